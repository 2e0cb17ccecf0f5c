//! Request latency histograms: how long [`crate::Store::read`] and [`crate::Store::write`]
//! took, the calls every front end makes per request, in power-of-two buckets of
//! microseconds (`le` 1 µs, 2 µs, ... 2^22 µs ≈ 4.2 s, then +Inf), with the sum, so that a
//! monitoring system derives rates, means and percentiles (p50, p99) from them.
//!
//! No shared cache line on the I/O path: each [`crate::Context`] (one per I/O thread) records
//! into histograms of its own, and only it writes them (a request holds its context `&mut`),
//! so an update is a relaxed load and store, not a locked read-modify-write. The store keeps
//! a registry of every context's histograms, taken only when a context is made and when the
//! figures are read ([`Registry::snapshot`] sums them); histograms of contexts that are gone
//! are folded into a retired total then, so the registry does not grow with every connection
//! a server has ever had. Nothing here allocates on the I/O path: a context's histograms are
//! made with it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Finite buckets: upper bounds 2^0 .. 2^22 µs; one more counts everything above.
pub const FINITE_BUCKETS: usize = 23;
const BUCKETS: usize = FINITE_BUCKETS + 1;

/// The upper bound of finite bucket `i`, in seconds.
pub fn bucket_bound_secs(i: usize) -> f64 {
    (1u64 << i) as f64 * 1e-6
}

/// The bucket a duration falls in: the first whose bound it does not exceed.
fn bucket_of(d: Duration) -> usize {
    let us = d.as_nanos().div_ceil(1000).max(1);
    // ceil(log2(us)): 1 µs -> 0, 2 -> 1, 3..=4 -> 2, ...
    let b = (128 - (us - 1).leading_zeros()) as usize;
    b.min(BUCKETS - 1)
}

/// One histogram, written by one thread at a time.
#[derive(Default, Debug)]
struct Histogram {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records `d`. Only the owner of the histogram calls it (module docs), so a load and a
    /// store are enough; a concurrent reader sees the old or the new value of each word.
    fn record(&self, d: Duration) {
        let c = &self.counts[bucket_of(d)];
        c.store(c.load(Relaxed) + 1, Relaxed);
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.sum_ns.store(self.sum_ns.load(Relaxed).wrapping_add(ns), Relaxed);
    }

    fn add_to(&self, out: &mut LatencyHistogram) {
        for (o, c) in out.counts.iter_mut().zip(&self.counts) {
            *o += c.load(Relaxed);
        }
        out.sum_ns = out.sum_ns.wrapping_add(self.sum_ns.load(Relaxed));
    }

    /// Adds `other` into this one (the registry's retired total, under its lock).
    fn absorb(&self, other: &Histogram) {
        for (c, o) in self.counts.iter().zip(&other.counts) {
            c.fetch_add(o.load(Relaxed), Relaxed);
        }
        self.sum_ns.fetch_add(other.sum_ns.load(Relaxed), Relaxed);
    }
}

/// Which request a latency is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// A context's histograms.
#[derive(Default, Debug)]
pub(crate) struct ThreadLatency {
    read: Histogram,
    write: Histogram,
}

impl ThreadLatency {
    pub fn record(&self, op: Op, d: Duration) {
        match op {
            Op::Read => self.read.record(d),
            Op::Write => self.write.record(d),
        }
    }
}

/// Every context's histograms (module docs).
#[derive(Default, Debug)]
pub(crate) struct Registry {
    live: Mutex<Vec<Arc<ThreadLatency>>>,
    retired: ThreadLatency,
}

impl Registry {
    /// Histograms for a new context, registered.
    pub fn register(&self) -> Arc<ThreadLatency> {
        let t = Arc::new(ThreadLatency::default());
        self.live.lock().push(Arc::clone(&t));
        t
    }

    /// The sums over every context, past and present.
    pub fn snapshot(&self) -> Latency {
        let mut live = self.live.lock();
        // A context that is gone left only the registry's reference: fold it in.
        live.retain(|t| {
            if Arc::strong_count(t) > 1 {
                return true;
            }
            self.retired.read.absorb(&t.read);
            self.retired.write.absorb(&t.write);
            false
        });
        let mut out = Latency::default();
        for t in live.iter() {
            t.read.add_to(&mut out.read);
            t.write.add_to(&mut out.write);
        }
        self.retired.read.add_to(&mut out.read);
        self.retired.write.add_to(&mut out.write);
        out
    }
}

/// A latency histogram's figures: `counts[i]` requests took at most `bucket_bound_secs(i)`
/// and more than the bound before (the last, above every bound); not cumulative.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    pub counts: [u64; BUCKETS],
    /// The sum of the latencies, in nanoseconds.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// Requests counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The upper bound (seconds) of the bucket that holds quantile `q` (0..=1), as Prometheus'
    /// `histogram_quantile` would bound it; `None` with no request, infinity above the last
    /// bound.
    pub fn quantile_bound_secs(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(if i < FINITE_BUCKETS { bucket_bound_secs(i) } else { f64::INFINITY });
            }
        }
        Some(f64::INFINITY)
    }
}

/// The read and write histograms ([`crate::Store::latency`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    pub read: LatencyHistogram,
    pub write: LatencyHistogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_power_of_two_buckets() {
        let us = Duration::from_micros;
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(Duration::from_nanos(999)), 0);
        assert_eq!(bucket_of(us(1)), 0);
        assert_eq!(bucket_of(Duration::from_nanos(1001)), 1);
        assert_eq!(bucket_of(us(2)), 1);
        assert_eq!(bucket_of(us(3)), 2);
        assert_eq!(bucket_of(us(4)), 2);
        assert_eq!(bucket_of(us(5)), 3);
        assert_eq!(bucket_of(us(1 << 22)), 22);
        assert_eq!(bucket_of(us((1 << 22) + 1)), 23, "above the last bound");
        assert_eq!(bucket_of(Duration::from_secs(3600)), 23);
        for i in 0..FINITE_BUCKETS {
            let bound = Duration::from_secs_f64(bucket_bound_secs(i));
            assert_eq!(bucket_of(bound), i, "a bound is in its own bucket");
        }
    }

    #[test]
    fn contexts_gone_are_kept_in_the_totals() {
        let r = Registry::default();
        let a = r.register();
        let b = r.register();
        a.record(Op::Read, Duration::from_micros(3));
        a.record(Op::Read, Duration::from_micros(3));
        b.record(Op::Read, Duration::from_micros(100));
        b.record(Op::Write, Duration::from_millis(2));
        drop(b);
        let s = r.snapshot();
        assert_eq!((s.read.count(), s.write.count()), (3, 1));
        assert_eq!(s.read.counts[2], 2);
        assert_eq!(s.read.counts[7], 1, "100 µs is in (64, 128]");
        assert_eq!(s.read.sum_ns, 106_000);
        assert_eq!(r.live.lock().len(), 1, "the dropped context left the registry");
        assert_eq!(r.snapshot(), s, "and its figures stayed");
        assert_eq!(s.read.quantile_bound_secs(0.5), Some(4e-6));
        assert_eq!(s.read.quantile_bound_secs(0.99), Some(128e-6));
        assert_eq!(LatencyHistogram::default().quantile_bound_secs(0.5), None);
    }
}
