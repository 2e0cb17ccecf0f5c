//! Sequential readahead: a small table of streams, atomics only (no lock).
//!
//! A stream is the page where its reader's next miss is expected and its current window. A
//! read miss of pages `first..end` that starts where a stream expects one is sequential: the
//! window doubles (at least the run's length, at most the configured maximum) and that many
//! pages after `end` are read with the miss, in the same origin read. A miss no stream
//! expects takes a table entry (round-robin) as a new stream with no window: random access
//! never reads ahead. Two readers racing for one entry may lose a window (a CAS fails); that
//! costs a readahead, never correctness.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Streams tracked at once (concurrent sequential readers).
const STREAMS: usize = 16;
/// Bits of a packed entry holding the window in pages.
const WINDOW_BITS: u32 = 24;
const WINDOW_MASK: u64 = (1 << WINDOW_BITS) - 1;

pub(crate) struct Streams {
    /// `(expected_first + 1) << WINDOW_BITS | window_pages`; 0: unused.
    table: [AtomicU64; STREAMS],
    next: AtomicUsize,
}

impl Streams {
    pub fn new() -> Streams {
        Streams { table: std::array::from_fn(|_| AtomicU64::new(0)), next: AtomicUsize::new(0) }
    }

    /// A read missed pages `first..end`: how many pages after `end` to read ahead.
    /// `limit(window)` is how many of a window can be read now (device end, buffer room,
    /// pages already cached); the stream then expects its next miss after them.
    pub fn on_miss(&self, first: u64, end: u64, max_pages: u64, limit: impl FnOnce(u64) -> u64) -> u64 {
        if max_pages == 0 {
            return 0;
        }
        let pack = |next: u64, window: u64| ((next + 1) << WINDOW_BITS) | window;
        for e in &self.table {
            let v = e.load(Relaxed);
            if v == 0 || (v >> WINDOW_BITS) - 1 != first {
                continue;
            }
            let window = ((v & WINDOW_MASK) * 2).max(end - first).min(max_pages);
            let ra = limit(window).min(window);
            if e.compare_exchange(v, pack(end + ra, window), Relaxed, Relaxed).is_ok() {
                return ra;
            }
            return 0;
        }
        let slot = self.next.fetch_add(1, Relaxed) % STREAMS;
        self.table[slot].store(pack(end, 0), Relaxed);
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_misses_grow_the_window_and_random_ones_get_none() {
        let s = Streams::new();
        let all = |w| w;
        assert_eq!(s.on_miss(0, 1, 256, all), 0, "a first miss is not a stream yet");
        assert_eq!(s.on_miss(1, 2, 256, all), 1, "at least the run");
        assert_eq!(s.on_miss(3, 4, 256, all), 2, "doubles");
        assert_eq!(s.on_miss(6, 10, 256, all), 4);
        assert_eq!(s.on_miss(14, 15, 256, |_| 3), 3, "limited: the stream expects the miss after what was read");
        assert_eq!(s.on_miss(18, 19, 10, all), 10, "at most the maximum");
        for k in 0..100u64 {
            assert_eq!(s.on_miss(k * 1000 + 500, k * 1000 + 501, 256, all), 0, "strided access is not sequential");
        }
        assert_eq!(Streams::new().on_miss(0, 1, 0, all), 0);
    }
}
