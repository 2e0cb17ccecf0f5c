//! Cache mode (zcache): the store as a compressed RAM cache in front of an origin, a slower
//! block device or disk image of the device's size (`docs/cache.md`).
//!
//! `Store`'s byte-granular methods branch here once at the top when the store has an origin;
//! everything else (compressors, statistics, every front end) is the store's. Cache mode
//! reaches slots and pool only through the RAM layer (`ram/`), as every tier does: it encodes
//! with [`Ram::classify`] and [`Ram::alloc`] (the write path's checks, written once), reads
//! with [`Ram::fetch`] and [`Ram::finish`], hands every entry it takes out of a slot to the
//! mover to be freed, and never calls the pool itself. In cache mode an `Empty` slot means
//! "not cached: ask the origin", and `Same(0)` is a cached page of zeroes.
//!
//! One job per file: `origin.rs` the origin device, `policy.rs` eviction (S3-FIFO),
//! `stripes.rs` the range locks, `readahead.rs` the stream table; this file the read, write,
//! discard, write-zeroes and flush paths.
//!
//! # The invariant
//! A cached page always equals the origin's page. Reads serve cached pages without asking the
//! origin, so anything else would be wrong data.
//!
//! # Rules
//! 1. Writes, discards, write-zeroes and read misses (the origin read, with its readahead,
//!    and the inserts) hold the stripes of their page range (`stripes.rs`) from before their
//!    origin I/O until their slots are updated. So while a request holds a page's stripe,
//!    nobody else changes that page in the origin or puts a page in its slot.
//! 2. Read hits take no stripe: a slot holds nothing or the origin's page (rule 1), so a hit
//!    returns the origin's page, old or new if a write is in flight (either is correct for a
//!    read concurrent with a write).
//! 3. Eviction takes no stripe: dropping a clean page is always safe. It only ever empties a
//!    slot, so a request holding the stripe that sees a slot empty inserts into it under the
//!    slot lock only if it is still empty, and one that sees it full may leave it.
//! 4. Write-through: the origin write completes before the slots are replaced with the new
//!    pages (an update, not an invalidation: a re-read hits). A page that cannot be stored
//!    (memory budget) leaves its slot empty, never stale. A failed origin write (or discard,
//!    or zeroing) empties the slots of its range (the origin may hold part of it) and fails
//!    the request: nothing unacknowledged or stale is served afterwards.
//! 5. A failed origin read fails the request and inserts nothing; no byte of it reaches the
//!    client.
//! 6. Partial pages are read-modify-written whole, under the stripe: the page comes from the
//!    cache or the origin, the new bytes go in, the whole page goes to the origin.
//! 7. Lock order: stripe -> policy shard -> slot -> pool class -> arena (slot.rs rules 3 and
//!    9). A request takes its stripes in one call (ascending, deduplicated); eviction, which
//!    runs inside inserts, takes shard and slot locks under them; no slot lock is held while a
//!    shard lock or a stripe is taken.

pub mod origin;
pub(crate) mod policy;
mod readahead;
mod stripes;

pub use origin::{origin_size, AlignedBuf, FileOrigin, OriginDevice};

use std::convert::Infallible;

use crate::context::Context;
use crate::error::StoreError;
use crate::ram::{Encoded, Ram, Record};
use crate::slot::{Entry, Kind, SlotGuard};
use crate::stats::Counters;
use crate::{PAGE, PAGE_SIZE};
use policy::{Policy, Queue};
use readahead::Streams;
use stripes::Stripes;

/// The longest run of missed pages read from the origin at once (1 MiB).
const MAX_MISS_PAGES: u64 = 256;
/// The largest readahead window is this share of the memory budget (1/16).
const READAHEAD_BUDGET_SHARE: u64 = 16;
/// Pages evicted per attempt when the pool is full.
const EVICT_BATCH: usize = 8;
/// Attempts (evict a batch, then retry the allocation) before an insert is skipped.
const EVICT_ROUNDS: usize = 16;
/// Errors logged in full before the log thins out to one in `LOG_EVERY`.
const LOG_FIRST: u64 = 20;
const LOG_EVERY: u64 = 1000;

/// What a store in cache mode adds to itself.
pub(crate) struct Cache {
    pub origin: Box<dyn OriginDevice>,
    policy: Policy,
    stripes: Stripes,
    streams: Streams,
    readahead_max_pages: u64,
}

/// Where a byte request's data lies relative to one page of it.
struct Span {
    /// The request's bytes `buf_from..buf_from + len` ...
    buf_from: usize,
    /// ... are the page's bytes `in_page..in_page + len`.
    in_page: usize,
    len: usize,
}

fn span(offset: u64, len: usize, index: u64) -> Span {
    let page_start = index * PAGE;
    let from = offset.max(page_start);
    let to = (offset + len as u64).min(page_start + PAGE);
    Span { buf_from: (from - offset) as usize, in_page: (from - page_start) as usize, len: (to - from) as usize }
}

/// The data a write puts in its range.
#[derive(Clone, Copy)]
enum Src<'a> {
    Data(&'a [u8]),
    Zeroes,
}

impl Cache {
    pub fn new(origin: Box<dyn OriginDevice>, readahead_max_bytes: u64) -> Cache {
        Cache {
            origin,
            policy: Policy::new(),
            stripes: Stripes::new(),
            streams: Streams::new(),
            readahead_max_pages: readahead_max_bytes / PAGE,
        }
    }

    /// Bytes of the aligned origin buffer each worker's `Context` needs: the longest miss run
    /// plus the largest readahead window.
    pub fn io_buf_bytes(&self) -> usize {
        ((MAX_MISS_PAGES + self.readahead_max_pages) * PAGE) as usize
    }

    /// Pages the worker's origin buffer holds.
    fn io_pages(ctx: &Context) -> u64 {
        (ctx.origin.capacity() / PAGE_SIZE) as u64
    }

    fn origin_error(&self, ram: &Ram, op: &'static str, offset: u64, e: std::io::Error) -> StoreError {
        let n = ram.counters().origin_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let err = StoreError::Origin { origin: self.origin.describe(), op, offset, reason: e.to_string() };
        if n < LOG_FIRST || n % LOG_EVERY == 0 {
            compcache_log::error("compcache", &format!("{err} [origin error {} so far]", n + 1));
        }
        err
    }

    // --- read ------------------------------------------------------------------------------

    /// Reads `buf.len()` bytes at `offset` (inside the device): hits from the slots, runs of
    /// misses from the origin with readahead (rules 1, 2, 5).
    pub fn read(&self, ram: &Ram, ctx: &mut Context, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if buf.is_empty() {
            return Ok(());
        }
        let (first, end) = (offset / PAGE, (offset + buf.len() as u64).div_ceil(PAGE));
        let mut i = first;
        while i < end {
            Counters::inc(&ram.counters().num_reads);
            if self.hit(ram, ctx, i, offset, buf).inspect_err(|_| Counters::inc(&ram.counters().failed_reads))? {
                i += 1;
                continue;
            }
            let max = MAX_MISS_PAGES.min(Self::io_pages(ctx));
            let mut j = i + 1;
            while j < end && j - i < max && ram.slots()[j as usize].peek().kind == Kind::Empty {
                Counters::inc(&ram.counters().num_reads);
                j += 1;
            }
            self.miss(ram, ctx, i, j, offset, buf).inspect_err(|_| Counters::inc(&ram.counters().failed_reads))?;
            i = j;
        }
        Ok(())
    }

    /// Serves page `index` of a read from the cache if it is there.
    fn hit(&self, ram: &Ram, ctx: &mut Context, index: u64, offset: u64, buf: &mut [u8]) -> Result<bool, StoreError> {
        let sp = span(offset, buf.len(), index);
        let whole = sp.len == PAGE_SIZE;
        let mut page = std::mem::take(&mut ctx.page);
        let out: &mut [u8] = if whole { &mut buf[sp.buf_from..sp.buf_from + PAGE_SIZE] } else { &mut page };
        let r = (|| {
            let mut g = ram.slots()[index as usize].lock();
            if g.entry() == Entry::Empty {
                return Ok(false);
            }
            // A cache store has no backing device, so what `fetch` leaves is done in RAM.
            let fetched = ram.fetch(&g, ctx, out, no_record);
            let first_use = policy::on_hit(&mut g);
            g.touch(ram.tick());
            drop::<SlotGuard>(g);
            Counters::inc(&ram.counters().cache_hits);
            if first_use {
                Counters::inc(&ram.counters().readahead_used);
            }
            ram.finish(ctx, index, fetched, out)?;
            Ok(true)
        })();
        if matches!(r, Ok(true)) && !whole {
            buf[sp.buf_from..sp.buf_from + sp.len].copy_from_slice(&page[sp.in_page..sp.in_page + sp.len]);
        }
        ctx.page = page;
        r
    }

    /// Reads missed pages `first..end` (and readahead after them) from the origin under their
    /// stripes, hands the request its bytes and inserts every page that is still not cached.
    fn miss(&self, ram: &Ram, ctx: &mut Context, first: u64, end: u64, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let room = Self::io_pages(ctx) - (end - first);
        // A window is at most a sixteenth of the budget: read ahead, then evicted before the
        // reader gets there, it would be read twice (and push out the main queue).
        let budget_pages = ram.mem_limit_bytes() / PAGE;
        let max = match budget_pages {
            0 => self.readahead_max_pages,
            b => self.readahead_max_pages.min(b / READAHEAD_BUDGET_SHARE),
        };
        let ra = self.streams.on_miss(first, end, max, |window| {
            // Up to the device's end and the buffer's room, and only pages not cached.
            let limit = window.min(room).min(ram.num_pages() - end);
            (0..limit).take_while(|&k| ram.slots()[(end + k) as usize].peek().kind == Kind::Empty).count() as u64
        });
        let n = end + ra - first;
        let _stripes = self.stripes.lock(first, end + ra);
        let mut io = std::mem::replace(&mut ctx.origin, AlignedBuf::empty());
        let r = (|| {
            let bytes = io.bytes_mut((n * PAGE) as usize);
            self.origin.read_at(bytes, first * PAGE).map_err(|e| self.origin_error(ram, "read", first * PAGE, e))?;
            Counters::inc(&ram.counters().origin_reads);
            Counters::add(&ram.counters().origin_read_bytes, n * PAGE);
            Counters::add(&ram.counters().cache_misses, end - first);
            for index in first..end + ra {
                let page = &bytes[((index - first) * PAGE) as usize..][..PAGE_SIZE];
                if index < end {
                    let sp = span(offset, buf.len(), index);
                    buf[sp.buf_from..sp.buf_from + sp.len].copy_from_slice(&page[sp.in_page..sp.in_page + sp.len]);
                }
                let readahead = index >= end;
                if self.insert(ram, ctx, index, page, readahead) && readahead {
                    Counters::inc(&ram.counters().readahead_pages);
                }
            }
            Ok(())
        })();
        ctx.origin = io;
        r
    }

    /// Caches `page` (the origin's page `index`, read under its stripe) if the slot is still
    /// empty (rule 3). Skipped when the memory budget has no room. True if inserted.
    fn insert(&self, ram: &Ram, ctx: &mut Context, index: u64, page: &[u8], readahead: bool) -> bool {
        let Some(new) = self.encode(ram, ctx, index, page) else { return false };
        let mut g = ram.slots()[index as usize].lock();
        if g.entry() != Entry::Empty {
            drop::<SlotGuard>(g);
            ram.free_unpublished(new);
            return false;
        }
        g.replace(ram.journal(), index, new);
        let (queue, _) = policy::on_install(&mut g, Entry::Empty, new, readahead);
        g.touch(ram.tick());
        drop::<SlotGuard>(g);
        self.installed(ram, index, new, Entry::Empty, queue);
        true
    }

    /// Statistics, freeing and queueing after `new` replaced `old` in slot `index`.
    fn installed(&self, ram: &Ram, index: u64, new: Entry, old: Entry, queue: Option<Queue>) {
        ram.mover(None).replaced(new, old);
        Counters::inc(&ram.counters().cache_inserts);
        if let Some(q) = queue {
            self.policy.push(index, q);
        }
    }

    /// Turns a page into an entry: a fill word, or a pool object made room for by eviction.
    /// `None` if the budget has no room even after eviction (and compaction).
    fn encode(&self, ram: &Ram, ctx: &mut Context, index: u64, page: &[u8]) -> Option<Entry> {
        match ram.classify(&mut *ctx.comp, &mut ctx.cbuf, page) {
            Encoded::Same(fill) => Some(Entry::Same(fill)),
            e => self.alloc_evicting(ram, e, index),
        }
    }

    /// Allocates `e` in the pool, evicting (S3-FIFO) while the budget is full; compacts when
    /// evictions stop lowering the pool's pages (freed objects leave holes in zspages of other
    /// size classes, which only compaction turns into free pages).
    fn alloc_evicting(&self, ram: &Ram, e: Encoded<'_>, index: u64) -> Option<Entry> {
        for _ in 0..EVICT_ROUNDS {
            if let Ok(entry) = ram.alloc(index, e) {
                return Some(entry);
            }
            let before = ram.pool().total_pages();
            let evicted = self.policy.evict(ram.slots(), &ram.mover(None), EVICT_BATCH);
            if ram.pool().total_pages() >= before && ram.pool().compactable_pages() > 0 {
                ram.compact();
            } else if evicted == 0 {
                break;
            }
        }
        ram.alloc(index, e).ok()
    }

    // --- write, write-zeroes, discard, flush -----------------------------------------------

    /// Writes `data` at `offset` through to the origin, then updates the cache (rules 4, 6).
    pub fn write(&self, ram: &Ram, ctx: &mut Context, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        if data.is_empty() {
            return Ok(());
        }
        let (first, end) = (offset / PAGE, (offset + data.len() as u64).div_ceil(PAGE));
        let _stripes = self.stripes.lock(first, end);
        self.put(ram, ctx, first, end, offset, data.len(), Src::Data(data))
    }

    /// Zeroes `offset..offset + len`: whole pages with the origin's own zeroing (cached as
    /// `Same(0)`, which costs no memory), partial pages read-modify-written.
    pub fn write_zeroes(&self, ram: &Ram, ctx: &mut Context, offset: u64, len: u64) -> Result<(), StoreError> {
        if len == 0 {
            return Ok(());
        }
        let (first, end) = (offset / PAGE, (offset + len).div_ceil(PAGE));
        let (wf, we) = (offset.div_ceil(PAGE), (offset + len) / PAGE);
        let _stripes = self.stripes.lock(first, end);
        if wf >= we {
            return self.put(ram, ctx, first, end, offset, len as usize, Src::Zeroes);
        }
        if first < wf {
            self.put(ram, ctx, first, wf, offset, len as usize, Src::Zeroes)?;
        }
        Counters::add(&ram.counters().num_writes, we - wf);
        if let Err(e) = self.origin.write_zeroes(wf * PAGE, (we - wf) * PAGE) {
            self.drop_range(ram, wf, we);
            Counters::inc(&ram.counters().failed_writes);
            return Err(self.origin_error(ram, "write-zeroes", wf * PAGE, e));
        }
        for index in wf..we {
            self.update(ram, index, Some(Entry::Same(0)));
        }
        if we < end {
            self.put(ram, ctx, we, end, offset, len as usize, Src::Zeroes)?;
        }
        Ok(())
    }

    /// Discards the whole pages inside `offset..offset + len` on the origin and drops them
    /// from the cache (partial pages are left as they are, as the store's discard does).
    pub fn discard(&self, ram: &Ram, offset: u64, len: u64) -> Result<(), StoreError> {
        let (wf, we) = (offset.div_ceil(PAGE), (offset + len) / PAGE);
        if wf >= we {
            return Ok(());
        }
        let _stripes = self.stripes.lock(wf, we);
        let r = self.origin.discard(wf * PAGE, (we - wf) * PAGE);
        let dropped = self.drop_range(ram, wf, we);
        Counters::add(&ram.counters().notify_free, dropped);
        r.map_err(|e| self.origin_error(ram, "discard", wf * PAGE, e))
    }

    /// FLUSH (and the second half of FUA): every completed write is durable on the origin.
    /// Counted in `origin_syncs` once the origin's sync returned (a failed one in
    /// `origin_errors`).
    pub fn flush(&self, ram: &Ram) -> Result<(), StoreError> {
        self.origin.sync().map_err(|e| self.origin_error(ram, "sync", 0, e))?;
        Counters::inc(&ram.counters().origin_syncs);
        Ok(())
    }

    /// Pages `first..end` of a write (stripes held): each chunk of them that fits the worker's
    /// buffer is assembled whole (partial pages read first, rule 6), written to the origin,
    /// then stored in the slots.
    #[allow(clippy::too_many_arguments)]
    fn put(&self, ram: &Ram, ctx: &mut Context, first: u64, end: u64, offset: u64, len: usize, src: Src<'_>) -> Result<(), StoreError> {
        let mut io = std::mem::replace(&mut ctx.origin, AlignedBuf::empty());
        let chunk = Self::io_pages_of(&io);
        let mut r = Ok(());
        let mut a = first;
        while a < end && r.is_ok() {
            let b = (a + chunk).min(end);
            r = self.put_chunk(ram, ctx, io.bytes_mut(((b - a) * PAGE) as usize), a, b, offset, len, src);
            a = b;
        }
        ctx.origin = io;
        r.inspect_err(|_| Counters::inc(&ram.counters().failed_writes))
    }

    fn io_pages_of(io: &AlignedBuf) -> u64 {
        (io.capacity() / PAGE_SIZE) as u64
    }

    #[allow(clippy::too_many_arguments)]
    fn put_chunk(
        &self,
        ram: &Ram,
        ctx: &mut Context,
        bytes: &mut [u8],
        a: u64,
        b: u64,
        offset: u64,
        len: usize,
        src: Src<'_>,
    ) -> Result<(), StoreError> {
        Counters::add(&ram.counters().num_writes, b - a);
        for index in a..b {
            let page = &mut bytes[((index - a) * PAGE) as usize..][..PAGE_SIZE];
            let sp = span(offset, len, index);
            if sp.len < PAGE_SIZE {
                self.current_page(ram, ctx, index, page)?;
            }
            match src {
                Src::Data(d) => page[sp.in_page..sp.in_page + sp.len].copy_from_slice(&d[sp.buf_from..sp.buf_from + sp.len]),
                Src::Zeroes => page[sp.in_page..sp.in_page + sp.len].fill(0),
            }
        }
        if let Err(e) = self.origin.write_at(bytes, a * PAGE) {
            self.drop_range(ram, a, b);
            return Err(self.origin_error(ram, "write", a * PAGE, e));
        }
        Counters::inc(&ram.counters().origin_writes);
        Counters::add(&ram.counters().origin_write_bytes, (b - a) * PAGE);
        for index in a..b {
            let new = self.encode(ram, ctx, index, &bytes[((index - a) * PAGE) as usize..][..PAGE_SIZE]);
            self.update(ram, index, new);
        }
        Ok(())
    }

    /// The current contents of page `index` (its stripe held): from the cache, else the origin.
    fn current_page(&self, ram: &Ram, ctx: &mut Context, index: u64, out: &mut [u8]) -> Result<(), StoreError> {
        let g = ram.slots()[index as usize].lock();
        if g.entry() != Entry::Empty {
            let fetched = ram.fetch(&g, ctx, out, no_record);
            drop::<SlotGuard>(g);
            return ram.finish(ctx, index, fetched, out);
        }
        drop::<SlotGuard>(g);
        self.origin.read_at(out, index * PAGE).map_err(|e| self.origin_error(ram, "read", index * PAGE, e))?;
        Counters::inc(&ram.counters().origin_reads);
        Counters::add(&ram.counters().origin_read_bytes, PAGE);
        Ok(())
    }

    /// Replaces slot `index`'s page with `new` (the origin's page now, its stripe held), or
    /// empties the slot when `new` is `None` (no room in the budget: never stale, rule 4).
    fn update(&self, ram: &Ram, index: u64, new: Option<Entry>) {
        let Some(new) = new else {
            self.drop_range(ram, index, index + 1);
            return;
        };
        let mut g = ram.slots()[index as usize].lock();
        let old = g.replace(ram.journal(), index, new);
        let (queue, wasted) = policy::on_install(&mut g, old, new, false);
        g.touch(ram.tick());
        drop::<SlotGuard>(g);
        if wasted {
            Counters::inc(&ram.counters().readahead_wasted);
        }
        self.installed(ram, index, new, old, queue);
    }

    /// Empties the slots of pages `first..end` (their stripes held); returns how many held a
    /// page.
    fn drop_range(&self, ram: &Ram, first: u64, end: u64) -> u64 {
        let mut dropped = 0;
        for index in first..end {
            let mut g = ram.slots()[index as usize].lock();
            let old = g.replace(ram.journal(), index, Entry::Empty);
            let wasted = old != Entry::Empty && policy::on_drop(&mut g);
            drop::<SlotGuard>(g);
            if wasted {
                Counters::inc(&ram.counters().readahead_wasted);
            }
            if old != Entry::Empty {
                dropped += 1;
                ram.mover(None).release(old);
            }
        }
        dropped
    }

    /// Block status: the origin's data and holes (SEEK_DATA/SEEK_HOLE of an image), or all
    /// data where it cannot say. The run at `pos`, cut at `end`: (is data, its end).
    pub fn extent(&self, pos: u64, end: u64) -> (bool, u64) {
        match self.origin.extent_at(pos) {
            Some((data, to)) if to > pos => (data, to.min(end)),
            _ => (true, end),
        }
    }
}

/// What [`Ram::fetch`] does with a page on a backing device: a store in cache mode has none.
fn no_record(_: Record) -> Infallible {
    unreachable!("a store in cache mode has no backing device")
}
