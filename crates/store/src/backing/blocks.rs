//! The cold tier's blocks in the state file (`shm.rs`), so that they outlive the server: a
//! successor ([`Blocks::open`]) serves every block the dead one had published. `memdev.rs`
//! compresses and decodes; this file only stores blobs (a tag byte and a zstd frame or the
//! raw 64 KiB, at most [`MAX_BLOB`] bytes), publishes them and reads them back.
//!
//! # Region layout (inside the backing tier's region, after `keep.rs`'s part)
//! ```text
//! page 0, u64 words (LE, atomics):
//!   0  MAGIC (written last by the creator)   1  VERSION   2  blocks
//!   3  dictionary length: 0 none; else its bytes are in the dictionary pages (published last)
//!   4  block being written + 1 (0: none): the one block whose slots a kill may leave untidy
//! pages 1..5    the dictionary (at most DICT_MAX_BYTES)
//! table         blocks x u64 entries (below), page-rounded
//! tail words    blocks x 2 u64, one per slot: where the blob in that slot keeps its tail
//! heap          blocks x 2 slots of SLOT_BYTES (65537 rounded up to pages: 17 pages)
//! tail pages    blocks pages, shared by the blobs' tails (`tails.rs`)
//! ```
//! The region is sparse like the rest of the file: a slot costs the pages its blob's head
//! covers, a tail page is resident while it holds a tail.
//!
//! # Heads and tails
//! A blob of `len` bytes is its head, the first `len` rounded down to whole pages, in its
//! slot, and its tail, the `len % PAGE_SIZE` bytes after, packed with other blobs' tails into
//! a tail page (`tails.rs` places them), so that a blob costs its length, not its length
//! rounded up to a page. The slot's tail word names the tail: `0` none (the blob is whole in
//! its slot: its length is whole pages, or no tail page had room), else bits 0..48 the
//! tail's byte offset in the tail pages / 8, + 1 (tails are 8-aligned and may run from one
//! tail page into the next), bits 56..64 a check byte over the low bits, the block and the
//! slot ([`TailWord`]). A tail word that fails its check, or names a place outside the area,
//! makes its block corrupt.
//!
//! # Entries (one AtomicU64 per block)
//! `0` is an empty block never written. Otherwise bits 0..17 the blob's length (0: empty,
//! discarded), bit 17 the slot holding it (0 or 1), bits 18..56 a generation (one more at each
//! publication of the block), bits 56..64 a check byte over the low 56 bits and the block's
//! index ([`Entry::seal`]). An entry whose check byte or length is wrong is corrupt: reads of
//! its block fail with `InvalidData`, never return other data.
//!
//! # Rules (what must hold, and where it is enforced)
//! 1. One writer at a time (`MemDevice`'s writer mutex): `publish`, `clear` and `set_dict`
//!    take `&mut WriterToken`, which only the holder of that mutex has.
//! 2. A block's active slot (the entry's) and its tail word and tail are never written; a
//!    write goes to the other (inactive) slot, its tail word and a newly placed tail, then the
//!    entry is stored with Release (copy-on-write), then the old slot is punched
//!    (`fallocate(PUNCH_HOLE)`: `MADV_DONTNEED` does not free shared memory, and `MADV_REMOVE`
//!    fails under `mlock`) and the old tail freed (its page punched if it held no other). A
//!    SIGKILL at any instruction leaves each entry naming a complete blob, old or new; the
//!    tail pages' map is rebuilt from the entries by a successor (`tails.rs`), so a tail a
//!    kill left placed but unpublished, or published but not freed, is free again.
//! 3. Before writing a slot the writer stores the block in word 4 and a Release fence (so no
//!    byte of the slot is stored before it, across a kill or for a reader), and clears it once
//!    the old slot is punched. Recovery tidies that one block (its inactive slot and the pages
//!    of its active slot past the blob); every other block's inactive slot is empty.
//! 4. Readers take no lock (a seqlock per block): load the entry (Acquire), copy the bytes
//!    out with Relaxed word loads, fence (Acquire), load the entry again; a change means the
//!    copy may be torn and is retried. A slot is written again only after its block's entry
//!    changed twice (rule 2), so an unchanged entry (its generation included) means the copy
//!    is whole. Both sides use atomics, so there is no data race, only a retry.
//! 5. A reader racing with a punch may fault zero pages back into a slot it was copying (a
//!    read fault on a shmem hole allocates): they are freed by the block's next write, which
//!    punches the tail of the slot it fills and the whole of the other. Until then they are
//!    memory not counted in `mem_bytes` (at most 17 pages per block, and only after a race).
//!    The same race on a tail page that was just given back leaves it resident until a tail
//!    is placed in it again (the writer reuses given-back pages first) or a successor's
//!    rebuild punches it.
//! 6. The dictionary is stored before its length (Release), and before any blob that needs
//!    it is published; it never changes once stored.

use std::io;
use std::sync::atomic::{fence, AtomicU64, Ordering::*};
use std::sync::Arc;

use super::tails::{self, Claim, TailMap};
use crate::shm::{Region, StateMap};
use crate::zeroed::ZeroedSlice;
use crate::PAGE_SIZE;

/// Bytes of a block's data.
pub(crate) const BLOCK: usize = crate::config::COLD_BLOCK_BYTES as usize;
/// The longest blob: the tag and the raw block.
pub(crate) const MAX_BLOB: usize = 1 + BLOCK;
/// Bytes of one slot: a blob rounded up to pages.
pub(crate) const SLOT_BYTES: usize = MAX_BLOB.next_multiple_of(PAGE_SIZE);
const SLOT_WORDS: usize = SLOT_BYTES / 8;
/// The longest dictionary the region holds.
pub(crate) const DICT_MAX_BYTES: usize = 16 << 10;
/// Bytes a reader's copy buffer needs: whole words of the longest blob.
pub(crate) const COPY_BYTES: usize = MAX_BLOB.next_multiple_of(8);

const MAGIC: u64 = u64::from_le_bytes(*b"ccblocks");
/// 1: the first layout (with tail pages: never released without them).
const VERSION: u64 = 1;
const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_BLOCKS: usize = 2;
const W_DICT_LEN: usize = 3;
const W_WRITING: usize = 4;
const HEADER_WORDS: usize = 5;
const DICT_OFFSET: usize = PAGE_SIZE;
const TABLE_OFFSET: usize = DICT_OFFSET + DICT_MAX_BYTES;

const _: () = assert!(MAX_BLOB < 1 << 17, "a blob's length fits the entry's 17 bits");
const _: () = assert!(SLOT_BYTES % PAGE_SIZE == 0 && DICT_MAX_BYTES % PAGE_SIZE == 0);

fn page_up(n: usize) -> usize {
    n.next_multiple_of(PAGE_SIZE)
}

fn table_bytes(blocks: usize) -> usize {
    page_up(blocks * 8)
}

fn tail_words_offset(blocks: usize) -> usize {
    TABLE_OFFSET + table_bytes(blocks)
}

fn tail_words_bytes(blocks: usize) -> usize {
    page_up(blocks * 2 * 8)
}

fn heap_offset(blocks: usize) -> usize {
    tail_words_offset(blocks) + tail_words_bytes(blocks)
}

fn tails_offset(blocks: usize) -> usize {
    heap_offset(blocks) + blocks * 2 * SLOT_BYTES
}

/// Bytes of the region for `blocks` blocks.
pub(crate) fn region_bytes(blocks: usize) -> usize {
    tails_offset(blocks) + blocks * PAGE_SIZE
}

/// The byte offset of the tail pages in a region of `blocks` blocks, and their length.
#[cfg(test)]
pub(crate) fn tail_pages_range(blocks: usize) -> (usize, usize) {
    (tails_offset(blocks), blocks * PAGE_SIZE)
}

/// The byte offset of the slots in a region of `blocks` blocks.
#[cfg(test)]
pub(crate) fn heap_range(blocks: usize) -> (usize, usize) {
    (heap_offset(blocks), blocks * 2 * SLOT_BYTES)
}

/// A block's entry (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry(u64);

const LEN_MASK: u64 = (1 << 17) - 1;
const SLOT_BIT: u64 = 1 << 17;
const GEN_SHIFT: u32 = 18;
const GEN_MASK: u64 = (1 << 38) - 1;
const LOW56: u64 = (1 << 56) - 1;

impl Entry {
    const NEVER: Entry = Entry(0);

    fn check(low: u64, b: usize) -> u64 {
        let x = (low ^ (b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (x >> 56).max(1) // never 0, so that no sealed entry is the all-zero NEVER
    }

    fn seal(b: usize, len: usize, slot: usize, gen: u64) -> Entry {
        let low = len as u64 | (slot as u64) << 17 | (gen & GEN_MASK) << GEN_SHIFT;
        Entry(low | Entry::check(low, b) << 56)
    }

    /// Whether the entry is one the writer could have stored for block `b`.
    fn valid(self, b: usize) -> bool {
        self == Entry::NEVER || (self.0 >> 56 == Entry::check(self.0 & LOW56, b) && self.len() <= MAX_BLOB)
    }

    pub fn len(self) -> usize {
        (self.0 & LEN_MASK) as usize
    }

    fn slot(self) -> usize {
        usize::from(self.0 & SLOT_BIT != 0)
    }

    fn gen(self) -> u64 {
        (self.0 >> GEN_SHIFT) & GEN_MASK
    }

    /// The entry's bits: with the device and the block, names one blob for good (a reader's
    /// cache key: rule 4).
    pub fn bits(self) -> u64 {
        self.0
    }
}

/// A slot's tail word (module docs, "Heads and tails").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TailWord(u64);

impl TailWord {
    const NONE: TailWord = TailWord(0);

    fn check(low: u64, b: usize, slot: usize) -> u64 {
        let x = (low ^ ((b * 2 + slot) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x >> 56).max(1)
    }

    fn seal(b: usize, slot: usize, offset: usize) -> TailWord {
        debug_assert_eq!(offset % tails::ALIGN, 0);
        let low = (offset / tails::ALIGN) as u64 + 1;
        TailWord(low | TailWord::check(low, b, slot) << 56)
    }

    /// The tail's byte offset in the tail pages for a blob of `len` bytes in block `b`'s
    /// `slot` of a region with `pages` tail pages: `Ok(None)` if the blob is whole in its slot;
    /// `Err` if the word cannot be one the writer stored for it.
    fn place(self, b: usize, slot: usize, len: usize, pages: usize) -> Result<Option<usize>, ()> {
        if self == TailWord::NONE {
            return Ok(None);
        }
        let low = self.0 & ((1 << 56) - 1);
        let tail = len % PAGE_SIZE;
        if self.0 >> 56 != TailWord::check(low, b, slot) || low >> 48 != 0 || low == 0 || tail == 0 {
            return Err(());
        }
        let offset = (low as usize - 1) * tails::ALIGN;
        match offset.checked_add(tails::taken(tail)) {
            Some(end) if end <= pages * PAGE_SIZE => Ok(Some(offset)),
            _ => Err(()),
        }
    }
}

/// What a read of a block found.
pub(crate) enum Got {
    Empty,
    /// The blob's length; its bytes are in the caller's buffer.
    Blob(usize),
}

/// Proof of being the one writer (rule 1): `MemDevice` keeps it under its writer mutex. It
/// owns what only the writer changes: the tail pages' map, and the bytes of the heads'
/// pages.
pub(crate) struct WriterToken {
    tails: TailMap,
    head_bytes: u64,
}

/// What recovery found ([`Blocks::open`]).
#[derive(Debug, Default)]
pub(crate) struct Opened {
    pub blocks: u64,
    pub blob_bytes: u64,
    pub resident_bytes: u64,
    pub corrupt: u64,
    pub dict: Option<Vec<u8>>,
    /// The dead writer was inside a block's write (rule 3), which was tidied.
    pub cut_write: bool,
}

/// The cold tier's blocks in a region of the state file.
pub(crate) struct Blocks {
    map: Arc<StateMap>,
    /// The region's offset in the file.
    offset: usize,
    header: ZeroedSlice<AtomicU64>,
    dict: ZeroedSlice<AtomicU64>,
    table: ZeroedSlice<AtomicU64>,
    tail_words: ZeroedSlice<AtomicU64>,
    heap: ZeroedSlice<AtomicU64>,
    tails: ZeroedSlice<AtomicU64>,
}

impl Blocks {
    fn map_in(region: &Region, blocks: usize) -> Blocks {
        assert!(region.len >= region_bytes(blocks), "the region holds {blocks} blocks");
        let (m, o) = (&region.map, region.offset);
        Blocks {
            map: m.clone(),
            offset: o,
            header: ZeroedSlice::in_map(m, o, HEADER_WORDS),
            dict: ZeroedSlice::in_map(m, o + DICT_OFFSET, DICT_MAX_BYTES / 8),
            table: ZeroedSlice::in_map(m, o + TABLE_OFFSET, blocks),
            tail_words: ZeroedSlice::in_map(m, o + tail_words_offset(blocks), blocks * 2),
            heap: ZeroedSlice::in_map(m, o + heap_offset(blocks), blocks * 2 * SLOT_WORDS),
            tails: ZeroedSlice::in_map(m, o + tails_offset(blocks), blocks * PAGE_SIZE / 8),
        }
    }

    fn tail_pages(&self) -> usize {
        self.table.len()
    }

    /// A new region of `blocks` empty blocks (the region is zeros: a new state file's).
    pub fn create(region: &Region, blocks: usize) -> (Blocks, WriterToken) {
        let me = Blocks::map_in(region, blocks);
        me.header[W_VERSION].store(VERSION, Relaxed);
        me.header[W_BLOCKS].store(blocks as u64, Relaxed);
        me.header[W_MAGIC].store(MAGIC, Release);
        let w = WriterToken { tails: TailMap::new(blocks), head_bytes: 0 };
        (me, w)
    }

    /// A dead server's region of `blocks` blocks, tidied (rule 3); the error is one line.
    pub fn open(region: &Region, blocks: usize) -> Result<(Blocks, WriterToken, Opened), String> {
        if region.len < region_bytes(blocks) {
            return Err(format!("its cold tier's region is {} bytes, {} are needed: it is damaged", region.len, region_bytes(blocks)));
        }
        let me = Blocks::map_in(region, blocks);
        let h = |w: usize| me.header[w].load(Acquire);
        if h(W_MAGIC) != MAGIC {
            return Err("its cold tier's blocks were never set up (its server died while starting)".into());
        }
        if h(W_VERSION) != VERSION {
            return Err(format!("its cold tier's blocks have layout version {}, this compcache reads {VERSION}", h(W_VERSION)));
        }
        if h(W_BLOCKS) != blocks as u64 {
            return Err(format!(
                "its cold tier has {} blocks, the configuration {blocks}: configure the size it was made with",
                h(W_BLOCKS)
            ));
        }
        let writing = h(W_WRITING);
        if writing != 0 {
            let b = (writing - 1) as usize;
            if b >= blocks {
                return Err(format!("its cold tier names block {b} of {blocks} as being written: it is damaged"));
            }
            me.tidy(b).map_err(|e| format!("cannot free the cold tier's unfinished write: {e}"))?;
            me.header[W_WRITING].store(0, Release);
        }
        let mut o = Opened { cut_write: writing != 0, ..Opened::default() };
        let dict_len = h(W_DICT_LEN) as usize;
        if dict_len > DICT_MAX_BYTES {
            return Err(format!("its cold tier's dictionary is {dict_len} bytes: it is damaged"));
        }
        if dict_len > 0 {
            let mut d = vec![0u8; dict_len.next_multiple_of(8)];
            copy_words(&me.dict, 0, &mut d);
            d.truncate(dict_len);
            o.dict = Some(d);
        }
        // Only the table's written pages: reading a hole of a shared mapping allocates a page.
        let mut claims = Vec::new();
        let mut head_bytes = 0u64;
        for r in me.map.data_ranges(me.offset + TABLE_OFFSET, blocks * 8) {
            let from = (r.start - me.offset - TABLE_OFFSET) / 8;
            let to = ((r.end - me.offset - TABLE_OFFSET) / 8).min(blocks);
            for b in from..to {
                let e = me.entry(b);
                if !e.valid(b) {
                    o.corrupt += 1;
                    continue;
                }
                if e.len() == 0 {
                    continue;
                }
                match me.tail_word(b, e.slot()).place(b, e.slot(), e.len(), me.tail_pages()) {
                    Err(()) => {
                        o.corrupt += 1;
                        continue;
                    }
                    Ok(Some(offset)) => {
                        let len = e.len() % PAGE_SIZE;
                        claims.push(Claim { offset, len, block: b });
                        head_bytes += (e.len() - len) as u64;
                    }
                    Ok(None) => head_bytes += page_up(e.len()) as u64,
                }
                o.blocks += 1;
                o.blob_bytes += e.len() as u64;
            }
        }
        let (tails, overlapping, punch_from) = TailMap::rebuild(blocks, claims);
        // Tails that overlap cannot both be right: their blocks read as corrupt from now on.
        for &b in &overlapping {
            let e = me.entry(b);
            me.table[b].store(e.0 ^ (1 << 56), Release);
            o.corrupt += 1;
            o.blocks -= 1;
            o.blob_bytes -= e.len() as u64;
        }
        // Tail pages no tail lives in may hold a cut write's: punched (they are counted free).
        for p in tails.free_pages() {
            me.punch_tail_page(p).map_err(|e| format!("cannot free the cold tier's unused tail page {p}: {e}"))?;
        }
        let past = me.map.data_ranges(me.offset + tails_offset(blocks) + punch_from * PAGE_SIZE, (blocks - punch_from) * PAGE_SIZE);
        for r in past {
            me.map.punch(r.start, r.len()).map_err(|e| format!("cannot free the cold tier's unused tail pages: {e}"))?;
        }
        o.resident_bytes = head_bytes + tails.resident_bytes();
        Ok((me, WriterToken { tails, head_bytes }, o))
    }

    fn tail_word(&self, b: usize, slot: usize) -> TailWord {
        TailWord(self.tail_words[b * 2 + slot].load(Relaxed))
    }

    fn punch_tail_page(&self, p: usize) -> io::Result<()> {
        self.map.punch(self.offset + tails_offset(self.table.len()) + p * PAGE_SIZE, PAGE_SIZE)
    }

    /// Bytes of the blobs' pages: their heads' and the tail pages'.
    pub fn resident_bytes(&self, w: &WriterToken) -> u64 {
        w.head_bytes + w.tails.resident_bytes()
    }

    /// The bytes of block `b`'s blob as its entry `e` places them: (head bytes in the slot,
    /// the tail's place), or `None` if the tail word is corrupt.
    fn layout(&self, b: usize, e: Entry) -> Option<(usize, Option<usize>)> {
        let place = self.tail_word(b, e.slot()).place(b, e.slot(), e.len(), self.tail_pages()).ok()?;
        let head = match place {
            Some(_) => e.len() - e.len() % PAGE_SIZE,
            None => e.len(),
        };
        Some((head, place))
    }

    /// Frees block `b`'s blob as `e` named it (its tail; the caller punches its slot).
    fn free_tail(&self, w: &mut WriterToken, b: usize, e: Entry) -> io::Result<()> {
        if e.len() == 0 || !e.valid(b) {
            return Ok(());
        }
        match self.layout(b, e) {
            Some((head, Some(offset))) => {
                w.head_bytes -= head as u64;
                for p in w.tails.free(offset, e.len() % PAGE_SIZE).into_iter().flatten() {
                    self.punch_tail_page(p)?;
                }
            }
            Some((head, None)) => w.head_bytes -= page_up(head) as u64,
            None => {}
        }
        Ok(())
    }

    fn entry(&self, b: usize) -> Entry {
        Entry(self.table[b].load(Acquire))
    }

    /// Byte offset of block `b`'s `slot` in the file.
    fn slot_offset(&self, b: usize, slot: usize) -> usize {
        self.offset + heap_offset(self.table.len()) + (b * 2 + slot) * SLOT_BYTES
    }

    fn slot_words(&self, b: usize, slot: usize) -> &[AtomicU64] {
        &self.heap[(b * 2 + slot) * SLOT_WORDS..][..SLOT_WORDS]
    }

    fn punch(&self, b: usize, slot: usize, from: usize) -> io::Result<()> {
        let from = page_up(from);
        if from >= SLOT_BYTES {
            return Ok(());
        }
        self.map.punch(self.slot_offset(b, slot) + from, SLOT_BYTES - from)
    }

    /// Frees what a write of block `b` cut short may have left in its slots (rule 3): the
    /// inactive slot, and the active one's pages past its head. (A tail it placed is freed by
    /// the rebuild of the tail pages' map.)
    fn tidy(&self, b: usize) -> io::Result<()> {
        let e = self.entry(b);
        if !e.valid(b) {
            return Ok(()); // which slot is whose is not known: leave both
        }
        let active = e.slot();
        self.punch(b, 1 - active, 0)?;
        match self.layout(b, e) {
            Some((head, _)) => self.punch(b, active, head),
            None => Ok(()),
        }
    }

    /// Block `b`'s entry now (a reader's cache key: equal bits, the same blob).
    pub fn current(&self, b: usize) -> Entry {
        self.entry(b)
    }

    /// Block `b` as its entry names it, copied into `buf` ([`COPY_BYTES`] at least), whole
    /// (rule 4): `want(tag, len)` says which bytes of the blob to copy (at their own offsets),
    /// from its first byte and length, e.g. a part of a raw block. Fails with `InvalidData` on
    /// a corrupt entry. Returns the entry too.
    pub fn read(&self, b: usize, buf: &mut [u8], want: impl Fn(u8, usize) -> std::ops::Range<usize>) -> io::Result<(Entry, Got)> {
        loop {
            let e = self.entry(b);
            if !e.valid(b) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("its entry {:#x} is corrupt", e.0)));
            }
            if e.len() == 0 {
                return Ok((e, Got::Empty));
            }
            let Some((head, place)) = self.layout(b, e) else {
                if self.table[b].load(Acquire) == e.0 {
                    let w = self.tail_word(b, e.slot()).0;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, format!("its tail word {w:#x} is corrupt")));
                }
                continue;
            };
            let words = self.slot_words(b, e.slot());
            let tag = match (head, place) {
                (0, Some(offset)) => self.tails[offset / 8].load(Relaxed) as u8,
                _ => words[0].load(Relaxed) as u8,
            };
            let r = want(tag, e.len());
            let r = r.start.min(e.len())..r.end.min(e.len());
            buf[0] = tag;
            let in_head = r.start.min(head)..r.end.min(head);
            copy_words(words, in_head.start, &mut buf[in_head.clone()]);
            if let Some(offset) = place {
                let in_tail = r.start.max(head)..r.end.max(head);
                copy_words(&self.tails, offset + in_tail.start - head, &mut buf[in_tail]);
            }
            fence(Acquire);
            if self.table[b].load(Relaxed) == e.0 {
                return Ok((e, Got::Blob(e.len())));
            }
        }
    }

    /// Publishes `blob` as block `b`'s (rule 2). Returns the old blob's length (0: none).
    pub fn publish(&self, w: &mut WriterToken, b: usize, blob: &[u8]) -> io::Result<usize> {
        assert!(!blob.is_empty() && blob.len() <= MAX_BLOB);
        let old = self.entry(b);
        // A corrupt entry (no reader copies its slots) is replaced as an empty one would be.
        let (slot, old_len) = match old {
            _ if !old.valid(b) => (0, None),
            Entry::NEVER => (0, Some(0)),
            _ => (1 - old.slot(), Some(old.len())),
        };
        let tail_len = blob.len() % PAGE_SIZE;
        let place = if tail_len > 0 { w.tails.alloc(tail_len) } else { None };
        let head = if place.is_some() { blob.len() - tail_len } else { blob.len() };
        self.begin(b);
        store_words(self.slot_words(b, slot), 0, &blob[..head]);
        let word = match place {
            Some(offset) => {
                store_words(&self.tails, offset, &blob[head..]);
                TailWord::seal(b, slot, offset)
            }
            None => TailWord::NONE,
        };
        // Rule 5: pages a racing reader faulted in past the head.
        self.punch(b, slot, head)?;
        self.tail_words[b * 2 + slot].store(word.0, Relaxed);
        self.table[b].store(Entry::seal(b, blob.len(), slot, old.gen() + 1).0, Release);
        w.head_bytes += page_up(head) as u64;
        if old_len != Some(0) {
            self.free_tail(w, b, old)?;
            self.punch(b, 1 - slot, 0)?;
        }
        self.end();
        Ok(old_len.unwrap_or(0))
    }

    /// Empties block `b`; returns the old blob's length (0: it was empty).
    pub fn clear(&self, w: &mut WriterToken, b: usize) -> io::Result<usize> {
        let old = self.entry(b);
        if old.len() == 0 && old.valid(b) {
            return Ok(0);
        }
        // A corrupt entry is replaced too: its block is given up, as the caller asked.
        self.begin(b);
        let slot = if old.valid(b) { old.slot() } else { 0 };
        self.table[b].store(Entry::seal(b, 0, slot, old.gen() + 1).0, Release);
        self.free_tail(w, b, old)?;
        self.punch(b, 0, 0)?;
        self.punch(b, 1, 0)?;
        self.end();
        Ok(if old.valid(b) { old.len() } else { 0 })
    }

    /// Rule 3: block `b` is being written, stored before any byte of its slots.
    fn begin(&self, b: usize) {
        self.header[W_WRITING].store(b as u64 + 1, Relaxed);
        fence(Release);
    }

    fn end(&self) {
        self.header[W_WRITING].store(0, Release);
    }

    /// Stores the dictionary (rule 6), once.
    pub fn set_dict(&self, _w: &mut WriterToken, dict: &[u8]) {
        assert!(dict.len() <= DICT_MAX_BYTES && !dict.is_empty());
        debug_assert_eq!(self.header[W_DICT_LEN].load(Relaxed), 0, "set once");
        for (i, c) in dict.chunks(8).enumerate() {
            let mut x = [0u8; 8];
            x[..c.len()].copy_from_slice(c);
            self.dict[i].store(u64::from_le_bytes(x), Relaxed);
        }
        self.header[W_DICT_LEN].store(dict.len() as u64, Release);
    }

    /// Bytes of the header, dictionary pages, table and tail words (resident once written;
    /// the tables counted whole: the log goes through them).
    pub fn fixed_bytes(&self, dict_len: usize) -> u64 {
        (PAGE_SIZE + page_up(dict_len) + table_bytes(self.table.len()) + tail_words_bytes(self.table.len())) as u64
    }

    pub fn num_blocks(&self) -> usize {
        self.table.len()
    }

    #[cfg(test)]
    pub(crate) fn poke_entry(&self, b: usize, bits: u64) {
        self.table[b].store(bits, SeqCst);
    }

    #[cfg(test)]
    pub(crate) fn entry_bits(&self, b: usize) -> u64 {
        self.table[b].load(SeqCst)
    }
}

/// Stores `src` at byte `at` (a multiple of 8) of `words`, in whole words: the last one
/// padded with zeros (the room it pads is the writer's: `tails.rs` rule 2).
fn store_words(words: &[AtomicU64], at: usize, src: &[u8]) {
    debug_assert_eq!(at % 8, 0);
    for (i, c) in src.chunks(8).enumerate() {
        let mut x = [0u8; 8];
        x[..c.len()].copy_from_slice(c);
        words[at / 8 + i].store(u64::from_le_bytes(x), Relaxed);
    }
}

/// Copies `dst.len()` bytes starting at byte `from` of `words` (little-endian) into `dst`,
/// with Relaxed loads (rule 4: the words may be stored meanwhile; a torn copy is detected by
/// the entry, not prevented here).
fn copy_words(words: &[AtomicU64], from: usize, dst: &mut [u8]) {
    let mut at = from;
    let mut out = 0;
    while out < dst.len() {
        let x = words[at / 8].load(Relaxed).to_le_bytes();
        let k = at % 8;
        let n = (8 - k).min(dst.len() - out);
        dst[out..out + n].copy_from_slice(&x[k..k + n]);
        at += n;
        out += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(blocks: usize) -> Region {
        let len = region_bytes(blocks);
        Region { map: Arc::new(StateMap::create(len).unwrap()), offset: 0, len }
    }

    fn blob(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn read(bl: &Blocks, b: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; COPY_BYTES];
        match bl.read(b, &mut buf, |_, n| 0..n).unwrap() {
            (_, Got::Empty) => None,
            (_, Got::Blob(n)) => Some(buf[..n].to_vec()),
        }
    }

    fn tail_pages(r: &Region, blocks: usize) -> Vec<std::ops::Range<usize>> {
        let (at, len) = tail_pages_range(blocks);
        let at = r.offset + at;
        r.map.data_ranges(at, len).into_iter().map(|x| x.start - at..x.end - at).collect()
    }

    fn resident(r: &Region, b: usize, blocks: usize) -> Vec<std::ops::Range<usize>> {
        let at = r.offset + heap_offset(blocks) + b * 2 * SLOT_BYTES;
        r.map.data_ranges(at, 2 * SLOT_BYTES).into_iter().map(|x| x.start - at..x.end - at).collect()
    }

    #[test]
    fn publish_read_clear_and_the_old_slot_is_freed() {
        let r = region(4);
        let (bl, mut w) = Blocks::create(&r, 4);
        assert_eq!(read(&bl, 2), None);
        let a = blob(10_000, 1);
        assert_eq!(bl.publish(&mut w, 2, &a).unwrap(), 0);
        assert_eq!(read(&bl, 2), Some(a.clone()));
        assert_eq!(resident(&r, 2, 4), vec![0..8192], "slot 0: the head's two pages");
        assert_eq!(tail_pages(&r, 4), vec![0..4096], "the tail in tail page 0");
        assert_eq!(bl.resident_bytes(&w), 3 * 4096);
        let c = blob(MAX_BLOB, 2);
        assert_eq!(bl.publish(&mut w, 2, &c).unwrap(), 10_000);
        assert_eq!(read(&bl, 2), Some(c));
        assert_eq!(resident(&r, 2, 4), vec![SLOT_BYTES..SLOT_BYTES + 65536], "slot 1's 16 pages, slot 0 punched");
        assert_eq!(bl.resident_bytes(&w), 17 * 4096, "the one-byte tail shares tail page 0");
        let mut part = vec![0u8; COPY_BYTES];
        let (_, got) = bl.read(2, &mut part, |_, _| 100..200).unwrap();
        assert!(matches!(got, Got::Blob(n) if n == MAX_BLOB) && part[100..200] == blob(MAX_BLOB, 2)[100..200]);
        assert_eq!(bl.clear(&mut w, 2).unwrap(), MAX_BLOB);
        assert_eq!(read(&bl, 2), None);
        assert!(resident(&r, 2, 4).is_empty());
        assert!(tail_pages(&r, 4).is_empty(), "the emptied tail page punched");
        assert_eq!(bl.resident_bytes(&w), 0);
        assert_eq!(read(&bl, 1), None, "others untouched");
    }

    #[test]
    fn a_reader_retries_while_the_block_changes_and_never_sees_a_torn_blob() {
        let r = region(1);
        let (bl, mut w) = Blocks::create(&r, 1);
        // Each blob is one byte value repeated, of a length tied to it: a torn copy mixes them.
        let make = |k: u64| vec![(k % 251) as u8 + 1; 3000 + (k % 251) as usize * 200];
        bl.publish(&mut w, 0, &make(0)).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut n = 0u64;
                    while !stop.load(Relaxed) {
                        let v = read(&bl, 0).unwrap();
                        assert!(v.iter().all(|&x| x == v[0]) && v.len() == 3000 + (v[0] as usize - 1) * 200, "torn");
                        n += 1;
                    }
                    assert!(n > 0);
                });
            }
            for k in 1..3000 {
                bl.publish(&mut w, 0, &make(k)).unwrap();
            }
            stop.store(true, Relaxed);
        });
    }

    #[test]
    fn recovery_tidies_a_half_written_slot_and_keeps_the_published_blob() {
        let r = region(3);
        let (bl, mut w) = Blocks::create(&r, 3);
        let a = blob(5000, 3);
        bl.publish(&mut w, 1, &a).unwrap();
        bl.set_dict(&mut w, b"a dictionary");
        // A kill in the middle of the next write of block 1: the inactive slot half filled,
        // the entry not yet published.
        bl.begin(1);
        for x in &bl.slot_words(1, 1)[..3000] {
            x.store(0x5a5a_5a5a_5a5a_5a5a, Relaxed);
        }
        drop(bl);
        assert!(!resident(&r, 1, 3).iter().all(|x| x.end <= SLOT_BYTES), "the torn write is there");
        let (bl, _, o) = Blocks::open(&r, 3).unwrap();
        assert_eq!((o.blocks, o.blob_bytes, o.corrupt), (1, 5000, 0));
        assert_eq!(o.dict.as_deref(), Some(&b"a dictionary"[..]));
        assert_eq!(read(&bl, 1), Some(a), "the old blob, whole");
        assert_eq!(resident(&r, 1, 3), vec![0..4096], "the inactive slot punched");
        assert!(Blocks::open(&r, 2).err().expect("refused").contains("configuration 2"));
    }

    #[test]
    fn a_corrupt_entry_fails_reads_with_invalid_data() {
        let r = region(2);
        let (bl, mut w) = Blocks::create(&r, 2);
        bl.publish(&mut w, 0, &blob(5000, 1)).unwrap();
        bl.publish(&mut w, 1, &blob(6000, 1)).unwrap();
        let good = bl.entry_bits(0);
        let mut buf = vec![0u8; COPY_BYTES];
        // A flipped length bit, another block's entry, a length past a slot.
        for bits in [good ^ 4, bl.entry_bits(1), (good & !LEN_MASK) | (MAX_BLOB as u64 + 5)] {
            bl.poke_entry(0, bits);
            let e = bl.read(0, &mut buf, |_, n| 0..n).err().expect("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bits:#x}");
        }
        let (_, _, o) = Blocks::open(&r, 2).unwrap();
        assert_eq!((o.blocks, o.corrupt), (1, 1));
        assert_eq!(bl.clear(&mut w, 0).unwrap(), 0, "a corrupt block can be given up");
        assert!(read(&bl, 0).is_none() && read(&bl, 1).is_some());
    }

    #[test]
    fn tails_share_pages_and_every_blob_reads_back_through_rewrites_and_clears() {
        let blocks = 64;
        let r = region(blocks);
        let (bl, mut w) = Blocks::create(&r, blocks);
        let len = |b: usize, k: usize| 1 + (b * 7919 + k * 104_729) % MAX_BLOB;
        let mut want: Vec<Option<Vec<u8>>> = vec![None; blocks];
        for k in 0..6 {
            for (b, slot) in want.iter_mut().enumerate() {
                let x = blob(len(b, k), (b + k) as u8);
                bl.publish(&mut w, b, &x).unwrap();
                *slot = Some(x);
            }
            for (b, x) in want.iter().enumerate() {
                assert_eq!(read(&bl, b).as_ref(), x.as_ref(), "block {b}, round {k}");
            }
            // Partial copies across the head and the tail.
            let mut buf = vec![0u8; COPY_BYTES];
            for (b, x) in want.iter().enumerate() {
                let x = x.as_ref().unwrap();
                let from = x.len().saturating_sub(5000) / 2;
                let (_, got) = bl.read(b, &mut buf, |_, n| from..n).unwrap();
                assert!(matches!(got, Got::Blob(n) if n == x.len()));
                assert_eq!(buf[from..x.len()], x[from..], "block {b}, bytes {from}..");
                assert_eq!(buf[0], x[0], "the tag");
            }
        }
        let tails: u64 = want.iter().flatten().map(|x| (x.len() % 4096) as u64).sum();
        let heads: u64 = want.iter().flatten().map(|x| (x.len() - x.len() % 4096) as u64).sum();
        let tail_resident = tail_pages(&r, blocks).iter().map(|x| x.len() as u64).sum::<u64>();
        assert!(tail_resident < tails + tails / 2 + 4096 * 8, "tails {tails} bytes in {tail_resident} bytes of pages");
        assert_eq!(bl.resident_bytes(&w), heads + tail_resident, "what is counted is what is resident");
        for b in (0..blocks).step_by(2) {
            bl.clear(&mut w, b).unwrap();
        }
        for b in (1..blocks).step_by(2) {
            assert_eq!(read(&bl, b).as_ref(), want[b].as_ref());
            bl.clear(&mut w, b).unwrap();
        }
        assert!(tail_pages(&r, blocks).is_empty() && bl.resident_bytes(&w) == 0, "all given back");
    }

    #[test]
    fn with_no_tail_page_free_a_blob_is_kept_whole_in_its_slot() {
        let r = region(2);
        let (bl, mut w) = Blocks::create(&r, 2);
        let (a, b, c) = (blob(4096 + 3000, 1), blob(4096 + 3000, 2), blob(4096 + 3000, 3));
        bl.publish(&mut w, 0, &a).unwrap();
        bl.publish(&mut w, 1, &b).unwrap();
        assert_eq!(tail_pages(&r, 2), vec![0..8192], "a's tail and b's, back to back");
        bl.publish(&mut w, 0, &c).unwrap();
        assert_eq!(bl.tail_word(0, 1), TailWord::NONE, "no room: whole in its slot");
        assert_eq!(resident(&r, 0, 2), vec![SLOT_BYTES..SLOT_BYTES + 8192]);
        assert_eq!(tail_pages(&r, 2), vec![0..8192], "b's tail still runs across both");
        assert_eq!((read(&bl, 0), read(&bl, 1)), (Some(c), Some(b)));
        assert_eq!(bl.resident_bytes(&w), 5 * 4096, "c's two pages, b's head, two tail pages");
        let (bl2, w2, o) = Blocks::open(&r, 2).unwrap();
        assert_eq!((o.blocks, o.corrupt, o.resident_bytes), (2, 0, bl.resident_bytes(&w)));
        assert_eq!(bl2.resident_bytes(&w2), o.resident_bytes);
    }

    #[test]
    fn recovery_frees_a_tail_a_kill_placed_but_never_published_and_keeps_the_live_ones() {
        let r = region(8);
        let (bl, mut w) = Blocks::create(&r, 8);
        let a = blob(4096 + 1000, 1);
        let b = blob(2000, 2);
        bl.publish(&mut w, 0, &a).unwrap();
        bl.publish(&mut w, 1, &b).unwrap();
        // A kill in block 2's write: its tail stored in a new tail page (page 0 full, say), the
        // entry never published.
        bl.begin(2);
        let offset = w.tails.alloc(4000).unwrap();
        assert_eq!(offset, 3000, "after b's");
        store_words(&bl.tails, offset, &blob(4000, 9));
        drop(bl);
        assert_eq!(tail_pages(&r, 8), vec![0..8192]);
        let (bl, mut w, o) = Blocks::open(&r, 8).unwrap();
        assert!(o.cut_write);
        assert_eq!((o.blocks, o.corrupt), (2, 0));
        assert_eq!(tail_pages(&r, 8), vec![0..4096], "the cut write's tail page punched");
        assert_eq!(w.tails.alloc(8), Some(3000), "new tails go after the live ones");
        w.tails.free(3000, 8);
        assert_eq!((read(&bl, 0), read(&bl, 1)), (Some(a.clone()), Some(b.clone())));
        assert_eq!(o.resident_bytes, 4096 + 4096);
        // New tails go after the live ones, never over them.
        for k in 2..8 {
            bl.publish(&mut w, k, &blob(900, k as u8)).unwrap();
        }
        assert_eq!((read(&bl, 0), read(&bl, 1)), (Some(a), Some(b)));
        for k in 2..8 {
            assert_eq!(read(&bl, k), Some(blob(900, k as u8)));
        }
    }

    #[test]
    fn a_corrupt_or_overlapping_tail_word_fails_its_block_never_reads_other_bytes() {
        let r = region(4);
        let (bl, mut w) = Blocks::create(&r, 4);
        for k in 0..3 {
            bl.publish(&mut w, k, &blob(4096 + 500, k as u8)).unwrap();
        }
        let mut buf = vec![0u8; COPY_BYTES];
        // Block 0's tail word flipped: its reads fail, recovery counts it.
        let slot = bl.entry(0).slot();
        let good = bl.tail_words[slot].load(SeqCst);
        bl.tail_words[slot].store(good ^ 8, SeqCst);
        assert_eq!(bl.read(0, &mut buf, |_, n| 0..n).err().expect("refused").kind(), io::ErrorKind::InvalidData);
        bl.tail_words[slot].store(good, SeqCst);
        // Block 2's tail word made to name block 1's tail (sealed as the writer would).
        let (s1, s2) = (bl.entry(1).slot(), bl.entry(2).slot());
        let off = bl.tail_word(1, s1).place(1, s1, 4096 + 500, 4).unwrap().unwrap();
        bl.tail_words[2 * 2 + s2].store(TailWord::seal(2, s2, off).0, SeqCst);
        let (bl2, _, o) = Blocks::open(&r, 4).unwrap();
        assert_eq!((o.blocks, o.corrupt), (1, 2), "blocks 1 and 2 overlap: neither vouched for");
        for k in [1, 2] {
            assert_eq!(bl2.read(k, &mut buf, |_, n| 0..n).err().expect("refused").kind(), io::ErrorKind::InvalidData);
        }
        assert_eq!(read(&bl2, 0), Some(blob(4096 + 500, 0)));
    }
}
