//! `compcache list`: every compcache device on the machine in one zramctl-style table.
//!
//! Devices are found by their control sockets (`crate::target`, which `stat` and the other
//! commands share): every `*.ctl` socket in the default socket directory (`/run/compcache` as
//! root, where `compcache serve`'s default socket and every swap server's `<device>.ctl` are),
//! and each `--control PATH` given. Each is asked for its statistics (`stat`), trusted only as
//! `compcache stat` trusts one (owner checks); a socket nobody answers on is a stale file and
//! is skipped. The swap priority comes from /proc/swaps.

use crate::failure::Failure;
use crate::metrics::name_of;
use crate::paths;
use crate::table::{self, Align};
use crate::target;
use crate::units::human;
use compcache_store::Stats;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// The version of `--json`'s layout: raised when a field changes meaning or goes away (new
/// fields may appear without it).
pub const SCHEMA_VERSION: u64 = 1;

/// List every compcache device on this machine (zramctl's table).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Columns to print, comma-separated: NAME, DISKSIZE, DATA, COMPR, ALGORITHM, TOTAL,
    /// MEM-LIMIT, MEM-USED, RATIO, SAME-PAGES, BACKING, BD-DATA, FRONTEND, PRIORITY, PID
    /// (docs/cli.md says what each is) [default:
    /// NAME,ALGORITHM,DISKSIZE,DATA,COMPR,TOTAL,RATIO,MEM-LIMIT,FRONTEND,PRIORITY].
    #[arg(short = 'o', long, value_name = "LIST", value_delimiter = ',')]
    output: Vec<String>,
    /// Sizes in bytes instead of 4K, 1.5M, 3G.
    #[arg(short = 'b', long)]
    bytes: bool,
    /// No header line.
    #[arg(short = 'n', long)]
    noheadings: bool,
    /// Raw output: cells separated by one space, not aligned.
    #[arg(short = 'r', long)]
    raw: bool,
    /// Print the devices as JSON (`{"schema_version": 1, "devices": [...]}`; sizes in bytes).
    #[arg(long, conflicts_with_all = ["raw", "noheadings", "bytes"])]
    json: bool,
    /// Print every device's statistics as Prometheus/OpenMetrics text, e.g. for
    /// node_exporter's textfile collector (docs/metrics.md).
    #[arg(long, conflicts_with_all = ["raw", "noheadings", "bytes", "json", "output"])]
    prometheus: bool,
    /// Also this control socket (repeatable), besides those in the default directory.
    #[arg(long, value_name = "PATH")]
    control: Vec<PathBuf>,
}

/// A column: its name in `-o` and the header, its alignment, and what it says in words.
#[derive(Debug)]
struct Column {
    name: &'static str,
    align: Align,
    help: &'static str,
}

const fn col(name: &'static str, align: Align, help: &'static str) -> Column {
    Column { name, align, help }
}

const COLUMNS: [Column; 15] = [
    col("NAME", Align::Left, "the block device, or the NBD socket (address) of `compcache serve`"),
    col("DISKSIZE", Align::Right, "the device's size"),
    col("DATA", Align::Right, "uncompressed size of the stored data (orig_data_size)"),
    col("COMPR", Align::Right, "compressed size of the stored data (compr_data_size)"),
    col("ALGORITHM", Align::Left, "the compression algorithm"),
    col("TOTAL", Align::Right, "memory the pool takes, overhead included (mem_used_total)"),
    col("MEM-LIMIT", Align::Right, "the memory limit (mem_limit)"),
    col("MEM-USED", Align::Right, "the most memory the pool has taken (mem_used_max)"),
    col("RATIO", Align::Right, "DATA / TOTAL"),
    col("SAME-PAGES", Align::Right, "same-filled pages, stored as one word (same_pages)"),
    col("BACKING", Align::Left, "the backing device or file"),
    col("BD-DATA", Align::Right, "compressed bytes on the backing device (bd_bytes)"),
    col("FRONTEND", Align::Left, "nbd-server (compcache serve), ublk, nbd or fuse"),
    col("PRIORITY", Align::Right, "the swap priority, if the device is swap (/proc/swaps)"),
    col("PID", Align::Right, "the server's process id"),
];

const DEFAULT_COLUMNS: [&str; 10] =
    ["NAME", "ALGORITHM", "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO", "MEM-LIMIT", "FRONTEND", "PRIORITY"];

/// One device: what its control socket said (and its statistics, typed once), and its swap
/// priority.
struct Device {
    answer: Value,
    stats: Stats,
    priority: Option<i64>,
}

impl Device {
    fn new(answer: Value, priority: Option<i64>) -> Device {
        // Fields an older server did not send read as 0.
        let stats = serde_json::from_value(answer["stats"].clone()).unwrap_or_default();
        Device { answer, stats, priority }
    }
}

pub fn run(args: Args) -> Result<(), Failure> {
    let columns = columns(&args.output)?;
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let devices: Vec<Device> = target::answering(&target::control_sockets(&paths::default_dir(), &args.control), &json!({"cmd": "stat"}))
        .into_iter()
        .filter(|(ctl, a)| {
            let has = a.get("stats").is_some_and(Value::is_object);
            if !has {
                crate::log::warning(&format!("{}: the answer has no statistics (a different program?); skipped", ctl.display()));
            }
            has
        })
        .map(|(_, answer)| {
            let priority = name_of(&answer).and_then(|n| swap_priority(&swaps, Path::new(&n)));
            Device::new(answer, priority)
        })
        .collect();
    if args.prometheus {
        print!("{}", crate::metrics::render(devices.into_iter().map(|d| d.answer).collect()));
        return Ok(());
    }
    if args.json {
        let list: Vec<Value> = devices.iter().map(|d| json_of(d, &columns)).collect();
        println!("{:#}", json!({"schema_version": SCHEMA_VERSION, "devices": list}));
        return Ok(());
    }
    if devices.is_empty() {
        return Ok(()); // as zramctl: no device, no output (not even the header)
    }
    let rows: Vec<Vec<String>> = devices.iter().map(|d| columns.iter().map(|c| cell(d, c.name).text(args.bytes)).collect()).collect();
    let headers: Vec<&str> = columns.iter().map(|c| c.name).collect();
    let headers = (!args.noheadings).then_some(headers.as_slice());
    if args.raw {
        for line in headers.map(|h| h.join(" ")).into_iter().chain(rows.iter().map(|r| r.join(" "))) {
            println!("{line}");
        }
    } else {
        let align: Vec<Align> = columns.iter().map(|c| c.align).collect();
        print!("{}", table::format(headers, &align, &rows));
    }
    Ok(())
}

/// The columns `-o` names (case-insensitive), or the default ones.
fn columns(wanted: &[String]) -> Result<Vec<&'static Column>, Failure> {
    if wanted.is_empty() {
        return Ok(DEFAULT_COLUMNS.iter().map(|n| COLUMNS.iter().find(|c| c.name == *n).expect("a default column exists")).collect());
    }
    wanted
        .iter()
        .map(|w| {
            COLUMNS.iter().find(|c| c.name.eq_ignore_ascii_case(w.trim())).ok_or_else(|| {
                let known: Vec<String> = COLUMNS.iter().map(|c| format!("  {:<11} {}", c.name, c.help)).collect();
                Failure::usage(format!("-o: unknown column {w:?}; the columns are:\n{}", known.join("\n")))
            })
        })
        .collect()
}

/// The priority of `dev` in /proc/swaps' text, if it is swap: matched by canonical path or
/// block device number (`compcache swapon` enables swap through another node of the device,
/// `swapdev::swap_alias`).
fn swap_priority(swaps: &str, dev: &Path) -> Option<i64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let rdev = |p: &Path| std::fs::metadata(p).ok().filter(|m| m.file_type().is_block_device()).map(|m| m.rdev());
    let (dev_path, dev_rdev) = (canon(dev), rdev(dev));
    swaps.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Filename Type Size Used Priority; a name with a space is written with \040.
        let name = f.first()?.replace("\\040", " ");
        let same = canon(Path::new(&name)) == dev_path || (dev_rdev.is_some() && rdev(Path::new(&name)) == dev_rdev);
        (f.len() >= 5 && same).then(|| f[4].parse().ok()).flatten()
    })
}

/// What a column says about a device, before it is printed as text or JSON.
enum Cell {
    /// Bytes: `human` sizes, or bytes with `--bytes`.
    Size(u64),
    /// A limit in bytes, 0 meaning none.
    Limit(u64),
    Number(Option<u64>),
    Ratio(Option<f64>),
    Priority(Option<i64>),
    Text(Option<String>),
}

impl Cell {
    /// In the table (`bytes`: `--bytes`); `-` when there is nothing to say.
    fn text(&self, bytes: bool) -> String {
        let size = |b: u64| if bytes { b.to_string() } else { human(b) };
        match self {
            Cell::Size(b) => size(*b),
            Cell::Limit(0) => "none".into(),
            Cell::Limit(b) => size(*b),
            Cell::Number(n) => n.map_or("-".into(), |n| n.to_string()),
            Cell::Ratio(r) => r.map_or("-".into(), |r| format!("{r:.2}")),
            Cell::Priority(p) => p.map_or("-".into(), |p| p.to_string()),
            Cell::Text(t) => t.clone().unwrap_or_else(|| "-".into()),
        }
    }

    /// In `--json`: sizes in bytes, a limit of 0 as 0, nothing as null.
    fn json(&self) -> Value {
        match self {
            Cell::Size(b) | Cell::Limit(b) => json!(b),
            Cell::Number(n) => json!(n),
            Cell::Ratio(r) => json!(r),
            Cell::Priority(p) => json!(p),
            Cell::Text(t) => json!(t),
        }
    }
}

/// The cell of `column` for the device.
fn cell(d: &Device, column: &str) -> Cell {
    let s = &d.stats;
    let sum = s.summary();
    let dev =
        |k: &str| Cell::Text(d.answer.pointer(&format!("/device/{k}")).and_then(Value::as_str).filter(|v| !v.is_empty()).map(String::from));
    match column {
        "NAME" => Cell::Text(name_of(&d.answer)),
        "DISKSIZE" => Cell::Size(sum.disksize),
        "DATA" => Cell::Size(sum.data_bytes),
        "COMPR" => Cell::Size(sum.compr_bytes),
        "ALGORITHM" => Cell::Text(Some(sum.algorithm).filter(|a| !a.is_empty())),
        "TOTAL" => Cell::Size(sum.total_bytes),
        "MEM-LIMIT" => Cell::Limit(sum.mem_limit),
        "MEM-USED" => Cell::Size(sum.mem_used_max),
        "RATIO" => Cell::Ratio(sum.ratio),
        "SAME-PAGES" => Cell::Number(Some(sum.same_pages)),
        "BACKING" => dev("backing"),
        "BD-DATA" => Cell::Size(s.bd_bytes),
        "FRONTEND" => dev("frontend"),
        "PRIORITY" => Cell::Priority(d.priority),
        "PID" => Cell::Number(d.answer.pointer("/device/pid").and_then(Value::as_u64)),
        other => unreachable!("column {other} is checked by `columns`"),
    }
}

/// A device for `--json`: the chosen columns (lowercase names, sizes in bytes, absent values
/// null), and its control socket.
fn json_of(d: &Device, columns: &[&Column]) -> Value {
    let mut m: Map<String, Value> = columns.iter().map(|c| (c.name.to_ascii_lowercase(), cell(d, c.name).json())).collect();
    m.insert("control".into(), d.answer.pointer("/device/control_socket").cloned().unwrap_or(Value::Null));
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(frontend: &str, export: &str, socket: Option<&str>) -> Device {
        let answer = json!({
            "ok": true, "protocol": 2,
            "device": {"export_name": export, "nbd_socket": socket, "nbd_tcp": null, "control_socket": "/run/compcache/x.ctl",
                       "pid": 42, "version": "0.1.0", "frontend": frontend, "backing": "/var/swap.img"},
            "stats": {"disksize": 1u64 << 30, "comp_algorithm": "lz4", "orig_data_size": 300u64 << 20,
                      "compr_data_size": 100u64 << 20, "mem_used_total": 120u64 << 20, "mem_limit": 0,
                      "mem_used_max": 150u64 << 20, "same_pages": 7, "bd_bytes": 4096}
        });
        Device::new(answer, Some(100))
    }

    #[test]
    fn cells_follow_zramctl() {
        let d = device("ublk", "/dev/ublkb0", None);
        let cells: Vec<String> = COLUMNS.iter().map(|c| cell(&d, c.name).text(false)).collect();
        assert_eq!(
            cells,
            ["/dev/ublkb0", "1G", "300M", "100M", "lz4", "120M", "none", "150M", "2.50", "7", "/var/swap.img", "4K", "ublk", "100", "42"]
        );
        assert_eq!(cell(&d, "DATA").text(true), (300u64 << 20).to_string());
        let served = device("nbd-server", "compcache", Some("/run/compcache/compcache.sock"));
        assert_eq!(cell(&served, "NAME").text(false), "/run/compcache/compcache.sock");
        let j = json_of(&d, &columns(&[]).unwrap());
        assert_eq!(j["name"], "/dev/ublkb0");
        assert_eq!((j["data"].as_u64(), j["mem-limit"].as_u64(), j["priority"].as_i64()), (Some(300 << 20), Some(0), Some(100)));
        assert_eq!(j["control"], "/run/compcache/x.ctl");
    }

    #[test]
    fn columns_are_chosen_by_name() {
        let c = columns(&["name".into(), "MEM-USED".into(), " bd-data".into()]).unwrap();
        assert_eq!(c.iter().map(|c| c.name).collect::<Vec<_>>(), ["NAME", "MEM-USED", "BD-DATA"]);
        let e = columns(&["STREAMS".into()]).unwrap_err();
        assert!(e.to_string().contains("unknown column \"STREAMS\"") && e.to_string().contains("SAME-PAGES"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn priorities_come_from_proc_swaps() {
        let swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                     /dev/ublkb0                             partition\t1048572\t\t0\t\t100\n\
                     /swap\\040file                           file\t\t1024\t\t0\t\t-2\n";
        assert_eq!(swap_priority(swaps, Path::new("/dev/ublkb0")), Some(100));
        assert_eq!(swap_priority(swaps, Path::new("/swap file")), Some(-2));
        assert_eq!(swap_priority(swaps, Path::new("/dev/ublkb1")), None);
    }
}
