//! What the swap commands share: writing a swap header, the swapon/swapoff system calls,
//! `/proc/swaps`, keeping a swap server's memory resident, waiting for a stop signal, and
//! the state files that let `compcache swapoff` find what `compcache swapon` started.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::failure::Failure;

/// The page size swap works in (x86-64, arm64 with 4K pages).
pub const PAGE_BYTES: u64 = 4096;
/// Where `compcache swapon` records its devices (one JSON file each) and the servers' logs.
pub const STATE_DIR: &str = "/run/compcache/swap";

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

/// swapon(2) with a priority (0..=32767) and, with `discard`, freed swap slots discarded so
/// the device frees their memory (zram gets this from the swap-free notification instead).
pub fn swapon(dev: &Path, priority: i32, discard: bool) -> Result<(), Failure> {
    if !(0..=SWAP_FLAG_PRIO_MASK).contains(&priority) {
        return Err(Failure::usage(format!("priority {priority} is outside 0..=32767")));
    }
    let mut flags = SWAP_FLAG_PREFER | (priority & SWAP_FLAG_PRIO_MASK);
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

/// Whether `dev` is an active swap area (listed in /proc/swaps).
pub fn is_active_swap(dev: &Path) -> bool {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let want = dev.to_string_lossy();
    swaps.lines().skip(1).any(|l| l.split_whitespace().next() == Some(want.as_ref()))
}

/// Keeps a swap server's memory resident and out of reclaim's I/O:
/// - `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`: every page the server touches stays
///   in RAM (a swapped-out swap server deadlocks the machine), while the store's reserved but
///   untouched address space costs nothing (`MCL_ONFAULT`; without it `MCL_FUTURE` would
///   populate the whole reservation at once);
/// - `PR_SET_IO_FLUSHER` on this thread, inherited by every thread started afterwards: memory
///   reclaim entered by the server never waits for I/O, so it cannot wait on itself;
/// - `oom_score_adj = -1000`: the OOM killer never picks the server, whose death would take
///   every swapped-out page with it (zram's memory is the kernel's, which it cannot kill
///   either). nbd-client does the same with `-swap`.
pub fn pin_server_memory(mlock: bool) -> Result<(), Failure> {
    if mlock {
        // SAFETY: mlockall takes flags only and changes no Rust-visible state.
        let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(Failure::new(format!("mlockall: {e}: run as root (CAP_IPC_LOCK) or raise `ulimit -l`")));
        }
    }
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments only; affects this thread's reclaim flags.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) } != 0 {
        eprintln!("compcache: warning: PR_SET_IO_FLUSHER: {} (needs CAP_SYS_RESOURCE)", io::Error::last_os_error());
    }
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        eprintln!("compcache: warning: oom_score_adj: {e} (needs CAP_SYS_RESOURCE)");
    }
    Ok(())
}

/// Stack size of every thread started after [`lock_future_mappings`]: their stacks are then
/// populated and locked whole when created, so keep them small (lz4 needs 16 KiB of stack).
pub const SERVER_THREAD_STACK_BYTES: usize = 512 << 10;

/// The second half of pinning, once the store's big sparse mappings exist (locked on fault):
/// from now on every new mapping (thread stacks, heap growth) is populated and locked when it
/// is made, so the I/O threads never take a page fault on their stacks or buffers, which
/// under memory pressure would wait in reclaim for the swap-outs they are serving.
pub fn lock_future_mappings(mlock: bool) {
    // std reads this once, at the first thread spawn: set it before any thread exists.
    std::env::set_var("RUST_MIN_STACK", SERVER_THREAD_STACK_BYTES.to_string());
    if mlock {
        // SAFETY: mlockall takes flags only. MCL_FUTURE without MCL_CURRENT leaves the existing
        // mappings (the store's reservations, locked on fault) as they are.
        if unsafe { libc::mlockall(libc::MCL_FUTURE) } != 0 {
            eprintln!("compcache: warning: mlockall(MCL_FUTURE): {}", io::Error::last_os_error());
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, blocked in the calling thread (and so in every thread started
/// after) and collected by [`StopSignals::wait`].
pub struct StopSignals {
    set: libc::sigset_t,
}

// SAFETY: sigset_t is plain data (a bit array) with no pointers or thread affinity.
unsafe impl Send for StopSignals {}
// SAFETY: as above; it is never written after construction.
unsafe impl Sync for StopSignals {}

impl StopSignals {
    pub fn block() -> Result<StopSignals, Failure> {
        // SAFETY: an all-zero sigset_t is valid storage, initialised by sigemptyset before use;
        // each call gets a valid exclusive pointer to it.
        let (set, rc) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            (set, rc)
        };
        if rc != 0 {
            return Err(Failure::new(format!("blocking stop signals: {}", io::Error::from_raw_os_error(rc))));
        }
        Ok(StopSignals { set })
    }

    /// Returns the signal that arrived, or `None` once `alive()` turns false.
    pub fn wait(&self, alive: &dyn Fn() -> bool) -> Option<i32> {
        let tick = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
        loop {
            // SAFETY: `self.set` is initialised, `tick` is a valid timespec, and a null
            // siginfo pointer is allowed.
            let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &tick) };
            if sig > 0 {
                return Some(sig);
            }
            if !alive() {
                return None;
            }
        }
    }
}

/// What `compcache swapon` records about a device it set up, in `STATE_DIR/<dev>.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapState {
    pub device: PathBuf,
    pub frontend: String,
    pub pid: u32,
    pub log: PathBuf,
    pub stats: PathBuf,
    pub control: PathBuf,
}

impl SwapState {
    pub fn path_for(device: &Path) -> PathBuf {
        let name = device.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "device".into());
        Path::new(STATE_DIR).join(format!("{name}.json"))
    }

    pub fn save(&self) -> Result<(), Failure> {
        let v = serde_json::json!({
            "device": self.device, "frontend": self.frontend, "pid": self.pid,
            "log": self.log, "stats": self.stats, "control": self.control,
        });
        let path = Self::path_for(&self.device);
        std::fs::create_dir_all(STATE_DIR).map_err(|e| Failure::new(format!("{STATE_DIR}: {e}")))?;
        std::fs::write(&path, format!("{v:#}\n")).map_err(|e| Failure::new(format!("{}: {e}", path.display())))
    }

    pub fn load(path: &Path) -> Result<SwapState, Failure> {
        let text = std::fs::read_to_string(path).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
        let s = |k: &str| PathBuf::from(v.get(k).and_then(|x| x.as_str()).unwrap_or_default());
        Ok(SwapState {
            device: s("device"),
            frontend: v.get("frontend").and_then(|x| x.as_str()).unwrap_or_default().to_string(),
            pid: v.get("pid").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
            log: s("log"),
            stats: s("stats"),
            control: s("control"),
        })
    }

    /// Every recorded device.
    pub fn all() -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(STATE_DIR)
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.to_string_lossy().ends_with(".json") && !p.to_string_lossy().ends_with(".stats.json"))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// Writes `text` to the readiness file descriptor `fd` (a pipe from `compcache swapon`) and
/// closes it.
pub fn signal_ready(fd: Option<i32>, text: &str) {
    if let Some(fd) = fd {
        use std::os::fd::FromRawFd;
        // SAFETY: the parent passed this descriptor to us for exactly this use; nothing else
        // in this process owns it, so taking ownership (and closing it on drop) is sound.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let _ = f.write_all(text.as_bytes());
    }
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
