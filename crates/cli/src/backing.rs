//! The backing device, as every server takes it: the flags (`compcache serve`, `compcache
//! ublk`, `compcache nbd-attach`, and `compcache swapon`, which passes them on to the server it
//! starts), their translation into the store's [`BackingConfig`], and the writeback thread.
//!
//! The tier itself (overflow, writeback, GC) is the store's (`crates/store/src/backing/`,
//! docs/backing.md); a front end only configures it and calls [`Store::maintain`] periodically.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use compcache_store::config::{DEFAULT_COLD_IDLE_SECS, DEFAULT_COLD_LEVEL, DEFAULT_WRITEBACK_HIGH_PCT, DEFAULT_WRITEBACK_LOW_PCT};
use compcache_store::{parse_size, BackingConfig, Medium, Store};

use crate::failure::Failure;
use crate::log;
use crate::units::{idle_age, size_or_none};

/// The backing-device flags.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct BackingArgs {
    /// Backing device: a block device or a regular file (created sparse if absent). Writes
    /// beyond --mem-limit go there instead of failing, and cold pages are written back to it
    /// (compressed, packed, encrypted with a key of this run). See docs/backing.md.
    #[arg(long, value_name = "PATH", help_heading = "Backing device")]
    pub backing: Option<PathBuf>,

    /// Bytes of the backing device to use (SIZE, docs/cli.md "Sizes and durations"; 0: the
    /// default) [default: a block device's size, an existing file's size, or --size for a new
    /// file].
    #[arg(long, value_name = "SIZE", help_heading = "Backing device")]
    pub backing_size: Option<String>,

    /// Write back cold pages when compressed memory passes this percent of --mem-limit...
    /// [default: 90]
    #[arg(long, value_name = "PCT", help_heading = "Backing device")]
    pub writeback_high: Option<u8>,

    /// ...until it is under this percent [default: 75].
    #[arg(long, value_name = "PCT", help_heading = "Backing device")]
    pub writeback_low: Option<u8>,

    /// Most bytes writeback may write in total (zram's writeback_limit; SIZE, 0 or none: no
    /// limit) [default: no limit].
    #[arg(long, value_name = "SIZE", help_heading = "Backing device")]
    pub writeback_limit: Option<String>,

    /// Most bytes per second writeback may write (SIZE/s, 0 or none: no limit) [default: no
    /// limit].
    #[arg(long, value_name = "SIZE/s", help_heading = "Backing device")]
    pub writeback_rate: Option<String>,

    /// Store pages that do not compress on the backing device at once.
    #[arg(long, help_heading = "Backing device")]
    pub backing_incompressible: bool,

    /// Do not encrypt what goes to the backing device (records are then only checksummed).
    /// For a device already encrypted with a throwaway key (dm-crypt with a random key, as
    /// swap partitions are set up), where a second encryption protects nothing more, and to
    /// measure what encryption costs. See docs/backing.md, "Encryption".
    #[arg(long, help_heading = "Backing device")]
    pub backing_plaintext: bool,

    /// A cold tier in RAM instead of a backing device: pages idle for --cold-idle (and, with
    /// --mem-limit, the coldest when memory passes --writeback-high) move to a log of up to
    /// SIZE of raw pages that is kept compressed 64 KiB at a time with zstd (--cold-level),
    /// so cold pages cost what multi-page units cost; a read of one costs tens of
    /// microseconds. Its memory counts in mem_used_total. See docs/backing.md, "The cold tier".
    #[arg(long, value_name = "SIZE", conflicts_with = "backing", help_heading = "Backing device")]
    pub cold_tier: Option<String>,

    /// How long a page stays unused before it moves to the cold tier: a DURATION in whole
    /// seconds (600, 10m, 2h; docs/cli.md "Sizes and durations"), at most 18h12m15s; 0: only
    /// when memory passes --writeback-high [default: 10m].
    #[arg(long, value_name = "DURATION", value_parser = idle_age, help_heading = "Backing device")]
    pub cold_idle: Option<u64>,

    /// The cold tier's zstd level (1-22) [default: 19].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=22), help_heading = "Backing device")]
    pub cold_level: Option<i32>,

    /// Take over an existing --backing file that has no compcache signature, or that other
    /// users could read (it is set to mode 0600 and this user). Without it such a file is
    /// refused and left untouched. See docs/backing.md, "What compcache refuses".
    #[arg(long, help_heading = "Backing device")]
    pub force: bool,
}

impl BackingArgs {
    /// The store's backing configuration, `None` without `--backing`. `mem_limit` is the
    /// device's memory limit in bytes (0: none), `ram` physical RAM for `%` sizes.
    pub fn config(&self, ram: u64, mem_limit: u64) -> Result<Option<BackingConfig>, Failure> {
        let size =
            |flag: &str, text: &Option<String>, zero_means: &str| text.as_deref().map_or(Ok(0), |t| size_or_none(flag, t, ram, zero_means));
        let cold_flags = self.cold_idle.is_some() || self.cold_level.is_some();
        let high_pct = self.writeback_high.unwrap_or(DEFAULT_WRITEBACK_HIGH_PCT);
        let low_pct = self.writeback_low.unwrap_or(DEFAULT_WRITEBACK_LOW_PCT);
        if let Some(text) = &self.cold_tier {
            if self.backing.is_some() {
                return Err(Failure::usage("--cold-tier and --backing both name where cold pages go: give one"));
            }
            if self.backing_size.is_some() || self.backing_incompressible || self.backing_plaintext || self.force {
                return Err(Failure::usage(
                    "--backing-size, --backing-incompressible, --backing-plaintext and --force are for --backing PATH, not --cold-tier",
                ));
            }
            let segment = compcache_store::config::DEFAULT_SEGMENT_BYTES;
            let bytes = parse_size(text, ram).map_err(|e| Failure::usage(format!("--cold-tier: {e}")))?;
            if bytes < 4 * segment {
                return Err(Failure::usage(format!("--cold-tier {text}: the cold tier needs at least {} MiB", (4 * segment) >> 20)));
            }
            let cfg = BackingConfig {
                high_pct,
                low_pct,
                writeback_limit_bytes: size("--writeback-limit", &self.writeback_limit, "no limit")?,
                writeback_rate_bytes: size("--writeback-rate", &self.writeback_rate, "no limit")?,
                medium: Medium::Memory { level: self.cold_level.unwrap_or(DEFAULT_COLD_LEVEL) },
                idle_secs: self.cold_idle.unwrap_or(DEFAULT_COLD_IDLE_SECS),
                // Whole segments (what the tier uses of it anyway).
                ..BackingConfig::in_memory(bytes / segment * segment)
            };
            return Ok(Some(cfg));
        }
        if cold_flags {
            return Err(Failure::usage("--cold-idle and --cold-level need --cold-tier SIZE"));
        }
        let Some(path) = &self.backing else {
            if self.backing_size.is_some()
                || self.writeback_high.is_some()
                || self.writeback_low.is_some()
                || self.writeback_limit.is_some()
                || self.writeback_rate.is_some()
                || self.backing_incompressible
                || self.backing_plaintext
                || self.force
            {
                return Err(Failure::usage(
                    "--backing-size, --writeback-*, --backing-incompressible, --backing-plaintext and --force need --backing PATH",
                ));
            }
            return Ok(None);
        };
        let cfg = BackingConfig {
            size_bytes: size("--backing-size", &self.backing_size, "the default size (the device's, or --size for a new file)")?,
            high_pct,
            low_pct,
            writeback_limit_bytes: size("--writeback-limit", &self.writeback_limit, "no limit")?,
            writeback_rate_bytes: size("--writeback-rate", &self.writeback_rate, "no limit")?,
            incompressible: self.backing_incompressible,
            encrypt: !self.backing_plaintext,
            force: self.force,
            ..BackingConfig::new(path)
        };
        // After the checks: a refused start is one line.
        if mem_limit == 0 && !self.backing_incompressible {
            log::warning("--backing without --mem-limit: only incompressible pages (with --backing-incompressible) go to it");
        }
        Ok(Some(cfg))
    }

    /// The same flags as arguments for a server command line (`swapon` starting `compcache
    /// ublk` or `compcache nbd-attach`): nothing without `--backing`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = match (&self.backing, &self.cold_tier) {
            (Some(path), _) => vec!["--backing".into(), path.into()],
            (None, Some(size)) => vec!["--cold-tier".into(), size.into()],
            (None, None) => return Vec::new(),
        };
        for (flag, value) in [
            ("--cold-idle", self.cold_idle.map(|n| n.to_string())),
            ("--cold-level", self.cold_level.map(|n| n.to_string())),
            ("--writeback-high", self.writeback_high.map(|n| n.to_string())),
            ("--writeback-low", self.writeback_low.map(|n| n.to_string())),
        ] {
            if let Some(text) = value {
                v.extend([flag.into(), text.into()]);
            }
        }
        for (flag, value) in [
            ("--backing-size", &self.backing_size),
            ("--writeback-limit", &self.writeback_limit),
            ("--writeback-rate", &self.writeback_rate),
        ] {
            if let Some(text) = value {
                v.extend([flag.into(), text.into()]);
            }
        }
        if self.backing_incompressible {
            v.push("--backing-incompressible".into());
        }
        if self.backing_plaintext {
            v.push("--backing-plaintext".into());
        }
        if self.force {
            v.push("--force".into());
        }
        v
    }
}

/// Held from the store's creation until a server has started: if the start is refused
/// (a socket cannot be bound, a thread cannot start, the kernel refuses the device), its drop
/// gives the backing device up ([`Store::abandon_backing`]: emptied, and the file removed if
/// this start created it), as docs/cli.md promises ("a refused start leaves nothing behind").
pub struct StartGuard(Option<Arc<Store>>);

impl StartGuard {
    pub fn new(store: &Arc<Store>) -> StartGuard {
        StartGuard(Some(Arc::clone(store)))
    }

    /// The server is up: from now on its exit path closes the backing device
    /// ([`Store::close_backing`]).
    pub fn started(mut self) {
        self.0 = None;
    }
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if let Some(store) = self.0.take() {
            store.abandon_backing();
        }
    }
}

/// How often the writeback thread calls [`Store::maintain`] while it has work.
const WRITEBACK_PERIOD: Duration = Duration::from_millis(100);
/// How long it sleeps when a step found nothing to do, unless pool memory passing the high
/// watermark wakes it first (`Store::arm_writeback_wakeup`): GC of pages rewritten or
/// discarded on the backing device, and a change of the watermarks or the limit, wait that
/// long at most.
const WRITEBACK_IDLE: Duration = Duration::from_secs(1);

/// Starts the backing tier's background writer for `store` (which has a backing device): every
/// 100 ms while there is work, writeback of cold pages above the high watermark (within
/// --writeback-rate) and GC of the backing device; when a step finds nothing to do, it sleeps
/// until the pool passes the high watermark (the allocation that crosses it wakes the thread)
/// or a second has passed, so an idle device does not wake it ten times a second. (Without a
/// memory limit there is no watermark: only GC, once a second while idle.) It runs for
/// the life of the process. The store logs device errors itself; this thread says when the
/// device fills up and when it has room again.
///
/// In a swap server it is started after the memory is pinned, so it inherits
/// `PR_SET_IO_FLUSHER` and its stack is locked. Nothing on the I/O path waits for it: when it
/// falls behind (or waits for memory itself), writes that find the pool full overflow to the
/// device directly.
pub fn spawn_writeback(store: Arc<Store>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("writeback".into()).spawn(move || {
        let mut full = false;
        let mut last = Instant::now();
        loop {
            // Armed before the step: a crossing during it wakes the park below at once.
            let armed = store.arm_writeback_wakeup();
            let r = store.maintain(last.elapsed());
            last = Instant::now();
            if r.writeback.device_full != full {
                full = r.writeback.device_full;
                log::info(&format!("backing device {}", if full { "full: writeback paused" } else { "has room again" }));
            }
            match (worked(&r), armed) {
                (true, _) => std::thread::sleep(WRITEBACK_PERIOD),
                (false, true) => std::thread::park_timeout(WRITEBACK_IDLE),
                // Over the watermark and nothing written (the writeback limit, a full device):
                // allocations do not wake it; it tries again in a second.
                (false, false) => std::thread::sleep(WRITEBACK_IDLE),
            }
        }
    })
}

/// Whether a maintenance step did something (so the next one may find more).
fn worked(r: &compcache_store::MaintenanceReport) -> bool {
    r.writeback.pages > 0 || r.writeback.raced > 0 || r.gc.segments > 0 || r.gc.segments_freed > 0 || r.gc.punched > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        backing: BackingArgs,
    }

    fn args(v: &[&str]) -> BackingArgs {
        T::try_parse_from(std::iter::once("t").chain(v.iter().copied())).unwrap().backing
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn flags_become_the_store_config() {
        let a = args(&[
            "--backing",
            "/dev/vdb",
            "--backing-size",
            "4G",
            "--writeback-rate",
            "8M/s",
            "--writeback-limit",
            "1G",
            "--writeback-high",
            "80",
            "--writeback-low",
            "60",
            "--backing-incompressible",
        ]);
        let b = a.config(8 * GIB, GIB).unwrap().unwrap();
        assert_eq!(b.path, PathBuf::from("/dev/vdb"));
        assert_eq!(
            (b.size_bytes, b.writeback_rate_bytes, b.writeback_limit_bytes, b.high_pct, b.low_pct, b.incompressible),
            (4 * GIB, 8 << 20, GIB, 80, 60, true)
        );
        assert!(!b.force);
        assert!(b.encrypt, "encrypted by default");
        assert!(args(&["--backing", "f", "--force"]).config(8 * GIB, GIB).unwrap().unwrap().force);
        assert!(!args(&["--backing", "f", "--backing-plaintext"]).config(8 * GIB, GIB).unwrap().unwrap().encrypt);
        let e = args(&["--backing-plaintext"]).config(8 * GIB, GIB).unwrap_err().to_string();
        assert!(e.contains("need --backing"), "{e}");
        let e = args(&["--force"]).config(8 * GIB, GIB).unwrap_err().to_string();
        assert!(e.contains("need --backing"), "{e}");
        let d = args(&["--backing", "f"]).config(8 * GIB, GIB).unwrap().unwrap();
        assert_eq!(
            (d.size_bytes, d.high_pct, d.low_pct, d.writeback_rate_bytes),
            (0, DEFAULT_WRITEBACK_HIGH_PCT, DEFAULT_WRITEBACK_LOW_PCT, 0)
        );
        assert!(args(&[]).config(8 * GIB, 0).unwrap().is_none());
        let e = args(&["--writeback-rate", "1M"]).config(8 * GIB, GIB).unwrap_err().to_string();
        assert!(e.contains("need --backing"), "{e}");
        let e = args(&["--backing", "f", "--writeback-limit", "lots"]).config(8 * GIB, GIB).unwrap_err().to_string();
        assert!(e.starts_with("--writeback-limit"), "{e}");
    }

    #[test]
    fn the_cold_tier_flags_become_a_tier_in_memory() {
        let c = args(&["--cold-tier", "1G", "--cold-idle", "120", "--cold-level", "15", "--writeback-rate", "4M/s"]);
        let b = c.config(8 * GIB, 0).unwrap().unwrap();
        assert_eq!((b.medium, b.idle_secs, b.size_bytes, b.writeback_rate_bytes), (Medium::Memory { level: 15 }, 120, GIB, 4 << 20));
        assert!(!b.encrypt && !b.incompressible, "in the server's memory: not encrypted, no overflow");
        let d = args(&["--cold-tier", "10%"]).config(8 * GIB, 0).unwrap().unwrap();
        assert_eq!((d.medium, d.idle_secs), (Medium::Memory { level: DEFAULT_COLD_LEVEL }, DEFAULT_COLD_IDLE_SECS));
        assert_eq!(d.size_bytes % compcache_store::config::DEFAULT_SEGMENT_BYTES, 0, "whole segments");
        let e = args(&["--cold-tier", "1M"]).config(8 * GIB, 0).unwrap_err().to_string();
        assert!(e.contains("at least 4 MiB"), "{e}");
        let e = args(&["--cold-idle", "30"]).config(8 * GIB, 0).unwrap_err().to_string();
        assert!(e.contains("need --cold-tier"), "{e}");
        let e = args(&["--cold-tier", "1G", "--backing-plaintext"]).config(8 * GIB, 0).unwrap_err().to_string();
        assert!(e.contains("not --cold-tier"), "{e}");
        assert!(T::try_parse_from(["t", "--cold-tier", "1G", "--backing", "f"]).is_err(), "one place for cold pages");
        assert!(T::try_parse_from(["t", "--cold-tier", "1G", "--cold-level", "23"]).is_err(), "zstd has no level 23");
    }

    #[test]
    fn cold_idle_takes_a_duration_and_sizes_never_round_to_their_meaning_for_0() {
        let b = args(&["--cold-tier", "1G", "--cold-idle", "10m"]).config(8 * GIB, 0).unwrap().unwrap();
        assert_eq!(b.idle_secs, 600);
        assert_eq!(args(&["--cold-tier", "1G", "--cold-idle", "2h"]).config(8 * GIB, 0).unwrap().unwrap().idle_secs, 7200);
        for (bad, why) in [("1d", "65535 s (18h12m15s)"), ("500ms", "whole number of seconds"), ("ten", "not a duration")] {
            let e = T::try_parse_from(["t", "--cold-tier", "1G", "--cold-idle", bad]).err().expect(bad).to_string();
            assert!(e.contains("--cold-idle") && e.contains(why), "{bad}: {e}");
        }
        for (flag, value, means) in [
            ("--writeback-limit", "100", "no limit"),
            ("--writeback-rate", "1000/s", "no limit"),
            ("--backing-size", "0.5K", "the default size"),
        ] {
            let e = args(&["--backing", "f", flag, value]).config(8 * GIB, GIB).unwrap_err().to_string();
            assert!(
                e.starts_with(flag) && e.contains(&format!("which means {means}")) && e.contains("give at least 4K"),
                "{flag} {value}: {e}"
            );
        }
        let b =
            args(&["--backing", "f", "--writeback-limit", "none", "--writeback-rate", "0", "--backing-size", "off"]).config(8 * GIB, GIB);
        let b = b.unwrap().unwrap();
        assert_eq!((b.writeback_limit_bytes, b.writeback_rate_bytes, b.size_bytes), (0, 0, 0));
        let e = args(&["--writeback-high", "80"]).config(8 * GIB, GIB).unwrap_err().to_string();
        assert!(e.contains("need --backing"), "a watermark without a backing device is refused, as the other writeback flags: {e}");
    }

    #[test]
    fn to_args_round_trips() {
        assert!(args(&[]).to_args().is_empty());
        for v in [
            &["--cold-tier", "2G", "--cold-idle", "60", "--cold-level", "12", "--writeback-high", "90", "--writeback-low", "75"][..],
            &["--cold-tier", "2G", "--cold-idle", "2h"][..],
            &["--backing", "/dev/vdb"][..],
            &[
                "--backing",
                "/var/lib/b.img",
                "--backing-size",
                "2G",
                "--writeback-high",
                "70",
                "--writeback-low",
                "50",
                "--writeback-limit",
                "1G",
                "--writeback-rate",
                "4M/s",
                "--backing-incompressible",
                "--backing-plaintext",
                "--force",
            ][..],
        ] {
            let a = args(v);
            let again = T::try_parse_from(std::iter::once(OsString::from("t")).chain(a.to_args())).unwrap().backing;
            assert_eq!(again, a, "{v:?}");
        }
    }
}
