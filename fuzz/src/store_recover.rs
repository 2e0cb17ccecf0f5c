//! Taking a device over from a damaged state file (`Store::recover`): never a panic or a hang,
//! never a page recovery could have checked returned wrong, and a recovered store that works.
//!
//! The input builds a state, damages it, and has a successor take it over:
//! 1. byte 0 configures a 32-page store: bit 0 zstd instead of lz4, bit 1 recompression (pages
//!    idle for 2 s, dictionaries trained on 9 samples and always installed), bit 2 the cold
//!    tier (`BackingConfig::in_memory`: 512 KiB of records in 8 blocks of 64 KiB, one segment
//!    each, zstd level 1, its blocks in the state file; the pool limited to 6 pages, or 12 with
//!    bit 3; writeback between the watermarks 80% and 50%, pages idle 4 s moved by the
//!    maintenance step, a page read again within 4 s promoted back into RAM);
//! 2. operations until an opcode byte of 0xff: WRITE (page, kind, version), DISCARD (page),
//!    and a step of compaction, the clock moving on 5 s and a recompression run; with the cold
//!    tier (the opcode taken mod 8) also READ (page, once or twice: the second read promotes a
//!    page from the tier) and the tier's maintenance as crates/store/tests/takeover.rs's child
//!    runs it (`maintain`, `writeback` within a budget, the clock moving on 0-63 s,
//!    `writeback_idle`, `gc`). A byte model records each page's contents. With the cold tier a
//!    write the full pool cannot take fails (requests never go to the tier) and the page keeps
//!    its old contents; reads return the model's bytes, writeback and GC report no error
//!    (writeback may find the tier full), pool memory stays within the limit, and no read of
//!    the tier fails;
//! 3. the store is handed over (`Store::hand_over`: left as a server that is killed leaves it)
//!    and dropped, its state file kept open; then damage operations, each a region byte (taken
//!    mod 5, or mod 10 with the cold tier), an offset and a value, written into the state file
//!    with `pwrite`, of four kinds:
//!    - *derived state*, which recovery must recompute and never trust: the lock and mover
//!      bits of slots' meta words (region 0), the list and count fields of page descriptors
//!      (`inuse`, `list_prev`, `list_next`; 1), journal records that are free or not yet
//!      filled, or that name a slot that is not locked (2); the cold tier's header word naming
//!      the block being written, set to any block or none (5): recovery frees what that
//!      block's entry does not name (its other slot, its slot's pages past the blob) and
//!      clears the word (blocks.rs rule 3), which changes no block;
//!    - the cold tier's *unused bytes* (6), which no entry names and recovery never reads as
//!      data, since a writer fills a slot, its tail word and its tail before an entry names
//!      them (blocks.rs rule 2): the tail word and the slot an entry does not name (both of an
//!      empty block), a slot's bytes past its blob's head, the tail pages' bytes outside the
//!      live tails (the writer's map of them is rebuilt from the entries, and a tail page
//!      holding none is punched: tails.rs), the dictionary area past the dictionary's length.
//!      Recovery does not recompute them (but for those tail pages), yet no page may depend
//!      on them: they are held to the standard of derived state;
//!    - the cold tier's *checked state*: its entries and tail words (7: bits flipped, or
//!      changed and sealed again with the check byte the writer computes, copied here, so
//!      that the fields lie and pass the check), the bytes of live blobs (8: heads in their
//!      slots, tails in the tail pages), any value in a word of its headers (9: `keep.rs`'s
//!      state, seal, run, identity and geometry, its generation counter and table;
//!      `blocks.rs`'s magic, version, blocks, dictionary length and block being written).
//!      Recovery checks these (entries and tail words against their check bytes and the tail
//!      area, overlapping tails, the headers), a blob must decode to exactly 64 KiB, and each
//!      page in the tier is a record sealed with a crc32c of its run, generation, place, slot
//!      and bytes: so a page reads as the model says or as an I/O error, never as other bytes;
//!    - *anything* (3 and 4: any byte of the file, the header, slot data words, page chains,
//!      pool pages, dictionaries, the tier), which only has to give no panic and a store that
//!      works afterwards: recovery checks the structure (header, owners, classes, chains), not
//!      the bytes of a page in the pool, as the kernel trusts its own memory.
//! 4. `Store::recover`: an error is fine (one line) for damage of the last two kinds and never
//!    for the first two. After a recovery with damage of the first two kinds only, every page
//!    reads exactly as the model says, none is lost, and as many are in the tier as before.
//!    After one with the tier's checked state damaged besides, but nothing of the last kind,
//!    every page reads as the model says or as an I/O error. After any recovery, every page
//!    reads as an I/O error or as some page (never a panic); then every page is written (with
//!    the cold tier, when the pool is full, again after the clock moved on a minute and GC
//!    and idle writeback made room, up to 40 times), with the cold tier written back into it
//!    again (without an error after damage of the first two kinds only), and reads back
//!    exactly; and discarding the whole device gives every pool page and every record of the
//!    tier back.

use crate::{Bytes, PAGE};
use compcache_store::testing::StateRegions;
use compcache_store::{
    Algorithm, BackingConfig, Config, Context, GcReport, Medium, RecompressConfig, Store, StoreError, WritebackBudget, WritebackReport,
};
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Once;
use std::time::Duration;

const PAGES: u64 = 32;

/// The cold tier's size in records (raw pages and their 16-byte headers: 127 pages), and its
/// segments: one 64 KiB block each, 8 of them (the tier needs 4), so that GC has victims.
const TIER_BYTES: u64 = 512 << 10;
const SEGMENT_BYTES: u64 = 64 << 10;

fn config(c: u8) -> Config {
    let mut cfg = Config::with_disksize(PAGES * PAGE as u64);
    if c & 1 != 0 {
        cfg.algorithm = Algorithm::Zstd;
        cfg.level = Some(1);
    }
    if c & 2 != 0 {
        cfg.recompress = Some(RecompressConfig { idle_secs: 2, dict_samples: 9, min_dict_gain_permille: 0, ..RecompressConfig::default() });
    }
    if c & 4 != 0 {
        // As crates/store/tests/takeover.rs's `cold_config`, scaled to 32 pages: a pool of a
        // fifth or a third of the device, so that the watermarks move pages as well as age.
        let mut b = BackingConfig::in_memory(TIER_BYTES);
        b.segment_bytes = SEGMENT_BYTES;
        b.medium = Medium::Memory { level: 1 };
        b.idle_secs = 4;
        b.high_pct = 80;
        b.low_pct = 50;
        cfg.backing = Some(b);
        cfg.mem_limit_bytes = if c & 8 != 0 { 12 } else { 6 } * PAGE as u64;
    }
    cfg
}

/// A page of one of five kinds, naming (page, version) so that a wrong page cannot pass.
fn page(kind: u8, index: u64, version: u8) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    let mut x = (index << 8 | version as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rng = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match kind % 5 {
        0 => return p,
        1 => p.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&(index << 8 | version as u64).to_ne_bytes())),
        2 => p.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&rng().to_ne_bytes())),
        3 => p.iter_mut().enumerate().for_each(|(i, b)| *b = b"swap memory page "[i % 17]),
        _ => p[..PAGE / 2].chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&rng().to_ne_bytes())),
    }
    p[..8].copy_from_slice(&index.to_le_bytes());
    p[8] = version;
    p
}

fn pwrite(fd: &OwnedFd, off: usize, bytes: &[u8]) {
    // SAFETY: a plain pwrite of our own buffer into our own descriptor.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), off as libc::off_t) };
    assert_eq!(n, bytes.len() as isize, "the state file takes writes inside its size");
}

fn pread_u64(fd: &OwnedFd, off: usize) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: as above, a read into our own buffer.
    let n = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8, off as libc::off_t) };
    assert_eq!(n, 8);
    u64::from_ne_bytes(b)
}

/// The cold tier's part of the state file for [`config`]'s tier, as `backing/keep.rs` and
/// `backing/blocks.rs` lay it out (their module docs): the store exports no offsets inside it,
/// so they are computed here, and [`Tier::at`] checks the magic words each part starts with
/// (a layout that moved fails there, loudly, instead of damaging the wrong bytes).
mod layout {
    use crate::PAGE;

    pub const BLOCKS: usize = (super::TIER_BYTES / (64 << 10)) as usize;
    pub const SEGMENTS: usize = (super::TIER_BYTES / super::SEGMENT_BYTES) as usize;
    /// `keep.rs`: page 0 its words, page 1 the generation table (the counter, then one word a
    /// segment).
    pub const KEEP_WORDS: usize = 13;
    pub const KEEP_BYTES: usize = 2 * PAGE;
    pub const KEEP_IDENTITY: usize = 7;
    /// `blocks.rs`: its header page, the dictionary, the table of entries, the tail words (one
    /// a slot), two slots of 17 pages a block, the tail pages (one a block).
    pub const HEADER_WORDS: usize = 5;
    pub const W_DICT_LEN: usize = 3;
    pub const W_WRITING: usize = 4;
    pub const DICT: usize = PAGE;
    pub const DICT_BYTES: usize = 16 << 10;
    pub const TABLE: usize = DICT + DICT_BYTES;
    pub const TAIL_WORDS: usize = TABLE + PAGE;
    pub const HEAP: usize = TAIL_WORDS + PAGE;
    pub const SLOT_BYTES: usize = 17 * PAGE;
    pub const TAILS: usize = HEAP + BLOCKS * 2 * SLOT_BYTES;
    pub const TAIL_BYTES: usize = BLOCKS * PAGE;
    pub const BLOCKS_BYTES: usize = TAILS + TAIL_BYTES;
    const _: () = assert!(BLOCKS * 8 <= PAGE && BLOCKS * 16 <= PAGE && (1 + SEGMENTS) * 8 <= PAGE);

    /// An entry's fields (`blocks.rs`, "Entries").
    pub const LEN_MASK: u64 = (1 << 17) - 1;
    pub const LOW56: u64 = (1 << 56) - 1;

    /// `blocks.rs`'s `Entry::check`, copied so that damage can forge an entry that passes it
    /// ([`super::Tier::blobs`] checks the copy against every entry of the undamaged file).
    pub fn entry_check(low: u64, b: usize) -> u64 {
        let x = (low ^ (b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (x >> 56).max(1)
    }

    /// `blocks.rs`'s `TailWord::check`, copied likewise.
    pub fn tail_check(low: u64, b: usize, slot: usize) -> u64 {
        let x = (low ^ ((b * 2 + slot) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x >> 56).max(1)
    }
}

use layout::*;

/// A live blob of the cold tier as the undamaged file places it: the slot its entry names,
/// its head's bytes in that slot, and its tail's bytes in the tail area (8-byte granules).
struct Blob {
    slot: usize,
    head: usize,
    tail: Option<Range<usize>>,
}

/// Where the cold tier's parts are in the state file.
struct Tier {
    keep: usize,
    blocks: usize,
}

impl Tier {
    /// The tier region ends where the slots begin (`ram/layout.rs`; it is whole pages).
    fn at(r: &StateRegions, fd: &OwnedFd) -> Tier {
        let blocks = r.slots - BLOCKS_BYTES;
        let t = Tier { keep: blocks - KEEP_BYTES, blocks };
        assert_eq!(pread_u64(fd, t.blocks), u64::from_le_bytes(*b"ccblocks"), "the cold tier's blocks where the harness expects them");
        assert_eq!(pread_u64(fd, t.keep + KEEP_IDENTITY * 8), u64::from_le_bytes(*b"coldtier"), "and its keep.rs part");
        t
    }

    fn entry_at(&self, b: usize) -> usize {
        self.blocks + TABLE + b * 8
    }

    fn tail_word_at(&self, b: usize, slot: usize) -> usize {
        self.blocks + TAIL_WORDS + (b * 2 + slot) * 8
    }

    fn slot_at(&self, b: usize, slot: usize) -> usize {
        self.blocks + HEAP + (b * 2 + slot) * SLOT_BYTES
    }

    /// Every block's live blob (`None`: empty, never written or discarded), before damage.
    fn blobs(&self, fd: &OwnedFd) -> Vec<Option<Blob>> {
        (0..BLOCKS)
            .map(|b| {
                let e = pread_u64(fd, self.entry_at(b));
                if e == 0 {
                    return None;
                }
                assert_eq!(e >> 56, entry_check(e & LOW56, b), "block {b}'s entry {e:#x} passes blocks.rs's check as copied here");
                let (len, slot) = ((e & LEN_MASK) as usize, (e >> 17 & 1) as usize);
                if len == 0 {
                    return None;
                }
                let w = pread_u64(fd, self.tail_word_at(b, slot));
                if w == 0 {
                    return Some(Blob { slot, head: len, tail: None });
                }
                assert_eq!(w >> 56, tail_check(w & LOW56, b, slot), "block {b}'s tail word {w:#x} passes its check as copied here");
                let at = ((w & ((1 << 48) - 1)) as usize - 1) * 8;
                Some(Blob { slot, head: len - len % PAGE, tail: Some(at..at + (len % PAGE).next_multiple_of(8)) })
            })
            .collect()
    }

    /// The tier's unused bytes (module docs), as ranges of the file, none empty.
    fn unused(&self, fd: &OwnedFd, blobs: &[Option<Blob>]) -> Vec<Range<usize>> {
        let mut u = Vec::new();
        let dict = pread_u64(fd, self.blocks + W_DICT_LEN * 8) as usize;
        u.push(self.blocks + DICT + dict..self.blocks + DICT + DICT_BYTES);
        for (b, blob) in blobs.iter().enumerate() {
            for slot in 0..2 {
                let at = self.slot_at(b, slot);
                match blob {
                    Some(x) if x.slot == slot => u.push(at + x.head..at + SLOT_BYTES),
                    _ => u.extend([self.tail_word_at(b, slot)..self.tail_word_at(b, slot) + 8, at..at + SLOT_BYTES]),
                }
            }
        }
        let mut tails: Vec<Range<usize>> = blobs.iter().flatten().filter_map(|x| x.tail.clone()).collect();
        tails.sort_by_key(|t| t.start);
        // The gaps before, between and after them (the padding of a tail's last word is live).
        let mut from = 0;
        for t in tails {
            u.push(self.blocks + TAILS + from..self.blocks + TAILS + t.start.max(from));
            from = from.max(t.end);
        }
        u.push(self.blocks + TAILS + from..self.blocks + TAILS + TAIL_BYTES);
        u.retain(|r| !r.is_empty());
        u
    }

    /// The bytes of the live blobs: heads in their slots, tails in the tail pages.
    fn live(&self, blobs: &[Option<Blob>]) -> Vec<Range<usize>> {
        let mut l = Vec::new();
        for (b, x) in blobs.iter().enumerate() {
            if let Some(x) = x {
                let at = self.slot_at(b, x.slot);
                l.push(at..at + x.head);
                l.extend(x.tail.clone().map(|t| self.blocks + TAILS + t.start..self.blocks + TAILS + t.end));
            }
        }
        l.retain(|r| !r.is_empty());
        l
    }
}

/// Writes 1 to 8 bytes of `val` (repeated) at a place `off` picks in `ranges`, inside the
/// range it picks.
fn damage_in(fd: &OwnedFd, ranges: &[Range<usize>], off: u32, val: u32) {
    if ranges.is_empty() {
        return;
    }
    let r = &ranges[off as usize % ranges.len()];
    let at = r.start + (off as usize / ranges.len()) % r.len();
    let n = (val as usize % 8 + 1).min(r.end - at);
    pwrite(fd, at, &val.to_ne_bytes().repeat(2)[..n]);
}

/// Writeback may find the tier full (it has no room for every page); nothing else.
fn check_writeback(r: &WritebackReport) {
    assert!(r.error.is_none() || r.device_full, "writeback: {:?}", r.error);
}

fn check_gc(r: &GcReport) {
    assert!(r.error.is_none() && r.corrupt == 0, "gc: {r:?}");
}

/// Writes page `index`. With the cold tier a write the pool has no room for fails (requests
/// never go to the tier): it is tried again, up to 40 times, after the clock moved on a minute
/// and GC and idle writeback made room. (A block that damage left corrupt in a segment no
/// record uses fails the writebacks into that segment, a few, until GC gives the segment
/// back and the block is emptied: up to 8 such blocks.)
fn write_making_room(store: &Store, ctx: &mut Context, index: u64, p: &[u8]) -> Result<(), StoreError> {
    let mut tries = 0;
    loop {
        match store.write_page(ctx, index, p) {
            Err(StoreError::NoSpace { .. }) if store.has_backing() && tries < 40 => {
                tries += 1;
                store.advance_clock(60);
                store.gc(u64::MAX);
                store.writeback_idle(4, WritebackBudget::UNLIMITED);
            }
            r => return r,
        }
    }
}

/// What an operation byte means: without the cold tier as it always did (WRITE for 0 and 1
/// mod 4, DISCARD for 2, the step otherwise), with it from the byte mod 8.
#[derive(Clone, Copy)]
enum Op {
    Write,
    Discard,
    Step,
    Read,
    Tier,
}

pub fn run(data: &[u8]) {
    // A cold-tier store once per process, before the first input (in the fork server, when
    // `crate::init` calls this): what the tier sets up once per process or thread (zstd's
    // warm-up frame, the thread's decompression state) is then not any input's path.
    static WARM: Once = Once::new();
    WARM.call_once(|| run_input(&[4, 0xff, 0xff]));
    run_input(data);
}

fn run_input(data: &[u8]) {
    let mut b = Bytes::new(data);
    let c = b.u8();
    let cold = c & 4 != 0;
    let cfg = config(c);
    let limit = cfg.mem_limit_bytes;
    let store = Store::new(cfg.clone()).expect("a 32-page store");
    let mut ctx = store.context();
    let mut model: Vec<Vec<u8>> = vec![vec![0u8; PAGE]; PAGES as usize];
    let mut out = vec![0u8; PAGE];
    // The tier was full at some writeback (which the tier counts as an error).
    let mut full = false;
    for _ in 0..64 {
        let op = b.u8();
        if op == 0xff {
            break;
        }
        let what = match op {
            _ if cold => [Op::Write, Op::Write, Op::Discard, Op::Step, Op::Write, Op::Read, Op::Step, Op::Tier][op as usize % 8],
            op if op % 4 <= 1 => Op::Write,
            2 => Op::Discard,
            _ => Op::Step,
        };
        match what {
            Op::Write => {
                let (i, kind, v) = (b.u8() as u64 % PAGES, b.u8(), b.u8());
                let p = page(kind, i, v);
                match store.write_page(&mut ctx, i, &p) {
                    Ok(()) => model[i as usize] = p,
                    // The pool is full: the page keeps its old contents (checked by the reads).
                    Err(StoreError::NoSpace { .. }) if limit != 0 => {}
                    Err(e) => panic!("write of page {i}: {e} (a store without a limit takes every write)"),
                }
            }
            Op::Discard => {
                let i = b.u8() as u64 % PAGES;
                store.discard_page(i);
                model[i as usize] = vec![0u8; PAGE];
            }
            Op::Step => {
                store.compact();
                store.advance_clock(5);
                store.recompress(Duration::from_millis(20));
            }
            Op::Read => {
                let i = b.u8() as u64 % PAGES;
                for _ in 0..1 + (op >> 3 & 1) {
                    store.read_page(&mut ctx, i, &mut out).unwrap_or_else(|e| panic!("read of page {i}: {e}"));
                    assert!(out == model[i as usize], "page {i} differs from what was written");
                }
            }
            Op::Tier => {
                let m = b.u8();
                let budget = WritebackBudget { max_bytes: [16 << 10, 64 << 10, 256 << 10, u64::MAX][usize::from(m & 3)] };
                let r = store.maintain(Duration::from_millis(10));
                check_writeback(&r.writeback);
                check_gc(&r.gc);
                let w = store.writeback(budget);
                check_writeback(&w);
                store.advance_clock(u64::from(m >> 2));
                let i = store.writeback_idle(4, budget);
                check_writeback(&i);
                check_gc(&store.gc(budget.max_bytes));
                full |= r.writeback.device_full || w.device_full || i.device_full;
            }
        }
        if cold {
            let s = store.stats();
            // The limit bounds the pool; the tier's memory is bounded by its size.
            let pool = s.mem_used_total - s.bd_mem_bytes;
            assert!(pool <= limit, "pool memory {pool} above the limit {limit}");
            assert_eq!(s.failed_reads, 0, "a read failed");
            assert!(s.bd_errors == 0 || full, "an error of the cold tier");
        }
    }
    let in_tier = store.stats().bd_count;
    // A server that is killed leaves the tier to its successor; a drop would discard it.
    store.hand_over();
    let r = store.state_regions();
    let fd = store.state_fd().expect("a RAM store's state is kept").try_clone_to_owned().unwrap();
    drop((ctx, store));

    // The cold tier's parts, and its blobs' places before any damage.
    let tier = cold.then(|| Tier::at(&r, &fd));
    let (unused, live) = match &tier {
        Some(t) => {
            let blobs = t.blobs(&fd);
            (t.unused(&fd, &blobs), t.live(&blobs))
        }
        None => (Vec::new(), Vec::new()),
    };
    // Damage of the last kind (module docs), and of the tier's checked state.
    let mut anything = false;
    let mut checked = false;
    // Slots a damaged journal record names (never locked afterwards).
    let mut named = [false; PAGES as usize];
    for _ in 0..16 {
        let region = b.u8();
        if region == 0xff {
            break;
        }
        let (off, val) = (b.u32() as usize, b.u32());
        match (region % if cold { 10 } else { 5 }, &tier) {
            // A slot's lock and mover bits (63, 59, 58, 57): derived.
            (0, _) => {
                let s = off % PAGES as usize;
                let at = r.slots + s * 16;
                // Not the lock bit of a slot a damaged record names: that would make the
                // record authoritative (a real one is written only under the lock).
                let bits = if named[s] { val as u64 & 0b0000_1110 } else { val as u64 & 0b1000_1110 };
                let meta = pread_u64(&fd, at) | (bits << 56);
                pwrite(&fd, at, &meta.to_ne_bytes());
            }
            // A descriptor's `inuse`, `list_prev` or `list_next` (not `next`, not `free_head`).
            (1, _) => {
                let desc = off % (r.capacity_pages as usize).min(4096);
                let field = [1usize, 3, 4][(off >> 16) % 3];
                pwrite(&fd, r.descs + desc * 20 + field * 4, &val.to_ne_bytes());
            }
            // A journal record that recovery must ignore: free (slot word 0) or being filled
            // (u64::MAX) with any old words, or naming a slot that is not locked.
            (2, _) => {
                let rec = r.journal + (off % 1024) * 64;
                let slot_word = match val % 3 {
                    0 => 0,
                    1 => u64::MAX,
                    _ => {
                        let s = (val as u64 >> 8) % PAGES;
                        let meta = pread_u64(&fd, r.slots + s as usize * 16);
                        if meta >> 63 == 1 {
                            0 // that slot is locked: a record for it is authoritative
                        } else {
                            named[s as usize] = true;
                            s + 1
                        }
                    }
                };
                pwrite(&fd, rec + 8, &(val as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_ne_bytes());
                pwrite(&fd, rec + 16, &(!(val as u64)).to_ne_bytes());
                pwrite(&fd, rec, &slot_word.to_ne_bytes());
            }
            // Anything at all.
            (3 | 4, _) => {
                let at = off % r.len;
                let n = (val as usize % 8 + 1).min(r.len - at);
                pwrite(&fd, at, &val.to_ne_bytes().repeat(2)[..n]);
                anything = true;
            }
            // The cold tier's block being written: none or any block (derived).
            (5, Some(t)) => pwrite(&fd, t.blocks + W_WRITING * 8, &(u64::from(val) % (BLOCKS as u64 + 1)).to_ne_bytes()),
            // The cold tier's unused bytes.
            (6, Some(_)) => damage_in(&fd, &unused, off as u32, val),
            // An entry or a tail word: bits flipped, or changed and sealed again.
            (7, Some(t)) => {
                let b = off % BLOCKS;
                let e = pread_u64(&fd, t.entry_at(b));
                let flip = u64::from(val) << ((off >> 16) % 33);
                // The slot the entry names (either, for an empty block).
                let slot = if e & LEN_MASK != 0 { (e >> 17 & 1) as usize } else { off >> 8 & 1 };
                let (at, word) = match (off >> 9) % 4 {
                    0 => (t.entry_at(b), e ^ flip),
                    1 => {
                        let low = (e ^ u64::from(val)) & LOW56;
                        (t.entry_at(b), low | entry_check(low, b) << 56)
                    }
                    2 => (t.tail_word_at(b, slot), pread_u64(&fd, t.tail_word_at(b, slot)) ^ flip),
                    _ => {
                        // Any tail's place, or none (0).
                        let low = u64::from(val) % (TAIL_BYTES as u64 / 8 + 1);
                        (t.tail_word_at(b, slot), if low == 0 { 0 } else { low | tail_check(low, b, slot) << 56 })
                    }
                };
                pwrite(&fd, at, &word.to_ne_bytes());
                checked = true;
            }
            // The bytes of a live blob.
            (8, Some(_)) => {
                damage_in(&fd, &live, off as u32, val);
                checked |= !live.is_empty();
            }
            // A word of the tier's headers: `keep.rs`'s, its generation table, `blocks.rs`'s.
            (_, Some(t)) => {
                let i = (off & 0xffff) % (KEEP_WORDS + 1 + SEGMENTS + HEADER_WORDS);
                let at = match i {
                    i if i < KEEP_WORDS => t.keep + i * 8,
                    i if i < KEEP_WORDS + 1 + SEGMENTS => t.keep + PAGE + (i - KEEP_WORDS) * 8,
                    i => t.blocks + (i - KEEP_WORDS - 1 - SEGMENTS) * 8,
                };
                let old = pread_u64(&fd, at);
                let v = u64::from(val);
                let word = [v, old.wrapping_add(v), old ^ 1 << (v % 64), v | v << 32][(off >> 16) % 4];
                pwrite(&fd, at, &word.to_ne_bytes());
                checked = true;
            }
            (_, None) => unreachable!("regions 5-9 are the cold tier's"),
        }
    }

    let (store, report) = match Store::recover(cfg, fd) {
        Ok(x) => x,
        Err(e) if anything || checked => {
            assert!(!e.to_string().contains('\n'), "one line: {e}");
            return;
        }
        Err(e) => panic!("derived-state damage only, and recovery refused: {e}"),
    };
    let exact = !anything && !checked;
    let mut ctx = store.context();
    for i in 0..PAGES {
        let got = store.read_page(&mut ctx, i, &mut out);
        if exact {
            assert!(got.is_ok() && out == model[i as usize], "page {i} after derived-state damage only ({report})");
        } else if !anything {
            assert!(
                got.is_err() || out == model[i as usize],
                "page {i} read as other bytes after damage to the cold tier's checked state ({report})"
            );
        }
    }
    if exact {
        assert_eq!((report.lost_pages, report.backing_pages), (0, in_tier), "{report}");
    }
    for i in 0..PAGES {
        write_making_room(&store, &mut ctx, i, &page(3, i, 200)).expect("a recovered store takes writes");
    }
    if cold {
        // The recovered tier takes pages again: every page, idle a minute, goes there.
        store.advance_clock(60);
        let g = store.gc(u64::MAX);
        let w = store.writeback_idle(4, WritebackBudget::UNLIMITED);
        if exact {
            check_gc(&g);
            check_writeback(&w);
        }
    }
    for i in 0..PAGES {
        store.read_page(&mut ctx, i, &mut out).expect("and reads them back");
        assert!(out == page(3, i, 200), "page {i} after rewriting the recovered store");
    }
    store.discard(0, PAGES * PAGE as u64).unwrap();
    if cold {
        store.gc(u64::MAX);
    }
    let s = store.stats();
    assert_eq!(
        (s.mem_used_total - s.bd_mem_bytes, s.compr_data_size, s.bd_count, s.bd_bytes),
        (0, 0, 0, 0),
        "every pool page and record given back after discarding everything ({report})"
    );
}
