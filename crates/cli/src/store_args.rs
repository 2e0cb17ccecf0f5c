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
//!   them.
//!
//! Warnings are printed only once every check has passed, so that an error is the one line.

use compcache_store::{parse_size, physical_ram_bytes, Algorithm, Config, PAGE_SIZE};

use crate::backing::BackingArgs;
use crate::cmd::zramconf;
use crate::failure::Failure;
use crate::log;
use crate::units::human;

/// The fewest pages a device may have: the smallest swap area mkswap(8) makes.
pub const MIN_DEVICE_PAGES: u64 = 10;

/// The device's size, compression and memory limit, and its backing device.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct StoreArgs {
    /// Device size: bytes with an optional K/M/G/T suffix, a share of RAM such as 25%, or a
    /// zram-generator zram-size expression in MiB such as 'min(ram / 2, 4096)' [default: 25%;
    /// swapon: the configuration's zram-size, else min(ram / 2, 4096)].
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// Compression algorithm [default: lz4] (zram-generator: compression-algorithm).
    #[arg(long, value_name = "lz4|zstd")]
    pub algorithm: Option<String>,

    /// Compression level (zstd: 1..=22 or -7..=-1; lz4 ignores it).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub level: Option<i32>,

    /// Most memory the compressed data may take (SIZE, % or expression; 0 or none: no limit)
    /// [default: none] (zram-generator: zram-resident-limit). Writes beyond it fail with
    /// ENOSPC, or go to the backing device.
    #[arg(long, value_name = "SIZE")]
    pub mem_limit: Option<String>,

    #[command(flatten)]
    pub backing: BackingArgs,
}

/// A size given either as compcache writes sizes or as a zram-size expression (MiB).
pub fn parse_size_or_expr(text: &str, ram_bytes: u64) -> Result<u64, String> {
    parse_size(text, ram_bytes).or_else(|plain| {
        zramconf::eval(text, ram_bytes as f64 / 1048576.0)
            .map(|mib| (mib.max(0.0) * 1048576.0) as u64 / PAGE_SIZE as u64 * PAGE_SIZE as u64)
            .map_err(|expr| format!("{plain}; nor is it a zram-size expression: {expr}"))
    })
}

/// Whether a `--mem-limit` text means "no limit".
fn no_limit(text: &str) -> bool {
    matches!(text.trim(), "0" | "none" | "")
}

/// The checks of `--mem-limit` against one page and `--size`, on the parsed values
/// (`mem_limit_text` as given): an error, or a warning for the caller to print.
pub fn check_store_limits(size_bytes: u64, mem_limit_text: &str, mem_limit_bytes: u64) -> Result<Option<String>, Failure> {
    if !no_limit(mem_limit_text) && mem_limit_bytes < PAGE_SIZE as u64 {
        return Err(Failure::usage(format!(
            "--mem-limit {mem_limit_text} is below one page ({PAGE_SIZE} bytes), which would mean no limit at all: give at least 4K, or 0 for no limit"
        )));
    }
    if mem_limit_bytes > size_bytes {
        return Ok(Some(format!(
            "--mem-limit {} is above --size {}: the compressed data can never reach it, so it limits nothing",
            human(mem_limit_bytes),
            human(size_bytes)
        )));
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
        return Err(Failure::usage(format!(
            "--size {size_text} needs a {} slot table, more than half of RAM ({}): choose a smaller size (25%-200% of RAM is usual)",
            human(slot_table),
            human(ram)
        )));
    }
    if size_bytes > 2 * ram {
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
    /// machine with `ram` bytes of RAM (0: unknown); prints its warnings once it passed.
    pub fn config_for_ram(&self, ram: u64) -> Result<Config, Failure> {
        let size_text = self.size.as_deref().unwrap_or("25%");
        let size = parse_size_or_expr(size_text, ram).map_err(|e| Failure::usage(format!("--size: {e}")))?;
        if size < MIN_DEVICE_PAGES * PAGE_SIZE as u64 {
            return Err(Failure::usage(format!(
                "--size {size_text}: the device needs at least {MIN_DEVICE_PAGES} pages of {PAGE_SIZE} bytes ({}), the smallest swap area: give at least one swap area's worth",
                human(MIN_DEVICE_PAGES * PAGE_SIZE as u64)
            )));
        }
        let algorithm: Algorithm =
            self.algorithm.as_deref().unwrap_or("lz4").parse().map_err(|e: String| Failure::usage(format!("--algorithm: {e}")))?;
        let mem_limit_text = self.mem_limit.as_deref().unwrap_or("0");
        let mem_limit = if no_limit(mem_limit_text) {
            0
        } else {
            parse_size_or_expr(mem_limit_text, ram).map_err(|e| Failure::usage(format!("--mem-limit: {e}")))?
        };
        let mut warnings = Vec::new();
        warnings.extend(check_store_limits(size, mem_limit_text, mem_limit)?);
        warnings.extend(check_against_ram(size_text, size, mem_limit_text, mem_limit, ram)?);
        let backing = self.backing.config(ram, mem_limit)?;
        let cfg = Config { algorithm, level: self.level, mem_limit_bytes: mem_limit, backing, ..Config::with_disksize(size) };
        cfg.validate().map_err(|e| Failure::usage(e.to_string()))?;
        for w in warnings {
            log::warning(&w);
        }
        Ok(cfg)
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
        assert!(check_store_limits(1 << 20, "1", 1).is_err());
        assert!(check_store_limits(1 << 20, "none", 0).unwrap().is_none());
    }

    #[test]
    fn a_mem_limit_above_the_size_is_warned_about() {
        let w = check_store_limits(64 << 20, "1G", 1 << 30).unwrap().expect("a warning");
        assert!(w.contains("above --size") && w.contains("limits nothing"), "{w}");
        assert!(check_store_limits(64 << 20, "16M", 16 << 20).unwrap().is_none());
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
}
