//! systemd's zram-generator configuration, read so that `compcache swapon` can stand in for the
//! zram swap devices zram-generator sets up, and compcache's own file beside it.
//!
//! The parts, in the order a configuration goes through them:
//! - `paths.rs`: which files (the search paths, drop-ins, `/dev/null` masks, under a root);
//! - `ini.rs`: one file's text into sections and `key = value` entries (rust-ini's rules);
//! - `directives.rs`: the global section's `set!VAR = program` lines;
//! - this file: the `[zramN]` sections of every file merged key by key (later files win),
//!   obsolete key names renamed, compcache's own keys kept apart, in [`load`];
//! - `crate::expr` (`src/expr.rs`, a floor below every command, since the size flags take
//!   the same expressions): the size expressions; `device.rs`: one section into what
//!   compcache makes of it; `cmdline.rs`: the `systemd.zram=` kernel switch.
//!
//! Pure except for reading the files and running `set!` programs (through the runner the
//! caller passes). docs/swap.md has the key-by-key table of what compcache does with each key.

pub mod cmdline;
pub mod device;
pub mod directives;
pub mod ini;
pub mod paths;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::expr::Vars;
pub use device::{interpret, Device, DEFAULT_PRIORITY, DEFAULT_SIZE_EXPR};
pub use directives::{run_with_sh, ProgramOutput};

/// The keys compcache adds to zram-generator's: read from compcache's own file
/// (`/etc/compcache/compcache.conf` and the other places `paths::COMPCACHE` names), never from
/// zram-generator.conf, where zram-generator would warn about them. Each is the `swapon` flag
/// of the same name; `swapon` gives them their meaning (`swapon/own_keys.rs`).
pub const COMPCACHE_KEYS: &[&str] = &[
    "frontend",
    "reserve",
    "backing",
    "backing-size",
    "writeback-high",
    "writeback-low",
    "writeback-limit",
    "writeback-rate",
    "backing-incompressible",
    "backing-plaintext",
    "cold-tier",
    "cold-idle",
    "cold-level",
    "recompress",
    "recompress-idle",
    "recompress-level",
    "recompress-threshold",
    "recompress-cpu",
    "dict",
];

/// Obsolete zram-generator key names that mean another key exactly.
const RENAMED: &[(&str, &str)] = &[("memory-limit", "host-memory-limit")];

/// One `[zramN]` device: its zram-generator keys as written (values trimmed; compcache.conf's
/// over zram-generator.conf's), and compcache's own keys from compcache.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub keys: BTreeMap<String, String>,
    pub own: BTreeMap<String, String>,
}

/// A configuration read: its devices (sorted by number), the files read and masked, the
/// `set!` variables, and what is worth telling the user.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub sections: Vec<Section>,
    pub files: Vec<PathBuf>,
    pub masked: Vec<PathBuf>,
    pub vars: Vars,
    pub warnings: Vec<String>,
}

impl Loaded {
    /// The section named `name`, added with no keys (zram-generator's defaults) if missing:
    /// what `systemd.zram=1` does with `zram0`.
    pub fn ensure_section(&mut self, name: &str) {
        if !self.sections.iter().any(|s| s.name == name) {
            self.sections.push(Section { name: name.to_string(), ..Section::default() });
            sort_sections(&mut self.sections);
        }
    }
}

/// Where to read from.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// The root the search paths are under (`/`; a fake tree in tests, `swapon --config-root`).
    pub root: &'a Path,
    /// A zram-generator file read instead of the search (`swapon --config`); compcache.conf is
    /// still searched for under `root`.
    pub explicit: Option<&'a Path>,
}

/// Reads the zram-generator configuration and compcache's file. `run` runs `set!` programs
/// (`run_with_sh`). Errors: a file that cannot be read or parsed, a `set!` that fails.
pub fn load(src: Sources, ram_mib: f64, run: &mut dyn FnMut(&str) -> Result<ProgramOutput, String>) -> Result<Loaded, String> {
    let mut out = Loaded::default();
    let zg = match src.explicit {
        Some(p) => paths::Found { files: vec![p.to_path_buf()], masked: Vec::new() },
        None => paths::find(src.root, &paths::ZRAM_GENERATOR),
    };
    let own = paths::find(src.root, &paths::COMPCACHE);
    let mut sections: Vec<Section> = Vec::new();
    for (files, ours) in [(&zg.files, false), (&own.files, true)] {
        for f in files {
            let origin = f.display().to_string();
            let text = std::fs::read_to_string(f).map_err(|e| format!("{origin}: {e}"))?;
            let parsed = ini::parse(&text, &origin)?;
            if ours {
                for e in &parsed.global {
                    out.warnings.push(format!("{origin}:{}: `{}` outside any [zramN] section is ignored", e.line, e.key));
                }
            } else {
                directives::apply(&parsed.global, &origin, ram_mib, &mut out.vars, &mut out.warnings, run)?;
            }
            for s in parsed.sections {
                if !is_device_name(&s.name) {
                    out.warnings.push(format!("{origin}:{}: section [{}] is ignored (only [zramN] sections are devices)", s.line, s.name));
                    continue;
                }
                let i = section_index(&mut sections, &s.name);
                for e in s.entries {
                    let key = match RENAMED.iter().find(|(old, _)| *old == e.key) {
                        Some((old, new)) => {
                            out.warnings.push(format!("{origin}:{}: [{}] {old} is an obsolete name of {new}: rename it", e.line, s.name));
                            new.to_string()
                        }
                        None => e.key,
                    };
                    let is_own = COMPCACHE_KEYS.contains(&key.as_str());
                    if is_own && !ours {
                        out.warnings.push(format!(
                            "{origin}:{}: [{}] {key} is compcache's key, not zram-generator's (which warns about it): ignored here; put it in /etc/compcache/compcache.conf under [{}]",
                            e.line, s.name, s.name
                        ));
                        continue;
                    }
                    let map = if is_own { &mut sections[i].own } else { &mut sections[i].keys };
                    map.insert(key, e.value);
                }
            }
        }
    }
    sort_sections(&mut sections);
    out.sections = sections;
    out.files = zg.files.into_iter().chain(own.files).collect();
    out.masked = zg.masked.into_iter().chain(own.masked).collect();
    Ok(out)
}

/// The index of the section `name` in `sections`, added (empty) if it is not there yet: files
/// read later merge into the sections of earlier ones.
fn section_index(sections: &mut Vec<Section>, name: &str) -> usize {
    match sections.iter().position(|x| x.name == name) {
        Some(i) => i,
        None => {
            sections.push(Section { name: name.to_string(), ..Section::default() });
            sections.len() - 1
        }
    }
}

/// `zram` and a number: the sections zram-generator makes devices of.
fn is_device_name(name: &str) -> bool {
    name.strip_prefix("zram").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && n.parse::<u64>().is_ok())
}

fn sort_sections(sections: &mut [Section]) {
    sections.sort_by_key(|s| (s.name[4..].parse::<u64>().unwrap_or(u64::MAX), s.name.clone()));
}

/// Parses one file's text into sections, merging into `sections` (a later file's keys override
/// an earlier file's), for the fuzz target (fuzz/src/zramconf.rs) and tests: no directives,
/// no renames.
#[cfg_attr(not(test), allow(dead_code))]
pub fn parse_into(sections: &mut Vec<Section>, text: &str, origin: &str) -> Result<(), String> {
    for s in ini::parse(text, origin)?.sections {
        let i = section_index(sections, &s.name);
        for e in s.entries {
            sections[i].keys.insert(e.key, e.value);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::paths::tests::FakeRoot;
    use super::*;

    fn load_root(r: &FakeRoot) -> Result<Loaded, String> {
        load(Sources { root: &r.0, explicit: None }, 2048.0, &mut run_with_sh)
    }

    fn keys(l: &Loaded, name: &str) -> Vec<(String, String)> {
        l.sections.iter().find(|s| s.name == name).unwrap().keys.clone().into_iter().collect()
    }

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn later_files_override_key_by_key_and_sections_add_up() {
        let r = FakeRoot::new("merge");
        r.write("usr/lib/systemd/zram-generator.conf", "[zram0]\nzram-size = 100\nswap-priority = 1\n")
            .write("etc/systemd/zram-generator.conf", "[zram0]\nzram-size = 200\n[zram2]\n")
            .write("usr/lib/systemd/zram-generator.conf.d/20-b.conf", "[zram0]\nswap-priority = 20\n")
            .write(
                "etc/systemd/zram-generator.conf.d/10-a.conf",
                "[zram0]\nswap-priority = 10\ncompression-algorithm = zstd\n[zram10]\n[zram1]\n",
            );
        let l = load_root(&r).unwrap();
        // Only /etc's main file (the highest one there is), then 10-a, then 20-b.
        assert_eq!(keys(&l, "zram0"), kv(&[("compression-algorithm", "zstd"), ("swap-priority", "20"), ("zram-size", "200")]));
        assert_eq!(l.sections.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["zram0", "zram1", "zram2", "zram10"]);
        assert_eq!(l.files.len(), 3);
    }

    #[test]
    fn masked_files_are_not_read() {
        let r = FakeRoot::new("masked");
        r.write("usr/lib/systemd/zram-generator.conf", "[zram0]\n")
            .write("usr/lib/systemd/zram-generator.conf.d/50-vendor.conf", "[zram1]\n")
            .mask("etc/systemd/zram-generator.conf")
            .mask("etc/systemd/zram-generator.conf.d/50-vendor.conf");
        let l = load_root(&r).unwrap();
        assert!(l.sections.is_empty() && l.files.is_empty() && l.masked.len() == 2, "{l:?}");
    }

    #[test]
    fn set_variables_reach_every_section() {
        let r = FakeRoot::new("set");
        r.write("etc/systemd/zram-generator.conf", "set!quarter = echo ram / 4\n[zram0]\nzram-size = quarter\n")
            .write("etc/systemd/zram-generator.conf.d/10.conf", "set!quarter = echo 100\n");
        let l = load_root(&r).unwrap();
        assert_eq!(l.vars["quarter"], 100.0, "the drop-in's set! runs after the main file's");
        let d = interpret(&l.sections[0], 2048.0, &l.vars).unwrap();
        assert_eq!(d.size_bytes, Some(100 << 20));
    }

    #[test]
    fn other_sections_obsolete_names_and_compcache_keys() {
        let r = FakeRoot::new("warn");
        r.write(
            "etc/systemd/zram-generator.conf",
            "zram-size = 5\n[swap]\nzram-size = 1\n[zram]\n[zram0]\nmemory-limit = 4096\nfrontend = fuse\nbacking = /var/b\n",
        )
        .write("etc/compcache/compcache.conf", "[zram0]\nfrontend = fuse\nswap-priority = 7\n[zram3]\nbacking-size = 1G\n[other]\n");
        let l = load_root(&r).unwrap();
        let w = l.warnings.join("\n");
        for expected in [
            "`zram-size` outside any",
            "[swap] is ignored",
            "[zram] is ignored",
            "memory-limit is an obsolete name",
            "frontend is compcache's key",
            "[other] is ignored",
        ] {
            assert!(w.contains(expected), "{expected}: {w}");
        }
        let z0 = &l.sections[0];
        assert_eq!(z0.keys, kv(&[("host-memory-limit", "4096"), ("swap-priority", "7")]).into_iter().collect());
        assert_eq!(z0.own, kv(&[("frontend", "fuse")]).into_iter().collect(), "zram-generator.conf's backing is not taken");
        assert_eq!((l.sections[1].name.as_str(), l.sections[1].own.get("backing-size").map(String::as_str)), ("zram3", Some("1G")));
    }

    #[test]
    fn an_explicit_file_replaces_the_search_but_not_compcache_conf() {
        let r = FakeRoot::new("explicit");
        r.write("etc/systemd/zram-generator.conf", "[zram0]\nzram-size = 1\n")
            .write("mine.conf", "[zram5]\n")
            .write("etc/compcache/compcache.conf.d/10.conf", "[zram5]\nfrontend = nbd\n");
        let l = load(Sources { root: &r.0, explicit: Some(&r.0.join("mine.conf")) }, 2048.0, &mut run_with_sh).unwrap();
        assert_eq!(l.sections.len(), 1);
        assert_eq!(l.sections[0].own.get("frontend").map(String::as_str), Some("nbd"));
        assert_eq!(r.rel(&l.files), ["mine.conf", "etc/compcache/compcache.conf.d/10.conf"]);
        let mut l = l;
        l.ensure_section("zram0");
        l.ensure_section("zram5");
        assert_eq!(l.sections.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["zram0", "zram5"]);
    }

    #[test]
    fn errors_name_the_file() {
        let r = FakeRoot::new("errors");
        r.write("etc/systemd/zram-generator.conf", "[zram0]\nbroken\n");
        assert!(load_root(&r).unwrap_err().contains("etc/systemd/zram-generator.conf:2:"));
        let r = FakeRoot::new("errors-set");
        r.write("etc/systemd/zram-generator.conf", "set!x = echo nope\n");
        assert!(load_root(&r).unwrap_err().contains("zram-generator.conf:1: set!x"));
        assert!(is_device_name("zram0") && is_device_name("zram12") && !is_device_name("zram+1") && !is_device_name("zramx"));
    }
}
