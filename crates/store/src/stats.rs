//! Statistics: a fixed set of counters with the kernel's names and units, so that compcache's
//! figures line up with zram's `mm_stat`, `io_stat` and `bd_stat`, plus the original ramzswap
//! fields (`/proc/ramzswap`, see shared/seeds/004) where zram has no twin.
//!
//! All counters are `AtomicU64` updated with `Relaxed` ordering: they order nothing, they only
//! count. Each counter is exact at every moment (updated in the same operation that changes
//! what it counts); a [`Stats`] snapshot reads them one after another, so two counters in one
//! snapshot may straddle a concurrent request.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters, owned by the store.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub num_reads: AtomicU64,
    pub num_writes: AtomicU64,
    pub failed_reads: AtomicU64,
    pub failed_writes: AtomicU64,
    pub invalid_io: AtomicU64,
    pub notify_free: AtomicU64,
    /// Slots holding data of any kind (same-filled included), as zram's `pages_stored`.
    pub pages_stored: AtomicU64,
    pub same_pages: AtomicU64,
    pub huge_pages: AtomicU64,
    pub huge_pages_since: AtomicU64,
    /// Stored compressed pages whose compressed size is at most half a page (ramzswap).
    pub good_compress: AtomicU64,
    /// Sum of the stored sizes of compressed and huge pages, in bytes.
    pub compr_data_size: AtomicU64,
    /// Slots whose page is on the backing device.
    pub bd_count: AtomicU64,
    /// Pages read from / written to the backing device for requests, overflow and writeback.
    pub bd_reads: AtomicU64,
    pub bd_writes: AtomicU64,
    pub bd_bytes: AtomicU64,
}

impl Counters {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
    pub fn sub(c: &AtomicU64, n: u64) {
        c.fetch_sub(n, Relaxed);
    }
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }
}

/// A snapshot of a device's statistics. Field names are the kernel's (zram) where one exists;
/// sizes are in bytes, counts in pages or requests as named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    // --- device
    /// Device size in bytes.
    pub disksize: u64,
    /// Compression algorithm name.
    pub comp_algorithm: String,

    // --- mm_stat (zram column order)
    /// Uncompressed size of all stored data, bytes (pages_stored * 4096, same pages included).
    pub orig_data_size: u64,
    /// Compressed size of stored data, bytes (huge pages count 4096; same pages count 0).
    pub compr_data_size: u64,
    /// Memory the allocator holds for compressed data, bytes (pool pages * 4096).
    pub mem_used_total: u64,
    /// The memory limit in bytes; 0 means none.
    pub mem_limit: u64,
    /// The highest `mem_used_total` seen, bytes.
    pub mem_used_max: u64,
    /// Pages stored as a fill word, without allocation.
    pub same_pages: u64,
    /// Pool pages freed by compaction since the device was created.
    pub pages_compacted: u64,
    /// Pages stored raw because they did not compress below the huge threshold.
    pub huge_pages: u64,
    /// Huge pages stored since the device was created.
    pub huge_pages_since: u64,

    // --- io_stat
    pub failed_reads: u64,
    pub failed_writes: u64,
    pub invalid_io: u64,
    /// Pages freed by discard / trim / write-zeroes (swap-free-notify).
    pub notify_free: u64,

    // --- bd_stat (pages) and backing-device bytes
    /// Pages currently on the backing device.
    pub bd_count: u64,
    /// Pages read from the backing device.
    pub bd_reads: u64,
    /// Pages written to the backing device.
    pub bd_writes: u64,
    /// Bytes of compressed data currently on the backing device (record headers excluded).
    pub bd_bytes: u64,
    /// Usable bytes of the backing device (whole segments); 0 without one.
    pub bd_size_bytes: u64,
    /// Bytes of the backing device in segments that are in use (open or holding records):
    /// the space the backing file occupies, holes from dead records included.
    pub bd_space_bytes: u64,
    /// The backing file's space efficiency: `bd_bytes * 100 / bd_space_bytes` (GC keeps it up).
    pub bd_efficiency_pct: u64,
    /// Pages sent to the backing device by the write path (memory limit reached, or
    /// incompressible with `--backing-incompressible`). Included in `bd_writes`.
    pub bd_overflow_pages: u64,
    /// Pages moved to the backing device by writeback (cold pages). Included in `bd_writes`.
    pub bd_writeback_pages: u64,
    /// Pages rewritten on the backing device by GC (not included in `bd_writes`).
    pub bd_gc_pages: u64,
    /// Pages brought back from the backing device into RAM because they were read again soon.
    pub bd_promoted_pages: u64,
    /// Failed backing device operations (I/O errors, device full, checksum failures).
    pub bd_errors: u64,

    // --- request counters (the block layer's `stat`), in pages
    pub num_reads: u64,
    pub num_writes: u64,

    // --- ramzswap names with no zram twin
    /// Pages stored compressed or raw (same-filled pages excluded), ramzswap's `PagesStored`.
    pub pages_stored: u64,
    /// Pages the allocator holds (`mem_used_total / 4096`), ramzswap's `PagesUsed`.
    pub pages_used: u64,
    /// Percent of stored pages that compressed to at most half a page, ramzswap's `GoodCompress`.
    pub good_compress_pct: u64,
    /// Percent of stored pages kept uncompressed, ramzswap's `NoCompress`.
    pub no_compress_pct: u64,
    /// Bytes of slot metadata (the slot table), not included in `mem_used_total`, as in zram.
    pub slot_table_bytes: u64,
    /// Bytes of free pool memory kept resident for the I/O path (a swap server's reserve,
    /// `Store::prefault`, or pages freed under mlock); not included in `mem_used_total`.
    pub mem_reserve_free: u64,
}

impl Stats {
    /// zram's `mm_stat` line, same columns and units.
    pub fn mm_stat_line(&self) -> String {
        format!(
            "{:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            self.orig_data_size,
            self.compr_data_size,
            self.mem_used_total,
            self.mem_limit,
            self.mem_used_max,
            self.same_pages,
            self.pages_compacted,
            self.huge_pages,
            self.huge_pages_since
        )
    }

    /// zram's `io_stat` line.
    pub fn io_stat_line(&self) -> String {
        format!("{:>8} {:>8} {:>8} {:>8}", self.failed_reads, self.failed_writes, self.invalid_io, self.notify_free)
    }

    /// zram's `bd_stat` line (pages).
    pub fn bd_stat_line(&self) -> String {
        format!("{:>8} {:>8} {:>8}", self.bd_count, self.bd_reads, self.bd_writes)
    }

    /// The `/proc/ramzswap` view of the seed documents, fields and units as ramzswap printed them.
    pub fn ramzswap_text(&self) -> String {
        let kb = |b: u64| b / 1024;
        let zero_pages = self.same_pages;
        let lines = [
            ("DiskSize", format!("{:>8} kB", kb(self.disksize))),
            ("MemLimit", format!("{:>8} kB", kb(self.mem_limit))),
            ("NumReads", format!("{:>8}", self.num_reads)),
            ("NumWrites", format!("{:>8}", self.num_writes)),
            ("FailedReads", format!("{:>8}", self.failed_reads)),
            ("FailedWrites", format!("{:>8}", self.failed_writes)),
            ("InvalidIO", format!("{:>8}", self.invalid_io)),
            ("NotifyFree", format!("{:>8}", self.notify_free)),
            ("ZeroPages", format!("{:>8}", zero_pages)),
            ("GoodCompress", format!("{:>8} %", self.good_compress_pct)),
            ("NoCompress", format!("{:>8} %", self.no_compress_pct)),
            ("PagesStored", format!("{:>8}", self.pages_stored)),
            ("PagesUsed", format!("{:>8}", self.pages_used)),
            ("OrigDataSize", format!("{:>8} kB", kb(self.pages_stored * crate::PAGE_SIZE as u64))),
            ("ComprDataSize", format!("{:>8} kB", kb(self.compr_data_size))),
            ("MemUsedTotal", format!("{:>8} kB", kb(self.mem_used_total))),
            ("BDevNumReads", format!("{:>8}", self.bd_reads)),
            ("BDevNumWrites", format!("{:>8}", self.bd_writes)),
        ];
        // With a backing device, what is on it (compcache's own lines, after ramzswap's).
        let backing = [
            ("BDevPages", format!("{:>8}", self.bd_count)),
            ("BDevDataSize", format!("{:>8} kB", kb(self.bd_bytes))),
            ("BDevSpace", format!("{:>8} kB", kb(self.bd_space_bytes))),
            ("BDevEfficiency", format!("{:>8} %", self.bd_efficiency_pct)),
        ];
        let backing = if self.bd_size_bytes > 0 { &backing[..] } else { &[] };
        lines.iter().chain(backing).map(|(k, v)| format!("{:<14}{v}\n", format!("{k}:"))).collect()
    }
}
