//! The in-flight state of one connection (lock 2 of [`super`]): the payload bytes and
//! requests it has in flight, bounded by its own budget and drawing on the server-wide one
//! ([`crate::budget`]), and which worker executes which modifying request, so that a FLUSH
//! can wait for the writes read before it.
//!
//! Rule 2 of [`super`] (memory is bounded) is enforced here: a request is admitted only when
//! the connection's bytes and requests fit its budget, and an idle connection always admits
//! one. The FLUSH ordering ([`super`], "FUA and FLUSH") is kept here too: a modifying request
//! ([`Command::modifies`](super::Command::modifies)) is recorded by its worker from its
//! admission until its release.

use super::request::Job;
use crate::budget::Budget;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The in-flight state of one connection (lock 2; rules 2 and FLUSH ordering), and its share
/// of the server-wide byte budget (`crate::budget`: taken after this connection's own budget
/// admits a request, with lock 2 released meanwhile; the admitting worker holds the read turn,
/// so nothing else can be admitted on this connection while it waits).
pub(super) struct Inflight {
    state: Mutex<InflightState>,
    changed: Condvar,
    max_bytes: usize,
    max_requests: usize,
    server: Arc<Budget>,
}

struct InflightState {
    bytes: usize,
    requests: usize,
    /// Per worker: the `seq` of the modifying request it is executing, 0 if none.
    modifying: Vec<u64>,
}

impl Inflight {
    pub(super) fn new(workers: usize, max_bytes: usize, max_requests: usize) -> Inflight {
        Inflight {
            state: Mutex::new(InflightState { bytes: 0, requests: 0, modifying: vec![0; workers] }),
            changed: Condvar::new(),
            max_bytes,
            max_requests: max_requests.max(1),
            server: Arc::new(Budget::new(usize::MAX)),
        }
    }

    /// The same, drawing on the server-wide budget `server` as well.
    pub(super) fn sharing(self, server: Arc<Budget>) -> Inflight {
        Inflight { server, ..self }
    }

    /// Admits `job` for `worker`, waiting for room; false if the connection failed meanwhile.
    pub(super) fn admit(&self, worker: usize, job: &Job, failed: &AtomicBool) -> bool {
        let bytes = job.cost();
        let mut s = self.state.lock();
        // An idle connection always admits one request, whatever its size.
        while s.requests > 0 && (s.bytes + bytes > self.max_bytes || s.requests >= self.max_requests) {
            if failed.load(Ordering::Acquire) {
                return false;
            }
            self.changed.wait(&mut s);
        }
        if bytes > 0 {
            drop(s);
            // Nothing else is admitted on this connection meanwhile (the caller holds the read
            // turn); its other requests may finish, which `connection_idle` sees.
            let connection_idle = || self.state.lock().bytes == 0;
            if !self.server.acquire(bytes, &connection_idle, failed) {
                return false;
            }
            s = self.state.lock();
        }
        s.bytes += bytes;
        s.requests += 1;
        if job.cmd.modifies() {
            s.modifying[worker] = job.seq;
        }
        true
    }

    /// Releases what [`Inflight::admit`] took, once the request is answered.
    pub(super) fn release(&self, worker: usize, job: &Job) {
        {
            let mut s = self.state.lock();
            s.bytes -= job.cost();
            s.requests -= 1;
            if job.cmd.modifies() {
                s.modifying[worker] = 0;
            }
        }
        self.server.release(job.cost());
        self.changed.notify_all();
    }

    /// Waits until every modifying request read before request `seq` has been answered (or
    /// the connection failed).
    pub(super) fn wait_for_earlier_writes(&self, seq: u64, failed: &AtomicBool) {
        let mut s = self.state.lock();
        while s.modifying.iter().any(|&m| m != 0 && m < seq) && !failed.load(Ordering::Acquire) {
            self.changed.wait(&mut s);
        }
    }

    /// Wakes every waiter (after `failed` was set, so that they see it).
    pub(super) fn wake_all(&self) {
        {
            let _s = self.state.lock();
            self.changed.notify_all();
        }
        self.server.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transmission::request::tests::job;
    use crate::transmission::request::Command;
    use crate::MAX_PAYLOAD_BYTES;

    #[test]
    fn the_budget_counts_bytes_requests_and_modifying_requests() {
        let failed = AtomicBool::new(false);
        let f = Inflight::new(3, 8192, 8);
        let (w, r, t) = (job(Command::Write, 1, 4096), job(Command::Read, 2, 4096), job(Command::Trim, 3, 1 << 30));
        assert!(f.admit(0, &w, &failed));
        assert!(f.admit(1, &r, &failed));
        assert!(f.admit(2, &t, &failed), "requests without a payload cost no bytes");
        {
            let s = f.state.lock();
            assert_eq!((s.bytes, s.requests), (8192, 3));
            assert_eq!(s.modifying, vec![1, 0, 3], "READs are not waited for by FLUSH");
        }
        f.release(0, &w);
        f.release(1, &r);
        f.release(2, &t);
        let s = f.state.lock();
        assert_eq!((s.bytes, s.requests, s.modifying.clone()), (0, 0, vec![0, 0, 0]));
    }

    #[test]
    fn an_idle_connection_admits_one_large_request() {
        let failed = AtomicBool::new(false);
        let f = Inflight::new(2, 4096, 8);
        let big = job(Command::Write, 1, MAX_PAYLOAD_BYTES);
        assert!(f.admit(0, &big, &failed));
        f.release(0, &big);
        // A failed connection stops a worker waiting for room instead of hanging it.
        assert!(f.admit(0, &big, &failed));
        failed.store(true, Ordering::Release);
        assert!(!f.admit(1, &job(Command::Read, 2, 4096), &failed));
    }

    #[test]
    fn connections_share_the_server_budget() {
        let failed = AtomicBool::new(false);
        let budget = Arc::new(Budget::new(1 << 20));
        let a = Inflight::new(2, 64 << 20, 8).sharing(budget.clone());
        let b = Inflight::new(2, 64 << 20, 8).sharing(budget.clone());
        let held = job(Command::Read, 1, 1 << 20);
        assert!(a.admit(0, &held, &failed), "an idle server admits");
        // The progress guarantee: a connection holding nothing gets a small request through.
        let small = job(Command::Write, 1, crate::budget::GUARANTEED_REQUEST_BYTES as u32);
        assert!(b.admit(0, &small, &failed));
        b.release(0, &small);
        // A larger one waits until the other connection gives room back.
        let large = job(Command::Read, 2, 1 << 20);
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                assert!(b.admit(1, &large, &failed));
                released.load(Ordering::Acquire)
            });
            released.store(true, Ordering::Release);
            a.release(0, &held);
            assert!(waiter.join().unwrap(), "admitted beyond the server budget while another connection held it");
        });
        assert_eq!(budget.in_flight_bytes(), 1 << 20);
        b.release(1, &large);
        assert_eq!(budget.in_flight_bytes(), 0);
    }

    #[test]
    fn flush_waits_for_earlier_writes_only() {
        let failed = AtomicBool::new(false);
        let f = Inflight::new(3, 1 << 20, 8);
        let (earlier, later) = (job(Command::Write, 1, 4096), job(Command::Write, 3, 4096));
        assert!(f.admit(0, &earlier, &failed));
        assert!(f.admit(2, &later, &failed));
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                f.wait_for_earlier_writes(2, &failed);
                released.load(Ordering::Acquire)
            });
            released.store(true, Ordering::Release);
            f.release(0, &earlier);
            assert!(waiter.join().unwrap(), "FLUSH (seq 2) returned before the WRITE read before it was done");
        });
        // The later write does not hold the flush up.
        f.wait_for_earlier_writes(2, &failed);
        f.release(2, &later);
    }
}
