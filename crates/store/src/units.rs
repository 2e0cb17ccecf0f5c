//! The sizes and durations people type, one grammar each, parsed here for every flag,
//! configuration key and front end (docs/cli.md, "Sizes and durations"):
//!
//! - a size is bytes (`4096`), a number with a binary unit (`512K`, `1.5G`; `K`, `M`, `G`, `T`,
//!   any case, optionally followed by `i`, `B` or `iB`), or a share of physical RAM (`25%`, above
//!   0 and at most 1000); never negative, at most 4 EiB. Most settings count whole pages: the
//!   value is rounded down to them ([`parse_size`]); the few that count bytes take it as it is
//!   ([`parse_bytes`]).
//! - a setting whose 0 means something else than "a little" (no limit, no readahead, no
//!   reserve, the whole device) takes `0`, `none` or `off` for that meaning, and refuses any
//!   other value that would round to 0 ([`parse_size_or_none`]): `--mem-limit 0.001%` of a small
//!   machine is an error that says the smallest value accepted, never "no limit".
//! - a duration is a number of seconds (`90`), or a number with a unit: `ms`, `s`, `m`, `h`,
//!   `d` (`500ms`, `90s`, `1.5h`, `2d`), lowercase, an optional space between; never negative.
//!   [`parse_duration`] keeps milliseconds; [`parse_secs`] is for the settings that count whole
//!   seconds (idle ages: pages keep their access time in seconds), and refuses what is not a
//!   whole number of them rather than round `500ms` down to 0.
//!
//! Errors say what was wrong and what is accepted; the caller puts the flag's or key's name in
//! front.

use std::time::Duration;

use crate::PAGE;

/// The largest size accepted: 4 EiB, far above any machine, and far enough below 2^64 that
/// rounding and sums cannot overflow.
pub const MAX_SIZE_BYTES: u64 = 1 << 62;

/// What a size may look like, for the error messages.
const SIZE_FORMS: &str = "give bytes (4096), a number with K, M, G or T (512M, 1.5G), or a share of RAM (25%)";

/// What a duration may look like, for the error messages.
const DURATION_FORMS: &str = "give seconds (90), or a number with ms, s, m, h or d (500ms, 90s, 30m, 1.5h, 2d)";

/// Parses a size into bytes, exactly (fractions of a byte dropped): for the settings that count
/// bytes. `ram_bytes` is what `100%` is.
pub fn parse_bytes(text: &str, ram_bytes: u64) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err(format!("empty size: {SIZE_FORMS}"));
    }
    if t.starts_with('-') {
        return Err(format!("'{text}' is negative: {SIZE_FORMS}"));
    }
    let bytes = if let Some(pct) = t.strip_suffix('%') {
        let p: f64 = pct.trim().parse().map_err(|_| format!("'{text}' is not a percentage such as 25%"))?;
        if !(p > 0.0 && p <= 1000.0) {
            return Err(format!("'{text}': the percentage must be above 0 and at most 1000"));
        }
        ram_bytes as f64 * p / 100.0
    } else {
        let upper = t.to_ascii_uppercase();
        let digits_end = upper.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(upper.len());
        let (num, suffix) = upper.split_at(digits_end);
        let n: f64 = num.parse().map_err(|_| format!("'{text}' is not a size: {SIZE_FORMS}"))?;
        let mult: u64 = match suffix.trim() {
            "" | "B" => 1,
            "K" | "KB" | "KI" | "KIB" => 1 << 10,
            "M" | "MB" | "MI" | "MIB" => 1 << 20,
            "G" | "GB" | "GI" | "GIB" => 1 << 30,
            "T" | "TB" | "TI" | "TIB" => 1 << 40,
            other => return Err(format!("'{text}': unknown unit '{other}' (use K, M, G, T or %)")),
        };
        n * mult as f64
    };
    if bytes > MAX_SIZE_BYTES as f64 {
        return Err(format!("'{text}' is more than any machine has (at most 4 EiB)"));
    }
    Ok(bytes as u64)
}

/// Parses a size ([`parse_bytes`]) and rounds it down to whole 4 KiB pages: for the settings
/// that count pages. A setting for which 0 means something else than "nothing" takes
/// [`parse_size_or_none`] instead.
pub fn parse_size(text: &str, ram_bytes: u64) -> Result<u64, String> {
    Ok(parse_bytes(text, ram_bytes)? / PAGE * PAGE)
}

/// Whether `text` is one of the words for a setting's 0: `0`, `none`, `off`.
pub fn is_none_word(text: &str) -> bool {
    matches!(text.trim(), "0" | "none" | "off")
}

/// A size setting whose 0 means `zero_means` ("no limit", "no readahead"): `0`, `none` or `off`
/// give 0; anything else is a size ([`parse_bytes`]) rounded down to whole `unit_bytes` (a
/// power of two: 4096 for pages), which must not come to 0 there: that would silently mean
/// `zero_means`, the opposite of a request for a little.
pub fn parse_size_or_none(text: &str, ram_bytes: u64, unit_bytes: u64, zero_means: &str) -> Result<u64, String> {
    if is_none_word(text) {
        return Ok(0);
    }
    round_or_refuse(text, parse_bytes(text, ram_bytes)?, unit_bytes, zero_means)
}

/// `bytes` (what `text` says) rounded down to whole `unit_bytes`; an error if that is 0 while
/// `bytes` is not, naming the smallest value accepted (for size expressions evaluated
/// elsewhere, which follow the same rule). A `bytes` of exactly 0 (`0K`, `0.0M`) is 0.
pub fn round_or_refuse(text: &str, bytes: u64, unit_bytes: u64, zero_means: &str) -> Result<u64, String> {
    let rounded = bytes / unit_bytes * unit_bytes;
    if rounded == 0 && bytes > 0 {
        return Err(format!(
            "'{}' is {bytes} bytes, less than {}, so it would round to 0, which means {zero_means}: give at least {}, or 0 for {zero_means}",
            text.trim(),
            unit_name(unit_bytes),
            short_size(unit_bytes)
        ));
    }
    Ok(rounded)
}

fn unit_name(unit_bytes: u64) -> String {
    if unit_bytes == PAGE {
        format!("one page ({PAGE} bytes)")
    } else {
        format!("{unit_bytes} bytes")
    }
}

/// `4096` as `4K`, `1048576` as `1M`: a size in the form the grammar takes.
pub fn short_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses a duration, to the millisecond.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err(format!("empty duration: {DURATION_FORMS}"));
    }
    if t.starts_with('-') {
        return Err(format!("'{text}' is negative: {DURATION_FORMS}"));
    }
    let num_end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(num_end);
    if num.is_empty() {
        return Err(format!("'{text}' is not a duration: {DURATION_FORMS}"));
    }
    let unit_ms: u128 = match unit.trim_start() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("'{text}': unknown unit '{other}': {DURATION_FORMS}")),
    };
    // The number as an integer and a power of ten (1.5 is 15 / 10), so that 1.5h is exactly
    // 5400 s: no float rounding.
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() && frac.is_empty() || frac.contains('.') || !(whole.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())) {
        return Err(format!("'{text}' is not a duration: {DURATION_FORMS}"));
    }
    let digits = format!("{whole}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 || frac.len() > 30 {
        return Err(format!("'{text}' is too long a duration"));
    }
    let mantissa: u128 = if digits.is_empty() { 0 } else { digits.parse().expect("at most 30 ASCII digits") };
    let scale = 10u128.pow(frac.len() as u32);
    let ms_scaled = mantissa * unit_ms;
    if ms_scaled % scale != 0 {
        return Err(format!("'{text}' is finer than a millisecond: {DURATION_FORMS}"));
    }
    let ms = u64::try_from(ms_scaled / scale).map_err(|_| format!("'{text}' is too long a duration"))?;
    Ok(Duration::from_millis(ms))
}

/// Parses a duration for a setting that counts whole seconds, at most `max_secs` (its reason
/// in `max_why`): `1500ms` and `0.5s` are refused, not rounded (half a second would round to
/// 0, which for an idle age means every page).
pub fn parse_secs(text: &str, max_secs: u64, max_why: &str) -> Result<u64, String> {
    let d = parse_duration(text)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("'{}' is not a whole number of seconds, which this setting counts", text.trim()));
    }
    let secs = d.as_secs();
    if secs > max_secs {
        return Err(format!(
            "'{}' is {secs} s, above the most this setting takes, {max_secs} s ({}): {max_why}",
            text.trim(),
            format_secs(max_secs)
        ));
    }
    Ok(secs)
}

/// Seconds as the duration grammar writes them, largest units first: `65535` is `18h12m15s`.
pub fn format_secs(secs: u64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let mut left = secs;
    for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if left >= n {
            out += &format!("{}{unit}", left / n);
            left %= n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// Every size spelling the grammar accepts or refuses, with the value or a piece of the
    /// error (the one test table of the size grammar).
    #[test]
    fn the_size_table() {
        let ok: &[(&str, u64)] = &[
            ("4096", 4096),
            ("5000", 5000),
            (" 4096 ", 4096),
            ("512K", 512 << 10),
            ("512k", 512 << 10),
            ("512KiB", 512 << 10),
            ("512KB", 512 << 10),
            ("512 M", 512 << 20),
            ("2GiB", 2 * GIB),
            ("1.5g", 3 * GIB / 2),
            ("1T", 1 << 40),
            ("0.1K", 102),
            ("100B", 100),
            ("25%", GIB),
            ("0.001%", 42949),
            ("1000%", 40 * GIB),
            ("0", 0),
            ("0K", 0),
            ("4194304T", MAX_SIZE_BYTES),
        ];
        for (text, bytes) in ok {
            assert_eq!(parse_bytes(text, 4 * GIB).as_ref(), Ok(bytes), "{text}");
        }
        let refused: &[(&str, &str)] = &[
            ("", "empty size"),
            ("  ", "empty size"),
            ("-1", "negative"),
            ("-1G", "negative"),
            ("12Q", "unknown unit 'Q'"),
            ("1e9", "unknown unit 'E9'"),
            ("1.2.3M", "not a size"),
            ("G", "not a size"),
            (".", "not a size"),
            ("lots", "not a size"),
            ("x%", "not a percentage"),
            ("0%", "above 0 and at most 1000"),
            ("-5%", "negative"),
            ("1001%", "above 0 and at most 1000"),
            ("nan%", "above 0"),
            ("inf%", "above 0"),
            ("4194305T", "at most 4 EiB"),
            ("99999999999999999999999", "at most 4 EiB"),
        ];
        for (text, why) in refused {
            let e = parse_bytes(text, 4 * GIB).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn page_sizes_round_down_and_settings_with_a_meaning_for_0_refuse_rounding_to_it() {
        assert_eq!(parse_size("5000", GIB), Ok(4096), "rounded down to pages");
        assert_eq!(parse_size("100", GIB), Ok(0), "a plain page size may be 0; its setting checks its minimum");
        let mib_64 = 64 << 20;
        for (text, bytes) in
            [("0", 0), ("none", 0), ("off", 0), ("0K", 0), ("4K", 4096), ("4097", 4096), ("1%", mib_64 / 100 / PAGE * PAGE)]
        {
            assert_eq!(parse_size_or_none(text, mib_64, PAGE, "no limit"), Ok(bytes), "{text}");
        }
        // The case: 0.001% of a small machine is 671 bytes; as pages, 0: "no limit".
        for text in ["0.001%", "100", "4095", "0.5K"] {
            let e = parse_size_or_none(text, mib_64, PAGE, "no limit").unwrap_err();
            assert!(e.contains("round to 0, which means no limit") && e.contains("give at least 4K, or 0 for no limit"), "{text}: {e}");
        }
        let e = parse_size_or_none("1M", GIB, 4 << 20, "no cold tier").unwrap_err();
        assert!(e.contains("less than 4194304 bytes") && e.contains("at least 4M"), "{e}");
        assert!(parse_size_or_none("lots", GIB, PAGE, "no limit").unwrap_err().contains("not a size"));
        assert_eq!(
            (short_size(4096), short_size(1 << 20), short_size(1536), short_size(3 << 30)),
            ("4K".into(), "1M".into(), "1536".into(), "3G".into())
        );
    }

    /// Every duration spelling the grammar accepts or refuses (the one test table of the
    /// duration grammar).
    #[test]
    fn the_duration_table() {
        let ok: &[(&str, u64)] = &[
            ("0", 0),
            ("90", 90_000),
            (" 90 ", 90_000),
            ("90s", 90_000),
            ("90 s", 90_000),
            ("500ms", 500),
            ("1500ms", 1500),
            ("30m", 1_800_000),
            ("2h", 7_200_000),
            ("1.5h", 5_400_000),
            ("0.5s", 500),
            (".5s", 500),
            ("1.", 1000),
            ("1d", 86_400_000),
            ("007", 7000),
            ("0.001s", 1),
        ];
        for (text, ms) in ok {
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(*ms)), "{text}");
        }
        let refused: &[(&str, &str)] = &[
            ("", "empty duration"),
            ("-1", "negative"),
            ("-5m", "negative"),
            ("h", "not a duration"),
            (".", "not a duration"),
            ("1.2.3s", "not a duration"),
            ("2w", "unknown unit 'w'"),
            ("1H", "unknown unit 'H'"),
            ("10min", "unknown unit 'min'"),
            ("1h30m", "unknown unit 'h30m'"),
            ("1e3", "unknown unit 'e3'"),
            ("0.0001s", "finer than a millisecond"),
            ("0.5ms", "finer than a millisecond"),
            ("99999999999999999999d", "too long"),
            ("1234567890123456789012345678901", "too long"),
        ];
        for (text, why) in refused {
            let e = parse_duration(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
            if !why.starts_with("too long") {
                assert!(e.contains("give seconds (90), or a number with ms, s, m, h or d"), "{text:?} says what is accepted: {e}");
            }
        }
    }

    #[test]
    fn whole_seconds_are_not_rounded_and_have_a_maximum() {
        assert_eq!(parse_secs("2h", 65535, "why"), Ok(7200));
        assert_eq!(parse_secs("2000ms", 65535, "why"), Ok(2));
        assert_eq!(parse_secs("0", 65535, "why"), Ok(0));
        let e = parse_secs("500ms", 65535, "why").unwrap_err();
        assert!(e.contains("not a whole number of seconds"), "{e}");
        let e = parse_secs("1d", 65535, "pages keep 16 bits").unwrap_err();
        assert!(e.contains("86400 s, above the most this setting takes, 65535 s (18h12m15s): pages keep 16 bits"), "{e}");
        assert_eq!((format_secs(0), format_secs(90), format_secs(86_400 + 61)), ("0s".into(), "1m30s".into(), "1d1m1s".into()));
    }
}
