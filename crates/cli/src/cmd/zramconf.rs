//! systemd's zram-generator configuration, read so that `compcache swapon` can stand in for a
//! zram swap device set up by it.
//!
//! The format (zram-generator.conf(5)): INI sections named `[zramN]`, one device each, with
//! `key = value` lines and `#`/`;` comments. Files are read in this order, later ones
//! overriding earlier ones key by key: `/usr/lib/systemd/zram-generator.conf`,
//! `/usr/local/lib/systemd/zram-generator.conf`, `/etc/systemd/zram-generator.conf`, then the
//! drop-ins `/etc/systemd/zram-generator.conf.d/*.conf` in name order.
//!
//! Keys understood, and what they become:
//! - `zram-size`: an arithmetic expression in MiB over `ram` (physical RAM in MiB) with
//!   `+ - * /`, parentheses, `min(a, b)` and `max(a, b)`; default `min(ram / 2, 4096)`.
//!   Becomes the device size.
//! - `compression-algorithm`: the first algorithm named (`zstd(level=3)` gives a level);
//!   algorithms compcache lacks (`lzo-rle`, `lzo`, `842`, `deflate`, `lz4hc`) become lz4 with
//!   a warning. Recompression algorithms after the first are ignored.
//! - `swap-priority`: the swap priority, default 100.
//! - `zram-resident-limit`: an expression like `zram-size`; becomes the memory limit.
//! - `host-memory-limit`: no device when RAM (MiB) is above it, as zram-generator does.
//! - `fs-type`: only `swap` (the default) is accepted.
//! - `writeback-device`: zram's `backing_dev`, a block device for pages that are better off on
//!   disk; becomes the backing device (`--backing`), which compcache also accepts as a regular
//!   file. Empty: none.
//!
//! Any other key is reported as ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// zram-generator's default `zram-size`.
pub const DEFAULT_SIZE_EXPR: &str = "min(ram / 2, 4096)";
/// zram-generator's default `swap-priority`.
pub const DEFAULT_PRIORITY: i32 = 100;

/// The files read when no `--config` is given, in override order (drop-ins after these).
pub const SYSTEM_FILES: &[&str] =
    &["/usr/lib/systemd/zram-generator.conf", "/usr/local/lib/systemd/zram-generator.conf", "/etc/systemd/zram-generator.conf"];
pub const DROP_IN_DIR: &str = "/etc/systemd/zram-generator.conf.d";

/// One `[zramN]` section: its keys as written (values trimmed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub keys: BTreeMap<String, String>,
}

/// Parses one file's text into sections, merging into `sections` (a later file's keys override
/// an earlier file's). Lines outside a section and malformed lines are errors with a line number.
pub fn parse_into(sections: &mut Vec<Section>, text: &str, origin: &str) -> Result<(), String> {
    let mut current: Option<usize> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_string();
            current = Some(match sections.iter().position(|s| s.name == name) {
                Some(i) => i,
                None => {
                    sections.push(Section { name, keys: BTreeMap::new() });
                    sections.len() - 1
                }
            });
            continue;
        }
        let (key, value) = line.split_once('=').ok_or_else(|| format!("{origin}:{}: expected `key = value` or `[section]`", n + 1))?;
        let i = current.ok_or_else(|| format!("{origin}:{}: `{}` outside any [zramN] section", n + 1, key.trim()))?;
        sections[i].keys.insert(key.trim().to_string(), value.trim().to_string());
    }
    Ok(())
}

/// Reads `explicit` if given, or else the system files and drop-ins that exist. Returns the
/// sections and the files that were read (empty when there is no configuration at all).
pub fn load(explicit: Option<&Path>) -> Result<(Vec<Section>, Vec<PathBuf>), String> {
    let mut files: Vec<PathBuf> = Vec::new();
    match explicit {
        Some(p) => files.push(p.to_path_buf()),
        None => {
            files.extend(SYSTEM_FILES.iter().map(PathBuf::from).filter(|p| p.exists()));
            if let Ok(dir) = std::fs::read_dir(DROP_IN_DIR) {
                let mut drop_ins: Vec<PathBuf> =
                    dir.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "conf")).collect();
                drop_ins.sort();
                files.extend(drop_ins);
            }
        }
    }
    let mut sections = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        parse_into(&mut sections, &text, &f.display().to_string())?;
    }
    Ok((sections, files))
}

/// What one section asks for, in compcache's terms.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// `None`: `host-memory-limit` says this machine gets no device.
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
    /// Things worth telling the user (ignored keys, substituted algorithms).
    pub notes: Vec<String>,
}

/// Recompression settings from `compression-algorithm`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recompress {
    /// The zstd level of a zstd secondary algorithm (`zstd(level=N)`).
    pub level: Option<i32>,
    /// A dictionary (`dict=PATH`, on the primary or a secondary algorithm).
    pub dict: Option<PathBuf>,
}

/// Interprets a section on a machine with `ram_mib` MiB of RAM.
pub fn interpret(section: &Section, ram_mib: f64) -> Result<Device, String> {
    let mut dev = Device {
        size_bytes: None,
        algorithm: None,
        level: None,
        priority: None,
        mem_limit_bytes: None,
        writeback_device: None,
        recompress: None,
        notes: Vec::new(),
    };
    let ctx = |key: &str, e: String| format!("[{}] {key}: {e}", section.name);
    for (key, value) in &section.keys {
        match key.as_str() {
            "zram-size" | "zram-resident-limit" | "host-memory-limit" | "compression-algorithm" | "swap-priority" | "writeback-device" => {}
            "fs-type" if value == "swap" => {}
            "fs-type" => return Err(ctx(key, format!("compcache is only swap; fs-type = {value} is not supported"))),
            _ => dev.notes.push(format!("[{}] {key} is ignored by compcache", section.name)),
        }
    }
    if let Some(limit) = section.keys.get("host-memory-limit") {
        if limit != "none" {
            let l = eval(limit, ram_mib).map_err(|e| ctx("host-memory-limit", e))?;
            if ram_mib > l {
                dev.notes.push(format!("[{}] host-memory-limit {l} MiB is below RAM ({ram_mib:.0} MiB): no device", section.name));
                return Ok(dev);
            }
        }
    }
    let size_expr = section.keys.get("zram-size").map_or(DEFAULT_SIZE_EXPR, String::as_str);
    let mib = eval(size_expr, ram_mib).map_err(|e| ctx("zram-size", e))?;
    if mib <= 0.0 {
        return Err(ctx("zram-size", format!("`{size_expr}` is {mib} MiB: no device to make")));
    }
    let bytes = mib_to_pages_bytes(mib);
    if bytes == 0 {
        return Err(ctx("zram-size", format!("`{size_expr}` is {mib} MiB, less than one 4 KiB page: no device to make")));
    }
    dev.size_bytes = Some(bytes);
    if let Some(expr) = section.keys.get("zram-resident-limit") {
        let mib = eval(expr, ram_mib).map_err(|e| ctx("zram-resident-limit", e))?;
        dev.mem_limit_bytes = Some(mib_to_pages_bytes(mib.max(0.0)));
    }
    if let Some(alg) = section.keys.get("compression-algorithm") {
        let specs = parse_algorithms(alg).map_err(|e| ctx("compression-algorithm", e))?;
        interpret_algorithms(&section.name, &specs, &mut dev);
    }
    dev.writeback_device = section.keys.get("writeback-device").filter(|p| !p.is_empty()).map(PathBuf::from);
    if let Some(p) = section.keys.get("swap-priority") {
        let p: i32 = p.parse().map_err(|_| ctx("swap-priority", format!("`{p}` is not a number")))?;
        dev.priority = Some(p);
    }
    Ok(dev)
}

fn mib_to_pages_bytes(mib: f64) -> u64 {
    ((mib * 1048576.0) as u64) / 4096 * 4096
}

/// `zstd(level=3)`, `lzo-rle`, `lz4 zstd(level=9) (type=idle)`: the first algorithm and its level.
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

/// How deeply an expression may nest (parentheses, function arguments, unary minus). The
/// parser recurses once per level: without a bound, a file of a few hundred thousand `(`
/// overflows the stack and kills the process instead of giving an error.
pub const MAX_DEPTH: u32 = 100;

/// Evaluates a zram-size expression (result in MiB) with `ram` bound to `ram_mib`.
pub fn eval(expr: &str, ram_mib: f64) -> Result<f64, String> {
    let mut p = Parser { s: expr.as_bytes(), i: 0, ram: ram_mib, depth: 0 };
    let v = p.sum()?;
    p.skip_ws();
    if p.i != p.s.len() {
        return Err(format!("`{expr}`: unexpected `{}`", &expr[p.i..]));
    }
    if !v.is_finite() {
        return Err(format!("`{expr}` is not a finite number"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    ram: f64,
    /// `unary` calls in progress: every recursion of the parser goes through `unary`.
    depth: u32,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn sum(&mut self) -> Result<f64, String> {
        let mut v = self.product()?;
        loop {
            if self.eat(b'+') {
                v += self.product()?;
            } else if self.eat(b'-') {
                v -= self.product()?;
            } else {
                return Ok(v);
            }
        }
    }
    fn product(&mut self) -> Result<f64, String> {
        let mut v = self.unary()?;
        loop {
            if self.eat(b'*') {
                v *= self.unary()?;
            } else if self.eat(b'/') {
                v /= self.unary()?;
            } else {
                return Ok(v);
            }
        }
    }
    fn unary(&mut self) -> Result<f64, String> {
        if self.depth >= MAX_DEPTH {
            return Err(format!("the expression nests deeper than {MAX_DEPTH} levels"));
        }
        self.depth += 1;
        let v = if self.eat(b'-') { self.unary().map(|v| -v) } else { self.atom() };
        self.depth -= 1;
        v
    }
    fn atom(&mut self) -> Result<f64, String> {
        self.skip_ws();
        if self.eat(b'(') {
            let v = self.sum()?;
            return if self.eat(b')') { Ok(v) } else { Err("missing `)`".into()) };
        }
        let start = self.i;
        while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'.' || self.s[self.i] == b'_') {
            self.i += 1;
        }
        let word = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
        match word {
            "" => Err(format!("expected a number, `ram`, min() or max() at offset {start}")),
            "ram" => Ok(self.ram),
            "min" | "max" => {
                if !self.eat(b'(') {
                    return Err(format!("`{word}` needs `(`"));
                }
                let a = self.sum()?;
                if !self.eat(b',') {
                    return Err(format!("`{word}` needs two arguments"));
                }
                let b = self.sum()?;
                if !self.eat(b')') {
                    return Err(format!("`{word}(` is not closed"));
                }
                Ok(if word == "min" { a.min(b) } else { a.max(b) })
            }
            w => w.parse::<f64>().map_err(|_| format!("unknown name `{w}` (only `ram`, min and max)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_expressions_evaluate_as_zram_generator_does() {
        assert_eq!(eval(DEFAULT_SIZE_EXPR, 2048.0).unwrap(), 1024.0);
        assert_eq!(eval(DEFAULT_SIZE_EXPR, 16384.0).unwrap(), 4096.0);
        assert_eq!(eval("ram", 300.0).unwrap(), 300.0);
        assert_eq!(eval("min(ram * 2, 4096)", 300.0).unwrap(), 600.0);
        assert_eq!(eval("max(512, ram / 4) + 1", 1024.0).unwrap(), 513.0);
        assert_eq!(eval("-(2 - 8) * 2", 0.0).unwrap(), 12.0);
        assert_eq!(eval("4096", 1.0).unwrap(), 4096.0);
        assert!(eval("ram +", 1.0).is_err());
        assert!(eval("disk", 1.0).unwrap_err().contains("unknown name"));
        assert!(eval("min(1)", 1.0).is_err());
        assert!(eval("ram / 0", 1.0).is_err());
    }

    /// Found by the zramconf fuzz target: `ram / 22222222222222` is above 0 MiB but rounds
    /// down to 0 bytes, which became a device of size 0 instead of an error.
    #[test]
    fn a_size_below_one_page_is_an_error() {
        let mut s = Vec::new();
        parse_into(&mut s, "[zram0]\nzram-size = ram / 22222222222222\n", "t").unwrap();
        assert!(interpret(&s[0], 1024.0).unwrap_err().contains("less than one 4 KiB page"));
        parse_into(&mut s, "[zram0]\nzram-size = 0.004\n", "t").unwrap();
        assert_eq!(interpret(&s[0], 1024.0).unwrap().size_bytes, Some(4096));
    }

    /// Deep nesting is an error, not a stack overflow that kills `compcache swapon`.
    #[test]
    fn deep_nesting_is_an_error() {
        for depth in [100_000, MAX_DEPTH as usize + 1] {
            let parens = "(".repeat(depth) + "1" + &")".repeat(depth);
            assert!(eval(&parens, 1.0).unwrap_err().contains("nests deeper"), "{depth} parentheses");
            assert!(eval(&("-".repeat(depth) + "1"), 1.0).unwrap_err().contains("nests deeper"), "{depth} minus signs");
            let mins = "min(1, ".repeat(depth) + "1" + &")".repeat(depth);
            assert!(eval(&mins, 1.0).unwrap_err().contains("nests deeper"), "{depth} min()");
        }
        let ok = "(".repeat(MAX_DEPTH as usize - 1) + "ram" + &")".repeat(MAX_DEPTH as usize - 1);
        assert_eq!(eval(&ok, 7.0).unwrap(), 7.0);
        assert_eq!(eval("--3", 0.0).unwrap(), 3.0);
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
        interpret(&s[0], 1024.0).unwrap()
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
        let text = "# comment\n[zram0]\nzram-size = ram / 2\ncompression-algorithm = zstd(level=5)\nswap-priority = 50\nzram-resident-limit = 256\nwriteback-device = /dev/disk/by-partuuid/2d54ffa0-01\noptions = discard\n";
        let mut s = Vec::new();
        parse_into(&mut s, text, "t").unwrap();
        let d = interpret(&s[0], 1024.0).unwrap();
        assert_eq!(d.size_bytes, Some(512 << 20));
        assert_eq!((d.algorithm.as_deref(), d.level, d.priority), (Some("zstd"), Some(5), Some(50)));
        assert_eq!(d.mem_limit_bytes, Some(256 << 20));
        assert_eq!(d.writeback_device, Some(PathBuf::from("/dev/disk/by-partuuid/2d54ffa0-01")));
        assert!(!d.notes.iter().any(|n| n.contains("writeback-device")), "writeback-device is understood: {:?}", d.notes);
        assert!(d.notes.iter().any(|n| n.contains("options is ignored")));

        // A later file overrides key by key; defaults fill the rest.
        parse_into(&mut s, "[zram0]\nswap-priority = 7\n", "u").unwrap();
        assert_eq!(interpret(&s[0], 1024.0).unwrap().priority, Some(7));
        parse_into(&mut s, "[zram0]\nwriteback-device =\n", "w").unwrap();
        assert_eq!(interpret(&s[0], 1024.0).unwrap().writeback_device, None, "an empty value is no device");
        let mut e = Vec::new();
        parse_into(&mut e, "[zram0]\n", "v").unwrap();
        assert_eq!(interpret(&e[0], 1024.0).unwrap().size_bytes, Some(512 << 20));
    }

    #[test]
    fn limits_and_errors() {
        let mut s = Vec::new();
        parse_into(&mut s, "[zram0]\nhost-memory-limit = 512\ncompression-algorithm = lzo-rle\n", "t").unwrap();
        assert_eq!(interpret(&s[0], 1024.0).unwrap().size_bytes, None);
        let d = interpret(&s[0], 256.0).unwrap();
        assert_eq!(d.algorithm.as_deref(), Some("lz4"));
        assert!(d.notes[0].contains("using lz4"));
        let mut f = Vec::new();
        parse_into(&mut f, "[zram1]\nfs-type = ext4\n", "t").unwrap();
        assert!(interpret(&f[0], 1024.0).unwrap_err().contains("only swap"));
        assert!(parse_into(&mut Vec::new(), "zram-size = 1\n", "x").unwrap_err().contains("outside"));
    }
}
