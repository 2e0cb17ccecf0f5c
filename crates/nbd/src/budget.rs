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
//! 3. its connection has nothing in flight and `bytes` ≤ [`GUARANTEED_REQUEST_BYTES`];
//! 4. its connection has nothing in flight, `bytes` ≤ [`RESERVED_REQUEST_BYTES`], and it fits
//!    the budget plus [`RESERVE_BYTES`].
//!
//! Rule 3 is the progress guarantee: a client that never reads its replies can pin its own
//! connection's requests (and their bytes) until the request deadline drops it
//! ([`crate::ServerOptions::request_deadline`]), but it cannot starve
//! another connection, which can always have one request of up to 128 KiB in flight: swap
//! I/O (at most 128 KiB per request under `compcache nbd-attach`) always gets through.
//! Rule 4 is the reserve that keeps well-behaved clients from waiting on stuck ones: clients
//! that stop reading (or stop in the middle of their payloads) can fill the budget, but each
//! of them holds something, so none of their further requests may use the reserve; a
//! connection that holds nothing still gets a request of up to 1 MiB through at once, until
//! 32 such requests together fill the reserve. Requests without a payload (FLUSH, TRIM,
//! WRITE_ZEROES) do not take from the budget.
//!
//! # Payloads are taken as they arrive
//! A WRITE's payload is not taken whole when its header arrives: its reader takes it a
//! chunk at a time, each once its first bytes are there (`transmission::turn`), so a client
//! that announces large writes and sends nothing holds nothing, and one that trickles holds
//! what it has sent (until the payload deadline drops it). The first chunk is a request
//! admitted by the rules above ([`Budget::acquire`]); each further one ([`Budget::grow`]) is
//! admitted when it fits, or when its reception has *priority*: the first reception that
//! finds no room takes it (if no other holds it) and keeps it until its payload is in or the
//! connection ends; a payload of up to [`RESERVED_REQUEST_BYTES`] alone on its connection may
//! also grow into the reserve (rule 4). Receptions hold part of their payload while they wait for the rest, so
//! without priority several could hold the whole budget between them and wait for each other
//! for ever; with it, one always goes on, finishes, and gives its bytes back.
//!
//! # Bound
//! In-flight payload bytes never exceed `max(budget, MAX_PAYLOAD_BYTES)` +
//! `MAX_PAYLOAD_BYTES` + [`RESERVE_BYTES`] + connections × [`GUARANTEED_REQUEST_BYTES`]: rule
//! 2 admits one request only when nothing else is in flight, priority lets one reception run
//! over by at most one payload, rule 4 lets requests run over by the reserve, and rule 3
//! admits one request per connection, only while that connection holds nothing.
//!
//! # Locking
//! One mutex and one condition variable. The budget is taken only by a connection's reader
//! (the worker holding its read turn), never while holding that connection's in-flight lock;
//! under it only that in-flight lock is taken, briefly, to ask whether the connection is idle
//! (so the order is: read turn, budget, in-flight lock). A waiter is woken by every release, by
//! the end of a reception with priority, and by [`Budget::wake_all`] (a failed connection: it
//! must see its `failed` flag and stop waiting).

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Payload bytes a connection with nothing in flight is always admitted (rule 3), whatever
/// the other connections hold: a swap cluster (32 pages), the largest request
/// `compcache nbd-attach` lets the kernel send.
pub const GUARANTEED_REQUEST_BYTES: usize = 128 << 10;
/// Bytes above the budget that connections holding nothing may take together (rule 4), with
/// requests of up to [`RESERVED_REQUEST_BYTES`] each.
pub const RESERVE_BYTES: usize = 32 << 20;
/// The largest request that may take from [`RESERVE_BYTES`] (rule 4).
pub const RESERVED_REQUEST_BYTES: usize = 1 << 20;

/// The budget shared by every connection of a server.
pub struct Budget {
    pub(crate) state: Mutex<State>,
    changed: Condvar,
    max_bytes: usize,
    /// The next [`Budget::key`].
    next_key: AtomicU64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State {
    /// Payload bytes in flight.
    bytes: usize,
    /// The key of the connection whose reception has priority (module docs), if any.
    priority: Option<u64>,
}

impl Budget {
    pub fn new(max_bytes: usize) -> Budget {
        Budget { state: Mutex::new(State::default()), changed: Condvar::new(), max_bytes, next_key: AtomicU64::new(1) }
    }

    /// A key for one connection, naming it in [`Budget::grow`] and [`Budget::end_reception`].
    pub fn key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// The admission rule (module docs).
    /// `bytes` are taken now, of a request of `request_bytes` (a WRITE's first chunk: less).
    fn admits(&self, s: &State, bytes: usize, request_bytes: usize, connection_idle: impl FnOnce() -> bool) -> bool {
        bytes == 0
            || s.bytes.saturating_add(bytes) <= self.max_bytes
            || s.bytes == 0
            || ((bytes <= GUARANTEED_REQUEST_BYTES || self.reserve_fits(s, bytes, request_bytes)) && connection_idle())
    }

    /// Rule 4: a request of `request_bytes` in all (of which `bytes` are taken now) may use
    /// the reserve.
    fn reserve_fits(&self, s: &State, bytes: usize, request_bytes: usize) -> bool {
        request_bytes <= RESERVED_REQUEST_BYTES && s.bytes.saturating_add(bytes) <= self.max_bytes.saturating_add(RESERVE_BYTES)
    }

    /// Takes `bytes` for a request of a connection; waits while the rule says no. False
    /// (nothing taken) if `failed` was set meanwhile. `connection_idle()` says whether the
    /// connection has nothing in flight now: it is asked again at every wake-up, since the
    /// connection's other requests finish while this one waits (it takes the connection's
    /// in-flight lock under the budget's: the one place they nest, in that order).
    pub fn acquire(&self, bytes: usize, request_bytes: usize, connection_idle: &dyn Fn() -> bool, failed: &AtomicBool) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut s = self.state.lock();
        while !self.admits(&s, bytes, request_bytes, connection_idle) {
            if failed.load(Ordering::Acquire) {
                return false;
            }
            self.changed.wait(&mut s);
        }
        s.bytes += bytes;
        true
    }

    /// Takes `bytes` more for the payload being received by connection `key`, whose first
    /// chunk [`Budget::acquire`] took: at once if they fit, or the reception has priority, or
    /// it is alone on its connection (`alone`) and, at `payload_bytes` in all, may use the
    /// reserve (rule 4); else it takes priority if no other reception holds it, or waits.
    /// False (nothing taken) if `failed` was set meanwhile.
    pub fn grow(&self, bytes: usize, payload_bytes: usize, alone: bool, key: u64, failed: &AtomicBool) -> bool {
        let mut s = self.state.lock();
        loop {
            if s.bytes.saturating_add(bytes) <= self.max_bytes
                || s.priority == Some(key)
                || (alone && self.reserve_fits(&s, bytes, payload_bytes))
            {
                break;
            }
            if s.priority.is_none() {
                s.priority = Some(key);
                break;
            }
            if failed.load(Ordering::Acquire) {
                return false;
            }
            self.changed.wait(&mut s);
        }
        s.bytes += bytes;
        true
    }

    /// The reception of connection `key` is over (its payload is in, or it was dropped): it
    /// gives up priority if it had it.
    pub fn end_reception(&self, key: u64) {
        let mut s = self.state.lock();
        if s.priority == Some(key) {
            s.priority = None;
            drop(s);
            self.changed.notify_all();
        }
    }

    /// Gives back `bytes` of what [`Budget::acquire`] and [`Budget::grow`] took (all of a
    /// request's, or part of it).
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        {
            let mut s = self.state.lock();
            s.bytes -= bytes;
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
        let s = State { bytes: 3 * MIB, ..State::default() };
        assert!(b.admits(&s, MIB, MIB, || false), "fits exactly");
        assert!(!b.admits(&s, MIB + 1, MIB + 1, || false), "does not fit, connection busy");
        assert!(b.admits(&s, 0, 0, || false), "no payload, no budget");
        assert!(b.admits(&State::default(), 32 * MIB, 32 * MIB, || false), "an idle server admits one of any size");
    }

    #[test]
    fn an_idle_connection_always_gets_one_small_request() {
        let b = Budget::new(MIB);
        let full = State { bytes: 64 * MIB, ..State::default() };
        assert!(b.admits(&full, GUARANTEED_REQUEST_BYTES, GUARANTEED_REQUEST_BYTES, || true), "the progress guarantee");
        assert!(!b.admits(&full, GUARANTEED_REQUEST_BYTES, GUARANTEED_REQUEST_BYTES, || false), "only while the connection holds nothing");
        assert!(!b.admits(&full, GUARANTEED_REQUEST_BYTES + 1, GUARANTEED_REQUEST_BYTES + 1, || true), "only up to the guaranteed size");
    }

    #[test]
    fn a_waiter_is_admitted_when_room_is_released() {
        let b = Arc::new(Budget::new(2 * MIB));
        let failed = AtomicBool::new(false);
        assert!(b.acquire(2 * MIB, 2 * MIB, &|| true, &failed));
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| b.acquire(MIB, MIB, &|| false, &failed));
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
        assert!(b.acquire(MIB, MIB, &|| true, &failed));
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| b.acquire(MIB, MIB, &|| false, &failed));
            failed.store(true, Ordering::Release);
            b.wake_all();
            assert!(!waiter.join().unwrap(), "a waiter whose connection failed takes nothing");
        });
        assert_eq!(b.in_flight_bytes(), MIB);
    }

    /// Two receptions that each hold part of their payload and together the whole budget:
    /// without priority both would wait for the other for ever.
    #[test]
    fn receptions_that_hold_the_budget_between_them_do_not_wait_for_each_other() {
        let b = Arc::new(Budget::new(2 * MIB));
        let (a, c) = (b.key(), b.key());
        let failed = AtomicBool::new(false);
        assert!(b.acquire(MIB, MIB, &|| true, &failed));
        assert!(b.acquire(MIB, MIB, &|| true, &failed));
        assert!(b.grow(MIB, 32 * MIB, false, a, &failed), "the first reception that finds no room takes priority");
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| b.grow(MIB, 32 * MIB, false, c, &failed));
            assert!(b.grow(MIB, 32 * MIB, false, a, &failed), "priority goes on");
            // A's payload is in and served: it gives its bytes back and priority up.
            b.release(3 * MIB);
            b.end_reception(a);
            assert!(waiter.join().unwrap(), "the other reception then goes on");
        });
        assert_eq!(b.in_flight_bytes(), 2 * MIB);
        b.end_reception(c);
        b.release(2 * MIB);
        assert_eq!(*b.state.lock(), State::default(), "everything given back, no priority left");
    }

    #[test]
    fn a_reception_without_priority_waits_and_stops_when_its_connection_fails() {
        let b = Budget::new(MIB);
        let (a, c) = (b.key(), b.key());
        let failed = AtomicBool::new(false);
        assert!(b.acquire(MIB, MIB, &|| true, &failed));
        assert!(b.grow(MIB, 32 * MIB, false, a, &failed));
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| b.grow(1, 32 * MIB, false, c, &failed));
            failed.store(true, Ordering::Release);
            b.wake_all();
            assert!(!waiter.join().unwrap(), "a reception without priority waits while the budget is full");
        });
        assert_eq!(b.in_flight_bytes(), 2 * MIB);
    }

    #[test]
    fn connections_that_hold_nothing_share_a_reserve_above_the_budget() {
        let b = Budget::new(4 * MIB);
        let full = State { bytes: 4 * MIB, ..State::default() };
        assert!(b.admits(&full, MIB, MIB, || true), "a 1 MiB request of a connection holding nothing");
        assert!(!b.admits(&full, MIB, MIB, || false), "not for a connection that holds something (a stuck one)");
        assert!(!b.admits(&full, MIB + 1, MIB + 1, || true), "only requests of up to 1 MiB");
        let reserve_used = State { bytes: 4 * MIB + RESERVE_BYTES - MIB + 1, ..State::default() };
        assert!(!b.admits(&reserve_used, MIB, MIB, || true), "only while the reserve has room");
        assert!(b.admits(&reserve_used, GUARANTEED_REQUEST_BYTES, GUARANTEED_REQUEST_BYTES, || true), "rule 3 still holds");
        // A payload alone on its connection grows into the reserve; a stuck one does not.
        let failed = AtomicBool::new(false);
        assert!(b.acquire(4 * MIB, 4 * MIB, &|| true, &failed));
        let (good, stuck) = (b.key(), b.key());
        assert!(b.acquire(256 << 10, MIB, &|| true, &failed), "the first chunk of a 1 MiB payload (rule 4)");
        assert!(b.grow(768 << 10, MIB, true, good, &failed), "the rest of a 1 MiB payload alone on its connection");
        assert_eq!(b.state.lock().priority, None, "without taking priority");
        assert!(b.grow(MIB, 32 * MIB, false, stuck, &failed), "a large payload takes priority instead");
        assert_eq!(b.state.lock().priority, Some(stuck));
    }
}
