//! Writeback policy: which pages leave RAM, when, and how many bytes at a time; and which
//! come back (promotion).
//!
//! - When: pool memory (`mem_used_total`) above `high_pct` of `mem_limit` starts writeback;
//!   it continues, call after call, until memory is under `low_pct` (hysteresis, so that the
//!   writer works in bursts of large batches rather than a page at a time at the limit).
//! - Which: the coldest. Each slot keeps 16 bits of access time (`Store::tick`, 1 s ticks,
//!   inside the 16-byte slot), set on every read and write. A pass over the slot table (meta
//!   words read as hints, slot.rs rule 5) builds a histogram of stored bytes by age (1 s
//!   buckets up to a minute, then powers of two); the youngest age that must go for the wanted
//!   bytes is the cut-off, and a second pass, starting where the previous call stopped, writes
//!   back pages at least that old. Ages are modulo 2^16 s (18 h): a page untouched for longer
//!   may look young, which only delays it.
//! - How much: the wanted bytes are capped by the caller's budget (bytes per call; `maintain`
//!   turns `writeback_rate_bytes` into one) and by what is left of `writeback_limit_bytes`.
//! - How: pages are copied (still compressed) into a batch under their slot lock, one at a
//!   time; the batch is placed and written with one `pwrite` per contiguous run (256 KiB
//!   batches); then each slot is switched to its new location if it still holds what was
//!   copied (otherwise the copy is dead space for GC). Compaction then gives the emptied
//!   zspages back.
//! - Promotion: a page read from the device within `PROMOTE_WITHIN_SECS` of its previous
//!   access is put back into RAM, if that keeps memory under the low watermark.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::gc::GcReport;
use super::log::{BatchError, HEADER};
use super::space::GC_RESERVE_SEGMENTS;
use super::{Backing, Maint};
use crate::error::StoreError;
use crate::slot::{Entry, Kind};
use crate::stats::Counters;
use crate::store::Store;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// A page read again within this many ticks (seconds) of its last access is promoted.
const PROMOTE_WITHIN_SECS: u16 = 4;
/// Age buckets: 0..64 s one per second, then one per power of two up to 2^16 s.
const AGE_BUCKETS: usize = 64 + 10;

/// How much one writeback call may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritebackBudget {
    /// Most payload bytes to write in this call.
    pub max_bytes: u64,
}

impl WritebackBudget {
    pub const UNLIMITED: WritebackBudget = WritebackBudget { max_bytes: u64::MAX };
}

/// What a writeback call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WritebackReport {
    /// Pages moved to the backing device.
    pub pages: u64,
    /// Their payload bytes (compressed sizes).
    pub bytes: u64,
    /// `pwrite` calls it took.
    pub writes: u64,
    /// Pages rewritten or discarded while being written back (their copies are dead space).
    pub raced: u64,
    /// Pool pages given back by the compaction that follows.
    pub pool_pages_freed: u64,
    /// The backing device had no room for everything.
    pub device_full: bool,
    /// A write failed: the pages of that batch stay in RAM.
    pub error: Option<StoreError>,
}

/// What [`Store::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub writeback: WritebackReport,
    pub gc: GcReport,
}

/// What a batch is for: its pages are counted differently.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    Writeback,
    Gc,
}

/// What writing one batch did.
#[derive(Default)]
pub(super) struct Flushed {
    pub installed: u64,
    pub bytes: u64,
    pub writes: u64,
    pub raced: u64,
    pub full: bool,
    pub error: Option<StoreError>,
}

fn age_bucket(age: u16) -> usize {
    if age < 64 {
        age as usize
    } else {
        64 + (15 - age.leading_zeros() as usize) - 6
    }
}

impl Store {
    /// Moves the coldest pages to the backing device when pool memory is above the high
    /// watermark, until it is under the low one, writing at most `budget` bytes. Call it
    /// periodically from a background thread (or use [`Store::maintain`]); it takes no lock
    /// a request waits on for longer than one page copy. Without a backing device or a memory
    /// limit it does nothing.
    pub fn writeback(&self, budget: WritebackBudget) -> WritebackReport {
        let Some(b) = &self.backing else { return WritebackReport::default() };
        let mut m = b.maint.lock();
        let limit = self.mem_limit_bytes.load(Relaxed);
        if limit == 0 {
            return WritebackReport::default();
        }
        let used = self.pool.total_pages() * PAGE;
        let (high, low) = (limit * b.cfg.high_pct as u64 / 100, limit * b.cfg.low_pct as u64 / 100);
        if used > high {
            m.draining = true;
        }
        if !m.draining || used <= low {
            m.draining = false;
            return WritebackReport::default();
        }
        let want = (used - low).min(budget.max_bytes).min(self.writeback_allowance(b));
        let report = self.write_back_coldest(b, &mut m, want, 0);
        if self.pool.total_pages() * PAGE <= low {
            m.draining = false;
        }
        report
    }

    /// Writes back pages not accessed for at least `min_age_secs`, whatever the watermarks
    /// (zram's idle writeback), coldest first, at most `budget` bytes.
    pub fn writeback_idle(&self, min_age_secs: u64, budget: WritebackBudget) -> WritebackReport {
        let Some(b) = &self.backing else { return WritebackReport::default() };
        let mut m = b.maint.lock();
        let want = budget.max_bytes.min(self.writeback_allowance(b));
        self.write_back_coldest(b, &mut m, want, min_age_secs.min(u16::MAX as u64) as u16)
    }

    /// One step of background work for a front end's maintenance thread, called every
    /// `elapsed`: writeback within the configured rate, then GC with what is left of it.
    pub fn maintain(&self, elapsed: Duration) -> MaintenanceReport {
        let Some(b) = &self.backing else { return MaintenanceReport::default() };
        let rate = b.cfg.writeback_rate_bytes;
        let budget = if rate == 0 { u64::MAX } else { (rate as f64 * elapsed.as_secs_f64().min(1.0)) as u64 };
        let writeback = self.writeback(WritebackBudget { max_bytes: budget });
        let gc = self.gc(budget.saturating_sub(writeback.bytes));
        MaintenanceReport { writeback, gc }
    }

    fn writeback_allowance(&self, b: &Backing) -> u64 {
        match b.cfg.writeback_limit_bytes {
            0 => u64::MAX,
            limit => limit.saturating_sub(b.ctr.writeback_bytes.load(Relaxed)),
        }
    }

    /// Writes back about `want` bytes of the coldest RAM pages at least `min_age` ticks old.
    fn write_back_coldest(&self, b: &Backing, m: &mut Maint, want: u64, min_age: u16) -> WritebackReport {
        let mut rep = WritebackReport::default();
        if want == 0 || self.num_pages() == 0 {
            return rep;
        }
        // A full device: do not gather a batch only to find no place for it (GC, which may
        // use the reserved segments, makes room first).
        if b.space.free_segments() <= GC_RESERVE_SEGMENTS && m.head.room(&b.space) < (HEADER + PAGE_SIZE) as u64 {
            rep.device_full = true;
            return rep;
        }
        let now = self.tick();
        let in_ram = |k: Kind| matches!(k, Kind::Compressed | Kind::Huge);
        let mut hist = [0u64; AGE_BUCKETS];
        for slot in self.slots.iter() {
            let h = slot.peek();
            let age = now.wrapping_sub(h.ac_time);
            if in_ram(h.kind) && age >= min_age {
                hist[age_bucket(age)] += h.size as u64;
            }
        }
        let mut cut = AGE_BUCKETS;
        let mut acc = 0;
        while cut > 0 && acc < want {
            cut -= 1;
            acc += hist[cut];
        }
        if acc == 0 {
            return rep;
        }

        let n = self.num_pages();
        let mut i = m.cursor % n;
        let mut gathered = 0u64;
        for _ in 0..n {
            if gathered >= want {
                break;
            }
            let index = i;
            i = (i + 1) % n;
            let slot = &self.slots[index as usize];
            let h = slot.peek();
            let age = now.wrapping_sub(h.ac_time);
            if !in_ram(h.kind) || age < min_age || age_bucket(age) < cut {
                continue;
            }
            let mut g = slot.lock();
            let age = now.wrapping_sub(g.ac_time());
            if age < min_age || age_bucket(age) < cut {
                continue;
            }
            let old = g.entry();
            let len = match old {
                Entry::Compressed { len, .. } => len as usize,
                Entry::Huge { .. } => PAGE_SIZE,
                _ => continue,
            };
            let copied = self.copy_stored(&g, m.batch.push(index, old, len, false));
            g.mark_moving();
            drop(g);
            debug_assert_eq!(copied, Some(len));
            gathered += len as u64;
            // Written as soon as it is full, so the next page's copy (under its slot lock) never
            // grows it.
            if m.batch.is_full() && !self.write_back_batch(b, m, &mut rep) {
                break;
            }
        }
        m.cursor = i;
        if !m.batch.is_empty() {
            self.write_back_batch(b, m, &mut rep);
        }
        if rep.pages > 0 {
            rep.pool_pages_freed = self.compact();
        }
        rep
    }

    /// Writes the batch and adds it to `rep`; false when writeback should stop.
    fn write_back_batch(&self, b: &Backing, m: &mut Maint, rep: &mut WritebackReport) -> bool {
        let f = self.flush_batch(b, m, Purpose::Writeback);
        rep.pages += f.installed;
        rep.bytes += f.bytes;
        rep.writes += f.writes;
        rep.raced += f.raced;
        rep.device_full |= f.full;
        let stop = f.full || f.error.is_some();
        if f.error.is_some() {
            rep.error = f.error;
        }
        !stop
    }

    /// Places and writes `m.batch`, then switches every slot that still holds what was copied
    /// to its new location. Shared by writeback and GC.
    pub(super) fn flush_batch(&self, b: &Backing, m: &mut Maint, purpose: Purpose) -> Flushed {
        let mut f = Flushed::default();
        let Maint { head, batch, .. } = m;
        let first = batch.items.first().map_or(u64::MAX, |it| it.index);
        let pages = batch.items.len();
        let written = if b.is_closed() {
            Err(BatchError(std::io::Error::other("the device is closed")))
        } else {
            batch.write(head, &b.space, &*b.dev, &b.run, purpose == Purpose::Gc)
        };
        match written {
            Ok((full, writes)) => {
                f.full = full;
                f.writes = writes;
                // Writeback marked its pages; GC's sources are pinned (slot.rs rule 8).
                let marked = purpose == Purpose::Writeback;
                for it in &batch.items {
                    if self.install(it.index, it.old, Entry::Backing { loc: it.loc, len: it.len }, marked) {
                        f.installed += 1;
                        f.bytes += it.len as u64;
                    } else {
                        b.free(it.loc, it.len);
                        f.raced += 1;
                    }
                }
            }
            Err(BatchError(e)) => {
                let what = if purpose == Purpose::Gc { "GC" } else { "writeback" };
                let reason = format!("{what} of {pages} pages failed: {e}; they stay where they were");
                f.error = Some(b.error(first, reason));
            }
        }
        batch.clear();
        let c = &b.ctr;
        match purpose {
            Purpose::Writeback => {
                Counters::add(&self.counters.bd_writes, f.installed + f.raced);
                Counters::add(&c.writeback_pages, f.installed);
                Counters::add(&c.writeback_bytes, f.bytes);
            }
            Purpose::Gc => Counters::add(&c.gc_pages, f.installed),
        }
        f
    }

    /// Puts a page just read from the backing device back into RAM if it was read again soon
    /// and there is room under the low watermark. `entry` is the slot's entry when it was
    /// read, `payload` its record's payload; the caller pins its segment (slot.rs rule 8).
    pub(crate) fn maybe_promote(&self, index: u64, entry: Entry, last_access: u16, payload: &[u8]) {
        let Some(b) = &self.backing else { return };
        let Entry::Backing { len, .. } = entry else { return };
        if !b.cfg.promote || self.tick().wrapping_sub(last_access) > PROMOTE_WITHIN_SECS {
            return;
        }
        if b.cfg.incompressible && len as usize == PAGE_SIZE {
            return; // the user wants incompressible pages on the device
        }
        let limit = self.mem_limit_bytes.load(Relaxed);
        let room = limit * b.cfg.low_pct as u64 / 100;
        if limit != 0 && self.pool.total_pages() * PAGE + len as u64 > room {
            return;
        }
        let Ok(h) = self.pool.alloc(payload, index as u32) else { return };
        let new = if len as usize == PAGE_SIZE { Entry::Huge { handle: h.0 } } else { Entry::Compressed { handle: h.0, len } };
        if self.install(index, entry, new, false) {
            Counters::inc(&b.ctr.promoted_pages);
        } else {
            self.free_uninstalled(h.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_buckets_are_ordered_and_bounded() {
        let mut last = 0;
        for age in 0..=u16::MAX {
            let b = age_bucket(age);
            assert!(b >= last && b < AGE_BUCKETS, "age {age}");
            last = b;
        }
        assert_eq!((age_bucket(63), age_bucket(64), age_bucket(127), age_bucket(128)), (63, 64, 64, 65));
    }
}
