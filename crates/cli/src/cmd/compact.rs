//! `compcache compact`: ask a running device to compact its pool (zram's `compact`).

use crate::failure::Failure;
use crate::target::Target;
use crate::units::human;
use compcache_control as control;
use serde_json::{json, Value};

/// Compact the compressed pool of a running device, returning free pool pages to the system.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    target: Target,
    /// Print the answer as JSON (`{"ok": true, "pages_freed": N}`).
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.target.control_socket()?;
    let answer = control::request(&path, &json!({"cmd": "compact"}))?;
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    let freed = answer.get("pages_freed").and_then(Value::as_u64).unwrap_or(0);
    println!("compacted: {freed} pool pages freed ({})", human(freed * compcache_store::PAGE_SIZE as u64));
    Ok(())
}
