//! Eviction: S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//! SOSP'23), sharded.
//!
//! # Why S3-FIFO
//! The cache sits under a page cache: a page reaches it again only after the page cache
//! dropped it, so one re-read is a strong signal, and a single large sequential read (a
//! backup, a `cp`, a scan) must not flush the hot set. S3-FIFO gives that with FIFO queues
//! only: new pages enter a small FIFO (about 10% of the cached pages); a page that leaves it
//! without having been read again is dropped (its index kept in a ghost FIFO), so a scan
//! passes through the small queue and leaves the main queue alone; a page read again while
//! in the small queue, or inserted while its index is a ghost, goes to the main FIFO, which
//! evicts CLOCK-style (a page read since it was last looked at goes round again). A hit is
//! a frequency bump in the slot's meta word, under the slot lock the read takes anyway: no
//! queue lock on the hit path (LRU lists need one). FIFO order also suits the allocator:
//! pages inserted together share zspages, and evicting them together empties those zspages.
//!
//! # Sharding
//! Slot `i` belongs to shard `i % SHARDS`; each shard has its own three queues under its own
//! mutex, so there is no global lock. An insert pushes to its page's shard; eviction takes
//! shards round-robin (a global cursor), one victim at a time.
//!
//! # State
//! The queues hold slot indices (4 bytes each). Per-page state is in the slot meta word's
//! policy bits (`slot.rs`, rule 9), changed only under the slot lock:
//! - FREQ (0..=3): reads since the page entered its queue or was last passed over;
//! - READAHEAD: inserted by readahead and not read since (for `readahead_used`/`_wasted`);
//!   the first hit on such a page clears it without a frequency bump (it is the reader's
//!   first access, which readahead anticipated);
//! - GHOST: the slot is empty and its index is in the ghost FIFO (it was evicted from the
//!   small queue recently); an insert then goes straight to the main queue;
//! - QUEUED: the index is in the small or main FIFO. Set by the insert that pushes it and
//!   cleared only by the eviction scan that pops it, so each index is in those queues at most
//!   once. A page dropped by a write error or discard keeps its (now stale) queue place; the
//!   scan skips an empty slot, and a page cached again meanwhile takes the old place.
//!
//! Same-filled pages cost no pool memory: they are never queued, and a scan that meets one
//! (a queued page rewritten with a fill) leaves it cached and unqueued.
//!
//! # Lock order
//! stripe -> shard -> slot -> pool class -> arena. A slot lock is never held while a shard
//! lock is taken (inserts push after releasing the slot); the scan takes one slot lock at a
//! time under its shard lock.
//!
//! The ghost FIFO is bounded by the shard's cached pages (the paper sizes it as the main
//! queue); an index evicted twice may sit in it twice, and the older entry then clears the
//! GHOST bit early (a ghost hit missed, never a wrong page).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::journal::Journal;
use crate::ram::mover::Mover;
use crate::slot::{Entry, Slot, SlotGuard};
use crate::stats::Counters;

/// Shards of the policy (a power of two, so that `index % SHARDS` is cheap).
pub(crate) const SHARDS: usize = 16;
/// The small FIFO's share of a shard's queued pages, in percent (the paper's 10%).
const SMALL_PCT: usize = 10;
/// The ghost FIFO's smallest bound, in indices.
const MIN_GHOST: usize = 64;

pub(crate) const FREQ: u8 = 0b0_0011;
pub(crate) const READAHEAD: u8 = 0b0_0100;
pub(crate) const GHOST: u8 = 0b0_1000;
pub(crate) const QUEUED: u8 = 0b1_0000;

/// Which FIFO a page enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    Small,
    Main,
}

#[derive(Default)]
struct Shard {
    small: VecDeque<u32>,
    main: VecDeque<u32>,
    ghost: VecDeque<u32>,
}

pub(crate) struct Policy {
    shards: Box<[Mutex<Shard>]>,
    /// The next shard eviction looks at.
    cursor: AtomicUsize,
}

/// A read hit: the frequency bump. True if the page was read ahead and this is its first hit:
/// that hit is the reader's first access (readahead only guessed it), so it clears READAHEAD
/// and bumps nothing; otherwise a sequential scan read ahead would look re-used and move to
/// the main queue.
pub(crate) fn on_hit(g: &mut SlotGuard<'_>) -> bool {
    let p = g.policy();
    if p & READAHEAD != 0 {
        g.set_policy(p & !READAHEAD);
        return true;
    }
    g.set_policy((p & !FREQ) | (p & FREQ).saturating_add(1).min(FREQ));
    false
}

/// Under slot `g`'s lock, after `new` replaced `old` (an insert or an update): sets the page's
/// policy bits and says which queue to push the index to (after releasing the slot lock), if
/// any. Returns (queue, whether a READAHEAD page was overwritten before any read hit it).
pub(crate) fn on_install(g: &mut SlotGuard<'_>, old: Entry, new: Entry, readahead: bool) -> (Option<Queue>, bool) {
    let p = g.policy();
    let wasted = p & READAHEAD != 0 && old != Entry::Empty;
    let mut bits = p & !(READAHEAD | GHOST);
    if old == Entry::Empty {
        bits &= !FREQ;
    }
    if readahead {
        bits |= READAHEAD;
    }
    let pooled = matches!(new, Entry::Compressed { .. } | Entry::Huge { .. });
    let queue = if pooled && p & QUEUED == 0 {
        bits |= QUEUED;
        Some(if p & GHOST != 0 { Queue::Main } else { Queue::Small })
    } else {
        None
    };
    g.set_policy(bits);
    (queue, wasted)
}

/// Under slot `g`'s lock, after its page was dropped (write error, discard): whether it was
/// a READAHEAD page no read hit. The QUEUED bit stays (its queue place is now stale).
pub(crate) fn on_drop(g: &mut SlotGuard<'_>) -> bool {
    let p = g.policy();
    g.set_policy(p & !(READAHEAD | FREQ | GHOST));
    p & READAHEAD != 0
}

impl Policy {
    pub fn new() -> Policy {
        Policy { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(), cursor: AtomicUsize::new(0) }
    }

    /// Appends slot `index` to `queue` of its shard (its QUEUED bit was set by `on_install`).
    pub fn push(&self, index: u64, queue: Queue) {
        let mut sh = self.shards[index as usize % SHARDS].lock();
        match queue {
            Queue::Small => sh.small.push_back(index as u32),
            Queue::Main => sh.main.push_back(index as u32),
        }
    }

    /// Evicts up to `want` pages, taking shards round-robin; returns how many it evicted (0:
    /// nothing is left to evict).
    pub fn evict(&self, slots: &[Slot], mv: &Mover<'_>, want: usize) -> usize {
        let mut evicted = 0;
        let mut idle = 0;
        while evicted < want && idle < SHARDS {
            let s = self.cursor.fetch_add(1, Relaxed) % SHARDS;
            let mut sh = self.shards[s].lock();
            if sh.evict_one(slots, mv) {
                evicted += 1;
                idle = 0;
            } else {
                idle += 1;
            }
        }
        evicted
    }
}

/// What the scan found at a popped index.
enum Seen {
    /// Nothing to evict there (empty, same-filled): the index leaves the queue.
    Gone,
    /// Read since it was queued: it moves on (small -> main, or round main again).
    Keep,
    /// Evicted; the entry to free.
    Evicted(Entry),
}

impl Shard {
    /// Evicts one page of this shard, S3-FIFO's way. False if the shard holds none.
    fn evict_one(&mut self, slots: &[Slot], mv: &Mover<'_>) -> bool {
        // Each index is looked at a bounded number of times (a main page goes round at most
        // FREQ times before its frequency is spent).
        let mut budget = (self.small.len() + self.main.len()) * (FREQ as usize + 2) + 1;
        while budget > 0 {
            budget -= 1;
            let total = self.small.len() + self.main.len();
            let from_small = !self.small.is_empty() && (self.main.is_empty() || self.small.len() * 100 > total * SMALL_PCT);
            let index = match from_small {
                true => self.small.pop_front(),
                false => self.main.pop_front(),
            };
            let Some(index) = index else { return false };
            match visit(&slots[index as usize], mv.journal(), index as u64, from_small, mv.counters()) {
                Seen::Gone => {}
                Seen::Keep => self.main.push_back(index),
                Seen::Evicted(old) => {
                    mv.release(old);
                    if from_small {
                        self.ghost.push_back(index);
                        self.trim_ghost(slots);
                    }
                    return true;
                }
            }
        }
        false
    }

    fn trim_ghost(&mut self, slots: &[Slot]) {
        let bound = (self.small.len() + self.main.len()).max(MIN_GHOST);
        while self.ghost.len() > bound {
            let Some(index) = self.ghost.pop_front() else { break };
            let mut g = slots[index as usize].lock();
            if g.entry() == Entry::Empty {
                let p = g.policy();
                g.set_policy(p & !GHOST);
            }
        }
    }
}

/// Under the slot's lock: what to do with a page the scan popped from the small queue
/// (`from_small`) or the main queue.
fn visit<'a>(slot: &'a Slot, journal: &'a Journal, index: u64, from_small: bool, c: &Counters) -> Seen {
    let mut g = slot.lock();
    let p = g.policy();
    let entry = g.entry();
    if !matches!(entry, Entry::Compressed { .. } | Entry::Huge { .. }) {
        g.set_policy(p & !QUEUED);
        return Seen::Gone;
    }
    let freq = p & FREQ;
    if freq > 0 {
        // small -> main starts over in main; in main, a lap costs one read's credit.
        let freq = if from_small { 0 } else { freq - 1 };
        g.set_policy((p & !FREQ) | freq);
        return Seen::Keep;
    }
    g.replace(journal, index, Entry::Empty);
    g.set_policy(if from_small { GHOST } else { 0 });
    Counters::inc(&c.cache_evictions);
    if p & READAHEAD != 0 {
        Counters::inc(&c.readahead_wasted);
    }
    Seen::Evicted(entry)
}
