//! `compcache ublk` and `compcache nbd-attach`: create a compressed RAM block device through
//! one of the kernel's front ends and serve it until SIGINT/SIGTERM/SIGHUP. They are the
//! servers that `compcache swapon` starts; they can also be run by hand (under systemd, say).
//!
//! On a stop signal the device is first taken out of swap use if the kernel still swaps to
//! it, then removed. The final statistics go to `--stats-dir/<device>.stats.json` and a
//! control socket (`/run/compcache/<device>.ctl`) answers `compcache stat --control` while
//! the device is up.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use compcache_nbd::control::{self, ControlState, DeviceInfo};
use compcache_store::{parse_size, physical_ram_bytes, Algorithm, Config, Store, PAGE_SIZE};

use super::reserve;
use super::swapdev::{is_active_swap, lock_future_mappings, pin_server_memory, signal_ready, swapoff, StopSignals};
use super::zramconf;
use crate::backing::{spawn_writeback, BackingArgs};
use crate::failure::Failure;
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
        let backing = self.backing.config(ram, mem_limit)?;
        let cfg = Config { algorithm, level: self.level, mem_limit_bytes: mem_limit, backing, ..Config::with_disksize(size) };
        cfg.validate().map_err(|e| Failure::usage(e.to_string()))?;
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
    #[arg(long, value_name = "FD", hide = true)]
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

/// Everything a running server needs around the device, shared by both front ends.
struct Session {
    store: Arc<Store>,
    cfg: Config,
    /// The size the front end exposes.
    size_bytes: u64,
    server: ServerArgs,
    signals: StopSignals,
    frontend: &'static str,
}

impl Session {
    fn start(store_args: &StoreArgs, server: &ServerArgs, frontend: &'static str) -> Result<Session, Failure> {
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
        Ok(Session { store, cfg, size_bytes, server: server.clone(), signals, frontend })
    }

    /// Runs while the device is up: announce it, serve `compcache stat`, wait for a stop
    /// signal, and take the device out of swap use before it goes.
    fn while_up(&self, dev: &Path, detail: &str, alive: &dyn Fn() -> bool) {
        let name = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
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
                let _ = std::thread::Builder::new().name("control".into()).spawn(move || control::serve(state, listener));
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
        if is_active_swap(dev) {
            eprintln!("compcache: {} is swap: swapoff first (reads every page back)", dev.display());
            if let Err(e) = swapoff(dev) {
                eprintln!("compcache: {e}");
            }
        }
        let _ = std::fs::remove_file(&ctl);
        self.write_stats(&name);
    }

    fn write_stats(&self, name: &str) {
        let stats = serde_json::to_value(self.store.stats()).unwrap_or_default();
        eprintln!("compcache: final statistics of {name}: {stats}");
        if let Some(dir) = &self.server.stats_dir {
            let path = dir.join(format!("{name}.stats.json"));
            if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, format!("{stats:#}\n"))) {
                eprintln!("compcache: {}: {e}", path.display());
            }
        }
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
