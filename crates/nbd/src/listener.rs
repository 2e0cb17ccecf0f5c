//! Sockets: binding a Unix socket safely (a live server is refused, a stale socket file is
//! replaced), binding TCP, and accept loops that give each client its own thread.
//!
//! Unix sockets are created mode 0600: whoever can connect can read and write the device (for
//! a swap device, that is the contents of swapped-out memory).

use crate::{log, Server, Transport};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A connected byte stream a connection can be served on.
pub trait Stream: Read + Write + Send + Sync + Sized + 'static {
    /// A second handle on the same socket (one reads, the other writes).
    fn try_clone_stream(&self) -> io::Result<Self>;
    /// Shuts down both directions, waking any thread blocked on the socket.
    fn shutdown_both(&self);
    /// Sets (or clears) the receive timeout of the socket (shared by every handle on it).
    fn set_receive_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Bytes received and not yet read, without blocking (`FIONREAD`).
    fn queued_bytes(&self) -> io::Result<usize>;
}

/// `FIONREAD` on a socket: the bytes waiting in its receive queue.
fn fionread(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is an open descriptor for the lifetime of the borrow, and FIONREAD writes
    // exactly one `c_int` through the pointer, which points to `n`, live and writable for the
    // duration of the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// Both socket types implement `Stream` with the same std calls.
macro_rules! impl_stream {
    ($($t:ty),*) => {$(
        impl Stream for $t {
            fn try_clone_stream(&self) -> io::Result<Self> {
                self.try_clone()
            }
            fn shutdown_both(&self) {
                let _ = self.shutdown(Shutdown::Both);
            }
            fn set_receive_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                self.set_read_timeout(timeout)
            }
            fn queued_bytes(&self) -> io::Result<usize> {
                fionread(self.as_fd())
            }
        }
    )*};
}

impl_stream!(UnixStream, TcpStream);

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
            std::fs::create_dir_all(dir)
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
    let listener = UnixListener::bind(path).map_err(|source| match source.kind() {
        io::ErrorKind::AddrInUse => BindError::InUse { path: path.to_path_buf() },
        _ => BindError::Io { what: format!("cannot bind socket {}", path.display()), source },
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| BindError::Io { what: format!("cannot restrict permissions of socket {}", path.display()), source })?;
    Ok(listener)
}

/// Binds a TCP listener.
pub fn bind_tcp(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).map_err(|source| {
        let what = match source.kind() {
            io::ErrorKind::AddrInUse => format!("TCP address {addr} is in use: stop the other server or choose another port"),
            _ => format!("cannot listen on TCP address {addr}"),
        };
        BindError::Io { what, source }
    })
}

/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Accepts clients on a Unix listener forever, one thread per client. Returns only if the
/// listener fails in a way that retrying cannot fix.
pub fn serve_unix(server: Arc<Server>, listener: UnixListener) -> io::Error {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let server = server.clone();
                spawn_connection(move || server.serve_connection(stream, "unix"));
            }
            Err(e) => {
                if let Some(fatal) = accept_failed(e) {
                    return fatal;
                }
            }
        }
    }
}

/// Accepts clients on a TCP listener forever, one thread per client. Refuses to serve at all
/// when TCP clients would get in without TLS and the server does not allow that (see the
/// crate docs, "Who may connect").
pub fn serve_tcp(server: Arc<Server>, listener: TcpListener) -> io::Error {
    if server.tls_mode(Transport::Tcp).is_none() {
        return io::Error::new(
            io::ErrorKind::PermissionDenied,
            "TCP without TLS: give TLS credentials, or allow plain TCP explicitly (anyone who can reach the port could read and write the device)",
        );
    }
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                // Replies are written whole; Nagle would only delay them.
                let _ = stream.set_nodelay(true);
                let server = server.clone();
                spawn_connection(move || server.serve_connection_over(stream, &peer.to_string(), Transport::Tcp));
            }
            Err(e) => {
                if let Some(fatal) = accept_failed(e) {
                    return fatal;
                }
            }
        }
    }
}

fn spawn_connection(f: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new().name("nbd-conn".into()).spawn(f) {
        log("listener", &format!("cannot start a thread for a new client ({e}); it is disconnected"));
    }
}

/// Classifies an accept error: transient ones are logged and retried after a pause.
fn accept_failed(e: io::Error) -> Option<io::Error> {
    match e.kind() {
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::WouldBlock => None,
        _ if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)) => {
            log("listener", &format!("accept failed ({e}); retrying"));
            std::thread::sleep(ACCEPT_RETRY);
            None
        }
        _ => Some(e),
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
    fn queued_bytes_counts_what_is_not_read_yet() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        assert_eq!(b.queued_bytes().unwrap(), 0);
        a.write_all(b"hello").unwrap();
        assert_eq!(b.queued_bytes().unwrap(), 5);
        let mut two = [0u8; 2];
        b.read_exact(&mut two).unwrap();
        assert_eq!(b.queued_bytes().unwrap(), 3);

        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(s.queued_bytes().unwrap(), 0);
        c.write_all(&[1u8; 100]).unwrap();
        c.flush().unwrap();
        // TCP on loopback delivers at once, but wait for it without timing anything.
        let mut b = [0u8; 100];
        s.peek(&mut b).unwrap();
        assert!(s.queued_bytes().unwrap() > 0);
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
