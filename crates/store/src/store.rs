//! The store: the facade that composes the layers (`lib.rs` lists the floors), and every
//! public method of [`Store`]. It owns the RAM layer (`ram/`: slots, pool, counters, clock,
//! memory limit), the backing tier, cache mode and recompression, and hands each the layer
//! under it: cache mode gets the RAM layer, the tiers that move pages a `Mover`. In cache
//! mode the byte-granular methods branch into `cache/` once at the top.
//!
//! Without an origin, the read, write and discard paths are here, over the RAM layer's
//! halves. The write path reads top to bottom, as zram's does: same-filled check, compress,
//! huge check ([`Ram::classify`]), allocate and copy ([`Ram::alloc`]), lock the slot only to
//! swap the entry in, free the old entry, update statistics ([`Mover::replaced`]). The new object is allocated before the old one is freed, so a write that
//! fails (memory limit) leaves the page's old contents readable.
//!
//! With a backing device (`backing/`), a page that the pool cannot take (memory limit) goes to
//! the device instead: only the allocation failure branches off, so the RAM path is unchanged.
//! Reads of a `BACKING` slot pin the record's segment under the slot lock and hand the rest
//! (the `pread`, verification, promotion) to the backing tier's read path (`backing/read.rs`),
//! after releasing the lock.
//!
//! Every public method of [`Store`] is here; the maintenance ones (writeback, GC) are one call
//! into the backing tier each. Locking rules are in `slot.rs`; the pool's contract in
//! `zspool/mod.rs`. This file locks slots (as every request path does) but never touches the
//! pool: objects are allocated, read and freed by the RAM layer (`ram/mod.rs` and
//! `ram/mover.rs`, the only code that touches both), and every entry this file takes out of a
//! slot goes back to it to be freed, once. The fields of [`Store`] are private; the backing
//! tier and recompression get a [`Mover`], cache mode the [`Ram`].

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::backing::log::HEADER as RECORD_HEADER;
use crate::backing::read::{self, Pending, PendingList, MAX_RUN_BYTES, READ_CHUNK_PAGES};
use crate::backing::tuning::{WritebackSettings, WritebackTuning};
use crate::backing::{self, Backing, BackingDevice, GcReport, MaintenanceReport};
use crate::backing::{WritebackBudget, WritebackReport};
use crate::buf::resident_bytes;
use crate::cache::{Cache, FileOrigin, OriginDevice};
use crate::compress::strong::StrongDecoder;
use crate::compress::{Backend, Codec, MAX_COMPRESSED_BYTES};
use crate::config::{Config, DEFAULT_READAHEAD_MAX_BYTES, ORIGIN_WITH_BACKING};
use crate::context::Context;
use crate::error::StoreError;
use crate::latency::{self, Latency};
use crate::ram::mover::{Mover, Records};
use crate::ram::{Encoded, Fetched, KeptRecords, Ram};
use crate::recompress::{RecompressReport, RecompressSettings, RecompressTuning, Recompressor};
use crate::slot::{Entry, Kind, SlotGuard};
use crate::stats::{BackingGauges, Counters, Gauges, RecompressGauges, Stats};
use crate::zspool::PoolFull;
use crate::{RecoveryReport, PAGE, PAGE_SIZE};

/// Why a store with an origin is not taken over.
const NOT_KEPT: &str = "a device with an origin (cache mode) cannot be taken over by a successor: part of \
                        its state (the cache's state) is not in the state file";

/// How many pages [`Store::prefault`] makes resident before it hands them to the pool (256 KiB:
/// one chunk is a fraction of a millisecond of faults on an idle machine, and the pool's lock
/// is taken twice per chunk).
pub const PREFAULT_CHUNK_PAGES: u64 = 64;

/// A compressed RAM block device. Share it between threads in an `Arc`; give each worker
/// thread its own [`Context`].
pub struct Store {
    /// Slots, pool, counters, clock, memory limit (`ram/`).
    ram: Ram,
    backend: Box<dyn Backend>,
    cfg: Config,
    /// Fault-free mode: how long (µs) a write that found no resident pool page waits for the
    /// reserve's keeper before it fails (0: it fails at once).
    reserve_wait_us: AtomicU64,
    /// A write waited the whole `reserve_wait_us` and the keeper added nothing: until it adds
    /// pages ([`Store::prefault`]), writes that find no page fail at once instead of waiting
    /// too. Set and cleared with relaxed order: a hint for how long to wait, never for what a
    /// write stores.
    reserve_starved: AtomicBool,
    backing: Option<Backing>,
    /// Cache mode: the origin and the cache's own state (`cache/`).
    cache: Option<Cache>,
    /// Background recompression and its dictionaries (`recompress/`); `None` when off.
    pub(crate) recomp: Option<Recompressor>,
    /// Every context's request latency histograms (`latency.rs`).
    latency: latency::Registry,
}

impl Store {
    /// Creates a device. Memory is committed only as pages are stored.
    pub fn new(cfg: Config) -> Result<Store, StoreError> {
        cfg.validate()?;
        if let Some(o) = &cfg.origin {
            let origin = FileOrigin::open(&o.path)?;
            return Store::with_origin(cfg, Box::new(origin));
        }
        // The cold tier's device is made in the state file, once it exists (`build`).
        let dev = match &cfg.backing {
            Some(b) if !b.in_ram() => Some(Backing::open_device(b, cfg.disksize_bytes)?),
            _ => None,
        };
        Store::build(cfg, dev, None)
    }

    /// Creates a device in cache mode in front of `origin` instead of opening
    /// `cfg.origin.path` (a test injecting faults, a front end with its own origin). The
    /// readahead comes from `cfg.origin` if set, else the default. `cfg.disksize_bytes` must
    /// equal the origin's size, and `cfg.mem_limit_bytes` (the budget) must be set.
    pub fn with_origin(cfg: Config, origin: Box<dyn OriginDevice>) -> Result<Store, StoreError> {
        cfg.validate()?;
        // `validate` checks these for `cfg.origin`; the origin here may come without it.
        if cfg.backing.is_some() {
            return Err(StoreError::Config(ORIGIN_WITH_BACKING.into()));
        }
        if cfg.mem_limit_bytes == 0 {
            return Err(StoreError::Config(format!(
                "origin {}: cache mode needs a memory budget (--mem-limit, e.g. 10% of RAM)",
                origin.describe()
            )));
        }
        if cfg.disksize_bytes != origin.size_bytes() {
            return Err(StoreError::Config(format!(
                "origin {} is {} bytes but the device size is {} bytes: in cache mode the device is the origin's size",
                origin.describe(),
                origin.size_bytes(),
                cfg.disksize_bytes
            )));
        }
        let ra = cfg.origin.as_ref().map_or(DEFAULT_READAHEAD_MAX_BYTES, |o| o.readahead_max_bytes);
        Store::build(cfg, None, Some(Cache::new(origin, ra)))
    }

    /// Creates a device whose backing tier uses `dev` instead of opening `cfg.backing.path`
    /// (which must be set, for the policy): a front end with its own device, or a test
    /// injecting faults.
    pub fn with_backing_device(cfg: Config, dev: Box<dyn BackingDevice>) -> Result<Store, StoreError> {
        cfg.validate()?;
        if cfg.backing.is_none() {
            return Err(StoreError::Config("a backing device needs a backing configuration".into()));
        }
        Store::build(cfg, Some(dev), None)
    }

    /// Takes over the device whose state file a dead (or stopped) store left in `fd`
    /// (`ram/recover.rs`): checks the file's layout version and the device's geometry and
    /// algorithm against `cfg`, undoes the entry changes the dead process had not finished,
    /// frees what they left, rebuilds the pool and recomputes the counters. Pages it cannot
    /// vouch for read as I/O errors (the report counts them). The error is one line saying what
    /// is wrong; the file is then untouched. With a backing file or block device, the device
    /// at `cfg.backing.path` must be the one the file names (`backing/keep.rs`): it is reopened
    /// without being discarded and its records are vouched for by the slots that name them.
    /// With the cold tier, its blocks are in the file too (`backing/blocks.rs`): the write a
    /// dead process had in flight is undone, every published block is served (that undoing,
    /// which frees a half-written slot, may have run before a later check refuses: it leaves
    /// the blocks as they read, and a next try finds nothing to undo). Stores with an
    /// origin (cache mode) are not taken over: part of their state is not in the file
    /// ([`Store::state_fd`]).
    pub fn recover(cfg: Config, fd: OwnedFd) -> Result<(Store, RecoveryReport), StoreError> {
        cfg.validate()?;
        if cfg.origin.is_some() {
            return Err(StoreError::Config(NOT_KEPT.into()));
        }
        let refused = |e: String| StoreError::Config(format!("cannot take the device over: {e}"));
        let opened = Ram::open_state(fd, cfg.disksize_bytes / PAGE, cfg.huge_threshold_bytes, cfg.algorithm.name()).map_err(refused)?;
        // The backing tier checks its part before anything changes: its device is reopened,
        // not discarded, and left as it is if the takeover is refused.
        let backing = match (&cfg.backing, opened.tier_region()) {
            (Some(b), Some(region)) => Some(Backing::take_over(b, &region).map_err(refused)?),
            (Some(b), None) => {
                let what = if b.in_ram() { "the cold tier".to_string() } else { b.path.display().to_string() };
                return Err(refused(format!("the state file is of a device without a backing device, the configuration has {what}")));
            }
            (None, Some(_)) => {
                return Err(refused("the state file is of a device with a backing device: configure it (--backing PATH)".into()))
            }
            (None, None) => None,
        };
        let claims = backing.as_ref().map(|b| b as &dyn KeptRecords);
        let (ram, mut report) = opened.recover(cfg.mem_limit_bytes, claims).map_err(refused)?;
        report.cold_writes_undone = backing.as_ref().map_or(0, |b| b.cold_writes_undone);
        let store = Store::build_over(cfg, ram, backing, None)?;
        if let Some(b) = &store.backing {
            b.taken_over();
        }
        Ok((store, report))
    }

    /// The state file holding every page of the device (`ram/`): keep this descriptor open
    /// (a supervisor, systemd's file-descriptor store) and a successor can take the device over
    /// with [`Store::recover`] after this process dies. With a backing file or block device the
    /// file also holds what the tier needs (`backing/keep.rs`: the run's key, the segments'
    /// generations, the device's identity), and the records stay on the device; with the cold
    /// tier, its compressed blocks and dictionary are in the file too (`backing/blocks.rs`).
    /// `None` for a store whose state is not all in it (a backing device given as an object,
    /// which no successor can open again; cache mode): such a store dies with its process, and
    /// its successor would have nothing to serve.
    pub fn state_fd(&self) -> Option<BorrowedFd<'_>> {
        let kept = self.backing.as_ref().is_none_or(Backing::is_kept);
        (kept && self.cache.is_none()).then(|| self.ram.state_fd())
    }

    /// Leaves every page for a successor that takes the state file over ([`Store::recover`]),
    /// as a kill would: from now on neither dropping the store nor [`Store::close_backing`]
    /// discards the records on a backing device (without one, a drop leaves every page
    /// anyway). For a server handing its device over (an upgrade): call it, stop serving,
    /// exit; its threads may still hold the store. Irreversible.
    pub fn hand_over(&self) {
        if let Some(b) = &self.backing {
            b.leave_for_successor();
        }
    }

    /// Where each part of the state is in the state file (tests and fuzz targets that damage
    /// it on purpose).
    #[cfg(any(test, feature = "testing"))]
    pub fn state_regions(&self) -> crate::testing::StateRegions {
        let l = self.ram.layout();
        crate::testing::StateRegions {
            journal: l.journal,
            dicts: l.dicts,
            slots: l.slots,
            descs: l.arena.descs_offset,
            pages: l.arena.pages_offset,
            len: l.file_len,
            num_pages: l.num_pages,
            capacity_pages: l.capacity_pages as u64,
        }
    }

    fn build(cfg: Config, dev: Option<Box<dyn BackingDevice>>, cache: Option<Cache>) -> Result<Store, StoreError> {
        let tier_bytes = match (&cfg.backing, &dev) {
            (Some(b), d) => Backing::kept_bytes(b, d.as_deref()),
            _ => 0,
        };
        let ram = Ram::new(cfg.disksize_bytes / PAGE, cfg.mem_limit_bytes, cfg.huge_threshold_bytes, cfg.algorithm.name(), tier_bytes)
            .map_err(|(what, e)| {
                // A refused start leaves no backing file it created behind.
                if let Some(d) = &dev {
                    let _ = d.remove_if_created();
                }
                StoreError::Config(format!("cannot reserve {what}: {e}"))
            })?;
        let backing = match (&cfg.backing, dev) {
            (Some(b), Some(d)) => Some(Backing::with_device(b, d, ram.tier_region())?),
            (Some(b), None) => Some(Backing::cold(b, &ram.tier_region().expect("kept_bytes sized the cold tier's region"))?),
            _ => None,
        };
        Store::build_over(cfg, ram, backing, cache)
    }

    fn build_over(cfg: Config, ram: Ram, backing: Option<Backing>, cache: Option<Cache>) -> Result<Store, StoreError> {
        let recomp = match &cfg.recompress {
            Some(r) => Some(Recompressor::new(r.clone()).map_err(|e| {
                if let Some(b) = &backing {
                    b.abandon();
                }
                StoreError::Config(e)
            })?),
            None => None,
        };
        let backend = cfg.algorithm.backend(cfg.level);
        if let Some(b) = backing.as_ref().filter(|b| b.in_ram()) {
            b.maint.lock().raw = Some(backing::policy::RawPages {
                comp: backend.new_context(),
                strong: recomp.is_some().then(StrongDecoder::new),
                cbuf: resident_bytes(MAX_COMPRESSED_BYTES).into_boxed_slice(),
                page: resident_bytes(PAGE_SIZE).into_boxed_slice(),
            });
        }
        Ok(Store {
            ram,
            backend,
            reserve_wait_us: AtomicU64::new(0),
            reserve_starved: AtomicBool::new(false),
            backing,
            cache,
            recomp,
            latency: latency::Registry::default(),
            cfg,
        })
    }

    pub fn disksize_bytes(&self) -> u64 {
        self.ram.num_pages() * PAGE
    }

    pub fn num_pages(&self) -> u64 {
        self.ram.num_pages()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A new per-worker context. Its buffers are resident when it is made (written once), so
    /// that their first use in a request does not fault. Made on the thread that will use it:
    /// it also prepares that thread's own state for reading the backing device (the cold
    /// tier's decompression context, `BackingDevice::prepare_reader`).
    pub fn context(&self) -> Context {
        if let Some(b) = &self.backing {
            b.dev.prepare_reader();
        }
        Context::new(
            self.backend.new_context(),
            self.recomp.is_some(),
            // Room for a compressor's worst case too: promotion compresses into it.
            RECORD_HEADER + MAX_COMPRESSED_BYTES,
            self.backing.as_ref().map(|_| MAX_RUN_BYTES as usize),
            self.cache.as_ref().map(Cache::io_buf_bytes),
            self.latency.register(),
        )
    }

    /// The request latency histograms of [`Store::read`] and [`Store::write`], summed over
    /// every context (`latency.rs`).
    pub fn latency(&self) -> Latency {
        self.latency.snapshot()
    }

    /// Whether this store is in cache mode (it fronts an origin, `cache/`).
    pub fn is_cache(&self) -> bool {
        self.cache.is_some()
    }

    // --- byte-granular requests (what front ends call) -----------------------------------------

    /// Reads `buf.len()` bytes at `offset`. Any alignment. Its latency is recorded
    /// ([`Store::latency`]).
    pub fn read(&self, ctx: &mut Context, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let start = Instant::now();
        let r = self.read_bytes(ctx, offset, buf);
        ctx.lat.record(latency::Op::Read, start.elapsed());
        r
    }

    fn read_bytes(&self, ctx: &mut Context, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.check_range(offset, buf.len() as u64)?;
        if let Some(c) = &self.cache {
            return c.read(&self.ram, ctx, offset, buf);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (index, in_page) = (pos / PAGE, (pos % PAGE) as usize);
            let n = (PAGE_SIZE - in_page).min(buf.len() - done);
            if n == PAGE_SIZE && self.backing.is_some() {
                // Every whole page from here on at once: records adjacent on the device are
                // read with one pread.
                let pages = (buf.len() - done) / PAGE_SIZE;
                self.read_pages(ctx, index, &mut buf[done..done + pages * PAGE_SIZE])?;
                done += pages * PAGE_SIZE;
                continue;
            } else if n == PAGE_SIZE {
                self.read_page(ctx, index, &mut buf[done..done + n])?;
            } else {
                let mut page = std::mem::take(&mut ctx.page);
                let r = self.read_page(ctx, index, &mut page);
                buf[done..done + n].copy_from_slice(&page[in_page..in_page + n]);
                ctx.page = page;
                r?;
            }
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `offset`. Whole pages take the write path; partial pages are
    /// read-modify-written under their slot lock. Its latency is recorded ([`Store::latency`]).
    pub fn write(&self, ctx: &mut Context, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let start = Instant::now();
        let r = self.write_bytes(ctx, offset, data);
        ctx.lat.record(latency::Op::Write, start.elapsed());
        r
    }

    fn write_bytes(&self, ctx: &mut Context, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.check_range(offset, data.len() as u64)?;
        if let Some(c) = &self.cache {
            return c.write(&self.ram, ctx, offset, data);
        }
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let (index, in_page) = (pos / PAGE, (pos % PAGE) as usize);
            let n = (PAGE_SIZE - in_page).min(data.len() - done);
            if n == PAGE_SIZE {
                self.write_page(ctx, index, &data[done..done + n])?;
            } else {
                self.update_page(ctx, index, |page| page[in_page..in_page + n].copy_from_slice(&data[done..done + n]))?;
            }
            done += n;
        }
        Ok(())
    }

    /// Frees the whole pages inside `offset..offset + len` (trim, swap-free-notify). Partial
    /// pages at either end are left as they are, as zram does.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), StoreError> {
        self.check_range(offset, len)?;
        if let Some(c) = &self.cache {
            return c.discard(&self.ram, offset, len);
        }
        let first = offset.div_ceil(PAGE);
        let end = (offset + len) / PAGE;
        for index in first..end {
            self.discard_page(index);
        }
        Ok(())
    }

    /// Zeroes `offset..offset + len`: whole pages are freed (they read back as zeroes),
    /// partial pages are rewritten.
    pub fn write_zeroes(&self, ctx: &mut Context, offset: u64, len: u64) -> Result<(), StoreError> {
        self.check_range(offset, len)?;
        if let Some(c) = &self.cache {
            return c.write_zeroes(&self.ram, ctx, offset, len);
        }
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let (index, in_page) = (pos / PAGE, (pos % PAGE) as usize);
            let n = (PAGE - in_page as u64).min(end - pos) as usize;
            if n == PAGE_SIZE {
                self.discard_page(index);
            } else {
                self.update_page(ctx, index, |page| page[in_page..in_page + n].fill(0))?;
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// What FLUSH and FUA ask of the device: that every completed write is kept. Every write
    /// is in the store (RAM, or a record on the backing device whose `pwrite` returned) before
    /// it completes, and every later read finds it, so there is nothing left to do: this
    /// returns at once. The backing device is not fsync'd: the index of its records lives in
    /// this process's memory, so they are useless after it ends, and an fsync would make
    /// nothing durable (docs/backing.md, "Flush and FUA"). Front ends still order a FLUSH
    /// after the writes before it (crates/nbd).
    ///
    /// In cache mode the origin is the durable copy: FLUSH is its fdatasync (every write
    /// already reached it: write-through), and an error is an I/O error for the client.
    pub fn flush(&self) -> Result<(), StoreError> {
        match &self.cache {
            Some(c) => c.flush(&self.ram),
            None => Ok(()),
        }
    }

    /// Ends the backing device's life before the process exits: discards all of it (a file
    /// is emptied to its superblock, a block device gets BLKDISCARD), so that no page data
    /// outlives the run. Dropping the store does the same; a server that exits without
    /// dropping it (it is shared with threads) calls this once it serves no more requests.
    /// Pages still on the device read as I/O errors afterwards. Idempotent.
    pub fn close_backing(&self) {
        if let Some(b) = &self.backing {
            b.close();
        }
    }

    /// A start refused after the store was made: [`Store::close_backing`], and remove the
    /// backing file if this store created it (only that file: an existing one is kept, empty).
    /// A device taken over ([`Store::recover`]) is left with its records instead, for another
    /// try with the same state file.
    pub fn abandon_backing(&self) {
        if let Some(b) = &self.backing {
            b.abandon();
        }
    }

    /// What `offset..offset + len` holds, as consecutive [`Extent`]s from `offset` on: adjacent
    /// pages in the same state are merged, the first and last extent are cut at the range's
    /// ends (so they never reach outside it, and either may be part of a page). For
    /// block status (NBD's `base:allocation`): a client skips reading and copying holes.
    ///
    /// Lazy and allocation-free: the iterator looks at a slot only when it gets there, so a
    /// caller that wants one extent (or a bounded number) takes that many and the rest of the
    /// range is never scanned.
    ///
    /// A snapshot, not a lock: a page written or discarded concurrently may be reported in
    /// either state, as the protocol allows (block status is only meaningful without concurrent
    /// writers). Every write or discard completed before the call is seen. Slots are looked at
    /// with `Slot::peek` (slot.rs rule 5), and only a same-filled slot is locked, to read its
    /// fill word. Not locking the others matters beyond contention: the slot table is committed
    /// only where it is touched, and a lock would dirty (commit) the table of a sparse device
    /// that a client merely maps; a peek of an untouched part reads the shared zero page.
    pub fn block_status(&self, offset: u64, len: u64) -> Result<Extents<'_>, StoreError> {
        self.check_range(offset, len)?;
        Ok(Extents { store: self, pos: offset, end: offset + len })
    }

    /// What page `index` holds, for [`Store::block_status`].
    fn allocation(&self, index: u64) -> Allocation {
        let slot = &self.ram.slots()[index as usize];
        match slot.peek().kind {
            Kind::Empty => Allocation::Hole,
            // The fill word is `data`, read only under the lock (rule 1); the kind may have
            // changed since the peek, so the locked entry decides.
            Kind::Same => match slot.lock().entry() {
                Entry::Empty | Entry::Same(0) => Allocation::Hole,
                _ => Allocation::Data,
            },
            // A lost page is data (it reads as an error, not as zeros).
            Kind::Compressed | Kind::Huge | Kind::Backing | Kind::Lost => Allocation::Data,
        }
    }

    /// Whether a backing device is configured.
    pub fn has_backing(&self) -> bool {
        self.backing.is_some()
    }

    /// Counts a request a front end rejected before it reached the store.
    pub fn note_invalid_io(&self) {
        Counters::inc(&self.ram.counters().invalid_io);
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), StoreError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.disksize_bytes() => Ok(()),
            _ => {
                self.note_invalid_io();
                Err(StoreError::OutOfRange { offset, len, disksize_bytes: self.disksize_bytes() })
            }
        }
    }

    // --- page operations -----------------------------------------------------------------------

    /// Stores one whole page at slot `index`.
    pub fn write_page(&self, ctx: &mut Context, index: u64, page: &[u8]) -> Result<(), StoreError> {
        assert_eq!(page.len(), PAGE_SIZE);
        if let Some(c) = &self.cache {
            return c.write(&self.ram, ctx, index * PAGE, page);
        }
        Counters::inc(&self.ram.counters().num_writes);
        let entry = match self.encode(ctx, index, page) {
            Err(StoreError::NoSpace { .. }) if self.ram.pool().compactable_pages() > 0 => {
                // Fragmentation, not data, filled the pool: compact once and retry.
                self.compact();
                self.encode(ctx, index, page)
            }
            r => r,
        };
        let entry = match entry {
            Err(e @ StoreError::NoSpace { .. }) => self.encode_awaiting_reserve(ctx, index, page).unwrap_or(Err(e)),
            r => r,
        };
        let entry = entry.inspect_err(|_| Counters::inc(&self.ram.counters().failed_writes))?;
        let old = {
            let mut g = self.ram.slots()[index as usize].lock();
            g.touch(self.ram.tick());
            g.replace(self.ram.journal(), index, entry)
        };
        self.installed(entry, old);
        Ok(())
    }

    /// A write found no resident pool page in fault-free mode. If the reserve's keeper can
    /// still add pages, waits for it (polling every millisecond, no lock held) up to
    /// [`Store::set_reserve_wait`], then fails as before. Bounded, so it cannot deadlock: if
    /// the keeper itself waits in reclaim for swap-outs, the write fails with ENOSPC and the
    /// kernel keeps the page and retries it. Without the wait such a write fails at once,
    /// and the kernel logs "Write-error on swap-device" for each.
    ///
    /// One wait that ends with nothing added marks the reserve starved, and then writes fail
    /// at once until the keeper adds pages: a keeper that waits in reclaim for this device's
    /// own swap-outs (a successor that just took a device over with the machine out of memory)
    /// must not have every write wait in turn, each queue's requests behind them, reads
    /// included (a VM `global-kill` run with 50 ms per write: the device's reads stalled for
    /// minutes).
    #[cold]
    fn encode_awaiting_reserve(&self, ctx: &mut Context, index: u64, page: &[u8]) -> Option<Result<Entry, StoreError>> {
        let wait = Duration::from_micros(self.reserve_wait_us.load(Relaxed));
        if wait.is_zero() || self.reserve_starved.load(Relaxed) {
            return None;
        }
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < wait && self.ram.pool().may_refill() {
            std::thread::sleep(Duration::from_millis(1));
            match self.encode(ctx, index, page) {
                Err(e @ StoreError::NoSpace { .. }) => last = Some(Err(e)),
                r => return Some(r),
            }
        }
        if last.is_some() {
            self.reserve_starved.store(true, Relaxed);
        }
        last
    }

    /// Reads one whole page at slot `index` into `out`.
    pub fn read_page(&self, ctx: &mut Context, index: u64, out: &mut [u8]) -> Result<(), StoreError> {
        assert_eq!(out.len(), PAGE_SIZE);
        if let Some(c) = &self.cache {
            return c.read(&self.ram, ctx, index * PAGE, out);
        }
        let r = match self.lock_and_fetch(ctx, index, out) {
            Fetched::Backing(p) => read::read_one_and_promote(&self.mover(), self.backing(), ctx, p, out),
            fetched => self.finish(ctx, index, fetched, out),
        };
        r.inspect_err(|_| Counters::inc(&self.ram.counters().failed_reads))
    }

    /// Reads whole pages `first..` into `out` (a multiple of a page), with a backing device:
    /// pages in RAM as `read_page` does; pages on the device are pinned under their slot
    /// locks, then read by `backing::read` (one `pread` per run of adjacent records),
    /// `READ_CHUNK_PAGES` at a time. Fails with the first error, after serving every page it
    /// can.
    fn read_pages(&self, ctx: &mut Context, first: u64, out: &mut [u8]) -> Result<(), StoreError> {
        let mut result = Ok(());
        let mut fail = |e: StoreError| {
            Counters::inc(&self.ram.counters().failed_reads);
            if result.is_ok() {
                result = Err(e);
            }
        };
        for (k, chunk) in out.chunks_mut(READ_CHUNK_PAGES * PAGE_SIZE).enumerate() {
            let chunk_first = first + (k * READ_CHUNK_PAGES) as u64;
            let mut pending = PendingList::new();
            for (j, page) in chunk.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let index = chunk_first + j as u64;
                match self.lock_and_fetch(ctx, index, page) {
                    Fetched::Backing(p) => pending.push(p),
                    fetched => {
                        if let Err(e) = self.finish(ctx, index, fetched, page) {
                            fail(e);
                        }
                    }
                }
            }
            read::read_pending(&self.mover(), self.backing(), ctx, pending, chunk_first, chunk, &mut fail);
        }
        result
    }

    /// A read's visit to slot `index`: counts it, records the access, and fetches the page
    /// under the slot lock.
    fn lock_and_fetch(&self, ctx: &mut Context, index: u64, out: &mut [u8]) -> Fetched<Pending<'_>> {
        Counters::inc(&self.ram.counters().num_reads);
        let mut g = self.ram.slots()[index as usize].lock();
        let last_access = g.ac_time();
        g.touch(self.ram.tick());
        self.fetch(&g, index, last_access, ctx, out)
    }

    /// Frees slot `index` (swap-free-notify).
    pub fn discard_page(&self, index: u64) {
        if let Some(c) = &self.cache {
            // The error is counted and logged (`origin_errors`); the page is dropped anyway.
            let _ = c.discard(&self.ram, index * PAGE, PAGE);
            return;
        }
        let old = self.ram.slots()[index as usize].lock().replace(self.ram.journal(), index, Entry::Empty);
        if old != Entry::Empty {
            Counters::inc(&self.ram.counters().notify_free);
            self.mover().release(old);
        }
    }

    /// Read-modify-write of part of a page, under the slot lock from start to end, so that two
    /// partial writes to one page cannot lose each other's bytes.
    fn update_page(&self, ctx: &mut Context, index: u64, modify: impl FnOnce(&mut [u8])) -> Result<(), StoreError> {
        Counters::inc(&self.ram.counters().num_writes);
        let mut page = std::mem::take(&mut ctx.page);
        let r = (|| {
            let mut g = self.ram.slots()[index as usize].lock();
            // The backing read (if any) is done under the slot lock (slot.rs rule 4), without
            // promotion, which would take the lock again.
            match self.fetch(&g, index, g.ac_time(), ctx, &mut page) {
                Fetched::Backing(p) => read::read_one(&self.mover(), self.backing(), ctx, &p, &mut page)?,
                fetched => self.finish(ctx, index, fetched, &mut page)?,
            }
            modify(&mut page);
            let entry = self.encode(ctx, index, &page)?;
            g.touch(self.ram.tick());
            let old = g.replace(self.ram.journal(), index, entry);
            drop::<SlotGuard>(g);
            self.installed(entry, old);
            Ok(())
        })();
        ctx.page = page;
        r.inspect_err(|_| Counters::inc(&self.ram.counters().failed_writes))
    }

    /// Turns a page into an entry: the RAM layer's checks and allocation ([`Ram::classify`],
    /// [`Ram::alloc`]), with the backing tier's two branches: an incompressible page goes to
    /// the device if the user wants those there, and a page the pool cannot take (memory
    /// limit) overflows to it. Takes no slot lock; the caller installs the entry.
    fn encode(&self, ctx: &mut Context, index: u64, page: &[u8]) -> Result<Entry, StoreError> {
        let e = self.ram.classify(&mut *ctx.comp, &mut ctx.cbuf, page);
        if let Encoded::Huge(raw) = e {
            if self.backing.as_ref().is_some_and(|b| b.cfg.incompressible) {
                return self.overflow(&mut ctx.rec, index, raw);
            }
        }
        match self.ram.alloc(index, e) {
            Ok(entry) => Ok(entry),
            Err(_) if self.backing.as_ref().is_some_and(|b| !b.in_ram()) => self.overflow(&mut ctx.rec, index, e.payload()),
            Err(PoolFull { used_bytes, limit_bytes }) => Err(StoreError::NoSpace { used_bytes, limit_bytes }),
        }
    }

    /// Stores a page's payload (compressed, or raw) on the backing device: the pool is full,
    /// or the page is incompressible and the user wants those on the device.
    #[cold]
    fn overflow(&self, rec: &mut [u8], index: u64, payload: &[u8]) -> Result<Entry, StoreError> {
        let b = self.backing.as_ref().expect("overflow needs a backing device");
        let rec = &mut rec[..RECORD_HEADER + payload.len()];
        rec[RECORD_HEADER..].copy_from_slice(payload);
        let loc = b.write_record(index, rec)?;
        Counters::inc(&self.ram.counters().bd_writes);
        Counters::inc(&b.ctr.overflow_pages);
        Ok(Entry::Backing { loc, len: payload.len() as u16, codec: Codec::PRIMARY })
    }

    /// [`Ram::fetch`] for slot `g` (slot `index`, last accessed at `last_access`): a page on
    /// the backing device has its record pinned for `backing::read`.
    fn fetch(&self, g: &SlotGuard<'_>, index: u64, last_access: u16, ctx: &mut Context, out: &mut [u8]) -> Fetched<Pending<'_>> {
        self.ram.fetch(g, ctx, out, |r| {
            // Under the slot lock the record is live, so its segment cannot be reused
            // before the pin is dropped (slot.rs rule 7).
            let pin = self.backing().space.pin(r.loc);
            Pending { index, loc: r.loc, len: r.len, codec: r.codec, dict: r.dict, last_access, pin }
        })
    }

    /// Completes a read of a page in RAM after the slot lock is released.
    fn finish(&self, ctx: &mut Context, index: u64, fetched: Fetched<Pending<'_>>, out: &mut [u8]) -> Result<(), StoreError> {
        self.ram.finish(ctx, index, fetched, out)
    }

    /// Statistics and freeing after a request replaced a slot's entry `old` with `new`.
    fn installed(&self, new: Entry, old: Entry) {
        self.mover().replaced(new, old);
    }

    /// The interface through which the backing tier, recompression and compaction move pages
    /// (`ram/mover.rs`).
    fn mover(&self) -> Mover<'_> {
        self.ram.mover(self.backing.as_ref().map(|b| b as &dyn Records))
    }

    /// The RAM layer, for the crate's unit tests.
    #[cfg(test)]
    pub(crate) fn ram(&self) -> &Ram {
        &self.ram
    }

    /// The backing tier, for paths only a `BACKING` entry or a configured device leads to.
    fn backing(&self) -> &Backing {
        self.backing.as_ref().expect("BACKING entries exist only with a backing device")
    }

    // --- maintenance ---------------------------------------------------------------------------

    /// Compacts the pool: moves objects out of sparse zspages and gives their pages back.
    /// Returns the number of pages released. Safe to run while I/O is in flight.
    pub fn compact(&self) -> u64 {
        self.ram.compact()
    }

    /// Moves the coldest pages to the backing device when pool memory is above the high
    /// watermark, until it is under the low one, writing at most `budget` bytes. Call it
    /// periodically from a background thread (or use [`Store::maintain`]); it takes no lock
    /// a request waits on for longer than one page copy. Without a backing device or a memory
    /// limit it does nothing.
    pub fn writeback(&self, budget: WritebackBudget) -> WritebackReport {
        let Some(b) = &self.backing else { return WritebackReport::default() };
        backing::policy::writeback(&self.mover(), b, budget)
    }

    /// Changes writeback's watermarks, rate or limit on the running device (a limit given is
    /// re-armed: that many more bytes from now on) and returns the settings after the change;
    /// an error, changing nothing, without a backing device or for watermarks out of order.
    pub fn tune_writeback(&self, t: &WritebackTuning) -> Result<WritebackSettings, StoreError> {
        let b = self
            .backing
            .as_ref()
            .ok_or_else(|| StoreError::Config("this device has no backing device (start it with --backing PATH)".into()))?;
        backing::tuning::tune(b, t).map_err(StoreError::Config)
    }

    /// Writeback's settings now; `None` without a backing device.
    pub fn writeback_settings(&self) -> Option<WritebackSettings> {
        self.backing.as_ref().map(backing::tuning::settings)
    }

    /// Writes back pages not accessed for at least `min_age_secs`, whatever the watermarks
    /// (zram's idle writeback), coldest first, at most `budget` bytes.
    pub fn writeback_idle(&self, min_age_secs: u64, budget: WritebackBudget) -> WritebackReport {
        let Some(b) = &self.backing else { return WritebackReport::default() };
        backing::policy::writeback_idle(&self.mover(), b, min_age_secs, budget)
    }

    /// Collects garbage on the backing device, moving at most about `max_bytes` of live
    /// records (GC may exceed it by one record, and ignores it when the device is nearly
    /// full, since a full device stops overflow writes). A front end calls it from its
    /// maintenance thread ([`Store::maintain`] does).
    pub fn gc(&self, max_bytes: u64) -> GcReport {
        let Some(b) = &self.backing else { return GcReport::default() };
        backing::gc::gc(&self.mover(), b, max_bytes)
    }

    /// Makes the calling thread (the front end's writeback thread) the one to wake when pool
    /// memory passes writeback's high watermark, and arms that wake-up while the pool is
    /// under it: call before each [`Store::maintain`]; if it returns true and the step found
    /// nothing to do, sleep with `std::thread::park_timeout`. The allocation that crosses the
    /// watermark unparks the thread (one futex call, once per arming; nothing allocated, no
    /// lock). Returns false, arming nothing, when the pool is over the watermark already (so
    /// a step that could not write back, at the writeback limit or with the device full, is
    /// not woken again by every allocation), and without a backing device or a memory limit.
    pub fn arm_writeback_wakeup(&self) -> bool {
        let Some(b) = &self.backing else { return false };
        let Some((high, _)) = backing::watermark_bytes(b, self.ram.mem_limit_bytes()) else { return false };
        let mark = high / PAGE;
        let w = self.ram.pool().high_watch();
        w.watch(mark);
        if self.ram.pool().total_pages() > mark {
            return false;
        }
        w.rearm();
        // An allocation that crossed between the check and the re-arming woke nobody.
        self.ram.pool().total_pages() <= mark
    }

    /// One step of background work for a front end's maintenance thread, called every
    /// `elapsed`: writeback within the configured rate, then GC with what is left of it.
    ///
    /// In cache mode (no backing device) it compacts the pool when compaction can give pages
    /// back: evictions free objects all over the zspages, and only compaction turns those
    /// holes into free pages (`docs/cache.md`).
    pub fn maintain(&self, elapsed: Duration) -> MaintenanceReport {
        if self.cache.is_some() && self.ram.pool().compactable_pages() > 0 {
            self.compact();
        }
        let Some(b) = &self.backing else { return MaintenanceReport::default() };
        backing::maintain(&self.mover(), b, elapsed)
    }

    /// One step of background recompression, called every `elapsed` from a thread of the
    /// front end's (at low priority): skipped while the device is busy, and within the
    /// configured CPU share of `elapsed` (`recompress/`). Compacts the pool afterwards when
    /// that gives pages back, so that the saving shows in `mem_used_total`. Does nothing when
    /// recompression is off.
    pub fn recompress_step(&self, elapsed: Duration) -> RecompressReport {
        let Some(r) = &self.recomp else { return RecompressReport::default() };
        let rep = crate::recompress::step(&self.mover(), r, elapsed, None, || self.context());
        if rep.done > 0 && self.ram.pool().compactable_pages() > 0 {
            self.compact();
        }
        rep
    }

    /// Changes recompression's tunables on the running device (from the next step on) and
    /// returns the settings after the change; an error if recompression is off or a value is
    /// out of range.
    pub fn tune_recompression(&self, t: &RecompressTuning) -> Result<RecompressSettings, StoreError> {
        let r = self
            .recomp
            .as_ref()
            .ok_or_else(|| StoreError::Config("recompression is off on this device (it was started with --recompress off)".into()))?;
        r.tune(t).map_err(StoreError::Config)
    }

    /// Recompression's settings now; `None` when it is off.
    pub fn recompression_settings(&self) -> Option<RecompressSettings> {
        self.recomp.as_ref().map(Recompressor::settings)
    }

    /// Whether background recompression is configured ([`crate::RecompressConfig`]).
    pub fn recompresses(&self) -> bool {
        self.recomp.is_some()
    }

    /// Runs recompression now, busy or not, for up to `cpu` of this thread's CPU time
    /// ([`Store::recompress_step`] runs it within the configured budget instead). Pages must still be idle
    /// for the configured age. Does nothing when recompression is off, or when another thread
    /// is recompressing right now. Compacts the pool afterwards, so that `mem_used_total`
    /// shows the saving.
    pub fn recompress(&self, cpu: Duration) -> RecompressReport {
        let Some(r) = &self.recomp else { return RecompressReport::default() };
        let ns = cpu.as_nanos().min(i64::MAX as u128) as i64;
        let rep = crate::recompress::step(&self.mover(), r, Duration::ZERO, Some(ns), || self.context());
        if rep.done > 0 {
            self.compact();
        }
        rep
    }

    /// Makes up to `pages` pool pages resident now and keeps them free for the I/O path: a
    /// swap server's reserve. The pages are faulted in with no store lock held, so a caller
    /// that waits in the kernel's reclaim here blocks no request. Under `mlockall` they stay
    /// resident. Bounded by the memory limit. Returns how many pages were added.
    ///
    /// The pages are handed to the pool [`PREFAULT_CHUNK_PAGES`] at a time, each chunk as soon
    /// as it is resident, and each clears a starved reserve: a keeper whose faults wait in
    /// reclaim feeds the writes waiting for it page run by page run, instead of holding
    /// thousands of faulted pages back until the whole top-up is done (the VM test's `fuse`
    /// step once failed 2972 swap-outs so, the reserve starved while a top-up was under way).
    pub fn prefault(&self, pages: u64) -> u64 {
        let mut added = 0;
        while added < pages {
            let n = self.ram.pool().prefault((pages - added).min(PREFAULT_CHUNK_PAGES));
            if n == 0 {
                break;
            }
            added += n;
            self.reserve_starved.store(false, Relaxed);
        }
        added
    }

    /// Makes every page of the slot table resident (under `mlockall`, locked), so that the I/O
    /// path takes no page fault on a slot: one write that changes nothing per page of slots,
    /// no data read or written (a cache's origin is not touched). A swap server calls it
    /// before serving.
    pub fn make_slot_table_resident(&self) {
        let per_page = PAGE_SIZE / std::mem::size_of_val(&self.ram.slots()[0]);
        for slot in self.ram.slots().iter().step_by(per_page) {
            slot.touch();
        }
    }

    /// Free pool pages that are resident (the reserve left; `mem_reserve_free` in stats).
    pub fn reserve_free_pages(&self) -> u64 {
        self.ram.pool().resident_free_pages()
    }

    /// Makes the calling thread the reserve's watcher: the pool allocation (a write's, or a
    /// background mover's) that leaves fewer than `low_pages` resident free pages unparks it
    /// (`std::thread::park`), once until [`Store::rearm_reserve_watch`]. So the keeper sleeps
    /// until the reserve is used instead of polling it; the wake-up is one futex call on the
    /// I/O path, which allocates nothing and takes no lock.
    pub fn watch_reserve(&self, low_pages: u64) {
        self.ram.pool().low_watch().watch(low_pages)
    }

    /// The watcher is about to look at the reserve: the next allocation under the mark wakes
    /// it again. Call before each look, then park.
    pub fn rearm_reserve_watch(&self) {
        self.ram.pool().low_watch().rearm()
    }

    /// Fault-free mode: the write path takes only resident pool pages (see
    /// [`Store::prefault`]) and fails with `NoSpace` rather than fault in a new page. For swap
    /// servers, whose page faults under memory pressure can wait on their own I/O.
    pub fn set_fault_free(&self, on: bool) {
        self.ram.pool().set_fault_free(on)
    }

    /// In fault-free mode, how long a write that finds no resident pool page waits for the
    /// reserve to be refilled (by [`Store::prefault`] on another thread) before it fails with
    /// `NoSpace`; never when the memory limit leaves no room to refill. Default: no wait.
    pub fn set_reserve_wait(&self, wait: Duration) {
        self.reserve_wait_us.store(wait.as_micros().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Pages that [`Store::compact`] could release now (an estimate).
    pub fn compactable_pages(&self) -> u64 {
        self.ram.pool().compactable_pages()
    }

    /// Changes the memory limit (bytes; 0 = none). Lowering it below current use does not
    /// evict anything; new allocations fail until use drops.
    pub fn set_mem_limit(&self, bytes: u64) {
        self.ram.set_mem_limit(bytes);
    }

    /// Resets `mem_used_max` to the current use (zram's `mem_used_max` reset).
    pub fn reset_mem_used_max(&self) {
        self.ram.pool().reset_max();
    }

    /// Moves the access-time clock forward by `secs` seconds, as if that much time had passed
    /// (tests and benchmarks age pages without sleeping; front ends never call it).
    #[doc(hidden)]
    pub fn advance_clock(&self, secs: u64) {
        self.ram.advance_clock(secs);
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let backing = self.backing.as_ref().map(|b| BackingGauges {
            counters: &b.ctr,
            size_bytes: b.space.num_segments() * b.space.seg_bytes,
            space_bytes: b.space.segments_in_use() * b.space.seg_bytes,
            mem_bytes: b.dev.mem_bytes(),
        });
        self.ram.counters().snapshot(Gauges {
            disksize: self.disksize_bytes(),
            comp_algorithm: self.cfg.algorithm.name(),
            mem_limit: self.ram.mem_limit_bytes(),
            pool_pages: self.ram.pool().total_pages(),
            pool_max_pages: self.ram.pool().max_pages(),
            pages_compacted: self.ram.pool().pages_compacted(),
            reserve_free_pages: self.ram.pool().resident_free_pages(),
            slot_table_bytes: self.ram.slot_table_bytes() as u64,
            backing,
            recompress: self.recomp.as_ref().map(|r| RecompressGauges { counters: &r.ctr, dicts: self.ram.dicts().summary() }),
        })
    }
}

/// What a range of the device holds, as [`Store::block_status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Reads as zeroes and holds no memory: never written, discarded (TRIM, swap-free-notify,
    /// a whole page of WRITE_ZEROES), or written with zeroes (a same-filled page whose fill
    /// word is 0, which, as in zram, is only its slot entry). Writing to it allocates.
    Hole,
    /// Anything else: a compressed or raw page, a page same-filled with a non-zero word, a page
    /// on the backing device.
    Data,
}

/// Consecutive bytes of the device in one [`Allocation`] state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len_bytes: u64,
    pub allocation: Allocation,
}

/// The extents of a range, from [`Store::block_status`]: consecutive, each one maximal (the
/// next one is in the other state), none empty, together exactly the range.
pub struct Extents<'a> {
    store: &'a Store,
    /// Where the next extent starts.
    pos: u64,
    /// The end of the range.
    end: u64,
}

impl Iterator for Extents<'_> {
    type Item = Extent;

    fn next(&mut self) -> Option<Extent> {
        if self.pos >= self.end {
            return None;
        }
        let start = self.pos;
        if let Some(c) = &self.store.cache {
            let (data, end) = c.extent(start, self.end);
            self.pos = end;
            return Some(Extent { len_bytes: end - start, allocation: if data { Allocation::Data } else { Allocation::Hole } });
        }
        let allocation = self.store.allocation(start / PAGE);
        let mut next = start / PAGE + 1;
        while next * PAGE < self.end && self.store.allocation(next) == allocation {
            next += 1;
        }
        self.pos = (next * PAGE).min(self.end);
        Some(Extent { len_bytes: self.pos - start, allocation })
    }
}
