//! `compcache stat`: statistics of a running device, through its control socket.

use crate::failure::Failure;
use crate::table::{self, Align};
use crate::target::Target;
use crate::units::human;
use compcache_control::{self as control, Uses};
use compcache_store::stats::{unit_of, Unit, UNITS};
use compcache_store::Stats;
use serde_json::{json, Map, Value};

/// Show the statistics of a running device (zram's names and units).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print every statistic as one JSON object.
    #[arg(long, conflicts_with_all = ["ramzswap", "mm_stat", "prometheus"])]
    json: bool,

    /// Print the statistics as Prometheus/OpenMetrics text, e.g. for node_exporter's textfile
    /// collector (docs/metrics.md).
    #[arg(long, conflicts_with_all = ["ramzswap", "mm_stat"])]
    prometheus: bool,

    /// Print the /proc/ramzswap view of the original compcache.
    #[arg(long, conflicts_with = "mm_stat")]
    ramzswap: bool,

    /// Print zram's mm_stat line (same columns and units as /sys/block/zramN/mm_stat).
    #[arg(long)]
    mm_stat: bool,

    /// List every counter, also those of features the device does not use (cache, backing
    /// device, recompression, dictionary); --json, --prometheus, --mm-stat and --ramzswap
    /// always have every one.
    #[arg(long, conflicts_with_all = ["json", "prometheus", "ramzswap", "mm_stat"])]
    all: bool,

    #[command(flatten)]
    target: Target,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.target.control_socket()?;
    let answer = control::request(&path, &json!({"cmd": "stat"}))?;
    let text = |key: &str| answer.get(key).and_then(Value::as_str).unwrap_or_default().to_string();
    let stats = answer
        .get("stats")
        .and_then(Value::as_object)
        .ok_or_else(|| Failure::new("the server's answer has no statistics (a different compcache version?)"))?;
    let origin = answer.pointer("/device/origin").and_then(Value::as_str);
    if args.prometheus {
        print!("{}", crate::metrics::render(vec![answer]));
    } else if args.json {
        let mut stats = stats.clone();
        if let Some(origin) = origin {
            stats.insert("origin".into(), Value::from(origin));
            stats.insert("cache_hit_ratio".into(), hit_ratio(&stats).map_or(Value::Null, Value::from));
        }
        // Beside the statistics (whose names are zram's and never collide with these): the
        // layout's version and the device (the control answer's `device`, and its protocol).
        stats.insert("schema_version".into(), Value::from(SCHEMA_VERSION));
        stats.insert("device".into(), answer.get("device").cloned().unwrap_or(Value::Null));
        stats.insert("protocol".into(), answer.get("protocol").cloned().unwrap_or(Value::from(1)));
        println!("{}", serde_json::to_string_pretty(&Value::Object(stats)).unwrap_or_default());
    } else if args.ramzswap {
        print!("{}", text("ramzswap"));
    } else if args.mm_stat {
        println!("{}", text("mm_stat"));
    } else {
        // As `list` names it: the block device of a swap server, the NBD socket (or TCP
        // address) of `serve`.
        let name = crate::metrics::name_of(&answer).unwrap_or_else(|| "?".into());
        let uses = uses_of(&answer);
        let shown = |k: &str| args.all || used(&uses, k);
        print!("{}", table(&name, origin, stats, &shown));
    }
    Ok(())
}

/// The version of `--json`'s layout (the statistics as one flat object, plus `device`,
/// `protocol` and this): raised when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u64 = 1;

/// What the device uses (the control answer's `uses`, protocol 3). From an older server,
/// which does not say: cache mode if it names an origin, and every other feature, so that
/// nothing it counts is hidden.
fn uses_of(answer: &Value) -> Uses {
    match answer.get("uses").and_then(|u| serde_json::from_value(u.clone()).ok()) {
        Some(u) => u,
        None => Uses {
            cache: answer.pointer("/device/origin").is_some_and(|o| !o.is_null()),
            backing: true,
            recompress: true,
            dictionary: true,
        },
    }
}

/// Whether counter `name` means something on a device that uses `uses`: the counters of a
/// feature (cache mode, a backing device, recompression, its dictionary) only when the
/// device's configuration has it; the others always. By name prefix, as the counters are
/// named (`compcache_store::Stats`).
fn used(uses: &Uses, name: &str) -> bool {
    /// A counter name prefix, and whether a device uses what counters of that name count.
    type Group = (&'static str, fn(&Uses) -> bool);
    const GROUPS: [Group; 9] = [
        ("cache_", |u| u.cache),
        ("origin_", |u| u.cache),
        ("readahead_", |u| u.cache),
        ("bd_", |u| u.backing),
        // The dictionary's before recompression's: `recomp_dict_` is also `recomp_`.
        ("recomp_dict_", |u| u.dictionary),
        ("dict_", |u| u.dictionary),
        ("dicts_", |u| u.dictionary),
        ("recomp_", |u| u.recompress),
        ("recompress_", |u| u.recompress),
    ];
    GROUPS.iter().find(|(prefix, _)| name.starts_with(prefix)).is_none_or(|(_, on)| on(uses))
}

/// A statistic as a number (0 when absent: an older server).
fn count(stats: &Map<String, Value>, key: &str) -> u64 {
    stats.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// The cache's hit ratio ([`Stats::cache_hit_ratio`], the one definition), from the statistics
/// as the server sent them; `None` before the first read.
fn hit_ratio(stats: &Map<String, Value>) -> Option<f64> {
    serde_json::from_value::<Stats>(Value::Object(stats.clone())).unwrap_or_default().cache_hit_ratio()
}

/// The cache line under the summary: what the cache served and what it cost the origin
/// (bytes read and written, syncs).
fn cache_lines(origin: &str, stats: &Map<String, Value>) -> String {
    let c = |k| count(stats, k).to_string();
    let headers = ["CACHE OF", "HITS", "MISSES", "HIT%", "INSERTS", "EVICTED", "ORIGIN-RD", "ORIGIN-WR", "SYNCS", "RA-USED", "RA-WASTED"];
    let mut align = vec![Align::Right; headers.len()];
    align[0] = Align::Left;
    let row = vec![
        origin.to_string(),
        c("cache_hits"),
        c("cache_misses"),
        hit_ratio(stats).map_or("-".into(), |r| format!("{:.1}", r * 100.0)),
        c("cache_inserts"),
        c("cache_evictions"),
        human(count(stats, "origin_read_bytes")),
        human(count(stats, "origin_write_bytes")),
        c("origin_syncs"),
        c("readahead_used"),
        c("readahead_wasted"),
    ];
    table::format(Some(&headers), &align, &[row]) + "\n"
}

/// The zramctl-like summary line (`Stats::summary`), for a cache device (`origin`) the cache
/// line, then every field `shown` keeps with its unit (`compcache_store::stats::UNITS`, in
/// their order); fields the server has and the table does not (a newer server) are printed
/// after these, in name order. A last line says how many were left out, and how to see them.
fn table(name: &str, origin: Option<&str>, stats: &Map<String, Value>, shown: &dyn Fn(&str) -> bool) -> String {
    // Typed: fields an older server did not send read as 0.
    let typed: Stats = serde_json::from_value(Value::Object(stats.clone())).unwrap_or_default();
    let sum = typed.summary();
    let ratio = sum.ratio.map_or("-".into(), |r| format!("{r:.2}"));
    let algorithm = if sum.algorithm.is_empty() { "?" } else { sum.algorithm.as_str() };
    let headers = ["NAME", "ALGORITHM", "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO", "LIMIT"];
    let mut align = vec![Align::Right; headers.len()];
    align[..2].fill(Align::Left);
    let row = vec![
        name.to_string(),
        algorithm.to_string(),
        human(sum.disksize),
        human(sum.data_bytes),
        human(sum.compr_bytes),
        human(sum.total_bytes),
        ratio,
        if sum.mem_limit > 0 { human(sum.mem_limit) } else { "none".into() },
    ];
    let mut out = table::format(Some(&headers), &align, &[row]) + "\n";
    if let Some(origin) = origin {
        out += &cache_lines(origin, stats);
    }
    let mut keys: Vec<&str> = UNITS.iter().map(|(k, _)| *k).filter(|k| stats.contains_key(*k)).collect();
    let mut extra: Vec<&str> = stats.keys().map(String::as_str).filter(|k| unit_of(k).is_none()).collect();
    extra.sort_unstable();
    keys.extend(extra);
    let all = keys.len();
    keys.retain(|k| shown(k));
    for &k in &keys {
        let unit = unit_of(k);
        let value = match &stats[k] {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let shown = match (unit, stats[k].as_u64()) {
            (Some(Unit::Bytes), Some(b)) if b >= 1024 => format!("{value} ({})", human(b)),
            _ => value,
        };
        let label = unit.map_or("", Unit::label);
        out += &format!("{k:<20} {shown:>16} {label}\n").replace(" \n", "\n");
    }
    if keys.len() < all {
        out += &format!("({} counters of features this device does not use left out; --all lists them)\n", all - keys.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_the_summary_and_every_field() {
        let stats = json!({
            "disksize": 1u64 << 30, "comp_algorithm": "lz4", "orig_data_size": 8u64 << 20,
            "compr_data_size": 2u64 << 20, "mem_used_total": 4u64 << 20, "mem_limit": 0,
            "num_writes": 2048, "a_new_field": 7
        });
        let t = table("/run/compcache/compcache.sock", None, stats.as_object().unwrap(), &|_| true);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME") && lines[0].contains("DISKSIZE") && lines[0].contains("TOTAL"));
        assert!(lines[1].contains("lz4") && lines[1].contains("1G") && lines[1].contains("8M") && lines[1].contains("2.00"));
        assert!(t.contains("orig_data_size") && t.contains("8388608 (8M) bytes"));
        assert!(t.contains("num_writes") && t.contains("2048 pages"));
        let last: Vec<&str> = lines.last().unwrap().split_whitespace().collect();
        assert_eq!(last, ["a_new_field", "7"], "unknown fields come last: {t}");
    }

    #[test]
    fn a_long_device_name_keeps_the_columns_in_line() {
        let stats = json!({"disksize": 1u64 << 30, "comp_algorithm": "lz4", "orig_data_size": 8u64 << 20, "mem_used_total": 4u64 << 20});
        let name = "/run/user/1000/compcache/a-device-with-a-long-descriptive-name.sock";
        let t = table(name, None, stats.as_object().unwrap(), &|_| true);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0].find("ALGORITHM"), lines[1].find("lz4"), "{t}");
        assert_eq!(lines[0].len(), lines[1].len(), "right-aligned columns end together: {t}");
    }

    #[test]
    fn a_cache_device_shows_its_counters_and_a_swap_device_does_not() {
        let stats = json!({
            "disksize": 1u64 << 30, "comp_algorithm": "lz4", "orig_data_size": 8u64 << 20,
            "compr_data_size": 2u64 << 20, "mem_used_total": 4u64 << 20, "mem_limit": 64u64 << 20,
            "cache_hits": 300, "cache_misses": 100, "cache_inserts": 100, "cache_evictions": 20,
            "origin_reads": 10, "origin_read_bytes": 409600, "origin_writes": 5, "origin_write_bytes": 20480, "origin_syncs": 3,
            "readahead_pages": 64, "readahead_used": 50, "readahead_wasted": 4
        });
        let stats = stats.as_object().unwrap();
        assert_eq!(hit_ratio(stats), Some(0.75));
        let cache = Uses { cache: true, ..Uses::default() };
        let t = table("/run/compcache/compcache.sock", Some("/var/lib/disk.img"), stats, &|k| used(&cache, k));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[3].starts_with("CACHE OF") && lines[3].contains("HIT%"), "{t}");
        let row: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(row, ["/var/lib/disk.img", "300", "100", "75.0", "100", "20", "400K", "20K", "3", "50", "4"], "{t}");
        assert!(t.contains("cache_hits") && t.contains("origin_read_bytes"), "every counter listed: {t}");
        // The mm_stat figures stay next to them.
        assert!(t.contains("orig_data_size") && t.contains("mem_used_total"), "{t}");

        let t = table("/run/compcache/compcache.sock", None, stats, &|k| used(&Uses::default(), k));
        assert!(!t.contains("CACHE OF") && !t.contains("cache_hits") && !t.contains("origin_reads"), "{t}");
        assert_eq!(hit_ratio(json!({"cache_hits": 0}).as_object().unwrap()), None);
    }

    /// Every counter the store has, as the server sends them (zeroes, as on a fresh device).
    fn every_counter() -> Map<String, Value> {
        let Value::Object(m) = serde_json::to_value(Stats::default()).unwrap() else { panic!("Stats is an object") };
        m
    }

    #[test]
    fn the_table_lists_the_counters_of_what_the_device_uses() {
        let stats = every_counter();
        let lines = |uses: Uses| {
            let t = table("/dev/ublkb0", None, &stats, &|k| used(&uses, k));
            t.lines().map(|l| l.split_whitespace().next().unwrap_or("").to_string()).collect::<Vec<String>>()
        };
        let has = |l: &[String], p: &str| l.iter().any(|k| k.starts_with(p));
        // A plain swap device: no cache, backing, recompression or dictionary counters, and a
        // line saying how many were left out.
        let plain = lines(Uses::default());
        for p in ["cache_", "origin_", "readahead_", "bd_", "recomp_", "recompress_", "dict_", "dicts_"] {
            assert!(!has(&plain, p), "{p}* on a plain device: {plain:?}");
        }
        for k in ["orig_data_size", "mem_used_total", "same_pages", "huge_pages", "num_writes", "notify_free"] {
            assert!(plain.iter().any(|l| l == k), "{k} missing: {plain:?}");
        }
        let t = table("/dev/ublkb0", None, &stats, &|k| used(&Uses::default(), k));
        assert!(t.trim_end().ends_with("left out; --all lists them)"), "{t}");
        // Each feature brings its own counters, zero or not.
        let backing = lines(Uses { backing: true, ..Uses::default() });
        assert!(has(&backing, "bd_count") && has(&backing, "bd_writeback_pages") && !has(&backing, "recomp_"), "{backing:?}");
        let recompress = lines(Uses { recompress: true, ..Uses::default() });
        assert!(has(&recompress, "recompress_done") && has(&recompress, "recomp_pages"), "{recompress:?}");
        assert!(!has(&recompress, "recomp_dict_") && !has(&recompress, "dict_version"), "{recompress:?}");
        let dict = lines(Uses { recompress: true, dictionary: true, ..Uses::default() });
        assert!(has(&dict, "recomp_dict_pages") && has(&dict, "dicts_live") && has(&dict, "dict_gain_permille"), "{dict:?}");
        // --all: every counter, and no line about left-out ones.
        let t = table("/dev/ublkb0", None, &stats, &|_| true);
        assert_eq!(t.lines().count(), 3 + stats.len(), "{t}");
        assert!(!t.contains("left out"), "{t}");
    }

    #[test]
    fn what_a_device_uses_comes_from_the_control_answer() {
        let a = json!({"uses": {"cache": false, "backing": true, "recompress": false, "dictionary": false}, "device": {"origin": null}});
        assert_eq!(uses_of(&a), Uses { backing: true, ..Uses::default() });
        // An older server does not say: nothing is hidden but a swap device's cache counters.
        let old = json!({"device": {"export_name": "/dev/ublkb0"}});
        assert_eq!(uses_of(&old), Uses { cache: false, backing: true, recompress: true, dictionary: true });
        let old_cache = json!({"device": {"origin": "/var/lib/disk.img"}});
        assert!(uses_of(&old_cache).cache);
    }
}
