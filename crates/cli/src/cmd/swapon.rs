//! `compcache swapon` and `compcache swapoff`: compressed swap in one step, in the manner of
//! systemd's zram-generator.
//!
//! swapon: reads the zram-generator configuration if there is one (or `--config`), lets the
//! flags override it, picks the best front end this kernel has (ublk, else the NBD driver),
//! starts the server for it (`compcache ublk` or `compcache nbd-attach`, detached, memory
//! locked, its log in `/run/compcache/swap/`), waits until the device is up, writes a swap
//! header (mkswap) and enables it with the priority (swapon). What it started is recorded in
//! `/run/compcache/swap/<device>.json`.
//!
//! swapoff: for each recorded device (or the ones named) takes the swap away (the kernel
//! reads every page back), stops the server (which removes the device), and prints the
//! device's final statistics.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use compcache_store::physical_ram_bytes;

use super::device::parse_size_or_expr;
use super::swapdev::{is_active_swap, mkswap, swapoff, swapon, SwapState, STATE_DIR};
use super::zramconf;
use crate::backing::BackingArgs;
use crate::failure::Failure;
use crate::units::human;

/// How long the server may take to bring the device up (generous for emulated machines).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stopped server may take to exit after swapoff.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Set up a compressed RAM swap device in one step (mkswap and swapon included).
#[derive(clap::Args, Debug)]
#[command(after_help = "Settings come from the flags, else from a zram-generator configuration \
(/etc/systemd/zram-generator.conf and the other places zram-generator reads, or --config), \
else zram-generator's defaults: size min(ram / 2, 4096) MiB, priority 100. See docs/swap.md.")]
pub struct SwaponArgs {
    /// Device size: 25%, 2G, or a zram-size expression such as 'min(ram / 2, 4096)' (MiB).
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,

    /// Compression algorithm (zram-generator: compression-algorithm).
    #[arg(long, value_name = "lz4|zstd")]
    algorithm: Option<String>,

    /// Compression level (zstd).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    level: Option<i32>,

    /// Swap priority, 0..=32767 (zram-generator: swap-priority; default 100).
    #[arg(long, value_name = "N")]
    priority: Option<i32>,

    /// Most memory the compressed data may take (SIZE or expression; zram-resident-limit).
    #[arg(long, value_name = "SIZE")]
    mem_limit: Option<String>,

    /// Front end: ublk (Linux 6.0+, ublk_drv), nbd (the kernel's NBD driver), or auto (the
    /// first of these the kernel has, loading the module if needed).
    #[arg(long, default_value = "auto", value_parser = ["auto", "ublk", "nbd"])]
    frontend: String,

    /// Read this zram-generator configuration file instead of the system's.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Ignore any zram-generator configuration.
    #[arg(long, conflicts_with = "config")]
    no_config: bool,

    /// The configuration section to use [default: the first, usually zram0].
    #[arg(long, value_name = "NAME")]
    section: Option<String>,

    /// Memory reserved up front for storing swapped-out pages (SIZE or auto; see
    /// docs/swap.md): make it about the compressed size you expect under memory pressure.
    #[arg(long, default_value = "auto", value_name = "SIZE|auto")]
    reserve: String,

    /// Do not discard freed swap slots (discard is what frees the device's memory when pages
    /// are swapped back in and freed; zram-generator's default is discard too).
    #[arg(long)]
    no_discard: bool,

    /// The backing device (zram-generator: writeback-device) and its writeback policy, passed
    /// on to the server.
    #[command(flatten)]
    backing: BackingArgs,
}

/// Take compcache swap devices out of use and remove them (all of them by default).
#[derive(clap::Args, Debug)]
pub struct SwapoffArgs {
    /// Devices to take down (e.g. /dev/ublkb0) [default: every device `compcache swapon` set up].
    devices: Vec<PathBuf>,
}

/// The settings swapon ends up with, and where each came from.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    size_bytes: u64,
    algorithm: String,
    level: Option<i32>,
    priority: i32,
    mem_limit_bytes: u64,
    /// The backing flags for the server, `--backing` from the flag or else `writeback-device`.
    backing: BackingArgs,
    source: String,
}

fn settings(args: &SwaponArgs, ram_bytes: u64) -> Result<Option<Settings>, Failure> {
    let (sections, files) =
        if args.no_config { (Vec::new(), Vec::new()) } else { zramconf::load(args.config.as_deref()).map_err(Failure::usage)? };
    let section = match &args.section {
        Some(name) => Some(
            sections.iter().find(|s| &s.name == name).ok_or_else(|| Failure::usage(format!("no [{name}] section in the configuration")))?,
        ),
        None => sections.first(),
    };
    let conf = match section {
        Some(s) => Some(zramconf::interpret(s, ram_bytes as f64 / 1048576.0).map_err(Failure::usage)?),
        None => None,
    };
    if let Some(c) = &conf {
        for n in &c.notes {
            eprintln!("compcache: {n}");
        }
        if c.size_bytes.is_none() && args.size.is_none() {
            return Ok(None);
        }
    }
    let source = match (&conf, files.is_empty()) {
        (Some(_), false) => format!("{} + flags", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")),
        _ => "flags and zram-generator defaults".to_string(),
    };
    let size_bytes = match &args.size {
        Some(s) => parse_size_or_expr(s, ram_bytes).map_err(|e| Failure::usage(format!("--size: {e}")))?,
        None => match conf.as_ref().and_then(|c| c.size_bytes) {
            Some(b) => b,
            None => parse_size_or_expr(zramconf::DEFAULT_SIZE_EXPR, ram_bytes).map_err(Failure::usage)?,
        },
    };
    let mem_limit_bytes = match &args.mem_limit {
        Some(s) => parse_size_or_expr(s, ram_bytes).map_err(|e| Failure::usage(format!("--mem-limit: {e}")))?,
        None => conf.as_ref().and_then(|c| c.mem_limit_bytes).unwrap_or(0),
    };
    let mut backing = args.backing.clone();
    if backing.backing.is_none() {
        backing.backing = conf.as_ref().and_then(|c| c.writeback_device.clone());
    }
    // Checked here, so that bad flags fail before a server is started.
    backing.config(ram_bytes, mem_limit_bytes)?;
    Ok(Some(Settings {
        size_bytes,
        algorithm: args.algorithm.clone().or_else(|| conf.as_ref().and_then(|c| c.algorithm.clone())).unwrap_or_else(|| "lz4".into()),
        level: args.level.or_else(|| conf.as_ref().and_then(|c| c.level)),
        priority: args.priority.or_else(|| conf.as_ref().and_then(|c| c.priority)).unwrap_or(zramconf::DEFAULT_PRIORITY),
        mem_limit_bytes,
        backing,
        source,
    }))
}

/// `modprobe NAME`, quietly; whether it worked is judged by the caller's own check.
fn modprobe(name: &str) {
    let _ = Command::new("modprobe").arg("-q").arg(name).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// The front end to use: the one asked for, or the best one this kernel has.
fn choose_frontend(wanted: &str) -> Result<&'static str, Failure> {
    let ublk = || {
        if compcache_ublk::kernel_support().is_err() {
            modprobe("ublk_drv");
        }
        compcache_ublk::kernel_support().map_err(|e| e.to_string())
    };
    let nbd = || {
        if compcache_kernel_nbd::kernel_support().is_err() {
            modprobe("nbd");
        }
        compcache_kernel_nbd::kernel_support().map_err(|e| e.to_string())
    };
    match wanted {
        "ublk" => ublk().map(|_| "ublk").map_err(Failure::new),
        "nbd" => nbd().map(|_| "nbd").map_err(Failure::new),
        _ => match ublk() {
            Ok(()) => Ok("ublk"),
            Err(u) => nbd().map(|_| "nbd").map_err(|n| Failure::new(format!("no front end: {u}; {n}"))),
        },
    }
}

/// A pipe whose write end the child inherits (no close-on-exec) and whose read end we keep.
fn ready_pipe() -> Result<(OwnedFd, OwnedFd), Failure> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Failure::new(format!("pipe: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETFD on a descriptor we own; clears FD_CLOEXEC so the server inherits it.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(Failure::new(format!("fcntl: {}", std::io::Error::last_os_error())));
    }
    Ok((r, w))
}

pub fn run_swapon(args: SwaponArgs) -> Result<(), Failure> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::new("swapon needs root (creating block devices, mlock, swapon(2))"));
    }
    let ram = physical_ram_bytes();
    let Some(s) = settings(&args, ram)? else {
        println!("compcache: the configuration asks for no device on this machine (host-memory-limit)");
        return Ok(());
    };
    let frontend = choose_frontend(&args.frontend)?;
    std::fs::create_dir_all(STATE_DIR).map_err(|e| Failure::new(format!("{STATE_DIR}: {e}")))?;

    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let log = PathBuf::from(format!("{STATE_DIR}/{frontend}-{stamp}.log"));
    let log_file = std::fs::File::create(&log).map_err(|e| Failure::new(format!("{}: {e}", log.display())))?;
    let (ready_r, ready_w) = ready_pipe()?;

    let exe = std::env::current_exe().map_err(|e| Failure::new(format!("finding the compcache binary: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.args(server_command(frontend, &s, &args.reserve, ready_w.as_raw_fd()));
    // Its own process group: a Ctrl-C meant for this command does not reach the server.
    cmd.stdin(Stdio::null()).stdout(log_file.try_clone().map_err(|e| Failure::new(e.to_string()))?).stderr(log_file).process_group(0);
    let mut child = cmd.spawn().map_err(|e| Failure::new(format!("starting the {frontend} server: {e}")))?;
    drop(ready_w);

    let dev = match wait_ready(ready_r) {
        Some(dev) => dev,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(Failure::new(format!(
                "the {frontend} server did not bring a device up; its log ({}):\n{}",
                log.display(),
                tail.trim_end()
            )));
        }
    };
    let state = SwapState {
        device: dev.clone(),
        frontend: frontend.to_string(),
        pid: child.id(),
        log: log.clone(),
        stats: Path::new(STATE_DIR).join(format!("{}.stats.json", dev.file_name().unwrap_or_default().to_string_lossy())),
        control: PathBuf::from(format!("/run/compcache/{}.ctl", dev.file_name().unwrap_or_default().to_string_lossy())),
    };
    state.save()?;
    let enabled = mkswap(&dev, s.size_bytes).and_then(|_| swapon(&dev, s.priority, !args.no_discard));
    if let Err(e) = enabled {
        let _ = stop_server(&state);
        let _ = std::fs::remove_file(SwapState::path_for(&dev));
        return Err(e);
    }
    println!(
        "compcache: swapon {}: {} {}{}{}, priority {}, {} (server pid {}, log {}; settings from {})",
        dev.display(),
        human(s.size_bytes),
        s.algorithm,
        if s.mem_limit_bytes > 0 { format!(", mem-limit {}", human(s.mem_limit_bytes)) } else { String::new() },
        s.backing.backing.as_ref().map_or(String::new(), |p| format!(", backing {}", p.display())),
        s.priority,
        frontend,
        state.pid,
        log.display(),
        s.source
    );
    // The server runs on, re-parented to init; `compcache swapoff` stops it.
    std::mem::forget(child);
    Ok(())
}

/// The arguments of the server `swapon` starts for `frontend`: the settings, the reserve, where
/// its final statistics go and the descriptor it reports readiness on.
fn server_command(frontend: &str, s: &Settings, reserve: &str, ready_fd: i32) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![if frontend == "ublk" { "ublk" } else { "nbd-attach" }.into()];
    let pairs = [
        ("--size", s.size_bytes.to_string()),
        ("--algorithm", s.algorithm.clone()),
        ("--mem-limit", s.mem_limit_bytes.to_string()),
        ("--reserve", reserve.to_string()),
        ("--stats-dir", STATE_DIR.to_string()),
        ("--ready-fd", ready_fd.to_string()),
    ];
    v.extend(pairs.into_iter().flat_map(|(flag, value)| [flag.into(), value.into()]));
    if let Some(l) = s.level {
        v.extend(["--level".into(), l.to_string().into()]);
    }
    v.extend(s.backing.to_args());
    v
}

/// Reads the server's readiness line; `None` if it closed the pipe (it failed) or timed out.
fn wait_ready(r: OwnedFd) -> Option<PathBuf> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(std::fs::File::from(r)).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(READY_TIMEOUT).ok()?;
    line.trim().strip_prefix("READY ").map(PathBuf::from)
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Sends SIGTERM to the recorded server (if it is still ours) and waits for it to exit.
fn stop_server(state: &SwapState) -> Result<(), Failure> {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", state.pid)).unwrap_or_default();
    if state.pid == 0 || !alive(state.pid) || !String::from_utf8_lossy(&cmdline).contains("compcache") {
        return Ok(());
    }
    // SAFETY: kill with a pid and a signal number has no memory-safety preconditions; the pid
    // was checked above to be a live compcache process.
    unsafe { libc::kill(state.pid as libc::pid_t, libc::SIGTERM) };
    let start = Instant::now();
    while alive(state.pid) {
        if start.elapsed() > EXIT_TIMEOUT {
            return Err(Failure::new(format!("server {} did not exit within {EXIT_TIMEOUT:?}; see {}", state.pid, state.log.display())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub fn run_swapoff(args: SwapoffArgs) -> Result<(), Failure> {
    let states: Vec<PathBuf> =
        if args.devices.is_empty() { SwapState::all() } else { args.devices.iter().map(|d| SwapState::path_for(d)).collect() };
    if states.is_empty() {
        println!("compcache: no compcache swap devices");
        return Ok(());
    }
    let mut failed = Vec::new();
    for path in states {
        let state = SwapState::load(&path)?;
        let dev = state.device.clone();
        let result = (|| {
            if is_active_swap(&dev) {
                swapoff(&dev)?;
            }
            stop_server(&state)
        })();
        match result {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                println!("compcache: swapoff {}: done ({})", dev.display(), state.frontend);
                match std::fs::read_to_string(&state.stats) {
                    Ok(stats) => print_stats(&dev, &stats),
                    Err(_) => println!("compcache: no final statistics for {} (see {})", dev.display(), state.log.display()),
                }
            }
            Err(e) => {
                eprintln!("compcache: error: {e}");
                failed.push(dev.display().to_string());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(format!("could not take down {}", failed.join(", "))))
    }
}

/// The final statistics, one summary line (zramctl's columns) and the JSON.
fn print_stats(dev: &Path, json: &str) {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let orig = n("orig_data_size");
    let compr = n("compr_data_size");
    let ratio = if compr > 0 { orig as f64 / compr as f64 } else { 0.0 };
    println!(
        "compcache: {} statistics: DATA {} COMPR {} TOTAL {} (mem_used_max {}), ratio {:.2}, same_pages {}, huge_pages {}",
        dev.display(),
        human(orig),
        human(compr),
        human(n("mem_used_total")),
        human(n("mem_used_max")),
        ratio,
        n("same_pages"),
        n("huge_pages"),
    );
    println!("{}", json.trim_end());
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        args: SwaponArgs,
    }

    fn args(v: &[&str]) -> SwaponArgs {
        T::parse_from(std::iter::once("swapon").chain(v.iter().copied())).args
    }

    const GIB: u64 = 1 << 30;

    /// A zram-generator configuration file in a directory of its own, removed on drop.
    struct ConfigFile(PathBuf);

    impl ConfigFile {
        fn new(tag: &str, text: &str) -> ConfigFile {
            let dir = std::env::temp_dir().join(format!("compcache-swapon-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("zram-generator.conf"), text).unwrap();
            ConfigFile(dir)
        }
        fn path(&self) -> String {
            self.0.join("zram-generator.conf").display().to_string()
        }
    }

    impl Drop for ConfigFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn defaults_follow_zram_generator() {
        let s = settings(&args(&["--no-config"]), 4 * GIB).unwrap().unwrap();
        assert_eq!((s.size_bytes, s.priority, s.algorithm.as_str(), s.mem_limit_bytes), (2 * GIB, 100, "lz4", 0));
        let s = settings(&args(&["--no-config"]), 32 * GIB).unwrap().unwrap();
        assert_eq!(s.size_bytes, 4 * GIB);
    }

    #[test]
    fn flags_override_the_config_file() {
        let f = ConfigFile::new("override", "[zram0]\nzram-size = ram\ncompression-algorithm = zstd(level=7)\nswap-priority = 5\n");
        let c = &f.path();
        let s = settings(&args(&["--config", c]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.size_bytes, s.algorithm.as_str(), s.level, s.priority), (2 * GIB, "zstd", Some(7), 5));
        let s = settings(&args(&["--config", c, "--size", "25%", "--priority", "100", "--algorithm", "lz4"]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.size_bytes, s.algorithm.as_str(), s.priority), (GIB / 2, "lz4", 100));
        assert!(settings(&args(&["--config", c, "--section", "zram1"]), GIB).is_err());
    }

    #[test]
    fn writeback_device_becomes_the_servers_backing_device() {
        let f = ConfigFile::new("wb", "[zram0]\nzram-size = 1024\nzram-resident-limit = 64\nwriteback-device = /dev/vdb\n");
        let c = &f.path();
        let s = settings(&args(&["--config", c, "--writeback-rate", "4M/s"]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.backing.backing.as_deref(), s.backing.writeback_rate.as_deref()), (Some(Path::new("/dev/vdb")), Some("4M/s")));
        // A flag overrides the file; without either there is no backing device.
        let s = settings(&args(&["--config", c, "--backing", "/var/b.img"]), 2 * GIB).unwrap().unwrap();
        assert_eq!(s.backing.backing.as_deref(), Some(Path::new("/var/b.img")));
        assert_eq!(settings(&args(&["--no-config"]), 2 * GIB).unwrap().unwrap().backing.backing, None);
        let e = settings(&args(&["--no-config", "--writeback-limit", "1G"]), 2 * GIB).unwrap_err().to_string();
        assert!(e.contains("need --backing"), "{e}");
    }

    #[test]
    fn the_server_gets_every_setting() {
        use crate::cmd::device::{NbdAttachArgs, UblkArgs};
        #[derive(Parser)]
        enum Server {
            Ublk(UblkArgs),
            NbdAttach(NbdAttachArgs),
        }
        let s = settings(
            &args(&[
                "--no-config",
                "--size",
                "1G",
                "--mem-limit",
                "16M",
                "--algorithm",
                "zstd",
                "--level",
                "3",
                "--backing",
                "/dev/vdb",
                "--writeback-high",
                "80",
                "--backing-incompressible",
            ]),
            2 * GIB,
        )
        .unwrap()
        .unwrap();
        let cmd = server_command("ublk", &s, "8M", 5);
        let Server::Ublk(u) = Server::try_parse_from(std::iter::once(OsString::from("compcache")).chain(cmd)).unwrap() else {
            panic!("not ublk")
        };
        let cfg = u.store.config().unwrap();
        assert_eq!(
            (cfg.disksize_bytes, cfg.mem_limit_bytes, cfg.level, u.server.reserve.as_deref(), u.server.ready_fd),
            (GIB, 16 << 20, Some(3), Some("8M"), Some(5))
        );
        let b = cfg.backing.unwrap();
        assert_eq!((b.path.as_path(), b.high_pct, b.incompressible), (Path::new("/dev/vdb"), 80, true));
        let cmd = server_command("nbd", &s, "0", 5);
        let Server::NbdAttach(n) = Server::try_parse_from(std::iter::once(OsString::from("compcache")).chain(cmd)).unwrap() else {
            panic!("not nbd")
        };
        assert_eq!(n.store.backing, s.backing);
    }
}
