//! What every swap server (`ublk`, `nbd-attach`, `fuse`) does around its device, whatever
//! the front end: the flags they share besides the store's ([`ServerArgs`]), the readiness
//! line `compcache swapon` waits for, and the [`Session`]: the store and its threads before
//! the device is up, then the control socket, the wait for a stop signal, taking the device
//! out of swap use, and the final statistics.
//!
//! On a stop signal the device is first taken out of swap use if the kernel still swaps to
//! it, then removed. It is never removed while it is swap: a failed swapoff is logged with
//! what to do, the device keeps serving, and swapoff is retried with a growing pause and at
//! each further stop signal (`swapdev::take_out_of_swap`). The final statistics go to
//! `--stats-dir/<device>.stats.json` and a control socket (`/run/compcache/<device>.ctl`)
//! answers `compcache stat --control` while the device is up.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use compcache_control::{self as control, ControlState, DeviceInfo};
use compcache_store::{physical_ram_bytes, Config, Store};

use super::reserve;
use super::swapdev::{take_out_of_swap, KernelSwap};
use crate::backing::{spawn_writeback, StartGuard};
use crate::failure::Failure;
use crate::frontend::Frontend;
use crate::log;
use crate::private_file;
use crate::process::{lock_future_mappings, pin_swap_server, StopSignals};
use crate::store_args::{config_error_line, StoreArgs};
use crate::takeover_reserve::{TakeoverReserve, TAKEOVER_RESERVE_BYTES};
use crate::units::human;

/// How long the announcement of a device waits for the lines logged before it to be written
/// (writing a line to a file takes microseconds; only a writer blocked on a swapped-out log
/// page takes longer, and then the device is announced without them).
const ANNOUNCE_LOG_FLUSH: std::time::Duration = std::time::Duration::from_millis(100);

/// Where a takeover began (a standby: when the descriptors came; a successor started with them:
/// when its recovery began), and this process's page faults until then (`getrusage`). Logged with the faults since once the device serves again: every fault a
/// takeover takes while the device's I/O is held may wait in reclaim for memory only that
/// device can free (docs/swap.md, "A standby, started in advance").
static TAKEOVER_BEGAN: std::sync::OnceLock<(std::time::Instant, Faults)> = std::sync::OnceLock::new();

/// This process's page faults so far: (minor, major).
type Faults = (u64, u64);

fn faults() -> Faults {
    // SAFETY: getrusage writes one rusage into the zeroed value it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF counts every thread of this process.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    (u.ru_minflt as u64, u.ru_majflt as u64)
}

/// Marks the start of a takeover (the first call counts).
fn takeover_begins() {
    let _ = TAKEOVER_BEGAN.set((std::time::Instant::now(), faults()));
}

/// "N ms and F page faults (M major) from the descriptors to serving", for a takeover.
fn takeover_cost() -> Option<String> {
    let (at, (minor0, major0)) = TAKEOVER_BEGAN.get()?;
    let (minor, major) = faults();
    Some(format!(
        "{:.1} ms and {} page faults ({} major) from the descriptors to serving",
        at.elapsed().as_secs_f64() * 1e3,
        (minor + major).saturating_sub(minor0 + major0),
        major.saturating_sub(*major0)
    ))
}

/// What both servers take besides the store.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Do not lock the server's memory. Only for experiments: a swap server that can itself be
    /// swapped out can deadlock the machine.
    #[arg(long)]
    pub no_mlock: bool,

    /// Write the final statistics to DIR/<device>.stats.json on exit.
    #[arg(long, value_name = "DIR")]
    pub stats_dir: Option<PathBuf>,

    /// Memory kept resident and free for the I/O path, so that storing a swapped-out page
    /// never waits for memory (see docs/swap.md): a SIZE, `auto` (1/128 of RAM, 8..=128 MiB)
    /// or 0 for none [default: auto] (`swapon` passes its own).
    #[arg(long, value_name = "SIZE|auto|0")]
    pub reserve: Option<String>,

    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics (a port alone: on
    /// 127.0.0.1). See docs/metrics.md.
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = crate::metrics::parse_metrics_addr)]
    pub metrics: Option<std::net::SocketAddr>,

    /// File descriptor to write "READY <device>" to once the device is up (used by swapon).
    #[arg(long, value_name = "FD", hide = true, value_parser = parse_ready_fd)]
    pub ready_fd: Option<i32>,

    /// Start as a standby (a supervisor's, with --takeover): pin the process, then wait on this
    /// socket for the descriptors of the device to take over ([`wait_if_standby`]).
    /// (The commands that flatten these arguments check that --takeover is given too:
    /// `wait_if_standby`.)
    #[arg(long, value_name = "FD", hide = true, value_parser = parse_standby_fd)]
    pub standby_fd: Option<i32>,
}

/// Parses `--standby-fd`: a socket (the supervisor's socket pair) above stderr.
pub fn parse_standby_fd(text: &str) -> Result<i32, String> {
    let fd: i32 = text.parse().map_err(|_| format!("{text:?} is not a descriptor number"))?;
    // SAFETY: stat is plain data; all-zero is valid storage for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `st`; a bad descriptor is EBADF, not undefined behaviour.
    if fd <= 2 || unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("descriptor {fd} is not the socket a supervisor passes a standby"));
    }
    Ok(fd)
}

/// A standby (`--standby-fd`, started by a supervisor in advance of a server's death): pinned
/// as a swap server is, its memory locked before it is needed, it waits until its supervisor
/// hands it the descriptors of the device to take over, and returns; the server then takes
/// them as it takes `LISTEN_FDS` (`fdstore::handed`). Dismissed (the supervisor closed the
/// socket, or died), it exits 0. Called first by every server, before it reads what it was
/// handed. What a successor still needs after this is little: the heap for its recovery's
/// lists (proportional to the pages it serves, a few MiB for hundreds of MiB) and no reserve
/// (recovery hands it its predecessor's resident free pages).
pub fn wait_if_standby(server: &ServerArgs, takeover: bool) -> Result<(), Failure> {
    let Some(fd) = server.standby_fd else { return Ok(()) };
    if !takeover {
        return Err(Failure::new("--standby-fd needs --takeover (a standby takes a device over)"));
    }
    pin_swap_server(!server.no_mlock)?;
    wait_as_standby(fd, !server.no_mlock)
}

/// The wait of [`wait_if_standby`] on socket `fd`, for a standby that has pinned itself as its
/// server needs (`serve`: its `--mlock`); `locked`: its memory is locked (said in the log).
pub fn wait_as_standby(fd: i32, locked: bool) -> Result<(), Failure> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    // SAFETY: the supervisor passed this descriptor for exactly this use (`parse_standby_fd`
    // checked it is a socket); nothing else in this process owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // Memory for the takeover's first allocations, given back when it begins
    // (`takeover_reserve.rs`). Only with the memory locked: unlocked, it could be swapped out.
    let reserve = match locked {
        true => match TakeoverReserve::set_aside(TAKEOVER_RESERVE_BYTES) {
            Ok(r) => Some(r),
            Err(e) => {
                log::warning(&format!("standby: cannot set memory aside for the takeover: {e}"));
                None
            }
        },
        false => None,
    };
    let aside = reserve
        .as_ref()
        .map_or(String::new(), |r| format!("setting {} aside for the takeover as memory is to spare, ", human(r.len() as u64)));
    let locked = if locked { "memory locked, " } else { "" };
    log::info(&format!("standby pid {}: {locked}{aside}waiting for a device to take over", std::process::id()));
    let handed = crate::fdstore::wait_as_standby(sock.as_fd());
    takeover_begins();
    // Given back to the kernel now, as the takeover starts to allocate.
    if let Some(r) = reserve {
        let (locked, len) = (r.locked(), r.len());
        drop(r);
        if handed.as_ref().is_ok_and(|&h| h) {
            log::info(&format!(
                "standby: {} of the {} set aside was locked when the takeover began; given back",
                human(locked as u64),
                human(len as u64)
            ));
        }
    }
    match handed {
        Ok(true) => Ok(()),
        Ok(false) => std::process::exit(0),
        Err(e) => Err(Failure::new(format!("standby: waiting for the descriptors: {e}"))),
    }
}

/// Parses `--ready-fd`: the write end of the pipe `compcache swapon` passes. Anything else (a
/// closed descriptor, stdin/stdout/stderr, a regular file, a terminal, a socket) is refused,
/// so that the readiness line can never land in a file or on a descriptor the server uses.
pub fn parse_ready_fd(text: &str) -> Result<i32, String> {
    let fd: i32 = text.parse().map_err(|_| format!("{text:?} is not a descriptor number"))?;
    if fd <= 2 {
        return Err(format!("{fd} is stdin, stdout or stderr: give the pipe `compcache swapon` passes"));
    }
    // SAFETY: stat is plain data; all-zero is valid storage for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `st`, which is valid for writes; a bad descriptor is an
    // error (EBADF), not undefined behaviour.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!("descriptor {fd}: {} (it must be open: the pipe `compcache swapon` passes)", std::io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => "a regular file",
            libc::S_IFCHR => "a character device (a terminal?)",
            libc::S_IFSOCK => "a socket",
            libc::S_IFDIR => "a directory",
            _ => "not a pipe",
        };
        return Err(format!("descriptor {fd} is {kind}: it must be the pipe `compcache swapon` passes"));
    }
    Ok(fd)
}

/// Writes `text` to the readiness file descriptor `fd` (a pipe from `compcache swapon`) and
/// closes it.
pub fn signal_ready(fd: Option<i32>, text: &str) {
    if let Some(fd) = fd {
        use std::os::fd::FromRawFd;
        // SAFETY: the parent passed this descriptor to us for exactly this use; nothing else
        // in this process owns it, so taking ownership (and closing it on drop) is sound.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let _ = f.write_all(text.as_bytes());
    }
}

/// What a ublk successor writes on its readiness pipe just before `START_USER_RECOVERY`: from
/// then on its supervisor does not give up on it (swapon's `server.rs`, `wait_ready_line`).
pub const RECOVERING: &str = "RECOVERING";

/// Writes the line `text` to the readiness file descriptor `fd` and leaves it open: progress
/// before the READY line ([`RECOVERING`]).
pub fn signal_progress(fd: Option<i32>, text: &str) {
    if let Some(fd) = fd {
        use std::os::fd::FromRawFd;
        // SAFETY: the parent passed this descriptor to us for this use; the File is never
        // dropped (ManuallyDrop), so the descriptor stays open for `signal_ready`.
        let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
        let _ = f.write_all(text.as_bytes());
    }
}

/// Everything a running swap server needs around the device, shared by the front ends (ublk
/// and nbd in `device.rs`, fuse in `fuse.rs`).
pub(super) struct Session {
    pub(super) store: Arc<Store>,
    pub(super) cfg: Config,
    /// The size the front end exposes.
    pub(super) size_bytes: u64,
    server: ServerArgs,
    signals: StopSignals,
    frontend: Frontend,
    /// Until the device is up: a refused start gives the backing device up (`StartGuard`).
    start: std::sync::Mutex<Option<StartGuard>>,
    /// A takeover's background threads, started once the device serves ([`Background`]).
    deferred: std::sync::Mutex<Option<Background>>,
}

/// What a session runs beside the device: the reserve's keeper, writeback (with a backing
/// device: with the store fault-free, a write that finds no resident pool page overflows to
/// the device, and this thread keeps the pool under its watermarks meanwhile) and
/// recompression; and, in a server that starts fresh, from then on every new mapping populated
/// when made ([`lock_future_mappings`]).
struct Background {
    reserve: Option<reserve::Reserve>,
    /// Whether new mappings are to be populated and locked whole from now on: a fresh start's
    /// (memory is plentiful). Not a takeover's: it keeps locking on fault for its whole life.
    /// Populating is done under the process's mmap lock held for writing (`mprotect` of a new
    /// thread's stack populates it there), and a queue thread's `madvise` (the store giving a
    /// page back) waits for that lock: in the VM test's `global-kill` step a successor, just
    /// serving again with memory at its shortest, started its reserve keeper so, and its main
    /// thread sat in reclaim populating the 512 KiB stack while a queue thread waited in
    /// `madvise` behind it and the device stopped serving (2026-11-28).
    populate: bool,
}

impl Background {
    /// Starts it all; the error is one line.
    fn start(self, store: &Arc<Store>) -> Result<(), String> {
        lock_future_mappings(self.populate);
        if let Some(keeper) = self.reserve {
            std::thread::Builder::new()
                .name("reserve".into())
                .spawn(move || keeper.keep())
                .map_err(|e| format!("starting the reserve keeper: {e}"))?;
        }
        if store.has_backing() {
            spawn_writeback(Arc::clone(store)).map_err(|e| format!("starting the writeback thread: {e}"))?;
        }
        if store.recompresses() {
            crate::maintenance::spawn_recompression(Arc::clone(store)).map_err(|e| format!("starting the recompression thread: {e}"))?;
        }
        Ok(())
    }
}

/// How a [`Session`] ended: stopped (the device was taken down, or is gone), or handed over to
/// a successor (nothing was taken down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    Stopped,
    HandOver,
}

impl Session {
    /// Makes the store and its threads: a new store, or with `state` the one a predecessor
    /// left there (`Store::recover`); the stop signals and SIGUSR2, the request to hand over,
    /// are blocked for the session to take. A state the store refuses is a
    /// [`TAKEOVER_REFUSED`](crate::failure::TAKEOVER_REFUSED) failure of one line.
    pub(super) fn start_with(
        store_args: &StoreArgs,
        server: &ServerArgs,
        frontend: Frontend,
        state: Option<OwnedFd>,
    ) -> Result<Session, Failure> {
        // Before any thread exists: every thread inherits the blocked mask and the flags.
        // SIGUSR2 (hand over, `compcache restart`) too: a server that cannot hand over logs and
        // ignores it rather than dying of it.
        let signals = StopSignals::block_with_handover()?;
        pin_swap_server(!server.no_mlock)?;
        let cfg = store_args.config()?;
        let size_bytes = cfg.disksize_bytes;
        let reserve_bytes = match server.reserve.as_deref().unwrap_or("auto") {
            "auto" => reserve::default_high_bytes(physical_ram_bytes()),
            t => crate::units::size_or_none("--reserve", t, physical_ram_bytes(), "no reserve")?,
        };
        let takeover = state.is_some();
        let store = match state {
            None => Store::new(cfg.clone()).map_err(|e| Failure::new(format!("cannot create the store: {}", config_error_line(&e))))?,
            Some(fd) => {
                takeover_begins();
                let (store, report) = Store::recover(cfg.clone(), fd).map_err(|e| {
                    crate::failure::with_code(
                        crate::failure::TAKEOVER_REFUSED,
                        format!("cannot take the device over: {}", config_error_line(&e)),
                    )
                })?;
                log::info(&format!("took the store over: {report}"));
                store
            }
        };
        let store = Arc::new(store);
        let start = StartGuard::new(&store);
        let reserve = (reserve_bytes > 0).then(|| {
            let mut keeper = reserve::Reserve::new(Arc::clone(&store), reserve_bytes);
            keeper.prime(!takeover);
            keeper
        });
        let background = Background { reserve, populate: !server.no_mlock && !takeover };
        // A takeover starts its background threads only once the device serves again
        // (`while_up_handing_over`, after its READY): until then the device's I/O is held,
        // memory may be at its shortest, and a thread's stack and heap are allocations that can
        // wait in reclaim for the very swap-outs the device holds (docs/swap.md, "A standby,
        // started in advance"). None of them is needed to serve. And a takeover never has new
        // mappings populated whole (`Background::populate`).
        let deferred = if takeover {
            Some(background)
        } else {
            background.start(&store).map_err(Failure::new)?;
            None
        };
        let start = std::sync::Mutex::new(Some(start));
        Ok(Session { store, cfg, size_bytes, server: server.clone(), signals, frontend, start, deferred: std::sync::Mutex::new(deferred) })
    }

    /// Runs while the device is up: announce it, serve `compcache stat` (the control socket and
    /// statistics named `name`: `/run/compcache/<name>.ctl`), wait for a stop signal, and take
    /// the device out of swap use before it goes. With `can_hand_over` (a supervised server
    /// whose descriptors are held), SIGUSR2 ends it as [`Ending::HandOver`]: nothing is taken down, no statistics are
    /// written, and the caller hands the connection over and exits. Without it SIGUSR2 is
    /// logged and ignored.
    pub(super) fn while_up_handing_over(
        &self,
        dev: &Path,
        name: &str,
        detail: &str,
        alive: &dyn Fn() -> bool,
        can_hand_over: bool,
    ) -> Ending {
        if let Some(start) = self.start.lock().ok().and_then(|mut s| s.take()) {
            start.started();
        }
        let ctl = PathBuf::from(format!("/run/compcache/{name}.ctl"));
        let _ = std::fs::create_dir_all("/run/compcache");
        let _ = std::fs::remove_file(&ctl);
        let state = Arc::new(ControlState {
            store: Arc::clone(&self.store),
            device: DeviceInfo {
                export_name: dev.display().to_string(),
                nbd_socket: None,
                nbd_tcp: None,
                control_socket: ctl.display().to_string(),
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                origin: self.origin(),
                frontend: self.frontend.name().into(),
                backing: self.cfg.backing.as_ref().map(|b| b.path.display().to_string()),
            },
        });
        // The device is up: a metrics endpoint that cannot start is reported, not fatal.
        if let Some(addr) = self.server.metrics {
            if let Err(e) = crate::metrics::serve_http(addr, Arc::clone(&state), can_hand_over) {
                log::warning(&format!("{e}; the device serves without metrics"));
            }
        }
        match control::bind(&ctl) {
            Ok(listener) => {
                let _ = std::thread::Builder::new().name("control".into()).spawn(move || {
                    control::serve(state, listener);
                });
            }
            Err(e) => log::warning(&format!("no control socket {}: {e}", ctl.display())),
        }
        // Whoever reads the log once the device is announced (a supervisor, a test, an operator
        // after READY) finds every line logged before the announcement, in order before it:
        // the log's writer thread may still hold them. Bounded: a writer stuck on a log file
        // swapped out to this very device must not hold the announcement up.
        compcache_log::flush(ANNOUNCE_LOG_FLUSH);
        // A closed stdout (a supervisor that stopped reading) must not kill a running device.
        let _ = writeln!(
            std::io::stdout(),
            "compcache: {} is up: {}, {}{} {}{}{}, {detail}; control {}; pid {}",
            dev.display(),
            self.frontend,
            human(self.cfg.disksize_bytes),
            self.origin().map_or(String::new(), |o| format!(" cache of {o}")),
            self.cfg.algorithm,
            if self.cfg.mem_limit_bytes > 0 { format!(", mem-limit {}", human(self.cfg.mem_limit_bytes)) } else { String::new() },
            self.cfg.backing.as_ref().map_or(String::new(), |b| format!(", backing {}", b.path.display())),
            ctl.display(),
            std::process::id()
        );
        signal_ready(self.server.ready_fd, &format!("READY {}\n", dev.display()));
        if let Some(cost) = takeover_cost() {
            log::info(&format!("serving {} again: {cost}", dev.display()));
        }
        // A takeover's, once the device serves and its supervisor knows it. A thread that cannot
        // start is reported; the device serves without it (its job waits: no reserve top-up,
        // writeback or recompression).
        if let Some(background) = self.deferred.lock().ok().and_then(|mut d| d.take()) {
            if let Err(e) = background.start(&self.store) {
                log::error(&format!("{e}; the device serves without it"));
            }
        }
        loop {
            match self.signals.wait(alive) {
                Some(libc::SIGUSR2) if can_hand_over => {
                    log::info(&format!("SIGUSR2: handing {} over to a successor", dev.display()));
                    let _ = std::fs::remove_file(&ctl);
                    return Ending::HandOver;
                }
                Some(libc::SIGUSR2) => {
                    log::warning(&format!(
                        "SIGUSR2: {} cannot be handed over (no holder keeps its descriptors); it keeps serving",
                        dev.display()
                    ));
                    continue;
                }
                Some(sig) => log::info(&format!("signal {sig}: removing {}", dev.display())),
                None => log::info(&format!("{} was stopped by the kernel or another program", dev.display())),
            }
            break;
        }
        // The front end removes the device once this returns: not while it is swap.
        let mut pause = |d: std::time::Duration| self.signals.wait_timeout(d);
        take_out_of_swap(dev, &KernelSwap, &mut pause, &mut |line: &str| log::info(line));
        super::swapdev::remove_swap_alias(dev);
        let _ = std::fs::remove_file(&ctl);
        if let Some(origin) = self.origin() {
            // Write-through: every completed write is on the origin already; this makes it
            // durable there too before the device goes.
            if let Err(e) = self.store.flush() {
                log::error(&format!("flushing the origin {origin} at exit: {e}"));
            }
        }
        self.write_stats(name);
        Ending::Stopped
    }

    /// In cache mode, the origin the device fronts.
    pub(super) fn origin(&self) -> Option<String> {
        self.cfg.origin.as_ref().map(|o| o.path.display().to_string())
    }

    /// The final statistics, to the log and to `--stats-dir` (a private file, replacing only
    /// this user's own: `private_file`).
    fn write_stats(&self, name: &str) {
        let stats = serde_json::to_value(self.store.stats()).unwrap_or_default();
        log::info(&format!("final statistics of {name}: {stats}"));
        if let Some(dir) = &self.server.stats_dir {
            let path = dir.join(format!("{name}.stats.json"));
            let written = private_file::create_private_dir_all(dir)
                .and_then(|_| private_file::write_replacing_own(&path, format!("{stats:#}\n").as_bytes()));
            if let Err(e) = written {
                log::error(&format!("{}: {e}", path.display()));
            }
        }
    }
}

impl Drop for Session {
    /// The front end has removed the device (or never made it): empty the backing device,
    /// so that no page data outlives the server (docs/backing.md); the store itself is
    /// shared with threads that outlive the session. A start refused before the device was
    /// up then also removes a backing file it created (`start`, dropped after this).
    fn drop(&mut self) {
        self.store.close_backing();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<ServerArgs, clap::Error> {
        crate::test_flags::parse_flags(v)
    }

    #[test]
    fn ready_fd_must_be_a_pipe() {
        use std::os::fd::AsRawFd;
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let w = fds[1].to_string();
        assert_eq!(parse(&["--ready-fd", &w]).unwrap().ready_fd, Some(fds[1]));
        // SAFETY: both descriptors came from pipe() above and are closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        // (Not the pipe's number: another test's thread may open a file under it meanwhile.)
        let e = parse(&["--ready-fd", "987654"]).expect_err("a closed descriptor is refused").to_string();
        assert!(e.contains("must be open"), "{e}");
        for fd in ["0", "1", "2"] {
            let e = parse(&["--ready-fd", fd]).expect_err("stdio is refused").to_string();
            assert!(e.contains("stdin, stdout or stderr"), "{e}");
        }
        let path = std::env::temp_dir().join(format!("compcache-ready-fd-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let fd = file.as_raw_fd().to_string();
        let e = parse(&["--ready-fd", &fd]).expect_err("a regular file is refused").to_string();
        drop(file);
        std::fs::remove_file(&path).unwrap();
        assert!(e.contains("regular file"), "{e}");
        assert!(parse(&["--ready-fd", "x"]).is_err());
    }
}
