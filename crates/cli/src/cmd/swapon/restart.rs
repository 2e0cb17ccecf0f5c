//! `compcache restart`: replace the running server of each device with the installed binary,
//! keeping every page (docs/swap.md, "When the server dies").
//!
//! The supervisor is asked for the hand-over (SIGUSR2): it starts a standby of the binary
//! installed at the path it was started from (`--takeover`), waits until that one has pinned
//! itself, and asks the server to hand over (SIGUSR2 again); the server exits without taking
//! anything down (FUSE first stops taking requests and answers those in flight; ublk and nbd
//! leave them to the kernel, which holds them for the successor), and the standby recovers
//! the store and serves the same device. An older supervisor passes the signal on and starts
//! the installed binary after the server's exit. `restart` waits until the record names a
//! new, live server.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::state::SwapState;
use crate::failure::Failure;
use crate::log;

/// How long a hand-over may take (the successor's start included).
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);

/// Replace the running swap server with the installed compcache, keeping every page.
#[derive(clap::Args, Debug)]
pub struct RestartArgs {
    /// The devices to restart (as `compcache swapon` printed them) [default: every
    /// device `compcache swapon` set up].
    #[arg(value_name = "DEVICE")]
    pub devices: Vec<PathBuf>,

    /// The device supervised by this process (`swapon --foreground`'s pid: the unit's
    /// `ExecReload=compcache restart --supervisor $MAINPID`) instead of named ones.
    #[arg(long, value_name = "PID", conflicts_with = "devices")]
    pub supervisor: Option<u32>,
}

pub fn run_restart(args: RestartArgs) -> Result<(), Failure> {
    let every = args.devices.is_empty() && args.supervisor.is_none();
    let states: Vec<PathBuf> = match args.supervisor {
        Some(pid) => {
            let mine: Vec<PathBuf> =
                SwapState::all().into_iter().filter(|p| SwapState::load(p).is_ok_and(|s| s.supervisor == pid)).collect();
            if mine.is_empty() {
                return Err(Failure::new(format!("no device is supervised by pid {pid}")));
            }
            mine
        }
        None if every => SwapState::all(),
        None => args.devices.iter().map(|d| SwapState::path_for(d)).collect(),
    };
    if states.is_empty() {
        println!("compcache: no compcache swap devices");
        return Ok(());
    }
    let mut failed = Vec::new();
    for path in states {
        let state = SwapState::load(&path)?;
        if every && !(state.supervisor != 0 && state.takeover) {
            // Without names, the devices that cannot be handed over keep their server.
            println!("compcache: restart {}: skipped, its server cannot be replaced ({})", state.device.display(), why_not(&state));
            continue;
        }
        match restart_one(&state, &path) {
            Ok(new) => println!("compcache: restart {}: server pid {} handed over to pid {new}", state.device.display(), state.pid),
            Err(e) => {
                log::error(&format!("{}: {e}", state.device.display()));
                failed.push(state.device.display().to_string());
            }
        }
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(Failure::new(format!("could not restart {}", failed.join(", ")))),
    }
}

/// Why `state`'s server cannot be handed over.
fn why_not(state: &SwapState) -> String {
    if state.supervisor == 0 {
        return format!("its {} server has no supervisor: only a device set up by swapon can be restarted", state.frontend);
    }
    "its store's state does not outlive the server (cache mode), so a successor could not take it over; \
     `compcache swapoff` and `swapon` change the binary"
        .into()
}

/// Hands `state`'s device over; the new server's pid.
fn restart_one(state: &SwapState, record: &std::path::Path) -> Result<u32, String> {
    if state.supervisor == 0 || !state.takeover {
        return Err(why_not(state));
    }
    // SAFETY: kill with a pid and a signal number.
    if unsafe { libc::kill(state.supervisor as libc::pid_t, libc::SIGUSR2) } != 0 {
        return Err(format!("signalling the supervisor {}: {}", state.supervisor, std::io::Error::last_os_error()));
    }
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if let Ok(now) = SwapState::load(record) {
            if now.pid != state.pid && now.pid != 0 {
                return Ok(now.pid);
            }
        }
        if start.elapsed() > RESTART_TIMEOUT {
            return Err(format!("no successor after {RESTART_TIMEOUT:?}; see {}", state.log.display()));
        }
    }
}
