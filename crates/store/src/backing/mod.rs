//! The backing tier: a backing device (block device or file) under the compressed RAM, as
//! compcache 0.5's backing swap device and zram's writeback, built so that it just works.
//!
//! Pages reach the device three ways, always compressed (raw only if they do not compress),
//! packed several to a 4 KiB block and checksummed (record format in `log.rs`):
//! - overflow: a write that would take the pool over `mem_limit` goes to the device instead
//!   of failing (`Store::write_page`); so do incompressible pages with
//!   `BackingConfig::incompressible`;
//! - writeback: a background thread of the front end calls [`crate::Store::maintain`] (or
//!   `writeback`), which moves the coldest pages out when pool memory passes the high
//!   watermark, until it is under the low one, within a byte budget (`policy.rs`);
//! - GC rewrites the live records of mostly-dead segments so whole segments free up (`gc.rs`).
//!
//! Reads of a `BACKING` slot `pread` the record, verify it and decompress it; a page read
//! twice within a few seconds is promoted back into RAM when there is room. Discard, overwrite
//! and promotion free the record's bytes in the space map (`space.rs`).
//!
//! One job per file: `device.rs` (file I/O), `log.rs` (records, log heads, batches),
//! `space.rs` (segments, live bytes, free list, reclaim), `policy.rs` (writeback: watermarks,
//! coldness, budget), `gc.rs` (garbage collection).
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
//!
//! # Durability and faults
//! A slot points to a record only after the record's `pwrite` returned, so nothing is reported
//! written that is not in the file; `Store::flush` fsyncs the device. A failed write leaves
//! the page where it was (writeback) or fails the request with [`StoreError::Backing`]
//! (overflow); a failed or unverifiable read fails that request only. Each failure is logged
//! (the first ones, then one in a thousand) and counted in `bd_errors`.

pub mod device;
mod gc;
pub(crate) mod log;
mod policy;
pub(crate) mod space;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::config::BackingConfig;
use crate::error::StoreError;
pub use device::{BackingDevice, FileDevice, ReadBuf};
pub use gc::GcReport;
use log::{Batch, LogHead, HEADER};
pub use policy::{MaintenanceReport, WritebackBudget, WritebackReport};
use space::SpaceMap;

/// Errors logged in full before the log thins out to one in `LOG_EVERY`.
const LOG_FIRST: u64 = 20;
const LOG_EVERY: u64 = 1000;

pub(crate) struct Backing {
    pub dev: Box<dyn BackingDevice>,
    pub space: SpaceMap,
    pub cfg: BackingConfig,
    overflow: Mutex<LogHead>,
    pub maint: Mutex<Maint>,
    pub ctr: BackingCounters,
}

/// State of the maintenance side (writeback and GC), under `Backing::maint`.
pub(crate) struct Maint {
    pub head: LogHead,
    pub batch: Batch,
    /// Writeback passed the high watermark and runs until the low one.
    pub draining: bool,
    /// Where the next writeback scan starts, so equally cold pages take turns.
    pub cursor: u64,
}

/// The backing tier's own counters (Relaxed, as all statistics: see `stats.rs`).
#[derive(Default)]
pub(crate) struct BackingCounters {
    pub overflow_pages: AtomicU64,
    pub writeback_pages: AtomicU64,
    /// Payload bytes written by writeback, against `writeback_limit_bytes`.
    pub writeback_bytes: AtomicU64,
    pub gc_pages: AtomicU64,
    pub promoted_pages: AtomicU64,
    pub errors: AtomicU64,
}

/// A buffer of `bytes` whose every page has been written, so that it is resident now (under
/// the swap servers' `mlockall`, for good). Freshly allocated memory may be untouched zero
/// pages that the first use would fault in; where that first use holds a slot lock or serves a
/// request, the fault could wait in reclaim (docs/swap.md, "Memory pressure"). The fill is not
/// zero so that it cannot become a `calloc`.
pub(crate) fn resident_bytes(bytes: usize) -> Vec<u8> {
    let mut v = vec![0xa5u8; bytes];
    std::hint::black_box(&mut v);
    v
}

impl Backing {
    /// Opens (creating if needed) the configured file or device.
    pub fn open(cfg: &BackingConfig, disksize_bytes: u64) -> Result<Backing, StoreError> {
        let dev = FileDevice::open(&cfg.path, cfg.size_bytes, disksize_bytes)
            .map_err(|e| StoreError::Config(format!("cannot open the backing device {}: {e}", cfg.path.display())))?;
        Backing::with_device(cfg, Box::new(dev))
    }

    pub fn with_device(cfg: &BackingConfig, dev: Box<dyn BackingDevice>) -> Result<Backing, StoreError> {
        let space = SpaceMap::new(dev.size_bytes(), cfg.segment_bytes);
        if space.num_segments() < 4 {
            return Err(StoreError::Config(format!(
                "backing device {} has {} bytes: at least 4 segments of {} bytes are needed",
                dev.describe(),
                dev.size_bytes(),
                cfg.segment_bytes
            )));
        }
        Ok(Backing {
            dev,
            space,
            cfg: cfg.clone(),
            overflow: Mutex::new(LogHead::default()),
            // The batch is reserved (and resident) now: writeback copies pages into it under
            // their slot locks, where growing it would make requests wait on an allocation.
            maint: Mutex::new(Maint { head: LogHead::default(), batch: Batch::reserved(), draining: false, cursor: 0 }),
            ctr: BackingCounters::default(),
        })
    }

    /// Writes one record (the overflow path of a request). `rec` is the record buffer with
    /// the payload at `rec[HEADER..]`. Returns its location once it is in the file.
    pub fn write_record(&self, index: u64, rec: &mut [u8]) -> Result<u64, StoreError> {
        let (loc, gen) = self
            .overflow
            .lock()
            .reserve(&self.space, rec.len() as u64, false)
            .map_err(|_| self.error(index, format!("the backing device {} is full", self.dev.describe())))?;
        let crc = log::record_crc(gen, loc, index, &rec[HEADER..]);
        rec[..HEADER].copy_from_slice(&crc.to_le_bytes());
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
    /// for the error) into the worker's read buffer; returns them.
    pub fn read_raw<'a>(&self, index: u64, loc: u64, len: usize, scratch: &'a mut ReadBuf) -> Result<&'a [u8], StoreError> {
        self.dev.read_into(scratch, loc, len).map_err(|e| self.error(index, format!("read of {len} bytes at byte {loc} failed: {e}")))
    }

    /// Verifies the record of slot `index` read from `loc` (its segment pinned).
    pub fn check(&self, index: u64, loc: u64, rec: &[u8]) -> Result<(), StoreError> {
        let gen = self.space.gen(self.space.seg_of(loc));
        log::verify(gen, loc, index, rec).map_err(|reason| {
            self.log(index, &reason);
            StoreError::Corrupt { index, reason }
        })
    }

    /// Frees the record of a slot entry that was just taken out of its slot.
    pub fn free(&self, loc: u64, len: u16) {
        self.space.free(loc, (HEADER + len as usize) as u64);
    }

    pub fn sync(&self) -> Result<(), StoreError> {
        self.dev.sync().map_err(|e| self.error(u64::MAX, format!("fsync of {} failed: {e}", self.dev.describe())))
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
            eprintln!("compcache: backing device {}: {reason}{page} [error {} so far]", self.dev.describe(), n + 1);
        }
    }
}
