//! `compcache serve`: create a compressed RAM device and serve it over NBD until SIGINT,
//! SIGTERM or SIGHUP, with a control socket for `compcache stat`.
//!
//! Supervised (docs/nbd.md, "A server that dies"; docs/swap.md, "When the server dies"): when
//! a holder is named (`NOTIFY_SOCKET`: a supervisor, systemd's file descriptor store) and the
//! store's state outlives the process (`Store::state_fd`), the server gives the holder, before
//! it serves anything, the state's descriptor ([`FD_STORE`]), its NBD listening sockets (the
//! Unix socket's and the TCP one's, [`FD_NBD_LISTEN`]) and the control socket's
//! ([`FD_CONTROL_LISTEN`]): [`SERVE_HELD`]. While the holder keeps the listeners, a client that
//! connects finds the socket listening whether or not a server runs: it waits in the listen
//! backlog. A successor is started with the same flags, `--takeover` and those descriptors
//! (`LISTEN_FDS`; under systemd, which sets `LISTEN_PID`, no `--takeover` is needed), or a
//! standby a supervisor started in advance is handed them (`--standby-fd`): it recovers the store (a state it cannot read is refused in one line, exit
//! `TAKEOVER_REFUSED`), serves on the handed listeners (the socket files are neither removed
//! nor bound again) and from then on is the server. The clients of the dead server lose their
//! connection; qemu with `reconnect-delay` connects again and sends again the requests that had
//! no reply. SIGUSR2 (`compcache restart`) hands over: stop accepting, stop reading requests,
//! answer those read, close every connection, exit with `HANDED_OVER`, leaving the socket files
//! and every page to the successor. SIGTERM still stops the device and removes its files. A
//! panic of a held server aborts the process, so that the holder sees it die.

use crate::backing::{spawn_writeback, StartGuard};
use crate::failure::{with_code, Failure, HANDED_OVER, TAKEOVER_REFUSED};
use crate::log;
use crate::metrics::port_or_address;
use crate::paths;
use crate::private_file;
use crate::process::{self, StopSignals};
use crate::store_args::{config_error_line, StoreArgs};
use crate::units::human;
use compcache_control::socket::{bind_unix, AcceptGate, SocketFileGuard};
use compcache_control::{self as control, ControlState, DeviceInfo};
use compcache_nbd::listener;
use compcache_nbd::tls::{self, TlsOptions};
use compcache_nbd::{Export, Server, ServerOptions};
use compcache_store::{Config, Store};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Serve a compressed RAM block device over NBD (Unix socket by default).
#[derive(clap::Args, Debug)]
#[command(after_help = "Use --mlock when the device is used as swap: see docs/cli.md.")]
pub struct Args {
    /// The store flags, as every server takes them (`crate::store_args`).
    #[command(flatten)]
    store: StoreArgs,

    /// NBD Unix socket [default: $COMPCACHE_SOCKET, /run/compcache/compcache.sock as root,
    /// else $XDG_RUNTIME_DIR/compcache.sock or /tmp/compcache-$UID.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,

    /// Serve NBD over TCP on this address (PORT alone means 127.0.0.1:PORT). Without
    /// --socket, TCP only; with it, both. Needs --tls-certificates (or --insecure-plain-tcp).
    #[arg(long, value_name = "[ADDR:]PORT")]
    listen: Option<String>,

    /// TLS credentials: a directory with ca-cert.pem, server-cert.pem and server-key.pem (the
    /// layout of nbdkit, qemu and libnbd). TCP clients must use TLS and present a client
    /// certificate signed by ca-cert.pem.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,

    /// TLS on the Unix socket: `on` offers it (the socket is owner-only already), `require`
    /// requires it as on TCP.
    #[arg(long, value_name = "on|require", value_parser = ["on", "require"], requires = "tls_certificates")]
    tls: Option<String>,

    /// Let TCP clients in without TLS: anyone who can reach the port (every local user, for
    /// 127.0.0.1) can read and write the device. Logged as a warning at start.
    #[arg(long)]
    insecure_plain_tcp: bool,

    /// Control socket for `compcache stat` [default: the NBD socket path + .ctl].
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,

    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics (a port alone: on
    /// 127.0.0.1). See docs/metrics.md.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = crate::metrics::parse_metrics_addr)]
    metrics: Option<SocketAddr>,

    /// NBD export name (clients asking for the default export "" get it too).
    #[arg(long, default_value = "compcache", value_name = "NAME")]
    name: String,

    /// Lock the server's memory (its program whole, the rest as it is touched) so it is never swapped out: use
    /// it when serving swap, or the kernel can deadlock swapping out the swap server.
    #[arg(long)]
    mlock: bool,

    /// Write the server's PID to this file (removed on exit).
    #[arg(long, value_name = "PATH")]
    pid_file: Option<PathBuf>,

    /// Worker threads per NBD connection [default: CPUs, 2..=4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: Option<u16>,

    /// Log each client connecting and disconnecting (errors are always logged).
    #[arg(long, short)]
    verbose: bool,

    /// File descriptor to write "READY <NBD socket>" to once the device is served (a
    /// supervisor's pipe).
    #[arg(long, value_name = "FD", hide = true, value_parser = crate::cmd::session::parse_ready_fd)]
    ready_fd: Option<i32>,

    /// Take over the device whose descriptors are handed to this process (LISTEN_FDS, from a
    /// supervisor or systemd's file descriptor store) instead of making a new one.
    #[arg(long, hide = true)]
    takeover: bool,

    /// Start as a standby (a supervisor's, with --takeover): lock memory if --mlock, then wait
    /// on this socket for the descriptors of the device to take over.
    #[arg(long, value_name = "FD", hide = true, value_parser = crate::cmd::session::parse_standby_fd, requires = "takeover")]
    standby_fd: Option<i32>,
}

/// The names the server's descriptors are stored under (module docs): the store's state, as
/// for every front end.
pub const FD_STORE: &str = crate::cmd::fuse::FD_STORE;
/// The NBD listening sockets (the Unix socket's, the TCP one's: told apart by address family).
pub const FD_NBD_LISTEN: &str = "compcache-nbd-listen";
/// The control socket's listening socket.
pub const FD_CONTROL_LISTEN: &str = "compcache-control-listen";
/// What a holder must keep for a successor of `compcache serve`.
pub const SERVE_HELD: &[&str] = &[FD_STORE, FD_NBD_LISTEN, FD_CONTROL_LISTEN];

/// How long a server handing over waits for its connections to answer what they have read
/// and close; a connection still open then is cut (its client sends its requests again).
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the main thread waits for: a signal, or an accept loop that ended (only once the
/// accept gate is closed, or if its listener could not be set up).
enum Event {
    Signal(i32),
    AcceptEnded(&'static str, std::io::Result<()>),
}

/// What a successor is handed (module docs).
struct Handed {
    state: OwnedFd,
    unix: Option<UnixListener>,
    tcp: Option<TcpListener>,
    control: UnixListener,
}

impl Handed {
    /// The descriptors handed to this process, by name; the error is one line. Call before any
    /// thread exists (the environment is read and cleared).
    fn take() -> Result<Handed, String> {
        let fds = crate::fdstore::handed(false).map_err(|e| format!("the handed descriptors: {e}"))?;
        if let Some(name) = SERVE_HELD.iter().find(|&&n| !fds.iter().any(|(m, _)| m == n)) {
            return Err(format!("no {name} descriptor was handed over"));
        }
        let (mut state, mut unix, mut tcp, mut control) = (None, None, None, None);
        for (name, fd) in fds {
            match name.as_str() {
                FD_STORE => state = Some(fd),
                FD_NBD_LISTEN => match listening_family(&fd).map_err(|e| format!("{FD_NBD_LISTEN}: {e}"))? {
                    libc::AF_UNIX => unix = Some(UnixListener::from(fd)),
                    _ => tcp = Some(TcpListener::from(fd)),
                },
                FD_CONTROL_LISTEN => match listening_family(&fd).map_err(|e| format!("{FD_CONTROL_LISTEN}: {e}"))? {
                    libc::AF_UNIX => control = Some(UnixListener::from(fd)),
                    _ => return Err(format!("{FD_CONTROL_LISTEN} is not a Unix socket")),
                },
                crate::metrics::FD_METRICS_LISTEN => crate::metrics::adopt_handed(fd).unwrap_or_else(|e| log::warning(&e)),
                // Another program's, or a later version's: not ours to use.
                _ => {}
            }
        }
        let missing = |name: &str| format!("no {name} descriptor was handed over");
        Ok(Handed {
            state: state.ok_or_else(|| missing(FD_STORE))?,
            unix,
            tcp,
            control: control.ok_or_else(|| missing(FD_CONTROL_LISTEN))?,
        })
    }

    /// Checks that the handed listeners are the ones the flags name (the same socket paths, the
    /// same TCP address), so that a successor serves where its clients connect and removes the
    /// right files when it stops.
    fn check(&self, socket: Option<&Path>, tcp: Option<SocketAddr>, control: &Path) -> Result<(), String> {
        let bound = |l: &UnixListener| l.local_addr().ok().and_then(|a| a.as_pathname().map(Path::to_path_buf));
        match (socket, &self.unix) {
            (Some(p), Some(l)) if bound(l).as_deref() == Some(p) => {}
            (None, None) => {}
            (want, got) => {
                return Err(format!(
                    "the handed NBD Unix socket ({}) is not --socket's ({})",
                    got.as_ref().and_then(bound).map_or("none".into(), |p| p.display().to_string()),
                    want.map_or("none".into(), |p| p.display().to_string())
                ))
            }
        }
        let got_tcp = self.tcp.as_ref().and_then(|l| l.local_addr().ok());
        match (tcp, got_tcp) {
            (Some(want), Some(got)) if want == got || (want.port() == 0 && want.ip() == got.ip()) => {}
            (None, None) => {}
            (want, got) => {
                return Err(format!(
                    "the handed TCP listener ({}) is not --listen's ({})",
                    got.map_or("none".into(), |a| a.to_string()),
                    want.map_or("none".into(), |a| a.to_string())
                ))
            }
        }
        if bound(&self.control).as_deref() != Some(control) {
            return Err(format!("the handed control socket is not {}", control.display()));
        }
        Ok(())
    }
}

/// Whether systemd handed this process a device to take over: `LISTEN_PID` is this process and
/// `LISTEN_FDNAMES` names the store's state. systemd's file descriptor store gives the
/// descriptors a service stored back to it when it restarts the service (`Restart=`,
/// `FileDescriptorStoreMax=`), on the same command line: so no `--takeover` is needed there.
fn handed_by_systemd() -> bool {
    let ours = std::env::var("LISTEN_PID").is_ok_and(|p| p.trim().parse::<u32>().ok() == Some(std::process::id()));
    ours && std::env::var("LISTEN_FDNAMES").is_ok_and(|names| names.split(':').any(|n| n == FD_STORE))
}

/// The address family of `fd` if it is a listening socket; else why it cannot be served on.
fn listening_family(fd: &OwnedFd) -> Result<i32, String> {
    let get = |opt: libc::c_int| -> Result<libc::c_int, String> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt on an open descriptor writes at most `len` bytes (one c_int) to
        // `v`, a live local of that size.
        let r = unsafe { libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, opt, (&mut v as *mut libc::c_int).cast(), &mut len) };
        if r != 0 {
            return Err(format!("not a socket ({})", std::io::Error::last_os_error()));
        }
        Ok(v)
    };
    if get(libc::SO_ACCEPTCONN)? == 0 {
        return Err("not a listening socket".into());
    }
    match get(libc::SO_DOMAIN)? {
        f @ (libc::AF_UNIX | libc::AF_INET | libc::AF_INET6) => Ok(f),
        f => Err(format!("a socket of address family {f}")),
    }
}

/// Gives the holder the state and the listeners (module docs); the error is one line.
fn hold(store: &Store, unix: Option<&UnixListener>, tcp: Option<&TcpListener>, control: &UnixListener) -> std::io::Result<()> {
    let state = store.state_fd().ok_or_else(|| std::io::Error::other("the store's state does not outlive the process"))?;
    let listeners: Vec<_> = unix.map(AsFd::as_fd).into_iter().chain(tcp.map(AsFd::as_fd)).collect();
    crate::fdstore::store(FD_STORE, &[state])?;
    crate::fdstore::store(FD_NBD_LISTEN, &listeners)?;
    crate::fdstore::store(FD_CONTROL_LISTEN, &[control.as_fd()])?;
    Ok(())
}

pub fn run(args: Args) -> Result<(), Failure> {
    // A standby (started by a supervisor in advance of a death, docs/swap.md) waits here, with
    // the signals' default actions: a stop signal meanwhile ends it, not the server it becomes.
    if let Some(fd) = args.standby_fd {
        if args.mlock {
            process::lock_memory("--mlock")?;
        }
        crate::cmd::session::wait_as_standby(fd, args.mlock)?;
    }
    // Before any thread exists, so that every thread inherits the mask and only the signal
    // thread below receives SIGINT/SIGTERM/SIGHUP, and SIGUSR2 (hand over) never kills the
    // server: one that cannot hand over logs it and goes on.
    let signals = StopSignals::block_with_handover()?;
    // (The store's own refusals say "cannot take the device over" already.)
    let refused = |e: String| {
        let why = e.strip_prefix("cannot take the device over: ").unwrap_or(&e);
        with_code(TAKEOVER_REFUSED, format!("cannot take the device over: {why}"))
    };
    // Before any thread exists too (the environment is read and cleared).
    let handed = match args.takeover || handed_by_systemd() {
        true => Some(Handed::take().map_err(refused)?),
        false => None,
    };

    let cfg = args.store.config()?;
    let Endpoints { socket, tcp, tls, control: control_path } = endpoints(&args)?;
    if let Some(h) = &handed {
        h.check(socket.as_deref(), tcp, &control_path).map_err(refused)?;
    }

    if args.mlock {
        process::lock_memory("--mlock")?;
    }
    process::log_in_background();
    let hint =
        if args.mlock { " (with --mlock, locked memory counts against RLIMIT_MEMLOCK: run as root or raise `ulimit -l`)" } else { "" };
    let (store, listeners) = match handed {
        None => {
            let store =
                Store::new(cfg.clone()).map_err(|e| Failure::new(format!("cannot create the device: {}{hint}", config_error_line(&e))))?;
            (store, None)
        }
        Some(h) => {
            let (store, report) = Store::recover(cfg.clone(), h.state).map_err(|e| refused(format!("{}{hint}", config_error_line(&e))))?;
            log::info(&format!("took the store over: {report}"));
            (store, Some((h.unix, h.tcp, h.control)))
        }
    };
    let takeover = listeners.is_some();
    let store = Arc::new(store);
    let start = StartGuard::new(&store);

    // Bind everything before serving anything, so a failure leaves nothing behind. A
    // successor's listeners are its predecessor's: the files are there, and become this
    // server's to remove when it stops.
    let mut guards: Vec<SocketFileGuard> = Vec::new();
    let (unix, tcp_listener, control_listener) = match listeners {
        Some((unix, tcp, control)) => {
            guards.extend(socket.iter().map(|p| SocketFileGuard::new(p)));
            guards.push(SocketFileGuard::new(&control_path));
            (unix, tcp, control)
        }
        None => {
            let unix = match &socket {
                Some(path) => {
                    let l = bind_unix(path).map_err(|e| Failure::new(format!("--socket: {e}")))?;
                    guards.push(SocketFileGuard::new(path));
                    Some(l)
                }
                None => None,
            };
            let tcp_listener = match tcp {
                Some(addr) => Some(listener::bind_tcp(addr).map_err(|e| Failure::new(format!("--listen: {e}")))?),
                None => None,
            };
            let control_listener = control::bind(&control_path).map_err(|e| Failure::new(format!("--control: {e}")))?;
            guards.push(SocketFileGuard::new(&control_path));
            (unix, tcp_listener, control_listener)
        }
    };
    let mut pid_file = match &args.pid_file {
        Some(p) => Some(PidFile::write(p)?),
        None => None,
    };

    // Held: the state and the listeners are kept by someone who outlives this process.
    let held = takeover || give_to_holder(&store, unix.as_ref(), tcp_listener.as_ref(), &control_listener);
    if held {
        super::device::abort_on_panic();
    }

    let tcp_addr = tcp_listener.as_ref().and_then(|l| l.local_addr().ok());
    let device = DeviceInfo {
        export_name: args.name.clone(),
        nbd_socket: socket.as_ref().map(|p| p.display().to_string()),
        nbd_tcp: tcp_addr.map(|a| a.to_string()),
        control_socket: control_path.display().to_string(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        origin: cfg.origin.as_ref().map(|o| o.path.display().to_string()),
        frontend: "nbd-server".into(),
        backing: cfg.backing.as_ref().map(|b| b.path.display().to_string()),
    };
    let mut options = ServerOptions { verbose: args.verbose, tls, allow_plain_tcp: args.insecure_plain_tcp, ..ServerOptions::default() };
    if let Some(w) = args.workers {
        options.workers_per_connection = w as usize;
    }
    let description = match &device.origin {
        Some(origin) => format!("compcache {} {} cache of {origin}", human(store.disksize_bytes()), cfg.algorithm),
        None => format!("compcache {} {} device", human(store.disksize_bytes()), cfg.algorithm),
    };
    let server = Arc::new(Server::new(Export { name: args.name.clone(), description, store: store.clone() }, options));

    // Every accept loop ends when the gate closes (a hand-over); until then none ends.
    let gate = Arc::new(AcceptGate::new().map_err(|e| Failure::new(format!("cannot make the accept gate: {e}")))?);
    let mut accepting = 0;
    let (tx, events) = mpsc::channel::<Event>();
    spawn("signals", tx.clone(), move || loop {
        match signals.wait_forever() {
            libc::SIGUSR2 if !held => {
                log::warning("SIGUSR2: this server cannot hand over (no holder keeps its descriptors); it keeps serving")
            }
            sig => return Event::Signal(sig),
        }
    });
    if let Some(l) = unix {
        let (s, g) = (server.clone(), gate.clone());
        spawn("nbd-unix", tx.clone(), move || Event::AcceptEnded("NBD Unix socket", listener::serve_unix_until(s, &l, &g)));
        accepting += 1;
    }
    if let Some(l) = tcp_listener {
        let (s, g) = (server.clone(), gate.clone());
        spawn("nbd-tcp", tx.clone(), move || Event::AcceptEnded("NBD TCP", listener::serve_tcp_until(s, &l, &g)));
        accepting += 1;
    }
    crate::maintenance::spawn(store.clone()).map_err(|e| Failure::new(format!("cannot start the maintenance thread: {e}")))?;
    if store.has_backing() {
        spawn_writeback(store.clone()).map_err(|e| Failure::new(format!("cannot start the writeback thread: {e}")))?;
    }
    if store.recompresses() {
        crate::maintenance::spawn_recompression(store.clone())
            .map_err(|e| Failure::new(format!("cannot start the recompression thread: {e}")))?;
    }
    let state = Arc::new(ControlState { store: store.clone(), device: device.clone() });
    if let Some(addr) = args.metrics {
        crate::metrics::serve_http(addr, Arc::clone(&state), held)?;
    }
    let g = gate.clone();
    spawn("control", tx, move || Event::AcceptEnded("control socket", control::serve_until(state, &control_listener, &g)));
    accepting += 1;
    start.started();

    // A closed stdout (a supervisor that stopped reading) must not kill a running device.
    let _ = writeln!(std::io::stdout(), "{}", ready_line(&store, &cfg, &device));
    if takeover {
        log::info(&format!("took the device over: serving {} on the handed listeners", where_served(&device)));
    }
    crate::cmd::session::signal_ready(args.ready_fd, &format!("READY {}\n", where_served(&device)));

    let result = loop {
        match events.recv() {
            Ok(Event::Signal(libc::SIGUSR2)) => hand_over(&server, &gate, &events, accepting, &mut pid_file, guards),
            Ok(Event::Signal(sig)) => {
                let files: Vec<String> = guards.iter().map(|g| g.path().display().to_string()).collect();
                log::info(&format!("{} received: stopping, removing {}", process::signal_name(sig), files.join(" and ")));
                if let Some(origin) = &device.origin {
                    // Write-through: every completed write is on the origin already; this makes it
                    // durable there too before the server goes.
                    if let Err(e) = store.flush() {
                        log::error(&format!("flushing the origin {origin} at exit: {e}"));
                    }
                }
                break Ok(());
            }
            Ok(Event::AcceptEnded(what, Err(e))) => break Err(Failure::new(format!("the {what}'s listener: {e}; stopping"))),
            // Only after the gate is closed, which is a hand-over.
            Ok(Event::AcceptEnded(_, Ok(()))) => continue,
            Err(_) => break Err(Failure::new("every listener stopped; stopping")),
        }
    };
    // Remove the socket files and the PID file, empty the backing device, then leave without
    // waiting for connection threads: the device lives in this process's memory and ends
    // with it.
    drop(guards);
    drop(pid_file);
    // No page data outlives the server (docs/backing.md): the store is shared with threads
    // that `exit` stops, so it is never dropped; empty the backing device now.
    store.close_backing();
    if let Err(f) = result {
        log::error(&f.to_string());
        std::process::exit(f.exit_code());
    }
    std::process::exit(0);
}

/// A first server with a holder named: gives it the state and the listeners (module docs);
/// whether they are held. A server whose state does not outlive it says so, once.
fn give_to_holder(store: &Store, unix: Option<&UnixListener>, tcp: Option<&TcpListener>, control: &UnixListener) -> bool {
    if !crate::fdstore::holder_named() {
        return false;
    }
    if store.state_fd().is_none() {
        log::info(
            "a holder is named (NOTIFY_SOCKET), but this device's state does not outlive the server (cache mode): it cannot be taken over",
        );
        return false;
    }
    match hold(store, unix, tcp, control) {
        Ok(()) => true,
        Err(e) => {
            log::error(&format!("giving the holder the store's state and the listeners: {e}; this device cannot be taken over"));
            false
        }
    }
}

/// SIGUSR2 on a held server (module docs): stop accepting, stop reading requests, let every
/// connection answer what it has read and close, leave every page to the successor
/// (`Store::hand_over`) and exit with `HANDED_OVER`. The socket files stay: the successor
/// serves on the same listeners.
fn hand_over(
    server: &Server,
    gate: &AcceptGate,
    events: &mpsc::Receiver<Event>,
    accepting: usize,
    pid_file: &mut Option<PidFile>,
    guards: Vec<SocketFileGuard>,
) -> ! {
    log::info("SIGUSR2: handing the device over to a successor: no more clients accepted, no more requests read");
    let deadline = Instant::now() + HANDOVER_TIMEOUT;
    gate.close();
    // A loop that was accepting a client as the gate closed serves it first: wait for every
    // loop, so that no connection starts unseen by `stop_reading`.
    let mut ended = 0;
    while ended < accepting {
        match events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Event::AcceptEnded(..)) => ended += 1,
            Ok(Event::Signal(sig)) => log::info(&format!("{} during the hand-over: ignored", process::signal_name(sig))),
            Err(_) => break,
        }
    }
    server.stop_reading();
    let open = server.open_connections();
    while server.open_connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    match server.open_connections() {
        0 => log::info(&format!("{open} connection(s) answered what they had read and closed")),
        n => {
            log::warning(&format!("{n} connection(s) still open after {HANDOVER_TIMEOUT:?}: cut; their clients send their requests again"))
        }
    }
    server.export.store.hand_over();
    // The socket files are the successor's: not removed. The PID file names this process.
    std::mem::forget(guards);
    drop(pid_file.take());
    log::info("handed over; exiting without removing anything (the holder keeps the state and the listeners)");
    std::process::exit(HANDED_OVER);
}

/// Where the device is served, for the READY line and the log: the NBD Unix socket's path, or
/// `tcp:ADDR` when there is none.
fn where_served(device: &DeviceInfo) -> String {
    match (&device.nbd_socket, &device.nbd_tcp) {
        (Some(p), _) => p.clone(),
        (None, Some(a)) => format!("tcp:{a}"),
        (None, None) => String::new(),
    }
}

/// Where the server answers, from the flags: the NBD Unix socket (the default one unless
/// `--listen` alone), the TCP address with its TLS, and the control socket.
struct Endpoints {
    socket: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    tls: Option<TlsOptions>,
    control: PathBuf,
}

fn endpoints(args: &Args) -> Result<Endpoints, Failure> {
    let socket = match (&args.socket, &args.listen) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(_)) => None,
        (None, None) => {
            let path = paths::default_socket();
            // The default place is made private (0700) and must be ours: bound there, nobody
            // else can reach or replace the socket.
            if std::env::var_os(paths::SOCKET_ENV).filter(|p| !p.is_empty()).is_none() {
                paths::private_dir(&paths::default_dir()).map_err(Failure::new)?;
            }
            Some(path)
        }
    };
    let tcp = args.listen.as_deref().map(parse_listen).transpose()?;
    let tls = tls_options(args, tcp)?;
    let control_path = args.control.clone().unwrap_or_else(|| match &socket {
        Some(s) => paths::control_for(s),
        None => paths::default_control(),
    });
    if socket.as_deref() == Some(control_path.as_path()) {
        return Err(Failure::usage("--control must differ from --socket"));
    }
    Ok(Endpoints { socket, tcp, tls, control: control_path })
}

/// The line printed on stdout once everything is bound and served.
fn ready_line(store: &Store, cfg: &Config, device: &DeviceInfo) -> String {
    let mut places: Vec<String> = Vec::new();
    if let Some(p) = &device.nbd_socket {
        places.push(format!("unix:{p}"));
    }
    if let Some(a) = &device.nbd_tcp {
        places.push(format!("tcp:{a}"));
    }
    format!(
        "compcache: serving {}{} ({} bytes, {}{}) as NBD export \"{}\" on {}; control {}; pid {}",
        human(store.disksize_bytes()),
        device.origin.as_ref().map_or(String::new(), |o| format!(" cache of {o}")),
        store.disksize_bytes(),
        cfg.algorithm,
        if cfg.mem_limit_bytes > 0 { format!(", mem-limit {}", human(cfg.mem_limit_bytes)) } else { String::new() },
        device.export_name,
        places.join(" and "),
        device.control_socket,
        device.pid
    )
}

/// TLS from the flags; refuses a TCP listener that would let clients in without TLS unless
/// `--insecure-plain-tcp` says so, and then warns.
fn tls_options(args: &Args, tcp: Option<SocketAddr>) -> Result<Option<TlsOptions>, Failure> {
    if args.insecure_plain_tcp && tcp.is_none() {
        return Err(Failure::usage("--insecure-plain-tcp only applies to --listen"));
    }
    let tls = match &args.tls_certificates {
        Some(dir) => {
            let config = tls::load_credentials(dir, true).map_err(|e| Failure::new(format!("--tls-certificates: {e}")))?;
            Some(TlsOptions { config, require_on_unix: args.tls.as_deref() == Some("require") })
        }
        None => None,
    };
    if let Some(addr) = tcp {
        if args.insecure_plain_tcp {
            // In capitals: a device anyone on the network path can read and write.
            log::verbatim(
                log::Level::Warning,
                &format!(
                "WARNING: --insecure-plain-tcp: NBD on {addr} accepts clients without TLS: anyone who can reach it{} can read and write this device (for swap: other processes' memory)",
                if addr.ip().is_loopback() { " (every local user)" } else { "" }
            ),
            );
        } else if tls.is_none() {
            return Err(Failure::usage(format!(
                "--listen {addr}: TCP needs TLS, or every user who can reach the port can read and write the device: give --tls-certificates DIR (see docs/cli.md), or --insecure-plain-tcp to accept that"
            )));
        }
    }
    Ok(tls)
}

/// `--listen`: `PORT` (on 127.0.0.1) or `ADDR:PORT`.
fn parse_listen(text: &str) -> Result<SocketAddr, Failure> {
    port_or_address("--listen", text, 10809)
}

fn spawn(name: &str, tx: mpsc::Sender<Event>, f: impl FnOnce() -> Event + Send + 'static) {
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        let _ = tx.send(f());
    });
    if let Err(e) = spawned {
        log::error(&format!("cannot start the {name} thread: {e}"));
        std::process::exit(1);
    }
}

/// The PID file: created exclusively, owner-only, never through a symbolic link
/// (`private_file`). A file already at the path is replaced only if it is this user's regular
/// file holding the PID of a process that no longer exists (left by a server that was
/// killed); anything else is refused, untouched. Removed on drop if the path still names the
/// file we wrote.
struct PidFile {
    path: PathBuf,
    id: (u64, u64),
}

impl PidFile {
    fn write(path: &Path) -> Result<PidFile, Failure> {
        let fail = |what: String| Failure::new(format!("--pid-file {}: {what}", path.display()));
        let mut f = match private_file::create_new(path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                match stale_pid(path) {
                    Ok(pid) => log::warning(&format!("--pid-file {}: replacing a stale PID file (process {pid} is gone)", path.display())),
                    Err(why) => return Err(fail(format!("{why}: remove it or choose another path"))),
                }
                std::fs::remove_file(path).map_err(|e| fail(e.to_string()))?;
                private_file::create_new(path)
            }
            r => r,
        }
        .map_err(|e| fail(e.to_string()))?;
        f.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(|e| fail(e.to_string()))?;
        let m = f.metadata().map_err(|e| fail(e.to_string()))?;
        Ok(PidFile { path: path.to_path_buf(), id: (m.dev(), m.ino()) })
    }
}

/// The PID in the existing file at `path` if it is a stale PID file of ours; else why not.
fn stale_pid(path: &Path) -> Result<i32, String> {
    if private_file::own_regular_file(path).ok().flatten() != Some(true) {
        return Err("exists and is not this user's regular file".into());
    }
    let mut text = String::new();
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
        .map_err(|e| format!("exists and cannot be read ({e})"))?;
    let pid: i32 = text.trim().parse().ok().filter(|&p| p > 0).ok_or("exists and does not hold a PID")?;
    // SAFETY: kill with signal 0 only checks whether the process exists; no signal is sent.
    let alive = unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    if alive {
        return Err(format!("exists and process {pid} is running (another server?)"));
    }
    Ok(pid)
}

impl Drop for PidFile {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compcache_store::Algorithm;

    fn args(v: &[&str]) -> Args {
        crate::test_flags::parse_flags(v).unwrap()
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn defaults_are_a_quarter_of_ram_lz4_no_limit() {
        let cfg = args(&[]).store.config_for_ram(8 * GIB).unwrap();
        assert_eq!(cfg.disksize_bytes, 2 * GIB);
        assert_eq!(cfg.algorithm, Algorithm::Lz4);
        assert_eq!(cfg.mem_limit_bytes, 0);
    }

    #[test]
    fn flags_reach_the_config() {
        let cfg =
            args(&["--size", "1G", "--algorithm", "zstd", "--level", "-3", "--mem-limit", "10%"]).store.config_for_ram(8 * GIB).unwrap();
        assert_eq!(cfg.disksize_bytes, GIB);
        assert_eq!(cfg.algorithm, Algorithm::Zstd);
        assert_eq!(cfg.level, Some(-3));
        assert_eq!(cfg.mem_limit_bytes, 8 * GIB / 10 / 4096 * 4096);
    }

    #[test]
    fn impossible_sizes_say_what_to_do() {
        let e = args(&["--mem-limit", "16G"]).store.config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("above physical RAM") && e.contains("0 for no limit"), "{e}");
        let e = args(&["--size", "2T"]).store.config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("slot table"), "{e}");
        let e = args(&["--size", "12Q"]).store.config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.starts_with("--size"), "{e}");
        let e = args(&["--algorithm", "lzo"]).store.config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("lz4, lz4hc or zstd"), "{e}");
        let e = args(&["--algorithm", "zstd", "--level", "99"]).store.config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("level 99"), "{e}");
    }

    #[test]
    fn backing_flags_reach_the_config() {
        // The flags themselves are tested in crate::backing; here, that serve takes them.
        let cfg = args(&["--mem-limit", "1G", "--backing", "/tmp/b", "--writeback-rate", "8M/s"]).store.config_for_ram(8 * GIB).unwrap();
        let b = cfg.backing.unwrap();
        assert_eq!((b.path.to_str(), b.writeback_rate_bytes), (Some("/tmp/b"), 8 << 20));
        assert!(args(&[]).store.config_for_ram(8 * GIB).unwrap().backing.is_none());
        let e = args(&["--backing", "/tmp/b", "--writeback-low", "95"]).store.config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("watermarks"), "{e}");
    }

    #[test]
    fn only_listening_sockets_are_served_on() {
        let dir = std::env::temp_dir().join(format!("compcache-serve-family-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("s")).unwrap();
        assert_eq!(listening_family(&OwnedFd::from(listener.try_clone().unwrap())), Ok(libc::AF_UNIX));
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(listening_family(&OwnedFd::from(tcp)), Ok(libc::AF_INET));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(listening_family(&OwnedFd::from(a)), Err("not a listening socket".to_string()));
        let file = std::fs::File::create(dir.join("f")).unwrap();
        assert!(listening_family(&OwnedFd::from(file)).unwrap_err().starts_with("not a socket"));
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn handed_listeners_must_be_the_flags() {
        let dir = std::env::temp_dir().join(format!("compcache-serve-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (sock, ctl) = (dir.join("nbd.sock"), dir.join("nbd.sock.ctl"));
        let state = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let h = Handed { state, unix: Some(UnixListener::bind(&sock).unwrap()), tcp: None, control: UnixListener::bind(&ctl).unwrap() };
        assert_eq!(h.check(Some(&sock), None, &ctl), Ok(()));
        let e = h.check(Some(&dir.join("other.sock")), None, &ctl).unwrap_err();
        assert!(e.contains("is not --socket's") && e.contains("other.sock"), "{e}");
        let e = h.check(Some(&sock), Some("127.0.0.1:10809".parse().unwrap()), &ctl).unwrap_err();
        assert!(e.contains("the handed TCP listener (none) is not --listen's (127.0.0.1:10809)"), "{e}");
        let e = h.check(Some(&sock), None, &sock).unwrap_err();
        assert!(e.contains("control socket"), "{e}");
        drop(h);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn listen_takes_a_port_or_an_address() {
        assert_eq!(parse_listen("10809").unwrap(), "127.0.0.1:10809".parse().unwrap());
        assert_eq!(parse_listen("[::1]:7").unwrap(), "[::1]:7".parse().unwrap());
        assert!(parse_listen("localhost").unwrap_err().to_string().contains("give a port"));
    }
}
