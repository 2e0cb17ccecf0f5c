//! # compcache-fuse
//!
//! The FUSE front end: serves a [`compcache_store::Store`] as one regular file,
//! `<mountpoint>/device`, of the device's size, on a FUSE mount; `compcache fuse` attaches it
//! to a loop device (`losetup --direct-io=on --sector-size 4096`) for the kernel to swap to.
//! For kernels with FUSE and loop but neither ublk nor nbd.ko. Mounted with the `fuser` crate,
//! served by this crate's own transports ("fuser's part", below).
//!
//! One job per file:
//! - [`request`]: decoding and validating one read, write, fallocate, fsync or flush, and
//!   the one `match` that turns it into a store call (pure: unit-tested without a mount);
//! - [`answer`]: the answer to every request the file gets (one `match` on the opcode), shared
//!   by both transports;
//! - [`classic`]: the classic transport, `read`/`writev` on `/dev/fuse`, on our own threads
//!   with buffers made before the device is used;
//! - [`uring`]: the FUSE-over-io_uring transport (Linux 6.14+), used when
//!   [`Options::io_uring`] asks for it and the kernel offers it;
//! - [`abi`]: the kernel structures both transports read and write;
//! - [`fs`]: what the filesystem declares to the kernel at INIT;
//! - this file: mounting, starting the transports, unmounting.
//!
//! ## fuser's part
//! fuser (0.18, pure-Rust mount: `mount(2)` as root, else `fusermount3`; no libfuse linked)
//! mounts and answers INIT ([`fs::InitFs`]); its session is then kept, for its descriptor and
//! its mount, but never run: fuser's event loop gives each thread a 16 MiB buffer and its
//! request and reply types are not ours to keep off the heap, while a swap server must serve
//! without allocating (docs/swap.md, "Memory pressure"). Our transports do
//! ([`classic`], [`uring`]: every buffer made, written and locked before the first request).
//!
//! ## Failure model
//! The pages live in this process. When it dies the kernel aborts the FUSE connection: every
//! request on the file fails (ENOTCONN), and through the loop device with an I/O error,
//! never with stale data. The file is opened with `FOPEN_DIRECT_IO`, so the kernel keeps no
//! page cache of it that could outlive the server.

pub mod abi;
pub mod answer;
pub mod classic;
pub mod fs;
pub mod request;
pub mod uring;

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use compcache_store::Store;

pub use fs::{InitFs, FILE_NAME};

/// How the filesystem is served.
#[derive(Debug, Clone)]
pub struct Options {
    /// Threads serving `/dev/fuse` ([`classic`]), each with its own descriptor, buffer and
    /// compression context.
    pub threads: usize,
    /// The largest read or write the kernel may send (declared as `max_write`, and so
    /// `max_pages`); every thread's and ring entry's buffer holds one.
    pub max_request_bytes: usize,
    /// The kernel's queue of background requests (asynchronous direct I/O from the loop
    /// driver counts as background): `max_background` at INIT.
    pub max_background: u16,
    /// Serve through FUSE over io_uring ([`uring`]) when the kernel offers it at INIT
    /// (`/sys/module/fuse/parameters/enable_uring` is Y); else, or if registering the rings
    /// fails, the classic `/dev/fuse` protocol ([`Mounted::transport`] says which).
    pub io_uring: bool,
    /// How long a classic thread that has answered a request polls `/dev/fuse` for the next
    /// one, at idle priority, before it sleeps in `read` (one thread of the connection at a
    /// time; zero: never). Off by default: on the 2-vCPU machine this was measured on, under
    /// load, polling made reads slower (docs/swap.md, "Where a page fault's time goes").
    /// See [`classic`], "Waiting".
    pub spin: std::time::Duration,
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
            spin: DEFAULT_SPIN,
            uring_depth: 32,
        }
    }
}

/// The default spin window ([`Options::spin`]): none.
pub const DEFAULT_SPIN: std::time::Duration = std::time::Duration::ZERO;

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
    /// fuser's session: the connection's first descriptor and the mount. Never run; dropped
    /// after the threads end, when its unmount-on-drop finds nothing left to unmount (while
    /// the file is busy it cannot unmount either: fuser's `umount2` has no `MNT_DETACH`).
    session: fuser::Session<InitFs>,
    /// The `/dev/fuse` threads.
    classic: classic::Threads,
    /// The io_uring queue threads, if the rings are up.
    rings: Option<uring::Rings>,
    /// How requests travel: "io_uring (N queues x D entries)" or "/dev/fuse" with the reason
    /// io_uring is not used when it was asked for.
    pub transport: String,
}

impl Mounted {
    /// Whether the filesystem is still served (false once it was unmounted).
    pub fn alive(&self) -> bool {
        self.classic.alive()
    }

    /// Unmounts: `umount2(dir, 0)`, or with `lazy` `MNT_DETACH`. Without `lazy` this fails
    /// with EBUSY while the file is open (for instance while a loop device still holds it).
    pub fn unmount(&self, lazy: bool) -> io::Result<()> {
        umount(&self.dir, lazy)
    }

    /// Waits for the serving threads to end (they end when the filesystem is unmounted and
    /// the kernel closes the connection).
    pub fn join(self) -> io::Result<()> {
        let r = self.classic.join();
        if let Some(rings) = self.rings {
            rings.join();
        }
        drop(self.session);
        r
    }

    /// Requests answered through io_uring (None when the rings are not in use).
    pub fn uring_served(&self) -> Option<u64> {
        self.rings.as_ref().map(uring::Rings::served)
    }
}

/// Mounts the filesystem on `mountpoint` (an existing empty directory) and serves it on
/// `opts.threads` threads. Returns once the kernel's INIT was answered and every serving
/// thread has its buffer: the file can be used.
pub fn mount(store: Arc<Store>, mountpoint: &Path, opts: &Options) -> io::Result<Mounted> {
    use fuser::MountOption as M;
    let mut filesystem = InitFs::new(opts.max_request_bytes, opts.max_background);
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
    // Session::new mounts and answers INIT; nothing else is read until our threads start.
    let session = fuser::Session::new(filesystem, mountpoint, &config)?;
    let dev = Arc::new(answer::Device::new(store, opts.max_request_bytes));
    let classic = match classic::start(session.as_fd(), Arc::clone(&dev), opts.threads, opts.spin) {
        Ok(t) => t,
        Err(e) => {
            // Nothing serves the mount: take it down (the file is not in use yet).
            let _ = umount(mountpoint, true);
            return Err(e);
        }
    };
    // Whether io_uring was agreed is known (INIT), and the kernel accepts ring registrations
    // from now on; until every queue has its entries, requests keep coming through /dev/fuse.
    let mut rings = None;
    if opts.io_uring && granted.load(Ordering::Acquire) {
        let started = session.as_fd().try_clone_to_owned().and_then(|fd| uring::start(fd, Arc::clone(&dev), opts.uring_depth));
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
    if classic.spin.is_zero() && !opts.spin.is_zero() {
        transport += ", no polling for requests (no CAP_SYS_NICE to return a thread from SCHED_IDLE)";
    }
    Ok(Mounted { dir: mountpoint.to_path_buf(), file: mountpoint.join(FILE_NAME), session, classic, rings, transport })
}

/// `umount2(dir, 0)`, or with `lazy` `MNT_DETACH`.
fn umount(dir: &Path, lazy: bool) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
