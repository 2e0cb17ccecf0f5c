//! The transmission phase: read a request, validate it completely, then make one store call.
//!
//! # Shape of a connection
//! The connection's thread runs the handshake, then becomes the *reader*: it reads request
//! headers (and write payloads), validates each one with [`validate`], answers rejected ones
//! itself, and queues accepted ones for the connection's *workers*. Each worker owns a store
//! [`Context`] and executes a request with exactly one store call (the `match` in
//! [`execute`]), then writes the reply under the writer lock. Replies may leave in any order;
//! the client matches them by handle, as the protocol allows.
//!
//! # What must hold
//! 1. A request is validated completely before anything is done: command, flags, length,
//!    range. A rejected request costs nothing but its reply (and, for WRITE, skipping its
//!    payload); it is counted in the store's `invalid_io`.
//! 2. Memory is bounded: a payload is at most [`MAX_PAYLOAD_BYTES`], and the reader admits a
//!    request only when the connection's in-flight bytes and requests fit its budget.
//! 3. A write is applied only once its whole payload has arrived: a client that disconnects
//!    mid-request loses that request and nothing else.
//! 4. One reply is one `write_all` under the writer lock, so replies never interleave.
//! 5. No allocation on the I/O path once warm, for requests up to [`KEEP_BUFFER_BYTES`]: write
//!    payloads come from a per-connection free list and read replies are assembled in each
//!    worker's reused buffer. A swap device is written to when memory is short; a server
//!    that must allocate to accept a swap-out could wait on the very reclaim it is serving.
//! 6. A connection logs at most a handful of lines: the first rejected requests, the first
//!    store error, and one line saying why it ended if that was not a clean `NBD_CMD_DISC`.
//!
//! # FUA and FLUSH
//! The store keeps everything in RAM, and a request is in the store before it is replied to:
//! FUA needs nothing beyond replying after the store call, and FLUSH calls `Store::flush`
//! (which writes back whatever a backing tier buffers, if any).

use crate::handshake::{self, Outcome};
use crate::listener::Stream;
use crate::wire::*;
use crate::{log, Server, MAX_PAYLOAD_BYTES};
use compcache_store::{Context, Store, StoreError};
use parking_lot::{Condvar, Mutex};
use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// The reader's buffer: large enough to take a header and a page of payload in one syscall.
const READ_BUFFER_BYTES: usize = 256 << 10;
/// A rejected WRITE's payload up to this size is read and dropped so the connection can go
/// on; a larger one is taken as hostile and the connection is closed (the protocol allows a
/// hard disconnect for payloads "large enough to be deemed a denial of service attack").
const MAX_SKIP_BYTES: u64 = 2 * MAX_PAYLOAD_BYTES as u64;
/// Buffers (write payloads, read replies) up to this size are kept for reuse; larger ones are
/// freed after their request.
pub const KEEP_BUFFER_BYTES: usize = 1 << 20;
/// Write payload buffers kept per connection for reuse.
const KEPT_PAYLOAD_BUFFERS: usize = 16;
/// A client must finish the handshake within this time, so that connections that never
/// negotiate cannot pin threads and connection slots forever. Transmission has no timeout:
/// the kernel's client may rightly stay idle for days.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
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

/// Checks everything about a request before anything is done with it.
pub fn validate(req: &Request, disksize_bytes: u64) -> Result<Command, Reject> {
    let name = command_name(req.cmd);
    let (cmd, allowed_flags) = match req.cmd {
        CMD_READ => (Command::Read, CMD_FLAG_FUA),
        CMD_WRITE => (Command::Write, CMD_FLAG_FUA),
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH => (Command::Flush, CMD_FLAG_FUA),
        CMD_TRIM => (Command::Trim, CMD_FLAG_FUA),
        CMD_WRITE_ZEROES => (Command::WriteZeroes, CMD_FLAG_FUA | CMD_FLAG_NO_HOLE),
        CMD_CACHE | CMD_BLOCK_STATUS => {
            return reject(EINVAL, format!("{name} is not supported (this server does not advertise it)"))
        }
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

/// An accepted request on its way to a worker.
struct Job {
    req: Request,
    cmd: Command,
    /// The WRITE payload; empty for other commands.
    payload: Vec<u8>,
}

impl Job {
    /// Bytes of buffer the request holds while in flight (payload in, or data out).
    fn cost(&self) -> usize {
        match self.cmd {
            Command::Read | Command::Write => self.req.len as usize,
            _ => 0,
        }
    }
}

/// The in-flight budget of one connection (rule 2).
struct Budget {
    state: Mutex<(usize, usize)>,
    freed: Condvar,
    max_bytes: usize,
    max_requests: usize,
}

impl Budget {
    fn acquire(&self, bytes: usize) {
        let mut s = self.state.lock();
        // An idle connection always admits one request, whatever its size.
        while s.1 > 0 && (s.0 + bytes > self.max_bytes || s.1 >= self.max_requests) {
            self.freed.wait(&mut s);
        }
        s.0 += bytes;
        s.1 += 1;
    }

    fn release(&self, bytes: usize) {
        let mut s = self.state.lock();
        s.0 -= bytes;
        s.1 -= 1;
        self.freed.notify_all();
    }
}

/// Write payload buffers of one connection, reused so that a warm connection does not
/// allocate (rule 5).
struct PayloadBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl PayloadBuffers {
    /// A zeroed buffer of `len` bytes, reused when one is free.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut b = self.free.lock().pop().unwrap_or_default();
        b.clear();
        b.resize(len, 0);
        b
    }

    /// Returns a buffer for reuse (or frees it, if it is large or enough are kept).
    fn give(&self, b: Vec<u8>) {
        if b.capacity() > 0 && b.capacity() <= KEEP_BUFFER_BYTES {
            let mut free = self.free.lock();
            if free.len() < KEPT_PAYLOAD_BUFFERS {
                free.push(b);
            }
        }
    }
}

/// The state a connection's reader and workers share.
struct Conn<S: Stream> {
    label: String,
    /// The writer lock: every reply is written whole while holding it (rule 4).
    writer: Mutex<S>,
    /// A third handle, used only to shut the socket down (a worker may hold the writer lock
    /// while blocked in `write`).
    shutdown: S,
    budget: Budget,
    payloads: PayloadBuffers,
    /// A reply could not be sent: the connection is dead, queued jobs are dropped.
    failed: AtomicBool,
    /// A line about how this connection ends has been logged: log no more (rule 5).
    quiet: AtomicBool,
    rejects_logged: AtomicU32,
    store_error_logged: AtomicBool,
}

impl<S: Stream> Conn<S> {
    /// Sends one reply; on failure marks the connection dead and wakes the reader.
    fn send(&self, bytes: &[u8]) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return false;
        }
        let result = self.writer.lock().write_all(bytes);
        match result {
            Ok(()) => true,
            Err(e) => {
                if !self.failed.swap(true, Ordering::AcqRel) && !self.quiet.swap(true, Ordering::AcqRel) {
                    log(&self.label, &format!("cannot send a reply ({e}); closing the connection"));
                }
                self.shutdown.shutdown_both();
                false
            }
        }
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

/// Serves one connection: handshake, then transmission until the client disconnects.
pub(crate) fn run_connection<S: Stream>(server: &Server, stream: S, label: &str) {
    let (writer, shutdown) = match (stream.try_clone_stream(), stream.try_clone_stream()) {
        (Ok(w), Ok(s)) => (w, s),
        (Err(e), _) | (_, Err(e)) => {
            log(label, &format!("cannot set up the connection ({e}); closing it"));
            return;
        }
    };
    let conn = Conn {
        label: label.to_string(),
        writer: Mutex::new(writer),
        shutdown,
        budget: Budget {
            state: Mutex::new((0, 0)),
            freed: Condvar::new(),
            max_bytes: server.options.max_inflight_bytes,
            max_requests: server.options.max_inflight_requests.max(1),
        },
        payloads: PayloadBuffers { free: Mutex::new(Vec::new()) },
        failed: AtomicBool::new(false),
        quiet: AtomicBool::new(false),
        rejects_logged: AtomicU32::new(0),
        store_error_logged: AtomicBool::new(false),
    };
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream);

    let _ = conn.shutdown.set_receive_timeout(Some(HANDSHAKE_TIMEOUT));
    let outcome = {
        let mut w = conn.writer.lock();
        handshake::negotiate(&mut reader, &mut *w, &server.export)
    };
    let _ = conn.shutdown.set_receive_timeout(None);
    match outcome {
        Ok(Outcome::Transmission) => {}
        Ok(Outcome::Closed) => {
            if server.options.verbose {
                log(label, "closed during the handshake");
            }
            conn.shutdown.shutdown_both();
            return;
        }
        Err(e) => {
            log(label, &format!("{e}; closing the connection"));
            conn.shutdown.shutdown_both();
            return;
        }
    }

    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Mutex::new(rx);
    std::thread::scope(|scope| {
        for i in 0..server.options.workers_per_connection.max(1) {
            let (conn, rx, store) = (&conn, &rx, &*server.export.store);
            let spawned = std::thread::Builder::new().name(format!("nbd-worker-{i}")).spawn_scoped(scope, move || worker(store, conn, rx));
            if let Err(e) = spawned {
                if i == 0 {
                    conn.log_once(&format!("cannot start a worker thread ({e}); closing the connection"));
                    conn.failed.store(true, Ordering::Release);
                    return;
                }
                break;
            }
        }
        let end = read_requests(&mut reader, &server.export.store, &conn, &tx);
        drop(tx); // workers finish what is queued, then stop
        match end {
            End::Disconnect => {
                if server.options.verbose {
                    log(label, "disconnected (NBD_CMD_DISC)");
                }
            }
            End::Error(msg) => conn.log_once(&msg),
            End::Failed => {}
        }
    });
    conn.shutdown.shutdown_both();
}

/// How the reader loop ended.
enum End {
    /// `NBD_CMD_DISC`: the clean end.
    Disconnect,
    /// A reply failed; already logged.
    Failed,
    /// Anything else, with the one line to log.
    Error(String),
}

/// The reader loop (see the module docs).
fn read_requests<S: Stream>(reader: &mut BufReader<S>, store: &Store, conn: &Conn<S>, tx: &mpsc::Sender<Job>) -> End {
    let disksize = store.disksize_bytes();
    loop {
        let mut header = [0u8; REQUEST_HEADER_BYTES];
        match read_full(reader, &mut header) {
            Ok(REQUEST_HEADER_BYTES) => {}
            Ok(0) => return End::Error("client closed the connection without NBD_CMD_DISC".into()),
            Ok(n) => return End::Error(format!("client disconnected after {n} of the {REQUEST_HEADER_BYTES} bytes of a request header")),
            Err(_) if conn.failed.load(Ordering::Acquire) => return End::Failed,
            Err(e) => return End::Error(format!("cannot read a request: {e}; closing the connection")),
        }
        let req = match Request::decode(&header) {
            Ok(r) => r,
            Err(magic) => {
                return End::Error(format!(
                    "bad request magic {magic:#010x} (expected {REQUEST_MAGIC:#010x}): the stream is garbage; closing the connection"
                ))
            }
        };

        let cmd = match validate(&req, disksize) {
            Ok(Command::Disconnect) => return End::Disconnect,
            Ok(cmd) => cmd,
            Err(r) => {
                store.note_invalid_io();
                if req.cmd == CMD_WRITE {
                    if req.len as u64 > MAX_SKIP_BYTES {
                        return End::Error(format!(
                            "WRITE with a {}-byte payload (above {MAX_SKIP_BYTES}, too large to skip); closing the connection",
                            req.len
                        ));
                    }
                    match io::copy(&mut reader.by_ref().take(req.len as u64), &mut io::sink()) {
                        Ok(n) if n == req.len as u64 => {}
                        Ok(n) => return End::Error(truncated_write(&req, n as usize)),
                        Err(_) if conn.failed.load(Ordering::Acquire) => return End::Failed,
                        Err(e) => return End::Error(format!("cannot read a request: {e}; closing the connection")),
                    }
                }
                conn.log_reject(&req, &r);
                if !conn.send(&simple_reply(r.error, req.handle)) {
                    return End::Failed;
                }
                continue;
            }
        };

        let mut job = Job { req, cmd, payload: Vec::new() };
        let cost = job.cost();
        conn.budget.acquire(cost);
        if cmd == Command::Write {
            job.payload = conn.payloads.take(req.len as usize);
            match read_full(reader, &mut job.payload) {
                Ok(n) if n == job.payload.len() => {}
                Ok(n) => {
                    conn.payloads.give(job.payload);
                    conn.budget.release(cost);
                    return End::Error(truncated_write(&req, n));
                }
                Err(e) => {
                    conn.payloads.give(job.payload);
                    conn.budget.release(cost);
                    if conn.failed.load(Ordering::Acquire) {
                        return End::Failed;
                    }
                    return End::Error(format!("cannot read a WRITE payload: {e}; closing the connection"));
                }
            }
        }
        if tx.send(job).is_err() {
            // Every worker is gone; nothing can be served.
            conn.budget.release(cost);
            return End::Failed;
        }
    }
}

fn truncated_write(req: &Request, got: usize) -> String {
    format!(
        "client disconnected in the middle of a WRITE (offset {}, {} of {} payload bytes received); that write was not applied",
        req.offset, got, req.len
    )
}

/// A worker: takes jobs until the reader is done, one store call each, replies.
fn worker<S: Stream>(store: &Store, conn: &Conn<S>, rx: &Mutex<mpsc::Receiver<Job>>) {
    let mut ctx = store.context();
    // Reply buffer: the 16-byte simple reply header, then the READ data, sent in one write.
    let mut out: Vec<u8> = Vec::new();
    loop {
        let job = match rx.lock().recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let cost = job.cost();
        if !conn.failed.load(Ordering::Acquire) {
            let data_len = if job.cmd == Command::Read { job.req.len as usize } else { 0 };
            out.clear();
            out.resize(SIMPLE_REPLY_BYTES + data_len, 0);
            let reply_len = match execute(store, &mut ctx, &job, &mut out[SIMPLE_REPLY_BYTES..]) {
                Ok(()) => {
                    out[..SIMPLE_REPLY_BYTES].copy_from_slice(&simple_reply(0, job.req.handle));
                    SIMPLE_REPLY_BYTES + data_len
                }
                Err(e) => {
                    conn.log_store_error(&job.req, &e);
                    // A failed READ is answered with the error and no data.
                    out[..SIMPLE_REPLY_BYTES].copy_from_slice(&simple_reply(nbd_error(e.errno()), job.req.handle));
                    SIMPLE_REPLY_BYTES
                }
            };
            conn.send(&out[..reply_len]);
            if out.capacity() > KEEP_BUFFER_BYTES + SIMPLE_REPLY_BYTES {
                out = Vec::new();
            }
        }
        conn.payloads.give(job.payload);
        conn.budget.release(cost);
    }
}

/// The one place requests reach the store: one call per command.
fn execute(store: &Store, ctx: &mut Context, job: &Job, read_buf: &mut [u8]) -> Result<(), StoreError> {
    let (offset, len) = (job.req.offset, job.req.len as u64);
    match job.cmd {
        Command::Read => store.read(ctx, offset, read_buf),
        Command::Write => store.write(ctx, offset, &job.payload),
        Command::Flush => store.flush(),
        Command::Trim => store.discard(offset, len),
        Command::WriteZeroes => store.write_zeroes(ctx, offset, len),
        Command::Disconnect => unreachable!("the reader handles NBD_CMD_DISC itself"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cmd: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request { flags, cmd, handle: 7, offset, len }
    }

    const SIZE: u64 = 1 << 20;

    #[test]
    fn payload_buffers_are_reused_and_bounded() {
        let pool = PayloadBuffers { free: Mutex::new(Vec::new()) };
        let b = pool.take(4096);
        assert_eq!(b, vec![0u8; 4096]);
        let ptr = b.as_ptr();
        pool.give(b);
        let mut again = pool.take(100);
        assert_eq!(again.as_ptr(), ptr, "a warm connection reuses its buffer");
        assert_eq!(again.len(), 100);
        again.fill(7);
        pool.give(again);
        assert_eq!(pool.take(200), vec![0u8; 200], "reused buffers come back zeroed");
        pool.give(vec![0u8; KEEP_BUFFER_BYTES + 1]);
        assert!(pool.free.lock().is_empty(), "large buffers are freed, not kept");
        for _ in 0..2 * KEPT_PAYLOAD_BUFFERS {
            pool.give(vec![0u8; 16]);
        }
        assert_eq!(pool.free.lock().len(), KEPT_PAYLOAD_BUFFERS);
    }

    #[test]
    fn valid_requests_pass() {
        assert_eq!(validate(&req(CMD_READ, 0, 0, 4096), SIZE), Ok(Command::Read));
        assert_eq!(validate(&req(CMD_WRITE, CMD_FLAG_FUA, SIZE - 1, 1), SIZE), Ok(Command::Write));
        assert_eq!(validate(&req(CMD_READ, 0, 3, 5), SIZE), Ok(Command::Read), "unaligned is served");
        assert_eq!(validate(&req(CMD_FLUSH, 0, 0, 0), SIZE), Ok(Command::Flush));
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, SIZE as u32), SIZE), Ok(Command::Trim));
        assert_eq!(
            validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FUA, 4096, 8192), SIZE),
            Ok(Command::WriteZeroes)
        );
        assert_eq!(validate(&req(CMD_DISC, 0, 0, 0), SIZE), Ok(Command::Disconnect));
    }

    #[test]
    fn out_of_range_gets_the_spec_errors() {
        let e = validate(&req(CMD_READ, 0, SIZE - 4095, 4096), SIZE).unwrap_err();
        assert_eq!(e.error, EINVAL);
        assert!(e.reason.contains("past the end"), "{}", e.reason);
        assert_eq!(validate(&req(CMD_WRITE, 0, SIZE, 1), SIZE).unwrap_err().error, ENOSPC);
        assert_eq!(validate(&req(CMD_WRITE_ZEROES, 0, u64::MAX, 1), SIZE).unwrap_err().error, ENOSPC, "no overflow");
        assert_eq!(validate(&req(CMD_TRIM, 0, SIZE + 1, 0x10), SIZE).unwrap_err().error, EINVAL);
    }

    #[test]
    fn bad_commands_flags_and_lengths_are_einval() {
        assert!(validate(&req(99, 0, 0, 1), SIZE).unwrap_err().reason.contains("unknown command 99"));
        assert!(validate(&req(CMD_BLOCK_STATUS, 0, 0, 1), SIZE).unwrap_err().reason.contains("not supported"));
        assert!(validate(&req(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1), SIZE).unwrap_err().reason.contains("flags 0x2"));
        assert!(validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1), SIZE).is_err());
        assert!(validate(&req(CMD_FLUSH, 0, 0, 1), SIZE).is_err());
        assert!(validate(&req(CMD_READ, 0, 0, 0), SIZE).unwrap_err().reason.contains("length 0"));
        let big = validate(&req(CMD_READ, 0, 0, MAX_PAYLOAD_BYTES + 1), 1 << 30).unwrap_err();
        assert_eq!(big.error, EINVAL);
        assert!(big.reason.contains("maximum payload"));
        // Commands without payload may exceed the payload limit.
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, u32::MAX), 1 << 33), Ok(Command::Trim));
    }
}
