//! `compcache recompress`: see and change a running device's recompression (docs/store.md,
//! "Recompression"), through the control socket's `recompress` command: pause and resume it,
//! change its idle age, threshold and CPU budget, or run it now for a while.

use crate::failure::Failure;
use crate::target::Target;
use compcache_control as control;
use serde_json::{json, Value};

/// Show or change the recompression of a running device (on unless it was started with --recompress off).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Pages not accessed for this many seconds are recompressed.
    #[arg(long, value_name = "SECS")]
    idle: Option<u64>,
    /// Keep a recompressed page only if it is at least this many bytes smaller.
    #[arg(long, value_name = "BYTES")]
    threshold: Option<u64>,
    /// CPU budget, percent of one core.
    #[arg(long, value_name = "PCT")]
    cpu: Option<u64>,
    /// Stop background recompression (pages stay as they are).
    #[arg(long, conflicts_with = "resume")]
    pause: bool,
    /// Start background recompression again.
    #[arg(long)]
    resume: bool,
    /// Train a new dictionary from fresh samples (with --dict train), whatever the current one
    /// measures; pages move to it as they are rescanned.
    #[arg(long)]
    retrain: bool,
    /// Recompress now, for up to this many seconds of CPU time (at most 60), busy or not.
    #[arg(long, value_name = "SECS")]
    now: Option<f64>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.target.control_socket()?;
    let mut set = serde_json::Map::new();
    for (k, v) in [("idle_secs", args.idle), ("min_saving_bytes", args.threshold), ("cpu_percent", args.cpu)] {
        if let Some(v) = v {
            set.insert(k.into(), json!(v));
        }
    }
    if args.pause || args.resume {
        set.insert("paused".into(), json!(args.pause));
    }
    if args.retrain {
        set.insert("retrain".into(), json!(true));
    }
    let run_ms = match args.now {
        Some(s) if s.is_finite() && s > 0.0 && s <= 60.0 => (s * 1000.0) as u64,
        Some(s) => return Err(Failure::usage(format!("--now {s}: give seconds of CPU time, above 0 and at most 60"))),
        None => 0,
    };
    let answer = control::request(&path, &json!({"cmd": "recompress", "set": set, "run_ms": run_ms}))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer).expect("JSON prints"));
        return Ok(());
    }
    let s = &answer["settings"];
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    println!(
        "recompression {}: pages idle {} s, zstd level {}, threshold {} bytes, CPU {}%, dictionary {}",
        if s["paused"].as_bool() == Some(true) { "paused" } else { "running" },
        num(s, "idle_secs"),
        s["level"],
        num(s, "min_saving_bytes"),
        num(s, "cpu_percent"),
        s["dict"].as_str().unwrap_or("?"),
    );
    if let Some(r) = answer.get("report").filter(|r| !r.is_null()) {
        println!(
            "ran now: {} pages recompressed ({} bytes saved), {} kept as they were, {} looked at",
            num(r, "done"),
            num(r, "saved_bytes"),
            num(r, "rejected"),
            num(r, "scanned")
        );
    }
    Ok(())
}
