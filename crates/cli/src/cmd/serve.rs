//! `compcache serve`: create a compressed RAM device and serve it over NBD until SIGINT,
//! SIGTERM or SIGHUP, with a control socket for `compcache stat`.

use crate::backing::{spawn_writeback, StartGuard};
use crate::failure::Failure;
use crate::log;
use crate::metrics::port_or_address;
use crate::paths;
use crate::private_file;
use crate::process::{self, StopSignals};
use crate::store_args::{config_error_line, StoreArgs};
use crate::units::human;
use compcache_control::socket::{bind_unix, SocketFileGuard};
use compcache_control::{self as control, ControlState, DeviceInfo};
use compcache_nbd::listener;
use compcache_nbd::tls::{self, TlsOptions};
use compcache_nbd::{Export, Server, ServerOptions};
use compcache_store::{Config, Store};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

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
}

/// What the main thread waits for. (Listeners never end: they retry after accept errors.)
enum Event {
    Signal(i32),
}

pub fn run(args: Args) -> Result<(), Failure> {
    // Before any thread exists, so that every thread inherits the mask and only the signal
    // thread below receives SIGINT/SIGTERM/SIGHUP.
    let signals = StopSignals::block()?;

    let cfg = args.store.config()?;
    let Endpoints { socket, tcp, tls, control: control_path } = endpoints(&args)?;

    if args.mlock {
        process::lock_memory("--mlock")?;
    }
    let store = Store::new(cfg.clone()).map_err(|e| {
        let hint =
            if args.mlock { " (with --mlock, locked memory counts against RLIMIT_MEMLOCK: run as root or raise `ulimit -l`)" } else { "" };
        Failure::new(format!("cannot create the device: {}{hint}", config_error_line(&e)))
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

    let (tx, events) = mpsc::channel::<Event>();
    spawn("signals", tx.clone(), move || Event::Signal(signals.wait_forever()));
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
    if store.recompresses() {
        crate::maintenance::spawn_recompression(store.clone())
            .map_err(|e| Failure::new(format!("cannot start the recompression thread: {e}")))?;
    }
    let state = Arc::new(ControlState { store: store.clone(), device: device.clone() });
    if let Some(addr) = args.metrics {
        crate::metrics::serve_http(addr, Arc::clone(&state))?;
    }
    spawn("control", tx, move || control::serve(state, control_listener));
    start.started();

    // A closed stdout (a supervisor that stopped reading) must not kill a running device.
    let _ = writeln!(std::io::stdout(), "{}", ready_line(&store, &cfg, &device));

    let result = match events.recv() {
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
        log::error(&f.to_string());
        std::process::exit(f.exit_code());
    }
    std::process::exit(0);
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
    fn listen_takes_a_port_or_an_address() {
        assert_eq!(parse_listen("10809").unwrap(), "127.0.0.1:10809".parse().unwrap());
        assert_eq!(parse_listen("[::1]:7").unwrap(), "[::1]:7".parse().unwrap());
        assert!(parse_listen("localhost").unwrap_err().to_string().contains("give a port"));
    }
}
