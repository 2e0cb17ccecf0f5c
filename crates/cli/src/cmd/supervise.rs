//! `compcache supervise -- <server command>`: runs a server in the foreground under the
//! supervisor `compcache swapon` gives its swap servers (`swapon/supervisor.rs`): it holds the
//! descriptors the server stores (the file descriptor store protocol, `crate::fdstore`) and,
//! when the server dies, starts a successor that takes its device over; SIGUSR2 (or
//! `systemctl reload` of a unit running this) hands the device over to the binary installed at
//! the same path. For servers that are not swap devices, or that an operator runs by hand: a
//! cache (`fuse --origin`, whose successor starts with an empty cache over the same origin), a
//! device on a FUSE file (`fuse --no-loop`), or an NBD server (`serve`, whose clients reconnect
//! to the successor: qemu's `reconnect-delay`). Which servers can be supervised, and what each
//! needs held, is in the supervisor's `SERVERS`.
//!
//! It ends when the server stops on its own (exit 0: this exits 0 too), when the server is gone
//! and nothing a successor needs is held (an error: the device is gone with it), or on SIGINT,
//! SIGTERM or SIGHUP, which stop the server as a signal to it would (it takes its device down)
//! and then end this. Under systemd (`NOTIFY_SOCKET`) the held descriptors are also forwarded
//! to the service's store, so that a restarted `compcache supervise` is handed them
//! (`LISTEN_FDS`) and starts a successor with them rather than a new device.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::cmd::swapon::{Output, Supervisor, Watch};
use crate::failure::Failure;
use crate::log;
use crate::process::StopSignals;

/// How long a server asked to stop may take to take its device down.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Run a server under a supervisor that holds its descriptors and starts a successor that
/// takes the device over when it dies (docs/swap.md, "When the server dies").
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Append the servers' output to this file [default: this command's standard error].
    #[arg(long, value_name = "PATH")]
    log: Option<PathBuf>,
    /// The server's command line, after `--`: `fuse ...` (a cache with --origin, or a device),
    /// or `serve ...` (NBD, for qemu and other clients that reconnect).
    #[arg(last = true, required = true, value_name = "SERVER")]
    server: Vec<OsString>,
}

pub fn run(args: Args) -> Result<(), Failure> {
    // Handed descriptors (systemd restarted this unit and kept what the last supervisor held);
    // read before any thread starts, as the environment is cleared.
    let handed = crate::fdstore::handed(true).map_err(|e| Failure::new(format!("the descriptors handed to this process: {e}")))?;
    let signals = StopSignals::block_with_handover()?;
    let exe = std::env::current_exe().map_err(|e| Failure::new(format!("finding the compcache binary: {e}")))?;
    let output = match args.log {
        Some(path) => {
            // The servers append to it; created here owner-only (it says what they serve).
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| Failure::new(format!("--log {}: {e}", path.display())))?;
            Output::Log(path)
        }
        None => Output::Inherit,
    };
    let systemd = std::env::var_os("NOTIFY_SOCKET");
    let mut sup = if handed.is_empty() {
        Supervisor::start(exe, args.server, output, systemd)?
    } else {
        log::info(&format!("{} descriptor(s) handed over: a successor takes the device over", handed.len()));
        Supervisor::adopt(exe, args.server, handed, systemd, 0)?
    };
    let held = if sup.holds_connection() { "a successor takes over if it dies" } else { "nothing is held: the device ends with it" };
    println!("compcache: supervise: {} served by pid {} ({held})", sup.device.display(), sup.server_pid());
    let _ = crate::fdstore::notify("READY=1", &[]);
    match sup.watch(&signals, None) {
        Watch::Signal(sig) => {
            log::info(&format!("signal {sig}: stopping the server of {}", sup.device.display()));
            sup.stop(STOP_TIMEOUT)
        }
        Watch::Stopped => {
            sup.release();
            Ok(())
        }
        Watch::Lost(why) => Err(Failure::new(format!("{}: {why}", sup.device.display()))),
    }
}
