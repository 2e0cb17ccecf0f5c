//! Garbage collection of the backing device: records die in place (discard, overwrite,
//! promotion, writeback races), leaving holes in sealed segments. GC picks the emptiest
//! sealed segments, reads each whole (one sequential `pread`), finds their live records by a
//! pass over the slot table (the slots are the index: a live record is one a `BACKING` slot
//! points to), and rewrites them packed through the maintenance head in large batches. Each
//! slot is switched to the new copy only if it still points to the old one; the old record is
//! then freed, and a segment whose last record leaves returns to the free list (`space.rs`),
//! its bytes punched out of a sparse file.
//!
//! Victims: sealed segments under `SPARSE_PCT` live always qualify; when free segments run
//! short, those under `PRESSURE_PCT` too. GC writes through the segments reserved for it, so a
//! full device can still make room. A record that no longer verifies is moved with a checksum
//! that still fails (it stays an error, never becomes data), and is counted.

use super::batch::{flush_batch, Purpose};
use super::log::HEADER;
use super::{Backing, Maint};
use crate::error::StoreError;
use crate::ram::mover::Mover;
use crate::slot::{Entry, Kind};

/// Segments with at most this share of live bytes are always collected.
const SPARSE_PCT: u64 = 40;
/// With few free segments left, segments with at most this share are collected.
const PRESSURE_PCT: u64 = 80;
/// Segments read per GC round (a call runs rounds until its budget or the candidates end).
const MAX_VICTIMS: usize = 8;

/// What a GC call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Segments collected (read and emptied of live records).
    pub segments: u64,
    /// Segments returned to the free list during this call.
    pub segments_freed: u64,
    /// Records moved.
    pub pages_moved: u64,
    pub bytes_moved: u64,
    /// Records found corrupt while moving (moved still failing their checksum).
    pub corrupt: u64,
    /// Holes punched in the backing file.
    pub punched: u64,
    pub error: Option<StoreError>,
}

/// `Store::gc`: collects garbage on the backing device, moving at most about `max_bytes` of
/// live records (GC may exceed it by one record, and ignores it when the device is nearly
/// full, since a full device stops overflow writes).
pub(crate) fn gc(mv: &Mover<'_>, b: &Backing, max_bytes: u64) -> GcReport {
    let mut m = b.maint.lock();
    let mut rep = GcReport::default();
    let sp = &b.space;
    let in_use_before = sp.segments_in_use();
    let short = sp.free_segments() <= (sp.num_segments() / 8).max(3);
    let (pct, mut budget) = if short { (PRESSURE_PCT, max_bytes.max(2 * sp.seg_bytes)) } else { (SPARSE_PCT, max_bytes) };
    loop {
        let mut victims = Vec::new();
        let mut bytes = 0;
        for (seg, live) in sp.gc_candidates(pct) {
            if victims.len() == MAX_VICTIMS || bytes + live > budget {
                break;
            }
            victims.push(seg);
            bytes += live;
        }
        let (moved, freed) = (rep.bytes_moved, sp.segments_in_use());
        if !victims.is_empty() {
            collect(mv, b, &mut m, &victims, &mut rep);
        }
        budget = budget.saturating_sub(rep.bytes_moved - moved);
        // Stop when nothing qualified, on an error, or when a round freed nothing (the
        // victims' records are busy or could not move).
        if victims.is_empty() || rep.error.is_some() || sp.segments_in_use() >= freed {
            break;
        }
    }
    rep.segments_freed = in_use_before.saturating_sub(sp.segments_in_use());
    match sp.punch_free(&*b.dev) {
        Ok(n) => rep.punched = n,
        Err(e) => rep.error = rep.error.or(Some(b.error(u64::MAX, format!("punching freed segments failed: {e}")))),
    }
    rep
}

fn collect(mv: &Mover<'_>, b: &Backing, m: &mut Maint, victims: &[u32], rep: &mut GcReport) {
    let sp = &b.space;
    // Pinned, a victim is not reused until we are done, so a slot pointing into it still
    // points to the record we copied (slot.rs rule 8); and no write is in flight in it, so
    // the image we read is complete.
    let pins: Vec<_> = victims.iter().filter_map(|&seg| sp.pin_sealed(seg).map(|p| (seg, p))).collect();
    let victims: Vec<u32> = pins.iter().map(|&(seg, _)| seg).collect();
    let victims = &victims[..];
    let seg_bytes = sp.seg_bytes as usize;
    let mut image = vec![0u8; victims.len() * seg_bytes];
    let mut readable = vec![true; victims.len()];
    for (k, &seg) in victims.iter().enumerate() {
        if let Err(e) = b.dev.read_at(&mut image[k * seg_bytes..][..seg_bytes], seg as u64 * sp.seg_bytes) {
            rep.error = Some(b.error(u64::MAX, format!("GC read of segment {seg} failed: {e}; left in place")));
            readable[k] = false;
        }
    }
    rep.segments += readable.iter().filter(|&&r| r).count() as u64;
    for (index, h) in mv.hints_from(0) {
        if h.kind != Kind::Backing {
            continue;
        }
        let Entry::Backing { loc, len, codec } = mv.entry(index) else { continue };
        let seg = sp.seg_of(loc);
        let Some(k) = victims.iter().position(|&v| v == seg) else { continue };
        if !readable[k] {
            continue;
        }
        // The record is live (the slot pointed to it) and its segment pinned, so the
        // segment's generation is the one it was written with.
        let gen = sp.gen(seg);
        let off = k * seg_bytes + (loc - seg as u64 * sp.seg_bytes) as usize;
        let rec = &mut image[off..off + HEADER + len as usize];
        let poison = b.run.open(gen, loc, index, rec).is_err();
        rep.corrupt += poison as u64;
        m.batch.push(index, Entry::Backing { loc, len, codec }, len as usize, poison).copy_from_slice(&rec[HEADER..]);
        if m.batch.is_full() && !gc_batch(mv, b, m, rep) {
            return;
        }
    }
    if !m.batch.is_empty() {
        gc_batch(mv, b, m, rep);
    }
    drop(pins);
}

fn gc_batch(mv: &Mover<'_>, b: &Backing, m: &mut Maint, rep: &mut GcReport) -> bool {
    let f = flush_batch(mv, b, m, Purpose::Gc);
    rep.pages_moved += f.installed;
    rep.bytes_moved += f.bytes;
    let ok = !f.stop();
    if f.error.is_some() {
        rep.error = f.error;
    }
    ok
}
