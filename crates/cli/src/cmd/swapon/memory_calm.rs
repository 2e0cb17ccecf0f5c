//! Whether the machine's memory is short now: the supervisor starts a standby only when it is
//! not (docs/swap.md, "A standby, started in advance").
//!
//! A standby locks its memory, makes its I/O buffers and sets memory aside as it starts: while
//! the whole machine is out of memory those are allocations that wait in direct reclaim, and
//! what reclaim waits for is the device the standby is meant to save, whose server (just taken
//! over, its reserve refilling) allocates at the same moment. In the VM test's `global-kill`
//! step a standby started just after a takeover was still making its buffers when the next
//! SIGKILL came, and that takeover then waited in `mlock`.
//!
//! The sign used is the kernel's count of direct reclaim (`allocstall_*` in /proc/vmstat): it
//! grows only when an allocation anywhere on the machine had to reclaim memory itself, that is
//! when free memory fell below the zones' min watermarks. A memory cgroup at its own limit does
//! not count there (its reclaim is the cgroup's, not the machine's), so a standby is not held
//! back by a workload confined to a cgroup; the machine's free memory is what a standby takes
//! from. Unlike pressure stall information it is there on every kernel (Debian's kernels leave
//! PSI off unless `psi=1` is on their command line).
//!
//! No lock: one value owned by the supervisor's thread.

use std::time::{Duration, Instant};

/// The shortest time between two looks that answers: over less, a machine out of memory may
/// not have reclaimed yet.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);

/// Watches the machine's direct-reclaim count between two looks.
#[derive(Debug)]
pub(crate) struct MemoryCalm {
    last: Option<u64>,
    at: Instant,
    /// When watching started (for the log).
    pub(crate) since: Instant,
    /// The first answer was "short" (for the log).
    pub(crate) was_short: bool,
}

impl MemoryCalm {
    /// Takes a first look; [`MemoryCalm::calm`] answers from the next one.
    pub(crate) fn watch() -> MemoryCalm {
        let now = Instant::now();
        MemoryCalm { last: read_allocstall(), at: now, since: now, was_short: false }
    }

    /// Whether no allocation on the machine has had to reclaim memory itself since the last
    /// look, at least [`WINDOW`] ago (this look becomes the last); `None` while the window has
    /// not passed. Without /proc/vmstat (or its counters), always calm: the standby is then
    /// started as it was before this check existed.
    pub(crate) fn calm(&mut self) -> Option<bool> {
        if self.at.elapsed() < WINDOW {
            return None;
        }
        let now = read_allocstall();
        let before = std::mem::replace(&mut self.last, now);
        self.at = Instant::now();
        let calm = MemoryCalm::from_looks(before, now);
        self.was_short |= !calm;
        Some(calm)
    }

    /// The answer from two looks at the count, the last look's and this one's.
    fn from_looks(before: Option<u64>, now: Option<u64>) -> bool {
        match (before, now) {
            (Some(b), Some(n)) => n == b,
            (_, None) => true,
            // The first readable look: a baseline, the answer at the next.
            (None, Some(_)) => false,
        }
    }
}

fn read_allocstall() -> Option<u64> {
    allocstall(&std::fs::read_to_string("/proc/vmstat").ok()?)
}

/// The sum of /proc/vmstat's `allocstall_<zone>` counters (one per zone since 4.8; a single
/// `allocstall` before), or `None` when the text has none.
pub(crate) fn allocstall(vmstat: &str) -> Option<u64> {
    let mut sum = None;
    for line in vmstat.lines() {
        let mut words = line.split_ascii_whitespace();
        let (Some(key), Some(value)) = (words.next(), words.next()) else { continue };
        if key == "allocstall" || key.starts_with("allocstall_") {
            if let Ok(v) = value.parse::<u64>() {
                sum = Some(sum.unwrap_or(0u64).wrapping_add(v));
            }
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zones_counts_are_summed_and_nothing_else() {
        let text = "nr_free_pages 1000\nallocstall_dma 1\nallocstall_dma32 20\nallocstall_normal 300\n\
                    allocstall_movable 4000\nallocstall_device 0\npgscan_direct 99999\ncompact_stall 7\n";
        assert_eq!(allocstall(text), Some(4321));
        assert_eq!(allocstall("allocstall 12\npswpin 5\n"), Some(12), "the single counter of kernels before 4.8");
        assert_eq!(allocstall("nr_free_pages 1000\n"), None);
        assert_eq!(allocstall("allocstall_normal x\n"), None, "an unreadable value is no count");
    }

    #[test]
    fn calm_only_when_the_count_did_not_move_since_the_last_look() {
        assert!(MemoryCalm::from_looks(Some(7), Some(7)));
        assert!(!MemoryCalm::from_looks(Some(7), Some(8)), "direct reclaim since the last look");
        assert!(!MemoryCalm::from_looks(None, Some(8)), "the first readable look is a baseline");
        assert!(MemoryCalm::from_looks(Some(7), None), "without the counters: calm");
        assert!(MemoryCalm::from_looks(None, None));
        // This machine's own counter, through the real reader: a look after a look answers.
        let mut c = MemoryCalm::watch();
        assert_eq!(c.calm(), None, "no answer before the window");
        std::thread::sleep(WINDOW);
        let before = c.last;
        let answer = c.calm().expect("an answer after the window");
        assert_eq!(answer, MemoryCalm::from_looks(before, c.last));
        assert!(c.last.is_some(), "this kernel has the counters");
        assert_eq!(c.was_short, !answer);
    }
}
