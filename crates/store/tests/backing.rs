//! The backing tier: a small memory limit and a backing file in a temporary directory.
//! - a model test: random writes, partial writes, discards, write-zeroes, reads, writeback,
//!   GC, compaction and the passing of time read back exactly what a byte-array model holds;
//! - overflow, cold-page writeback, promotion, GC and space reuse, statistics;
//! - faults: a device that starts failing (EIO, ENOSPC), a backing file truncated, punched or
//!   corrupted underneath: errors for the pages concerned, never wrong data, and everything
//!   else still readable;
//! - threads doing I/O while a maintenance thread writes back and collects.

mod common;

use common::model::{backing_op as op, Model, Op};
use common::stress::{self, Extra, Stress};
use common::{page, write_until_error, Kind, PAGE};
use compcache_store::backing::device::SUPERBLOCK_BYTES;
use compcache_store::testing::{Faults, TempDir, TestDevice};
use compcache_store::{BackingConfig, Config, DeviceOptions, Store, StoreError, WritebackBudget};
use proptest::prelude::*;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SEG: u64 = 16 * 1024;

fn config(pages: u64, mem_limit_pages: u64, backing: &Path, backing_bytes: u64) -> Config {
    let mut b = BackingConfig::new(backing);
    b.size_bytes = backing_bytes;
    b.segment_bytes = SEG;
    b.high_pct = 80;
    b.low_pct = 50;
    Config { mem_limit_bytes: mem_limit_pages * PAGE as u64, backing: Some(b), ..Config::with_disksize(pages * PAGE as u64) }
}

fn libc_eio() -> i32 {
    5
}

fn faulty_store(cfg: Config) -> (Store, Arc<Faults>) {
    let b = cfg.backing.as_ref().unwrap();
    let opts = DeviceOptions { size_bytes: b.size_bytes, default_bytes: cfg.disksize_bytes, ..Default::default() };
    let dev = TestDevice::file(&b.path, opts).unwrap();
    let faults = dev.faults();
    let store = Store::with_backing_device(cfg, Box::new(dev)).unwrap();
    (store, faults)
}

fn read(store: &Store, index: u64) -> Result<Vec<u8>, StoreError> {
    let mut ctx = store.context();
    let mut p = vec![0xEE; PAGE];
    store.read_page(&mut ctx, index, &mut p).map(|()| p)
}

// --- model ---------------------------------------------------------------------------------

const PAGES: u64 = 64;

fn check_model(ops: Vec<Op>, incompressible: bool) -> Result<(), TestCaseError> {
    let dir = TempDir::new("backing");
    let mut cfg = config(PAGES, 6, &dir.file(), 2 << 20);
    cfg.backing.as_mut().unwrap().incompressible = incompressible;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    let mut model = Model::new(PAGES);
    for op in ops {
        model.apply(&store, &mut ctx, op)?;
        let s = store.stats();
        prop_assert!(s.mem_used_total <= 6 * PAGE as u64, "the memory limit holds: {}", s.mem_used_total);
        prop_assert_eq!(s.failed_reads + s.failed_writes + s.bd_errors, 0);
        prop_assert!(s.bd_count <= s.pages_stored);
        prop_assert!(s.bd_bytes <= s.bd_count * PAGE as u64);
        prop_assert!(s.bd_space_bytes <= s.bd_size_bytes);
    }
    for i in 0..PAGES {
        let p = read(&store, i).unwrap();
        prop_assert!(p == model.page(i), "page {i}");
    }
    store.flush().unwrap();
    // Discarding everything frees every byte: pool and backing device.
    store.discard(0, PAGES * PAGE as u64).unwrap();
    let r = store.gc(u64::MAX);
    prop_assert!(r.error.is_none());
    let s = store.stats();
    prop_assert_eq!((s.mem_used_total, s.compr_data_size, s.orig_data_size), (0, 0, 0));
    prop_assert_eq!((s.bd_count, s.bd_bytes), (0, 0));
    prop_assert!(s.bd_space_bytes <= 2 * SEG, "only the two open segments stay in use: {}", s.bd_space_bytes);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_store_with_a_backing_file_matches_the_model(ops in prop::collection::vec(op(PAGES), 1..150)) {
        check_model(ops, false)?;
    }

    #[test]
    fn incompressible_pages_on_the_backing_file_match_the_model(ops in prop::collection::vec(op(PAGES), 1..80)) {
        check_model(ops, true)?;
    }
}

// --- overflow, writeback, promotion, GC ------------------------------------------------------

#[test]
fn writes_beyond_the_memory_limit_go_to_the_backing_file_and_read_back() {
    let dir = TempDir::new("backing");
    let store = Store::new(config(1024, 16, &dir.file(), 0)).unwrap();
    let mut ctx = store.context();
    for i in 0..512 {
        store.write_page(&mut ctx, i, &page(Kind::Random, i, 1)).unwrap();
    }
    let s = store.stats();
    assert!(s.mem_used_total <= 16 * PAGE as u64);
    assert!(s.bd_count >= 512 - 16 && s.bd_writes == s.bd_count && s.bd_overflow_pages == s.bd_count, "{s:?}");
    assert_eq!(s.failed_writes, 0);
    assert_eq!(
        std::fs::metadata(dir.file()).unwrap().len(),
        SUPERBLOCK_BYTES + 1024 * PAGE as u64,
        "a new file is sized to the device (and its superblock)"
    );
    for i in 0..512 {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Random, i, 1), "page {i}");
    }
    assert_eq!(store.stats().bd_reads, s.bd_count);
    assert!(store.stats().ramzswap_text().contains(&format!("BDevNumWrites:{:>8}", s.bd_writes)));
}

#[test]
fn without_a_backing_device_the_limit_still_fails_writes() {
    let store = Store::new(Config { mem_limit_bytes: 4 * PAGE as u64, ..Config::with_disksize(64 * PAGE as u64) }).unwrap();
    let mut ctx = store.context();
    let errs = (0..16).filter(|&i| store.write_page(&mut ctx, i, &page(Kind::Random, i, 1)).is_err()).count();
    assert_eq!(errs, 12);
    assert_eq!(store.stats().bd_count, 0);
    assert_eq!(store.writeback(WritebackBudget::UNLIMITED), Default::default());
}

#[test]
fn writeback_moves_cold_pages_out_and_keeps_hot_ones_in_ram() {
    let dir = TempDir::new("backing");
    let mut cfg = config(4096, 128, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().high_pct = 60;
    cfg.backing.as_mut().unwrap().low_pct = 40;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    // 200 text pages of ~1.6 KiB compressed: about 85 pool pages, under the limit (128
    // pages) but over the high watermark (77 pages).
    let n = 200;
    for i in 0..n {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap();
    }
    assert_eq!(store.stats().bd_count, 0, "nothing overflowed");
    assert!(store.stats().mem_used_total > 128 * PAGE as u64 * 60 / 100);
    store.advance_clock(600);
    let hot: Vec<u64> = (0..n).filter(|i| i % 10 == 0).collect();
    for &i in &hot {
        read(&store, i).unwrap();
    }
    // As the maintenance thread would: call until it has nothing to do (compaction frees
    // fewer pool pages than the bytes written back, so one call may not reach the mark).
    let mut r = store.writeback(WritebackBudget::UNLIMITED);
    assert!(r.error.is_none() && r.pages > 0, "{r:?}");
    for _ in 0..10 {
        let more = store.writeback(WritebackBudget::UNLIMITED);
        assert!(more.error.is_none());
        r.pages += more.pages;
        r.writes += more.writes;
    }
    let s = store.stats();
    assert!(s.mem_used_total <= 128 * PAGE as u64 * 40 / 100, "down to the low watermark: {s:?}");
    assert!(r.writes * 8 < r.pages, "batched: {} pages in {} writes", r.pages, r.writes);
    assert_eq!((s.bd_writeback_pages, s.bd_writes, s.bd_reads), (r.pages, r.pages, 0));
    for &i in &hot {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Text, i, 1));
    }
    assert_eq!(store.stats().bd_reads, 0, "hot pages stayed in RAM");
    for i in 0..n {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Text, i, 1), "page {i}");
    }
    assert_eq!(store.stats().bd_reads, r.pages, "cold pages are read from the device");
    // Packed: several compressed pages per 4 KiB block.
    let s = store.stats();
    assert!(s.bd_count * PAGE as u64 > 2 * s.bd_space_bytes, "{} pages in {} bytes", s.bd_count, s.bd_space_bytes);
}

#[test]
fn writeback_respects_its_budget_and_total_limit() {
    let dir = TempDir::new("backing");
    let mut cfg = config(4096, 1024, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().writeback_limit_bytes = 100 * 1024;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    for i in 0..1000 {
        store.write_page(&mut ctx, i, &page(Kind::Mixed, i, 1)).unwrap();
    }
    store.advance_clock(100);
    let r = store.writeback_idle(50, WritebackBudget { max_bytes: 20 * 1024 });
    assert!(r.bytes >= 20 * 1024 && r.bytes < 20 * 1024 + 2 * PAGE as u64, "{r:?}");
    let r = store.writeback_idle(50, WritebackBudget::UNLIMITED);
    assert!(r.bytes < 82 * 1024 && r.bytes > 70 * 1024, "the total limit stops it: {r:?}");
    assert_eq!(store.writeback_idle(50, WritebackBudget::UNLIMITED).pages, 0, "limit used up");
    assert_eq!(store.writeback_idle(50, WritebackBudget::UNLIMITED).pages, 0);
    // young pages are not idle
    store.write_page(&mut ctx, 2000, &page(Kind::Mixed, 2000, 1)).unwrap();
}

/// `compcache set`'s store side: the limit re-armed (zram's `writeback_limit`, rewritten
/// daily by its users) allows that much more from then on; watermarks changed on the running
/// device start writeback at the next maintenance step; a refused change changes nothing.
#[test]
fn writeback_tunables_change_on_a_running_device() {
    use compcache_store::WritebackTuning;
    let dir = TempDir::new("backing");
    let mut cfg = config(4096, 1024, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().writeback_limit_bytes = 40 * 1024;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    for i in 0..1000 {
        store.write_page(&mut ctx, i, &page(Kind::Mixed, i, 1)).unwrap();
    }
    store.advance_clock(100);
    let first = store.writeback_idle(50, WritebackBudget::UNLIMITED);
    assert!(first.bytes > 30 * 1024 && first.bytes <= 40 * 1024 + PAGE as u64, "{first:?}");
    assert_eq!(store.writeback_idle(50, WritebackBudget::UNLIMITED).pages, 0, "limit used up");
    let s = store.writeback_settings().unwrap();
    assert_eq!((s.limit_bytes, s.limit_left_bytes), (40 * 1024, Some(40 * 1024 - first.bytes.min(40 * 1024))));

    // Re-armed: 60 KiB more from now, whatever was written before.
    let s = store.tune_writeback(&WritebackTuning { limit_bytes: Some(60 * 1024), ..Default::default() }).unwrap();
    assert_eq!((s.limit_bytes, s.limit_left_bytes, s.high_pct, s.low_pct), (60 * 1024, Some(60 * 1024), 80, 50));
    let second = store.writeback_idle(50, WritebackBudget::UNLIMITED);
    assert!(second.bytes > 50 * 1024 && second.bytes <= 60 * 1024 + PAGE as u64, "{second:?}");
    assert_eq!(store.stats().bd_writeback_pages, first.pages + second.pages);
    // 0: no limit.
    store.tune_writeback(&WritebackTuning { limit_bytes: Some(0), ..Default::default() }).unwrap();
    assert!(store.writeback_idle(50, WritebackBudget { max_bytes: 100 * 1024 }).bytes >= 100 * 1024);

    // Watermarks: memory is under 80% of the limit, so maintenance writes nothing back...
    let used = store.stats().mem_used_total;
    let limit = store.stats().mem_limit;
    assert!(used * 100 < limit * 80 && used * 100 > limit * 20, "used {used} of {limit}");
    assert_eq!(store.maintain(std::time::Duration::from_secs(1)).writeback.pages, 0);
    // ...until the watermarks are lowered under it; then it drains to the new low one.
    let bad = WritebackTuning { high_pct: Some(10), ..Default::default() };
    assert!(store.tune_writeback(&bad).is_err(), "high under low (50%) is refused");
    assert_eq!(store.writeback_settings().unwrap().high_pct, 80, "and changes nothing");
    store.tune_writeback(&WritebackTuning { high_pct: Some(20), low_pct: Some(10), rate_bytes: Some(0), limit_bytes: None }).unwrap();
    let r = store.maintain(std::time::Duration::from_secs(1));
    assert!(r.writeback.pages > 0, "{r:?}");
    assert!(store.stats().mem_used_total * 100 <= limit * 10 + 100 * PAGE as u64, "{:?}", store.stats());

    // A device without a backing device has no writeback to tune.
    let plain = Store::new(Config::with_disksize(1 << 20)).unwrap();
    assert!(plain.writeback_settings().is_none());
    assert!(plain.tune_writeback(&WritebackTuning::default()).unwrap_err().to_string().contains("--backing"));
}

/// The writeback thread need not poll: armed while the pool is under the high watermark, it
/// is woken by the allocation that takes the pool past it. Here it parks for up to a minute
/// and must be woken by the writes long before that; once over the mark, arming refuses (so a
/// step that cannot write back is not woken by every allocation), and after writeback drains
/// the pool it arms again.
#[test]
fn the_allocation_that_passes_the_high_watermark_wakes_the_writeback_thread() {
    use std::time::{Duration, Instant};
    let dir = TempDir::new("backing");
    let store = Arc::new(Store::new(config(4096, 256, &dir.file(), 0)).unwrap()); // high: 80% of 256 pages
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            assert!(store.arm_writeback_wakeup(), "an empty pool is under the mark");
            ready_tx.send(()).unwrap();
            let start = Instant::now();
            // park may return spuriously: it is the pool over the mark that counts.
            while store.stats().mem_used_total <= 256 * 80 / 100 * PAGE as u64 && start.elapsed() < Duration::from_secs(60) {
                std::thread::park_timeout(Duration::from_secs(60));
            }
            start.elapsed()
        })
    };
    ready_rx.recv().unwrap();
    let mut ctx = store.context();
    let mut i = 0;
    while store.stats().mem_used_total <= 256 * 80 / 100 * PAGE as u64 {
        store.write_page(&mut ctx, i, &page(Kind::Random, i, 1)).unwrap();
        i += 1;
    }
    let woken_after = thread.join().unwrap();
    assert!(woken_after < Duration::from_secs(30), "parked {woken_after:?}: no allocation woke it");
    assert!(!store.arm_writeback_wakeup(), "over the mark: nothing to arm");
    let r = store.maintain(Duration::from_secs(1));
    assert!(r.writeback.pages > 0, "{r:?}");
    assert!(store.arm_writeback_wakeup(), "drained under the low watermark: armed again");
    for j in 0..i {
        assert_eq!(read(&store, j).unwrap(), page(Kind::Random, j, 1), "page {j}");
    }
    let plain = Store::new(Config::with_disksize(1 << 20)).unwrap();
    assert!(!plain.arm_writeback_wakeup(), "no backing device: no writeback to wake");
}

#[test]
fn a_page_read_twice_soon_is_promoted_back_into_ram() {
    let dir = TempDir::new("backing");
    let store = Store::new(config(256, 64, &dir.file(), 0)).unwrap();
    let mut ctx = store.context();
    for i in 0..20 {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap();
    }
    store.advance_clock(100);
    assert_eq!(store.writeback_idle(10, WritebackBudget::UNLIMITED).pages, 20);
    assert_eq!(read(&store, 5).unwrap(), page(Kind::Text, 5, 1));
    assert_eq!(store.stats().bd_promoted_pages, 0, "read once: stays on the device");
    assert_eq!(read(&store, 5).unwrap(), page(Kind::Text, 5, 1));
    let s = store.stats();
    assert_eq!((s.bd_promoted_pages, s.bd_count, s.bd_reads), (1, 19, 2));
    assert_eq!(read(&store, 5).unwrap(), page(Kind::Text, 5, 1));
    assert_eq!(store.stats().bd_reads, 2, "served from RAM now");
}

#[test]
fn gc_repacks_sparse_segments_and_freed_space_is_reused() {
    let dir = TempDir::new("backing");
    // 64 segments of 16 KiB = 1 MiB of backing file.
    let store = Store::new(config(4096, 8, &dir.file(), 1 << 20)).unwrap();
    let mut ctx = store.context();
    // 500 text pages of about 1.6 KiB compressed: 80% of the file.
    let n = 500;
    for i in 0..n {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap();
    }
    let full = store.stats();
    assert!(full.bd_count > 480);
    for i in (0..n).filter(|i| i % 4 != 0) {
        store.discard_page(i);
    }
    let sparse = store.stats();
    assert!(sparse.bd_efficiency_pct < full.bd_efficiency_pct / 2, "{} -> {}", full.bd_efficiency_pct, sparse.bd_efficiency_pct);
    let r = store.gc(u64::MAX);
    assert!(r.error.is_none() && r.pages_moved > 0 && r.segments_freed > 0, "{r:?}");
    let after = store.stats();
    assert!(after.bd_space_bytes < sparse.bd_space_bytes / 2, "{} -> {}", sparse.bd_space_bytes, after.bd_space_bytes);
    assert!(after.bd_efficiency_pct > 60, "repacked: {}%", after.bd_efficiency_pct);
    assert_eq!(after.bd_gc_pages, r.pages_moved);
    for i in 0..n {
        let want = if i % 4 == 0 { page(Kind::Text, i, 1) } else { vec![0; PAGE] };
        assert_eq!(read(&store, i).unwrap(), want, "page {i}");
    }
    // The device fills up again and again: freed segments are reused, GC keeps up.
    for round in 2..8u64 {
        for i in (0..n).filter(|i| i % 4 != 0) {
            store.write_page(&mut ctx, i, &page(Kind::Text, i, round)).unwrap();
        }
        for i in (0..n).filter(|i| i % 4 != 0) {
            store.discard_page(i);
        }
        assert!(store.gc(u64::MAX).error.is_none());
    }
    for i in (0..n).step_by(4) {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Text, i, 1), "page {i}");
    }
    assert_eq!(store.stats().failed_writes, 0);
}

#[test]
fn a_full_backing_device_fails_writes_cleanly_and_gc_makes_room() {
    let dir = TempDir::new("backing");
    // 8 segments of 16 KiB: room for about 30 random pages.
    let store = Store::new(config(4096, 4, &dir.file(), 8 * SEG)).unwrap();
    let mut ctx = store.context();
    let (written, err) = write_until_error(&store, &mut ctx, |i| page(Kind::Random, i, 1));
    assert!(matches!(err, StoreError::Backing { .. }) && err.to_string().contains("full"), "{err}");
    assert_eq!(err.errno(), libc_eio());
    // an overwrite that cannot be stored leaves the old page
    assert!(store.write_page(&mut ctx, 0, &page(Kind::Random, 0, 2)).is_err());
    for i in 0..written {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Random, i, 1), "page {i}");
    }
    for i in (0..written).filter(|i| i % 2 == 0) {
        store.discard_page(i);
    }
    let r = store.gc(u64::MAX);
    assert!(r.segments_freed > 0, "{r:?}");
    store.write_page(&mut ctx, 0, &page(Kind::Random, 0, 3)).unwrap();
    assert_eq!(read(&store, 0).unwrap(), page(Kind::Random, 0, 3));
}

// --- faults ----------------------------------------------------------------------------------

#[test]
fn a_failing_device_fails_only_the_requests_it_serves_and_ram_pages_stay_readable() {
    let dir = TempDir::new("backing");
    let (store, faults) = faulty_store(config(1024, 16, &dir.file(), 0));
    let mut ctx = store.context();
    for i in 0..100 {
        store.write_page(&mut ctx, i, &page(Kind::Random, i, 1)).unwrap();
    }
    let on_device = store.stats().bd_count;
    assert!(on_device > 80);

    faults.fail_writes.store(true, Ordering::Relaxed);
    let e = store.write_page(&mut ctx, 200, &page(Kind::Random, 200, 1)).unwrap_err();
    assert!(matches!(e, StoreError::Backing { index: 200, .. }) && e.errno() == libc_eio(), "{e}");
    let e = store.write_page(&mut ctx, 3, &page(Kind::Random, 3, 2)).unwrap_err();
    assert!(e.to_string().contains("failed"), "{e}");
    // Nothing is reported written that was not: the old pages are still there.
    for i in 0..100 {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Random, i, 1), "page {i}");
    }
    assert_eq!(read(&store, 200).unwrap(), vec![0; PAGE], "the failed write left nothing");
    // Same-filled pages need neither memory nor the device.
    store.write_page(&mut ctx, 300, &page(Kind::Same, 300, 1)).unwrap();

    faults.fail_writes.store(false, Ordering::Relaxed);
    faults.fail_reads.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, 0);
    for i in 0..100 {
        match read(&store, i) {
            Ok(p) => {
                assert_eq!(p, page(Kind::Random, i, 1), "page {i}");
                ok += 1;
            }
            Err(e) => {
                assert!(matches!(e, StoreError::Backing { .. }) && e.errno() == libc_eio(), "{e}");
                failed += 1;
            }
        }
    }
    assert_eq!((failed, ok), (on_device, 100 - on_device), "exactly the pages on the device fail");
    faults.fail_reads.store(false, Ordering::Relaxed);
    assert_eq!(read(&store, 7).unwrap(), page(Kind::Random, 7, 1), "and recover with the device");

    let s = store.stats();
    assert!(s.bd_errors >= on_device + 2 && s.failed_writes == 2 && s.failed_reads == on_device, "{s:?}");
}

#[test]
fn a_failed_writeback_keeps_the_pages_in_ram() {
    let dir = TempDir::new("backing");
    let (store, faults) = faulty_store(config(1024, 0, &dir.file(), 0));
    let mut ctx = store.context();
    for i in 0..200 {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap();
    }
    store.advance_clock(100);
    faults.full.store(true, Ordering::Relaxed);
    let r = store.writeback_idle(10, WritebackBudget::UNLIMITED);
    assert!(r.pages == 0 && r.error.as_ref().is_some_and(|e| e.to_string().contains("No space left")), "{r:?}");
    let s = store.stats();
    assert_eq!(s.bd_count, 0);
    assert!(s.bd_space_bytes <= SEG, "no space is held by the failed batch beyond the writer's open segment");
    faults.full.store(false, Ordering::Relaxed);
    for i in 0..200 {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Text, i, 1), "page {i}");
    }
    store.advance_clock(100);
    let r = store.writeback_idle(10, WritebackBudget::UNLIMITED);
    assert_eq!(r.pages, 200, "and go out once the device works: {r:?} {:?}", store.stats());
    for i in 0..200 {
        assert_eq!(read(&store, i).unwrap(), page(Kind::Text, i, 1), "page {i}");
    }
}

#[test]
fn a_multi_page_read_reads_adjacent_records_with_one_pread_and_fails_only_for_bad_pages() {
    let dir = TempDir::new("backing");
    let mut cfg = config(1024, 0, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().segment_bytes = 1 << 20; // the default: the pages fit in one
    let (store, faults) = faulty_store(cfg);
    let mut ctx = store.context();
    let kinds = [Kind::Text, Kind::Mixed, Kind::Random, Kind::Zero, Kind::Same];
    let want: Vec<u8> = (0..64).flat_map(|i| page(kinds[i as usize % 5], i, 1)).collect();
    store.write(&mut ctx, 0, &want).unwrap();
    store.advance_clock(100);
    let in_ram = (0..64).filter(|i| !matches!(kinds[*i as usize % 5], Kind::Zero | Kind::Same)).count() as u64;
    assert_eq!(store.writeback_idle(10, WritebackBudget::UNLIMITED).pages, in_ram);
    let mut back = vec![0u8; 64 * PAGE];
    store.read(&mut ctx, 0, &mut back).unwrap();
    assert!(back == want, "a 64-page read across RAM and device pages");
    assert_eq!(faults.reads.load(Ordering::Relaxed), 1, "written back together, read back together");
    // One record that fails its checksum fails the request, and only that page alone.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(dir.file()).unwrap();
    f.write_all_at(&[0xff; 8], SUPERBLOCK_BYTES + 20).unwrap();
    store.advance_clock(100); // no promotion: the last read was long ago
    let e = store.read(&mut ctx, 0, &mut back).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { index: 0, .. }), "{e}");
    for i in 1..64 {
        assert_eq!(read(&store, i).unwrap(), want[i as usize * PAGE..][..PAGE], "page {i}");
    }
}

/// Writes `n` pages that all end up on the backing file (no promotion); returns the store.
fn store_with_pages_on_file(dir: &TempDir, n: u64) -> Store {
    let mut cfg = config(1024, 0, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().promote = false;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    for i in 0..n {
        store.write_page(&mut ctx, i, &page(if i % 2 == 0 { Kind::Text } else { Kind::Random }, i, 1)).unwrap();
    }
    store.advance_clock(100);
    assert_eq!(store.writeback_idle(10, WritebackBudget::UNLIMITED).pages, n);
    store.flush().unwrap();
    store
}

fn want(i: u64) -> Vec<u8> {
    page(if i % 2 == 0 { Kind::Text } else { Kind::Random }, i, 1)
}

#[test]
fn a_truncated_backing_file_gives_errors_never_data() {
    let dir = TempDir::new("backing");
    let store = store_with_pages_on_file(&dir, 64);
    std::fs::OpenOptions::new().write(true).open(dir.file()).unwrap().set_len(0).unwrap();
    for i in 0..64 {
        let e = read(&store, i).unwrap_err();
        assert!(matches!(e, StoreError::Backing { .. }), "page {i}: {e}");
    }
    // Grown back, the file is a hole: zeroes, which fail their checksums.
    std::fs::OpenOptions::new().write(true).open(dir.file()).unwrap().set_len(1 << 22).unwrap();
    for i in 0..64 {
        let e = read(&store, i).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }) && e.errno() == libc_eio(), "page {i}: {e}");
    }
    let s = store.stats();
    assert_eq!(s.failed_reads, 128);
    // Pages written afterwards work: the tier is not wedged.
    let mut ctx = store.context();
    store.write_page(&mut ctx, 500, &page(Kind::Text, 500, 1)).unwrap();
    assert_eq!(read(&store, 500).unwrap(), page(Kind::Text, 500, 1));
}

#[test]
fn corrupted_bytes_in_the_backing_file_are_reported_for_their_pages_only() {
    use std::os::unix::fs::FileExt;
    let dir = TempDir::new("backing");
    let store = store_with_pages_on_file(&dir, 64);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(dir.file()).unwrap();
    let used = store.stats().bd_space_bytes;
    // Flip one bit every 5000 bytes of the used part.
    let mut hits = 0;
    let mut off = 1234;
    while off < used {
        let mut b = [0u8];
        f.read_exact_at(&mut b, off).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], off).unwrap();
        hits += 1;
        off += 5000;
    }
    let (mut ok, mut corrupt) = (0, 0);
    for i in 0..64 {
        match read(&store, i) {
            Ok(p) => {
                assert_eq!(p, want(i), "page {i} returned wrong data");
                ok += 1;
            }
            Err(e) => {
                assert!(matches!(e, StoreError::Corrupt { index, .. } if index == i), "{e}");
                corrupt += 1;
            }
        }
    }
    assert!(corrupt > 0 && corrupt <= hits && ok > 0, "{corrupt} corrupt, {ok} fine, {hits} flips");
    // GC moves corrupt records without making them valid.
    for i in (0..64).filter(|i| i % 3 == 0) {
        store.discard_page(i);
    }
    let r = store.gc(u64::MAX);
    assert!(r.pages_moved > 0 || r.segments == 0, "{r:?}");
    let mut after = 0;
    for i in (0..64).filter(|i| i % 3 != 0) {
        match read(&store, i) {
            Ok(p) => assert_eq!(p, want(i), "page {i} returned wrong data after GC"),
            Err(_) => after += 1,
        }
    }
    assert!(after <= corrupt);
}

// --- concurrency -----------------------------------------------------------------------------

#[test]
fn concurrent_io_with_writeback_and_gc_never_returns_wrong_data() {
    let dir = TempDir::new("backing");
    let pages = 512u64;
    let mut cfg = config(pages, 32, &dir.file(), 4 << 20);
    cfg.backing.as_mut().unwrap().high_pct = 60;
    cfg.backing.as_mut().unwrap().low_pct = 30;
    let store = Arc::new(Store::new(cfg).unwrap());
    let stress = Stress { pages, threads: 4, ops_per_thread: 6_000, seed: 11, extra: Extra::MultiRead };
    let rounds = stress::run(&store, stress, |store, round| stress::maintenance_round(store, round, 3, 64 << 10));
    assert!(rounds > 0);
    let s = store.stats();
    assert!(s.bd_writes > 0 && s.bd_reads > 0, "the device was used: {s:?}");
    assert_eq!(s.failed_reads + s.failed_writes + s.bd_errors, 0);
    store.discard(0, pages * PAGE as u64).unwrap();
    store.gc(u64::MAX);
    let s = store.stats();
    assert_eq!((s.orig_data_size, s.compr_data_size, s.mem_used_total, s.bd_count, s.bd_bytes), (0, 0, 0, 0, 0));
    assert!(s.bd_space_bytes <= 2 * SEG);
}

#[test]
fn every_backing_statistic_is_updated() {
    // Each bd_* field moves in a scenario that should move it: none is declared and forgotten.
    let dir = TempDir::new("backing");
    let (store, faults) = faulty_store(config(4096, 8, &dir.file(), 1 << 20));
    let mut ctx = store.context();
    for i in 0..200 {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap(); // overflow
    }
    store.discard(0, 8 * PAGE as u64).unwrap(); // free room in RAM and holes on the device
    for i in 1000..1008 {
        store.write_page(&mut ctx, i, &page(Kind::Text, i, 1)).unwrap(); // back into RAM
    }
    store.advance_clock(100);
    store.writeback_idle(10, WritebackBudget::UNLIMITED); // writeback
    for i in (8..200).filter(|i| i % 3 != 0) {
        store.discard_page(i);
    }
    store.set_mem_limit(0);
    read(&store, 9).unwrap();
    read(&store, 9).unwrap(); // promotion
    store.gc(u64::MAX); // GC
    faults.fail_reads.store(true, Ordering::Relaxed);
    assert!(read(&store, 12).is_err()); // an error
    let s = store.stats();
    let fields = [
        ("bd_count", s.bd_count),
        ("bd_reads", s.bd_reads),
        ("bd_writes", s.bd_writes),
        ("bd_bytes", s.bd_bytes),
        ("bd_size_bytes", s.bd_size_bytes),
        ("bd_space_bytes", s.bd_space_bytes),
        ("bd_efficiency_pct", s.bd_efficiency_pct),
        ("bd_overflow_pages", s.bd_overflow_pages),
        ("bd_writeback_pages", s.bd_writeback_pages),
        ("bd_gc_pages", s.bd_gc_pages),
        ("bd_promoted_pages", s.bd_promoted_pages),
        ("bd_errors", s.bd_errors),
    ];
    for (name, v) in fields {
        assert!(v > 0, "{name} never moved: {s:?}");
    }
    assert_eq!(
        s.bd_stat_line().split_whitespace().map(|v| v.parse().unwrap()).collect::<Vec<u64>>(),
        [s.bd_count, s.bd_reads, s.bd_writes]
    );
}

// --- the backing file's life: privacy, exclusive use, other runs, stale data ---------------
//
// The device holds other processes' memory (issue 10, items 1-3): these tests fail on a store
// that creates the file world-readable, follows symbolic links, takes over foreign files, lets
// two servers share a file, accepts another run's records, or leaves page data behind.

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Pages that do not compress go straight to the device (`incompressible`), in write order.
fn overflow_config(backing: &Path) -> Config {
    let mut cfg = config(256, 0, backing, 0);
    let b = cfg.backing.as_mut().unwrap();
    b.incompressible = true;
    b.promote = false;
    cfg
}

/// A random page with `marker` written into it every 512 bytes: stored raw on the device.
fn marked_page(i: u64, marker: &[u8]) -> Vec<u8> {
    let mut p = page(Kind::Random, i, 7);
    for off in (64..PAGE).step_by(512) {
        p[off..off + marker.len()].copy_from_slice(marker);
    }
    p
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_new_backing_file_is_owner_only_even_with_umask_0() {
    let dir = TempDir::new("backing");
    // SAFETY: umask only changes this process's file creation mask; restored below. Other
    // tests creating files meanwhile get wider modes, which they do not check.
    let old = unsafe { libc::umask(0) };
    let r = Store::new(config(64, 0, &dir.file(), 0));
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let store = r.unwrap();
    assert_eq!(mode_of(&dir.file()), 0o600, "swapped-out memory is private");
    drop(store);
    assert_eq!(mode_of(&dir.file()), 0o600);
}

#[test]
fn a_symlink_as_backing_path_is_refused_and_its_target_untouched() {
    let dir = TempDir::new("backing");
    let target = dir.path().join("passwd-copy");
    let text = b"root:x:0:0:root:/root:/bin/bash\n".repeat(100);
    std::fs::write(&target, &text).unwrap();
    std::os::unix::fs::symlink(&target, dir.file()).unwrap();
    let e = Store::new(config(64, 0, &dir.file(), 0)).err().expect("a symbolic link is refused").to_string();
    assert!(e.contains("symbolic link") && e.contains(&dir.file().display().to_string()), "{e}");
    assert_eq!(std::fs::read(&target).unwrap(), text, "the target is untouched (not grown, not written)");
    // Forcing does not make compcache follow it either.
    let mut cfg = config(64, 0, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().force = true;
    assert!(Store::new(cfg).is_err());
    assert_eq!(std::fs::read(&target).unwrap(), text);
    // A dangling link does not make compcache create its target.
    let missing = dir.path().join("nowhere");
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    assert!(Store::new(config(64, 0, &dangling, 0)).is_err());
    assert!(!missing.exists(), "nothing created through the link");
}

#[test]
fn an_existing_file_without_compcache_signature_is_refused_untouched_unless_forced() {
    let dir = TempDir::new("backing");
    let text = b"someone's precious data\n".repeat(50_000);
    std::fs::write(dir.file(), &text).unwrap();
    set_mode(&dir.file(), 0o600);
    let e = Store::new(config(64, 0, &dir.file(), 0)).err().expect("refused").to_string();
    assert!(e.contains("not a compcache backing file") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(dir.file()).unwrap(), text, "untouched");
    let mut cfg = config(64, 0, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().force = true;
    let store = Store::new(cfg).unwrap();
    drop(store);
    let now = std::fs::read(dir.file()).unwrap();
    assert!(now.starts_with(compcache_store::backing::device::MAGIC), "taken over: signed");
    assert!(!contains(&now, b"precious"), "and its old contents are gone");
    // Signed now: the next start takes it without --force.
    drop(Store::new(config(64, 0, &dir.file(), 0)).unwrap());
}

#[test]
fn a_backing_file_others_can_read_is_refused_unless_forced() {
    let dir = TempDir::new("backing");
    drop(Store::new(config(64, 0, &dir.file(), 0)).unwrap());
    set_mode(&dir.file(), 0o640);
    let e = Store::new(config(64, 0, &dir.file(), 0)).err().expect("refused").to_string();
    assert!(e.contains("0640") && e.contains("chmod 600"), "{e}");
    assert_eq!(mode_of(&dir.file()), 0o640, "untouched");
    let mut cfg = config(64, 0, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().force = true;
    drop(Store::new(cfg).unwrap());
    assert_eq!(mode_of(&dir.file()), 0o600, "--force makes it private");
}

#[test]
fn a_second_store_on_the_same_backing_file_is_refused_while_the_first_is_open() {
    let dir = TempDir::new("backing");
    let first = Store::new(overflow_config(&dir.file())).unwrap();
    let mut ctx = first.context();
    first.write_page(&mut ctx, 3, &page(Kind::Random, 3, 1)).unwrap();
    assert_eq!(first.stats().bd_count, 1);
    let e = Store::new(overflow_config(&dir.file())).err().expect("refused").to_string();
    assert!(e.contains("in use by another compcache server") && e.contains(&dir.file().display().to_string()), "{e}");
    assert_eq!(read(&first, 3).unwrap(), page(Kind::Random, 3, 1), "the first is unharmed");
    drop(first);
    drop(Store::new(overflow_config(&dir.file())).unwrap());
}

/// `overflow_config` with records encrypted (the default) or not.
fn overflow_config_sealed(backing: &Path, encrypt: bool) -> Config {
    let mut cfg = overflow_config(backing);
    cfg.backing.as_mut().unwrap().encrypt = encrypt;
    cfg
}

#[test]
fn records_written_by_another_run_fail_their_check() {
    // Another run's key (encrypted) or identifier (checksummed): the same refusal.
    for encrypt in [true, false] {
        records_written_by_another_run_fail_their_check_with(encrypt);
    }
}

fn records_written_by_another_run_fail_their_check_with(encrypt: bool) {
    use std::os::unix::fs::FileExt;
    let dir = TempDir::new("backing");
    let n = 12;
    // Run A writes versions 1 of pages 0..n; a copy of its file is what another server
    // sharing the file (or a crashed run) leaves at the same places.
    let a = Store::new(overflow_config_sealed(&dir.file(), encrypt)).unwrap();
    let mut ctx = a.context();
    for i in 0..n {
        a.write_page(&mut ctx, i, &page(Kind::Random, i, 1)).unwrap();
    }
    assert_eq!(a.stats().bd_count, n);
    let other_run = std::fs::read(dir.file()).unwrap();
    drop(a);
    // Run B writes the same pages, to the same places (same sizes, same order, same segment
    // generations), version 2; then the other run's bytes come back under it.
    let b = Store::new(overflow_config_sealed(&dir.file(), encrypt)).unwrap();
    let mut ctx = b.context();
    for i in 0..n {
        b.write_page(&mut ctx, i, &page(Kind::Random, i, 2)).unwrap();
    }
    let f = std::fs::OpenOptions::new().write(true).open(dir.file()).unwrap();
    f.write_all_at(&other_run, 0).unwrap();
    for i in 0..n {
        match read(&b, i) {
            Ok(p) => panic!(
                "page {i}: another run's record was returned as data (version {})",
                if p == page(Kind::Random, i, 1) { 1 } else { 0 }
            ),
            Err(e) => assert!(matches!(e, StoreError::Corrupt { index, .. } if index == i) && e.errno() == libc_eio(), "{e}"),
        }
    }
    assert_eq!(b.stats().bd_errors, n, "each failure counted (encrypt: {encrypt})");
}

#[test]
fn with_encryption_the_backing_file_never_holds_page_data() {
    // One body, both ways: without encryption the marker is on the file (so the grep can see
    // it); with encryption (the default) it never is, while pages go out by overflow and
    // writeback, are moved by GC and are read back.
    for encrypt in [false, true] {
        let dir = TempDir::new("backing");
        let marker = b"SECRET-swapped-out-password-0123456789";
        let mut cfg = config(512, 0, &dir.file(), 0);
        let b = cfg.backing.as_mut().unwrap();
        b.incompressible = true;
        b.promote = false;
        b.encrypt = encrypt;
        assert!(BackingConfig::new("x").encrypt, "encryption is the default");
        let store = Store::new(cfg).unwrap();
        let mut ctx = store.context();
        // Raw pages by overflow; compressible pages (the marker among the literals of lz4) by
        // writeback.
        for i in 0..40 {
            store.write_page(&mut ctx, i, &marked_page(i, marker)).unwrap();
        }
        let texts: Vec<Vec<u8>> = (100..140)
            .map(|i| {
                let mut t = page(Kind::Text, i, 1);
                t[200..200 + marker.len()].copy_from_slice(marker);
                t
            })
            .collect();
        for (i, t) in (100..).zip(&texts) {
            store.write_page(&mut ctx, i, t).unwrap();
        }
        store.advance_clock(100);
        assert_eq!(store.writeback_idle(10, WritebackBudget::UNLIMITED).pages, 40);
        let on_file = |what: &str| {
            let image = std::fs::read(dir.file()).unwrap();
            assert_eq!(contains(&image, marker), !encrypt, "{what}: encrypt {encrypt}");
        };
        on_file("after overflow and writeback");
        for i in (0..40).step_by(2).chain((100..140).step_by(2)) {
            store.discard_page(i);
        }
        let gc = store.gc(u64::MAX);
        assert!(gc.pages_moved > 0, "{gc:?}");
        on_file("after GC");
        for i in (1..40).step_by(2) {
            assert_eq!(read(&store, i).unwrap(), marked_page(i, marker), "page {i} read back");
        }
        for i in (101..140).step_by(2) {
            assert_eq!(read(&store, i).unwrap(), texts[i as usize - 100], "page {i} read back");
        }
        assert_eq!(store.stats().bd_errors, 0);
    }
}

#[test]
fn a_flipped_bit_in_a_sealed_record_is_an_io_error_never_data() {
    use std::os::unix::fs::FileExt;
    for encrypt in [true, false] {
        let dir = TempDir::new("backing");
        let store = Store::new(overflow_config_sealed(&dir.file(), encrypt)).unwrap();
        let mut ctx = store.context();
        // Incompressible pages: records of 16 + 4096 bytes, in write order, three to a
        // segment (a record never straddles segments).
        for i in 0..4 {
            store.write_page(&mut ctx, i, &page(Kind::Random, i, 1)).unwrap();
        }
        let rec = 16 + PAGE as u64;
        let loc = |i: u64| i / 3 * SEG + i % 3 * rec;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(dir.file()).unwrap();
        let flip = |at: u64| {
            let mut b = [0u8];
            f.read_exact_at(&mut b, SUPERBLOCK_BYTES + at).unwrap();
            f.write_all_at(&[b[0] ^ 0x04], SUPERBLOCK_BYTES + at).unwrap();
        };
        flip(loc(0) + 5); // page 0: the tag (or the crc's zero padding)
        flip(loc(1) + 16 + 1000); // page 1: the payload
        flip(loc(3) + rec - 1); // page 3: its last byte
        let errors = store.stats().bd_errors;
        for i in [0, 1, 3] {
            let e = read(&store, i).unwrap_err();
            assert!(matches!(e, StoreError::Corrupt { index, .. } if index == i) && e.errno() == libc_eio(), "page {i}: {e}");
        }
        assert_eq!(read(&store, 2).unwrap(), page(Kind::Random, 2, 1), "its neighbours are unharmed");
        let s = store.stats();
        assert_eq!((s.bd_errors - errors, s.failed_reads), (3, 3), "counted: encrypt {encrypt}");
    }
}

#[test]
fn after_close_the_backing_file_holds_no_page_data() {
    let dir = TempDir::new("backing");
    let marker = b"SECRET-swapped-out-password-0123456789";
    // Overflow and writeback both put pages on the file. Unencrypted, so that the marker is
    // on the file to be seen going: the discard must hold without encryption too.
    let mut cfg = config(512, 0, &dir.file(), 0);
    cfg.backing.as_mut().unwrap().incompressible = true;
    cfg.backing.as_mut().unwrap().encrypt = false;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    for i in 0..40 {
        store.write_page(&mut ctx, i, &marked_page(i, marker)).unwrap();
    }
    let mut text = page(Kind::Text, 100, 1);
    text[200..200 + marker.len()].copy_from_slice(marker);
    store.write_page(&mut ctx, 100, &text).unwrap();
    store.advance_clock(100);
    assert_eq!(store.writeback_idle(10, WritebackBudget::UNLIMITED).pages, 1);
    assert!(contains(&std::fs::read(dir.file()).unwrap(), marker), "the pages are on the file");
    assert_eq!(read(&store, 100).unwrap(), text);
    drop(store);
    let after = std::fs::read(dir.file()).unwrap();
    assert!(!contains(&after, marker), "page data outlived the store");
    assert!(after[SUPERBLOCK_BYTES as usize..].iter().all(|&b| b == 0), "the data area is empty");

    // A server that cannot drop its store closes the device instead: the same, at once.
    let store = Store::new(overflow_config_sealed(&dir.file(), false)).unwrap();
    let mut ctx = store.context();
    store.write_page(&mut ctx, 0, &marked_page(0, marker)).unwrap();
    assert!(contains(&std::fs::read(dir.file()).unwrap(), marker));
    store.close_backing();
    assert!(!contains(&std::fs::read(dir.file()).unwrap(), marker), "close_backing empties the file");
    assert!(read(&store, 0).is_err(), "a page of a closed device is an error, never data");
    assert!(store.write_page(&mut ctx, 1, &marked_page(1, marker)).is_err(), "nothing is written after close");
    assert!(!contains(&std::fs::read(dir.file()).unwrap(), marker));
}

#[test]
fn stale_data_in_a_reused_backing_file_is_discarded_at_start() {
    use std::os::unix::fs::FileExt;
    let dir = TempDir::new("backing");
    drop(Store::new(overflow_config(&dir.file())).unwrap());
    // As a killed server leaves it: signed, with page data in it.
    let f = std::fs::OpenOptions::new().write(true).open(dir.file()).unwrap();
    f.write_all_at(b"STALE-PAGE-DATA", SUPERBLOCK_BYTES + 5000).unwrap();
    drop(f);
    let store = Store::new(overflow_config(&dir.file())).unwrap();
    assert!(!contains(&std::fs::read(dir.file()).unwrap(), b"STALE-PAGE-DATA"), "discarded when the device opens");
    drop(store);
}

#[test]
fn a_refused_start_removes_the_backing_file_it_created_and_only_that() {
    let dir = TempDir::new("backing");
    // Too small for 4 segments: refused after the file was made.
    let small = |p: &Path| config(64, 0, p, 2 * SEG);
    let e = Store::new(small(&dir.file())).err().expect("refused").to_string();
    assert!(e.contains("at least 4 segments") && e.contains("too few"), "{e}");
    assert!(!dir.file().exists(), "the file made for the refused start is gone");
    // An existing (signed) file is kept, refused or not, and a refusal does not touch it.
    drop(Store::new(config(64, 0, &dir.file(), 0)).unwrap());
    let before = std::fs::read(dir.file()).unwrap();
    assert!(Store::new(small(&dir.file())).is_err());
    assert_eq!(std::fs::read(dir.file()).unwrap(), before, "a file that was there before is not removed, nor resized");
    // abandon_backing, as a server whose start is refused later (a socket in use) calls it.
    let other = dir.path().join("new.img");
    let store = Store::new(config(64, 0, &other, 0)).unwrap();
    store.abandon_backing();
    assert!(!other.exists(), "abandon removes the file this store created");
    let store = Store::new(config(64, 0, &dir.file(), 0)).unwrap();
    store.abandon_backing();
    assert!(dir.file().exists(), "and only that");
}
