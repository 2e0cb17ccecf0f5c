//! # compcache-nbd
//!
//! The NBD front end of compcache: it serves one [`compcache_store::Store`] as an NBD export
//! over Unix or TCP sockets, so the kernel's NBD client (or qemu, nbdkit's tools, libnbd) can
//! use it as a block device, and swap to it. A thin layer: it parses and validates requests
//! and makes one store call per request. Std threads, no async runtime.
//!
//! One job per file, in the order a connection meets them:
//! - [`listener`]: the [`listener::Stream`] a connection is served on, TCP binding, accept
//!   loops (Unix sockets are bound by `compcache_control::socket`, the rules every compcache
//!   server socket shares), the handshake's deadline reader;
//! - `connection`: a connection's setup: the connection cap, the TLS mode, the handshake under
//!   its deadline (STARTTLS included); only then transmission;
//! - [`handshake`]: fixed newstyle negotiation and option haggling;
//! - [`tls`]: TLS (`NBD_OPT_STARTTLS`): credentials, the TLS handshake, a TLS stream;
//! - [`meta`]: metadata contexts (`base:allocation`) and block status descriptors;
//! - [`transmission`]: the transmission phase, a folder by job: the read turn, request
//!   validation and the one store call, the in-flight budget, the request buffer, and the
//!   workers (its module docs walk through them and state the rules);
//! - [`budget`]: the server-wide in-flight byte budget shared by every connection;
//! - [`reply`]: structured reply chunks (READ data, block status, errors);
//! - [`wire`]: magic numbers, flags, codes, fixed-size messages (encode/decode only);
//! - [`client`]: a minimal blocking NBD client: the handshake of `compcache-kernel-nbd`
//!   (which hands the negotiated socket to the kernel, in production), and tests and tools.
//!
//! The control channel (`compcache stat`, `compact`) is not here: every front end serves one,
//! so it is the crate `compcache-control`.
//!
//! ## Threads of a connection
//! Each connection has its own workers (the connection's thread and up to
//! [`ServerOptions::workers_per_connection`]` - 1` more, started when requests queue up: an
//! idle connection is one thread), each with its own store [`compcache_store::Context`]. Workers take turns reading a request from the socket, then
//! serve it themselves (one store call) and write its reply under the connection's writer
//! lock, so concurrent replies never interleave and no request changes threads. At queue
//! depth 1 one worker does everything; deeper queues run up to `workers` requests of one
//! connection at once. Workers are per connection (not one pool for all) so that a client that
//! stops reading its replies stalls only its own connection (until the request deadline drops
//! it). Memory per connection is bounded by [`ServerOptions::max_inflight_bytes`] and the
//! maximum payload of [`MAX_PAYLOAD_BYTES`].
//! The rules (which lock protects what, in which order) are at the top of [`transmission`].
//!
//! ## Limits (what one client, or many, can take)
//! - payload bytes in flight: per connection [`ServerOptions::max_inflight_bytes`], and for
//!   the whole server [`ServerOptions::max_server_inflight_bytes`] ([`budget`]: the rule and
//!   the guarantee that every connection can always have one request of up to
//!   [`budget::GUARANTEED_REQUEST_BYTES`] in flight); a WRITE's payload is taken as it
//!   arrives, not when its header announces it;
//! - connections: [`ServerOptions::max_connections`] in all, of which the last
//!   [`ServerOptions::reserved_local_connections`] only local clients (Unix socket, socket
//!   pair) may take: TCP clients cannot lock the local ones out; and at most
//!   [`ServerOptions::max_connections_per_client`] per client (process or IP address), so
//!   that no one client can take every slot;
//! - the handshake: it must be over within [`ServerOptions::handshake_deadline`] of the
//!   connection's start, however slowly the client trickles bytes;
//! - a request: once its first byte is in, the rest (payload included) must follow within
//!   [`ServerOptions::request_deadline`], and each reply must be taken within it, so a
//!   client that stalls mid-request or stops reading is dropped and gives its budget back;
//! - accept errors (out of descriptors) never end a listener ([`listener`]).
//!
//! ## Handing over to a successor
//! A server whose listening sockets outlive it (held by a supervisor, handed to a successor
//! process: `compcache serve`'s takeover) stops in two steps: its accept loops return
//! (`compcache_control::socket::AcceptGate`, [`listener::serve_unix_until`]), so that clients connecting meanwhile wait in the listen backlog
//! for the successor; then [`Server::stop_reading`] shuts every open connection down for
//! reading: the requests already read are answered, the connection closes, and the client
//! (qemu with `reconnect-delay`) reconnects to the successor and sends again what had no reply.
//!
//! ## Capabilities
//! Declared in [`TRANSMISSION_FLAGS`]: FLUSH, FUA, TRIM, WRITE_ZEROES and MULTI_CONN, plus DF
//! on a connection that negotiated structured replies
//! ([`handshake::Negotiated::transmission_flags`]). Options: structured replies, and the
//! `base:allocation` metadata context for `NBD_CMD_BLOCK_STATUS`, which reports unwritten,
//! discarded and zero-filled pages as holes that read as zeroes (see [`meta`]), so that
//! `nbdcopy`, `qemu-img convert` and `qemu-img map` skip them. Not offered: extended
//! headers, CACHE, FAST_ZERO, resize.
//!
//! Every connection to one server reaches the same `Store`, which has no per-connection cache: a
//! write is in the store (visible to every connection) before it is replied to, so multi-conn
//! is valid. FUA is "the command, then `Store::flush`"; FLUSH is answered once the modifying
//! requests read before it on its connection are, after `Store::flush`. For a RAM device
//! `Store::flush` returns at once: a backing device does not change that, since the index of
//! its records lives in the server's memory and an fsync would make nothing durable
//! (docs/backing.md, "Flush and FUA"). In cache mode (`--origin`) it is the origin's fdatasync,
//! which covers every write completed on any connection, as multi-conn requires
//! ([`transmission`], "FUA and FLUSH").
//!
//! ## Who may connect
//! Whoever can connect can read and write the device. Unix sockets are owner-only (mode
//! 0600). TCP has no such check, so a TCP connection must use TLS (FORCEDTLS: nothing but
//! `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` before it) unless
//! [`ServerOptions::allow_plain_tcp`] says otherwise; without [`ServerOptions::tls`] and
//! without that, TCP connections are refused. On Unix sockets TLS is offered, and required
//! with [`tls::TlsOptions::require_on_unix`].

pub mod budget;
pub mod client;
mod connection;
pub mod handshake;
pub mod listener;
pub mod meta;
pub mod reply;
pub mod tls;
pub mod transmission;
pub mod wire;

#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod tests;

use compcache_store::Store;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The largest READ or WRITE payload a client may send or ask for: 32 MiB, the protocol's
/// interoperable maximum. Advertised in `NBD_INFO_BLOCK_SIZE`.
pub const MAX_PAYLOAD_BYTES: u32 = 32 << 20;
/// The preferred block size advertised: the store's page; smaller or unaligned requests work
/// (the store does read-modify-write) but cost more.
pub const PREFERRED_BLOCK_BYTES: u32 = compcache_store::PAGE_SIZE as u32;
/// The minimum block size advertised: 1, any byte range is served.
pub const MINIMUM_BLOCK_BYTES: u32 = 1;

/// The transmission flags every export advertises.
pub const TRANSMISSION_FLAGS: u16 = wire::FLAG_HAS_FLAGS
    | wire::FLAG_SEND_FLUSH
    | wire::FLAG_SEND_FUA
    | wire::FLAG_SEND_TRIM
    | wire::FLAG_SEND_WRITE_ZEROES
    | wire::FLAG_CAN_MULTI_CONN;

/// What is exported: one store under one name.
pub struct Export {
    /// The export name clients ask for; the empty name (the protocol's default export) is
    /// accepted as well.
    pub name: String,
    /// A human-readable description, sent in `NBD_INFO_DESCRIPTION` and `NBD_OPT_LIST`.
    pub description: String,
    pub store: Arc<Store>,
}

impl Export {
    /// Whether a client asking for `requested` gets this export.
    pub fn matches(&self, requested: &[u8]) -> bool {
        requested.is_empty() || requested == self.name.as_bytes()
    }
}

/// Tunables of the server, with defaults that suit a swap device.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Worker threads (each with its own store context) per connection, counting the
    /// connection's own thread; at most this many requests of one connection run at once.
    /// They start as requests queue up (an idle connection is one thread), or all at once
    /// with [`ServerOptions::request_buffer_bytes`].
    pub workers_per_connection: usize,
    /// Payload bytes one connection may have in flight (read buffers plus write payloads
    /// received but not yet stored). A single request of up to [`MAX_PAYLOAD_BYTES`] is
    /// always admitted when nothing else is in flight. It is also what one connection can
    /// take of [`ServerOptions::max_server_inflight_bytes`]: the default (32 MiB, one largest
    /// request) lets seven connections that stop reading hold their most and leave room for
    /// any request of the others.
    pub max_inflight_bytes: usize,
    /// Requests one connection may have in flight (each worker holds at most one, so the
    /// smaller of this and `workers_per_connection` applies).
    pub max_inflight_requests: usize,
    /// Payload bytes all connections together may have in flight ([`budget`]: a request is
    /// admitted when it fits, on an otherwise idle server, or, up to
    /// [`budget::GUARANTEED_REQUEST_BYTES`], when its connection holds nothing).
    pub max_server_inflight_bytes: usize,
    /// Connections served at once; more are closed at once with a log line.
    pub max_connections: usize,
    /// Connections one client may have open at once: a process on a Unix socket (its pid,
    /// `SO_PEERCRED`), an IP address over TCP. More from it are closed at once with a log line,
    /// so that one client cannot take every connection slot (idle or stuck in the handshake)
    /// and lock the others out. This server's own process (`compcache nbd-attach`'s socket
    /// pairs) is not counted.
    pub max_connections_per_client: usize,
    /// Of [`ServerOptions::max_connections`], the slots only local clients (Unix socket,
    /// socket pair) may take: a TCP client is refused once `max_connections -
    /// reserved_local_connections` connections are open.
    pub reserved_local_connections: usize,
    /// The whole handshake must be over within this time from the connection's start (an
    /// absolute deadline, not an idle timer), so connections that never negotiate cannot
    /// hold threads and connection slots. Transmission has no idle timeout: the kernel's
    /// client may rightly stay idle for days.
    pub handshake_deadline: Duration,
    /// A request, once its first byte has arrived, must be in whole (header and payload)
    /// within this time, and each reply must be taken by the client within it; a connection
    /// that stops (or trickles) in the middle of a request or does not read its replies is
    /// closed with a log line, and what it held of the in-flight budgets is given back. Time
    /// the server spends waiting for budget room does not count. 30 s lets a 32 MiB payload
    /// through at 1.1 MiB/s. `None`: no deadline, for a server whose only clients are the
    /// kernel's own connections (`compcache nbd-attach`): there is no one else to protect,
    /// and a dropped connection would fail swap I/O.
    pub request_deadline: Option<Duration>,
    /// Log a line when a client connects and disconnects cleanly (errors are always logged).
    pub verbose: bool,
    /// Data bytes each worker's request buffer holds from the start, made resident, and keeps
    /// (0: it grows with the requests served). For a swap server whose client's requests are
    /// capped at this size (`compcache nbd-attach` caps the kernel's): its workers then never
    /// allocate while serving, when an allocation could wait on the memory it is freeing.
    pub request_buffer_bytes: usize,
    /// TLS credentials and policy (`NBD_OPT_STARTTLS`); `None`: no TLS (STARTTLS gets
    /// `NBD_REP_ERR_POLICY`).
    pub tls: Option<tls::TlsOptions>,
    /// Serve TCP clients that do not use TLS (TLS stays offered if `tls` is set). Off by
    /// default: anyone who can reach a TCP port could read and write the device.
    pub allow_plain_tcp: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        ServerOptions {
            workers_per_connection: cpus.clamp(2, 4),
            max_inflight_bytes: MAX_PAYLOAD_BYTES as usize,
            max_inflight_requests: 128,
            max_server_inflight_bytes: 256 << 20,
            max_connections: 256,
            max_connections_per_client: 16,
            reserved_local_connections: 16,
            handshake_deadline: Duration::from_secs(60),
            request_deadline: Some(Duration::from_secs(30)),
            verbose: false,
            request_buffer_bytes: 0,
            tls: None,
            allow_plain_tcp: false,
        }
    }
}

/// An NBD server for one export. Share it in an `Arc`; serve any number of connections.
pub struct Server {
    pub export: Export,
    pub options: ServerOptions,
    /// The server-wide in-flight byte budget, shared by every connection.
    pub(crate) budget: Arc<budget::Budget>,
    next_client_id: AtomicU64,
    connections: AtomicU64,
    /// Open connections per client (`ServerOptions::max_connections_per_client`).
    per_client: parking_lot::Mutex<std::collections::HashMap<connection::ClientKey, usize>>,
    /// Every open connection's socket, for [`Server::stop_reading`].
    open: parking_lot::Mutex<OpenSockets>,
    /// Set by [`Server::stop_reading`] (under `open`) before any socket is shut down: no
    /// connection starts after it, and one that then reads end of file logs nothing (it is not
    /// the client's doing).
    pub(crate) reading_stopped: Arc<std::sync::atomic::AtomicBool>,
}

/// The sockets of the open connections (a second descriptor of each, closed when the
/// connection ends), by connection id. A connection registers under this lock, and
/// [`Server::stop_reading`] sets `Server::reading_stopped` under it: so no connection starts
/// unseen after it.
type OpenSockets = std::collections::HashMap<u64, OwnedFd>;

/// A connection's entry in the server's open sockets, removed when dropped.
pub(crate) struct Registered<'a> {
    server: &'a Server,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.server.open.lock().remove(&self.id);
    }
}

/// `shutdown(SHUT_RD)`: reads of every handle on the socket return what is queued, then end
/// of file; the other direction stays open for the replies.
fn shut_reading(fd: BorrowedFd<'_>) {
    // SAFETY: shutdown on a descriptor that is open for the borrow's lifetime; it changes the
    // socket's state only, never memory.
    unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RD) };
}

impl Server {
    pub fn new(export: Export, options: ServerOptions) -> Server {
        let budget = Arc::new(budget::Budget::new(options.max_server_inflight_bytes));
        Server {
            export,
            options,
            budget,
            next_client_id: AtomicU64::new(1),
            connections: AtomicU64::new(0),
            per_client: Default::default(),
            open: Default::default(),
            reading_stopped: Default::default(),
        }
    }

    /// Hands over (crate docs, "Handing over to a successor"): every open connection stops
    /// reading requests (its socket is shut down for reading), answers those it has read, and
    /// closes; a connection that starts after this is closed at once. The caller waits for
    /// [`Server::open_connections`] to reach 0. Irreversible.
    pub fn stop_reading(&self) {
        let open = self.open.lock();
        self.reading_stopped.store(true, Ordering::Release);
        for fd in open.values() {
            shut_reading(fd.as_fd());
        }
    }

    /// Registers connection `id` on socket `fd` for [`Server::stop_reading`]; `None` once the
    /// server has stopped reading. A socket that cannot be duplicated is served but not
    /// registered: `stop_reading` does not reach it, and it ends with the process.
    pub(crate) fn register(&self, id: u64, fd: BorrowedFd<'_>) -> Option<Registered<'_>> {
        let mut open = self.open.lock();
        if self.reading_stopped.load(Ordering::Acquire) {
            return None;
        }
        if let Ok(dup) = fd.try_clone_to_owned() {
            open.insert(id, dup);
        }
        Some(Registered { server: self, id })
    }

    /// The TLS mode of a connection over `transport` (see the crate docs, "Who may connect");
    /// `None`: such connections must not be served (TCP without TLS and without
    /// `allow_plain_tcp`).
    pub fn tls_mode(&self, transport: Transport) -> Option<tls::TlsMode> {
        use tls::TlsMode::*;
        let o = &self.options;
        match (transport, &o.tls) {
            (Transport::Unix, None) => Some(Off),
            (Transport::Unix, Some(t)) => Some(if t.require_on_unix { Required } else { Offered }),
            (Transport::Tcp, Some(_)) => Some(if o.allow_plain_tcp { Offered } else { Required }),
            (Transport::Tcp, None) => o.allow_plain_tcp.then_some(Off),
        }
    }

    /// Serves one client of a Unix socket (or socketpair) until it disconnects; blocks.
    /// Errors are logged (one line) and end only this connection.
    pub fn serve_connection<S: listener::Stream + AsFd>(&self, stream: S, peer: &str) {
        self.serve_connection_over(stream, peer, Transport::Unix)
    }

    /// Serves one client that came in over `transport`, with the TLS rules for it and the
    /// connection cap (which keeps room for local clients that TCP clients cannot take).
    pub fn serve_connection_over<S: listener::Stream + AsFd>(&self, stream: S, peer: &str, transport: Transport) {
        connection::serve(self, stream, peer, transport)
    }

    /// Connections open right now.
    pub fn open_connections(&self) -> u64 {
        self.connections.load(Ordering::Acquire)
    }
}

/// The kind of socket a client came in on; it decides whether TLS is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A Unix socket (owner-only) or a socketpair.
    Unix,
    /// TCP: reachable by every local user, or more.
    Tcp,
}

/// The one way this crate logs: through the servers' log sink (`compcache_log`: levels, the
/// journal's priorities, never a panic on a closed stderr), as `compcache-nbd: <who>: ...`.
/// What a connection does (connected, disconnected, TLS in use) is information.
pub(crate) fn log(who: &str, msg: &str) {
    compcache_log::info(&format!("compcache-nbd: {who}"), msg);
}

/// The same for what went wrong: a refused or failed connection, a reply that could not be
/// sent, a listener that had to pause.
pub(crate) fn warn(who: &str, msg: &str) {
    compcache_log::warning(&format!("compcache-nbd: {who}"), msg);
}
