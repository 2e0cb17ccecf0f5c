//! `compcache swapon` and `compcache swapoff`: compressed swap in one step, in the manner of
//! systemd's zram-generator.
//!
//! swapon: first the cases where zram-generator sets nothing up, when the system's
//! configuration decides what is set up (no `--config`, no `--no-config`, no `--size`: a size
//! on the command line is an explicit request, carried out): in a container (`container.rs`;
//! `--ignore-container` overrides) and with `systemd.zram=0` on the kernel command line
//! (`systemd.zram=1` adds a default `[zram0]`). Standing down is exit code 3 (`STOOD_DOWN`) and,
//! with `--json`, `"stood_down"` saying which rule. Then the devices (`settings.rs`: every
//! `[zramN]` section of the configuration, or `--section`'s, each the flags over compcache.conf
//! (`own_keys.rs`) over zram-generator's keys, all checked before any is set up), and for each:
//! the front end (`crate::frontend`: the one asked for, else ublk, else the NBD driver, else
//! FUSE through a loop device), the server process for it (`server.rs`: `compcache ublk`,
//! `compcache nbd-attach` or `compcache fuse`, detached, memory locked, its log in
//! `/run/compcache/swap/`, waited for until the device is up), then a swap header (mkswap) and
//! swapon with the priority. What it started is recorded in `/run/compcache/swap/<device>.json`
//! (`state.rs`). A device that fails does not stop the others; swapon then fails naming it.
//!
//! swapoff: for each recorded device (or the ones named) takes the swap away (the kernel
//! reads every page back), stops the server (which removes the device), and prints the
//! device's final statistics.

mod container;
mod foreground;
mod own_keys;
mod program_pin;
mod restart;
mod server;
mod settings;
mod state;
mod state_pin;
mod supervisor;

use std::path::{Path, PathBuf};

use compcache_store::physical_ram_bytes;

use super::swapdev::{create_swap_alias, is_active_swap, mkswap, remove_swap_alias, swapoff, swapon, HIBERNATION_SAFE_PREFIX};
use crate::cmd::zramconf;
use crate::failure::{Failure, STOOD_DOWN};
use crate::frontend::{Frontend, Wanted};
use crate::log;
use crate::store_args::StoreArgs;
use crate::units::human;
pub use restart::{run_restart, RestartArgs};
use server::{stop_server, ServerProcess};
use settings::{plan, Planned, Settings};
use state::SwapState;
pub use supervisor::{run_supervisor, SupervisorArgs};
pub(crate) use supervisor::{Output, Supervisor, Watch};

/// Set up a compressed RAM swap device in one step (mkswap and swapon included).
#[derive(clap::Args, Debug)]
#[command(after_help = "One device for each [zramN] section of the zram-generator configuration \
(/etc/systemd/zram-generator.conf, its drop-ins and the other places zram-generator reads, or --config), \
with compcache's own keys from /etc/compcache/compcache.conf; settings come from the flags, else \
compcache.conf, else zram-generator.conf, else zram-generator's defaults: size min(ram / 2, 4096) MiB, \
priority 100. Without any section, one device. See docs/swap.md.")]
pub struct SwaponArgs {
    /// The store flags, as every server takes them; what they leave open comes from the
    /// zram-generator configuration. The backing device is `--backing` or else the
    /// configuration's writeback-device.
    #[command(flatten)]
    pub(super) store: StoreArgs,

    /// Swap priority, 0..=32767, or -1 for the kernel's (zram-generator: swap-priority; default 100).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) priority: Option<i32>,

    /// Front end: ublk (Linux 6.0+, ublk_drv), nbd (the kernel's NBD driver), fuse (a file on
    /// a FUSE mount through a loop device), or auto (the first of these the kernel has, in
    /// that order, loading the module if needed).
    /// [default: compcache.conf's frontend, else auto]
    #[arg(long, value_name = "auto|ublk|nbd|fuse")]
    pub(super) frontend: Option<Wanted>,

    /// Read this zram-generator configuration file instead of the system's (compcache.conf is
    /// still read; the container check and the kernel's systemd.zram= switch are not made).
    #[arg(long, value_name = "FILE")]
    pub(super) config: Option<PathBuf>,

    /// Ignore every configuration file (zram-generator's and compcache's).
    #[arg(long, conflicts_with_all = ["config", "config_root"])]
    pub(super) no_config: bool,

    /// Read the configuration files, /proc/cmdline and run/systemd/container under this
    /// directory instead of / (to check another system's configuration; the tests).
    #[arg(long, value_name = "DIR")]
    pub(super) config_root: Option<PathBuf>,

    /// Set up only this section's device (e.g. zram1) [default: every [zramN] section, one
    /// device each].
    #[arg(long, value_name = "NAME")]
    pub(super) section: Option<String>,

    /// Set the configured devices up even in a container (zram-generator does nothing there;
    /// swapon, reading the system's configuration, neither, and exits 3; a --size on the
    /// command line is an explicit request and is set up without this flag).
    #[arg(long)]
    pub(super) ignore_container: bool,

    /// Memory reserved up front for storing swapped-out pages (SIZE or auto; see
    /// docs/swap.md): make it about the compressed size you expect under memory pressure
    /// [default: compcache.conf's reserve, else auto].
    #[arg(long, value_name = "SIZE|auto")]
    pub(super) reserve: Option<String>,

    /// Do not discard freed swap slots (discard is what frees the device's memory when pages
    /// are swapped back in and freed; zram-generator's default is discard too, its options
    /// key without discard turns it off).
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

    /// Print what was set up as JSON (`{"devices": [...], "stood_down": null}`: per section its
    /// device, size, algorithm, priority, front end, server pid, swap name and control socket,
    /// or why it has no device; `stood_down` says which of zram-generator's rules set nothing
    /// up) instead of the lines for people.
    #[arg(long)]
    pub(super) json: bool,
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

    /// Print the devices taken down and their final statistics as JSON (`{"devices": [...]}`)
    /// instead of the lines for people.
    #[arg(long)]
    pub(super) json: bool,
}

pub fn run_swapon(args: SwaponArgs) -> Result<(), Failure> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::new("swapon needs root (creating block devices, mlock, swapon(2))"));
    }
    if let Some(why) = zswap_refusal(std::fs::read_to_string(ZSWAP_ENABLED).ok().as_deref(), args.allow_zswap) {
        return Err(Failure::new(why));
    }
    // Descriptors systemd kept for this unit (its file descriptor store) while its previous
    // main process died: read before any thread exists (the environment is cleared).
    let mut handed = match args.foreground {
        true => crate::fdstore::handed(true).unwrap_or_else(|e| {
            log::warning(&format!("the descriptors systemd handed over: {e}"));
            Vec::new()
        }),
        false => Vec::new(),
    };
    // zram-generator's own cases for doing nothing, when the system's configuration decides
    // what is set up; a command line that names the device's size is an explicit request, and
    // is carried out (explicit_request).
    let system = args.config.is_none() && !args.no_config;
    let rules = system && !explicit_request(&args);
    let root = settings::root(&args).to_path_buf();
    if rules && !args.ignore_container {
        if let Some(kind) = container::detect(&root) {
            return stand_down(&args, "container", Some(&kind), &container::standing_down(&kind));
        }
    }
    let kernel = if system { kernel_switch(&root) } else { None };
    if rules && kernel == Some(false) {
        let msg = "compcache: systemd.zram=0 on the kernel command line: no swap devices set up (as zram-generator)";
        return stand_down(&args, "systemd.zram=0", None, msg);
    }
    let ram = physical_ram_bytes();
    let loaded = settings::load(&args, ram, kernel == Some(true))?;
    let planned = plan(&args, ram, loaded.as_ref())?;
    let devices = planned.iter().filter(|p| matches!(p, Planned::Device(_))).count();
    if args.foreground && devices != 1 {
        return Err(Failure::usage(format!(
            "--foreground serves one device and the configuration has {devices}: give --section NAME (as compcache-swap@NAME.service does)"
        )));
    }
    // In the foreground the stop signals are this process's to handle: blocked before any
    // thread or child exists, collected by `foreground::supervise`.
    let signals = if args.foreground { Some(crate::process::StopSignals::block_with_handover()?) } else { None };
    let mut failed = Vec::new();
    let mut report = Vec::new();
    for p in planned {
        match p {
            Planned::NoDevice { section, why } if args.json => report.push(serde_json::json!({"section": section, "no_device": why})),
            Planned::NoDevice { section, why } => println!("compcache: [{section}]: no device: {why}"),
            Planned::Device(s) => match set_up(&s, signals.as_ref(), args.json.then_some(&mut report), std::mem::take(&mut handed)) {
                Ok(()) => {}
                // One device: its error is the command's, exit code included.
                Err(e) if devices == 1 => return Err(e),
                Err(e) => {
                    let name = s.section.clone().unwrap_or_default();
                    log::error(&format!("[{name}]: {e}"));
                    failed.push(format!("[{name}]"));
                }
            },
        }
    }
    if args.json && !args.foreground {
        println!("{:#}", serde_json::json!({"devices": report, "stood_down": null}));
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(format!("could not set up {} (the other devices are up; compcache swapoff takes them down)", failed.join(", "))))
    }
}

/// Whether the command line itself asks for a device, rather than leaving what is set up to the
/// configuration: it names the device's size (`--size`). zram-generator's rules for setting
/// nothing up (in a container, `systemd.zram=0`) are about the configuration found at boot, so
/// they are not applied to such a request: it is carried out, and fails with the front end's
/// error where the container lacks the privileges. `--frontend` and `--section` alone only say
/// how, or which of the configured devices, to set up: the rules still apply to them.
fn explicit_request(args: &SwaponArgs) -> bool {
    args.store.size.is_some()
}

/// Sets nothing up by zram-generator's rule `rule` (`kind`: the container's), saying so on
/// stdout, or with `--json` as `{"devices": [], "stood_down": {...}}`; the exit code is
/// [`STOOD_DOWN`], so that a script can tell.
fn stand_down(args: &SwaponArgs, rule: &str, kind: Option<&str>, message: &str) -> Result<(), Failure> {
    if args.foreground {
        // As compcache-swap@.service's main process (Type=notify): a service that exits before
        // READY=1 is a failed start for systemd; READY then exit 3 (the unit's
        // SuccessExitStatus) ends it inactive, with the reason as its status line.
        foreground::notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(message)]);
    }
    if args.json {
        let why = serde_json::json!({"rule": rule, "container": kind, "message": message.trim_start_matches("compcache: ")});
        println!("{:#}", serde_json::json!({"devices": [], "stood_down": why}));
    } else {
        println!("{message}");
    }
    Err(Failure::status(STOOD_DOWN))
}

/// `systemd.zram=` on the kernel command line (under `root`), as zram-generator reads it; an
/// unreadable file is a warning and no switch.
fn kernel_switch(root: &Path) -> Option<bool> {
    let path = root.join("proc/cmdline");
    match std::fs::read_to_string(&path) {
        Ok(text) => zramconf::cmdline::systemd_zram(&text),
        Err(e) if root != Path::new("/") && e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            log::warning(&format!("{}: {e}; the systemd.zram= switch is not read", path.display()));
            None
        }
    }
}

/// One device: its server, mkswap, swapon, and the record for swapoff. With `foreground`
/// (the stop signals, blocked before any thread or child existed), it stays until told to stop
/// (`foreground::supervise`).
/// With `report` (`--json`), the device is added to it instead of printed.
fn set_up(
    s: &Settings,
    foreground: Option<&crate::process::StopSignals>,
    report: Option<&mut Vec<serde_json::Value>>,
    handed: Vec<(String, std::os::fd::OwnedFd)>,
) -> Result<(), Failure> {
    let frontend = Frontend::choose(s.frontend).map_err(Failure::new)?;
    if let (Frontend::Fuse, Some(signals)) = (frontend, foreground) {
        if let Some(state) = adoptable(&handed) {
            return adopt(s, state, handed, signals);
        }
    }
    forget_in_systemd(&handed);
    drop(handed);
    let (server, dev) = match (frontend, foreground.is_some()) {
        // In the foreground, swapon is the server's supervisor itself (supervisor.rs),
        // forwarding what the server stores to systemd's store.
        (_, true) => {
            let args = server::server_args(frontend, s, &s.reserve);
            let sup = Supervisor::start(server::installed_exe()?, args, Output::Inherit, std::env::var_os("NOTIFY_SOCKET"))?;
            let dev = sup.device.clone();
            (foreground::Server::Supervised(Box::new(sup)), dev)
        }
        _ => {
            let (p, dev) = ServerProcess::start(frontend, s, &s.reserve, foreground.is_some())?;
            (foreground::Server::Plain(p), dev)
        }
    };
    let state = match &server {
        foreground::Server::Plain(p) => {
            let mut st = SwapState::new(dev.clone(), frontend, p.pid(), p.log().to_path_buf());
            if let Some((pid, held)) = p.supervisor() {
                (st.supervisor, st.takeover) = (pid, held);
            }
            st
        }
        foreground::Server::Supervised(sup) => {
            let mut st = SwapState::new(dev.clone(), frontend, sup.server_pid(), PathBuf::from(server::JOURNAL));
            (st.supervisor, st.takeover) = (std::process::id(), sup.holds_connection());
            st
        }
    };
    // A previous device of the same name may have left its final statistics: they are not
    // this one's (a server that dies without a successor writes none, and swapoff must not
    // print another device's).
    let _ = std::fs::remove_file(&state.stats);
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
    let enabled = mkswap(&dev, s.size_bytes).and_then(|_| swapon(&swap_path, s.priority, s.discard));
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
    match report {
        Some(r) => {
            r.push(serde_json::json!({
                "section": s.section, "device": dev, "size_bytes": s.size_bytes, "algorithm": s.algorithm,
                "priority": s.priority, "frontend": frontend.name(), "pid": state.pid, "swap_name": swap_path,
                "control": state.control, "log": state.log,
            }));
            if foreground.is_some() {
                println!("{:#}", serde_json::json!({"devices": r}));
            }
        }
        None => println!("{status}"),
    }
    if let Some(signals) = foreground {
        return foreground::supervise(server, &state, &status, signals);
    }
    // The server (or its supervisor) runs on, re-parented to init; `compcache swapoff` stops it.
    server.detach();
    Ok(())
}

/// The device whose FUSE connection `handed` holds (systemd kept the descriptors of a
/// supervisor that died): the record whose loop device is on the file in the mount directory
/// the stored `compcache-fuse-init` record names. `None`: nothing to adopt.
fn adoptable(handed: &[(String, std::os::fd::OwnedFd)]) -> Option<SwapState> {
    use std::os::fd::AsFd;
    let init = handed.iter().find(|(n, _)| n == crate::cmd::fuse::FD_INIT)?;
    if !handed.iter().any(|(n, _)| n == crate::cmd::fuse::FD_FUSE) {
        return None;
    }
    let dir = crate::cmd::fuse::record_dir(init.1.as_fd()).ok()?;
    let file = dir.join(compcache_fuse::FILE_NAME);
    SwapState::all().into_iter().filter_map(|p| SwapState::load(&p).ok()).find(|st| {
        let name = st.device.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        st.frontend == Frontend::Fuse
            && std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).is_ok_and(|b| Path::new(b.trim()) == file)
    })
}

/// Descriptors systemd handed over that name no device any more (it was taken down): removed
/// from systemd's store, so that they are not handed over again.
fn forget_in_systemd(handed: &[(String, std::os::fd::OwnedFd)]) {
    let Some(sd) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let mut names: Vec<&str> = handed.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for n in names {
        let _ = crate::fdstore::notify_to(&sd, &format!("FDSTOREREMOVE=1\nFDNAME={n}\n"), &[]);
    }
}

/// `swapon --foreground` restarted by systemd while its device is up: it takes the device over
/// from the descriptors systemd kept (the running server hands over; a dead one is replaced)
/// and supervises it as if it had set it up.
fn adopt(
    s: &Settings,
    mut state: SwapState,
    handed: Vec<(String, std::os::fd::OwnedFd)>,
    signals: &crate::process::StopSignals,
) -> Result<(), Failure> {
    let args = server::server_args(Frontend::Fuse, s, &s.reserve);
    let sup = Supervisor::adopt(server::installed_exe()?, args, handed, std::env::var_os("NOTIFY_SOCKET"), state.pid)?;
    // The supervisor before this one was killed: its notify socket is left.
    if state.supervisor != 0 && !server::alive(state.supervisor) {
        let _ = std::fs::remove_file(format!("{}/notify-{}.sock", state::STATE_DIR, state.supervisor));
    }
    (state.pid, state.supervisor, state.takeover) = (sup.server_pid(), std::process::id(), sup.holds_connection());
    state.log = PathBuf::from(server::JOURNAL);
    state.save()?;
    let status = format!(
        "compcache: swapon {}: taken over from the descriptors systemd kept (server pid {}, log {})",
        state.device.display(),
        state.pid,
        state.log.display()
    );
    println!("{status}");
    foreground::supervise(foreground::Server::Supervised(Box::new(sup)), &state, &status, signals)
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
        match args.json {
            true => println!("{}", serde_json::json!({"devices": []})),
            false => println!("compcache: no compcache swap devices"),
        }
        return Ok(());
    }
    let mut failed = Vec::new();
    let mut report = Vec::new();
    for path in states {
        let state = SwapState::load(&path)?;
        let dev = state.device.clone();
        let result = (|| -> Result<(), Failure> {
            server::release_orphan(&state);
            if is_active_swap(&dev) {
                swapoff(&dev)?;
            }
            remove_swap_alias(&dev);
            stop_server(&state)?;
            server::clean_up_after_fuse(&state);
            // A server that was killed left its control socket.
            if !server::alive(state.pid) {
                let _ = std::fs::remove_file(&state.control);
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                let stats = std::fs::read_to_string(&state.stats).ok();
                if args.json {
                    let stats = stats.and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
                    report.push(serde_json::json!({"device": dev, "frontend": state.frontend.name(), "final_stats": stats}));
                    continue;
                }
                println!("compcache: swapoff {}: done ({})", dev.display(), state.frontend);
                match stats.as_deref().and_then(|s| stats_line(&dev, s)) {
                    Some(line) => println!("{line}"),
                    None => println!("compcache: no final statistics for {} (see {})", dev.display(), state.log.display()),
                }
            }
            Err(e) => {
                log::error(&e.to_string());
                failed.push(dev.display().to_string());
            }
        }
    }
    if args.json {
        println!("{:#}", serde_json::json!({"devices": report}));
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(format!("could not take down {}", failed.join(", "))))
    }
}

/// The final statistics as one summary line (zramctl's columns), for people: the whole
/// statistics are in `--json` (`final_stats`) and in the file. `None` when the file holds no
/// statistics (it is not a JSON object, or an empty one).
fn stats_line(dev: &Path, json: &str) -> Option<String> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(m)) if !m.is_empty() => {}
        _ => return None,
    }
    // The one summary (`Stats::summary`): its ratio is orig_data_size / mem_used_total, as
    // `compcache stat` shows it; fields missing from an older server's file read as 0.
    let stats: compcache_store::Stats = serde_json::from_str(json).unwrap_or_default();
    let sum = stats.summary();
    let ratio = sum.ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.2}"));
    Some(format!(
        "compcache: {} statistics: DATA {} COMPR {} TOTAL {} (mem_used_max {}), ratio {ratio}, same_pages {}, huge_pages {}",
        dev.display(),
        human(sum.data_bytes),
        human(sum.compr_bytes),
        human(sum.total_bytes),
        human(sum.mem_used_max),
        sum.same_pages,
        sum.huge_pages,
    ))
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

    #[test]
    fn the_kernel_switch_is_read_under_the_root() {
        let r = crate::cmd::zramconf::paths::tests::FakeRoot::new("cmdline");
        assert_eq!(kernel_switch(&r.0), None, "no proc/cmdline in a fake root: no switch, no warning");
        r.write("proc/cmdline", "ro quiet systemd.zram=0\n");
        assert_eq!(kernel_switch(&r.0), Some(false));
        r.write("proc/cmdline", "systemd.zram\n");
        assert_eq!(kernel_switch(&r.0), Some(true));
        assert_eq!(parse_args(&["--priority", "-1"]).priority, Some(-1), "zram-generator's -1 is a priority");
        assert!(crate::test_flags::parse_flags::<SwaponArgs>(&["--no-config", "--config-root", "/x"]).is_err());
    }

    #[test]
    fn swapoff_prints_a_summary_line_for_people_and_no_json() {
        let json = r#"{"orig_data_size": 8388608, "compr_data_size": 2097152, "mem_used_total": 4194304, "mem_used_max": 4194304, "same_pages": 3, "huge_pages": 1}"#;
        let line = stats_line(Path::new("/dev/ublkb0"), json).unwrap();
        assert!(line.starts_with("compcache: /dev/ublkb0 statistics: DATA 8M COMPR 2M TOTAL 4M"), "{line}");
        assert!(!line.contains('{') && !line.contains('\n'), "one line, no JSON: {line}");
        // An empty or broken file is no statistics (it used to print `{ }`).
        assert_eq!(stats_line(Path::new("/dev/ublkb0"), "{ }"), None);
        assert_eq!(stats_line(Path::new("/dev/ublkb0"), "not json"), None);
    }

    #[test]
    fn a_size_on_the_command_line_is_an_explicit_request() {
        assert!(explicit_request(&parse_args(&["--size", "1G"])));
        assert!(explicit_request(&parse_args(&["--frontend", "fuse", "--size", "64M"])));
        assert!(!explicit_request(&parse_args(&["--frontend", "fuse"])), "a front end says how, not whether");
        assert!(!explicit_request(&parse_args(&["--section", "zram1"])));
        assert!(!explicit_request(&parse_args(&[])));
    }
}
