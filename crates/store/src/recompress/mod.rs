//! Recompression: pages that have been idle a while, and raw ("huge") pages, are re-encoded in
//! the background with a stronger codec (zstd at a high level, with a dictionary trained from
//! the device's own pages), as zram's `recompress type=idle|huge` does when an administrator
//! asks; here the store does it by itself, within a CPU budget (`docs/store.md`,
//! "Recompression").
//!
//! One step ([`step`], from `Store::recompress_step` on a front end's recompression thread,
//! or `Store::recompress` directly):
//! 1. skip the step if the device is busy (more page requests per second than
//!    `RecompressConfig::busy_pages_per_sec` since the last step);
//! 2. scan slots from where the last step stopped, by their lock-free hints (slot.rs rule 5):
//!    a compressed page still in the store's own codec, a raw page, or (once there is a
//!    dictionary) a page recompressed without it or with an older version, idle for
//!    `idle_secs`, not rejected before;
//! 3. copy it out and mark it RECOMPRESSING under its slot lock (`Mover::copy_out`), decode
//!    and re-encode it holding no lock, and install the result only if it saves at least
//!    `min_saving_bytes` (a page moving from an older dictionary version: if it is no larger)
//!    and the slot still holds the page (the mark; slot.rs rule 8);
//!    otherwise mark the slot REJECTED so the next scans pass it by, until it is rewritten;
//! 4. stop when the step's CPU time (this thread's, measured) has used the budget,
//!    `cpu_percent` of the time since the last step.
//!
//! A page written again is encoded by the write path with the store's own codec: recompression
//! never touches the I/O path. Readers decode whatever codec a slot names (`ram/mod.rs`).
//!
//! Dictionaries (`dict.rs`): with [`DictSource::Train`], one idle compressed page in every
//! `pages stored / dict_samples` is kept as a sample (nothing is recompressed before the first
//! dictionary, for at most one pass over the device); once there are `dict_samples`, zstd's
//! trainer (fastCover as `ZDICT_trainFromBuffer` runs it, `dict::fastcover`) builds a
//! dictionary, which is installed as a new version only if it saves at least
//! `min_dict_gain_permille` on held-out samples. Every `DRIFT_EVERY`th page
//! recompressed with the dictionary is also encoded without it; when the gain measured that
//! way over `DRIFT_WINDOW` pages falls under half of the gain at training time, a new
//! dictionary is trained from fresh samples, and replaces the current one only if it saves
//! `MIN_DICT_IMPROVEMENT_PERMILLE` more on the same held-out pages (else the current one's gain
//! there becomes its new baseline). Versions no page uses any more are freed.
//!
//! # Memory and the swap server's guarantees
//! Nothing here runs on the I/O path. The state (contexts) is made on the first step and
//! kept; the sample buffer exists only while samples are taken, and is freed when they have
//! been trained on. New pool objects come from the pool like a write's; in fault-free mode (a
//! swap server with a reserve) a step stops while fewer than `RESERVE_FLOOR_PAGES` resident
//! pages are free, so it never takes the reserve the I/O path needs. Each install frees an
//! object at least as large, so recompression never raises `mem_used_total` (after
//! compaction). A training holds a copy of its samples and zstd's trainer's tables for its
//! duration (about half a second for 576 pages).
//!
//! # Locking
//! `Recompressor::state` (a mutex, one step at a time) is taken before any slot lock; slot
//! locks are taken one at a time, briefly (one copy; one install), as every mover does. It is
//! independent of the backing tier's maintenance mutex: writeback and recompression may copy
//! the same page, and the first to install wins (slot.rs rule 8).

/// The dictionaries are the codec's (`compress/dict.rs`); here under their old name too.
pub use crate::compress::dict;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::compress::strong::StrongEncoder;
use crate::compress::{Codec, MAX_COMPRESSED_BYTES};
use crate::config::{DictSource, RecompressConfig};
use crate::context::Context;
use crate::ram::mover::{Mover, Unchanged};
use crate::slot::{Kind, Mark};
use crate::stats::{Counters, RecompressCounters};
use crate::PAGE_SIZE;
use dict::{Dict, Dicts};

/// Pages a step looks at, at most (so a step over a large, cold device stays short even when
/// nothing qualifies).
const SCAN_PER_STEP: u64 = 1 << 16;
/// In fault-free mode, resident free pool pages below which a step allocates nothing.
const RESERVE_FLOOR_PAGES: u64 = 64;
/// The largest dictionary trained (bytes). zstd's advice: about 1/100 of the samples.
const DICT_MAX_BYTES: usize = 16 << 10;
/// Drift measurement: one page in `DRIFT_EVERY` is encoded both ways; the gain is judged over
/// `DRIFT_WINDOW` such pages.
const DRIFT_EVERY: u64 = 8;
const DRIFT_WINDOW: u64 = 256;
/// A new dictionary replaces the current one only if it saves this much more (per mille) on
/// the same held-out pages.
const MIN_DICT_IMPROVEMENT_PERMILLE: u32 = 10;
/// After a training that installed nothing, the next waits until this many times its samples
/// in pages have been recompressed.
const RETRY_AFTER_SAMPLES: u64 = 8;
/// CPU time a step may bank for the next ones (so a step after a busy pause is bounded).
const MAX_BANKED_NS: i64 = 200_000_000;

/// The recompression side of a store.
pub(crate) struct Recompressor {
    /// As configured at start; the tunables below may change while the device runs.
    pub cfg: RecompressConfig,
    pub tune: Tuning,
    pub ctr: RecompressCounters,
    state: Mutex<Option<State>>,
    /// The administrator's dictionary, read when the store was made (`DictSource::File`);
    /// installed on the first step.
    given_dict: Option<Vec<u8>>,
}

/// What may change on a running device (`Store::tune_recompression`, the control socket's
/// `recompress` command): read by each step, so a change takes effect at the next one.
#[derive(Debug)]
pub(crate) struct Tuning {
    pub idle_secs: AtomicU64,
    pub min_saving_bytes: AtomicU64,
    pub cpu_percent: AtomicU64,
    pub busy_pages_per_sec: AtomicU64,
    /// Background steps do nothing (an explicit `Store::recompress` still runs).
    pub paused: AtomicBool,
    /// Train a new dictionary from fresh samples at the next step (self-training only); it
    /// replaces the current one if it passes `min_dict_gain_permille`, better or not.
    pub retrain: AtomicBool,
}

/// Changes to recompression's tunables on a running device; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecompressTuning {
    pub idle_secs: Option<u64>,
    pub min_saving_bytes: Option<u64>,
    pub cpu_percent: Option<u64>,
    pub busy_pages_per_sec: Option<u64>,
    pub paused: Option<bool>,
    /// `Some(true)`: train a new dictionary version from fresh samples now, whatever the
    /// current one measures (with `--dict train`; ignored otherwise).
    pub retrain: Option<bool>,
}

/// Recompression's tunables as they are now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecompressSettings {
    pub idle_secs: u64,
    pub min_saving_bytes: u64,
    pub cpu_percent: u64,
    pub busy_pages_per_sec: u64,
    pub paused: bool,
    /// Set at start: the zstd level, whether raw pages are taken, the dictionary's source.
    pub level: i32,
    pub huge: bool,
    pub dict: String,
}

impl Recompressor {
    /// Applies `t` (checked as the configuration is) and returns the settings after it.
    pub fn tune(&self, t: &RecompressTuning) -> Result<RecompressSettings, String> {
        if let Some(secs) = t.idle_secs {
            crate::config::check_idle_secs("idle age", secs)?;
        }
        if let Some(p) = t.cpu_percent {
            if !(1..=100).contains(&p) {
                return Err(format!("CPU budget {p}% is outside 1..=100"));
            }
        }
        if let Some(b) = t.min_saving_bytes {
            if b >= PAGE_SIZE as u64 {
                return Err(format!("threshold {b} bytes is not below a page ({PAGE_SIZE} bytes)"));
            }
        }
        let n = &self.tune;
        let set = |a: &AtomicU64, v: Option<u64>| {
            if let Some(v) = v {
                a.store(v, Relaxed);
            }
        };
        set(&n.idle_secs, t.idle_secs);
        set(&n.min_saving_bytes, t.min_saving_bytes);
        set(&n.cpu_percent, t.cpu_percent);
        set(&n.busy_pages_per_sec, t.busy_pages_per_sec);
        if let Some(p) = t.paused {
            n.paused.store(p, Relaxed);
        }
        if t.retrain == Some(true) {
            n.retrain.store(true, Relaxed);
        }
        Ok(self.settings())
    }

    pub fn settings(&self) -> RecompressSettings {
        let n = &self.tune;
        RecompressSettings {
            idle_secs: n.idle_secs.load(Relaxed),
            min_saving_bytes: n.min_saving_bytes.load(Relaxed),
            cpu_percent: n.cpu_percent.load(Relaxed),
            busy_pages_per_sec: n.busy_pages_per_sec.load(Relaxed),
            paused: n.paused.load(Relaxed),
            level: self.cfg.level,
            huge: self.cfg.huge,
            dict: match &self.cfg.dict {
                DictSource::None => "none".into(),
                DictSource::Train => "train".into(),
                DictSource::File(p) => p.display().to_string(),
            },
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecompressReport {
    /// Slots looked at.
    pub scanned: u64,
    pub done: u64,
    pub rejected: u64,
    pub raced: u64,
    pub saved_bytes: u64,
    /// The step did nothing because the device was busy.
    pub busy: bool,
    /// A dictionary version was installed in this step.
    pub dict_installed: Option<u64>,
    /// A whole pass over the device, ending in this step, found nothing to do: no page to
    /// recompress or to sample (a settled or empty device); also set while background steps
    /// are paused. The front end's thread may then step less often, until a step finds work
    /// again.
    pub settled: bool,
}

/// The state a step keeps between steps (made on the first one).
struct State {
    enc: StrongEncoder,
    /// Primary-codec decoding and a page buffer.
    ctx: Context,
    out: Box<[u8]>,
    cursor: u64,
    /// Slots scanned since a step last found work (a page copied out to recompress or to
    /// sample, or a training): at least the device's slot count means a whole quiet pass.
    quiet: u64,
    last_requests: u64,
    budget_ns: i64,
    /// The dictionary new recompressions use: its place and the dictionary.
    current: Option<(usize, Arc<Dict>)>,
    next_version: u64,
    /// Self-training (`DictSource::Train`) only.
    trainer: Option<Trainer>,
}

struct Trainer {
    /// Sample pages, back to back (`pages` at most). Allocated by `start`, freed after the
    /// training, so that between trainings (most of a device's life) it costs nothing.
    samples: Vec<u8>,
    pages: usize,
    /// Drift window: bytes with and without the dictionary, and pages measured.
    with: u64,
    without: u64,
    measured: u64,
    /// Pages recompressed with the current dictionary (one in `DRIFT_EVERY` is measured).
    since: u64,
    /// Samples are wanted: no dictionary yet, or the current one drifted.
    retrain: bool,
    /// The last training installed nothing: `RecompressCounters::done` then.
    refused_at: Option<u64>,
    /// The next training was asked for (`Tuning::retrain`): its dictionary replaces the
    /// current one whether or not it beats it.
    forced: bool,
    /// Sampling takes one eligible page in `stride` (set when samples are first wanted, from
    /// the pages stored then), so that the samples spread over the whole device instead of
    /// being its first pages; `seen` counts eligible pages, `visited` slots, since then.
    stride: u64,
    seen: u64,
    visited: u64,
}

impl Trainer {
    fn new(pages: usize) -> Trainer {
        Trainer {
            samples: Vec::new(),
            pages,
            with: 0,
            without: 0,
            measured: 0,
            since: 0,
            retrain: true,
            refused_at: None,
            forced: false,
            stride: 0,
            seen: 0,
            visited: 0,
        }
    }

    /// Before the first dictionary, and after a drift until the next one is in.
    fn wants_samples(&self) -> bool {
        self.retrain && !self.full()
    }

    /// Starts (or restarts) sampling over a device holding `stored` pages.
    fn start(&mut self, stored: u64) {
        self.samples = Vec::with_capacity(self.pages * PAGE_SIZE);
        (self.retrain, self.refused_at) = (true, None);
        (self.stride, self.seen, self.visited) = ((stored / self.pages as u64).max(1), 0, 0);
    }

    fn full(&self) -> bool {
        self.samples.len() >= self.pages * PAGE_SIZE
    }
}

impl Recompressor {
    pub fn new(cfg: RecompressConfig) -> Result<Recompressor, String> {
        let given_dict = match &cfg.dict {
            DictSource::File(path) => {
                let bytes = std::fs::read(path).map_err(|e| format!("cannot read the dictionary {}: {e}", path.display()))?;
                if bytes.len() > crate::compress::dict::DICT_ROOM {
                    return Err(format!(
                        "the dictionary {} is {} bytes; compcache keeps dictionaries of at most {} KiB (zstd --train makes ~110 KiB)",
                        path.display(),
                        bytes.len(),
                        crate::compress::dict::DICT_ROOM >> 10
                    ));
                }
                // Checked now, so that a bad file fails the start instead of the first step.
                crate::compress::strong::ddict(&bytes).map_err(|e| format!("dictionary {}: {e}", path.display()))?;
                Some(bytes)
            }
            _ => None,
        };
        let tune = Tuning {
            idle_secs: AtomicU64::new(cfg.idle_secs),
            min_saving_bytes: AtomicU64::new(cfg.min_saving_bytes as u64),
            cpu_percent: AtomicU64::new(cfg.cpu_percent as u64),
            busy_pages_per_sec: AtomicU64::new(cfg.busy_pages_per_sec),
            paused: AtomicBool::new(false),
            retrain: AtomicBool::new(false),
        };
        Ok(Recompressor { cfg, tune, ctr: RecompressCounters::default(), state: Mutex::new(None), given_dict })
    }
}

/// Current thread's CPU time in ns.
fn thread_cpu_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// One step of recompression (see the module docs). `make_ctx` makes the step's decoding
/// context the first time. `budget`: `None` takes the configured CPU share of `elapsed`;
/// `Some(ns)` spends up to that much CPU time now (an explicit request, busy or not).
pub(crate) fn step(
    mv: &Mover<'_>,
    r: &Recompressor,
    elapsed: Duration,
    budget: Option<i64>,
    make_ctx: impl FnOnce() -> Context,
) -> RecompressReport {
    let mut rep = RecompressReport::default();
    let Some(mut guard) = r.state.try_lock() else { return rep };
    let st = guard.get_or_insert_with(|| State {
        enc: StrongEncoder::new(r.cfg.level),
        ctx: make_ctx(),
        out: vec![0u8; MAX_COMPRESSED_BYTES].into_boxed_slice(),
        cursor: 0,
        quiet: 0,
        last_requests: 0,
        budget_ns: 0,
        current: None,
        next_version: 1,
        trainer: matches!(r.cfg.dict, DictSource::Train).then(|| Trainer::new(r.cfg.dict_samples)),
    });
    if st.current.is_none() {
        if let Some(bytes) = &r.given_dict {
            rep.dict_installed = install(r, mv.dicts(), st, bytes.clone(), 0);
        }
    }
    let c = mv.counters();
    let requests = Counters::get(&c.num_reads) + Counters::get(&c.num_writes);
    let recent = requests.saturating_sub(st.last_requests);
    st.last_requests = requests;
    match budget {
        Some(ns) => st.budget_ns = ns,
        None if r.tune.paused.load(Relaxed) => {
            rep.settled = true;
            return rep;
        }
        None => {
            let secs = elapsed.as_secs_f64().max(1e-3);
            let busy = r.tune.busy_pages_per_sec.load(Relaxed);
            if busy > 0 && recent as f64 / secs > busy as f64 {
                Counters::inc(&r.ctr.busy_skips);
                rep.busy = true;
                return rep;
            }
            let earned = (elapsed.as_nanos() as f64 * r.tune.cpu_percent.load(Relaxed) as f64 / 100.0) as i64;
            st.budget_ns = (st.budget_ns + earned).min(MAX_BANKED_NS);
        }
    }
    let start = thread_cpu_ns();
    if st.budget_ns > 0 {
        scan(mv, r, st, start, &mut rep);
        rep.settled = st.quiet >= mv.num_slots();
    }
    mv.dicts().free_unused(|codec| Counters::get(&c.codec_pages[codec.index()]), st.current.as_ref().map(|(p, _)| *p));
    let used = thread_cpu_ns() - start;
    st.budget_ns -= used;
    Counters::add(&r.ctr.cpu_ns, used.max(0) as u64);
    rep
}

/// Step 2-4 of the module docs.
fn scan(mv: &Mover<'_>, r: &Recompressor, st: &mut State, start: i64, rep: &mut RecompressReport) {
    let now = mv.now();
    let idle = r.tune.idle_secs.load(Relaxed).min(u16::MAX as u64) as u16;
    let threshold = r.tune.min_saving_bytes.load(Relaxed) as usize;
    let n = mv.num_slots();
    let stored = compressed_pages(mv.counters());
    if let Some(t) = &mut st.trainer {
        if r.tune.retrain.swap(false, Relaxed) {
            t.start(stored);
            t.forced = true;
        }
        if t.refused_at.is_some_and(|at| Counters::get(&r.ctr.done) >= at + RETRY_AFTER_SAMPLES * t.pages as u64) {
            t.start(stored);
        }
        if t.wants_samples() && t.stride == 0 {
            t.start(stored);
        }
    }
    for (index, h) in mv.hints_from(st.cursor).take(SCAN_PER_STEP.min(n) as usize) {
        st.cursor = (index + 1) % n.max(1);
        rep.scanned += 1;
        st.quiet += 1;
        // Pages in the store's codec; raw pages; and, once there is a dictionary, pages
        // recompressed without it or with an older one (so that old versions empty out).
        let current = st.current.as_ref().map(|(place, _)| Codec::with_dict(*place));
        let wanted = |kind: Kind, codec: Codec, rejected: bool, ac_time: u16| {
            let kind_ok = match kind {
                Kind::Compressed => codec == Codec::PRIMARY || current.is_some_and(|c| c != codec),
                Kind::Huge => r.cfg.huge,
                _ => false,
            };
            kind_ok && !rejected && mv.age(now, ac_time) >= idle
        };
        // While a dictionary is being (re)trained, one idle compressed page in `stride`, in
        // any codec, is a sample (decoded; re-encoded only if it is a candidate too). Before
        // the first dictionary nothing is recompressed until it is trained (one pass over the
        // device at most), so that pages are not encoded twice.
        let (sampling, first, pick) = match &mut st.trainer {
            Some(t) if t.wants_samples() => {
                t.visited += 1;
                let eligible = h.kind == Kind::Compressed && mv.age(now, h.ac_time) >= idle;
                t.seen += eligible as u64;
                (true, st.current.is_none(), eligible && t.seen % t.stride == 0)
            }
            _ => (false, false, false),
        };
        let sample_only = |kind: Kind, ac_time: u16| pick && kind == Kind::Compressed && mv.age(now, ac_time) >= idle;
        let candidate = !first && wanted(h.kind, h.codec, h.rejected, h.ac_time);
        if sampling && first && st.trainer.as_ref().is_some_and(|t| t.visited > n) {
            // A whole pass without enough samples (a device with few pages): train on what
            // there is (`train` refuses too few), and recompress without waiting any more.
            train(r, mv.dicts(), st, rep);
            st.quiet = 0;
            continue;
        }
        if !candidate && !sample_only(h.kind, h.ac_time) {
            continue;
        }
        if candidate && !mv.background_may_allocate(RESERVE_FLOOR_PAGES) {
            break;
        }
        let cbuf = &mut st.ctx.cbuf;
        let mark = candidate.then_some(Mark::Recompress);
        let Some(old) = mv.copy_out(index, mark, |seen| {
            let (kind, codec) = (kind_of(seen), seen.entry.codec());
            let ok = match candidate {
                true => wanted(kind, codec, seen.rejected, seen.ac_time),
                false => sample_only(kind, seen.ac_time),
            };
            ok.then_some(&mut cbuf[..seen.stored_bytes])
        }) else {
            continue;
        };
        st.quiet = 0;
        // Decode (raw pages are their own page). The dictionary a page names is in the table:
        // only this thread frees dictionaries (`dict.rs`).
        let old_len = match old {
            crate::slot::Entry::Compressed { len, codec, .. } => {
                let dict = codec.dict().and_then(|place| mv.dict(place));
                let ctx = &mut st.ctx;
                let src = &ctx.cbuf[..len as usize];
                if crate::compress::decode(&mut *ctx.comp, ctx.strong.as_mut(), codec, dict.as_deref(), src, &mut ctx.page).is_err() {
                    // A page that does not decode stays as it is: its reader gets the error.
                    if candidate {
                        mv.reject(index);
                    }
                    continue;
                }
                len as usize
            }
            _ => {
                st.ctx.page.copy_from_slice(&st.ctx.cbuf[..PAGE_SIZE]);
                PAGE_SIZE
            }
        };
        if let Some(t) = st.trainer.as_mut().filter(|_| pick) {
            t.samples.extend_from_slice(&st.ctx.page);
            if t.full() {
                // Trained as soon as the samples are in, so that the pages after them get the
                // dictionary.
                train(r, mv.dicts(), st, rep);
            }
        }
        if !candidate {
            continue;
        }
        // A page already recompressed moves to the current dictionary if that costs no
        // memory: what matters then is that its old version empties out and can be freed.
        let upgrade = matches!(old, crate::slot::Entry::Compressed { codec, .. } if codec != Codec::PRIMARY);
        let needed = if upgrade { 0 } else { threshold };
        let (codec, new_len) = encode(st);
        match new_len {
            Some(n) if n + needed <= old_len => {
                if mv.install_in_ram(index, old, &st.out[..n], codec, Unchanged::Marked(Mark::Recompress)) {
                    rep.done += 1;
                    rep.saved_bytes += (old_len - n) as u64;
                } else {
                    rep.raced += 1;
                }
            }
            _ => {
                mv.reject(index);
                rep.rejected += 1;
            }
        }
        if thread_cpu_ns() - start >= st.budget_ns {
            break;
        }
    }
    Counters::add(&r.ctr.done, rep.done);
    Counters::add(&r.ctr.rejected, rep.rejected);
    Counters::add(&r.ctr.raced, rep.raced);
    Counters::add(&r.ctr.saved_bytes, rep.saved_bytes);
    if let (Some(t), Some(_)) = (&mut st.trainer, &st.current) {
        if t.measured >= DRIFT_WINDOW {
            let measured = dict::gain_permille(t.with, t.without);
            r.ctr.dict_measured_permille.store(measured as u64, Relaxed);
            let trained = Counters::get(&r.ctr.dict_gain_permille) as u32;
            (t.with, t.without, t.measured) = (0, 0, 0);
            if measured * 2 < trained {
                // Drifted: train a new one from fresh samples; until it is in, the current
                // one stays (it still saves what it measured).
                t.start(compressed_pages(mv.counters()));
            }
        }
    }
}

/// Pages stored compressed (the ones sampling picks from): not same-filled, not raw.
fn compressed_pages(c: &Counters) -> u64 {
    Counters::get(&c.pages_stored).saturating_sub(Counters::get(&c.same_pages) + Counters::get(&c.huge_pages) + Counters::get(&c.bd_count))
}

fn kind_of(seen: &crate::ram::mover::Seen) -> Kind {
    match seen.entry {
        crate::slot::Entry::Compressed { .. } => Kind::Compressed,
        crate::slot::Entry::Huge { .. } => Kind::Huge,
        _ => Kind::Backing,
    }
}

/// Encodes `st.ctx.page` into `st.out` with the current dictionary (or none), measuring the
/// dictionary's gain on one page in `DRIFT_EVERY`.
fn encode(st: &mut State) -> (Codec, Option<usize>) {
    let page = &st.ctx.page[..];
    match &st.current {
        Some((place, _)) => {
            let n = st.enc.compress(page, &mut st.out, true);
            if let (Some(t), Some(with)) = (&mut st.trainer, n) {
                t.since += 1;
                if t.since % DRIFT_EVERY == 0 {
                    let mut scratch = [0u8; MAX_COMPRESSED_BYTES];
                    if let Some(without) = st.enc.compress(page, &mut scratch, false) {
                        t.with += with as u64;
                        t.without += without as u64;
                        t.measured += 1;
                    }
                }
            }
            (Codec::with_dict(*place), n)
        }
        None => (Codec::STRONG, st.enc.compress(page, &mut st.out, false)),
    }
}

/// Trains a dictionary on the samples and installs it if it pays.
fn train(r: &Recompressor, dicts: &Dicts, st: &mut State, rep: &mut RecompressReport) {
    let t = st.trainer.as_mut().expect("training needs a trainer");
    // A replacement must beat the current dictionary on the same held-out pages: otherwise a
    // population no dictionary fits well (several programs' pages) would be retrained and
    // re-encoded forever.
    let current = (st.current.is_some() && !t.forced).then(|| dict::gain_on(&mut st.enc, &dict::held_out(&t.samples)));
    t.forced = false;
    let few = t.samples.len() < t.pages * PAGE_SIZE;
    let trained = dict::train(&t.samples, DICT_MAX_BYTES, r.cfg.level);
    t.samples = Vec::new();
    // Not installed (too little gain, a failure, or every table place still in use): no
    // training again until as many pages as `RETRY_AFTER_SAMPLES` samples' worth have been
    // recompressed, so that a device whose pages a dictionary does not help spends nothing
    // on it.
    (t.retrain, t.stride) = (false, 0);
    t.refused_at = Some(Counters::get(&r.ctr.done));
    match trained {
        Ok(d)
            if d.gain_permille >= r.cfg.min_dict_gain_permille
                && current.is_none_or(|c| d.gain_permille >= c + MIN_DICT_IMPROVEMENT_PERMILLE) =>
        {
            rep.dict_installed = install(r, dicts, st, d.bytes, d.gain_permille);
            if rep.dict_installed.is_none() {
                Counters::inc(&r.ctr.dicts_refused);
            }
        }
        Ok(_) => {
            Counters::inc(&r.ctr.dicts_refused);
            // The current one stays; what it saves on today's pages is its new baseline, so
            // the drift measure compares against that from now on.
            if let Some(c) = current {
                r.ctr.dict_gain_permille.store(c as u64, Relaxed);
            }
        }
        // Too few samples (a device with few pages) is no failure worth a warning.
        Err(_) if few => Counters::inc(&r.ctr.dicts_refused),
        Err(e) => {
            compcache_log::warning("compcache", &format!("recompression: training a dictionary failed: {e}; trying again later"));
            Counters::inc(&r.ctr.dicts_refused);
        }
    }
}

/// Installs `bytes` as the next dictionary version and makes it current. `None` if every
/// table place is still in use or the dictionary does not load.
fn install(r: &Recompressor, dicts: &Dicts, st: &mut State, bytes: Vec<u8>, gain: u32) -> Option<u64> {
    let version = st.next_version;
    let dict = match Dict::new(bytes) {
        Ok(d) => d,
        Err(e) => {
            compcache_log::warning("compcache", &format!("recompression: {e}"));
            Counters::inc(&r.ctr.dicts_refused);
            return None;
        }
    };
    st.enc.set_dict(Some(&dict.bytes)).ok()?;
    let place = dicts.install(dict)?;
    st.next_version += 1;
    st.current = Some((place, dicts.get(place).expect("just installed")));
    if let Some(t) = &mut st.trainer {
        (t.with, t.without, t.measured, t.since, t.retrain, t.refused_at) = (0, 0, 0, 0, false, None);
    }
    Counters::inc(&r.ctr.dicts_installed);
    r.ctr.dict_version.store(version, Relaxed);
    r.ctr.dict_gain_permille.store(gain as u64, Relaxed);
    r.ctr.dict_measured_permille.store(0, Relaxed);
    Some(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::{Store, StoreError, PAGE};

    /// A page of records, `record(n)` for successive pseudo-random `n` seeded by `i`.
    fn records(i: u64, record: impl Fn(u64) -> String) -> Vec<u8> {
        let mut p = Vec::with_capacity(PAGE_SIZE);
        let mut n = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        while p.len() < PAGE_SIZE {
            n ^= n << 13;
            n ^= n >> 7;
            n ^= n << 17;
            p.extend_from_slice(record(n).as_bytes());
        }
        p.truncate(PAGE_SIZE);
        p
    }

    /// A page of JSON-like records: lz4 compresses it, zstd more, a dictionary more still.
    fn record_page(i: u64) -> Vec<u8> {
        records(i, |n| {
            format!("{{\"id\":{},\"user\":\"u{:05}\",\"score\":{},\"tags\":[\"a{}\",\"b\"]}},", n % 100_000, n % 977, n % 1000, n % 7)
        })
    }

    /// A store of `pages` pages with recompression `rc`, each page written with
    /// `record_page`, and a context.
    fn filled(pages: u64, rc: RecompressConfig) -> (Store, Context) {
        let s = Store::new(Config { recompress: Some(rc), ..Config::with_disksize(pages * PAGE) }).unwrap();
        let mut ctx = s.context();
        for i in 0..pages {
            s.write_page(&mut ctx, i, &record_page(i)).unwrap();
        }
        (s, ctx)
    }

    #[test]
    fn a_damaged_dictionary_is_an_error_for_its_pages_never_wrong_data() {
        let rc = RecompressConfig { idle_secs: 1, dict_samples: 90, ..RecompressConfig::default() };
        let (s, mut ctx) = filled(256, rc);
        s.advance_clock(10);
        // Enough steps to sample, train, and recompress the rest with the dictionary.
        for _ in 0..4 {
            s.recompress(std::time::Duration::from_secs(5));
        }
        let st = s.stats();
        assert!(st.dict_version >= 1 && st.recomp_dict_pages > 0, "{st:?}");
        let mut page = vec![0u8; PAGE_SIZE];
        for i in 0..256 {
            s.read_page(&mut ctx, i, &mut page).unwrap();
            assert_eq!(page, record_page(i), "page {i}");
        }
        // Another dictionary in the place the pages name: every such page is an error.
        let samples: Vec<Vec<u8>> = (9000..9200).map(|i| record_page(i).into_iter().rev().collect()).collect();
        let other = zstd::dict::from_samples(&samples, 8192).unwrap();
        s.ram().dicts().replace(0, Dict::new(other).unwrap());
        let (mut errors, mut good) = (0, 0);
        for i in 0..256 {
            match s.read_page(&mut ctx, i, &mut page) {
                Ok(()) => {
                    assert_eq!(page, record_page(i), "page {i} read back wrong");
                    good += 1;
                }
                Err(StoreError::Corrupt { index, .. }) => {
                    assert_eq!(index, i);
                    errors += 1;
                }
                Err(e) => panic!("page {i}: {e}"),
            }
        }
        assert_eq!(errors, st.recomp_dict_pages, "every page encoded with the dictionary fails ({good} others read)");
        assert_eq!(s.stats().failed_reads, errors);
    }

    #[test]
    fn a_page_written_again_goes_back_to_the_fast_codec() {
        let rc = RecompressConfig { idle_secs: 1, dict: DictSource::None, ..RecompressConfig::default() };
        let (s, mut ctx) = filled(16, rc);
        s.recompress(std::time::Duration::from_secs(1));
        assert_eq!(s.stats().recomp_pages, 0, "nothing is idle yet");
        s.advance_clock(5);
        let rep = s.recompress(std::time::Duration::from_secs(1));
        assert_eq!((rep.done, s.stats().recomp_pages), (16, 16), "{rep:?}");
        assert!(rep.saved_bytes >= 16 * 64);
        s.write_page(&mut ctx, 3, &record_page(100)).unwrap();
        let st = s.stats();
        assert_eq!(st.recomp_pages, 15);
        assert_eq!(st.recompress_saved_bytes, rep.saved_bytes);
        let mut page = vec![0u8; PAGE_SIZE];
        s.read_page(&mut ctx, 3, &mut page).unwrap();
        assert_eq!(page, record_page(100));
    }

    #[test]
    fn pages_that_do_not_save_enough_are_tried_once() {
        let rc = RecompressConfig { idle_secs: 0, min_saving_bytes: 4000, dict: DictSource::None, ..RecompressConfig::default() };
        let (s, mut ctx) = filled(8, rc);
        let first = s.recompress(std::time::Duration::from_secs(1));
        assert_eq!((first.done, first.rejected), (0, 8));
        let again = s.recompress(std::time::Duration::from_secs(1));
        assert_eq!((again.done, again.rejected), (0, 0), "rejected pages are passed by");
        s.write_page(&mut ctx, 0, &record_page(50)).unwrap();
        assert_eq!(s.recompress(std::time::Duration::from_secs(1)).rejected, 1, "a rewritten page is a new page");
    }

    #[test]
    fn a_pass_that_finds_nothing_says_the_device_is_settled() {
        let rc = RecompressConfig { idle_secs: 10, dict: DictSource::None, ..RecompressConfig::default() };
        let (s, mut ctx) = filled(64, rc);
        let step = || s.recompress(std::time::Duration::from_secs(1));
        let young = step();
        assert!(young.settled && young.done == 0, "nothing idle yet: a quiet pass {young:?}");
        s.advance_clock(20);
        let work = step();
        assert!(!work.settled && work.done == 64, "{work:?}");
        assert!(step().settled, "everything recompressed: the next pass finds nothing");
        // A page written again becomes a candidate once idle: found, so not settled.
        s.write_page(&mut ctx, 7, &record_page(700)).unwrap();
        assert!(step().settled, "written, but not idle yet");
        s.advance_clock(20);
        let again = step();
        assert!(!again.settled && again.done == 1, "{again:?}");
        s.tune_recompression(&RecompressTuning { paused: Some(true), ..Default::default() }).unwrap();
        assert!(s.recompress_step(std::time::Duration::from_millis(200)).settled, "paused: nothing to do in the background");
    }

    #[test]
    fn an_idle_age_past_what_the_clock_tells_is_refused_not_cut() {
        let (s, _) = filled(16, RecompressConfig { dict: DictSource::None, ..RecompressConfig::default() });
        let e = s.tune_recompression(&RecompressTuning { idle_secs: Some(86_400), ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("idle age of 86400 s is above the most an idle age can be, 65535 s"), "{e}");
        assert_eq!(s.recompression_settings().unwrap().idle_secs, crate::config::DEFAULT_RECOMPRESS_IDLE_SECS, "unchanged");
        let t = s.tune_recompression(&RecompressTuning { idle_secs: Some(crate::config::MAX_IDLE_SECS), ..Default::default() });
        assert_eq!(t.unwrap().idle_secs, 65_535);
    }

    #[test]
    fn a_busy_device_is_left_alone_and_the_budget_bounds_a_step() {
        let rc = RecompressConfig { idle_secs: 0, busy_pages_per_sec: 100, dict: DictSource::None, ..RecompressConfig::default() };
        let (s, _) = filled(512, rc);
        let rep = s.recompress_step(std::time::Duration::from_millis(100));
        assert!(rep.busy && rep.done == 0, "512 writes in 100 ms is busy: {rep:?}");
        // Quiet now: a step of 100 ms at 10% may spend about 10 ms, far from all 512 pages.
        let rep = s.recompress_step(std::time::Duration::from_millis(100));
        assert!(!rep.busy && rep.done > 0 && rep.done < 512, "{rep:?}");
        assert_eq!(s.stats().recompress_busy_skips, 1);
    }

    /// Pages of one "program": records whose field names come from `words`.
    fn page_of(words: &[&str], i: u64) -> Vec<u8> {
        records(i, |n| format!("<{} id={} v={}/> ", words[(n % words.len() as u64) as usize], n % 10_000, (n >> 20) % 1000))
    }

    const A: &[&str] = &["customer", "invoice", "shipment", "warehouse", "quantity"];
    const B: &[&str] = &["ZXQV", "PLMK", "RTYH", "WQAS", "NBVC"];

    /// A dictionary trained on one kind of page loses its gain when the device fills with
    /// another kind: recompression trains a second version, moves pages to it as it rescans
    /// them, and frees the first once no page uses it. Every page reads back throughout.
    #[test]
    fn a_dictionary_that_drifts_is_retrained_and_the_old_version_freed() {
        const N: u64 = 1024;
        let rc = RecompressConfig { idle_secs: 1, dict_samples: 180, ..RecompressConfig::default() };
        let s = Store::new(Config { recompress: Some(rc), ..Config::with_disksize(N * PAGE) }).unwrap();
        let mut ctx = s.context();
        let check = |ctx: &mut Context, words: &[&str]| {
            let mut page = vec![0u8; PAGE_SIZE];
            for i in 0..N {
                s.read_page(ctx, i, &mut page).unwrap();
                assert!(page == page_of(words, i), "page {i}");
            }
        };
        for i in 0..N {
            s.write_page(&mut ctx, i, &page_of(A, i)).unwrap();
        }
        s.advance_clock(5);
        for _ in 0..4 {
            s.recompress(Duration::from_secs(5));
        }
        let first = s.stats();
        assert_eq!(first.dict_version, 1, "{first:?}");
        check(&mut ctx, A);

        // Another program's pages: the dictionary no longer helps; the drift measure sees it
        // and a second version is trained.
        for i in 0..N {
            s.write_page(&mut ctx, i, &page_of(B, i + N)).unwrap();
        }
        // The new pages, in B's vocabulary, stamped like A's (page_of's index differs).
        let b = |i: u64| page_of(B, i + N);
        s.advance_clock(5);
        for _ in 0..12 {
            s.recompress(Duration::from_secs(5));
            s.advance_clock(5);
        }
        let after = s.stats();
        assert!(after.dict_version >= 2, "retrained: {after:?}");
        assert!(after.dicts_installed >= 2);
        assert_eq!(after.dicts_live, 1, "the first version is freed once no page uses it: {after:?}");
        assert_eq!(after.failed_reads, 0);
        let mut page = vec![0u8; PAGE_SIZE];
        for i in 0..N {
            s.read_page(&mut ctx, i, &mut page).unwrap();
            assert!(page == b(i), "page {i}");
        }
    }
}
