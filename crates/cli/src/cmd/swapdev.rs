//! The kernel's swap, as the swap commands use it: writing a swap header, the swapon/swapoff
//! system calls, `/proc/swaps`, and taking a device out of swap use before its server removes
//! it. (Signals and memory locking are `crate::process`; `swapon`'s state files are
//! `swapon/state.rs`.)

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use crate::failure::Failure;

/// The page size swap works in (x86-64, arm64 with 4K pages).
pub const PAGE_BYTES: u64 = 4096;

/// `swapon(2)` flags (linux/swap.h).
const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
const SWAP_FLAG_PRIO_MASK: libc::c_int = 0x7fff;
const SWAP_FLAG_DISCARD: libc::c_int = 0x10000;

/// Builds the first page of a version-1 swap area ("SWAPSPACE2") for a device of
/// `size_bytes`, as mkswap(8) writes it: boot block padding up to byte 1024, then
/// `version`, `last_page`, `nr_badpages`, a UUID and a label, and the signature in the page's
/// last 10 bytes.
pub fn swap_header(size_bytes: u64, uuid: [u8; 16], label: &str) -> Result<Vec<u8>, String> {
    let pages = size_bytes / PAGE_BYTES;
    if pages < 10 {
        return Err(format!("a swap area needs at least 10 pages; the device has {pages}"));
    }
    let last_page = u32::try_from(pages - 1).map_err(|_| format!("{size_bytes} bytes is more than swap can address"))?;
    let mut page = vec![0u8; PAGE_BYTES as usize];
    page[1024..1028].copy_from_slice(&1u32.to_ne_bytes()); // version
    page[1028..1032].copy_from_slice(&last_page.to_ne_bytes());
    page[1032..1036].copy_from_slice(&0u32.to_ne_bytes()); // nr_badpages
    page[1036..1052].copy_from_slice(&uuid);
    let l = label.as_bytes();
    page[1052..1052 + l.len().min(15)].copy_from_slice(&l[..l.len().min(15)]);
    page[PAGE_BYTES as usize - 10..].copy_from_slice(b"SWAPSPACE2");
    Ok(page)
}

/// A random version-4 UUID from the kernel's random pool.
fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Ok(f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_at(&mut u, 0);
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// mkswap: writes a swap header on `dev` of `size_bytes` and syncs it to the device.
pub fn mkswap(dev: &Path, size_bytes: u64) -> Result<(), Failure> {
    let header = swap_header(size_bytes, random_uuid(), "compcache").map_err(Failure::new)?;
    let f = OpenOptions::new().write(true).open(dev).map_err(|e| Failure::new(format!("mkswap: opening {}: {e}", dev.display())))?;
    f.write_all_at(&header, 0)
        .and_then(|_| f.sync_all())
        .map_err(|e| Failure::new(format!("mkswap: writing the header on {}: {e}", dev.display())))
}

fn cpath(p: &Path) -> Result<std::ffi::CString, Failure> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| Failure::usage(format!("{}: path has a NUL byte", p.display())))
}

/// swapon(2) with a priority (0..=32767, or -1: the kernel's) and, with `discard`, freed swap slots discarded so
/// the device frees their memory (zram gets this from the swap-free notification instead).
pub fn swapon(dev: &Path, priority: i32, discard: bool) -> Result<(), Failure> {
    if !(-1..=SWAP_FLAG_PRIO_MASK).contains(&priority) {
        return Err(Failure::usage(format!("priority {priority} is outside -1..=32767")));
    }
    // -1 (zram-generator's and swapon(8)'s "no priority"): the kernel picks one, below every
    // given priority.
    let mut flags = if priority < 0 { 0 } else { SWAP_FLAG_PREFER | (priority & SWAP_FLAG_PRIO_MASK) };
    if discard {
        flags |= SWAP_FLAG_DISCARD;
    }
    let c = cpath(dev)?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; flags are plain integers.
    if unsafe { libc::swapon(c.as_ptr(), flags) } != 0 {
        let e = io::Error::last_os_error();
        return Err(Failure::new(format!("swapon {}: {e}", dev.display())));
    }
    Ok(())
}

/// swapoff(2): the kernel reads every swapped-out page back in first, so this takes as long
/// as that and needs the memory for it.
pub fn swapoff(dev: &Path) -> Result<(), Failure> {
    let c = cpath(dev)?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::swapoff(c.as_ptr()) } != 0 {
        let e = io::Error::last_os_error();
        return Err(Failure::new(format!("swapoff {}: {e}", dev.display())));
    }
    Ok(())
}

pub use crate::paths::HIBERNATION_SAFE_PREFIX;

/// The hibernation-safe name of `dev` ([`HIBERNATION_SAFE_PREFIX`]).
pub fn swap_alias(dev: &Path) -> std::path::PathBuf {
    let name = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    std::path::PathBuf::from(format!("{HIBERNATION_SAFE_PREFIX}{name}"))
}

/// Makes [`swap_alias`]`(dev)`: a block device node of `dev`'s number, mode 0600 (as the
/// device's own node: it gives the device's data to whoever can open it), replacing a stale
/// one a device of that name left. The error says why; the caller then swaps on `dev` itself.
pub fn create_swap_alias(dev: &Path) -> Result<std::path::PathBuf, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(dev).map_err(|e| format!("{}: {e}", dev.display()))?;
    if !meta.file_type().is_block_device() {
        return Err(format!("{} is not a block device", dev.display()));
    }
    let alias = swap_alias(dev);
    match std::fs::symlink_metadata(&alias) {
        Ok(m) if m.file_type().is_block_device() => {
            std::fs::remove_file(&alias).map_err(|e| format!("removing the stale {}: {e}", alias.display()))?
        }
        Ok(_) => return Err(format!("{} exists and is not a block device node: not touching it", alias.display())),
        Err(_) => {}
    }
    let c = cpath(&alias).map_err(|f| f.to_string())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; mode and device number are
    // plain integers (a block device node, owner read/write only).
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o600, meta.rdev() as libc::dev_t) } != 0 {
        return Err(format!("mknod {}: {}", alias.display(), io::Error::last_os_error()));
    }
    Ok(alias)
}

/// Removes [`swap_alias`]`(dev)` if it is a block device node (after swapoff, or when the
/// device goes: a stale node would keep the number of a device that may come back as another).
pub fn remove_swap_alias(dev: &Path) {
    use std::os::unix::fs::FileTypeExt;
    let alias = swap_alias(dev);
    if std::fs::symlink_metadata(&alias).is_ok_and(|m| m.file_type().is_block_device()) {
        if let Err(e) = std::fs::remove_file(&alias) {
            crate::log::warning(&format!("removing {}: {e}", alias.display()));
        }
    }
}

/// Whether `dev` is an active swap area (listed in /proc/swaps). Entries are compared by
/// device number as well as by name: swap enabled through another name for the same device
/// (a /dev/disk/by-* link, a copy of the node) is still this device's swap. When /proc/swaps
/// cannot be read the answer is "yes": the callers remove the device only on a "no".
pub fn is_active_swap(dev: &Path) -> bool {
    match std::fs::read_to_string("/proc/swaps") {
        Ok(swaps) => swaps_list(&swaps, dev),
        Err(e) => {
            crate::log::warning(&format!("cannot read /proc/swaps ({e}): taking {} to be swap", dev.display()));
            true
        }
    }
}

/// Whether the /proc/swaps text `swaps` lists `dev` (by name, or by device number).
pub fn swaps_list(swaps: &str, dev: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let rdev = |p: &Path| std::fs::metadata(p).ok().filter(|m| m.file_type().is_block_device()).map(|m| m.rdev());
    let want = dev.to_string_lossy();
    let want_rdev = rdev(dev);
    swaps.lines().skip(1).filter_map(|l| l.split_whitespace().next()).any(|name| {
        // /proc/swaps escapes spaces, tabs, newlines and backslashes as octal (\040).
        let name = name.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\");
        name == want || (want_rdev.is_some() && rdev(Path::new(&name)) == want_rdev)
    })
}

/// What taking a device out of swap use needs from the system; the real one is
/// [`KernelSwap`], tests give a scripted one.
pub trait SwapSystem {
    /// Whether the kernel swaps to `dev`; must answer "yes" when it cannot tell.
    fn is_active_swap(&self, dev: &Path) -> bool;
    fn swapoff(&self, dev: &Path) -> Result<(), Failure>;
}

/// /proc/swaps and swapoff(2).
pub struct KernelSwap;

impl SwapSystem for KernelSwap {
    fn is_active_swap(&self, dev: &Path) -> bool {
        is_active_swap(dev)
    }
    fn swapoff(&self, dev: &Path) -> Result<(), Failure> {
        swapoff(dev)
    }
}

/// The first pause between swapoff attempts that failed; it doubles up to
/// [`SWAPOFF_RETRY_MAX`].
pub const SWAPOFF_RETRY_FIRST: Duration = Duration::from_secs(1);
pub const SWAPOFF_RETRY_MAX: Duration = Duration::from_secs(60);

/// Takes `dev` out of swap use before its server removes it, and returns only once the kernel
/// no longer swaps to it (the number of failed swapoff attempts): removing a device that is
/// still swap loses every page swapped out to it, so the device stays up and keeps serving
/// meanwhile (the caller's I/O threads run on). After each failure it says what to do and
/// waits: `pause(d)` sleeps up to `d` and returns early, with the signal, when another stop
/// signal arrives, which retries at once. The pause grows from [`SWAPOFF_RETRY_FIRST`] to
/// [`SWAPOFF_RETRY_MAX`]. The only way to give up is SIGKILL, which loses the pages as
/// removing would: that is for the operator to decide, never for this code.
pub fn take_out_of_swap(
    dev: &Path,
    sys: &dyn SwapSystem,
    pause: &mut dyn FnMut(Duration) -> Option<i32>,
    log: &mut dyn FnMut(&str),
) -> u32 {
    let mut failures = 0u32;
    let mut delay = SWAPOFF_RETRY_FIRST;
    let mut announced = false;
    while sys.is_active_swap(dev) {
        if !std::mem::replace(&mut announced, true) {
            log(&format!("{} is swap: swapoff first (reads every page back)", dev.display()));
        }
        let Err(e) = sys.swapoff(dev) else { continue };
        failures += 1;
        log(&format!(
            "{e} (attempt {failures}): {dev} is still swap, so it stays up and keeps serving: removing it would lose every \
             swapped-out page. Free memory (swapoff needs room for every page it reads back) or stop the programs using \
             that swap, then send SIGTERM again to retry at once; retrying by itself in {delay:?}. `kill -9` gives up and \
             loses the pages",
            dev = dev.display()
        ));
        if let Some(sig) = pause(delay) {
            log(&format!("signal {sig}: retrying swapoff of {} now", dev.display()));
        }
        delay = (delay * 2).min(SWAPOFF_RETRY_MAX);
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_header_matches_mkswap_layout() {
        let uuid = [7u8; 16];
        let h = swap_header(64 << 20, uuid, "compcache").unwrap();
        assert_eq!(h.len(), 4096);
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert_eq!(u32::from_ne_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(h[1028..1032].try_into().unwrap()), (64 << 20) / 4096 - 1);
        assert_eq!(&h[1036..1052], &uuid);
        assert_eq!(&h[1052..1061], b"compcache");
        assert!(h[..1024].iter().all(|&b| b == 0));
        assert!(swap_header(4096 * 9, uuid, "x").is_err());
    }

    /// A scripted system: swapoff fails `fail` times, then takes the device out of swap.
    struct Scripted {
        swap: std::cell::Cell<bool>,
        fail: std::cell::Cell<u32>,
        calls: std::cell::Cell<u32>,
    }

    impl SwapSystem for Scripted {
        fn is_active_swap(&self, _: &Path) -> bool {
            self.swap.get()
        }
        fn swapoff(&self, _: &Path) -> Result<(), Failure> {
            self.calls.set(self.calls.get() + 1);
            if self.fail.get() > 0 {
                self.fail.set(self.fail.get() - 1);
                return Err(Failure::new("swapoff /dev/x: Cannot allocate memory"));
            }
            self.swap.set(false);
            Ok(())
        }
    }

    fn scripted(swap: bool, fail: u32) -> Scripted {
        Scripted { swap: swap.into(), fail: fail.into(), calls: 0.into() }
    }

    #[test]
    fn a_device_is_released_only_once_it_is_no_longer_swap() {
        let dev = Path::new("/dev/x");
        let sys = scripted(true, 9);
        let mut pauses = Vec::new();
        let mut lines = Vec::new();
        // Every third pause ends with a stop signal (a retry at once).
        let mut pause = |d: Duration| {
            pauses.push(d);
            (pauses.len() % 3 == 0).then_some(libc::SIGTERM)
        };
        let failures = take_out_of_swap(dev, &sys, &mut pause, &mut |l: &str| lines.push(l.to_string()));
        assert_eq!(failures, 9);
        assert!(!sys.swap.get(), "returned while the device was still swap");
        assert_eq!(sys.calls.get(), 10, "one swapoff per attempt, the last one works");
        let secs: Vec<u64> = pauses.iter().map(|d| d.as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60], "the pause grows and is capped");
        let failed: Vec<&String> = lines.iter().filter(|l| l.contains("still swap")).collect();
        assert_eq!(failed.len(), 9, "every failure is logged: {lines:?}");
        assert!(
            failed[0].contains("Cannot allocate memory") && failed[0].contains("keeps serving") && failed[0].contains("SIGTERM"),
            "{}",
            failed[0]
        );
        assert_eq!(lines.iter().filter(|l| l.contains("retrying swapoff of /dev/x now")).count(), 3, "{lines:?}");
    }

    #[test]
    fn a_device_that_is_not_swap_is_released_at_once() {
        let sys = scripted(false, 0);
        let mut pause = |_: Duration| -> Option<i32> { panic!("no pause when not swap") };
        assert_eq!(take_out_of_swap(Path::new("/dev/x"), &sys, &mut pause, &mut |_: &str| {}), 0);
        assert_eq!(sys.calls.get(), 0);
        let sys = scripted(true, 0);
        assert_eq!(take_out_of_swap(Path::new("/dev/x"), &sys, &mut pause, &mut |_: &str| {}), 0);
        assert_eq!(sys.calls.get(), 1);
    }

    #[test]
    fn proc_swaps_entries_match_by_name_or_device_number() {
        let swaps = "Filename\tType\tSize\tUsed\tPriority\n/dev/ublkb0 partition 1024 0 100\n/tmp/my\\040swap file 8 0 -2\n";
        assert!(swaps_list(swaps, Path::new("/dev/ublkb0")));
        assert!(swaps_list(swaps, Path::new("/tmp/my swap")), "octal escapes are decoded");
        assert!(!swaps_list(swaps, Path::new("/dev/ublkb1")));
        // The same block device under another name is the same swap.
        let null_like = Path::new("/dev/loop0");
        if std::fs::metadata(null_like).is_ok() {
            let dir = std::env::temp_dir().join(format!("compcache-swaps-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let alias = dir.join("alias");
            std::os::unix::fs::symlink(null_like, &alias).unwrap();
            let text = format!("Filename Type Size Used Priority\n{} partition 8 0 -2\n", alias.display());
            let found = swaps_list(&text, null_like);
            std::fs::remove_dir_all(&dir).unwrap();
            assert!(found, "swap enabled through a link to the device is the device's swap");
        } else {
            eprintln!("skipped the device-number case: no /dev/loop0");
        }
    }

    #[test]
    fn swap_header_is_what_util_linux_reads() {
        // Where the machine has util-linux's swaplabel, it must find our label and UUID.
        let Ok(out) = std::process::Command::new("swaplabel").arg("--version").output() else {
            eprintln!("skipped: no swaplabel");
            return;
        };
        if !out.status.success() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("compcache-mkswap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("swapfile");
        std::fs::write(&f, vec![0u8; 1 << 20]).unwrap();
        mkswap(&f, 1 << 20).unwrap();
        let out = std::process::Command::new("swaplabel").arg(&f).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(text.contains("LABEL: compcache"), "{text}");
    }
}
