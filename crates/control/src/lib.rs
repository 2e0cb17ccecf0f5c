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
//! | `{"cmd":"stat"}`     | `protocol`, `device` (see [`DeviceInfo`]), `stats` (every `Stats` field), `mm_stat`, `io_stat`, `bd_stat`, `ramzswap` (text); since 2 `latency` (`{"read", "write"}`: `counts` per bucket, `sum_ns`: `compcache_store::latency`) | 1 |
//! | `{"cmd":"compact"}`  | `pages_freed`                                                     | 1 |
//! | `{"cmd":"info"}`     | `protocol`, `device`                                              | 1 |
//! | `{"cmd":"recompress", "set": {..}, "run_ms": N}` | `settings` (recompression's tunables after `set`), `report` (what a run of `run_ms` did, or null) | 2 |
//! | `{"cmd":"set", "mem_limit": B, "reset_mem_used_max": true, "writeback": {"high_pct", "low_pct", "rate_bytes", "limit_bytes"}}` (each optional) | `mem_limit`, `mem_used_max`, `writeback` (settings, or null without a backing device) | 2 |
//! | `{"cmd":"writeback", "idle_secs": N, "max_bytes": B}` | `report` (`pages`, `bytes`, `writes`, `raced`, `pool_pages_freed`, `device_full`, `error`) | 2 |
//!
//! Versions: [`PROTOCOL_VERSION`] is in the answers of `stat` and `info`; a server that does
//! not send it speaks version 1. Version 2 added `recompress`, `set`, `writeback`, the
//! `protocol` field and `stat`'s `latency`. Fields are only ever added to answers; clients ignore what they do not
//! know. The commands that change the device are in [`change`](crate::change)'s file.
//!
//! A request line may be at most [`MAX_LINE_BYTES`] long; a longer one ends the connection.
//! At most [`MAX_CLIENTS`] clients are served at once; one more is answered
//! `{"ok":false,"error":...}` and closed. Accept errors never end the listener (it backs off:
//! [`socket::AcceptBackoff`]).
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

use compcache_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The protocol's version, in the answers of `stat` and `info` (crate docs: what each
/// version added). A client needing a later version than a server's says so.
pub const PROTOCOL_VERSION: u64 = 2;
/// The longest request line accepted.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// An idle control client is disconnected after this long, so it cannot pin a thread forever.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Control clients served at once (`compcache stat` and `compact` use one each, briefly).
pub const MAX_CLIENTS: usize = 16;

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
            })
        }
        "compact" => json!({"ok": true, "pages_freed": state.store.compact()}),
        "info" => json!({"ok": true, "protocol": PROTOCOL_VERSION, "device": state.device}),
        "recompress" => change::recompress(&state.store, &req),
        "set" => change::set(state, &req),
        "writeback" => change::writeback(&state.store, &req),
        other => json!({
            "ok": false,
            "error": format!("unknown command {other:?} (known: stat, compact, info, recompress, set, writeback)")
        }),
    }
}

/// Accepts control clients forever, a thread each, at most [`MAX_CLIENTS`] at once; never
/// returns (accept errors are retried after a pause).
pub fn serve(state: Arc<ControlState>, listener: UnixListener) -> ! {
    let clients = Arc::new(AtomicUsize::new(0));
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

/// Serves one accepted control client on its own thread, or refuses it when
/// [`MAX_CLIENTS`] are being served.
fn admit(state: &Arc<ControlState>, clients: &Arc<AtomicUsize>, mut stream: UnixStream) {
    if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
        clients.fetch_sub(1, Ordering::AcqRel);
        let msg = json!({"ok": false, "error": format!("too many control clients ({MAX_CLIENTS} at once): try again")});
        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = stream.write_all(format!("{msg}\n").as_bytes());
        return;
    }
    let (state, count) = (state.clone(), clients.clone());
    let spawned = std::thread::Builder::new().name("control".into()).spawn(move || {
        serve_client(&state, stream);
        count.fetch_sub(1, Ordering::AcqRel);
    });
    if let Err(e) = spawned {
        clients.fetch_sub(1, Ordering::AcqRel);
        log(&format!("cannot start a thread for a control client: {e}"));
    }
}

fn serve_client(state: &ControlState, stream: UnixStream) {
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        match (&mut reader).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) if line.len() > MAX_LINE_BYTES => {
                log(&format!("request line longer than {MAX_LINE_BYTES} bytes; closing that control connection"));
                return;
            }
            Ok(_) => {}
            Err(_) => return,
        }
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        let mut out = answer(state, text.trim()).to_string();
        out.push('\n');
        if writer.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// Binds the control socket (same rules as the NBD socket: a live server is refused, a stale
/// file replaced, mode 0600).
pub fn bind(path: &Path) -> Result<UnixListener, socket::BindError> {
    socket::bind_unix(path)
}

/// The one way the control server logs: one line on stderr. A closed stderr is ignored
/// (`eprintln!` would panic and take the control thread down with it).
fn log(msg: &str) {
    let _ = writeln!(std::io::stderr(), "compcache: control: {msg}");
}
