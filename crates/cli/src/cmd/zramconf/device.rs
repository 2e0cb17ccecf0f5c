//! One `[zramN]` section into what compcache makes of it, key by key as zram-generator reads
//! them (its config.rs), on a machine with `ram` MiB of RAM (MemTotal) and the `set!`
//! variables:
//!
//! - `zram-size`: an expression (`crate::expr`), default `min(ram / 2, 4096)`; negative is an
//!   error; the MiB become whole bytes (truncated, as zram-generator does), and 0 bytes means
//!   no device (zram-generator discards devices of size 0); the bytes are rounded up to whole
//!   pages, as the kernel's disksize is;
//! - `zram-fraction` and `max-zram-size` (obsolete): when either is given, the size is
//!   `min(int(zram-fraction * ram), max-zram-size)` (defaults 0.5 and none) and `zram-size`
//!   is not used, as in zram-generator; a note says so;
//! - `zram-resident-limit`: an expression, `0` (default) no limit; becomes the memory limit,
//!   rounded up to whole pages as the kernel rounds zram's `mem_limit`, so that a limit above 0
//!   is never 0 ("no limit"), however small;
//! - `host-memory-limit` (obsolete name `memory-limit`, renamed by `load`): `none` or a whole
//!   number of MiB; with less than RAM, no device;
//! - `compression-algorithm`: the first algorithm and its level; later ones are zram's
//!   recompression algorithms (see `interpret_algorithms`);
//! - `swap-priority`: -1..=32767, default 100 (-1: the kernel picks, as swapon without -p);
//! - `writeback-device`: an absolute, normalised path; the backing device (empty: none);
//! - `fs-type` other than `swap`, or `mount-point`: a file system, not swap: no device;
//! - `options`: swapon's options; `discard` (any form) turns discard on, its absence off
//!   (default `discard`); other options are noted and not used;
//! - any other key: a note, never an error (zram-generator warns and goes on).

use std::path::{Component, Path, PathBuf};

use super::Section;
use crate::expr::{eval_with, Vars};

/// zram-generator's default `zram-size`.
pub const DEFAULT_SIZE_EXPR: &str = "min(ram / 2, 4096)";
/// zram-generator's default `swap-priority`.
pub const DEFAULT_PRIORITY: i32 = 100;

const PAGE: u64 = 4096;

/// What one section asks for, in compcache's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// `None`: no device on this machine (`host-memory-limit`, a size of 0, or a file system
    /// rather than swap); `notes` says why.
    pub size_bytes: Option<u64>,
    pub algorithm: Option<String>,
    pub level: Option<i32>,
    pub priority: Option<i32>,
    pub mem_limit_bytes: Option<u64>,
    /// `writeback-device`: the backing device.
    pub writeback_device: Option<PathBuf>,
    /// Recompression, asked for by a second algorithm in `compression-algorithm` (zram's
    /// `recomp_algorithm`) or a dictionary (`dict=PATH`); compcache recompresses with zstd.
    pub recompress: Option<Recompress>,
    /// `options`: whether swapon discards (zram-generator's default `discard`: yes).
    pub discard: bool,
    /// Things worth telling the user (substituted algorithms, why there is no device).
    pub notes: Vec<String>,
    /// Things worth a warning: unknown keys, obsolete keys.
    pub warnings: Vec<String>,
}

/// Recompression settings from `compression-algorithm`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recompress {
    /// The zstd level of a zstd secondary algorithm (`zstd(level=N)`).
    pub level: Option<i32>,
    /// A dictionary (`dict=PATH`, on the primary or a secondary algorithm).
    pub dict: Option<PathBuf>,
}

/// The keys zram-generator knows (after `load` renamed the obsolete `memory-limit`).
const KNOWN_KEYS: &[&str] = &[
    "zram-size",
    "zram-resident-limit",
    "host-memory-limit",
    "compression-algorithm",
    "swap-priority",
    "writeback-device",
    "fs-type",
    "mount-point",
    "options",
    "zram-fraction",
    "max-zram-size",
];

/// Interprets a section on a machine with `ram_mib` MiB of RAM and the `set!` variables `vars`.
pub fn interpret(section: &Section, ram_mib: f64, vars: &Vars) -> Result<Device, String> {
    let name = &section.name;
    let mut dev = Device {
        size_bytes: None,
        algorithm: None,
        level: None,
        priority: None,
        mem_limit_bytes: None,
        writeback_device: None,
        recompress: None,
        discard: true,
        notes: Vec::new(),
        warnings: Vec::new(),
    };
    let ctx = |key: &str, e: String| format!("[{name}] {key}: {e}");
    let get = |key: &str| section.keys.get(key).map(String::as_str);
    for key in section.keys.keys().filter(|k| !KNOWN_KEYS.contains(&k.as_str())) {
        dev.warnings.push(format!("[{name}] unknown key {key} is ignored (zram-generator ignores it too, with a warning)"));
    }
    // zram-generator compares whole MiB of MemTotal.
    let ram_whole_mib = ram_mib.floor();
    if let Some(limit) = get("host-memory-limit").map(|v| optional_mib(v).map_err(|e| ctx("host-memory-limit", e))).transpose()?.flatten() {
        if (limit as f64) < ram_whole_mib {
            dev.notes.push(format!("[{name}] host-memory-limit is {limit} MiB, and this machine has {ram_whole_mib} MiB: no device"));
            return Ok(dev);
        }
    }
    let fs_type = get("fs-type").filter(|t| *t != "swap");
    if let Some(what) = get("mount-point").map(|m| format!("mount-point = {m}")).or(fs_type.map(|t| format!("fs-type = {t}"))) {
        dev.notes.push(format!("[{name}] {what}: zram-generator makes a file system of this device; compcache makes swap only: no device"));
        return Ok(dev);
    }
    let bytes = mib_to_pages_bytes(size_mib(section, ram_mib, vars, &mut dev.warnings)?).map_err(|e| ctx("zram-size", e))?;
    if bytes == 0 {
        dev.notes.push(format!("[{name}] the size is 0 bytes: no device (zram-generator discards devices of size 0)"));
        return Ok(dev);
    }
    dev.size_bytes = Some(bytes);
    if let Some(expr) = get("zram-resident-limit") {
        let mib = eval_with(expr, ram_mib, vars).map_err(|e| ctx("zram-resident-limit", e))?;
        if mib < 0.0 {
            return Err(ctx("zram-resident-limit", format!("`{expr}` is {mib} MiB, below 0")));
        }
        let bytes = mib_to_pages_bytes(mib).map_err(|e| ctx("zram-resident-limit", e))?;
        // Below one byte, a limit truncated as a size is would be 0: no limit, the opposite of
        // what was asked. Any limit above 0 is at least one page.
        dev.mem_limit_bytes = Some(if bytes == 0 && mib > 0.0 { PAGE } else { bytes });
    }
    if let Some(alg) = get("compression-algorithm") {
        let specs = parse_algorithms(alg).map_err(|e| ctx("compression-algorithm", e))?;
        interpret_algorithms(name, &specs, &mut dev);
    }
    if let Some(p) = get("writeback-device").filter(|p| !p.is_empty()) {
        dev.writeback_device = Some(absolute_path(p).map_err(|e| ctx("writeback-device", e))?);
    }
    if let Some(p) = get("swap-priority") {
        let p: i32 = p.parse().map_err(|_| ctx("swap-priority", format!("`{p}` is not a whole number")))?;
        if !(-1..=32767).contains(&p) {
            return Err(ctx("swap-priority", format!("{p} is outside -1..=32767")));
        }
        dev.priority = Some(p);
    }
    if let Some(opts) = get("options") {
        let (discard, other): (Vec<&str>, Vec<&str>) =
            opts.split(',').map(str::trim).filter(|o| !o.is_empty()).partition(|o| *o == "discard" || o.starts_with("discard="));
        dev.discard = !discard.is_empty();
        if !other.is_empty() {
            dev.notes.push(format!("[{name}] options {}: compcache uses only discard from options; the rest is ignored", other.join(",")));
        }
    }
    Ok(dev)
}

/// The device size in MiB: `zram-size`, or the obsolete `zram-fraction`/`max-zram-size`.
fn size_mib(section: &Section, ram_mib: f64, vars: &Vars, warnings: &mut Vec<String>) -> Result<f64, String> {
    let name = &section.name;
    let get = |key: &str| section.keys.get(key).map(String::as_str);
    let (fraction, max) = (get("zram-fraction"), get("max-zram-size"));
    if fraction.is_some() || max.is_some() {
        let f = match fraction {
            Some(v) => v.parse::<f64>().ok().filter(|f| *f >= 0.0 && f.is_finite()).ok_or_else(|| {
                format!("[{name}] zram-fraction: `{v}` is not a number of 0 or more (it is obsolete: write zram-size = {v} * ram instead)")
            })?,
            None => 0.5,
        };
        let m = max.map(|v| optional_mib(v).map_err(|e| format!("[{name}] max-zram-size: {e}"))).transpose()?.flatten();
        let expr = format!("min({f} * ram, {})", m.map_or("no limit".to_string(), |m| m.to_string()));
        let ignored = if get("zram-size").is_some() { "; zram-size is not used, as zram-generator does not use it either" } else { "" };
        warnings.push(format!("[{name}] zram-fraction and max-zram-size are obsolete: read as zram-size = {expr}{ignored}"));
        return Ok(((f * ram_mib.floor()).trunc()).min(m.map_or(f64::INFINITY, |m| m as f64)));
    }
    let expr = get("zram-size").unwrap_or(DEFAULT_SIZE_EXPR);
    let mib = eval_with(expr, ram_mib, vars).map_err(|e| format!("[{name}] zram-size: {e}"))?;
    if mib < 0.0 {
        return Err(format!("[{name}] zram-size: `{expr}` is {mib} MiB, below 0"));
    }
    Ok(mib)
}

/// `none`, or a whole number of MiB (host-memory-limit, max-zram-size).
fn optional_mib(v: &str) -> Result<Option<u64>, String> {
    if v == "none" {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| format!("`{v}` is neither a whole number of MiB nor `none`"))
}

/// An absolute path without `..`, with `.` components and repeated `/` removed.
fn absolute_path(p: &str) -> Result<PathBuf, String> {
    let path = Path::new(p);
    if path.is_relative() {
        return Err(format!("`{p}` is not an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("`{p}` has `..` in it: write the path without it"));
    }
    Ok(path.components().collect())
}

/// The largest size a key may give: 2^62 bytes (4 EiB), far above any machine, and far enough
/// below 2^64 that rounding up to whole pages cannot overflow (a larger value once saturated
/// and wrapped to 0, which a memory limit reads as "no limit": found by the zramconf fuzzer).
const MAX_BYTES: f64 = (1u64 << 62) as f64;

/// Bytes, rounded up to whole pages as the kernel rounds zram's disksize and mem_limit; an
/// error above [`MAX_BYTES`] (or for a value that is not a number).
fn mib_to_pages_bytes(mib: f64) -> Result<u64, String> {
    let bytes = mib * 1048576.0;
    if !(0.0..=MAX_BYTES).contains(&bytes) {
        return Err(format!("{mib} MiB is more than any machine has (at most 4 EiB)"));
    }
    Ok((bytes as u64).div_ceil(PAGE) * PAGE)
}

/// One entry of a `compression-algorithm` list: `name`, `name(key=value, ...)`, or a bare
/// `(key=value, ...)` group (zram-generator's recompression parameters, e.g. `(type=idle)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlgorithmSpec {
    pub name: Option<String>,
    pub params: Vec<(String, String)>,
}

impl AlgorithmSpec {
    fn param(&self, key: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn level(&self) -> Result<Option<i32>, String> {
        self.param("level").map(|v| v.parse().map_err(|_| format!("level `{v}` is not a number"))).transpose()
    }
}

/// Splits a `compression-algorithm` value into its entries: the first names the primary
/// algorithm, the others zram's recompression algorithms (`recomp_algorithm`); parentheses
/// may hold spaces.
pub fn parse_algorithms(text: &str) -> Result<Vec<AlgorithmSpec>, String> {
    let mut specs = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let name_end = rest.find(|c: char| c == '(' || c.is_whitespace()).unwrap_or(rest.len());
        let name = &rest[..name_end];
        rest = &rest[name_end..];
        let mut params = Vec::new();
        if let Some(inner) = rest.strip_prefix('(') {
            let close = inner.find(')').ok_or_else(|| format!("`{text}`: a `(` is not closed"))?;
            // `key=value` pairs, separated by commas or spaces (zram's algorithm_params uses
            // spaces); spaces around `=` are allowed.
            let inner_text = inner[..close].replace(|c: char| c.is_whitespace(), " ");
            let mut words = inner_text.split([',', ' ']).filter(|w| !w.is_empty()).peekable();
            while let Some(w) = words.next() {
                let (k, v) = match w.split_once('=') {
                    Some((k, "")) => (k, words.next().unwrap_or("")),
                    Some((k, v)) => (k, v),
                    None if words.peek() == Some(&"=") => {
                        words.next();
                        (w, words.next().unwrap_or(""))
                    }
                    None => match words.peek().and_then(|n| n.strip_prefix('=')) {
                        Some(v) => {
                            words.next();
                            (w, v)
                        }
                        None => return Err(format!("`{w}` is not key=value")),
                    },
                };
                params.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
            rest = &inner[close + 1..];
        }
        if name.is_empty() && params.is_empty() {
            return Err(format!("`{text}`: an empty entry"));
        }
        specs.push(AlgorithmSpec { name: (!name.is_empty()).then(|| name.to_ascii_lowercase()), params });
        rest = rest.trim_start();
    }
    if specs.first().is_none_or(|s| s.name.is_none()) {
        return Err(format!("`{text}`: no algorithm named first"));
    }
    Ok(specs)
}

/// The primary algorithm (`dev.algorithm`, `dev.level`) and recompression (`dev.recompress`)
/// from a `compression-algorithm` list, with a note for each thing compcache does its own way.
fn interpret_algorithms(section: &str, specs: &[AlgorithmSpec], dev: &mut Device) {
    let primary = &specs[0];
    let name = primary.name.clone().unwrap_or_default();
    match name.as_str() {
        "lz4" | "lz4hc" | "zstd" => {
            dev.algorithm = Some(name.clone());
            match primary.level() {
                Ok(level) => dev.level = level,
                Err(e) => dev.notes.push(format!("[{section}] compression-algorithm {name}: {e}; using the default level")),
            }
        }
        other => {
            dev.notes.push(format!("[{section}] compression-algorithm {other}: compcache has lz4, lz4hc and zstd; using lz4"));
            dev.algorithm = Some("lz4".into());
        }
    }
    let mut recompress: Option<Recompress> = None;
    if let Some(dict) = primary.param("dict") {
        dev.notes.push(format!(
            "[{section}] compression-algorithm {name}(dict={dict}): compcache uses the dictionary for recompressed pages (--recompress on --dict {dict})"
        ));
        recompress.get_or_insert_with(Recompress::default).dict = Some(PathBuf::from(dict));
    }
    for spec in &specs[1..] {
        match spec.name.as_deref() {
            Some("zstd") => {
                let r = recompress.get_or_insert_with(Recompress::default);
                r.level = spec.level().ok().flatten().or(r.level);
                if let Some(d) = spec.param("dict") {
                    r.dict = Some(PathBuf::from(d));
                }
            }
            Some(other) => {
                dev.notes.push(format!(
                    "[{section}] recompression algorithm {other}: compcache recompresses with zstd (level 9 and a dictionary of its own)"
                ));
                recompress.get_or_insert_with(Recompress::default);
            }
            None => dev.notes.push(format!(
                "[{section}] recompression parameters ({}): compcache recompresses idle and huge pages by itself, within its CPU budget",
                spec.params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    dev.recompress = recompress;
}

#[cfg(test)]
mod tests {
    use super::super::parse_into;
    use super::*;

    fn section(text: &str) -> Section {
        let mut s = Vec::new();
        parse_into(&mut s, text, "t").unwrap();
        s.remove(0)
    }

    fn dev(text: &str, ram_mib: f64) -> Result<Device, String> {
        interpret(&section(text), ram_mib, &Vars::new())
    }

    /// Found by the zramconf fuzz target: `ram / 22222222222222` is above 0 MiB but became a
    /// device of 0 bytes. zram-generator truncates the size to whole bytes and discards a
    /// device of 0; the kernel rounds any other size up to whole pages.
    #[test]
    fn sizes_are_whole_pages_and_below_one_byte_no_device() {
        let d = dev("[zram0]\nzram-size = ram / 22222222222222\n", 1024.0).unwrap();
        assert!(d.size_bytes.is_none() && d.notes[0].contains("0 bytes: no device"), "{d:?}");
        assert_eq!(dev("[zram0]\nzram-size = 0.004\n", 1024.0).unwrap().size_bytes, Some(8192));
        assert_eq!(dev("[zram0]\nzram-size = 1\n", 1024.0).unwrap().size_bytes, Some(1 << 20));
    }

    /// Found by the zramconf fuzz target on the rewritten parser: a limit of 2.5e26 MiB
    /// saturated to u64::MAX bytes, and rounding it up to whole pages overflowed (to 0 in a
    /// release build: "no memory limit"). Sizes and limits above 4 EiB are errors.
    #[test]
    fn sizes_beyond_any_machine_are_errors_not_wrapped() {
        let e = dev("[zram0]\nzram-resident-limit = 255555555555555555555555556\n", 1024.0).unwrap_err();
        assert!(e.contains("zram-resident-limit") && e.contains("more than any machine"), "{e}");
        let e = dev("[zram0]\nzram-size = ram * 1e30\n", 1024.0).unwrap_err();
        assert!(e.contains("zram-size") && e.contains("at most 4 EiB"), "{e}");
        let d = dev("[zram0]\nzram-resident-limit = 4194304 * 1024 * 1024\n", 1024.0).unwrap();
        assert_eq!(d.mem_limit_bytes, Some(1 << 62), "4 EiB itself is allowed");
    }

    /// A limit below one byte was truncated to 0 bytes, which is no limit at all.
    #[test]
    fn a_resident_limit_above_0_is_at_least_a_page() {
        for (expr, bytes) in [("ram / 22222222222222", 4096), ("0.000001", 4096), ("0.004", 8192), ("0", 0), ("ram - ram", 0)] {
            let d = dev(&format!("[zram0]\nzram-resident-limit = {expr}\n"), 1024.0).unwrap();
            assert_eq!(d.mem_limit_bytes, Some(bytes), "{expr}");
        }
    }

    #[test]
    fn a_size_of_zero_is_no_device_and_below_zero_an_error() {
        let d = dev("[zram0]\nzram-size = ram - ram\n", 1024.0).unwrap();
        assert!(d.size_bytes.is_none() && d.notes[0].contains("size is 0"), "{d:?}");
        assert!(dev("[zram0]\nzram-size = -1\n", 1024.0).unwrap_err().contains("below 0"));
        assert!(dev("[zram0]\nzram-resident-limit = -1\n", 1024.0).unwrap_err().contains("below 0"));
    }

    #[test]
    fn algorithms_take_the_first_and_its_level() {
        let first = |t: &str| {
            let s = parse_algorithms(t).unwrap().remove(0);
            let level = s.level().unwrap();
            (s.name.unwrap(), level)
        };
        assert_eq!(first("lz4"), ("lz4".into(), None));
        assert_eq!(first("zstd(level=3)"), ("zstd".into(), Some(3)));
        assert_eq!(first("lzo-rle zstd(level=9) (type=idle)"), ("lzo-rle".into(), None));
    }

    fn device_of(alg: &str) -> Device {
        let mut s = Vec::new();
        parse_into(&mut s, &format!("[zram0]\ncompression-algorithm = {alg}\n"), "t").unwrap();
        interpret(&s[0], 1024.0, &Vars::new()).unwrap()
    }

    #[test]
    fn secondary_algorithms_and_dictionaries_become_recompression() {
        let d = device_of("lz4 zstd(level=12, dict=/etc/zram.dict) (type=idle)");
        assert_eq!((d.algorithm.as_deref(), d.level), (Some("lz4"), None));
        assert_eq!(d.recompress, Some(Recompress { level: Some(12), dict: Some("/etc/zram.dict".into()) }));
        assert!(d.notes.iter().any(|n| n.contains("type=idle")), "{:?}", d.notes);
        let d = device_of("zstd(level=3,dict=/d)");
        assert_eq!((d.algorithm.as_deref(), d.level), (Some("zstd"), Some(3)));
        assert_eq!(d.recompress, Some(Recompress { level: None, dict: Some("/d".into()) }));
        let d = device_of("lzo-rle lz4hc (type=huge)");
        assert_eq!((d.algorithm.as_deref(), d.recompress.clone()), (Some("lz4"), Some(Recompress::default())));
        assert_eq!(device_of("lz4hc(level=10)").recompress, None);
        assert_eq!(device_of("lz4hc(level=10)").level, Some(10));
        let both = vec![("level".into(), "3".into()), ("dict".into(), "/a".into())];
        assert_eq!(parse_algorithms("zstd( level = 3 , dict=/a )").unwrap()[0].params, both);
        assert_eq!(parse_algorithms("zstd(level=3 dict=/a)").unwrap()[0].params, both);
        assert_eq!(parse_algorithms("zstd(level =3,dict= /a)").unwrap()[0].params, both);
        assert!(parse_algorithms("zstd(level)").is_err());
        assert!(parse_algorithms("(type=idle)").is_err() && parse_algorithms("zstd(level=3").is_err());
    }

    #[test]
    fn a_config_file_becomes_a_device() {
        let text = "# comment\n[zram0]\nzram-size = ram / 2\ncompression-algorithm = zstd(level=5)\nswap-priority = 50\nzram-resident-limit = 256\nwriteback-device = /dev/disk//by-partuuid/./2d54ffa0-01\nfrobnicate = yes\n";
        let d = dev(text, 1024.0).unwrap();
        assert_eq!(d.size_bytes, Some(512 << 20));
        assert_eq!((d.algorithm.as_deref(), d.level, d.priority), (Some("zstd"), Some(5), Some(50)));
        assert_eq!(d.mem_limit_bytes, Some(256 << 20));
        assert_eq!(d.writeback_device, Some(PathBuf::from("/dev/disk/by-partuuid/2d54ffa0-01")));
        assert!(d.discard, "zram-generator's default options are discard");
        assert_eq!(d.warnings, ["[zram0] unknown key frobnicate is ignored (zram-generator ignores it too, with a warning)"]);

        // A later file overrides key by key; defaults fill the rest.
        let mut s = Vec::new();
        parse_into(&mut s, text, "t").unwrap();
        parse_into(&mut s, "[zram0]\nswap-priority = 7\nwriteback-device =\n", "u").unwrap();
        let d = interpret(&s[0], 1024.0, &Vars::new()).unwrap();
        assert_eq!((d.priority, d.writeback_device), (Some(7), None), "an empty writeback-device is none");
        assert_eq!(dev("[zram0]\n", 1024.0).unwrap().size_bytes, Some(512 << 20));
        assert!(dev("[zram0]\nwriteback-device = dev/vdb\n", 1.0).unwrap_err().contains("not an absolute path"));
        assert!(dev("[zram0]\nwriteback-device = /dev/../vdb\n", 1.0).unwrap_err().contains("`..`"));
    }

    #[test]
    fn host_memory_limit() {
        let d = dev("[zram0]\nhost-memory-limit = 512\ncompression-algorithm = lzo-rle\n", 1024.0).unwrap();
        assert_eq!(d.size_bytes, None);
        assert!(d.notes[0].contains("host-memory-limit is 512 MiB"), "{:?}", d.notes);
        let d = dev("[zram0]\nhost-memory-limit = 512\ncompression-algorithm = lzo-rle\n", 256.0).unwrap();
        assert_eq!(d.algorithm.as_deref(), Some("lz4"));
        assert!(d.notes[0].contains("using lz4"));
        // The limit is compared with whole MiB of RAM: equal (or a fraction above) is a device.
        assert!(dev("[zram0]\nhost-memory-limit = 1024\n", 1024.9).unwrap().size_bytes.is_some());
        assert!(dev("[zram0]\nhost-memory-limit = 1023\n", 1024.0).unwrap().size_bytes.is_none());
        assert!(dev("[zram0]\nhost-memory-limit = none\n", 1e9).unwrap().size_bytes.is_some());
        assert!(dev("[zram0]\nhost-memory-limit = ram / 2\n", 1.0).unwrap_err().contains("neither a whole number of MiB nor `none`"));
    }

    #[test]
    fn obsolete_fraction_and_max_size() {
        let d = dev("[zram0]\nzram-fraction = 0.25\nzram-size = 10\n", 4000.0).unwrap();
        assert_eq!(d.size_bytes, Some(1000 << 20));
        assert!(d.warnings[0].contains("zram-size = min(0.25 * ram, no limit); zram-size is not used"), "{:?}", d.warnings);
        assert_eq!(dev("[zram0]\nmax-zram-size = 300\n", 4000.0).unwrap().size_bytes, Some(300 << 20), "fraction 0.5 by default");
        assert_eq!(dev("[zram0]\nzram-fraction = 1\nmax-zram-size = none\n", 4000.5).unwrap().size_bytes, Some(4000 << 20));
        // int(fraction * ram): 0.3 * 1001 = 300.3 becomes 300 MiB.
        assert_eq!(dev("[zram0]\nzram-fraction = 0.3\n", 1001.0).unwrap().size_bytes, Some(300 << 20));
        assert!(dev("[zram0]\nzram-fraction = -1\n", 1.0).unwrap_err().contains("zram-fraction"));
        assert!(dev("[zram0]\nmax-zram-size = 1G\n", 1.0).unwrap_err().contains("max-zram-size"));
    }

    #[test]
    fn file_systems_priorities_and_options() {
        for text in ["[zram1]\nfs-type = ext4\n", "[zram1]\nmount-point = /var/tmp\n", "[zram1]\nmount-point = /x\nfs-type = swap\n"] {
            let d = dev(text, 1024.0).unwrap();
            assert!(d.size_bytes.is_none() && d.notes[0].contains("compcache makes swap only"), "{text}: {d:?}");
        }
        assert!(dev("[zram1]\nfs-type = swap\n", 1024.0).unwrap().size_bytes.is_some());
        assert_eq!(dev("[zram0]\nswap-priority = -1\n", 1.0).unwrap().priority, Some(-1));
        assert!(dev("[zram0]\nswap-priority = 32768\n", 1.0).unwrap_err().contains("outside -1..=32767"));
        assert!(dev("[zram0]\nswap-priority = high\n", 1.0).is_err());
        assert!(!dev("[zram0]\noptions = nofail\n", 1.0).unwrap().discard);
        let d = dev("[zram0]\noptions = discard=pages, nofail\n", 1.0).unwrap();
        assert!(d.discard && d.notes[0].contains("nofail"), "{d:?}");
        assert!(!dev("[zram0]\noptions =\n", 1.0).unwrap().discard);
    }
}
