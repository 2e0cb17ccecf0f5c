//! `compcache serve`: create a compressed RAM device and serve it over NBD until SIGINT,
//! SIGTERM or SIGHUP, with a control socket for `compcache stat`.

use crate::backing::{spawn_writeback, BackingArgs, StartGuard};
use crate::failure::Failure;
use crate::paths;
use crate::private_file;
use crate::units::human;
use compcache_control::socket::{bind_unix, SocketFileGuard};
use compcache_control::{self as control, ControlState, DeviceInfo};
use compcache_nbd::listener;
use compcache_nbd::tls::{self, TlsOptions};
use compcache_nbd::{Export, Server, ServerOptions};
use compcache_store::{parse_size, physical_ram_bytes, Algorithm, Config, Store, PAGE_SIZE};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

/// Serve a compressed RAM block device over NBD (Unix socket by default).
#[derive(clap::Args, Debug)]
#[command(after_help = "Use --mlock when the device is used as swap: see docs/cli.md.")]
pub struct Args {
    /// Device size: bytes with an optional K/M/G/T suffix, or a share of RAM such as 25%.
    #[arg(long, default_value = "25%", value_name = "SIZE")]
    size: String,

    /// Compression algorithm.
    #[arg(long, default_value = "lz4", value_name = "lz4|zstd")]
    algorithm: String,

    /// Compression level (zstd: 1..=22 or -7..=-1; lz4 ignores it).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    level: Option<i32>,

    /// Most memory the compressed data may take (SIZE or %; 0 or none: no limit). Writes
    /// beyond it fail with ENOSPC.
    #[arg(long, default_value = "0", value_name = "SIZE")]
    mem_limit: String,

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

    /// NBD export name (clients asking for the default export "" get it too).
    #[arg(long, default_value = "compcache", value_name = "NAME")]
    name: String,

    /// Lock the server's memory (mlockall with MCL_ONFAULT) so it is never swapped out: use
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

    #[command(flatten)]
    backing: BackingArgs,
}

/// What the main thread waits for. (Listeners never end: they retry after accept errors.)
enum Event {
    Signal(i32),
}

pub fn run(args: Args) -> Result<(), Failure> {
    // Before any thread exists, so that every thread inherits the mask and only the signal
    // thread below receives SIGINT/SIGTERM/SIGHUP.
    let signals = block_shutdown_signals()?;

    let ram = physical_ram_bytes();
    let cfg = config_from(&args, ram)?;
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
    let tls = tls_options(&args, tcp)?;
    let control_path = args.control.clone().unwrap_or_else(|| match &socket {
        Some(s) => paths::control_for(s),
        None => paths::default_control(),
    });
    if socket.as_deref() == Some(control_path.as_path()) {
        return Err(Failure::usage("--control must differ from --socket"));
    }

    if args.mlock {
        lock_memory()?;
    }
    let store = Store::new(cfg.clone()).map_err(|e| {
        let hint =
            if args.mlock { " (with --mlock, locked memory counts against RLIMIT_MEMLOCK: run as root or raise `ulimit -l`)" } else { "" };
        Failure::new(format!("cannot create the device: {e}{hint}"))
    })?;
    let store = Arc::new(store);
    let start = StartGuard::new(&store);

    // Bind everything before serving anything, so a failure leaves nothing behind.
    let mut guards: Vec<SocketFileGuard> = Vec::new();
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
    let _pid_file = match &args.pid_file {
        Some(p) => Some(PidFile::write(p)?),
        None => None,
    };

    let tcp_addr = tcp_listener.as_ref().and_then(|l| l.local_addr().ok());
    let device = DeviceInfo {
        export_name: args.name.clone(),
        nbd_socket: socket.as_ref().map(|p| p.display().to_string()),
        nbd_tcp: tcp_addr.map(|a| a.to_string()),
        control_socket: control_path.display().to_string(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let mut options = ServerOptions { verbose: args.verbose, tls, allow_plain_tcp: args.insecure_plain_tcp, ..ServerOptions::default() };
    if let Some(w) = args.workers {
        options.workers_per_connection = w as usize;
    }
    let description = format!("compcache {} {} device", human(store.disksize_bytes()), cfg.algorithm);
    let server = Arc::new(Server::new(Export { name: args.name.clone(), description, store: store.clone() }, options));

    let (tx, events) = mpsc::channel::<Event>();
    spawn("signals", tx.clone(), move || Event::Signal(wait_for_signal(&signals)));
    if let Some(l) = unix {
        let s = server.clone();
        spawn("nbd-unix", tx.clone(), move || listener::serve_unix(s, l));
    }
    if let Some(l) = tcp_listener {
        let s = server.clone();
        spawn("nbd-tcp", tx.clone(), move || listener::serve_tcp(s, l));
    }
    crate::maintenance::spawn(store.clone()).map_err(|e| Failure::new(format!("cannot start the maintenance thread: {e}")))?;
    if store.has_backing() {
        spawn_writeback(store.clone()).map_err(|e| Failure::new(format!("cannot start the writeback thread: {e}")))?;
    }
    let state = Arc::new(ControlState { store: store.clone(), device: device.clone() });
    spawn("control", tx, move || control::serve(state, control_listener));
    start.started();

    let mut places: Vec<String> = Vec::new();
    if let Some(p) = &device.nbd_socket {
        places.push(format!("unix:{p}"));
    }
    if let Some(a) = &device.nbd_tcp {
        places.push(format!("tcp:{a}"));
    }
    // A closed stdout (a supervisor that stopped reading) must not kill a running device.
    let _ = writeln!(
        std::io::stdout(),
        "compcache: serving {} ({} bytes, {}{}) as NBD export \"{}\" on {}; control {}; pid {}",
        human(store.disksize_bytes()),
        store.disksize_bytes(),
        cfg.algorithm,
        if cfg.mem_limit_bytes > 0 { format!(", mem-limit {}", human(cfg.mem_limit_bytes)) } else { String::new() },
        args.name,
        places.join(" and "),
        device.control_socket,
        device.pid
    );

    let result = match events.recv() {
        Ok(Event::Signal(sig)) => {
            let files: Vec<String> = guards.iter().map(|g| g.path().display().to_string()).collect();
            let _ = writeln!(std::io::stderr(), "compcache: {} received: stopping, removing {}", signal_name(sig), files.join(" and "));
            Ok(())
        }
        Err(_) => Err(Failure::new("every listener stopped; stopping")),
    };
    // Remove the socket files and the PID file, empty the backing device, then leave without
    // waiting for connection threads: the device lives in this process's memory and ends
    // with it.
    drop(guards);
    drop(_pid_file);
    // No page data outlives the server (docs/backing.md): the store is shared with threads
    // that `exit` stops, so it is never dropped; empty the backing device now.
    store.close_backing();
    if let Err(f) = result {
        eprintln!("compcache: error: {f}");
        std::process::exit(f.exit_code());
    }
    std::process::exit(0);
}

/// Builds and checks the store configuration from the flags.
fn config_from(args: &Args, ram: u64) -> Result<Config, Failure> {
    let size = parse_size(&args.size, ram).map_err(|e| Failure::usage(format!("--size: {e}")))?;
    if size < PAGE_SIZE as u64 {
        return Err(Failure::usage(format!("--size {}: the device needs at least one {PAGE_SIZE}-byte page", args.size)));
    }
    let algorithm: Algorithm = args.algorithm.parse().map_err(|e: String| Failure::usage(format!("--algorithm: {e}")))?;
    let mem_limit = match args.mem_limit.trim() {
        "0" | "none" | "" => 0,
        text => parse_size(text, ram).map_err(|e| Failure::usage(format!("--mem-limit: {e}")))?,
    };
    // Printed once every other check has passed (an error is the one line then).
    let warning = super::device::check_store_limits(size, &args.mem_limit, mem_limit)?;
    if ram > 0 && mem_limit > ram {
        return Err(Failure::usage(format!(
            "--mem-limit {} is above physical RAM ({}): it could never take effect; give at most {} or 0 for no limit",
            args.mem_limit,
            human(ram),
            human(ram)
        )));
    }
    // The slot table costs 16 bytes per page whether or not it is used; a device whose table
    // alone would take half of RAM cannot be what was meant.
    let slot_table = size / PAGE_SIZE as u64 * 16;
    if ram > 0 && slot_table > ram / 2 {
        return Err(Failure::usage(format!(
            "--size {} needs a {} slot table, more than half of RAM ({}): choose a smaller size (25%-200% of RAM is usual)",
            args.size,
            human(slot_table),
            human(ram)
        )));
    }
    if ram > 0 && size > 2 * ram {
        eprintln!(
            "compcache: warning: --size {} is more than twice RAM ({}): compressed memory rarely holds more than 2-3x",
            human(size),
            human(ram)
        );
    }
    let backing = args.backing.config(ram, mem_limit)?;
    let cfg = Config { algorithm, level: args.level, mem_limit_bytes: mem_limit, backing, ..Config::with_disksize(size) };
    cfg.validate().map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(warning) = warning {
        eprintln!("compcache: warning: {warning}");
    }
    Ok(cfg)
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
            eprintln!(
                "compcache: WARNING: --insecure-plain-tcp: NBD on {addr} accepts clients without TLS: anyone who can reach it{} can read and write this device (for swap: other processes' memory)",
                if addr.ip().is_loopback() { " (every local user)" } else { "" }
            );
        } else if tls.is_none() {
            return Err(Failure::usage(format!(
                "--listen {addr}: TCP needs TLS, or every user who can reach the port can read and write the device: give --tls-certificates DIR (see docs/cli.md), or --insecure-plain-tcp to accept that"
            )));
        }
    }
    Ok(tls)
}

/// `PORT` or `ADDR:PORT`.
fn parse_listen(text: &str) -> Result<SocketAddr, Failure> {
    let addr = match text.parse::<u16>() {
        Ok(port) => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        Err(_) => text
            .parse::<SocketAddr>()
            .map_err(|_| Failure::usage(format!("--listen {text}: give a port (10809) or an address and port (127.0.0.1:10809)")))?,
    };
    Ok(addr)
}

fn spawn(name: &str, tx: mpsc::Sender<Event>, f: impl FnOnce() -> Event + Send + 'static) {
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        let _ = tx.send(f());
    });
    if let Err(e) = spawned {
        eprintln!("compcache: error: cannot start the {name} thread: {e}");
        std::process::exit(1);
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and so in every thread it starts). A
/// hangup (the terminal closed) stops the server cleanly instead of killing it with its
/// socket files left behind. SIGHUP is left alone when it is ignored (`nohup`): Linux keeps a
/// blocked signal pending even when its action is to ignore it, so `sigwait` would see it.
fn block_shutdown_signals() -> Result<libc::sigset_t, Failure> {
    // SAFETY: `set` and `old` are plain C structs; `set` is initialised by sigemptyset before
    // any other use and `old` is only written by sigaction (a null new action changes
    // nothing). pthread_sigmask only reads `set`. No Rust invariant depends on signal state.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let mut old: libc::sigaction = std::mem::zeroed();
        let hup_ignored = libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN;
        if !hup_ignored {
            libc::sigaddset(&mut set, libc::SIGHUP);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(Failure::new(format!("cannot block SIGINT/SIGTERM/SIGHUP: {}", std::io::Error::from_raw_os_error(rc))));
        }
        Ok(set)
    }
}

/// Waits for one of the blocked signals; returns its number.
fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` was initialised by block_shutdown_signals and `sig` is a valid out
        // pointer for the duration of the call.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        if rc == 0 {
            return sig;
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

/// `--mlock`: the server's memory locked as a swap server's is (`swapdev::lock_server_memory`):
/// what is mapped now whole, the rest as it is touched, so untouched reservations (the store's
/// address space) cost nothing.
fn lock_memory() -> Result<(), Failure> {
    super::swapdev::lock_server_memory().map_err(|e| {
        Failure::new(format!(
            "--mlock: mlockall failed: {e}: run as root (or with CAP_IPC_LOCK), or raise the locked-memory limit (`ulimit -l`)"
        ))
    })
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
                    Ok(pid) => eprintln!("compcache: --pid-file {}: replacing a stale PID file (process {pid} is gone)", path.display()),
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
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        args: Args,
    }

    fn args(v: &[&str]) -> Args {
        T::parse_from(std::iter::once("serve").chain(v.iter().copied())).args
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn defaults_are_a_quarter_of_ram_lz4_no_limit() {
        let cfg = config_from(&args(&[]), 8 * GIB).unwrap();
        assert_eq!(cfg.disksize_bytes, 2 * GIB);
        assert_eq!(cfg.algorithm, Algorithm::Lz4);
        assert_eq!(cfg.mem_limit_bytes, 0);
    }

    #[test]
    fn flags_reach_the_config() {
        let cfg = config_from(&args(&["--size", "1G", "--algorithm", "zstd", "--level", "-3", "--mem-limit", "10%"]), 8 * GIB).unwrap();
        assert_eq!(cfg.disksize_bytes, GIB);
        assert_eq!(cfg.algorithm, Algorithm::Zstd);
        assert_eq!(cfg.level, Some(-3));
        assert_eq!(cfg.mem_limit_bytes, 8 * GIB / 10 / 4096 * 4096);
    }

    #[test]
    fn impossible_sizes_say_what_to_do() {
        let e = config_from(&args(&["--mem-limit", "16G"]), 8 * GIB).unwrap_err().to_string();
        assert!(e.contains("above physical RAM") && e.contains("0 for no limit"), "{e}");
        let e = config_from(&args(&["--size", "2T"]), 8 * GIB).unwrap_err().to_string();
        assert!(e.contains("slot table"), "{e}");
        let e = config_from(&args(&["--size", "12Q"]), 8 * GIB).unwrap_err().to_string();
        assert!(e.starts_with("--size"), "{e}");
        let e = config_from(&args(&["--algorithm", "lzo"]), 8 * GIB).unwrap_err().to_string();
        assert!(e.contains("lz4 or zstd"), "{e}");
        let e = config_from(&args(&["--algorithm", "zstd", "--level", "99"]), 8 * GIB).unwrap_err().to_string();
        assert!(e.contains("level 99"), "{e}");
    }

    #[test]
    fn backing_flags_reach_the_config() {
        // The flags themselves are tested in crate::backing; here, that serve takes them.
        let cfg = config_from(&args(&["--mem-limit", "1G", "--backing", "/tmp/b", "--writeback-rate", "8M/s"]), 8 * GIB).unwrap();
        let b = cfg.backing.unwrap();
        assert_eq!((b.path.to_str(), b.writeback_rate_bytes), (Some("/tmp/b"), 8 << 20));
        assert!(config_from(&args(&[]), 8 * GIB).unwrap().backing.is_none());
        let e = config_from(&args(&["--backing", "/tmp/b", "--writeback-low", "95"]), 8 * GIB).unwrap_err().to_string();
        assert!(e.contains("watermarks"), "{e}");
    }

    #[test]
    fn listen_takes_a_port_or_an_address() {
        assert_eq!(parse_listen("10809").unwrap(), "127.0.0.1:10809".parse().unwrap());
        assert_eq!(parse_listen("[::1]:7").unwrap(), "[::1]:7".parse().unwrap());
        assert!(parse_listen("localhost").unwrap_err().to_string().contains("give a port"));
    }
}
