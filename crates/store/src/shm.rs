//! The state file: one memfd, mapped shared, that holds a device's whole RAM state (slot table,
//! pool pages and their descriptors, the recovery journal, dictionaries, the header naming the
//! layout) so that it outlives the process. Whoever keeps the descriptor open (a supervisor,
//! systemd's file-descriptor store) keeps the pages; a successor maps it again and recovers
//! (`ram/recover.rs`).
//!
//! Everything in it is position-independent (page frame numbers, slot indices, offsets from the
//! start of the file): it is mapped at a different address by each process.
//!
//! The file is sparse: `ftruncate` gives it its full size (address space only: memfds are
//! created with `VM_NORESERVE`, nothing is committed), and memory is taken by the pages that
//! are written, as with the private anonymous mapping it replaces. Pages are given back with
//! `MADV_REMOVE` (`MADV_DONTNEED` only drops a shared mapping's view, not the memory), which
//! fails under `mlock` as `MADV_DONTNEED` did (the page then stays, for reuse).
//!
//! One server at a time: each process that maps the file takes a POSIX write lock on its first
//! byte ([`claim`]), which the kernel drops when the process dies. A process that finds it held
//! by another live one is refused ("in use by pid N"): two servers of one state would each
//! take the other's pages. POSIX locks are per process, so a test (or a process) that maps
//! the file twice is not refused; and they are dropped when the process closes *any*
//! descriptor of the file, so a server keeps exactly one (the map's own) and closes no copy.
//!
//! Privacy: a memfd has no path; it is reachable only through its descriptor (by processes
//! given it, and through `/proc/<pid>/fd` by the owner's uid and root, as the process's own
//! memory is). Its size is sealed (`F_SEAL_SHRINK | F_SEAL_GROW`): no holder can truncate the
//! mapping under the server (a truncated shared mapping faults with SIGBUS).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// The name the memfd shows in `/proc/<pid>/fd` and `/proc/<pid>/maps`.
const MEMFD_NAME: &std::ffi::CStr = c"compcache-state";

/// A memfd mapped shared into this process, for its whole size.
pub(crate) struct StateMap {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by the StateMap for its whole life; who may touch which bytes is
// governed by the users of each region (slot.rs, zspool), as for any shared memory.
unsafe impl Send for StateMap {}
// SAFETY: as for Send.
unsafe impl Sync for StateMap {}

impl StateMap {
    /// A new, zero-filled state file of `len` bytes (a multiple of the page size), mapped.
    pub fn create(len: usize) -> io::Result<StateMap> {
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(MEMFD_NAME.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(fd)
    }

    /// Maps an existing state file (a successor's, given the descriptor). Its size is its own.
    pub fn open(fd: OwnedFd) -> io::Result<StateMap> {
        let seals = {
            // SAFETY: a plain query on a descriptor we own.
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) }
        };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a compcache state file (a sealed memfd)"));
        }
        Self::map(fd)
    }

    fn map(fd: OwnedFd) -> io::Result<StateMap> {
        claim(fd.as_fd())?;
        // SAFETY: fstat into a zeroed struct on our own descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let len = st.st_size as usize;
        if len == 0 || len % crate::PAGE_SIZE != 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("state file of {len} bytes: not whole pages")));
        }
        // SAFETY: a new shared mapping of the whole file; no existing memory is affected. The
        // file cannot shrink (sealed), so the mapping never faults past its end.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(StateMap { fd, base: NonNull::new(p as *mut u8).expect("mmap returned a non-null address"), len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The address of byte `offset` of the file. Dereferencing it is governed by the region's
    /// owner.
    pub fn at(&self, offset: usize) -> NonNull<u8> {
        assert!(offset < self.len, "offset {offset} outside the state file of {} bytes", self.len);
        // SAFETY: offset < len, so the result stays inside the mapping.
        unsafe { NonNull::new_unchecked(self.base.as_ptr().add(offset)) }
    }

    /// The parts of `offset..offset + len` that hold data (written pages; the rest are holes,
    /// which read as zeros), by `lseek(SEEK_DATA / SEEK_HOLE)`: so that recovery reads only
    /// what was written and does not commit memory for the holes of a sparse table.
    pub fn data_ranges(&self, offset: usize, len: usize) -> Vec<std::ops::Range<usize>> {
        let end = (offset + len).min(self.len);
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            // SAFETY: plain lseek calls on our descriptor.
            let data = unsafe { libc::lseek(self.fd.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
            if data < 0 || data as usize >= end {
                break; // ENXIO: no data after `at`
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(self.fd.as_raw_fd(), data, libc::SEEK_HOLE) };
            let hole = if hole < 0 { end } else { (hole as usize).min(end) };
            out.push(data as usize..hole);
            at = hole;
        }
        out
    }

    /// Gives the memory of `len` bytes at `offset` (page-aligned) back with `MADV_REMOVE`;
    /// false if the kernel refused (the range is `mlock`ed): the bytes then stay as they are.
    ///
    /// # Safety
    /// No reference to the bytes may be live: they read as zeros afterwards.
    pub unsafe fn remove(&self, offset: usize, len: usize) -> bool {
        // SAFETY: the range is inside the mapping (checked by `at`), and the caller guarantees
        // nobody refers to its bytes.
        unsafe { libc::madvise(self.at(offset).as_ptr() as *mut libc::c_void, len, libc::MADV_REMOVE) == 0 }
    }
}

impl StateMap {
    /// Frees the memory of `len` bytes at `offset` (page-aligned) with
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: unlike `MADV_REMOVE` it works under `mlock`. The
    /// bytes read as zeros afterwards; a thread reading them meanwhile sees old bytes or zeros
    /// (and its read faults a zero page back in), so callers free only bytes no reader trusts.
    pub fn punch(&self, offset: usize, len: usize) -> io::Result<()> {
        assert!(offset % crate::PAGE_SIZE == 0 && offset + len <= self.len, "punch {offset}+{len} outside the state file");
        // SAFETY: a plain syscall on our descriptor; it changes file contents, which every
        // user of this range reads through atomics (no reference to plain bytes is live).
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// This process's claim on the state file `fd` (module docs): a POSIX write lock on its first
/// byte. Refused, with the holder's pid, while another live process holds it.
fn claim(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: flock is plain data; all-zero is valid, filled in below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_len = 1;
    // SAFETY: fcntl F_SETLK with a live flock on our descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETLK, &fl) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
        return Err(e);
    }
    // SAFETY: as above; F_GETLK fills `fl` with the conflicting lock.
    let pid = if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETLK, &mut fl) } == 0 { fl.l_pid } else { 0 };
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!("the state file is in use by pid {pid}, a server still alive: a device is taken over only once its server is gone"),
    ))
}

/// A part of a state file handed to the code that owns its format (the backing tier's region,
/// which the RAM layer reserves without knowing what is in it: `ram/layout.rs`).
#[derive(Clone)]
pub(crate) struct Region {
    pub map: std::sync::Arc<StateMap>,
    /// Page-aligned, from the start of the file.
    pub offset: usize,
    pub len: usize,
}

impl Drop for StateMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; every region borrowing it holds an
        // `Arc<StateMap>`, so none outlives it.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_mapping_sees_the_first_ones_bytes() {
        let a = StateMap::create(1 << 20).unwrap();
        // SAFETY: test: the byte is inside the mapping and nobody else touches it.
        unsafe { a.at(4096 + 7).as_ptr().write(0xa5) };
        let dup = a.fd().try_clone_to_owned().unwrap();
        let b = StateMap::open(dup).unwrap();
        assert_eq!(b.len(), 1 << 20);
        // SAFETY: as above.
        assert_eq!(unsafe { b.at(4096 + 7).as_ptr().read() }, 0xa5);
        // SAFETY: nobody refers to the page.
        assert!(unsafe { b.remove(4096, 4096) }, "MADV_REMOVE (this test's memory is not locked)");
        // SAFETY: as above.
        assert_eq!(unsafe { a.at(4096 + 7).as_ptr().read() }, 0, "a hole reads as zeros");
    }

    #[test]
    fn data_ranges_skip_holes() {
        let a = StateMap::create(64 * 4096).unwrap();
        for page in [3usize, 4, 10] {
            // SAFETY: test: inside the mapping, nobody else touches it.
            unsafe { a.at(page * 4096).as_ptr().write(1) };
        }
        assert_eq!(a.data_ranges(0, 64 * 4096), vec![3 * 4096..5 * 4096, 10 * 4096..11 * 4096]);
        assert_eq!(a.data_ranges(4 * 4096, 2 * 4096), vec![4 * 4096..5 * 4096]);
    }

    #[test]
    fn the_size_is_sealed_and_other_files_are_refused() {
        let a = StateMap::create(8192).unwrap();
        // SAFETY: a plain syscall on a descriptor the map owns.
        assert_ne!(unsafe { libc::ftruncate(a.fd().as_raw_fd(), 4096) }, 0, "shrinking is refused");
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(StateMap::open(f.into()).is_err());
    }
}
