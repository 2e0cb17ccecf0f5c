//! A control client: one request to a running server's control socket ([`request`]), made
//! only after the socket, its directory and the process answering on it have been found
//! trustworthy ([`check_trusted`], and `SO_PEERCRED` after connecting; the crate docs,
//! "Trusting a control socket").

use serde_json::Value;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
