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
//! So a standby that locks its memory maps [`TAKEOVER_RESERVE_BYTES`] and locks it, and unmaps
//! it when its supervisor hands it the descriptors: those pages return to the kernel's free
//! lists just as the standby starts to allocate, on the CPU it runs on, while the processes
//! that could take them first are mostly waiting for the device. It is the userspace
//! counterpart of the reserve the kernel keeps for its own reclaim (`min_free_kbytes`, which
//! only tasks in reclaim may use), which a process cannot draw on. What it costs: the
//! standby's resident memory while it waits.
//!
//! It takes that memory only from what the kernel has to spare: a thread locks it
//! [`CHUNK_BYTES`] at a time, each only while the zones' free pages stand that much above their
//! high watermarks (`/proc/zoneinfo`: above them kswapd sleeps and no allocation reclaims), and
//! waits for memory to free up otherwise. A standby is started right after a takeover, often
//! with the machine still out of memory; locking 8 MiB at once then took the last free pages
//! from the server that had just come up, whose reserve's keeper needed them to store the
//! swap-outs that would free memory (VM test `global-kill`, 2026-11-29: the standby's main
//! thread in `mlock` of its 8 MiB and the server's keeper both in direct reclaim, on-CPU, for
//! good; the standby's reclaim may not start I/O, so it never gave up and the OOM killer never
//! came). Whatever is locked when the takeover begins is given back.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a standby sets aside: more than a takeover allocates before the device serves again
/// (a ublk successor: two queue threads, their contexts and rings, and the recovery's lists,
/// 40 bytes per page stored: 0.7 MiB for 16,000 pages).
pub const TAKEOVER_RESERVE_BYTES: usize = 8 << 20;

/// How much is locked at a time, and how far above the high watermarks the kernel's free
/// memory must stand for it to be taken.
const CHUNK_BYTES: usize = 256 << 10;

/// How long the filling thread waits before it looks at the zones again when memory is short.
const SHORT_LOOK: Duration = Duration::from_millis(100);

/// Anonymous memory, locked as the kernel has it to spare, until dropped (then unmapped:
/// given back).
pub struct TakeoverReserve {
    base: NonNull<libc::c_void>,
    len: usize,
    /// Bytes locked so far, from the start of the mapping.
    locked: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    filler: Option<std::thread::JoinHandle<()>>,
}

impl TakeoverReserve {
    /// Maps `len` bytes (nothing resident yet) and starts the thread that locks them, a chunk
    /// at a time, as memory is to spare (module docs). The error is the kernel's (no address
    /// space, or no thread); nothing stays mapped then. A lock the kernel refuses (the
    /// locked-memory limit) ends the filling, with what was locked kept.
    pub fn set_aside(len: usize) -> io::Result<TakeoverReserve> {
        // SAFETY: a new private anonymous mapping; nothing else refers to the range it returns.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut reserve = TakeoverReserve {
            base: NonNull::new(p).expect("mmap returned a non-null address"),
            len,
            locked: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            filler: None,
        };
        let (base, locked, stop) = (p as usize, Arc::clone(&reserve.locked), Arc::clone(&reserve.stop));
        let filler = std::thread::Builder::new().name("set-aside".into()).spawn(move || fill(base, len, &locked, &stop))?;
        reserve.filler = Some(filler);
        Ok(reserve)
    }

    /// Bytes set aside.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes locked so far.
    pub fn locked(&self) -> usize {
        self.locked.load(Ordering::Relaxed)
    }
}

/// The filling thread: locks `[base, base + len)` a chunk at a time, each once the kernel has
/// it to spare, until all is locked, a lock fails, or `stop`.
fn fill(base: usize, len: usize, locked: &AtomicUsize, stop: &AtomicBool) {
    let mut done = 0;
    while done < len && !stop.load(Ordering::Relaxed) {
        let chunk = CHUNK_BYTES.min(len - done);
        // An unreadable zoneinfo (no /proc) takes the chunk: what a standby did before.
        if spare_bytes().is_some_and(|spare| spare < chunk as u64) {
            std::thread::park_timeout(SHORT_LOOK);
            continue;
        }
        // SAFETY: a range inside the mapping `set_aside` made, which is unmapped only after
        // this thread has been joined; mlock faults its pages in and locks them, and nothing
        // reads or writes them.
        if unsafe { libc::mlock((base + done) as *const libc::c_void, chunk) } != 0 {
            return;
        }
        done += chunk;
        locked.store(done, Ordering::Relaxed);
    }
}

/// Bytes the kernel has free above its zones' high watermarks (and above what each zone keeps
/// back from allocations that could be served from a higher zone), from `/proc/zoneinfo`;
/// `None` if it cannot be read.
fn spare_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/zoneinfo").ok()?;
    Some(spare_pages(&text) * compcache_store::PAGE_SIZE as u64)
}

/// [`spare_bytes`] in pages, from the text of `/proc/zoneinfo`: per zone, its free pages less
/// its high watermark (which includes the watermark's boost) less the largest of its
/// protections (`lowmem_reserve`), counted when above zero.
fn spare_pages(zoneinfo: &str) -> u64 {
    let mut total = 0u64;
    let (mut free, mut high): (Option<u64>, Option<u64>) = (None, None);
    for line in zoneinfo.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Node"), _) => (free, high) = (None, None),
            (Some("pages"), Some("free")) => free = words.next().and_then(|w| w.parse().ok()),
            (Some("high"), Some(n)) => high = n.parse().ok(),
            (Some("protection:"), _) => {
                let kept = line.split(['(', ')', ',', ' ']).filter_map(|w| w.parse::<u64>().ok()).max().unwrap_or(0);
                if let (Some(f), Some(h)) = (free, high) {
                    total += f.saturating_sub(h).saturating_sub(kept);
                }
                (free, high) = (None, None);
            }
            _ => {}
        }
    }
    total
}

impl Drop for TakeoverReserve {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(filler) = self.filler.take() {
            // Wakes it if it waits for memory; a lock under way ends with its chunk.
            filler.thread().unpark();
            let _ = filler.join();
        }
        // SAFETY: the mapping made in `set_aside`, of `len` bytes; no reference into it exists
        // (the reserve never hands one out) and the filling thread has ended.
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
    fn the_reserve_is_locked_as_memory_allows_and_given_back_when_dropped() {
        let len = 32 << 20;
        let before = rss_kib();
        let r = TakeoverReserve::set_aside(len).unwrap();
        assert_eq!(r.len(), len);
        // This machine has far more than 32 MiB above its watermarks: all of it is taken.
        let t0 = std::time::Instant::now();
        while r.locked() < len && t0.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(r.locked(), len, "locked within 20 s (spare memory now: {:?} bytes)", spare_bytes());
        let held = rss_kib();
        // Other tests run in this process meanwhile: a margin of 8 MiB either way.
        assert!(held >= before + 24 * 1024, "resident: {before} -> {held} KiB");
        drop(r);
        let after = rss_kib();
        assert!(after + 24 * 1024 <= held, "given back: {held} -> {after} KiB");
    }

    /// Two zones as a 6.12 kernel prints them (trimmed): DMA with pages above its high
    /// watermark but fewer than it keeps back for DMA32's allocations, DMA32 first plentiful,
    /// then under its (boosted) high watermark, as in the VM test's out-of-memory guest.
    #[test]
    fn spare_memory_is_what_stands_above_each_zones_high_watermark_and_protection() {
        let zone = |name: &str, free: u64, high: u64, protection: &str| {
            format!(
                "Node 0, zone {name:>8}\n  per-node stats\n      nr_inactive_anon 40424\n  pages free     {free}\n        boost    1024\n        min      1570\n        low      1706\n        high     {high}\n        spanned  94176\n        managed  82196\n        protection: ({protection})\n      nr_free_pages {free}\n  pagesets\n    cpu: 0\n              count: 108\n              high:  9999\n              batch: 63\n"
            )
        };
        let dma = zone("DMA", 330, 38, "0, 306, 306, 306, 306");
        let plenty = format!("{dma}{}", zone("DMA32", 20_000, 1842, "0, 0, 0, 0, 0"));
        assert_eq!(spare_pages(&plenty), 20_000 - 1842, "DMA keeps its 330 free pages back (306 protected, high 38)");
        let short = format!("{dma}{}", zone("DMA32", 1499, 1842, "0, 0, 0, 0, 0"));
        assert_eq!(spare_pages(&short), 0, "under the high watermark nothing is spare");
        assert_eq!(spare_pages(""), 0);
        assert!(spare_bytes().is_some(), "this machine has /proc/zoneinfo");
    }
}
