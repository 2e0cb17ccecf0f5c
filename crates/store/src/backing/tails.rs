//! Where the cold tier's blobs keep their tails (`blocks.rs`): a blob's bytes past its last
//! whole page go into the tail pages, back to back with other blobs' tails, so that a blob
//! costs its length, not its length rounded up to a page (a shared memfd is memory by the
//! page: rounding cost 11-15% on real pages).
//!
//! This is the writer's map of the tail pages, in the heap, never in the state file: how many
//! bytes of live tails each page holds, and where the next tail goes. A successor rebuilds it
//! from the blocks' entries ([`TailMap::rebuild`]), as the backing tier's space map is rebuilt
//! from the slots, so a kill can leave nothing in it to undo.
//!
//! # Rules
//! 1. Only the writer (the holder of `blocks.rs`'s `WriterToken`, which owns the map) places
//!    and frees tails; readers never look at the map.
//! 2. The tail pages are one run of bytes: a tail takes its length rounded up to [`ALIGN`]
//!    bytes at an [`ALIGN`]ed offset (the writer stores whole words), and may run from one
//!    page into the next.
//! 3. Tails are placed at the cursor, which only moves forward while the pages ahead are free:
//!    a run of writes packs its tails with no gap. The rest of the cursor's page is free; at a
//!    page's start (a tail ended on the boundary) the page must be free itself. When the page
//!    a tail needs is in use, the cursor jumps to the start of the lowest free page (the room
//!    left in the page it leaves is a hole until that page empties).
//! 4. A page's live bytes count the parts of tails in it. A page whose count falls to 0 is
//!    free: the caller punches it (it is memory no longer), and if the cursor was in it the
//!    cursor goes back to its start. A page with live tails is resident, and holes in it are
//!    not reused until it empties (no compaction: the cold tier's blocks are rarely rewritten).
//! 5. With no free page for a tail, there is no room: the caller stores the blob whole in its
//!    slot, as before packing.

use std::collections::BTreeSet;

use crate::PAGE_SIZE;

/// A tail's alignment and size granule (rule 2).
pub(crate) const ALIGN: usize = 8;

/// Bytes a tail of `len` bytes takes (rule 2).
pub(crate) fn taken(len: usize) -> usize {
    len.next_multiple_of(ALIGN)
}

/// The writer's map of the tail pages (module docs).
#[derive(Debug)]
pub(crate) struct TailMap {
    /// Pages the area has.
    capacity: usize,
    /// Live bytes of each page below `high`.
    live: Vec<u16>,
    /// Pages below `high` with no live bytes.
    free: BTreeSet<usize>,
    /// Pages at and above `high` were never used (or were punched by a rebuild).
    high: usize,
    /// Where the next tail goes (rule 3), a byte offset in the area.
    cursor: usize,
    /// Pages with live bytes.
    resident: u64,
}

/// A tail claimed by a block in the state file, for [`TailMap::rebuild`]: `len` bytes at byte
/// `offset` of the area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Claim {
    pub offset: usize,
    pub len: usize,
    pub block: usize,
}

/// The pages a freed tail emptied (the caller punches them): at most two.
pub(crate) type Emptied = [Option<usize>; 2];

impl TailMap {
    /// An empty map of an area of `capacity` pages.
    pub fn new(capacity: usize) -> TailMap {
        TailMap { capacity, live: Vec::new(), free: BTreeSet::new(), high: 0, cursor: 0, resident: 0 }
    }

    /// Bytes of the pages holding tails.
    pub fn resident_bytes(&self) -> u64 {
        self.resident * PAGE_SIZE as u64
    }

    fn is_free(&self, p: usize) -> bool {
        p < self.capacity && (p >= self.high || self.free.contains(&p))
    }

    fn live_of(&self, p: usize) -> u16 {
        self.live.get(p).copied().unwrap_or(0)
    }

    /// Adds `n` live bytes to page `p` (taking it from the free pages).
    fn add(&mut self, p: usize, n: usize) {
        if p >= self.high {
            self.live.resize(p + 1, 0);
            self.free.extend(self.high..p);
            self.high = p + 1;
        }
        self.free.remove(&p);
        if self.live[p] == 0 {
            self.resident += 1;
        }
        self.live[p] += n as u16;
    }

    /// A place for a tail of `len` bytes (1..PAGE_SIZE): its byte offset in the area, or `None`
    /// when there is no room (rule 5).
    pub fn alloc(&mut self, len: usize) -> Option<usize> {
        assert!(len > 0 && len < PAGE_SIZE, "a tail is 1 to {} bytes, not {len}", PAGE_SIZE - 1);
        let size = taken(len);
        let (first, last) = (self.cursor / PAGE_SIZE, (self.cursor + size - 1) / PAGE_SIZE);
        // The rest of the cursor's page is the writer's; at a page's start (a tail ended on the
        // boundary) that page is not known to be free.
        let fits = first < self.capacity && (self.cursor % PAGE_SIZE != 0 || self.is_free(first)) && (last == first || self.is_free(last));
        if !fits {
            // Rule 3: the lowest free page, else the next never used; the cursor's page, if
            // nothing was put in it yet, stays free.
            let from = self.free.iter().next().copied();
            let to = match from {
                Some(p) => p,
                None if self.high < self.capacity => self.high,
                None => return None,
            };
            self.cursor = to * PAGE_SIZE;
        }
        let at = self.cursor;
        let first = at / PAGE_SIZE;
        let in_first = size.min(PAGE_SIZE - at % PAGE_SIZE);
        self.add(first, in_first);
        if in_first < size {
            self.add(first + 1, size - in_first);
        }
        self.cursor = at + size;
        Some(at)
    }

    /// Frees the tail of `len` bytes at byte `offset`; the pages it emptied (rule 4).
    pub fn free(&mut self, offset: usize, len: usize) -> Emptied {
        let size = taken(len);
        let first = offset / PAGE_SIZE;
        let in_first = size.min(PAGE_SIZE - offset % PAGE_SIZE);
        let mut emptied = [None, None];
        for (i, (p, n)) in [(first, in_first), (first + 1, size - in_first)].into_iter().enumerate() {
            if n == 0 {
                continue;
            }
            debug_assert!(self.live_of(p) as usize >= n, "freeing {n} bytes of page {p}, which holds {}", self.live_of(p));
            self.live[p] = self.live[p].saturating_sub(n as u16);
            if self.live[p] == 0 {
                self.resident -= 1;
                emptied[i] = Some(p);
                self.free.insert(p);
                if self.cursor / PAGE_SIZE == p {
                    self.cursor = p * PAGE_SIZE;
                }
            }
        }
        emptied
    }

    /// The map of an area of `capacity` pages holding the tails `claims` (a dead writer's, each
    /// checked to lie inside the area). Returns it, the blocks whose tails overlap another's
    /// (their data cannot be vouched for: they hold their bytes still), and the first page
    /// from which no page holds a tail: with the free pages below it (`free_pages`), what the
    /// caller punches, since a cut write may have filled them.
    pub fn rebuild(capacity: usize, mut claims: Vec<Claim>) -> (TailMap, Vec<usize>, usize) {
        claims.sort_unstable();
        let mut m = TailMap::new(capacity);
        let mut overlapping = Vec::new();
        let mut end = 0;
        // The claims before `c` that reach past its start: every one of them overlaps it (not
        // only the one just before: a long tail may hold several shorter ones). Empty or one
        // element in a sound state, where each tail ends at or before the next starts.
        let mut reaching: Vec<Claim> = Vec::new();
        for c in &claims {
            debug_assert!(c.offset % ALIGN == 0 && c.offset + taken(c.len) <= capacity * PAGE_SIZE);
            reaching.retain(|l| l.offset + taken(l.len) > c.offset);
            if !reaching.is_empty() {
                overlapping.extend(reaching.iter().map(|l| l.block));
                overlapping.push(c.block);
            }
            reaching.push(*c);
            let first = c.offset / PAGE_SIZE;
            let in_first = taken(c.len).min(PAGE_SIZE - c.offset % PAGE_SIZE);
            m.add(first, in_first);
            if in_first < taken(c.len) {
                m.add(first + 1, taken(c.len) - in_first);
            }
            end = end.max(c.offset + taken(c.len));
        }
        overlapping.sort_unstable();
        overlapping.dedup();
        // New tails go after the last live one, whose page is the highest in use (or, when it
        // ends a page, the cursor is at the start of the first page past them all).
        m.cursor = end;
        let punch_from = m.high;
        (m, overlapping, punch_from)
    }

    /// The free pages (below the first page no tail reaches).
    pub fn free_pages(&self) -> impl Iterator<Item = usize> + '_ {
        self.free.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_go_back_to_back_across_pages_and_an_empty_page_is_given_back() {
        let mut m = TailMap::new(4);
        assert_eq!(m.alloc(1000), Some(0));
        assert_eq!(m.alloc(1500), Some(1000));
        assert_eq!(m.alloc(1500), Some(2504), "8-byte aligned");
        assert_eq!(m.alloc(2000), Some(4008), "across the page boundary");
        assert_eq!(m.resident_bytes(), 2 * 4096);
        assert_eq!(m.free(1000, 1500), [None, None], "a hole");
        assert_eq!(m.free(0, 1000), [None, None]);
        assert_eq!(m.free(2504, 1500), [None, None], "page 0 still holds the start of the last");
        assert_eq!(m.free(4008, 2000), [Some(0), Some(1)], "both emptied");
        assert_eq!(m.resident_bytes(), 0);
        assert_eq!(m.alloc(100), Some(4096), "the cursor went back to the start of its page");
        assert_eq!(m.alloc(4090), Some(4200), "on into page 2");
        assert_eq!(m.alloc(4000), Some(8296));
        assert_eq!(m.alloc(3000), Some(12296));
        assert_eq!(m.alloc(2000), Some(0), "page 3 is the last: the lowest free page");
    }

    #[test]
    fn a_page_in_use_ahead_makes_the_cursor_jump_and_a_full_area_says_so() {
        let mut m = TailMap::new(3);
        let a = m.alloc(4000).unwrap(); // page 0
        let b = m.alloc(4000).unwrap(); // pages 0-1
        let c = m.alloc(4000).unwrap(); // pages 1-2
        assert_eq!((a, b, c), (0, 4000, 8000));
        assert_eq!(m.free(a, 4000), [None, None], "page 0 still has b's start");
        assert_eq!(m.free(b, 4000), [Some(0), None], "page 1 still has c's start");
        // The cursor (in page 2) cannot run into page 3: there is none. Page 0 is free.
        assert_eq!(m.alloc(4000), Some(0));
        assert_eq!(m.alloc(100), None, "page 1 is in use ahead, no page is free");
    }

    #[test]
    fn a_cursor_on_a_page_boundary_never_writes_into_a_page_in_use() {
        let mut m = TailMap::new(3);
        let (a, b, c) = (m.alloc(4000).unwrap(), m.alloc(4000).unwrap(), m.alloc(4000).unwrap());
        assert_eq!(c, 8000, "c holds the end of page 1");
        m.free(a, 4000);
        m.free(b, 4000);
        assert_eq!(m.alloc(4000), Some(0), "page 0, the one free page");
        assert_eq!(m.alloc(96), Some(4000), "page 0 filled to its end: the cursor at page 1's start");
        assert_eq!(m.alloc(8), None, "page 1 holds c: not written, and no page is free");
        m.free(c, 4000);
        assert_eq!(m.alloc(8), Some(4096), "page 1 free again");
    }

    #[test]
    fn a_rebuild_counts_what_the_claims_take_and_finds_the_free_pages() {
        let claims = vec![
            Claim { offset: 3 * 4096 + 8, len: 100, block: 7 },
            Claim { offset: 4000, len: 500, block: 3 },         // pages 0 and 1
            Claim { offset: 3 * 4096 + 96, len: 50, block: 9 }, // overlaps block 7's (104 bytes)
        ];
        let (mut m, overlapping, punch_from) = TailMap::rebuild(8, claims);
        assert_eq!(overlapping, vec![7, 9]);
        assert_eq!(punch_from, 4, "page 3 holds the last tail and the cursor");
        assert_eq!(m.free_pages().collect::<Vec<_>>(), vec![2], "page 2 held only a cut write's");
        assert_eq!(m.resident_bytes(), 3 * 4096);
        assert_eq!(m.alloc(8), Some(3 * 4096 + 152), "after the last live tail");
        assert_eq!(m.alloc(4000), Some(3 * 4096 + 160), "on into page 4");
        let (m, _, punch_from) = TailMap::rebuild(8, vec![Claim { offset: 4096 - 8, len: 8, block: 1 }]);
        assert_eq!((punch_from, m.resident_bytes()), (1, 4096), "the cursor at a page's start: that page is free");
        let (m, _, punch_from) = TailMap::rebuild(8, Vec::new());
        assert_eq!((punch_from, m.resident_bytes(), m.free_pages().count()), (0, 0, 0));
    }

    #[test]
    fn a_rebuild_finds_every_tail_a_long_one_holds_not_only_the_next() {
        // Block 1's tail holds blocks 2's and 3's (forged entries: a sound state has none of
        // this); 2 and 3 do not overlap each other; block 4's lies after all of them.
        let claims = vec![
            Claim { offset: 0, len: 1000, block: 1 },
            Claim { offset: 104, len: 96, block: 2 },
            Claim { offset: 304, len: 96, block: 3 },
            Claim { offset: 1000, len: 8, block: 4 },
        ];
        let (_, overlapping, _) = TailMap::rebuild(4, claims);
        assert_eq!(overlapping, vec![1, 2, 3], "every block whose tail overlaps another's, and only those");
        let back_to_back = vec![Claim { offset: 0, len: 100, block: 1 }, Claim { offset: 104, len: 8, block: 2 }];
        assert!(TailMap::rebuild(4, back_to_back).1.is_empty(), "tails that only touch do not overlap");
    }
}
