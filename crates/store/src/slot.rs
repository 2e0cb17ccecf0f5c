//! The slot table: one 16-byte entry per 4 KiB page of the device (zram's `table`).
//!
//! # Entry layout
//! ```text
//! meta (u64):  bit 63       LOCK        held while a thread reads or changes this slot
//!              bits 60..=62 kind        EMPTY, SAME, COMPRESSED, HUGE, BACKING, LOST
//!              bit 59       MOVING      set by writeback when it copies the page out; cleared
//!                                       by every `replace` (see rule 8)
//!              bit 58       RECOMPRESSING  set by recompression when it copies the page out;
//!                                       cleared by every `replace` (see rule 8)
//!              bit 57       REJECTED    recompression tried this page and kept the old
//!                                       encoding; cleared by every `replace` (a new page)
//!              bits 53..=56 codec       how a COMPRESSED or BACKING payload is encoded
//!                                       (`compress::Codec`: the store's algorithm, the
//!                                       recompression codec, or it with a dictionary
//!                                       version); zero for the other kinds
//!              bits 48..=52 policy      cache mode only (`cache/policy.rs`), zero otherwise:
//!                                       48..=49 FREQ (0..=3), 50 READAHEAD, 51 GHOST,
//!                                       52 QUEUED; kept by `replace` (see rule 9)
//!              bits 32..=47 ac_time     coarse time of the last access (see `mover::Clock`)
//!              bits 0..=12  size        stored bytes (compressed length; 4096 for HUGE)
//! data (u64):  SAME -> the fill word; COMPRESSED/HUGE -> pool handle; BACKING -> location
//! ```
//! LOST is written only by recovery (`ram/recover.rs`), for a slot whose entry it could not
//! vouch for: reading it is an I/O error; writing or discarding it replaces it as any entry.
//!
//! # Locking rules
//! 1. The LOCK bit is a per-slot spin lock (zram's slot lock). Every read or change of a
//!    slot's `data`, kind or size happens with it held; `data` is only read or written under
//!    the lock, so relaxed accesses suffice inside it (the lock's Acquire/Release orders them).
//! 2. The pool object a slot's handle names may be read only while holding that slot's lock;
//!    compaction moves an object only while holding the lock of the slot that owns it. So a
//!    slot lock pins its object.
//! 3. Lock order: slot lock, then a pool size-class lock, then the pool's page arena lock.
//!    Never take a slot lock while holding a class lock. Never hold two slot locks.
//! 4. Hold times are short (a copy of at most one page, or one compression for partial
//!    writes); waiters spin briefly, then yield. The one exception is a partial-page write
//!    (`Store::update_page`) of a page on the backing device, or one that overflows to it:
//!    the read-modify-write does its backing I/O under the slot lock. Whole-page reads and
//!    writes never do I/O under a slot lock.
//! 5. The meta word may be loaded without the lock, as a hint only ([`Slot::peek`]: kind,
//!    access time, size). The backing tier's scans (writeback, GC) use it to skip slots that
//!    cannot interest them; every decision is taken again under the lock. Block status
//!    (`Store::block_status`) reports the hinted kind as it is (a snapshot, which the NBD
//!    protocol allows to be stale under concurrent writes) and locks only SAME slots, for
//!    their fill word.
//! 6. The backing tier's locks (defined and described in `backing/mod.rs`) fit into this
//!    order as follows: the maintenance mutex (one writeback or GC at a time) is taken before
//!    any slot lock; the overflow log head and the free-segment list are leaves, taken after
//!    a slot lock or with none, in that order (head, then free list), and no backing I/O
//!    happens while either is held. So the full order is:
//!    maintenance -> slot -> { pool class -> arena | overflow head -> free-segment list }.
//! 7. A `BACKING` entry's bytes on the device are pinned for a reader by the segment's reader
//!    count, taken under the slot lock (`backing::space::Pin`): a segment is reused only when
//!    it holds no live record and no reader, so a reader that drops the slot lock before its
//!    `pread` never reads a reused segment.
//! 8. Movers (writeback, GC, promotion, recompression; all through `ram/mover.rs`, whose contract
//!    spells this out) copy a page out under the lock, work without it, and install the new
//!    place only if the slot still holds the same page. For a RAM entry, "same entry" is not
//!    enough (a rewrite may get the freed handle back with the same length): the mover sets
//!    its mark when it copies, every `replace` clears every mark, and install requires the
//!    mark. There are two marks, each with one owner at a time: MOVING (writeback, under the
//!    backing tier's maintenance mutex) and RECOMPRESSING (recompression, under its own
//!    mutex). A page both copied out is installed by at most one of them: the first install
//!    is a `replace`, which clears the other's mark. For a BACKING entry the location is unique while its segment is pinned, so
//!    GC and promotion hold a pin on the segment from the copy to the install instead.
//! 9. The policy bits (cache mode's eviction state) are read and changed only under the slot
//!    lock, like the entry. `replace` keeps them: whether the slot's index sits in an eviction
//!    queue (QUEUED) does not change when its page is rewritten or dropped; the cache's
//!    policy (`cache/policy.rs`) owns their meaning. Outside cache mode they stay zero.
//! 10. Crash consistency: the first `replace` under a lock records the slot's old words in the
//!     recovery journal (`journal.rs`) before it stores `data`, and the guard's release stores
//!     the new `meta` (still locked), gives the record back, then unlocks. A process killed
//!     at any instruction so leaves every locked slot restorable to its old entry, whole.
//!     `relocate` needs no record: it changes `data` alone, from one copy of the page to
//!     another, both live until the lock is released.

use std::sync::atomic::{AtomicU64, Ordering::*};

use crate::compress::Codec;
use crate::journal::{Held, Journal};
use crate::zspool::Handle;

/// Slots are indexed by u32 in pool object headers (the owner back-pointer), top bit reserved.
pub const MAX_SLOTS: u64 = 1 << 31;

const LOCK: u64 = 1 << 63;
const KIND_SHIFT: u32 = 60;
const KIND_MASK: u64 = 0b111 << KIND_SHIFT;
const AC_SHIFT: u32 = 32;
const AC_MASK: u64 = 0xffff << AC_SHIFT;
const SIZE_MASK: u64 = 0x1fff;
const MOVING: u64 = 1 << 59;
const RECOMPRESSING: u64 = 1 << 58;
const REJECTED: u64 = 1 << 57;
const CODEC_SHIFT: u32 = 53;
const CODEC_MASK: u64 = 0xf << CODEC_SHIFT;
const POLICY_SHIFT: u32 = 48;
const POLICY_MASK: u64 = 0x1f << POLICY_SHIFT;

const KIND_EMPTY: u64 = 0;
const KIND_SAME: u64 = 1;
const KIND_COMPRESSED: u64 = 2;
const KIND_HUGE: u64 = 3;
const KIND_BACKING: u64 = 4;
const KIND_LOST: u64 = 5;

/// What a slot holds, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Never written, or discarded: reads as zeroes.
    Empty,
    /// Every 8-byte word of the page equals this value.
    Same(u64),
    /// A compressed object of `len` bytes in the pool, encoded by `codec`.
    Compressed { handle: Handle, len: u16, codec: Codec },
    /// A raw page (did not compress below the huge threshold) in the pool.
    Huge { handle: Handle },
    /// On the backing device at `loc`, `len` stored bytes (the backing tier interprets both),
    /// encoded by `codec` unless raw (`len` 4096).
    Backing { loc: u64, len: u16, codec: Codec },
    /// Recovery could not vouch for what the slot held (`ram/recover.rs`): reads fail.
    Lost,
}

impl Entry {
    /// How the entry's payload is encoded: `codec` of a compressed or backing entry, the
    /// primary codec for the others (whose payload, if any, is a raw page).
    pub fn codec(self) -> Codec {
        match self {
            Entry::Compressed { codec, .. } | Entry::Backing { codec, .. } => codec,
            _ => Codec::PRIMARY,
        }
    }

    fn encode(self) -> (u64, u64) {
        match self {
            Entry::Empty => (KIND_EMPTY << KIND_SHIFT, 0),
            Entry::Same(w) => (KIND_SAME << KIND_SHIFT, w),
            Entry::Compressed { handle, len, codec } => ((KIND_COMPRESSED << KIND_SHIFT) | codec_bits(codec) | len as u64, handle.0),
            Entry::Huge { handle } => ((KIND_HUGE << KIND_SHIFT) | crate::PAGE, handle.0),
            Entry::Backing { loc, len, codec } => ((KIND_BACKING << KIND_SHIFT) | codec_bits(codec) | len as u64, loc),
            Entry::Lost => (KIND_LOST << KIND_SHIFT, 0),
        }
    }

    fn decode(meta: u64, data: u64) -> Entry {
        let size = (meta & SIZE_MASK) as u16;
        let codec = Codec::from_bits(((meta & CODEC_MASK) >> CODEC_SHIFT) as u8);
        match (meta & KIND_MASK) >> KIND_SHIFT {
            KIND_EMPTY => Entry::Empty,
            KIND_SAME => Entry::Same(data),
            KIND_COMPRESSED => Entry::Compressed { handle: Handle(data), len: size, codec },
            KIND_HUGE => Entry::Huge { handle: Handle(data) },
            KIND_BACKING => Entry::Backing { loc: data, len: size, codec },
            KIND_LOST => Entry::Lost,
            k => unreachable!("slot kind {k} is never written (recovery makes every other kind LOST)"),
        }
    }
}

fn codec_bits(codec: Codec) -> u64 {
    ((codec.bits() as u64) << CODEC_SHIFT) & CODEC_MASK
}

/// The two movers' marks (rule 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// MOVING: writeback's, under the backing tier's maintenance mutex.
    Writeback,
    /// RECOMPRESSING: recompression's, under its own mutex (`recompress/`).
    Recompress,
}

impl Mark {
    fn bit(self) -> u64 {
        match self {
            Mark::Writeback => MOVING,
            Mark::Recompress => RECOMPRESSING,
        }
    }
}

/// One slot. 16 bytes: zram's per-slot metadata budget.
#[derive(Default)]
#[repr(C)]
pub(crate) struct Slot {
    meta: AtomicU64,
    data: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16, "slot metadata budget is 16 bytes");

// SAFETY: two AtomicU64; all-zero is the EMPTY, unlocked slot.
unsafe impl crate::zeroed::Zeroable for Slot {}

/// What a slot holds, by kind only (see [`Slot::peek`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Empty,
    Same,
    Compressed,
    Huge,
    Backing,
    Lost,
}

/// A lock-free look at a slot's meta word (rule 5): possibly stale, never acted on alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hint {
    pub kind: Kind,
    pub ac_time: u16,
    pub size: u16,
    /// The codec bits (meaningful for COMPRESSED and BACKING).
    pub codec: Codec,
    /// Recompression tried this page and kept it as it was.
    pub rejected: bool,
}

impl Slot {
    /// Reads the meta word without the lock (rule 5).
    pub fn peek(&self) -> Hint {
        let m = self.meta.load(Relaxed);
        let kind = match (m & KIND_MASK) >> KIND_SHIFT {
            KIND_EMPTY => Kind::Empty,
            KIND_SAME => Kind::Same,
            KIND_COMPRESSED => Kind::Compressed,
            KIND_HUGE => Kind::Huge,
            KIND_BACKING => Kind::Backing,
            _ => Kind::Lost,
        };
        Hint {
            kind,
            ac_time: ((m & AC_MASK) >> AC_SHIFT) as u16,
            size: (m & SIZE_MASK) as u16,
            codec: Codec::from_bits(((m & CODEC_MASK) >> CODEC_SHIFT) as u8),
            rejected: m & REJECTED != 0,
        }
    }

    /// The raw words, for recovery (no live process uses the state): (meta, data).
    /// Makes the slot's memory resident and writable by a write that changes nothing: a
    /// compare-exchange of the word with itself, which needs write access whether it succeeds
    /// or not (an idempotent RMW such as `fetch_or(0)` may be compiled to a load, and a load
    /// leaves the page to fault on its first write), and is safe whoever holds the lock or
    /// changes the slot meanwhile. For the slot table of a swap server, whose I/O path must
    /// take no page fault.
    pub fn touch(&self) {
        let cur = self.meta.load(Relaxed);
        let _ = self.meta.compare_exchange(cur, cur, Relaxed, Relaxed);
    }

    pub fn raw(&self) -> (u64, u64) {
        (self.meta.load(Relaxed), self.data.load(Relaxed))
    }

    /// Sets the raw words, for recovery: the entry `e` with `meta`'s other bits kept
    /// (access time, policy), unlocked and with no mark.
    pub fn set_recovered(&self, meta: u64, e: Entry) {
        let (m, d) = e.encode();
        self.data.store(d, Relaxed);
        self.meta.store((meta & (AC_MASK | POLICY_MASK)) | m, Relaxed);
    }

    /// Whether `meta` (from [`Slot::raw`]) has the lock bit.
    pub fn is_locked(meta: u64) -> bool {
        meta & LOCK != 0
    }

    /// Decodes raw words as recovery reads them: `None` for a kind no version writes.
    pub fn decode_raw(meta: u64, data: u64) -> Option<Entry> {
        ((meta & KIND_MASK) >> KIND_SHIFT <= KIND_LOST).then(|| Entry::decode(meta, data))
    }

    /// Takes this slot's lock (rule 1).
    pub fn lock(&self) -> SlotGuard<'_> {
        let mut spins = 0u32;
        loop {
            let m = self.meta.load(Relaxed);
            if m & LOCK == 0 && self.meta.compare_exchange_weak(m, m | LOCK, Acquire, Relaxed).is_ok() {
                return SlotGuard { slot: self, meta: m, held: None };
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// A held slot lock. Dropping it publishes the changes and releases the lock.
pub(crate) struct SlotGuard<'a> {
    slot: &'a Slot,
    /// The meta word without the LOCK bit, as it will be stored on release.
    meta: u64,
    /// The journal record holding the slot's old words, from the first `replace` (rule 10).
    held: Option<(&'a Journal, Held)>,
}

impl<'a> SlotGuard<'a> {
    pub fn entry(&self) -> Entry {
        Entry::decode(self.meta, self.slot.data.load(Relaxed))
    }

    /// Replaces the entry of slot `index` (this one) and returns the old one; the caller frees
    /// what the old one held, after releasing the lock. The first replace under a lock records
    /// the old words in `journal` (rule 10).
    pub fn replace(&mut self, journal: &'a Journal, index: u64, new: Entry) -> Entry {
        let old = self.entry();
        if self.held.is_none() {
            let held = journal.begin(index, self.meta, self.slot.data.load(Relaxed));
            self.held = Some((journal, held));
            // The record is written before `data` changes (program order is what a dead
            // process leaves behind: every store before the kill reaches memory).
            std::sync::atomic::compiler_fence(SeqCst);
        }
        let (meta, data) = new.encode();
        self.meta = (self.meta & (AC_MASK | POLICY_MASK)) | meta;
        self.slot.data.store(data, Relaxed);
        old
    }

    /// Compaction moved the slot's compressed object to `handle`: only the handle changes.
    /// The page is the same, so marks, REJECTED and the codec stay (a mover's install still
    /// fails: its old entry named the old handle).
    pub fn relocate(&mut self, handle: Handle) {
        debug_assert!(matches!(self.entry(), Entry::Compressed { .. }));
        self.slot.data.store(handle.0, Relaxed);
    }

    /// Marks the page as being copied out by the mover that owns `mark` (rule 8).
    pub fn mark(&mut self, mark: Mark) {
        self.meta |= mark.bit();
    }

    /// True if nothing replaced the entry since `mark(mark)`.
    pub fn is_marked(&self, mark: Mark) -> bool {
        self.meta & mark.bit() != 0
    }

    /// Whether recompression kept this page as it was.
    pub fn peek_rejected(&self) -> bool {
        self.meta & REJECTED != 0
    }

    /// Records that recompression kept this page as it was (until the next `replace`).
    pub fn set_rejected(&mut self) {
        self.meta |= REJECTED;
    }

    /// Records an access at `tick`.
    pub fn touch(&mut self, tick: u16) {
        self.meta = (self.meta & !AC_MASK) | ((tick as u64) << AC_SHIFT);
    }

    pub fn ac_time(&self) -> u16 {
        ((self.meta & AC_MASK) >> AC_SHIFT) as u16
    }

    /// The cache policy bits (rule 9), as the low 5 bits.
    pub fn policy(&self) -> u8 {
        ((self.meta & POLICY_MASK) >> POLICY_SHIFT) as u8
    }

    /// Sets the cache policy bits (rule 9) to the low 5 bits of `bits`.
    pub fn set_policy(&mut self, bits: u8) {
        self.meta = (self.meta & !POLICY_MASK) | (((bits as u64) << POLICY_SHIFT) & POLICY_MASK);
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if let Some((journal, held)) = self.held.take() {
            // Rule 10: the new meta in place while still locked, then the record given back.
            self.slot.meta.store(self.meta | LOCK, Relaxed);
            journal.end(held);
        }
        self.slot.meta.store(self.meta & !LOCK, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::RECORDS;
    use crate::zeroed::ZeroedSlice;

    /// A journal for the tests' slots (leaked: guards borrow it for as long as the slot).
    fn journal() -> &'static Journal {
        Box::leak(Box::new(Journal::new(ZeroedSlice::new(RECORDS).unwrap())))
    }

    #[test]
    fn entries_round_trip_through_the_packed_layout() {
        let j = journal();
        let s = Slot::default();
        let cases = [
            Entry::Empty,
            Entry::Same(0xdead_beef_0000_0001),
            Entry::Compressed { handle: Handle((1 << 52) | 77), len: 3071, codec: Codec::PRIMARY },
            Entry::Compressed { handle: Handle(5), len: 17, codec: Codec::with_dict(Codec::DICT_VERSIONS - 1) },
            Entry::Huge { handle: Handle(42) },
            Entry::Backing { loc: u64::MAX >> 1, len: 4096, codec: Codec::PRIMARY },
            Entry::Backing { loc: 7, len: 1000, codec: Codec::STRONG },
        ];
        for e in cases {
            let mut g = s.lock();
            g.touch(0xabcd);
            g.replace(j, 0, e);
            drop(g);
            let g = s.lock();
            assert_eq!(g.entry(), e);
            assert_eq!(g.ac_time(), 0xabcd, "replace keeps the access time");
        }
    }

    #[test]
    fn policy_bits_survive_replace_and_touch() {
        let j = journal();
        let s = Slot::default();
        let mut g = s.lock();
        g.set_policy(0b1_0110);
        g.replace(j, 0, Entry::Same(3));
        g.touch(9);
        g.replace(j, 0, Entry::Empty);
        assert_eq!((g.policy(), g.entry(), g.ac_time()), (0b1_0110, Entry::Empty, 9));
        g.set_policy(0xff);
        assert_eq!(g.policy(), 0x1f, "five bits");
        assert_eq!(g.entry(), Entry::Empty);
    }

    #[test]
    fn marks_survive_touch_and_die_with_replace() {
        let j = journal();
        let s = Slot::default();
        let mut g = s.lock();
        let e = Entry::Compressed { handle: Handle(9), len: 100, codec: Codec::PRIMARY };
        g.replace(j, 0, e);
        g.mark(Mark::Writeback);
        g.mark(Mark::Recompress);
        g.set_rejected();
        g.touch(7);
        drop(g);
        let hint = s.peek();
        assert!(hint.rejected && hint.codec == Codec::PRIMARY);
        let mut g = s.lock();
        assert!(g.is_marked(Mark::Writeback) && g.is_marked(Mark::Recompress) && g.entry() == e);
        g.replace(j, 0, e);
        assert!(!g.is_marked(Mark::Writeback), "a rewrite with the same handle and length is still a rewrite");
        assert!(!g.is_marked(Mark::Recompress) && !g.peek_rejected());
    }

    #[test]
    fn the_lock_excludes_other_threads() {
        let j = journal();
        let s = std::sync::Arc::new(Slot::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let mut g = s.lock();
                        let n = match g.entry() {
                            Entry::Same(n) => n,
                            _ => 0,
                        };
                        g.replace(j, 0, Entry::Same(n + 1));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(s.lock().entry(), Entry::Same(40_000));
    }
}
