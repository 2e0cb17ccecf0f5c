//! # compcache-control
//!
//! The control channel: a Unix socket beside the device on which `compcache stat` and
//! `compcache compact` ask a running server for its statistics, or to compact its pool. It
//! never touches device data. Every front end serves one (`compcache serve` beside its NBD
//! socket, `compcache ublk`, `fuse` and `nbd-attach` beside their device), so it lives in a
//! crate of its own, which depends on the store alone.
//!
//! One job per file:
//! - here: the protocol and its server ([`answer`], [`serve`], [`bind`]);
//! - `change.rs`: the commands that change a running device (`set`, `writeback`, `recompress`);
//! - [`client`]: a client's request ([`request`]) and the trust checks it makes first
//!   ([`check_trusted`]);
//! - [`socket`]: private Unix sockets (mode 0600 before listening, stale-socket detection,
//!   removal at exit) and accept loops that back off instead of failing: the rules the
//!   control socket and the NBD socket (`compcache-nbd` uses this module) share.
//!
//! # Protocol (documented for users in docs/cli.md)
//! Line-based JSON. The client sends one JSON object per line, the server answers each with
//! one JSON object on one line, in order; the client may send several requests on one
//! connection and closes it when done. Every answer has `"ok"`: `true` with the command's
//! fields, or `false` with `"error"`, a one-line message.
//!
//! | request              | answer fields (besides `ok`)                                      | since |
//! |----------------------|-------------------------------------------------------------------|-------|
//! | `{"cmd":"stat"}`     | `protocol`, `device` (see [`DeviceInfo`]), `stats` (every `Stats` field), `mm_stat`, `io_stat`, `bd_stat`, `ramzswap` (text); since 2 `latency` (`{"read", "write"}`: `counts` per bucket, `sum_ns`: `compcache_store::latency`); since 3 `uses` ([`Uses`]) | 1 |
//! | `{"cmd":"compact"}`  | `pages_freed`                                                     | 1 |
//! | `{"cmd":"info"}`     | `protocol`, `device`; since 3 `uses`                              | 1 |
//! | `{"cmd":"recompress", "set": {..}, "run_ms": N}` | `settings` (recompression's tunables after `set`), `report` (what a run of `run_ms` did, or null) | 2 |
//! | `{"cmd":"set", "mem_limit": B, "reset_mem_used_max": true, "writeback": {"high_pct", "low_pct", "rate_bytes", "limit_bytes"}}` (each optional) | `mem_limit`, `mem_used_max`, `writeback` (settings, or null without a backing device) | 2 |
//! | `{"cmd":"writeback", "idle_secs": N, "max_bytes": B}` | `report` (`pages`, `bytes`, `writes`, `raced`, `pool_pages_freed`, `device_full`, `error`) | 2 |
//!
//! Versions: [`PROTOCOL_VERSION`] is in the answers of `stat` and `info`; a server that does
//! not send it speaks version 1. Version 2 added `recompress`, `set`, `writeback`, the
//! `protocol` field and `stat`'s `latency`; version 3 `uses` (what the device's configuration
//! turns on, so that a client can leave out the counters of what it does not use). Fields are
//! only ever added to answers; clients ignore what they do not know. The commands that change the device are in [`change`](crate::change)'s file.
//!
//! # Limits
//! One client that hangs must not blind every other tool (`compcache stat`, `swapoff`'s final
//! statistics, a scraper), so ([`Limits`]):
//! - a request line may be at most [`MAX_LINE_BYTES`] long; a longer one ends the connection;
//! - a client has [`REQUEST_DEADLINE`] (10 s) to send a whole request line, counted from when
//!   it connected or got its previous answer, however slowly its bytes come, and
//!   [`REPLY_DEADLINE`] (10 s) to read the answer; one that misses either is closed. A client
//!   that wants to ask again later connects again;
//! - at most [`MAX_CLIENTS`] (16) connections are open at once, each served by its own thread
//!   (so a request that takes long, a `recompress` run, delays no one else). When all are open
//!   and one more connects, the client idle the longest (waiting for its request, or for it to
//!   take its answer) is closed to make room, at once: idle clients never delay a new one.
//!   Only when all 16 are running requests is the newcomer answered `{"ok":false,"error":...}`
//!   and closed.
//!
//! Accept errors never end the listener (it backs off: [`socket::AcceptBackoff`]).
//!
//! # Trusting a control socket
//! A client believes what a control socket says (statistics, the server's pid) only if the
//! socket, and the directory it is in, belong to the user running the client or to root, and
//! the process that answers runs as one of them (`SO_PEERCRED`, checked after connecting, so
//! that a socket swapped in after the check is caught too): another user could otherwise
//! squat a socket path and feed `compcache stat` made-up figures ([`check_trusted`]).

mod change;
pub mod client;
pub mod socket;
#[cfg(test)]
mod tests;

pub use client::{check_trusted, request, ControlError, Distrust};

use compcache_store::{DictSource, Store};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The protocol's version, in the answers of `stat` and `info` (crate docs: what each
/// version added). A client needing a later version than a server's says so.
pub const PROTOCOL_VERSION: u64 = 3;
/// The longest request line accepted.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// Control clients served at once (`compcache stat` and `compact` use one each, briefly).
pub const MAX_CLIENTS: usize = 16;
/// How long a client may take to send a whole request line, from when it connected or got
/// its previous answer; then it is closed.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// How long a client may take to read an answer; then it is closed.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(10);

/// What the control server allows each client and all of them (crate docs, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, each served by a thread of its own.
    pub max_clients: usize,
    /// [`REQUEST_DEADLINE`].
    pub request_deadline: Duration,
    /// [`REPLY_DEADLINE`].
    pub reply_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_clients: MAX_CLIENTS, request_deadline: REQUEST_DEADLINE, reply_deadline: REPLY_DEADLINE }
    }
}

/// Where a running device is reachable and what it is: the `device` field of answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The NBD export name.
    pub export_name: String,
    /// The NBD Unix socket, if serving on one.
    pub nbd_socket: Option<String>,
    /// The NBD TCP address, if serving on one.
    pub nbd_tcp: Option<String>,
    /// This control socket.
    pub control_socket: String,
    /// The server's process id.
    pub pid: u32,
    /// The server's version.
    pub version: String,
    /// In cache mode, the origin the device fronts (`--origin`); `None` for a swap device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// How the device is reached: `nbd-server` (`compcache serve`), or the kernel front end
    /// of a swap server (`ublk`, `nbd`, `fuse`); empty from a server before protocol 2.
    #[serde(default)]
    pub frontend: String,
    /// The backing device or file (`--backing`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing: Option<String>,
}

/// What a device uses, from its configuration (not from its counters: a backing device that has
/// not been written to yet is used all the same): the `uses` field of `stat` and `info`
/// answers. Each says whether one group of `Stats` counters means something on this device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uses {
    /// Cache mode (`--origin`): the `cache_*`, `origin_*` and `readahead_*` counters.
    pub cache: bool,
    /// A backing device, file or cold tier (`--backing`, `--cold-tier`): the `bd_*` counters.
    pub backing: bool,
    /// Background recompression: the `recomp_*` and `recompress_*` counters.
    pub recompress: bool,
    /// A recompression dictionary (trained or from a file): the `dict*` and `recomp_dict_*`
    /// counters.
    pub dictionary: bool,
}

impl Uses {
    pub fn of(store: &Store) -> Uses {
        let recompress = store.config().recompress.as_ref();
        Uses {
            cache: store.is_cache(),
            backing: store.has_backing(),
            recompress: recompress.is_some(),
            dictionary: recompress.is_some_and(|r| r.dict != DictSource::None),
        }
    }
}

/// What the control server answers from.
pub struct ControlState {
    pub store: Arc<Store>,
    pub device: DeviceInfo,
}

/// Answers one request line.
pub fn answer(state: &ControlState, line: &str) -> Value {
    let req: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return json!({"ok": false, "error": format!("request is not JSON: {e}")}),
    };
    let Some(cmd) = req.get("cmd").and_then(Value::as_str) else {
        return json!({"ok": false, "error": "request has no \"cmd\" string (try {\"cmd\":\"stat\"})"});
    };
    match cmd {
        "stat" => {
            let s = state.store.stats();
            json!({
                "ok": true,
                "protocol": PROTOCOL_VERSION,
                "device": state.device,
                "stats": s,
                "mm_stat": s.mm_stat_line(),
                "io_stat": s.io_stat_line(),
                "bd_stat": s.bd_stat_line(),
                "ramzswap": s.ramzswap_text(),
                "latency": state.store.latency(),
                "uses": Uses::of(&state.store),
            })
        }
        "compact" => json!({"ok": true, "pages_freed": state.store.compact()}),
        "info" => json!({"ok": true, "protocol": PROTOCOL_VERSION, "device": state.device, "uses": Uses::of(&state.store)}),
        "recompress" => change::recompress(&state.store, &req),
        "set" => change::set(state, &req),
        "writeback" => change::writeback(&state.store, &req),
        other => json!({
            "ok": false,
            "error": format!("unknown command {other:?} (known: stat, compact, info, recompress, set, writeback)")
        }),
    }
}

/// Accepts control clients forever with the default [`Limits`]; never returns (accept errors
/// are retried after a pause).
pub fn serve(state: Arc<ControlState>, listener: UnixListener) -> ! {
    serve_with(state, listener, Limits::default())
}

/// [`serve`] with other limits (the tests use short deadlines).
pub fn serve_with(state: Arc<ControlState>, listener: UnixListener, limits: Limits) -> ! {
    let clients = Arc::new(Clients::new(limits));
    let mut backoff = socket::AcceptBackoff::default();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                backoff.accepted(log);
                admit(&state, &clients, stream);
            }
            Err(e) => backoff.pause_after(&e, log),
        }
    }
}

/// [`serve`] until `gate` is closed: a server handing its listener over to a successor stops
/// accepting, and clients that connect meanwhile wait in the backlog for the successor
/// ([`socket::accept_until`]). The listener is made non-blocking (a flag of the socket, which
/// the successor inherits: it serves with this function too).
pub fn serve_until(state: Arc<ControlState>, listener: &UnixListener, gate: &socket::AcceptGate) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    listener.set_nonblocking(true)?;
    let clients = Arc::new(Clients::new(Limits::default()));
    socket::accept_until(gate, listener.as_fd(), || listener.accept(), log, log, |stream, _| admit(&state, &clients, stream));
    Ok(())
}

/// Serves one accepted control client on its own thread; when [`Limits::max_clients`] are
/// open, the one idle the longest makes room ([`Clients::open`]), and only if every one is
/// running a request is the newcomer refused.
fn admit(state: &Arc<ControlState>, clients: &Arc<Clients>, mut stream: UnixStream) {
    let id = match clients.open(&stream) {
        Ok(id) => id,
        Err(why) => {
            let error = match why {
                Refused::Busy => {
                    format!("too many control clients ({} at once, each running a request): try again", clients.limits.max_clients)
                }
                Refused::Clone(e) => format!("the server cannot take another control client now ({e}): try again"),
            };
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = stream.write_all(format!("{}\n", json!({"ok": false, "error": error})).as_bytes());
            return;
        }
    };
    let (state, table) = (state.clone(), clients.clone());
    let spawned = std::thread::Builder::new().name("control".into()).spawn(move || {
        serve_client(&state, &table, id, stream);
        table.close(id);
    });
    if let Err(e) = spawned {
        clients.close(id);
        log(&format!("cannot start a thread for a control client: {e}"));
    }
}

/// One client's requests, in order, each within its deadlines ([`Limits`]); returns when the
/// client closes, misses a deadline, sends too long a line, or is closed to make room.
fn serve_client(state: &ControlState, clients: &Clients, id: u64, stream: UnixStream) {
    let limits = clients.limits;
    let mut conn = Conn { stream, pending: Vec::new() };
    // Idle from its registration ([`Clients::open`]) until its first request, and from each
    // answer until its next request; blank lines do not count as requests, nor restart the clock.
    let mut deadline = Instant::now() + limits.request_deadline;
    loop {
        let line = match conn.read_line(deadline) {
            Ok(Some(line)) => line,
            Ok(None) | Err(End::Gone) | Err(End::Deadline) => return,
            Err(End::TooLong) => {
                log(&format!("request line longer than {MAX_LINE_BYTES} bytes; closing that control connection"));
                return;
            }
        };
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        // Closed to make room meanwhile: its last bytes (still in the socket) are not run.
        if !clients.set_idle(id, false) {
            return;
        }
        let mut out = answer(state, text.trim()).to_string();
        out.push('\n');
        // A client that does not take its answer is as idle as one that sends nothing; marked
        // before the answer is sent, so that it is older than any client that connects after
        // reading it.
        clients.set_idle(id, true);
        if conn.write_all(out.as_bytes(), Instant::now() + limits.reply_deadline).is_err() {
            return;
        }
        deadline = Instant::now() + limits.request_deadline;
    }
}

/// Why a connection ends.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The client closed it, or it failed, or it was closed to make room.
    Gone,
    /// A deadline passed.
    Deadline,
    /// A request line longer than [`MAX_LINE_BYTES`].
    TooLong,
}

/// A client's socket, and what it sent beyond the line last read (pipelined requests).
struct Conn {
    stream: UnixStream,
    pending: Vec<u8>,
}

impl Conn {
    /// The next request line (without its newline), or `None` when the client closed the
    /// connection between requests; the whole line must be in by `deadline`, however slowly
    /// its bytes trickle in. An unterminated last line before the close is a request too.
    fn read_line(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, End> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(pos) = self.pending.iter().position(|&b| b == b'\n') {
                let rest = self.pending.split_off(pos + 1);
                let mut line = std::mem::replace(&mut self.pending, rest);
                line.pop();
                return if line.len() > MAX_LINE_BYTES { Err(End::TooLong) } else { Ok(Some(line)) };
            }
            if self.pending.len() > MAX_LINE_BYTES {
                return Err(End::TooLong);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(End::Deadline);
            }
            self.stream.set_read_timeout(Some(left)).map_err(|_| End::Gone)?;
            match self.stream.read(&mut chunk) {
                Ok(0) if self.pending.is_empty() => return Ok(None),
                Ok(0) => return Ok(Some(std::mem::take(&mut self.pending))),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(End::Deadline),
                Err(_) => return Err(End::Gone),
            }
        }
    }

    /// Writes all of `bytes` by `deadline`, however slowly the client reads.
    fn write_all(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), End> {
        while !bytes.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(End::Deadline);
            }
            self.stream.set_write_timeout(Some(left)).map_err(|_| End::Gone)?;
            match self.stream.write(bytes) {
                Ok(0) => return Err(End::Gone),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(End::Deadline),
                Err(_) => return Err(End::Gone),
            }
        }
        Ok(())
    }
}

/// The open control connections: at most [`Limits::max_clients`], each with a handle to close
/// it by and, while it is not running a request, since when it has been idle.
struct Clients {
    limits: Limits,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: Vec<Open>,
}

/// Why a new client is refused ([`Clients::open`]).
enum Refused {
    /// Every open client is running a request.
    Busy,
    /// Its socket could not be cloned (out of descriptors, most likely).
    Clone(std::io::Error),
}

struct Open {
    id: u64,
    /// A second handle on the client's socket: `shutdown` on it ends the serving thread's
    /// blocked read or write at once.
    handle: UnixStream,
    /// `None` while a request runs (never closed then: the work is someone's).
    idle_since: Option<Instant>,
}

impl Clients {
    fn new(limits: Limits) -> Clients {
        Clients { limits, table: Mutex::new(Table::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table stays consistent across a panic (every change is one push, remove or store).
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new client; when the table is full, closes the client idle the longest to
    /// make room. Refused when every open client is running a request, or when the socket
    /// cannot be cloned (out of descriptors: a client refused by the server's limits, said so).
    fn open(&self, stream: &UnixStream) -> Result<u64, Refused> {
        let handle = stream.try_clone().map_err(Refused::Clone)?;
        let mut t = self.lock();
        if t.open.len() >= self.limits.max_clients {
            let idlest = t.open.iter().enumerate().filter_map(|(i, o)| o.idle_since.map(|s| (s, i))).min().ok_or(Refused::Busy)?.1;
            let evicted = t.open.swap_remove(idlest);
            let _ = evicted.handle.shutdown(std::net::Shutdown::Both);
        }
        let id = t.next_id;
        t.next_id += 1;
        t.open.push(Open { id, handle, idle_since: Some(Instant::now()) });
        Ok(id)
    }

    /// Marks a client idle (waiting for its request or for it to take its answer) or busy;
    /// `false` if it has been closed to make room.
    fn set_idle(&self, id: u64, idle: bool) -> bool {
        match self.lock().open.iter_mut().find(|o| o.id == id) {
            Some(o) => {
                o.idle_since = idle.then(Instant::now);
                true
            }
            None => false,
        }
    }

    /// Forgets a client whose thread ended (it may already be gone: closed to make room).
    fn close(&self, id: u64) {
        self.lock().open.retain(|o| o.id != id);
    }
}

/// Binds the control socket (same rules as the NBD socket: a live server is refused, a stale
/// file replaced, mode 0600).
pub fn bind(path: &Path) -> Result<UnixListener, socket::BindError> {
    socket::bind_unix(path)
}

/// The one way the control server logs: one line through the servers' log sink
/// (compcache-log: never panics, never waits for the log file in a server).
fn log(msg: &str) {
    compcache_log::warning("compcache", &format!("control: {msg}"));
}
