//! Where the lines go: to stderr, written by the thread that logs (the default, for commands
//! that print and exit), or, once a server calls [`write_in_background`], queued in memory
//! and written by one writer thread of the process's own.
//!
//! Why a server needs the writer thread: its stderr is usually a file on tmpfs
//! (`/run/compcache/...`, or the guest's `/run` in the VM test), and the kernel swaps tmpfs
//! pages out like any process memory, possibly to the server's own device. A thread appending
//! a line to such a file waits in `write(2)` for that page to be swapped in, through the
//! server. If the waiting thread is one the server needs to serve that swap-in (a queue
//! thread, a thread holding a lock one needs, the supervisor about to start a successor), the
//! device never answers again and every process with a page on it hangs (seen in the VM test:
//! docs/swap.md, "Memory pressure: why the server cannot deadlock", item 5). With the writer
//! thread, the thread that logs only appends to the queue and goes on; the writer is the one
//! thread that waits, and nothing waits for it.
//!
//! Invariants: the queue holds at most [`QUEUE_BYTES`] bytes of lines; a line that does not
//! fit is dropped and counted, and the count is written after the lines queued before it. The
//! queue's lock is held only to push or take lines, never across a `write(2)`, and nothing
//! under it allocates: the queue and the writer's buffer are two buffers of [`QUEUE_BYTES`],
//! allocated and made resident when the writer starts and swapped, never grown or freed. (A
//! queue that grew as lines came was an allocation under the lock: in the VM test's
//! `global-kill` a ublk successor's queue thread logging a failed write sat in a page fault
//! in direct reclaim there, and the other queue thread waited for the lock, so the device
//! stopped serving.) Lines keep the order they were logged in. The writer thread has every signal blocked (a stop signal meant
//! for the server must never be delivered to it).
//!
//! At exit (`exit(3)`, so also a return from `main` and `std::process::exit`) an `atexit`
//! handler waits up to [`EXIT_FLUSH`] for the queue to be written. A process killed by a
//! signal loses what was still queued.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The most bytes of lines waiting for the writer thread: far more than a server logs between
/// two writes (some 1,700 lines), while a writer blocked for good holds at most this much
/// memory. The process keeps two buffers of it resident (module text).
pub const QUEUE_BYTES: usize = 256 << 10;

/// How long the exit waits for the queued lines to be written.
pub const EXIT_FLUSH: Duration = Duration::from_secs(2);

struct Queue {
    /// Whole lines, in order, not yet taken by the writer.
    bytes: Vec<u8>,
    /// Lines dropped because the queue was full, not yet reported.
    dropped: u64,
    /// The writer has taken lines and not finished writing them.
    writing: bool,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue { bytes: Vec::new(), dropped: 0, writing: false });
/// Signalled when lines are queued (for the writer) and when a write is done (for a flush).
static CHANGED: Condvar = Condvar::new();
/// Set once the writer thread runs; from then on every line goes through the queue.
static BACKGROUND: AtomicBool = AtomicBool::new(false);

fn queue() -> MutexGuard<'static, Queue> {
    // A thread that panicked while holding the lock left whole lines (pushes and takes are
    // single calls): the queue is still valid.
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `line` (one or more whole lines): to the queue once the writer runs, to stderr
/// directly before. Never blocks on stderr in the first case, never panics.
pub(crate) fn write(line: &[u8]) {
    if !BACKGROUND.load(Ordering::Acquire) {
        write_stderr(line);
        return;
    }
    let mut q = queue();
    // The capacity, not QUEUE_BYTES: pushing within it never reallocates (module text).
    if q.bytes.len() + line.len() > q.bytes.capacity() {
        q.dropped += 1;
    } else {
        q.bytes.extend_from_slice(line);
    }
    drop(q);
    CHANGED.notify_all();
}

/// One write of whole lines, so that the lines of two processes appending to the same file
/// (a supervisor and its server) do not interleave. A closed stderr is ignored.
fn write_stderr(bytes: &[u8]) {
    let _ = std::io::stderr().lock().write_all(bytes);
}

/// From now on, lines are written by a writer thread (see the module's text); call it in a
/// server before anything is logged that the I/O path could wait on. Idempotent. If the thread
/// cannot be started, lines go on being written by the threads that log, and the error is
/// returned for the caller to report.
pub fn write_in_background() -> std::io::Result<()> {
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return Ok(());
    }
    // The queue's buffer, and (in the writer) the one it is swapped with, allocated now and
    // made resident (under a server's mlockall, locked): from here on logging allocates
    // nothing under the lock.
    queue().bytes = resident_buffer();
    spawn_with_signals_blocked()?;
    // SAFETY: `flush_at_exit` is an `extern "C" fn()` that never unwinds (it catches nothing
    // because nothing in it panics: lock poisoning is handled, waits are bounded) and only
    // touches statics, which live until the process ends.
    if unsafe { libc::atexit(flush_at_exit) } != 0 {
        // Without the handler a clean exit may lose its last lines; say so, synchronously.
        write_stderr(b"compcache-log: warning: atexit failed: the last lines before an exit may be lost\n");
    }
    BACKGROUND.store(true, Ordering::Release);
    *started = true;
    Ok(())
}

/// Starts the writer thread with every signal blocked: the calling thread's mask is set to
/// all signals around the spawn (a new thread inherits its creator's mask), then restored.
fn spawn_with_signals_blocked() -> std::io::Result<()> {
    // SAFETY: `all` and `old` are plain C signal sets, initialised by sigfillset and by
    // pthread_sigmask before they are read. Changing this thread's mask changes no Rust state.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        old
    };
    let spawned = std::thread::Builder::new().name("log-writer".into()).spawn(writer);
    // SAFETY: as above; `old` is the mask pthread_sigmask returned.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned.map(drop)
}

/// An empty buffer of [`QUEUE_BYTES`] capacity whose pages are resident.
fn resident_buffer() -> Vec<u8> {
    let mut b = vec![0u8; QUEUE_BYTES];
    // Written, not only allocated: a zeroed allocation may be untouched fresh pages.
    for page in b.chunks_mut(4096) {
        // SAFETY: a volatile write of one byte inside the buffer, so that it is not elided.
        unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 0) };
    }
    b.clear();
    b
}

/// The writer thread: takes every queued line at once (its empty buffer swapped in for the
/// queue's) and writes them in one call.
fn writer() {
    let mut bytes = resident_buffer();
    loop {
        let dropped = {
            let mut q = queue();
            while q.bytes.is_empty() && q.dropped == 0 {
                q = CHANGED.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            q.writing = true;
            std::mem::swap(&mut q.bytes, &mut bytes);
            std::mem::take(&mut q.dropped)
        };
        write_stderr(&bytes);
        bytes.clear();
        if dropped > 0 {
            write_stderr(dropped_line(dropped).as_bytes());
        }
        queue().writing = false;
        CHANGED.notify_all();
    }
}

fn dropped_line(dropped: u64) -> String {
    format!(
        "compcache-log: warning: {dropped} line(s) dropped here: {QUEUE_BYTES} bytes of lines were waiting for a write to stderr that did not finish\n"
    )
}

/// Waits until every line queued so far is written, at most `timeout`; whether it was.
/// Immediate when lines are written by the threads that log.
pub fn flush(timeout: Duration) -> bool {
    if !BACKGROUND.load(Ordering::Acquire) {
        return true;
    }
    let deadline = Instant::now() + timeout;
    let mut q = queue();
    while !q.bytes.is_empty() || q.dropped > 0 || q.writing {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
        q = CHANGED.wait_timeout(q, left).unwrap_or_else(|e| e.into_inner()).0;
    }
    true
}

extern "C" fn flush_at_exit() {
    flush(EXIT_FLUSH);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_two_buffers_made_at_the_start_never_grown() {
        write_in_background().unwrap();
        let buffers = || {
            let q = queue();
            (q.bytes.as_ptr() as usize, q.bytes.capacity())
        };
        let mut seen = std::collections::BTreeSet::new();
        // (A queue past its buffer drops lines rather than grow: tests/background.rs.)
        for round in 0..20 {
            for i in 0..3 {
                write(format!("writer test: round {round} line {i:>40}\n").as_bytes());
                let (ptr, cap) = buffers();
                assert_eq!(cap, QUEUE_BYTES, "the queue's buffer was reallocated");
                seen.insert(ptr);
            }
            assert!(flush(Duration::from_secs(10)));
        }
        assert!(seen.len() <= 2, "the queue used {} buffers, not the two made at the start", seen.len());
    }

    #[test]
    fn the_dropped_line_names_the_count_and_the_cause() {
        let l = dropped_line(3);
        assert!(l.starts_with("compcache-log: warning: 3 line(s) dropped"), "{l}");
        assert!(l.ends_with('\n'));
    }
}
