//! Device configuration. The sizes and durations users type are parsed in `units.rs`.
//!
//! The default device size is 25% of physical RAM, as in ramzswap and Ubuntu's compcache
//! set-up; the seed benchmarks (shared/seeds/001 and 002) found 25-50% sound.

use crate::compress::Algorithm;
use crate::error::StoreError;
use crate::{PAGE, PAGE_SIZE};

/// Bytes per compressed block of the cold tier (`backing/memdev.rs`, which calls it
/// `BLOCK_BYTES`): its segment size is a multiple of it.
pub const COLD_BLOCK_BYTES: u64 = 64 << 10;

/// The rule writeback's watermarks follow, in the configuration and in every change
/// (`backing/tuning.rs`).
pub(crate) fn check_watermarks(high: u8, low: u8) -> Result<(), String> {
    if !(1..=100).contains(&high) || low >= high {
        return Err(format!("writeback watermarks high {high}% low {low}%: need 0 <= low < high <= 100"));
    }
    Ok(())
}

/// The default huge threshold: compressed pages larger than this are stored raw ("huge
/// pages"). It is the largest size the allocator stores more densely than a raw page
/// (`zspool::huge_payload_threshold`, 3628 bytes): beyond it, keeping the compressed copy saves
/// no memory and costs a decompression on every read.
pub fn default_huge_threshold_bytes() -> usize {
    crate::zspool::huge_payload_threshold()
}

/// The default device size as a share of physical RAM.
pub const DEFAULT_SIZE_PERCENT: u64 = 25;

/// Everything needed to create a [`crate::Store`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Device size in bytes; rounded down to whole pages.
    pub disksize_bytes: u64,
    /// Compression algorithm.
    pub algorithm: Algorithm,
    /// Compression level; `None` is the algorithm's default. lz4 ignores it.
    pub level: Option<i32>,
    /// Upper bound on pool memory (`mem_used_total`) in bytes; 0 means no limit (zram's convention).
    pub mem_limit_bytes: u64,
    /// Compressed sizes above this are stored raw.
    pub huge_threshold_bytes: usize,
    /// The backing device (the backing tier); `None`: RAM only, writes beyond `mem_limit` fail.
    pub backing: Option<BackingConfig>,
    /// Cache mode: the origin this store caches (`cache/`); `None`: a RAM device (swap mode).
    /// In cache mode `disksize_bytes` equals the origin's size and `mem_limit_bytes` is the
    /// cache's memory budget (required).
    pub origin: Option<OriginConfig>,
    /// Background recompression of idle and raw pages (`recompress/`); `None`: off.
    pub recompress: Option<RecompressConfig>,
}

/// Recompression (`recompress/`, docs/store.md "Recompression"): which pages, with what, and
/// at what cost. [`RecompressConfig::default`] holds the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecompressConfig {
    /// Pages not accessed for this long are recompressed (seconds).
    pub idle_secs: u64,
    /// The zstd level of the recompression codec (1..=22).
    pub level: i32,
    /// A recompressed page is kept only if it is at least this many bytes smaller (zram's
    /// `threshold`, as a saving).
    pub min_saving_bytes: usize,
    /// Raw ("huge") pages are recompressed too (zram's `type=huge`).
    pub huge: bool,
    /// CPU budget: percent of one core, averaged over steps.
    pub cpu_percent: u8,
    /// A step is skipped when the device served more page requests per second than this since
    /// the last one (0: never skipped).
    pub busy_pages_per_sec: u64,
    /// The dictionary recompressed pages use.
    pub dict: DictSource,
    /// `DictSource::Train`: pages sampled for one training; one in nine is held out to measure
    /// the dictionary's gain. zstd's advice is samples of about 100 times the dictionary
    /// (16 KiB): the default, 576 pages, is 2.25 MiB.
    pub dict_samples: usize,
    /// A trained dictionary is installed only if it saves at least this much (per 1000 bytes,
    /// on the held-out samples) against the same level without it.
    pub min_dict_gain_permille: u32,
}

/// Where recompression's zstd dictionary comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DictSource {
    /// No dictionary.
    None,
    /// Trained from the device's own pages, and retrained when its gain drifts.
    Train,
    /// An administrator's dictionary file (zstd's format, e.g. from `compcache dict train` or
    /// `zstd --train`).
    File(std::path::PathBuf),
}

/// Default idle age before recompression.
pub const DEFAULT_RECOMPRESS_IDLE_SECS: u64 = 60;

/// The longest idle age a setting may ask for (recompression's, the cold tier's, an idle
/// writeback's): 65535 s, 18h12m15s. Pages keep their access time in 16 bits of seconds
/// (the slot's `ac_time`, ticked by `ram/mover.rs`'s clock, which checks this figure against its
/// tick at compile time), so an older age cannot be told apart; a longer setting is refused
/// rather than cut to this.
pub const MAX_IDLE_SECS: u64 = u16::MAX as u64;

/// Why [`MAX_IDLE_SECS`] is the most, for error messages.
pub const MAX_IDLE_WHY: &str = "pages keep their access time in 16 bits of seconds";

/// The rule every idle age follows (configuration, `compcache set`-style changes, an idle
/// writeback): at most [`MAX_IDLE_SECS`].
pub fn check_idle_secs(what: &str, secs: u64) -> Result<(), String> {
    if secs > MAX_IDLE_SECS {
        return Err(format!("{what} of {secs} s is above the most an idle age can be, {MAX_IDLE_SECS} s (18h12m15s): {MAX_IDLE_WHY}"));
    }
    Ok(())
}

/// The rule every memory limit follows (the configuration and a change on a running device):
/// 0 is no limit, anything else at least one page; a limit under one page would be rounded, by
/// the CLI's page sizes, to 0: no limit, the opposite of what was asked.
pub fn check_mem_limit(bytes: u64) -> Result<(), String> {
    if bytes > 0 && bytes < PAGE {
        return Err(format!(
            "memory limit {bytes} bytes is below one page ({PAGE_SIZE} bytes): give at least {PAGE_SIZE}, or 0 for no limit"
        ));
    }
    Ok(())
}
/// Default zstd level of the recompression codec.
pub const DEFAULT_RECOMPRESS_LEVEL: i32 = 9;

impl Default for RecompressConfig {
    fn default() -> RecompressConfig {
        RecompressConfig {
            idle_secs: DEFAULT_RECOMPRESS_IDLE_SECS,
            level: DEFAULT_RECOMPRESS_LEVEL,
            min_saving_bytes: 32,
            huge: true,
            cpu_percent: 10,
            busy_pages_per_sec: 20_000,
            dict: DictSource::Train,
            dict_samples: 576,
            min_dict_gain_permille: 20,
        }
    }
}

impl RecompressConfig {
    fn validate(&self) -> Result<(), StoreError> {
        check_idle_secs("recompression's idle age", self.idle_secs).map_err(StoreError::Config)?;
        if !(1..=22).contains(&self.level) {
            return Err(StoreError::Config(format!("recompression level {} is outside zstd's 1..=22", self.level)));
        }
        if !(1..=100).contains(&self.cpu_percent) {
            return Err(StoreError::Config(format!("recompression CPU budget {}% is outside 1..=100", self.cpu_percent)));
        }
        if self.dict_samples < 9 {
            return Err(StoreError::Config(format!("{} dictionary samples are too few (at least 9 pages)", self.dict_samples)));
        }
        if self.min_saving_bytes >= PAGE_SIZE {
            return Err(StoreError::Config(format!(
                "recompression threshold {} bytes is not below a page ({PAGE_SIZE} bytes)",
                self.min_saving_bytes
            )));
        }
        Ok(())
    }
}

/// The default largest readahead window of cache mode (`OriginConfig::readahead_max_bytes`).
pub const DEFAULT_READAHEAD_MAX_BYTES: u64 = 1 << 20;
/// The largest readahead window accepted: it is read into each worker's origin buffer.
pub const MAX_READAHEAD_BYTES: u64 = 16 << 20;

/// Cache mode: the origin a store fronts (zcache's role: a compressed cache of a slower
/// device), as `docs/cache.md` describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginConfig {
    /// A regular file (an image) or a block device; its size is the device's.
    pub path: std::path::PathBuf,
    /// Largest readahead window in bytes; 0: no readahead. Default
    /// [`DEFAULT_READAHEAD_MAX_BYTES`] (1 MiB). Rounded down to whole pages.
    pub readahead_max_bytes: u64,
}

impl OriginConfig {
    /// The origin at `path` with the default readahead.
    pub fn new(path: impl Into<std::path::PathBuf>) -> OriginConfig {
        OriginConfig { path: path.into(), readahead_max_bytes: DEFAULT_READAHEAD_MAX_BYTES }
    }

    fn validate(&self) -> Result<(), StoreError> {
        if self.readahead_max_bytes > MAX_READAHEAD_BYTES {
            return Err(StoreError::Config(format!(
                "origin {}: readahead of {} bytes is above the maximum of {MAX_READAHEAD_BYTES} bytes",
                self.path.display(),
                self.readahead_max_bytes
            )));
        }
        Ok(())
    }
}

/// Default share of `mem_limit` above which cold pages are written back.
pub const DEFAULT_WRITEBACK_HIGH_PCT: u8 = 90;
/// Default share of `mem_limit` that writeback brings memory use down to.
pub const DEFAULT_WRITEBACK_LOW_PCT: u8 = 75;
/// Default segment size of the backing log: the unit of allocation, GC and sequential I/O.
pub const DEFAULT_SEGMENT_BYTES: u64 = 1 << 20;
/// The cold tier's default zstd level: its pages are read rarely and compressed once, so it
/// takes zstd's strongest practical level (docs/store.md, "The cold tier").
pub const DEFAULT_COLD_LEVEL: i32 = 19;
/// Pages idle this long go to the cold tier by default (seconds).
pub const DEFAULT_COLD_IDLE_SECS: u64 = 600;

/// Where the backing tier keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// A block device or regular file at `BackingConfig::path`.
    File,
    /// RAM, compressed 64 KiB at a time with zstd at `level` (`backing/memdev.rs`): the cold
    /// tier. Pages are written to it decoded (raw), so that runs of them compress together;
    /// a write over the memory limit is refused rather than sent to it (it would compress on
    /// the request path), and its records are not encrypted (they stay in this process's
    /// memory, as the pool's pages do).
    Memory { level: i32 },
}

/// The backing device and its writeback policy (compcache 0.5's backing swap device; zram's
/// `backing_dev`, `writeback`, `writeback_limit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingConfig {
    /// A block device or a regular file; a missing file is created (sparse, mode 0600).
    pub path: std::path::PathBuf,
    /// Bytes of the device to use after its 4 KiB superblock; 0: a block device's or existing
    /// file's size (less the superblock), or for a new file the device size
    /// (`disksize_bytes`, plenty: pages go out compressed).
    pub size_bytes: u64,
    /// Write back cold pages when pool memory passes this percent of `mem_limit`...
    pub high_pct: u8,
    /// ...until it is under this percent.
    pub low_pct: u8,
    /// Total bytes writeback may write over the device's life; 0: no limit (zram's
    /// `writeback_limit`). Overflow writes from the I/O path are not counted: refusing them
    /// would fail the request.
    pub writeback_limit_bytes: u64,
    /// Bytes per second the background writer may write; 0: no limit. Applied by
    /// [`crate::Store::maintain`] (front ends that call `writeback` directly pass their own budget).
    pub writeback_rate_bytes: u64,
    /// Send pages that do not compress (huge pages) to the backing device at once.
    pub incompressible: bool,
    /// Bring a written-back page back into RAM when it is read twice within a few seconds.
    pub promote: bool,
    /// Segment size in bytes (a multiple of 4096).
    pub segment_bytes: u64,
    /// Take over an existing regular file that has no compcache signature or is not private
    /// (other owner, group or other access, several links): it is set to mode 0600 and this
    /// user. Without it such a file is refused, untouched (`backing/device.rs`).
    pub force: bool,
    /// Encrypt every record with AES-256-GCM under a key of this run, kept only in a locked
    /// page of memory (`backing/seal.rs`); without it records are stored as they are, with a
    /// crc32c. On by default: it costs well under a microsecond per page (docs/backing.md).
    pub encrypt: bool,
    /// Where the records live: the file or device at `path`, or RAM (the cold tier).
    pub medium: Medium,
    /// Pages idle at least this many seconds are written back by [`crate::Store::maintain`]
    /// whatever the watermarks (zram's `writeback idle`, done by the device itself); 0: only
    /// the watermarks move pages.
    pub idle_secs: u64,
}

impl BackingConfig {
    /// A backing file or device at `path` with the default policy.
    pub fn new(path: impl Into<std::path::PathBuf>) -> BackingConfig {
        BackingConfig {
            path: path.into(),
            size_bytes: 0,
            high_pct: DEFAULT_WRITEBACK_HIGH_PCT,
            low_pct: DEFAULT_WRITEBACK_LOW_PCT,
            writeback_limit_bytes: 0,
            writeback_rate_bytes: 0,
            incompressible: false,
            promote: true,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            force: false,
            encrypt: true,
            medium: Medium::File,
            idle_secs: 0,
        }
    }

    /// The cold tier: `size_bytes` of records (raw pages and their headers, before its own
    /// compression) kept in RAM, compressed with zstd at [`DEFAULT_COLD_LEVEL`]; pages idle
    /// for [`DEFAULT_COLD_IDLE_SECS`] go there.
    pub fn in_memory(size_bytes: u64) -> BackingConfig {
        BackingConfig {
            size_bytes,
            encrypt: false,
            medium: Medium::Memory { level: DEFAULT_COLD_LEVEL },
            idle_secs: DEFAULT_COLD_IDLE_SECS,
            ..BackingConfig::new("memory")
        }
    }

    /// Whether the records are in RAM (the cold tier).
    pub fn in_ram(&self) -> bool {
        matches!(self.medium, Medium::Memory { .. })
    }

    fn validate(&self) -> Result<(), StoreError> {
        let bad = |m: String| Err(StoreError::Config(format!("backing device {}: {m}", self.path.display())));
        if let Err(e) = check_watermarks(self.high_pct, self.low_pct) {
            return bad(e);
        }
        if let Err(e) = check_idle_secs("the idle age", self.idle_secs) {
            return bad(e);
        }
        if self.segment_bytes < PAGE * 4 || self.segment_bytes % PAGE != 0 {
            return bad(format!("segment size {} is not a multiple of {PAGE_SIZE} of at least 4 pages", self.segment_bytes));
        }
        // The AES-GCM nonce holds a record's place as 32 bits, unique inside one segment
        // (`backing/seal.rs`).
        if self.segment_bytes > 1 << 32 {
            return bad(format!("segment size {} is above 4 GiB", self.segment_bytes));
        }
        if let Medium::Memory { level } = self.medium {
            let block = COLD_BLOCK_BYTES;
            if self.size_bytes == 0 || self.size_bytes % self.segment_bytes != 0 {
                return bad(format!(
                    "the cold tier's size {} bytes is not a non-zero multiple of its segment size ({} bytes)",
                    self.size_bytes, self.segment_bytes
                ));
            }
            if self.segment_bytes % block != 0 {
                return bad(format!("segment size {} is not a multiple of the cold tier's {block}-byte blocks", self.segment_bytes));
            }
            if !(1..=22).contains(&level) {
                return bad(format!("zstd level {level} is outside 1..=22"));
            }
            if self.incompressible {
                return bad("incompressible pages go to a backing file or device, not to the cold tier (it would compress them on the request path)".into());
            }
            if self.encrypt {
                return bad("the cold tier's records stay in this process's memory and are not encrypted: turn encryption off".into());
            }
        }
        Ok(())
    }
}

impl Config {
    /// A configuration with the defaults for everything but the size.
    pub fn with_disksize(disksize_bytes: u64) -> Config {
        Config {
            disksize_bytes,
            algorithm: Algorithm::Lz4,
            level: None,
            mem_limit_bytes: 0,
            huge_threshold_bytes: default_huge_threshold_bytes(),
            backing: None,
            origin: None,
            recompress: None,
        }
    }

    /// Checks that the configuration can work, with a message that says what to change.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.disksize_bytes < PAGE {
            return Err(StoreError::Config(format!("device size {} bytes is smaller than one {PAGE_SIZE}-byte page", self.disksize_bytes)));
        }
        if self.disksize_bytes / PAGE > crate::slot::MAX_SLOTS {
            return Err(StoreError::Config(format!(
                "device size {} bytes is above the maximum of {} bytes",
                self.disksize_bytes,
                crate::slot::MAX_SLOTS * PAGE
            )));
        }
        check_mem_limit(self.mem_limit_bytes).map_err(StoreError::Config)?;
        if self.huge_threshold_bytes < 64 || self.huge_threshold_bytes > PAGE_SIZE {
            return Err(StoreError::Config(format!("huge threshold {} is outside 64..={PAGE_SIZE} bytes", self.huge_threshold_bytes)));
        }
        if let Some(b) = &self.backing {
            b.validate()?;
        }
        if let Some(o) = &self.origin {
            if self.backing.is_some() {
                return Err(StoreError::Config(ORIGIN_WITH_BACKING.into()));
            }
            if self.mem_limit_bytes == 0 {
                return Err(StoreError::Config(format!(
                    "origin {}: cache mode needs a memory budget (--mem-limit, e.g. 10% of RAM)",
                    o.path.display()
                )));
            }
            o.validate()?;
        }
        if let Some(r) = &self.recompress {
            r.validate()?;
        }
        self.algorithm.check_level(self.level)
    }
}

/// Why a store cannot have both an origin and a backing device.
pub(crate) const ORIGIN_WITH_BACKING: &str =
    "--origin and --backing cannot be combined: a cache drops what does not fit, it has nothing to write back";

/// Physical RAM in bytes, from `sysconf`.
pub fn physical_ram_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions; it returns -1 on error, handled below.
    let (pages, page_size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || page_size <= 0 {
        return 0;
    }
    pages as u64 * page_size as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_what_cannot_work() {
        assert!(Config::with_disksize(100).validate().is_err());
        assert!(Config::with_disksize(1 << 20).validate().is_ok());
        let mut c = Config::with_disksize(1 << 20);
        c.huge_threshold_bytes = 5000;
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_memory_limit_under_a_page_and_an_idle_age_past_the_clock_are_refused() {
        let mut c = Config::with_disksize(1 << 20);
        for (limit, ok) in [(0, true), (1, false), (4095, false), (4096, true)] {
            c.mem_limit_bytes = limit;
            assert_eq!(c.validate().is_ok(), ok, "mem_limit {limit}");
        }
        c.mem_limit_bytes = 0;
        c.recompress = Some(RecompressConfig { idle_secs: MAX_IDLE_SECS, ..RecompressConfig::default() });
        assert!(c.validate().is_ok());
        c.recompress = Some(RecompressConfig { idle_secs: MAX_IDLE_SECS + 1, ..RecompressConfig::default() });
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("65536 s is above the most an idle age can be, 65535 s"), "{e}");
        c.recompress = None;
        c.backing = Some(BackingConfig { idle_secs: 86_400, ..BackingConfig::in_memory(8 << 20) });
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("86400 s is above the most"), "{e}");
    }

    #[test]
    fn cache_mode_needs_a_budget_and_no_backing_device() {
        let mut c = Config::with_disksize(1 << 20);
        c.origin = Some(OriginConfig::new("/x.img"));
        assert!(c.validate().unwrap_err().to_string().contains("memory budget"));
        c.mem_limit_bytes = 1 << 20;
        assert!(c.validate().is_ok());
        c.backing = Some(BackingConfig::new("/y"));
        assert!(c.validate().unwrap_err().to_string().contains("--origin and --backing cannot be combined"));
        c.backing = None;
        c.origin.as_mut().unwrap().readahead_max_bytes = MAX_READAHEAD_BYTES + 1;
        assert!(c.validate().unwrap_err().to_string().contains("readahead"));
    }
}
