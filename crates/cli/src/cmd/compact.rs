//! `compcache compact`: ask a running device to compact its pool (zram's `compact`).

use crate::failure::Failure;
use crate::paths;
use crate::units::human;
use compcache_control as control;
use serde_json::{json, Value};
use std::path::PathBuf;

/// Compact the compressed pool of a running device, returning free pool pages to the system.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Control socket of the server [default: the default NBD socket path + .ctl].
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Print the answer as JSON (`{"ok": true, "pages_freed": N}`).
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let path = args.control.unwrap_or_else(paths::default_control);
    let answer = control::request(&path, &json!({"cmd": "compact"}))?;
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    let freed = answer.get("pages_freed").and_then(Value::as_u64).unwrap_or(0);
    println!("compacted: {freed} pool pages freed ({})", human(freed * compcache_store::PAGE_SIZE as u64));
    Ok(())
}
