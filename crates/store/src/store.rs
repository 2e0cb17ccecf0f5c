//! The store: read, write and discard paths over the slot table and the pool.
//!
//! The write path reads top to bottom, as zram's does: same-filled check, compress, huge
//! check, allocate and copy, lock the slot only to swap the entry in, free the old entry,
//! update statistics. The new object is allocated before the old one is freed, so a write that
//! fails (memory limit) leaves the page's old contents readable.
//!
//! With a backing device (`backing/`), a page that the pool cannot take (memory limit) goes to
//! the device instead: only the allocation failure branches off, so the RAM path is unchanged.
//! Reads of a `BACKING` slot pin the record's segment under the slot lock and `pread` it after
//! releasing the lock.
//!
//! Locking rules are in `slot.rs`; the pool's contract in `zspool/mod.rs`. This file and the
//! backing tier's `policy.rs` and `gc.rs` (which use the helpers marked for them here) are the
//! only users of both and keep both: every pool read happens under the owner's slot lock, and
//! every pool free happens once, for an entry just taken out of its slot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::backing::log::HEADER as RECORD_HEADER;
use crate::backing::space::Pin;
use crate::backing::{resident_bytes, Backing, BackingDevice, ReadBuf};
use crate::compress::{Backend, BackendContext, MAX_COMPRESSED_BYTES};
use crate::config::Config;
use crate::error::StoreError;
use crate::slot::{Entry, Kind, Slot, SlotGuard};
use crate::stats::{Counters, Stats};
use crate::zeroed::ZeroedSlice;
use crate::zspool::{Handle, PoolFull, ZsPool};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// Seconds per access-time tick (the slot keeps 16 bits of it).
const TICK_SECS: u64 = 1;
/// Most bytes one `pread` of adjacent backing records may cover.
const MAX_RUN_BYTES: u64 = 1 << 20;
/// Pages a multi-page read pins and reads at a time (their records fit in a run of
/// `MAX_RUN_BYTES`, nearly): the list of them lives on the stack, so the read allocates nothing.
const READ_CHUNK_PAGES: usize = MAX_RUN_BYTES as usize / PAGE_SIZE;

/// A compressed RAM block device. Share it between threads in an `Arc`; give each worker
/// thread its own [`Context`].
pub struct Store {
    pub(crate) slots: ZeroedSlice<Slot>,
    pub(crate) pool: ZsPool,
    backend: Box<dyn Backend>,
    cfg: Config,
    num_pages: u64,
    pub(crate) counters: Counters,
    created: Instant,
    /// Ticks added to the clock (tests age pages without sleeping).
    clock_offset: AtomicU64,
    pub(crate) mem_limit_bytes: AtomicU64,
    /// Fault-free mode: how long (µs) a write that found no resident pool page waits for the
    /// reserve's keeper before it fails (0: it fails at once).
    reserve_wait_us: AtomicU64,
    pub(crate) backing: Option<Backing>,
}

/// Per-worker scratch: a compression context and buffers, so that the I/O path takes no lock
/// for compression and does not allocate. Not shared: one per thread.
pub struct Context {
    pub(crate) comp: Box<dyn BackendContext>,
    pub(crate) cbuf: Box<[u8]>,
    page: Box<[u8]>,
    /// A backing record being written: header, then payload.
    rec: Box<[u8]>,
    /// Reads from the backing device: a single record, or a run of records (up to
    /// `MAX_RUN_BYTES`), in the aligned blocks an O_DIRECT read covers. Made resident at its
    /// full size when the store has a backing device (about 1 MiB), empty otherwise.
    read: ReadBuf,
}

/// What `fetch` left to do after releasing the slot lock.
enum Fetched<'a> {
    Done,
    /// `ctx.cbuf[..len]` holds compressed bytes to decompress into the output.
    Compressed(usize),
    /// The page is the record at `loc` on the backing device, whose segment `_pin` keeps.
    Backing {
        loc: u64,
        len: u16,
        _pin: Pin<'a>,
    },
}

impl Store {
    /// Creates a device. Memory is committed only as pages are stored.
    pub fn new(cfg: Config) -> Result<Store, StoreError> {
        cfg.validate()?;
        let backing = match &cfg.backing {
            Some(b) => Some(Backing::open(b, cfg.disksize_bytes)?),
            None => None,
        };
        Store::build(cfg, backing)
    }

    /// Creates a device whose backing tier uses `dev` instead of opening `cfg.backing.path`
    /// (which must be set, for the policy): a front end with its own device, or a test
    /// injecting faults.
    pub fn with_backing_device(cfg: Config, dev: Box<dyn BackingDevice>) -> Result<Store, StoreError> {
        cfg.validate()?;
        let b = cfg.backing.as_ref().ok_or_else(|| StoreError::Config("a backing device needs a backing configuration".into()))?;
        let backing = Backing::with_device(b, dev)?;
        Store::build(cfg, Some(backing))
    }

    fn build(cfg: Config, backing: Option<Backing>) -> Result<Store, StoreError> {
        let num_pages = cfg.disksize_bytes / PAGE;
        let os = |what: &str, e: std::io::Error| {
            // A refused start leaves no backing file it created behind.
            if let Some(b) = &backing {
                b.abandon();
            }
            StoreError::Config(format!("cannot reserve {what}: {e}"))
        };
        let slots = ZeroedSlice::new(num_pages as usize).map_err(|e| os("the slot table", e))?;
        // Address space for the pool: room for every slot raw plus fragmentation; only
        // touched pages cost memory.
        let capacity = (num_pages * 2 + 16384).min(u32::MAX as u64 - 3) as u32;
        let limit_pages = cfg.mem_limit_bytes.div_ceil(PAGE);
        let pool = ZsPool::new(capacity, limit_pages).map_err(|e| os("pool address space", e))?;
        Ok(Store {
            slots,
            pool,
            backend: cfg.algorithm.backend(cfg.level),
            num_pages,
            counters: Counters::default(),
            created: Instant::now(),
            clock_offset: AtomicU64::new(0),
            mem_limit_bytes: AtomicU64::new(cfg.mem_limit_bytes),
            reserve_wait_us: AtomicU64::new(0),
            backing,
            cfg,
        })
    }

    pub fn disksize_bytes(&self) -> u64 {
        self.num_pages * PAGE
    }

    pub fn num_pages(&self) -> u64 {
        self.num_pages
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// A new per-worker context. Its buffers are resident when it is made (written once), so
    /// that their first use in a request does not fault.
    pub fn context(&self) -> Context {
        Context {
            comp: self.backend.new_context(),
            cbuf: resident_bytes(MAX_COMPRESSED_BYTES).into_boxed_slice(),
            page: resident_bytes(PAGE_SIZE).into_boxed_slice(),
            rec: resident_bytes(RECORD_HEADER + PAGE_SIZE).into_boxed_slice(),
            read: match self.backing {
                Some(_) => ReadBuf::new(MAX_RUN_BYTES as usize),
                None => ReadBuf::empty(),
            },
        }
    }

    // --- byte-granular requests (what front ends call) -----------------------------------------

    /// Reads `buf.len()` bytes at `offset`. Any alignment.
    pub fn read(&self, ctx: &mut Context, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.check_range(offset, buf.len() as u64)?;
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
    /// read-modify-written under their slot lock.
    pub fn write(&self, ctx: &mut Context, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.check_range(offset, data.len() as u64)?;
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
    pub fn flush(&self) -> Result<(), StoreError> {
        Ok(())
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
        let slot = &self.slots[index as usize];
        match slot.peek().kind {
            Kind::Empty => Allocation::Hole,
            // The fill word is `data`, read only under the lock (rule 1); the kind may have
            // changed since the peek, so the locked entry decides.
            Kind::Same => match slot.lock().entry() {
                Entry::Empty | Entry::Same(0) => Allocation::Hole,
                _ => Allocation::Data,
            },
            Kind::Compressed | Kind::Huge | Kind::Backing => Allocation::Data,
        }
    }

    /// Whether a backing device is configured.
    pub fn has_backing(&self) -> bool {
        self.backing.is_some()
    }

    /// Counts a request a front end rejected before it reached the store.
    pub fn note_invalid_io(&self) {
        Counters::inc(&self.counters.invalid_io);
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
        Counters::inc(&self.counters.num_writes);
        let entry = match self.encode(ctx, index, page) {
            Err(StoreError::NoSpace { .. }) if self.pool.compactable_pages() > 0 => {
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
        let entry = entry.inspect_err(|_| Counters::inc(&self.counters.failed_writes))?;
        let old = {
            let mut g = self.slots[index as usize].lock();
            g.touch(self.tick());
            g.replace(entry)
        };
        self.account(entry, true);
        self.release(old);
        Ok(())
    }

    /// A write found no resident pool page in fault-free mode. If the reserve's keeper can
    /// still add pages, waits for it (polling every millisecond, no lock held) up to
    /// [`Store::set_reserve_wait`], then fails as before. Bounded, so it cannot deadlock: if
    /// the keeper itself waits in reclaim for swap-outs, the write fails with ENOSPC and the
    /// kernel keeps the page and retries it. Without the wait such a write fails at once,
    /// and the kernel logs "Write-error on swap-device" for each.
    #[cold]
    fn encode_awaiting_reserve(&self, ctx: &mut Context, index: u64, page: &[u8]) -> Option<Result<Entry, StoreError>> {
        let wait = Duration::from_micros(self.reserve_wait_us.load(Relaxed));
        let start = Instant::now();
        let mut last = None;
        while !wait.is_zero() && start.elapsed() < wait && self.pool.may_refill() {
            std::thread::sleep(Duration::from_millis(1));
            match self.encode(ctx, index, page) {
                Err(e @ StoreError::NoSpace { .. }) => last = Some(Err(e)),
                r => return Some(r),
            }
        }
        last
    }

    /// Reads one whole page at slot `index` into `out`.
    pub fn read_page(&self, ctx: &mut Context, index: u64, out: &mut [u8]) -> Result<(), StoreError> {
        assert_eq!(out.len(), PAGE_SIZE);
        Counters::inc(&self.counters.num_reads);
        let (fetched, last_access) = {
            let mut g = self.slots[index as usize].lock();
            let last_access = g.ac_time();
            g.touch(self.tick());
            (self.fetch(&g, ctx, out), last_access)
        };
        // Promotion needs the record's segment pinned until it installs (slot.rs rule 8): a
        // second pin, taken while `fetched` holds the first, so the segment cannot go between.
        let backed = match &fetched {
            Fetched::Backing { loc, len, _pin } => Some((Entry::Backing { loc: *loc, len: *len }, _pin.again())),
            _ => None,
        };
        self.finish(ctx, index, fetched, out).inspect_err(|_| Counters::inc(&self.counters.failed_reads))?;
        if let Some((entry, _pin)) = backed {
            let Entry::Backing { len, .. } = entry else { unreachable!("a backing entry") };
            self.maybe_promote(index, entry, last_access, &ctx.cbuf[RECORD_HEADER..RECORD_HEADER + len as usize]);
        }
        Ok(())
    }

    /// Reads whole pages `first..` into `out` (a multiple of a page), with a backing device:
    /// pages in RAM as `read_page` does; pages on the device are pinned under their slot
    /// locks, then read run by run, one `pread` per run of records adjacent on the device
    /// (writeback and overflow write neighbouring pages next to each other, and swap reads
    /// ahead), then verified and decompressed one by one; `READ_CHUNK_PAGES` at a time. Fails
    /// with the first error, after serving every page it can.
    fn read_pages(&self, ctx: &mut Context, first: u64, out: &mut [u8]) -> Result<(), StoreError> {
        let mut result = Ok(());
        for (k, chunk) in out.chunks_mut(READ_CHUNK_PAGES * PAGE_SIZE).enumerate() {
            let r = self.read_chunk(ctx, first + (k * READ_CHUNK_PAGES) as u64, chunk);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// `read_pages` for at most `READ_CHUNK_PAGES` pages.
    fn read_chunk(&self, ctx: &mut Context, first: u64, out: &mut [u8]) -> Result<(), StoreError> {
        let b = self.backing.as_ref().expect("read_pages is the backing device's read path");
        struct Deferred<'a> {
            page: usize,
            loc: u64,
            len: u16,
            last_access: u16,
            _pin: Pin<'a>,
        }
        // The pages to read from the device, in page order; on the stack (about 10 KiB).
        let mut deferred: [Option<Deferred<'_>>; READ_CHUNK_PAGES] = [const { None }; READ_CHUNK_PAGES];
        let mut num_deferred = 0;
        let mut result = Ok(());
        let fail = |r: &mut Result<(), StoreError>, e: StoreError| {
            Counters::inc(&self.counters.failed_reads);
            if r.is_ok() {
                *r = Err(e);
            }
        };
        for (k, page) in out.chunks_exact_mut(PAGE_SIZE).enumerate() {
            let index = first + k as u64;
            Counters::inc(&self.counters.num_reads);
            let (fetched, last_access) = {
                let mut g = self.slots[index as usize].lock();
                let last_access = g.ac_time();
                g.touch(self.tick());
                (self.fetch(&g, ctx, page), last_access)
            };
            match fetched {
                Fetched::Backing { loc, len, _pin } => {
                    deferred[num_deferred] = Some(Deferred { page: k, loc, len, last_access, _pin });
                    num_deferred += 1;
                }
                other => {
                    if let Err(e) = self.finish(ctx, index, other, page) {
                        fail(&mut result, e);
                    }
                }
            }
        }
        let deferred = &deferred[..num_deferred];
        let get = |i: usize| deferred[i].as_ref().expect("the first num_deferred are set");
        let rec_bytes = |d: &Deferred<'_>| (RECORD_HEADER + d.len as usize) as u64;
        let mut i = 0;
        while i < deferred.len() {
            let start = get(i).loc;
            let mut end = start + rec_bytes(get(i));
            let mut j = i + 1;
            while j < deferred.len() && get(j).loc == end && end - start + rec_bytes(get(j)) <= MAX_RUN_BYTES {
                end += rec_bytes(get(j));
                j += 1;
            }
            let run = i..j;
            i = j;
            let bytes = match b.read_raw(first + get(run.start).page as u64, start, (end - start) as usize, &mut ctx.read) {
                Ok(bytes) => bytes,
                Err(e) => {
                    for _ in run {
                        fail(&mut result, e.clone());
                    }
                    continue;
                }
            };
            for d in run.map(get) {
                let index = first + d.page as u64;
                let rec = &mut bytes[(d.loc - start) as usize..][..RECORD_HEADER + d.len as usize];
                if let Err(e) = b.check(index, d.loc, rec) {
                    fail(&mut result, e);
                    continue;
                }
                Counters::inc(&self.counters.bd_reads);
                let payload = &rec[RECORD_HEADER..];
                let page = &mut out[d.page * PAGE_SIZE..][..PAGE_SIZE];
                if payload.len() == PAGE_SIZE {
                    page.copy_from_slice(payload);
                } else if let Err(reason) = ctx.comp.decompress(payload, page) {
                    fail(&mut result, StoreError::Corrupt { index, reason });
                    continue;
                }
                self.maybe_promote(index, Entry::Backing { loc: d.loc, len: d.len }, d.last_access, payload);
            }
        }
        result
    }

    /// Frees slot `index` (swap-free-notify).
    pub fn discard_page(&self, index: u64) {
        let old = self.slots[index as usize].lock().replace(Entry::Empty);
        if old != Entry::Empty {
            Counters::inc(&self.counters.notify_free);
            self.release(old);
        }
    }

    /// Read-modify-write of part of a page, under the slot lock from start to end, so that two
    /// partial writes to one page cannot lose each other's bytes.
    fn update_page(&self, ctx: &mut Context, index: u64, modify: impl FnOnce(&mut [u8])) -> Result<(), StoreError> {
        Counters::inc(&self.counters.num_writes);
        let mut page = std::mem::take(&mut ctx.page);
        let r = (|| {
            let mut g = self.slots[index as usize].lock();
            let fetched = self.fetch(&g, ctx, &mut page);
            self.finish(ctx, index, fetched, &mut page)?;
            modify(&mut page);
            let entry = self.encode(ctx, index, &page)?;
            g.touch(self.tick());
            let old = g.replace(entry);
            drop::<SlotGuard>(g);
            self.account(entry, true);
            self.release(old);
            Ok(())
        })();
        ctx.page = page;
        r.inspect_err(|_| Counters::inc(&self.counters.failed_writes))
    }

    /// Turns a page into an entry: a fill word, or a new pool object (compressed or raw).
    /// Takes no slot lock; the caller installs the entry.
    fn encode(&self, ctx: &mut Context, index: u64, page: &[u8]) -> Result<Entry, StoreError> {
        if let Some(fill) = same_filled(page) {
            return Ok(Entry::Same(fill));
        }
        let owner = index as u32;
        let clen = ctx.comp.compress(page, &mut ctx.cbuf).filter(|&n| n <= self.cfg.huge_threshold_bytes && n < PAGE_SIZE - 8);
        let r = match clen {
            Some(n) => self.pool.alloc(&ctx.cbuf[..n], owner).map(|h| Entry::Compressed { handle: h.0, len: n as u16 }),
            None if self.backing.as_ref().is_some_and(|b| b.cfg.incompressible) => {
                return self.overflow(&mut ctx.rec, index, page);
            }
            None => self.pool.alloc(page, owner).map(|h| Entry::Huge { handle: h.0 }),
        };
        match r {
            Ok(entry) => Ok(entry),
            Err(_) if self.backing.is_some() => {
                let payload = match clen {
                    Some(n) => &ctx.cbuf[..n],
                    None => page,
                };
                self.overflow(&mut ctx.rec, index, payload)
            }
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
        Counters::inc(&self.counters.bd_writes);
        Counters::inc(&b.ctr.overflow_pages);
        Ok(Entry::Backing { loc, len: payload.len() as u16 })
    }

    /// Copies what slot `g` holds into `out`, or its compressed bytes into `ctx.cbuf`, under
    /// the slot lock.
    fn fetch(&self, g: &SlotGuard<'_>, ctx: &mut Context, out: &mut [u8]) -> Fetched<'_> {
        match g.entry() {
            Entry::Empty => out.fill(0),
            Entry::Same(w) => out.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&w.to_ne_bytes())),
            Entry::Compressed { handle, len } => {
                // SAFETY: we hold the owner's slot lock and the handle is the slot's live object.
                unsafe { self.pool.read(Handle(handle), &mut ctx.cbuf[..len as usize]) };
                return Fetched::Compressed(len as usize);
            }
            // SAFETY: as above.
            Entry::Huge { handle } => unsafe { self.pool.read(Handle(handle), out) },
            Entry::Backing { loc, len } => {
                let b = self.backing.as_ref().expect("BACKING entries exist only with a backing device");
                // Under the slot lock the record is live, so its segment cannot be reused
                // before the pin is dropped (slot.rs rule 7).
                return Fetched::Backing { loc, len, _pin: b.space.pin(loc) };
            }
        }
        Fetched::Done
    }

    /// Completes a read after the slot lock is released.
    fn finish(&self, ctx: &mut Context, index: u64, fetched: Fetched, out: &mut [u8]) -> Result<(), StoreError> {
        match fetched {
            Fetched::Done => Ok(()),
            Fetched::Compressed(len) => ctx.comp.decompress(&ctx.cbuf[..len], out).map_err(|reason| StoreError::Corrupt { index, reason }),
            Fetched::Backing { loc, len, _pin } => {
                let b = self.backing.as_ref().expect("BACKING entries exist only with a backing device");
                let len = len as usize;
                b.read_record(index, loc, &mut ctx.cbuf[..RECORD_HEADER + len], &mut ctx.read)?;
                drop(_pin);
                Counters::inc(&self.counters.bd_reads);
                let payload = &ctx.cbuf[RECORD_HEADER..RECORD_HEADER + len];
                if len == PAGE_SIZE {
                    out.copy_from_slice(payload);
                    Ok(())
                } else {
                    ctx.comp.decompress(payload, out).map_err(|reason| StoreError::Corrupt { index, reason })
                }
            }
        }
    }

    /// Swaps `new` into slot `index` if the slot still holds `old` (and, with `marked`, was
    /// not replaced since writeback marked it), then frees `old`. For the backing tier
    /// (writeback, GC, promotion), which copies a page out, does its I/O without the slot
    /// lock, and must not install a copy of a page rewritten meanwhile (slot.rs rule 8).
    pub(crate) fn install(&self, index: u64, old: Entry, new: Entry, marked: bool) -> bool {
        let mut g = self.slots[index as usize].lock();
        if g.entry() != old || (marked && !g.is_moving()) {
            return false;
        }
        g.replace(new);
        drop::<SlotGuard>(g);
        self.account(new, true);
        self.release(old);
        true
    }

    /// Copies the stored bytes of the RAM entry slot guard `g` holds (compressed or raw) into
    /// `out`; returns their length, or `None` for entries without pool bytes.
    pub(crate) fn copy_stored(&self, g: &SlotGuard<'_>, out: &mut [u8]) -> Option<usize> {
        let (handle, len) = match g.entry() {
            Entry::Compressed { handle, len } => (handle, len as usize),
            Entry::Huge { handle } => (handle, PAGE_SIZE),
            _ => return None,
        };
        // SAFETY: `g` is the owner's slot lock and `handle` its live object (pool contract 1).
        unsafe { self.pool.read(Handle(handle), &mut out[..len]) };
        Some(len)
    }

    /// Frees a pool object that was allocated but never installed in a slot (promotion lost
    /// a race): its allocator is its only owner.
    pub(crate) fn free_uninstalled(&self, handle: u64) {
        // SAFETY: the object was allocated by the caller and never published in a slot, so
        // no reader can reach it and this is its one free.
        unsafe { self.pool.free(Handle(handle)) }
    }

    /// Frees what an entry taken out of its slot held.
    fn release(&self, old: Entry) {
        self.account(old, false);
        match old {
            // SAFETY: `old` was just taken out of its slot under the slot lock, so this is the
            // one free of a live object and nobody can reach it any more.
            Entry::Compressed { handle, .. } | Entry::Huge { handle } => unsafe { self.pool.free(Handle(handle)) },
            Entry::Empty | Entry::Same(_) => {}
            Entry::Backing { loc, len } => self.backing.as_ref().expect("BACKING entries exist only with a backing device").free(loc, len),
        }
    }

    /// Adds (`add`) or removes an entry's share of the statistics.
    fn account(&self, e: Entry, add: bool) {
        let c = &self.counters;
        let upd = |ctr: &AtomicU64, n: u64| if add { Counters::add(ctr, n) } else { Counters::sub(ctr, n) };
        match e {
            Entry::Empty => return,
            Entry::Same(_) => upd(&c.same_pages, 1),
            Entry::Compressed { len, .. } => {
                upd(&c.compr_data_size, len as u64);
                if len as usize <= PAGE_SIZE / 2 {
                    upd(&c.good_compress, 1);
                }
            }
            Entry::Huge { .. } => {
                upd(&c.compr_data_size, PAGE);
                upd(&c.huge_pages, 1);
                if add {
                    Counters::inc(&c.huge_pages_since);
                }
            }
            Entry::Backing { len, .. } => {
                upd(&c.bd_count, 1);
                upd(&c.bd_bytes, len as u64);
            }
        }
        upd(&c.pages_stored, 1);
    }

    // --- maintenance ---------------------------------------------------------------------------

    /// Compacts the pool: moves objects out of sparse zspages and gives their pages back.
    /// Returns the number of pages released. Safe to run while I/O is in flight.
    pub fn compact(&self) -> u64 {
        self.pool.compact(&mut |owner, h, mv| {
            let mut g = self.slots[owner as usize].lock();
            if let Entry::Compressed { handle, len } = g.entry() {
                if handle == h.0 {
                    if let Some(new) = mv() {
                        g.replace(Entry::Compressed { handle: new.0, len });
                    }
                }
            }
        })
    }

    /// Makes up to `pages` pool pages resident now and keeps them free for the I/O path: a
    /// swap server's reserve. The pages are faulted in with no store lock held, so a caller
    /// that waits in the kernel's reclaim here blocks no request. Under `mlockall` they stay
    /// resident. Bounded by the memory limit. Returns how many pages were added.
    pub fn prefault(&self, pages: u64) -> u64 {
        self.pool.prefault(pages)
    }

    /// Free pool pages that are resident (the reserve left; `mem_reserve_free` in stats).
    pub fn reserve_free_pages(&self) -> u64 {
        self.pool.resident_free_pages()
    }

    /// Fault-free mode: the write path takes only resident pool pages (see
    /// [`Store::prefault`]) and fails with `NoSpace` rather than fault in a new page. For swap
    /// servers, whose page faults under memory pressure can wait on their own I/O.
    pub fn set_fault_free(&self, on: bool) {
        self.pool.set_fault_free(on)
    }

    /// In fault-free mode, how long a write that finds no resident pool page waits for the
    /// reserve to be refilled (by [`Store::prefault`] on another thread) before it fails with
    /// `NoSpace`; never when the memory limit leaves no room to refill. Default: no wait.
    pub fn set_reserve_wait(&self, wait: Duration) {
        self.reserve_wait_us.store(wait.as_micros().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Pages that [`Store::compact`] could release now (an estimate).
    pub fn compactable_pages(&self) -> u64 {
        self.pool.compactable_pages()
    }

    /// Changes the memory limit (bytes; 0 = none). Lowering it below current use does not
    /// evict anything; new allocations fail until use drops.
    pub fn set_mem_limit(&self, bytes: u64) {
        self.mem_limit_bytes.store(bytes, Relaxed);
        self.pool.set_limit_pages(bytes.div_ceil(PAGE));
    }

    /// Resets `mem_used_max` to the current use (zram's `mem_used_max` reset).
    pub fn reset_mem_used_max(&self) {
        self.pool.reset_max();
    }

    /// The coarse clock stored in slots as the access time.
    pub(crate) fn tick(&self) -> u16 {
        (self.created.elapsed().as_secs() / TICK_SECS + self.clock_offset.load(Relaxed)) as u16
    }

    /// Moves the access-time clock forward by `secs` seconds, as if that much time had passed
    /// (tests and benchmarks age pages without sleeping; front ends never call it).
    #[doc(hidden)]
    pub fn advance_clock(&self, secs: u64) {
        self.clock_offset.fetch_add(secs / TICK_SECS, Relaxed);
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let g = Counters::get;
        let pages_stored_all = g(&c.pages_stored);
        let same = g(&c.same_pages);
        let stored = pages_stored_all - same.min(pages_stored_all);
        let pct = |n: u64| (n * 100).checked_div(stored).unwrap_or(0);
        let used = self.pool.total_pages();
        let bd_bytes = g(&c.bd_bytes);
        let (bd_size_bytes, bd_space_bytes, bd) = match &self.backing {
            Some(b) => (b.space.num_segments() * b.space.seg_bytes, b.space.segments_in_use() * b.space.seg_bytes, Some(&b.ctr)),
            None => (0, 0, None),
        };
        let bdc = |f: fn(&crate::backing::BackingCounters) -> &AtomicU64| bd.map_or(0, |c| g(f(c)));
        Stats {
            disksize: self.disksize_bytes(),
            comp_algorithm: self.cfg.algorithm.name().to_string(),
            orig_data_size: pages_stored_all * PAGE,
            compr_data_size: g(&c.compr_data_size),
            mem_used_total: used * PAGE,
            mem_limit: self.mem_limit_bytes.load(Relaxed),
            mem_used_max: self.pool.max_pages() * PAGE,
            same_pages: same,
            pages_compacted: self.pool.pages_compacted(),
            huge_pages: g(&c.huge_pages),
            huge_pages_since: g(&c.huge_pages_since),
            failed_reads: g(&c.failed_reads),
            failed_writes: g(&c.failed_writes),
            invalid_io: g(&c.invalid_io),
            notify_free: g(&c.notify_free),
            bd_count: g(&c.bd_count),
            bd_reads: g(&c.bd_reads),
            bd_writes: g(&c.bd_writes),
            bd_bytes,
            bd_size_bytes,
            bd_space_bytes,
            bd_efficiency_pct: (bd_bytes * 100).checked_div(bd_space_bytes).unwrap_or(0),
            bd_overflow_pages: bdc(|c| &c.overflow_pages),
            bd_writeback_pages: bdc(|c| &c.writeback_pages),
            bd_gc_pages: bdc(|c| &c.gc_pages),
            bd_promoted_pages: bdc(|c| &c.promoted_pages),
            bd_errors: bdc(|c| &c.errors),
            num_reads: g(&c.num_reads),
            num_writes: g(&c.num_writes),
            pages_stored: stored,
            pages_used: used,
            good_compress_pct: pct(g(&c.good_compress)),
            no_compress_pct: pct(g(&c.huge_pages)),
            slot_table_bytes: self.slots.bytes() as u64,
            mem_reserve_free: self.pool.resident_free_pages() * PAGE,
        }
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
        let allocation = self.store.allocation(start / PAGE);
        let mut next = start / PAGE + 1;
        while next * PAGE < self.end && self.store.allocation(next) == allocation {
            next += 1;
        }
        self.pos = (next * PAGE).min(self.end);
        Some(Extent { len_bytes: self.pos - start, allocation })
    }
}

/// The fill word if every 8-byte word of `page` is the same (zero pages included).
fn same_filled(page: &[u8]) -> Option<u64> {
    let mut words = page.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunk")));
    let first = words.next()?;
    // Check the last word first: most pages that are not same-filled differ there too.
    let last = u64::from_ne_bytes(page[PAGE_SIZE - 8..].try_into().expect("8 bytes"));
    (last == first && words.all(|w| w == first)).then_some(first)
}
