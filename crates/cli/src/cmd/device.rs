//! `compcache ublk` and `compcache nbd-attach`: create a compressed RAM block device through
//! one of the kernel's front ends and serve it until SIGINT/SIGTERM/SIGHUP. They are the
//! servers that `compcache swapon` starts; they can also be run by hand (under systemd, say).
//!
//! On a stop signal the device is first taken out of swap use if the kernel still swaps to
//! it, then removed. It is never removed while it is swap: a failed swapoff is logged with
//! what to do, the device keeps serving, and swapoff is retried with a growing pause and at
//! each further stop signal (`swapdev::take_out_of_swap`). The final statistics go to `--stats-dir/<device>.stats.json` and a
//! control socket (`/run/compcache/<device>.ctl`) answers `compcache stat --control` while
//! the device is up.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use compcache_control::{self as control, ControlState, DeviceInfo};
use compcache_store::{parse_size, physical_ram_bytes, Algorithm, Config, Store, PAGE_SIZE};

use super::reserve;
use super::swapdev::{lock_future_mappings, pin_server_memory, signal_ready, take_out_of_swap, KernelSwap, StopSignals};
use super::zramconf;
use crate::backing::{spawn_writeback, BackingArgs, StartGuard};
use crate::failure::Failure;
use crate::private_file;
use crate::units::human;

/// The store settings both servers take.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// Device size: bytes with K/M/G/T, a share of RAM (25%), or a zram-generator
    /// zram-size expression in MiB such as 'min(ram / 2, 4096)'.
    #[arg(long, default_value = "25%", value_name = "SIZE")]
    pub size: String,

    /// Compression algorithm.
    #[arg(long, default_value = "lz4", value_name = "lz4|zstd")]
    pub algorithm: String,

    /// Compression level (zstd only).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub level: Option<i32>,

    /// Most memory the compressed data may take (SIZE; 0: no limit).
    #[arg(long, default_value = "0", value_name = "SIZE")]
    pub mem_limit: String,

    #[command(flatten)]
    pub backing: BackingArgs,
}

/// A size given either as compcache writes sizes or as a zram-size expression (MiB).
pub fn parse_size_or_expr(text: &str, ram_bytes: u64) -> Result<u64, String> {
    parse_size(text, ram_bytes).or_else(|plain| {
        zramconf::eval(text, ram_bytes as f64 / 1048576.0)
            .map(|mib| (mib.max(0.0) * 1048576.0) as u64 / PAGE_SIZE as u64 * PAGE_SIZE as u64)
            .map_err(|expr| format!("{plain}; nor is it a zram-size expression: {expr}"))
    })
}

/// The checks of the store flags that `serve` and the swap servers (`ublk`, `nbd-attach`)
/// share, on the parsed values (`mem_limit_text` as given): the one place for them until the
/// two flag sets are unified.
/// - a `--mem-limit` that is not 0 but below one page is an error (it used to round to 0,
///   which means no limit: the opposite of what was asked);
/// - a `--mem-limit` above `--size` is accepted with a warning, returned for the caller to
///   print: the compressed data cannot grow much beyond the device size, so such a limit
///   limits nothing, but zram accepts it too and zram-generator configurations may carry it.
pub fn check_store_limits(size_bytes: u64, mem_limit_text: &str, mem_limit_bytes: u64) -> Result<Option<String>, Failure> {
    let no_limit = matches!(mem_limit_text.trim(), "0" | "none" | "");
    if !no_limit && mem_limit_bytes < PAGE_SIZE as u64 {
        return Err(Failure::usage(format!(
            "--mem-limit {mem_limit_text} is below one page ({PAGE_SIZE} bytes), which would mean no limit at all: give at least 4K, or 0 for no limit"
        )));
    }
    if mem_limit_bytes > size_bytes {
        return Ok(Some(format!(
            "--mem-limit {} is above --size {}: the compressed data can never reach it, so it limits nothing",
            human(mem_limit_bytes),
            human(size_bytes)
        )));
    }
    Ok(None)
}

/// Parses `--ready-fd`: the write end of the pipe `compcache swapon` passes. Anything else (a
/// closed descriptor, stdin/stdout/stderr, a regular file, a terminal, a socket) is refused,
/// so that the readiness line can never land in a file or on a descriptor the server uses.
pub fn parse_ready_fd(text: &str) -> Result<i32, String> {
    let fd: i32 = text.parse().map_err(|_| format!("{text:?} is not a descriptor number"))?;
    if fd <= 2 {
        return Err(format!("{fd} is stdin, stdout or stderr: give the pipe `compcache swapon` passes"));
    }
    // SAFETY: stat is plain data; all-zero is valid storage for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `st`, which is valid for writes; a bad descriptor is an
    // error (EBADF), not undefined behaviour.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!("descriptor {fd}: {} (it must be open: the pipe `compcache swapon` passes)", std::io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => "a regular file",
            libc::S_IFCHR => "a character device (a terminal?)",
            libc::S_IFSOCK => "a socket",
            libc::S_IFDIR => "a directory",
            _ => "not a pipe",
        };
        return Err(format!("descriptor {fd} is {kind}: it must be the pipe `compcache swapon` passes"));
    }
    Ok(fd)
}

impl StoreArgs {
    pub fn config(&self) -> Result<Config, Failure> {
        let ram = physical_ram_bytes();
        let size = parse_size_or_expr(&self.size, ram).map_err(|e| Failure::usage(format!("--size: {e}")))?;
        if size < 10 * PAGE_SIZE as u64 {
            return Err(Failure::usage(format!("--size {}: a swap device needs at least 10 pages", self.size)));
        }
        let algorithm: Algorithm = self.algorithm.parse().map_err(|e: String| Failure::usage(format!("--algorithm: {e}")))?;
        let mem_limit = match self.mem_limit.trim() {
            "0" | "none" | "" => 0,
            t => parse_size_or_expr(t, ram).map_err(|e| Failure::usage(format!("--mem-limit: {e}")))?,
        };
        // Printed once every other check has passed (an error is the one line then).
        let warning = check_store_limits(size, &self.mem_limit, mem_limit)?;
        let backing = self.backing.config(ram, mem_limit)?;
        let cfg = Config { algorithm, level: self.level, mem_limit_bytes: mem_limit, backing, ..Config::with_disksize(size) };
        cfg.validate().map_err(|e| Failure::usage(e.to_string()))?;
        if let Some(warning) = warning {
            eprintln!("compcache: warning: {warning}");
        }
        Ok(cfg)
    }
}

/// What both servers take besides the store.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Do not lock the server's memory. Only for experiments: a swap server that can itself be
    /// swapped out can deadlock the machine.
    #[arg(long)]
    pub no_mlock: bool,

    /// Write the final statistics to DIR/<device>.stats.json on exit.
    #[arg(long, value_name = "DIR")]
    pub stats_dir: Option<PathBuf>,

    /// Memory kept resident and free for the I/O path, so that storing a swapped-out page
    /// never waits for memory (see docs/swap.md): a SIZE, `auto` (1/128 of RAM, 8..=128 MiB)
    /// or 0 for none [default: auto] (`swapon` passes its own).
    #[arg(long, value_name = "SIZE|auto|0")]
    pub reserve: Option<String>,

    /// File descriptor to write "READY <device>" to once the device is up (used by swapon).
    #[arg(long, value_name = "FD", hide = true, value_parser = parse_ready_fd)]
    pub ready_fd: Option<i32>,
}

/// Create a compressed RAM block device through ublk (/dev/ublkbN) and serve it.
#[derive(clap::Args, Debug)]
pub struct UblkArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub server: ServerArgs,
    /// Hardware queues, one server thread each [default: one per CPU].
    #[arg(long, value_name = "N")]
    pub queues: Option<u16>,
    /// Requests in flight per queue.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub depth: u16,
    /// Device number to ask for (/dev/ublkbN) [default: the next free one].
    #[arg(long, value_name = "N")]
    pub id: Option<i32>,
}

/// Create a compressed RAM block device on the kernel's NBD driver (/dev/nbdN) and serve it
/// in-process, with no separate nbd-client.
#[derive(clap::Args, Debug)]
pub struct NbdAttachArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub server: ServerArgs,
    /// The NBD device to use [default: the first free /dev/nbdN].
    #[arg(long, value_name = "PATH")]
    pub device: Option<PathBuf>,
    /// Connections (kernel hardware queues) [default: one per CPU, at most 8].
    #[arg(long, value_name = "N")]
    pub connections: Option<usize>,
}

/// Everything a running server needs around the device, shared by the front ends (ublk, nbd
/// here; fuse in `fuse.rs`).
pub(super) struct Session {
    pub(super) store: Arc<Store>,
    cfg: Config,
    /// The size the front end exposes.
    pub(super) size_bytes: u64,
    server: ServerArgs,
    signals: StopSignals,
    frontend: &'static str,
    /// Until the device is up: a refused start gives the backing device up (`StartGuard`).
    start: std::sync::Mutex<Option<StartGuard>>,
}

impl Session {
    pub(super) fn start(store_args: &StoreArgs, server: &ServerArgs, frontend: &'static str) -> Result<Session, Failure> {
        // Before any thread exists: every thread inherits the blocked mask and the flags.
        let signals = StopSignals::block()?;
        pin_server_memory(!server.no_mlock)?;
        let cfg = store_args.config()?;
        let size_bytes = cfg.disksize_bytes;
        let reserve_bytes = match server.reserve.as_deref().unwrap_or("auto") {
            "auto" => reserve::default_high_bytes(physical_ram_bytes()),
            "0" | "none" => 0,
            t => parse_size(t, physical_ram_bytes()).map_err(|e| Failure::usage(format!("--reserve: {e}")))?,
        };
        let store = Arc::new(Store::new(cfg.clone()).map_err(|e| Failure::new(format!("cannot create the store: {e}")))?);
        let start = StartGuard::new(&store);
        lock_future_mappings(!server.no_mlock);
        if reserve_bytes > 0 {
            let mut keeper = reserve::Reserve::new(Arc::clone(&store), reserve_bytes);
            keeper.prime();
            std::thread::Builder::new()
                .name("reserve".into())
                .spawn(move || keeper.keep())
                .map_err(|e| Failure::new(format!("starting the reserve keeper: {e}")))?;
        }
        // With the store fault-free, a write that finds no resident pool page overflows to
        // the backing device; this thread keeps the pool under its watermarks meanwhile.
        if store.has_backing() {
            spawn_writeback(Arc::clone(&store)).map_err(|e| Failure::new(format!("starting the writeback thread: {e}")))?;
        }
        let start = std::sync::Mutex::new(Some(start));
        Ok(Session { store, cfg, size_bytes, server: server.clone(), signals, frontend, start })
    }

    /// Runs while the device is up: announce it, serve `compcache stat`, wait for a stop
    /// signal, and take the device out of swap use before it goes.
    pub(super) fn while_up(&self, dev: &Path, detail: &str, alive: &dyn Fn() -> bool) {
        let name = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        self.while_up_named(dev, &name, detail, alive)
    }

    /// The same, with the control socket and statistics named `name` (`/run/compcache/<name>.ctl`)
    /// rather than after the device.
    pub(super) fn while_up_named(&self, dev: &Path, name: &str, detail: &str, alive: &dyn Fn() -> bool) {
        if let Some(start) = self.start.lock().ok().and_then(|mut s| s.take()) {
            start.started();
        }
        let ctl = PathBuf::from(format!("/run/compcache/{name}.ctl"));
        let _ = std::fs::create_dir_all("/run/compcache");
        let _ = std::fs::remove_file(&ctl);
        match control::bind(&ctl) {
            Ok(listener) => {
                let state = Arc::new(ControlState {
                    store: Arc::clone(&self.store),
                    device: DeviceInfo {
                        export_name: dev.display().to_string(),
                        nbd_socket: None,
                        nbd_tcp: None,
                        control_socket: ctl.display().to_string(),
                        pid: std::process::id(),
                        version: env!("CARGO_PKG_VERSION").to_string(),
                    },
                });
                let _ = std::thread::Builder::new().name("control".into()).spawn(move || {
                    control::serve(state, listener);
                });
            }
            Err(e) => eprintln!("compcache: warning: no control socket {}: {e}", ctl.display()),
        }
        println!(
            "compcache: {} is up: {}, {} {}{}{}, {detail}; control {}; pid {}",
            dev.display(),
            self.frontend,
            human(self.cfg.disksize_bytes),
            self.cfg.algorithm,
            if self.cfg.mem_limit_bytes > 0 { format!(", mem-limit {}", human(self.cfg.mem_limit_bytes)) } else { String::new() },
            self.cfg.backing.as_ref().map_or(String::new(), |b| format!(", backing {}", b.path.display())),
            ctl.display(),
            std::process::id()
        );
        signal_ready(self.server.ready_fd, &format!("READY {}\n", dev.display()));
        match self.signals.wait(alive) {
            Some(sig) => eprintln!("compcache: signal {sig}: removing {}", dev.display()),
            None => eprintln!("compcache: {} was stopped by the kernel or another program", dev.display()),
        }
        // The front end removes the device once this returns: not while it is swap.
        let mut pause = |d: std::time::Duration| self.signals.wait_timeout(d);
        take_out_of_swap(dev, &KernelSwap, &mut pause, &mut |line: &str| eprintln!("compcache: {line}"));
        let _ = std::fs::remove_file(&ctl);
        self.write_stats(name);
    }

    /// The final statistics, to the log and to `--stats-dir` (a private file, replacing only
    /// this user's own: `private_file`).
    fn write_stats(&self, name: &str) {
        let stats = serde_json::to_value(self.store.stats()).unwrap_or_default();
        eprintln!("compcache: final statistics of {name}: {stats}");
        if let Some(dir) = &self.server.stats_dir {
            let path = dir.join(format!("{name}.stats.json"));
            let written = private_file::create_private_dir_all(dir)
                .and_then(|_| private_file::write_replacing_own(&path, format!("{stats:#}\n").as_bytes()));
            if let Err(e) = written {
                eprintln!("compcache: {}: {e}", path.display());
            }
        }
    }
}

impl Drop for Session {
    /// The front end has removed the device (or never made it): empty the backing device,
    /// so that no page data outlives the server (docs/backing.md); the store itself is
    /// shared with threads that outlive the session. A start refused before the device was
    /// up then also removes a backing file it created (`start`, dropped after this).
    fn drop(&mut self) {
        self.store.close_backing();
    }
}

pub fn run_ublk(args: UblkArgs) -> Result<(), Failure> {
    compcache_ublk::kernel_support()?;
    let session = Arc::new(Session::start(&args.store, &args.server, "ublk")?);
    let mut opts = compcache_ublk::Options { mlock_io_buffers: !args.server.no_mlock, ..Default::default() };
    if let Some(q) = args.queues {
        opts.nr_queues = q;
    }
    opts.queue_depth = args.depth;
    if let Some(id) = args.id {
        opts.dev_id = id;
    }
    let s = Arc::clone(&session);
    let size = session.size_bytes;
    compcache_ublk::serve(Arc::clone(&session.store), size, &opts, move |dev, alive| {
        let detail = format!("{} queues x depth {}", dev.nr_queues, dev.queue_depth);
        s.while_up(Path::new(&dev.bdev_path), &detail, alive);
    })
    .map_err(|e| {
        let hint = if e.errno() == libc::EPERM || e.errno() == libc::EACCES { " (run as root)" } else { "" };
        Failure::new(format!("{e}{hint}"))
    })?;
    Ok(())
}

/// The largest request `nbd-attach` lets the kernel send: 32 swap pages, as a swap cluster
/// (ublk's I/O buffers are 64 KiB). Swap I/O rarely merges beyond that.
const NBD_MAX_REQUEST_BYTES: u32 = 128 << 10;

pub fn run_nbd_attach(args: NbdAttachArgs) -> Result<(), Failure> {
    compcache_kernel_nbd::kernel_support()?;
    let session = Session::start(&args.store, &args.server, "nbd")?;
    let description = format!("compcache {} {} device", human(session.cfg.disksize_bytes), session.cfg.algorithm);
    let export = compcache_nbd::Export { name: "compcache".into(), description, store: Arc::clone(&session.store) };
    // The kernel's requests are capped and every worker holds a buffer for the largest from
    // the start (made before the device is up, locked by mlockall): serving swap allocates
    // nothing in userspace. (Replies still take socket buffers in the kernel: docs/swap.md.)
    let server_opts = compcache_nbd::ServerOptions { request_buffer_bytes: NBD_MAX_REQUEST_BYTES as usize, ..Default::default() };
    let server = Arc::new(compcache_nbd::Server::new(export, server_opts));
    let mut opts = compcache_kernel_nbd::AttachOptions {
        device: args.device.clone(),
        max_request_bytes: Some(NBD_MAX_REQUEST_BYTES),
        ..Default::default()
    };
    if let Some(c) = args.connections {
        opts.connections = c;
    }
    compcache_kernel_nbd::attach(server, &opts, |a, alive| {
        let detail = format!("{} connection(s)", a.connections);
        session.while_up(&a.dev_path, &detail, alive);
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        server: ServerArgs,
    }

    fn parse(v: &[&str]) -> Result<T, clap::Error> {
        T::try_parse_from(std::iter::once("ublk").chain(v.iter().copied()))
    }

    #[test]
    fn a_mem_limit_below_one_page_is_an_error_in_both_servers() {
        let e = parse(&["--size", "64M", "--mem-limit", "100"]).unwrap().store.config().unwrap_err();
        assert!(e.to_string().contains("below one page") && e.exit_code() == 2, "{e}");
        assert_eq!(parse(&["--size", "64M", "--mem-limit", "4K"]).unwrap().store.config().unwrap().mem_limit_bytes, 4096);
        assert_eq!(parse(&["--size", "64M", "--mem-limit", "0"]).unwrap().store.config().unwrap().mem_limit_bytes, 0);
        // The one function both flag sets call.
        assert!(check_store_limits(1 << 20, "1", 1).is_err());
        assert!(check_store_limits(1 << 20, "none", 0).unwrap().is_none());
    }

    #[test]
    fn a_mem_limit_above_the_size_is_warned_about() {
        let w = check_store_limits(64 << 20, "1G", 1 << 30).unwrap().expect("a warning");
        assert!(w.contains("above --size") && w.contains("limits nothing"), "{w}");
        assert!(check_store_limits(64 << 20, "16M", 16 << 20).unwrap().is_none());
        // Still accepted.
        assert_eq!(parse(&["--size", "64M", "--mem-limit", "1G"]).unwrap().store.config().unwrap().mem_limit_bytes, 1 << 30);
    }

    #[test]
    fn ready_fd_must_be_a_pipe() {
        use std::os::fd::AsRawFd;
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let w = fds[1].to_string();
        assert_eq!(parse(&["--ready-fd", &w]).unwrap().server.ready_fd, Some(fds[1]));
        // SAFETY: both descriptors came from pipe() above and are closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        // (Not the pipe's number: another test's thread may open a file under it meanwhile.)
        let e = parse(&["--ready-fd", "987654"]).err().expect("a closed descriptor is refused").to_string();
        assert!(e.contains("must be open"), "{e}");
        for fd in ["0", "1", "2"] {
            let e = parse(&["--ready-fd", fd]).err().expect("stdio is refused").to_string();
            assert!(e.contains("stdin, stdout or stderr"), "{e}");
        }
        let path = std::env::temp_dir().join(format!("compcache-ready-fd-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let fd = file.as_raw_fd().to_string();
        let e = parse(&["--ready-fd", &fd]).err().expect("a regular file is refused").to_string();
        drop(file);
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("regular file"), "{e}");
        assert!(parse(&["--ready-fd", "x"]).is_err());
    }

    #[test]
    fn sizes_take_both_forms() {
        let gib = 1u64 << 30;
        assert_eq!(parse_size_or_expr("25%", 4 * gib).unwrap(), gib);
        assert_eq!(parse_size_or_expr("1G", 4 * gib).unwrap(), gib);
        assert_eq!(parse_size_or_expr("min(ram / 2, 4096)", 4 * gib).unwrap(), 2 * gib);
        assert_eq!(parse_size_or_expr("ram * 2", gib).unwrap(), 2 * gib);
        let e = parse_size_or_expr("lots", gib).unwrap_err();
        assert!(e.contains("zram-size expression"), "{e}");
    }
}
