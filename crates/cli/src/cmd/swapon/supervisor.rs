//! The supervisor of a swap server (ublk, nbd or FUSE): the holder of its descriptors, and the
//! one that starts a successor when it dies (docs/swap.md, "When the server dies").
//!
//! It plays systemd's part of the file descriptor store protocol (`crate::fdstore`): the
//! server's `NOTIFY_SOCKET` is the supervisor's own socket (in the private `STATE_DIR`), and
//! every descriptor it stores there (`FDSTORE=1`) is kept here, and under systemd also
//! forwarded to systemd's store (`FileDescriptorStoreMax=`), so that a restarted supervisor
//! gets them back. When the server exits:
//! - with status 0, it was stopped on purpose (swapoff, SIGTERM): the supervisor ends too;
//! - otherwise (killed, crashed, `HANDED_OVER` by `compcache restart`, a successor that
//!   refused the state) and while what its server needs is held ([`SERVERS`]: the one place
//!   that says it per server), a successor is
//!   started: the same binary path and arguments plus `--takeover`, the held descriptors as
//!   `LISTEN_FDS` from 3 with their names in `LISTEN_FDNAMES`. At once after a hand-over or a
//!   death; after more than five deaths in ten seconds, or a successor that refused the state
//!   (`TAKEOVER_REFUSED`), only after a pause that doubles up to a minute (logged), the
//!   descriptors staying held meanwhile: the device's users wait, nothing guessed is served;
//!   Before it starts one, it locks the dead server's state in memory (`state_pin.rs`): the
//!   server's locks went with it, and the successor locks the pages only once it has
//!   recovered the store. The successor is the *standby* when one waits: a process of the
//!   server started in advance (`--takeover --standby-fd N`) as soon as each server is up,
//!   that has pinned itself (memory locked) and waits on a socket pair for the held descriptors
//!   (`fdstore::hand_to_standby`); so the successor of a death needs no exec, no program
//!   read from disk and no pinning while memory may be short, and comes up sooner. A
//!   hand-over (SIGUSR2 to the supervisor: `compcache restart`) first replaces the standby
//!   by one of the binary installed now and waits until it is pinned, then asks the server
//!   to hand over (exit `HANDED_OVER`): the new program is read while the device still
//!   serves. A hand-over the supervisor did not prepare (SIGUSR2 to the server itself)
//!   dismisses the standby and starts the installed binary then. A standby that died or
//!   cannot be handed the descriptors is replaced by a successor started then;
//! - without them held (the store's state does not survive, so the server stored nothing),
//!   the device is gone with the server, as before supervision.
//!
//! The binary is started by the path it was installed at (`exe`, resolved when swapon ran),
//! not `/proc/self/exe`, which after an upgrade names the deleted old file. The supervisor is
//! on the path back from a dead server, so it is pinned like one: memory locked, OOM-exempt
//! where allowed (a supervisor swapped out to the very device it must restore would wait
//! forever).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::program_pin::ProgramPin;
use super::server::wait_ready;
use super::state::{SwapState, STATE_DIR};
use super::state_pin::StatePin;
use crate::failure::{Failure, HANDED_OVER, TAKEOVER_REFUSED};
use crate::fdstore::{NotifySocket, LISTEN_FDS_START};
use crate::log;
use crate::process::StopSignals;

/// The servers a supervisor starts, by their command (`args[0]`), and what a holder must keep
/// so that a successor can take the device over, by the names the server stores them under
/// (each server's module says why). A server command is added here, with its held names:
/// - `ublk`: the store's state and the device's number (`device.rs`); the kernel keeps the
///   device and holds its I/O (user recovery), and `/dev/ublkcN` must not be held;
/// - `nbd-attach`: the store's state and the device's index (`device.rs`); the kernel keeps the
///   device and queues its I/O for the dead-connection timeout, and the sockets must not be
///   held (their closing is how the kernel learns the server died);
/// - `fuse`: the mount's record and every `/dev/fuse` descriptor of the connection (`fuse.rs`):
///   the connection dies with its last descriptor. The store's state too, which the server
///   stores before these whenever its store has one; a cache (`--origin`) has none, and its
///   successor starts with an empty cache over the same origin.
/// - `serve`: the store's state, the NBD listeners and the control socket's listener
///   (`serve.rs`): held, they keep listening, so that clients (qemu with `reconnect-delay`)
///   reconnect into the backlog and the successor accepts them.
const SERVERS: &[(&str, &[&str])] = &[
    ("ublk", crate::cmd::device::UBLK_HELD),
    ("nbd-attach", crate::cmd::device::NBD_HELD),
    ("fuse", crate::cmd::fuse::FUSE_HELD),
    ("serve", crate::cmd::serve::SERVE_HELD),
];

/// Deaths within this window ...
const DEATH_WINDOW: Duration = Duration::from_secs(10);
/// ... beyond this many make the supervisor pause before the next successor.
const DEATHS_BEFORE_PAUSE: usize = 5;
/// The first pause, doubled each time up to [`PAUSE_MAX`].
const PAUSE_FIRST: Duration = Duration::from_secs(1);
const PAUSE_MAX: Duration = Duration::from_secs(60);
/// How often the supervisor looks for stop signals while nothing else happens.
const TICK: Duration = Duration::from_millis(200);

/// Where the server's output goes.
#[derive(Debug, Clone)]
pub(crate) enum Output {
    /// The supervisor's own stderr (`swapon --foreground`: the journal).
    Inherit,
    /// Appended to this file.
    Log(PathBuf),
}

/// What ended [`Supervisor::watch`].
#[derive(Debug)]
pub(crate) enum Watch {
    /// A stop signal came (SIGINT, SIGTERM, SIGHUP): the server still runs.
    Signal(i32),
    /// The server exited with status 0: it was stopped on purpose and took its device down.
    Stopped,
    /// The server is gone and nothing can take over: the message says why.
    Lost(String),
}

pub(crate) struct Supervisor {
    /// The server's command (`args[0]`), and the names a successor needs held ([`SERVERS`]).
    command: &'static str,
    needs: &'static [&'static str],
    /// The compcache binary, by the path it is installed at.
    exe: PathBuf,
    /// The server's arguments (`ublk ...`, `nbd-attach ...`, `fuse ...`), without `--ready-fd`
    /// and `--takeover`.
    args: Vec<OsString>,
    output: Output,
    socket: NotifySocket,
    /// The descriptors the server stored, with their names.
    held: Vec<(String, OwnedFd)>,
    /// systemd's notify socket, when the supervisor runs under systemd: stored descriptors are
    /// forwarded there.
    systemd: Option<OsString>,
    child: Option<Child>,
    /// The child's pidfd, readable when it exits.
    pidfd: Option<OwnedFd>,
    /// The device the server serves.
    pub(crate) device: PathBuf,
    backoff: Backoff,
    /// Every server this supervisor started: only their messages are taken.
    started: Vec<u32>,
    /// The standby, while one waits (`start_standby`).
    standby: Option<Standby>,
    /// The state, locked from a server's death until the next one's (`state_pin.rs`),
    /// by a thread of its own while the successor starts. Dropping the sender lets the thread go.
    pin: Option<(std::thread::JoinHandle<()>, std::sync::mpsc::Sender<()>)>,
    /// The held records (shared memory other than the state), locked for as long as they are
    /// held (`state_pin.rs`).
    record_pins: Vec<(String, StatePin)>,
    /// The files of the program a successor started from disk runs, locked (`program_pin.rs`).
    program: Option<ProgramPin>,
    /// The standby was started for a hand-over, from the binary installed then
    /// (`start_upgrade_standby`): the successor of that hand-over.
    upgrade_standby: bool,
}

impl Supervisor {
    /// A supervisor of `exe` with `args` that has started nothing yet: its notify socket bound
    /// in the private `STATE_DIR`, `held` the descriptors it already keeps.
    fn new(
        exe: PathBuf,
        args: Vec<OsString>,
        output: Output,
        held: Vec<(String, OwnedFd)>,
        systemd: Option<OsString>,
    ) -> Result<Supervisor, Failure> {
        crate::private_file::create_private_dir_all(Path::new(STATE_DIR)).map_err(|e| Failure::new(format!("{STATE_DIR}: {e}")))?;
        let path = PathBuf::from(format!("{STATE_DIR}/notify-{}.sock", std::process::id()));
        let socket = NotifySocket::bind(&path).map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
        let (command, needs) = server_of(&args)?;
        Ok(Supervisor {
            command,
            needs,
            exe,
            args,
            output,
            socket,
            held,
            systemd,
            child: None,
            pidfd: None,
            device: PathBuf::new(),
            backoff: Backoff::default(),
            started: Vec::new(),
            standby: None,
            pin: None,
            record_pins: Vec::new(),
            program: None,
            upgrade_standby: false,
        })
        .map(|mut s| {
            let adopted: Vec<(String, OwnedFd)> = std::mem::take(&mut s.held);
            for (name, fd) in adopted {
                s.hold(name, fd);
            }
            s
        })
    }

    /// Keeps `fd` under `name`; a record (shared memory that is not the state, which the
    /// server keeps locked itself and `pin` locks after its death) is locked in memory from
    /// now on ("state_pin.rs").
    fn hold(&mut self, name: String, fd: OwnedFd) {
        if name != crate::cmd::fuse::FD_STORE && super::state_pin::is_shared_memory(fd.as_fd()) {
            match StatePin::lock(fd.as_fd()) {
                Ok(p) => self.record_pins.push((name.clone(), p)),
                Err(e) => log::warning(&format!("cannot lock the record {name} in memory: {e}")),
            }
        }
        self.held.push((name, fd));
    }

    /// Starts the first server (a successor with `takeover`) and waits for its device.
    fn bring_up(&mut self, takeover: bool) -> Result<(), Option<ExitStatus>> {
        self.device = self.spawn(takeover)?;
        self.pin_program(self.server_pid());
        self.drain();
        self.start_standby();
        Ok(())
    }

    /// Starts the first server, `exe` with `args`, and waits until its device is up. `systemd`:
    /// the NOTIFY_SOCKET to forward stored descriptors to.
    pub(crate) fn start(exe: PathBuf, args: Vec<OsString>, output: Output, systemd: Option<OsString>) -> Result<Supervisor, Failure> {
        // On the way back from a dead server: never to be swapped out to its device (module docs).
        crate::process::pin_swap_server(true)?;
        let mut s = Supervisor::new(exe, args, output, Vec::new(), systemd)?;
        let command = s.command;
        s.bring_up(false)
            .map_err(|status| Failure::new(format!("the {command} server did not bring a device up ({})", describe(status))))?;
        Ok(s)
    }

    /// Adopts a device from descriptors a supervisor before this one stored in systemd's store
    /// (`held`, handed back as LISTEN_FDS when systemd restarted the unit): the server still
    /// running, `old_server`, is asked to hand over (SIGUSR2) and awaited, then a successor is
    /// started with the descriptors. The device it serves.
    pub(crate) fn adopt(
        exe: PathBuf,
        args: Vec<OsString>,
        held: Vec<(String, OwnedFd)>,
        systemd: Option<OsString>,
        old_server: u32,
    ) -> Result<Supervisor, Failure> {
        crate::process::pin_swap_server(true)?;
        if old_server != 0 && super::server::alive(old_server) {
            log::info(&format!("asking the running server (pid {old_server}) to hand over"));
            // SAFETY: kill with a pid and a signal number; the pid is the device's recorded
            // server, checked alive just now.
            unsafe { libc::kill(old_server as libc::pid_t, libc::SIGUSR2) };
            let start = Instant::now();
            while super::server::alive(old_server) {
                if start.elapsed() > Duration::from_secs(60) {
                    return Err(Failure::new(format!("the running server (pid {old_server}) did not hand over within a minute")));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let mut s = Supervisor::new(exe, args, Output::Inherit, held, systemd)?;
        s.bring_up(true).map_err(|status| {
            Failure::new(format!(
                "the successor did not take the device over ({}); its descriptors stay in systemd's store",
                describe(status)
            ))
        })?;
        Ok(s)
    }

    /// The running server's pid (0 while none runs).
    pub(crate) fn server_pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether everything a successor needs is held ([`SERVERS`]).
    pub(crate) fn holds_connection(&self) -> bool {
        self.needs.iter().all(|name| self.held.iter().any(|(n, _)| n == name))
    }

    /// Starts the server (a successor with `takeover`) and waits for its READY line: the
    /// device, or how the server ended when it did not come up.
    fn spawn(&mut self, takeover: bool) -> Result<PathBuf, Option<ExitStatus>> {
        let mode = if takeover { Launch::Takeover } else { Launch::Fresh };
        let (child, ready_r, _) = self.launch(mode).map_err(|()| None)?;
        self.await_ready(child, ready_r)
    }

    /// Starts a process of the server: a first one (`Fresh`), a successor handed the held
    /// descriptors (`Takeover`), or a standby that waits for them on a socket (`Standby`, whose
    /// end of the socket pair is returned). Errors are logged.
    fn launch(&mut self, mode: Launch) -> Result<(Child, OwnedFd, Option<OwnedFd>), ()> {
        let handed: Vec<&(String, OwnedFd)> = if mode == Launch::Takeover { self.held.iter().collect() } else { Vec::new() };
        let n = handed.len() as RawFd;
        let first_free = LISTEN_FDS_START + n;
        let (ready_r, ready_w) = pipe().map_err(|e| log::error(&format!("pipe: {e}")))?;
        // Every descriptor the child gets by number lies at or above `first_free`, so that
        // moving the handed ones to 3.. in the child overwrites none of them.
        let ready_child = dup_above(ready_w.as_fd().as_raw_fd(), first_free, false).map_err(|_| ())?;
        let sources: Vec<OwnedFd> = handed.iter().filter_map(|(_, fd)| dup_above(fd.as_raw_fd(), first_free, true).ok()).collect();
        if sources.len() != handed.len() {
            log::error("duplicating the held descriptors failed");
            return Err(());
        }
        let standby = match mode {
            Launch::Standby => {
                let (ours, theirs) = crate::fdstore::standby_pair().map_err(|e| log::error(&format!("socketpair: {e}")))?;
                Some((ours, dup_above(theirs.as_raw_fd(), first_free, false).map_err(|_| ())?))
            }
            _ => None,
        };
        let mut cmd = Command::new(&self.exe);
        cmd.arg0("@compcache").args(&self.args).arg("--ready-fd").arg(ready_child.as_raw_fd().to_string());
        cmd.env("NOTIFY_SOCKET", self.socket.env_value()).env_remove("LISTEN_PID").env_remove("LISTEN_FDS").env_remove("LISTEN_FDNAMES");
        match (&mode, &standby) {
            (Launch::Takeover, _) => {
                let names: Vec<&str> = handed.iter().map(|(name, _)| name.as_str()).collect();
                cmd.arg("--takeover").env("LISTEN_FDS", handed.len().to_string()).env("LISTEN_FDNAMES", names.join(":"));
            }
            (Launch::Standby, Some((_, theirs))) => {
                cmd.arg("--takeover").arg("--standby-fd").arg(theirs.as_raw_fd().to_string());
            }
            _ => {}
        }
        cmd.stdin(Stdio::null()).process_group(0);
        if let Output::Log(path) = &self.output {
            let file = std::fs::OpenOptions::new().append(true).open(path).map_err(|e| log::error(&format!("{}: {e}", path.display())))?;
            let w = relay_log(file).map_err(|e| log::error(&format!("relaying the server's log to {}: {e}", path.display())))?;
            let copy = w.try_clone().map_err(|_| ())?;
            cmd.stdout(copy).stderr(w);
        }
        let raw: Vec<RawFd> = sources.iter().map(|f| f.as_raw_fd()).collect();
        // SAFETY: the closure runs in the child between fork and exec and calls only dup2, which
        // is async-signal-safe; it touches `raw`, a vector made before the fork and not freed
        // in the child. Each target 3 + i lies below every source (module: `first_free`).
        unsafe {
            cmd.pre_exec(move || {
                for (i, &src) in raw.iter().enumerate() {
                    if libc::dup2(src, LISTEN_FDS_START + i as RawFd) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| log::error(&format!("starting {}: {e}", self.exe.display())))?;
        drop((ready_w, ready_child, sources));
        self.started.push(child.id());
        Ok((child, ready_r, standby.map(|(ours, _theirs)| ours)))
    }

    /// Waits for `child`'s READY line on `ready_r`: then it is the server, and its device is
    /// returned; else it is not serving (killed if still running), and how it ended.
    fn await_ready(&mut self, mut child: Child, ready_r: OwnedFd) -> Result<PathBuf, Option<ExitStatus>> {
        self.pidfd = pidfd_open(child.id());
        match wait_ready(ready_r) {
            Some(dev) => {
                self.child = Some(child);
                Ok(dev)
            }
            None => {
                // Dead, or not up in time: it is not serving.
                if matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                if matches!(child.try_wait(), Ok(None)) {
                    let _ = child.kill();
                }
                Err(reap(&mut child, Duration::ZERO))
            }
        }
    }

    /// Starts a standby for the server that is up (docs/swap.md, "A standby"), if a successor
    /// could take over (the connection is held) and none waits yet. A failure is logged: the
    /// successor is then started when needed, as without a standby.
    ///
    /// At once, also while the machine's memory is short: a standby's start allocates (its
    /// locked memory; what it sets aside only as memory is to spare, `takeover_reserve.rs`),
    /// and those allocations may wait
    /// in reclaim beside the server that just came up; but a death with no standby is taken
    /// over by a successor from disk that must allocate all that while the device's I/O is
    /// held, with nothing to give it memory, and a standby still starting at a death is killed
    /// and gives its memory back (`activate_standby`). (Until 2026-11-29 the standby waited for
    /// a 100 ms look at /proc/vmstat's `allocstall_*` that found no direct reclaim, seen to
    /// hold it back in the VM test's `global-kill`; there a death that found no standby had its
    /// successor from disk sit in `mlock` of its I/O buffers for good.)
    fn start_standby(&mut self) {
        if self.standby.is_some() || !self.holds_connection() {
            return;
        }
        if let Ok((child, ready, Some(sock))) = self.launch(Launch::Standby) {
            self.standby = Some(Standby { child, ready, sock, waiting: false });
        }
    }

    /// Before a hand-over (SIGUSR2): replaces the standby by one of the binary installed now
    /// and waits (up to [`UPGRADE_STANDBY_WAIT`]) until it says it is pinned, so that the
    /// successor's program is read and locked while the device still serves, not while its
    /// I/O waits for it: under memory pressure a program read then may need pages only the
    /// device can give back (docs/swap.md, "A standby, started in advance"). Then
    /// `upgrade_standby` is set, and `revive` hands the device to it.
    fn start_upgrade_standby(&mut self) {
        self.upgrade_standby = false;
        if !self.holds_connection() {
            return;
        }
        self.dismiss_standby();
        self.start_standby();
        let Some(s) = &mut self.standby else {
            log::warning("no standby could be started: the successor starts after the hand-over");
            return;
        };
        let start = Instant::now();
        if s.says_it_waits(UPGRADE_STANDBY_WAIT) {
            let pid = s.child.id();
            log::info(&format!(
                "standby pid {pid} of the installed binary is pinned and waits ({:.0} ms)",
                start.elapsed().as_secs_f64() * 1e3
            ));
            // Should it fail, the successor started from disk is this program.
            self.pin_program(pid);
        } else {
            log::warning(&format!(
                "the standby pid {} did not say it waits (it ended, or {UPGRADE_STANDBY_WAIT:?} passed): asking the server to hand over all the same",
                s.child.id()
            ));
        }
        self.upgrade_standby = true;
    }

    /// Hands the held descriptors to the standby and waits for its READY. `None`: there is no
    /// live standby, or it could not be handed them (it is then dismissed): start a successor.
    ///
    /// A standby that has not said it waits within [`STANDBY_GRACE`] is killed instead: it is
    /// still starting, and a standby starts by allocating (its locked memory), which with the
    /// machine out of memory waits in reclaim for the very device whose server just died. Handed the descriptors, it would read them only
    /// once those allocations end, that is never, or when the supervisor's patience ends (seen
    /// in the VM test's `global-kill` step, 2026-11-29: a standby in `mlock` of the memory it
    /// sets aside, the device held 122 s until `READY_TIMEOUT`, then a successor from disk
    /// served in under a second). Killed, it gives its memory back for the successor.
    fn activate_standby(&mut self) -> Option<Result<PathBuf, Option<ExitStatus>>> {
        let mut s = self.standby.take()?;
        if !matches!(s.child.try_wait(), Ok(None)) {
            log::warning(&format!("the standby (pid {}) had ended: starting a successor instead", s.child.id()));
            return None;
        }
        if !s.says_it_waits(STANDBY_GRACE) {
            log::warning(&format!(
                "the standby (pid {}) is still starting ({STANDBY_GRACE:?} after the server's end it has not said it waits): \
                 killed, its memory given back; starting a successor instead",
                s.child.id()
            ));
            let _ = reap(&mut s.child, Duration::ZERO);
            return None;
        }
        if let Err(e) = crate::fdstore::hand_to_standby(s.sock.as_fd(), &self.held) {
            log::warning(&format!("handing the descriptors to the standby (pid {}): {e}; starting a successor instead", s.child.id()));
            let _ = reap(&mut s.child, Duration::ZERO);
            return None;
        }
        Some(self.await_ready(s.child, s.ready))
    }

    /// Dismisses the standby, if any (its socket closed: it exits 0), and waits for it.
    fn dismiss_standby(&mut self) {
        if let Some(mut s) = self.standby.take() {
            drop(s.sock);
            let _ = reap(&mut s.child, Duration::from_secs(5));
        }
    }

    /// Reads every queued notify message: stored descriptors are kept (and forwarded to
    /// systemd), `FDSTOREREMOVE=1` drops the name's.
    fn drain(&mut self) {
        loop {
            let m = match self.socket.recv() {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(e) => {
                    log::warning(&format!("reading the notify socket: {e}"));
                    return;
                }
            };
            if !self.started.contains(&m.pid) {
                log::warning(&format!("a notify message from pid {}, not a server of this supervisor: dropped", m.pid));
                continue;
            }
            let name = m.get("FDNAME").unwrap_or("stored").to_string();
            if m.get("FDSTOREREMOVE") == Some("1") {
                self.held.retain(|(n, _)| *n != name);
                self.record_pins.retain(|(n, _)| *n != name);
                if let Some(sd) = &self.systemd {
                    let _ = crate::fdstore::notify_to(sd, &format!("FDSTOREREMOVE=1\nFDNAME={name}\n"), &[]);
                }
                continue;
            }
            if m.get("FDSTORE") != Some("1") || m.fds.is_empty() {
                continue;
            }
            if let Some(sd) = &self.systemd {
                let fds: Vec<_> = m.fds.iter().map(|f| f.as_fd()).collect();
                if let Err(e) = crate::fdstore::notify_to(sd, &format!("FDSTORE=1\nFDNAME={name}\n"), &fds) {
                    log::warning(&format!(
                        "forwarding {} descriptor(s) {name} to systemd's store: {e} (FileDescriptorStoreMax=?)",
                        fds.len()
                    ));
                }
            }
            for fd in m.fds {
                self.hold(name.clone(), fd);
            }
        }
    }

    /// Forgets every held descriptor (the device was taken down), here and in systemd's store.
    pub(crate) fn release(&mut self) {
        if let Some(sd) = &self.systemd {
            let mut names: Vec<&str> = self.held.iter().map(|(n, _)| n.as_str()).collect();
            names.dedup();
            for n in names {
                let _ = crate::fdstore::notify_to(sd, &format!("FDSTOREREMOVE=1\nFDNAME={n}\n"), &[]);
            }
        }
        self.held.clear();
        self.record_pins.clear();
    }

    /// Waits for a stop signal, starting a successor whenever the server dies (module docs).
    /// SIGUSR2 is passed on to the server (hand over to the installed binary).
    pub(crate) fn watch(&mut self, signals: &StopSignals, record: Option<&Path>) -> Watch {
        loop {
            self.wait_event(TICK);
            self.drain();
            match signals.wait_timeout(Duration::ZERO) {
                Some(libc::SIGUSR2) => {
                    let pid = self.server_pid();
                    log::info(&format!("SIGUSR2: asking the server (pid {pid}) to hand over to {}", self.exe.display()));
                    // Its successor is the binary installed now, started and pinned first.
                    self.start_upgrade_standby();
                    if pid != 0 {
                        // SAFETY: kill with our own child's pid (not yet reaped) and a signal number.
                        unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR2) };
                    }
                }
                Some(sig) => return Watch::Signal(sig),
                None => {}
            }
            let status = match self.child.as_mut().map(Child::try_wait) {
                Some(Ok(None)) => continue,
                Some(Ok(Some(status))) => Some(status),
                Some(Err(_)) | None => None,
            };
            let seen = Instant::now();
            self.child = None;
            self.pidfd = None;
            self.drain();
            if status.is_some_and(|s| s.code() == Some(0)) {
                self.dismiss_standby();
                return Watch::Stopped;
            }
            if !self.holds_connection() {
                self.dismiss_standby();
                return Watch::Lost(format!("the server exited ({}) and nothing a successor needs is held", describe(status)));
            }
            self.pin_state();
            if let Some(sig) = self.revive(status, seen, signals, record) {
                return Watch::Signal(sig);
            }
        }
    }

    /// Starts successors until one is up; a stop signal during a pause ends the attempts (it is
    /// returned).
    fn revive(&mut self, mut status: Option<ExitStatus>, seen: Instant, signals: &StopSignals, record: Option<&Path>) -> Option<i32> {
        loop {
            let pause = self.backoff.after(status.and_then(|s| s.code()), Instant::now());
            log::warning(&format!(
                "the {} server of {} ended ({}); {}",
                self.command,
                self.device.display(),
                describe(status),
                if pause.is_zero() {
                    "starting a successor".to_string()
                } else {
                    format!("starting a successor in {pause:?} (the device waits)")
                }
            ));
            if !pause.is_zero() {
                let until = Instant::now() + pause;
                while Instant::now() < until {
                    match signals.wait_timeout(until.saturating_duration_since(Instant::now()).min(TICK)) {
                        Some(libc::SIGUSR2) | None => {}
                        Some(sig) => return Some(sig),
                    }
                }
            }
            if status.and_then(|s| s.code()) == Some(HANDED_OVER) && !std::mem::take(&mut self.upgrade_standby) {
                // A hand-over the supervisor did not prepare (`compcache restart` signals the
                // server itself): its successor is the binary installed now, not the standby
                // started from the one before.
                self.dismiss_standby();
            }
            let (result, from) = match self.activate_standby() {
                Some(r) => (r, " (the standby)"),
                None => (self.spawn(true), ""),
            };
            match result {
                Ok(dev) => {
                    log::info(&format!(
                        "successor pid {}{from} serves {} {:.1} ms after the server's end was seen (takeover {:.1} ms)",
                        self.server_pid(),
                        dev.display(),
                        seen.elapsed().as_secs_f64() * 1e3,
                        (seen.elapsed().saturating_sub(pause)).as_secs_f64() * 1e3,
                    ));
                    self.drain();
                    self.backoff.up();
                    self.pin_program(self.server_pid());
                    // The state stays locked here (`state_pin.rs`): a successor locks the pages
                    // it touches, not every page its predecessors wrote.
                    self.start_standby();
                    if let Some(r) = record {
                        update_record(r, self.server_pid());
                    }
                    return None;
                }
                Err(s) => {
                    status = s;
                    self.drain();
                }
            }
        }
    }

    /// Locks the files of the program process `pid` runs (`program_pin.rs`), in place of those
    /// locked before, unless they are the same files. A failure is a warning: a successor
    /// started from disk may then have to read its program back while memory is short.
    fn pin_program(&mut self, pid: u32) {
        if pid == 0 {
            return;
        }
        let Some(files) = ProgramPin::files_of(pid) else { return };
        if self.program.as_ref().is_some_and(|p| p.files == files) {
            return;
        }
        match ProgramPin::of_process(pid) {
            Ok(pin) => {
                log::info(&format!(
                    "locked the program's {} files ({:.1} MiB) in memory, for a successor started from disk",
                    pin.files.len(),
                    pin.locked as f64 / (1 << 20) as f64
                ));
                self.program = Some(pin);
            }
            Err(e) => {
                log::warning(&format!("cannot lock the program's files in memory: {e} (a successor started from disk may wait for them)"))
            }
        }
    }

    /// Locks the held state's pages (`state_pin.rs`) on a thread of its own, which starts at once
    /// and so runs while the successor starts (it takes tens of milliseconds for hundreds of
    /// MiB); it logs how much and how long. The lock is held until the next server's death
    /// replaces it (the new one taken first, then the old let go) or the supervisor ends: a
    /// successor locks only the pages it touches, and a page of the state that no one locks may
    /// be swapped out to this very device, where the next successor (or this lock) would wait
    /// for it forever (seen: tests/test_takeover.py, a supervisor's state-pin thread and a
    /// successor both in `shmem_swapin_folio` waiting for the writeback of a state page to the
    /// device, 2026-11-28). A refused lock is a warning.
    fn pin_state(&mut self) {
        let old = self.pin.take();
        let Some((_, fd)) = self.held.iter().find(|(n, _)| n == crate::cmd::fuse::FD_STORE) else { return };
        let Ok(fd) = fd.try_clone() else { return };
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new().name("state-pin".into()).spawn(move || {
            let start = Instant::now();
            let pin = StatePin::lock(fd.as_fd());
            // The pages the old lock held are locked again now (or the new lock failed).
            if let Some((h, old_release)) = old {
                drop(old_release);
                let _ = h.join();
            }
            match pin {
                Ok(pin) => {
                    log::info(&format!(
                        "locked the state's {:.1} MiB in memory ({:.1} ms)",
                        pin.locked as f64 / (1 << 20) as f64,
                        start.elapsed().as_secs_f64() * 1e3
                    ));
                    // Held until the supervisor lets go (its end of the channel dropped).
                    let _ = wait.recv();
                    drop(pin);
                }
                Err(e) => log::warning(&format!("cannot lock the state in memory: {e}")),
            }
        });
        match spawned {
            Ok(h) => self.pin = Some((h, release)),
            Err(e) => log::warning(&format!("cannot lock the state in memory until a successor is up: {e}")),
        }
    }

    /// Sleeps until the server exits, a notify message comes, or `timeout` passes.
    fn wait_event(&self, timeout: Duration) {
        let mut fds = vec![libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        if let Some(p) = &self.pidfd {
            fds.push(libc::pollfd { fd: p.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout.as_millis() as libc::c_int) };
    }

    /// Stops the server (SIGTERM: it takes its device out of swap and down, and exits 0) and
    /// waits for it; then forgets the descriptors.
    pub(crate) fn stop(&mut self, timeout: Duration) -> Result<(), Failure> {
        self.dismiss_standby();
        if let Some(child) = &mut self.child {
            // SAFETY: kill with our own child's pid (not yet reaped) and a signal number.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let start = Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if start.elapsed() > timeout => {
                        return Err(Failure::new(format!("server {} did not exit within {timeout:?}", child.id())));
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
        self.child = None;
        self.release();
        Ok(())
    }

    /// Leaves the server running on its own (the machine shuts down): not waited for.
    pub(crate) fn detach(mut self) {
        if let Some(c) = self.child.take() {
            std::mem::forget(c);
        }
    }
}

/// What [`Supervisor::launch`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    Fresh,
    Takeover,
    Standby,
}

/// A successor started in advance (`--standby-fd`): pinned, waiting on `sock` for the
/// descriptors; `ready` is its readiness pipe.
/// How long a hand-over waits for its new standby to say it is pinned before the server is
/// asked to hand over (a TCG guest under memory pressure takes seconds).
const UPGRADE_STANDBY_WAIT: Duration = Duration::from_secs(30);

struct Standby {
    child: Child,
    ready: OwnedFd,
    sock: OwnedFd,
    /// It said it waits (`WAITING=1`: pinned, buffers made, memory set aside), read by
    /// [`Supervisor::start_upgrade_standby`] or [`Supervisor::activate_standby`].
    waiting: bool,
}

impl Standby {
    /// Whether it has said it waits, reading its socket up to `within` for that (and
    /// remembering it: the message is read once).
    fn says_it_waits(&mut self, within: Duration) -> bool {
        self.waiting = self.waiting || crate::fdstore::standby_waiting(self.sock.as_fd(), within);
        self.waiting
    }
}

/// How long a server's death waits for a standby that has not yet said it waits, before it is
/// killed and a successor started from disk instead (`activate_standby`).
const STANDBY_GRACE: Duration = Duration::from_secs(3);

/// The server of a command line (`args[0]`) and what its successor needs held ([`SERVERS`]).
fn server_of(args: &[OsString]) -> Result<(&'static str, &'static [&'static str]), Failure> {
    let command = args.first().and_then(|a| a.to_str()).unwrap_or_default();
    let known: Vec<&str> = SERVERS.iter().map(|(c, _)| *c).collect();
    SERVERS
        .iter()
        .copied()
        .find(|(c, _)| *c == command)
        .ok_or_else(|| Failure::new(format!("{command:?} is not a server a supervisor can restart (one of: {})", known.join(", "))))
}

/// When to start the next successor (module docs): at once, except after a refusal of the
/// state or in a crash loop (more than [`DEATHS_BEFORE_PAUSE`] deaths within
/// [`DEATH_WINDOW`]), when the pause doubles from [`PAUSE_FIRST`] up to [`PAUSE_MAX`].
#[derive(Debug, Default)]
struct Backoff {
    deaths: VecDeque<Instant>,
    pause: Duration,
}

impl Backoff {
    /// The pause before the successor of a server that ended at `now` with exit `code` (None:
    /// killed by a signal, or it never reported).
    fn after(&mut self, code: Option<i32>, now: Instant) -> Duration {
        if code == Some(HANDED_OVER) {
            // Asked for: no death.
            return Duration::ZERO;
        }
        self.deaths.push_back(now);
        while self.deaths.front().is_some_and(|t| now.duration_since(*t) > DEATH_WINDOW) {
            self.deaths.pop_front();
        }
        if code == Some(TAKEOVER_REFUSED) || self.deaths.len() > DEATHS_BEFORE_PAUSE {
            self.pause = (self.pause * 2).clamp(PAUSE_FIRST, PAUSE_MAX);
            return self.pause;
        }
        Duration::ZERO
    }

    /// A successor is up: the next death starts from no pause (a crash loop is caught by the
    /// death count).
    fn up(&mut self) {
        self.pause = Duration::ZERO;
    }
}

/// How a server ended, for the log.
fn describe(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "it did not report its device".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(HANDED_OVER), _) => "handed over".into(),
            (Some(TAKEOVER_REFUSED), _) => "it refused the state it was handed".into(),
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => format!("{s}"),
        },
    }
}

/// Writes the running server's pid into the device's record (swapoff and restart read it).
fn update_record(record: &Path, pid: u32) {
    if let Ok(mut s) = SwapState::load(record) {
        s.pid = pid;
        if let Err(e) = s.save() {
            log::warning(&format!("{e}"));
        }
    }
}

/// How long [`reap`] waits for a killed child.
const REAP_AFTER_KILL: Duration = Duration::from_secs(2);

/// Waits for `child` to end, up to `grace`, then kills it and waits up to [`REAP_AFTER_KILL`]
/// more; its status, or `None` if it still has not ended. Such a child is left as it is (a
/// thread of it in an uninterruptible wait, say for a page only the device can give back,
/// keeps it from ending until the device serves again): the supervisor must not wait for it,
/// since starting the successor is what lets it end.
fn reap(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    let mut killed = false;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        let waited = start.elapsed();
        if !killed && waited >= grace {
            let _ = child.kill();
            killed = true;
        }
        if waited >= grace + REAP_AFTER_KILL {
            log::warning(&format!("pid {} has not ended {:?} after it was killed: going on without it", child.id(), REAP_AFTER_KILL));
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How much a server may write to its log pipe while the relay is held up (Linux's limit for
/// a process without CAP_SYS_RESOURCE; the default, 64 KiB, where the kernel refuses).
const LOG_PIPE_BYTES: libc::c_int = 1 << 20;

/// The write end of a pipe whose lines a thread of the supervisor appends to `file`: a server's
/// stdout and stderr.
///
/// Why not the file itself: the log is on tmpfs, whose pages may be swapped out to the
/// server's own device, and a thread writing to it then waits uninterruptibly for a swap-in
/// only the server can serve. In a server that thread is not only stuck: a SIGKILLed server
/// with a thread in that wait cannot finish dying, so it keeps its device's descriptors and no
/// successor can take over. A write to a pipe waits interruptibly (a killed writer dies), and
/// only when the relay is 1 MiB behind; the relay thread, which may wait on the file, is
/// nothing a takeover waits for.
fn relay_log(mut file: std::fs::File) -> std::io::Result<OwnedFd> {
    let (r, w) = pipe()?;
    // SAFETY: F_SETPIPE_SZ on a pipe this function just made; a refusal leaves the default.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, LOG_PIPE_BYTES) };
    std::thread::Builder::new().name("log-relay".into()).spawn(move || {
        // Until every writer (the server and whatever inherited its output) has closed it.
        let _ = std::io::copy(&mut std::fs::File::from(r), &mut file);
    })?;
    Ok(w)
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A copy of `fd` numbered `min` or above; close-on-exec or not.
fn dup_above(fd: RawFd, min: RawFd, cloexec: bool) -> std::io::Result<OwnedFd> {
    let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    // SAFETY: fcntl F_DUPFD(_CLOEXEC) on a descriptor we hold; returns a new one or -1.
    let new = unsafe { libc::fcntl(fd, cmd, min) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// A pidfd of `pid` (Linux 5.3+), readable once the process exits; `None` where there is none
/// (the supervisor then notices a death within `TICK`).
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: the pidfd_open system call with a pid and no flags; returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a new descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `compcache swap-supervisor` (hidden): the detached supervisor `compcache swapon` starts for
/// each device (module docs).
#[derive(clap::Args, Debug)]
pub struct SupervisorArgs {
    /// The compcache binary to start servers from.
    #[arg(long, value_name = "PATH")]
    exe: PathBuf,
    /// The servers' log (appended to).
    #[arg(long, value_name = "PATH")]
    log: PathBuf,
    /// Where to write "READY <device> <server pid> <1 if the connection is held, else 0>".
    #[arg(long, value_name = "FD", value_parser = crate::cmd::session::parse_ready_fd)]
    ready_fd: i32,
    /// The server's command line (`ublk ...`, `nbd-attach ...`, `fuse ...`).
    #[arg(last = true, required = true)]
    server: Vec<OsString>,
}

/// Runs the detached supervisor until its server stops or it is told to stop.
pub fn run_supervisor(args: SupervisorArgs) -> Result<(), Failure> {
    let signals = StopSignals::block_with_handover()?;
    // Not under systemd: nothing to forward (`swapon --foreground` is systemd's supervisor).
    let mut sup = Supervisor::start(args.exe, args.server, Output::Log(args.log), None)?;
    let held = u8::from(sup.holds_connection());
    crate::cmd::session::signal_ready(Some(args.ready_fd), &format!("READY {} {} {held}\n", sup.device.display(), sup.server_pid()));
    let record = SwapState::path_for(&sup.device);
    match sup.watch(&signals, Some(&record)) {
        Watch::Signal(sig) => {
            log::info(&format!("signal {sig}: stopping the server of {}", sup.device.display()));
            sup.stop(Duration::from_secs(60))
        }
        Watch::Stopped => {
            sup.release();
            Ok(())
        }
        Watch::Lost(why) => {
            Err(Failure::new(format!("{}: {why}; the device's pages are gone (`compcache swapoff` cleans up)", sup.device.display())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_is_ready_once_it_says_it_waits_and_stays_so() {
        let (ours, theirs) = crate::fdstore::standby_pair().unwrap();
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let (ready, _w) = std::io::pipe().unwrap();
        let mut s = Standby { child, ready: ready.into(), sock: ours, waiting: false };
        // Silent (still starting): not ready, after the grace given.
        let t = Instant::now();
        assert!(!s.says_it_waits(Duration::from_millis(100)));
        assert!(t.elapsed() >= Duration::from_millis(90), "{:?}", t.elapsed());
        // Its message: ready, and still so once the message is read.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // What `fdstore::wait_as_standby` sends first. SAFETY: a live socket and a buffer
            // of the length given.
            unsafe { libc::send(theirs.as_raw_fd(), b"WAITING=1\n".as_ptr().cast(), 10, 0) };
            std::thread::sleep(Duration::from_millis(500));
        });
        assert!(s.says_it_waits(Duration::from_secs(5)));
        assert!(s.says_it_waits(Duration::ZERO));
        let _ = reap(&mut s.child, Duration::ZERO);
    }

    #[test]
    fn successors_start_at_once_unless_refused_or_in_a_crash_loop() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // Kills and hand-overs: at once, five deaths in the window are not yet a loop.
        for i in 0..5 {
            assert_eq!(b.after(None, t0 + s(i)), Duration::ZERO, "death {i}");
            assert_eq!(b.after(Some(HANDED_OVER), t0 + s(i)), Duration::ZERO, "a hand-over is no death");
        }
        // The sixth within ten seconds: a crash loop, 1 s, then doubling.
        assert_eq!(b.after(Some(101), t0 + s(5)), s(1));
        assert_eq!(b.after(None, t0 + s(6)), s(2));
        b.up();
        // Deaths spread out: the window forgets the old ones, the pause starts again at none.
        assert_eq!(b.after(None, t0 + s(60)), Duration::ZERO);
        // A refused state pauses at once, doubling to a minute, while no successor comes up.
        let got: Vec<u64> = (0..9).map(|i| b.after(Some(TAKEOVER_REFUSED), t0 + s(100 + 100 * i)).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        b.up();
        assert_eq!(b.after(Some(TAKEOVER_REFUSED), t0 + s(10_000)), s(1));
    }
}
