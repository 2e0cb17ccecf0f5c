//! The space map of the backing device: which segments are free, open or sealed, how many
//! live bytes each holds, and who is reading it.
//!
//! The device is cut into segments of `seg_bytes` (1 MiB by default). A segment is
//! - FREE: on the free list, holding nothing;
//! - OPEN: the current segment of a log head (`log.rs`), which appends records to it;
//! - SEALED: full (or abandoned by its head); it only loses live bytes, as records are
//!   discarded, rewritten, promoted back to RAM or moved away by GC.
//!
//! A record's location (`loc`, the byte offset of its header) is what a slot's `BACKING` entry
//! holds; `loc / seg_bytes` is its segment. A segment goes back to FREE when it is sealed, its
//! live bytes are 0 and no reader pins it (slot.rs rule 7); whoever sees the last of those
//! three conditions become true reclaims it. Each opening of a segment takes the next value of
//! one 64-bit counter as its generation, which is in every record's seal (`seal.rs`: the
//! checksum, or the AES-GCM nonce): a stale record from an earlier life of the segment never
//! verifies, and no two lives of any segments share a generation within a run, also across
//! a takeover: the generations are in the state file then (`keep.rs`), and a successor
//! rebuilds everything else from the records the slots name ([`SpaceMap::taking_over`]).
//!
//! Locking: the free list is one mutex (a leaf, slot.rs rule 6); everything else is atomics.
//! Live bytes grow only while a segment is OPEN (under its head's lock), so within one life a
//! SEALED segment that reaches 0 stays dead. A segment goes to FREE and back out of it only
//! under the free-list lock, and the reclaim decides there (`try_reclaim`): a look without
//! the lock may see an earlier life of the segment.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::*};

use super::device::BackingDevice;
use crate::zeroed::ZeroedSlice;

/// Free segments kept for GC (see [`SpaceMap::open_segment`]).
pub(crate) const GC_RESERVE_SEGMENTS: u64 = 1;

const FREE: u8 = 0;
const OPEN: u8 = 1;
const SEALED: u8 = 2;

struct Segment {
    live_bytes: AtomicU64,
    /// Records reserved but not yet written (or failed). Grows only while OPEN, so a SEALED
    /// segment with none will not be written again: only then may GC read it.
    writers: AtomicU32,
    readers: AtomicU32,
    state: AtomicU8,
    /// Freed since its bytes were last punched out of the file.
    dirty: AtomicBool,
}

pub(crate) struct SpaceMap {
    pub seg_bytes: u64,
    segs: Box<[Segment]>,
    /// Free segment numbers; popped from the end, so low offsets are used first and freed
    /// segments are reused before untouched ones (the file stays compact).
    free: Mutex<Vec<u32>>,
    in_use: AtomicU64,
    /// Word 0: the last generation given to a segment. Never wraps (2^64 openings), so
    /// generations never repeat: the AES-GCM nonce relies on it (`seal.rs`). Word 1 + s: the
    /// generation of segment s's current (or last) life; 0: never opened. In the state file
    /// when the tier's state is kept (`keep.rs`): a segment's generation is there before any
    /// record is sealed with it, and a successor continues the counter.
    gens: GenTable,
}

/// Where the generations are: this process's memory, or the state file.
pub(crate) enum GenTable {
    Own(Box<[AtomicU64]>),
    Kept(ZeroedSlice<AtomicU64>),
}

impl std::ops::Deref for GenTable {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        match self {
            GenTable::Own(b) => b,
            GenTable::Kept(z) => z,
        }
    }
}

impl GenTable {
    /// Words a table for `segments` segments takes.
    pub fn words(segments: u64) -> usize {
        segments as usize + 1
    }
}

/// Keeps a segment from being reused while a reader reads a record in it (slot.rs rule 7).
pub(crate) struct Pin<'a> {
    map: &'a SpaceMap,
    seg: u32,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        // SeqCst with `free`'s: of a reader leaving and the last record going, at least one
        // sees the other and reclaims the segment.
        self.map.segs[self.seg as usize].readers.fetch_sub(1, SeqCst);
        self.map.try_reclaim(self.seg);
    }
}

impl SpaceMap {
    /// Segments of `seg_bytes` on a device of `device_bytes`.
    pub fn segments(device_bytes: u64, seg_bytes: u64) -> u32 {
        (device_bytes / seg_bytes).min(u32::MAX as u64) as u32
    }

    /// A new device's map, every segment FREE; the generations in this process's memory.
    pub fn new(device_bytes: u64, seg_bytes: u64) -> SpaceMap {
        let n = Self::segments(device_bytes, seg_bytes);
        SpaceMap::with_gens(device_bytes, seg_bytes, GenTable::Own((0..=n).map(|_| AtomicU64::new(0)).collect()))
    }

    /// A new device's map whose generations are in `gens` (all zero: the state file's tier
    /// region, `keep.rs`), [`GenTable::words`] long.
    pub fn with_gens(device_bytes: u64, seg_bytes: u64, gens: GenTable) -> SpaceMap {
        let n = Self::segments(device_bytes, seg_bytes);
        assert_eq!(gens.len(), GenTable::words(n as u64));
        SpaceMap { seg_bytes, segs: Self::fresh(n, FREE), free: Mutex::new((0..n).rev().collect()), in_use: AtomicU64::new(0), gens }
    }

    fn fresh(n: u32, state: u8) -> Box<[Segment]> {
        (0..n)
            .map(|_| Segment {
                live_bytes: AtomicU64::new(0),
                writers: AtomicU32::new(0),
                readers: AtomicU32::new(0),
                state: AtomicU8::new(state),
                dirty: AtomicBool::new(false),
            })
            .collect()
    }

    /// A dead process's map (a takeover): the generations its state file kept, nothing else
    /// trusted. Until [`SpaceMap::taken_over`], every segment is SEALED with no live bytes
    /// and [`SpaceMap::claim`] counts the records the slots name.
    pub fn taking_over(device_bytes: u64, seg_bytes: u64, gens: GenTable) -> SpaceMap {
        let n = Self::segments(device_bytes, seg_bytes);
        assert_eq!(gens.len(), GenTable::words(n as u64));
        SpaceMap { seg_bytes, segs: Self::fresh(n, SEALED), free: Mutex::new(Vec::new()), in_use: AtomicU64::new(n as u64), gens }
    }

    /// Counts live the record of `bytes` (header and payload) at `loc` a slot names, if it
    /// lies inside one segment of the device that was opened (its generation is not 0 and
    /// not past the counter); `false` otherwise (the slot is then LOST).
    pub fn claim(&self, loc: u64, bytes: u64) -> bool {
        let seg = loc / self.seg_bytes;
        let last = self.gens[0].load(Relaxed);
        let inside = seg < self.segs.len() as u64
            && bytes <= self.seg_bytes - loc % self.seg_bytes
            && (1..=last).contains(&self.gens[1 + seg as usize].load(Relaxed));
        if inside {
            self.segs[seg as usize].live_bytes.fetch_add(bytes, Relaxed);
        }
        inside
    }

    /// Ends a takeover: every segment holding a claimed record stays SEALED (a segment the
    /// dead process had open is full: nothing is appended to it under its generation again),
    /// the others are FREE (and punched out by the next [`SpaceMap::punch_free`] if they were
    /// ever used); the generation counter goes on from the highest one in use. Returns the
    /// segments in use.
    pub fn taken_over(&self) -> u64 {
        let mut free = self.free.lock();
        let mut last = self.gens[0].load(Relaxed);
        for seg in (0..self.segs.len() as u32).rev() {
            let s = &self.segs[seg as usize];
            let gen = self.gens[1 + seg as usize].load(Relaxed);
            last = last.max(gen);
            if s.live_bytes.load(Relaxed) == 0 {
                s.state.store(FREE, SeqCst);
                s.dirty.store(gen != 0, Relaxed);
                free.push(seg);
                self.in_use.fetch_sub(1, Relaxed);
            }
        }
        self.gens[0].store(last, SeqCst);
        self.in_use.load(Relaxed)
    }

    pub fn num_segments(&self) -> u64 {
        self.segs.len() as u64
    }
    pub fn seg_of(&self, loc: u64) -> u32 {
        (loc / self.seg_bytes) as u32
    }
    pub fn gen(&self, seg: u32) -> u64 {
        self.gens[1 + seg as usize].load(Acquire)
    }
    pub fn live_bytes(&self, seg: u32) -> u64 {
        self.segs[seg as usize].live_bytes.load(Relaxed)
    }
    /// Segments not FREE.
    pub fn segments_in_use(&self) -> u64 {
        self.in_use.load(Relaxed)
    }
    pub fn free_segments(&self) -> u64 {
        self.num_segments() - self.segments_in_use()
    }

    /// Takes a FREE segment and opens it with a new generation, unique in the run. The last
    /// [`GC_RESERVE_SEGMENTS`] free segments go only to GC (`use_reserve`), so that a full
    /// device can always make room by moving records.
    pub fn open_segment(&self, use_reserve: bool) -> Option<u32> {
        let seg = {
            let mut free = self.free.lock();
            if !use_reserve && free.len() as u64 <= GC_RESERVE_SEGMENTS {
                return None;
            }
            free.pop()?
        };
        let s = &self.segs[seg as usize];
        debug_assert!(
            s.state.load(SeqCst) == FREE && s.live_bytes.load(SeqCst) == 0,
            "segment {seg} was on the free list with state {} and {} live bytes",
            s.state.load(SeqCst),
            s.live_bytes.load(SeqCst)
        );
        // A read-modify-write: two heads opening segments at once get different values.
        self.gens[1 + seg as usize].store(self.gens[0].fetch_add(1, Relaxed) + 1, Release);
        s.dirty.store(false, Relaxed);
        s.state.store(OPEN, Release);
        self.in_use.fetch_add(1, Relaxed);
        Some(seg)
    }

    /// OPEN -> SEALED: no record will be added any more.
    pub fn seal(&self, seg: u32) {
        self.segs[seg as usize].state.store(SEALED, SeqCst);
        self.try_reclaim(seg);
    }

    /// Counts a record placed in an OPEN segment (by its head, under the head's lock), and
    /// its write in flight until [`SpaceMap::written`].
    pub fn add_live(&self, seg: u32, bytes: u64) {
        let s = &self.segs[seg as usize];
        debug_assert_eq!(s.state.load(Relaxed), OPEN);
        s.writers.fetch_add(1, SeqCst);
        s.live_bytes.fetch_add(bytes, SeqCst);
    }

    /// The write of the record at `loc` is over (done or failed).
    pub fn written(&self, loc: u64) {
        self.segs[self.seg_of(loc) as usize].writers.fetch_sub(1, Release);
    }

    /// Un-counts a record at `loc` of `bytes` (discarded, rewritten, moved, or never installed).
    pub fn free(&self, loc: u64, bytes: u64) {
        let seg = self.seg_of(loc);
        let before = self.segs[seg as usize].live_bytes.fetch_sub(bytes, SeqCst);
        assert!(before >= bytes, "segment {seg}: freeing {bytes} bytes of {before} live");
        if before == bytes {
            self.try_reclaim(seg);
        }
    }

    /// Pins the segment of a live record for a reader. Call with the owner's slot lock held.
    pub fn pin(&self, loc: u64) -> Pin<'_> {
        let seg = self.seg_of(loc);
        self.segs[seg as usize].readers.fetch_add(1, SeqCst);
        Pin { map: self, seg }
    }

    /// Pins a SEALED segment with no write in flight, for GC to read and empty; `None` if
    /// it is not such a segment (any more).
    ///
    /// Unlike [`SpaceMap::pin`], nothing live in the segment orders this pin before a
    /// reclaim, so it is taken under the free-list lock, under which `try_reclaim` re-checks
    /// the readers before it frees the segment: either the reclaim sees this pin, or this
    /// sees the segment FREE. (Without the lock, GC could pin a segment between the reclaim's
    /// check and its state change, then read it while it was reused: a stale image whose
    /// records fail their checksums, which GC would then move as corrupt.)
    pub fn pin_sealed(&self, seg: u32) -> Option<Pin<'_>> {
        let s = &self.segs[seg as usize];
        let _free = self.free.lock();
        s.readers.fetch_add(1, SeqCst);
        let pin = Pin { map: self, seg };
        let ok = s.state.load(SeqCst) == SEALED && s.writers.load(Acquire) == 0;
        drop(_free);
        ok.then_some(pin)
    }

    /// SEALED, empty and unread -> FREE.
    ///
    /// The first look is without the lock, so it may see an earlier life of the segment: two
    /// threads can both see it SEALED, empty and unread (the last record freed, the last
    /// reader gone), one frees it, a head reopens, fills and seals it, and the other then
    /// takes the lock. So every condition is looked at again under the free-list lock, state
    /// first: under that lock a SEALED segment stays SEALED (freeing one takes the lock, and
    /// so does reopening one, which pops it from the list), and a SEALED segment's live bytes
    /// and readers only fall, so what is seen there holds until the segment is freed. (Checking
    /// only the readers there freed a segment of the next life with its records live: a head
    /// then reopened it over them; found by `tests/takeover.rs`, 2 runs in 32 under load.)
    fn try_reclaim(&self, seg: u32) {
        let s = &self.segs[seg as usize];
        if s.state.load(SeqCst) != SEALED || s.live_bytes.load(SeqCst) != 0 || s.readers.load(SeqCst) != 0 {
            return;
        }
        #[cfg(test)]
        tests::reclaim_window();
        let mut free = self.free.lock();
        // GC pins under this lock too (`pin_sealed`): it cannot slip in after this look.
        if s.state.load(SeqCst) != SEALED || s.live_bytes.load(SeqCst) != 0 || s.readers.load(SeqCst) != 0 {
            return;
        }
        s.state.store(FREE, SeqCst);
        s.dirty.store(true, Relaxed);
        free.push(seg);
        self.in_use.fetch_sub(1, Relaxed);
    }

    /// SEALED segments holding under `max_live_pct` percent of live bytes, emptiest first.
    pub fn gc_candidates(&self, max_live_pct: u64) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = (0..self.segs.len() as u32)
            .filter(|&i| {
                let s = &self.segs[i as usize];
                s.state.load(Acquire) == SEALED && s.writers.load(Acquire) == 0
            })
            .map(|i| (i, self.live_bytes(i)))
            .filter(|&(_, live)| live * 100 < self.seg_bytes * max_live_pct)
            .collect();
        v.sort_by_key(|&(_, live)| live);
        v
    }

    /// Punches freed segments out of the file, so a sparse backing file gives its blocks
    /// back. Under the free-list lock, so that no segment is reopened meanwhile. Returns the
    /// number punched.
    pub fn punch_free(&self, dev: &dyn BackingDevice) -> std::io::Result<u64> {
        let free = self.free.lock();
        let mut n = 0;
        for &seg in free.iter() {
            let s = &self.segs[seg as usize];
            if s.dirty.swap(false, Relaxed) {
                dev.discard(seg as u64 * self.seg_bytes, self.seg_bytes)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::Arc;

    thread_local! {
        /// Run once by this thread's next reclaim between its look without the lock and the
        /// lock: what other threads could do in that window.
        static IN_WINDOW: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    pub(super) fn reclaim_window() {
        if let Some(f) = IN_WINDOW.with(|w| w.borrow_mut().take()) {
            f();
        }
    }

    #[test]
    fn a_reclaim_that_looked_at_an_earlier_life_frees_nothing() {
        let m = Arc::new(SpaceMap::new(2 * 65536, 65536));
        let a = m.open_segment(true).unwrap();
        m.add_live(a, 100);
        m.written(0);
        m.seal(a);
        // A reader holds the segment while its last record goes: the reader's leaving will
        // reclaim it.
        let pin = m.pin(0);
        m.free(0, 100);
        assert_eq!(m.segments_in_use(), 1, "pinned");
        // After that reclaim's first look (SEALED, empty, unread), and before its lock: another
        // thread frees the segment, a head reopens it, writes 500 bytes and seals it.
        let other = Arc::clone(&m);
        IN_WINDOW.with(|w| {
            *w.borrow_mut() = Some(Box::new(move || {
                other.try_reclaim(a);
                assert_eq!(other.segments_in_use(), 0, "the other thread freed it");
                assert_eq!(other.open_segment(true), Some(a), "and it was reopened");
                other.add_live(a, 500);
                other.written(0);
                other.seal(a);
            }))
        });
        drop(pin);
        assert_eq!((m.segments_in_use(), m.live_bytes(a)), (1, 500), "the next life's records keep it");
        assert_ne!(m.open_segment(true), Some(a), "it is not handed out over its live records");
    }

    #[test]
    fn a_segment_is_reclaimed_only_when_sealed_empty_and_unread() {
        let m = SpaceMap::new(4 * 65536, 65536);
        let s = m.open_segment(true).unwrap();
        assert_eq!(s, 0, "low offsets first");
        let g = m.gen(s);
        m.add_live(s, 100);
        m.add_live(s, 50);
        m.written(0);
        m.written(100);
        m.free(100, 100);
        assert_eq!(m.segments_in_use(), 1, "still open");
        m.seal(s);
        let pin = m.pin(0);
        m.free(0, 50);
        assert_eq!(m.segments_in_use(), 1, "pinned by a reader");
        drop(pin);
        assert_eq!(m.segments_in_use(), 0, "the last reader reclaims it");
        let again = m.open_segment(false).unwrap();
        assert_eq!(again, s, "freed segments are reused first");
        assert!(m.gen(again) > g, "with a new generation");
    }

    #[test]
    fn no_two_lives_of_any_segments_share_a_generation() {
        // The AES-GCM nonce is (generation, location): a generation must name one life of
        // one segment, across segments too (a per-segment counter would repeat values).
        let m = SpaceMap::new(4 * 65536, 65536);
        let mut seen = std::collections::HashSet::new();
        for round in 0..50 {
            let segs: Vec<u32> = (0..1 + round % 4).map(|_| m.open_segment(true).unwrap()).collect();
            for &s in &segs {
                assert!(seen.insert(m.gen(s)), "generation {} given twice", m.gen(s));
                m.seal(s);
            }
        }
    }

    #[test]
    fn a_takeover_keeps_what_slots_name_and_never_reuses_a_generation() {
        let gens = || GenTable::Own((0..5).map(|_| AtomicU64::new(0)).collect());
        let dead = SpaceMap::with_gens(4 * 65536, 65536, gens());
        let (a, b) = (dead.open_segment(true).unwrap(), dead.open_segment(true).unwrap());
        dead.seal(a);
        // The successor gets the dead map's generations, nothing else.
        let words: Box<[AtomicU64]> = dead.gens.iter().map(|g| AtomicU64::new(g.load(Relaxed))).collect();
        let m = SpaceMap::taking_over(4 * 65536, 65536, GenTable::Own(words));
        assert!(m.claim(65536 + 100, 200), "in segment b, which was open");
        assert!(!m.claim(65536 - 10, 20), "straddles two segments");
        assert!(!m.claim(2 * 65536, 20), "in a segment never opened");
        assert!(!m.claim(4 * 65536, 20), "past the device");
        assert_eq!(m.taken_over(), 1);
        assert_eq!(m.live_bytes(b), 200);
        assert!(m.gc_candidates(100).iter().any(|&(s, _)| s == b), "the dead process's open segment is sealed");
        let fresh = m.open_segment(true).unwrap();
        assert_eq!(fresh, a, "a segment no slot names is free again");
        assert!(m.gen(fresh) > dead.gen(b), "with a generation after every one the dead process gave");
        m.free(65536 + 100, 200);
        assert_eq!(m.segments_in_use(), 1, "b freed once its last record goes");
    }

    #[test]
    fn gc_candidates_are_sealed_sparse_segments_emptiest_first() {
        let m = SpaceMap::new(4 * 65536, 65536);
        for live in [60_000u64, 1000, 30_000, 500] {
            let s = m.open_segment(true).unwrap();
            m.add_live(s, live);
            m.seal(s);
            if live != 500 {
                m.written(s as u64 * 65536);
            }
        }
        assert!(m.open_segment(false).is_none(), "no free segment");
        assert_eq!(m.gc_candidates(50), vec![(1, 1000), (2, 30_000)], "not the one still being written");
    }
}
