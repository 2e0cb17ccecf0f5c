//! The control channel: a Unix socket beside the NBD socket on which `compcache stat` and
//! `compcache compact` ask a running server for its statistics, or to compact its pool. It
//! never touches device data.
//!
//! # Protocol (documented for users in docs/cli.md)
//! Line-based JSON. The client sends one JSON object per line, the server answers each with
//! one JSON object on one line, in order; the client may send several requests on one
//! connection and closes it when done. Every answer has `"ok"`: `true` with the command's
//! fields, or `false` with `"error"`, a one-line message.
//!
//! | request              | answer fields (besides `ok`)                                      |
//! |----------------------|-------------------------------------------------------------------|
//! | `{"cmd":"stat"}`     | `device` (see [`DeviceInfo`]), `stats` (every `Stats` field), `mm_stat`, `io_stat`, `bd_stat`, `ramzswap` (text) |
//! | `{"cmd":"compact"}`  | `pages_freed`                                                     |
//! | `{"cmd":"info"}`     | `device`                                                          |
//!
//! A request line may be at most [`MAX_LINE_BYTES`] long; a longer one ends the connection.

use crate::{listener, log};
use compcache_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The longest request line accepted.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// An idle control client is disconnected after this long, so it cannot pin a thread forever.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

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
                "device": state.device,
                "stats": s,
                "mm_stat": s.mm_stat_line(),
                "io_stat": s.io_stat_line(),
                "bd_stat": s.bd_stat_line(),
                "ramzswap": s.ramzswap_text(),
            })
        }
        "compact" => json!({"ok": true, "pages_freed": state.store.compact()}),
        "info" => json!({"ok": true, "device": state.device}),
        other => json!({"ok": false, "error": format!("unknown command {other:?} (known: stat, compact, info)")}),
    }
}

/// Accepts control clients forever, a thread each. Returns only on a listener failure.
pub fn serve(state: Arc<ControlState>, listener: UnixListener) -> io::Error {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let state = state.clone();
                let spawned = std::thread::Builder::new().name("control".into()).spawn(move || serve_client(&state, stream));
                if let Err(e) = spawned {
                    log("control", &format!("cannot start a thread for a control client: {e}"));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted || e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) => return e,
        }
    }
}

fn serve_client(state: &ControlState, stream: UnixStream) {
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        match (&mut reader).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) if line.len() > MAX_LINE_BYTES => {
                log("control", &format!("request line longer than {MAX_LINE_BYTES} bytes; closing that control connection"));
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

/// A failed control request, worded for the person at the terminal.
#[derive(Debug)]
pub enum ControlError {
    /// Nobody answers on the socket.
    Unreachable { path: PathBuf, source: io::Error },
    /// The server answered something that is not this protocol.
    Protocol(String),
    /// The server refused the request (`"ok": false`).
    Refused(String),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Unreachable { path, source } if source.kind() == io::ErrorKind::PermissionDenied => write!(
                f,
                "cannot reach control socket {}: {source}: it belongs to another user (a server run as root needs `sudo compcache ...`)",
                path.display()
            ),
            ControlError::Unreachable { path, source } => {
                write!(f, "cannot reach control socket {}: {source}: is `compcache serve` running? try --control PATH", path.display())
            }
            ControlError::Protocol(m) => write!(f, "unexpected answer on the control socket: {m}"),
            ControlError::Refused(m) => write!(f, "the server refused the request: {m}"),
        }
    }
}

impl std::error::Error for ControlError {}

/// Sends one request to the control socket at `path`; returns the answer (with `ok: true`).
pub fn request(path: &Path, req: &Value) -> Result<Value, ControlError> {
    let unreachable = |source| ControlError::Unreachable { path: path.to_path_buf(), source };
    let stream = UnixStream::connect(path).map_err(unreachable)?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut writer = stream.try_clone().map_err(unreachable)?;
    let mut line = req.to_string();
    line.push('\n');
    writer.write_all(line.as_bytes()).map_err(unreachable)?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).map_err(|e| ControlError::Protocol(format!("reading the answer: {e}")))?;
    if answer.is_empty() {
        return Err(ControlError::Protocol("the server closed the connection without answering".into()));
    }
    let v: Value = serde_json::from_str(&answer).map_err(|e| ControlError::Protocol(format!("not JSON: {e}")))?;
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(v),
        Some(false) => Err(ControlError::Refused(v.get("error").and_then(Value::as_str).unwrap_or("no reason given").to_string())),
        None => Err(ControlError::Protocol("answer has no \"ok\" field".into())),
    }
}

/// Binds the control socket (same rules as the NBD socket: a live server is refused, a stale
/// file replaced, mode 0600).
pub fn bind(path: &Path) -> Result<UnixListener, listener::BindError> {
    listener::bind_unix(path)
}
