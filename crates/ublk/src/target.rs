//! Creating the device, running its queues, and shutting it down.
//!
//! Threads: `serve` runs the control side on the calling thread; libublk spawns one thread
//! per queue, each with its own io_uring, its own store [`Context`] and its own buffer, all
//! allocated before the device starts (nothing on the request path allocates except the
//! store's own page arena, which reuses freed pages first). libublk marks each queue thread
//! an I/O flusher (`PR_SET_IO_FLUSHER`): memory reclaim entered from these threads never
//! issues I/O, so a queue thread short of memory cannot wait on a swap-out that only it could
//! serve.
//!
//! Data: devices are created with `UBLK_F_USER_COPY`. The kernel then copies no request's data
//! into a buffer of ours; a queue thread reads a write's data from `/dev/ublkcN` (`pread` at the
//! position naming its queue and tag) and writes a read's data there (`pwrite`) before it
//! completes the request. So a queue needs one buffer of the largest request (64 KiB), not one
//! per tag (64 of them: 4 MiB a queue), and that is what a takeover must allocate while the
//! device's I/O is held and memory may be at its shortest (docs/swap.md, "When the server
//! dies": a successor locking 4 MiB a queue then was seen waiting in reclaim for good). The
//! cost is one system call per request that carries data. A kernel before 6.5 clears the flag
//! it does not know when it creates the device, and a device made by an older compcache is
//! taken over in its own mode: either way a buffer per tag, allocated and locked before the
//! first fetch (the queue reads the mode from the device's flags).
//!
//! Shutdown: the caller's `while_up` closure runs on the control thread once the device accepts
//! I/O, and the device is stopped when it returns; libublk deletes it when the control handle
//! drops. What ends the service (a signal, a command) is the caller's policy, and so is taking
//! the device out of swap use first (swapoff reads every page back through the queues, which
//! are still running while `while_up` runs). If the device is stopped from outside (e.g.
//! `ublk del`), the queue threads end and the `alive` function passed to `while_up` turns
//! false.
//!
//! Rejects and failures: a request `decode` refuses is counted in the store's `invalid_io`
//! and one that the store fails in its `failed_reads`/`failed_writes`; both are logged through
//! one `compcache_log::Rejects` per device (at most a few lines a minute, the rest counted in
//! the next line), the policy every front end follows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use compcache_log::Rejects;
use compcache_store::{Context, Store, PAGE_SIZE};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkIOCtx, UblkQueue};
use libublk::{BufDesc, BufDescList, UblkFlags, UblkIORes};

use crate::buffers::IoBuffers;
use crate::error::Error;
use crate::params::device_params;
use crate::request::{decode, execute, Decoded};
use crate::user_copy::{make_resident, UserCopy};

/// How this crate's log lines start.
const WHO: &str = "compcache-ublk";

/// The ublk control device node; present once `ublk_drv` is loaded.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// How the device is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Hardware queues, one server thread each. Default: one per online CPU, so that the
    /// CPU which swaps out a page submits to its own queue.
    pub nr_queues: u16,
    /// Requests in flight per queue. Swap-out submits many single-page writes at once
    /// under pressure and swap-in reads a few clusters of readahead; 64 keeps every CPU's
    /// burst in flight without pinning much memory (depth × `io_buf_bytes` per queue).
    pub queue_depth: u16,
    /// Largest request in bytes (also each queue's buffer size). 64 KiB is 16 pages, above
    /// swap's readahead cluster of 8 pages (`vm.page-cluster` = 3).
    pub io_buf_bytes: u32,
    /// Lock each queue's buffer in memory (`mlock`, before the first fetch): needed to serve as
    /// swap; the process should also `mlockall` (the caller's job: it is process-wide).
    pub mlock_io_buffers: bool,
    /// Device number to ask for (`/dev/ublkbN`), or -1 for the next free one.
    pub dev_id: i32,
    /// Create the device with `UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE`: when this
    /// process dies the kernel keeps the device and holds its I/O (the requests the dead
    /// process had taken are issued again) until a successor takes it over ([`recover`]).
    /// Only for a store whose state outlives the process and is held by someone who will
    /// start that successor (crate docs, "Failure model").
    pub user_recovery: bool,
}

impl Default for Options {
    fn default() -> Options {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Options {
            nr_queues: cpus.clamp(1, 64) as u16,
            queue_depth: 64,
            io_buf_bytes: 64 << 10,
            mlock_io_buffers: true,
            dev_id: -1,
            user_recovery: false,
        }
    }
}

impl Options {
    fn validate(&self) -> Result<(), Error> {
        if self.nr_queues == 0 || self.queue_depth == 0 {
            return Err(Error::Options("queues and queue depth must be at least 1".into()));
        }
        if self.queue_depth > 4096 {
            return Err(Error::Options(format!("queue depth {} is over ublk's 4096", self.queue_depth)));
        }
        if self.io_buf_bytes < PAGE_SIZE as u32 || self.io_buf_bytes % PAGE_SIZE as u32 != 0 {
            return Err(Error::Options(format!("I/O buffer of {} bytes is not a whole number of pages", self.io_buf_bytes)));
        }
        Ok(())
    }
}

/// The device as the kernel shows it, handed to the readiness callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub dev_id: u32,
    /// The block device to swap to, e.g. `/dev/ublkb0`.
    pub bdev_path: String,
    /// The char device the server talks to, e.g. `/dev/ublkc0`.
    pub cdev_path: String,
    pub nr_queues: u16,
    pub queue_depth: u16,
    pub size_bytes: u64,
    /// The kernel moves the data by user copy (module docs, "Data"): created so by this
    /// compcache on Linux 6.5+.
    pub user_copy: bool,
}

/// Says whether this kernel can host a ublk device, and if not, what is missing.
pub fn kernel_support() -> Result<(), Error> {
    if std::path::Path::new(CONTROL_PATH).exists() {
        return Ok(());
    }
    let loaded = std::fs::read_to_string("/proc/modules").map(|m| m.lines().any(|l| l.starts_with("ublk_drv "))).unwrap_or(false);
    Err(Error::Unsupported(if loaded {
        format!("ublk_drv is loaded but {CONTROL_PATH} is missing (no devtmpfs/udev?)")
    } else {
        format!("{CONTROL_PATH} is missing: `modprobe ublk_drv` (Linux 6.0+, CONFIG_BLK_DEV_UBLK)")
    }))
}

/// The `ctrl_flags` of a device created with `user_recovery`: the kernel keeps a device whose
/// server died and re-issues the requests that server had taken, for a successor.
const RECOVERY_FLAGS: u64 = (libublk::sys::UBLK_F_USER_RECOVERY | libublk::sys::UBLK_F_USER_RECOVERY_REISSUE) as u64;

/// The `ctrl_flags` every device is created with: its requests' data is copied with `pread` and
/// `pwrite` on `/dev/ublkcN`, so no buffer per tag is needed (module docs, "Data").
const USER_COPY: u64 = libublk::sys::UBLK_F_USER_COPY as u64;

/// Creates a ublk device of `size_bytes` over `store` and serves it while `while_up` runs,
/// then stops and removes it. `while_up(device, alive)` is called on the calling thread once
/// the block device exists and accepts I/O; `alive()` is false once every queue has ended
/// (the device was stopped from outside). Block the signals you want to wait for *before*
/// calling: the queue threads inherit the signal mask of the calling thread.
///
/// The caller keeps its own `Arc` of the store to read the statistics afterwards.
pub fn serve<W>(store: Arc<Store>, size_bytes: u64, opts: &Options, while_up: W) -> Result<(), Error>
where
    W: FnOnce(&Device, &dyn Fn() -> bool) + Send + Sync + 'static,
{
    check(size_bytes, opts)?;
    let ctrl = UblkCtrlBuilder::default()
        .name("compcache")
        .id(opts.dev_id)
        .nr_queues(opts.nr_queues)
        .depth(opts.queue_depth)
        .io_buf_bytes(opts.io_buf_bytes)
        // User recovery only when asked: see the failure model in the crate docs.
        .ctrl_flags(USER_COPY | if opts.user_recovery { RECOVERY_FLAGS } else { 0 })
        .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
        .build()
        .map_err(Error::ublk("adding the device"))?;
    let served = run(&ctrl, store, size_bytes, opts, None, while_up);
    // Dropping `ctrl` (created with UBLK_DEV_F_ADD_DEV) deletes the device.
    drop(ctrl);
    served
}

/// Takes over the device `opts.dev_id`, created with `user_recovery` by a server that has
/// died (or is dying), and serves it over `store` (the state that server left) as [`serve`]
/// does; then stops and removes it. The order is the kernel's (`ublk_drv.c`): the dead
/// server's `/dev/ublkcN` must be closed (its exit does that) and the device QUIESCED (its
/// requests requeued) before `START_USER_RECOVERY`, which libublk retries while the kernel
/// says EBUSY (up to 30 s); then the queues are set up and fetch, and `END_USER_RECOVERY`
/// lets the held and re-issued requests through. A device that was stopped, or created
/// without recovery, is refused with an error and left alone. The device keeps the data mode
/// it was created with (module docs, "Data").
///
/// `prepared`: queue buffers a standby made before it waited ([`IoBuffers`]), used instead of
/// allocating while memory may be short.
pub fn recover<W>(store: Arc<Store>, size_bytes: u64, opts: &Options, prepared: Option<Arc<IoBuffers>>, while_up: W) -> Result<(), Error>
where
    W: FnOnce(&Device, &dyn Fn() -> bool) + Send + Sync + 'static,
{
    check(size_bytes, opts)?;
    if opts.dev_id < 0 {
        return Err(Error::Options("a takeover needs the device's number".into()));
    }
    replace_exported_json(opts.dev_id);
    let ctrl = UblkCtrlBuilder::default()
        .name("compcache")
        .id(opts.dev_id)
        .nr_queues(opts.nr_queues)
        .depth(opts.queue_depth)
        .io_buf_bytes(opts.io_buf_bytes)
        .ctrl_flags(RECOVERY_FLAGS)
        .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
        .build()
        .map_err(Error::ublk("opening the device to take it over"))?;
    let info = ctrl.dev_info();
    if info.flags & RECOVERY_FLAGS != RECOVERY_FLAGS {
        return Err(Error::Options(format!("ublk device {} was created without user recovery: it cannot be taken over", opts.dev_id)));
    }
    if info.state == libublk::sys::UBLK_S_DEV_DEAD as u16 {
        return Err(Error::Options(format!("ublk device {} is stopped: nothing to take over", opts.dev_id)));
    }
    let started = match ctrl.start_user_recover() {
        Ok(r) if r < 0 => Err(Error::Ublk { context: "START_USER_RECOVERY", source: libublk::UblkError::OtherError(r) }),
        Ok(_) => Ok(()),
        Err(e) => Err(Error::Ublk { context: "START_USER_RECOVERY", source: e }),
    };
    match started {
        Ok(()) => {}
        // A successor before this one started the recovery and died before any queue was
        // ready: the kernel then refuses another start (EINVAL: no queue is ready), but the
        // queues are already reset for new fetches, so the recovery goes on from there.
        Err(e) if e.errno() == libc::EINVAL && info.state == libublk::sys::UBLK_S_DEV_QUIESCED as u16 => {
            compcache_log::warning(
                WHO,
                &format!("ublk device {}: {e}: a successor before this one started the recovery and died; going on with it", opts.dev_id),
            );
        }
        Err(e) => return Err(e),
    }
    let served = run(&ctrl, store, size_bytes, opts, prepared, while_up);
    // A control opened for recovery does not delete its device when dropped: this server owns
    // it now, and a stop removes it as the first server's would.
    if served.is_ok() {
        let _ = ctrl.del_dev();
    }
    served
}

/// Replaces the JSON file libublk exported for device `dev_id` (`/run/ublksrvd/NNNN.json`:
/// queue thread ids and target data, none of which this server uses) with an empty object,
/// before libublk reads it back to recover the device.
///
/// Why: that file is on tmpfs, and its pages, untouched since the dead server wrote them, may
/// have been swapped out to this very device, whose server is the one missing: reading it
/// back would wait for a swap-in only this process can serve (the VM test's `global-kill`
/// step hung so, the standby in `read()` of 1095 bytes from shmem). A new file renamed over
/// it never reads the old one's pages (they are freed with it), and libublk writes the
/// device's JSON afresh when the recovered device starts. A failure here is ignored: libublk
/// then reads the old file, as before.
fn replace_exported_json(dev_id: i32) {
    let path = std::path::PathBuf::from(format!("{}/{:04}.json", UblkCtrl::run_dir(), dev_id));
    let tmp = path.with_extension("json.compcache-new");
    let written = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).and_then(|mut f| {
            use std::io::Write;
            f.write_all(b"{}")
        })
    };
    if written.is_err() || std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Stops and deletes device `dev_id` whose server is gone for good (it and its holder died):
/// a device with user recovery would otherwise hold its I/O forever; stopping it fails that
/// I/O with an I/O error. `Ok(false)`: there is no such device.
pub fn remove_orphan(dev_id: u32) -> Result<bool, Error> {
    kernel_support()?;
    let ctrl = match UblkCtrl::new_simple(dev_id as i32).map_err(Error::ublk("opening the device")) {
        Ok(c) => c,
        Err(e) if e.errno() == libc::ENODEV => return Ok(false),
        Err(e) => return Err(e),
    };
    let _ = ctrl.kill_dev();
    ctrl.del_dev().map_err(Error::ublk("deleting the device"))?;
    Ok(true)
}

fn check(size_bytes: u64, opts: &Options) -> Result<(), Error> {
    opts.validate()?;
    if size_bytes == 0 || size_bytes % PAGE_SIZE as u64 != 0 {
        return Err(Error::Options(format!("device size {size_bytes} is not a whole number of pages")));
    }
    kernel_support()
}

/// Sets up the queues, starts the device (or ends its recovery), runs `while_up`, and stops
/// the device once it returns.
fn run<W>(
    ctrl: &UblkCtrl,
    store: Arc<Store>,
    size_bytes: u64,
    opts: &Options,
    prepared: Option<Arc<IoBuffers>>,
    while_up: W,
) -> Result<(), Error>
where
    W: FnOnce(&Device, &dyn Fn() -> bool) + Send + Sync + 'static,
{
    let live_queues = Arc::new(AtomicUsize::new(ctrl.dev_info().nr_hw_queues as usize));
    // A cache device's writes are durable only once the origin is synced (`params`).
    let write_cache = store.is_cache();
    let (io_buf_bytes, lock) = (opts.io_buf_bytes, opts.mlock_io_buffers);
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_default_params(size_bytes);
        dev.tgt.params = device_params(size_bytes, io_buf_bytes, write_cache);
        Ok(())
    };

    let q_store = Arc::clone(&store);
    let q_live = Arc::clone(&live_queues);
    let rejects = Arc::new(Rejects::new(WHO));
    let queue_fn = move |qid: u16, dev: &UblkDev| {
        let made = prepared.as_ref().and_then(|p| p.take(qid, dev.dev_info.max_io_buf_bytes));
        serve_queue(qid, dev, &q_store, &rejects, lock, made);
        q_live.fetch_sub(1, Ordering::SeqCst);
    };

    let device = Device {
        dev_id: ctrl.dev_info().dev_id,
        bdev_path: ctrl.get_bdev_path(),
        cdev_path: ctrl.get_cdev_path(),
        nr_queues: ctrl.dev_info().nr_hw_queues,
        queue_depth: ctrl.dev_info().queue_depth,
        size_bytes,
        user_copy: ctrl.dev_info().flags & USER_COPY != 0,
    };
    let device_fn = move |ctrl: &UblkCtrl| {
        let alive = || live_queues.load(Ordering::SeqCst) > 0;
        while_up(&device, &alive);
        let _ = ctrl.kill_dev();
    };

    ctrl.run_target(tgt_init, queue_fn, device_fn).map(|_| ()).map_err(Error::ublk("serving the device"))
}

/// One queue thread: fetch requests, run each against the store, complete, until the device
/// stops. Everything the loop needs is allocated here, before the first fetch: with user copy
/// one buffer of the largest request (`made` in advance by a standby, if it brings one), else
/// (a device made without it, taken over) one per tag; written once and, with `lock`, locked,
/// so that no request faults on it.
fn serve_queue(qid: u16, dev: &UblkDev, store: &Store, rejects: &Rejects, lock: bool, made: Option<IoBuf<u8>>) {
    let mut ctx: Context = store.context();
    let dev_bytes = dev.tgt.dev_size;
    let io_buf_bytes = dev.dev_info.max_io_buf_bytes as usize;
    let user_copy = dev.dev_info.flags & USER_COPY != 0;
    let mut bufs: Vec<IoBuf<u8>> = match user_copy {
        true => vec![made.unwrap_or_else(|| IoBuf::new(io_buf_bytes))],
        false => dev.alloc_queue_io_bufs(),
    };
    for b in &bufs {
        make_resident(b);
        if lock && !b.mlock() {
            let e = std::io::Error::last_os_error();
            compcache_log::warning(WHO, &format!("queue {qid}: cannot lock its buffer of {} bytes: {e}", b.len()));
        }
    }
    compcache_store::make_stack_resident();
    // With user copy the data goes through the char device's descriptor, which libublk keeps
    // open (`fds[0]`) for as long as the device is served.
    let data = UserCopy { fd: dev.tgt.fds[0], qid };

    let fetch = if user_copy { BufDescList::Slices(None) } else { BufDescList::Slices(Some(&bufs)) };
    let queue = match UblkQueue::new(qid, dev).and_then(|q| q.submit_fetch_commands_unified(fetch)) {
        Ok(q) => q,
        Err(e) => {
            compcache_log::error(WHO, &format!("queue {qid} failed to start: {e}"));
            return;
        }
    };

    queue.wait_and_handle_io(move |q: &UblkQueue, tag: u16, _io: &UblkIOCtx| {
        let iod = q.get_iod(tag);
        let buf = match user_copy {
            true => bufs[0].as_mut_slice(),
            false => bufs[tag as usize].as_mut_slice(),
        };
        let res = match decode(iod.op_flags, iod.start_sector, iod.nr_sectors, dev_bytes, io_buf_bytes) {
            Ok(req) => {
                let res = match user_copy {
                    true => data.serve(tag, &req.req, buf, |buf| execute(store, &mut ctx, &req, buf)),
                    false => execute(store, &mut ctx, &req, buf),
                };
                if res < 0 {
                    rejects.failed(|| store_failure(qid, &req, res));
                }
                res
            }
            Err(errno) => {
                store.note_invalid_io();
                rejects.refused(|| {
                    format!(
                        "queue {qid}: op_flags {:#x} sector {} sectors {}: {}",
                        iod.op_flags,
                        iod.start_sector,
                        iod.nr_sectors,
                        std::io::Error::from_raw_os_error(-errno)
                    )
                });
                errno
            }
        };
        // The buffer the kernel copies the next request of this tag into: none with user copy.
        let desc = if user_copy { BufDesc::Slice(&[]) } else { BufDesc::Slice(bufs[tag as usize].as_slice()) };
        if let Err(e) = q.complete_io_cmd_unified(tag, desc, Ok(UblkIORes::Result(res))) {
            rejects.failed(|| format!("queue {qid} tag {tag}: completion failed: {e}"));
        }
    });
}

/// The log line of a request the store failed (`res` is `-errno`).
fn store_failure(qid: u16, d: &Decoded, res: i32) -> String {
    let (req, fua) = (&d.req, if d.fua { " (FUA)" } else { "" });
    format!(
        "queue {qid}: {:?}{fua} at offset {} length {} failed: {}",
        req.op,
        req.offset,
        req.len,
        std::io::Error::from_raw_os_error(-res)
    )
}
