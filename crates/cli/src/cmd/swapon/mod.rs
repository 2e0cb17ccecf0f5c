//! `compcache swapon` and `compcache swapoff`: compressed swap in one step, in the manner of
//! systemd's zram-generator.
//!
//! swapon: the settings (`settings.rs`: the flags over the zram-generator configuration, if
//! there is one, or `--config`, checked as every server checks them), the front end
//! (`crate::frontend`: the one asked for, else ublk, else the NBD driver, else FUSE through a
//! loop device), the server process for it (`server.rs`: `compcache ublk`, `compcache
//! nbd-attach` or `compcache fuse`, detached, memory locked, its log in `/run/compcache/swap/`,
//! waited for until the device is up), then a swap header (mkswap) and swapon with the
//! priority. What it started is recorded in `/run/compcache/swap/<device>.json` (`state.rs`).
//!
//! swapoff: for each recorded device (or the ones named) takes the swap away (the kernel
//! reads every page back), stops the server (which removes the device), and prints the
//! device's final statistics.

mod foreground;
mod server;
mod settings;
mod state;

use std::path::{Path, PathBuf};

use compcache_store::physical_ram_bytes;

use super::swapdev::{create_swap_alias, is_active_swap, mkswap, remove_swap_alias, swapoff, swapon, HIBERNATION_SAFE_PREFIX};
use crate::failure::Failure;
use crate::frontend::{Frontend, Wanted};
use crate::log;
use crate::store_args::StoreArgs;
use crate::units::human;
use server::{stop_server, ServerProcess};
use settings::settings;
use state::SwapState;

/// Set up a compressed RAM swap device in one step (mkswap and swapon included).
#[derive(clap::Args, Debug)]
#[command(after_help = "Settings come from the flags, else from a zram-generator configuration \
(/etc/systemd/zram-generator.conf and the other places zram-generator reads, or --config), \
else zram-generator's defaults: size min(ram / 2, 4096) MiB, priority 100. See docs/swap.md.")]
pub struct SwaponArgs {
    /// The store flags, as every server takes them; what they leave open comes from the
    /// zram-generator configuration. The backing device is `--backing` or else the
    /// configuration's writeback-device.
    #[command(flatten)]
    pub(super) store: StoreArgs,

    /// Swap priority, 0..=32767 (zram-generator: swap-priority; default 100).
    #[arg(long, value_name = "N")]
    pub(super) priority: Option<i32>,

    /// Front end: ublk (Linux 6.0+, ublk_drv), nbd (the kernel's NBD driver), fuse (a file on
    /// a FUSE mount through a loop device), or auto (the first of these the kernel has, in
    /// that order, loading the module if needed).
    #[arg(long, default_value = "auto", value_name = "auto|ublk|nbd|fuse")]
    pub(super) frontend: Wanted,

    /// Read this zram-generator configuration file instead of the system's.
    #[arg(long, value_name = "FILE")]
    pub(super) config: Option<PathBuf>,

    /// Ignore any zram-generator configuration.
    #[arg(long, conflicts_with = "config")]
    pub(super) no_config: bool,

    /// The configuration section to use [default: the first, usually zram0].
    #[arg(long, value_name = "NAME")]
    pub(super) section: Option<String>,

    /// Memory reserved up front for storing swapped-out pages (SIZE or auto; see
    /// docs/swap.md): make it about the compressed size you expect under memory pressure.
    #[arg(long, default_value = "auto", value_name = "SIZE|auto")]
    pub(super) reserve: String,

    /// Do not discard freed swap slots (discard is what frees the device's memory when pages
    /// are swapped back in and freed; zram-generator's default is discard too).
    #[arg(long)]
    pub(super) no_discard: bool,

    /// Set up the device even though zswap is enabled (it compresses pages before they reach
    /// compcache; see docs/swap.md, "zswap in front").
    #[arg(long)]
    pub(super) allow_zswap: bool,

    /// Stay in the foreground once swap is on, as a systemd service's main process
    /// (compcache-swap@.service, Type=notify): notify READY, log to stderr (the journal), and
    /// on SIGTERM swapoff and stop, except while the system shuts down (docs/swap.md, "systemd").
    #[arg(long)]
    pub(super) foreground: bool,
}

/// Where the kernel says whether zswap is on.
const ZSWAP_ENABLED: &str = "/sys/module/zswap/parameters/enabled";

/// The refusal when zswap is on (`enabled`: the parameter's text), or `None`: zswap is off,
/// absent, or allowed.
fn zswap_refusal(enabled: Option<&str>, allowed: bool) -> Option<String> {
    let on = matches!(enabled.map(str::trim), Some("Y") | Some("y") | Some("1"));
    (on && !allowed).then(|| {
        format!(
            "zswap is enabled ({ZSWAP_ENABLED} is Y): it would compress swapped pages in RAM before they reach \
             compcache, and send compcache the ones it writes back or rejects, so memory is compressed twice \
             for little gain. Disable it (echo N > {ZSWAP_ENABLED}, or zswap.enabled=0 on the kernel command \
             line), or pass --allow-zswap to set the device up anyway"
        )
    })
}

/// Take compcache swap devices out of use and remove them (all of them by default).
#[derive(clap::Args, Debug)]
pub struct SwapoffArgs {
    /// Devices to take down (e.g. /dev/ublkb0) [default: every device `compcache swapon` set up].
    pub(super) devices: Vec<PathBuf>,
}

pub fn run_swapon(args: SwaponArgs) -> Result<(), Failure> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::new("swapon needs root (creating block devices, mlock, swapon(2))"));
    }
    if let Some(why) = zswap_refusal(std::fs::read_to_string(ZSWAP_ENABLED).ok().as_deref(), args.allow_zswap) {
        return Err(Failure::new(why));
    }
    let Some(s) = settings(&args, physical_ram_bytes())? else {
        println!("compcache: the configuration asks for no device on this machine (host-memory-limit)");
        return Ok(());
    };
    let frontend = Frontend::choose(args.frontend).map_err(Failure::new)?;
    // In the foreground the stop signals are this process's to handle (blocked before any
    // thread or child exists, collected by `foreground::supervise`).
    let signals = if args.foreground { Some(crate::process::StopSignals::block()?) } else { None };
    let (server, dev) = ServerProcess::start(frontend, &s, &args.reserve, args.foreground)?;
    let state = SwapState::new(dev.clone(), frontend, server.pid(), server.log().to_path_buf());
    state.save()?;
    // Swap is enabled through the hibernation-safe name, so that systemd never writes a
    // hibernation image to it (swapdev::HIBERNATION_SAFE_PREFIX); the device's own name if
    // that node cannot be made (a read-only /dev), with a warning.
    let swap_path = match create_swap_alias(&dev) {
        Ok(alias) => alias,
        Err(e) => {
            log::warning(&format!(
                "{e}: swapping on {} itself, which systemd may choose for a hibernation image (docs/swap.md, \"Hibernation\")",
                dev.display()
            ));
            dev.clone()
        }
    };
    let enabled = mkswap(&dev, s.size_bytes).and_then(|_| swapon(&swap_path, s.priority, !args.no_discard));
    if let Err(e) = enabled {
        let _ = stop_server(&state);
        remove_swap_alias(&dev);
        let _ = std::fs::remove_file(SwapState::path_for(&dev));
        return Err(e);
    }
    let status = format!(
        "compcache: swapon {}: {} {}{}{}, priority {}, {} (server pid {}, log {}; settings from {})",
        dev.display(),
        human(s.size_bytes),
        s.algorithm,
        if s.mem_limit_bytes > 0 { format!(", mem-limit {}", human(s.mem_limit_bytes)) } else { String::new() },
        s.backing.backing.as_ref().map_or(String::new(), |p| format!(", backing {}", p.display())),
        s.priority,
        frontend,
        state.pid,
        state.log.display(),
        s.source
    );
    println!("{status}");
    if let Some(signals) = &signals {
        return foreground::supervise(server, &state, &status, signals);
    }
    // The server runs on, re-parented to init; `compcache swapoff` stops it.
    server.detach();
    Ok(())
}

pub fn run_swapoff(args: SwapoffArgs) -> Result<(), Failure> {
    // A device may be named as /proc/swaps shows it (its hibernation-safe name).
    let device = |d: &PathBuf| match d.to_str().and_then(|s| s.strip_prefix(HIBERNATION_SAFE_PREFIX)) {
        Some(name) => PathBuf::from(format!("/dev/{name}")),
        None => d.clone(),
    };
    let states: Vec<PathBuf> =
        if args.devices.is_empty() { SwapState::all() } else { args.devices.iter().map(|d| SwapState::path_for(&device(d))).collect() };
    if states.is_empty() {
        println!("compcache: no compcache swap devices");
        return Ok(());
    }
    let mut failed = Vec::new();
    for path in states {
        let state = SwapState::load(&path)?;
        let dev = state.device.clone();
        let result = (|| -> Result<(), Failure> {
            if is_active_swap(&dev) {
                swapoff(&dev)?;
            }
            remove_swap_alias(&dev);
            stop_server(&state)?;
            server::clean_up_after_fuse(&state);
            Ok(())
        })();
        match result {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                println!("compcache: swapoff {}: done ({})", dev.display(), state.frontend);
                match std::fs::read_to_string(&state.stats) {
                    Ok(stats) => print_stats(&dev, &stats),
                    Err(_) => println!("compcache: no final statistics for {} (see {})", dev.display(), state.log.display()),
                }
            }
            Err(e) => {
                log::error(&e.to_string());
                failed.push(dev.display().to_string());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(format!("could not take down {}", failed.join(", "))))
    }
}

/// The final statistics, one summary line (zramctl's columns) and the JSON.
fn print_stats(dev: &Path, json: &str) {
    // The one summary (`Stats::summary`): its ratio is orig_data_size / mem_used_total, as
    // `compcache stat` shows it; fields missing from an older server's file read as 0.
    let stats: compcache_store::Stats = serde_json::from_str(json).unwrap_or_default();
    let sum = stats.summary();
    let ratio = sum.ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.2}"));
    println!(
        "compcache: {} statistics: DATA {} COMPR {} TOTAL {} (mem_used_max {}), ratio {ratio}, same_pages {}, huge_pages {}",
        dev.display(),
        human(sum.data_bytes),
        human(sum.compr_bytes),
        human(sum.total_bytes),
        human(sum.mem_used_max),
        sum.same_pages,
        sum.huge_pages,
    );
    println!("{}", json.trim_end());
}

/// `compcache swapon` parsed from `v` (its arguments, without the command name), for the tests
/// of its parts.
#[cfg(test)]
pub(crate) fn parse_args(v: &[&str]) -> SwaponArgs {
    crate::test_flags::parse_flags(v).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zswap_on_is_refused_unless_allowed() {
        assert!(zswap_refusal(Some("Y\n"), false).is_some_and(|m| m.contains("--allow-zswap") && m.contains("echo N")));
        assert_eq!(zswap_refusal(Some("Y"), true), None);
        assert!(parse_args(&["--allow-zswap"]).allow_zswap);
        assert_eq!(zswap_refusal(Some("N\n"), false), None);
        assert_eq!(zswap_refusal(None, false), None, "a kernel without zswap");
    }
}
