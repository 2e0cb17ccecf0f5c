//! The supervisor's lock on a dead server's state (docs/swap.md, "When the server dies").
//!
//! A server locks every page of its store's state file (the memfd of `Store::state_fd`) by
//! having its memory locked (`process::lock_memory`); when it dies those locks go with its
//! mappings, and until the successor has recovered the store and locked the pages again they
//! are ordinary shared memory that reclaim may swap out, perhaps to the very device they are
//! the pages of, whose server is the one that is missing. So the supervisor, on seeing the
//! server die, maps the file itself and locks the parts that hold data (`SEEK_DATA` /
//! `SEEK_HOLE`: the file is sparse and sized for the whole device; its holes are not touched,
//! so no memory is committed for them), before it starts the successor, and lets go once the
//! successor is up. The pages are the same pages (shared memory): nothing is copied and no
//! memory is added. A page reclaim took in the moments between the death and the lock is
//! still in the swap cache while its write waits for the successor, and is locked from there.
//!
//! The small records a server stores beside its state (a front end's record, FUSE's INIT
//! record: memfds the server wrote once and never mapped) are locked the same way, but as
//! soon as the supervisor receives them and for as long as it holds them ([`is_shared_memory`]
//! picks them): nothing of the server's keeps them resident, and a successor reads them
//! first. Seen in the VM test (`global-kill`, 2026-11-28): a record's page had been swapped
//! out to the device while the server lived, and the standby, handed the descriptors,
//! waited in `read()` for a swap-in only it could serve.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// A read-only shared mapping of a state file whose data parts are locked; unmapped (and so
/// unlocked) when dropped.
pub(super) struct StatePin {
    base: NonNull<libc::c_void>,
    len: usize,
    /// Bytes locked (the file's data parts).
    pub(super) locked: usize,
}

impl StatePin {
    /// Maps the state file `fd` and locks every part of it that holds data. An error is the
    /// kernel's (a lock refused for the locked-memory limit, for instance); nothing stays
    /// mapped then.
    pub(super) fn lock(fd: BorrowedFd<'_>) -> io::Result<StatePin> {
        // SAFETY: fstat fills the zeroed struct it is given.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `fd` is a live descriptor for the call.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let len = st.st_size as usize;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the state file is empty"));
        }
        // SAFETY: a new shared read-only mapping of the whole file; nothing else refers to the
        // address range it returns.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut pin = StatePin { base: NonNull::new(p).expect("mmap returned a non-null address"), len, locked: 0 };
        for range in data_ranges(fd, len) {
            // SAFETY: the range lies inside the mapping made above (data_ranges clamps to `len`,
            // and offsets from SEEK_DATA/SEEK_HOLE are page-aligned for shared memory); mlock
            // only faults the pages in and locks them.
            let r = unsafe { libc::mlock(pin.base.as_ptr().cast::<u8>().add(range.start).cast(), range.end - range.start) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            pin.locked += range.end - range.start;
        }
        Ok(pin)
    }
}

impl Drop for StatePin {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `lock`, of `len` bytes; no reference into it exists (the
        // pin never hands one out).
        unsafe { libc::munmap(self.base.as_ptr(), self.len) };
    }
}

/// Whether `fd` is shared memory (a memfd or a tmpfs file): `F_GET_SEALS` answers only for
/// those (EINVAL for a device, a socket, a regular file elsewhere).
pub(super) fn is_shared_memory(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: a plain query on a live descriptor.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) >= 0 }
}

/// The parts of the first `len` bytes of `fd` that hold data, by `lseek(SEEK_DATA/SEEK_HOLE)`.
fn data_ranges(fd: BorrowedFd<'_>, len: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < len {
        // SAFETY: plain lseek calls on a live descriptor (its offset is not used by anyone: every
        // holder of the state reads and writes it through mappings).
        let data = unsafe { libc::lseek(fd.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 || data as usize >= len {
            break; // ENXIO: no data after `at`
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd.as_raw_fd(), data, libc::SEEK_HOLE) };
        let hole = if hole < 0 { len } else { (hole as usize).min(len) };
        out.push(data as usize..hole);
        at = hole;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    /// VmLck is the process's: the tests that measure it take turns.
    static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A new memfd named `name`.
    fn memfd(name: &std::ffi::CStr) -> OwnedFd {
        // SAFETY: memfd_create with a NUL-terminated name; a new descriptor or -1.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a new descriptor nothing else owns.
        unsafe { OwnedFd::from_raw_fd(raw) }
    }

    fn locked_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmLck:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn locks_the_data_of_a_sparse_file_and_commits_nothing_for_its_holes() {
        let _turn = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
        let fd = memfd(c"state-pin-test");
        let file = std::fs::File::from(fd.try_clone().unwrap());
        let len = 64 << 20;
        file.set_len(len).unwrap();
        use std::os::unix::fs::FileExt;
        // Three runs of data: 1 page, 16 pages, and the last page of the file.
        file.write_all_at(&[1u8; 4096], 8 << 20).unwrap();
        file.write_all_at(&[2u8; 16 * 4096], 20 << 20).unwrap();
        file.write_all_at(&[3u8; 4096], len - 4096).unwrap();
        let blocks = || file.metadata().map(|m| std::os::unix::fs::MetadataExt::blocks(&m)).unwrap();
        let before = (blocks(), locked_kib());
        let pin = match StatePin::lock(fd.as_fd()) {
            Ok(p) => p,
            // Without CAP_IPC_LOCK and with a small RLIMIT_MEMLOCK the lock is refused: the
            // supervisor runs as root, this test may not.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) || e.raw_os_error() == Some(libc::ENOMEM) => {
                eprintln!("mlock refused ({e}): skipped");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(pin.locked, 18 * 4096);
        assert_eq!(locked_kib() - before.1, 18 * 4);
        assert_eq!(blocks(), before.0, "the holes stay holes");
        drop(pin);
        assert_eq!(locked_kib(), before.1);
    }

    #[test]
    fn a_record_is_shared_memory_and_is_locked_whole_a_pipe_is_not_shared_memory() {
        let _turn = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
        let fd = memfd(c"record-pin-test");
        // A record as the servers write one: a few bytes, written, never mapped.
        std::io::Write::write_all(&mut std::fs::File::from(fd.try_clone().unwrap()), b"dev_id=3 queues=2\n").unwrap();
        assert!(is_shared_memory(fd.as_fd()));
        let (r, _w) = std::io::pipe().unwrap();
        assert!(!is_shared_memory(r.as_fd()), "a pipe is not a record to lock");
        let before = locked_kib();
        match StatePin::lock(fd.as_fd()) {
            Ok(pin) => {
                assert_eq!(pin.locked, 18, "the record's bytes");
                assert_eq!(locked_kib() - before, 4, "its one page locked");
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) || e.raw_os_error() == Some(libc::ENOMEM) => {
                eprintln!("mlock refused ({e}): skipped");
            }
            Err(e) => panic!("{e}"),
        }
    }
}
