//! `compcache restart`: replace the running server of each device with the installed binary,
//! keeping every page (docs/swap.md, "When the server dies").
//!
//! The server is asked to hand over (SIGUSR2): it exits without taking anything down (FUSE
//! first stops taking requests and answers those in flight; ublk and nbd leave them to the
//! kernel, which holds them for the successor); its supervisor starts the binary installed
//! at the path it was started from, with `--takeover`, which recovers the store and serves the
//! same device. `restart` waits until the record names a new, live server.

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
    /// The devices to restart (/dev/loopN as `compcache swapon` printed it) [default: every
    /// device `compcache swapon` set up].
    #[arg(value_name = "DEVICE")]
    pub devices: Vec<PathBuf>,
}

pub fn run_restart(args: RestartArgs) -> Result<(), Failure> {
    let states = if args.devices.is_empty() { SwapState::all() } else { args.devices.iter().map(|d| SwapState::path_for(d)).collect() };
    if states.is_empty() {
        println!("compcache: no compcache swap devices");
        return Ok(());
    }
    let mut failed = Vec::new();
    for path in states {
        let state = SwapState::load(&path)?;
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

/// Hands `state`'s device over; the new server's pid.
fn restart_one(state: &SwapState, record: &std::path::Path) -> Result<u32, String> {
    if state.supervisor == 0 {
        return Err(format!(
            "its {} server has no supervisor: only a device set up by this version's swapon can be restarted",
            state.frontend
        ));
    }
    if !state.takeover {
        return Err(
            "its store's state does not outlive the server, so a successor could not take it over; restarting would lose every page \
                    (`compcache swapoff` and `swapon` to change the binary)"
                .into(),
        );
    }
    // SAFETY: kill with a pid and a signal number.
    if unsafe { libc::kill(state.pid as libc::pid_t, libc::SIGUSR2) } != 0 {
        return Err(format!("signalling server {}: {}", state.pid, std::io::Error::last_os_error()));
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
