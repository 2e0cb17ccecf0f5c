//! The server-wide in-flight byte budget: payload bytes (READ data going out, WRITE payloads
//! coming in) held by every connection of one [`crate::Server`] together.
//!
//! Each connection has its own budget as well ([`crate::ServerOptions::max_inflight_bytes`]);
//! this one bounds their sum, so that many connections cannot together pin more memory than
//! the server was given ([`crate::ServerOptions::max_server_inflight_bytes`]).
//!
//! # Admission rule (and why every connection makes progress)
//! A request with a payload of `bytes` is admitted when one of these holds:
//! 1. it fits: in-flight bytes + `bytes` ≤ the budget;
//! 2. the server has nothing in flight (an otherwise idle server always admits one request,
//!    whatever its size, up to the protocol's [`crate::MAX_PAYLOAD_BYTES`]);
//! 3. its connection has nothing in flight and `bytes` ≤ [`GUARANTEED_REQUEST_BYTES`].
//!
//! Rule 3 is the progress guarantee: a client that never reads its replies can pin its own
//! connection's requests (and their bytes) for as long as it likes, but it cannot starve
//! another connection, which can always have one request of up to 128 KiB in flight: swap
//! I/O (at most 128 KiB per request under `compcache nbd-attach`) always gets through.
//! Requests without a payload (FLUSH, TRIM, WRITE_ZEROES) do not take from the budget.
//!
//! # Bound
//! In-flight payload bytes never exceed `max(budget, MAX_PAYLOAD_BYTES)` +
//! connections × [`GUARANTEED_REQUEST_BYTES`]: rule 2 admits one request only when nothing
//! else is in flight, and rule 3 one per connection, only while that connection holds nothing.
//!
//! # Locking
//! One mutex and one condition variable. The budget is taken only by a connection's reader
//! (the worker holding its read turn), never while holding that connection's in-flight lock;
//! under it only that in-flight lock is taken, briefly, to ask whether the connection is idle
//! (so the order is: read turn, budget, in-flight lock). A waiter is woken by every release and by
//! [`Budget::wake_all`] (a failed connection: it must see its `failed` flag and stop waiting).

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};

/// Payload bytes a connection with nothing in flight is always admitted (rule 3), whatever
/// the other connections hold: a swap cluster (32 pages), the largest request
/// `compcache nbd-attach` lets the kernel send.
pub const GUARANTEED_REQUEST_BYTES: usize = 128 << 10;

/// The budget shared by every connection of a server.
pub struct Budget {
    pub(crate) state: Mutex<State>,
    changed: Condvar,
    max_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State {
    /// Payload bytes in flight.
    bytes: usize,
    /// Requests with a payload in flight.
    requests: usize,
}

impl Budget {
    pub fn new(max_bytes: usize) -> Budget {
        Budget { state: Mutex::new(State::default()), changed: Condvar::new(), max_bytes }
    }

    /// The admission rule (module docs).
    fn admits(&self, s: &State, bytes: usize, connection_idle: impl FnOnce() -> bool) -> bool {
        bytes == 0
            || s.bytes.saturating_add(bytes) <= self.max_bytes
            || s.requests == 0
            || (bytes <= GUARANTEED_REQUEST_BYTES && connection_idle())
    }

    /// Takes `bytes` for a request of a connection; waits while the rule says no. False
    /// (nothing taken) if `failed` was set meanwhile. `connection_idle()` says whether the
    /// connection has nothing in flight now: it is asked again at every wake-up, since the
    /// connection's other requests finish while this one waits (it takes the connection's
    /// in-flight lock under the budget's: the one place they nest, in that order).
    pub fn acquire(&self, bytes: usize, connection_idle: &dyn Fn() -> bool, failed: &AtomicBool) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut s = self.state.lock();
        while !self.admits(&s, bytes, connection_idle) {
            if failed.load(Ordering::Acquire) {
                return false;
            }
            self.changed.wait(&mut s);
        }
        s.bytes += bytes;
        s.requests += 1;
        true
    }

    /// Gives back what [`Budget::acquire`] took for a request of `bytes`.
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        {
            let mut s = self.state.lock();
            s.bytes -= bytes;
            s.requests -= 1;
        }
        self.changed.notify_all();
    }

    /// Wakes every waiter, so that one whose connection failed sees it.
    pub fn wake_all(&self) {
        let _s = self.state.lock();
        self.changed.notify_all();
    }

    /// Payload bytes in flight on the whole server now.
    pub fn in_flight_bytes(&self) -> usize {
        self.state.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const MIB: usize = 1 << 20;

    #[test]
    fn requests_are_admitted_while_they_fit() {
        let b = Budget::new(4 * MIB);
        let s = State { bytes: 3 * MIB, requests: 3 };
        assert!(b.admits(&s, MIB, || false), "fits exactly");
        assert!(!b.admits(&s, MIB + 1, || false), "does not fit, connection busy");
        assert!(b.admits(&s, 0, || false), "no payload, no budget");
        assert!(b.admits(&State::default(), 32 * MIB, || false), "an idle server admits one of any size");
    }

    #[test]
    fn an_idle_connection_always_gets_one_small_request() {
        let b = Budget::new(MIB);
        let full = State { bytes: 64 * MIB, requests: 2 };
        assert!(b.admits(&full, GUARANTEED_REQUEST_BYTES, || true), "the progress guarantee");
        assert!(!b.admits(&full, GUARANTEED_REQUEST_BYTES, || false), "only while the connection holds nothing");
        assert!(!b.admits(&full, GUARANTEED_REQUEST_BYTES + 1, || true), "only up to the guaranteed size");
    }

    #[test]
    fn a_waiter_is_admitted_when_room_is_released() {
        let b = Arc::new(Budget::new(2 * MIB));
        let failed = AtomicBool::new(false);
        assert!(b.acquire(2 * MIB, &|| true, &failed));
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| b.acquire(MIB, &|| false, &failed));
            b.release(2 * MIB);
            assert!(waiter.join().unwrap());
        });
        assert_eq!(b.in_flight_bytes(), MIB);
        b.release(MIB);
        assert_eq!(b.in_flight_bytes(), 0);
    }

    #[test]
    fn a_failed_connection_stops_waiting() {
        let b = Budget::new(MIB);
        let failed = AtomicBool::new(false);
        assert!(b.acquire(MIB, &|| true, &failed));
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| b.acquire(MIB, &|| false, &failed));
            failed.store(true, Ordering::Release);
            b.wake_all();
            assert!(!waiter.join().unwrap(), "a waiter whose connection failed takes nothing");
        });
        assert_eq!(b.in_flight_bytes(), MIB);
    }
}
