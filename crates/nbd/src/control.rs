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
//! At most [`MAX_CLIENTS`] clients are served at once; one more is answered
//! `{"ok":false,"error":...}` and closed. Accept errors never end the listener (it backs off:
//! [`listener::AcceptBackoff`]).
//!
//! # Trusting a control socket
//! A client believes what a control socket says (statistics, the server's pid) only if the
//! socket, and the directory it is in, belong to the user running the client or to root, and
//! the process that answers runs as one of them (`SO_PEERCRED`, checked after connecting, so
//! that a socket swapped in after the check is caught too): another user could otherwise
//! squat a socket path and feed `compcache stat` made-up figures ([`check_trusted`]).

use crate::{listener, log};
use compcache_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
        other => {
            json!({"ok": false, "error": format!("unknown command {other:?} (known: stat, compact, info)")})
        }
    }
}

/// Accepts control clients forever, a thread each, at most [`MAX_CLIENTS`] at once; never
/// returns (accept errors are retried after a pause).
pub fn serve(state: Arc<ControlState>, listener: UnixListener) -> ! {
    let clients = Arc::new(AtomicUsize::new(0));
    let mut backoff = listener::AcceptBackoff::default();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                backoff.accepted("control");
                admit(&state, &clients, stream);
            }
            Err(e) => backoff.pause_after("control", &e),
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
        log("control", &format!("cannot start a thread for a control client: {e}"));
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
    /// The socket, its directory, or the process answering on it belongs to another user.
    Untrusted { path: PathBuf, why: String },
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
            ControlError::Untrusted { path, why } => write!(
                f,
                "not trusting control socket {}: {why}; another user may have put it there to feed you made-up figures. \
                 Remove it (or ask its owner to), or give --control with your own server's socket",
                path.display()
            ),
        }
    }
}

impl std::error::Error for ControlError {}

/// Sends one request to the control socket at `path`; returns the answer (with `ok: true`).
pub fn request(path: &Path, req: &Value) -> Result<Value, ControlError> {
    let unreachable = |source| ControlError::Unreachable { path: path.to_path_buf(), source };
    let untrusted = |why| ControlError::Untrusted { path: path.to_path_buf(), why };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    match check_trusted(path, me) {
        Err(Distrust::Io(source)) => return Err(unreachable(source)),
        Err(Distrust::Owner(why)) => return Err(untrusted(why)),
        Ok(()) => {}
    }
    let stream = UnixStream::connect(path).map_err(unreachable)?;
    let peer = peer_uid(&stream).map_err(unreachable)?;
    if !trusted_uid(peer, me) {
        return Err(untrusted(format!("the process answering on it runs as uid {peer}")));
    }
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut writer = stream.try_clone().map_err(unreachable)?;
    let mut line = req.to_string();
    line.push('\n');
    // A server that refuses the connection (too many control clients) answers at once and
    // closes it, perhaps before our request arrives: then the write fails, but its answer is
    // there to read, and says more than the write error.
    let sent = writer.write_all(line.as_bytes());
    let mut answer = String::new();
    let read = BufReader::new(stream).read_line(&mut answer);
    if answer.is_empty() {
        sent.map_err(unreachable)?;
        read.map_err(|e| ControlError::Protocol(format!("reading the answer: {e}")))?;
        return Err(ControlError::Protocol("the server closed the connection without answering".into()));
    }
    let v: Value = serde_json::from_str(&answer).map_err(|e| ControlError::Protocol(format!("not JSON: {e}")))?;
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(v),
        Some(false) => Err(ControlError::Refused(v.get("error").and_then(Value::as_str).unwrap_or("no reason given").to_string())),
        None => Err(ControlError::Protocol("answer has no \"ok\" field".into())),
    }
}

/// Why a socket is not trusted.
#[derive(Debug)]
pub enum Distrust {
    /// It could not be inspected (it does not exist, say).
    Io(io::Error),
    /// It, or its directory, belongs to another user: the reason.
    Owner(String),
}

/// Whether files and processes of `uid` may be trusted by a client running as `me`: its own,
/// and root's.
fn trusted_uid(uid: u32, me: u32) -> bool {
    uid == me || uid == 0
}

/// Checks that the socket at `path` (following links) and the directory it is in belong to
/// `me` or to root, and that the directory cannot be written by others unless it is sticky
/// (like /tmp, where nobody can replace another user's file). Used by clients before they
/// believe a socket (module docs).
pub fn check_trusted(path: &Path, me: u32) -> Result<(), Distrust> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).map_err(Distrust::Io)?;
    if !meta.file_type().is_socket() {
        return Err(Distrust::Owner("it is not a socket".into()));
    }
    if !trusted_uid(meta.uid(), me) {
        return Err(Distrust::Owner(format!("it belongs to uid {} (you are uid {me})", meta.uid())));
    }
    let real = std::fs::canonicalize(path).map_err(Distrust::Io)?;
    let dir = real.parent().unwrap_or(Path::new("/"));
    let d = std::fs::metadata(dir).map_err(Distrust::Io)?;
    if !trusted_uid(d.uid(), me) {
        return Err(Distrust::Owner(format!("its directory {} belongs to uid {} (you are uid {me})", dir.display(), d.uid())));
    }
    if d.mode() & 0o022 != 0 && d.mode() & 0o1000 == 0 {
        return Err(Distrust::Owner(format!("its directory {} can be written by other users and is not sticky", dir.display())));
    }
    Ok(())
}

/// The uid of the process at the other end of a connected Unix socket (`SO_PEERCRED`).
fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    // SAFETY: ucred is plain data; all-zero is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the descriptor is an
    // open Unix socket for the duration of the borrow.
    let rc = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Binds the control socket (same rules as the NBD socket: a live server is refused, a stale
/// file replaced, mode 0600).
pub fn bind(path: &Path) -> Result<UnixListener, listener::BindError> {
    listener::bind_unix(path)
}
