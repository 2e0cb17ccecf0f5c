//! Memory reserved up front for the store's hot path, so that a swap server cannot deadlock
//! when the machine is out of memory.
//!
//! The problem: the kernel swaps a page out to us, and we need memory to store it. If that
//! memory comes from a page fault while the machine is at its minimum watermark, the fault
//! enters direct reclaim, which (the server being an I/O flusher) may not swap, so it can
//! only wait for memory that will be freed when the swap-outs complete, and those wait for
//! us. zram escapes this because its allocations run in the reclaimer's context, allowed to
//! dip into the kernel's reserves; a userspace server is not.
//!
//! The way out: the I/O path never faults for new memory. The store runs in fault-free mode
//! (`Store::set_fault_free`): its pool takes only pages that are already resident, and a
//! write that would need a fresh page fails with ENOSPC instead of faulting (the kernel keeps
//! that page in memory, marks it dirty and tries again later: nothing is lost). The resident
//! pages come from a *reserve* that this keeper fills with `Store::prefault`, which faults
//! pages in with no store lock held; under `mlockall` they stay resident, and so do pages the
//! pool frees (madvise cannot drop locked pages), which it reuses first. When the reserve runs
//! below three quarters, the keeper thread tops it up: the allocation that takes it below wakes
//! the keeper, which otherwise sleeps. Its page faults may wait in reclaim,
//! but nothing waits for the keeper without a bound: meanwhile the I/O path stores pages from
//! what is left of the reserve, the kernel frees the swapped-out pages, and the keeper's
//! faults complete. A write that finds the reserve empty waits for the keeper up to `WAIT`
//! (polling, no lock held), then fails. Size the
//! reserve (`--reserve`) for the burst of compressed data you expect between two refills.
//! The slot table is made resident before the device starts.

use std::sync::Arc;
use std::time::Duration;

use compcache_store::{Store, PAGE_SIZE};

const PAGE: u64 = PAGE_SIZE as u64;
/// How often the keeper looks at the reserve when nothing wakes it. The pool wakes it as soon
/// as an allocation leaves the reserve under its low mark (`Store::watch_reserve`), so this is
/// only a safety net; it polled every 10 ms before, a hundred wake-ups a second on an idle
/// machine.
const IDLE_LOOK: Duration = Duration::from_secs(1);
/// How long a write that finds the reserve empty waits for the keeper before it fails with
/// ENOSPC (`Store::set_reserve_wait`). In the VM test's `global` step (the whole guest out of
/// memory, a 256 MiB scan, other work on the host), failing at once refused 70 and 1890
/// swap-outs in two runs; waiting up to 20 ms with the keeper refilling below half refused 7
/// and 461; waiting up to 50 ms with the keeper refilling below three quarters, 0 and 0.
const WAIT: Duration = Duration::from_millis(50);

/// The reserve's size for a machine with `ram_bytes` of RAM (refilled below three quarters of
/// it): 1/128 of RAM, within 8..=128 MiB, absorbs a burst of several thousand swapped pages while
/// the keeper waits for memory.
pub fn default_high_bytes(ram_bytes: u64) -> u64 {
    let low = (ram_bytes / 256).clamp(4 << 20, 64 << 20);
    2 * low / PAGE * PAGE
}

/// The keeper of one store's reserve.
pub struct Reserve {
    store: Arc<Store>,
    low_pages: u64,
    high_pages: u64,
}

impl Reserve {
    /// A keeper that holds `high_bytes` of resident free pool memory for `store` (bounded by
    /// the store's memory limit, which `Store::prefault` respects).
    pub fn new(store: Arc<Store>, high_bytes: u64) -> Reserve {
        let high_pages = (high_bytes / PAGE).max(2);
        Reserve { store, low_pages: high_pages * 3 / 4, high_pages }
    }

    /// Makes the slot table resident (`Store::make_slot_table_resident`: no page is read, so a
    /// successor decompresses nothing and a cache reads nothing from its origin), fills the
    /// reserve if `fill`, and puts the store in fault-free mode. Call before the device starts.
    ///
    /// A successor passes `fill` false: it starts with the free pages the dead server left
    /// (recovery hands them over), and [`Reserve::keep`], started once the device serves
    /// again, fills the rest. Filling here would fault new pages of the state in while the
    /// device's I/O waits for this process, and with the machine's memory short that
    /// allocation waits in reclaim for swap-outs to this very device: in the VM test's
    /// `global-kill` step a ublk successor sat so (`shmem_fault` -> `try_to_free_pages` right
    /// after "took the store over"), and the device never served again. Until the keeper has
    /// filled it, a write that finds the reserve empty waits for it (`set_reserve_wait`) and
    /// then fails with ENOSPC, which the kernel's swap retries later.
    pub fn prime(&mut self, fill: bool) {
        self.store.make_slot_table_resident();
        if fill {
            self.top_up();
        }
        self.store.set_fault_free(true);
        self.store.set_reserve_wait(WAIT);
    }

    /// Pages the pool holds resident but unused: what the I/O path can still take.
    pub fn free_pages(&self) -> u64 {
        self.store.reserve_free_pages()
    }

    /// Brings the free reserve up to `high_pages` (within the store's memory limit).
    fn top_up(&self) {
        let want = self.high_pages.saturating_sub(self.free_pages());
        if want > 0 {
            self.store.prefault(want);
        }
    }

    /// The keeper's loop: top up whenever the free reserve is below three quarters. It sleeps
    /// until the pool wakes it (an allocation that leaves the reserve below that) or
    /// `IDLE_LOOK` has passed. Never returns.
    pub fn keep(self) {
        self.store.watch_reserve(self.low_pages);
        loop {
            // Re-armed before looking: an allocation that crosses the mark after this wakes
            // the park below at once (an unpark before the park is kept for it).
            self.store.rearm_reserve_watch();
            if self.free_pages() < self.low_pages {
                self.top_up();
            }
            std::thread::park_timeout(IDLE_LOOK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compcache_store::Config;

    #[test]
    fn the_reserve_is_resident_and_bounds_the_io_path() {
        let high = 64 * PAGE;
        let store = Arc::new(Store::new(Config::with_disksize(1024 * PAGE)).unwrap());
        let mut r = Reserve::new(Arc::clone(&store), high);
        r.prime(true);
        assert_eq!(r.free_pages(), 64, "reserve of {} pages", r.free_pages());
        assert_eq!(store.stats().orig_data_size, 0, "nothing stored to make the reserve");

        // The I/O path can store pages while the reserve lasts, then gets ENOSPC, not a fault.
        let mut ctx = store.context();
        let mut stored = 0;
        let mut seed = 1u64;
        for i in 0..1024u64 {
            let page: Vec<u8> = (0..PAGE_SIZE)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect();
            match store.write(&mut ctx, i * PAGE, &page) {
                Ok(()) => stored += 1,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC);
                    break;
                }
            }
        }
        assert_eq!(stored, 64, "incompressible pages take one reserve page each");
        // The keeper tops the reserve up again, and writes go through.
        r.top_up();
        assert_eq!(r.free_pages(), 64);
        store.write(&mut ctx, 1000 * PAGE, &[0x5a; PAGE_SIZE]).unwrap();
    }

    #[test]
    fn a_successor_primes_without_faulting_pages_in_and_the_keeper_fills_later() {
        let store = Arc::new(Store::new(Config::with_disksize(1024 * PAGE)).unwrap());
        let mut r = Reserve::new(Arc::clone(&store), 64 * PAGE);
        r.prime(false);
        assert_eq!(r.free_pages(), 0, "no page faulted in before the device serves");
        // Fault-free already: a write with no page to take fails (after the wait), not faults.
        let mut ctx = store.context();
        let random: Vec<u8> = (0..PAGE_SIZE).map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[3]).collect();
        assert_eq!(store.write(&mut ctx, 0, &random).unwrap_err().errno(), libc::ENOSPC);
        // The keeper, once started, fills it, and the write goes through.
        r.top_up();
        assert_eq!(r.free_pages(), 64);
        store.write(&mut ctx, 0, &random).unwrap();
    }

    #[test]
    fn the_reserve_stays_within_the_memory_limit() {
        let mut cfg = Config::with_disksize(1024 * PAGE);
        cfg.mem_limit_bytes = 16 * PAGE;
        let store = Arc::new(Store::new(cfg).unwrap());
        let mut r = Reserve::new(Arc::clone(&store), 64 * PAGE);
        r.prime(true);
        assert_eq!(r.free_pages(), 16);
    }

    #[test]
    fn sizes() {
        assert_eq!(default_high_bytes(256 << 20), 8 << 20);
        assert_eq!(default_high_bytes(64 << 30), 128 << 20);
    }
}
