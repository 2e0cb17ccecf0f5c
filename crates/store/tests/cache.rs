//! Cache mode (`cache/`): the store in front of an origin image.
//!
//! - a property model: random reads, writes, partial writes, discards, write-zeroes and
//!   flushes, with origin faults switched on and off, against a byte array of the origin,
//!   under a budget small enough that eviction runs all the time: every read equals the
//!   model, a failed read is an error (never data), the origin file equals the model after
//!   every flush; and the same with recompression (on by default in the CLI) re-encoding
//!   cached pages between the requests, dictionary training included;
//! - fault injection case by case (EIO on read, write, sync, discard; short reads);
//! - threads reading and writing overlapping pages, then every page equals the origin;
//! - scan resistance, readahead, same-filled pages, block status, and the origin checks at
//!   open (exclusive use, size, symbolic links).

mod common;

use common::{page, Kind, PAGE};
use compcache_store::testing::{FaultyOrigin, OriginFaults, TempDir};
use compcache_store::{Config, DictSource, Extent, FileOrigin, OriginConfig, RecompressConfig, Store, StoreError};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

const P: u64 = PAGE as u64;

/// An image of `pages` pages holding `init` (zero-padded) in `dir`.
fn image(dir: &TempDir, pages: u64, init: &[u8]) -> PathBuf {
    let path = dir.path().join("origin.img");
    let mut v = init.to_vec();
    v.resize((pages * P) as usize, 0);
    std::fs::write(&path, v).unwrap();
    path
}

fn config(pages: u64, budget_pages: u64, path: &Path, readahead_max_bytes: u64) -> Config {
    let mut o = OriginConfig::new(path);
    o.readahead_max_bytes = readahead_max_bytes;
    Config { mem_limit_bytes: budget_pages * P, origin: Some(o), ..Config::with_disksize(pages * P) }
}

/// A cache store over a faulty origin on the image at `path`, and its fault switches.
fn faulty_store(cfg: Config, path: &Path) -> (Store, Arc<OriginFaults>) {
    let origin = FaultyOrigin::file(path).unwrap();
    let faults = origin.faults();
    (Store::with_origin(cfg, Box::new(origin)).unwrap(), faults)
}

/// Pages of varied kinds: text, noise, half noise, same-filled, zero.
fn varied(pages: u64, version: u64) -> Vec<u8> {
    let kinds = [Kind::Text, Kind::Random, Kind::Mixed, Kind::Same, Kind::Zero, Kind::Text];
    (0..pages).flat_map(|i| page(kinds[(i % 6) as usize], i, version)).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        index: u64,
        pages: u64,
        kind: Kind,
        version: u64,
    },
    Partial {
        offset: u64,
        len: usize,
        byte: u8,
    },
    Discard {
        offset: u64,
        len: u64,
    },
    Zeroes {
        offset: u64,
        len: u64,
    },
    Read {
        offset: u64,
        len: usize,
    },
    Flush,
    /// Switch one fault on (0: reads, 1: short reads, 2: writes, 3: syncs, 4: discards).
    Fault(u8),
    Heal,
    /// Recompress every cached page that qualifies, now (a no-op without recompression).
    Recompress,
}

const PAGES: u64 = 48;

fn op() -> impl Strategy<Value = Op> {
    let size = PAGES * P;
    prop_oneof![
        6 => (0..PAGES, 1..4u64, common::kind_strategy(), 0..1000u64)
            .prop_map(|(index, pages, kind, version)| Op::Write { index, pages: pages.min(PAGES - index), kind, version }),
        3 => (0..size - 1, 1..3 * PAGE, any::<u8>()).prop_map(move |(offset, len, byte)| Op::Partial { offset, len: len.min((size - offset) as usize), byte }),
        2 => (0..size, 1..6 * P).prop_map(move |(offset, len)| Op::Discard { offset, len: len.min(size - offset) }),
        2 => (0..size, 1..6 * P).prop_map(move |(offset, len)| Op::Zeroes { offset, len: len.min(size - offset) }),
        8 => (0..size - 1, 1..8 * PAGE).prop_map(move |(offset, len)| Op::Read { offset, len: len.min((size - offset) as usize) }),
        2 => Just(Op::Flush),
        1 => (0..5u8).prop_map(Op::Fault),
        2 => Just(Op::Heal),
        2 => Just(Op::Recompress),
    ]
}

fn set_fault(f: &OriginFaults, which: u8, on: bool) {
    [&f.fail_reads, &f.short_reads, &f.fail_writes, &f.fail_syncs, &f.fail_discards][which as usize].store(on, Relaxed);
}

/// Recompression as the model runs it: every page idle at once, and a dictionary trained on
/// 18 sampled pages (the device has only 48), so that `Op::Recompress` re-encodes cached pages
/// with and without a dictionary while eviction and writes replace them.
fn recompression() -> RecompressConfig {
    RecompressConfig { idle_secs: 0, dict: DictSource::Train, dict_samples: 18, min_dict_gain_permille: 0, ..RecompressConfig::default() }
}

fn check_model(ops: Vec<Op>, budget_pages: u64, readahead: u64, recompress: bool) -> Result<(), TestCaseError> {
    let dir = TempDir::new("cache-model");
    let init = varied(PAGES, 1);
    let path = image(&dir, PAGES, &init);
    let cfg = Config { recompress: recompress.then(recompression), ..config(PAGES, budget_pages, &path, readahead) };
    let (store, faults) = faulty_store(cfg, &path);
    let mut ctx = store.context();
    let mut model = init;
    let mut faulty = [false; 5];
    for op in ops {
        let file = |off: u64, len: usize| std::fs::read(&path).unwrap()[off as usize..][..len].to_vec();
        match op {
            Op::Write { index, pages, kind, version } => {
                let data: Vec<u8> = (index..index + pages).flat_map(|i| page(kind, i, version)).collect();
                let (off, len) = (index * P, data.len());
                match store.write(&mut ctx, off, &data) {
                    Ok(()) => model[off as usize..][..len].copy_from_slice(&data),
                    Err(e) => {
                        prop_assert!(faulty[2] || faulty[0] || faulty[1], "write failed without a fault: {e}");
                        prop_assert_eq!(e.errno(), libc::EIO);
                        // The origin may hold part of it: the model is what it holds.
                        model[off as usize..][..len].copy_from_slice(&file(off, len));
                    }
                }
            }
            Op::Partial { offset, len, byte } => {
                let data = vec![byte; len];
                match store.write(&mut ctx, offset, &data) {
                    Ok(()) => model[offset as usize..][..len].copy_from_slice(&data),
                    Err(e) => {
                        prop_assert!(faulty[2] || faulty[0] || faulty[1], "write failed without a fault: {e}");
                        let (a, b) = (offset / P * P, (offset + len as u64).div_ceil(P) * P);
                        model[a as usize..b as usize].copy_from_slice(&file(a, (b - a) as usize));
                    }
                }
            }
            Op::Discard { offset, len } => {
                let (a, b) = (offset.div_ceil(P) * P, (offset + len) / P * P);
                match store.discard(offset, len) {
                    Ok(()) if a < b => model[a as usize..b as usize].fill(0),
                    Ok(()) => {}
                    Err(e) => {
                        prop_assert!(faulty[4], "discard failed without a fault: {e}");
                        model[a as usize..b as usize].copy_from_slice(&file(a, (b - a) as usize));
                    }
                }
            }
            Op::Zeroes { offset, len } => match store.write_zeroes(&mut ctx, offset, len) {
                Ok(()) => model[offset as usize..][..len as usize].fill(0),
                Err(e) => {
                    prop_assert!(faulty.iter().any(|&f| f), "write-zeroes failed without a fault: {e}");
                    let (a, b) = (offset / P * P, (offset + len).div_ceil(P) * P);
                    model[a as usize..b as usize].copy_from_slice(&file(a, (b - a) as usize));
                }
            },
            Op::Read { offset, len } => {
                let mut buf = vec![0u8; len];
                match store.read(&mut ctx, offset, &mut buf) {
                    Ok(()) => prop_assert!(buf == model[offset as usize..][..len], "read at {offset} len {len} differs from the model"),
                    Err(e) => {
                        prop_assert!(faulty[0] || faulty[1], "read failed without a fault: {e}");
                        prop_assert_eq!(e.errno(), libc::EIO);
                    }
                }
            }
            Op::Flush => match store.flush() {
                Ok(()) => prop_assert!(std::fs::read(&path).unwrap() == model, "the origin differs from the model after a flush"),
                Err(e) => prop_assert!(faulty[3], "flush failed without a fault: {e}"),
            },
            Op::Fault(k) => {
                faulty[k as usize] = true;
                set_fault(&faults, k, true);
            }
            Op::Heal => {
                faulty = [false; 5];
                (0..5).for_each(|k| set_fault(&faults, k, false));
            }
            Op::Recompress => {
                store.recompress(Duration::from_millis(200));
            }
        }
        let s = store.stats();
        prop_assert!(s.mem_used_total <= budget_pages * P, "pool {} above the budget", s.mem_used_total);
        prop_assert_eq!(s.origin_syncs, faults.syncs.load(Relaxed), "origin_syncs counts the origin's successful syncs");
    }
    (0..5).for_each(|k| set_fault(&faults, k, false));
    // After the faults clear, everything reads as the model, and the origin is the model.
    let mut all = vec![0u8; model.len()];
    store.read(&mut ctx, 0, &mut all).unwrap();
    prop_assert!(all == model, "final read differs from the model");
    store.flush().unwrap();
    prop_assert!(std::fs::read(&path).unwrap() == model);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_cache_matches_a_model_of_its_origin(ops in prop::collection::vec(op(), 1..120)) {
        // 8 pages of budget for 48 pages of origin: eviction runs all the time.
        check_model(ops, 8, 64 << 10, false)?;
    }

    #[test]
    fn the_cache_matches_the_model_without_readahead_and_with_room(ops in prop::collection::vec(op(), 1..80)) {
        check_model(ops, 64, 0, false)?;
    }

    #[test]
    fn the_cache_matches_the_model_with_recompression_running(ops in prop::collection::vec(op(), 1..120)) {
        // Tight (eviction all the time) and roomy (recompressed pages stay) in turn.
        check_model(ops.clone(), 8, 64 << 10, true)?;
        check_model(ops, 64, 0, true)?;
    }
}

/// The model above with recompression can only pass if recompression ran: here it does, on
/// cached text pages, and they read back, are rewritten and are evicted like any others.
#[test]
fn recompressed_cached_pages_read_back_and_leave_like_any_others() {
    let dir = TempDir::new("cache-recompress");
    let init: Vec<u8> = (0..PAGES).flat_map(|i| page(Kind::Text, i, 1)).collect();
    let path = image(&dir, PAGES, &init);
    let cfg = Config { recompress: Some(recompression()), ..config(PAGES, 24, &path, 0) };
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    let mut buf = vec![0u8; (16 * P) as usize];
    store.read(&mut ctx, 0, &mut buf).unwrap();
    // The first call trains (one pass of samples), the next ones re-encode.
    for _ in 0..4 {
        store.recompress(Duration::from_secs(1));
    }
    let st = store.stats();
    assert!(st.recomp_pages > 0 && st.recomp_dict_pages > 0, "nothing recompressed with a dictionary: {st:?}");
    assert!(st.mem_used_total <= 24 * P);
    buf.fill(0xEE);
    store.read(&mut ctx, 0, &mut buf).unwrap();
    assert!(buf == init[..buf.len()], "recompressed cached pages read back wrong");
    // A write replaces a recompressed page (through to the origin); reading the rest of the
    // origin evicts the others.
    let new = page(Kind::Text, 3, 2);
    store.write(&mut ctx, 3 * P, &new).unwrap();
    let mut all = vec![0u8; (PAGES * P) as usize];
    store.read(&mut ctx, 0, &mut all).unwrap();
    let mut want = init.clone();
    want[(3 * P) as usize..][..PAGE].copy_from_slice(&new);
    assert!(all == want);
    let st = store.stats();
    assert!(st.cache_evictions > 0, "the cache evicted nothing: {st:?}");
    assert!(st.recomp_pages <= st.pages_stored);
    store.flush().unwrap();
    assert!(std::fs::read(&path).unwrap() == want, "the origin differs");
}

#[test]
fn an_origin_read_error_is_an_error_never_data_and_caches_nothing() {
    let dir = TempDir::new("cache-eio");
    let init = varied(16, 1);
    let path = image(&dir, 16, &init);
    let (store, faults) = faulty_store(config(16, 64, &path, 0), &path);
    let mut ctx = store.context();
    for flag in [&faults.fail_reads, &faults.short_reads] {
        flag.store(true, Relaxed);
        let mut buf = vec![0u8; 4 * PAGE];
        let e = store.read(&mut ctx, 0, &mut buf).unwrap_err();
        assert!(matches!(e, StoreError::Origin { op: "read", .. }), "{e}");
        assert_eq!(e.errno(), libc::EIO);
        assert_eq!(store.stats().cache_inserts, 0, "nothing read from a failed origin read is cached");
        flag.store(false, Relaxed);
    }
    let s = store.stats();
    assert_eq!((s.origin_errors, s.failed_reads), (2, 2));
    let mut buf = vec![0u8; 16 * PAGE];
    store.read(&mut ctx, 0, &mut buf).unwrap();
    assert_eq!(buf, init, "after the fault clears, the origin's data");
}

#[test]
fn a_failed_origin_write_fails_the_request_and_leaves_nothing_stale() {
    let dir = TempDir::new("cache-wfail");
    let init = varied(16, 1);
    let path = image(&dir, 16, &init);
    let (store, faults) = faulty_store(config(16, 64, &path, 0), &path);
    let mut ctx = store.context();
    let mut buf = vec![0u8; 16 * PAGE];
    store.read(&mut ctx, 0, &mut buf).unwrap();
    assert_eq!(store.stats().cache_inserts, 16, "all cached");
    // A torn write: the injected fault writes the first page, then fails.
    faults.fail_writes.store(true, Relaxed);
    let new = varied(4, 2);
    let e = store.write(&mut ctx, 4 * P, &new).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    faults.fail_writes.store(false, Relaxed);
    let file = std::fs::read(&path).unwrap();
    assert_eq!(file[4 * PAGE..5 * PAGE], new[..PAGE], "the origin got the first page");
    assert_eq!(file[5 * PAGE..8 * PAGE], init[5 * PAGE..8 * PAGE]);
    store.read(&mut ctx, 0, &mut buf).unwrap();
    assert_eq!(buf, file, "the cache serves what the origin holds, not the old page");
    // A partial write whose read-modify-write fails to read the page does nothing.
    store.discard(0, 16 * P).unwrap();
    faults.fail_reads.store(true, Relaxed);
    assert_eq!(store.write(&mut ctx, 100, b"xyz").unwrap_err().errno(), libc::EIO);
    faults.fail_reads.store(false, Relaxed);
    let s = store.stats();
    assert_eq!((s.failed_writes, s.origin_errors), (2, 2));
}

#[test]
fn flush_is_the_origins_sync_and_its_error_reaches_the_client() {
    let dir = TempDir::new("cache-sync");
    let path = image(&dir, 4, &[]);
    let (store, faults) = faulty_store(config(4, 16, &path, 0), &path);
    let mut ctx = store.context();
    store.write(&mut ctx, 0, &vec![7u8; PAGE]).unwrap();
    assert_eq!(store.stats().origin_syncs, 0, "a write without FUA does not sync");
    store.flush().unwrap();
    assert_eq!(faults.syncs.load(Relaxed), 1);
    assert_eq!(store.stats().origin_syncs, 1, "the flush reached the origin's sync");
    faults.fail_syncs.store(true, Relaxed);
    let errors = store.stats().origin_errors;
    assert_eq!(store.flush().unwrap_err().errno(), libc::EIO);
    assert_eq!((store.stats().origin_syncs, store.stats().origin_errors), (1, errors + 1), "a failed sync is an error, not a sync");
    faults.fail_syncs.store(false, Relaxed);
    let mut p = vec![0u8; PAGE];
    store.read(&mut ctx, 0, &mut p).unwrap();
    assert_eq!(p, vec![7u8; PAGE]);
    // Without an origin, flush stays a no-op.
    Store::new(Config::with_disksize(4 * P)).unwrap().flush().unwrap();
}

#[test]
fn a_failed_discard_drops_the_cached_pages_and_fails() {
    let dir = TempDir::new("cache-dfail");
    let init = varied(8, 1);
    let path = image(&dir, 8, &init);
    let (store, faults) = faulty_store(config(8, 64, &path, 0), &path);
    let mut ctx = store.context();
    let mut buf = vec![0u8; 8 * PAGE];
    store.read(&mut ctx, 0, &mut buf).unwrap();
    faults.fail_discards.store(true, Relaxed);
    assert_eq!(store.discard(0, 8 * P).unwrap_err().errno(), libc::EIO);
    assert_eq!(store.write_zeroes(&mut ctx, 0, 8 * P).unwrap_err().errno(), libc::EIO);
    faults.fail_discards.store(false, Relaxed);
    let s = store.stats();
    assert_eq!(s.orig_data_size, 0, "dropped");
    store.read(&mut ctx, 0, &mut buf).unwrap();
    assert_eq!(buf, init);
}

#[test]
fn threads_on_overlapping_pages_leave_every_cached_page_equal_to_the_origin() {
    const N: u64 = 64;
    let dir = TempDir::new("cache-threads");
    let path = image(&dir, N, &varied(N, 1));
    // A budget of 12 pages: eviction runs while the threads race.
    let store = Arc::new(Store::new(config(N, 12, &path, 64 << 10)).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut ctx = store.context();
                let mut rng = common::xorshift(t + 1);
                let mut buf = vec![0u8; 8 * PAGE];
                for k in 0..3000u64 {
                    let r = rng();
                    // Overlapping ranges of 1..8 pages, in the first 24 pages mostly.
                    let first = r % if k % 4 == 0 { N - 8 } else { 24 };
                    let pages = 1 + (r >> 8) % 8;
                    match (r >> 16) % 6 {
                        0 | 1 => {
                            let data: Vec<u8> = (first..first + pages).flat_map(|i| page(common::kind_of(k), i, k * 4 + t)).collect();
                            store.write(&mut ctx, first * P, &data).unwrap();
                        }
                        2 => {
                            let off = first * P + (r >> 24) % P;
                            store.write(&mut ctx, off, &vec![(r >> 32) as u8; (r >> 40) as usize % (2 * PAGE) + 1]).unwrap();
                        }
                        3 => store.write_zeroes(&mut ctx, first * P + (r >> 24) % 100, pages * P).unwrap(),
                        _ => store.read(&mut ctx, first * P, &mut buf[..(pages * P) as usize]).unwrap(),
                    }
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let mut ctx = store.context();
    let s0 = store.stats();
    let mut all = vec![0u8; (N * P) as usize];
    store.read(&mut ctx, 0, &mut all).unwrap();
    let s1 = store.stats();
    assert!(s1.cache_hits > s0.cache_hits, "some pages were cached (and read from the cache)");
    let file = std::fs::read(&path).unwrap();
    for i in 0..N as usize {
        assert!(all[i * PAGE..][..PAGE] == file[i * PAGE..][..PAGE], "page {i} differs from the origin");
    }
    assert!(s1.cache_evictions > 0, "the budget made the cache evict");
}

#[test]
fn a_long_sequential_read_passes_through_and_leaves_the_hot_set_cached() {
    const N: u64 = 4096;
    const HOT: u64 = 64;
    let dir = TempDir::new("cache-scan");
    // Hot pages compress (text); the scanned ones are noise (one pool page each).
    let data: Vec<u8> = (0..N).flat_map(|i| page(if i < HOT { Kind::Text } else { Kind::Random }, i, 1)).collect();
    let path = image(&dir, N, &data);
    // 1 MiB of budget: the hot set fits, the scan (15.75 MiB) is 63 times the budget.
    let store = Store::new(config(N, 256, &path, 1 << 20)).unwrap();
    let mut ctx = store.context();
    let mut buf = vec![0u8; (HOT * P) as usize];
    for _ in 0..2 {
        store.read(&mut ctx, 0, &mut buf).unwrap();
    }
    let mut chunk = vec![0u8; 128 << 10];
    for off in (HOT * P..N * P).step_by(chunk.len()) {
        store.read(&mut ctx, off, &mut chunk).unwrap();
        assert!(chunk == data[off as usize..][..chunk.len()]);
    }
    let before = store.stats();
    assert!(before.cache_evictions > N - HOT - 256, "the scan went through the cache: {} evictions", before.cache_evictions);
    store.read(&mut ctx, 0, &mut buf).unwrap();
    assert_eq!(buf, data[..buf.len()]);
    let after = store.stats();
    assert_eq!(after.cache_hits - before.cache_hits, HOT, "every hot page is still cached");
    assert_eq!(after.origin_reads, before.origin_reads);
    assert!(after.mem_used_total <= 256 * P);
}

#[test]
fn sequential_reads_read_ahead_and_random_ones_do_not() {
    const N: u64 = 1024;
    let dir = TempDir::new("cache-ra");
    let data = varied(N, 3);
    let path = image(&dir, N, &data);
    let store = Store::new(config(N, 4096, &path, 256 << 10)).unwrap();
    let mut ctx = store.context();
    let mut p = vec![0u8; PAGE];
    // Random: a stride that never lands next to an earlier miss.
    for k in 0..200u64 {
        let i = (k * 389) % N;
        store.read(&mut ctx, i * P, &mut p).unwrap();
        assert!(p == data[(i * P) as usize..][..PAGE]);
    }
    let s = store.stats();
    assert_eq!((s.readahead_pages, s.readahead_used, s.origin_reads), (0, 0, 200), "no readahead for random reads");
    // A new cache (the image is free once the first store is gone), read from start to end.
    drop(store);
    let store = Store::new(config(N, 4096, &path, 256 << 10)).unwrap();
    let mut ctx = store.context();
    let before = store.stats();
    for i in 0..N {
        store.read(&mut ctx, i * P, &mut p).unwrap();
        assert!(p == data[(i * P) as usize..][..PAGE], "page {i}");
    }
    let s = store.stats();
    let reads = s.origin_reads - before.origin_reads;
    assert!(s.readahead_used > N / 2, "readahead served the sequential reader: {}", s.readahead_used);
    assert!(reads < N / 16, "{reads} origin reads for {N} sequential pages");
    assert_eq!(s.cache_hits - before.cache_hits + s.cache_misses - before.cache_misses, N);
}

#[test]
fn same_filled_pages_cost_no_pool_memory() {
    const N: u64 = 64;
    let dir = TempDir::new("cache-same");
    let data: Vec<u8> = (0..N).flat_map(|i| page(if i % 2 == 0 { Kind::Zero } else { Kind::Same }, i, 5)).collect();
    let path = image(&dir, N, &data);
    let store = Store::new(config(N, 16, &path, 0)).unwrap();
    let mut ctx = store.context();
    let mut buf = vec![0u8; (N * P) as usize];
    for _ in 0..2 {
        store.read(&mut ctx, 0, &mut buf).unwrap();
        assert_eq!(buf, data);
    }
    store.write_zeroes(&mut ctx, 0, 8 * P).unwrap();
    let s = store.stats();
    assert_eq!((s.mem_used_total, s.compr_data_size, s.same_pages, s.cache_hits), (0, 0, N, N));
    assert_eq!(s.orig_data_size, N * P, "cached all the same");
}

#[test]
fn block_status_reports_the_origins_holes() {
    let dir = TempDir::new("cache-bs");
    let path = dir.path().join("sparse.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(1 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 8192], 256 << 10).unwrap();
    drop(f);
    let store = Store::new(config(256, 16, &path, 0)).unwrap();
    let extents: Vec<Extent> = store.block_status(0, 1 << 20).unwrap().collect();
    assert_eq!(extents.iter().map(|e| e.len_bytes).sum::<u64>(), 1 << 20);
    assert!(extents.iter().any(|e| e.allocation == compcache_store::Allocation::Hole), "{extents:?}");
    let data_at = extents.iter().scan(0u64, |pos, e| {
        let start = *pos;
        *pos += e.len_bytes;
        Some((start, *e))
    });
    assert!(data_at.into_iter().any(|(start, e)| e.allocation == compcache_store::Allocation::Data
        && start <= 256 << 10
        && start + e.len_bytes >= (256 << 10) + 8192));
}

#[test]
fn an_origin_is_used_exclusively() {
    let dir = TempDir::new("cache-excl");
    let path = image(&dir, 4, &[]);
    let first = FileOrigin::open(&path).unwrap();
    let e = FileOrigin::open(&path).err().unwrap().to_string();
    assert!(e.contains("is in use by another process"), "{e}");
    let e = Store::new(config(4, 16, &path, 0)).err().unwrap().to_string();
    assert!(e.contains("in use"), "{e}");
    drop(first);
    assert!(Store::new(config(4, 16, &path, 0)).unwrap().is_cache());
    assert!(!Store::new(Config::with_disksize(4 * P)).unwrap().is_cache());
}

#[test]
fn wrong_origins_are_refused_with_one_clear_line() {
    let dir = TempDir::new("cache-wrong");
    let odd = dir.path().join("odd.img");
    std::fs::write(&odd, vec![0u8; 5000]).unwrap();
    let e = compcache_store::cache::origin_size(&odd).unwrap_err().to_string();
    assert!(e.contains("is 5000 bytes, not a non-zero multiple of 4096"), "{e}");
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    assert!(FileOrigin::open(&empty).err().unwrap().to_string().contains("is 0 bytes"));
    let good = image(&dir, 4, &[]);
    assert_eq!(compcache_store::cache::origin_size(&good).unwrap(), 4 * P);
    let link = dir.path().join("link.img");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let e = FileOrigin::open(&link).err().unwrap().to_string();
    assert!(e.contains("is a symbolic link"), "{e}");
    assert!(compcache_store::cache::origin_size(&link).unwrap_err().to_string().contains("symbolic link"));
    let e = FileOrigin::open(&dir.path().join("missing.img")).err().unwrap().to_string();
    assert!(e.contains("does not exist"), "{e}");
    let e = Store::new(config(8, 16, &good, 0)).err().unwrap().to_string();
    assert!(e.contains("is 16384 bytes but the device size is 32768 bytes"), "{e}");
    let mut both = config(4, 16, &good, 0);
    both.backing = Some(compcache_store::BackingConfig::new(dir.path().join("b")));
    assert!(Store::new(both).err().unwrap().to_string().contains("--origin and --backing cannot be combined"));
    assert!(!e.contains('\n'), "one line: {e}");
}

#[test]
fn without_an_origin_the_cache_statistics_stay_zero() {
    let store = Store::new(Config::with_disksize(16 * P)).unwrap();
    let mut ctx = store.context();
    store.write(&mut ctx, 0, &page(Kind::Text, 0, 1)).unwrap();
    let mut p = vec![0u8; PAGE];
    store.read(&mut ctx, 0, &mut p).unwrap();
    store.flush().unwrap();
    let s = store.stats();
    assert_eq!((s.cache_hits, s.cache_misses, s.cache_inserts, s.origin_reads, s.origin_writes, s.origin_syncs), (0, 0, 0, 0, 0, 0));
    assert_eq!(s.cache_hit_ratio(), None);
}
