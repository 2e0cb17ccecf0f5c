//! # compcache-fuse
//!
//! The FUSE front end: serves a [`compcache_store::Store`] as one regular file,
//! `<mountpoint>/device`, of the device's size, on a FUSE mount; `compcache fuse` attaches it
//! to a loop device (`losetup --direct-io=on --sector-size 4096`) for the kernel to swap to.
//! For kernels with FUSE and loop but neither ublk nor nbd.ko. Built on the `fuser` crate
//! (0.18, pure-Rust mount: `mount(2)` as root, else `fusermount3`; no libfuse linked).
//!
//! One job per file:
//! - [`request`]: decoding and validating one read, write, fallocate, fsync or flush, and
//!   the one `match` that turns it into a store call (pure: unit-tested without a mount);
//! - [`fs`]: the filesystem (a directory with one file), its per-thread workers, and what
//!   it declares to the kernel at INIT;
//! - [`uring`]: the FUSE-over-io_uring transport (Linux 6.14+), used instead of `/dev/fuse`
//!   reads and writes when [`Options::io_uring`] asks for it and the kernel offers it, and
//!   [`abi`], the kernel structures it reads and writes;
//! - this file: mounting, serving on several threads, unmounting.
//!
//! ## What the I/O path allocates
//! fuser 0.18 (read in its source, `session.rs`, `request.rs`, `reply.rs`, `channel.rs`):
//! - each event-loop thread allocates one request buffer of 16 MiB + 4 KiB when it starts
//!   (`FuseReadBuf`, sized for fuser's largest `max_write`, whatever we declare) and reuses
//!   it for every request; under the server's `mlockall(MCL_FUTURE)` it is populated and
//!   locked when made: 16 MiB of locked memory per thread, none per request;
//! - parsing a request borrows from that buffer (a write's data is a slice of it); a reply
//!   is one `writev` of a header on the stack and our data slice (`ResponseSlice`), and the
//!   reply's channel is an `Arc` clone: no heap allocation per request;
//! - its `debug!`/`warn!` logging formats only if a logger is installed (we install none).
//!
//! Ours: each request takes a [`fs::Worker`] (compression context and read buffer), made
//! when the filesystem is created, from a fixed set ([`fs::Workers`]): nothing per request.
//!
//! ## Threads
//! `Options::threads` event loops (fuser's `Config::n_threads`), each with its own
//! `/dev/fuse` descriptor cloned with `FUSE_DEV_IOC_CLONE` (`clone_fd`), so the kernel hands
//! requests to several threads at once; the filesystem's methods take `&self`.
//!
//! ## Failure model
//! The pages live in this process. When it dies the kernel aborts the FUSE connection: every
//! request on the file fails (ENOTCONN), and through the loop device with an I/O error,
//! never with stale data. The file is opened with `FOPEN_DIRECT_IO`, so the kernel keeps no
//! page cache of it that could outlive the server.

pub mod abi;
pub mod fs;
pub mod request;
pub mod uring;

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use compcache_store::Store;

pub use fs::{DeviceFs, FILE_NAME};

/// How the filesystem is served.
#[derive(Debug, Clone)]
pub struct Options {
    /// Event-loop threads, each with its own `/dev/fuse` descriptor and worker.
    pub threads: usize,
    /// The largest read or write the kernel may send (declared as `max_write`, and so
    /// `max_pages`); every worker has a buffer of this size.
    pub max_request_bytes: usize,
    /// The kernel's queue of background requests (asynchronous direct I/O from the loop
    /// driver counts as background): `max_background` at INIT.
    pub max_background: u16,
    /// Serve through FUSE over io_uring ([`uring`]) when the kernel offers it at INIT
    /// (`/sys/module/fuse/parameters/enable_uring` is Y); else, or if registering the rings
    /// fails, the classic `/dev/fuse` protocol ([`Mounted::transport`] says which).
    pub io_uring: bool,
    /// Ring entries per kernel queue (one queue per possible CPU), each with a payload buffer
    /// of `max_request_bytes`.
    pub uring_depth: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_request_bytes: 128 << 10,
            max_background: 128,
            io_uring: false,
            uring_depth: 32,
        }
    }
}

/// Whether the kernel can host the FUSE front end; the text says what is missing.
pub fn kernel_support() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("FUSE is not available: no /dev/fuse (modprobe fuse; CONFIG_FUSE_FS)".into());
    }
    Ok(())
}

/// A mounted filesystem, served by its own threads until it is unmounted (by
/// [`Mounted::unmount`] or by anyone else).
pub struct Mounted {
    /// The mount point.
    pub dir: PathBuf,
    /// The device file.
    pub file: PathBuf,
    /// Kept so that fuser's own unmount-on-drop never runs behind our back; unmounting is
    /// done by [`Mounted::unmount`] (umount2, which fails while the file is busy).
    _unmounter: fuser::SessionUnmounter,
    thread: JoinHandle<io::Result<()>>,
    /// The io_uring queue threads, if the rings are up.
    rings: Option<uring::Rings>,
    /// How requests travel: "io_uring (N queues x D entries)" or "/dev/fuse" with the reason
    /// io_uring is not used when it was asked for.
    pub transport: String,
}

impl Mounted {
    /// Whether the session still serves (false once the filesystem was unmounted).
    pub fn alive(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Unmounts: `umount2(dir, 0)`, or with `lazy` `MNT_DETACH`. Without `lazy` this fails
    /// with EBUSY while the file is open (for instance while a loop device still holds it).
    pub fn unmount(&self, lazy: bool) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(self.dir.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for the serving threads to end (they end when the filesystem is unmounted and
    /// the kernel closes the connection).
    pub fn join(self) -> io::Result<()> {
        let r = self.thread.join().map_err(|_| io::Error::other("a FUSE thread panicked"))?;
        if let Some(rings) = self.rings {
            rings.join();
        }
        r
    }

    /// Requests answered through io_uring (None when the rings are not in use).
    pub fn uring_served(&self) -> Option<u64> {
        self.rings.as_ref().map(uring::Rings::served)
    }
}

/// Mounts the filesystem on `mountpoint` (an existing empty directory) and serves it on
/// `opts.threads` threads. Returns once the kernel's INIT was answered: the file can be used.
pub fn mount(store: Arc<Store>, mountpoint: &Path, opts: &Options) -> io::Result<Mounted> {
    use fuser::MountOption as M;
    let threads = opts.threads.max(1);
    let mut filesystem = DeviceFs::new(Arc::clone(&store), threads, opts.max_request_bytes, opts.max_background);
    let granted = Arc::new(AtomicBool::new(false));
    let mut transport = "/dev/fuse".to_string();
    if opts.io_uring {
        match uring::kernel_enabled() {
            Ok(true) => filesystem.want_io_uring(Arc::clone(&granted)),
            Ok(false) => transport = "/dev/fuse (FUSE over io_uring is off: /sys/module/fuse/parameters/enable_uring is N)".into(),
            Err(e) => transport = format!("/dev/fuse ({e})"),
        }
    }
    let mut config = fuser::Config::default();
    config.mount_options = vec![M::FSName("compcache".into()), M::Subtype("compcache".into()), M::NoDev, M::NoSuid, M::NoExec, M::NoAtime];
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let mut session = fuser::Session::new(filesystem, mountpoint, &config)?;
    // INIT has been answered (Session::new does the handshake): whether io_uring was agreed
    // is known, and the kernel accepts ring registrations from now on.
    let mut rings = None;
    if opts.io_uring && granted.load(Ordering::Acquire) {
        let started = session.as_fd().try_clone_to_owned().and_then(|fd| {
            // SAFETY: getuid and getgid have no preconditions and cannot fail.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            let dev = uring::Device {
                size: store.disksize_bytes(),
                store: Arc::clone(&store),
                max_request: opts.max_request_bytes,
                uid,
                gid,
                started: std::time::SystemTime::now(),
            };
            uring::start(fd, Arc::new(dev), opts.uring_depth, opts.max_request_bytes)
        });
        match started {
            Ok(r) => {
                transport = format!("io_uring ({} queues x {} entries)", uring::kernel_queues(), opts.uring_depth.max(1));
                rings = Some(r);
            }
            Err(e) => transport = format!("/dev/fuse (registering the io_uring queues failed: {e})"),
        }
    } else if opts.io_uring && transport == "/dev/fuse" {
        transport = "/dev/fuse (the kernel did not offer FUSE_OVER_IO_URING at INIT)".into();
    }
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new().name("fuse-session".into()).spawn(move || session.run())?;
    Ok(Mounted { dir: mountpoint.to_path_buf(), file: mountpoint.join(FILE_NAME), _unmounter: unmounter, thread, rings, transport })
}
