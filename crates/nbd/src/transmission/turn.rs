//! The read turn (lock 1 of [`super`]): the receive half of the socket, which one worker at a
//! time holds to read the next request (its header, [`validate`], admission into the in-flight
//! budget, its payload) and gives back before serving it, unless the short path
//! ([`keep_turn`]) says keeping it is cheaper.
//!
//! Rules 3 and 7 of [`super`] are kept here: a WRITE is handed to its worker only once its
//! whole payload has arrived, and `NBD_CMD_DISC` ends the reading (the requests read before it
//! are still served).

use super::buffer::RequestBuffer;
use super::request::{validate, Command, Job, Reject};
use super::Conn;
use crate::listener::Stream;
use crate::wire::*;
use crate::MAX_PAYLOAD_BYTES;
use compcache_store::Store;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::io::{self, BufReader, Read};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;

/// The receive buffer: large enough to take a header and a page of payload in one syscall,
/// and many pipelined headers at once.
pub(crate) const READ_BUFFER_BYTES: usize = 256 << 10;
/// A rejected WRITE's payload up to this size is read and dropped so the connection can go
/// on; a larger one is taken as hostile and the connection is closed (the protocol allows a
/// hard disconnect for payloads "large enough to be deemed a denial of service attack").
const MAX_SKIP_BYTES: u64 = 2 * MAX_PAYLOAD_BYTES as u64;
/// Requests up to this size (READ/WRITE data, TRIM/WRITE_ZEROES range) count as quick for
/// the short path: 16 pages, a few tens of microseconds of (de)compression at most.
const QUICK_REQUEST_BYTES: usize = 64 << 10;

/// What the holder of the read turn owns (lock 1).
pub(super) struct ReadSide<S: Stream> {
    stream: BufReader<S>,
    /// `seq` of the last request read.
    last_seq: u64,
    /// Why the connection ends, once known: after it is set, nobody reads.
    end: Option<End>,
}

/// The read turn: [`ReadSide`] for one worker at a time. Waiting is sleeping on `free`.
/// `side` is locked only by the worker holding the turn, so it is never contended; it is
/// what gives that worker `&mut` access.
pub(super) struct ReadTurn<S: Stream> {
    taken: Mutex<bool>,
    free: Condvar,
    side: Mutex<ReadSide<S>>,
}

impl<S: Stream> ReadTurn<S> {
    /// A turn over `stream`, with no request read yet.
    pub(super) fn new(stream: BufReader<S>) -> ReadTurn<S> {
        let side = ReadSide { stream, last_seq: 0, end: None };
        ReadTurn { taken: Mutex::new(false), free: Condvar::new(), side: Mutex::new(side) }
    }

    /// Whether the reading ended with `NBD_CMD_DISC`, the clean end.
    pub(super) fn disconnected(&self) -> bool {
        matches!(self.side.lock().end, Some(End::Disconnect))
    }

    /// Takes the turn: at once if it is free, else sleeping until it is given back.
    pub(super) fn take(&self) -> TurnGuard<'_, S> {
        {
            let mut taken = self.taken.lock();
            while *taken {
                self.free.wait(&mut taken);
            }
            *taken = true;
        }
        TurnGuard { turn: self, side: Some(self.side.lock()) }
    }
}

/// The read turn, held; given back (waking one waiting worker) when dropped.
pub(super) struct TurnGuard<'a, S: Stream> {
    turn: &'a ReadTurn<S>,
    side: Option<MutexGuard<'a, ReadSide<S>>>,
}

impl<S: Stream> Deref for TurnGuard<'_, S> {
    type Target = ReadSide<S>;
    fn deref(&self) -> &ReadSide<S> {
        self.side.as_ref().expect("held until drop")
    }
}

impl<S: Stream> DerefMut for TurnGuard<'_, S> {
    fn deref_mut(&mut self) -> &mut ReadSide<S> {
        self.side.as_mut().expect("held until drop")
    }
}

impl<S: Stream> Drop for TurnGuard<'_, S> {
    fn drop(&mut self) {
        // Unlock `side` first, so the next holder never finds it locked.
        self.side = None;
        *self.turn.taken.lock() = false;
        self.turn.free.notify_one();
    }
}

/// How a connection ends; decided by the worker holding the read turn when it does.
enum End {
    /// `NBD_CMD_DISC`: the clean end.
    Disconnect,
    /// A reply failed (already logged), or a worker panicked.
    Failed,
    /// Anything else, with the one line to log.
    Error(String),
}

/// What a worker got from its turn at the socket.
pub(super) enum Next {
    /// An accepted request, admitted into the in-flight budget; a WRITE's payload is in the
    /// worker's buffer.
    Serve(Job),
    /// A rejected request, already counted (and its payload skipped): reply with the error.
    Reject(Request, Reject),
    /// The connection is ending: no more requests.
    Stop,
}

/// The short path: whether the worker that read `next` keeps the read turn while it serves
/// it, and then reads the next request itself. Giving the turn back wakes another worker
/// (a futex wake on this request's path, a context switch for the woken worker, and on a busy
/// machine a wait for a CPU) only for it to block in `read`; at queue depth 1 that is all
/// overhead. So the turn is kept when nothing else is waiting to be read (neither in the
/// receive buffer nor in the socket) and the request is quick: a RAM-only store (no backing
/// device, whose reads and overflow writes may wait for the disk) and at most
/// [`QUICK_REQUEST_BYTES`]. A request that arrives after the check waits for at most that
/// one quick request.
pub(super) fn keep_turn<S: Stream>(store: &Store, rs: &mut ReadSide<S>, next: &Next) -> bool {
    let quick = match next {
        Next::Serve(job) => job.cmd == Command::Flush || job.req.len as usize <= QUICK_REQUEST_BYTES,
        Next::Reject(..) => true,
        Next::Stop => return false,
    };
    quick && !store.has_backing() && rs.stream.buffer().is_empty() && rs.stream.get_ref().queued_bytes().is_ok_and(|n| n == 0)
}

/// The worker's turn at the socket: reads the next request, or records why there is none.
pub(super) fn next_request<S: Stream>(rs: &mut ReadSide<S>, store: &Store, conn: &Conn<S>, id: usize, buf: &mut RequestBuffer) -> Next {
    if rs.end.is_some() {
        return Next::Stop;
    }
    let end = if conn.failed.load(Ordering::Acquire) {
        End::Failed
    } else {
        match read_request(rs, store, conn, id, buf) {
            Ok(next) => return next,
            Err(_) if conn.failed.load(Ordering::Acquire) => End::Failed,
            Err(end) => end,
        }
    };
    if let End::Error(msg) = &end {
        conn.log_once(msg);
    }
    rs.end = Some(end);
    Next::Stop
}

/// Reads one request header, validates it, admits it and reads its payload.
fn read_request<S: Stream>(rs: &mut ReadSide<S>, store: &Store, conn: &Conn<S>, id: usize, buf: &mut RequestBuffer) -> Result<Next, End> {
    let reader = &mut rs.stream;
    let mut header = [0u8; REQUEST_HEADER_BYTES];
    match read_full(reader, &mut header) {
        Ok(REQUEST_HEADER_BYTES) => {}
        Ok(0) => return Err(End::Error("client closed the connection without NBD_CMD_DISC".into())),
        Ok(n) => return Err(End::Error(format!("client disconnected after {n} of the {REQUEST_HEADER_BYTES} bytes of a request header"))),
        Err(e) => return Err(End::Error(format!("cannot read a request: {e}; closing the connection"))),
    }
    let req = Request::decode(&header).map_err(|magic| {
        End::Error(format!(
            "bad request magic {magic:#010x} (expected {REQUEST_MAGIC:#010x}): the stream is garbage; closing the connection"
        ))
    })?;

    let cmd = match validate(&req, store.disksize_bytes(), &conn.negotiated) {
        Ok(Command::Disconnect) => return Err(End::Disconnect),
        Ok(cmd) => cmd,
        Err(r) => {
            store.note_invalid_io();
            if req.cmd == CMD_WRITE {
                if req.len as u64 > MAX_SKIP_BYTES {
                    return Err(End::Error(format!(
                        "WRITE with a {}-byte payload (above {MAX_SKIP_BYTES}, too large to skip); closing the connection",
                        req.len
                    )));
                }
                match io::copy(&mut reader.by_ref().take(req.len as u64), &mut io::sink()) {
                    Ok(n) if n == req.len as u64 => {}
                    Ok(n) => return Err(End::Error(truncated_write(&req, n as usize))),
                    Err(e) => return Err(End::Error(format!("cannot read a request: {e}; closing the connection"))),
                }
            }
            return Ok(Next::Reject(req, r));
        }
    };

    rs.last_seq += 1;
    let job = Job { req, cmd, seq: rs.last_seq };
    if !conn.inflight.admit(id, &job, &conn.failed) {
        return Err(End::Failed);
    }
    if cmd == Command::Write {
        let payload = buf.data(req.len as usize);
        let got = read_full(reader, payload);
        match got {
            Ok(n) if n == req.len as usize => {}
            Ok(n) => {
                conn.inflight.release(id, &job);
                return Err(End::Error(truncated_write(&req, n)));
            }
            Err(e) => {
                conn.inflight.release(id, &job);
                return Err(End::Error(format!("cannot read a WRITE payload: {e}; closing the connection")));
            }
        }
    }
    Ok(Next::Serve(job))
}

fn truncated_write(req: &Request, got: usize) -> String {
    format!(
        "client disconnected in the middle of a WRITE (offset {}, {} of {} payload bytes received); that write was not applied",
        req.offset, got, req.len
    )
}
