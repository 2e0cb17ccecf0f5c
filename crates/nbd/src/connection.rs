//! A connection's setup, from the accepted socket to transmission: its label, the connection
//! cap (with room kept for local clients), the TLS mode of its transport, the three handles on
//! its socket, and the handshake under its absolute deadline (STARTTLS and the haggling inside
//! TLS included). Only a connection whose handshake ended in transmission reaches
//! [`transmission::run`], with the handshake's receive timeout cleared: transmission has no
//! timeout (the kernel's client may rightly stay idle for days).

use crate::handshake::{self, HandshakeError, Outcome, Resume};
use crate::listener::{Deadline, Stream};
use crate::transmission::{self, READ_BUFFER_BYTES};
use crate::{log, warn, Server, Transport};
use std::io::BufReader;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Serves one client that came in over `transport` until it disconnects; blocks. Errors are
/// logged (one line) and end only this connection.
pub(crate) fn serve<S: Stream + AsFd>(server: &Server, stream: S, peer: &str, transport: Transport) {
    let id = server.next_client_id.fetch_add(1, Ordering::Relaxed);
    let label = format!("client {id} ({peer})");
    let open = server.connections.fetch_add(1, Ordering::AcqRel) + 1;
    let _count = ConnectionCount(&server.connections);
    let limit = match transport {
        Transport::Unix => server.options.max_connections,
        Transport::Tcp => server.options.max_connections.saturating_sub(server.options.reserved_local_connections),
    };
    if open as usize > limit {
        let kind = if transport == Transport::Tcp { " for TCP clients (the rest are kept for local ones)" } else { "" };
        warn(&label, &format!("refused: {} connections already open (the limit{kind})", open - 1));
        stream.shutdown_both();
        return;
    }
    let Some(_registered) = server.register(id, stream.as_fd()) else {
        // Handing over (`Server::stop_reading`): the client reconnects to the successor.
        stream.shutdown_both();
        return;
    };
    let client = client_of(stream.as_fd());
    let Some(_client_count) = ClientCount::open(server, client) else {
        warn(
            &label,
            &format!(
                "refused: {} already has {} connections open (the limit per client); close some of them",
                client.map_or_else(String::new, |c| c.to_string()),
                server.options.max_connections_per_client
            ),
        );
        stream.shutdown_both();
        return;
    };
    let Some(tls) = server.tls_mode(transport) else {
        warn(&label, "refused: TCP without TLS is not allowed (no TLS credentials, no allow_plain_tcp)");
        stream.shutdown_both();
        return;
    };
    if server.options.verbose {
        log(&label, "connected");
    }
    let Some(mut h) = Handles::split(stream, &label) else {
        return;
    };
    // A client that does not read the handshake's replies cannot hold its writer longer.
    let _ = h.writer.set_send_timeout(Some(server.options.handshake_deadline));
    // An absolute deadline, not an idle timer: a client that trickles a byte now and then
    // must still finish within it, the TLS handshake and the haggling inside TLS included.
    let deadline = Instant::now() + server.options.handshake_deadline;
    let outcome = handshake::negotiate(&mut Deadline::new(&mut h.reader, &h.shutdown, deadline), &mut h.writer, &server.export, tls);
    match outcome {
        Ok(Outcome::StartTls(resume)) => start_tls(server, h, resume, deadline, &label),
        outcome => transmit(server, outcome, h, &label),
    }
}

/// Who a connection comes from, for [`crate::ServerOptions::max_connections_per_client`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    /// A process on a Unix socket (`SO_PEERCRED`: the pid that connected).
    Process(i32),
    /// A TCP peer.
    Address(IpAddr),
}

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientKey::Process(pid) => write!(f, "process {pid}"),
            ClientKey::Address(ip) => write!(f, "address {ip}"),
        }
    }
}

/// The client at the other end of socket `fd`; `None` (not counted) for this very process
/// (`compcache nbd-attach`'s socket pairs, tests) or a peer that cannot be told.
pub(crate) fn client_of(fd: BorrowedFd<'_>) -> Option<ClientKey> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket for the borrow's lifetime; SO_PEERCRED writes at most
    // `len` bytes (one `ucred`) through the pointer, which points to `cred`, live and
    // writable for the call, and `len` to its size.
    let r =
        unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) };
    if r == 0 && cred.pid > 0 {
        // SAFETY: getpid has no preconditions.
        let own = unsafe { libc::getpid() };
        return (cred.pid != own).then_some(ClientKey::Process(cred.pid));
    }
    // Not a Unix socket (TCP has no peer process): the peer's address.
    let mut addr: libc::sockaddr_storage = zeroed_storage();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket; getpeername writes at most `len` bytes through the
    // pointer, which points to `addr`, a live and writable `sockaddr_storage` of that size.
    let r = unsafe { libc::getpeername(fd.as_raw_fd(), (&mut addr as *mut libc::sockaddr_storage).cast(), &mut len) };
    if r != 0 {
        return None;
    }
    match addr.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a `sockaddr_in`, which it is large
            // and aligned enough for (sockaddr_storage's contract).
            let a = unsafe { &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(ClientKey::Address(IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes())))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for `sockaddr_in6`.
            let a = unsafe { &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(ClientKey::Address(IpAddr::from(a.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// An all-zero `sockaddr_storage`, for getpeername to fill.
fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: `sockaddr_storage` is plain old data (integers and byte arrays): all zeroes is a
    // valid value of it.
    unsafe { std::mem::zeroed() }
}

/// Counts a connection against its client's cap for as long as it lives (none for a client
/// that is not counted).
struct ClientCount<'a> {
    server: &'a Server,
    client: Option<ClientKey>,
}

impl<'a> ClientCount<'a> {
    /// Counts a connection of `client`; `None` if that client has its most open already.
    fn open(server: &'a Server, client: Option<ClientKey>) -> Option<ClientCount<'a>> {
        if let Some(key) = client {
            let mut map = server.per_client.lock();
            let n = map.entry(key).or_insert(0);
            if *n >= server.options.max_connections_per_client {
                return None;
            }
            *n += 1;
        }
        Some(ClientCount { server, client })
    }
}

impl Drop for ClientCount<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.client {
            let mut map = self.server.per_client.lock();
            if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
    }
}

/// Counts a connection as open for as long as it lives.
struct ConnectionCount<'a>(&'a AtomicU64);

impl Drop for ConnectionCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The three handles of a connection: the buffered receive half, the send half, and one to
/// shut it down with (a worker may be blocked in `read` or `write` on the other two).
struct Handles<S: Stream> {
    reader: BufReader<S>,
    writer: S,
    shutdown: S,
}

impl<S: Stream> Handles<S> {
    fn split(stream: S, label: &str) -> Option<Handles<S>> {
        match (stream.try_clone_stream(), stream.try_clone_stream()) {
            (Ok(writer), Ok(shutdown)) => Some(Handles { reader: BufReader::with_capacity(READ_BUFFER_BYTES, stream), writer, shutdown }),
            (Err(e), _) | (_, Err(e)) => {
                warn(label, &format!("cannot set up the connection ({e}); closing it"));
                None
            }
        }
    }
}

/// The TLS handshake and the rest of haggling, inside TLS, under the same deadline.
fn start_tls<S: Stream + AsFd>(server: &Server, h: Handles<S>, resume: Resume, deadline: Instant, label: &str) {
    let Some(config) = server.options.tls.as_ref().map(|t| t.config.clone()) else {
        // Unreachable: STARTTLS is accepted only in the modes that need TLS options.
        warn(label, "STARTTLS accepted without TLS credentials; closing the connection");
        h.shutdown.shutdown_both();
        return;
    };
    let stream = match crate::tls::accept(h.reader, config, deadline) {
        Ok(stream) => stream,
        Err(e) => {
            warn(label, &format!("TLS handshake failed: {e}; closing the connection"));
            h.shutdown.shutdown_both();
            return;
        }
    };
    if server.options.verbose {
        log(label, &crate::tls::describe(&stream));
    }
    let Some(mut h) = Handles::split(stream, label) else {
        return;
    };
    let outcome = handshake::resume_in_tls(&mut Deadline::new(&mut h.reader, &h.shutdown, deadline), &mut h.writer, &server.export, resume);
    transmit(server, outcome, h, label)
}

/// Transmission, if the handshake ended in it; else the connection is closed (with a line
/// saying why, unless the client just left).
fn transmit<S: Stream>(server: &Server, outcome: Result<Outcome, HandshakeError>, h: Handles<S>, label: &str) {
    let _ = h.shutdown.set_receive_timeout(None);
    let negotiated = match outcome {
        Ok(Outcome::Transmission(negotiated)) => negotiated,
        Ok(Outcome::StartTls(_)) => {
            // Only a plain connection starts TLS (see `serve`).
            warn(label, "STARTTLS inside TLS; closing the connection");
            h.shutdown.shutdown_both();
            return;
        }
        Ok(Outcome::Closed) => {
            if server.options.verbose {
                log(label, "closed during the handshake");
            }
            h.shutdown.shutdown_both();
            return;
        }
        Err(e) => {
            warn(label, &format!("{e}; closing the connection"));
            h.shutdown.shutdown_both();
            return;
        }
    };
    transmission::run(server, negotiated, h.reader, h.writer, h.shutdown, label)
}
