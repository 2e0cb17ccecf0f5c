//! `compcache ublk` and `compcache nbd-attach`: create a compressed RAM block device through
//! one of the kernel's front ends and serve it until SIGINT/SIGTERM/SIGHUP. They are servers
//! that `compcache swapon` starts; they can also be run by hand (under systemd, say), and with
//! `--origin` they make a cache of a disk (docs/cli.md, "Cache mode (zcache)").
//! Everything around the device (the store, signals, swapoff before removal, statistics) is
//! the [`Session`] they share with `compcache fuse`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::session::{ServerArgs, Session};
use crate::failure::Failure;
use crate::frontend::Frontend;
use crate::store_args::StoreArgs;
use crate::units::human;

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

pub fn run_ublk(args: UblkArgs) -> Result<(), Failure> {
    compcache_ublk::kernel_support()?;
    let session = Arc::new(Session::start(&args.store, &args.server, Frontend::Ublk)?);
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
    let session = Session::start(&args.store, &args.server, Frontend::Nbd)?;
    let description = match session.origin() {
        Some(origin) => format!("compcache {} {} cache of {origin}", human(session.cfg.disksize_bytes), session.cfg.algorithm),
        None => format!("compcache {} {} device", human(session.cfg.disksize_bytes), session.cfg.algorithm),
    };
    let export = compcache_nbd::Export { name: "compcache".into(), description, store: Arc::clone(&session.store) };
    // The kernel's requests are capped and every worker holds a buffer for the largest from
    // the start (made before the device is up, locked by mlockall): serving swap allocates
    // nothing in userspace. (Replies still take socket buffers in the kernel: docs/swap.md.)
    // The kernel's connections are this server's only clients: no request deadline (there is
    // no one else to protect, and dropping one of them would fail swap I/O).
    let server_opts =
        compcache_nbd::ServerOptions { request_buffer_bytes: NBD_MAX_REQUEST_BYTES as usize, request_deadline: None, ..Default::default() };
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
