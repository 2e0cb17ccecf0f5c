//! The cold tier: a backing tier whose device is RAM compressed 64 KiB at a time
//! (`backing/memdev.rs`, `BackingConfig::in_memory`).
//! - model tests: writes, partial writes, discards, reads, idle writeback, GC, compaction (and
//!   recompression with its dictionaries) read back exactly what a byte-array model holds;
//! - idle pages move by themselves (`maintain`), read back, and cost less memory there than in
//!   the pool, which `mem_used_total` shows (it counts the tier's memory);
//! - a write over the memory limit fails as without a backing device: requests never write
//!   to the tier;
//! - four I/O threads against writeback, GC and promotion: never wrong data.

mod common;

use common::model::{backing_op, recompress_op, Model, Op};
use common::stress::{self, Extra, Stress};
use common::{page, Kind, PAGE};
use compcache_store::{BackingConfig, Config, Medium, RecompressConfig, Store, StoreError};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

const SEG: u64 = 64 << 10;

/// A store of `pages` pages over a cold tier of `tier_bytes`, zstd level 3 (fast tests; the
/// level changes nothing but the ratio), pages idle 5 s going cold.
fn config(pages: u64, tier_bytes: u64) -> Config {
    let mut b = BackingConfig::in_memory(tier_bytes);
    b.segment_bytes = SEG;
    b.medium = Medium::Memory { level: 3 };
    b.idle_secs = 5;
    Config { backing: Some(b), ..Config::with_disksize(pages * PAGE as u64) }
}

fn read(store: &Store, ctx: &mut compcache_store::Context, index: u64) -> Result<Vec<u8>, StoreError> {
    let mut p = vec![0xEE; PAGE];
    store.read_page(ctx, index, &mut p).map(|()| p)
}

const PAGES: u64 = 64;

fn check_model(cfg: Config, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    let mut model = Model::new(PAGES);
    for op in ops {
        model.apply(&store, &mut ctx, op)?;
        let s = store.stats();
        prop_assert_eq!(s.failed_reads + s.failed_writes + s.bd_errors, 0);
        prop_assert_eq!(s.bd_overflow_pages, 0, "requests never write to the cold tier");
        prop_assert!(s.bd_count <= s.pages_stored);
    }
    for i in 0..PAGES {
        let p = read(&store, &mut ctx, i).unwrap();
        prop_assert!(p == model.page(i), "page {i}");
    }
    store.discard(0, PAGES * PAGE as u64).unwrap();
    prop_assert!(store.gc(u64::MAX).error.is_none());
    let s = store.stats();
    prop_assert_eq!((s.compr_data_size, s.orig_data_size, s.bd_count, s.bd_bytes), (0, 0, 0, 0));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn the_store_with_a_cold_tier_matches_the_model(ops in prop::collection::vec(backing_op(PAGES), 1..150)) {
        check_model(config(PAGES, 4 << 20), ops)?;
    }

    #[test]
    fn recompressed_pages_go_cold_decoded_and_match_the_model(ops in prop::collection::vec(recompress_op(PAGES, true), 1..150)) {
        let rc = RecompressConfig { idle_secs: 5, dict_samples: 18, ..RecompressConfig::default() };
        check_model(Config { recompress: Some(rc), ..config(PAGES, 4 << 20) }, ops)?;
    }
}

/// Pages that look like a program's memory: records of text and numbers, a few per page
/// alike, so that pages compress better together than apart.
fn record_page(i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(PAGE);
    let mut k = 0u64;
    while p.len() < PAGE {
        let line = format!(
            "{{\"id\": {}, \"name\": \"item-{}\", \"price\": {}.{:02}, \"tags\": [\"a{}\"]}}\n",
            i * 97 + k,
            (i + k) % 13,
            k % 50,
            (i * k) % 100,
            k % 7
        );
        p.extend_from_slice(line.as_bytes());
        k += 1;
    }
    p.truncate(PAGE);
    p
}

#[test]
fn idle_pages_move_to_the_cold_tier_by_themselves_read_back_and_cost_less_memory() {
    let n = 1024u64;
    let mut cfg = config(n, 16 << 20);
    cfg.backing.as_mut().unwrap().medium = Medium::Memory { level: 19 };
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    for i in 0..n {
        store.write_page(&mut ctx, i, &record_page(i)).unwrap();
    }
    let before = store.stats();
    // Younger than the idle age: nothing moves.
    let r = store.maintain(Duration::from_secs(1));
    assert_eq!(r.writeback.pages, 0, "{r:?}");
    store.advance_clock(6);
    let r = store.maintain(Duration::from_secs(1));
    assert!(r.writeback.error.is_none(), "{r:?}");
    assert_eq!(r.writeback.pages, n, "every idle page moved: {r:?}");
    let after = store.stats();
    assert_eq!(after.bd_count, n);
    assert!(after.bd_mem_bytes > 0 && after.mem_used_total >= after.bd_mem_bytes, "{after:?}");
    assert!(
        after.mem_used_total * 10 < before.mem_used_total * 9,
        "cold pages cost at least 10% less: {} -> {} bytes",
        before.mem_used_total,
        after.mem_used_total
    );
    for i in (0..n).rev() {
        assert_eq!(read(&store, &mut ctx, i).unwrap(), record_page(i), "page {i}");
    }
    let s = store.stats();
    assert_eq!(s.failed_reads + s.bd_errors, 0);
    // Rewritten and discarded pages leave the tier; GC gives their space back.
    for i in 0..n / 2 {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 2)).unwrap();
    }
    store.discard(n / 2 * PAGE as u64, n / 4 * PAGE as u64).unwrap();
    let r = store.gc(u64::MAX);
    assert!(r.error.is_none() && r.corrupt == 0, "{r:?}");
    for i in 0..n {
        let want = match i {
            i if i < n / 2 => page(Kind::Text, i, 2),
            i if i < 3 * n / 4 => vec![0; PAGE],
            i => record_page(i),
        };
        assert_eq!(read(&store, &mut ctx, i).unwrap(), want, "page {i}");
    }
    store.discard(0, n * PAGE as u64).unwrap();
    store.gc(u64::MAX);
    let s = store.stats();
    assert_eq!((s.orig_data_size, s.bd_count, s.bd_bytes), (0, 0, 0));
}

#[test]
fn a_write_over_the_memory_limit_fails_instead_of_going_to_the_cold_tier() {
    let cfg = Config { mem_limit_bytes: 8 * PAGE as u64, ..config(64, 4 << 20) };
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    let mut failed = None;
    for i in 0..64 {
        if let Err(e) = store.write_page(&mut ctx, i, &page(Kind::Random, i, 1)) {
            failed = Some(e);
            break;
        }
    }
    assert!(matches!(failed, Some(StoreError::NoSpace { .. })), "{failed:?}");
    let s = store.stats();
    assert_eq!((s.bd_overflow_pages, s.bd_count), (0, 0));
}

#[test]
fn a_cold_tier_is_refused_with_a_backing_option_it_cannot_honour() {
    let mut b = BackingConfig::in_memory(4 << 20);
    b.incompressible = true;
    let err = Store::new(Config { backing: Some(b), ..Config::with_disksize(1 << 20) }).err().expect("refused");
    assert!(err.to_string().contains("incompressible"), "{err}");
    let b = BackingConfig { encrypt: true, ..BackingConfig::in_memory(4 << 20) };
    let err = Store::new(Config { backing: Some(b), ..Config::with_disksize(1 << 20) }).err().expect("refused");
    assert!(err.to_string().contains("not encrypted"), "{err}");
    let b = BackingConfig::in_memory((4 << 20) + 4096);
    let err = Store::new(Config { backing: Some(b), ..Config::with_disksize(1 << 20) }).err().expect("refused");
    assert!(err.to_string().contains("multiple"), "{err}");
}

#[test]
fn concurrent_io_with_cold_writeback_gc_and_promotion_never_returns_wrong_data() {
    let pages = 512u64;
    let mut cfg = config(pages, 8 << 20);
    cfg.backing.as_mut().unwrap().idle_secs = 2;
    let store = Arc::new(Store::new(cfg).unwrap());
    let stress = Stress { pages, threads: 4, ops_per_thread: 4_000, seed: 23, extra: Extra::MultiRead };
    let rounds = stress::run(&store, stress, |store, round| stress::maintenance_round(store, round, 1, 256 << 10));
    assert!(rounds > 0);
    let s = store.stats();
    assert!(s.bd_writes > 0 && s.bd_reads > 0, "the tier was used: {s:?}");
    assert_eq!(s.failed_reads + s.failed_writes + s.bd_errors, 0);
    store.discard(0, pages * PAGE as u64).unwrap();
    store.gc(u64::MAX);
    let s = store.stats();
    assert_eq!((s.orig_data_size, s.compr_data_size, s.bd_count, s.bd_bytes), (0, 0, 0, 0));
}

#[test]
fn a_cold_page_read_twice_soon_comes_back_compressed() {
    let store = Store::new(config(64, 4 << 20)).unwrap();
    let mut ctx = store.context();
    for i in 0..64 {
        store.write_page(&mut ctx, i, &record_page(i)).unwrap();
    }
    store.advance_clock(10);
    assert_eq!(store.maintain(Duration::from_secs(1)).writeback.pages, 64);
    store.compact();
    assert_eq!(store.stats().bd_count, 64);
    // Read twice within the promotion window: back in RAM, as a compressed page.
    for _ in 0..2 {
        assert_eq!(read(&store, &mut ctx, 7).unwrap(), record_page(7));
    }
    let s = store.stats();
    assert_eq!((s.bd_promoted_pages, s.bd_count, s.huge_pages), (1, 63, 0), "{s:?}");
    assert!(s.compr_data_size < PAGE as u64 / 2, "stored compressed: {} bytes", s.compr_data_size);
    assert_eq!(read(&store, &mut ctx, 7).unwrap(), record_page(7));
}
