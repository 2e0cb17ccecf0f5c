//! The backing tier: a backing device (block device or file) under the compressed RAM, as
//! compcache 0.5's backing swap device and zram's writeback, built so that it just works.
//!
//! The device may also be RAM: the cold tier (`memdev.rs`, `Medium::Memory`), which keeps the
//! log compressed 64 KiB at a time. Then writeback writes pages decoded (raw records, so that
//! neighbours compress together), requests never overflow into it, and records are sealed
//! with a crc32c, not encrypted (they stay in this process's memory, as the pool's pages do).
//!
//! Pages reach a file or block device three ways, always compressed (raw only if they do not
//! compress), packed several to a 4 KiB block and checksummed (record format in `log.rs`):
//! - overflow: a write that would take the pool over `mem_limit` goes to the device instead
//!   of failing (`Store::write_page`); so do incompressible pages with
//!   `BackingConfig::incompressible`;
//! - writeback: a background thread of the front end calls [`crate::Store::maintain`] (here:
//!   [`maintain`]) or `writeback`, which moves the coldest pages out when pool memory passes
//!   the high watermark, until it is under the low one, within a byte budget (`policy.rs`);
//! - GC rewrites the live records of mostly-dead segments so whole segments free up (`gc.rs`).
//!
//! Reads of a `BACKING` slot `pread` the record, verify it and decompress it (`read.rs`); a
//! page read twice within a few seconds is promoted back into RAM when there is room. Discard,
//! overwrite and promotion free the record's bytes in the space map (`space.rs`).
//!
//! One job per file: `device.rs` (file I/O), `keep.rs` (the tier's part of the state file),
//! `log.rs` (records, log heads, batches),
//! `space.rs` (segments, live bytes, free list, reclaim), `batch.rs` (the batch writer that
//! writeback and GC share), `policy.rs` (writeback: watermarks, coldness, budget; promotion),
//! `gc.rs` (garbage collection), `read.rs` (the read path of pages on the device); the cold
//! tier: `memdev.rs` (compression, the device's interface), `blocks.rs` (its blocks in the
//! state file), `tails.rs` (where the blobs' tails go). Writeback,
//! GC and promotion reach slots and pool objects only through the [`Mover`]
//! (`crate::mover`), whose contract says who locks, copies, installs and frees what; `policy`
//! and `gc` depend on `batch`, never on each other.
//!
//! # Locking (the numbered rules 6 and 7 in `slot.rs` place these in the lock order)
//! - `maint` (the maintenance mutex): one writeback or GC at a time. Taken before any slot
//!   lock; its holder takes slot locks one at a time and briefly (to copy a page out, or to
//!   swap a new entry in), and does its device I/O holding no slot lock.
//! - `overflow` (the overflow log head): reserving a record's place only; the `pwrite` runs
//!   after it is released. A leaf, taken with or without a slot lock held.
//! - the space map's free-segment list: a leaf under everything (`space.rs`).
//! - Neither request path takes `maint`: a request never waits for writeback or GC, only for
//!   a slot lock the maintenance thread holds for one page copy.
//! - `close` (the end of the device) takes `maint`, then waits for the overflow writes in
//!   flight (`overflow_writers`, no lock: a writer counts itself, then checks `closed`) before
//!   it discards the device; no record is written after it.
//!
//! # Durability, flush and faults
//! A slot points to a record only after the record's `pwrite` returned, so nothing is reported
//! written that is not in the file, and every later read (from any thread) finds it. That is
//! all FLUSH and FUA mean here (`Store::flush`): the index of the records lives in the
//! server's RAM, so they are useless once the server is gone, and an fsync would make nothing
//! durable; the device is never fsync'd. A failed write leaves the page where it was
//! (writeback) or fails the request with [`StoreError::Backing`] (overflow); a failed or
//! unverifiable read fails that request only. Each failure is logged (the first ones, then
//! one in a thousand) and counted in `bd_errors`.
//!
//! # Life of the device (security)
//! The device holds other processes' memory. `device.rs` opens it private (0600, no symbolic
//! link, no foreign file taken over, locked against a second server); each opening draws a
//! new run key (or, unencrypted, run identifier) that seals every record (`seal.rs`), so
//! records of another run or server never verify; the data area is discarded when the device is opened and when
//! the tier is closed (`Backing`'s drop, or `Store::close_backing` from a server that exits
//! without dropping the store), so no page data outlives the run.
//!
//! A run outlives its process when the device is a file or block device opened by path
//! (`keep.rs`): the key, the generations and the device's identity are in the state file, and
//! a successor takes the device over ([`Backing::take_over`]: reopened by path, checked, not
//! discarded), recomputing everything else from the slots. A server that stops still discards
//! the device (and marks the state file's part closed first); one that is killed leaves it to
//! its successor. A start refused after the
//! device was opened calls `Store::abandon_backing`, which also removes a file this run
//! created. By default records are encrypted under a key of the run that lives only in a
//! locked page of the server's memory (`seal.rs`).

mod batch;
mod blocks;
pub mod device;
pub(crate) mod gc;
mod keep;
pub(crate) mod log;
pub mod memdev;
pub(crate) mod policy;
pub(crate) mod read;
pub mod seal;
pub(crate) mod space;
mod tails;
pub(crate) mod tuning;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use crate::config::BackingConfig;
use crate::error::StoreError;
use crate::ram::mover::{Mover, Records};
use crate::ram::KeptRecords;
use crate::shm::Region;
use crate::stats::BackingCounters;
pub(crate) use device::trusted_link_to_block_device;
pub use device::{BackingDevice, DeviceOptions, FileDevice, Identity, ReadBuf};
pub use gc::GcReport;
use log::{Batch, LogHead, HEADER};
pub(crate) use policy::watermark_bytes;
pub use policy::{WritebackBudget, WritebackReport};
use space::SpaceMap;

/// The fewest segments a device must have: one open per log head, GC's reserve, and one.
const MIN_SEGMENTS: u64 = 4;
/// Errors logged in full before the log thins out to one in `LOG_EVERY`.
const LOG_FIRST: u64 = 20;
const LOG_EVERY: u64 = 1000;

pub(crate) struct Backing {
    pub dev: Box<dyn BackingDevice>,
    /// This run's key (or identifier), sealing every record (`seal.rs`).
    pub run: seal::RecordSeal,
    pub space: SpaceMap,
    /// As configured at start. Its watermarks, rate and writeback limit are only the starting
    /// values: the live ones are `tune` and `Maint::limit` (`compcache set` changes them).
    pub cfg: BackingConfig,
    /// Writeback's watermarks and rate, changeable while the device runs (`tuning.rs`).
    pub tune: tuning::Tunables,
    overflow: Mutex<LogHead>,
    pub maint: Mutex<Maint>,
    pub ctr: BackingCounters,
    /// `close` ran (or is running): no record is written any more. Set under `maint` (so no
    /// writeback or GC batch follows it) and checked by overflow writers after they count
    /// themselves in `overflow_writers` (SeqCst both sides: either `close` sees the writer
    /// and waits for its `pwrite`, or the writer sees `closed` and writes nothing).
    closed: AtomicBool,
    overflow_writers: AtomicU64,
    /// The tier's part of the state file (`keep.rs`), when its state is kept for a successor
    /// (a file or block device opened by path); `None`: the tier dies with the process.
    kept: Option<keep::Kept>,
    /// The records are left on the device for a successor: `close` (and so drop) discards
    /// nothing. Set while a takeover is not finished (a refused one leaves the device as the
    /// dead server left it) and by `Store::hand_over`.
    leave: AtomicBool,
    /// This tier took a dead server's device over (`take_over`).
    inherited: bool,
    /// The cold tier taken over: the dead server's unfinished block writes it undid (0 or 1).
    pub cold_writes_undone: u64,
}

impl Drop for Backing {
    fn drop(&mut self) {
        self.close();
    }
}

/// How recovery vouches for the record a `BACKING` entry names (`ram/recover.rs`).
impl KeptRecords for Backing {
    fn claim(&self, loc: u64, len: u16) -> bool {
        len as usize <= crate::PAGE_SIZE && self.space.claim(loc, (HEADER + len as usize) as u64)
    }
}

/// State of the maintenance side (writeback and GC), under `Backing::maint`.
pub(crate) struct Maint {
    pub head: LogHead,
    pub batch: Batch,
    /// Writeback passed the high watermark and runs until the low one.
    pub draining: bool,
    /// Where the next writeback scan starts, so equally cold pages take turns.
    pub cursor: u64,
    /// The writeback limit (`tuning.rs`).
    pub limit: tuning::Limit,
    /// The cold tier only: decodes pages before they are written (`policy.rs`); set by the
    /// store when it is made.
    pub raw: Option<policy::RawPages>,
}

/// What [`crate::Store::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub writeback: WritebackReport,
    pub gc: GcReport,
}

/// Bytes of the cold tier's two parts of the state file: its `keep.rs` part (page-rounded),
/// then its blocks.
fn cold_parts(cfg: &BackingConfig) -> (usize, usize) {
    let keep = keep::region_bytes(cfg.size_bytes / cfg.segment_bytes).next_multiple_of(crate::PAGE_SIZE);
    (keep, memdev::MemDevice::region_bytes(cfg.size_bytes))
}

/// The cold tier's region split into its two parts (`cold_parts`); the second may be shorter
/// than the configuration wants in a damaged or other file (checked by whoever reads it).
fn split_cold(cfg: &BackingConfig, region: &Region) -> (Region, Region) {
    let (keep, blocks) = cold_parts(cfg);
    let keep_len = keep.min(region.len);
    let first = Region { map: region.map.clone(), offset: region.offset, len: keep_len };
    let second = Region { map: region.map.clone(), offset: region.offset + keep_len, len: blocks.min(region.len - keep_len) };
    (first, second)
}

/// `Store::maintain`: one step of background work, called every `elapsed`: writeback within
/// the configured rate, then GC with what is left of it.
pub(crate) fn maintain(mv: &Mover<'_>, b: &Backing, elapsed: Duration) -> MaintenanceReport {
    let rate = b.tune.rate_bytes();
    let budget = if rate == 0 { u64::MAX } else { (rate as f64 * elapsed.as_secs_f64().min(1.0)) as u64 };
    let mut writeback = policy::writeback(mv, b, WritebackBudget { max_bytes: budget });
    let idle = b.cfg.idle_secs;
    if idle > 0 && writeback.error.is_none() && !writeback.device_full {
        let left = budget.saturating_sub(writeback.bytes);
        writeback.add(policy::writeback_idle(mv, b, idle, WritebackBudget { max_bytes: left }));
    }
    let gc = gc::gc(mv, b, budget.saturating_sub(writeback.bytes));
    MaintenanceReport { writeback, gc }
}

/// How the mover frees a record (`ram/mover.rs`, which does not import this tier).
impl Records for Backing {
    fn free(&self, loc: u64, len: u16) {
        Backing::free(self, loc, len)
    }
}

impl Backing {
    /// Opens (creating if needed) the configured file or device (`device.rs` says what it
    /// refuses). A device opened but then refused (too small) is closed again, and a file this
    /// call created is removed. (The cold tier's device is made in the state file:
    /// [`Backing::cold`].)
    pub fn open_device(cfg: &BackingConfig, disksize_bytes: u64) -> Result<Box<dyn BackingDevice>, StoreError> {
        let opts = DeviceOptions {
            size_bytes: cfg.size_bytes,
            default_bytes: disksize_bytes,
            min_bytes: MIN_SEGMENTS * cfg.segment_bytes,
            force: cfg.force,
        };
        let dev = FileDevice::open(&cfg.path, opts).map_err(|e| {
            StoreError::Config(format!(
                "cannot use the backing device (at least {MIN_SEGMENTS} segments of {} bytes): {e}",
                cfg.segment_bytes
            ))
        })?;
        // (FileDevice::open refused a device under MIN_SEGMENTS before writing anything.)
        Ok(Box::new(dev))
    }

    /// Bytes of the state file the tier keeps for a successor (`keep.rs`) over `dev`, or for
    /// the cold tier (`dev` None): its `keep.rs` part, then its blocks (`blocks.rs`). 0 when
    /// it cannot be taken over (a device given as an object, which no other process can open
    /// again).
    pub fn kept_bytes(cfg: &BackingConfig, dev: Option<&dyn BackingDevice>) -> usize {
        match (cfg.medium, dev.and_then(|d| d.identity())) {
            (crate::config::Medium::File, Some(id)) => keep::region_bytes(id.size_bytes / cfg.segment_bytes),
            (crate::config::Medium::Memory { .. }, None) if dev.is_none() => {
                let (keep, blocks) = cold_parts(cfg);
                keep + blocks
            }
            _ => 0,
        }
    }

    /// The cold tier, its blocks and its `keep.rs` part in `region` (sized by
    /// [`Backing::kept_bytes`]) of a new state file, so that a successor takes it over.
    pub fn cold(cfg: &BackingConfig, region: &Region) -> Result<Backing, StoreError> {
        let crate::config::Medium::Memory { level } = cfg.medium else { unreachable!("the cold tier's configuration") };
        let (keep_part, blocks_part) = split_cold(cfg, region);
        let dev = memdev::MemDevice::create(&blocks_part, cfg.size_bytes, level)
            .map_err(|e| StoreError::Config(format!("cannot make the cold tier of {} bytes: {e}", cfg.size_bytes)))?;
        if dev.size_bytes() / cfg.segment_bytes < MIN_SEGMENTS {
            return Err(StoreError::Config(format!(
                "the cold tier of {} bytes: at least {MIN_SEGMENTS} segments of {} bytes are needed",
                cfg.size_bytes, cfg.segment_bytes
            )));
        }
        // The blocks' header is written; `Kept::create` marks the whole part LIVE last.
        let id = keep::cold_identity(cfg.size_bytes);
        let (kept, run, gens) = keep::Kept::create(&keep_part, id, cfg.segment_bytes, cfg.encrypt)
            .map_err(|e| StoreError::Config(format!("cannot draw the cold tier's run identifier: {e}")))?;
        let space = SpaceMap::with_gens(cfg.size_bytes, cfg.segment_bytes, gens);
        Ok(Backing::build(cfg, Box::new(dev), run, space, Some(kept)))
    }

    /// The tier over `dev`. With `region` (the state file's part [`Backing::kept_bytes`] sized),
    /// its state is kept there for a successor. Refused (and a file made for it removed) if
    /// the device is too small or the run's key cannot be drawn.
    pub fn with_device(cfg: &BackingConfig, dev: Box<dyn BackingDevice>, region: Option<Region>) -> Result<Backing, StoreError> {
        let refuse = |dev: &dyn BackingDevice, msg: String| {
            let _ = dev.remove_if_created();
            StoreError::Config(msg)
        };
        if dev.size_bytes() / cfg.segment_bytes < MIN_SEGMENTS {
            let msg = format!(
                "backing device {} has {} usable bytes: at least {MIN_SEGMENTS} segments of {} bytes are needed",
                dev.describe(),
                dev.size_bytes(),
                cfg.segment_bytes
            );
            return Err(refuse(&*dev, msg));
        }
        let key_error = |e: std::io::Error| format!("cannot draw the backing device's run key (getrandom, mmap): {e}");
        let (run, space, kept) = match (region, dev.identity()) {
            (Some(region), Some(id)) => match keep::Kept::create(&region, id, cfg.segment_bytes, cfg.encrypt) {
                Ok((kept, run, gens)) => (run, SpaceMap::with_gens(id.size_bytes, cfg.segment_bytes, gens), Some(kept)),
                Err(e) => return Err(refuse(&*dev, key_error(e))),
            },
            _ => match seal::RecordSeal::new(cfg.encrypt) {
                Ok(run) => (run, SpaceMap::new(dev.size_bytes(), cfg.segment_bytes), None),
                Err(e) => return Err(refuse(&*dev, key_error(e))),
            },
        };
        Ok(Backing::build(cfg, dev, run, space, kept))
    }

    /// A successor's tier over the device a dead server's state file `region` names
    /// (`keep.rs`): reopened by `cfg.path`, which must lead to that device, of that size, and
    /// not discarded. The space map holds no live bytes until recovery claims the records the
    /// slots name (`KeptRecords`) and [`Backing::taken_over`] ends it. Until then a refused
    /// takeover leaves the device as it is. The error is one line.
    pub fn take_over(cfg: &BackingConfig, region: &Region) -> Result<Backing, String> {
        let (keep_part, blocks_part) = if cfg.in_ram() { split_cold(cfg, region) } else { (region.clone(), region.clone()) };
        if cfg.in_ram() && region.len < keep_part.len + blocks_part.len {
            return Err(format!(
                "its backing tier's region is {} bytes, the cold tier configured needs more: configure its size",
                region.len
            ));
        }
        let t = keep::take_over(&keep_part, cfg.segment_bytes, cfg.in_ram())?;
        let mut undone = 0;
        let dev: Box<dyn BackingDevice> = match cfg.medium {
            crate::config::Medium::Memory { level } => {
                if t.id.size_bytes != cfg.size_bytes {
                    return Err(format!(
                        "its cold tier is of {} bytes, the configuration's {}: configure the size it was made with",
                        t.id.size_bytes, cfg.size_bytes
                    ));
                }
                let (dev, cut) = memdev::MemDevice::take_over(&blocks_part, cfg.size_bytes, level)?;
                undone = u64::from(cut);
                Box::new(dev)
            }
            crate::config::Medium::File => Box::new(FileDevice::reopen(&cfg.path, t.id).map_err(|e| format!("its backing device: {e}"))?),
        };
        let space = SpaceMap::taking_over(t.id.size_bytes, cfg.segment_bytes, t.gens);
        let mut b = Backing::build(cfg, dev, t.seal, space, Some(t.kept));
        b.cold_writes_undone = undone;
        b.inherited = true;
        b.leave.store(true, SeqCst);
        Ok(b)
    }

    /// Ends a takeover once every slot was checked: segments no record uses are free, the
    /// others full (`SpaceMap::taken_over`); from now on the device's life is this process's.
    pub fn taken_over(&self) {
        self.space.taken_over();
        self.leave.store(false, SeqCst);
    }

    /// Whether a successor can take this tier over (its state is in the state file).
    pub fn is_kept(&self) -> bool {
        self.kept.is_some()
    }

    /// Leaves the records on the device for a successor that takes the state file over:
    /// closing (and dropping) the tier will not discard them (`Store::hand_over`).
    pub fn leave_for_successor(&self) {
        self.leave.store(true, SeqCst);
    }

    fn build(
        cfg: &BackingConfig,
        dev: Box<dyn BackingDevice>,
        run: seal::RecordSeal,
        space: SpaceMap,
        kept: Option<keep::Kept>,
    ) -> Backing {
        Backing {
            dev,
            run,
            space,
            cfg: cfg.clone(),
            tune: tuning::Tunables::new(cfg),
            overflow: Mutex::new(LogHead::default()),
            // The batch is reserved (and resident) now: writeback copies pages into it under
            // their slot locks, where growing it would make requests wait on an allocation.
            maint: Mutex::new(Maint {
                head: LogHead::default(),
                batch: Batch::reserved(),
                draining: false,
                cursor: 0,
                limit: tuning::Limit { bytes: cfg.writeback_limit_bytes, base: 0 },
                raw: None,
            }),
            ctr: BackingCounters::default(),
            closed: AtomicBool::new(false),
            overflow_writers: AtomicU64::new(0),
            kept,
            leave: AtomicBool::new(false),
            inherited: false,
            cold_writes_undone: 0,
        }
    }

    /// Discards the whole device: the end of its life (module docs). Writes fail from now on
    /// and pages still on it read as I/O errors. Idempotent; failures are logged.
    pub fn close(&self) {
        if self.leave.load(SeqCst) {
            return; // for a successor (`leave_for_successor`)
        }
        // Under the maintenance mutex: no writeback or GC batch lands after the discard.
        let m = self.maint.lock();
        if self.closed.swap(true, SeqCst) {
            return;
        }
        while self.overflow_writers.load(SeqCst) != 0 {
            std::thread::yield_now(); // an overflow pwrite in flight: one write's time
        }
        // Before the discard: a successor given the state file now refuses it in one line
        // rather than finding records gone.
        if let Some(k) = &self.kept {
            k.close();
        }
        if let Err(e) = self.dev.discard_all() {
            let _ = self.error(u64::MAX, format!("discarding the device at close failed: {e}; its records may stay on it"));
        }
        drop(m);
    }

    /// Whether the records are in RAM (the cold tier): writeback then writes pages decoded,
    /// so that the device compresses runs of them together, and requests never write to it
    /// (overflow would compress 64 KiB blocks on the request path).
    pub fn in_ram(&self) -> bool {
        self.cfg.in_ram()
    }

    /// Whether writeback and GC may write (checked under `maint`).
    pub fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// A start refused after the device was opened: close it, and remove the file if this
    /// run created it. A device taken over from a dead server is left as it is instead (its
    /// records, for the next try with the same state file).
    pub fn abandon(&self) {
        if self.inherited {
            self.leave.store(true, SeqCst);
        }
        if self.leave.load(SeqCst) {
            return;
        }
        self.close();
        if let Err(e) = self.dev.remove_if_created() {
            compcache_log::error(
                "compcache",
                &format!("backing device {}: cannot remove the file made for this run: {e}", self.dev.describe()),
            );
        }
    }

    /// Writes one record (the overflow path of a request). `rec` is the record buffer with
    /// the payload at `rec[HEADER..]`. Returns its location once it is in the file.
    pub fn write_record(&self, index: u64, rec: &mut [u8]) -> Result<u64, StoreError> {
        self.overflow_writers.fetch_add(1, SeqCst);
        let r = if self.closed.load(SeqCst) {
            Err(self.error(index, format!("the backing device {} is closed", self.dev.describe())))
        } else {
            self.write_open_record(index, rec)
        };
        self.overflow_writers.fetch_sub(1, SeqCst);
        r
    }

    fn write_open_record(&self, index: u64, rec: &mut [u8]) -> Result<u64, StoreError> {
        let (loc, gen) = self
            .overflow
            .lock()
            .reserve(&self.space, rec.len() as u64, false)
            .map_err(|_| self.error(index, format!("the backing device {} is full", self.dev.describe())))?;
        self.run.seal(gen, loc, index, rec);
        let r = self.dev.write_at(rec, loc);
        self.space.written(loc);
        if let Err(e) = r {
            self.space.free(loc, rec.len() as u64);
            return Err(self.error(index, format!("write of {} bytes at byte {loc} failed: {e}", rec.len())));
        }
        Ok(loc)
    }

    /// Reads and verifies the record of slot `index` at `loc` into `rec` (header + payload),
    /// through the worker's read buffer. The caller pinned the segment under the slot lock.
    pub fn read_record(&self, index: u64, loc: u64, rec: &mut [u8], scratch: &mut ReadBuf) -> Result<(), StoreError> {
        rec.copy_from_slice(self.read_raw(index, loc, rec.len(), scratch)?);
        self.check(index, loc, rec)
    }

    /// Reads `len` bytes at `loc` (one record or a run of them; `index` names the first page
    /// for the error) into the worker's read buffer; returns them, for `check` to open.
    pub fn read_raw<'a>(&self, index: u64, loc: u64, len: usize, scratch: &'a mut ReadBuf) -> Result<&'a mut [u8], StoreError> {
        self.dev.read_into(scratch, loc, len).map_err(|e| self.error(index, format!("read of {len} bytes at byte {loc} failed: {e}")))
    }

    /// Verifies the record of slot `index` read from `loc` (its segment pinned) and leaves
    /// its plaintext payload in `rec[HEADER..]`.
    pub fn check(&self, index: u64, loc: u64, rec: &mut [u8]) -> Result<(), StoreError> {
        let gen = self.space.gen(self.space.seg_of(loc));
        self.run.open(gen, loc, index, rec).map_err(|reason| {
            self.log(index, &reason);
            StoreError::Corrupt { index, reason }
        })
    }

    /// Frees the record of a slot entry that was just taken out of its slot.
    pub fn free(&self, loc: u64, len: u16) {
        self.space.free(loc, (HEADER + len as usize) as u64);
    }

    /// Counts and logs a device failure; the error for the request it hit.
    pub fn error(&self, index: u64, reason: String) -> StoreError {
        self.log(index, &reason);
        StoreError::Backing { index, reason }
    }

    fn log(&self, index: u64, reason: &str) {
        let n = self.ctr.errors.fetch_add(1, Relaxed);
        if n < LOG_FIRST || n % LOG_EVERY == 0 {
            let page = if index == u64::MAX { String::new() } else { format!(" (page {index})") };
            compcache_log::error("compcache", &format!("backing device {}: {reason}{page} [error {} so far]", self.dev.describe(), n + 1));
        }
    }
}
