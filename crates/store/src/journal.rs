//! The recovery journal: what makes a slot's entry change atomic for a process that can die at
//! any instruction.
//!
//! A slot's entry is two words (`slot.rs`), changed under the slot lock: `data` when the entry
//! is replaced, `meta` when the lock is released. A process killed between the two stores
//! leaves a locked slot whose `meta` is the old entry's and whose `data` may be the new one's:
//! a torn entry. So before the first `data` store under a lock, the writer records the slot's
//! old words in a journal record, and it clears the record only after the new `meta` is in
//! place (still locked), just before it unlocks:
//!
//! ```text
//! lock (meta |= LOCK)                       -- crash: slot locked, no record: old entry intact
//! record = { old meta, old data }, then its slot index (the record is valid from here)
//! data = new                                -- crash: locked + record: restore the old words
//! meta = new | LOCK                         -- crash: locked + record: restore the old words
//! record cleared                            -- crash: locked, no record: the new entry, whole
//! meta = new (unlocked)
//! ```
//!
//! Recovery (`ram/recover.rs`) restores the old words of every locked slot a valid record names
//! and unlocks every slot. The old entry's object is still allocated then: the RAM layer frees
//! an entry taken out of a slot only after the slot is unlocked (`ram/mover.rs`). The new
//! object, named by no slot, is freed by recovery's scan.
//!
//! Records live in the state file (`shm.rs`), one cache line each; a writer takes a free one
//! with a compare-and-swap, starting at a place of its own (so writers on different threads
//! normally never share a line), for the time it holds one slot lock. Since a thread holds at
//! most one slot lock (slot.rs rule 3), at most one record per thread is taken.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use crate::zeroed::{Zeroable, ZeroedSlice};

/// Records in a journal: more than the threads that hold slot locks at once.
pub(crate) const RECORDS: usize = 1024;

/// `slot` of a record taken but not yet filled.
const FILLING: u64 = u64::MAX;

/// One record: the old words of a slot whose entry is being changed.
#[repr(C, align(64))]
pub(crate) struct Record {
    /// 0: free; `FILLING`: taken, not valid yet; else the slot's index + 1 (valid).
    slot: AtomicU64,
    old_meta: AtomicU64,
    old_data: AtomicU64,
}

// SAFETY: three AtomicU64 and padding; every bit pattern of them is valid (a record read from a
// dead process's state file is checked before it is used).
unsafe impl Zeroable for Record {}

pub(crate) const RECORD_BYTES: usize = std::mem::size_of::<Record>();
const _: () = assert!(RECORD_BYTES == 64);

/// The journal of one device: `RECORDS` records in its state file.
pub(crate) struct Journal {
    records: ZeroedSlice<Record>,
}

/// A record a writer holds ([`Journal::begin`]); given back with [`Journal::end`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held(usize);

thread_local! {
    /// Where this thread starts looking for a free record.
    static START: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The next thread's starting place.
static NEXT_START: AtomicU32 = AtomicU32::new(0);

impl Journal {
    pub fn new(records: ZeroedSlice<Record>) -> Journal {
        assert_eq!(records.len(), RECORDS);
        Journal { records }
    }

    /// Takes a record and fills it with slot `index`'s old words; from its return on, the
    /// record is valid. The caller then changes the slot and calls [`Journal::end`] after
    /// storing the new `meta` (still locked) and before unlocking.
    pub fn begin(&self, index: u64, old_meta: u64, old_data: u64) -> Held {
        let start = START.with(|s| match s.get() {
            Some(i) => i,
            None => NEXT_START.fetch_add(1, Relaxed) as usize * 7 % RECORDS,
        });
        let mut i = start;
        loop {
            let r = &self.records[i];
            if r.slot.load(Relaxed) == 0 && r.slot.compare_exchange(0, FILLING, Acquire, Relaxed).is_ok() {
                r.old_meta.store(old_meta, Relaxed);
                r.old_data.store(old_data, Relaxed);
                // Release: the old words are in place before the record says whose they are
                // (for the compiler; a dead process's stores all reach memory).
                r.slot.store(index + 1, Release);
                START.with(|s| s.set(Some(i)));
                return Held(i);
            }
            i = (i + 1) % RECORDS;
            if i == start {
                std::thread::yield_now(); // more writers than records: wait for one
            }
        }
    }

    /// Gives a record back: the slot's new entry is whole (`meta` stored, still locked).
    pub fn end(&self, held: Held) {
        self.records[held.0].slot.store(0, Release);
    }

    /// The valid records: (slot index, old meta, old data). For recovery, in a state no live
    /// process uses.
    pub fn pending(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.records.iter().filter_map(|r| match r.slot.load(Acquire) {
            0 | FILLING => None,
            s => Some((s - 1, r.old_meta.load(Relaxed), r.old_data.load(Relaxed))),
        })
    }

    /// Frees every record (recovery, once it has applied them).
    pub fn clear(&self) {
        for r in self.records.iter() {
            r.slot.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_pending_from_begin_to_end() {
        let j = Journal::new(ZeroedSlice::new(RECORDS).unwrap());
        let a = j.begin(41, 1, 2);
        let b = j.begin(7, 3, 4);
        let mut p: Vec<_> = j.pending().collect();
        p.sort();
        assert_eq!(p, vec![(7, 3, 4), (41, 1, 2)]);
        j.end(a);
        assert_eq!(j.pending().collect::<Vec<_>>(), vec![(7, 3, 4)]);
        j.end(b);
        assert_eq!(j.pending().count(), 0);
    }

    #[test]
    fn records_taken_but_not_filled_are_not_pending() {
        let j = Journal::new(ZeroedSlice::new(RECORDS).unwrap());
        j.records[5].slot.store(FILLING, Relaxed);
        assert_eq!(j.pending().count(), 0);
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let j = &j;
                move || {
                    for i in 0..1000 {
                        let h = j.begin(t * 1000 + i, i, t);
                        j.end(h);
                    }
                }
            })
            .collect();
        std::thread::scope(|s| {
            for t in threads {
                s.spawn(t);
            }
        });
        assert_eq!(j.pending().count(), 0);
    }
}
