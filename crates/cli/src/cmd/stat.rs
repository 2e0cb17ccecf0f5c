//! `compcache stat`: statistics of a running device, through its control socket.

use crate::failure::Failure;
use crate::paths;
use crate::units::human;
use compcache_control as control;
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

/// Every statistic in display order, with its unit; fields the server has and this list does
/// not (a newer server) are printed after these, in name order.
const FIELDS: &[(&str, &str)] = &[
    ("disksize", "bytes"),
    ("comp_algorithm", ""),
    ("orig_data_size", "bytes"),
    ("compr_data_size", "bytes"),
    ("mem_used_total", "bytes"),
    ("mem_limit", "bytes"),
    ("mem_used_max", "bytes"),
    ("same_pages", "pages"),
    ("pages_compacted", "pages"),
    ("huge_pages", "pages"),
    ("huge_pages_since", "pages"),
    ("failed_reads", "requests"),
    ("failed_writes", "requests"),
    ("invalid_io", "requests"),
    ("notify_free", "pages"),
    ("bd_count", "pages"),
    ("bd_reads", "pages"),
    ("bd_writes", "pages"),
    ("bd_bytes", "bytes"),
    ("num_reads", "pages"),
    ("num_writes", "pages"),
    ("pages_stored", "pages"),
    ("pages_used", "pages"),
    ("good_compress_pct", "%"),
    ("no_compress_pct", "%"),
    ("slot_table_bytes", "bytes"),
];

/// The zramctl-like summary line, then every field.
fn table(name: &str, stats: &Map<String, Value>) -> String {
    let num = |k: &str| stats.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (orig, total) = (num("orig_data_size"), num("mem_used_total"));
    let ratio = if total > 0 { format!("{:.2}", orig as f64 / total as f64) } else { "-".into() };
    let algorithm = stats.get("comp_algorithm").and_then(Value::as_str).unwrap_or("?");
    let mut out = format!(
        "{:<32} {:<9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8}\n",
        "NAME", "ALGORITHM", "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO", "LIMIT"
    );
    out += &format!(
        "{:<32} {:<9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8}\n\n",
        name,
        algorithm,
        human(num("disksize")),
        human(orig),
        human(num("compr_data_size")),
        human(total),
        ratio,
        if num("mem_limit") > 0 { human(num("mem_limit")) } else { "none".into() },
    );
    let mut keys: Vec<&str> = FIELDS.iter().map(|(k, _)| *k).filter(|k| stats.contains_key(*k)).collect();
    let mut extra: Vec<&str> = stats.keys().map(String::as_str).filter(|k| !FIELDS.iter().any(|(f, _)| f == k)).collect();
    extra.sort_unstable();
    keys.extend(extra);
    for k in keys {
        let unit = FIELDS.iter().find(|(f, _)| *f == k).map(|(_, u)| *u).unwrap_or("");
        let value = match &stats[k] {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let shown = match (unit, stats[k].as_u64()) {
            ("bytes", Some(b)) if b >= 1024 => format!("{value} ({})", human(b)),
            _ => value,
        };
        out += &format!("{k:<20} {shown:>16} {unit}\n").replace(" \n", "\n");
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
