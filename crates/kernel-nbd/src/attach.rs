//! Attaching an in-process NBD server to the kernel's `/dev/nbdN`, and detaching it.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use compcache_nbd::client::{greet, info_or_go};
use compcache_nbd::wire::{FLAG_CAN_MULTI_CONN, OPT_GO};
use compcache_nbd::Server;
use thiserror::Error;

use crate::ioctl::*;
use crate::netlink::{self, Nbd};

/// How this crate's log lines start.
const WHO: &str = "compcache-kernel-nbd";

/// The block size given to the kernel: one page, the unit the store works in and swap uses.
pub const BLOCK_BYTES: u64 = 4096;

/// How long the device may take to show its size after `NBD_DO_IT` started (generous: under
/// emulation a guest kernel is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything that can stop an attach.
#[derive(Debug, Error)]
pub enum Error {
    /// The kernel has no NBD driver (or no free device); the text says what to do.
    #[error("kernel NBD is not available: {0}")]
    Unsupported(String),
    /// The in-process handshake failed: a bug in one side or the other.
    #[error("NBD handshake on connection {connection}: {message}")]
    Handshake { connection: usize, message: String },
    /// A netlink command on the device failed.
    #[error("{command} on {device}: {source}")]
    Netlink {
        command: &'static str,
        device: String,
        #[source]
        source: io::Error,
    },
    /// An ioctl on the device failed.
    #[error("{ioctl} on {device}: {source}")]
    Ioctl {
        ioctl: &'static str,
        device: String,
        #[source]
        source: io::Error,
    },
    /// Any other OS call (open, socketpair, thread spawn, sysfs).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The errno that best describes the error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Unsupported(_) => libc::ENODEV,
            Error::Handshake { .. } => libc::EPROTO,
            Error::Ioctl { source, .. } | Error::Io { source, .. } | Error::Netlink { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
        }
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

/// How to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachOptions {
    /// The device to use (`/dev/nbd3`), or `None` for the first free one.
    pub device: Option<PathBuf>,
    /// Connections (socket pairs); the kernel spreads requests over them, one hardware queue
    /// each. Default: one per CPU, at most 8. One if the server does not allow multi-conn.
    pub connections: usize,
    /// The export name to ask the server for ("" is the default export).
    pub export_name: String,
    /// Caps the kernel's requests at this many bytes (the device's `queue/max_sectors_kb`;
    /// the driver's own limit is 32 MiB, the block layer's default about 1.25 MiB), so that a
    /// swap server can hold buffers for the largest request from the start. `None`: as the
    /// kernel sets it.
    pub max_request_bytes: Option<u32>,
    /// Attach through the `nbd` generic netlink family with this dead-connection timeout, so
    /// that the device outlives this process: when its connections die the kernel queues the
    /// I/O for this long, for a successor to give it new connections ([`reattach`]), then
    /// fails it. `None`: the classic ioctls, and the device dies with the process (also the
    /// fallback, with a warning, where the kernel has no `nbd` netlink family).
    pub dead_conn_timeout: Option<Duration>,
}

impl Default for AttachOptions {
    fn default() -> Self {
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        AttachOptions {
            device: None,
            connections: cpus.clamp(1, 8),
            export_name: String::new(),
            max_request_bytes: None,
            dead_conn_timeout: None,
        }
    }
}

/// The attached device, as handed to `while_up`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub dev_path: PathBuf,
    pub index: u32,
    pub size_bytes: u64,
    pub connections: usize,
    /// The transmission flags the kernel was given.
    pub flags: u16,
    /// Attached through netlink with a dead-connection timeout: a successor can take the
    /// device over ([`reattach`]).
    pub survives: bool,
}

/// Says whether this kernel has the NBD driver, and if not, what to do.
pub fn kernel_support() -> Result<(), Error> {
    if Path::new("/sys/block/nbd0").exists() || Path::new("/dev/nbd0").exists() {
        return Ok(());
    }
    if Path::new("/sys/module/nbd").exists() {
        return Err(Error::Unsupported("nbd is loaded with nbds_max=0: reload it with nbds_max=16".into()));
    }
    Err(Error::Unsupported("no /dev/nbd0: `modprobe nbd` (CONFIG_BLK_DEV_NBD)".into()))
}

/// The first `/dev/nbdN` with no connection and no size, and its N.
pub fn find_free_device() -> Result<(PathBuf, u32), Error> {
    let mut indexes: Vec<u32> = std::fs::read_dir("/sys/block")
        .map_err(io_err("listing /sys/block"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("nbd")?.parse().ok())
        .collect();
    indexes.sort_unstable();
    for n in indexes {
        let sys = PathBuf::from(format!("/sys/block/nbd{n}"));
        let size = std::fs::read_to_string(sys.join("size")).unwrap_or_default();
        if !sys.join("pid").exists() && size.trim() == "0" {
            return Ok((PathBuf::from(format!("/dev/nbd{n}")), n));
        }
    }
    Err(Error::Unsupported("every /dev/nbdN is in use (load nbd with a larger nbds_max)".into()))
}

fn index_of(dev: &Path) -> Result<u32, Error> {
    dev.file_name()
        .and_then(|f| f.to_str()?.strip_prefix("nbd")?.parse().ok())
        .ok_or_else(|| Error::Unsupported(format!("{} is not an NBD device (/dev/nbdN)", dev.display())))
}

/// Server threads and our socket ends; dropping it closes the sockets and joins the threads,
/// on the error paths as on the normal one.
struct Connections {
    ours: Vec<UnixStream>,
    threads: Vec<JoinHandle<()>>,
    /// Server threads still serving.
    live: Arc<AtomicUsize>,
}

impl Drop for Connections {
    fn drop(&mut self) {
        for s in &self.ours {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.ours.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Connections {
    /// Opens one socket pair, serves its far end on a new thread, and runs the client side of
    /// the handshake on the near end.
    fn open(&mut self, server: &Arc<Server>, i: usize, label: &str, export: &str) -> Result<compcache_nbd::client::ExportInfo, Error> {
        let (mut ours, theirs) = UnixStream::pair().map_err(io_err("socketpair"))?;
        let srv = Arc::clone(server);
        let peer = format!("{label} connection {i}");
        let live = Arc::clone(&self.live);
        live.fetch_add(1, Ordering::SeqCst);
        let t = thread::Builder::new()
            .name(format!("nbd-conn-{i}"))
            .spawn(move || {
                srv.serve_connection(theirs, &peer);
                live.fetch_sub(1, Ordering::SeqCst);
            })
            .map_err(|e| {
                self.live.fetch_sub(1, Ordering::SeqCst);
                Error::Io { context: "spawning a server thread".into(), source: e }
            })?;
        self.threads.push(t);
        let hs = |e: compcache_nbd::client::ClientError| Error::Handshake { connection: i, message: e.to_string() };
        greet(&mut ours).map_err(hs)?;
        let info = info_or_go(&mut ours, OPT_GO, export).map_err(hs)?;
        self.ours.push(ours);
        Ok(info)
    }
}

/// Attaches `server` to a kernel NBD device and keeps it attached while `while_up` runs;
/// then disconnects it. `while_up(attached, alive)` runs on the calling thread once the
/// device has its size; `alive()` turns false if the kernel ended the connection by itself.
/// Block the signals you wait for before calling: the threads started here inherit the mask.
/// With `opts.dead_conn_timeout`, through netlink (the device outlives the process); else, or
/// where the kernel has no `nbd` netlink family (with a warning), with the classic ioctls.
pub fn attach<W>(server: Arc<Server>, opts: &AttachOptions, while_up: W) -> Result<(), Error>
where
    W: FnOnce(&Attached, &dyn Fn() -> bool),
{
    kernel_support()?;
    if opts.dead_conn_timeout.is_some() {
        match Nbd::open() {
            Ok(nl) => return attach_netlink(nl, server, opts, false, while_up),
            Err(e) => compcache_log::warning(
                WHO,
                &format!("{e}: attaching with the classic ioctls, so the device dies with this process (no takeover)"),
            ),
        }
    }
    attach_ioctl(server, opts, while_up)
}

/// Takes over `opts.device`, attached through netlink by a server that has died: gives the
/// kernel new connections to `server` in place of the dead ones (`NBD_CMD_RECONFIGURE`), then
/// serves it as [`attach`] does. `opts.connections` must be the number of connections the
/// device was made with (the kernel replaces that many; [`Attached::connections`] of the
/// first server). The kernel queued the device's I/O meanwhile (for the dead-connection
/// timeout the first server set), and sends it on the new connections; the requests the dead
/// server had been sent are sent again when the block layer's timer next fires for them
/// ([`REQUEUE_PERIOD`] on a device this crate made).
pub fn reattach<W>(server: Arc<Server>, opts: &AttachOptions, while_up: W) -> Result<(), Error>
where
    W: FnOnce(&Attached, &dyn Fn() -> bool),
{
    kernel_support()?;
    if opts.device.is_none() {
        return Err(Error::Unsupported("a takeover needs the device (/dev/nbdN)".into()));
    }
    let nl = Nbd::open().map_err(|e| Error::Unsupported(format!("{e}: a device cannot be taken over without netlink")))?;
    attach_netlink(nl, server, opts, true, while_up)
}

/// How long a successor waits for the kernel to take its new connections.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The netlink path of [`attach`] and [`reattach`].
fn attach_netlink<W>(mut nl: Nbd, server: Arc<Server>, opts: &AttachOptions, takeover: bool, while_up: W) -> Result<(), Error>
where
    W: FnOnce(&Attached, &dyn Fn() -> bool),
{
    let (dev_path, index) = match &opts.device {
        Some(p) => (p.clone(), index_of(p)?),
        None => find_free_device()?,
    };
    let name = dev_path.display().to_string();
    let nl_err = |command: &'static str| {
        let device = name.clone();
        move |source| Error::Netlink { command, device, source }
    };
    let label = format!("kernel nbd{index}");
    let mut conns = Connections { ours: Vec::new(), threads: Vec::new(), live: Arc::new(AtomicUsize::new(0)) };
    let info = conns.open(&server, 0, &label, &opts.export_name)?;
    // A new device gets one connection (module docs, "One connection"); a successor replaces
    // as many as the device was made with.
    let wanted = match takeover {
        true => opts.connections.max(1),
        false => 1,
    };
    for i in 1..wanted {
        conns.open(&server, i, &label, &opts.export_name)?;
    }
    if info.size == 0 || info.size % BLOCK_BYTES != 0 {
        return Err(Error::Unsupported(format!("export size {} is not a whole number of 4 KiB blocks", info.size)));
    }
    let fds: Vec<RawFd> = conns.ours.iter().map(|s| s.as_raw_fd()).collect();
    let dead_conn_timeout_s = opts.dead_conn_timeout.map_or(0, |d| d.as_secs().max(1));
    if takeover {
        reconnect(&mut nl, &mut conns, &server, index, &label, &opts.export_name).map_err(nl_err("NBD_CMD_RECONFIGURE"))?;
    } else {
        let cfg = netlink::Config {
            index,
            size_bytes: info.size,
            block_bytes: BLOCK_BYTES,
            server_flags: info.flags as u64,
            dead_conn_timeout_s,
        };
        nl.connect(&cfg, &fds).map_err(nl_err("NBD_CMD_CONNECT"))?;
        // The kernel holds its own reference to each socket: ours are closed, not shut down
        // (shutting one down would end the kernel's connection).
        conns.ours.clear();
    }
    let attached =
        Attached { dev_path: dev_path.clone(), index, size_bytes: info.size, connections: wanted, flags: info.flags, survives: true };
    let none_done = AtomicBool::new(false);
    let up = wait_for_size(index, &none_done);
    // A successor leaves the cap and the timer's period the first server set: the queue's
    // settings outlive the connections, and writing a sysfs knob freezes the queue, which
    // waits for every request in flight, including those the dead server had been sent.
    if up && !takeover {
        if let Some(max) = opts.max_request_bytes {
            cap_requests(index, max, &name);
        }
        set_requeue_period(index, &name);
    }
    let live = Arc::clone(&conns.live);
    let alive = || live.load(Ordering::SeqCst) > 0;
    if up {
        while_up(&attached, &alive);
    }
    // As in the ioctl path: never disconnect a device that is still swap.
    let mut waited = false;
    while alive() && listed_in_proc_swaps(&dev_path) {
        if !std::mem::replace(&mut waited, true) {
            compcache_log::warning(WHO, &format!("{name} is still swap: it stays attached until `swapoff {name}` succeeds"));
        }
        thread::sleep(Duration::from_secs(1));
    }
    // The kernel sends NBD_CMD_DISC on each connection and shuts them down: the server
    // threads end, and dropping `conns` joins them.
    if let Err(e) = nl.disconnect(index) {
        compcache_log::error(WHO, &format!("NBD_CMD_DISCONNECT on {name}: {e}"));
    }
    drop(conns);
    if !up {
        return Err(Error::Unsupported(format!("{name} did not come up within {READY_TIMEOUT:?}")));
    }
    Ok(())
}

/// Gives device `index` this process's connections in place of its dead ones, and checks that
/// the kernel took them: the kernel replaces only connections it has already found dead and
/// ignores the rest without an error, so each one it did not take (its server thread sees the
/// socket close once our descriptor is closed) is opened again and offered again, until all
/// are taken or [`RECONNECT_TIMEOUT`] passes.
fn reconnect(nl: &mut Nbd, conns: &mut Connections, server: &Arc<Server>, index: u32, label: &str, export: &str) -> io::Result<()> {
    let wanted = conns.ours.len();
    let start = Instant::now();
    let mut next = wanted;
    loop {
        let fds: Vec<RawFd> = conns.ours.iter().map(|s| s.as_raw_fd()).collect();
        nl.reconfigure(index, &fds)?;
        conns.ours.clear();
        // Long enough for a thread whose socket the kernel did not take to see it close.
        thread::sleep(Duration::from_millis(250));
        let live = conns.live.load(Ordering::SeqCst);
        if live >= wanted {
            return Ok(());
        }
        if start.elapsed() > RECONNECT_TIMEOUT {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the kernel took {live} of {wanted} connections within {RECONNECT_TIMEOUT:?} (are the old ones dead?)"),
            ));
        }
        for _ in live..wanted {
            conns.open(server, next, label, export).map_err(|e| io::Error::other(e.to_string()))?;
            next += 1;
        }
    }
}

/// How often the block layer's timer looks at a request in flight on a device attached
/// through netlink (its `queue/io_timeout`). With one connection and no request timeout (the
/// kernel's "timeout=0": module docs, "One connection") the timer never fails a request and
/// never cuts a live connection: it logs "Possible stuck request" and, if the connection the
/// request was sent on has been replaced since (a successor reconnected), sends it again on
/// the new one. So it bounds how long the requests a dead server had read wait after a
/// successor reconnects (the default period is 30 s).
pub const REQUEUE_PERIOD: Duration = Duration::from_secs(2);

/// Sets the device's timer period to [`REQUEUE_PERIOD`]; a failure is a warning (the requests
/// a dead server had read then wait for the kernel's default period, 30 s).
fn set_requeue_period(index: u32, name: &str) {
    let knob = format!("/sys/block/nbd{index}/queue/io_timeout");
    if let Err(e) = std::fs::write(&knob, format!("{}\n", REQUEUE_PERIOD.as_millis())) {
        compcache_log::warning(
            WHO,
            &format!(
                "cannot set {name}'s request timer to {REQUEUE_PERIOD:?} ({knob}: {e}); after a takeover the requests the dead server had read wait up to 30 s"
            ),
        );
    }
}

/// Caps the kernel's requests at `max` bytes: no request larger than this comes.
fn cap_requests(index: u32, max: u32, name: &str) {
    let knob = format!("/sys/block/nbd{index}/queue/max_sectors_kb");
    if let Err(e) = std::fs::write(&knob, format!("{}\n", (max / 1024).max(4))) {
        compcache_log::warning(
            WHO,
            &format!("cannot cap {name}'s requests at {max} bytes ({knob}: {e}); larger requests are served with buffers grown on demand"),
        );
    }
}

/// The classic ioctl path of [`attach`]: `NBD_DO_IT` on a thread of its own; the device dies
/// with the process.
fn attach_ioctl<W>(server: Arc<Server>, opts: &AttachOptions, while_up: W) -> Result<(), Error>
where
    W: FnOnce(&Attached, &dyn Fn() -> bool),
{
    let (dev_path, index) = match &opts.device {
        Some(p) => (p.clone(), index_of(p)?),
        None => find_free_device()?,
    };
    let name = dev_path.display().to_string();
    let ioctl_err = |ioctl: &'static str| {
        let device = name.clone();
        move |source| Error::Ioctl { ioctl, device, source }
    };
    let dev = OpenOptions::new().read(true).write(true).open(&dev_path).map_err(io_err(format!("opening {name}")))?;

    let label = format!("kernel nbd{index}");
    let mut conns = Connections { ours: Vec::new(), threads: Vec::new(), live: Arc::new(AtomicUsize::new(0)) };
    let info = conns.open(&server, 0, &label, &opts.export_name)?;
    let wanted = if info.flags & FLAG_CAN_MULTI_CONN != 0 { opts.connections.max(1) } else { 1 };
    for i in 1..wanted {
        conns.open(&server, i, &label, &opts.export_name)?;
    }
    if info.size == 0 || info.size % BLOCK_BYTES != 0 {
        return Err(Error::Unsupported(format!("export size {} is not a whole number of 4 KiB blocks", info.size)));
    }

    nbd_ioctl(&dev, NBD_SET_BLKSIZE, BLOCK_BYTES as libc::c_ulong).map_err(ioctl_err("NBD_SET_BLKSIZE"))?;
    nbd_ioctl(&dev, NBD_SET_SIZE_BLOCKS, (info.size / BLOCK_BYTES) as libc::c_ulong).map_err(ioctl_err("NBD_SET_SIZE_BLOCKS"))?;
    // A left-over socket from a dead attacher would make NBD_SET_SOCK fail; there is none on
    // a free device, so an error here means nothing.
    let _ = nbd_ioctl(&dev, NBD_CLEAR_SOCK, 0);
    nbd_ioctl(&dev, NBD_SET_FLAGS, info.flags as libc::c_ulong).map_err(ioctl_err("NBD_SET_FLAGS"))?;
    // No NBD_SET_TIMEOUT: with one connection a request waits for the server however long it
    // takes (the server is this process, and a slow reply under memory pressure is not a dead
    // server); with more, the kernel's timer still sends a request older than 30 s again on
    // another connection (module docs, "One connection"). A dead server closes its sockets,
    // which fails the requests at once.
    for s in &conns.ours {
        nbd_ioctl(&dev, NBD_SET_SOCK, s.as_raw_fd() as libc::c_ulong).map_err(ioctl_err("NBD_SET_SOCK"))?;
    }

    let dev = Arc::new(dev);
    let done = Arc::new(AtomicBool::new(false));
    let doit = {
        let dev = Arc::clone(&dev);
        let done = Arc::clone(&done);
        thread::Builder::new()
            .name("nbd-do-it".into())
            .spawn(move || {
                let r = nbd_ioctl(&*dev, NBD_DO_IT, 0);
                done.store(true, Ordering::SeqCst);
                let _ = nbd_ioctl(&*dev, NBD_CLEAR_QUE, 0);
                let _ = nbd_ioctl(&*dev, NBD_CLEAR_SOCK, 0);
                r
            })
            .map_err(io_err("spawning the NBD_DO_IT thread"))?
    };

    let attached = Attached {
        dev_path: dev_path.clone(),
        index,
        size_bytes: info.size,
        connections: conns.ours.len(),
        flags: info.flags,
        survives: false,
    };
    let up = wait_for_size(index, &done);
    if let (true, Some(max)) = (up, opts.max_request_bytes) {
        // Before `while_up` (which puts the device to use): no request larger than this comes.
        cap_requests(index, max, &name);
    }
    if up {
        let alive = || !done.load(Ordering::SeqCst);
        while_up(&attached, &alive);
    }
    // `while_up` must return only once the device is out of swap use; if it did not (a bug in
    // the caller), the device stays attached and served until it is: disconnecting swap loses
    // every page swapped out to it.
    let mut waited = false;
    while !done.load(Ordering::SeqCst) && listed_in_proc_swaps(&dev_path) {
        if !std::mem::replace(&mut waited, true) {
            compcache_log::warning(WHO, &format!("{name} is still swap: it stays attached until `swapoff {name}` succeeds"));
        }
        thread::sleep(Duration::from_secs(1));
    }
    if !done.load(Ordering::SeqCst) {
        if let Err(e) = nbd_ioctl(&*dev, NBD_DISCONNECT, 0) {
            compcache_log::error(WHO, &format!("NBD_DISCONNECT on {name}: {e}"));
        }
    }
    let ran = doit.join().unwrap_or_else(|_| Err(io::Error::other("NBD_DO_IT thread panicked")));
    drop(conns);
    if !up {
        return Err(match ran {
            Err(source) => Error::Ioctl { ioctl: "NBD_DO_IT", device: name, source },
            Ok(()) => Error::Unsupported(format!("{name} did not come up within {READY_TIMEOUT:?}")),
        });
    }
    // NBD_DO_IT returns an error after a disconnect on some kernels; the device is gone either way.
    Ok(())
}

/// Whether the kernel swaps to `dev` (by device number or name); "yes" when /proc/swaps
/// cannot be read, since the answer decides whether the device may go.
fn listed_in_proc_swaps(dev: &Path) -> bool {
    std::fs::read_to_string("/proc/swaps").map_or(true, |text| swaps_name(&text, dev))
}

fn swaps_name(swaps: &str, dev: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let rdev = |p: &Path| std::fs::metadata(p).ok().filter(|m| m.file_type().is_block_device()).map(|m| m.rdev());
    let want = rdev(dev);
    swaps.lines().skip(1).filter_map(|l| l.split_whitespace().next()).any(|name| {
        let name = name.replace("\\040", " ");
        Path::new(&name) == dev || (want.is_some() && rdev(Path::new(&name)) == want)
    })
}

/// Waits until `/sys/block/nbdN/size` is non-zero (the kernel sets the capacity once
/// `NBD_DO_IT` has started the device), or `NBD_DO_IT` has already returned.
fn wait_for_size(index: u32, done: &AtomicBool) -> bool {
    let path = format!("/sys/block/nbd{index}/size");
    let start = Instant::now();
    while start.elapsed() < READY_TIMEOUT {
        if done.load(Ordering::SeqCst) {
            return false;
        }
        let sectors: u64 = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        if sectors > 0 {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_listed_as_swap_is_kept() {
        let swaps = "Filename Type Size Used Priority\n/dev/nbd3 partition 1024 0 100\n";
        assert!(swaps_name(swaps, Path::new("/dev/nbd3")));
        assert!(!swaps_name(swaps, Path::new("/dev/nbd1")));
        assert!(!swaps_name("Filename Type Size Used Priority\n", Path::new("/dev/nbd3")));
    }

    #[test]
    fn device_names_parse() {
        assert_eq!(index_of(Path::new("/dev/nbd7")).unwrap(), 7);
        assert!(index_of(Path::new("/dev/sda")).is_err());
    }

    #[test]
    fn free_device_or_a_reason() {
        // On a kernel without nbd.ko (this project's build machine) this says why; in the VM
        // guest it finds /dev/nbd0.
        match kernel_support() {
            Ok(()) => {
                let (p, n) = find_free_device().expect("nbd loaded but no free device");
                assert!(p.to_str().unwrap().ends_with(&n.to_string()));
            }
            Err(e) => eprintln!("skipped: {e}"),
        }
    }
}
