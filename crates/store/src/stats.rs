//! Statistics: a fixed set of counters with the kernel's names and units, so that compcache's
//! figures line up with zram's `mm_stat`, `io_stat` and `bd_stat`, plus the original ramzswap
//! fields (`/proc/ramzswap`, see shared/seeds/004) where zram has no twin.
//!
//! All counters are `AtomicU64` updated with `Relaxed` ordering: they order nothing, they only
//! count. Each counter is exact at every moment (updated in the same operation that changes
//! what it counts); a [`Stats`] snapshot reads them one after another, so two counters in one
//! snapshot may straddle a concurrent request.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::compress::dict::DictsSummary;
use crate::compress::Codec;
use crate::PAGE;

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
    // Cache mode (`cache/`); zero without an origin.
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub cache_inserts: AtomicU64,
    pub cache_evictions: AtomicU64,
    pub origin_reads: AtomicU64,
    pub origin_read_bytes: AtomicU64,
    pub origin_writes: AtomicU64,
    pub origin_write_bytes: AtomicU64,
    /// Origin syncs (fdatasync) that succeeded: FLUSH, and the flush half of FUA.
    pub origin_syncs: AtomicU64,
    pub origin_errors: AtomicU64,
    pub readahead_pages: AtomicU64,
    pub readahead_used: AtomicU64,
    pub readahead_wasted: AtomicU64,
    /// Pages (RAM and backing device) encoded by each codec, and their stored bytes, indexed
    /// by `Codec::index` (raw and same-filled pages excluded). A dictionary codec's count is
    /// what keeps that dictionary alive (`compress/dict.rs`).
    pub codec_pages: [AtomicU64; Codec::COUNT],
    pub codec_bytes: [AtomicU64; Codec::COUNT],
}

/// The backing tier's own counters (in `Backing`, which exists only with a device).
#[derive(Default, Debug)]
pub(crate) struct BackingCounters {
    pub overflow_pages: AtomicU64,
    pub writeback_pages: AtomicU64,
    /// Payload bytes written by writeback (what the writeback limit counts: `backing/tuning.rs`).
    pub writeback_bytes: AtomicU64,
    pub gc_pages: AtomicU64,
    pub promoted_pages: AtomicU64,
    pub errors: AtomicU64,
}

/// Recompression's own counters (in its `Recompressor`, which exists only when it is on) (statistics `recompress_*`, `dict_*`).
#[derive(Default, Debug)]
pub(crate) struct RecompressCounters {
    /// Pages re-encoded and installed.
    pub done: AtomicU64,
    /// Pages re-encoded and kept as they were (did not save enough).
    pub rejected: AtomicU64,
    /// Pages rewritten (or moved) while being re-encoded: the result was dropped.
    pub raced: AtomicU64,
    /// Bytes saved by installs (old stored size minus new), summed.
    pub saved_bytes: AtomicU64,
    /// CPU time spent in steps, ns (this thread's clock).
    pub cpu_ns: AtomicU64,
    /// Steps skipped because the device was busy.
    pub busy_skips: AtomicU64,
    /// Dictionaries installed (trained or given).
    pub dicts_installed: AtomicU64,
    /// Dictionaries trained but not installed (too little gain, or training failed).
    pub dicts_refused: AtomicU64,
    /// The current dictionary's version (0: none) and its gain at training (per mille), and the
    /// gain measured since (per mille, over the drift window; 0 until measured).
    pub dict_version: AtomicU64,
    pub dict_gain_permille: AtomicU64,
    pub dict_measured_permille: AtomicU64,
}

/// What a snapshot reads besides the counters: the pool's, the slot table's and the backing
/// tier's own figures, gathered by `Store::stats`.
pub(crate) struct Gauges<'a> {
    pub disksize: u64,
    pub comp_algorithm: &'a str,
    pub mem_limit: u64,
    pub pool_pages: u64,
    pub pool_max_pages: u64,
    pub pages_compacted: u64,
    pub reserve_free_pages: u64,
    pub slot_table_bytes: u64,
    pub backing: Option<BackingGauges<'a>>,
    pub recompress: Option<RecompressGauges<'a>>,
}

/// Recompression's part of [`Gauges`].
pub(crate) struct RecompressGauges<'a> {
    pub counters: &'a RecompressCounters,
    pub dicts: DictsSummary,
}

/// The backing tier's part of [`Gauges`].
pub(crate) struct BackingGauges<'a> {
    pub counters: &'a BackingCounters,
    /// Usable bytes (whole segments).
    pub size_bytes: u64,
    /// Bytes in segments in use.
    pub space_bytes: u64,
    /// RAM the device holds (the cold tier's; 0 for a file).
    pub mem_bytes: u64,
}

impl Counters {
    /// A [`Stats`] snapshot of these counters and `gauges`.
    pub fn snapshot(&self, gauges: Gauges<'_>) -> Stats {
        let c = self;
        let g = Counters::get;
        let pages_stored_all = g(&c.pages_stored);
        let same = g(&c.same_pages);
        let stored = pages_stored_all - same.min(pages_stored_all);
        let pct = |n: u64| (n * 100).checked_div(stored).unwrap_or(0);
        let used = gauges.pool_pages;
        let bd_bytes = g(&c.bd_bytes);
        let (bd_size_bytes, bd_space_bytes) = gauges.backing.as_ref().map_or((0, 0), |b| (b.size_bytes, b.space_bytes));
        let bd_mem_bytes = gauges.backing.as_ref().map_or(0, |b| b.mem_bytes);
        let bd = gauges.backing.as_ref().map(|b| b.counters);
        let bdc = |f: fn(&BackingCounters) -> &AtomicU64| bd.map_or(0, |c| g(f(c)));
        let rc = gauges.recompress.as_ref().map(|r| r.counters);
        let rcc = |f: fn(&RecompressCounters) -> &AtomicU64| rc.map_or(0, |c| g(f(c)));
        let dicts = gauges.recompress.as_ref().map_or(DictsSummary::default(), |r| r.dicts);
        let codec_sum = |f: fn(&Counters) -> &[AtomicU64; Codec::COUNT], from: usize| f(c)[from..].iter().map(g).sum::<u64>();
        Stats {
            disksize: gauges.disksize,
            comp_algorithm: gauges.comp_algorithm.to_string(),
            orig_data_size: pages_stored_all * PAGE,
            compr_data_size: g(&c.compr_data_size),
            mem_used_total: used * PAGE + bd_mem_bytes,
            mem_limit: gauges.mem_limit,
            mem_used_max: gauges.pool_max_pages * PAGE,
            same_pages: same,
            pages_compacted: gauges.pages_compacted,
            huge_pages: g(&c.huge_pages),
            huge_pages_since: g(&c.huge_pages_since),
            failed_reads: g(&c.failed_reads),
            failed_writes: g(&c.failed_writes),
            invalid_io: g(&c.invalid_io),
            notify_free: g(&c.notify_free),
            bd_count: g(&c.bd_count),
            bd_reads: g(&c.bd_reads),
            bd_writes: g(&c.bd_writes),
            bd_bytes,
            bd_size_bytes,
            bd_space_bytes,
            bd_efficiency_pct: (bd_bytes * 100).checked_div(bd_space_bytes).unwrap_or(0),
            bd_mem_bytes,
            bd_overflow_pages: bdc(|c| &c.overflow_pages),
            bd_writeback_pages: bdc(|c| &c.writeback_pages),
            bd_gc_pages: bdc(|c| &c.gc_pages),
            bd_promoted_pages: bdc(|c| &c.promoted_pages),
            bd_errors: bdc(|c| &c.errors),
            cache_hits: g(&c.cache_hits),
            cache_misses: g(&c.cache_misses),
            cache_inserts: g(&c.cache_inserts),
            cache_evictions: g(&c.cache_evictions),
            origin_reads: g(&c.origin_reads),
            origin_read_bytes: g(&c.origin_read_bytes),
            origin_writes: g(&c.origin_writes),
            origin_write_bytes: g(&c.origin_write_bytes),
            origin_syncs: g(&c.origin_syncs),
            origin_errors: g(&c.origin_errors),
            readahead_pages: g(&c.readahead_pages),
            readahead_used: g(&c.readahead_used),
            readahead_wasted: g(&c.readahead_wasted),
            recomp_pages: codec_sum(|c| &c.codec_pages, Codec::STRONG.index()),
            recomp_bytes: codec_sum(|c| &c.codec_bytes, Codec::STRONG.index()),
            recomp_dict_pages: codec_sum(|c| &c.codec_pages, Codec::with_dict(0).index()),
            recomp_dict_bytes: codec_sum(|c| &c.codec_bytes, Codec::with_dict(0).index()),
            recompress_done: rcc(|c| &c.done),
            recompress_rejected: rcc(|c| &c.rejected),
            recompress_raced: rcc(|c| &c.raced),
            recompress_saved_bytes: rcc(|c| &c.saved_bytes),
            recompress_cpu_ms: rcc(|c| &c.cpu_ns) / 1_000_000,
            recompress_busy_skips: rcc(|c| &c.busy_skips),
            dict_version: rcc(|c| &c.dict_version),
            dict_gain_permille: rcc(|c| &c.dict_gain_permille),
            dict_measured_permille: rcc(|c| &c.dict_measured_permille),
            dicts_installed: rcc(|c| &c.dicts_installed),
            dicts_refused: rcc(|c| &c.dicts_refused),
            dicts_live: dicts.live,
            dicts_bytes: dicts.bytes,
            num_reads: g(&c.num_reads),
            num_writes: g(&c.num_writes),
            pages_stored: stored,
            pages_used: used,
            good_compress_pct: pct(g(&c.good_compress)),
            no_compress_pct: pct(g(&c.huge_pages)),
            slot_table_bytes: gauges.slot_table_bytes,
            mem_reserve_free: gauges.reserve_free_pages * PAGE,
        }
    }

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
/// each field's unit is in [`UNITS`]. It travels as JSON (the control socket's `stat`); a
/// reader fills fields an older server did not send with 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
    /// Memory the allocator holds for compressed data, bytes (pool pages * 4096), and with a
    /// cold tier the RAM it holds (`bd_mem_bytes`).
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
    /// RAM the cold tier holds (its compressed blocks, their table and its dictionary),
    /// included in `mem_used_total`; 0 with a backing file or device.
    pub bd_mem_bytes: u64,
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

    // --- cache mode (an origin behind the store, `docs/cache.md`); all zero without one. The
    // hit ratio is `cache_hits / (cache_hits + cache_misses)` ([`Stats::cache_hit_ratio`]).
    /// Pages read from the cache (zcache's `succ_gets`).
    pub cache_hits: u64,
    /// Pages a read did not find in the cache and read from the origin (zcache's `failed_gets`).
    pub cache_misses: u64,
    /// Pages put into the cache: read misses, readahead, and writes (zcache's `puts`).
    pub cache_inserts: u64,
    /// Clean pages the eviction policy dropped to stay within the memory budget.
    pub cache_evictions: u64,
    /// Reads sent to the origin (each a run of pages).
    pub origin_reads: u64,
    /// Bytes read from the origin.
    pub origin_read_bytes: u64,
    /// Writes sent to the origin (each a run of pages).
    pub origin_writes: u64,
    /// Bytes written to the origin (zeroing and discards excluded).
    pub origin_write_bytes: u64,
    /// Syncs of the origin (fdatasync) that succeeded: FLUSH, and the flush half of a write,
    /// write-zeroes or discard with FUA. A failed sync counts in `origin_errors` instead.
    pub origin_syncs: u64,
    /// Origin operations that failed (read, write, discard, zeroing, sync).
    pub origin_errors: u64,
    /// Pages read ahead of a sequential reader and cached.
    pub readahead_pages: u64,
    /// Read-ahead pages that a later read hit.
    pub readahead_used: u64,
    /// Read-ahead pages evicted or dropped before any read hit them.
    pub readahead_wasted: u64,

    // --- recompression (`docs/store.md`, "Recompression"); all zero when it is off
    /// Pages (in RAM or on the backing device) encoded by the recompression codec, with or
    /// without a dictionary; the rest of the compressed pages use `comp_algorithm`.
    pub recomp_pages: u64,
    /// Their stored bytes (included in `compr_data_size` for those in RAM).
    pub recomp_bytes: u64,
    /// Of `recomp_pages`, those encoded with a dictionary, and their bytes.
    pub recomp_dict_pages: u64,
    pub recomp_dict_bytes: u64,
    /// Pages recompressed and installed since the device was created.
    pub recompress_done: u64,
    /// Pages recompressed but kept as they were (they did not save the threshold).
    pub recompress_rejected: u64,
    /// Pages rewritten or moved while being recompressed (the result was dropped).
    pub recompress_raced: u64,
    /// Bytes saved by recompression (stored size before minus after), summed over installs.
    pub recompress_saved_bytes: u64,
    /// CPU time recompression and dictionary training used.
    pub recompress_cpu_ms: u64,
    /// Recompression steps skipped because the device was busy.
    pub recompress_busy_skips: u64,
    /// The dictionary version new recompressions use (0: none).
    pub dict_version: u64,
    /// Its gain when it was made: bytes saved per 1000 against the same codec without it, on
    /// pages it was not trained on.
    pub dict_gain_permille: u64,
    /// Its gain measured since, on pages recompressed with it (0 until measured); a new
    /// dictionary is trained when this falls under half of `dict_gain_permille`.
    pub dict_measured_permille: u64,
    /// Dictionaries installed (trained or given) and trained but refused (too little gain).
    pub dicts_installed: u64,
    pub dicts_refused: u64,
    /// Dictionary versions held now (used by pages, or current), and their bytes.
    pub dicts_live: u64,
    pub dicts_bytes: u64,

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

/// The unit of a [`Stats`] field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Pages,
    Requests,
    Percent,
    /// Parts per thousand.
    Permille,
    Milliseconds,
    /// A plain count or number (a version).
    Number,
    /// A name (the algorithm).
    Text,
}

impl Unit {
    /// How the unit is printed after a value ("" for text).
    pub fn label(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Pages => "pages",
            Unit::Requests => "requests",
            Unit::Percent => "%",
            Unit::Permille => "‰",
            Unit::Milliseconds => "ms",
            Unit::Number | Unit::Text => "",
        }
    }
}

/// Every field of [`Stats`] with its unit, in the struct's order (the order to print them in).
/// A test checks that it names every field once, and nothing else.
pub const UNITS: &[(&str, Unit)] = &[
    ("disksize", Unit::Bytes),
    ("comp_algorithm", Unit::Text),
    ("orig_data_size", Unit::Bytes),
    ("compr_data_size", Unit::Bytes),
    ("mem_used_total", Unit::Bytes),
    ("mem_limit", Unit::Bytes),
    ("mem_used_max", Unit::Bytes),
    ("same_pages", Unit::Pages),
    ("pages_compacted", Unit::Pages),
    ("huge_pages", Unit::Pages),
    ("huge_pages_since", Unit::Pages),
    ("failed_reads", Unit::Requests),
    ("failed_writes", Unit::Requests),
    ("invalid_io", Unit::Requests),
    ("notify_free", Unit::Pages),
    ("bd_count", Unit::Pages),
    ("bd_reads", Unit::Pages),
    ("bd_writes", Unit::Pages),
    ("bd_bytes", Unit::Bytes),
    ("bd_size_bytes", Unit::Bytes),
    ("bd_space_bytes", Unit::Bytes),
    ("bd_efficiency_pct", Unit::Percent),
    ("bd_mem_bytes", Unit::Bytes),
    ("bd_overflow_pages", Unit::Pages),
    ("bd_writeback_pages", Unit::Pages),
    ("bd_gc_pages", Unit::Pages),
    ("bd_promoted_pages", Unit::Pages),
    ("bd_errors", Unit::Requests),
    ("cache_hits", Unit::Pages),
    ("cache_misses", Unit::Pages),
    ("cache_inserts", Unit::Pages),
    ("cache_evictions", Unit::Pages),
    ("origin_reads", Unit::Requests),
    ("origin_read_bytes", Unit::Bytes),
    ("origin_writes", Unit::Requests),
    ("origin_write_bytes", Unit::Bytes),
    ("origin_syncs", Unit::Requests),
    ("origin_errors", Unit::Requests),
    ("readahead_pages", Unit::Pages),
    ("readahead_used", Unit::Pages),
    ("readahead_wasted", Unit::Pages),
    ("recomp_pages", Unit::Pages),
    ("recomp_bytes", Unit::Bytes),
    ("recomp_dict_pages", Unit::Pages),
    ("recomp_dict_bytes", Unit::Bytes),
    ("recompress_done", Unit::Pages),
    ("recompress_rejected", Unit::Pages),
    ("recompress_raced", Unit::Pages),
    ("recompress_saved_bytes", Unit::Bytes),
    ("recompress_cpu_ms", Unit::Milliseconds),
    ("recompress_busy_skips", Unit::Number),
    ("dict_version", Unit::Number),
    ("dict_gain_permille", Unit::Permille),
    ("dict_measured_permille", Unit::Permille),
    ("dicts_installed", Unit::Number),
    ("dicts_refused", Unit::Number),
    ("dicts_live", Unit::Number),
    ("dicts_bytes", Unit::Bytes),
    ("num_reads", Unit::Pages),
    ("num_writes", Unit::Pages),
    ("pages_stored", Unit::Pages),
    ("pages_used", Unit::Pages),
    ("good_compress_pct", Unit::Percent),
    ("no_compress_pct", Unit::Percent),
    ("slot_table_bytes", Unit::Bytes),
    ("mem_reserve_free", Unit::Bytes),
];

/// The unit of the field `name`, if it is one of [`Stats`]'s.
pub fn unit_of(name: &str) -> Option<Unit> {
    UNITS.iter().find(|(n, _)| *n == name).map(|&(_, u)| u)
}

/// The figures a one-line summary shows (zramctl's columns), from [`Stats::summary`]: the one
/// place that says what "ratio" means.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub algorithm: String,
    pub disksize: u64,
    /// zramctl's DATA: `orig_data_size`.
    pub data_bytes: u64,
    /// zramctl's COMPR: `compr_data_size`.
    pub compr_bytes: u64,
    /// zramctl's TOTAL: `mem_used_total`, what the data really costs in memory.
    pub total_bytes: u64,
    pub mem_used_max: u64,
    /// 0: no limit.
    pub mem_limit: u64,
    pub same_pages: u64,
    pub huge_pages: u64,
    /// `orig_data_size / mem_used_total`, as users of zram's `mm_stat` compute it (the memory
    /// saved, allocator overhead included); `None` while nothing is in memory.
    pub ratio: Option<f64>,
}

impl Stats {
    /// The summary line's figures.
    pub fn summary(&self) -> Summary {
        Summary {
            algorithm: self.comp_algorithm.clone(),
            disksize: self.disksize,
            data_bytes: self.orig_data_size,
            compr_bytes: self.compr_data_size,
            total_bytes: self.mem_used_total,
            mem_used_max: self.mem_used_max,
            mem_limit: self.mem_limit,
            same_pages: self.same_pages,
            huge_pages: self.huge_pages,
            ratio: (self.mem_used_total > 0).then(|| self.orig_data_size as f64 / self.mem_used_total as f64),
        }
    }

    /// Cache mode: the share of pages read that the cache served, `cache_hits / (cache_hits +
    /// cache_misses)`; `None` before the first read (and without an origin).
    pub fn cache_hit_ratio(&self) -> Option<f64> {
        let total = self.cache_hits + self.cache_misses;
        (total > 0).then(|| self.cache_hits as f64 / total as f64)
    }

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
            ("OrigDataSize", format!("{:>8} kB", kb(self.pages_stored * PAGE))),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_table_names_every_field_once() {
        let json = serde_json::to_value(Stats::default()).unwrap();
        let mut fields: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        let mut table: Vec<&str> = UNITS.iter().map(|(n, _)| *n).collect();
        fields.sort_unstable();
        table.sort_unstable();
        assert_eq!(table, fields);
    }

    #[test]
    fn the_ratio_is_orig_data_size_over_mem_used_total() {
        let s = Stats { orig_data_size: 8 << 20, compr_data_size: 2 << 20, mem_used_total: 4 << 20, ..Stats::default() };
        assert_eq!(s.summary().ratio, Some(2.0));
        assert_eq!(Stats::default().summary().ratio, None);
    }

    #[test]
    fn the_hit_ratio_is_hits_over_pages_read() {
        let s = Stats { cache_hits: 3, cache_misses: 1, ..Stats::default() };
        assert_eq!(s.cache_hit_ratio(), Some(0.75));
        assert_eq!(Stats::default().cache_hit_ratio(), None);
    }

    #[test]
    fn a_snapshot_from_an_older_server_reads_with_zeroes() {
        let s: Stats = serde_json::from_str(r#"{"disksize": 4096, "comp_algorithm": "lz4"}"#).unwrap();
        assert_eq!((s.disksize, s.comp_algorithm.as_str(), s.bd_errors), (4096, "lz4", 0));
    }
}
