//! The NBD server's sockets: the [`Stream`] a connection is served on, binding TCP, the
//! accept loops that give each client its own thread, and the [`Deadline`] reader the
//! handshake runs under. Unix sockets are bound by [`compcache_control::socket::bind_unix`]
//! (mode 0600 before anyone can connect, stale-socket detection), the rules every compcache
//! server socket follows; accept loops back off on errors with its
//! [`AcceptBackoff`]: no accept error ends a listener (a server that is swap must not stop
//! because a moment's descriptor shortage made one `accept` fail). Only an [`AcceptGate`]
//! (`compcache_control::socket`'s) ends one ([`serve_unix_until`], [`serve_tcp_until`]): a server handing its listeners over
//! to a successor stops accepting, and the clients that connect meanwhile wait in the listen
//! backlog for the successor (crate docs, "Handing over to a successor").

use crate::{log, warn, Server, Transport};
use compcache_control::socket::{accept_until, AcceptBackoff, AcceptGate, BindError};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A connected byte stream a connection can be served on.
pub trait Stream: Read + Write + Send + Sync + Sized + 'static {
    /// A second handle on the same socket (one reads, the other writes).
    fn try_clone_stream(&self) -> io::Result<Self>;
    /// Shuts down both directions, waking any thread blocked on the socket.
    fn shutdown_both(&self);
    /// Sets (or clears) the receive timeout of the socket (shared by every handle on it).
    fn set_receive_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Sets (or clears) the send timeout of the socket (shared by every handle on it): a
    /// write that can send nothing for this long fails with `WouldBlock`.
    fn set_send_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
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
            fn set_send_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                self.set_write_timeout(timeout)
            }
            fn queued_bytes(&self) -> io::Result<usize> {
                fionread(self.as_fd())
            }
        }
    )*};
}

impl_stream!(UnixStream, TcpStream);

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

/// Accepts clients on a Unix listener forever, one thread per client; never returns (module
/// docs: no accept error ends it).
pub fn serve_unix(server: Arc<Server>, listener: UnixListener) -> ! {
    let mut backoff = AcceptBackoff::default();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                backoff.accepted(|line| log("unix listener", line));
                let server = server.clone();
                spawn_connection(move || server.serve_connection_over(stream, "unix", Transport::Unix));
            }
            Err(e) => backoff.pause_after(&e, |line| warn("unix listener", line)),
        }
    }
}

/// Accepts clients on a TCP listener forever, one thread per client; never returns. A server
/// whose TCP clients would get in without TLS, where that is not allowed, refuses each of
/// them (`Server::serve_connection_over`; the crate docs, "Who may connect"); the CLI refuses
/// to start such a listener at all.
pub fn serve_tcp(server: Arc<Server>, listener: TcpListener) -> ! {
    let mut backoff = AcceptBackoff::default();
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                backoff.accepted(|line| log("tcp listener", line));
                // Replies are written whole; Nagle would only delay them.
                let _ = stream.set_nodelay(true);
                let server = server.clone();
                spawn_connection(move || server.serve_connection_over(stream, &peer.to_string(), Transport::Tcp));
            }
            Err(e) => backoff.pause_after(&e, |line| warn("tcp listener", line)),
        }
    }
}

/// [`serve_unix`] until `gate` is closed. The listener is made non-blocking (a flag of the
/// socket, which a successor handed the same listener inherits: it must accept like this too).
pub fn serve_unix_until(server: Arc<Server>, listener: &UnixListener, gate: &AcceptGate) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    accept_until(
        gate,
        listener.as_fd(),
        || listener.accept(),
        |line| warn("unix listener", line),
        |line| log("unix listener", line),
        |stream, _| {
            let server = server.clone();
            spawn_connection(move || server.serve_connection_over(stream, "unix", Transport::Unix));
        },
    );
    Ok(())
}

/// [`serve_tcp`] until `gate` is closed; the listener is made non-blocking, as in
/// [`serve_unix_until`].
pub fn serve_tcp_until(server: Arc<Server>, listener: &TcpListener, gate: &AcceptGate) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    accept_until(
        gate,
        listener.as_fd(),
        || listener.accept(),
        |line| warn("tcp listener", line),
        |line| log("tcp listener", line),
        |stream, peer| {
            let _ = stream.set_nodelay(true);
            let server = server.clone();
            spawn_connection(move || server.serve_connection_over(stream, &peer.to_string(), Transport::Tcp));
        },
    );
    Ok(())
}

fn spawn_connection(f: impl FnOnce() + Send + 'static) {
    if let Err(e) = std::thread::Builder::new().name("nbd-conn".into()).spawn(f) {
        warn("listener", &format!("cannot start a thread for a new client ({e}); it is disconnected"));
    }
}

/// A reader that must be done by `deadline`: before each read it sets the socket's receive
/// timeout to the time left, and past the deadline it fails with `TimedOut`. An absolute
/// limit, unlike a receive timeout alone, which a client resets with every byte it sends.
pub struct Deadline<'a, R: Read, S: Stream> {
    inner: &'a mut R,
    socket: &'a S,
    deadline: Instant,
}

impl<'a, R: Read, S: Stream> Deadline<'a, R, S> {
    pub fn new(inner: &'a mut R, socket: &'a S, deadline: Instant) -> Self {
        Deadline { inner, socket, deadline }
    }
}

impl<R: Read, S: Stream> Read for Deadline<'_, R, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        self.socket.set_receive_timeout(Some(left))?;
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
