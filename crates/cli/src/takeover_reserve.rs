//! Memory a standby sets aside for its takeover, and gives back to the kernel the moment the
//! takeover begins (docs/swap.md, "A standby, started in advance").
//!
//! When a swap server dies, the kernel holds every swap-in and swap-out of its device until a
//! successor serves again, so reclaim cannot free anonymous memory meanwhile; and that is when
//! the successor must allocate: its store's recovery lists, its queue threads' stacks and
//! compression contexts, the kernel's rings for its io_urings. Each page it touches then waits
//! in reclaim for memory that only the device it is bringing back could free. Seen in the VM
//! test's `global-kill` step (the whole guest out of memory): a standby's queue thread in a
//! page fault in direct reclaim (`do_anonymous_page` -> `try_to_free_pages`) until the
//! supervisor's patience ran out.
//!
//! So a standby that locks its memory maps [`TAKEOVER_RESERVE_BYTES`] while it starts (memory
//! is plentiful then), locked and resident, and unmaps it when its supervisor hands it the
//! descriptors: those pages return to the kernel's free lists just as the standby starts to
//! allocate, on the CPU it runs on, while the processes that could take them first are mostly
//! waiting for the device. It is the userspace counterpart of the reserve the kernel keeps
//! for its own reclaim (`min_free_kbytes`, which only tasks in reclaim may use), which a
//! process cannot draw on. What it costs: the standby's resident memory while it waits.

use std::io;
use std::ptr::NonNull;

/// What a standby sets aside: more than a takeover allocates before the device serves again
/// (a ublk successor: two queue threads, their contexts and rings, and the recovery's lists,
/// 40 bytes per page stored: 0.7 MiB for 16,000 pages).
pub const TAKEOVER_RESERVE_BYTES: usize = 8 << 20;

/// Anonymous memory, resident and locked until dropped (then unmapped: given back).
pub struct TakeoverReserve {
    base: NonNull<libc::c_void>,
    len: usize,
}

impl TakeoverReserve {
    /// Maps `len` bytes and locks them (`mlock` faults every page in). The error is the
    /// kernel's (a lock refused for the locked-memory limit, say); nothing stays mapped then.
    pub fn set_aside(len: usize) -> io::Result<TakeoverReserve> {
        // SAFETY: a new private anonymous mapping; nothing else refers to the range it returns.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let reserve = TakeoverReserve { base: NonNull::new(p).expect("mmap returned a non-null address"), len };
        // SAFETY: the whole mapping just made; mlock only faults its pages in and locks them.
        if unsafe { libc::mlock(reserve.base.as_ptr(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(reserve)
    }

    /// Bytes set aside.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for TakeoverReserve {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `set_aside`, of `len` bytes; no reference into it exists
        // (the reserve never hands one out).
        unsafe { libc::munmap(self.base.as_ptr(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn the_reserve_is_resident_while_held_and_given_back_when_dropped() {
        let len = 32 << 20;
        let before = rss_kib();
        let r = match TakeoverReserve::set_aside(len) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) || e.raw_os_error() == Some(libc::ENOMEM) => {
                eprintln!("mlock refused ({e}): skipped");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert_eq!(r.len(), len);
        let held = rss_kib();
        // Other tests run in this process meanwhile: a margin of 8 MiB either way.
        assert!(held >= before + 24 * 1024, "resident: {before} -> {held} KiB");
        drop(r);
        let after = rss_kib();
        assert!(after + 24 * 1024 <= held, "given back: {held} -> {after} KiB");
    }
}
