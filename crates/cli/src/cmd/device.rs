//! `compcache ublk` and `compcache nbd-attach`: create a compressed RAM block device through
//! one of the kernel's front ends and serve it until SIGINT/SIGTERM/SIGHUP. They are servers
//! that `compcache swapon` starts; they can also be run by hand (under systemd, say), and with
//! `--origin` they make a cache of a disk (docs/cli.md, "Cache mode (zcache)").
//! Everything around the device (the store, signals, swapoff before removal, statistics) is
//! the [`Session`] they share with `compcache fuse`.
//!
//! Supervised ublk (docs/swap.md, "When the server dies"): when a holder is named
//! (`NOTIFY_SOCKET`: swapon's supervisor or systemd) and the store's state outlives the process
//! (`Store::state_fd`), the device is created with ublk's user recovery and, once it is up
//! and before READY, the server gives the holder the state's descriptor ([`FD_STORE`]) and a
//! record of the device's number ([`FD_UBLK`]): [`UBLK_HELD`], all a successor needs. A
//! successor is started with `--takeover` and those descriptors (`LISTEN_FDS`): it recovers the
//! store, takes the device over (`compcache_ublk::recover`: the kernel held the I/O and gives
//! the dead server's requests again) and from then on is the server. SIGUSR2 (`compcache
//! restart`) makes a held server exit with `HANDED_OVER` without taking anything down: the
//! kernel holds the I/O for the successor as after a death. A panic aborts the process, so that
//! the supervisor sees it die.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use super::session::{Ending, ServerArgs, Session};
use crate::failure::{with_code, Failure, HANDED_OVER, TAKEOVER_REFUSED};
use crate::frontend::Frontend;
use crate::log;
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
    /// Take over the device whose descriptors are handed to this process (LISTEN_FDS, from
    /// swapon's supervisor or systemd's file descriptor store) instead of making a new one.
    #[arg(long, hide = true)]
    pub takeover: bool,
}

/// The name the store's state is stored under (the same for every front end).
pub const FD_STORE: &str = crate::cmd::fuse::FD_STORE;
/// The name of the record of the ublk device's number.
pub const FD_UBLK: &str = "compcache-ublk";
/// What a holder must keep for a ublk successor: the state and the device's number. The
/// kernel keeps the device itself; `/dev/ublkcN` must NOT be held (the kernel starts a
/// recovery only once the dead server's descriptor is closed).
pub const UBLK_HELD: &[&str] = &[FD_STORE, FD_UBLK];
/// The value parser of `--dead-conn-timeout`: whole seconds, 1 to 3600.
fn dead_conn_secs(text: &str) -> Result<u64, String> {
    match compcache_store::parse_secs(text, 3600, "an hour is the longest the kernel is asked to hold the I/O")? {
        0 => Err("0 would fail the I/O at once: a successor could never take the device over".into()),
        s => Ok(s),
    }
}

/// The name of the record of the nbd device's index.
pub const FD_NBD: &str = "compcache-nbd";
/// What a holder must keep for an nbd successor: the state and the device's index. The kernel
/// keeps the device and queues its I/O for the dead-connection timeout; the sockets must not
/// be held (their closing is how the kernel learns that the server died).
pub const NBD_HELD: &[&str] = &[FD_STORE, FD_NBD];

/// A small record for a successor, in a memfd of its own.
fn record_memfd(name: &std::ffi::CStr, text: &str) -> std::io::Result<OwnedFd> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a NUL-terminated name and flags; returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.write_all(text.as_bytes())?;
    Ok(f.into())
}

/// The text of a record made by [`record_memfd`].
fn read_record(fd: OwnedFd) -> Result<String, String> {
    use std::io::{Read, Seek};
    let mut f = std::fs::File::from(fd);
    let mut text = String::new();
    f.rewind().and_then(|_| f.take(4096).read_to_string(&mut text)).map_err(|e| format!("reading the record: {e}"))?;
    Ok(text)
}

/// What a successor is handed: the store's state and the front end's record (its text).
fn take_handed(record_name: &str) -> Result<(OwnedFd, String), String> {
    let fds = crate::fdstore::handed(false).map_err(|e| format!("the handed descriptors: {e}"))?;
    let (mut state, mut record) = (None, None);
    for (name, fd) in fds {
        match name.as_str() {
            n if n == FD_STORE => state = Some(fd),
            n if n == record_name => record = Some(fd),
            crate::metrics::FD_METRICS_LISTEN => crate::metrics::adopt_handed(fd).unwrap_or_else(|e| log::warning(&e)),
            // Another program's, or a later version's: not ours to use.
            _ => {}
        }
    }
    let state = state.ok_or_else(|| format!("no {FD_STORE} descriptor was handed over"))?;
    let record = record.ok_or_else(|| format!("no {record_name} descriptor was handed over"))?;
    Ok((state, read_record(record)?))
}

/// The value of `key=` in a record.
fn record_value<T: std::str::FromStr>(text: &str, key: &str) -> Result<T, String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("the record has no valid {key}= line: {:?}", text.trim()))
}

/// How many connections the nbd device named in a held record has: its `connections=` line;
/// a record without one is from a version that always made two.
fn nbd_connections(record: &str) -> Result<usize, String> {
    match record.lines().any(|l| l.starts_with("connections=")) {
        true => record_value::<usize>(record, "connections").and_then(|n| match n {
            1..=64 => Ok(n),
            _ => Err(format!("the record's connections={n} is not 1 to 64")),
        }),
        false => Ok(2),
    }
}

/// Gives the holder the state and a record (`record_name`, `text`); the error is one line.
fn hold(state: Option<std::os::fd::BorrowedFd<'_>>, record_name: &str, record: &std::ffi::CStr, text: &str) -> std::io::Result<()> {
    let state = state.ok_or_else(|| std::io::Error::other("the store's state does not outlive the process"))?;
    let rec = record_memfd(record, text)?;
    crate::fdstore::store(FD_STORE, &[state])?;
    crate::fdstore::store(record_name, &[rec.as_fd()])?;
    Ok(())
}

/// A panicking thread would leave its request unanswered with the process alive: a held
/// server dies instead, for the supervisor to start a successor.
pub(super) fn abort_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        std::process::abort();
    }));
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
    /// Connections (kernel hardware queues) [default: one per CPU, at most 8]. A device that
    /// can be taken over (its state held for a successor) always has one (docs/swap.md, "Kernel
    /// NBD: the requests in flight at a kill").
    #[arg(long, value_name = "N")]
    pub connections: Option<usize>,
    /// When the store's state is held for a successor (a supervisor, systemd's file descriptor
    /// store): how long the kernel queues the device's I/O after this server's connections die,
    /// for a successor to reconnect, before it fails the I/O (NBD_ATTR_DEAD_CONN_TIMEOUT).
    /// A DURATION in whole seconds (60, 2m), 1s to 1h.
    #[arg(long, value_name = "DURATION", default_value = "60", value_parser = dead_conn_secs)]
    pub dead_conn_timeout: u64,
    /// Take over the device whose descriptors are handed to this process (LISTEN_FDS, from
    /// swapon's supervisor or systemd's file descriptor store) instead of making a new one.
    #[arg(long, hide = true)]
    pub takeover: bool,
}

pub fn run_ublk(args: UblkArgs) -> Result<(), Failure> {
    compcache_ublk::kernel_support()?;
    let mut opts = compcache_ublk::Options { mlock_io_buffers: !args.server.no_mlock, ..Default::default() };
    if let Some(q) = args.queues {
        opts.nr_queues = q;
    }
    opts.queue_depth = args.depth;
    if let Some(id) = args.id {
        opts.dev_id = id;
    }
    // A standby makes its queues' buffers now, pinned, while memory is plentiful: at the
    // takeover it may be short, and nothing can be swapped out until the device serves again
    // (compcache_ublk's `buffers.rs`).
    let prepared = match (args.server.standby_fd, args.takeover) {
        (Some(_), true) => {
            crate::process::pin_swap_server(!args.server.no_mlock)?;
            let bufs = compcache_ublk::IoBuffers::allocate(opts.nr_queues, opts.io_buf_bytes);
            log::info(&format!(
                "standby pid {}: made {} queue buffers of {} in advance",
                std::process::id(),
                opts.nr_queues,
                human(opts.io_buf_bytes as u64)
            ));
            Some(Arc::new(bufs))
        }
        _ => None,
    };
    super::session::wait_if_standby(&args.server, args.takeover)?;
    let refused = |e: String| with_code(TAKEOVER_REFUSED, format!("cannot take the device over: {e}"));
    // Before any thread exists (the environment is read and cleared).
    let (state, taken_id) = match args.takeover {
        true => {
            let (state, record) = take_handed(FD_UBLK).map_err(refused)?;
            (Some(state), Some(record_value::<i32>(&record, "dev_id").map_err(refused)?))
        }
        false => (None, None),
    };
    let session = Arc::new(Session::start_with(&args.store, &args.server, Frontend::Ublk, state)?);
    // Held: the state and the device's number are kept by someone who outlives us.
    let held = taken_id.is_some() || (session.store.state_fd().is_some() && crate::fdstore::holder_named());
    opts.user_recovery = held;
    if held {
        abort_on_panic();
    }
    let s = Arc::clone(&session);
    let size = session.size_bytes;
    let takeover = taken_id.is_some();
    let while_up = move |dev: &compcache_ublk::Device, alive: &dyn Fn() -> bool| {
        let mut held = held;
        if held && !takeover {
            let text = format!("dev_id={}\n", dev.dev_id);
            if let Err(e) = hold(s.store.state_fd(), FD_UBLK, c"compcache-ublk", &text) {
                // The device has user recovery but no one to start a successor: if this server
                // dies, its I/O waits until the device is deleted (`compcache swapoff`).
                log::error(&format!("giving the holder the store's state: {e}; {} cannot be taken over", dev.bdev_path));
                held = false;
            }
        }
        let detail = format!(
            "{} queues x depth {}{}{}",
            dev.nr_queues,
            dev.queue_depth,
            if dev.user_copy { ", user copy" } else { "" },
            match (takeover, held) {
                (true, _) => ", taken over (user recovery)",
                (false, true) => ", user recovery (state held)",
                (false, false) => "",
            }
        );
        let path = PathBuf::from(&dev.bdev_path);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if s.while_up_handing_over(&path, &name, &detail, alive, held) == Ending::HandOver {
            log::info(&format!("{} handed over; exiting without taking anything down (the kernel holds its I/O)", dev.bdev_path));
            std::process::exit(HANDED_OVER);
        }
    };
    let served = match taken_id {
        Some(id) => {
            opts.dev_id = id;
            // From here the supervisor must not give up on this process (swapon's
            // `wait_ready_line`): a successor killed between START_USER_RECOVERY and its
            // queues' first fetch leaves a device older kernels cannot recover again.
            super::session::signal_progress(args.server.ready_fd, &format!("{}\n", super::session::RECOVERING));
            compcache_ublk::recover(Arc::clone(&session.store), size, &opts, prepared, while_up).map_err(|e| refused(e.to_string()))
        }
        None => compcache_ublk::serve(Arc::clone(&session.store), size, &opts, while_up).map_err(|e| {
            let hint = if e.errno() == libc::EPERM || e.errno() == libc::EACCES { " (run as root)" } else { "" };
            Failure::new(format!("{e}{hint}"))
        }),
    };
    served
}

/// The largest request `nbd-attach` lets the kernel send: 32 swap pages, as a swap cluster
/// (ublk's largest request is 64 KiB). Swap I/O rarely merges beyond that.
const NBD_MAX_REQUEST_BYTES: u32 = 128 << 10;

pub fn run_nbd_attach(args: NbdAttachArgs) -> Result<(), Failure> {
    compcache_kernel_nbd::kernel_support()?;
    super::session::wait_if_standby(&args.server, args.takeover)?;
    let refused = |e: String| with_code(TAKEOVER_REFUSED, format!("cannot take the device over: {e}"));
    // Before any thread exists (the environment is read and cleared).
    let (state, taken) = match args.takeover {
        true => {
            let (state, record) = take_handed(FD_NBD).map_err(refused)?;
            let index = record_value::<u32>(&record, "index").map_err(refused)?;
            (Some(state), Some((index, nbd_connections(&record).map_err(refused)?)))
        }
        false => (None, None),
    };
    let taken_index = taken.map(|(index, _)| index);
    let session = Session::start_with(&args.store, &args.server, Frontend::Nbd, state)?;
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
    // Held: the state and the device's index are kept by someone who outlives us, so the
    // device is attached through netlink with a dead-connection timeout (the kernel queues its
    // I/O for a successor); else with the classic ioctls, and it dies with this process.
    let held = taken_index.is_some() || (session.store.state_fd().is_some() && crate::fdstore::holder_named());
    let mut opts = compcache_kernel_nbd::AttachOptions {
        device: taken_index.map(|i| PathBuf::from(format!("/dev/nbd{i}"))).or(args.device.clone()),
        max_request_bytes: Some(NBD_MAX_REQUEST_BYTES),
        dead_conn_timeout: held.then_some(std::time::Duration::from_secs(args.dead_conn_timeout)),
        ..Default::default()
    };
    match (taken, args.connections) {
        // The kernel replaces as many connections as the device has.
        (Some((_, n)), _) => opts.connections = n,
        (None, Some(n)) if held && n > 1 => log::warning(&format!(
            "--connections {n}: a device that can be taken over has one connection (docs/swap.md, \"Kernel NBD: the requests in flight at a kill\")"
        )),
        (None, Some(n)) => opts.connections = n,
        (None, None) => {}
    }
    if held {
        abort_on_panic();
    }
    let takeover = taken_index.is_some();
    let while_up = |a: &compcache_kernel_nbd::Attached, alive: &dyn Fn() -> bool| {
        let mut held = a.survives;
        if held && !takeover {
            let text = format!("index={}\nconnections={}\n", a.index, a.connections);
            if let Err(e) = hold(session.store.state_fd(), FD_NBD, c"compcache-nbd", &text) {
                // Attached through netlink but no one to start a successor: if this server
                // dies, its I/O fails after the dead-connection timeout.
                log::error(&format!("giving the holder the store's state: {e}; {} cannot be taken over", a.dev_path.display()));
                held = false;
            }
        }
        let detail = format!(
            "{} connection(s){}",
            a.connections,
            match (takeover, held) {
                (true, _) => ", taken over (netlink reconfigure)".to_string(),
                (false, true) => format!(", netlink, dead-connection timeout {}s (state held)", args.dead_conn_timeout),
                (false, false) => String::new(),
            }
        );
        let name = a.dev_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if session.while_up_handing_over(&a.dev_path, &name, &detail, alive, held) == Ending::HandOver {
            log::info(&format!("{} handed over; exiting without taking anything down (the kernel queues its I/O)", a.dev_path.display()));
            std::process::exit(HANDED_OVER);
        }
    };
    match takeover {
        true => compcache_kernel_nbd::reattach(server, &opts, while_up).map_err(|e| refused(e.to_string())),
        false => compcache_kernel_nbd::attach(server, &opts, while_up).map_err(Failure::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_its_memfd() {
        let fd = record_memfd(c"compcache-test-record", "dev_id=3\n").unwrap();
        let text = read_record(fd).unwrap();
        assert_eq!(record_value::<i32>(&text, "dev_id"), Ok(3));
        assert!(record_value::<u32>(&text, "index").unwrap_err().contains("index="));
        assert!(record_value::<u32>("index=x\n", "index").is_err());
    }

    #[test]
    fn an_nbd_record_names_its_connections_and_an_old_one_had_two() {
        assert_eq!(nbd_connections("index=0\nconnections=1\n"), Ok(1));
        assert_eq!(nbd_connections("index=3\n"), Ok(2));
        assert!(nbd_connections("index=0\nconnections=0\n").unwrap_err().contains("1 to 64"));
        assert!(nbd_connections("index=0\nconnections=x\n").unwrap_err().contains("connections="));
    }

    #[test]
    fn the_dead_connection_timeout_is_whole_seconds_and_never_0() {
        assert_eq!(dead_conn_secs("60"), Ok(60));
        assert_eq!(dead_conn_secs("2m"), Ok(120));
        assert!(dead_conn_secs("0").unwrap_err().contains("at once"));
        assert!(dead_conn_secs("2h").is_err());
    }

    #[test]
    fn ublk_and_nbd_hold_the_state_and_no_kernel_descriptor_fuse_its_connection() {
        assert_eq!(UBLK_HELD, [FD_STORE, FD_UBLK]);
        assert_eq!(NBD_HELD, [FD_STORE, FD_NBD]);
        // FUSE: the state is stored when the store has one (a cache has none), always before
        // these two (fuse.rs).
        assert_eq!(crate::cmd::fuse::FUSE_HELD, [crate::cmd::fuse::FD_INIT, crate::cmd::fuse::FD_FUSE]);
    }
}
