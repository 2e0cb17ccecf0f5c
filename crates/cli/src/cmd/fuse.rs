//! `compcache fuse`: the compressed RAM device as a file on a FUSE mount, attached to a loop
//! device, for kernels with FUSE and loop but neither ublk nor nbd.ko. The server that
//! `compcache swapon --frontend fuse` starts; it can be run by hand too.
//!
//! Up: the swap server's guarantees (memory locked, I/O flusher, OOM-exempt, a reserve; see
//! `process::pin_swap_server` and `reserve`), then the store is mounted as
//! `/run/compcache/fuse-<pid>/device` (a directory of mode 0700), attached with
//! `losetup --find --direct-io=on --sector-size 4096` (buffered, with a log line, if the
//! kernel refuses direct I/O), and "READY /dev/loopN" goes to `--ready-fd`.
//!
//! Down, on SIGINT/SIGTERM/SIGHUP: as for ublk and nbd (`session.rs`'s `Session`, which this
//! server shares): if the loop device is still swap, swapoff first, and while that fails the
//! server keeps serving and retries (a device still in swap use is never torn down); the final
//! statistics are written. Then the loop device is detached, the filesystem unmounted once
//! the loop driver has let go of the file, the directory removed, and the backing device (if
//! any) emptied. A start refused before the device is up removes a backing file it created.
//!
//! Supervised (docs/swap.md, "When the server dies"): when a holder is named (`NOTIFY_SOCKET`:
//! swapon's supervisor, `compcache supervise`, or systemd) and the store's state outlives the
//! process (`Store::state_fd`), the server first gives the holder the state's descriptor
//! (`compcache-store`), a record of the mount (`compcache-fuse-init`: what INIT agreed, the
//! mount directory) and every `/dev/fuse` descriptor it will read requests from
//! (`compcache-fuse`), then serves (`compcache_fuse::mount_held`). A successor is started with
//! `--takeover` and those descriptors (`LISTEN_FDS`): it recovers the store, serves the same
//! connection (`compcache_fuse::take_over`, which has the kernel send the requests in flight
//! again), finds the loop device on the file, and from then on is the server: its stop takes
//! everything down as the first one's would. A cache (`--origin`) has no state to keep but
//! needs none: every acknowledged write is on the origin (write-through), so it stores the
//! record and the connection only, and its successor serves them with an empty cache over the
//! same origin (the cached pages are dropped; they are read from the origin again). SIGUSR2 (`compcache restart`) hands over: stop
//! taking requests, answer those in flight, exit with `HANDED_OVER` without taking anything
//! down. A panic aborts the process, so that the supervisor sees it die.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::session::{Ending, ServerArgs, Session};
use crate::failure::{with_code, Failure, HANDED_OVER, TAKEOVER_REFUSED};
use crate::frontend::Frontend;
use crate::log;
use crate::store_args::StoreArgs;

/// How long a server handing over waits for the requests in flight to be answered.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the loop driver may take to let go of the file after `losetup -d`.
const DETACH_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve a compressed RAM block device as a file on a FUSE mount, attached to a loop device
/// (/dev/loopN): for kernels without ublk or nbd.
#[derive(clap::Args, Debug)]
pub struct FuseArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub server: ServerArgs,
    /// Threads serving FUSE requests, each with its own /dev/fuse descriptor [default: one
    /// per CPU].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// After answering a request, a serving thread polls for the next one for this many
    /// microseconds, at idle priority, before it sleeps (one thread at a time; 0: never poll).
    /// Meant to save the wake-up of a sleeping thread while requests keep arriving; on a
    /// loaded 2-CPU machine it made reads slower (docs/swap.md), so it is off by default.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = compcache_fuse::DEFAULT_SPIN.as_micros() as u64)]
    pub spin_us: u64,
    /// Attach no loop device: serve the file only ("READY <file>"); for tests and benchmarks.
    #[arg(long)]
    pub no_loop: bool,
    /// Carry requests through FUSE over io_uring (Linux 6.14+) when the kernel offers it
    /// (/sys/module/fuse/parameters/enable_uring = Y), else the classic /dev/fuse protocol;
    /// the log line "fuse transport" says which.
    #[arg(long)]
    pub io_uring: bool,
    /// Take over the device whose descriptors are handed to this process (LISTEN_FDS, from
    /// swapon's supervisor or systemd's file descriptor store) instead of making a new one.
    #[arg(long, hide = true)]
    pub takeover: bool,
}

/// The names the server's descriptors are stored under.
pub const FD_STORE: &str = "compcache-store";
pub const FD_INIT: &str = "compcache-fuse-init";
pub const FD_FUSE: &str = "compcache-fuse";
/// What a holder must keep for a FUSE successor (the supervisor's `SERVERS`): the store's state
/// (`FD_STORE`) too when the store has one, which the server stores before these; a cache has
/// none.
pub const FUSE_HELD: &[&str] = &[FD_INIT, FD_FUSE];

/// What a successor gets: the store's state (none for a cache), the mount's record, the
/// connection's descriptors.
struct Handed {
    state: Option<OwnedFd>,
    negotiated: compcache_fuse::Negotiated,
    dir: PathBuf,
    fuse: Vec<OwnedFd>,
}

impl Handed {
    /// The descriptors handed to this process, sorted by name; the error is one line.
    fn take() -> Result<Handed, String> {
        let fds = crate::fdstore::handed(false).map_err(|e| format!("the handed descriptors: {e}"))?;
        let (mut state, mut record, mut fuse) = (None, None, Vec::new());
        for (name, fd) in fds {
            match name.as_str() {
                FD_STORE => state = Some(fd),
                FD_INIT => record = Some(fd),
                FD_FUSE => fuse.push(fd),
                crate::metrics::FD_METRICS_LISTEN => crate::metrics::adopt_handed(fd).unwrap_or_else(|e| crate::log::warning(&e)),
                // Another program's, or a later version's: not ours to use.
                _ => {}
            }
        }
        let record = record.ok_or_else(|| format!("no {FD_INIT} descriptor was handed over"))?;
        let text = read_record(record)?;
        let mut lines = text.lines();
        let negotiated = compcache_fuse::Negotiated::parse(lines.next().unwrap_or_default())?;
        let dir = lines.find_map(|l| l.strip_prefix("dir=")).map(PathBuf::from).ok_or("the FUSE record has no dir= line")?;
        Ok(Handed { state, negotiated, dir, fuse })
    }
}

/// The mount's record for a successor: what INIT agreed and the mount directory, in a memfd.
fn make_record(negotiated: &compcache_fuse::Negotiated, dir: &Path) -> std::io::Result<OwnedFd> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a NUL-terminated name and flags; returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"compcache-fuse-init".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    writeln!(f, "{}\ndir={}", negotiated.to_line(), dir.display())?;
    Ok(f.into())
}

fn read_record(fd: OwnedFd) -> Result<String, String> {
    let mut buf = [0u8; 4096];
    // SAFETY: pread into a live local buffer of its length; the offset is not moved, so every
    // holder of the description reads the record whole.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(format!("reading the FUSE record: {}", std::io::Error::last_os_error()));
    }
    Ok(String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

/// The mount directory a stored `compcache-fuse-init` record names (a supervisor handed
/// descriptors by systemd finds its device by it).
pub fn record_dir(fd: std::os::fd::BorrowedFd<'_>) -> Result<PathBuf, String> {
    let text = read_record(fd.try_clone_to_owned().map_err(|e| e.to_string())?)?;
    text.lines().find_map(|l| l.strip_prefix("dir=")).map(PathBuf::from).ok_or_else(|| "the FUSE record has no dir= line".into())
}

/// The loop device whose backing file is `file` (a successor finds its predecessor's so).
fn loop_on(file: &Path) -> Option<PathBuf> {
    let want = file.to_string_lossy().into_owned();
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("loop")).find_map(|n| {
        let backing = std::fs::read_to_string(format!("/sys/block/{n}/loop/backing_file")).ok()?;
        (backing.trim() == want).then(|| PathBuf::from(format!("/dev/{n}")))
    })
}

/// A private directory for the mount: /run/compcache/fuse-<pid>, mode 0700.
fn make_mount_dir() -> Result<PathBuf, Failure> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = PathBuf::from(format!("/run/compcache/fuse-{}", std::process::id()));
    std::fs::create_dir_all("/run/compcache").map_err(|e| Failure::new(format!("/run/compcache: {e}")))?;
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| Failure::new(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// A loop device attached to the file.
struct Loop {
    dev: PathBuf,
    direct_io: bool,
}

impl Loop {
    /// `losetup --find --show --direct-io=on --sector-size 4096 FILE`; without direct I/O if
    /// that fails (logged). Whether the kernel really runs it with direct I/O is read back from
    /// sysfs (losetup may attach and only warn).
    fn attach(file: &Path) -> Result<Loop, Failure> {
        let run = |dio: bool| -> Result<PathBuf, String> {
            let mut c = Command::new("losetup");
            c.args(["--find", "--show", "--sector-size", "4096"]);
            if dio {
                c.arg("--direct-io=on");
            }
            let out = c.arg(file).output().map_err(|e| format!("running losetup: {e}"))?;
            if !out.status.success() {
                return Err(format!("losetup: {}", String::from_utf8_lossy(&out.stderr).trim()));
            }
            Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        };
        let dev = match run(true) {
            Ok(dev) => dev,
            Err(e) => {
                log::warning(&format!("direct I/O refused ({e}); attaching the loop device buffered"));
                run(false).map_err(Failure::new)?
            }
        };
        let direct_io = std::fs::read_to_string(Self::sys(&dev, "dio")).is_ok_and(|s| s.trim() == "1");
        if !direct_io {
            log::warning(&format!("{} runs without direct I/O (buffered through the page cache)", dev.display()));
        }
        Ok(Loop { dev, direct_io })
    }

    fn sys(dev: &Path, attr: &str) -> PathBuf {
        let name = dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        PathBuf::from(format!("/sys/block/{name}/loop/{attr}"))
    }

    /// Whether the loop driver still holds the backing file.
    fn attached(dev: &Path) -> bool {
        Self::sys(dev, "backing_file").exists()
    }

    /// `losetup -d`, then waits until the driver has let go of the file (a detach is
    /// deferred while the device is open).
    fn detach(&self) -> Result<(), String> {
        let out = Command::new("losetup").arg("-d").arg(&self.dev).output().map_err(|e| format!("running losetup -d: {e}"))?;
        if !out.status.success() && Self::attached(&self.dev) {
            return Err(format!("losetup -d {}: {}", self.dev.display(), String::from_utf8_lossy(&out.stderr).trim()));
        }
        let start = Instant::now();
        while Self::attached(&self.dev) {
            if start.elapsed() > DETACH_TIMEOUT {
                return Err(format!("{} still holds the file after {DETACH_TIMEOUT:?} (open by someone?)", self.dev.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// Unmounts, retrying while the file is still busy (the loop driver drops its reference
/// asynchronously), then lazily with a warning.
fn unmount(m: &compcache_fuse::Mounted) {
    let start = Instant::now();
    loop {
        match m.unmount(false) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::ENOENT) => return, // unmounted already
            Err(e) => {
                log::error(&format!("unmounting {}: {e}; detaching it lazily (users of the file will see errors)", m.dir.display()));
                let _ = m.unmount(true);
                return;
            }
        }
    }
}

pub fn run_fuse(args: FuseArgs) -> Result<(), Failure> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::new("compcache fuse needs root (mount, losetup, mlock)"));
    }
    crate::frontend::fuse_kernel_support().map_err(Failure::new)?;
    super::session::wait_if_standby(&args.server, args.takeover)?;
    // Before any thread exists (the environment is read and cleared).
    let handed = match args.takeover {
        true => Some(Handed::take().map_err(|e| with_code(TAKEOVER_REFUSED, format!("cannot take the device over: {e}")))?),
        false => None,
    };
    let (state, handed) = match handed {
        // A cache's successor starts with an empty cache (every acknowledged write is on the
        // origin: write-through); any other store must be handed its state.
        Some(h) if h.state.is_none() && args.store.origin.is_none() => {
            return Err(with_code(TAKEOVER_REFUSED, format!("cannot take the device over: no {FD_STORE} descriptor was handed over")))
        }
        Some(h) => (h.state, Some((h.negotiated, h.dir, h.fuse))),
        None => (None, None),
    };
    let session = Session::start_with(&args.store, &args.server, Frontend::Fuse, state)?;
    let store = Arc::clone(&session.store);
    let mut opts = compcache_fuse::Options::default();
    if let Some(t) = args.threads {
        opts.threads = t.max(1);
    }
    opts.io_uring = args.io_uring;
    opts.spin = Duration::from_micros(args.spin_us);
    // Held: every descriptor the connection is served on is kept by someone who outlives us.
    let mut held = handed.is_some();
    let (mounted, dir) = match handed {
        Some((negotiated, dir, fuse)) => {
            let taken = compcache_fuse::take_over(Arc::clone(&store), &dir, fuse, negotiated, &opts)
                .map_err(|e| with_code(TAKEOVER_REFUSED, format!("cannot take the device over: serving {}: {e}", dir.display())))?;
            match &taken.resend {
                Ok(()) => log::info("took the FUSE connection over; the kernel sent the requests in flight again (FUSE_NOTIFY_RESEND)"),
                Err(e) => log::error(&format!(
                    "took the FUSE connection over, but the kernel refused FUSE_NOTIFY_RESEND ({e}; it needs Linux 6.9): \
                     the requests the dead server had read are lost, and the tasks waiting for them hang"
                )),
            }
            (taken.mounted, dir)
        }
        None => {
            let dir = make_mount_dir()?;
            // A cache survives without its state: its successor starts empty over the origin.
            let survives = (store.state_fd().is_some() || store.is_cache()) && crate::fdstore::holder_named();
            let mounted = if survives {
                held = true;
                let state = store.state_fd();
                let mut hold = |h: &compcache_fuse::Held<'_>| -> std::io::Result<()> {
                    let record = make_record(&h.negotiated, &dir)?;
                    crate::fdstore::store(FD_STORE, &state.into_iter().collect::<Vec<_>>())?;
                    crate::fdstore::store(FD_INIT, &[record.as_fd()])?;
                    crate::fdstore::store(FD_FUSE, &h.fds)?;
                    Ok(())
                };
                compcache_fuse::mount_held(Arc::clone(&store), &dir, &opts, &mut hold)
            } else {
                compcache_fuse::mount(Arc::clone(&store), &dir, &opts)
            };
            match mounted {
                Ok(m) => (m, dir),
                Err(e) => {
                    let _ = std::fs::remove_dir(&dir);
                    return Err(Failure::new(format!("mounting the FUSE filesystem on {}: {e}", dir.display())));
                }
            }
        }
    };
    if held {
        // A panicking thread would leave its request unanswered with the process alive: die
        // instead, for the supervisor to start a successor.
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            std::process::abort();
        }));
    }
    let adopted = if args.takeover && !args.no_loop { loop_on(&mounted.file) } else { None };
    let lo = if args.no_loop {
        None
    } else if let Some(dev) = adopted {
        let direct_io = std::fs::read_to_string(Loop::sys(&dev, "dio")).is_ok_and(|s| s.trim() == "1");
        Some(Loop { dev, direct_io })
    } else {
        match Loop::attach(&mounted.file) {
            Ok(l) => Some(l),
            Err(e) => {
                unmount(&mounted);
                let _ = mounted.join();
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        }
    };
    let dev = lo.as_ref().map_or(mounted.file.clone(), |l| l.dev.clone());
    log::info(&format!("fuse transport: {}", mounted.transport));
    let detail = format!(
        "file {}, {} thread(s) (spin {} us), requests through {}{}",
        mounted.file.display(),
        opts.threads,
        args.spin_us,
        mounted.transport,
        lo.as_ref().map_or(String::new(), |l| if l.direct_io { ", loop with direct I/O".into() } else { ", loop buffered".into() }),
    );
    let alive = || mounted.alive() && lo.as_ref().is_none_or(|l| Loop::attached(&l.dev));
    // Announces the device, serves `compcache stat`, waits for a stop signal, takes the
    // device out of swap use (retrying while swapoff fails) and writes the final statistics.
    let name = match &lo {
        Some(l) => l.dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        // The mount directory's (`fuse-<pid of the first server>`): a successor keeps the name,
        // and so the control socket's path.
        None => dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    };
    if session.while_up_handing_over(&dev, &name, &detail, &alive, held) == Ending::HandOver {
        let answered = mounted.hand_over(HANDOVER_TIMEOUT);
        if !answered {
            log::warning(&format!("requests still in flight after {HANDOVER_TIMEOUT:?}: the successor gets them again"));
        }
        log::info(&format!("{} handed over; exiting without taking anything down", dev.display()));
        // Nothing is dropped: the store's state, the mount, the loop device and the backing
        // device are the successor's.
        std::process::exit(HANDED_OVER);
    }
    if let Some(l) = &lo {
        if let Err(e) = l.detach() {
            log::error(&e);
        }
    }
    unmount(&mounted);
    if let Some(n) = mounted.uring_served() {
        log::info(&format!("fuse transport: {n} requests answered through io_uring"));
    }
    if let Err(e) = mounted.join() {
        log::error(&format!("the FUSE session ended with: {e}"));
    }
    let _ = std::fs::remove_dir(&dir);
    // Dropping the session empties the backing device (no page data outlives the server).
    drop(session);
    Ok(())
}
