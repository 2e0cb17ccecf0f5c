//! The supervisor's lock on the program a successor would run (docs/swap.md, "What a successor
//! must not wait for").
//!
//! When no standby can take a device over (it died, or it stalled and was given up on), the
//! supervisor starts a successor from disk: `execve` of the compcache binary, then the dynamic
//! linker maps its libraries. Both read the program's pages from the page cache, and the kernel
//! itself writes to some of them before the program runs (`elf_load` clears the end of the data
//! segment's last page). When the program lives on tmpfs (an initramfs root, a container's
//! image on shared memory) those pages are shared memory, and under memory pressure they may have
//! been swapped out, to the very device whose server is missing: the successor then waits
//! forever in `execve` (seen in the VM test's `global-kill` step: `elf_load` ->
//! `shmem_swapin_folio`). On a disk file system they may have been dropped and must be read
//! back while memory is shortest.
//!
//! So the supervisor keeps them resident: once a server (or a standby) of the program is up,
//! it maps every file that process has mapped executable (the program and its libraries),
//! over the same ranges the process maps from each (its text, its read-only data, the file
//! part of its data segment), shared and read-only, and locks them. These are the page cache's
//! own pages, which the running server maps too: nothing is copied, and the memory locked is
//! what the program already takes (a few MiB). A new program (an upgrade: `compcache restart`)
//! is pinned in its place once a process of it is up.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::ptr::NonNull;

/// One range of a file a process maps: `len` bytes from `offset` of `path`, whose inode is
/// `inode` on device `dev` (major, minor).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct FileRange {
    path: PathBuf,
    dev: (u32, u32),
    inode: u64,
    offset: u64,
    len: u64,
}

/// The program files of one process, mapped and locked ([`ProgramPin::of_process`]); unmapped
/// (so unlocked) when dropped.
pub(super) struct ProgramPin {
    maps: Vec<(NonNull<libc::c_void>, usize)>,
    /// The files pinned, by (device, inode): a process mapping the same ones needs no new pin.
    pub(super) files: BTreeSet<(u64, u64)>,
    /// Bytes locked.
    pub(super) locked: usize,
}

// SAFETY: the pin only owns its mappings (it never hands out a pointer into them); unmapping
// them from another thread is as sound as from this one.
unsafe impl Send for ProgramPin {}

impl ProgramPin {
    /// Maps and locks the ranges process `pid` maps from the files it maps executable (module
    /// docs). A file that cannot be opened or mapped, or is no longer the one the process maps
    /// (replaced since: its inode differs), is left out; an error is only that the process's
    /// maps cannot be read, or a lock the kernel refused (the locked-memory limit).
    pub(super) fn of_process(pid: u32) -> io::Result<ProgramPin> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let mut pin = ProgramPin { maps: Vec::new(), files: BTreeSet::new(), locked: 0 };
        for range in program_ranges(&maps) {
            let Ok(file) = std::fs::File::open(&range.path) else { continue };
            let Ok(meta) = file.metadata() else { continue };
            if meta.ino() != range.inode || (libc::major(meta.dev()), libc::minor(meta.dev())) != range.dev {
                continue;
            }
            // Not past the end of the file: a lock there would fail (SIGBUS pages).
            let end = (range.offset + range.len).min(meta.len().next_multiple_of(page_size()));
            if end <= range.offset {
                continue;
            }
            let len = (end - range.offset) as usize;
            // SAFETY: a new shared read-only mapping of a file we opened; nothing else refers
            // to the address range it returns.
            let p = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), range.offset as libc::off_t)
            };
            if p == libc::MAP_FAILED {
                continue;
            }
            let p = NonNull::new(p).expect("mmap returned a non-null address");
            pin.maps.push((p, len));
            // SAFETY: the whole of the mapping just made; mlock faults its pages in and locks them.
            if unsafe { libc::mlock(p.as_ptr(), len) } != 0 {
                return Err(io::Error::last_os_error());
            }
            pin.locked += len;
            pin.files.insert((meta.dev(), meta.ino()));
        }
        Ok(pin)
    }

    /// The files (device, inode) process `pid` maps executable, as [`ProgramPin::files`] counts
    /// them; `None` if its maps cannot be read.
    pub(super) fn files_of(pid: u32) -> Option<BTreeSet<(u64, u64)>> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        Some(program_ranges(&maps).into_iter().map(|r| (libc::makedev(r.dev.0, r.dev.1), r.inode)).collect())
    }
}

impl Drop for ProgramPin {
    fn drop(&mut self) {
        for &(p, len) in &self.maps {
            // SAFETY: a mapping made in `of_process`, of `len` bytes; no reference into it exists.
            unsafe { libc::munmap(p.as_ptr(), len) };
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf takes a name and returns a number.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64
}

/// The ranges of `/proc/PID/maps` text that map a file some range maps executable: a regular
/// file by its path (not one deleted since, not a memfd, nothing under /dev), merged where
/// they overlap or touch, sorted.
fn program_ranges(maps: &str) -> Vec<FileRange> {
    let mut all = Vec::new();
    let mut programs = BTreeSet::new();
    for line in maps.lines() {
        // start-end perms offset major:minor inode path
        let mut f = line.split_ascii_whitespace();
        let (Some(span), Some(perms), Some(offset), Some(dev), Some(inode)) = (f.next(), f.next(), f.next(), f.next(), f.next()) else {
            continue;
        };
        let path: Vec<&str> = f.collect();
        let path = path.join(" ");
        if !path.starts_with('/') || path.starts_with("/dev/") || path.starts_with("/memfd:") || path.ends_with(" (deleted)") {
            continue;
        }
        let parse = || -> Option<FileRange> {
            let (start, end) = span.split_once('-')?;
            let len = u64::from_str_radix(end, 16).ok()?.checked_sub(u64::from_str_radix(start, 16).ok()?)?;
            let (major, minor) = dev.split_once(':')?;
            Some(FileRange {
                path: PathBuf::from(&path),
                dev: (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?),
                inode: inode.parse().ok().filter(|&i| i != 0)?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                len,
            })
        };
        let Some(r) = parse() else { continue };
        if perms.as_bytes().get(2) == Some(&b'x') {
            programs.insert((r.dev, r.inode));
        }
        all.push(r);
    }
    all.retain(|r| programs.contains(&(r.dev, r.inode)));
    all.sort();
    let mut out: Vec<FileRange> = Vec::new();
    for r in all {
        match out.last_mut() {
            Some(last) if last.dev == r.dev && last.inode == r.inode && r.offset <= last.offset + last.len => {
                last.len = last.len.max(r.offset + r.len - last.offset);
            }
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0100000 r--p 00000000 fd:01 1234 /usr/bin/compcache
55d0c0100000-55d0c0500000 r-xp 00100000 fd:01 1234 /usr/bin/compcache
55d0c0500000-55d0c0600000 r--p 00500000 fd:01 1234 /usr/bin/compcache
55d0c0600000-55d0c0601000 rw-p 00600000 fd:01 1234 /usr/bin/compcache
55d0c0601000-55d0c0700000 rw-p 00000000 00:00 0 
7f0000000000-7f0000100000 r--p 00000000 fd:01 99 /usr/lib/locale/locale-archive
7f0000200000-7f0000228000 r--p 00000000 fd:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000228000-7f00003bd000 r-xp 00028000 fd:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000400000-7f0040400000 rw-s 00000000 00:01 5 /memfd:compcache-state (deleted)
7f0050000000-7f0050001000 r-xp 00000000 fd:01 88 /usr/lib/old.so (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0 [vdso]
";

    #[test]
    fn takes_every_range_of_the_files_mapped_executable_merged_and_nothing_else() {
        let got = program_ranges(MAPS);
        let brief: Vec<(&str, u64, u64)> = got.iter().map(|r| (r.path.to_str().unwrap(), r.offset, r.len)).collect();
        assert_eq!(
            brief,
            vec![
                // The program: text, read-only data and the file part of its data segment.
                ("/usr/bin/compcache", 0, 0x601000),
                // libc: two touching ranges, one range.
                ("/usr/lib/x86_64-linux-gnu/libc.so.6", 0, 0x3bd000 - 0x200000),
            ],
            "not the locale (never mapped executable), the memfd, a deleted file, the heap, the stack or the vdso"
        );
        assert_eq!(got[0].dev, (0xfd, 1));
    }

    #[test]
    fn pins_this_test_programs_own_files_and_lets_go_when_dropped() {
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        let pin = match ProgramPin::of_process(std::process::id()) {
            Ok(p) => p,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) || e.raw_os_error() == Some(libc::ENOMEM) => {
                eprintln!("mlock refused ({e}): skipped");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert!(pin.files.contains(&(exe.dev(), exe.ino())), "the program itself is pinned: {:?}", pin.files);
        assert_eq!(Some(pin.files.clone()), ProgramPin::files_of(std::process::id()));
        assert!(pin.locked > 0);
        // Each of the pin's mappings is resident whole and locked.
        for &(p, len) in &pin.maps {
            assert_eq!(resident_locked_at(p.as_ptr() as usize), Some((len as u64, true)), "mapping at {p:?} of {len} bytes");
        }
        drop(pin);
    }

    /// The resident bytes of this process's mapping that starts at `addr`, and whether it is
    /// locked (`lo` in its `VmFlags`), if one starts there. (smaps' `Locked:` is proportional:
    /// pages another mapping shares count in part.)
    fn resident_locked_at(addr: usize) -> Option<(u64, bool)> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_it = false;
        let mut rss = None;
        for line in smaps.lines() {
            if let Some((span, _)) = line.split_once(' ').filter(|(s, _)| s.contains('-') && !s.ends_with(':')) {
                in_it = usize::from_str_radix(span.split('-').next().unwrap(), 16) == Ok(addr);
            } else if in_it && line.starts_with("Rss:") {
                rss = line.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()).map(|k| k * 1024);
            } else if in_it && line.starts_with("VmFlags:") {
                return Some((rss?, line.split_whitespace().any(|f| f == "lo")));
            }
        }
        None
    }
}
