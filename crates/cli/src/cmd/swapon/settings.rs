//! The settings `compcache swapon` ends up with: the flags over a zram-generator
//! configuration over zram-generator's defaults. Pure (the configuration file is read, nothing
//! else is touched), and checked as every server checks its store flags.

use super::SwaponArgs;
use crate::backing::BackingArgs;
use crate::cmd::zramconf;
use crate::failure::Failure;
use crate::log;
use crate::recompress_args::RecompressArgs;
use crate::store_args::StoreArgs;

/// The settings swapon ends up with, and where each came from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Settings {
    pub(super) size_bytes: u64,
    pub(super) algorithm: String,
    pub(super) level: Option<i32>,
    pub(super) priority: i32,
    pub(super) mem_limit_bytes: u64,
    /// The backing flags for the server, `--backing` from the flag or else `writeback-device`.
    pub(super) backing: BackingArgs,
    /// The recompression flags for the server, as given.
    pub(super) recompress: RecompressArgs,
    pub(super) source: String,
}

/// The flags over the configuration over zram-generator's defaults, checked by the one
/// validation of the store flags (`StoreArgs::config_for_ram`), so that a device no server
/// would make fails here, before a server is started; `None` when the configuration asks for
/// no device on this machine.
pub(super) fn settings(args: &SwaponArgs, ram_bytes: u64) -> Result<Option<Settings>, Failure> {
    if args.store.origin.is_some() || args.store.readahead.is_some() {
        return Err(Failure::usage(
            "compcache swapon makes swap devices; --origin and --readahead make a cache of a disk: run `compcache serve`, `ublk`, `nbd-attach` or `fuse` with --origin instead",
        ));
    }
    let (sections, files) =
        if args.no_config { (Vec::new(), Vec::new()) } else { zramconf::load(args.config.as_deref()).map_err(Failure::usage)? };
    let section = match &args.section {
        Some(name) => Some(
            sections.iter().find(|s| &s.name == name).ok_or_else(|| Failure::usage(format!("no [{name}] section in the configuration")))?,
        ),
        None => sections.first(),
    };
    let conf = match section {
        Some(s) => Some(zramconf::interpret(s, ram_bytes as f64 / 1048576.0).map_err(Failure::usage)?),
        None => None,
    };
    if let Some(c) = &conf {
        for n in &c.notes {
            log::info(n);
        }
        if c.size_bytes.is_none() && args.store.size.is_none() {
            return Ok(None);
        }
    }
    let source = match (&conf, files.is_empty()) {
        (Some(_), false) => format!("{} + flags", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")),
        _ => "flags and zram-generator defaults".to_string(),
    };
    // The flags as given, else the configuration's values (sizes in bytes), else the defaults.
    let flags = &args.store;
    let mut store = StoreArgs {
        size: flags.size.clone().or_else(|| conf.as_ref().and_then(|c| c.size_bytes).map(|b| b.to_string())),
        algorithm: flags.algorithm.clone().or_else(|| conf.as_ref().and_then(|c| c.algorithm.clone())),
        level: flags.level.or_else(|| conf.as_ref().and_then(|c| c.level)),
        mem_limit: flags.mem_limit.clone().or_else(|| conf.as_ref().and_then(|c| c.mem_limit_bytes).map(|b| b.to_string())),
        backing: flags.backing.clone(),
        recompress: flags.recompress.clone(),
        origin: None,
        readahead: None,
    };
    store.size.get_or_insert_with(|| zramconf::DEFAULT_SIZE_EXPR.to_string());
    if store.backing.backing.is_none() {
        store.backing.backing = conf.as_ref().and_then(|c| c.writeback_device.clone());
    }
    // Recompression asked for by the configuration (a second algorithm, a dictionary), unless
    // the flags say something about it.
    if store.recompress == RecompressArgs::default() {
        if let Some(r) = conf.as_ref().and_then(|c| c.recompress.clone()) {
            store.recompress = RecompressArgs {
                recompress: Some("on".into()),
                recompress_level: r.level,
                dict: r.dict.map(|d| d.display().to_string()),
                ..RecompressArgs::default()
            };
        }
    }
    let cfg = store.config_for_ram(ram_bytes)?;
    Ok(Some(Settings {
        size_bytes: cfg.disksize_bytes,
        algorithm: cfg.algorithm.to_string(),
        level: store.level,
        priority: args.priority.or_else(|| conf.as_ref().and_then(|c| c.priority)).unwrap_or(zramconf::DEFAULT_PRIORITY),
        mem_limit_bytes: cfg.mem_limit_bytes,
        backing: store.backing,
        recompress: store.recompress,
        source,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    use super::super::parse_args as args;

    const GIB: u64 = 1 << 30;

    /// A zram-generator configuration file in a directory of its own, removed on drop.
    struct ConfigFile(PathBuf);

    impl ConfigFile {
        fn new(tag: &str, text: &str) -> ConfigFile {
            let dir = std::env::temp_dir().join(format!("compcache-swapon-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("zram-generator.conf"), text).unwrap();
            ConfigFile(dir)
        }
        fn path(&self) -> String {
            self.0.join("zram-generator.conf").display().to_string()
        }
    }

    impl Drop for ConfigFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn defaults_follow_zram_generator() {
        let s = settings(&args(&["--no-config"]), 4 * GIB).unwrap().unwrap();
        assert_eq!((s.size_bytes, s.priority, s.algorithm.as_str(), s.mem_limit_bytes), (2 * GIB, 100, "lz4", 0));
        let s = settings(&args(&["--no-config"]), 32 * GIB).unwrap().unwrap();
        assert_eq!(s.size_bytes, 4 * GIB);
    }

    #[test]
    fn a_cache_is_not_a_swap_device() {
        for flags in [&["--no-config", "--origin", "/var/lib/disk.img"][..], &["--no-config", "--readahead", "0"][..]] {
            let e = settings(&args(flags), 4 * GIB).unwrap_err();
            assert!(e.to_string().contains("compcache serve") && e.exit_code() == 2, "{e}");
        }
    }

    #[test]
    fn flags_override_the_config_file() {
        let f = ConfigFile::new("override", "[zram0]\nzram-size = ram\ncompression-algorithm = zstd(level=7)\nswap-priority = 5\n");
        let c = &f.path();
        let s = settings(&args(&["--config", c]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.size_bytes, s.algorithm.as_str(), s.level, s.priority), (2 * GIB, "zstd", Some(7), 5));
        let s = settings(&args(&["--config", c, "--size", "25%", "--priority", "100", "--algorithm", "lz4"]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.size_bytes, s.algorithm.as_str(), s.priority), (GIB / 2, "lz4", 100));
        assert!(settings(&args(&["--config", c, "--section", "zram1"]), GIB).is_err());
    }

    #[test]
    fn writeback_device_becomes_the_servers_backing_device() {
        let f = ConfigFile::new("wb", "[zram0]\nzram-size = 1024\nzram-resident-limit = 64\nwriteback-device = /dev/vdb\n");
        let c = &f.path();
        let s = settings(&args(&["--config", c, "--writeback-rate", "4M/s"]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.backing.backing.as_deref(), s.backing.writeback_rate.as_deref()), (Some(Path::new("/dev/vdb")), Some("4M/s")));
        // A flag overrides the file; without either there is no backing device.
        let s = settings(&args(&["--config", c, "--backing", "/var/b.img"]), 2 * GIB).unwrap().unwrap();
        assert_eq!(s.backing.backing.as_deref(), Some(Path::new("/var/b.img")));
        assert_eq!(settings(&args(&["--no-config"]), 2 * GIB).unwrap().unwrap().backing.backing, None);
        let e = settings(&args(&["--no-config", "--writeback-limit", "1G"]), 2 * GIB).unwrap_err().to_string();
        assert!(e.contains("need --backing"), "{e}");
    }

    #[test]
    fn a_recompression_algorithm_turns_recompression_on() {
        let f = ConfigFile::new("recomp", "[zram0]\nzram-size = 1024\ncompression-algorithm = lz4 zstd(level=15) (type=idle)\n");
        let c = &f.path();
        let s = settings(&args(&["--config", c]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.recompress.recompress.as_deref(), s.recompress.recompress_level), (Some("on"), Some(15)));
        assert!(s.recompress.to_args().contains(&"--recompress-level".into()));
        // The flags, when they say anything about recompression, win.
        let s = settings(&args(&["--config", c, "--recompress", "off"]), 2 * GIB).unwrap().unwrap();
        assert_eq!((s.recompress.recompress.as_deref(), s.recompress.recompress_level), (Some("off"), None));
        assert_eq!(settings(&args(&["--no-config"]), 2 * GIB).unwrap().unwrap().recompress, RecompressArgs::default());
    }
}
