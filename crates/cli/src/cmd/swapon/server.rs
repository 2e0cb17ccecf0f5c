//! The server process `compcache swapon` starts (`compcache ublk`, `nbd-attach` or `fuse`):
//! its command line, its log file, the readiness pipe it reports the device on, and stopping
//! it again (`swapoff`, or a swapon that failed after the device was up).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::settings::Settings;
use super::state::{SwapState, STATE_DIR};
use crate::cmd::session::RECOVERING;
use crate::failure::Failure;
use crate::frontend::Frontend;

/// How long the server may take to bring the device up (generous for emulated machines).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The server's log when it writes to swapon's stderr (`swapon --foreground`, under systemd:
/// the journal).
pub(super) const JOURNAL: &str = "the journal (stderr of compcache swapon --foreground)";

/// How long a stopped server may take to exit after swapoff.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// A started server whose device is up, through the detached supervisor that started it
/// (`supervisor.rs`).
pub(super) struct ServerProcess {
    child: Child,
    log: PathBuf,
    /// With a supervisor: the server's pid and whether the supervisor holds its connection.
    supervised: Option<(u32, bool)>,
}

impl ServerProcess {
    /// Starts `frontend`'s server with the settings, detached (its own process group, so a
    /// Ctrl-C meant for swapon does not reach it; stdout and stderr to a new private log in
    /// `STATE_DIR`, or with `journal` to swapon's own, which systemd sends to the journal), and
    /// waits until it reports its device (returned). A server that fails or takes longer than
    /// `READY_TIMEOUT` is killed and its log is the error.
    ///
    /// Its `argv[0]` is `@compcache`: systemd's final killing spree at shutdown spares the
    /// processes whose name starts with `@` (its "storage daemons" rule), so the device serves
    /// until the kernel has taken its swap off, after every other process is gone.
    pub(super) fn start(frontend: Frontend, s: &Settings, reserve: &str, journal: bool) -> Result<(ServerProcess, PathBuf), Failure> {
        let (log, output) = if journal {
            (PathBuf::from(JOURNAL), None)
        } else {
            crate::private_file::create_private_dir_all(Path::new(STATE_DIR)).map_err(|e| Failure::new(format!("{STATE_DIR}: {e}")))?;
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let log = PathBuf::from(format!("{STATE_DIR}/{frontend}-{stamp}.log"));
            crate::private_file::create_new(&log).map_err(|e| Failure::new(format!("{}: {e}", log.display())))?;
            // Opened again to append: the supervisor writes to it, and so do the threads that
            // relay its servers' output (`supervisor.rs`, `relay_log`); without O_APPEND the
            // supervisor's lines would overwrite theirs at its own offset.
            let file = std::fs::OpenOptions::new().append(true).open(&log).map_err(|e| Failure::new(format!("{}: {e}", log.display())))?;
            (log, Some(file))
        };
        let (ready_r, ready_w) = ready_pipe()?;

        let exe = installed_exe()?;
        let mut cmd = Command::new(&exe);
        // The supervisor (docs/swap.md, "When the server dies") starts the server itself.
        cmd.arg0("@compcache-supervisor").arg("swap-supervisor").arg("--exe").arg(&exe).arg("--log").arg(&log);
        cmd.arg("--ready-fd").arg(ready_w.as_raw_fd().to_string()).arg("--").args(server_args(frontend, s, reserve));
        cmd.stdin(Stdio::null()).process_group(0);
        if let Some(file) = output {
            cmd.stdout(file.try_clone().map_err(|e| Failure::new(e.to_string()))?).stderr(file);
        }
        let mut child = cmd.spawn().map_err(|e| Failure::new(format!("starting the {frontend} server: {e}")))?;
        drop(ready_w);

        match wait_ready_line(ready_r) {
            Some(line) => {
                // "<device> <server pid> <held 0|1>" from the supervisor.
                let mut w = line.rsplitn(3, ' ');
                let (held, pid, dev) =
                    (w.next() == Some("1"), w.next().and_then(|p| p.parse().ok()).unwrap_or(0), w.next().unwrap_or_default());
                Ok((ServerProcess { child, log, supervised: Some((pid, held)) }, PathBuf::from(dev)))
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                let tail = if journal { String::new() } else { std::fs::read_to_string(&log).unwrap_or_default() };
                Err(Failure::new(format!(
                    "the {frontend} server did not bring a device up; its log ({}):\n{}",
                    log.display(),
                    tail.trim_end()
                )))
            }
        }
    }

    /// Whether the server is still running (not exited, not a zombie).
    pub(super) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The server's pid.
    pub(super) fn pid(&self) -> u32 {
        self.supervised.map_or(self.child.id(), |(pid, _)| pid)
    }

    /// The supervisor's pid and whether it holds the connection (FUSE).
    pub(super) fn supervisor(&self) -> Option<(u32, bool)> {
        self.supervised.map(|(_, held)| (self.child.id(), held))
    }

    pub(super) fn log(&self) -> &Path {
        &self.log
    }

    /// Leaves the server running on its own (re-parented to init; `compcache swapoff` stops
    /// it): it is not waited for.
    pub(super) fn detach(self) {
        std::mem::forget(self.child);
    }
}

/// The compcache binary by the path it is installed at (resolved now, while it is the running
/// one): a supervisor starts successors by this path, which after an upgrade is the new binary
/// (`/proc/self/exe` would then name the deleted old file).
pub(super) fn installed_exe() -> Result<PathBuf, Failure> {
    std::env::current_exe().map_err(|e| Failure::new(format!("finding the compcache binary: {e}")))
}

/// The arguments of the server `swapon` starts for `frontend`: the settings, the reserve, where
/// its final statistics go and the descriptor it reports readiness on (the supervisor adds the
/// last itself: only the tests build the whole line).
#[cfg(test)]
fn server_command(frontend: Frontend, s: &Settings, reserve: &str, ready_fd: i32) -> Vec<OsString> {
    let mut v = server_args(frontend, s, reserve);
    v.extend(["--ready-fd".into(), ready_fd.to_string().into()]);
    v
}

/// [`server_command`] without the readiness descriptor (a supervisor adds its own).
pub(super) fn server_args(frontend: Frontend, s: &Settings, reserve: &str) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![frontend.server_command().into()];
    let pairs = [
        ("--size", s.size_bytes.to_string()),
        ("--algorithm", s.algorithm.clone()),
        ("--mem-limit", s.mem_limit_bytes.to_string()),
        ("--reserve", reserve.to_string()),
        ("--stats-dir", STATE_DIR.to_string()),
    ];
    v.extend(pairs.into_iter().flat_map(|(flag, value)| [flag.into(), value.into()]));
    if let Some(l) = s.level {
        v.extend(["--level".into(), l.to_string().into()]);
    }
    v.extend(s.backing.to_args());
    v.extend(s.recompress.to_args());
    v
}

/// A pipe whose write end the child inherits (no close-on-exec) and whose read end we keep.
fn ready_pipe() -> Result<(OwnedFd, OwnedFd), Failure> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Failure::new(format!("pipe: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETFD on a descriptor we own; clears FD_CLOEXEC so the server inherits it.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(Failure::new(format!("fcntl: {}", std::io::Error::last_os_error())));
    }
    Ok((r, w))
}

/// Reads the server's readiness line (the device); `None` if it closed the pipe (it failed)
/// or timed out.
pub(super) fn wait_ready(r: OwnedFd) -> Option<PathBuf> {
    wait_ready_line(r).map(PathBuf::from)
}

/// The text after "READY " on the readiness pipe; `None` if the server closed it without
/// (it ended) or took longer than [`READY_TIMEOUT`] to write it, unless it wrote
/// [`RECOVERING`] first: then it is waited for without a bound (logged every
/// [`READY_TIMEOUT`]), since a ublk successor killed between `START_USER_RECOVERY` and its
/// queues' first fetch leaves a device that kernels before 6.15 cannot recover again (the
/// next `START_USER_RECOVERY` fails with EINVAL, or dereferences NULL in `ublk_queue_reinit`
/// if some queue had fetched: seen on 6.12 in the VM test, a kernel panic) (docs/swap.md,
/// "When the server dies").
fn wait_ready_line(r: OwnedFd) -> Option<String> {
    wait_ready_line_within(r, READY_TIMEOUT)
}

/// [`wait_ready_line`] with `timeout` for [`READY_TIMEOUT`].
fn wait_ready_line_within(r: OwnedFd, timeout: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(std::fs::File::from(r));
        loop {
            let mut line = String::new();
            let n = reader.read_line(&mut line).unwrap_or(0);
            let last = n == 0 || line.starts_with("READY ");
            if tx.send(line).is_err() || last {
                return;
            }
        }
    });
    let start = Instant::now();
    let mut recovering = false;
    loop {
        let line = match rx.recv_timeout(timeout) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) if recovering => {
                crate::log::warning(&format!(
                    "the successor has been recovering its ublk device for {:.0} s; still waiting (killing it now could leave the device unrecoverable)",
                    start.elapsed().as_secs_f64()
                ));
                continue;
            }
            Err(_) => return None,
        };
        match line.trim() {
            RECOVERING => recovering = true,
            l => return l.strip_prefix("READY ").map(str::to_string),
        }
    }
}

/// Whether `pid` is a live (not zombie) process.
pub(super) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Sends SIGTERM to the recorded supervisor (which stops its server and exits) or, without one
/// (or when the supervisor is this process: `swapon --foreground` taking its device down), to
/// the recorded server, if it is still ours, and waits for it to exit.
pub(super) fn stop_server(state: &SwapState) -> Result<(), Failure> {
    let target = match state.supervisor {
        0 => state.pid,
        s if s == std::process::id() => state.pid,
        s if !alive(s) => state.pid,
        s => s,
    };
    let cmdline = std::fs::read(format!("/proc/{target}/cmdline")).unwrap_or_default();
    if target == 0 || !alive(target) || !String::from_utf8_lossy(&cmdline).contains("compcache") {
        return Ok(());
    }
    // SAFETY: kill with a pid and a signal number has no memory-safety preconditions; the pid
    // was checked above to be a live compcache process.
    unsafe { libc::kill(target as libc::pid_t, libc::SIGTERM) };
    let start = Instant::now();
    while alive(target) {
        if start.elapsed() > EXIT_TIMEOUT {
            return Err(Failure::new(format!("server {target} did not exit within {EXIT_TIMEOUT:?}; see {}", state.log.display())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A ublk or nbd device whose server and supervisor are both dead (docs/swap.md, "Supervisor
/// gone too"): nobody will start a successor, and the kernel holds (ublk, user recovery) or
/// queues (nbd, netlink) its I/O. Deleting it (ublk: STOP_DEV, DEL_DEV) or disconnecting it
/// (nbd) fails that I/O with an I/O error, so that swapoff can finish (the pages are gone: their
/// owners get SIGBUS, never other data). Does nothing while the server or its supervisor lives.
/// Failures are logged.
pub(super) fn release_orphan(state: &SwapState) {
    if state.frontend == Frontend::Fuse || alive(state.pid) || (state.supervisor != 0 && alive(state.supervisor)) {
        return;
    }
    let name = state.device.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match state.frontend {
        Frontend::Ublk => {
            let Some(id) = name.strip_prefix("ublkb").and_then(|n| n.parse().ok()) else { return };
            match compcache_ublk::remove_orphan(id) {
                Ok(true) => crate::log::warning(&format!(
                    "{}: its server and supervisor are gone: deleted the device, its held I/O fails",
                    state.device.display()
                )),
                Ok(false) => {}
                Err(e) => crate::log::warning(&format!("{}: deleting the orphaned device: {e}", state.device.display())),
            }
        }
        Frontend::Nbd => {
            let Some(index) = name.strip_prefix("nbd").and_then(|n| n.parse().ok()) else { return };
            // A device attached with the ioctls was cleared when its server died: the kernel
            // then refuses the disconnect, which is nothing to report.
            if compcache_kernel_nbd::netlink::Nbd::open().and_then(|mut nl| nl.disconnect(index)).is_ok() {
                crate::log::warning(&format!(
                    "{}: its server and supervisor are gone: disconnected the device, its queued I/O fails",
                    state.device.display()
                ));
            }
        }
        Frontend::Fuse => {}
    }
}

/// What a FUSE server that died (killed, crashed) left behind once its swap is off: the loop
/// device still attached to its file and its mount (`/run/compcache/fuse-<pid>`), whose
/// filesystem nobody serves any more. A server that stopped normally took both down itself;
/// then this does nothing. Failures are logged: the swap is off already.
pub(super) fn clean_up_after_fuse(state: &SwapState) {
    if state.frontend != Frontend::Fuse {
        return;
    }
    let name = state.device.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // The mount is the first server's (`/run/compcache/fuse-<its pid>`), which after a takeover
    // is not the recorded server: the loop device's backing file names it.
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok();
    let mount_dir =
        backing.as_deref().and_then(|b| Path::new(b.trim()).parent()).filter(|d| d.starts_with("/run/compcache")).map(Path::to_path_buf);
    if backing.is_some() {
        match Command::new("losetup").arg("-d").arg(&state.device).output() {
            Ok(o) if o.status.success() => crate::log::info(&format!("{}: detached (its server had died)", state.device.display())),
            Ok(o) => crate::log::warning(&format!("losetup -d {}: {}", state.device.display(), String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => crate::log::warning(&format!("running losetup -d: {e}")),
        }
    }
    let dir = mount_dir.unwrap_or_else(|| PathBuf::from(format!("/run/compcache/fuse-{}", state.pid)));
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split_whitespace().nth(4) == Some(dir.to_str().unwrap_or(""))));
    if mounted {
        let c = std::ffi::CString::new(dir.to_string_lossy().as_bytes()).unwrap_or_default();
        // SAFETY: `c` is a NUL-terminated path that outlives the call; MNT_DETACH is a flag.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            crate::log::warning(&format!("unmounting {}: {}", dir.display(), std::io::Error::last_os_error()));
        }
    }
    let _ = std::fs::remove_dir(&dir);
    // A supervisor that was killed left its notify socket.
    if state.supervisor != 0 && !alive(state.supervisor) {
        let _ = std::fs::remove_file(format!("{STATE_DIR}/notify-{}.sock", state.supervisor));
    }
}

#[cfg(test)]
mod tests {
    use super::super::settings::settings;
    use super::*;
    use crate::frontend::Wanted;
    use clap::Parser;

    use super::super::parse_args as args;

    const GIB: u64 = 1 << 30;

    /// A readiness pipe whose writing end `script` writes to from a thread of its own.
    fn pipe_written(script: Vec<(u64, &'static str)>) -> OwnedFd {
        let (r, mut w) = std::io::pipe().unwrap();
        std::thread::spawn(move || {
            use std::io::Write;
            for (after_ms, text) in script {
                std::thread::sleep(Duration::from_millis(after_ms));
                let _ = w.write_all(text.as_bytes());
            }
        });
        OwnedFd::from(r)
    }

    #[test]
    fn a_successor_that_says_it_is_recovering_is_waited_for_past_the_timeout() {
        let t = Duration::from_millis(100);
        // READY in time.
        assert_eq!(wait_ready_line_within(pipe_written(vec![(10, "READY /dev/ublkb0\n")]), t).as_deref(), Some("/dev/ublkb0"));
        // READY after three timeouts, but RECOVERING first: waited for.
        let late = vec![(10, "RECOVERING\n"), (350, "READY /dev/ublkb0\n")];
        assert_eq!(wait_ready_line_within(pipe_written(late), t).as_deref(), Some("/dev/ublkb0"));
        // The same without RECOVERING: given up on.
        assert_eq!(wait_ready_line_within(pipe_written(vec![(350, "READY /dev/ublkb0\n")]), t), None);
        // RECOVERING, then the pipe closed (the successor died): not ready.
        assert_eq!(wait_ready_line_within(pipe_written(vec![(10, "RECOVERING\n")]), t), None);
    }

    #[test]
    fn the_server_gets_every_setting() {
        use crate::cmd::device::{NbdAttachArgs, UblkArgs};
        #[derive(Parser)]
        enum Server {
            Ublk(UblkArgs),
            NbdAttach(NbdAttachArgs),
        }
        let s = settings(
            &args(&[
                "--no-config",
                "--size",
                "1G",
                "--mem-limit",
                "16M",
                "--algorithm",
                "zstd",
                "--level",
                "3",
                "--backing",
                "/dev/vdb",
                "--writeback-high",
                "80",
                "--backing-incompressible",
            ]),
            2 * GIB,
        )
        .unwrap()
        .unwrap();
        // The descriptor must be a pipe, as the one swapon makes (the server checks).
        let (_r, w) = ready_pipe().unwrap();
        let fd = w.as_raw_fd();
        let cmd = server_command(Frontend::Ublk, &s, "8M", fd);
        let Server::Ublk(u) = Server::try_parse_from(std::iter::once(OsString::from("compcache")).chain(cmd)).unwrap() else {
            panic!("not ublk")
        };
        let cfg = u.store.config().unwrap();
        assert_eq!(
            (cfg.disksize_bytes, cfg.mem_limit_bytes, cfg.level, u.server.reserve.as_deref(), u.server.ready_fd),
            (GIB, 16 << 20, Some(3), Some("8M"), Some(fd))
        );
        let b = cfg.backing.unwrap();
        assert_eq!((b.path.as_path(), b.high_pct, b.incompressible), (Path::new("/dev/vdb"), 80, true));
        let cmd = server_command(Frontend::Nbd, &s, "0", fd);
        let Server::NbdAttach(n) = Server::try_parse_from(std::iter::once(OsString::from("compcache")).chain(cmd)).unwrap() else {
            panic!("not nbd")
        };
        assert_eq!(n.store.backing, s.backing);
    }

    #[test]
    fn the_fuse_server_gets_every_setting() {
        use crate::cmd::fuse::FuseArgs;
        #[derive(Parser)]
        enum Server {
            Fuse(FuseArgs),
        }
        assert_eq!(args(&["--frontend", "fuse"]).frontend, Some(Wanted::One(Frontend::Fuse)));
        let s = settings(&args(&["--no-config", "--size", "1G", "--mem-limit", "16M", "--algorithm", "zstd"]), 2 * GIB).unwrap().unwrap();
        // The descriptor must be a pipe, as the one swapon makes (the server checks).
        let (_r, w) = ready_pipe().unwrap();
        let fd = w.as_raw_fd();
        let cmd = server_command(Frontend::Fuse, &s, "8M", fd);
        assert_eq!(cmd[0], "fuse");
        let Server::Fuse(f) = Server::try_parse_from(std::iter::once(OsString::from("compcache")).chain(cmd)).unwrap();
        let cfg = f.store.config().unwrap();
        assert_eq!(
            (cfg.disksize_bytes, cfg.mem_limit_bytes, f.server.reserve.as_deref(), f.server.ready_fd, f.no_loop),
            (GIB, 16 << 20, Some("8M"), Some(fd), false)
        );
    }
}
