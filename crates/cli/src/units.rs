//! Sizes and durations on the command line and in compcache.conf: the store's one grammar
//! (`compcache_store::units`, docs/cli.md "Sizes and durations") with the flag's name in front
//! of every error, zram-generator's size expressions where a flag takes them, and sizes for
//! people (`human(3 << 30)` is `3G`, as zramctl prints them).

use compcache_store::config::{MAX_IDLE_SECS, MAX_IDLE_WHY};
use compcache_store::units::{parse_bytes, parse_size_or_none, round_or_refuse, MAX_SIZE_BYTES};
use compcache_store::PAGE_SIZE;

use crate::expr;
use crate::failure::Failure;

const PAGE: u64 = PAGE_SIZE as u64;

/// A size given as compcache writes sizes or as a zram-size expression (MiB of `ram` bytes),
/// in bytes (an expression's rounded up to a whole byte): an expression that comes out
/// negative or above 4 EiB is an error.
pub fn size_or_expr_bytes(text: &str, ram_bytes: u64) -> Result<u64, String> {
    parse_bytes(text, ram_bytes).or_else(|plain| {
        let mib =
            expr::eval(text, ram_bytes as f64 / 1048576.0).map_err(|expr| format!("{plain}; nor is it a zram-size expression: {expr}"))?;
        let bytes = mib * 1048576.0;
        if bytes < 0.0 {
            return Err(format!("'{text}' is {mib} MiB, below 0"));
        }
        if bytes.is_nan() || bytes > MAX_SIZE_BYTES as f64 {
            return Err(format!("'{text}' is more than any machine has (at most 4 EiB)"));
        }
        // Up to a whole byte: a value above 0, however small, never becomes 0 here.
        Ok(bytes.ceil() as u64)
    })
}

/// [`size_or_expr_bytes`] rounded down to whole pages (`--size`).
pub fn size_or_expr(text: &str, ram_bytes: u64) -> Result<u64, String> {
    Ok(size_or_expr_bytes(text, ram_bytes)? / PAGE * PAGE)
}

/// `--mem-limit` (every server, `swapon`, `set`): `0`, `none` or `off` for no limit; else a
/// size, a share of RAM or an expression, rounded down to pages, and at least one page (below
/// it would round to 0: no limit, the opposite of what was asked).
pub fn mem_limit(text: &str, ram_bytes: u64) -> Result<u64, Failure> {
    let flag = |e: String| Failure::usage(format!("--mem-limit: {e}"));
    if compcache_store::units::is_none_word(text) {
        return Ok(0);
    }
    let bytes = size_or_expr_bytes(text, ram_bytes).map_err(flag)?;
    round_or_refuse(text, bytes, PAGE, "no limit").map_err(flag)
}

/// A size flag whose 0 means `zero_means` (`--writeback-limit`, `--writeback-rate`, which may
/// end in `/s`, `--backing-size`, `--readahead`, `--reserve`, `writeback --max`): `0`, `none`
/// or `off` for that; else a size rounded down to pages that must not come to 0.
pub fn size_or_none(flag: &str, text: &str, ram_bytes: u64, zero_means: &str) -> Result<u64, Failure> {
    let t = if flag.ends_with("-rate") { text.trim().strip_suffix("/s").unwrap_or(text) } else { text };
    parse_size_or_none(t, ram_bytes, PAGE, zero_means).map_err(|e| Failure::usage(format!("{flag}: {e}")))
}

/// The value parser of every idle-age flag (`--recompress-idle`, `--cold-idle`, `writeback
/// --idle`, `recompress --idle`, and their compcache.conf keys): a duration in whole seconds,
/// at most what a page's access time can tell. clap puts the flag's name in front.
pub fn idle_age(text: &str) -> Result<u64, String> {
    compcache_store::parse_secs(text, MAX_IDLE_SECS, MAX_IDLE_WHY)
}

/// Bytes with a binary suffix and at most one decimal: `0B`, `512B`, `4K`, `1.5M`, `3G`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value >= 100.0 || (value - value.round()).abs() < 0.05 {
        format!("{}{}", value.round() as u64, UNITS[unit])
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn sizes_read_like_zramctl() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(512), "512B");
        assert_eq!(human(4096), "4K");
        assert_eq!(human(1536 << 10), "1.5M");
        assert_eq!(human(3 << 30), "3G");
        assert_eq!(human(200 << 20), "200M");
    }

    #[test]
    fn sizes_take_both_forms_and_an_expression_is_never_negative() {
        assert_eq!(size_or_expr("25%", 4 * GIB).unwrap(), GIB);
        assert_eq!(size_or_expr("1G", 4 * GIB).unwrap(), GIB);
        assert_eq!(size_or_expr("min(ram / 2, 4096)", 4 * GIB).unwrap(), 2 * GIB);
        assert_eq!(size_or_expr("ram * 2", GIB).unwrap(), 2 * GIB);
        let e = size_or_expr("lots", GIB).unwrap_err();
        assert!(e.contains("zram-size expression"), "{e}");
        // Before: a negative expression was 0 bytes.
        let e = size_or_expr("ram - 2048", GIB).unwrap_err();
        assert!(e.contains("-1024 MiB, below 0"), "{e}");
        let e = size_or_expr("ram * 1e12", GIB).unwrap_err();
        assert!(e.contains("at most 4 EiB"), "{e}");
    }

    /// The case and its relatives: a limit that rounds to zero pages is an error that
    /// names the flag and the smallest accepted value, never "no limit".
    #[test]
    fn a_memory_limit_never_rounds_to_no_limit() {
        let ram = 64 << 20;
        for none in ["0", "none", "off", " 0 "] {
            assert_eq!(mem_limit(none, ram).unwrap(), 0, "{none}");
        }
        assert_eq!(mem_limit("4K", ram).unwrap(), 4096);
        assert_eq!(mem_limit("5000", ram).unwrap(), 4096);
        assert_eq!(mem_limit("50%", ram).unwrap(), 32 << 20);
        assert_eq!(mem_limit("ram / 2", ram).unwrap(), 32 << 20);
        for small in ["0.001%", "100", "4095", "ram / 100000", "ram / 1099511627776"] {
            let e = mem_limit(small, ram).unwrap_err();
            let t = e.to_string();
            assert!(t.starts_with("--mem-limit: ") && t.contains("means no limit: give at least 4K, or 0 for no limit"), "{small}: {t}");
            assert_eq!(e.exit_code(), 2);
        }
        assert!(mem_limit("", ram).unwrap_err().to_string().contains("empty size"), "an empty value is not 'none'");
    }

    #[test]
    fn size_flags_with_a_meaning_for_0_refuse_to_round_to_it() {
        assert_eq!(size_or_none("--writeback-rate", "4M/s", GIB, "no limit").unwrap(), 4 << 20);
        assert_eq!(size_or_none("--writeback-rate", "none", GIB, "no limit").unwrap(), 0);
        let e = size_or_none("--writeback-rate", "1000/s", GIB, "no limit").unwrap_err().to_string();
        assert!(e.starts_with("--writeback-rate: '1000' is 1000 bytes") && e.contains("at least 4K, or 0 for no limit"), "{e}");
        let e = size_or_none("--backing-size", "100", GIB, "the whole device").unwrap_err().to_string();
        assert!(e.contains("which means the whole device"), "{e}");
        assert!(size_or_none("--max", "4M/s", GIB, "no cap").is_err(), "only a rate ends in /s");
    }

    /// The idle-age flags' table: what each accepts and refuses (the grammar's own table is
    /// in compcache_store::units).
    #[test]
    fn idle_ages_take_the_duration_grammar_in_whole_seconds() {
        for (text, secs) in
            [("0", 0), ("60", 60), ("1s", 1), ("10m", 600), ("2h", 7200), ("1.5h", 5400), ("3000ms", 3), ("18h", 64_800), ("65535", 65_535)]
        {
            assert_eq!(idle_age(text), Ok(secs), "{text}");
        }
        for (text, why) in [
            ("500ms", "not a whole number of seconds"),
            ("1d", "above the most this setting takes, 65535 s (18h12m15s)"),
            ("19h", "above the most"),
            ("2w", "unknown unit"),
            ("-1", "negative"),
            ("soon", "not a duration"),
        ] {
            let e = idle_age(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
