//! compcache's private Unix sockets, the control socket and the NBD socket alike: binding one
//! safely (a live server is refused, a stale socket file is replaced), removing it at exit only
//! if it is still ours, and accept loops that back off instead of failing.
//!
//! A socket is mode 0600 before anyone can connect: whoever can connect to the NBD socket can
//! read and write the device (for a swap device, that is the contents of swapped-out memory),
//! and whoever can connect to the control socket can compact the pool. The socket is bound,
//! then its mode set, and only then does it listen; a connect before `listen` is refused
//! (`ECONNREFUSED`), so there is no window in which the socket has the umask's wider mode and
//! accepts. A directory made for it is made 0700.
//!
//! No accept error ends a listener: out of file descriptors (`EMFILE`, `ENFILE`), out of
//! memory, or anything else, the loop pauses (growing from [`ACCEPT_PAUSE_FIRST`] to
//! [`ACCEPT_PAUSE_MAX`]) and tries again, and logs at most one line per
//! [`ACCEPT_LOG_INTERVAL`] ([`AcceptBackoff`]). A server that is swap must not stop because a
//! moment's descriptor shortage made one `accept` fail. Only an [`AcceptGate`] ends an accept
//! loop ([`accept_until`]): a server handing its listeners over to a successor stops accepting,
//! and the clients that connect meanwhile wait in the listen backlog for the successor.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Why a socket could not be bound. Messages say what is wrong and what to do.
#[derive(Debug)]
pub enum BindError {
    /// Another server answers on this socket.
    InUse { path: PathBuf },
    /// The path exists and is not a socket: we never delete such a file.
    NotASocket { path: PathBuf },
    /// The directory does not exist and could not be created, or another OS error.
    Io { what: String, source: io::Error },
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindError::InUse { path } => {
                write!(f, "socket {} is in use by a running server: stop it first, or choose another path", path.display())
            }
            BindError::NotASocket { path } => write!(f, "{} exists and is not a socket: remove it or choose another path", path.display()),
            BindError::Io { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for BindError {}

/// Binds a Unix socket at `path`, creating its directory if needed. If a socket file is
/// already there, it is probed: when a server accepts the connection the path is in use and
/// [`BindError::InUse`] is returned; when nobody listens (the file is stale, left by a server
/// that was killed) it is removed and bound anew.
pub fn bind_unix(path: &Path) -> Result<UnixListener, BindError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| BindError::Io { what: format!("cannot create directory {} for the socket", dir.display()), source })?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => return Err(BindError::InUse { path: path.to_path_buf() }),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)
                    .map_err(|source| BindError::Io { what: format!("cannot remove stale socket {}", path.display()), source })?;
            }
            Err(source) => return Err(BindError::Io { what: format!("cannot probe existing socket {}", path.display()), source }),
        },
        Ok(_) => return Err(BindError::NotASocket { path: path.to_path_buf() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(BindError::Io { what: format!("cannot inspect {}", path.display()), source }),
    }
    bind_private(path)
}

/// socket, bind, chmod 0600, listen: the socket accepts nobody before its mode is 0600.
fn bind_private(path: &Path) -> Result<UnixListener, BindError> {
    use std::os::unix::ffi::OsStrExt;
    let io_err = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| BindError::Io { what, source }
    };
    // SAFETY: socket(2) takes integers only.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io_err("cannot create a socket for")(io::Error::last_os_error()));
    }
    // SAFETY: socket(2) just returned this descriptor; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; all-zero is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io_err("socket path too long (at most 107 bytes) or has a NUL byte:")(io::Error::from_raw_os_error(
            libc::ENAMETOOLONG,
        )));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un, `len` covers its family and NUL-terminated path
    // and is within its size; `fd` is an open socket.
    if unsafe { libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
        let source = io::Error::last_os_error();
        return Err(match source.kind() {
            io::ErrorKind::AddrInUse => BindError::InUse { path: path.to_path_buf() },
            _ => io_err("cannot bind socket")(source),
        });
    }
    // Bound, not listening: a connect now is refused, whatever the mode.
    if let Err(source) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        let _ = std::fs::remove_file(path);
        return Err(io_err("cannot restrict permissions of socket")(source));
    }
    // SAFETY: `fd` is an open, bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), libc::SOMAXCONN) } != 0 {
        let source = io::Error::last_os_error();
        let _ = std::fs::remove_file(path);
        return Err(io_err("cannot listen on socket")(source));
    }
    Ok(UnixListener::from(fd))
}

/// The first pause after a failed accept; it doubles with each failure in a row up to
/// [`ACCEPT_PAUSE_MAX`] and starts again after an accept succeeds.
pub const ACCEPT_PAUSE_FIRST: Duration = Duration::from_millis(10);
pub const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);
/// At most one log line per this interval while accepts keep failing.
pub const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What an accept loop does after errors: pause, growing and capped, and log rate-limited.
/// Pure (the caller sleeps and logs), so that it is tested without running out of anything.
#[derive(Debug)]
pub struct AcceptBackoff {
    pause: Duration,
    /// Failures in a row, and failures since the last log line.
    failures: u64,
    unlogged: u64,
    last_log: Option<Instant>,
    /// A line was logged during the current run of failures (only then is its end logged).
    logged_in_run: bool,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff { pause: ACCEPT_PAUSE_FIRST, failures: 0, unlogged: 0, last_log: None, logged_in_run: false }
    }
}

impl AcceptBackoff {
    /// An accept failed at `now` with `e`: how long to pause, and the line to log, if any.
    pub fn failed(&mut self, e: &io::Error, now: Instant) -> (Duration, Option<String>) {
        // Errors about one connection that is already gone: try again at once.
        if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::WouldBlock) {
            return (Duration::ZERO, None);
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_PAUSE_MAX);
        self.failures += 1;
        self.unlogged += 1;
        let due = self.last_log.is_none_or(|t| now.duration_since(t) >= ACCEPT_LOG_INTERVAL);
        if !due {
            return (pause, None);
        }
        let hint = match e.raw_os_error() {
            Some(libc::EMFILE) => ": out of file descriptors; raise the limit (`ulimit -n`, LimitNOFILE=) or close clients",
            Some(libc::ENFILE) => ": the system is out of file descriptors (fs.file-max)",
            Some(libc::ENOMEM) | Some(libc::ENOBUFS) => ": out of memory",
            _ => "",
        };
        let line = format!(
            "accept failed ({e}){hint}; still serving the connections that are open, retrying (pause now {pause:?}, {} failure(s) since the last line)",
            self.unlogged
        );
        self.unlogged = 0;
        self.last_log = Some(now);
        self.logged_in_run = true;
        (pause, Some(line))
    }

    /// An accept succeeded: the line to log if it ends a run of failures whose start was
    /// logged (so that failures and recoveries alternating fast still log at most two lines
    /// per interval).
    pub fn succeeded(&mut self) -> Option<String> {
        let ended = (self.failures > 0 && self.logged_in_run).then(|| format!("accepting again after {} failed accept(s)", self.failures));
        // The rate limit, and the failures not yet reported, carry over.
        *self = AcceptBackoff { last_log: self.last_log, unlogged: self.unlogged, ..AcceptBackoff::default() };
        ended
    }

    /// Logs (through `log`) and pauses for a failed accept (the accept loops' use of
    /// [`AcceptBackoff::failed`]).
    pub fn pause_after(&mut self, e: &io::Error, log: impl FnOnce(&str)) {
        let (pause, line) = self.failed(e, Instant::now());
        if let Some(line) = line {
            log(&line);
        }
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }

    /// Notes a successful accept (logging the end of a run of failures through `log`).
    pub fn accepted(&mut self, log: impl FnOnce(&str)) {
        if self.failures > 0 {
            if let Some(line) = self.succeeded() {
                log(&line);
            }
        }
    }
}

/// Closes accept loops ([`accept_until`]: the control socket's `serve_until`, the NBD server's
/// `serve_unix_until` and `serve_tcp_until`): once [`AcceptGate::close`] is called, every loop
/// on the gate returns without accepting again. Closed for good.
pub struct AcceptGate {
    closed: AtomicBool,
    /// An eventfd, readable once the gate is closed (never read: it stays readable, for every
    /// loop), so that a loop waiting in `poll` wakes.
    wake: OwnedFd,
}

impl AcceptGate {
    pub fn new() -> io::Result<AcceptGate> {
        // SAFETY: eventfd with an initial count and flags; returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: eventfd returned a new descriptor that nothing else owns.
        Ok(AcceptGate { closed: AtomicBool::new(false), wake: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Makes every loop on the gate return: a loop that is in `accept` now serves that one
    /// client, then returns.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of a live local u64 to the eventfd this gate owns.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Waits until `listener` has a client to accept (true) or the gate is closed (false).
    fn wait(&self, listener: BorrowedFd<'_>) -> bool {
        loop {
            if self.is_closed() {
                return false;
            }
            let mut fds = [
                libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: `fds` is a live array of two pollfds, its length passed with it.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if n > 0 && fds[0].revents != 0 && !self.is_closed() {
                return true;
            }
            // EINTR, or the gate: look again.
        }
    }
}

/// The accept loop of a server that hands its listener over: waits for a client or for
/// `gate` to close, accepts, and gives the client to `serve`; an accept that finds no client
/// (it left, or the listener is non-blocking and another took it) waits again. Errors back
/// off as [`AcceptBackoff`] says (`warn` gets its lines, `note` the end of a run of
/// failures). Returns once `gate` is closed.
pub fn accept_until<S, A>(
    gate: &AcceptGate,
    listener: BorrowedFd<'_>,
    mut accept: impl FnMut() -> io::Result<(S, A)>,
    mut warn: impl FnMut(&str),
    mut note: impl FnMut(&str),
    mut serve: impl FnMut(S, A),
) {
    let mut backoff = AcceptBackoff::default();
    while gate.wait(listener) {
        match accept() {
            Ok((stream, addr)) => {
                backoff.accepted(&mut note);
                serve(stream, addr);
            }
            Err(e) => backoff.pause_after(&e, &mut warn),
        }
    }
}

/// Removes a socket file when dropped, if it is still the one this process bound (same inode
/// and change time; inode numbers alone are reused): a later server may have replaced it.
pub struct SocketFileGuard {
    path: PathBuf,
    id: Option<(u64, i64, i64)>,
}

fn file_id(path: &Path) -> Option<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

impl SocketFileGuard {
    pub fn new(path: &Path) -> SocketFileGuard {
        SocketFileGuard { path: path.to_path_buf(), id: file_id(path) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file now (idempotent).
    pub fn remove(&mut self) {
        if let Some(id) = self.id.take() {
            if file_id(&self.path) == Some(id) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

impl Drop for SocketFileGuard {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("compcache-nbd-test-{}-{name}.sock", std::process::id()))
    }

    #[test]
    fn live_socket_is_refused_and_stale_socket_is_replaced() {
        let path = temp_path("bind");
        let _ = std::fs::remove_file(&path);
        let first = bind_unix(&path).unwrap();
        let mut guard = SocketFileGuard::new(&path);
        match bind_unix(&path) {
            Err(BindError::InUse { .. }) => {}
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(first); // the file stays: now it is stale
        assert!(path.exists());
        let second = bind_unix(&path).expect("a stale socket is replaced");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(second);
        guard.remove(); // inode changed: the guard must not remove the new server's file
        assert!(path.exists());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn accept_errors_back_off_and_log_rate_limited() {
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let mut b = AcceptBackoff::default();
        let t0 = Instant::now();
        let mut pauses = Vec::new();
        let mut lines = Vec::new();
        // 20 failures within one second, then one more ten seconds later.
        for i in 0..20u32 {
            let (pause, line) = b.failed(&emfile, t0 + Duration::from_millis(50 * i as u64));
            pauses.push(pause);
            lines.extend(line);
        }
        assert_eq!(pauses[0], ACCEPT_PAUSE_FIRST);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]), "the pause grows: {pauses:?}");
        assert_eq!(*pauses.last().unwrap(), ACCEPT_PAUSE_MAX, "and is capped");
        assert_eq!(lines.len(), 1, "one line for a burst: {lines:?}");
        assert!(lines[0].contains("out of file descriptors") && lines[0].contains("ulimit -n"), "{}", lines[0]);
        let (_, line) = b.failed(&emfile, t0 + ACCEPT_LOG_INTERVAL + Duration::from_secs(1));
        assert!(line.expect("a line after the interval").contains("20 failure(s)"));
        // Success resets the pause; the rate limit carries over.
        assert!(b.succeeded().unwrap().contains("21 failed"));
        let (pause, line) = b.failed(&emfile, t0 + ACCEPT_LOG_INTERVAL + Duration::from_secs(2));
        assert_eq!((pause, line), (ACCEPT_PAUSE_FIRST, None));
        // Failures and recoveries alternating within the interval log nothing more.
        for i in 0..100 {
            assert_eq!(b.succeeded(), None, "recovery {i} logged");
            assert_eq!(b.failed(&emfile, t0 + ACCEPT_LOG_INTERVAL + Duration::from_secs(3)).1, None);
        }
        let (_, line) = b.failed(&emfile, t0 + 3 * ACCEPT_LOG_INTERVAL);
        assert!(line.expect("after the interval").contains("102 failure(s)"), "unlogged failures are counted across recoveries");
        // A connection aborted before it was accepted is retried at once, without a line.
        let mut b = AcceptBackoff::default();
        assert_eq!(b.failed(&io::Error::from(io::ErrorKind::ConnectionAborted), t0), (Duration::ZERO, None));
        // Any other error (the ones that used to end a listener) backs off too.
        assert_eq!(b.failed(&io::Error::from_raw_os_error(libc::EINVAL), t0).0, ACCEPT_PAUSE_FIRST);
    }

    #[test]
    fn a_socket_directory_made_for_the_socket_is_private() {
        let dir = std::env::temp_dir().join(format!("compcache-nbd-test-{}-newdir", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("s.sock");
        let l = bind_unix(&path).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        UnixStream::connect(&path).expect("it listens");
        drop(l);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_regular_file_is_never_replaced() {
        let path = temp_path("regular");
        std::fs::write(&path, b"precious").unwrap();
        assert!(matches!(bind_unix(&path), Err(BindError::NotASocket { .. })));
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        std::fs::remove_file(&path).unwrap();
    }
}
