//! `compcache fuse`: the compressed RAM device as a file on a FUSE mount, attached to a loop
//! device, for kernels with FUSE and loop but neither ublk nor nbd.ko. The server that
//! `compcache swapon --frontend fuse` starts; it can be run by hand too.
//!
//! Up: the swap server's guarantees (memory locked, I/O flusher, OOM-exempt, a reserve; see
//! `swapdev::pin_server_memory` and `reserve`), then the store is mounted as
//! `/run/compcache/fuse-<pid>/device` (a directory of mode 0700), attached with
//! `losetup --find --direct-io=on --sector-size 4096` (buffered, with a log line, if the
//! kernel refuses direct I/O), and "READY /dev/loopN" goes to `--ready-fd`.
//!
//! Down, on SIGINT/SIGTERM/SIGHUP: if the loop device is still swap, swapoff first; if that
//! fails the server keeps serving (a device still in swap use is never torn down) and waits
//! for the next signal. Then the loop device is detached, the filesystem unmounted once the
//! loop driver has let go of the file, the directory removed, the final statistics written.
//!
//! (The store set-up repeats `device.rs`'s private `Session::start`, which is being changed
//! at the same time; the two should share it.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use compcache_nbd::control::{self, ControlState, DeviceInfo};
use compcache_store::{parse_size, physical_ram_bytes, Config, Store};

use super::device::{ServerArgs, StoreArgs};
use super::reserve;
use super::swapdev::{is_active_swap, lock_future_mappings, pin_server_memory, signal_ready, swapoff, StopSignals};
use crate::backing::spawn_writeback;
use crate::failure::Failure;
use crate::units::human;

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
    /// Attach no loop device: serve the file only ("READY <file>"); for tests and benchmarks.
    #[arg(long)]
    pub no_loop: bool,
}

/// The store with the swap server's guarantees around it, as `device.rs` makes it.
fn start_store(store_args: &StoreArgs, server: &ServerArgs) -> Result<(Arc<Store>, Config), Failure> {
    pin_server_memory(!server.no_mlock)?;
    let cfg = store_args.config()?;
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
    if store.has_backing() {
        spawn_writeback(Arc::clone(&store)).map_err(|e| Failure::new(format!("starting the writeback thread: {e}")))?;
    }
    Ok((store, cfg))
}

/// Whether this machine can run the FUSE front end (FUSE, loop, losetup), loading the
/// modules if needed; the error says what is missing.
pub fn kernel_support() -> Result<(), String> {
    let modprobe = |m: &str| {
        let _ = Command::new("modprobe").args(["-q", m]).status();
    };
    if compcache_fuse::kernel_support().is_err() {
        modprobe("fuse");
    }
    compcache_fuse::kernel_support()?;
    if !Path::new("/dev/loop-control").exists() {
        modprobe("loop");
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("no loop devices: no /dev/loop-control (modprobe loop; CONFIG_BLK_DEV_LOOP)".into());
    }
    match Command::new("losetup").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("no losetup (util-linux; apt-get install mount)".into()),
    }
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
                eprintln!("compcache: direct I/O refused ({e}); attaching the loop device buffered");
                run(false).map_err(Failure::new)?
            }
        };
        let direct_io = std::fs::read_to_string(Self::sys(&dev, "dio")).is_ok_and(|s| s.trim() == "1");
        if !direct_io {
            eprintln!("compcache: {} runs without direct I/O (buffered through the page cache)", dev.display());
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
                eprintln!("compcache: unmounting {}: {e}; detaching it lazily (users of the file will see errors)", m.dir.display());
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
    kernel_support().map_err(Failure::new)?;
    // Before any thread exists: every thread inherits the blocked mask and the flags.
    let signals = StopSignals::block()?;
    let (store, cfg) = start_store(&args.store, &args.server)?;
    let dir = make_mount_dir()?;
    let mut opts = compcache_fuse::Options::default();
    if let Some(t) = args.threads {
        opts.threads = t.max(1);
    }
    let mounted = match compcache_fuse::mount(Arc::clone(&store), &dir, &opts) {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_dir(&dir);
            return Err(Failure::new(format!("mounting the FUSE filesystem on {}: {e}", dir.display())));
        }
    };
    let lo = if args.no_loop {
        None
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
    let name = match &lo {
        Some(l) => l.dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        None => format!("fuse-{}", std::process::id()),
    };
    let ctl = PathBuf::from(format!("/run/compcache/{name}.ctl"));
    let _ = std::fs::remove_file(&ctl);
    match control::bind(&ctl) {
        Ok(listener) => {
            let state = Arc::new(ControlState {
                store: Arc::clone(&store),
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
        "compcache: {} is up: fuse, {} {}{}{}, file {}, {} thread(s){}; control {}; pid {}",
        dev.display(),
        human(cfg.disksize_bytes),
        cfg.algorithm,
        if cfg.mem_limit_bytes > 0 { format!(", mem-limit {}", human(cfg.mem_limit_bytes)) } else { String::new() },
        cfg.backing.as_ref().map_or(String::new(), |b| format!(", backing {}", b.path.display())),
        mounted.file.display(),
        opts.threads,
        lo.as_ref().map_or(String::new(), |l| if l.direct_io { ", loop with direct I/O".into() } else { ", loop buffered".into() }),
        ctl.display(),
        std::process::id()
    );
    signal_ready(args.server.ready_fd, &format!("READY {}\n", dev.display()));

    let alive = || mounted.alive() && lo.as_ref().map_or(true, |l| Loop::attached(&l.dev));
    loop {
        let signalled = match signals.wait(&alive) {
            Some(sig) => {
                eprintln!("compcache: signal {sig}: removing {}", dev.display());
                true
            }
            None => {
                eprintln!("compcache: {} was detached or unmounted by another program", dev.display());
                false
            }
        };
        if !is_active_swap(&dev) {
            break;
        }
        eprintln!("compcache: {} is swap: swapoff first (reads every page back)", dev.display());
        match swapoff(&dev) {
            Ok(()) => break,
            // Never tear down a device the kernel still swaps to while it can still be
            // served: its pages would be lost.
            Err(e) if signalled => eprintln!("compcache: {e}; {} is still swap, so it stays up: free memory and stop again", dev.display()),
            Err(e) => {
                eprintln!("compcache: {e}; the device can no longer be served");
                break;
            }
        }
    }
    if let Some(l) = &lo {
        if let Err(e) = l.detach() {
            eprintln!("compcache: {e}");
        }
    }
    unmount(&mounted);
    if let Err(e) = mounted.join() {
        eprintln!("compcache: the FUSE session ended with: {e}");
    }
    let _ = std::fs::remove_dir(&dir);
    let _ = std::fs::remove_file(&ctl);
    let stats = serde_json::to_value(store.stats()).unwrap_or_default();
    eprintln!("compcache: final statistics of {name}: {stats}");
    if let Some(sd) = &args.server.stats_dir {
        let path = sd.join(format!("{name}.stats.json"));
        if let Err(e) = std::fs::create_dir_all(sd).and_then(|_| std::fs::write(&path, format!("{stats:#}\n"))) {
            eprintln!("compcache: {}: {e}", path.display());
        }
    }
    Ok(())
}
