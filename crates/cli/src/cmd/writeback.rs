//! `compcache writeback --idle AGE`: write back a running device's idle pages now (zram's
//! `echo idle > writeback` after marking pages idle), through the control socket's `writeback`
//! command. The device's writeback limit applies (`compcache set --writeback-limit`).

use crate::backing::size_or_none;
use crate::failure::Failure;
use crate::target::Target;
use crate::units::human;
use compcache_control as control;
use serde_json::{json, Value};

/// Write back a running device's idle pages to its backing device now.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Pages not read or written for this long: seconds, or with a unit (90s, 30m, 2h, 1d);
    /// 0: every page in RAM.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    idle: u64,
    /// Write at most this many bytes (compressed) [default: no cap but the writeback limit].
    #[arg(long, value_name = "SIZE")]
    max: Option<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// An age in seconds: a number, or a number with `s`, `m`, `h` or `d`.
fn parse_age(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("{text:?}: give seconds, or a number with s, m, h or d (30m, 2h)")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{text:?}: give seconds, or a number with s, m, h or d (30m, 2h)"))?;
    n.checked_mul(scale).ok_or_else(|| format!("{text:?}: too long"))
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.target.control_socket()?;
    let mut req = json!({"cmd": "writeback", "idle_secs": args.idle});
    if let Some(t) = &args.max {
        match size_or_none("--max", t, compcache_store::physical_ram_bytes())? {
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
    use super::parse_age;

    #[test]
    fn ages_take_units() {
        assert_eq!(parse_age("0"), Ok(0));
        assert_eq!(parse_age("90"), Ok(90));
        assert_eq!(parse_age("90s"), Ok(90));
        assert_eq!(parse_age("30m"), Ok(1800));
        assert_eq!(parse_age("2h"), Ok(7200));
        assert_eq!(parse_age("1d"), Ok(86400));
        for bad in ["", "h", "2w", "-1", "1.5h", "99999999999999999999d"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
