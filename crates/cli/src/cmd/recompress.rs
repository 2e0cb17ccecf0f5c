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
    /// Pages not accessed for this long are recompressed: a DURATION in whole seconds (60,
    /// 10m, 2h; docs/cli.md "Sizes and durations"), at most 18h12m15s.
    #[arg(long, value_name = "DURATION", value_parser = crate::units::idle_age)]
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
    /// Recompress now, for up to this much CPU time (a DURATION to the millisecond: 5, 500ms,
    /// 1m; above 0 and at most 1m), busy or not.
    #[arg(long, value_name = "DURATION", value_parser = cpu_time)]
    now: Option<std::time::Duration>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// `--now`: CPU time to the millisecond, above 0 and at most a minute (the control socket's
/// bound on one run).
fn cpu_time(text: &str) -> Result<std::time::Duration, String> {
    let d = compcache_store::parse_duration(text)?;
    if d.is_zero() || d > std::time::Duration::from_secs(60) {
        return Err(format!("'{}' is not above 0 and at most 1m of CPU time", text.trim()));
    }
    Ok(d)
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
    let run_ms = args.now.map_or(0, |d| d.as_millis() as u64);
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

#[cfg(test)]
mod tests {
    use super::Args;
    use crate::test_flags::parse_flags;
    use std::time::Duration;

    #[test]
    fn idle_and_now_take_the_duration_grammar() {
        let a = parse_flags::<Args>(&["--idle", "10m", "--now", "500ms"]).unwrap();
        assert_eq!((a.idle, a.now), (Some(600), Some(Duration::from_millis(500))));
        let a = parse_flags::<Args>(&["--idle", "90", "--now", "2.5"]).unwrap();
        assert_eq!((a.idle, a.now), (Some(90), Some(Duration::from_millis(2500))), "bare seconds stay valid");
        for (flag, bad, why) in [
            ("--idle", "1d", "65535 s"),
            ("--idle", "0.5s", "whole number of seconds"),
            ("--now", "0", "above 0 and at most 1m"),
            ("--now", "2m", "above 0 and at most 1m"),
            ("--now", "0.0001", "finer than a millisecond"),
        ] {
            let e = parse_flags::<Args>(&[flag, bad]).err().unwrap_or_else(|| panic!("{flag} {bad} accepted")).to_string();
            assert!(e.contains(flag) && e.contains(why), "{flag} {bad}: {e}");
        }
    }
}
