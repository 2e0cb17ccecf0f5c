//! Taking a device over (`Store::recover`): a successor process serves every page a dead one
//! stored, whatever instruction it died at.
//!
//! This file has its own `main` (harness = false): run with `--child`, it is the process that
//! gets killed (`child`). The tests:
//! - `a_successor_serves_every_page_and_the_same_gauges`: a clean handover in one process;
//! - `a_successor_refuses_what_it_cannot_read`: the refusals, each one line;
//! - `killed_at_random_a_successor_serves_every_acknowledged_write`: a child process stores
//!   pages from two writer threads (writes, overwrites, discards of every kind of page) while a
//!   third compacts the pool and a fourth recompresses idle pages (training, installing and
//!   retiring dictionaries), and is SIGKILLed at a random moment; the parent recovers, checks
//!   every page of the device against a model (an acknowledged write reads back exactly; the
//!   one write each thread had in flight reads as its old or its new content, never anything
//!   else) and the gauges against the pages, and lets the next child take over from there.
//!   `COMPCACHE_KILLS` sets the number of kills (default 1000; the closing figures of issue 29
//!   used 3000);
//! - the same three over a store with a backing file (`backing_*`): the children also write
//!   back (by the watermarks and idle pages), collect garbage, overflow into the file (a small
//!   `mem_limit`) and promote pages they read twice when the kill comes; the parent reopens
//!   the file (not discarded), checks every page, the device's gauges against the records the
//!   slots name, maintains the device itself, and hands it over to the next child
//!   (`Store::hand_over`). `COMPCACHE_KILLS` kills (default 300, a few tens of seconds);
//!   refusals: another file, a resized file, a device closed by its server, a configuration
//!   without the device;
//! - the same over a store with the cold tier (`cold_*`, issue 29: its blocks are in the state
//!   file): the children write back into the tier (watermarks and idle pages: its 64 KiB
//!   blocks are compressed, rewritten and discarded), collect its garbage and promote, with a
//!   small `mem_limit` (a write the pool refuses is retried: requests never go to the tier);
//!   the parent checks every page and the tier's gauges.
//!   `COMPCACHE_KILLS` kills (default 300).

mod common;

use common::{page, xorshift, Kind, PAGE};
use compcache_store::testing::TempDir;
use compcache_store::{BackingConfig, Config, DictSource, RecompressConfig, Store, WritebackBudget};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

const PAGES: u64 = 2048;
const WRITERS: u64 = 2;
/// Each writer owns `PAGES / WRITERS` pages, so the model per page follows one thread's order.
const SPAN: u64 = PAGES / WRITERS;

fn config() -> Config {
    let rc = RecompressConfig {
        idle_secs: 5,
        dict_samples: 27,
        min_dict_gain_permille: 0,
        dict: DictSource::Train,
        ..RecompressConfig::default()
    };
    Config { recompress: Some(rc), ..Config::with_disksize(PAGES * PAGE as u64) }
}

/// The backing file's configuration: 1 MiB of pool for an 8 MiB device, so requests overflow
/// and writeback runs; segments of 64 KiB, so GC has victims.
fn backing_config(path: &std::path::Path, encrypt: bool) -> Config {
    let mut b = BackingConfig::new(path);
    b.size_bytes = 32 << 20;
    b.segment_bytes = 64 << 10;
    b.high_pct = 60;
    b.low_pct = 40;
    b.encrypt = encrypt;
    Config { mem_limit_bytes: 256 * PAGE as u64, backing: Some(b), ..Config::with_disksize(PAGES * PAGE as u64) }
}

/// The cold tier's configuration: 2 MiB of pool for an 8 MiB device, so writeback runs by the
/// watermarks as well as by idle pages; a tier of 32 MiB in segments of 256 KiB (four blocks),
/// so GC has victims; zstd level 3 (the level changes nothing here but the time).
fn cold_config() -> Config {
    let mut b = BackingConfig::in_memory(32 << 20);
    b.segment_bytes = 256 << 10;
    b.medium = compcache_store::Medium::Memory { level: 3 };
    b.high_pct = 60;
    b.low_pct = 40;
    Config { mem_limit_bytes: 512 * PAGE as u64, backing: Some(b), ..Config::with_disksize(PAGES * PAGE as u64) }
}

/// Which store a test (and its children) runs.
#[derive(Clone)]
enum Mode {
    Ram,
    Backing(std::path::PathBuf),
    Cold,
}

impl Mode {
    fn config(&self) -> Config {
        match self {
            Mode::Ram => config(),
            Mode::Backing(p) => backing_config(p, true),
            Mode::Cold => cold_config(),
        }
    }
    fn arg(&self) -> String {
        match self {
            Mode::Ram => "-".into(),
            Mode::Backing(p) => p.display().to_string(),
            Mode::Cold => "cold".into(),
        }
    }
    fn from_arg(a: &str) -> Mode {
        match a {
            "-" => Mode::Ram,
            "cold" => Mode::Cold,
            _ => Mode::Backing(a.into()),
        }
    }
    /// A backing tier: a file or the cold tier.
    fn tiered(&self) -> bool {
        !matches!(self, Mode::Ram)
    }
}

/// Words of the progress page where a backing child publishes its tier's counters (overflow,
/// writeback, GC, promotion: pages since it took over; then the device's writes).
const TIER_WORDS: usize = 100;

/// What writer `t`'s op `n` does: (page, Some(content) | None for a discard).
fn op(seed: u64, t: u64, n: u64) -> (u64, Option<(Kind, u64)>) {
    let mut r = xorshift(seed ^ (t << 56) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let page = t * SPAN + r() % SPAN;
    let kind = match r() % 16 {
        0 => return (page, None),
        1 => Kind::Zero,
        2 | 3 => Kind::Same,
        4 | 5 => Kind::Random,
        6..=8 => Kind::Mixed,
        _ => Kind::Text,
    };
    (page, Some((kind, n)))
}

fn content(c: Option<(Kind, u64)>, index: u64) -> Vec<u8> {
    match c {
        None => vec![0u8; PAGE],
        Some((kind, version)) => page(kind, index, version),
    }
}

/// A shared page of progress counters: per writer (ops started, ops done), both counting ops.
struct Progress {
    fd: OwnedFd,
    words: *const AtomicU64,
}

impl Progress {
    fn create() -> Progress {
        // SAFETY: memfd_create with a NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"progress".as_ptr(), 0) };
        assert!(raw >= 0);
        // SAFETY: a descriptor we just opened.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        Progress::map(fd)
    }

    fn map(fd: OwnedFd) -> Progress {
        // SAFETY: a new shared mapping of one page of the file.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        Progress { fd, words: p as *const AtomicU64 }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < 512);
        // SAFETY: inside the mapped page, which lives as long as self (never unmapped).
        unsafe { &*self.words.add(i) }
    }
    fn started(&self, t: u64) -> &AtomicU64 {
        self.word(2 * t as usize)
    }
    fn done(&self, t: u64) -> &AtomicU64 {
        self.word(2 * t as usize + 1)
    }
}

// SAFETY: the mapping is shared memory of atomics.
unsafe impl Sync for Progress {}

/// The child: takes the device over from fd 3, then writes until killed (fd 4: progress).
fn child(seed: u64, mode: Mode) -> ! {
    // SAFETY: the parent put the state file at fd 3 and the progress file at fd 4 for us.
    let (state, progress) = unsafe { (OwnedFd::from_raw_fd(3), OwnedFd::from_raw_fd(4)) };
    let progress = Progress::map(progress);
    let (store, _) = Store::recover(mode.config(), state).expect("the child takes the device over");
    std::thread::scope(|s| {
        for t in 0..WRITERS {
            let (store, progress, mode) = (&store, &progress, &mode);
            s.spawn(move || {
                let mut ctx = store.context();
                let mut n = progress.done(t).load(Relaxed);
                loop {
                    let (index, c) = op(seed, t, n);
                    progress.started(t).store(n + 1, SeqCst);
                    match c {
                        None => store.discard_page(index),
                        // With the cold tier a write the pool has no room for fails (requests
                        // never go to the tier) until writeback makes room: the op is retried.
                        Some(_) if matches!(mode, Mode::Cold) => {
                            while store.write_page(&mut ctx, index, &content(c, index)).is_err() {
                                std::thread::sleep(Duration::from_micros(50));
                            }
                        }
                        Some(_) => store.write_page(&mut ctx, index, &content(c, index)).expect("write"),
                    }
                    n += 1;
                    progress.done(t).store(n, SeqCst);
                }
            });
        }
        s.spawn(|| loop {
            store.compact();
            std::thread::sleep(Duration::from_micros(200));
        });
        if let Mode::Ram = mode {
            s.spawn(|| loop {
                store.advance_clock(60);
                store.recompress(Duration::from_millis(5));
            });
        } else {
            let (store, progress, mode) = (&store, &progress, &mode);
            s.spawn(move || loop {
                let budget = WritebackBudget { max_bytes: 256 << 10 };
                store.maintain(Duration::from_millis(10));
                store.writeback(budget);
                // The cold tier: pages written since the last turn go cold at the next, so its
                // blocks are being rewritten most of the time a kill may come.
                store.advance_clock(if matches!(mode, Mode::Cold) { 30 } else { 10 });
                store.writeback_idle(30, budget);
                store.gc(256 << 10);
                std::thread::sleep(Duration::from_micros(300));
            });
            // The tier's counters, published every 200 µs (a kill loses at most that much).
            s.spawn(move || loop {
                let st = store.stats();
                let counts = [st.bd_overflow_pages, st.bd_writeback_pages, st.bd_gc_pages, st.bd_promoted_pages, st.bd_writes];
                for (i, v) in counts.into_iter().enumerate() {
                    progress.word(TIER_WORDS + i).store(v, SeqCst);
                }
                std::thread::sleep(Duration::from_micros(200));
            });
            // A reader: pages read twice within seconds are promoted back into RAM.
            s.spawn(move || {
                let mut ctx = store.context();
                let mut out = vec![0u8; PAGE];
                let mut r = xorshift(seed ^ 0xbeef);
                loop {
                    let index = r() % PAGES;
                    for _ in 0..2 {
                        let _ = store.read_page(&mut ctx, index, &mut out);
                    }
                }
            });
        }
    });
    unreachable!("the child runs until it is killed")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(args[i + 1].parse().unwrap(), Mode::from_arg(&args[i + 2]));
    }
    let filter: Option<&String> = args.iter().skip(1).find(|a| !a.starts_with('-'));
    let tests: [(&str, fn()); 11] = [
        ("a_successor_serves_every_page_and_the_same_gauges", a_successor_serves_every_page_and_the_same_gauges),
        ("a_successor_refuses_what_it_cannot_read", a_successor_refuses_what_it_cannot_read),
        ("a_successor_refuses_a_state_still_in_use", a_successor_refuses_a_state_still_in_use),
        ("killed_at_random_a_successor_serves_every_acknowledged_write", killed_at_random_a_successor_serves_every_acknowledged_write),
        ("backing_a_successor_serves_every_page_and_the_same_gauges", backing_a_successor_serves_every_page_and_the_same_gauges),
        ("backing_a_successor_refuses_another_device", backing_a_successor_refuses_another_device),
        ("backing_killed_at_random_a_successor_serves_every_acknowledged_write", backing_killed_at_random),
        ("backing_block_device_a_successor_serves_every_page", backing_block_device),
        ("cold_a_successor_serves_every_page_and_the_same_gauges", cold_a_successor_serves_every_page_and_the_same_gauges),
        ("cold_a_successor_refuses_another_tier", cold_a_successor_refuses_another_tier),
        ("cold_killed_at_random_a_successor_serves_every_acknowledged_write", cold_killed_at_random),
    ];
    for (name, f) in tests {
        if filter.is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        eprintln!("test {name} ...");
        f();
        eprintln!("test {name} ... ok");
    }
}

/// Reads every page of `store` through a context of its own and checks it is `want(page)`.
fn check_every_page(store: &Store, want: impl Fn(u64) -> Vec<u8>, when: &str) {
    let mut ctx = store.context();
    let mut out = vec![0u8; PAGE];
    for i in 0..PAGES {
        store.read_page(&mut ctx, i, &mut out).unwrap_or_else(|e| panic!("page {i} {when}: {e}"));
        assert!(out == want(i), "page {i} {when}");
    }
}

fn dup(store: &Store) -> OwnedFd {
    store.state_fd().expect("a RAM store's state is kept").try_clone_to_owned().unwrap()
}

fn a_successor_serves_every_page_and_the_same_gauges() {
    let store = Store::new(config()).unwrap();
    let mut ctx = store.context();
    let kinds = [Kind::Text, Kind::Random, Kind::Same, Kind::Zero, Kind::Mixed];
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page(kinds[i as usize % 5], i, 1)).unwrap();
    }
    for i in (0..PAGES).step_by(3) {
        store.discard_page(i);
    }
    store.advance_clock(60);
    store.recompress(Duration::from_secs(5));
    store.compact();
    let before = store.stats();
    assert!(before.recomp_pages > 0, "something was recompressed: {before:?}");
    let fd = dup(&store);
    drop((ctx, store));
    let (store, report) = Store::recover(config(), fd).unwrap();
    assert_eq!((report.lost_pages, report.undone, report.takeovers), (0, 0, 1), "{report}");
    let after = store.stats();
    assert_eq!(
        (after.pages_stored, after.compr_data_size, after.same_pages, after.huge_pages, after.mem_used_total, after.recomp_pages),
        (before.pages_stored, before.compr_data_size, before.same_pages, before.huge_pages, before.mem_used_total, before.recomp_pages)
    );
    let mut ctx = store.context();
    let mut out = vec![0u8; PAGE];
    for i in 0..PAGES {
        store.read_page(&mut ctx, i, &mut out).unwrap();
        let want = if i % 3 == 0 { vec![0u8; PAGE] } else { page(kinds[i as usize % 5], i, 1) };
        assert!(out == want, "page {i}");
    }
    // And it goes on as a store does: writes, frees, compaction.
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 2)).unwrap();
    }
    check_every_page(&store, |i| page(Kind::Text, i, 2), "after rewriting");
}

fn a_successor_refuses_what_it_cannot_read() {
    let store = Store::new(config()).unwrap();
    let err = |cfg: Config| Store::recover(cfg, dup(&store)).err().expect("refused").to_string();
    let e = err(Config { disksize_bytes: 2 * PAGES * PAGE as u64, ..config() });
    assert!(e.contains("8 MiB device") && e.contains("16 MiB"), "{e}");
    let e = err(Config { algorithm: compcache_store::Algorithm::Zstd, ..config() });
    assert!(e.contains("compressed with lz4"), "{e}");
    let f = std::fs::File::open("/dev/null").unwrap();
    let e = Store::recover(config(), f.into()).err().unwrap().to_string();
    assert!(e.contains("not a compcache state file"), "{e}");
    let cold = Config { backing: Some(BackingConfig::in_memory(4 << 20)), mem_limit_bytes: 1 << 20, ..config() };
    let b = Store::new(cold.clone()).unwrap();
    assert!(b.state_fd().is_some(), "the cold tier's blocks are in the file");
    let e = Store::recover(cold, dup(&store)).err().unwrap().to_string();
    assert!(e.contains("without a backing device, the configuration has the cold tier"), "{e}");
    let dir = TempDir::new("takeover");
    let e = Store::recover(backing_config(&dir.file(), true), dup(&store)).err().unwrap().to_string();
    assert!(e.contains("without a backing device"), "{e}");
}

fn killed_at_random_a_successor_serves_every_acknowledged_write() {
    kill_loop(Mode::Ram, 1000);
}

fn backing_killed_at_random() {
    // On tmpfs where there is one: this test is about what a kill leaves, and the parent reads
    // the whole device after each one (on a disk, with O_DIRECT, ten times slower). The clean
    // handover and the refusals above use the disk.
    let shm = std::path::Path::new("/dev/shm");
    let dir = shm.join(format!("compcache-takeover-kills-{}", std::process::id()));
    if !shm.is_dir() || std::fs::create_dir(&dir).is_err() {
        let dir = TempDir::new("takeover-kills");
        return kill_loop(Mode::Backing(dir.file()), 300);
    }
    kill_loop(Mode::Backing(dir.join("backing.img")), 300);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hands a store over to the next process: a backing device's records stay on it.
fn leave(store: Store) {
    store.hand_over();
    store.close_backing(); // what a server does on its way out: now it discards nothing
}

/// A child (`--child`) that takes the store over from `state` and writes until it is killed,
/// reporting in `progress`.
fn spawn_child(exe: &std::path::Path, state: &OwnedFd, progress: &Progress, seed: u64, mode: &Mode) -> std::process::Child {
    let (s, p) = (state.try_clone().unwrap(), progress.fd.try_clone().unwrap());
    let mut cmd = Command::new(exe);
    cmd.args(["--child", &seed.to_string(), &mode.arg()]).stdin(Stdio::null());
    // SAFETY: between fork and exec only dup2, which is async-signal-safe; the targets are
    // the fds the child expects, and dup2 clears close-on-exec on them.
    unsafe {
        let (s, p) = (s.as_raw_fd(), p.as_raw_fd());
        cmd.pre_exec(move || {
            if libc::dup2(s, 3) < 0 || libc::dup2(p, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// A state file whose server is alive is refused ("in use by pid N"), and taken over once the
/// server is gone: two servers of one state would take each other's pages.
fn a_successor_refuses_a_state_still_in_use() {
    let state = {
        let first = Store::new(config()).unwrap();
        let fd = dup(&first);
        leave(first);
        fd
    };
    let progress = Progress::create();
    let mut child = spawn_child(&std::env::current_exe().unwrap(), &state, &progress, 7, &Mode::Ram);
    let start = Instant::now();
    while progress.done(0).load(SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "the child did not start writing");
        std::thread::sleep(Duration::from_millis(5));
    }
    let err = Store::recover(config(), state.try_clone().unwrap()).err().expect("a state in use is refused");
    assert!(err.to_string().contains(&format!("in use by pid {}", child.id())), "{err}");
    // SAFETY: kill of our own child by its pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    child.wait().unwrap();
    let (store, report) = Store::recover(config(), state.try_clone().unwrap()).expect("taken over once its server is gone");
    assert_eq!(report.lost_pages, 0);
    drop(store);
}

fn kill_loop(mode: Mode, default_kills: u64) {
    let kills: u64 = std::env::var("COMPCACHE_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(default_kills);
    let seed = std::env::var("COMPCACHE_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_u64 ^ std::process::id() as u64);
    eprintln!("  {kills} kills, seed {seed} (COMPCACHE_KILLS, COMPCACHE_SEED)");
    if let Mode::Backing(_) = mode {
        eprintln!("  records sealed with {}", if seed % 2 == 0 { "AES-256-GCM" } else { "crc32c" });
    }
    // The cold tier: the most memory a successor found it using; kills that cut a block's
    // write short (recovery undid it).
    let (mut cold_mem, mut cold_cut) = (0u64, 0u64);
    let state = {
        // Over a backing file, the first store draws a key (even seeds) or a run identifier
        // (odd): the state file's seal is what a successor uses, whatever it is configured with.
        let first = match &mode {
            Mode::Ram => Store::new(config()).unwrap(),
            Mode::Backing(p) => Store::new(backing_config(p, seed % 2 == 0)).unwrap(),
            Mode::Cold => Store::new(cold_config()).unwrap(),
        };
        let fd = dup(&first);
        leave(first);
        fd
    };
    // The most pages a successor found on the backing device; the tier's work the children
    // did (overflow, writeback, GC, promotion: pages, summed over the children).
    let (mut on_device, mut tier) = (0u64, [0u64; 5]);
    // Time the parent spends recovering and checking (the rest is the children's).
    let (mut checking, whole) = (Duration::ZERO, Instant::now());
    let progress = Progress::create();
    let exe = std::env::current_exe().unwrap();
    // page -> its content (None: zeros).
    let mut model: HashMap<u64, Option<(Kind, u64)>> = HashMap::new();
    // Pages whose last op was in flight at a kill and reads the same either way (a zero page
    // written over a discarded one, or discarded over a zero page): whether the store holds a
    // page there (a same-filled one, counted in the gauges) or a hole is not known.
    let mut unsure: std::collections::HashSet<u64> = std::collections::HashSet::new();
    // Per writer: the op the next child starts at.
    let mut next = [0u64; WRITERS as usize];
    let mut rng = xorshift(seed);
    let (mut total_ops, mut in_flight, mut undone, mut freed, mut max_recovery) = (0u64, 0u64, 0u64, 0u64, Duration::ZERO);
    // The most recompressed pages and dictionaries a successor found.
    let (mut recompressed, mut dicts) = (0u64, 0u64);
    let mut out = vec![0u8; PAGE];
    for k in 0..kills {
        let mut child = spawn_child(&exe, &state, &progress, seed, &mode);
        // Kill anywhere: during its recovery, its start, or well into its writes.
        // (The cold tier's children live longer: their first turns of writeback compress.)
        let delay = Duration::from_micros(rng() % if matches!(mode, Mode::Cold) { 80_000 } else { 40_000 });
        std::thread::sleep(delay);
        // SAFETY: kill of our own child by its pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "the child died of the kill: {status:?}");

        let started = Instant::now();
        let (store, report) = Store::recover(mode.config(), state.try_clone().unwrap()).unwrap_or_else(|e| panic!("kill {k}: {e}"));
        max_recovery = max_recovery.max(started.elapsed());
        assert_eq!(report.lost_pages, 0, "kill {k}: {report}");
        on_device = on_device.max(report.backing_pages);
        for (i, t) in tier.iter_mut().enumerate() {
            *t += progress.word(TIER_WORDS + i).swap(0, SeqCst);
        }
        if mode.tiered() {
            let s = store.stats();
            assert_eq!(s.bd_count, report.backing_pages, "kill {k}: the device's gauges follow the slots");
            assert!(s.bd_space_bytes >= s.bd_bytes, "kill {k}: the segments in use hold the live records: {s:?}");
            if let Mode::Cold = mode {
                cold_mem = cold_mem.max(s.bd_mem_bytes);
                cold_cut += report.cold_writes_undone;
            }
        }
        undone += report.undone;
        dicts = dicts.max(report.dicts);
        freed += report.freed_objects;
        let mut ctx = store.context();
        // Apply what each writer finished; its op in flight may have happened or not.
        let mut either: Vec<(u64, Option<(Kind, u64)>)> = Vec::new();
        for t in 0..WRITERS {
            let done = progress.done(t).load(SeqCst);
            let begun = progress.started(t).load(SeqCst);
            let from = next[t as usize];
            for n in from..done {
                let (index, c) = op(seed, t, n);
                model.insert(index, c);
                unsure.remove(&index);
            }
            total_ops += done - from;
            if begun > done {
                let (index, c) = op(seed, t, done);
                either.push((index, c));
                in_flight += 1;
            }
            // Where the next child starts: after the op in flight, which it must not redo
            // with another outcome; the model learns which outcome the store kept below.
            next[t as usize] = begun.max(done);
            progress.done(t).store(next[t as usize], SeqCst);
            progress.started(t).store(next[t as usize], SeqCst);
        }
        for (index, new) in either {
            store.read_page(&mut ctx, index, &mut out).unwrap();
            let old = model.get(&index).copied().flatten();
            if out == content(new, index) {
                if new.is_some() != old.is_some() && out == content(old, index) {
                    unsure.insert(index);
                } else if out != content(old, index) {
                    unsure.remove(&index); // the new op happened: its page is known
                }
                model.insert(index, new);
            } else {
                assert!(out == content(old, index), "kill {k}: page {index} in flight is neither its old nor its new content");
            }
        }
        let mut stored = 0;
        // The whole device in one read: records adjacent on the device come in one pread.
        let mut all = vec![0u8; PAGES as usize * PAGE];
        store.read(&mut ctx, 0, &mut all).unwrap_or_else(|e| panic!("kill {k}: {e}"));
        for index in 0..PAGES {
            let want = model.get(&index).copied().flatten();
            let got = &all[index as usize * PAGE..][..PAGE];
            assert!(got == content(want, index), "kill {k}: page {index} is not its last acknowledged write");
            stored += u64::from(want.is_some() && !unsure.contains(&index));
        }
        let s = store.stats();
        recompressed = recompressed.max(s.recomp_pages);
        let pages = s.orig_data_size / PAGE as u64;
        assert!(
            (stored..=stored + unsure.len() as u64).contains(&pages),
            "kill {k}: the recomputed gauges follow the pages: {pages} stored, {stored} acknowledged and {} unsure",
            unsure.len()
        );
        assert_eq!(s.bd_errors, 0, "kill {k}: every record the slots name verifies");
        if mode.tiered() && k % 4 == 0 {
            // The successor's own tier works on the taken-over segments: write back, collect,
            // and every page still reads back (every fourth kill: it costs more than the rest
            // of the check).
            store.advance_clock(60);
            store.writeback_idle(30, WritebackBudget { max_bytes: 512 << 10 });
            store.gc(u64::MAX);
            store.read(&mut ctx, 0, &mut all).unwrap_or_else(|e| panic!("kill {k}: after GC: {e}"));
            for index in 0..PAGES {
                let got = &all[index as usize * PAGE..][..PAGE];
                assert!(got == content(model.get(&index).copied().flatten(), index), "kill {k}: page {index} after GC");
            }
        }
        drop(ctx);
        leave(store);
        checking += started.elapsed();
    }
    eprintln!(
        "  {kills} kills: {total_ops} writes and discards acknowledged, {in_flight} in flight at a kill, \
         {undone} entry changes undone, {freed} orphaned objects freed, up to {recompressed} recompressed pages \
         and {dicts} dictionaries taken over, recovery at most {:.1} ms; {:.1} s in all, {:.1} s of it the parent's checks",
        max_recovery.as_secs_f64() * 1000.0,
        whole.elapsed().as_secs_f64(),
        checking.as_secs_f64()
    );
    if let Mode::Backing(_) = mode {
        eprintln!(
            "  backing file: up to {on_device} pages on the device at a takeover; the children overflowed {}, wrote back {}, \
             moved by GC {} and promoted {} pages",
            tier[0], tier[1], tier[2], tier[3]
        );
        if kills >= 100 {
            assert!(on_device > 0 && tier.iter().all(|&t| t > 0), "the children used the device every way before the kills: {tier:?}");
        }
    } else if let Mode::Cold = mode {
        eprintln!(
            "  cold tier: up to {on_device} pages in it at a takeover, {cold_mem} bytes of its memory; the children wrote back {}, \
             moved by GC {} and promoted {} pages, in {} writes to the tier; {cold_cut} kills came inside a block's write, which recovery undid",
            tier[1], tier[2], tier[3], tier[4]
        );
        if kills >= 100 {
            assert!(on_device > 0 && tier[1] > 0 && tier[2] > 0 && tier[4] > 0, "the children used the tier before the kills: {tier:?}");
            assert!(cold_cut > 0, "some kills came inside a block's write");
        }
    } else if kills >= 100 {
        assert!(recompressed > 0 && dicts > 0, "the children recompressed and trained dictionaries before a kill");
    }
}

fn backing_a_successor_serves_every_page_and_the_same_gauges() {
    for encrypt in [true, false] {
        let dir = TempDir::new("takeover-clean");
        let cfg = backing_config(&dir.file(), encrypt);
        let store = Store::new(cfg.clone()).unwrap();
        let mut ctx = store.context();
        let kinds = [Kind::Text, Kind::Random, Kind::Same, Kind::Zero, Kind::Mixed];
        for i in 0..PAGES {
            store.write_page(&mut ctx, i, &page(kinds[i as usize % 5], i, 1)).unwrap();
        }
        for i in (0..PAGES).step_by(3) {
            store.discard_page(i);
        }
        store.advance_clock(60);
        store.writeback_idle(30, WritebackBudget { max_bytes: u64::MAX });
        store.gc(u64::MAX);
        let before = store.stats();
        assert!(before.bd_count > 0 && before.bd_overflow_pages > 0, "pages overflowed and were written back: {before:?}");
        let fd = dup(&store);
        drop(ctx);
        store.hand_over();
        drop(store);
        let (store, report) = Store::recover(cfg.clone(), fd).unwrap();
        assert_eq!((report.lost_pages, report.backing_pages), (0, before.bd_count), "{report}");
        let after = store.stats();
        assert_eq!(
            (after.pages_stored, after.compr_data_size, after.same_pages, after.bd_count, after.bd_bytes, after.mem_used_total),
            (before.pages_stored, before.compr_data_size, before.same_pages, before.bd_count, before.bd_bytes, before.mem_used_total)
        );
        assert!(after.bd_space_bytes <= before.bd_space_bytes, "no segment more in use than before");
        let mut ctx = store.context();
        let mut out = vec![0u8; PAGE];
        for i in 0..PAGES {
            store.read_page(&mut ctx, i, &mut out).unwrap();
            let want = if i % 3 == 0 { vec![0u8; PAGE] } else { page(kinds[i as usize % 5], i, 1) };
            assert!(out == want, "page {i} (encrypt {encrypt})");
        }
        // It goes on as a store does: overflow, writeback and GC on the taken-over device.
        for i in 0..PAGES {
            store.write_page(&mut ctx, i, &page(Kind::Text, i, 2)).unwrap();
        }
        store.advance_clock(60);
        store.writeback_idle(30, WritebackBudget { max_bytes: u64::MAX });
        store.gc(u64::MAX);
        check_every_page(&store, |i| page(Kind::Text, i, 2), "after rewriting");
        assert_eq!(store.stats().bd_errors, 0);
    }
}

fn backing_a_successor_refuses_another_device() {
    let dir = TempDir::new("takeover-refuse");
    let cfg = backing_config(&dir.file(), true);
    let store = Store::new(cfg.clone()).unwrap();
    let mut ctx = store.context();
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap();
    }
    assert!(store.stats().bd_count > 0);
    let fd = dup(&store);
    drop(ctx);
    store.hand_over();
    drop(store);
    let err = |cfg: Config| Store::recover(cfg, fd.try_clone().unwrap()).err().expect("refused").to_string();
    // Another file, of the same size.
    let other = dir.path().join("other.img");
    drop(Store::new(backing_config(&other, true)).unwrap());
    let e = err(backing_config(&other, true));
    assert!(e.contains("other.img") && e.contains("records are on file"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    // Another segment size; no backing device at all.
    let mut c = cfg.clone();
    c.backing.as_mut().unwrap().segment_bytes = 128 << 10;
    assert!(err(c).contains("segments of 65536 bytes"));
    assert!(err(config()).contains("with a backing device"));
    // The file resized.
    let f = std::fs::OpenOptions::new().write(true).open(dir.file()).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len + (1 << 20)).unwrap();
    let e = err(cfg.clone());
    assert!(e.contains("usable bytes") && e.contains("resized"), "{e}");
    f.set_len(len).unwrap();
    // Refusals touched nothing: the right file is taken over, every page there.
    let (store, report) = Store::recover(cfg.clone(), fd.try_clone().unwrap()).unwrap();
    assert_eq!(report.lost_pages, 0, "{report}");
    check_every_page(&store, |i| page(Kind::Text, i, 1), "after the takeover");
    // A successor whose start is refused later (`abandon_backing`) leaves the records for the
    // next try.
    store.abandon_backing();
    drop(store);
    let (store, report) = Store::recover(cfg.clone(), fd.try_clone().unwrap()).unwrap();
    assert_eq!(report.lost_pages, 0, "{report}");
    let mut ctx = store.context();
    let mut out = vec![0u8; PAGE];
    store.read_page(&mut ctx, 5, &mut out).unwrap();
    assert!(out == page(Kind::Text, 5, 1));
    // A server that stops closes the device (its data area discarded): no successor then.
    drop(ctx);
    drop(store);
    let e = err(cfg);
    assert!(e.contains("closed by its server"), "{e}");
    // A device given as an object cannot be opened again by a successor.
    let d = compcache_store::testing::TestDevice::file(&other, compcache_store::DeviceOptions::default()).unwrap();
    let s = Store::with_backing_device(backing_config(&other, true), Box::new(d)).unwrap();
    assert!(s.state_fd().is_none());
}

/// A block device (`COMPCACHE_TAKEOVER_BLOCKDEV=/dev/loopN`, whose contents are destroyed;
/// skipped without it, as making one needs root): taken over by its device number, not
/// discarded, every page served; another device is refused.
fn backing_block_device() {
    let Ok(dev) = std::env::var("COMPCACHE_TAKEOVER_BLOCKDEV") else {
        eprintln!("  skipped: set COMPCACHE_TAKEOVER_BLOCKDEV to a block device whose contents may be destroyed");
        return;
    };
    let cfg = {
        let mut c = backing_config(std::path::Path::new(&dev), true);
        c.backing.as_mut().unwrap().size_bytes = 0; // the whole device
        c
    };
    let store = Store::new(cfg.clone()).unwrap();
    let mut ctx = store.context();
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap();
    }
    store.advance_clock(60);
    store.writeback_idle(30, WritebackBudget { max_bytes: u64::MAX });
    let before = store.stats();
    assert!(before.bd_count > 0, "{before:?}");
    let fd = dup(&store);
    drop(ctx);
    store.hand_over();
    drop(store);
    let (store, report) = Store::recover(cfg.clone(), fd.try_clone().unwrap()).unwrap();
    assert_eq!((report.lost_pages, report.backing_pages), (0, before.bd_count), "{report}");
    check_every_page(&store, |i| page(Kind::Text, i, 1), "after the takeover");
    store.hand_over();
    drop(store);
    let dir = TempDir::new("takeover-blockdev");
    drop(Store::new(backing_config(&dir.file(), true)).unwrap());
    let e = Store::recover(backing_config(&dir.file(), true), fd).err().unwrap().to_string();
    assert!(e.contains("records are on block device"), "{e}");
}

fn cold_killed_at_random() {
    kill_loop(Mode::Cold, 300);
}

/// The cold tier handed over cleanly: every page, the same gauges, the tier's memory counted
/// the same; and the successor goes on (writeback, GC, rewrites).
fn cold_a_successor_serves_every_page_and_the_same_gauges() {
    let cfg = cold_config();
    let store = Store::new(cfg.clone()).unwrap();
    assert!(store.state_fd().is_some(), "the cold tier's blocks are in the state file");
    let mut ctx = store.context();
    let kinds = [Kind::Text, Kind::Random, Kind::Same, Kind::Zero, Kind::Mixed];
    for i in 0..PAGES {
        // Idle writeback makes room as the pool fills (requests never go to the tier).
        while store.write_page(&mut ctx, i, &page(kinds[i as usize % 5], i, 1)).is_err() {
            store.advance_clock(60);
            store.writeback_idle(30, WritebackBudget { max_bytes: 1 << 20 });
        }
    }
    for i in (0..PAGES).step_by(3) {
        store.discard_page(i);
    }
    store.advance_clock(60);
    store.writeback_idle(30, WritebackBudget { max_bytes: u64::MAX });
    store.gc(u64::MAX);
    let before = store.stats();
    assert!(before.bd_count > PAGES / 4, "most pages went cold: {before:?}");
    let fd = dup(&store);
    drop(ctx);
    store.hand_over();
    drop(store);
    let (store, report) = Store::recover(cfg.clone(), fd).unwrap();
    assert_eq!((report.lost_pages, report.backing_pages), (0, before.bd_count), "{report}");
    let after = store.stats();
    assert_eq!(
        (after.pages_stored, after.compr_data_size, after.same_pages, after.bd_count, after.bd_bytes),
        (before.pages_stored, before.compr_data_size, before.same_pages, before.bd_count, before.bd_bytes)
    );
    // The blobs, table and dictionary are counted the same; the dead writer's buffers are not.
    assert!(after.bd_mem_bytes <= before.bd_mem_bytes && after.bd_mem_bytes > before.bd_mem_bytes / 2, "{after:?} {before:?}");
    let mut ctx = store.context();
    let mut out = vec![0u8; PAGE];
    for i in 0..PAGES {
        store.read_page(&mut ctx, i, &mut out).unwrap();
        let want = if i % 3 == 0 { vec![0u8; PAGE] } else { page(kinds[i as usize % 5], i, 1) };
        assert!(out == want, "page {i}");
    }
    for i in 0..PAGES {
        while store.write_page(&mut ctx, i, &page(Kind::Text, i, 2)).is_err() {
            store.advance_clock(60);
            store.writeback_idle(30, WritebackBudget { max_bytes: 1 << 20 });
        }
    }
    store.advance_clock(60);
    store.writeback_idle(30, WritebackBudget { max_bytes: u64::MAX });
    store.gc(u64::MAX);
    check_every_page(&store, |i| page(Kind::Text, i, 2), "after rewriting");
    assert_eq!(store.stats().bd_errors, 0);
    // A server that stops discards the tier: no successor then.
    let fd = dup(&store);
    drop(ctx);
    drop(store);
    let e = Store::recover(cfg, fd).err().expect("refused").to_string();
    assert!(e.contains("closed by its server"), "{e}");
}

/// A cold tier's state file is refused by a configuration with another tier or another size,
/// in one line, and taken over afterwards: the refusals changed nothing.
fn cold_a_successor_refuses_another_tier() {
    let cfg = cold_config();
    let store = Store::new(cfg.clone()).unwrap();
    let mut ctx = store.context();
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap();
        if i % 256 == 255 {
            store.advance_clock(60);
            store.writeback_idle(30, WritebackBudget { max_bytes: u64::MAX });
        }
    }
    assert!(store.stats().bd_count > 0);
    let fd = dup(&store);
    drop(ctx);
    store.hand_over();
    drop(store);
    let err = |cfg: Config| Store::recover(cfg, fd.try_clone().unwrap()).err().expect("refused").to_string();
    let dir = TempDir::new("takeover-cold");
    let e = err(backing_config(&dir.file(), false));
    assert!(e.contains("is the cold tier") && !e.contains('\n'), "{e}");
    assert!(err(config()).contains("with a backing device"));
    let mut other = cfg.clone();
    other.backing.as_mut().unwrap().size_bytes = 64 << 20;
    let e = err(other);
    assert!(e.contains("cannot take the device over"), "{e}");
    let (store, report) = Store::recover(cfg.clone(), fd.try_clone().unwrap()).unwrap();
    assert_eq!(report.lost_pages, 0, "{report}");
    check_every_page(&store, |i| page(Kind::Text, i, 1), "after the refusals");
    // And a file's state file is refused by a cold configuration.
    store.hand_over();
    drop(store);
    let fstore = Store::new(backing_config(&dir.file(), false)).unwrap();
    let e = Store::recover(cfg, dup(&fstore)).err().expect("refused").to_string();
    assert!(e.contains("a file or block device, the configuration has the cold tier"), "{e}");
}
