//! Recompression (`recompress/`): with pages re-encoded in the background (and dictionaries
//! trained, installed, retired) between and during requests, every read still returns exactly
//! what was written, the statistics follow, and a dictionary is never freed while a page or a
//! read uses it.

mod common;

use common::model::{recompress_op, Model, Op};
use common::stress::{self, Extra, Stress};
use common::PAGE;
use compcache_store::testing::TempDir;
use compcache_store::{BackingConfig, Config, DictSource, RecompressConfig, RecompressTuning, Store, StoreError};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// A page of JSON-like records (what heaps of many programs look like): lz4 compresses it,
/// zstd more, zstd with a dictionary trained on its neighbours more still.
fn record_page(i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(PAGE);
    let mut rng = common::xorshift(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while p.len() < PAGE {
        let n = rng();
        let rec =
            format!("{{\"id\":{},\"user\":\"u{:05}\",\"score\":{},\"tags\":[\"a{}\",\"b\"]}},", n % 100_000, n % 977, n % 1000, n % 7);
        p.extend_from_slice(rec.as_bytes());
    }
    p.truncate(PAGE);
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

/// Recompression settings for small tests: pages idle after 5 s (the tests age them with
/// `advance_clock`), dictionaries trained on `samples` pages.
fn rc(samples: usize) -> RecompressConfig {
    RecompressConfig { idle_secs: 5, dict_samples: samples, ..RecompressConfig::default() }
}

fn check_model(cfg: Config, pages: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    let mut m = Model::new(pages);
    for op in ops {
        m.apply(&store, &mut ctx, op)?;
        let s = store.stats();
        let stored = m.stored.iter().filter(|&&b| b).count() as u64;
        prop_assert_eq!(s.orig_data_size, stored * PAGE as u64);
        prop_assert_eq!(s.num_writes, m.writes);
        prop_assert_eq!(s.notify_free, m.notify_free);
        prop_assert!(s.recomp_pages <= s.pages_stored && s.recomp_dict_pages <= s.recomp_pages, "{:?}", s);
        prop_assert!(s.recomp_bytes <= s.compr_data_size + s.bd_bytes, "{:?}", s);
        prop_assert!(s.dicts_live <= 14);
        prop_assert_eq!(s.failed_reads + s.failed_writes, 0);
    }
    for i in 0..pages {
        let mut p = vec![0u8; PAGE];
        store.read_page(&mut ctx, i, &mut p).unwrap();
        prop_assert!(p == m.page(i), "page {i}");
    }
    // Everything discarded: no page is recompressed, and a step frees every dictionary but
    // the current one.
    store.discard(0, pages * PAGE as u64).unwrap();
    store.recompress(Duration::from_secs(1));
    let s = store.stats();
    prop_assert_eq!((s.recomp_pages, s.recomp_bytes, s.mem_used_total, s.bd_count), (0, 0, 0, 0));
    prop_assert!(s.dicts_live <= 1, "{:?}", s);
    Ok(())
}

const PAGES: u64 = 48;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn recompression_matches_the_model(ops in prop::collection::vec(recompress_op(PAGES, false), 1..150)) {
        let cfg = Config { recompress: Some(rc(18)), ..Config::with_disksize(PAGES * PAGE as u64) };
        check_model(cfg, PAGES, ops)?;
    }

    #[test]
    fn recompression_with_a_backing_device_matches_the_model(ops in prop::collection::vec(recompress_op(PAGES, true), 1..150)) {
        let dir = TempDir::new("recompress-model");
        let mut b = BackingConfig::new(dir.file());
        b.size_bytes = 16 << 20;
        b.segment_bytes = 64 << 10;
        let cfg = Config {
            mem_limit_bytes: 16 * PAGE as u64,
            backing: Some(b),
            recompress: Some(rc(18)),
            ..Config::with_disksize(PAGES * PAGE as u64)
        };
        check_model(cfg, PAGES, ops)?;
    }
}

#[test]
fn a_trained_dictionary_saves_memory_and_every_page_reads_back() {
    const N: u64 = 2048;
    let run = |recompress: Option<RecompressConfig>| {
        let store = Store::new(Config { recompress, ..Config::with_disksize(N * PAGE as u64) }).unwrap();
        let mut ctx = store.context();
        for i in 0..N {
            store.write_page(&mut ctx, i, &record_page(i)).unwrap();
        }
        store.advance_clock(10);
        for _ in 0..20 {
            store.recompress(Duration::from_secs(2));
        }
        let mut p = vec![0u8; PAGE];
        for i in 0..N {
            store.read_page(&mut ctx, i, &mut p).unwrap();
            assert!(p == record_page(i), "page {i}");
        }
        store.stats()
    };
    let lz4 = run(None);
    let plain = run(Some(RecompressConfig { dict: DictSource::None, ..rc(576) }));
    let dict = run(Some(rc(576)));
    assert_eq!(plain.recomp_pages, N);
    assert!(dict.dict_version >= 1 && dict.recomp_dict_pages > N / 2, "{dict:?}");
    assert!(dict.dict_gain_permille >= 20, "{dict:?}");
    assert!(plain.mem_used_total < lz4.mem_used_total, "zstd {} vs lz4 {}", plain.mem_used_total, lz4.mem_used_total);
    // Stored bytes: what the dictionary changes (the pool's packing adds a few pages either way).
    assert!(
        dict.compr_data_size < plain.compr_data_size,
        "with a dictionary {} vs without {}",
        dict.compr_data_size,
        plain.compr_data_size
    );
}

#[test]
fn an_administrators_dictionary_is_used_and_a_bad_one_refused() {
    let dir = TempDir::new("recompress-dict");
    let samples: Vec<Vec<u8>> = (10_000..10_300).map(record_page).collect();
    let path = dir.path().join("pages.dict");
    std::fs::write(&path, zstd::dict::from_samples(&samples, 16 << 10).unwrap()).unwrap();
    let rc = RecompressConfig { dict: DictSource::File(path.clone()), ..rc(576) };
    let store = Store::new(Config { recompress: Some(rc.clone()), ..Config::with_disksize(64 * PAGE as u64) }).unwrap();
    let mut ctx = store.context();
    for i in 0..64 {
        store.write_page(&mut ctx, i, &record_page(i)).unwrap();
    }
    store.advance_clock(10);
    let rep = store.recompress(Duration::from_secs(2));
    assert_eq!(rep.dict_installed, Some(1));
    let s = store.stats();
    assert_eq!((s.recomp_dict_pages, s.dicts_live, s.dicts_refused), (64, 1, 0), "{s:?}");
    let mut p = vec![0u8; PAGE];
    for i in 0..64 {
        store.read_page(&mut ctx, i, &mut p).unwrap();
        assert!(p == record_page(i), "page {i}");
    }

    // Not a dictionary: the start fails, naming the file.
    let junk = dir.path().join("junk.dict");
    let mut bytes = vec![0x37, 0xa4, 0x30, 0xec, 1, 2, 3, 4];
    bytes.extend(std::iter::repeat_n(0xff, 512));
    std::fs::write(&junk, bytes).unwrap();
    let bad = RecompressConfig { dict: DictSource::File(junk.clone()), ..rc };
    let err = Store::new(Config { recompress: Some(bad.clone()), ..Config::with_disksize(1 << 20) }).err().expect("refused");
    assert!(matches!(&err, StoreError::Config(m) if m.contains("junk.dict")), "{err}");
    let missing = RecompressConfig { dict: DictSource::File(dir.path().join("nope.dict")), ..bad };
    let err = Store::new(Config { recompress: Some(missing), ..Config::with_disksize(1 << 20) }).err().expect("refused");
    assert!(err.to_string().contains("nope.dict"), "{err}");
}

/// Four I/O threads against recompression and dictionary training in a loop, the clock moving
/// so that pages keep turning idle: never a torn or foreign page, never an error (a dictionary
/// freed under a reader would be one).
#[test]
fn recompression_under_four_io_threads_never_tears_a_page() {
    const N: u64 = 512;
    // Every trained dictionary is installed (whatever it saves on these synthetic pages), so
    // that versions come and go.
    let rc = RecompressConfig { idle_secs: 1, min_dict_gain_permille: 0, ..rc(27) };
    let cfg = Config { recompress: Some(rc), ..Config::with_disksize(N * PAGE as u64) };
    let store = Arc::new(Store::new(cfg).unwrap());
    // Rounds of the stress until two dictionaries were installed during them (on a loaded
    // machine the background thread gets less done per round); each round checks every read.
    for seed in 7..15 {
        let stress = Stress { pages: N, threads: 4, ops_per_thread: 20_000, seed, extra: Extra::MultiRead };
        let rounds = stress::run(&store, stress, |store, round| {
            store.advance_clock(2);
            store.recompress(Duration::from_millis(20));
            if round % 8 == 0 {
                store.compact();
            }
            // A new dictionary version now and then: versions come and go under the readers.
            if round % 16 == 0 {
                store.tune_recompression(&RecompressTuning { retrain: Some(true), ..Default::default() }).unwrap();
            }
        });
        assert!(rounds > 0);
        if store.stats().dicts_installed > 1 {
            break;
        }
    }
    let s = store.stats();
    assert!(s.recompress_done > 0, "{s:?}");
    assert!(s.dicts_installed > 1, "dictionaries were trained and installed during the run: {s:?}");
    assert_eq!(s.failed_reads + s.failed_writes, 0);
    store.discard(0, N * PAGE as u64).unwrap();
    store.recompress(Duration::from_millis(1));
    let s = store.stats();
    assert_eq!((s.recomp_pages, s.mem_used_total), (0, 0));
    assert!(s.dicts_live <= 1);
}
