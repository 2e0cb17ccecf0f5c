//! The store flags, declared once and validated once for every command that makes a device:
//! `serve`, `ublk`, `nbd-attach` and `fuse` flatten [`StoreArgs`] and build their store's
//! [`Config`] with [`StoreArgs::config`]; `swapon` flattens it too, fills what the flags leave
//! open from the zram-generator configuration, and runs the same validation before it starts a
//! server (which runs it again on what it is passed).
//!
//! The rules (where `serve` and the swap servers used to differ, the stricter one holds for
//! all, see docs/cli.md, "Errors"):
//! - `--size`: bytes with K/M/G/T, a share of RAM, or a zram-size expression; at least 10
//!   pages (mkswap's minimum: every server's device can be made swap); a slot table (16 bytes
//!   per page) above half of RAM is an error, a size above twice RAM a warning;
//! - `--mem-limit`: `0`/`none` for no limit; anything else below one page is an error (it
//!   would round to 0, no limit, the opposite of what was asked), above physical RAM an error
//!   (it could never take effect), above `--size` a warning (it limits nothing, but zram
//!   accepts it and zram-generator configurations may carry it);
//! - `--algorithm`, `--level` and the backing flags as the store and `crate::backing` check
//!   them;
//! - cache mode (`--origin PATH`, docs/cli.md "Cache mode (zcache)"): the device's size is the
//!   origin's, read first (`compcache_store::cache::origin_size`); `--size` is refused unless
//!   it says the same; `--backing` is refused (a cache has no backing tier: what it evicts is
//!   on the origin already); `--mem-limit` is the cache's budget, 10% of RAM by default as
//!   zcache's pools were, and cannot be 0 (a cache without a budget would hold the whole
//!   origin); the slot table check is made against the origin's size, and the "twice RAM"
//!   warning is not given (a cache is meant to front more than RAM); `--readahead` (default
//!   1M, 0 off) needs `--origin`.
//!
//! Warnings are printed only once every check has passed, so that an error is the one line.

use std::path::PathBuf;

use compcache_store::config::DEFAULT_READAHEAD_MAX_BYTES;
use compcache_store::{parse_size, physical_ram_bytes, Algorithm, Config, OriginConfig, StoreError, PAGE_SIZE};

use crate::backing::BackingArgs;
use crate::cmd::zramconf;
use crate::failure::Failure;
use crate::log;
use crate::recompress_args::RecompressArgs;
use crate::units::human;

/// The fewest pages a device may have: the smallest swap area mkswap(8) makes.
pub const MIN_DEVICE_PAGES: u64 = 10;

/// The cache budget without `--mem-limit`, as a share of RAM: zcache's pools defaulted to 10%.
pub const DEFAULT_CACHE_MEM_LIMIT: &str = "10%";

/// The device's size, compression and memory limit, and its backing device.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct StoreArgs {
    /// Device size: bytes with an optional K/M/G/T suffix, a share of RAM such as 25%, or a
    /// zram-generator zram-size expression in MiB such as 'min(ram / 2, 4096)' [default: 25%;
    /// swapon: the configuration's zram-size, else min(ram / 2, 4096)].
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// Compression algorithm [default: lz4] (zram-generator: compression-algorithm).
    #[arg(long, value_name = "lz4|lz4hc|zstd")]
    pub algorithm: Option<String>,

    /// Compression level, as zram's algorithm_params level (zstd: 1..=22 or -7..=-1; lz4: the
    /// acceleration, 1..=65537, higher is faster and compresses less; lz4hc: 1..=12).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub level: Option<i32>,

    /// Most memory the compressed data may take (SIZE, % or expression; 0 or none: no limit)
    /// [default: none] (zram-generator: zram-resident-limit). Writes beyond it fail with
    /// ENOSPC, or go to the backing device.
    #[arg(long, value_name = "SIZE")]
    pub mem_limit: Option<String>,

    #[command(flatten)]
    pub backing: BackingArgs,

    #[command(flatten)]
    pub recompress: RecompressArgs,

    /// Cache mode (zcache): the device fronts this block device or disk image (the origin),
    /// has its size, and keeps recently used blocks compressed in RAM within --mem-limit
    /// (default 10% of RAM here). Writes go through to the origin before they complete; the
    /// origin is locked against a second user. See docs/cli.md, "Cache mode (zcache)".
    #[arg(long, value_name = "PATH", help_heading = "Cache mode")]
    pub origin: Option<PathBuf>,

    /// Largest readahead window for sequential misses (SIZE; 0: no readahead) [default: 1M].
    #[arg(long, value_name = "SIZE", help_heading = "Cache mode")]
    pub readahead: Option<String>,
}

/// A size given either as compcache writes sizes or as a zram-size expression (MiB).
pub fn parse_size_or_expr(text: &str, ram_bytes: u64) -> Result<u64, String> {
    parse_size(text, ram_bytes).or_else(|plain| {
        zramconf::eval(text, ram_bytes as f64 / 1048576.0)
            .map(|mib| (mib.max(0.0) * 1048576.0) as u64 / PAGE_SIZE as u64 * PAGE_SIZE as u64)
            .map_err(|expr| format!("{plain}; nor is it a zram-size expression: {expr}"))
    })
}

/// A store error as the one line of a refused start: a configuration the store refuses (an
/// origin that is missing, misshapen or in use: the message names it and says what to do)
/// without the "invalid configuration" prefix, anything else as it is.
pub fn config_error_line(e: &StoreError) -> String {
    match e {
        StoreError::Config(message) => message.clone(),
        e => e.to_string(),
    }
}

/// Whether a `--mem-limit` text means "no limit".
fn no_limit(text: &str) -> bool {
    matches!(text.trim(), "0" | "none" | "")
}

/// The checks of `--mem-limit` against one page and the device's size (`--size`, or the
/// origin's for a `cache`), on the parsed values (`mem_limit_text` as given): an error, or a
/// warning for the caller to print.
fn check_limits(size_bytes: u64, mem_limit_text: &str, mem_limit_bytes: u64, cache: bool) -> Result<Option<String>, Failure> {
    if !no_limit(mem_limit_text) && mem_limit_bytes < PAGE_SIZE as u64 {
        return Err(Failure::usage(format!(
            "--mem-limit {mem_limit_text} is below one page ({PAGE_SIZE} bytes), which would mean no limit at all: give at least 4K, or 0 for no limit"
        )));
    }
    if mem_limit_bytes > size_bytes {
        return Ok(Some(if cache {
            format!(
                "--mem-limit {} is above the origin's size ({}): the cache can hold all of it compressed and never reaches its budget",
                human(mem_limit_bytes),
                human(size_bytes)
            )
        } else {
            format!(
                "--mem-limit {} is above --size {}: the compressed data can never reach it, so it limits nothing",
                human(mem_limit_bytes),
                human(size_bytes)
            )
        }));
    }
    Ok(None)
}

/// The checks against physical RAM (`ram` 0: unknown, nothing checked): errors, or a warning.
fn check_against_ram(
    size_text: &str,
    size_bytes: u64,
    mem_limit_text: &str,
    mem_limit_bytes: u64,
    ram: u64,
    cache: bool,
) -> Result<Option<String>, Failure> {
    if ram == 0 {
        return Ok(None);
    }
    if mem_limit_bytes > ram {
        return Err(Failure::usage(format!(
            "--mem-limit {mem_limit_text} is above physical RAM ({}): it could never take effect; give at most {} or 0 for no limit",
            human(ram),
            human(ram)
        )));
    }
    // The slot table costs 16 bytes per page whether or not it is used; a device whose table
    // alone would take half of RAM cannot be what was meant.
    let slot_table = size_bytes / PAGE_SIZE as u64 * 16;
    if slot_table > ram / 2 {
        return Err(Failure::usage(if cache {
            format!(
                "--origin {size_text} ({}) needs a {} slot table, more than half of RAM ({}): a cache in front of it would cost more memory than it could save",
                human(size_bytes),
                human(slot_table),
                human(ram)
            )
        } else {
            format!(
                "--size {size_text} needs a {} slot table, more than half of RAM ({}): choose a smaller size (25%-200% of RAM is usual)",
                human(slot_table),
                human(ram)
            )
        }));
    }
    // A cache is meant to front more than RAM: no warning for its size.
    if size_bytes > 2 * ram && !cache {
        return Ok(Some(format!(
            "--size {} is more than twice RAM ({}): compressed memory rarely holds more than 2-3x",
            human(size_bytes),
            human(ram)
        )));
    }
    Ok(None)
}

impl StoreArgs {
    /// The store configuration for this machine (physical RAM for `%` sizes and the checks).
    pub fn config(&self) -> Result<Config, Failure> {
        self.config_for_ram(physical_ram_bytes())
    }

    /// The one validation of the store flags (the rules are at the top of this file), for a
    /// machine with `ram` bytes of RAM (0: unknown); prints its warnings once it passed. In
    /// cache mode the origin's size is read here, so a missing, unreadable or misshapen origin
    /// is the one error line of a refused start.
    pub fn config_for_ram(&self, ram: u64) -> Result<Config, Failure> {
        // Flags that cannot go together are refused before the origin is even looked at.
        if self.origin.is_some() && self.backing.backing.is_some() {
            return Err(Failure::usage(
                "--origin and --backing cannot be combined: a cache has no backing tier (what it evicts is on the origin already); drop --backing",
            ));
        }
        if self.origin.is_none() && self.readahead.is_some() {
            return Err(Failure::usage("--readahead needs --origin PATH (it is the cache's readahead)"));
        }
        let origin_bytes = match &self.origin {
            Some(path) => Some(compcache_store::cache::origin_size(path).map_err(|e| Failure::new(config_error_line(&e)))?),
            None => None,
        };
        self.config_with(ram, origin_bytes)
    }

    /// The validation itself, given the origin's size (read by [`Self::config_for_ram`]; `None`
    /// without `--origin`).
    fn config_with(&self, ram: u64, origin_bytes: Option<u64>) -> Result<Config, Failure> {
        let cache = origin_bytes.is_some();
        let (size_text, size) = match origin_bytes {
            Some(origin) => (self.origin.as_ref().map(|p| p.display().to_string()).unwrap_or_default(), self.origin_size(origin, ram)?),
            None => {
                let text = self.size.as_deref().unwrap_or("25%");
                (text.to_string(), parse_size_or_expr(text, ram).map_err(|e| Failure::usage(format!("--size: {e}")))?)
            }
        };
        let size_text = size_text.as_str();
        if size < MIN_DEVICE_PAGES * PAGE_SIZE as u64 {
            let flag = if cache { "--origin" } else { "--size" };
            return Err(Failure::usage(format!(
                "{flag} {size_text}: the device needs at least {MIN_DEVICE_PAGES} pages of {PAGE_SIZE} bytes ({}), the smallest swap area: give at least one swap area's worth",
                human(MIN_DEVICE_PAGES * PAGE_SIZE as u64)
            )));
        }
        let algorithm: Algorithm =
            self.algorithm.as_deref().unwrap_or("lz4").parse().map_err(|e: String| Failure::usage(format!("--algorithm: {e}")))?;
        let mem_limit_text = self.mem_limit.as_deref().unwrap_or(if cache { DEFAULT_CACHE_MEM_LIMIT } else { "0" });
        let mem_limit = if no_limit(mem_limit_text) {
            if cache {
                return Err(Failure::usage(format!(
                    "--mem-limit {mem_limit_text} with --origin: a cache needs a memory budget; give a size or a share of RAM (default {DEFAULT_CACHE_MEM_LIMIT})"
                )));
            }
            0
        } else {
            parse_size_or_expr(mem_limit_text, ram).map_err(|e| Failure::usage(format!("--mem-limit: {e}")))?
        };
        let mut warnings = Vec::new();
        // (A cache's default budget above a small origin's size is no mistake of the user's.)
        if !(cache && self.mem_limit.is_none()) {
            warnings.extend(check_limits(size, mem_limit_text, mem_limit, cache)?);
        }
        warnings.extend(check_against_ram(size_text, size, mem_limit_text, mem_limit, ram, cache)?);
        let origin = self.origin_config(ram)?;
        let backing = self.backing.config(ram, mem_limit)?;
        let recompress = self.recompress.config()?;
        let cfg =
            Config { algorithm, level: self.level, mem_limit_bytes: mem_limit, backing, origin, recompress, ..Config::with_disksize(size) };
        cfg.validate().map_err(|e| Failure::usage(config_error_line(&e)))?;
        for w in warnings {
            log::warning(&w);
        }
        Ok(cfg)
    }

    /// The device size in cache mode: the origin's, `origin_bytes`; `--size` may only repeat it.
    fn origin_size(&self, origin_bytes: u64, ram: u64) -> Result<u64, Failure> {
        let path = self.origin.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        if let Some(text) = &self.size {
            let asked = parse_size_or_expr(text, ram).map_err(|e| Failure::usage(format!("--size: {e}")))?;
            if asked != origin_bytes {
                return Err(Failure::usage(format!(
                    "--size {text} ({asked} bytes) differs from the size of --origin {path} ({origin_bytes} bytes): a cache has its origin's size; drop --size"
                )));
            }
        }
        Ok(origin_bytes)
    }

    /// The cache's configuration from `--origin` and `--readahead`; `None` without `--origin`.
    fn origin_config(&self, ram: u64) -> Result<Option<OriginConfig>, Failure> {
        let Some(path) = &self.origin else { return Ok(None) };
        let readahead_max_bytes = match self.readahead.as_deref().map(str::trim) {
            None => DEFAULT_READAHEAD_MAX_BYTES,
            Some("0") | Some("none") | Some("off") => 0,
            Some(t) => parse_size(t, ram).map_err(|e| Failure::usage(format!("--readahead: {e}")))?,
        };
        Ok(Some(OriginConfig { readahead_max_bytes, ..OriginConfig::new(path) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> StoreArgs {
        crate::test_flags::parse_flags(v).unwrap()
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_mem_limit_below_one_page_is_an_error_in_both_servers() {
        let e = parse(&["--size", "64M", "--mem-limit", "100"]).config().unwrap_err();
        assert!(e.to_string().contains("below one page") && e.exit_code() == 2, "{e}");
        assert_eq!(parse(&["--size", "64M", "--mem-limit", "4K"]).config().unwrap().mem_limit_bytes, 4096);
        assert_eq!(parse(&["--size", "64M", "--mem-limit", "0"]).config().unwrap().mem_limit_bytes, 0);
        assert!(check_limits(1 << 20, "1", 1, false).is_err());
        assert!(check_limits(1 << 20, "none", 0, false).unwrap().is_none());
    }

    #[test]
    fn a_mem_limit_above_the_size_is_warned_about() {
        let w = check_limits(64 << 20, "1G", 1 << 30, false).unwrap().expect("a warning");
        assert!(w.contains("above --size") && w.contains("limits nothing"), "{w}");
        assert!(check_limits(64 << 20, "16M", 16 << 20, false).unwrap().is_none());
        // Still accepted.
        assert_eq!(parse(&["--size", "64M", "--mem-limit", "1G"]).config_for_ram(8 * GIB).unwrap().mem_limit_bytes, 1 << 30);
    }

    #[test]
    fn sizes_take_both_forms() {
        assert_eq!(parse_size_or_expr("25%", 4 * GIB).unwrap(), GIB);
        assert_eq!(parse_size_or_expr("1G", 4 * GIB).unwrap(), GIB);
        assert_eq!(parse_size_or_expr("min(ram / 2, 4096)", 4 * GIB).unwrap(), 2 * GIB);
        assert_eq!(parse_size_or_expr("ram * 2", GIB).unwrap(), 2 * GIB);
        let e = parse_size_or_expr("lots", GIB).unwrap_err();
        assert!(e.contains("zram-size expression"), "{e}");
        assert_eq!(parse(&["--size", "min(ram / 2, 4096)"]).config_for_ram(4 * GIB).unwrap().disksize_bytes, 2 * GIB);
    }

    #[test]
    fn every_server_has_the_same_minimum_and_ram_checks() {
        let e = parse(&["--size", "36K"]).config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("at least 10 pages"), "{e}");
        assert_eq!(parse(&["--size", "40K"]).config_for_ram(8 * GIB).unwrap().disksize_bytes, 40 << 10);
        let e = parse(&["--size", "2T"]).config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("slot table"), "{e}");
        let e = parse(&["--mem-limit", "16G"]).config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("above physical RAM"), "{e}");
        // RAM unknown: nothing to check against.
        assert!(parse(&["--size", "2T"]).config_for_ram(0).is_ok());
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_cache_has_its_origins_size_and_a_budget_of_a_tenth_of_ram() {
        let cfg = parse(&["--origin", "/var/lib/disk.img"]).config_with(8 * GIB, Some(64 * MIB)).unwrap();
        assert_eq!(cfg.disksize_bytes, 64 * MIB);
        assert_eq!(cfg.mem_limit_bytes, 8 * GIB / 10 / 4096 * 4096, "zcache's 10% of RAM");
        let origin = cfg.origin.expect("cache mode");
        assert_eq!(origin.path, PathBuf::from("/var/lib/disk.img"));
        assert_eq!(origin.readahead_max_bytes, DEFAULT_READAHEAD_MAX_BYTES);
        assert!(cfg.backing.is_none());
        // Without --origin nothing changes: no origin, no limit.
        let cfg = parse(&["--size", "64M"]).config_with(8 * GIB, None).unwrap();
        assert!(cfg.origin.is_none());
        assert_eq!(cfg.mem_limit_bytes, 0);
    }

    #[test]
    fn cache_flags_reach_the_config() {
        let a = parse(&["--origin", "/dev/vdb", "--mem-limit", "256M", "--readahead", "4M", "--algorithm", "zstd"]);
        let cfg = a.config_with(8 * GIB, Some(GIB)).unwrap();
        assert_eq!((cfg.mem_limit_bytes, cfg.algorithm), (256 * MIB, Algorithm::Zstd));
        assert_eq!(cfg.origin.unwrap().readahead_max_bytes, 4 * MIB);
        for off in ["0", "off", "none"] {
            let cfg = parse(&["--origin", "/dev/vdb", "--readahead", off]).config_with(8 * GIB, Some(GIB)).unwrap();
            assert_eq!(cfg.origin.unwrap().readahead_max_bytes, 0, "--readahead {off}");
        }
        let e = parse(&["--origin", "/dev/vdb", "--readahead", "lots"]).config_with(8 * GIB, Some(GIB)).unwrap_err().to_string();
        assert!(e.starts_with("--readahead"), "{e}");
        let e = parse(&["--origin", "/dev/vdb", "--readahead", "64M"]).config_with(8 * GIB, Some(GIB)).unwrap_err();
        assert!(e.to_string().contains("readahead") && e.to_string().contains("maximum") && e.exit_code() == 2, "{e}");
    }

    #[test]
    fn size_may_only_repeat_the_origins() {
        assert_eq!(parse(&["--origin", "/i", "--size", "64M"]).config_with(8 * GIB, Some(64 * MIB)).unwrap().disksize_bytes, 64 * MIB);
        let e = parse(&["--origin", "/i", "--size", "32M"]).config_with(8 * GIB, Some(64 * MIB)).unwrap_err();
        let t = e.to_string();
        assert!(t.contains("differs from the size of --origin /i") && t.contains("67108864 bytes") && e.exit_code() == 2, "{t}");
    }

    #[test]
    fn a_cache_needs_a_budget_and_no_backing_device() {
        for none in ["0", "none"] {
            let e = parse(&["--origin", "/i", "--mem-limit", none]).config_with(8 * GIB, Some(64 * MIB)).unwrap_err().to_string();
            assert!(e.contains("a cache needs a memory budget"), "{e}");
        }
        // Refused before the origin is looked at: the path does not exist.
        let e = parse(&["--origin", "/nonexistent/compcache-origin", "--backing", "/tmp/b"]).config_for_ram(8 * GIB).unwrap_err();
        assert!(e.to_string().contains("--origin and --backing cannot be combined") && e.exit_code() == 2, "{e}");
        let e = parse(&["--readahead", "1M"]).config_for_ram(8 * GIB).unwrap_err().to_string();
        assert!(e.contains("--readahead needs --origin"), "{e}");
    }

    #[test]
    fn an_origin_that_cannot_be_read_is_one_error_naming_it() {
        let e = parse(&["--origin", "/nonexistent/compcache-origin"]).config_for_ram(8 * GIB).unwrap_err();
        let t = e.to_string();
        assert!(t.contains("/nonexistent/compcache-origin") && !t.contains('\n') && e.exit_code() != 0, "{t}");
    }

    #[test]
    fn a_cache_may_front_more_than_ram_but_its_slot_table_must_fit() {
        // 64 GiB behind 8 GiB of RAM: a 256 MiB slot table, no "twice RAM" warning needed.
        assert_eq!(parse(&["--origin", "/d"]).config_with(8 * GIB, Some(64 * GIB)).unwrap().disksize_bytes, 64 * GIB);
        let e = parse(&["--origin", "/d"]).config_with(8 * GIB, Some(2 << 40)).unwrap_err().to_string();
        assert!(e.contains("--origin /d") && e.contains("slot table"), "{e}");
        let e = parse(&["--origin", "/d"]).config_with(8 * GIB, Some(8192)).unwrap_err().to_string();
        assert!(e.starts_with("--origin /d") && e.contains("at least 10 pages"), "{e}");
        let w = check_limits(64 * MIB, "1G", GIB, true).unwrap().expect("a warning");
        assert!(w.contains("origin's size"), "{w}");
    }
}
