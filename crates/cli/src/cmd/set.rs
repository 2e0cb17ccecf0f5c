//! `compcache set`: change a running device's memory limit and writeback tunables, or reset its
//! `mem_used_max` (zram's `mem_limit`, `writeback_limit`, `mem_used_max` reset), through the
//! control socket's `set` command. Without a change, prints the settings.

use crate::failure::Failure;
use crate::target::Target;
use crate::units::{human, size_or_none};
use compcache_control as control;
use compcache_store::physical_ram_bytes;
use serde_json::{json, Map, Value};

/// Change a running device's memory limit and writeback settings (or show them).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// New memory limit (a size, a share of RAM such as 25%, or an expression, at least 4K;
    /// 0 or none: no limit; docs/cli.md "Sizes and durations"). Lowering it under
    /// what is used evicts nothing: writes overflow to the backing device (or fail) until use
    /// drops; writeback aims at the new limit from its next step.
    #[arg(long, value_name = "SIZE")]
    mem_limit: Option<String>,
    /// Reset mem_used_max to what is used now.
    #[arg(long)]
    reset_mem_used_max: bool,
    /// Write back cold pages when compressed memory passes this percent of the memory limit...
    #[arg(long, value_name = "PCT")]
    writeback_high: Option<u8>,
    /// ...until it is under this percent.
    #[arg(long, value_name = "PCT")]
    writeback_low: Option<u8>,
    /// Most bytes per second background writeback may write (SIZE/s, at least 4K/s; 0 or
    /// none: no limit).
    #[arg(long, value_name = "SIZE/s")]
    writeback_rate: Option<String>,
    /// Re-arm the writeback limit: writeback may write this much more from now on, whatever
    /// it wrote before (SIZE, at least 4K; 0 or none: no limit). zram's writeback_limit;
    /// re-arm it from a timer for a daily budget.
    #[arg(long, value_name = "SIZE")]
    writeback_limit: Option<String>,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.target.control_socket()?;
    let request = request(&args, physical_ram_bytes())?;
    let answer = control::request(&path, &request)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer).expect("JSON prints"));
    } else {
        print!("{}", describe(&answer));
    }
    Ok(())
}

/// The control request for `args` (`ram`: physical RAM, for sizes given as a share of it).
fn request(args: &Args, ram: u64) -> Result<Value, Failure> {
    let mut req = json!({"cmd": "set"});
    if let Some(t) = &args.mem_limit {
        req["mem_limit"] = json!(crate::units::mem_limit(t, ram)?);
    }
    if args.reset_mem_used_max {
        req["reset_mem_used_max"] = json!(true);
    }
    let mut wb = Map::new();
    if let Some(p) = args.writeback_high {
        wb.insert("high_pct".into(), json!(p));
    }
    if let Some(p) = args.writeback_low {
        wb.insert("low_pct".into(), json!(p));
    }
    if let Some(t) = &args.writeback_rate {
        wb.insert("rate_bytes".into(), json!(size_or_none("--writeback-rate", t, ram, "no limit")?));
    }
    if let Some(t) = &args.writeback_limit {
        wb.insert("limit_bytes".into(), json!(size_or_none("--writeback-limit", t, ram, "no limit")?));
    }
    if !wb.is_empty() {
        req["writeback"] = Value::Object(wb);
    }
    Ok(req)
}

/// The settings after the change, for people.
fn describe(answer: &Value) -> String {
    let num = |p: &str| answer.pointer(p).and_then(Value::as_u64);
    let size = |p: &str| match num(p) {
        Some(0) | None => "none".to_string(),
        Some(b) => human(b),
    };
    let mut out = format!("memory limit {}, mem_used_max {}\n", size("/mem_limit"), human(num("/mem_used_max").unwrap_or(0)));
    if answer["writeback"].is_object() {
        let left = num("/writeback/limit_left_bytes").map_or(String::new(), |b| format!(" ({} left)", human(b)));
        let rate = match num("/writeback/rate_bytes") {
            Some(0) | None => "none".to_string(),
            Some(b) => format!("{}/s", human(b)),
        };
        out += &format!(
            "writeback: from {}% to {}% of the memory limit, rate {rate}, limit {}{left}\n",
            num("/writeback/high_pct").unwrap_or(0),
            num("/writeback/low_pct").unwrap_or(0),
            size("/writeback/limit_bytes"),
        );
    } else {
        out += "writeback: no backing device\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn req(argv: &[&str]) -> Result<Value, Failure> {
        let cli = Cli::try_parse_from(std::iter::once("set").chain(argv.iter().copied())).unwrap();
        request(&cli.args, 8 << 30)
    }

    #[test]
    fn flags_become_one_request() {
        assert_eq!(req(&[]).unwrap(), json!({"cmd": "set"}), "no flag: show the settings");
        assert_eq!(
            req(&[
                "--mem-limit",
                "25%",
                "--reset-mem-used-max",
                "--writeback-high",
                "60",
                "--writeback-rate",
                "4M/s",
                "--writeback-limit",
                "1G"
            ])
            .unwrap(),
            json!({"cmd": "set", "mem_limit": 2u64 << 30, "reset_mem_used_max": true,
                   "writeback": {"high_pct": 60, "rate_bytes": 4u64 << 20, "limit_bytes": 1u64 << 30}})
        );
        assert_eq!(
            req(&["--mem-limit", "none", "--writeback-limit", "none"]).unwrap(),
            json!({"cmd": "set", "mem_limit": 0, "writeback": {"limit_bytes": 0}})
        );
        let e = req(&["--writeback-limit", "lots"]).unwrap_err();
        assert!(e.to_string().starts_with("--writeback-limit: ") && e.exit_code() == 2, "{e}");
    }

    /// Each of these once sent 0, "no limit", for a request of a little.
    #[test]
    fn a_small_value_is_never_sent_as_no_limit() {
        for (flag, value) in
            [("--mem-limit", "0.000001%"), ("--mem-limit", "100"), ("--writeback-rate", "100/s"), ("--writeback-limit", "1K")]
        {
            let e = req(&[flag, value]).unwrap_err();
            let t = e.to_string();
            assert!(
                t.starts_with(&format!("{flag}: ")) && t.contains("give at least 4K, or 0 for no limit") && e.exit_code() == 2,
                "{flag} {value}: {t}"
            );
        }
        assert_eq!(req(&["--mem-limit", "off"]).unwrap(), json!({"cmd": "set", "mem_limit": 0}));
    }

    #[test]
    fn the_answer_reads_as_a_sentence() {
        let a = json!({"ok": true, "mem_limit": 512u64 << 20, "mem_used_max": 100u64 << 20,
                       "writeback": {"high_pct": 90, "low_pct": 70, "rate_bytes": 0, "limit_bytes": 1u64 << 30, "limit_left_bytes": 256u64 << 20}});
        assert_eq!(
            describe(&a),
            "memory limit 512M, mem_used_max 100M\nwriteback: from 90% to 70% of the memory limit, rate none, limit 1G (256M left)\n"
        );
        let a = json!({"ok": true, "mem_limit": 0, "mem_used_max": 0, "writeback": null});
        assert_eq!(describe(&a), "memory limit none, mem_used_max 0B\nwriteback: no backing device\n");
    }
}
