//! The mover: the one internal interface through which code that moves pages between places
//! (the backing tier's writeback, GC and promotion; pool compaction; cache mode's eviction;
//! recompression) reaches the slot table and the pool. Part of the RAM layer: with `mod.rs`
//! (the RAM half of the request paths), this file is the only code that touches both, so the
//! pool contract (`zspool/mod.rs`) and the movers' rule (slot.rs rule 8) are kept here and
//! nowhere else. It knows no tier: a `BACKING` entry's record is freed through [`Records`],
//! which the backing tier implements.
//!
//! # Contract
//! A move has three steps, and the slot lock is held only inside each call, never between:
//! 1. **Find** candidates without locks: [`Mover::hints_from`] reads the
//!    meta words (kind, access time, stored size) as hints only (slot.rs rule 5); the calls
//!    below decide again under the lock.
//! 2. **Copy out** under the slot lock: [`Mover::copy_out`] copies a RAM entry's pool bytes
//!    (compressed, or a raw page) into a buffer of the caller's and, with `mark`, sets MOVING
//!    on the slot; [`Mover::entry`] reads a `BACKING` entry, whose bytes stay on the device
//!    (the caller pins its segment, slot.rs rule 7). The caller then works without any slot
//!    lock (device I/O, compression). The pool object stays the slot's: the caller never
//!    frees it and never reads it again.
//! 3. **Install** the replacement if the slot still holds what was copied:
//!    [`Mover::install`] (a new entry the caller made: a backing record, or `Entry::Empty` to
//!    drop a clean page) and [`Mover::install_in_ram`] (a new pool object made from a payload:
//!    promotion, recompression). "Still holds" is checked as [`Unchanged`] says: by the MOVING
//!    mark (RAM entries: a rewrite may get the same handle back) or by the entry itself with
//!    its segment pinned (BACKING entries). On success the slot's old entry is freed here,
//!    once (its pool object, or its record's bytes); on failure the replacement is the
//!    caller's: a record it wrote is freed by the caller (`Backing::free`), a pool object
//!    [`Mover::install_in_ram`] made is freed here before it returns.
//!
//! Each mark has one owner at a time: MOVING is writeback's (under the backing tier's
//! maintenance mutex, `backing/mod.rs`), RECOMPRESSING recompression's (under its state mutex,
//! `recompress/`). Every `replace` (a request's write or discard, or another mover's install)
//! clears both, so a page rewritten during a move is never overwritten by the stale copy, and
//! of two movers that copied the same page only the first to install succeeds.
//!
//! Statistics follow the entries: [`Mover::install`], and [`Mover::replaced`] after a
//! request's swap (the store's and cache mode's), account the new entry and un-account the old
//! one in the same step (`stats.rs`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::compress::dict::{Dict, Dicts};
use crate::compress::Codec;
use crate::journal::Journal;
use crate::slot::{Entry, Hint, Mark, Slot, SlotGuard};
use crate::stats::Counters;
use crate::zspool::ZsPool;
use crate::{PAGE, PAGE_SIZE};

/// Seconds per access-time tick (the slot keeps 16 bits of it).
const TICK_SECS: u64 = 1;

/// The oldest age a slot's access time can tell (`config::MAX_IDLE_SECS`).
pub(crate) const MAX_AGE_SECS: u64 = u16::MAX as u64 * TICK_SECS;
// The configuration's bound on idle ages (a lower floor) is this figure, written there again.
const _: () = assert!(MAX_AGE_SECS == crate::config::MAX_IDLE_SECS);

/// The coarse clock whose ticks slots keep as their access time (16 bits, so ages are modulo
/// 2^16 ticks). It counts from an origin on CLOCK_MONOTONIC, which is the machine's (since
/// boot), so a successor process that takes the state over keeps the same clock
/// (`ram/layout.rs` keeps the origin).
pub(crate) struct Clock {
    origin_ns: u64,
    /// Ticks added to the clock (tests age pages without sleeping).
    offset: AtomicU64,
}

/// CLOCK_MONOTONIC in nanoseconds.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock::from_origin(monotonic_ns())
    }

    /// A clock that started at `origin_ns` (CLOCK_MONOTONIC).
    pub fn from_origin(origin_ns: u64) -> Clock {
        Clock { origin_ns, offset: AtomicU64::new(0) }
    }

    pub fn origin_ns(&self) -> u64 {
        self.origin_ns
    }

    pub fn tick(&self) -> u16 {
        (monotonic_ns().saturating_sub(self.origin_ns) / 1_000_000_000 / TICK_SECS + self.offset.load(Relaxed)) as u16
    }

    pub fn advance(&self, secs: u64) {
        self.offset.fetch_add(secs / TICK_SECS, Relaxed);
    }
}

/// Where the records of `BACKING` entries live (the backing tier, a floor above): the mover
/// frees a record through it and knows nothing else of the tier.
pub(crate) trait Records: Sync {
    /// Frees the record at `loc` holding `len` payload bytes, of an entry just taken out of its
    /// slot (pool contract 2 for records: once).
    fn free(&self, loc: u64, len: u16);
}

/// How [`Mover::install`] knows that a slot was not rewritten since its page was copied out
/// (slot.rs rule 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unchanged {
    /// The copy set the mover's mark (`copy_out` with `mark`), and no `replace` cleared it
    /// since. For RAM entries, whose handle a rewrite may get back.
    Marked(Mark),
    /// The entry is a `BACKING` one whose segment the caller has kept pinned since it read the
    /// entry: its location cannot be reused meanwhile, so an equal entry is the same record.
    Pinned,
}

/// What [`Mover::copy_out`] shows its `take` callback, under the slot lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub entry: Entry,
    /// Bytes the pool object holds (what will be copied).
    pub stored_bytes: usize,
    /// The slot's last access ([`Clock`] ticks).
    pub ac_time: u16,
    /// Recompression tried the page and kept it as it was.
    pub rejected: bool,
}

/// A view of the RAM layer for movers; see the module docs for the contract. Cheap to make (a
/// few references): `Ram::mover` makes one per call.
pub(crate) struct Mover<'a> {
    slots: &'a [Slot],
    pool: &'a ZsPool,
    counters: &'a Counters,
    records: Option<&'a dyn Records>,
    clock: &'a Clock,
    mem_limit_bytes: &'a AtomicU64,
    /// The dictionaries, for movers that decode (the cold tier's writeback) and for
    /// recompression, which fills them.
    dicts: &'a Dicts,
    /// The recovery journal every entry change records in (`journal.rs`).
    journal: &'a Journal,
}

impl<'a> Mover<'a> {
    /// The mover over `ram`'s state; `records` frees the records of `BACKING` entries.
    pub fn new(ram: &'a super::Ram, records: Option<&'a dyn Records>) -> Mover<'a> {
        Mover {
            slots: &ram.slots,
            pool: &ram.pool,
            counters: &ram.counters,
            records,
            clock: &ram.clock,
            mem_limit_bytes: &ram.mem_limit_bytes,
            dicts: &ram.dicts,
            journal: &ram.journal,
        }
    }

    /// The dictionary in `place`, for decoding a page whose codec names it. Call under the
    /// lock of a slot that names it (in `copy_out`'s callback): only then is it that page's
    /// (compress/dict.rs).
    pub fn dict(&self, place: usize) -> Option<std::sync::Arc<Dict>> {
        self.dicts.get(place)
    }

    /// The dictionary table, for recompression (which installs and frees its versions).
    pub fn dicts(&self) -> &'a Dicts {
        self.dicts
    }

    pub fn num_slots(&self) -> u64 {
        self.slots.len() as u64
    }

    pub fn counters(&self) -> &'a Counters {
        self.counters
    }

    pub fn now(&self) -> u16 {
        self.clock.tick()
    }

    /// Ticks since `ac_time` (modulo 2^16).
    pub fn age(&self, now: u16, ac_time: u16) -> u16 {
        now.wrapping_sub(ac_time)
    }

    /// Bytes the pool holds now (`mem_used_total`).
    pub fn pool_bytes(&self) -> u64 {
        self.pool.total_pages() * PAGE
    }

    /// Whether background work (recompression) may allocate pool memory now: always, except in
    /// fault-free mode with fewer than `floor` resident free pages (the I/O path's reserve).
    pub fn background_may_allocate(&self, floor: u64) -> bool {
        !self.pool.is_fault_free() || self.pool.resident_free_pages() >= floor
    }

    /// The memory limit in bytes (0: none).
    pub fn mem_limit_bytes(&self) -> u64 {
        self.mem_limit_bytes.load(Relaxed)
    }

    // --- 1. find ---------------------------------------------------------------------------

    /// Every slot's hint once, starting at `start` and wrapping around (a scan that resumes
    /// where the previous one stopped, so equally good candidates take turns).
    pub fn hints_from(&self, start: u64) -> impl Iterator<Item = (u64, Hint)> + 'a {
        let slots = self.slots;
        let n = slots.len();
        let start = if n == 0 { 0 } else { start as usize % n };
        (start..n).chain(0..start).map(move |i| (i as u64, slots[i].peek()))
    }

    // --- 2. copy out -----------------------------------------------------------------------

    /// Under slot `index`'s lock: if it holds a RAM entry (compressed or raw) and `take`
    /// returns a buffer (of exactly `seen.stored_bytes`) for it, copies the pool bytes there
    /// and sets `mark` if given (the caller must own that mark: slot.rs rule 8). Returns the
    /// entry copied, to give to [`Mover::install`].
    pub fn copy_out<'b>(&self, index: u64, mark: Option<Mark>, take: impl FnOnce(&Seen) -> Option<&'b mut [u8]>) -> Option<Entry> {
        let mut g = self.slots[index as usize].lock();
        let entry = g.entry();
        let (handle, stored_bytes) = match entry {
            Entry::Compressed { handle, len, .. } => (handle, len as usize),
            Entry::Huge { handle } => (handle, PAGE_SIZE),
            _ => return None,
        };
        let seen = Seen { entry, stored_bytes, ac_time: g.ac_time(), rejected: g.peek_rejected() };
        let out = take(&seen)?;
        // SAFETY: `g` is the owner's slot lock and `handle` its live object (pool contract 1);
        // the length is the object's (`stored_bytes`), checked by the slice index.
        unsafe { self.pool.read(handle, &mut out[..stored_bytes]) };
        if let Some(m) = mark {
            g.mark(m);
        }
        Some(entry)
    }

    /// Recompression kept slot `index`'s page as it was: marks it REJECTED if the slot still
    /// holds the page recompression copied (its mark), so later scans pass it by.
    pub fn reject(&self, index: u64) {
        let mut g = self.slots[index as usize].lock();
        if g.is_marked(Mark::Recompress) {
            g.set_rejected();
        }
    }

    /// Slot `index`'s entry, read under its lock (for `BACKING` entries, whose bytes the
    /// caller reads from the device with the segment pinned).
    pub fn entry(&self, index: u64) -> Entry {
        self.slots[index as usize].lock().entry()
    }

    // --- 3. install -------------------------------------------------------------------------

    /// Swaps `new` into slot `index` if the slot still holds `old` (as `unchanged` checks),
    /// then frees `old`. False if the slot changed: `new` is then still the caller's.
    pub fn install(&self, index: u64, old: Entry, new: Entry, unchanged: Unchanged) -> bool {
        let mut g = self.slots[index as usize].lock();
        let marked = match unchanged {
            Unchanged::Marked(m) => g.is_marked(m),
            Unchanged::Pinned => true,
        };
        if g.entry() != old || !marked {
            return false;
        }
        g.replace(self.journal, index, new);
        drop::<SlotGuard>(g);
        self.account(new, true);
        self.release(old);
        true
    }

    /// Stores `payload` (bytes encoded by `codec`, or a raw page if it is `PAGE_SIZE` long) as
    /// a new pool object and installs it in slot `index` as [`Mover::install`] does. False if
    /// the pool is full or the slot changed (the new object is freed then).
    pub fn install_in_ram(&self, index: u64, old: Entry, payload: &[u8], codec: Codec, unchanged: Unchanged) -> bool {
        let Ok(handle) = self.pool.alloc(payload, index as u32) else { return false };
        let new = match payload.len() {
            PAGE_SIZE => Entry::Huge { handle },
            len => Entry::Compressed { handle, len: len as u16, codec },
        };
        if self.install(index, old, new, unchanged) {
            return true;
        }
        // SAFETY: the object was allocated above and never published in a slot, so no reader
        // can reach it and this is its one free.
        unsafe { self.pool.free(handle) };
        false
    }

    /// Compacts the pool: moves objects out of sparse zspages, each under its owner's slot lock
    /// (slot.rs rule 2), and gives their pages back. Returns the pages released.
    pub fn compact(&self) -> u64 {
        self.pool.compact(&mut |owner, h, mv| {
            let mut g = self.slots[owner as usize].lock();
            if let Entry::Compressed { handle, .. } = g.entry() {
                if handle == h {
                    if let Some(new) = mv() {
                        g.relocate(new);
                    }
                }
            }
        })
    }

    // --- what every entry change does ------------------------------------------------------

    /// The recovery journal, for callers that replace an entry under a slot lock themselves.
    pub fn journal(&self) -> &'a Journal {
        self.journal
    }

    /// Frees what an entry just taken out of its slot held (pool contract 2: once), and takes
    /// it out of the statistics.
    pub fn release(&self, old: Entry) {
        self.account(old, false);
        match old {
            // SAFETY: `old` was just taken out of its slot under the slot lock, so this is the
            // one free of a live object and nobody can reach it any more.
            Entry::Compressed { handle, .. } | Entry::Huge { handle } => unsafe { self.pool.free(handle) },
            Entry::Empty | Entry::Same(_) | Entry::Lost => {}
            Entry::Backing { loc, len, .. } => self.records.expect("BACKING entries exist only with a backing device").free(loc, len),
        }
    }

    /// After a request (or cache mode's insert) swapped `new` into a slot under its lock and
    /// took `old` out: accounts the new entry and frees the old one ([`Mover::release`]).
    pub fn replaced(&self, new: Entry, old: Entry) {
        self.account(new, true);
        self.release(old);
    }

    /// Adds (`add`) or removes an entry's share of the statistics.
    pub fn account(&self, e: Entry, add: bool) {
        let c = self.counters;
        let upd = |ctr: &AtomicU64, n: u64| if add { Counters::add(ctr, n) } else { Counters::sub(ctr, n) };
        match e {
            // A lost page holds nothing and is counted by recovery (`Recovered::lost`).
            Entry::Empty | Entry::Lost => return,
            Entry::Same(_) => upd(&c.same_pages, 1),
            Entry::Compressed { len, codec, .. } => {
                upd(&c.compr_data_size, len as u64);
                upd(&c.codec_pages[codec.index()], 1);
                upd(&c.codec_bytes[codec.index()], len as u64);
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
            Entry::Backing { len, codec, .. } => {
                upd(&c.bd_count, 1);
                upd(&c.bd_bytes, len as u64);
                // A raw page on the device has no codec; an encoded one keeps its dictionary
                // in use (`compress/dict.rs`).
                if (len as usize) < PAGE_SIZE {
                    upd(&c.codec_pages[codec.index()], 1);
                    upd(&c.codec_bytes[codec.index()], len as u64);
                }
            }
        }
        upd(&c.pages_stored, 1);
    }
}
