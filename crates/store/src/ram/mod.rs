//! The RAM layer: the slot table and the pool, and everything that keeps the two consistent.
//!
//! [`Ram`] owns the state a page in RAM lives in: the slots, the pool, the counters, the
//! access-time clock, the memory limit, and the dictionaries recompressed pages may name. It is
//! the one owner of that state, and the only code that touches the pool: every pool read, allocation and free is
//! here or in `mover.rs`, each under the rules of the pool's contract (`zspool/mod.rs`) and the
//! slot table's (`slot.rs`).
//!
//! The layers above (the store's facade, cache mode, the backing tier, recompression) see it
//! through this interface and never through `Store`:
//! - the write path's checks, once, in zram's order: [`Ram::classify`] (same-filled, compress,
//!   huge), then [`Ram::alloc`] (a pool object for the payload). The caller installs the entry
//!   under the slot lock and hands the old one to [`Mover::replaced`], which frees it;
//! - the read path's two halves: [`Ram::fetch`] under the slot lock (copies the pool bytes
//!   out), [`Ram::finish`] after it (decodes);
//! - [`Ram::mover`]: the interface for code that moves pages (`mover.rs`, its contract);
//! - [`Ram::slots`]: the slot table, for the slot locks the callers take themselves (slot.rs
//!   rules); a slot's entry taken out under its lock goes back through the mover, never to
//!   the pool directly;
//! - the pool's gauges and knobs ([`Ram::pool`]: limits, the reserve, watches, compaction),
//!   whose methods are all safe.
//!
//! # State that outlives the process
//! The slots, the pool's pages and descriptors, the dictionaries, the recovery journal and
//! the backing tier's region (reserved here, its format the tier's) are in one state file (`shm.rs`: a memfd mapped shared; `layout.rs`: where each part is and the
//! header naming the layout). The counters, the pool's lists and the arena's free lists are
//! this process's own. A process that keeps the file's descriptor (`Ram::state_fd`) lets a
//! successor take the device over after this one dies, at any instruction:
//! [`Ram::recover`] (`recover.rs`) checks the header, restores what the journal says was
//! half-changed, rebuilds the pool from the objects the slots name and recomputes the
//! counters.

pub(crate) mod layout;
pub(crate) mod mover;
mod recover;

pub(crate) use recover::KeptRecords;
pub use recover::Recovered;

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::compress::dict::{Dict, Dicts};
use crate::compress::{BackendContext, Codec};
use crate::context::Context;
use crate::error::StoreError;
use crate::journal::{Journal, RECORDS};
use crate::page::{fill_same, same_filled};
use crate::shm::{Region, StateMap};
use crate::slot::{Entry, Slot, SlotGuard};
use crate::stats::Counters;
use crate::zeroed::ZeroedSlice;
use crate::zspool::{PoolFull, ZsPool};
use crate::{PAGE, PAGE_SIZE};
use layout::Layout;
use mover::{Clock, Mover, Records};

/// The RAM state of a device; see the module docs.
pub(crate) struct Ram {
    /// The state file everything below that outlives the process is in, and where.
    map: Arc<StateMap>,
    layout: Layout,
    slots: ZeroedSlice<Slot>,
    journal: Journal,
    pool: ZsPool,
    counters: Counters,
    /// The access-time clock slots keep.
    clock: Clock,
    mem_limit_bytes: AtomicU64,
    /// Compressed pages larger than this are stored raw (`Config::huge_threshold_bytes`).
    huge_threshold_bytes: usize,
    /// The dictionaries recompressed pages may be encoded with (recompression fills them:
    /// `compress/dict.rs` says how long each lives). Empty without recompression.
    dicts: Dicts,
}

fn tier_region(map: &Arc<StateMap>, l: &Layout) -> Option<Region> {
    (l.tier_bytes > 0).then(|| Region { map: map.clone(), offset: l.tier, len: l.tier_bytes })
}

/// A page as the write path's checks left it ([`Ram::classify`]).
#[derive(Clone, Copy)]
pub(crate) enum Encoded<'a> {
    /// One word repeated: stored in the slot, no memory.
    Same(u64),
    /// Compressed (by the store's own algorithm) to these bytes.
    Compressed(&'a [u8]),
    /// Did not compress below the huge threshold: the raw page.
    Huge(&'a [u8]),
}

impl Encoded<'_> {
    /// The bytes to store (`Same` has none).
    pub fn payload(&self) -> &[u8] {
        match self {
            Encoded::Same(_) => &[],
            Encoded::Compressed(p) | Encoded::Huge(p) => p,
        }
    }
}

/// A `BACKING` entry found by [`Ram::fetch`] under the slot lock: what the caller (who knows
/// the backing tier) pins and reads.
pub(crate) struct Record {
    pub loc: u64,
    pub len: u16,
    pub codec: Codec,
    /// The dictionary the record's codec names, taken under the slot lock.
    pub dict: Option<Arc<Dict>>,
}

/// What [`Ram::fetch`] left to do after releasing the slot lock.
pub(crate) enum Fetched<P> {
    Done,
    /// `ctx.cbuf[..len]` holds bytes encoded by `codec` to decode into the output, with
    /// `dict` if the codec needs one (taken under the slot lock: `compress/dict.rs`).
    Compressed {
        len: usize,
        codec: Codec,
        dict: Option<Arc<Dict>>,
    },
    /// The page is a record on the backing device: what the caller's `on_record` made of it
    /// under the slot lock (the store pins the record's segment).
    Backing(P),
    /// Recovery could not vouch for the page (`recover.rs`): the read fails.
    Lost,
}

impl Ram {
    /// The RAM state of a device of `num_pages` pages, in a new state file; `algorithm` names
    /// the primary codec (the header records it); `tier_bytes` reserves the backing tier's
    /// region (0: none; [`Ram::tier_region`]). Memory is committed only as pages are
    /// stored; an error names what could not be reserved.
    pub fn new(
        num_pages: u64,
        mem_limit_bytes: u64,
        huge_threshold_bytes: usize,
        algorithm: &str,
        tier_bytes: usize,
    ) -> Result<Ram, (&'static str, std::io::Error)> {
        // Address space for the pool: room for every slot raw plus fragmentation; only
        // touched pages cost memory.
        let capacity = (num_pages * 2 + 16384).min(u32::MAX as u64 - 3) as u32;
        let l = Layout::new(num_pages, capacity, tier_bytes);
        let map = Arc::new(StateMap::create(l.file_len).map_err(|e| ("the state file (memfd)", e))?);
        let clock = Clock::new();
        layout::header(&map).write(&l, huge_threshold_bytes, algorithm, clock.origin_ns());
        let ram = Ram::over(map, &l, mem_limit_bytes, huge_threshold_bytes, clock);
        // The journal is written by every entry change: its pages are made now, so that the
        // first write of each thread takes no page fault on the I/O path (fault-free mode).
        ram.journal.clear();
        Ok(ram)
    }

    /// The RAM state over the state file `map` laid out as `l`, as the file holds it.
    fn over(map: Arc<StateMap>, l: &Layout, mem_limit_bytes: u64, huge_threshold_bytes: usize, clock: Clock) -> Ram {
        Ram {
            slots: ZeroedSlice::in_map(&map, l.slots, l.num_pages as usize),
            journal: Journal::new(ZeroedSlice::in_map(&map, l.journal, RECORDS)),
            pool: ZsPool::new(&map, l.arena, l.capacity_pages, mem_limit_bytes.div_ceil(PAGE)),
            counters: Counters::default(),
            clock,
            mem_limit_bytes: AtomicU64::new(mem_limit_bytes),
            huge_threshold_bytes,
            dicts: Dicts::in_map(&map, l.dicts),
            map,
            layout: *l,
        }
    }

    /// The state file's descriptor: whoever keeps it open keeps every page for a successor.
    pub fn state_fd(&self) -> BorrowedFd<'_> {
        self.map.fd()
    }

    /// The region the state file keeps for the backing tier (`layout.rs`), whose format is the
    /// tier's; `None` if none was reserved.
    pub fn tier_region(&self) -> Option<Region> {
        tier_region(&self.map, &self.layout)
    }

    /// Where each part is in the state file (tests that damage it).
    #[cfg(any(test, feature = "testing"))]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The recovery journal (`journal.rs`), for callers that replace entries under a slot
    /// lock ([`SlotGuard::replace`]).
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn num_pages(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The slot table, for callers that lock a slot themselves (slot.rs rules).
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Bytes the slot table has committed.
    pub fn slot_table_bytes(&self) -> usize {
        self.slots.bytes()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The access-time clock's current tick.
    pub fn tick(&self) -> u16 {
        self.clock.tick()
    }

    /// Moves the clock forward by `secs` seconds (tests and benchmarks age pages).
    pub fn advance_clock(&self, secs: u64) {
        self.clock.advance(secs);
    }

    /// The memory limit in bytes (0: none).
    pub fn mem_limit_bytes(&self) -> u64 {
        self.mem_limit_bytes.load(Relaxed)
    }

    /// Changes the memory limit (bytes; 0 = none).
    pub fn set_mem_limit(&self, bytes: u64) {
        self.mem_limit_bytes.store(bytes, Relaxed);
        self.pool.set_limit_pages(bytes.div_ceil(PAGE));
    }

    /// The pool, for its gauges and knobs (pages, limits, the reserve, the watches): every
    /// method reachable through it is safe. Object reads and frees are `unsafe` and done in
    /// this module only.
    pub fn pool(&self) -> &ZsPool {
        &self.pool
    }

    /// The dictionary table (recompression installs and frees; readers take theirs in
    /// [`Ram::fetch`]).
    pub fn dicts(&self) -> &Dicts {
        &self.dicts
    }

    // --- write ------------------------------------------------------------------------------

    /// The write path's checks, in zram's order: same-filled, then compress with the worker's
    /// context into `cbuf`, then the huge check (a compressed page above the threshold, or
    /// one that saves less than a word, is stored raw). Takes no lock and allocates nothing.
    pub fn classify<'a>(&self, comp: &mut dyn BackendContext, cbuf: &'a mut [u8], page: &'a [u8]) -> Encoded<'a> {
        if let Some(fill) = same_filled(page) {
            return Encoded::Same(fill);
        }
        match comp.compress(page, cbuf).filter(|&n| n <= self.huge_threshold_bytes && n < PAGE_SIZE - 8) {
            Some(n) => Encoded::Compressed(&cbuf[..n]),
            None => Encoded::Huge(page),
        }
    }

    /// Stores an encoded page for slot `index`: a fill word as it is, a payload as a new pool
    /// object. The caller installs the entry (or, if the slot turned out to be taken, gives it
    /// to [`Ram::free_unpublished`]).
    pub fn alloc(&self, index: u64, e: Encoded<'_>) -> Result<Entry, PoolFull> {
        let owner = index as u32;
        match e {
            Encoded::Same(fill) => Ok(Entry::Same(fill)),
            Encoded::Compressed(c) => {
                self.pool.alloc(c, owner).map(|handle| Entry::Compressed { handle, len: c.len() as u16, codec: Codec::PRIMARY })
            }
            Encoded::Huge(page) => self.pool.alloc(page, owner).map(|handle| Entry::Huge { handle }),
        }
    }

    /// Frees a pool object made by [`Ram::alloc`] for a slot that turned out to be taken
    /// (never published in a slot).
    pub fn free_unpublished(&self, e: Entry) {
        if let Entry::Compressed { handle, .. } | Entry::Huge { handle } = e {
            // SAFETY: the object was allocated by `alloc` and never stored in a slot, so no
            // reader can reach it and this is its one free.
            unsafe { self.pool.free(handle) };
        }
    }

    // --- read -------------------------------------------------------------------------------

    /// Copies what slot `g` (slot `index`) holds into `out`, or its compressed bytes into
    /// `ctx.cbuf`, under the slot lock. A `BACKING` entry is handed to `on_record` (still
    /// under the lock), whose result the caller gets back.
    pub fn fetch<P>(&self, g: &SlotGuard<'_>, ctx: &mut Context, out: &mut [u8], on_record: impl FnOnce(Record) -> P) -> Fetched<P> {
        match g.entry() {
            Entry::Empty => out.fill(0),
            Entry::Same(w) => fill_same(out, w),
            Entry::Compressed { handle, len, codec } => {
                // SAFETY: we hold the owner's slot lock and the handle is the slot's live object.
                unsafe { self.pool.read(handle, &mut ctx.cbuf[..len as usize]) };
                return Fetched::Compressed { len: len as usize, codec, dict: self.dict_of(codec) };
            }
            // SAFETY: as above.
            Entry::Huge { handle } => unsafe { self.pool.read(handle, out) },
            Entry::Backing { loc, len, codec } => {
                return Fetched::Backing(on_record(Record { loc, len, codec, dict: self.dict_of(codec) }))
            }
            Entry::Lost => return Fetched::Lost,
        }
        Fetched::Done
    }

    /// Completes a read of a page in RAM after the slot lock is released.
    pub fn finish<P>(&self, ctx: &mut Context, index: u64, fetched: Fetched<P>, out: &mut [u8]) -> Result<(), StoreError> {
        match fetched {
            Fetched::Done => Ok(()),
            Fetched::Compressed { len, codec, dict } => {
                crate::compress::decode(&mut *ctx.comp, ctx.strong.as_mut(), codec, dict.as_deref(), &ctx.cbuf[..len], out)
                    .map_err(|reason| StoreError::Corrupt { index, reason })
            }
            Fetched::Backing(_) => unreachable!("pages on the backing device are read by backing::read"),
            Fetched::Lost => Err(StoreError::Corrupt {
                index,
                reason: "the page was lost when a successor took the device over (its state failed recovery's checks)".into(),
            }),
        }
    }

    /// The dictionary a page of `codec` needs, for a reader holding the page's slot lock (so
    /// that the dictionary is in its table place: `compress/dict.rs`). `None` for the other
    /// codecs: the common case costs one comparison.
    fn dict_of(&self, codec: Codec) -> Option<Arc<Dict>> {
        let place = codec.dict()?;
        self.dicts.get(place)
    }

    // --- movers -----------------------------------------------------------------------------

    /// The interface through which code that moves pages reaches slots and pool (`mover.rs`);
    /// `records` frees the records of `BACKING` entries (the backing tier, if there is one).
    pub fn mover<'a>(&'a self, records: Option<&'a dyn Records>) -> Mover<'a> {
        Mover::new(self, records)
    }

    /// Compacts the pool: moves objects out of sparse zspages and gives their pages back.
    /// Returns the number of pages released.
    pub fn compact(&self) -> u64 {
        self.mover(None).compact()
    }
}
