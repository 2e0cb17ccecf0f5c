//! Writeback policy: which pages leave RAM, when, and how many bytes at a time; and which
//! come back (promotion).
//!
//! - When: pool memory (`mem_used_total`) above `high_pct` of `mem_limit` starts writeback;
//!   it continues, call after call, until memory is under `low_pct` (hysteresis, so that the
//!   writer works in bursts of large batches rather than a page at a time at the limit).
//! - Which: the coldest. Each slot keeps 16 bits of access time (`mover::Clock`, 1 s ticks,
//!   inside the 16-byte slot), set on every read and write. A pass over the slot table (meta
//!   words read as hints, slot.rs rule 5) builds a histogram of stored bytes by age (1 s
//!   buckets up to a minute, then powers of two); the youngest age that must go for the wanted
//!   bytes is the cut-off, and a second pass, starting where the previous call stopped, writes
//!   back pages at least that old. Ages are modulo 2^16 s (18 h): a page untouched for longer
//!   may look young, which only delays it.
//! - How much: the wanted bytes are capped by the caller's budget (bytes per call; `maintain`
//!   turns the rate into one) and by what is left of the writeback limit. Watermarks, rate and
//!   limit start as configured and can be changed while the device runs (`tuning.rs`).
//! - How: pages are copied (still compressed) into a batch under their slot lock, one at a
//!   time (for the cold tier they are then decoded into the batch as raw pages, `RawPages`);
//!   the batch is placed and written with one `pwrite` per contiguous run (256 KiB
//!   batches); then each slot is switched to its new location if it still holds what was
//!   copied (otherwise the copy is dead space for GC). Compaction then gives the emptied
//!   zspages back.
//! - Promotion: a page read from the device within `PROMOTE_WITHIN_SECS` of its previous
//!   access is put back into RAM, if that keeps memory under the low watermark.

use std::sync::atomic::Ordering::Relaxed;

use super::batch::{flush_batch, Purpose};
use super::log::HEADER;
use super::read::Pending;
use super::space::GC_RESERVE_SEGMENTS;
use super::{Backing, Maint};
use crate::error::StoreError;
use crate::ram::mover::{Mover, Unchanged};
use crate::slot::{Entry, Kind, Mark};
use crate::PAGE_SIZE;

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

impl WritebackReport {
    /// Adds a later call's figures to this one's.
    pub fn add(&mut self, o: WritebackReport) {
        self.pages += o.pages;
        self.bytes += o.bytes;
        self.writes += o.writes;
        self.raced += o.raced;
        self.pool_pages_freed += o.pool_pages_freed;
        self.device_full |= o.device_full;
        if self.error.is_none() {
            self.error = o.error;
        }
    }
}

/// The cold tier's writeback decodes each page before it goes into the batch, so that the
/// device (`memdev.rs`) compresses whole pages together. Made by the store with its own codec
/// (`Store::build`); lives in `Maint`, so only the holder of the maintenance mutex uses it.
pub(crate) struct RawPages {
    pub comp: Box<dyn crate::compress::BackendContext>,
    pub strong: Option<crate::compress::strong::StrongDecoder>,
    /// The payload copied out under the slot lock, then the decoded page.
    pub cbuf: Box<[u8]>,
    pub page: Box<[u8]>,
}

impl RawPages {
    /// Decodes the payload copied into `cbuf` (`len` bytes of `entry`, with `dict` if its
    /// codec names one) into `page`.
    fn decode(&mut self, entry: Entry, len: usize, dict: Option<&crate::compress::dict::Dict>) -> Result<(), String> {
        match entry {
            Entry::Huge { .. } => {
                self.page.copy_from_slice(&self.cbuf[..PAGE_SIZE]);
                Ok(())
            }
            e => crate::compress::decode(&mut *self.comp, self.strong.as_mut(), e.codec(), dict, &self.cbuf[..len], &mut self.page),
        }
    }
}

fn age_bucket(age: u16) -> usize {
    if age < 64 {
        age as usize
    } else {
        64 + (15 - age.leading_zeros() as usize) - 6
    }
}

/// `Store::writeback`: the watermarks decide whether to write back and how much.
pub(crate) fn writeback(mv: &Mover<'_>, b: &Backing, budget: WritebackBudget) -> WritebackReport {
    let mut m = b.maint.lock();
    let Some((high, low)) = watermark_bytes(b, mv.mem_limit_bytes()) else {
        return WritebackReport::default();
    };
    let used = mv.pool_bytes();
    if used > high {
        m.draining = true;
    }
    if !m.draining || used <= low {
        m.draining = false;
        return WritebackReport::default();
    }
    let want = (used - low).min(budget.max_bytes).min(writeback_allowance(b, &m));
    let report = write_back_coldest(mv, b, &mut m, want, 0);
    if mv.pool_bytes() <= low {
        m.draining = false;
    }
    report
}

/// The watermarks in pool bytes for the memory limit `limit`: above the high one writeback
/// starts, and it drains to the low one; `None` without a limit (no writeback by watermark).
pub(crate) fn watermark_bytes(b: &Backing, limit: u64) -> Option<(u64, u64)> {
    let (high_pct, low_pct) = b.tune.watermarks();
    (limit > 0).then(|| (limit * high_pct as u64 / 100, limit * low_pct as u64 / 100))
}

/// `Store::writeback_idle`: pages idle for `min_age_secs`, whatever the watermarks.
pub(crate) fn writeback_idle(mv: &Mover<'_>, b: &Backing, min_age_secs: u64, budget: WritebackBudget) -> WritebackReport {
    let mut m = b.maint.lock();
    let want = budget.max_bytes.min(writeback_allowance(b, &m));
    write_back_coldest(mv, b, &mut m, want, min_age_secs.min(u16::MAX as u64) as u16)
}

/// What is left of the writeback limit (`m` is `b.maint`, held).
fn writeback_allowance(b: &Backing, m: &Maint) -> u64 {
    m.limit.left(b.ctr.writeback_bytes.load(Relaxed))
}

/// Writes back about `want` bytes of the coldest RAM pages at least `min_age` ticks old.
fn write_back_coldest(mv: &Mover<'_>, b: &Backing, m: &mut Maint, want: u64, min_age: u16) -> WritebackReport {
    let mut rep = WritebackReport::default();
    if want == 0 || mv.num_slots() == 0 {
        return rep;
    }
    // A full device: do not gather a batch only to find no place for it (GC, which may
    // use the reserved segments, makes room first).
    if b.space.free_segments() <= GC_RESERVE_SEGMENTS && m.head.room(&b.space) < (HEADER + PAGE_SIZE) as u64 {
        rep.device_full = true;
        return rep;
    }
    let now = mv.now();
    let in_ram = |k: Kind| matches!(k, Kind::Compressed | Kind::Huge);
    let mut hist = [0u64; AGE_BUCKETS];
    for (_, h) in mv.hints_from(0) {
        let age = mv.age(now, h.ac_time);
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

    let mut gathered = 0u64;
    for (index, h) in mv.hints_from(m.cursor) {
        if gathered >= want {
            break;
        }
        m.cursor = (index + 1) % mv.num_slots();
        let age = mv.age(now, h.ac_time);
        if !in_ram(h.kind) || age < min_age || age_bucket(age) < cut {
            continue;
        }
        // Decided again under the slot lock, where the page is copied and marked.
        let Maint { batch, raw, .. } = &mut *m;
        let mut dict = None;
        let taken = mv.copy_out(index, Some(Mark::Writeback), |seen| {
            let age = mv.age(now, seen.ac_time);
            let old_enough = age >= min_age && age_bucket(age) >= cut;
            match raw {
                _ if !old_enough => None,
                None => Some(batch.push(index, seen.entry, seen.stored_bytes, false)),
                Some(r) => {
                    // The dictionary is taken under the slot lock, as a reader takes it: a
                    // version a slot names is not freed (compress/dict.rs).
                    dict = seen.entry.codec().dict().and_then(|place| mv.dict(place));
                    Some(&mut r.cbuf[..seen.stored_bytes])
                }
            }
        });
        let Some(old) = taken else { continue };
        // The pool bytes the page holds (what it frees once written back).
        let stored = match old {
            Entry::Compressed { len, .. } => len as usize,
            _ => PAGE_SIZE,
        };
        if let Some(r) = raw {
            if let Err(reason) = r.decode(old, stored, dict.as_deref()) {
                // Left where it is: its reader gets the error, the cold tier no wrong page.
                let _ = b.error(index, format!("page not written back: it does not decode ({reason})"));
                continue;
            }
            batch.push(index, old, PAGE_SIZE, false).copy_from_slice(&r.page);
        }
        // Counted as the pool bytes it frees (the cold tier's records are raw pages).
        gathered += stored as u64;
        // Written as soon as it is full, so the next page's copy (under its slot lock) never
        // grows it.
        if m.batch.is_full() && !write_back_batch(mv, b, m, &mut rep) {
            break;
        }
    }
    if !m.batch.is_empty() {
        write_back_batch(mv, b, m, &mut rep);
    }
    if rep.pages > 0 {
        rep.pool_pages_freed = mv.compact();
    }
    rep
}

/// Writes the batch and adds it to `rep`; false when writeback should stop.
fn write_back_batch(mv: &Mover<'_>, b: &Backing, m: &mut Maint, rep: &mut WritebackReport) -> bool {
    let f = flush_batch(mv, b, m, Purpose::Writeback);
    rep.pages += f.installed;
    rep.bytes += f.bytes;
    rep.writes += f.writes;
    rep.raced += f.raced;
    rep.device_full |= f.full;
    let stop = f.stop();
    if f.error.is_some() {
        rep.error = f.error;
    }
    !stop
}

/// Puts a page just read from the backing device back into RAM if it was read again soon
/// and there is room under the low watermark. `p` is what the read found under the slot lock
/// (its pin still held, so an equal entry is the same record: slot.rs rule 8), `payload` its
/// record's payload.
///
/// A raw page from the cold tier (whose records are all raw) is compressed with the store's
/// codec first, into `scratch` (`MAX_COMPRESSED_BYTES` or more: room for lz4's worst case),
/// by `comp`: it comes back as the page it was before it went cold, not as a raw 4 KiB
/// object.
pub(crate) fn maybe_promote(
    mv: &Mover<'_>,
    b: &Backing,
    p: &Pending<'_>,
    payload: &[u8],
    comp: &mut dyn crate::compress::BackendContext,
    scratch: &mut [u8],
) {
    if !b.cfg.promote || mv.age(mv.now(), p.last_access) > PROMOTE_WITHIN_SECS {
        return;
    }
    if b.cfg.incompressible && payload.len() == PAGE_SIZE {
        return; // the user wants incompressible pages on the device
    }
    let limit = mv.mem_limit_bytes();
    let room = limit * b.tune.watermarks().1 as u64 / 100;
    if limit != 0 && mv.pool_bytes() + payload.len() as u64 > room {
        return;
    }
    let raw_cold = b.in_ram() && payload.len() == PAGE_SIZE;
    let (payload, codec) = match raw_cold.then(|| comp.compress(payload, scratch)).flatten() {
        Some(n) if n <= crate::config::default_huge_threshold_bytes() => (&scratch[..n], crate::compress::Codec::PRIMARY),
        _ => (payload, p.codec),
    };
    if mv.install_in_ram(p.index, p.entry(), payload, codec, Unchanged::Pinned) {
        crate::stats::Counters::inc(&b.ctr.promoted_pages);
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
