//! The in-flight state of one connection (lock 2 of [`super`]): the payload bytes and
//! requests it has in flight, bounded by its own budget and drawing on the server-wide one
//! ([`crate::budget`]), and which worker executes which modifying request, so that a FLUSH
//! can wait for the writes read before it.
//!
//! Rule 2 of [`super`] (memory is bounded) is enforced here: a request is admitted only when
//! the connection's bytes and requests fit its budget, and an idle connection always admits
//! one. A READ (or BLOCK_STATUS) takes its bytes when it is admitted; a WRITE is admitted with
//! none and takes its payload's bytes chunk by chunk as they arrive ([`Inflight::take`]), so a
//! client that announces a write and sends nothing holds nothing. What a request holds is
//! given back when it is answered, or, for a request whose reply carries no data, as soon as
//! it is executed ([`Inflight::give_back`]): a reply blocked on a client that does not read
//! holds no payload bytes. The FLUSH ordering ([`super`], "FUA and FLUSH") is kept here too:
//! a modifying request ([`Command::modifies`](super::Command::modifies)) is recorded by its
//! worker from its admission until its release.

use super::request::Job;
use crate::budget::Budget;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The in-flight state of one connection (lock 2; rules 2 and FLUSH ordering), and its share
/// of the server-wide byte budget (`crate::budget`: taken after this connection's own budget
/// admits a request or a chunk, with lock 2 released meanwhile; the admitting worker holds
/// the read turn, so nothing else can be admitted on this connection while it waits).
pub(super) struct Inflight {
    state: Mutex<InflightState>,
    changed: Condvar,
    max_bytes: usize,
    max_requests: usize,
    server: Arc<Budget>,
    /// This connection's key in the server budget (its receptions' priority).
    key: u64,
}

struct InflightState {
    bytes: usize,
    requests: usize,
    /// Per worker: the `seq` of the modifying request it is executing, 0 if none.
    modifying: Vec<u64>,
}

impl Inflight {
    /// A connection's state on a server without a shared budget (tests of this file).
    #[cfg(test)]
    pub(super) fn new(workers: usize, max_bytes: usize, max_requests: usize) -> Inflight {
        Inflight::sharing(workers, max_bytes, max_requests, Arc::new(Budget::new(usize::MAX)))
    }

    /// The same, drawing on the server-wide budget `server` as well.
    pub(super) fn sharing(workers: usize, max_bytes: usize, max_requests: usize, server: Arc<Budget>) -> Inflight {
        Inflight {
            state: Mutex::new(InflightState { bytes: 0, requests: 0, modifying: vec![0; workers] }),
            changed: Condvar::new(),
            max_bytes,
            max_requests: max_requests.max(1),
            key: server.key(),
            server,
        }
    }

    /// Admits `job` for `worker` with `bytes` of its cost taken now (all of it for a READ or
    /// BLOCK_STATUS, none for a WRITE, whose payload is taken with [`Inflight::take`]),
    /// waiting for room; false if the connection failed meanwhile.
    pub(super) fn admit(&self, worker: usize, job: &Job, bytes: usize, failed: &AtomicBool) -> bool {
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
            if !self.server.acquire(bytes, bytes, &connection_idle, failed) {
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

    /// Takes `bytes` more for the WRITE payload of `payload_bytes` being received, of which it
    /// holds `held` already: its first chunk is admitted by the server budget's rules for a request, the
    /// others with the reception's priority ([`crate::budget`]). Waits while this connection's
    /// other requests hold bytes and these would not fit its budget (a payload alone on its
    /// connection is always let in). False (nothing taken) if the connection failed meanwhile.
    pub(super) fn take(&self, held: usize, bytes: usize, payload_bytes: usize, failed: &AtomicBool) -> bool {
        let alone = {
            let mut s = self.state.lock();
            while s.bytes > held && s.bytes + bytes > self.max_bytes {
                if failed.load(Ordering::Acquire) {
                    return false;
                }
                self.changed.wait(&mut s);
            }
            s.bytes == held
        };
        let taken = if held == 0 {
            let connection_idle = || self.state.lock().bytes == 0;
            self.server.acquire(bytes, payload_bytes, &connection_idle, failed)
        } else {
            self.server.grow(bytes, payload_bytes, alone, self.key, failed)
        };
        if taken {
            self.state.lock().bytes += bytes;
        }
        taken
    }

    /// The payload being received is in, or will never be: its reception gives up priority in
    /// the server budget.
    pub(super) fn end_reception(&self) {
        self.server.end_reception(self.key);
    }

    /// Gives back `bytes` of what a request holds before it is answered (its payload, once it
    /// is executed and the reply carries none of it).
    pub(super) fn give_back(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.state.lock().bytes -= bytes;
        self.server.release(bytes);
        self.changed.notify_all();
    }

    /// Releases `job` for `worker` once it is answered (or dropped), with the `held` bytes it
    /// still holds.
    pub(super) fn release(&self, worker: usize, job: &Job, held: usize) {
        {
            let mut s = self.state.lock();
            s.bytes -= held;
            s.requests -= 1;
            if job.cmd.modifies() {
                s.modifying[worker] = 0;
            }
        }
        self.server.release(held);
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
        assert!(f.admit(0, &w, w.cost(), &failed));
        assert!(f.admit(1, &r, r.cost(), &failed));
        assert!(f.admit(2, &t, t.cost(), &failed), "requests without a payload cost no bytes");
        {
            let s = f.state.lock();
            assert_eq!((s.bytes, s.requests), (8192, 3));
            assert_eq!(s.modifying, vec![1, 0, 3], "READs are not waited for by FLUSH");
        }
        f.release(0, &w, w.cost());
        f.release(1, &r, r.cost());
        f.release(2, &t, t.cost());
        let s = f.state.lock();
        assert_eq!((s.bytes, s.requests, s.modifying.clone()), (0, 0, vec![0, 0, 0]));
    }

    #[test]
    fn an_idle_connection_admits_one_large_request() {
        let failed = AtomicBool::new(false);
        let f = Inflight::new(2, 4096, 8);
        let big = job(Command::Write, 1, MAX_PAYLOAD_BYTES);
        assert!(f.admit(0, &big, big.cost(), &failed));
        f.release(0, &big, big.cost());
        // A failed connection stops a worker waiting for room instead of hanging it.
        assert!(f.admit(0, &big, big.cost(), &failed));
        failed.store(true, Ordering::Release);
        assert!(!f.admit(1, &job(Command::Read, 2, 4096), 4096, &failed));
    }

    #[test]
    fn connections_share_the_server_budget() {
        let failed = AtomicBool::new(false);
        let budget = Arc::new(Budget::new(1 << 20));
        let a = Inflight::sharing(2, 64 << 20, 8, budget.clone());
        let b = Inflight::sharing(2, 64 << 20, 8, budget.clone());
        let held = job(Command::Read, 1, 1 << 20);
        assert!(a.admit(0, &held, held.cost(), &failed), "an idle server admits");
        // The progress guarantee: a connection holding nothing gets a small request through.
        let small = job(Command::Write, 1, crate::budget::GUARANTEED_REQUEST_BYTES as u32);
        assert!(b.admit(0, &small, small.cost(), &failed));
        b.release(0, &small, small.cost());
        // One above the reserve's requests (`budget::RESERVED_REQUEST_BYTES`) waits until the
        // other connection gives room back.
        let large = job(Command::Read, 2, 2 << 20);
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                assert!(b.admit(1, &large, large.cost(), &failed));
                released.load(Ordering::Acquire)
            });
            released.store(true, Ordering::Release);
            a.release(0, &held, held.cost());
            assert!(waiter.join().unwrap(), "admitted beyond the server budget while another connection held it");
        });
        assert_eq!(budget.in_flight_bytes(), 2 << 20);
        b.release(1, &large, large.cost());
        assert_eq!(budget.in_flight_bytes(), 0);
    }

    #[test]
    fn flush_waits_for_earlier_writes_only() {
        let failed = AtomicBool::new(false);
        let f = Inflight::new(3, 1 << 20, 8);
        let (earlier, later) = (job(Command::Write, 1, 4096), job(Command::Write, 3, 4096));
        assert!(f.admit(0, &earlier, earlier.cost(), &failed));
        assert!(f.admit(2, &later, later.cost(), &failed));
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                f.wait_for_earlier_writes(2, &failed);
                released.load(Ordering::Acquire)
            });
            released.store(true, Ordering::Release);
            f.release(0, &earlier, earlier.cost());
            assert!(waiter.join().unwrap(), "FLUSH (seq 2) returned before the WRITE read before it was done");
        });
        // The later write does not hold the flush up.
        f.wait_for_earlier_writes(2, &failed);
        f.release(2, &later, later.cost());
    }

    #[test]
    fn a_payload_is_taken_as_it_arrives_within_the_connection_budget() {
        let failed = AtomicBool::new(false);
        let budget = Arc::new(Budget::new(64 << 20));
        let f = Inflight::sharing(2, 1 << 20, 8, budget.clone());
        let read = job(Command::Read, 1, 512 << 10);
        assert!(f.admit(1, &read, read.cost(), &failed));
        let write = job(Command::Write, 2, 1 << 20);
        assert!(f.admit(0, &write, 0, &failed), "a WRITE is admitted with none of its payload");
        assert_eq!(budget.in_flight_bytes(), 512 << 10);
        assert!(f.take(0, 256 << 10, 1 << 20, &failed));
        assert!(f.take(256 << 10, 256 << 10, 1 << 20, &failed), "up to the connection's budget");
        let released = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                assert!(f.take(512 << 10, 256 << 10, 1 << 20, &failed));
                released.load(Ordering::Acquire)
            });
            released.store(true, Ordering::Release);
            f.release(1, &read, read.cost());
            assert!(waiter.join().unwrap(), "the payload went over the connection's budget while its READ held it");
        });
        assert!(f.take(768 << 10, 256 << 10, 1 << 20, &failed), "alone, the payload is always let in");
        f.end_reception();
        assert_eq!(budget.in_flight_bytes(), 1 << 20);
        // Executed: the payload goes back before the reply is sent.
        f.give_back(1 << 20);
        assert_eq!(budget.in_flight_bytes(), 0);
        f.release(0, &write, 0);
        let s = f.state.lock();
        assert_eq!((s.bytes, s.requests, s.modifying.clone()), (0, 0, vec![0, 0]));
    }
}
