//! The cache's range locks: striped mutexes over 64 KiB granules of the device.
//!
//! A request that changes the origin or inserts what it read (a write, discard, write-zeroes,
//! a read miss with its readahead) holds the stripes of its page range from before its origin
//! I/O until its slots are updated, so that no other such request can change the origin
//! between the two: what it caches is what the origin holds (the cache's invariant,
//! `cache/mod.rs`). Read hits and eviction take no stripe.
//!
//! Deadlock freedom: a request takes all its stripes in one [`Stripes::lock`] call, in
//! ascending stripe order, each once, and takes no other stripe until it releases them.

use parking_lot::lock_api::RawMutex as _;
use parking_lot::RawMutex;

/// Number of stripes.
pub(crate) const STRIPES: usize = 1024;
/// Pages per granule: the unit that maps to a stripe (64 KiB).
pub(crate) const GRANULE_PAGES: u64 = 16;
const WORDS: usize = STRIPES / 64;

pub(crate) struct Stripes {
    locks: Box<[RawMutex]>,
}

/// The stripes one request holds; dropping it releases them.
pub(crate) struct RangeGuard<'a> {
    stripes: &'a Stripes,
    held: [u64; WORDS],
}

impl Stripes {
    pub fn new() -> Stripes {
        Stripes { locks: (0..STRIPES).map(|_| RawMutex::INIT).collect() }
    }

    /// Locks the stripes of pages `first..end` (ascending, deduplicated).
    pub fn lock(&self, first: u64, end: u64) -> RangeGuard<'_> {
        let mut held = [0u64; WORDS];
        if end > first {
            let (g0, g1) = (first / GRANULE_PAGES, (end - 1) / GRANULE_PAGES);
            if g1 - g0 + 1 >= STRIPES as u64 {
                held = [u64::MAX; WORDS];
            } else {
                for g in g0..=g1 {
                    let s = (g % STRIPES as u64) as usize;
                    held[s / 64] |= 1 << (s % 64);
                }
            }
        }
        let guard = RangeGuard { stripes: self, held };
        guard.each(|s| self.locks[s].lock());
        guard
    }
}

impl RangeGuard<'_> {
    fn each(&self, mut f: impl FnMut(usize)) {
        for (w, &bits) in self.held.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                let i = b.trailing_zeros() as usize;
                f(w * 64 + i);
                b &= b - 1;
            }
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: every stripe in `held` was locked by `Stripes::lock` for this guard, which
        // is the only owner of those locks and releases each once, here.
        self.each(|s| unsafe { self.stripes.locks[s].unlock() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;

    #[test]
    fn overlapping_ranges_exclude_each_other_and_never_deadlock() {
        const PAGES: u64 = 40_000;
        let s = Arc::new(Stripes::new());
        let busy: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (s, busy) = (s.clone(), busy.clone());
                std::thread::spawn(move || {
                    for k in 0..1000u64 {
                        // Ranges in different places of the stripe table (they wrap around
                        // it), now and then one that covers every stripe.
                        let first = (k * 7919 + t * 5003) % (PAGES - 20_000);
                        let len = if k % 97 == 0 { 20_000 } else { 1 + k % 40 };
                        let _g = s.lock(first, first + len);
                        for p in first..first + len {
                            assert_eq!(busy[p as usize].fetch_add(1, Relaxed), 0, "page {p} held twice");
                        }
                        for p in first..first + len {
                            busy[p as usize].fetch_sub(1, Relaxed);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
    }
}
