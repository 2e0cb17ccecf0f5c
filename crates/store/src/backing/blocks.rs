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
//! heap          blocks x 2 slots of SLOT_BYTES (65537 rounded up to pages: 17 pages)
//! ```
//! The region is sparse like the rest of the file: a slot costs the pages its blob covers.
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
//! 2. A block's active slot (the entry's) is never written; a write goes to the other
//!    (inactive) slot, then the entry is stored with Release (copy-on-write), then the old slot
//!    is punched (`fallocate(PUNCH_HOLE)`: `MADV_DONTNEED` does not free shared memory, and
//!    `MADV_REMOVE` fails under `mlock`). A SIGKILL at any instruction leaves each entry
//!    naming a complete blob, old or new.
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
//! 6. The dictionary is stored before its length (Release), and before any blob that needs
//!    it is published; it never changes once stored.

use std::io;
use std::sync::atomic::{fence, AtomicU64, Ordering::*};
use std::sync::Arc;

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
/// 1: the first layout.
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

fn heap_offset(blocks: usize) -> usize {
    TABLE_OFFSET + table_bytes(blocks)
}

/// Bytes of the region for `blocks` blocks.
pub(crate) fn region_bytes(blocks: usize) -> usize {
    heap_offset(blocks) + blocks * 2 * SLOT_BYTES
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

/// What a read of a block found.
pub(crate) enum Got {
    Empty,
    /// The blob's length; its bytes are in the caller's buffer.
    Blob(usize),
}

/// Proof of being the one writer (rule 1): `MemDevice` keeps it under its writer mutex.
pub(crate) struct WriterToken(());

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
    heap: ZeroedSlice<AtomicU64>,
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
            heap: ZeroedSlice::in_map(m, o + heap_offset(blocks), blocks * 2 * SLOT_WORDS),
        }
    }

    /// A new region of `blocks` empty blocks (the region is zeros: a new state file's).
    pub fn create(region: &Region, blocks: usize) -> (Blocks, WriterToken) {
        let me = Blocks::map_in(region, blocks);
        me.header[W_VERSION].store(VERSION, Relaxed);
        me.header[W_BLOCKS].store(blocks as u64, Relaxed);
        me.header[W_MAGIC].store(MAGIC, Release);
        (me, WriterToken(()))
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
        let mut w = WriterToken(());
        let writing = h(W_WRITING);
        if writing != 0 {
            let b = (writing - 1) as usize;
            if b >= blocks {
                return Err(format!("its cold tier names block {b} of {blocks} as being written: it is damaged"));
            }
            me.tidy(&mut w, b).map_err(|e| format!("cannot free the cold tier's unfinished write: {e}"))?;
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
        for r in me.map.data_ranges(me.offset + TABLE_OFFSET, blocks * 8) {
            let from = (r.start - me.offset - TABLE_OFFSET) / 8;
            let to = ((r.end - me.offset - TABLE_OFFSET) / 8).min(blocks);
            for b in from..to {
                let e = me.entry(b);
                if !e.valid(b) {
                    o.corrupt += 1;
                } else if e.len() > 0 {
                    o.blocks += 1;
                    o.blob_bytes += e.len() as u64;
                    o.resident_bytes += page_up(e.len()) as u64;
                }
            }
        }
        Ok((me, w, o))
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

    /// Frees what a write of block `b` cut short may have left (rule 3): the inactive slot,
    /// and the active one's pages past its blob.
    fn tidy(&self, _w: &mut WriterToken, b: usize) -> io::Result<()> {
        let e = self.entry(b);
        if !e.valid(b) {
            return Ok(()); // which slot is whose is not known: leave both
        }
        let active = e.slot();
        self.punch(b, 1 - active, 0)?;
        self.punch(b, active, e.len())
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
            let words = self.slot_words(b, e.slot());
            let tag = words[0].load(Relaxed) as u8;
            let r = want(tag, e.len());
            let r = r.start.min(e.len())..r.end.min(e.len());
            buf[0] = tag;
            copy_words(words, r.start, &mut buf[r.clone()]);
            fence(Acquire);
            if self.table[b].load(Relaxed) == e.0 {
                return Ok((e, Got::Blob(e.len())));
            }
        }
    }

    /// Publishes `blob` as block `b`'s (rule 2). Returns the old blob's length (0: none).
    pub fn publish(&self, _w: &mut WriterToken, b: usize, blob: &[u8]) -> io::Result<usize> {
        assert!(!blob.is_empty() && blob.len() <= MAX_BLOB);
        let old = self.entry(b);
        // A corrupt entry (no reader copies its slots) is replaced as an empty one would be.
        let (slot, old_len) = match old {
            _ if !old.valid(b) => (0, None),
            Entry::NEVER => (0, Some(0)),
            _ => (1 - old.slot(), Some(old.len())),
        };
        self.begin(b);
        let words = self.slot_words(b, slot);
        for (i, c) in blob.chunks(8).enumerate() {
            let mut x = [0u8; 8];
            x[..c.len()].copy_from_slice(c);
            words[i].store(u64::from_le_bytes(x), Relaxed);
        }
        // Rule 5: pages a racing reader faulted in past the blob.
        self.punch(b, slot, blob.len())?;
        self.table[b].store(Entry::seal(b, blob.len(), slot, old.gen() + 1).0, Release);
        if old_len != Some(0) {
            self.punch(b, 1 - slot, 0)?;
        }
        self.end();
        Ok(old_len.unwrap_or(0))
    }

    /// Empties block `b`; returns the old blob's length (0: it was empty).
    pub fn clear(&self, _w: &mut WriterToken, b: usize) -> io::Result<usize> {
        let old = self.entry(b);
        if old.len() == 0 && old.valid(b) {
            return Ok(0);
        }
        // A corrupt entry is replaced too: its block is given up, as the caller asked.
        self.begin(b);
        let slot = if old.valid(b) { old.slot() } else { 0 };
        self.table[b].store(Entry::seal(b, 0, slot, old.gen() + 1).0, Release);
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

    /// Bytes of the header, dictionary pages and table (resident once written; the table
    /// counted whole: the log goes through it).
    pub fn fixed_bytes(&self, dict_len: usize) -> u64 {
        (PAGE_SIZE + page_up(dict_len) + table_bytes(self.table.len())) as u64
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

/// Bytes of the memory a blob of `len` bytes takes in its slot.
pub(crate) fn blob_resident(len: usize) -> u64 {
    page_up(len) as u64
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
        assert_eq!(resident(&r, 2, 4), vec![0..12288], "slot 0, three pages");
        let c = blob(MAX_BLOB, 2);
        assert_eq!(bl.publish(&mut w, 2, &c).unwrap(), 10_000);
        assert_eq!(read(&bl, 2), Some(c));
        assert_eq!(resident(&r, 2, 4), vec![SLOT_BYTES..2 * SLOT_BYTES], "slot 1 whole, slot 0 punched");
        let mut part = vec![0u8; COPY_BYTES];
        let (_, got) = bl.read(2, &mut part, |_, _| 100..200).unwrap();
        assert!(matches!(got, Got::Blob(n) if n == MAX_BLOB) && part[100..200] == blob(MAX_BLOB, 2)[100..200]);
        assert_eq!(bl.clear(&mut w, 2).unwrap(), MAX_BLOB);
        assert_eq!(read(&bl, 2), None);
        assert!(resident(&r, 2, 4).is_empty());
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
        assert_eq!(resident(&r, 1, 3), vec![0..8192], "the inactive slot punched");
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
        assert_eq!(bl.clear(&mut WriterToken(()), 0).unwrap(), 0, "a corrupt block can be given up");
        assert!(read(&bl, 0).is_none() && read(&bl, 1).is_some());
    }
}
