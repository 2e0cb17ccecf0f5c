//! The recompression flags (`--recompress` and its tuning), shared by every command that makes
//! a device as [`crate::store_args::StoreArgs`] flattens them, and handed on by `swapon` to the
//! server it starts ([`RecompressArgs::to_args`]). What they mean: docs/store.md,
//! "Recompression"; the store's `RecompressConfig` holds the defaults.

use std::ffi::OsString;
use std::path::PathBuf;

use compcache_store::config::{DEFAULT_RECOMPRESS_IDLE_SECS, DEFAULT_RECOMPRESS_LEVEL};
use compcache_store::{DictSource, RecompressConfig};

use crate::failure::Failure;

#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct RecompressArgs {
    /// Recompress idle and incompressible ("huge") pages in the background with zstd at a
    /// higher level and a dictionary trained from the device's own pages, within a CPU budget
    /// (docs/store.md, "Recompression") [default: on].
    #[arg(long, value_name = "on|off", help_heading = "Recompression")]
    pub recompress: Option<String>,

    /// Pages not read or written for this long are recompressed: a DURATION in whole seconds
    /// (60, 90s, 10m, 2h; docs/cli.md "Sizes and durations"), at most 18h12m15s [default: 1m].
    #[arg(long, value_name = "DURATION", value_parser = crate::units::idle_age, help_heading = "Recompression")]
    pub recompress_idle: Option<u64>,

    /// zstd level of the recompression codec, 1..=22 [default: 9].
    #[arg(long, value_name = "N", help_heading = "Recompression")]
    pub recompress_level: Option<i32>,

    /// Keep a recompressed page only if it is at least this many bytes smaller [default: 32].
    #[arg(long, value_name = "BYTES", help_heading = "Recompression")]
    pub recompress_threshold: Option<usize>,

    /// CPU budget of recompression, percent of one core [default: 10].
    #[arg(long, value_name = "PCT", help_heading = "Recompression")]
    pub recompress_cpu: Option<u8>,

    /// The dictionary: `train` (from the device's own pages, retrained when its gain drifts),
    /// `none`, or a zstd dictionary file (`compcache dict train`, `zstd --train`) [default: train].
    #[arg(long, value_name = "train|none|PATH", help_heading = "Recompression")]
    pub dict: Option<String>,
}

impl RecompressArgs {
    /// The store's recompression configuration; `None` when recompression is off. On unless
    /// `--recompress off` says otherwise: the measurements that made it the default are in
    /// docs/store.md, "On by default".
    pub fn config(&self) -> Result<Option<RecompressConfig>, Failure> {
        let on = match self.recompress.as_deref().map(str::trim) {
            Some("off") | Some("no") | Some("0") => false,
            None | Some("on") | Some("yes") | Some("1") => true,
            Some(other) => return Err(Failure::usage(format!("--recompress {other}: say on or off"))),
        };
        let tuned = self.recompress_idle.is_some()
            || self.recompress_level.is_some()
            || self.recompress_threshold.is_some()
            || self.recompress_cpu.is_some()
            || self.dict.is_some();
        if !on {
            if tuned {
                return Err(Failure::usage(
                    "--recompress-idle, --recompress-level, --recompress-threshold, --recompress-cpu and --dict tune recompression, \
                     which --recompress off turns off: drop one or the other",
                ));
            }
            return Ok(None);
        }
        let d = RecompressConfig::default();
        let dict = match self.dict.as_deref() {
            None | Some("train") | Some("auto") => DictSource::Train,
            Some("none") => DictSource::None,
            Some(path) => DictSource::File(PathBuf::from(path)),
        };
        Ok(Some(RecompressConfig {
            idle_secs: self.recompress_idle.unwrap_or(DEFAULT_RECOMPRESS_IDLE_SECS),
            level: self.recompress_level.unwrap_or(DEFAULT_RECOMPRESS_LEVEL),
            min_saving_bytes: self.recompress_threshold.unwrap_or(d.min_saving_bytes),
            cpu_percent: self.recompress_cpu.unwrap_or(d.cpu_percent),
            dict,
            ..d
        }))
    }

    /// The same flags as arguments for a server command line (`swapon` starting a server).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = Vec::new();
        let mut put = |flag: &str, value: Option<String>| {
            if let Some(value) = value {
                v.extend([flag.into(), value.into()]);
            }
        };
        put("--recompress", self.recompress.clone());
        put("--recompress-idle", self.recompress_idle.map(|n| n.to_string()));
        put("--recompress-level", self.recompress_level.map(|n| n.to_string()));
        put("--recompress-threshold", self.recompress_threshold.map(|n| n.to_string()));
        put("--recompress-cpu", self.recompress_cpu.map(|n| n.to_string()));
        put("--dict", self.dict.clone());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        r: RecompressArgs,
    }

    fn parse(v: &[&str]) -> RecompressArgs {
        T::try_parse_from(std::iter::once("t").chain(v.iter().copied())).unwrap().r
    }

    #[test]
    fn on_by_default_and_tuning_it_while_off_is_an_error() {
        assert_eq!(parse(&[]).config().unwrap(), Some(RecompressConfig::default()));
        assert_eq!(parse(&["--recompress", "off"]).config().unwrap(), None);
        let tuned = parse(&["--dict", "none", "--recompress-idle", "300"]).config().unwrap().unwrap();
        assert_eq!((tuned.dict, tuned.idle_secs), (DictSource::None, 300));
        assert_eq!(parse(&["--recompress-idle", "1s"]).config().unwrap().unwrap().idle_secs, 1);
        assert_eq!(parse(&["--recompress-idle", "10m"]).config().unwrap().unwrap().idle_secs, 600);
        let e = T::try_parse_from(["t", "--recompress-idle", "1d"]).err().expect("above 65535 s").to_string();
        assert!(e.contains("--recompress-idle") && e.contains("65535 s"), "{e}");
        let e = parse(&["--recompress", "off", "--dict", "none"]).config().unwrap_err();
        assert!(e.to_string().contains("--recompress off turns off"), "{e}");
        assert!(parse(&["--recompress", "maybe"]).config().is_err());
    }

    #[test]
    fn flags_become_the_store_config_and_round_trip() {
        let a = parse(&["--recompress", "on", "--recompress-idle", "5m", "--recompress-level", "12", "--dict", "/etc/pages.dict"]);
        let c = a.config().unwrap().unwrap();
        assert_eq!((c.idle_secs, c.level, c.dict), (300, 12, DictSource::File("/etc/pages.dict".into())));
        assert_eq!(parse(&["--recompress", "on"]).config().unwrap().unwrap(), RecompressConfig::default());
        let again = T::try_parse_from(std::iter::once(OsString::from("t")).chain(a.to_args())).unwrap().r;
        assert_eq!(again, a);
    }
}
