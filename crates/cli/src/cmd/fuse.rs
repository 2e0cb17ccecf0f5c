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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::session::{ServerArgs, Session};
use crate::failure::Failure;
use crate::frontend::Frontend;
use crate::log;
use crate::store_args::StoreArgs;

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
    let session = Session::start(&args.store, &args.server, Frontend::Fuse)?;
    let store = Arc::clone(&session.store);
    let dir = make_mount_dir()?;
    let mut opts = compcache_fuse::Options::default();
    if let Some(t) = args.threads {
        opts.threads = t.max(1);
    }
    opts.io_uring = args.io_uring;
    opts.spin = Duration::from_micros(args.spin_us);
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
        None => format!("fuse-{}", std::process::id()),
    };
    session.while_up_named(&dev, &name, &detail, &alive);
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
