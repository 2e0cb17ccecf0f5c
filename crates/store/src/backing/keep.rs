//! The backing tier's part of the state file: what a successor needs to take a backing file or
//! block device over after its server died, and cannot recompute from the slots.
//!
//! The RAM layer reserves the region (`ram/layout.rs`, its size in the header) without knowing
//! what is in it, and hands it up (`Ram::tier_region`); its format is this file's:
//!
//! ```text
//! page 0, u64 words (LE, atomics):
//!   0      state: 0 not written (its creator died first), LIVE, or CLOSED (its server closed
//!          the device: the data area was discarded, nothing is left to take over)
//!   1      seal: AEAD (AES-256-GCM) or CHECKSUM (crc32c)
//!   2      the run identifier (crc32c)
//!   3..7   the run key (AES-256-GCM), 32 bytes
//!   7..11  the device's identity (`device.rs`): st_dev, st_ino, st_rdev, usable bytes
//!   11     segment bytes
//!   12     segments
//! page 1.. the generation table (`space.rs`, `GenTable`): word 0 the last generation given,
//!          word 1 + s the generation of segment s
//! ```
//!
//! A successor seals with the kept secret whatever its own `encrypt` says: the records on the
//! device are the dead run's, and so are the run's next ones. Everything else of the tier is
//! recomputed by a successor ([`take_over`]): live bytes per
//! segment from the slots' `BACKING` entries (each checked to lie inside the device and inside
//! one opened segment, else the slot is LOST), free segments (those no entry uses), fresh log
//! heads, counters from zero. The key is here, as private as the pool's pages that are here too
//! (a memfd reachable only through its descriptor, locked in memory by a swap server).
//!
//! Crash consistency: the creator writes everything before `state` (Release); a segment's
//! generation is stored in the table when the segment opens, before any record is sealed with
//! it (`SpaceMap::open_segment`); the counter is a word here too, so a successor continues it
//! and no (generation, location) nonce repeats under the kept key. A segment the dead process
//! had open is treated as full: nothing is appended to it under its generation again.

use std::sync::atomic::{AtomicU64, Ordering::*};

use super::device::Identity;
use super::seal::{RecordSeal, Secret};
use super::space::GenTable;
use crate::shm::Region;
use crate::zeroed::ZeroedSlice;
use crate::PAGE_SIZE;

const LIVE: u64 = 1;
const CLOSED: u64 = 2;
const AEAD: u64 = 1;
const CHECKSUM: u64 = 2;

const STATE: usize = 0;
const SEAL: usize = 1;
const RUN: usize = 2;
const KEY: usize = 3;
const ID: usize = 7;
const SEG_BYTES: usize = 11;
const SEGMENTS: usize = 12;
const WORDS: usize = 13;

/// The identity the cold tier's part records (`Backing::cold`): no file has it (no device
/// number is the word "coldtier"), so a file configuration never takes a cold tier over, nor
/// the reverse.
pub(crate) fn cold_identity(size_bytes: u64) -> Identity {
    Identity { dev: u64::from_le_bytes(*b"coldtier"), ino: u64::MAX, rdev: u64::MAX, size_bytes }
}

/// Bytes of the region for a device of `segments` segments.
pub(crate) fn region_bytes(segments: u64) -> usize {
    PAGE_SIZE + GenTable::words(segments) * 8
}

/// The tier's region of a live state file (page 0; the generation table is the space map's).
pub(crate) struct Kept {
    words: ZeroedSlice<AtomicU64>,
}

fn split(region: &Region, segments: u64) -> (Kept, GenTable) {
    let words = ZeroedSlice::in_map(&region.map, region.offset, WORDS);
    let gens = ZeroedSlice::in_map(&region.map, region.offset + PAGE_SIZE, GenTable::words(segments));
    (Kept { words }, GenTable::Kept(gens))
}

impl Kept {
    /// Fills a new device's region: its identity and geometry, and a new run's seal
    /// (`encrypt`: a key, else a run identifier); `state` last. Returns the seal and the
    /// generation table for the space map.
    pub fn create(region: &Region, id: Identity, seg_bytes: u64, encrypt: bool) -> std::io::Result<(Kept, RecordSeal, GenTable)> {
        let segments = id.size_bytes / seg_bytes;
        assert!(region.len >= region_bytes(segments), "the layout reserved the tier's region for its segments");
        let (kept, gens) = split(region, segments);
        let w = &kept.words;
        let seal = RecordSeal::drawn(encrypt, &mut |s| match s {
            Secret::Key(k) => {
                for (i, c) in k.chunks(8).enumerate() {
                    w[KEY + i].store(u64::from_le_bytes(c.try_into().expect("8 bytes")), Relaxed);
                }
                w[SEAL].store(AEAD, Relaxed);
            }
            Secret::Run(r) => {
                w[RUN].store(*r, Relaxed);
                w[SEAL].store(CHECKSUM, Relaxed);
            }
        })?;
        for (i, v) in [id.dev, id.ino, id.rdev, id.size_bytes, seg_bytes, segments].into_iter().enumerate() {
            w[ID + i].store(v, Relaxed);
        }
        w[STATE].store(LIVE, Release);
        Ok((kept, seal, gens))
    }

    /// The device's records are gone (its server closed it): a successor must not take it over.
    pub fn close(&self) {
        self.words[STATE].store(CLOSED, SeqCst);
    }
}

/// Above any generation a server gives: one segment opened per nanosecond would take 146
/// years to reach it.
const GEN_LIMIT: u64 = 1 << 62;

/// What a successor read from a dead server's region ([`take_over`]).
pub(crate) struct TakenOver {
    pub kept: Kept,
    pub id: Identity,
    pub seal: RecordSeal,
    pub gens: GenTable,
}

/// Reads a dead server's region for a successor configured with segments of `seg_bytes`, and
/// the cold tier (`cold`) or a file or block device; the error is one line. Nothing is changed.
pub(crate) fn take_over(region: &Region, seg_bytes: u64, cold: bool) -> Result<TakenOver, String> {
    if region.len < region_bytes(0) {
        return Err(format!("its backing tier's region is {} bytes: it is damaged", region.len));
    }
    let words: ZeroedSlice<AtomicU64> = ZeroedSlice::in_map(&region.map, region.offset, WORDS);
    let w = |i: usize| words[i].load(Acquire);
    match w(STATE) {
        LIVE => {}
        CLOSED => return Err("its backing device was closed by its server (stopped, not killed): the records on it were discarded".into()),
        _ => return Err("its backing tier was never set up (its server died while starting)".into()),
    }
    let id = Identity { dev: w(ID), ino: w(ID + 1), rdev: w(ID + 2), size_bytes: w(ID + 3) };
    match (id == cold_identity(id.size_bytes), cold) {
        (true, false) => return Err("its backing tier is the cold tier, the configuration has a file or block device".into()),
        (false, true) => return Err("its backing tier is a file or block device, the configuration has the cold tier".into()),
        _ => {}
    }
    let segments = w(SEGMENTS);
    if w(SEG_BYTES) != seg_bytes {
        return Err(format!("its backing device has segments of {} bytes, the configuration {seg_bytes}", w(SEG_BYTES)));
    }
    if segments != id.size_bytes / seg_bytes || region_bytes(segments) > region.len {
        return Err(format!("its backing tier's region names {segments} segments of a {}-byte device: it is damaged", id.size_bytes));
    }
    let secret = match w(SEAL) {
        AEAD => {
            let mut k = [0u8; 32];
            for i in 0..4 {
                k[i * 8..][..8].copy_from_slice(&w(KEY + i).to_le_bytes());
            }
            Secret::Key(k)
        }
        CHECKSUM => Secret::Run(w(RUN)),
        s => return Err(format!("its backing tier's seal is of kind {s}: it is damaged")),
    };
    let seal = RecordSeal::from_secret(&secret);
    if let Secret::Key(mut k) = secret {
        k.fill(0);
        std::hint::black_box(&k);
    }
    let seal = seal.map_err(|e| format!("cannot set the backing device's key up (mmap): {e}"))?;
    let (kept, gens) = split(region, segments);
    // Generations only grow, one per segment opened: one past GEN_LIMIT is damage, and taking
    // it over would let the counter wrap to generations (with a file, AES-GCM nonces) the
    // device has used before.
    if let Some((i, g)) = gens.iter().map(|g| g.load(Acquire)).enumerate().find(|&(_, g)| g >= GEN_LIMIT) {
        return Err(format!("its backing tier's generation table has {g} in word {i}, past any a server gives: it is damaged"));
    }
    Ok(TakenOver { kept, id, seal, gens })
}
