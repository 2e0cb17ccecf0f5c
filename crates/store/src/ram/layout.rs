//! The state file's layout: where each part of a device's RAM state is, and the header that
//! names the layout, its version and the device's geometry, so that a successor knows it can
//! read the file before it touches anything else.
//!
//! ```text
//! page 0            Header (below)
//! journal           journal::RECORDS records of 64 bytes (journal.rs)
//! dictionaries      a page of lengths, then Codec::DICT_VERSIONS places (compress/dict.rs)
//! tier              tier_bytes (0 without one): the backing tier's own part, whose format is
//!                   the tier's (backing/keep.rs); the RAM layer only reserves it and hands it up
//! slots             num_pages x 16 bytes (slot.rs)
//! descriptors       capacity_pages x 20 bytes (zspool/arena.rs)
//! pages             capacity_pages x 4096 bytes (zspool/arena.rs)
//! ```
//! Every part starts on a page boundary; the file is sparse (only what is written costs memory).
//! A change to any part's format, or to this header, is a new `LAYOUT_VERSION`: a successor
//! refuses a version it does not know rather than guess.

use std::sync::atomic::{AtomicU64, Ordering::*};

use crate::compress::dict::DICTS_BYTES;
use crate::journal::{RECORDS, RECORD_BYTES};
use crate::shm::StateMap;
use crate::zspool::{ArenaRegions, ZsPool};
use crate::PAGE_SIZE;

/// The layout this build writes and reads.
/// 2: the tier region (and `tier_bytes` in the header).
pub(crate) const LAYOUT_VERSION: u64 = 2;
const MAGIC: u64 = u64::from_le_bytes(*b"ccstate\0");

/// The header, in page 0. Written once by the creator, `magic` last; read by a successor.
#[repr(C)]
pub(crate) struct Header {
    magic: AtomicU64,
    version: AtomicU64,
    page_size: AtomicU64,
    num_pages: AtomicU64,
    capacity_pages: AtomicU64,
    huge_threshold: AtomicU64,
    /// The primary algorithm, by name (`Algorithm::name`), NUL-padded: pages are encoded by it.
    algorithm: [AtomicU64; 2],
    /// CLOCK_MONOTONIC (ns) at which the access-time clock started (`mover::Clock`).
    clock_origin_ns: AtomicU64,
    /// Processes that took the state over since it was made.
    takeovers: AtomicU64,
    file_len: AtomicU64,
    /// Bytes of the tier region (0: a device without a backing tier whose state is kept).
    tier_bytes: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Header>() <= PAGE_SIZE);

/// Where each part is, in bytes from the start of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub num_pages: u64,
    pub capacity_pages: u32,
    pub journal: usize,
    pub dicts: usize,
    /// The tier region: `tier_bytes` at `tier` (page-aligned; empty when `tier_bytes` is 0).
    pub tier: usize,
    pub tier_bytes: usize,
    pub slots: usize,
    pub arena: ArenaRegions,
    pub file_len: usize,
}

fn page_up(n: usize) -> usize {
    n.next_multiple_of(PAGE_SIZE)
}

impl Layout {
    pub fn new(num_pages: u64, capacity_pages: u32, tier_bytes: usize) -> Layout {
        let journal = PAGE_SIZE;
        let dicts = journal + page_up(RECORDS * RECORD_BYTES);
        let tier = dicts + DICTS_BYTES;
        let slots = tier + page_up(tier_bytes);
        let (desc_bytes, page_bytes) = ZsPool::region_bytes(capacity_pages);
        let descs = slots + page_up(num_pages as usize * 16);
        let pages = descs + page_up(desc_bytes);
        Layout {
            num_pages,
            capacity_pages,
            journal,
            dicts,
            tier,
            tier_bytes,
            slots,
            arena: ArenaRegions { descs_offset: descs, pages_offset: pages },
            file_len: pages + page_bytes,
        }
    }
}

fn algorithm_words(name: &str) -> [u64; 2] {
    let mut b = [0u8; 16];
    let n = name.len().min(16);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    [u64::from_le_bytes(b[..8].try_into().unwrap()), u64::from_le_bytes(b[8..].try_into().unwrap())]
}

fn algorithm_name(words: [u64; 2]) -> String {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&words[0].to_le_bytes());
    b.extend_from_slice(&words[1].to_le_bytes());
    String::from_utf8_lossy(&b).trim_end_matches('\0').to_string()
}

/// The header of a mapped state file.
pub(crate) fn header(map: &StateMap) -> &Header {
    // SAFETY: page 0 of the mapping holds the header (every bit pattern of its atomics is
    // valid); it lives as long as the map.
    unsafe { &*(map.at(0).as_ptr() as *const Header) }
}

/// What a successor needs to match (from its configuration).
pub(crate) struct Expect<'a> {
    pub num_pages: u64,
    pub huge_threshold: usize,
    pub algorithm: &'a str,
}

impl Header {
    /// Writes a new file's header; `magic` last, so a file whose creator died before it is
    /// refused as unreadable.
    pub fn write(&self, l: &Layout, huge_threshold: usize, algorithm: &str, clock_origin_ns: u64) {
        self.version.store(LAYOUT_VERSION, Relaxed);
        self.page_size.store(PAGE_SIZE as u64, Relaxed);
        self.num_pages.store(l.num_pages, Relaxed);
        self.capacity_pages.store(l.capacity_pages as u64, Relaxed);
        self.huge_threshold.store(huge_threshold as u64, Relaxed);
        for (w, v) in self.algorithm.iter().zip(algorithm_words(algorithm)) {
            w.store(v, Relaxed);
        }
        self.clock_origin_ns.store(clock_origin_ns, Relaxed);
        self.takeovers.store(0, Relaxed);
        self.file_len.store(l.file_len as u64, Relaxed);
        self.tier_bytes.store(l.tier_bytes as u64, Relaxed);
        self.magic.store(MAGIC, Release);
    }

    /// Checks a dead process's header against this build and the successor's configuration;
    /// returns the layout, or one line saying what does not match.
    pub fn check(&self, map: &StateMap, want: &Expect<'_>) -> Result<Layout, String> {
        if self.magic.load(Acquire) != MAGIC {
            return Err("the state file has no compcache header (its creator died before writing it, or it is not one)".into());
        }
        let version = self.version.load(Relaxed);
        if version != LAYOUT_VERSION {
            return Err(format!(
                "the state file has layout version {version}, this compcache reads version {LAYOUT_VERSION}: \
                 run the compcache that made it (or one that reads its version)"
            ));
        }
        if self.page_size.load(Relaxed) != PAGE_SIZE as u64 {
            return Err(format!("the state file has {}-byte pages, this compcache {PAGE_SIZE}", self.page_size.load(Relaxed)));
        }
        let num_pages = self.num_pages.load(Relaxed);
        if num_pages != want.num_pages {
            return Err(format!(
                "the state file is of a {} MiB device, the configuration asks for {} MiB: take it over with the size it was made with",
                num_pages.saturating_mul(PAGE_SIZE as u64) >> 20,
                want.num_pages.saturating_mul(PAGE_SIZE as u64) >> 20
            ));
        }
        let algorithm = algorithm_name([self.algorithm[0].load(Relaxed), self.algorithm[1].load(Relaxed)]);
        if algorithm != want.algorithm {
            // The name comes from the file's bytes: escaped, so that the error stays one line.
            return Err(format!(
                "the state file's pages are compressed with {}, the configuration asks for {}",
                algorithm.escape_debug(),
                want.algorithm
            ));
        }
        let huge = self.huge_threshold.load(Relaxed);
        if huge != want.huge_threshold as u64 {
            return Err(format!("the state file's huge threshold is {huge} bytes, the configuration's {}", want.huge_threshold));
        }
        let cap = self.capacity_pages.load(Relaxed);
        let tier = self.tier_bytes.load(Relaxed);
        if tier > map.len() as u64 {
            return Err(format!("the state file's tier region of {tier} bytes is larger than the file: it is damaged"));
        }
        let l = Layout::new(
            num_pages,
            u32::try_from(cap).map_err(|_| format!("the state file's arena of {cap} pages is too large"))?,
            tier as usize,
        );
        if l.file_len as u64 != self.file_len.load(Relaxed) || l.file_len != map.len() {
            return Err(format!(
                "the state file is {} bytes, its header says {} and its geometry {}: it is damaged",
                map.len(),
                self.file_len.load(Relaxed),
                l.file_len
            ));
        }
        Ok(l)
    }

    pub fn clock_origin_ns(&self) -> u64 {
        self.clock_origin_ns.load(Relaxed)
    }

    /// Counts one more takeover; returns the new count.
    pub fn took_over(&self) -> u64 {
        self.takeovers.fetch_add(1, Relaxed) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_page_aligned_and_in_order() {
        let l = Layout::new(1000, 2 * 1000 + 16384, 100);
        let parts = [l.journal, l.dicts, l.tier, l.slots, l.arena.descs_offset, l.arena.pages_offset, l.file_len];
        assert!(parts.windows(2).all(|w| w[0] < w[1]));
        assert!(parts.iter().all(|p| p % PAGE_SIZE == 0));
    }

    #[test]
    fn a_header_is_checked_against_what_the_successor_wants() {
        let l = Layout::new(256, 16384 + 512, 0);
        let map = StateMap::create(l.file_len).unwrap();
        let h = header(&map);
        let want = Expect { num_pages: 256, huge_threshold: 3000, algorithm: "lz4" };
        assert!(h.check(&map, &want).unwrap_err().contains("no compcache header"));
        h.write(&l, 3000, "lz4", 5);
        assert_eq!(h.check(&map, &want).unwrap(), l);
        assert!(h.check(&map, &Expect { algorithm: "zstd", ..want }).unwrap_err().contains("compressed with lz4"));
        assert!(h.check(&map, &Expect { num_pages: 512, ..want }).unwrap_err().contains("1 MiB device"));
        h.version.store(LAYOUT_VERSION + 1, Relaxed);
        assert!(h.check(&map, &want).unwrap_err().contains("layout version 3"));
    }
}
