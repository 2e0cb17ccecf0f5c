//! The kernel command line switch `systemd.zram[=0|1]`, read as zram-generator reads it: the
//! last word starting with `systemd.zram` whose rest is one of `""`, `=1`, `=yes`, `=true`,
//! `=on` (on) or `=0`, `=no`, `=false`, `=off` (off) decides; other words are passed over.
//!
//! On: a `[zram0]` device is made with the defaults if the configuration has none (its keys
//! still apply when it has one). Off: no device at all. zram-generator reads the file
//! `/proc/cmdline` under its root; an unreadable file is a warning and no switch.

/// `Some(true)`: on, `Some(false)`: off, `None`: not given.
pub fn systemd_zram(cmdline: &str) -> Option<bool> {
    const WORD: &str = "systemd.zram";
    cmdline.split_whitespace().rev().filter_map(|w| w.strip_prefix(WORD)).find_map(|rest| match rest {
        "" | "=1" | "=yes" | "=true" | "=on" => Some(true),
        "=0" | "=no" | "=false" | "=off" => Some(false),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_valid_word_wins() {
        assert_eq!(systemd_zram("quiet"), None);
        assert_eq!(systemd_zram("systemd.zram"), Some(true));
        assert_eq!(systemd_zram("a systemd.zram=0 b"), Some(false));
        assert_eq!(systemd_zram("systemd.zram=1 systemd.zram=0 systemd.zram=on systemd.zram=off systemd.zram\n"), Some(true));
        assert_eq!(systemd_zram("systemd.zram=1\nsystemd.zram=0\n"), Some(false));
        for off in ["0", "no", "false", "off"] {
            assert_eq!(systemd_zram(&format!("systemd.zram={off}")), Some(false));
        }
        for on in ["1", "yes", "true", "on"] {
            assert_eq!(systemd_zram(&format!("systemd.zram={on}")), Some(true));
        }
        // Words that only start alike, or values it does not know, are passed over.
        assert_eq!(systemd_zram("systemd.zram=0 systemd.zram=maybe systemd.zramx=1 systemd.zram_size=1"), Some(false));
    }
}
