//! The read turn (lock 1 of [`super`]): the receive half of the socket, which one worker at a
//! time holds to read the next request (its header, [`validate`], admission into the in-flight
//! budget, its payload) and gives back before serving it, unless the short path
//! ([`keep_turn`]) says keeping it is cheaper.
//!
//! Rules 3, 7 and 8 of [`super`] are kept here: a WRITE is handed to its worker only once its
//! whole payload has arrived (taken from the budgets chunk by chunk as it comes), `NBD_CMD_DISC`
//! ends the reading (the requests read before it are still served), and a request must be in
//! whole within the request deadline of its first byte.

use super::buffer::RequestBuffer;
use super::request::{validate, Command, Job, Reject};
use super::Conn;
use crate::listener::Stream;
use crate::wire::*;
use crate::MAX_PAYLOAD_BYTES;
use compcache_store::Store;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::io::{self, BufRead, BufReader, Read};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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
/// A WRITE's payload is taken from the in-flight budgets and read in chunks of this size,
/// each once its first bytes have arrived: a client holds budget only for what it sends.
const PAYLOAD_CHUNK_BYTES: usize = 256 << 10;

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
    taken: Mutex<TurnState>,
    free: Condvar,
    side: Mutex<ReadSide<S>>,
}

#[derive(Default)]
struct TurnState {
    taken: bool,
    /// Workers sleeping until the turn is free.
    waiting: usize,
}

impl<S: Stream> ReadTurn<S> {
    /// A turn over `stream`, with no request read yet.
    pub(super) fn new(stream: BufReader<S>) -> ReadTurn<S> {
        let side = ReadSide { stream, last_seq: 0, end: None };
        ReadTurn { taken: Mutex::new(TurnState::default()), free: Condvar::new(), side: Mutex::new(side) }
    }

    /// Whether the reading ended with `NBD_CMD_DISC`, the clean end.
    pub(super) fn disconnected(&self) -> bool {
        matches!(self.side.lock().end, Some(End::Disconnect))
    }

    /// Whether a worker is waiting for the turn (else one more may be started to read the
    /// next request while the others serve theirs).
    pub(super) fn has_waiter(&self) -> bool {
        self.taken.lock().waiting > 0
    }

    /// Takes the turn: at once if it is free, else sleeping until it is given back.
    pub(super) fn take(&self) -> TurnGuard<'_, S> {
        {
            let mut t = self.taken.lock();
            while t.taken {
                t.waiting += 1;
                self.free.wait(&mut t);
                t.waiting -= 1;
            }
            t.taken = true;
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
        self.turn.taken.lock().taken = false;
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
        // After `Server::stop_reading` the socket ends for the server's own reasons.
        if !conn.reading_stopped.load(Ordering::Acquire) {
            conn.log_once(msg);
        }
    }
    rs.end = Some(end);
    Next::Stop
}

/// Reads one request header, validates it, admits it and reads its payload. The first byte
/// of the header may take as long as the client likes (an idle connection); the rest of the
/// request, payload included, must be in within the request deadline of it (rule 8).
fn read_request<S: Stream>(rs: &mut ReadSide<S>, store: &Store, conn: &Conn<S>, id: usize, buf: &mut RequestBuffer) -> Result<Next, End> {
    let mut header = [0u8; REQUEST_HEADER_BYTES];
    match read_full(&mut rs.stream, &mut header[..1]) {
        Ok(1) => {}
        Ok(_) => return Err(End::Error("client closed the connection without NBD_CMD_DISC".into())),
        Err(e) => return Err(End::Error(format!("cannot read a request: {e}; closing the connection"))),
    }
    let mut reader = Timed::new(&mut rs.stream, &conn.shutdown, conn.request_deadline);
    match read_full(&mut reader, &mut header[1..]) {
        Ok(n) if n == REQUEST_HEADER_BYTES - 1 => {}
        Ok(n) => {
            return Err(End::Error(format!("client disconnected after {} of the {REQUEST_HEADER_BYTES} bytes of a request header", n + 1)))
        }
        Err(e) if timed_out(&e) => {
            return Err(End::Error(format!(
                "the rest of a request header did not arrive within {:?} of its first byte; closing the connection",
                conn.request_deadline.unwrap_or_default()
            )))
        }
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
                    Err(e) => return Err(End::Error(payload_error(conn, &req, &e))),
                }
            }
            return Ok(Next::Reject(req, r));
        }
    };

    rs.last_seq += 1;
    let job = Job { req, cmd, seq: rs.last_seq };
    // A READ's or BLOCK_STATUS's bytes are taken now; a WRITE's as its payload arrives.
    let now = if cmd == Command::Write { 0 } else { job.cost() };
    if !conn.inflight.admit(id, &job, now, &conn.failed) {
        return Err(End::Failed);
    }
    if cmd == Command::Write {
        let mut held = 0;
        let got = receive_payload(&mut reader, conn, &req, &mut held, buf);
        if req.len as usize > PAYLOAD_CHUNK_BYTES {
            // Only a payload of several chunks can have taken priority.
            conn.inflight.end_reception();
        }
        if let Err(end) = got {
            // A payload not received whole is never applied (rule 3): what it held goes back.
            conn.inflight.release(id, &job, held);
            return Err(end);
        }
    }
    Ok(Next::Serve(job))
}

/// Reads the payload of WRITE `req` into `buf`, a chunk at a time: once a chunk's first
/// bytes are there, takes room for it in the budgets (`held` counts what is taken), then
/// reads it. The time spent waiting for room is the server's, not the client's: the deadline
/// moves on by it.
fn receive_payload<S: Stream>(
    reader: &mut Timed<'_, S>,
    conn: &Conn<S>,
    req: &Request,
    held: &mut usize,
    buf: &mut RequestBuffer,
) -> Result<(), End> {
    let len = req.len as usize;
    let mut got = 0;
    while got < len {
        match reader.wait_for_bytes() {
            Ok(true) => {}
            Ok(false) => return Err(End::Error(truncated_write(req, got))),
            Err(e) => return Err(End::Error(payload_error(conn, req, &e))),
        }
        let chunk = (len - got).min(PAYLOAD_CHUNK_BYTES);
        let waited = Instant::now();
        if !conn.inflight.take(*held, chunk, len, &conn.failed) {
            return Err(End::Failed);
        }
        reader.extend(waited.elapsed());
        *held += chunk;
        match read_full(reader, &mut buf.data(got + chunk)[got..]) {
            Ok(n) if n == chunk => got += chunk,
            Ok(n) => return Err(End::Error(truncated_write(req, got + n))),
            Err(e) => return Err(End::Error(payload_error(conn, req, &e))),
        }
    }
    Ok(())
}

fn payload_error<S: Stream>(conn: &Conn<S>, req: &Request, e: &io::Error) -> String {
    if timed_out(e) {
        format!(
            "the {}-byte payload of a WRITE (offset {}) did not arrive within {:?} of its request; closing the connection \
             (that write was not applied, and what it held is given back)",
            req.len,
            req.offset,
            conn.request_deadline.unwrap_or_default()
        )
    } else {
        format!("cannot read a WRITE payload: {e}; closing the connection")
    }
}

/// A read that ended because the socket's receive timeout (the deadline) passed.
fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// The receive half under a request's deadline: the socket's receive timeout is set to the
/// time left only before a read that would wait for the socket (nothing buffered), so a
/// request that is in the receive buffer already costs no system call; the timeout is taken
/// off again when it is dropped (an idle connection waits for its next request as long as it
/// likes).
struct Timed<'a, S: Stream> {
    stream: &'a mut BufReader<S>,
    socket: &'a S,
    /// `None`: no deadline (`ServerOptions::request_deadline`).
    deadline: Option<Instant>,
    armed: bool,
}

impl<'a, S: Stream> Timed<'a, S> {
    fn new(stream: &'a mut BufReader<S>, socket: &'a S, limit: Option<Duration>) -> Self {
        Timed { stream, socket, deadline: limit.map(|l| Instant::now() + l), armed: false }
    }

    /// Before a read that would wait for the socket: sets its receive timeout to the time left.
    fn arm(&mut self) -> io::Result<()> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        if !self.stream.buffer().is_empty() {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "request deadline passed"));
        }
        self.armed = true;
        self.socket.set_receive_timeout(Some(left))
    }

    /// Waits (within the deadline) until bytes are there to read; false at end of file.
    fn wait_for_bytes(&mut self) -> io::Result<bool> {
        self.arm()?;
        loop {
            match self.stream.fill_buf() {
                Ok(b) => return Ok(!b.is_empty()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Moves the deadline on by `by` (time the server, not the client, took).
    fn extend(&mut self, by: Duration) {
        if let Some(d) = &mut self.deadline {
            *d += by;
        }
    }
}

impl<S: Stream> Read for Timed<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.read(buf)
    }
}

impl<S: Stream> Drop for Timed<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.socket.set_receive_timeout(None);
        }
    }
}

fn truncated_write(req: &Request, got: usize) -> String {
    format!(
        "client disconnected in the middle of a WRITE (offset {}, {} of {} payload bytes received); that write was not applied",
        req.offset, got, req.len
    )
}
