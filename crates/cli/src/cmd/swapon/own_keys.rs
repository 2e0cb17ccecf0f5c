//! compcache's own keys (`zramconf::COMPCACHE_KEYS`, from compcache.conf; docs/swap.md
//! "compcache.conf"): each is the `swapon` flag of the same name and takes the same values,
//! parsed by the same clap definitions so that a key and its flag cannot drift apart. The
//! switches (`backing-incompressible`, `backing-plaintext`) take yes/no, true/false, on/off or
//! 1/0.
//!
//! The order of precedence for each setting: the command line's flag, else the key in
//! compcache.conf, else what zram-generator's keys say, else the default.

use std::collections::BTreeMap;

use clap::Parser;

use crate::backing::BackingArgs;
use crate::failure::Failure;
use crate::frontend::Wanted;
use crate::recompress_args::RecompressArgs;

/// The keys of one compcache.conf section, as the flags they stand for.
#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(no_binary_name = true)]
pub(super) struct OwnKeys {
    #[arg(long)]
    pub(super) frontend: Option<Wanted>,
    #[arg(long)]
    pub(super) reserve: Option<String>,
    #[command(flatten)]
    pub(super) backing: BackingArgs,
    #[command(flatten)]
    pub(super) recompress: RecompressArgs,
}

const SWITCHES: &[&str] = &["backing-incompressible", "backing-plaintext"];

impl OwnKeys {
    /// No keys: every setting from the flags, zram-generator's keys or the defaults.
    pub(super) fn none() -> OwnKeys {
        OwnKeys::try_parse_from(Vec::<String>::new()).expect("no arguments parse")
    }

    /// The keys of section `section` (`own`: key to value).
    pub(super) fn parse(section: &str, own: &BTreeMap<String, String>) -> Result<OwnKeys, Failure> {
        let mut argv: Vec<String> = Vec::new();
        for (key, value) in own {
            if SWITCHES.contains(&key.as_str()) {
                match value.to_ascii_lowercase().as_str() {
                    "yes" | "true" | "on" | "1" => argv.push(format!("--{key}")),
                    "no" | "false" | "off" | "0" => {}
                    _ => return Err(Failure::usage(format!("compcache.conf [{section}] {key} = {value}: write yes or no"))),
                }
            } else {
                argv.push(format!("--{key}={value}"));
            }
        }
        OwnKeys::try_parse_from(&argv).map_err(|e| {
            // clap's first line names the flag; the key has the same name.
            let first = e.to_string().lines().next().unwrap_or_default().trim_start_matches("error: ").to_string();
            Failure::usage(format!("compcache.conf [{section}]: {first} (each key takes what the swapon flag of its name takes)"))
        })
    }

    /// `flags` (the command line's) over these keys.
    pub(super) fn backing_under(&self, flags: &BackingArgs) -> BackingArgs {
        let own = &self.backing;
        BackingArgs {
            backing: flags.backing.clone().or_else(|| own.backing.clone()),
            backing_size: flags.backing_size.clone().or_else(|| own.backing_size.clone()),
            writeback_high: flags.writeback_high.or(own.writeback_high),
            writeback_low: flags.writeback_low.or(own.writeback_low),
            writeback_limit: flags.writeback_limit.clone().or_else(|| own.writeback_limit.clone()),
            writeback_rate: flags.writeback_rate.clone().or_else(|| own.writeback_rate.clone()),
            backing_incompressible: flags.backing_incompressible || own.backing_incompressible,
            backing_plaintext: flags.backing_plaintext || own.backing_plaintext,
            cold_tier: flags.cold_tier.clone().or_else(|| own.cold_tier.clone()),
            cold_idle: flags.cold_idle.or(own.cold_idle),
            cold_level: flags.cold_level.or(own.cold_level),
            force: flags.force,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::Frontend;

    fn own(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn keys_are_the_swapon_flags() {
        let k = OwnKeys::parse(
            "zram0",
            &own(&[
                ("frontend", "fuse"),
                ("reserve", "64M"),
                ("backing", "/var/lib/compcache/b.img"),
                ("writeback-high", "80"),
                ("backing-incompressible", "yes"),
                ("backing-plaintext", "off"),
                ("recompress", "on"),
                ("recompress-level", "12"),
            ]),
        )
        .unwrap();
        assert_eq!((k.frontend, k.reserve.as_deref()), (Some(Wanted::One(Frontend::Fuse)), Some("64M")));
        assert_eq!((k.backing.writeback_high, k.backing.backing_incompressible, k.backing.backing_plaintext), (Some(80), true, false));
        assert_eq!((k.recompress.recompress.as_deref(), k.recompress.recompress_level), (Some("on"), Some(12)));
        assert_eq!(OwnKeys::parse("zram0", &own(&[])).unwrap().frontend, None);
    }

    #[test]
    fn bad_values_say_which_section_and_key() {
        let e = OwnKeys::parse("zram1", &own(&[("writeback-high", "lots")])).unwrap_err().to_string();
        assert!(e.contains("compcache.conf [zram1]") && e.contains("--writeback-high") && e.contains("lots"), "{e}");
        let e = OwnKeys::parse("zram1", &own(&[("frontend", "zram")])).unwrap_err().to_string();
        assert!(e.contains("unknown front end"), "{e}");
        let e = OwnKeys::parse("zram1", &own(&[("backing-plaintext", "maybe")])).unwrap_err().to_string();
        assert!(e.contains("write yes or no"), "{e}");
    }

    #[test]
    fn flags_win_over_keys() {
        let k = OwnKeys::parse("zram0", &own(&[("backing", "/b"), ("writeback-low", "40"), ("writeback-rate", "1M")])).unwrap();
        let flags: BackingArgs = crate::test_flags::parse_flags(&["--backing", "/flag", "--writeback-low", "50"]).unwrap();
        let b = k.backing_under(&flags);
        assert_eq!(
            (b.backing.unwrap().display().to_string(), b.writeback_low, b.writeback_rate.as_deref()),
            ("/flag".into(), Some(50), Some("1M"))
        );
        let none: BackingArgs = crate::test_flags::parse_flags(&[]).unwrap();
        assert_eq!(k.backing_under(&none).writeback_low, Some(40));
        // A flag given as the default value still wins (it was once taken as not given).
        let flags: BackingArgs = crate::test_flags::parse_flags(&["--writeback-low", "75"]).unwrap();
        assert_eq!(k.backing_under(&flags).writeback_low, Some(75));
    }

    #[test]
    fn duration_keys_take_the_duration_grammar_and_say_which_key() {
        let k = OwnKeys::parse("zram0", &own(&[("recompress-idle", "5m"), ("cold-tier", "1G"), ("cold-idle", "2h")])).unwrap();
        assert_eq!((k.recompress.recompress_idle, k.backing.cold_idle), (Some(300), Some(7200)));
        let k = OwnKeys::parse("zram0", &own(&[("recompress-idle", "300")])).unwrap();
        assert_eq!(k.recompress.recompress_idle, Some(300), "bare seconds stay valid");
        for (key, value, why) in [
            ("recompress-idle", "1d", "65535 s"),
            ("cold-idle", "10 min", "unknown unit 'min'"),
            ("recompress-idle", "0.5s", "whole number"),
        ] {
            let e = OwnKeys::parse("zram2", &own(&[(key, value)])).unwrap_err().to_string();
            assert!(e.contains("compcache.conf [zram2]") && e.contains(&format!("--{key}")) && e.contains(why), "{key} = {value}: {e}");
        }
    }
}
