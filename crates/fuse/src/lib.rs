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
//! - [`takeover`]: what a successor needs to serve a connection a dead server left (the INIT
//!   record, `FUSE_NOTIFY_RESEND`);
//! - this file: mounting, taking over, starting the transports, handing over, unmounting.
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
//! Mounted with [`mount`], the connection lives as long as this process: when it dies the
//! kernel aborts it, every request on the file fails (ENOTCONN), and through the loop device
//! with an I/O error, never with stale data. The file is opened with `FOPEN_DIRECT_IO`, so
//! the kernel keeps no page cache of it that could outlive the server.
//!
//! Mounted with [`mount_held`], every descriptor requests are read from is first given to a
//! holder that outlives the process; a successor takes the connection over with
//! [`take_over`] (see [`takeover`]), and [`Mounted::hand_over`] ends a server without taking
//! anything down.

pub mod abi;
pub mod answer;
pub mod classic;
pub mod fs;
pub mod request;
pub mod takeover;
pub mod uring;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use compcache_store::Store;

pub use fs::{InitFs, FILE_NAME};
pub use takeover::Negotiated;

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
    /// The connection's first descriptor (and, when this process mounted, the mount).
    conn: Connection,
    /// The `/dev/fuse` threads.
    classic: classic::Threads,
    /// The io_uring queue threads, if the rings are up.
    rings: Option<uring::Rings>,
    /// How requests travel: "io_uring (N queues x D entries)" or "/dev/fuse" with the reason
    /// io_uring is not used when it was asked for.
    pub transport: String,
    /// What INIT agreed (recorded by this process's INIT, or taken over).
    pub negotiated: Negotiated,
}

/// The connection's first descriptor.
enum Connection {
    /// fuser's session: the descriptor and the mount. Never run; dropped after the threads
    /// end, when its unmount-on-drop finds nothing left to unmount (while the file is busy it
    /// cannot unmount either: fuser's `umount2` has no `MNT_DETACH`).
    Mounted(fuser::Session<InitFs>),
    /// A descriptor taken over from a predecessor (the mount is the predecessor's).
    Adopted(OwnedFd),
}

impl Connection {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Connection::Mounted(s) => s.as_fd(),
            Connection::Adopted(fd) => fd.as_fd(),
        }
    }
}

impl Mounted {
    /// Hands the connection over to a successor: stops taking requests, waits (up to
    /// `timeout`) for those in flight to be answered, and returns without unmounting or closing
    /// anything; the caller exits the process next (the holder keeps the descriptors). A
    /// request read meanwhile stays unanswered for the successor's resend. Returns whether
    /// every request in flight was answered in time.
    pub fn hand_over(self, timeout: std::time::Duration) -> bool {
        let done = self.classic.quiesce(timeout);
        // Neither fuser's unmount-on-drop nor the threads' descriptors may run their course:
        // the process ends with everything as it is.
        std::mem::forget(self);
        done
    }

    /// The connection's first descriptor (`Mounted` keeps it open).
    pub fn session_fd(&self) -> BorrowedFd<'_> {
        self.conn.fd()
    }

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
        drop(self.conn);
        r
    }

    /// Requests answered through io_uring (None when the rings are not in use).
    pub fn uring_served(&self) -> Option<u64> {
        self.rings.as_ref().map(uring::Rings::served)
    }
}

/// Mounts the filesystem on `mountpoint` (an existing empty directory) and serves it on
/// `opts.threads` threads. Returns once the kernel's INIT was answered and every serving
/// thread has its buffer: the file can be used. The connection dies with this process.
pub fn mount(store: Arc<Store>, mountpoint: &Path, opts: &Options) -> io::Result<Mounted> {
    mount_inner(store, mountpoint, opts, None)
}

/// The descriptors a server reads requests from, to be held by someone that outlives it
/// ([`mount_held`]), and what INIT agreed.
pub struct Held<'a> {
    /// The connection's first descriptor, then one per serving thread.
    pub fds: Vec<BorrowedFd<'a>>,
    pub negotiated: Negotiated,
}

/// What [`mount_held`] calls with the descriptors to hold.
pub type Hold<'h> = dyn FnMut(&Held<'_>) -> io::Result<()> + 'h;

/// As [`mount`], for a connection a successor can take over ([`take_over`]): `hold` gets every
/// descriptor requests will be read from, and what INIT agreed, before the first request is
/// read; if it fails, nothing is served and the mount is taken down. Always the classic
/// transport (FUSE over io_uring cannot be taken over: [`takeover`]); `opts.io_uring` is
/// answered in [`Mounted::transport`].
pub fn mount_held(
    store: Arc<Store>,
    mountpoint: &Path,
    opts: &Options,
    hold: &mut dyn FnMut(&Held<'_>) -> io::Result<()>,
) -> io::Result<Mounted> {
    let classic_only = Options { io_uring: false, ..opts.clone() };
    let mut m = mount_inner(store, mountpoint, &classic_only, Some(hold))?;
    if opts.io_uring {
        m.transport =
            "/dev/fuse (FUSE over io_uring cannot be taken over by a successor; a server that can be serves through /dev/fuse)".into();
    }
    Ok(m)
}

fn mount_inner(store: Arc<Store>, mountpoint: &Path, opts: &Options, hold: Option<&mut Hold<'_>>) -> io::Result<Mounted> {
    use fuser::MountOption as M;
    let mut filesystem = InitFs::new(opts.max_request_bytes, opts.max_background);
    let negotiated = filesystem.negotiated();
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
    let negotiated = negotiated.lock().ok().and_then(|n| *n).ok_or_else(|| io::Error::other("the kernel's INIT was not answered"))?;
    let dev = Arc::new(answer::Device::new(store, opts.max_request_bytes));
    let started = classic::clone_fds(session.as_fd(), opts.threads).and_then(|fds| {
        if let Some(hold) = hold {
            let mut all = vec![session.as_fd()];
            all.extend(fds.iter().map(|f| f.as_fd()));
            hold(&Held { fds: all, negotiated })?;
        }
        classic::start(fds, Arc::clone(&dev), opts.spin)
    });
    let classic = match started {
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
    let conn = Connection::Mounted(session);
    Ok(Mounted { dir: mountpoint.to_path_buf(), file: mountpoint.join(FILE_NAME), conn, classic, rings, transport, negotiated })
}

/// A connection taken over: what [`take_over`] started, and whether the kernel sent the
/// predecessor's unanswered requests again.
pub struct TakenOver {
    pub mounted: Mounted,
    /// `FUSE_NOTIFY_RESEND`'s outcome: an error (EINVAL before Linux 6.9) means the requests
    /// the predecessor had read but not answered are lost (their tasks wait until the
    /// connection is aborted); new requests are served either way.
    pub resend: io::Result<()>,
}

/// Serves the connection mounted on `mountpoint` by a predecessor: `fds` are the descriptors
/// it held (the first one the connection's, then one per serving thread; every one of them is
/// served), `negotiated` what its INIT agreed. Starts the classic threads, then asks the kernel
/// to send every request read but not answered again ([`takeover::notify_resend`]).
/// `opts.threads` and `opts.io_uring` are not used: one thread per descriptor, /dev/fuse.
pub fn take_over(
    store: Arc<Store>,
    mountpoint: &Path,
    mut fds: Vec<OwnedFd>,
    negotiated: Negotiated,
    opts: &Options,
) -> io::Result<TakenOver> {
    if fds.len() < 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} /dev/fuse descriptor(s) handed over: a connection's and at least one serving", fds.len()),
        ));
    }
    let first = fds.remove(0);
    // The buffers hold the largest request the kernel was told it may send.
    let dev = Arc::new(answer::Device::new(store, negotiated.max_write as usize));
    let classic = classic::start(fds, dev, opts.spin)?;
    let resend = takeover::notify_resend(first.as_fd());
    let mounted = Mounted {
        dir: mountpoint.to_path_buf(),
        file: mountpoint.join(FILE_NAME),
        conn: Connection::Adopted(first),
        classic,
        rings: None,
        transport: "/dev/fuse (taken over)".into(),
        negotiated,
    };
    Ok(TakenOver { mounted, resend })
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
