//! The one log sink of compcache's servers (the `compcache` command and the front-end crates
//! it runs: ublk, kernel-nbd, FUSE).
//!
//! Format: one line per event on stderr, `<who>: <level word><message>`, as the command always
//! printed them (`compcache: error: ...`, `compcache: warning: ...`, `compcache-ublk: ...`).
//! When stderr is the systemd journal's stream (`$JOURNAL_STREAM` names stderr's device and
//! inode, as systemd sets it for a service), each line starts with its syslog priority
//! (`<3>`, `<4>`, ...), which journald takes as the entry's priority and strips; on a
//! terminal or in a file the line is unchanged.
//!
//! Lines a client can cause (a rejected request, a failing store write) go through a
//! [`RateLimit`], so that a hostile or broken client cannot flood the log: at most a burst of
//! lines per interval, the rest counted and reported with the next line let through, after
//! the kernel's `printk_ratelimit` (`lib/ratelimit.c`). [`Rejects`] is the one policy for
//! requests a front end refuses.
//!
//! Writing never panics: a closed stderr (a supervisor gone) is ignored, where `eprintln!`
//! would panic and take the thread that logs with it. A server has its lines written by a
//! thread of their own ([`write_in_background`], `writer.rs`), so that no thread it serves
//! with ever waits for its log file: that file's pages may be swapped out to the server's own
//! device.

mod writer;

pub use writer::{flush, write_in_background, EXIT_FLUSH, QUEUE_BYTES};

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How bad an event is: the syslog priorities journald understands (`sd-daemon.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something failed: a request, a thread, a step of the start or of the shutdown.
    Error = 3,
    /// Something is wrong or risky but the server goes on (a setting that limits nothing, a
    /// capability it lacks).
    Warning = 4,
    /// What the server does: up, stopping, final statistics.
    Info = 6,
}

impl Level {
    /// The word after the prefix: as the command's lines always read.
    fn word(self) -> &'static str {
        match self {
            Level::Error => "error: ",
            Level::Warning => "warning: ",
            Level::Info => "",
        }
    }
}

/// Writes one line: `who: <level word>msg`. Never panics.
pub fn log(level: Level, who: &str, msg: &str) {
    write_line(format_line(level, who, msg, journal_stream()));
}

/// Writes one line at `level` in the caller's own words, `who: text`, without the level
/// word: for the few lines whose wording is fixed (`WARNING:` in capitals for a server open to
/// everyone).
pub fn log_verbatim(level: Level, who: &str, text: &str) {
    let priority = if journal_stream() { format!("<{}>", level as u8) } else { String::new() };
    write_line(format!("{priority}{who}: {text}\n"));
}

fn write_line(line: String) {
    writer::write(line.as_bytes());
}

/// `log(Level::Error, ...)`.
pub fn error(who: &str, msg: &str) {
    log(Level::Error, who, msg)
}

/// `log(Level::Warning, ...)`.
pub fn warning(who: &str, msg: &str) {
    log(Level::Warning, who, msg)
}

/// `log(Level::Info, ...)`.
pub fn info(who: &str, msg: &str) {
    log(Level::Info, who, msg)
}

fn format_line(level: Level, who: &str, msg: &str, journal: bool) -> String {
    let priority = if journal { format!("<{}>", level as u8) } else { String::new() };
    format!("{priority}{who}: {}{msg}\n", level.word())
}

/// Whether stderr is the journal's stream: `$JOURNAL_STREAM` is `<device>:<inode>` of it
/// (systemd.exec(5)). Read once.
fn journal_stream() -> bool {
    static JOURNAL: OnceLock<bool> = OnceLock::new();
    *JOURNAL.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let Some(wanted) = std::env::var_os("JOURNAL_STREAM") else { return false };
        // stat(2) of /proc/self/fd/2 describes what descriptor 2 is open on (a socket too).
        std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| wanted.to_str() == Some(&format!("{}:{}", m.dev(), m.ino())))
    })
}

/// At most `burst` lines per `interval` from one source (a call site, a queue, a device);
/// past that, lines are only counted, and the first line let through in a later interval
/// says how many were left out. Never blocks: a thread that finds another one deciding counts
/// its line as left out (under a flood that is what would happen to it anyway).
pub struct RateLimit {
    interval: Duration,
    burst: u32,
    window: Mutex<Window>,
    /// Lines left out since the last one let through. Relaxed: a count for a log line only.
    missed: AtomicU64,
}

struct Window {
    start: Option<Instant>,
    printed: u32,
}

impl RateLimit {
    pub const fn new(interval: Duration, burst: u32) -> RateLimit {
        RateLimit { interval, burst, window: Mutex::new(Window { start: None, printed: 0 }), missed: AtomicU64::new(0) }
    }

    /// Logs `msg()` at `level` as `who` if the limit lets it through; `msg` is only called
    /// (and the line only formatted) then.
    pub fn log(&self, level: Level, who: &str, msg: impl FnOnce() -> String) {
        if let Some(missed) = self.admit(Instant::now()) {
            let msg = msg();
            if missed > 0 {
                log(level, who, &format!("{msg} ({missed} more such lines left out before this one)"));
            } else {
                log(level, who, &msg);
            }
        }
    }

    /// Whether a line at `now` may be written: `Some(lines left out before it)`, or `None`
    /// (counted as left out).
    fn admit(&self, now: Instant) -> Option<u64> {
        let mut w = match self.window.try_lock() {
            Ok(w) => w,
            // A thread that panicked while deciding left the window as consistent as any.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.missed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        if w.start.is_none_or(|s| now.saturating_duration_since(s) >= self.interval) {
            *w = Window { start: Some(now), printed: 0 };
        }
        if w.printed < self.burst {
            w.printed += 1;
            Some(self.missed.swap(0, Ordering::Relaxed))
        } else {
            self.missed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Lines per [`REJECT_INTERVAL`] that [`Rejects`] lets through (the NBD front end logs the
/// first 8 rejects of a connection too).
pub const REJECT_BURST: u32 = 8;
/// The interval of [`Rejects`]' limit.
pub const REJECT_INTERVAL: Duration = Duration::from_secs(60);

/// The policy for requests a front end refuses (malformed, out of range, unsupported) and
/// for store errors it returns: the caller counts each refusal in the store's `invalid_io`
/// (`Store::note_invalid_io`, as zram counts invalid I/O; a store error is counted by the
/// store itself), replies with the errno, and reports it here, where at most
/// [`REJECT_BURST`] lines per [`REJECT_INTERVAL`] are written, the rest counted in the next
/// line. One `Rejects` per source (a device, a connection): a flood from one does not hide
/// the others.
pub struct Rejects {
    who: Cow<'static, str>,
    refused: RateLimit,
    failed: RateLimit,
}

impl Rejects {
    pub const fn new(who: &'static str) -> Rejects {
        Rejects {
            who: Cow::Borrowed(who),
            refused: RateLimit::new(REJECT_INTERVAL, REJECT_BURST),
            failed: RateLimit::new(REJECT_INTERVAL, REJECT_BURST),
        }
    }

    /// The same for a source named at run time (an NBD connection: `compcache-nbd: <peer>`).
    pub fn named(who: String) -> Rejects {
        Rejects { who: Cow::Owned(who), ..Rejects::new("") }
    }

    /// A request refused before it reached the store (already counted in `invalid_io`).
    pub fn refused(&self, reason: impl FnOnce() -> String) {
        self.refused.log(Level::Warning, &self.who, || format!("rejected request: {} (counted in invalid_io)", reason()));
    }

    /// A request the store failed (counted by the store in `failed_reads`/`failed_writes`).
    pub fn failed(&self, what: impl FnOnce() -> String) {
        self.failed.log(Level::Error, &self.who, what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_as_they_always_did_and_carry_a_priority_for_the_journal() {
        assert_eq!(format_line(Level::Error, "compcache", "--size: bad", false), "compcache: error: --size: bad\n");
        assert_eq!(format_line(Level::Warning, "compcache", "x", false), "compcache: warning: x\n");
        assert_eq!(format_line(Level::Info, "compcache-ublk", "up", false), "compcache-ublk: up\n");
        assert_eq!(format_line(Level::Error, "compcache", "x", true), "<3>compcache: error: x\n");
        assert_eq!(format_line(Level::Info, "compcache", "x", true), "<6>compcache: x\n");
    }

    #[test]
    fn a_burst_per_interval_then_a_count_of_what_was_left_out() {
        let limit = RateLimit::new(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        let got: Vec<Option<u64>> = (0..10).map(|i| limit.admit(t0 + Duration::from_millis(i))).collect();
        assert_eq!(got, [Some(0), Some(0), Some(0), None, None, None, None, None, None, None]);
        // The next interval lets a burst through again, the first line with the count.
        assert_eq!(limit.admit(t0 + Duration::from_secs(61)), Some(7));
        assert_eq!(limit.admit(t0 + Duration::from_secs(62)), Some(0));
    }

    #[test]
    fn a_flood_from_many_threads_writes_at_most_the_burst() {
        let limit = RateLimit::new(Duration::from_secs(3600), REJECT_BURST);
        let t0 = Instant::now();
        let (admitted, reported) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        if let Some(missed) = limit.admit(t0) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            reported.fetch_add(missed, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(admitted <= REJECT_BURST as u64, "{admitted} lines");
        let counted = admitted + reported.load(Ordering::Relaxed) + limit.missed.load(Ordering::Relaxed);
        assert_eq!(counted, 40_000, "every line is written, or counted in a line or in the limit");
    }
}
