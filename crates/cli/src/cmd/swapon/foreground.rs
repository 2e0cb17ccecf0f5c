//! `compcache swapon --foreground`: swapon as a systemd service's main process
//! (`compcache-swap@.service`, `Type=notify`; docs/swap.md, "systemd").
//!
//! Once swap is on, it tells systemd (sd_notify `READY=1` with a status line) and stays: the
//! server, its child, logs to the same stderr (the journal). It ends when:
//! - a stop signal comes (`systemctl stop`): it takes the device out of swap use (retrying
//!   while swapoff fails, never removing a device that is still swap), stops the server and
//!   prints the final statistics, as `compcache swapoff` does;
//! - the same signal comes while the system shuts down: swap stays on and the server stays up.
//!   A swapoff now would read every swapped-out page back while the programs that own them are
//!   still alive (zram-generator stopped doing it at shutdown after 15-20 s stop jobs, its issue
//!   #191); the server's `@` name makes systemd's final kill spare it, and systemd-shutdown's
//!   own swapoff runs after every other process is gone, when little is left to read;
//! - the server exits: the device is gone with its pages, which is an error; except for a FUSE
//!   server whose connection and store survive it, which this process, its supervisor
//!   (`supervisor.rs`), replaces with a successor (and SIGUSR2, `systemctl reload`, hands it
//!   over to the installed binary).

use std::path::Path;

use super::server::ServerProcess;
use super::state::SwapState;
use super::supervisor::{Supervisor, Watch};
use super::{run_swapoff, SwapoffArgs};
use crate::failure::Failure;
use crate::log;
use crate::process::StopSignals;

/// How often the server is checked while waiting for a signal.
const CHECK_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the machine is shutting down, as systemd says it (`systemctl is-system-running`
/// prints `stopping` from the start of a shutdown or reboot); "no" without systemd.
fn system_stopping() -> bool {
    std::process::Command::new("systemctl")
        .arg("is-system-running")
        .stderr(std::process::Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "stopping")
}

pub(super) fn notify(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        log::warning(&format!("cannot notify systemd (NOTIFY_SOCKET): {e}"));
    }
}

/// The server swapon started: a process of its own (ublk, nbd, or FUSE under a detached
/// supervisor), or a FUSE server this process supervises.
pub(super) enum Server {
    Plain(ServerProcess),
    Supervised(Box<Supervisor>),
}

impl Server {
    /// Leaves the server running on its own: it is not waited for.
    pub(super) fn detach(self) {
        match self {
            Server::Plain(p) => p.detach(),
            Server::Supervised(s) => (*s).detach(),
        }
    }

    /// Waits up to `CHECK_PERIOD` for a stop signal (a supervisor meanwhile replaces a dead
    /// server); `Err(())` once the server is gone for good.
    fn wait(&mut self, signals: &StopSignals, state: &SwapState) -> Result<Option<i32>, Option<String>> {
        match self {
            Server::Plain(p) => match signals.wait_timeout(CHECK_PERIOD) {
                Some(sig) => Ok(Some(sig)),
                None if p.running() => Ok(None),
                None => Err(None),
            },
            Server::Supervised(s) => match s.watch(signals, Some(&SwapState::path_for(&state.device))) {
                Watch::Signal(sig) => Ok(Some(sig)),
                Watch::Stopped => Err(None),
                Watch::Lost(why) => Err(Some(why)),
            },
        }
    }
}

/// Stays in the foreground for the swap device `dev` served by `server` (module docs).
/// `signals` were blocked before the server was started, so that they come here.
pub(super) fn supervise(mut server: Server, state: &SwapState, status: &str, signals: &StopSignals) -> Result<(), Failure> {
    let dev = state.device.clone();
    notify(&[sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(status)]);
    let sig = loop {
        let gone = match server.wait(signals, state) {
            Ok(Some(libc::SIGUSR2)) => {
                // Only a supervisor's `watch` passes it on; a plain server cannot hand over.
                log::warning("SIGUSR2: this device's server cannot be handed over");
                continue;
            }
            Ok(Some(sig)) => break sig,
            Ok(None) => continue,
            Err(why) => why,
        };
        if let Some(why) = gone {
            log::error(&why);
        }
        // Its swap is taken off if the kernel can (nothing was swapped out, or the pages
        // read as errors); otherwise the record stays for `compcache swapoff`.
        let cleaned = match run_swapoff(SwapoffArgs { devices: vec![dev.clone()], json: false }) {
            Ok(()) => "its swap is off".to_string(),
            Err(e) => format!("{e}; `compcache swapoff {}` once nothing uses it", dev.display()),
        };
        return Err(Failure::new(format!(
            "the {} server of {} exited: the device and every page swapped out to it are gone ({cleaned}; see the journal)",
            state.frontend,
            dev.display()
        )));
    };
    notify(&[sd_notify::NotifyState::Stopping]);
    if system_stopping() {
        log::info(&format!(
            "signal {sig} while the system shuts down: {} stays swap and its server (pid {}) stays up until the kernel \
             takes the swap off after every other process is gone",
            dev.display(),
            state.pid
        ));
        server.detach();
        return Ok(());
    }
    log::info(&format!("signal {sig}: taking {} out of swap use", dev.display()));
    let r = take_down(&dev, signals);
    if let Server::Supervised(mut s) = server {
        // The server took its device down: nothing is left to take over.
        s.release();
    }
    r
    // The stopped server is this process's child: reaped when this process exits, now.
}

/// swapoff, retried while it fails (a device that is still swap is never removed), then the
/// server stopped: `compcache swapoff DEV`.
fn take_down(dev: &Path, signals: &StopSignals) -> Result<(), Failure> {
    let mut delay = crate::cmd::swapdev::SWAPOFF_RETRY_FIRST;
    loop {
        match run_swapoff(SwapoffArgs { devices: vec![dev.to_path_buf()], json: false }) {
            Ok(()) => return Ok(()),
            Err(e) if crate::cmd::swapdev::is_active_swap(dev) => {
                log::error(&format!(
                    "{e}: {} is still swap, so its server stays up; retrying in {delay:?} (or at the next SIGTERM)",
                    dev.display()
                ));
                let _ = signals.wait_timeout(delay);
                delay = (delay * 2).min(crate::cmd::swapdev::SWAPOFF_RETRY_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}
