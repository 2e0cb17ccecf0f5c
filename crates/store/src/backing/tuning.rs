//! Writeback's tunables on a running device (`Store::tune_writeback`, `compcache set`): the
//! watermarks, the rate, and the writeback limit, which is a budget that can be re-armed as
//! zram's `writeback_limit` is (its users re-arm it daily from a timer).
//!
//! Where each lives and who reads it:
//! - The watermarks are one atomic word (`high << 8 | low`), so that a reader never pairs the
//!   high watermark of one change with the low one of another. Writeback reads them under
//!   `Backing::maint`; promotion reads the low one on the read path, where no lock is taken.
//! - The rate is an atomic read once per `maintain` step.
//! - The limit is under `Backing::maint` ([`Limit`] in `Maint`): every writeback takes that
//!   lock and computes what is left of the limit under it, so a re-arm and a writeback never
//!   interleave.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU16, AtomicU64};

use serde::{Deserialize, Serialize};

use super::Backing;
use crate::config::{check_watermarks, BackingConfig};

/// Changes to writeback's tunables; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WritebackTuning {
    /// Start writeback when pool memory passes this percent of the memory limit...
    pub high_pct: Option<u8>,
    /// ...and stop under this percent.
    pub low_pct: Option<u8>,
    /// Bytes per second the background writer may write; 0: no limit.
    pub rate_bytes: Option<u64>,
    /// Re-arms the writeback limit: writeback may write this many more bytes from now on;
    /// 0: no limit.
    pub limit_bytes: Option<u64>,
}

/// Writeback's tunables as they are now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WritebackSettings {
    pub high_pct: u8,
    pub low_pct: u8,
    pub rate_bytes: u64,
    /// The limit as last armed; 0: none.
    pub limit_bytes: u64,
    /// What writeback may still write under it (`None` without a limit).
    pub limit_left_bytes: Option<u64>,
}

/// The tunables read without a lock.
pub(crate) struct Tunables {
    /// `high_pct << 8 | low_pct`.
    watermarks: AtomicU16,
    rate_bytes: AtomicU64,
}

/// The writeback limit, under `Backing::maint`: `bytes` may be written after the
/// `writeback_bytes` counter stood at `base` (0 bytes: no limit).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limit {
    pub bytes: u64,
    pub base: u64,
}

impl Limit {
    /// What writeback may still write, given the `writeback_bytes` counter now.
    pub fn left(&self, written: u64) -> u64 {
        match self.bytes {
            0 => u64::MAX,
            n => n.saturating_sub(written.saturating_sub(self.base)),
        }
    }
}

fn pack(high: u8, low: u8) -> u16 {
    u16::from(high) << 8 | u16::from(low)
}

impl Tunables {
    pub fn new(cfg: &BackingConfig) -> Tunables {
        Tunables { watermarks: AtomicU16::new(pack(cfg.high_pct, cfg.low_pct)), rate_bytes: AtomicU64::new(cfg.writeback_rate_bytes) }
    }

    /// (high, low) percent of the memory limit.
    pub fn watermarks(&self) -> (u8, u8) {
        let w = self.watermarks.load(Relaxed);
        ((w >> 8) as u8, w as u8)
    }

    pub fn rate_bytes(&self) -> u64 {
        self.rate_bytes.load(Relaxed)
    }
}

/// `Store::tune_writeback`: applies `t` (checked whole first: a refused change changes
/// nothing) and returns the settings after it.
pub(crate) fn tune(b: &Backing, t: &WritebackTuning) -> Result<WritebackSettings, String> {
    let mut m = b.maint.lock();
    let (high, low) = b.tune.watermarks();
    let (high, low) = (t.high_pct.unwrap_or(high), t.low_pct.unwrap_or(low));
    check_watermarks(high, low)?;
    b.tune.watermarks.store(pack(high, low), Relaxed);
    if let Some(r) = t.rate_bytes {
        b.tune.rate_bytes.store(r, Relaxed);
    }
    if let Some(bytes) = t.limit_bytes {
        m.limit = Limit { bytes, base: b.ctr.writeback_bytes.load(Relaxed) };
    }
    Ok(settings_locked(b, &m.limit))
}

/// `Store::writeback_settings`.
pub(crate) fn settings(b: &Backing) -> WritebackSettings {
    let m = b.maint.lock();
    settings_locked(b, &m.limit)
}

fn settings_locked(b: &Backing, limit: &Limit) -> WritebackSettings {
    let (high_pct, low_pct) = b.tune.watermarks();
    WritebackSettings {
        high_pct,
        low_pct,
        rate_bytes: b.tune.rate_bytes(),
        limit_bytes: limit.bytes,
        limit_left_bytes: (limit.bytes != 0).then(|| limit.left(b.ctr.writeback_bytes.load(Relaxed))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_counts_from_when_it_was_armed() {
        let l = Limit { bytes: 100, base: 1000 };
        assert_eq!((l.left(1000), l.left(1040), l.left(1100), l.left(5000)), (100, 60, 0, 0));
        assert_eq!(Limit::default().left(1 << 40), u64::MAX, "0: no limit");
    }

    #[test]
    fn watermarks_pack_and_are_checked() {
        let t = Tunables::new(&BackingConfig { high_pct: 90, low_pct: 70, ..BackingConfig::new("/x") });
        assert_eq!(t.watermarks(), (90, 70));
        assert!(check_watermarks(100, 0).is_ok());
        for (h, l) in [(0, 0), (50, 50), (40, 60), (101, 10)] {
            assert!(check_watermarks(h, l).is_err(), "{h} {l}");
        }
    }
}
