//! The transmission phase: read a request, validate it completely, then make one store call.
//!
//! # Shape of a connection
//! After the handshake a connection is served by its *workers* (`workers_per_connection`; the
//! connection's own thread is worker 0), each with its own store [`Context`] and request
//! buffer. Workers take turns at the socket: the worker holding the *read turn* reads one
//! request header, validates it with [`validate`], reads its payload (for WRITE), and gives
//! the turn back, so that the next worker can read the next request; then it executes the
//! request with exactly one store call (the `match` in `execute`) and writes the reply
//! itself. No request is handed from one thread to another: up to `workers` requests of one
//! connection run at once. Replies may leave in any order; the client matches them by handle,
//! as the protocol allows.
//!
//! **The short path** (`keep_turn`): when nothing else is waiting to be read and the request
//! is quick (RAM only, at most `QUICK_REQUEST_BYTES`), the worker keeps the turn while it
//! serves the request and then reads the next one itself: at queue depth 1 one thread does
//! everything and the other workers sleep, instead of being woken once per request only to
//! block in `read`.
//!
//! # Concurrency rules
//! Locks of one connection, in the only order in which they nest (1, then 2, then 3):
//! 1. **The read turn** (`ReadTurn`: the receive half of the socket with its buffered bytes,
//!    the request sequence counter, and why the connection ends). Held from the first byte of
//!    a request header to the last byte of its payload (or of a rejected WRITE's skipped
//!    payload); held on through serving and replying only on the short path. Workers waiting
//!    for it sleep on a condition variable: no spinning, the idle workers of a quiet
//!    connection cost nothing, and a worker that finds it free takes it without sleeping.
//! 2. **The in-flight state** (`Inflight`: bytes and requests in flight, and the modifying
//!    request each worker executes). Taken briefly: under the read turn to admit a request
//!    (the holder of the read turn is the only worker that waits for room in the budget), to
//!    release one, and by FLUSH to wait for earlier writes. Both waits sleep on its condition
//!    variable (which releases the mutex) and may hold the read turn meanwhile: what they
//!    wait for (other workers finishing their requests) needs neither. An admitted request
//!    with a payload then takes its share of the server-wide budget (`crate::budget`), with
//!    lock 2 released: the budget's lock is taken under the read turn only, and lock 2 under
//!    it only to ask whether this connection is idle.
//! 3. **The writer lock** (`Conn::writer`: the send half). No lock is taken under it; a reply
//!    is written whole under it (rule 4). The workers waiting on locks 1 and 2 only ever wait
//!    for workers that do not wait for them, so there is no cycle; a client that stops
//!    reading its replies blocks its own connection's workers in `write`, and nothing else.
//!
//! The atomics of `Conn`: `failed` (Release/Acquire) says the connection is dead (a reply
//! could not be sent, or a worker panicked); it is set before the socket is shut down and
//! before waiters on the in-flight state are woken, so a worker woken by either sees it. The
//! log counters and flags are Relaxed/AcqRel and only bound log lines.
//!
//! # What must hold
//! 1. A request is validated completely before anything is done: command, flags, length,
//!    range. A rejected request costs nothing but its reply (and, for WRITE, skipping its
//!    payload); it is counted in the store's `invalid_io`.
//! 2. Memory is bounded: a payload is at most [`MAX_PAYLOAD_BYTES`]; a worker holds one
//!    request at a time, and a request is admitted only when the connection's in-flight bytes
//!    and requests fit its budget (an idle connection always admits one).
//! 3. A write is applied only once its whole payload has arrived: a client that disconnects
//!    mid-request loses that request and nothing else.
//! 4. One reply is one `write_all` under the writer lock (a READ's or BLOCK_STATUS's header
//!    and data from one buffer), so replies never interleave, and a typical reply is one
//!    syscall.
//! 5. No allocation on the I/O path once warm, for requests up to [`KEEP_BUFFER_BYTES`]: each
//!    worker reads WRITE payloads into, and assembles READ and BLOCK_STATUS replies (simple or
//!    structured, [`crate::reply`]) in, its own reused buffer.
//!    A swap device is written to when memory is short; a server that must allocate to accept
//!    a swap-out could wait on the very reclaim it is serving.
//! 6. A connection logs at most a handful of lines: the first rejected requests, the first
//!    store error, and one line saying why it ended if that was not a clean `NBD_CMD_DISC`.
//! 7. `NBD_CMD_DISC` stops the reading; requests read before it are executed and answered,
//!    then the connection is closed.
//!
//! # FUA and FLUSH
//! A request is in the store before it is replied to, and every later read on any connection
//! finds it: that is everything FUA and FLUSH can ask of this device, so FUA needs nothing
//! beyond replying after the store call, and FLUSH calls `Store::flush`, which returns at
//! once. With a backing device too: the index of its records lives in the server's memory,
//! so an fsync would make nothing durable (docs/backing.md, "Flush and FUA"). FLUSH is
//! answered only once every modifying request (WRITE, WRITE_ZEROES, TRIM) read before it on
//! this connection has been executed and answered. The protocol asks less (the writes
//! *completed* before the FLUSH was received; those are in the store already), but a client
//! that pipelines writes and a flush gets what it meant, and its flush reply comes after
//! those writes' replies.

use crate::budget::Budget;
use crate::handshake::{self, Negotiated, Outcome};
use crate::listener::{Deadline, Stream};
use crate::reply::{self, ErrorChunk, HEADROOM};
use crate::tls::TlsMode;
use crate::wire::*;
use crate::{log, meta, Server, MAX_PAYLOAD_BYTES};
use compcache_store::{Context, Store, StoreError};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::io::{self, BufReader, Read};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The receive buffer: large enough to take a header and a page of payload in one syscall,
/// and many pipelined headers at once.
const READ_BUFFER_BYTES: usize = 256 << 10;
/// A rejected WRITE's payload up to this size is read and dropped so the connection can go
/// on; a larger one is taken as hostile and the connection is closed (the protocol allows a
/// hard disconnect for payloads "large enough to be deemed a denial of service attack").
const MAX_SKIP_BYTES: u64 = 2 * MAX_PAYLOAD_BYTES as u64;
/// A worker's request buffer is kept for the next request up to this data size; a larger one
/// is freed after its request.
pub const KEEP_BUFFER_BYTES: usize = 1 << 20;
/// Requests up to this size (READ/WRITE data, TRIM/WRITE_ZEROES range) count as quick for
/// the short path: 16 pages, a few tens of microseconds of (de)compression at most.
const QUICK_REQUEST_BYTES: usize = 64 << 10;
/// Rejected requests logged per connection; the rest are only counted (`invalid_io`).
const LOGGED_REJECTS: u32 = 8;

/// A validated request: what to do, nothing left to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    /// `base:allocation` of a range (only once negotiated).
    BlockStatus,
    Disconnect,
}

/// A request refused by validation, with the protocol error to reply and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub error: u32,
    pub reason: String,
}

fn reject<T>(error: u32, reason: String) -> Result<T, Reject> {
    Err(Reject { error, reason })
}

/// Checks everything about a request before anything is done with it, for a connection that
/// negotiated `neg`.
pub fn validate(req: &Request, disksize_bytes: u64, neg: &Negotiated) -> Result<Command, Reject> {
    let name = command_name(req.cmd);
    let (cmd, allowed_flags) = match req.cmd {
        // DF is valid once advertised, with structured replies; a READ is one chunk anyway.
        CMD_READ if neg.structured_replies => (Command::Read, CMD_FLAG_FUA | CMD_FLAG_DF),
        CMD_READ => (Command::Read, CMD_FLAG_FUA),
        CMD_WRITE => (Command::Write, CMD_FLAG_FUA),
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH => (Command::Flush, CMD_FLAG_FUA),
        CMD_TRIM => (Command::Trim, CMD_FLAG_FUA),
        CMD_WRITE_ZEROES => (Command::WriteZeroes, CMD_FLAG_FUA | CMD_FLAG_NO_HOLE),
        CMD_BLOCK_STATUS if neg.base_allocation => (Command::BlockStatus, CMD_FLAG_FUA | CMD_FLAG_REQ_ONE),
        CMD_BLOCK_STATUS => {
            return reject(
                EINVAL,
                format!("{name} without a metadata context: select {:?} with NBD_OPT_SET_META_CONTEXT first", meta::BASE_ALLOCATION),
            )
        }
        CMD_CACHE => return reject(EINVAL, format!("{name} is not supported (this server does not advertise it)")),
        other => return reject(EINVAL, format!("unknown command {other}")),
    };
    // FUA is valid on every command once SEND_FUA is advertised (the spec: accept, even by
    // ignoring it); anything else must be documented for the command.
    let bad_flags = req.flags & !allowed_flags;
    if bad_flags != 0 {
        return reject(EINVAL, format!("flags {bad_flags:#x} are not valid for {name}"));
    }
    if cmd == Command::Flush {
        if req.offset != 0 || req.len != 0 {
            return reject(EINVAL, format!("FLUSH with offset {} length {}: both must be 0", req.offset, req.len));
        }
        return Ok(cmd);
    }
    if req.len == 0 {
        return reject(EINVAL, format!("{name} of length 0 at offset {}", req.offset));
    }
    if matches!(cmd, Command::Read | Command::Write) && req.len > MAX_PAYLOAD_BYTES {
        return reject(EINVAL, format!("{name} of {} bytes is above the maximum payload of {MAX_PAYLOAD_BYTES}", req.len));
    }
    if req.offset > disksize_bytes || req.len as u64 > disksize_bytes - req.offset {
        // The spec's choice of error: ENOSPC for writing past the end, EINVAL for the rest.
        let error = if matches!(cmd, Command::Write | Command::WriteZeroes) { ENOSPC } else { EINVAL };
        return reject(
            error,
            format!("{name} at offset {} length {} reaches past the end of the {disksize_bytes}-byte device", req.offset, req.len),
        );
    }
    Ok(cmd)
}

/// A request read and admitted by a worker, served by that same worker.
struct Job {
    req: Request,
    cmd: Command,
    /// Position in the connection's request stream (from 1), for FLUSH ordering.
    seq: u64,
}

impl Job {
    /// Bytes of buffer the request holds while in flight (payload in, or data out).
    fn cost(&self) -> usize {
        match self.cmd {
            Command::Read | Command::Write => self.req.len as usize,
            Command::BlockStatus => self.descriptor_room(),
            _ => 0,
        }
    }

    /// Buffer bytes a BLOCK_STATUS reply's descriptors may take.
    fn descriptor_room(&self) -> usize {
        meta::descriptor_room(self.req.offset, self.req.len, self.req.flags & CMD_FLAG_REQ_ONE != 0)
    }

    /// Whether the request changes the device (what a later FLUSH must wait for).
    fn modifies(&self) -> bool {
        matches!(self.cmd, Command::Write | Command::WriteZeroes | Command::Trim)
    }
}

/// The in-flight state of one connection (lock 2; rules 2 and FLUSH ordering), and its share
/// of the server-wide byte budget (`crate::budget`: taken after this connection's own budget
/// admits a request, with lock 2 released meanwhile; the admitting worker holds the read turn,
/// so nothing else can be admitted on this connection while it waits).
struct Inflight {
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
    fn new(workers: usize, max_bytes: usize, max_requests: usize) -> Inflight {
        Inflight {
            state: Mutex::new(InflightState { bytes: 0, requests: 0, modifying: vec![0; workers] }),
            changed: Condvar::new(),
            max_bytes,
            max_requests: max_requests.max(1),
            server: Arc::new(Budget::new(usize::MAX)),
        }
    }

    /// The same, drawing on the server-wide budget `server` as well.
    fn sharing(self, server: Arc<Budget>) -> Inflight {
        Inflight { server, ..self }
    }

    /// Admits `job` for `worker`, waiting for room; false if the connection failed meanwhile.
    fn admit(&self, worker: usize, job: &Job, failed: &AtomicBool) -> bool {
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
        if job.modifies() {
            s.modifying[worker] = job.seq;
        }
        true
    }

    /// Releases what [`Inflight::admit`] took, once the request is answered.
    fn release(&self, worker: usize, job: &Job) {
        {
            let mut s = self.state.lock();
            s.bytes -= job.cost();
            s.requests -= 1;
            if job.modifies() {
                s.modifying[worker] = 0;
            }
        }
        self.server.release(job.cost());
        self.changed.notify_all();
    }

    /// Waits until every modifying request read before request `seq` has been answered (or
    /// the connection failed).
    fn wait_for_earlier_writes(&self, seq: u64, failed: &AtomicBool) {
        let mut s = self.state.lock();
        while s.modifying.iter().any(|&m| m != 0 && m < seq) && !failed.load(Ordering::Acquire) {
            self.changed.wait(&mut s);
        }
    }

    /// Wakes every waiter (after `failed` was set, so that they see it).
    fn wake_all(&self) {
        {
            let _s = self.state.lock();
            self.changed.notify_all();
        }
        self.server.wake_all();
    }
}

/// A worker's buffer for its current request: [`HEADROOM`] for a reply header, then the data
/// (a WRITE's payload coming in, a READ's data or BLOCK_STATUS's descriptors going out), so a
/// reply with data leaves in one write (rule 4). Reused from request to request (rule 5): it
/// grows to the largest request served and is freed after one above [`KEEP_BUFFER_BYTES`],
/// down to what it was made with.
#[derive(Default)]
struct RequestBuffer {
    bytes: Vec<u8>,
    /// Bytes it was made with and keeps (`ServerOptions::request_buffer_bytes` plus the headroom).
    kept: usize,
}

impl RequestBuffer {
    /// A buffer with room for `data_bytes` of data, every page written once so that it is
    /// resident (fresh allocations can be untouched zero pages that fault on first use).
    fn with_room(data_bytes: usize) -> RequestBuffer {
        let kept = if data_bytes == 0 { 0 } else { HEADROOM + data_bytes };
        RequestBuffer { bytes: vec![0x5a; kept], kept }
    }

    /// The data area for a request of `len` bytes. Its previous contents are left as they are
    /// (no zeroing on the hot path): a WRITE payload overwrites all of it before it is used,
    /// and only what the store filled of it is sent.
    fn data(&mut self, len: usize) -> &mut [u8] {
        let end = HEADROOM + len;
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        &mut self.bytes[HEADROOM..end]
    }

    /// A reply: `header` (at most [`HEADROOM`] bytes) written just in front of the first `len`
    /// bytes of [`RequestBuffer::data`], and both as one slice.
    fn reply(&mut self, header: &[u8], len: usize) -> &[u8] {
        let start = HEADROOM - header.len();
        self.bytes[start..HEADROOM].copy_from_slice(header);
        &self.bytes[start..HEADROOM + len]
    }

    /// Frees the buffer if the last request made it large (back to what it was made with).
    fn trim(&mut self) {
        if self.bytes.len() > (HEADROOM + KEEP_BUFFER_BYTES).max(self.kept) {
            *self = RequestBuffer::with_room(self.kept.saturating_sub(HEADROOM));
        }
    }
}

/// What the holder of the read turn owns (lock 1).
struct ReadSide<S: Stream> {
    stream: BufReader<S>,
    /// `seq` of the last request read.
    last_seq: u64,
    /// Why the connection ends, once known: after it is set, nobody reads.
    end: Option<End>,
}

/// The read turn: [`ReadSide`] for one worker at a time. Waiting is sleeping on `free`.
/// `side` is locked only by the worker holding the turn, so it is never contended; it is
/// what gives that worker `&mut` access.
struct ReadTurn<S: Stream> {
    taken: Mutex<bool>,
    free: Condvar,
    side: Mutex<ReadSide<S>>,
}

impl<S: Stream> ReadTurn<S> {
    fn new(side: ReadSide<S>) -> ReadTurn<S> {
        ReadTurn { taken: Mutex::new(false), free: Condvar::new(), side: Mutex::new(side) }
    }

    /// Takes the turn: at once if it is free, else sleeping until it is given back.
    fn take(&self) -> TurnGuard<'_, S> {
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
struct TurnGuard<'a, S: Stream> {
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

/// The state a connection's workers share.
struct Conn<S: Stream> {
    label: String,
    /// Lock 1: the receive half.
    reader: ReadTurn<S>,
    /// Lock 3, the writer lock: every reply is written whole while holding it (rule 4).
    writer: Mutex<S>,
    /// A third handle, used only to shut the socket down (a worker may hold the read turn
    /// while blocked in `read`, or the writer lock while blocked in `write`).
    shutdown: S,
    /// Lock 2.
    inflight: Inflight,
    /// The connection is dead: replies are not sent, nothing more is read.
    failed: AtomicBool,
    /// A line about how this connection ends has been logged: log no more (rule 6).
    quiet: AtomicBool,
    rejects_logged: AtomicU32,
    store_error_logged: AtomicBool,
    /// `ServerOptions::request_buffer_bytes`.
    request_buffer_bytes: usize,
    /// What the handshake negotiated: structured replies, metadata contexts.
    negotiated: Negotiated,
}

impl<S: Stream> Conn<S> {
    /// Sends one reply; on failure marks the connection dead.
    fn send(&self, bytes: &[u8]) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return false;
        }
        let result = self.writer.lock().write_all(bytes);
        match result {
            Ok(()) => true,
            Err(e) => {
                if !self.failed.load(Ordering::Acquire) && !self.quiet.swap(true, Ordering::AcqRel) {
                    log(&self.label, &format!("cannot send a reply ({e}); closing the connection"));
                }
                self.fail();
                false
            }
        }
    }

    /// Sends an error reply: an `ERROR` chunk with `message` once structured replies are
    /// negotiated (the spec: never a simple reply to a READ then), else a simple reply.
    fn send_error(&self, handle: u64, error: u32, message: impl std::fmt::Display) -> bool {
        if self.negotiated.structured_replies {
            self.send(ErrorChunk::new(handle, error, message).as_bytes())
        } else {
            self.send(&simple_reply(error, handle))
        }
    }

    /// Marks the connection dead and wakes every worker that waits on it: in `read` or
    /// `write` (the socket is shut down) or for the in-flight state.
    fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.shutdown.shutdown_both();
        self.inflight.wake_all();
    }

    fn log_once(&self, msg: &str) {
        if !self.quiet.swap(true, Ordering::AcqRel) {
            log(&self.label, msg);
        }
    }

    fn log_reject(&self, req: &Request, r: &Reject) {
        let n = self.rejects_logged.fetch_add(1, Ordering::Relaxed);
        if n < LOGGED_REJECTS {
            log(&self.label, &format!("rejected request (handle {:#x}, error {}): {}", req.handle, r.error, r.reason));
        } else if n == LOGGED_REJECTS {
            log(&self.label, "further rejected requests are counted in invalid_io, not logged");
        }
    }

    fn log_store_error(&self, req: &Request, e: &StoreError) {
        if !self.store_error_logged.swap(true, Ordering::Relaxed) {
            log(
                &self.label,
                &format!(
                    "{} at offset {} length {} failed: {e} (further store errors on this connection are only counted)",
                    command_name(req.cmd),
                    req.offset,
                    req.len
                ),
            );
        }
    }
}

/// The three handles of a connection: the buffered receive half, the send half, and one to
/// shut it down with.
fn split<S: Stream>(stream: S, label: &str) -> Option<(BufReader<S>, S, S)> {
    match (stream.try_clone_stream(), stream.try_clone_stream()) {
        (Ok(w), Ok(s)) => Some((BufReader::with_capacity(READ_BUFFER_BYTES, stream), w, s)),
        (Err(e), _) | (_, Err(e)) => {
            log(label, &format!("cannot set up the connection ({e}); closing it"));
            None
        }
    }
}

/// Serves one connection: handshake (with TLS as `tls` says), then transmission until the
/// client disconnects.
pub(crate) fn run_connection<S: Stream + AsFd>(server: &Server, stream: S, label: &str, tls: TlsMode) {
    let Some((mut reader, mut writer, shutdown)) = split(stream, label) else {
        return;
    };
    // An absolute deadline, not an idle timer: a client that trickles a byte now and then
    // must still finish within it, the TLS handshake and the haggling inside TLS included.
    let deadline = Instant::now() + server.options.handshake_deadline;
    let outcome = handshake::negotiate(&mut Deadline::new(&mut reader, &shutdown, deadline), &mut writer, &server.export, tls);
    if let Ok(Outcome::StartTls(resume)) = outcome {
        // The TLS handshake and the rest of haggling run under the same deadline.
        let Some(config) = server.options.tls.as_ref().map(|t| t.config.clone()) else {
            // Unreachable: STARTTLS is accepted only in the modes that need TLS options.
            log(label, "STARTTLS accepted without TLS credentials; closing the connection");
            shutdown.shutdown_both();
            return;
        };
        let stream = match crate::tls::accept(reader, config, deadline) {
            Ok(stream) => stream,
            Err(e) => {
                log(label, &format!("TLS handshake failed: {e}; closing the connection"));
                shutdown.shutdown_both();
                return;
            }
        };
        if server.options.verbose {
            log(label, &crate::tls::describe(&stream));
        }
        let Some((mut reader, mut writer, tls_shutdown)) = split(stream, label) else {
            return;
        };
        let outcome =
            handshake::resume_in_tls(&mut Deadline::new(&mut reader, &tls_shutdown, deadline), &mut writer, &server.export, resume);
        let _ = tls_shutdown.set_receive_timeout(None);
        return serve_after_handshake(server, outcome, reader, writer, tls_shutdown, label);
    }
    let _ = shutdown.set_receive_timeout(None);
    serve_after_handshake(server, outcome, reader, writer, shutdown, label)
}

/// Transmission, if the handshake ended in it.
fn serve_after_handshake<S: Stream>(
    server: &Server,
    outcome: Result<Outcome, handshake::HandshakeError>,
    reader: BufReader<S>,
    writer: S,
    shutdown: S,
    label: &str,
) {
    let negotiated = match outcome {
        Ok(Outcome::Transmission(negotiated)) => negotiated,
        Ok(Outcome::StartTls(_)) => {
            // Only a plain connection starts TLS (see `run_connection`).
            log(label, "STARTTLS inside TLS; closing the connection");
            shutdown.shutdown_both();
            return;
        }
        Ok(Outcome::Closed) => {
            if server.options.verbose {
                log(label, "closed during the handshake");
            }
            shutdown.shutdown_both();
            return;
        }
        Err(e) => {
            log(label, &format!("{e}; closing the connection"));
            shutdown.shutdown_both();
            return;
        }
    };

    let workers = server.options.workers_per_connection.max(1);
    let conn = Conn {
        label: label.to_string(),
        reader: ReadTurn::new(ReadSide { stream: reader, last_seq: 0, end: None }),
        writer: Mutex::new(writer),
        shutdown,
        inflight: Inflight::new(workers, server.options.max_inflight_bytes, server.options.max_inflight_requests)
            .sharing(server.budget.clone()),
        failed: AtomicBool::new(false),
        quiet: AtomicBool::new(false),
        rejects_logged: AtomicU32::new(0),
        store_error_logged: AtomicBool::new(false),
        request_buffer_bytes: server.options.request_buffer_bytes,
        negotiated,
    };
    let store = &*server.export.store;
    std::thread::scope(|scope| {
        let conn = &conn;
        for i in 1..workers {
            let spawned = std::thread::Builder::new().name(format!("nbd-worker-{i}")).spawn_scoped(scope, move || worker(store, conn, i));
            if spawned.is_err() {
                // Fewer workers: less concurrency on this connection, the same service.
                break;
            }
        }
        worker(store, conn, 0);
    });
    // Every worker is done: requests read before the end are answered (rule 7).
    if matches!(conn.reader.side.lock().end, Some(End::Disconnect)) && server.options.verbose {
        log(label, "disconnected (NBD_CMD_DISC)");
    }
    conn.shutdown.shutdown_both();
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
enum Next {
    /// An accepted request, admitted into the in-flight budget; a WRITE's payload is in the
    /// worker's buffer.
    Serve(Job),
    /// A rejected request, already counted (and its payload skipped): reply with the error.
    Reject(Request, Reject),
    /// The connection is ending: no more requests.
    Stop,
}

/// A worker (see the module docs): read a request in turn, serve it, reply, again.
fn worker<S: Stream>(store: &Store, conn: &Conn<S>, id: usize) {
    let _unwind = FailOnPanic(conn);
    let mut ctx = store.context();
    let mut buf = RequestBuffer::with_room(conn.request_buffer_bytes);
    // The read turn, when this worker kept it through its last request (the short path).
    let mut kept: Option<TurnGuard<'_, S>> = None;
    loop {
        let mut turn = kept.take().unwrap_or_else(|| conn.reader.take());
        let next = next_request(&mut turn, store, conn, id, &mut buf);
        // Give the turn back before serving, so that the next request is read meanwhile,
        // unless keeping it is surely cheaper (see `keep_turn`).
        if keep_turn(store, &mut turn, &next) {
            kept = Some(turn);
        } else {
            drop(turn);
        }
        match next {
            Next::Serve(job) => {
                serve(store, &mut ctx, conn, &job, &mut buf);
                conn.inflight.release(id, &job);
                buf.trim();
            }
            Next::Reject(req, r) => {
                conn.log_reject(&req, &r);
                conn.send_error(req.handle, r.error, &r.reason);
            }
            Next::Stop => return,
        }
    }
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
fn keep_turn<S: Stream>(store: &Store, rs: &mut ReadSide<S>, next: &Next) -> bool {
    let quick = match next {
        Next::Serve(job) => job.cmd == Command::Flush || job.req.len as usize <= QUICK_REQUEST_BYTES,
        Next::Reject(..) => true,
        Next::Stop => return false,
    };
    quick && !store.has_backing() && rs.stream.buffer().is_empty() && rs.stream.get_ref().queued_bytes().is_ok_and(|n| n == 0)
}

/// If a worker panics (a bug), its connection ends instead of hanging: the socket is shut
/// down and waiters are woken, so the other workers stop and the panic reaches the
/// connection's thread.
struct FailOnPanic<'a, S: Stream>(&'a Conn<S>);

impl<S: Stream> Drop for FailOnPanic<'_, S> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}

/// The worker's turn at the socket: reads the next request, or records why there is none.
fn next_request<S: Stream>(rs: &mut ReadSide<S>, store: &Store, conn: &Conn<S>, id: usize, buf: &mut RequestBuffer) -> Next {
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

/// Executes an admitted request and sends its reply (on the worker's own thread).
fn serve<S: Stream>(store: &Store, ctx: &mut Context, conn: &Conn<S>, job: &Job, buf: &mut RequestBuffer) {
    if conn.failed.load(Ordering::Acquire) {
        return; // nobody to answer
    }
    if job.cmd == Command::Flush {
        conn.inflight.wait_for_earlier_writes(job.seq, &conn.failed);
    }
    let (handle, offset) = (job.req.handle, job.req.offset);
    let room = match job.cmd {
        Command::Read | Command::Write => job.req.len as usize,
        Command::BlockStatus => job.descriptor_room(),
        _ => 0,
    };
    let structured = conn.negotiated.structured_replies;
    match execute(store, ctx, job, buf.data(room)) {
        Ok(n) => match job.cmd {
            Command::Read if structured => conn.send(buf.reply(&reply::offset_data_header(handle, offset, n as u32), n)),
            Command::Read => conn.send(buf.reply(&simple_reply(0, handle), n)),
            Command::BlockStatus => conn.send(buf.reply(&reply::block_status_header(handle, meta::BASE_ALLOCATION_ID, n as u32), n)),
            _ => conn.send(&simple_reply(0, handle)),
        },
        Err(e) => {
            conn.log_store_error(&job.req, &e);
            // A failed READ is answered with the error and no data.
            conn.send_error(handle, nbd_error(e.errno()), &e)
        }
    };
}

/// The one place requests reach the store: one call per command. `data` is the READ
/// destination, the WRITE payload, or room for BLOCK_STATUS's descriptors; returns how many
/// bytes of it the reply carries.
fn execute(store: &Store, ctx: &mut Context, job: &Job, data: &mut [u8]) -> Result<usize, StoreError> {
    let (offset, len) = (job.req.offset, job.req.len as u64);
    let reply_bytes = match job.cmd {
        Command::Read => store.read(ctx, offset, data).map(|()| data.len()),
        Command::Write => store.write(ctx, offset, data).map(|()| 0),
        Command::Flush => store.flush().map(|()| 0),
        Command::Trim => store.discard(offset, len).map(|()| 0),
        Command::WriteZeroes => store.write_zeroes(ctx, offset, len).map(|()| 0),
        // As many extents as `data` has room for (one with REQ_ONE): the spec lets a reply
        // cover less than the range. None reaches past the range (the spec would allow it).
        Command::BlockStatus => store.block_status(offset, len).map(|extents| meta::encode_extents(data, extents)),
        Command::Disconnect => unreachable!("NBD_CMD_DISC ends the reading; it is never served"),
    }?;
    Ok(reply_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backing device in memory that counts the calls made to it.
    struct CountingDevice {
        bytes: parking_lot::Mutex<Vec<u8>>,
        calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl CountingDevice {
        fn count(&self) {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl compcache_store::BackingDevice for CountingDevice {
        fn size_bytes(&self) -> u64 {
            self.bytes.lock().len() as u64
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.count();
            buf.copy_from_slice(&self.bytes.lock()[offset as usize..][..buf.len()]);
            Ok(())
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.count();
            self.bytes.lock()[offset as usize..][..buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn discard(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
            self.count();
            Ok(())
        }
        fn discard_all(&self) -> std::io::Result<()> {
            Ok(()) // the store's close at drop, not a request
        }
        fn describe(&self) -> String {
            "memory".into()
        }
    }

    /// FUA and FLUSH ask for what every reply already guarantees (the write is in the store,
    /// and later reads find it), also with a backing device, whose records die with the
    /// server: they cost no device I/O (no fsync: the index is in RAM, so it would make
    /// nothing durable; docs/backing.md, "Flush and FUA").
    #[test]
    fn fua_and_flush_cost_no_backing_device_io_and_writes_are_read_back() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let dev = CountingDevice { bytes: parking_lot::Mutex::new(vec![0; 8 << 20]), calls: calls.clone() };
        let mut cfg = compcache_store::Config::with_disksize(1 << 20);
        cfg.backing = Some(compcache_store::BackingConfig::new("memory"));
        let store = Store::with_backing_device(cfg, Box::new(dev)).unwrap();
        let mut ctx = store.context();
        let count = || calls.load(std::sync::atomic::Ordering::Relaxed);
        let job = |cmd, flags| Job { req: req(0, flags, 0, 4096), cmd, seq: 1 };
        for cmd in [Command::Write, Command::WriteZeroes, Command::Trim, Command::Write] {
            let mut data = vec![7u8; 4096];
            execute(&store, &mut ctx, &job(cmd, CMD_FLAG_FUA), &mut data).unwrap();
            execute(&store, &mut ctx, &job(Command::Flush, 0), &mut []).unwrap();
        }
        assert_eq!(count(), 0, "FUA and FLUSH issued device I/O");
        let mut back = vec![0u8; 4096];
        execute(&store, &mut ctx, &job(Command::Read, CMD_FLAG_FUA), &mut back).unwrap();
        assert_eq!(back, vec![7u8; 4096], "the FUA write is what later reads see");
    }

    fn req(cmd: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request { flags, cmd, handle: 7, offset, len }
    }

    const SIZE: u64 = 1 << 20;
    /// A connection that negotiated nothing.
    const NONE: Negotiated = Negotiated { structured_replies: false, base_allocation: false };
    const STRUCTURED: Negotiated = Negotiated { structured_replies: true, base_allocation: false };
    const BLOCK_STATUS: Negotiated = Negotiated { structured_replies: true, base_allocation: true };

    #[test]
    fn negotiation_decides_df_and_block_status() {
        let df = req(CMD_READ, CMD_FLAG_DF, 0, 4096);
        assert!(validate(&df, SIZE, &NONE).unwrap_err().reason.contains("flags 0x4"), "DF needs structured replies");
        assert_eq!(validate(&df, SIZE, &STRUCTURED), Ok(Command::Read));

        let bs = req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 4096, u32::MAX);
        let e = validate(&bs, 1 << 33, &STRUCTURED).unwrap_err();
        assert_eq!(e.error, EINVAL, "no context selected");
        assert!(e.reason.contains("NBD_OPT_SET_META_CONTEXT"), "{}", e.reason);
        assert_eq!(validate(&bs, 1 << 33, &BLOCK_STATUS), Ok(Command::BlockStatus), "no payload limit: a range of 4 GiB");
        assert_eq!(validate(&req(CMD_BLOCK_STATUS, 0, SIZE - 1, 2), SIZE, &BLOCK_STATUS).unwrap_err().error, EINVAL, "past the end");
        assert_eq!(validate(&req(CMD_BLOCK_STATUS, 0, 0, 0), SIZE, &BLOCK_STATUS).unwrap_err().error, EINVAL, "length 0");
        assert!(validate(&req(CMD_BLOCK_STATUS, CMD_FLAG_DF, 0, 1), SIZE, &BLOCK_STATUS).is_err(), "DF is for READ");
        assert!(validate(&req(CMD_WRITE, CMD_FLAG_REQ_ONE, 0, 1), SIZE, &BLOCK_STATUS).is_err(), "REQ_ONE is for BLOCK_STATUS");
        assert_eq!(
            (
                job(Command::BlockStatus, 1, 1 << 20).cost(),
                Job { req: req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20), cmd: Command::BlockStatus, seq: 1 }.cost()
            ),
            (256 * meta::DESCRIPTOR_BYTES, meta::DESCRIPTOR_BYTES),
            "a BLOCK_STATUS holds room for its descriptors in the budget"
        );
    }

    #[test]
    fn request_buffers_are_reused_and_bounded() {
        let mut b = RequestBuffer::default();
        b.data(4096).fill(7);
        let ptr = b.data(4096).as_ptr();
        b.trim();
        assert_eq!(b.data(100).as_ptr(), ptr, "a warm worker reuses its buffer");
        assert_eq!(b.data(100).len(), 100);
        assert_eq!(b.data(4096).as_ptr(), ptr, "a smaller request does not shrink it");
        let reply = b.reply(&simple_reply(0, 0x55), 3);
        assert_eq!(reply.len(), SIMPLE_REPLY_BYTES + 3);
        assert_eq!(reply[..SIMPLE_REPLY_BYTES], simple_reply(0, 0x55));
        assert_eq!(reply[SIMPLE_REPLY_BYTES..], [7, 7, 7], "header and data leave from one buffer");
        let header = reply::offset_data_header(0x55, 4096, 3);
        let reply = b.reply(&header, 3);
        assert_eq!((&reply[..header.len()], &reply[header.len()..]), (&header[..], &[7u8, 7, 7][..]), "a structured header too");
        assert_eq!(b.data(4096).as_ptr(), ptr, "writing headers moves no data");
        b.data(KEEP_BUFFER_BYTES);
        b.trim();
        assert_eq!(b.bytes.len(), HEADROOM + KEEP_BUFFER_BYTES, "up to the limit it is kept");
        b.data(KEEP_BUFFER_BYTES + 1);
        b.trim();
        assert_eq!(b.bytes.capacity(), 0, "above the limit it is freed");
    }

    #[test]
    fn a_preallocated_request_buffer_never_reallocates_within_its_room() {
        let room = 2 * KEEP_BUFFER_BYTES;
        let mut b = RequestBuffer::with_room(room);
        let ptr = b.data(1).as_ptr();
        for len in [4096, room, 1, room] {
            assert_eq!(b.data(len).as_ptr(), ptr, "a request within the room uses the buffer it was made with");
            b.trim();
        }
        assert_eq!(b.bytes.len(), HEADROOM + room, "trim keeps the room, even above KEEP_BUFFER_BYTES");
        b.data(room + 1);
        b.trim();
        assert_eq!(b.bytes.len(), HEADROOM + room, "after a larger request it is back to its room");
    }

    fn job(cmd: Command, seq: u64, len: u32) -> Job {
        Job { req: req(0, 0, 0, len), cmd, seq }
    }

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

    #[test]
    fn valid_requests_pass() {
        assert_eq!(validate(&req(CMD_READ, 0, 0, 4096), SIZE, &NONE), Ok(Command::Read));
        assert_eq!(validate(&req(CMD_WRITE, CMD_FLAG_FUA, SIZE - 1, 1), SIZE, &NONE), Ok(Command::Write));
        assert_eq!(validate(&req(CMD_READ, 0, 3, 5), SIZE, &NONE), Ok(Command::Read), "unaligned is served");
        assert_eq!(validate(&req(CMD_FLUSH, 0, 0, 0), SIZE, &NONE), Ok(Command::Flush));
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, SIZE as u32), SIZE, &NONE), Ok(Command::Trim));
        assert_eq!(validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FUA, 4096, 8192), SIZE, &NONE), Ok(Command::WriteZeroes));
        assert_eq!(validate(&req(CMD_DISC, 0, 0, 0), SIZE, &NONE), Ok(Command::Disconnect));
    }

    #[test]
    fn out_of_range_gets_the_spec_errors() {
        let e = validate(&req(CMD_READ, 0, SIZE - 4095, 4096), SIZE, &NONE).unwrap_err();
        assert_eq!(e.error, EINVAL);
        assert!(e.reason.contains("past the end"), "{}", e.reason);
        assert_eq!(validate(&req(CMD_WRITE, 0, SIZE, 1), SIZE, &NONE).unwrap_err().error, ENOSPC);
        assert_eq!(validate(&req(CMD_WRITE_ZEROES, 0, u64::MAX, 1), SIZE, &NONE).unwrap_err().error, ENOSPC, "no overflow");
        assert_eq!(validate(&req(CMD_TRIM, 0, SIZE + 1, 0x10), SIZE, &NONE).unwrap_err().error, EINVAL);
    }

    #[test]
    fn bad_commands_flags_and_lengths_are_einval() {
        assert!(validate(&req(99, 0, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("unknown command 99"));
        assert!(validate(&req(CMD_BLOCK_STATUS, 0, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("without a metadata context"));
        assert!(validate(&req(CMD_CACHE, 0, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("not supported"));
        assert!(validate(&req(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("flags 0x2"));
        assert!(validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1), SIZE, &NONE).is_err());
        assert!(validate(&req(CMD_FLUSH, 0, 0, 1), SIZE, &NONE).is_err());
        assert!(validate(&req(CMD_READ, 0, 0, 0), SIZE, &NONE).unwrap_err().reason.contains("length 0"));
        let big = validate(&req(CMD_READ, 0, 0, MAX_PAYLOAD_BYTES + 1), 1 << 30, &NONE).unwrap_err();
        assert_eq!(big.error, EINVAL);
        assert!(big.reason.contains("maximum payload"));
        // Commands without payload may exceed the payload limit.
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, u32::MAX), 1 << 33, &NONE), Ok(Command::Trim));
    }
}
