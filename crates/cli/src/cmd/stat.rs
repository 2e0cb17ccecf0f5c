//! `compcache stat`: statistics of a running device, through its control socket.

use crate::failure::Failure;
use crate::paths;
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
    #[arg(long, conflicts_with_all = ["ramzswap", "mm_stat"])]
    json: bool,

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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Object(stats.clone())).unwrap_or_default());
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
        print!("{}", table(name, stats));
    }
    Ok(())
}

/// The zramctl-like summary line (`Stats::summary`), then every field with its unit
/// (`compcache_store::stats::UNITS`, in their order); fields the server has and the table does
/// not (a newer server) are printed after these, in name order.
fn table(name: &str, stats: &Map<String, Value>) -> String {
    // Typed: fields an older server did not send read as 0.
    let typed: Stats = serde_json::from_value(Value::Object(stats.clone())).unwrap_or_default();
    let sum = typed.summary();
    let ratio = sum.ratio.map_or("-".into(), |r| format!("{r:.2}"));
    let algorithm = if sum.algorithm.is_empty() { "?" } else { sum.algorithm.as_str() };
    let mut out = format!(
        "{:<32} {:<9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8}\n",
        "NAME", "ALGORITHM", "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO", "LIMIT"
    );
    out += &format!(
        "{:<32} {:<9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8}\n\n",
        name,
        algorithm,
        human(sum.disksize),
        human(sum.data_bytes),
        human(sum.compr_bytes),
        human(sum.total_bytes),
        ratio,
        if sum.mem_limit > 0 { human(sum.mem_limit) } else { "none".into() },
    );
    let mut keys: Vec<&str> = UNITS.iter().map(|(k, _)| *k).filter(|k| stats.contains_key(*k)).collect();
    let mut extra: Vec<&str> = stats.keys().map(String::as_str).filter(|k| unit_of(k).is_none()).collect();
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
        let t = table("/run/compcache/compcache.sock", stats.as_object().unwrap());
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME") && lines[0].contains("DISKSIZE") && lines[0].contains("TOTAL"));
        assert!(lines[1].contains("lz4") && lines[1].contains("1G") && lines[1].contains("8M") && lines[1].contains("2.00"));
        assert!(t.contains("orig_data_size") && t.contains("8388608 (8M) bytes"));
        assert!(t.contains("num_writes") && t.contains("2048 pages"));
        let last: Vec<&str> = lines.last().unwrap().split_whitespace().collect();
        assert_eq!(last, ["a_new_field", "7"], "unknown fields come last: {t}");
    }
}
