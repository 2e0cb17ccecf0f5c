//! The settings `compcache swapon` ends up with, one per device: the flags over compcache's
//! own keys (compcache.conf, `own_keys.rs`) over the zram-generator configuration over
//! zram-generator's defaults. Pure but for reading the configuration and running its `set!`
//! programs (`load`), and checked as every server checks its store flags.
//!
//! Which devices: every `[zramN]` section (one device each, as zram-generator makes one zram
//! device each), or the one `--section` names; with no section at all, one device from the
//! flags and zram-generator's defaults.

use std::path::Path;

use super::own_keys::OwnKeys;
use super::SwaponArgs;
use crate::backing::BackingArgs;
use crate::cmd::zramconf::{self, Loaded, Section, Sources};
use crate::failure::Failure;
use crate::frontend::Wanted;
use crate::log;
use crate::recompress_args::RecompressArgs;
use crate::store_args::StoreArgs;

/// The settings of one device, and where they came from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Settings {
    /// The configuration section (`zram0`), or `None` for flags and defaults alone.
    pub(super) section: Option<String>,
    pub(super) size_bytes: u64,
    pub(super) algorithm: String,
    pub(super) level: Option<i32>,
    /// -1: the kernel's default priority.
    pub(super) priority: i32,
    pub(super) discard: bool,
    pub(super) frontend: Wanted,
    pub(super) reserve: String,
    pub(super) mem_limit_bytes: u64,
    /// The backing flags for the server: `--backing` from the flag, else compcache.conf's
    /// `backing`, else `writeback-device`.
    pub(super) backing: BackingArgs,
    /// The recompression flags for the server.
    pub(super) recompress: RecompressArgs,
    pub(super) source: String,
}

/// What the configuration asks for: a device, or none for a section (and why).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Planned {
    Device(Box<Settings>),
    NoDevice { section: String, why: String },
}

/// The root the configuration is searched under: `--config-root`, else `/`.
pub(super) fn root(args: &SwaponArgs) -> &Path {
    args.config_root.as_deref().unwrap_or(Path::new("/"))
}

/// Reads the configuration (`None` with `--no-config`), running its `set!` programs;
/// `kernel_on` (`systemd.zram=1`) adds a `[zram0]` with the defaults if there is none. The
/// warnings are logged.
pub(super) fn load(args: &SwaponArgs, ram_bytes: u64, kernel_on: bool) -> Result<Option<Loaded>, Failure> {
    if args.no_config {
        return Ok(None);
    }
    let src = Sources { root: root(args), explicit: args.config.as_deref() };
    let mut loaded = zramconf::load(src, mib(ram_bytes), &mut zramconf::run_with_sh).map_err(Failure::usage)?;
    for w in &loaded.warnings {
        log::warning(w);
    }
    for m in &loaded.masked {
        log::info(&format!("{} is masked (a symlink to /dev/null)", m.display()));
    }
    if kernel_on {
        loaded.ensure_section("zram0");
    }
    Ok(Some(loaded))
}

fn mib(ram_bytes: u64) -> f64 {
    ram_bytes as f64 / 1048576.0
}

/// The devices to set up: every section's (or `--section`'s), each the flags over its keys;
/// all are checked before any is set up, so that one bad section fails the command before a
/// device exists.
pub(super) fn plan(args: &SwaponArgs, ram_bytes: u64, loaded: Option<&Loaded>) -> Result<Vec<Planned>, Failure> {
    if args.store.origin.is_some() || args.store.readahead.is_some() {
        return Err(Failure::usage(
            "compcache swapon makes swap devices; --origin and --readahead make a cache of a disk: run `compcache serve`, `ublk`, `nbd-attach` or `fuse` with --origin instead",
        ));
    }
    let empty = Loaded::default();
    let loaded = loaded.unwrap_or(&empty);
    let files = loaded.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ");
    let sections: Vec<&Section> = match &args.section {
        Some(name) => vec![loaded.sections.iter().find(|s| &s.name == name).ok_or_else(|| {
            let have = if loaded.files.is_empty() { "no configuration was found".to_string() } else { format!("read {files}") };
            Failure::usage(format!("no [{name}] section in the configuration ({have}); leave out --section to set up every section"))
        })?],
        None => loaded.sections.iter().collect(),
    };
    if sections.is_empty() {
        let s = settings_for(args, ram_bytes, None, &OwnKeys::none(), "flags and zram-generator defaults".into())?;
        return Ok(vec![Planned::Device(Box::new(s))]);
    }
    let mut planned = Vec::new();
    for section in sections {
        let dev = zramconf::interpret(section, mib(ram_bytes), &loaded.vars).map_err(Failure::usage)?;
        for w in &dev.warnings {
            log::warning(w);
        }
        if dev.size_bytes.is_none() {
            let why = dev.notes.last().map(|n| n.trim_start_matches(&format!("[{}] ", section.name)).to_string()).unwrap_or_default();
            planned.push(Planned::NoDevice { section: section.name.clone(), why });
            continue;
        }
        for n in &dev.notes {
            log::info(n);
        }
        let own = OwnKeys::parse(&section.name, &section.own)?;
        let source = format!("[{}] of {files} + flags", section.name);
        planned.push(Planned::Device(Box::new(settings_for(args, ram_bytes, Some((section, dev)), &own, source)?)));
    }
    one_backing_device_each(&planned)?;
    Ok(planned)
}

/// Two servers cannot share a backing device.
fn one_backing_device_each(planned: &[Planned]) -> Result<(), Failure> {
    let mut seen: Vec<(&Path, &str)> = Vec::new();
    for p in planned {
        let Planned::Device(s) = p else { continue };
        let (Some(b), Some(name)) = (s.backing.backing.as_deref(), s.section.as_deref()) else { continue };
        if let Some((_, other)) = seen.iter().find(|(seen_b, _)| *seen_b == b) {
            return Err(Failure::usage(format!(
                "[{other}] and [{name}] would share the backing device {}: give each section its own (writeback-device, or backing in compcache.conf), or set up one with --section",
                b.display()
            )));
        }
        seen.push((b, name));
    }
    Ok(())
}

/// The flags over compcache.conf's keys (`own`) over the section's zram-generator keys
/// (`conf`) over the defaults, checked by the one validation of the store flags
/// (`StoreArgs::config_for_ram`), so that a device no server would make fails here, before a
/// server is started.
fn settings_for(
    args: &SwaponArgs,
    ram_bytes: u64,
    conf: Option<(&Section, zramconf::Device)>,
    own: &OwnKeys,
    source: String,
) -> Result<Settings, Failure> {
    let (section, conf) = match conf {
        Some((s, d)) => (Some(s.name.clone()), Some(d)),
        None => (None, None),
    };
    // The flags as given, else the configuration's values (sizes in bytes), else the defaults.
    let flags = &args.store;
    let mut store = StoreArgs {
        size: flags.size.clone().or_else(|| conf.as_ref().and_then(|c| c.size_bytes).map(|b| b.to_string())),
        algorithm: flags.algorithm.clone().or_else(|| conf.as_ref().and_then(|c| c.algorithm.clone())),
        level: flags.level.or_else(|| conf.as_ref().and_then(|c| c.level)),
        mem_limit: flags.mem_limit.clone().or_else(|| conf.as_ref().and_then(|c| c.mem_limit_bytes).map(|b| b.to_string())),
        backing: own.backing_under(&flags.backing),
        recompress: flags.recompress.clone(),
        origin: None,
        readahead: None,
    };
    store.size.get_or_insert_with(|| zramconf::DEFAULT_SIZE_EXPR.to_string());
    if store.backing.backing.is_none() {
        store.backing.backing = conf.as_ref().and_then(|c| c.writeback_device.clone());
    }
    // Recompression: the flags if they say anything about it, else compcache.conf's keys if
    // they do, else what compression-algorithm asks for (a second algorithm, a dictionary).
    if store.recompress == RecompressArgs::default() {
        store.recompress = own.recompress.clone();
    }
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
    let cfg = store.config_for_ram(ram_bytes).map_err(|e| match &section {
        Some(name) => Failure::usage(format!("[{name}]: {e}")),
        None => e,
    })?;
    Ok(Settings {
        section,
        size_bytes: cfg.disksize_bytes,
        algorithm: cfg.algorithm.to_string(),
        level: store.level,
        priority: args.priority.or_else(|| conf.as_ref().and_then(|c| c.priority)).unwrap_or(zramconf::DEFAULT_PRIORITY),
        discard: !args.no_discard && conf.as_ref().is_none_or(|c| c.discard),
        frontend: args.frontend.or(own.frontend).unwrap_or(Wanted::Auto),
        reserve: args.reserve.clone().or_else(|| own.reserve.clone()).unwrap_or_else(|| "auto".into()),
        mem_limit_bytes: cfg.mem_limit_bytes,
        backing: store.backing,
        recompress: store.recompress,
        source,
    })
}

/// `plan` over `load`, as `run_swapon` calls them (without the kernel switch).
#[cfg(test)]
pub(super) fn settings(args: &SwaponArgs, ram_bytes: u64) -> Result<Option<Settings>, Failure> {
    let loaded = load(args, ram_bytes, false)?;
    Ok(plan(args, ram_bytes, loaded.as_ref())?.into_iter().find_map(|p| match p {
        Planned::Device(s) => Some(*s),
        Planned::NoDevice { .. } => None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    use crate::cmd::zramconf::paths::tests::FakeRoot;
    use crate::frontend::Frontend;

    use super::super::parse_args as args;

    const GIB: u64 = 1 << 30;

    /// The devices of `plan`, for the tests: the settings, panicking on a section without one.
    fn devices(planned: Vec<Planned>) -> Vec<Settings> {
        planned
            .into_iter()
            .map(|p| match p {
                Planned::Device(s) => *s,
                Planned::NoDevice { section, why } => panic!("[{section}]: no device: {why}"),
            })
            .collect()
    }

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

    /// `plan` over a fake root's configuration (`--config-root`), with `flags`.
    fn plan_root(root: &FakeRoot, flags: &[&str], kernel_on: bool) -> Result<Vec<Planned>, Failure> {
        let mut v = vec!["--config-root", root.0.to_str().unwrap()];
        v.extend_from_slice(flags);
        let a = args(&v);
        let loaded = load(&a, 4 * GIB, kernel_on)?;
        plan(&a, 4 * GIB, loaded.as_ref())
    }

    #[test]
    fn every_section_is_a_device_unless_one_is_named() {
        let r = FakeRoot::new("sections");
        r.write(
            "etc/systemd/zram-generator.conf",
            "[zram0]\nzram-size = 512\n[zram1]\nzram-size = 256\nswap-priority = 5\noptions = nofail\n",
        );
        let d = devices(plan_root(&r, &[], false).unwrap());
        assert_eq!(
            d.iter().map(|s| (s.section.as_deref().unwrap(), s.size_bytes, s.priority, s.discard)).collect::<Vec<_>>(),
            [("zram0", 512 << 20, 100, true), ("zram1", 256 << 20, 5, false)]
        );
        assert!(d[1].source.starts_with("[zram1] of ") && d[1].source.contains("zram-generator.conf"), "{}", d[1].source);
        let d = devices(plan_root(&r, &["--section", "zram1", "--no-discard"], false).unwrap());
        assert_eq!((d.len(), d[0].size_bytes, d[0].discard), (1, 256 << 20, false));
        // Flags apply to every device.
        let d = devices(plan_root(&r, &["--priority", "9"], false).unwrap());
        assert!(d.iter().all(|s| s.priority == 9));
        let e = plan_root(&r, &["--section", "zram7"], false).unwrap_err().to_string();
        assert!(e.contains("no [zram7] section") && e.contains("leave out --section"), "{e}");
    }

    #[test]
    fn a_section_without_a_device_does_not_stop_the_others() {
        let r = FakeRoot::new("nodevice");
        r.write(
            "etc/systemd/zram-generator.conf",
            "[zram0]\nhost-memory-limit = 1024\n[zram1]\nzram-size = 64\n[zram2]\nmount-point = /var/tmp\n",
        );
        let p = plan_root(&r, &[], false).unwrap();
        assert!(matches!(&p[0], Planned::NoDevice { section, why } if section == "zram0" && why.starts_with("host-memory-limit")), "{p:?}");
        assert!(matches!(&p[1], Planned::Device(s) if s.size_bytes == 64 << 20));
        assert!(matches!(&p[2], Planned::NoDevice { section, .. } if section == "zram2"));
        // One bad section fails them all, before anything is set up.
        r.write("etc/systemd/zram-generator.conf.d/10.conf", "[zram3]\nzram-size = -1\n");
        assert!(plan_root(&r, &[], false).unwrap_err().to_string().contains("[zram3] zram-size"));
    }

    #[test]
    fn compcache_conf_keys_over_zram_generators_under_flags() {
        let r = FakeRoot::new("own");
        r.write(
            "etc/systemd/zram-generator.conf",
            "[zram0]\nzram-size = 512\nwriteback-device = /dev/vdb\n[zram1]\nzram-size = 256\ncompression-algorithm = lz4 zstd\n",
        )
        .write("usr/lib/compcache/compcache.conf", "[zram0]\nfrontend = nbd\nreserve = 32M\n")
        .write(
            "etc/compcache/compcache.conf.d/50-local.conf",
            "[zram0]\nfrontend = fuse\nbacking = /var/b0.img\nwriteback-rate = 1M/s\n[zram1]\nrecompress = off\nswap-priority = 3\n",
        );
        let d = devices(plan_root(&r, &[], false).unwrap());
        assert_eq!((d[0].frontend, d[0].reserve.as_str()), (Wanted::One(Frontend::Fuse), "32M"), "the drop-in over the main file");
        assert_eq!(d[0].backing.backing.as_deref(), Some(Path::new("/var/b0.img")), "backing over writeback-device");
        assert_eq!(d[0].backing.writeback_rate.as_deref(), Some("1M/s"));
        assert_eq!(
            (d[1].recompress.recompress.as_deref(), d[1].priority),
            (Some("off"), 3),
            "compcache.conf over compression-algorithm's recompression"
        );
        assert_eq!(d[1].frontend, Wanted::Auto);
        let d = devices(plan_root(&r, &["--frontend", "ublk", "--reserve", "auto"], false).unwrap());
        assert_eq!((d[0].frontend, d[0].reserve.as_str()), (Wanted::One(Frontend::Ublk), "auto"));
    }

    #[test]
    fn two_devices_never_share_a_backing_device() {
        let r = FakeRoot::new("shared");
        r.write("etc/systemd/zram-generator.conf", "[zram0]\nzram-size = 64\n[zram1]\nzram-size = 64\n");
        let e = plan_root(&r, &["--backing", "/var/b.img"], false).unwrap_err().to_string();
        assert!(e.contains("[zram0] and [zram1] would share the backing device /var/b.img"), "{e}");
        assert_eq!(devices(plan_root(&r, &["--backing", "/var/b.img", "--section", "zram1"], false).unwrap()).len(), 1);
    }

    #[test]
    fn the_kernel_switch_adds_a_default_zram0() {
        let r = FakeRoot::new("kernel");
        let d = devices(plan_root(&r, &[], true).unwrap());
        assert_eq!((d.len(), d[0].section.as_deref(), d[0].size_bytes), (1, Some("zram0"), 2 * GIB));
        r.write("etc/systemd/zram-generator.conf", "[zram0]\nzram-size = 100\n[zram1]\nzram-size = 200\n");
        let d = devices(plan_root(&r, &[], true).unwrap());
        assert_eq!(d.iter().map(|s| s.size_bytes).collect::<Vec<_>>(), [100 << 20, 200 << 20], "zram0's keys still apply");
        // Without a section nor the switch: one device from the flags and defaults.
        let empty = FakeRoot::new("kernel-none");
        let d = devices(plan_root(&empty, &[], false).unwrap());
        assert_eq!((d.len(), d[0].section.as_deref()), (1, None));
    }
}
