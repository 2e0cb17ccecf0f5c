//! The server process itself, the same for every server (`serve`, `ublk`, `nbd-attach`,
//! `fuse`): the stop signals and keeping its memory resident.
//!
//! Signals: SIGINT, SIGTERM and SIGHUP, and SIGUSR2 (hand over to a successor), are blocked in
//! the main thread before any other thread exists (so every thread inherits the mask and none
//! is killed by them; the one thread started earlier, the log's writer, blocks every signal
//! itself) and collected with
//! `sigtimedwait` ([`StopSignals`]). SIGHUP is left alone when it is ignored (`nohup`): Linux
//! keeps a blocked signal pending even when its action is to ignore it, so waiting would see
//! it and stop a server that was told to survive its terminal.
//!
//! Memory: [`lock_memory`] is the one `mlockall` (the program whole, the rest on fault)
//! (`serve --mlock`, and every swap server unless `--no-mlock`); a swap server adds the I/O
//! flusher flag, OOM exemption and locking of every later mapping ([`pin_swap_server`],
//! [`lock_future_mappings`]).

use std::io;
use std::time::Duration;

use crate::failure::Failure;
use crate::log;

/// SIGINT, SIGTERM and SIGHUP (unless ignored) and SIGUSR2, blocked in the calling thread (and
/// so in every thread started after) and collected by [`StopSignals::wait`].
pub struct StopSignals {
    set: libc::sigset_t,
}

// SAFETY: sigset_t is plain data (a bit array) with no pointers or thread affinity.
unsafe impl Send for StopSignals {}
// SAFETY: as above; it is never written after construction.
unsafe impl Sync for StopSignals {}

impl StopSignals {
    /// Blocks the stop signals and SIGUSR2, the request to hand the device over to a successor
    /// (`compcache restart`), which a server that cannot hand over logs and ignores rather than
    /// dying of it. Call before any thread exists.
    pub fn block_with_handover() -> Result<StopSignals, Failure> {
        // SAFETY: `set` and `old` are plain C structs; `set` is initialised by sigemptyset
        // before any other use and `old` is only written by sigaction (a null new action
        // changes nothing). pthread_sigmask only reads `set`. No Rust invariant depends on
        // signal state.
        let (set, rc) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            let mut old: libc::sigaction = std::mem::zeroed();
            let hup_ignored = libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN;
            if !hup_ignored {
                libc::sigaddset(&mut set, libc::SIGHUP);
            }
            libc::sigaddset(&mut set, libc::SIGUSR2);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            (set, rc)
        };
        if rc != 0 {
            return Err(Failure::new(format!("cannot block SIGINT/SIGTERM/SIGHUP: {}", io::Error::from_raw_os_error(rc))));
        }
        Ok(StopSignals { set })
    }

    /// Waits up to `timeout` for a stop signal; returns it, or `None` when none came.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<i32> {
        let t = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
        // SAFETY: `self.set` is initialised, `t` is a valid timespec, and a null siginfo
        // pointer is allowed.
        let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &t) };
        (sig > 0).then_some(sig)
    }

    /// Returns the signal that arrived, or `None` once `alive()` turns false (checked once a
    /// second: an idle server's main thread wakes no more than that).
    pub fn wait(&self, alive: &dyn Fn() -> bool) -> Option<i32> {
        loop {
            if let Some(sig) = self.wait_timeout(Duration::from_secs(1)) {
                return Some(sig);
            }
            if !alive() {
                return None;
            }
        }
    }

    /// Waits for a stop signal, however long that takes (no wake-up before it comes).
    pub fn wait_forever(&self) -> i32 {
        loop {
            // SAFETY: `self.set` is initialised; a null siginfo pointer is allowed.
            let sig = unsafe { libc::sigwaitinfo(&self.set, std::ptr::null_mut()) };
            if sig > 0 {
                return sig;
            }
            // EINTR (a signal outside the set, e.g. SIGSTOP/SIGCONT): wait again.
        }
    }
}

/// The name of a stop signal, for the log line.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "signal",
    }
}

/// Locks a server's memory, before the store's big sparse mappings exist:
/// - `mlockall(MCL_CURRENT | MCL_FUTURE)`: everything mapped now (the program's text and data, the shared
///   libraries, the heap, the stack) is faulted in whole and locked. Not on fault: a page of
///   code the server has not run yet would otherwise be read in the first time it runs, and
///   that may be under memory pressure, in the middle of a swap-out. Where the program lives
///   on tmpfs (an initramfs, a container's root), its untouched pages are tmpfs pages that
///   the kernel may swap out *to this very device*, and the fault that reads one back waits
///   for a swap-in only this server can serve: the VM test's `global` step hung so, a server
///   thread in `shmem_swapin_folio` (docs/swap.md). From disk it is only slow. Costs the
///   program's size in RAM (about 5 MiB of text), as zram's code costs the kernel's.
/// - then `mlockall(MCL_FUTURE | MCL_ONFAULT)`: every mapping made later is locked page by
///   page as it is touched, so the store's reserved but untouched address space costs nothing
///   (without `MCL_ONFAULT`, `MCL_FUTURE` would populate the whole reservation at once). A
///   swap server later drops `MCL_ONFAULT` for the I/O threads' mappings
///   ([`lock_future_mappings`]).
///
/// Before locking, it fixes glibc's mmap threshold ([`MALLOC_MMAP_THRESHOLD_BYTES`]), so that
/// what the server frees is given back although it is locked.
///
/// `flag` names what asked for it in the error.
pub fn lock_memory(flag: &str) -> Result<(), Failure> {
    fix_malloc_mmap_threshold();
    set_thread_stack_size();
    // MCL_FUTURE with MCL_CURRENT, not after it: mlockall(MCL_CURRENT) alone clears the flags
    // of future mappings first and then faults every page in, which takes milliseconds (far
    // longer in an emulated guest); a mapping another thread made meanwhile (a malloc arena,
    // say) would be locked by neither call, and its pages could be swapped out to the very
    // device this process serves or restores (seen: a supervisor waiting in `do_swap_page` in
    // the VM test, while the log's writer thread still started before the lock). The second
    // call swaps the future flags under one lock, with no such window.
    // SAFETY: mlockall takes flags only and changes no Rust-visible state.
    let mut rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) };
    if rc == 0 {
        // SAFETY: as above. Without MCL_CURRENT this only sets the flags of future mappings
        // and leaves the ones just locked as they are.
        rc = unsafe { libc::mlockall(libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    }
    if rc == 0 {
        log_in_background();
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(Failure::new(format!(
        "{flag}: mlockall failed: {e}: run as root (or with CAP_IPC_LOCK), or raise the locked-memory limit (`ulimit -l`)"
    )))
}

/// From now on the process's log lines are written by a thread of their own
/// (compcache-log's `writer.rs`): a server's log file may be on tmpfs, its pages swapped out
/// to the server's own device, and no thread that serves may wait for it. Started once the
/// memory is locked ([`lock_memory`], [`pin_swap_server`]), not before: a thread that exists
/// during `mlockall(MCL_CURRENT)` has its malloc arena locked whole rather than on fault, and
/// a later thread that grows that arena then faults the growth in at once (seen in the VM
/// test: an nbd server's threads in `mprotect` -> `populate_vma_page_range`, in reclaim, until
/// the kernel's requests timed out). Idempotent.
pub fn log_in_background() {
    if let Err(e) = compcache_log::write_in_background() {
        log::warning(&format!("cannot start the log's writer thread ({e}): the threads that serve write the log themselves"));
    }
}

/// glibc's `malloc` serves every allocation of at least this size from a mapping of its own,
/// unmapped when it is freed, once a locked server fixes it ([`lock_memory`]).
///
/// Why: glibc starts at this value but raises the threshold each time such a mapping is freed
/// (up to 32 MiB), and from then on serves large allocations from the heap of the thread's
/// arena. Free pages of an arena heap are given back with `madvise(MADV_DONTNEED)`, which the
/// kernel refuses on locked memory, so under `mlockall` whatever a server once used for a large
/// temporary buffer would stay resident for its whole life: zstd's dictionary trainer's tables
/// (measured: 9.7 MiB kept after the first training, 7 MiB more after a retrain), or one large
/// client request. Setting the threshold turns the raising off; `munmap` frees locked pages
/// like any others. Measured with the same server: 2.8 MiB after the first training (the
/// dictionary and the encoder loaded with it, which stay in use), 0.2 MiB over three retrains
/// (docs/store.md, "Recompression"). The I/O paths do not feel it: their buffers are made once
/// and reused (an NBD worker keeps up to 1 MiB, the FUSE and ublk buffers are made at start).
const MALLOC_MMAP_THRESHOLD_BYTES: usize = 128 << 10;

fn fix_malloc_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt takes two integers and changes only the allocator's tuning; it is
        // called before the server's threads exist, and glibc takes its own lock for it.
        if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES as libc::c_int) } != 1 {
            log::warning("mallopt(M_MMAP_THRESHOLD) failed: memory the server frees may stay locked");
        }
    }
}

/// Keeps a swap server's memory resident and out of reclaim's I/O:
/// - [`lock_memory`] unless `mlock` is false (`--no-mlock`);
/// - `PR_SET_IO_FLUSHER` on this thread, inherited by every thread started afterwards: memory
///   reclaim entered by the server never waits for I/O, so it cannot wait on itself;
/// - `oom_score_adj = -1000`: the OOM killer never picks the server, whose death would take
///   every swapped-out page with it (zram's memory is the kernel's, which it cannot kill
///   either). nbd-client does the same with `-swap`.
pub fn pin_swap_server(mlock: bool) -> Result<(), Failure> {
    // Once per process (a standby pins itself before it is needed, then starts the session).
    static PINNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if PINNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    if mlock {
        lock_memory("swap server (without --no-mlock)")?;
    }
    const PR_SET_IO_FLUSHER: libc::c_int = 57;
    // SAFETY: prctl with integer arguments only; affects this thread's reclaim flags.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) } != 0 {
        log::warning(&format!("PR_SET_IO_FLUSHER: {} (needs CAP_SYS_RESOURCE)", io::Error::last_os_error()));
    }
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        log::warning(&format!("oom_score_adj: {e} (needs CAP_SYS_RESOURCE)"));
    }
    log_in_background();
    Ok(())
}

/// Stack size of every thread a pinned process starts: after [`lock_future_mappings`] their
/// stacks are populated and locked whole when created, so keep them small (lz4 needs 16 KiB of
/// stack).
pub const SERVER_THREAD_STACK_BYTES: usize = 512 << 10;

/// Sets the stack size of every later thread to [`SERVER_THREAD_STACK_BYTES`]
/// (`RUST_MIN_STACK`). std reads that variable once, at the first thread spawned without a
/// size of its own, and keeps the value: so before the first thread, which is the log's writer
/// ([`log_in_background`]). (Set later, as it once was, it was read too late: every thread of
/// a swap server had std's 2 MiB stack, populated and locked whole, 8 MiB of a FUSE server's
/// 20 MiB resident at start, and as much again in a standby's takeover.)
fn set_thread_stack_size() {
    std::env::set_var("RUST_MIN_STACK", SERVER_THREAD_STACK_BYTES.to_string());
}

/// The second half of pinning a swap server, once the store's big sparse mappings exist
/// (locked on fault): from now on every new mapping (thread stacks, heap growth) is populated
/// and locked when it is made, so the I/O threads never take a page fault on their stacks or
/// buffers, which under memory pressure would wait in reclaim for the swap-outs they are
/// serving.
pub fn lock_future_mappings(mlock: bool) {
    // Without --no-mlock, `lock_memory` has set it already, before the first thread.
    set_thread_stack_size();
    if mlock {
        // SAFETY: mlockall takes flags only. MCL_FUTURE without MCL_CURRENT leaves the existing
        // mappings (the store's reservations, locked on fault) as they are.
        if unsafe { libc::mlockall(libc::MCL_FUTURE) } != 0 {
            log::warning(&format!("mlockall(MCL_FUTURE): {}", io::Error::last_os_error()));
        }
    }
}
