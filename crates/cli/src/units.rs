//! Sizes for people: `human(3 << 30)` is `3G`, as zramctl prints them.

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
    use super::human;

    #[test]
    fn sizes_read_like_zramctl() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(512), "512B");
        assert_eq!(human(4096), "4K");
        assert_eq!(human(1536 << 10), "1.5M");
        assert_eq!(human(3 << 30), "3G");
        assert_eq!(human(200 << 20), "200M");
    }
}
