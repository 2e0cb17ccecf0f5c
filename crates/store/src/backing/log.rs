//! The log-structured writer: records, log heads and batches.
//!
//! # Record format
//! ```text
//! loc:  header (HEADER bytes: AES-256-GCM tag, or crc32c) | payload (len bytes: compressed
//!       page, or 4096 raw; encrypted by default)
//! ```
//! Records are packed back to back inside a segment (several compressed pages per 4 KiB
//! block; a record may straddle blocks but never segments). The record carries no length or
//! owner: the slot entry holds both (`BACKING { loc, len }`). `seal.rs` seals and opens
//! records: the header binds the payload to its location, segment generation, owner, length
//! and run (a per-run key or identifier, never written anywhere), so a record read for the
//! wrong slot, from the wrong place, from an earlier life of its segment, written by another
//! run or server, a hole, a truncated or a corrupted file is an error, never data.
//!
//! # Writers
//! A [`LogHead`] appends to its OPEN segment and opens the next one when a record does not
//! fit. There are two heads, so the two kinds of writer never wait for each other's I/O:
//! - the overflow head (`Backing::overflow`), shared by request threads: a writer reserves
//!   its record's place under the head's mutex and writes it after releasing it;
//! - the maintenance head, owned by whoever holds the maintenance mutex (writeback and GC):
//!   it places a whole [`Batch`] at once and writes it with one `pwrite` per contiguous run,
//!   i.e. one or two large sequential writes per batch.

use super::device::BackingDevice;
use super::seal::RecordSeal;
pub(crate) use super::seal::HEADER;
use super::space::SpaceMap;
use crate::slot::Entry;
use crate::PAGE_SIZE;

/// Bytes gathered before a batch is written.
pub(crate) const BATCH_BYTES: usize = 256 << 10;
/// Records a batch holds at most: a batch of pages that compress to under 128 bytes each is
/// written before it reaches `BATCH_BYTES`.
const BATCH_ITEMS: usize = 2048;

/// The backing device has no free segment left.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceFull;

/// Where a head appends.
#[derive(Default)]
pub(crate) struct LogHead {
    seg: Option<u32>,
    fill: u64,
}

impl LogHead {
    /// Bytes the open segment can still take (0 without one).
    pub fn room(&self, space: &SpaceMap) -> u64 {
        self.seg.map_or(0, |_| space.seg_bytes - self.fill)
    }

    /// Reserves `bytes` (a whole record) and counts them live; returns (loc, generation).
    /// `use_reserve`: GC may open the segments kept for it.
    pub fn reserve(&mut self, space: &SpaceMap, bytes: u64, use_reserve: bool) -> Result<(u64, u64), DeviceFull> {
        debug_assert!(bytes <= space.seg_bytes);
        if let Some(seg) = self.seg {
            if self.fill + bytes <= space.seg_bytes {
                let loc = seg as u64 * space.seg_bytes + self.fill;
                self.fill += bytes;
                space.add_live(seg, bytes);
                return Ok((loc, space.gen(seg)));
            }
            self.seg = None;
            space.seal(seg);
        }
        let seg = space.open_segment(use_reserve).ok_or(DeviceFull)?;
        self.seg = Some(seg);
        self.fill = bytes;
        space.add_live(seg, bytes);
        Ok((seg as u64 * space.seg_bytes, space.gen(seg)))
    }
}

/// One page in a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub index: u64,
    /// The entry the slot held when the page was copied; the new location is installed only
    /// if the slot still holds it.
    pub old: Entry,
    pub len: u16,
    /// Offset of the record in the batch buffer.
    off: usize,
    /// Set by `write`, with the generation of its segment.
    pub loc: u64,
    gen: u64,
    /// Write the record with a header that fails (GC moving a record that was already
    /// corrupt: it must stay an error, not become data).
    pub poison: bool,
}

/// Records gathered in memory, placed and written together.
///
/// Writeback copies pages into it under their slot locks, so it never grows: it is made with
/// room for a full batch ([`Batch::reserved`], resident), and its owner writes it out as soon
/// as [`Batch::is_full`], before the next `push`.
pub(crate) struct Batch {
    buf: Vec<u8>,
    pub items: Vec<Item>,
}

/// Writing a batch failed: nothing in it may be installed; its space is freed.
pub(crate) struct BatchError(pub std::io::Error);

impl Batch {
    /// An empty batch with room for a full one, every page of it resident (see
    /// `resident_bytes`): `BATCH_BYTES` plus one more record, and `BATCH_ITEMS` items.
    pub fn reserved() -> Batch {
        let mut buf = crate::buf::resident_bytes(BATCH_BYTES + HEADER + PAGE_SIZE);
        buf.clear();
        // A filler with nonzero bytes in every item, so that every page is written.
        let filler = Item { index: u64::MAX, old: Entry::Empty, len: 0, off: usize::MAX, loc: u64::MAX, gen: u64::MAX, poison: true };
        let mut items = vec![filler; BATCH_ITEMS];
        std::hint::black_box(&mut items);
        items.clear();
        Batch { buf, items }
    }

    /// Whether the batch must be written before another page is added; until then `push`
    /// stays within the room `reserved` made.
    pub fn is_full(&self) -> bool {
        self.buf.len() >= BATCH_BYTES || self.items.len() >= BATCH_ITEMS
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    pub fn clear(&mut self) {
        self.buf.clear();
        self.items.clear();
    }

    /// Adds a page of `len` payload bytes owned by slot `index`; the caller fills the
    /// returned payload slice.
    pub fn push(&mut self, index: u64, old: Entry, len: usize, poison: bool) -> &mut [u8] {
        debug_assert!(!self.is_full() && len <= PAGE_SIZE, "a full batch is written before the next push");
        let off = self.buf.len();
        self.buf.resize(off + HEADER + len, 0);
        self.items.push(Item { index, old, len: len as u16, off, loc: 0, gen: 0, poison });
        &mut self.buf[off + HEADER..]
    }

    /// Places every record with `head`, seals them (`seal.rs`) and writes them, one `pwrite` per run
    /// of records contiguous on the device. When the device fills up, the records that did
    /// not get a place are dropped from the batch (their pages stay where they are). Returns
    /// whether the device was full and the number of `pwrite`s. On an I/O error every record's space is freed
    /// and the caller must install none of them.
    pub fn write(
        &mut self,
        head: &mut LogHead,
        space: &SpaceMap,
        dev: &dyn BackingDevice,
        run: &RecordSeal,
        use_reserve: bool,
    ) -> Result<(bool, u64), BatchError> {
        let mut full = false;
        let mut placed = 0;
        for it in self.items.iter_mut() {
            match head.reserve(space, (HEADER + it.len as usize) as u64, use_reserve) {
                Ok((loc, gen)) => {
                    (it.loc, it.gen) = (loc, gen);
                    placed += 1;
                }
                Err(DeviceFull) => {
                    full = true;
                    break;
                }
            }
        }
        self.items.truncate(placed);
        for it in &self.items {
            let rec = &mut self.buf[it.off..it.off + HEADER + it.len as usize];
            run.seal(it.gen, it.loc, it.index, rec);
            if it.poison {
                // The first header byte is in the crc and in the tag: it never opens.
                rec[0] ^= 0xff;
            }
        }
        let mut i = 0;
        let mut ios = 0;
        while i < self.items.len() {
            let start = i;
            let mut end_loc = self.items[i].loc + (HEADER + self.items[i].len as usize) as u64;
            i += 1;
            while i < self.items.len() && self.items[i].loc == end_loc {
                end_loc += (HEADER + self.items[i].len as usize) as u64;
                i += 1;
            }
            let (first, last) = (&self.items[start], &self.items[i - 1]);
            let bytes = &self.buf[first.off..last.off + HEADER + last.len as usize];
            if let Err(e) = dev.write_at(bytes, first.loc) {
                for it in &self.items {
                    space.written(it.loc);
                    space.free(it.loc, (HEADER + it.len as usize) as u64);
                }
                self.items.clear();
                return Err(BatchError(e));
            }
            ios += 1;
        }
        for it in &self.items {
            space.written(it.loc);
        }
        Ok((full, ios))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_written_when_full_never_grows() {
        let mut b = Batch::reserved();
        let room = (b.buf.as_ptr(), b.buf.capacity(), b.items.as_ptr(), b.items.capacity());
        // Large records fill it by bytes, tiny ones by items; mixed, both.
        for sizes in [&[PAGE_SIZE][..], &[1, 30, 60], &[4000, 7, 2100, 90, 1]] {
            for round in 0..3 {
                let mut k = 0;
                while !b.is_full() {
                    let len = sizes[k % sizes.len()];
                    b.push(k as u64, Entry::Empty, len, false).fill(round as u8);
                    k += 1;
                }
                assert!(k > 1, "a batch takes more than one record");
                assert_eq!(
                    (b.buf.as_ptr(), b.buf.capacity(), b.items.as_ptr(), b.items.capacity()),
                    room,
                    "sizes {sizes:?}: the batch grew"
                );
                b.clear();
            }
        }
    }

    /// A device in memory, for batches written without a file.
    struct Mem(std::sync::Mutex<Vec<u8>>);

    impl BackingDevice for Mem {
        fn size_bytes(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            buf.copy_from_slice(&self.0.lock().unwrap()[offset as usize..][..buf.len()]);
            Ok(())
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.0.lock().unwrap()[offset as usize..][..buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn describe(&self) -> String {
            "memory".into()
        }
    }

    #[test]
    fn a_written_batch_opens_where_it_was_placed_and_a_poisoned_record_never_does() {
        for encrypt in [true, false] {
            let seal = RecordSeal::new(encrypt).unwrap();
            let space = SpaceMap::new(4 * 16384, 16384);
            let dev = Mem(std::sync::Mutex::new(vec![0; 4 * 16384]));
            let mut head = LogHead::default();
            let mut b = Batch::reserved();
            let pages: Vec<Vec<u8>> = (0..6u8).map(|k| vec![k + 1; 1000 + 600 * k as usize]).collect();
            for (k, p) in pages.iter().enumerate() {
                b.push(k as u64, Entry::Empty, p.len(), k == 4).copy_from_slice(p);
            }
            b.write(&mut head, &space, &dev, &seal, false).ok().expect("written");
            for (k, it) in b.items.iter().enumerate() {
                let mut rec = vec![0u8; HEADER + it.len as usize];
                dev.read_at(&mut rec, it.loc).unwrap();
                let opened = seal.open(space.gen(space.seg_of(it.loc)), it.loc, it.index, &mut rec);
                if it.poison {
                    assert!(opened.is_err(), "record {k} was poisoned (encrypt {encrypt})");
                } else {
                    opened.unwrap();
                    assert_eq!(rec[HEADER..], pages[k][..], "record {k} (encrypt {encrypt})");
                }
            }
        }
    }

    #[test]
    fn a_head_packs_records_and_moves_on_when_a_segment_is_full() {
        let space = SpaceMap::new(4 * 16384, 16384);
        let mut h = LogHead::default();
        let (a, _) = h.reserve(&space, 1000, false).unwrap();
        let (b, _) = h.reserve(&space, 1000, false).unwrap();
        assert_eq!((a, b), (0, 1000), "packed back to back");
        let (c, _) = h.reserve(&space, 15000, false).unwrap();
        assert_eq!(c, 16384, "does not straddle segments");
        assert_eq!(space.segments_in_use(), 2);
        h.reserve(&space, 16000, false).unwrap();
        assert!(h.reserve(&space, 16000, false).is_err(), "full but for GC's reserve");
        h.reserve(&space, 16000, true).unwrap();
        assert!(h.reserve(&space, 16000, true).is_err(), "full");
    }
}
