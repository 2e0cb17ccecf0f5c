//! `compcache writeback --idle AGE`: write back a running device's idle pages now (zram's
//! `echo idle > writeback` after marking pages idle), through the control socket's `writeback`
//! command. The device's writeback limit applies (`compcache set --writeback-limit`).

use crate::failure::Failure;
use crate::target::Target;
use crate::units::{human, idle_age, size_or_none};
use compcache_control as control;
use serde_json::{json, Value};

/// Write back a running device's idle pages to its backing device now.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Pages not read or written for this long: a DURATION in whole seconds (90, 90s, 30m, 2h;
    /// docs/cli.md "Sizes and durations"), at most 18h12m15s; 0: every page in RAM.
    #[arg(long, value_name = "DURATION", value_parser = idle_age)]
    idle: u64,
    /// Write at most this many bytes (compressed; SIZE, at least 4K; 0 or none: no cap)
    /// [default: no cap but the writeback limit].
    #[arg(long, value_name = "SIZE")]
    max: Option<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.target.control_socket()?;
    let mut req = json!({"cmd": "writeback", "idle_secs": args.idle});
    if let Some(t) = &args.max {
        match size_or_none("--max", t, compcache_store::physical_ram_bytes(), "no cap")? {
            0 => {}
            b => req["max_bytes"] = json!(b),
        }
    }
    let answer = control::request(&path, &req)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer).expect("JSON prints"));
        return Ok(());
    }
    let r = &answer["report"];
    let num = |k: &str| r.get(k).and_then(Value::as_u64).unwrap_or(0);
    println!(
        "written back: {} pages ({} compressed, {} writes), {} pool pages freed",
        num("pages"),
        human(num("bytes")),
        num("writes"),
        num("pool_pages_freed")
    );
    if r["device_full"] == true {
        println!("the backing device is full: run it again after GC has made room, or give a larger --backing-size");
    }
    if let Some(e) = r.get("error").and_then(Value::as_str) {
        return Err(Failure::new(format!("writeback stopped: {e} (the pages not written stay in RAM)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Args;
    use crate::test_flags::parse_flags;

    /// `--idle` takes the one duration grammar (its table is in compcache_store::units); `1d`,
    /// once cut silently to the 18 h a page's access time can tell, is refused.
    #[test]
    fn idle_takes_the_duration_grammar() {
        for (text, secs) in [("0", 0), ("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5h", 5400)] {
            assert_eq!(parse_flags::<Args>(&["--idle", text]).unwrap().idle, secs, "{text}");
        }
        for bad in ["", "h", "2w", "-1", "1d", "500ms", "99999999999999999999d"] {
            let e = parse_flags::<Args>(&["--idle", bad]).err().unwrap_or_else(|| panic!("{bad} accepted")).to_string();
            assert!(e.contains("--idle"), "{bad}: {e}");
        }
    }

    #[test]
    fn max_never_rounds_to_no_cap() {
        let e = super::size_or_none("--max", "100", 1 << 30, "no cap").unwrap_err().to_string();
        assert!(e.starts_with("--max: ") && e.contains("which means no cap: give at least 4K, or 0 for no cap"), "{e}");
    }
}
