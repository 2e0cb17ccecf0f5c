//! The transmission phase: read a request, validate it completely, then make one store call.
//! It starts once the handshake is over (`crate::connection` sets the connection up and
//! negotiates; `run` gets a connection in transmission and what it negotiated).
//!
//! One job per file, in the order a request meets them:
//! - `turn.rs`: the read turn (lock 1): reading the next request off the socket in turn,
//!   the short path;
//! - `request.rs`: [`Command`], [`Reject`], [`validate`] (rule 1) and `execute`, the one
//!   `match` that calls the store;
//! - `inflight.rs`: the connection's in-flight budget and FLUSH ordering (lock 2, rule 2);
//! - `buffer.rs`: a worker's request buffer (rules 4 and 5);
//! - here: these rules, `Conn` (what the workers share, the writer lock 3), the worker loop,
//!   and serving a request (execute, then reply).
//!
//! # Shape of a connection
//! A connection in transmission is served by its *workers* (`workers_per_connection`; the
//! connection's own thread is worker 0, and the others start when requests queue up, so an
//! idle connection costs one thread: `Crew`), each with its own store [`Context`] and request
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
//!    reading its replies blocks its own connection's workers in `write`, and nothing else,
//!    for at most the request deadline (rule 8): a blocked reply holds this connection's
//!    locks and its READ data's bytes, never another connection's, and a reply without data
//!    gives its request's bytes back before it is sent.
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
//! 2. Memory is bounded: a payload is at most [`MAX_PAYLOAD_BYTES`](crate::MAX_PAYLOAD_BYTES);
//!    a worker holds one request at a time, and a request is admitted only when the
//!    connection's in-flight bytes and requests fit its budget (an idle connection always
//!    admits one). A WRITE's payload is taken from the budgets as it arrives, chunk by chunk
//!    (`inflight.rs`), never on the word of its header.
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
//! 8. No client holds what others need for longer than the request deadline
//!    (`ServerOptions::request_deadline`): once the first byte of a request header is in,
//!    the rest of it and its payload must follow within it (`turn.rs`, `Timed`), and each
//!    reply must be taken within it (`write_within`); else the connection is closed with a
//!    line saying why, and what its requests held is given back. Waiting for a request's
//!    first byte has no limit (an idle connection), nor has the server's own wait for budget
//!    room.
//!
//! # FUA and FLUSH
//! A request is in the store before it is replied to, and every later read on any connection
//! finds it. What FUA and FLUSH add is durability, which is `Store::flush`'s: FUA on a
//! modifying request (WRITE, WRITE_ZEROES, TRIM) is that request, then `Store::flush`, before
//! the reply (`request::execute`); FLUSH is `Store::flush`. For a RAM device, also with a
//! backing device, `Store::flush` returns at once: the pages and the index of the backing
//! device's records live in the server's memory, so an fsync would make nothing durable
//! (docs/backing.md, "Flush and FUA"). In cache mode it is the origin's fdatasync, and an
//! error there is EIO to the client. FLUSH is answered only once every modifying request read
//! before it on this connection has been executed and answered. The protocol asks less (the
//! writes *completed* before the FLUSH was received; those are in the store already), but a
//! client that pipelines writes and a flush gets what it meant, and its flush reply comes
//! after those writes' replies.

mod buffer;
mod inflight;
mod request;
mod turn;

pub use buffer::KEEP_BUFFER_BYTES;
pub use request::{validate, Command, Reject};
pub(crate) use turn::READ_BUFFER_BYTES;

use crate::handshake::Negotiated;
use crate::listener::Stream;
use crate::reply::{self, ErrorChunk};
use crate::wire::*;
use crate::{log, meta, warn, Server};
use buffer::RequestBuffer;
use compcache_log::Rejects;
use compcache_store::{Context, Store, StoreError};
use inflight::Inflight;
use parking_lot::Mutex;
use request::{execute, Job};
use std::io::{self, BufReader};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::Scope;
use turn::{keep_turn, next_request, Next, ReadTurn, TurnGuard};

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
    /// Rejected and failed requests' log lines, rate-limited per connection.
    rejects: Rejects,
    /// `ServerOptions::request_buffer_bytes`.
    request_buffer_bytes: usize,
    /// What the handshake negotiated: structured replies, metadata contexts.
    negotiated: Negotiated,
    /// `ServerOptions::request_deadline` (rule 8).
    request_deadline: Option<std::time::Duration>,
    /// The server stopped reading to hand over (`Server::stop_reading`): the end of file that
    /// follows is not logged.
    reading_stopped: std::sync::Arc<AtomicBool>,
}

impl<S: Stream> Conn<S> {
    /// Sends one reply; on failure (or if the client does not take it within the request
    /// deadline, rule 8) marks the connection dead.
    fn send(&self, bytes: &[u8]) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return false;
        }
        let result = write_within(&mut *self.writer.lock(), bytes, self.request_deadline);
        match result {
            Ok(()) => true,
            Err(e) => {
                if !self.failed.load(Ordering::Acquire) && !self.quiet.swap(true, Ordering::AcqRel) {
                    let why = if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                        format!(
                            "the client did not take a {}-byte reply within {:?} (it does not read its replies); \
                             closing the connection, and what its requests held is given back",
                            bytes.len(),
                            self.request_deadline.unwrap_or_default()
                        )
                    } else {
                        format!("cannot send a reply ({e}); closing the connection")
                    };
                    warn(&self.label, &why);
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
            warn(&self.label, msg);
        }
    }

    /// A rejected request (already counted in `invalid_io`), through the one reject policy
    /// of every front end (`compcache_log::Rejects`: a few lines a minute per connection, the
    /// rest counted in the next line let through).
    fn log_reject(&self, req: &Request, r: &Reject) {
        self.rejects.refused(|| format!("handle {:#x}, error {}: {}", req.handle, r.error, r.reason));
    }

    /// A request the store failed (counted by the store), under the same policy.
    fn log_store_error(&self, req: &Request, e: &StoreError) {
        self.rejects.failed(|| format!("{} at offset {} length {} failed: {e}", command_name(req.cmd), req.offset, req.len));
    }
}

/// Serves a connection in transmission until it ends: its workers (the calling thread is
/// worker 0) read, serve and answer its requests. `reader`, `writer` and `shutdown` are three
/// handles on one socket whose handshake is over (no receive timeout left on it); `negotiated`
/// is what that handshake agreed.
pub(crate) fn run<S: Stream>(server: &Server, negotiated: Negotiated, reader: BufReader<S>, writer: S, shutdown: S, label: &str) {
    let workers = server.options.workers_per_connection.max(1);
    let conn = Conn {
        label: label.to_string(),
        reader: ReadTurn::new(reader),
        writer: Mutex::new(writer),
        shutdown,
        inflight: Inflight::sharing(
            workers,
            server.options.max_inflight_bytes,
            server.options.max_inflight_requests,
            server.budget.clone(),
        ),
        failed: AtomicBool::new(false),
        quiet: AtomicBool::new(false),
        rejects: Rejects::named(format!("compcache-nbd: {label}")),
        request_buffer_bytes: server.options.request_buffer_bytes,
        negotiated,
        request_deadline: server.options.request_deadline,
        reading_stopped: server.reading_stopped.clone(),
    };
    // A write to a client that takes nothing waits at most this long (rule 8; `write_within`).
    if let Err(e) = conn.writer.lock().set_send_timeout(conn.request_deadline) {
        warn(label, &format!("cannot set the socket's send timeout ({e}); closing the connection"));
        conn.shutdown.shutdown_both();
        return;
    }
    let store = &*server.export.store;
    let crew = Crew { store, conn: &conn, started: AtomicUsize::new(1), workers };
    std::thread::scope(|scope| {
        // With request buffers made up front (a swap server's: no allocation while serving,
        // rule 5) every worker starts now; else on demand (`Crew::grow`), so an idle
        // connection costs one thread.
        if conn.request_buffer_bytes > 0 {
            while crew.start(scope) {}
        }
        worker(scope, &crew, 0);
    });
    // Every worker is done: requests read before the end are answered (rule 7).
    if conn.reader.disconnected() && server.options.verbose {
        log(label, "disconnected (NBD_CMD_DISC)");
    }
    conn.shutdown.shutdown_both();
}

/// What a connection's workers share besides `Conn`: how many have started, of how many.
struct Crew<'a, S: Stream> {
    store: &'a Store,
    conn: &'a Conn<S>,
    started: AtomicUsize,
    workers: usize,
}

impl<'env, S: Stream> Crew<'env, S> {
    /// Starts one more worker, if fewer than `workers` run; false if none was started.
    fn start<'scope>(&'env self, scope: &'scope Scope<'scope, 'env>) -> bool {
        let Ok(id) = self.started.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.workers).then_some(n + 1)) else {
            return false;
        };
        let spawned = std::thread::Builder::new().name(format!("nbd-worker-{id}")).spawn_scoped(scope, move || worker(scope, self, id));
        // If it cannot be started: fewer workers, less concurrency, the same service.
        spawned.is_ok()
    }

    /// A worker gave the read turn back to serve its request: if no other worker waits to
    /// read the next request, starts one (up to `workers`), so requests pipelined behind this
    /// one are read and served meanwhile.
    fn grow<'scope>(&'env self, scope: &'scope Scope<'scope, 'env>) {
        if self.started.load(Ordering::Acquire) < self.workers && !self.conn.reader.has_waiter() {
            self.start(scope);
        }
    }
}

/// A worker (see the module docs): read a request in turn, serve it, reply, again.
fn worker<'scope, 'env, S: Stream>(scope: &'scope Scope<'scope, 'env>, crew: &'env Crew<'env, S>, id: usize) {
    let (store, conn) = (crew.store, crew.conn);
    let _unwind = FailOnPanic(conn);
    let mut ctx = store.context();
    compcache_store::make_stack_resident();
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
            if matches!(next, Next::Serve(_)) {
                crew.grow(scope);
            }
        }
        match next {
            Next::Serve(job) => {
                let held = serve(store, &mut ctx, conn, &job, &mut buf);
                conn.inflight.release(id, &job, held);
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

/// Executes an admitted request and sends its reply (on the worker's own thread); returns the
/// bytes the request still holds. A reply without data gives the request's bytes back before
/// it is sent: a client that does not read its replies then holds no payload bytes with it.
fn serve<S: Stream>(store: &Store, ctx: &mut Context, conn: &Conn<S>, job: &Job, buf: &mut RequestBuffer) -> usize {
    if conn.failed.load(Ordering::Acquire) {
        return job.cost(); // nobody to answer
    }
    if job.cmd == Command::Flush {
        conn.inflight.wait_for_earlier_writes(job.seq, &conn.failed);
    }
    let (handle, offset) = (job.req.handle, job.req.offset);
    let structured = conn.negotiated.structured_replies;
    // The data area is the room the request was admitted with (rule 2).
    let result = execute(store, ctx, job, buf.data(job.cost()));
    let held = match (&result, job.cmd) {
        (Ok(_), Command::Read | Command::BlockStatus) => job.cost(),
        _ => {
            conn.inflight.give_back(job.cost());
            0
        }
    };
    match result {
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
    held
}

/// Writes all of `bytes` to `socket`, which must take them within `limit` (rule 8): the
/// socket's send timeout (`limit`, set when transmission starts) bounds a write that makes no
/// progress; after a write that took only part, the timeout is set to the time left (a system
/// call only on this slow path) and put back at the end, so a client that reads a byte now and
/// then is held to the same limit. A TLS stream writes in rounds inside one call and is held
/// to the timeout per round of the socket.
fn write_within<S: Stream>(socket: &mut S, mut bytes: &[u8], limit: Option<std::time::Duration>) -> io::Result<()> {
    let Some(limit) = limit else {
        return socket.write_all(bytes);
    };
    let start = std::time::Instant::now();
    let mut shortened = false;
    let result = loop {
        if bytes.is_empty() {
            break Ok(());
        }
        match socket.write(bytes) {
            Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => break Err(e),
        }
        if !bytes.is_empty() {
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                break Err(io::Error::new(io::ErrorKind::TimedOut, "reply deadline passed"));
            }
            shortened = true;
            if let Err(e) = socket.set_send_timeout(Some(left)) {
                break Err(e);
            }
        }
    };
    if shortened {
        let _ = socket.set_send_timeout(Some(limit));
    }
    result
}
