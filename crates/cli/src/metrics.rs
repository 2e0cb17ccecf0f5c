//! Prometheus / OpenMetrics exposition of devices' statistics: the text `compcache stat
//! --prometheus` and `compcache list --prometheus` print (for node_exporter's textfile
//! collector) and the servers' `--metrics ADDR:PORT` endpoint serves, encoded by the
//! `prometheus-client` crate.
//!
//! Names map one to one to zram's statistics (docs/metrics.md has the table): every field of
//! `compcache_store::Stats` becomes `compcache_<field>`, a counter (`_total`) when it only
//! grows and a gauge otherwise, with its unit in the name as Prometheus wants it: byte fields
//! end in `_bytes` (a field already named `..._bytes` keeps one), milliseconds become
//! `_seconds`, percent and permille become a `_ratio` of 1. Pages and requests have no unit
//! suffix (zram counts them the same way). Every sample has the label `device` (the block
//! device, or the NBD socket of `compcache serve`). Beside them: `compcache_device_info`
//! (algorithm, front end, backing device, version as labels) and the request latency
//! histograms `compcache_read_latency_seconds` and `compcache_write_latency_seconds`.

use crate::failure::Failure;
use compcache_control::ControlState;
use compcache_store::latency::{bucket_bound_secs, FINITE_BUCKETS};
use compcache_store::stats::{Unit, UNITS};
use compcache_store::Latency;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit as PromUnit};
use serde_json::Value;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// The statistics that only grow (counters); every other field is a gauge.
const COUNTERS: &[&str] = &[
    "pages_compacted",
    "huge_pages_since",
    "failed_reads",
    "failed_writes",
    "invalid_io",
    "notify_free",
    "bd_reads",
    "bd_writes",
    "bd_overflow_pages",
    "bd_writeback_pages",
    "bd_gc_pages",
    "bd_promoted_pages",
    "bd_errors",
    "cache_hits",
    "cache_misses",
    "cache_inserts",
    "cache_evictions",
    "origin_reads",
    "origin_read_bytes",
    "origin_writes",
    "origin_write_bytes",
    "origin_syncs",
    "origin_errors",
    "readahead_pages",
    "readahead_used",
    "readahead_wasted",
    "recompress_done",
    "recompress_rejected",
    "recompress_raced",
    "recompress_saved_bytes",
    "recompress_cpu_ms",
    "recompress_busy_skips",
    "dicts_installed",
    "dicts_refused",
    "num_reads",
    "num_writes",
];

/// How a statistic is exposed: its metric name (without `compcache_`, unit and `_total`),
/// its unit, whether it is a counter, and the factor from the statistic to the metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Exposed {
    pub stat: &'static str,
    pub name: String,
    pub unit: Option<&'static str>,
    pub counter: bool,
    pub scale: f64,
}

/// Every numeric statistic and how it is exposed, in `UNITS`' order (the mapping table).
pub fn mapping() -> Vec<Exposed> {
    UNITS
        .iter()
        .filter(|(_, u)| *u != Unit::Text)
        .map(|&(stat, unit)| {
            let counter = COUNTERS.contains(&stat);
            let (name, unit, scale) = match unit {
                Unit::Bytes => (stat.strip_suffix("_bytes").unwrap_or(stat).to_string(), Some("bytes"), 1.0),
                Unit::Milliseconds => (stat.strip_suffix("_ms").unwrap_or(stat).to_string(), Some("seconds"), 1e-3),
                Unit::Percent => (format!("{}_ratio", stat.strip_suffix("_pct").unwrap_or(stat)), None, 1e-2),
                Unit::Permille => (format!("{}_ratio", stat.strip_suffix("_permille").unwrap_or(stat)), None, 1e-3),
                Unit::Pages | Unit::Requests | Unit::Number | Unit::Text => (stat.to_string(), None, 1.0),
            };
            Exposed { stat, name, unit, counter, scale }
        })
        .collect()
}

/// The full metric name of `e` as the encoder writes it (the docs' table is checked with it).
#[cfg(test)]
pub fn metric_name(e: &Exposed) -> String {
    let unit = e.unit.map_or(String::new(), |u| format!("_{u}"));
    format!("compcache_{}{unit}{}", e.name, if e.counter { "_total" } else { "" })
}

/// One device's figures: a control `stat` answer.
#[derive(Debug)]
struct Devices(Vec<Value>);

fn label(answer: &Value) -> String {
    name_of(answer).unwrap_or_else(|| "?".into())
}

fn prom_unit(u: &str) -> PromUnit {
    match u {
        "bytes" => PromUnit::Bytes,
        "seconds" => PromUnit::Seconds,
        other => PromUnit::Other(other.to_string()),
    }
}

impl Collector for Devices {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let devices: Vec<(String, &Value)> = self.0.iter().map(|a| (label(a), a)).collect();
        let mut info =
            enc.encode_descriptor("compcache_device", "A compcache device (its labels say what it is)", None, MetricType::Info)?;
        for (dev, a) in &devices {
            let s = |p: &str| a.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
            let labels = [
                ("device", dev.clone()),
                ("algorithm", s("/stats/comp_algorithm")),
                ("frontend", s("/device/frontend")),
                ("backing", s("/device/backing")),
                ("version", s("/device/version")),
            ];
            info.encode_info(&labels)?;
        }
        for e in mapping() {
            let unit = e.unit.map(prom_unit);
            let help = format!("zram/compcache statistic {} (docs/metrics.md)", e.stat);
            let kind = if e.counter { MetricType::Counter } else { MetricType::Gauge };
            let name = format!("compcache_{}", e.name);
            let mut m = enc.encode_descriptor(&name, &help, unit.as_ref(), kind)?;
            for (dev, a) in &devices {
                let Some(v) = a.pointer(&format!("/stats/{}", e.stat)).and_then(Value::as_u64) else { continue };
                let labels = [("device", dev.as_str())];
                let fam = m.encode_family(&labels)?;
                if e.scale == 1.0 {
                    if e.counter {
                        ConstCounter::new(v).encode(fam)?;
                    } else {
                        ConstGauge::new(v as i64).encode(fam)?;
                    }
                } else if e.counter {
                    ConstCounter::new(v as f64 * e.scale).encode(fam)?;
                } else {
                    ConstGauge::new(v as f64 * e.scale).encode(fam)?;
                }
            }
        }
        for (op, what) in [("read", "reads"), ("write", "writes")] {
            let help = format!("Time the store took for {what} (Store::{op}, one per front-end request)");
            let name = format!("compcache_{op}_latency");
            let mut m = enc.encode_descriptor(&name, &help, Some(&PromUnit::Seconds), MetricType::Histogram)?;
            for (dev, a) in &devices {
                let Some(lat) = a.get("latency").and_then(|l| serde_json::from_value::<Latency>(l.clone()).ok()) else { continue };
                let h = if op == "read" { &lat.read } else { &lat.write };
                let buckets: Vec<(f64, u64)> = h
                    .counts
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| (if i < FINITE_BUCKETS { bucket_bound_secs(i) } else { f64::INFINITY }, c))
                    .collect();
                let labels = [("device", dev.as_str())];
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(h.sum_ns as f64 * 1e-9, h.count(), &buckets, None)?;
            }
        }
        Ok(())
    }
}

/// The OpenMetrics text for the devices whose control `stat` answers are `answers`.
pub fn render(answers: Vec<Value>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Devices(answers)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `--metrics [ADDR:]PORT`, as the servers take it: a port alone is on 127.0.0.1. Any other
/// address is allowed (metrics carry no page data) with a warning, since whoever reaches it
/// learns how much the machine swaps.
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, String> {
    port_or_address("--metrics", text, 9100).map_err(|f| f.to_string())
}

/// The name a server whose device can be taken over gives its `--metrics` listener under to
/// its holder (`FDSTORE=1`), and a successor finds it under: the port stays bound, and
/// answers after a takeover, without a moment in which another program could take it.
pub const FD_METRICS_LISTEN: &str = "compcache-metrics-listen";

/// A `--metrics` listener handed to this process (a successor's), until [`serve_http`] takes
/// it. Set once, before any thread runs, by the code that reads the handed descriptors.
static HANDED: Mutex<Option<TcpListener>> = Mutex::new(None);

/// Keeps a handed [`FD_METRICS_LISTEN`] descriptor for [`serve_http`]. One that is not a TCP
/// listener is refused with the reason (the successor then binds its own).
pub fn adopt_handed(fd: OwnedFd) -> Result<(), String> {
    let listener = TcpListener::from(fd);
    match listener.local_addr() {
        Ok(_) => {
            *HANDED.lock().unwrap_or_else(|e| e.into_inner()) = Some(listener);
            Ok(())
        }
        Err(e) => Err(format!("the handed {FD_METRICS_LISTEN} is not a TCP socket ({e}); not used")),
    }
}

/// The handed listener if it listens on `addr` (any port if `addr`'s is 0).
fn handed_for(addr: SocketAddr) -> Option<TcpListener> {
    let l = HANDED.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    let bound = l.local_addr().ok()?;
    if bound.ip() == addr.ip() && (addr.port() == 0 || bound.port() == addr.port()) {
        return Some(l);
    }
    crate::log::info(&format!(
        "the handed metrics listener is on {bound}, --metrics asks for {addr}: serving on {addr}, the other is given back"
    ));
    let _ = crate::fdstore::notify(&format!("FDSTOREREMOVE=1\nFDNAME={FD_METRICS_LISTEN}\n"), &[]);
    None
}

/// Serves `GET /metrics` (the device of `state`, [`render`]ed) on `addr` from a thread of its
/// own, for the life of the process; any other path is a 404 naming the right one. The
/// listener is bound before this returns, so a taken port fails the server's start. With
/// `held` (the device can be taken over), the listener is a handed one (a successor's) or is
/// given to the holder once bound ([`FD_METRICS_LISTEN`]).
pub fn serve_http(addr: SocketAddr, state: Arc<ControlState>, held: bool) -> Result<(), Failure> {
    if !addr.ip().is_loopback() {
        crate::log::warning(&format!("--metrics {addr}: not a loopback address; whoever can reach it sees this device's statistics"));
    }
    let listener = match handed_for(addr) {
        Some(l) => l,
        None => {
            let l = TcpListener::bind(addr).map_err(|e| Failure::new(format!("--metrics {addr}: cannot listen: {e}")))?;
            if held {
                if let Err(e) = crate::fdstore::store(FD_METRICS_LISTEN, &[l.as_fd()]) {
                    crate::log::warning(&format!(
                        "giving the holder the metrics listener: {e}; after a takeover the successor binds {addr} again"
                    ));
                }
            }
            l
        }
    };
    let server =
        tiny_http::Server::from_listener(listener, None).map_err(|e| Failure::new(format!("--metrics {addr}: cannot listen: {e}")))?;
    let content_type = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header");
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let path = req.url().split('?').next().unwrap_or("");
                let resp = if *req.method() == tiny_http::Method::Get && path == "/metrics" {
                    let answer = compcache_control::answer(&state, r#"{"cmd":"stat"}"#);
                    tiny_http::Response::from_string(render(vec![answer])).with_header(content_type.clone())
                } else {
                    tiny_http::Response::from_string("compcache: the metrics are at GET /metrics\n").with_status_code(404)
                };
                // A client that went away is its own problem, never the server's.
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| Failure::new(format!("cannot start the metrics thread: {e}")))?;
    Ok(())
}

/// The NAME of a device: its block device (swap servers put it in `export_name`), else its NBD
/// socket or TCP address.
pub fn name_of(answer: &Value) -> Option<String> {
    let d = answer.get("device")?;
    let s = |k: &str| d.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(String::from);
    match d.get("frontend").and_then(Value::as_str) {
        Some("ublk" | "nbd" | "fuse") => s("export_name"),
        _ => s("nbd_socket").or_else(|| s("nbd_tcp")).or_else(|| s("export_name")),
    }
}

/// A TCP address flag (`--listen`, `--metrics`): `PORT` alone means 127.0.0.1:PORT, else
/// `ADDR:PORT`; the error shows `example` as the port to give.
pub(crate) fn port_or_address(flag: &str, text: &str, example: u16) -> Result<SocketAddr, Failure> {
    match text.parse::<u16>() {
        Ok(port) => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)),
        Err(_) => text
            .parse::<SocketAddr>()
            .map_err(|_| Failure::usage(format!("{flag} {text}: give a port ({example}) or an address and port (127.0.0.1:{example})"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_carry_their_unit_and_kind() {
        let m = mapping();
        let by = |s: &str| m.iter().find(|e| e.stat == s).unwrap_or_else(|| panic!("{s}")).clone();
        assert_eq!(metric_name(&by("orig_data_size")), "compcache_orig_data_size_bytes");
        assert_eq!(metric_name(&by("bd_bytes")), "compcache_bd_bytes", "one _bytes, not two");
        assert_eq!(metric_name(&by("num_reads")), "compcache_num_reads_total");
        assert_eq!(metric_name(&by("same_pages")), "compcache_same_pages");
        assert_eq!(metric_name(&by("recompress_cpu_ms")), "compcache_recompress_cpu_seconds_total");
        assert_eq!((metric_name(&by("good_compress_pct")), by("good_compress_pct").scale), ("compcache_good_compress_ratio".into(), 0.01));
        assert!(m.iter().all(|e| e.stat != "comp_algorithm"), "text goes to the info metric");
        for c in COUNTERS {
            assert!(m.iter().any(|e| e.stat == *c), "counter {c} is a statistic");
        }
    }

    /// docs/metrics.md's table has one row per statistic, as the code maps it.
    #[test]
    fn the_docs_table_is_the_mapping() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md")).unwrap();
        let rows: Vec<String> = mapping()
            .iter()
            .map(|e| {
                let kind = if e.counter { "counter" } else { "gauge" };
                let scale = if e.scale == 1.0 { String::new() } else { format!(" (× {})", e.scale) };
                format!("| `{}` | `{}` | {kind}{scale} |", e.stat, metric_name(e))
            })
            .collect();
        let missing: Vec<&String> = rows.iter().filter(|r| !docs.contains(r.as_str())).collect();
        assert!(missing.is_empty(), "docs/metrics.md lacks these rows (or has them differently):\n{}", rows.join("\n"));
    }

    #[test]
    fn the_text_has_every_family_once_and_a_sample_per_device() {
        let dev = |name: &str, reads: u64| {
            json!({"device": {"export_name": name, "frontend": "ublk", "version": "0.1.0"},
                   "stats": {"comp_algorithm": "lz4", "orig_data_size": 8192, "num_reads": reads, "good_compress_pct": 50},
                   "latency": {"read": {"counts": [0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], "sum_ns": 5_000_000_006u64},
                               "write": {"counts": vec![0u64; 24], "sum_ns": 0}}})
        };
        let t = render(vec![dev("/dev/ublkb0", 7), dev("/dev/ublkb1", 9)]);
        assert!(t.contains("# TYPE compcache_num_reads counter\n"), "{t}");
        assert_eq!(t.matches("# TYPE compcache_num_reads counter").count(), 1);
        assert!(t.contains("compcache_num_reads_total{device=\"/dev/ublkb0\"} 7\n"), "{t}");
        assert!(t.contains("compcache_num_reads_total{device=\"/dev/ublkb1\"} 9\n"), "{t}");
        assert!(t.contains("compcache_orig_data_size_bytes{device=\"/dev/ublkb0\"} 8192\n"), "{t}");
        assert!(t.contains("compcache_good_compress_ratio{device=\"/dev/ublkb0\"} 0.5\n"), "{t}");
        assert!(t.contains("compcache_device_info{device=\"/dev/ublkb0\",algorithm=\"lz4\",frontend=\"ublk\""), "{t}");
        assert!(t.contains("compcache_read_latency_seconds_count{device=\"/dev/ublkb0\"} 4\n"), "{t}");
        assert!(
            t.contains("compcache_read_latency_seconds_bucket{le=\"+Inf\",device=\"/dev/ublkb0\"} 4\n")
                || t.contains("compcache_read_latency_seconds_bucket{device=\"/dev/ublkb0\",le=\"+Inf\"} 4\n"),
            "{t}"
        );
        assert!(t.ends_with("# EOF\n"), "{t}");
        // Fields a server does not send are left out, not made zero.
        assert!(!t.contains("compcache_bd_reads_total{"), "{t}");
    }
}
