//! `compcache stat`: statistics of a running device, through its control socket.

use crate::failure::Failure;
use crate::paths;
use crate::table::{self, Align};
use crate::units::human;
use compcache_control as control;
use compcache_store::stats::{unit_of, Unit, UNITS};
use compcache_store::Stats;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

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

    /// Control socket of the server [default: the default NBD socket path + .ctl].
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.control.unwrap_or_else(paths::default_control);
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
        // The NBD socket, else the TCP address, else the export name (a ublk or kernel-NBD
        // device puts its /dev path there).
        let name = ["/device/nbd_socket", "/device/nbd_tcp", "/device/export_name"]
            .iter()
            .find_map(|p| answer.pointer(p).and_then(Value::as_str))
            .unwrap_or("?");
        print!("{}", table(name, origin, stats));
    }
    Ok(())
}

/// The version of `--json`'s layout (the statistics as one flat object, plus `device`,
/// `protocol` and this): raised when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u64 = 1;

/// The counters only a cache device has (zero on a swap device, whose table leaves them out).
const CACHE_FIELD_PREFIXES: [&str; 3] = ["cache_", "origin_", "readahead_"];

fn is_cache_field(name: &str) -> bool {
    CACHE_FIELD_PREFIXES.iter().any(|p| name.starts_with(p))
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
/// line, then every field with its unit (`compcache_store::stats::UNITS`, in their order; a
/// swap device's table leaves the cache counters out); fields the server has and the table does
/// not (a newer server) are printed after these, in name order.
fn table(name: &str, origin: Option<&str>, stats: &Map<String, Value>) -> String {
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
    let shown = |k: &&str| origin.is_some() || !is_cache_field(k);
    let mut keys: Vec<&str> = UNITS.iter().map(|(k, _)| *k).filter(|k| stats.contains_key(*k)).filter(shown).collect();
    let mut extra: Vec<&str> = stats.keys().map(String::as_str).filter(|k| unit_of(k).is_none()).filter(shown).collect();
    extra.sort_unstable();
    keys.extend(extra);
    for k in keys {
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
        let t = table("/run/compcache/compcache.sock", None, stats.as_object().unwrap());
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
        let t = table(name, None, stats.as_object().unwrap());
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
        let t = table("/run/compcache/compcache.sock", Some("/var/lib/disk.img"), stats);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[3].starts_with("CACHE OF") && lines[3].contains("HIT%"), "{t}");
        let row: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(row, ["/var/lib/disk.img", "300", "100", "75.0", "100", "20", "400K", "20K", "3", "50", "4"], "{t}");
        assert!(t.contains("cache_hits") && t.contains("origin_read_bytes"), "every counter listed: {t}");
        // The mm_stat figures stay next to them.
        assert!(t.contains("orig_data_size") && t.contains("mem_used_total"), "{t}");

        let t = table("/run/compcache/compcache.sock", None, stats);
        assert!(!t.contains("CACHE OF") && !t.contains("cache_hits") && !t.contains("origin_reads"), "{t}");
        assert_eq!(hit_ratio(json!({"cache_hits": 0}).as_object().unwrap()), None);
    }
}
