//! `Store::block_status`: which ranges are holes (read as zeroes, hold no memory) and which
//! hold data, merged into extents, cut at the range's ends; against a model of page states
//! over random operations; with pages on a backing device.

mod common;

use common::{page, xorshift, Kind, PAGE};
use compcache_store::testing::TestDevice;
use compcache_store::{Allocation, BackingConfig, Config, Extent, Store, StoreError};

const P: u64 = PAGE as u64;
use Allocation::{Data, Hole};

fn extents(store: &Store, offset: u64, len: u64) -> Vec<(u64, Allocation)> {
    store.block_status(offset, len).unwrap().map(|e| (e.len_bytes, e.allocation)).collect()
}

/// A device of 16 pages laid out as: 0-1 data, 2 written with zeroes, 3 same-filled with a
/// non-zero word, 4-5 unwritten, 6-7 data then trimmed, 8-9 data then WRITE_ZEROES, 10 data,
/// 11-15 unwritten.
fn layout() -> Store {
    let store = Store::new(Config::with_disksize(16 * P)).unwrap();
    let mut ctx = store.context();
    for i in [0, 1, 6, 7, 8, 9, 10] {
        store.write(&mut ctx, i * P, &page(Kind::Text, i, 1)).unwrap();
    }
    store.write(&mut ctx, 2 * P, &[0u8; PAGE]).unwrap();
    store.write(&mut ctx, 3 * P, &[0x5au8; PAGE]).unwrap();
    store.discard(6 * P, 2 * P).unwrap();
    store.write_zeroes(&mut ctx, 8 * P, 2 * P).unwrap();
    store
}

#[test]
fn holes_zero_pages_same_filled_pages_and_data() {
    let store = layout();
    assert_eq!(
        extents(&store, 0, 16 * P),
        vec![(2 * P, Data), (P, Hole), (P, Data), (6 * P, Hole), (P, Data), (5 * P, Hole)],
        "a zero-filled page is a hole, a non-zero same-filled page is data; trimmed and zeroed pages are holes, merged with their unwritten neighbours"
    );
    // The zero-filled page is stored (a same-filled page, as zram counts it) but holds no memory.
    assert_eq!(store.stats().same_pages, 2);
}

#[test]
fn extents_are_cut_at_the_ends_of_an_unaligned_range() {
    let store = layout();
    // From the middle of page 1 to the middle of page 4.
    assert_eq!(extents(&store, P + 100, 3 * P), vec![(P - 100, Data), (P, Hole), (P, Data), (100, Hole)]);
    // Inside one page.
    assert_eq!(extents(&store, 10 * P + 1, 5), vec![(5, Data)]);
    // The whole device in one extent when it is all holes.
    let empty = Store::new(Config::with_disksize(1 << 30)).unwrap();
    assert_eq!(extents(&empty, 0, 1 << 30), vec![(1 << 30, Hole)]);
    assert_eq!(extents(&empty, 3, (1 << 30) - 3), vec![((1 << 30) - 3, Hole)]);
}

#[test]
fn the_iterator_is_lazy_and_a_caller_can_take_one_extent() {
    let store = layout();
    let mut it = store.block_status(0, 16 * P).unwrap();
    assert_eq!(it.next(), Some(Extent { len_bytes: 2 * P, allocation: Data }));
    assert_eq!(it.next(), Some(Extent { len_bytes: P, allocation: Hole }));
    // A query changes nothing: no access time, no counter.
    let before = store.stats();
    let _ = extents(&store, 0, 16 * P);
    let after = store.stats();
    assert_eq!((before.num_reads, before.num_writes, before.invalid_io), (after.num_reads, after.num_writes, after.invalid_io));
}

#[test]
fn ranges_past_the_end_are_refused() {
    let store = layout();
    assert!(matches!(store.block_status(15 * P, 2 * P), Err(StoreError::OutOfRange { .. })));
    assert!(matches!(store.block_status(u64::MAX, 2), Err(StoreError::OutOfRange { .. })));
    assert_eq!(extents(&store, 16 * P, 0), vec![], "an empty range has no extents");
}

/// Random writes (data, zero pages, same-filled pages, partial pages), discards and
/// write-zeroes, against a model of which pages are holes; every query over a random range
/// must match the model exactly, merged.
#[test]
fn random_operations_match_a_model_of_page_states() {
    const PAGES: u64 = 64;
    let store = Store::new(Config::with_disksize(PAGES * P)).unwrap();
    let mut ctx = store.context();
    let mut model = vec![Hole; PAGES as usize];
    let mut rnd = xorshift(0xb10c_57a7);
    for step in 0..4000u64 {
        let first = rnd() % PAGES;
        let n = 1 + rnd() % 4.min(PAGES - first);
        match rnd() % 6 {
            0 => {
                for i in first..first + n {
                    store.write(&mut ctx, i * P, &page(Kind::Mixed, i, step)).unwrap();
                    model[i as usize] = Data;
                }
            }
            1 => {
                store.write(&mut ctx, first * P, &vec![0u8; (n * P) as usize]).unwrap();
                model[first as usize..(first + n) as usize].fill(Hole);
            }
            2 => {
                store.write(&mut ctx, first * P, &vec![1 + (step % 200) as u8; (n * P) as usize]).unwrap();
                model[first as usize..(first + n) as usize].fill(Data);
            }
            3 => {
                store.discard(first * P, n * P).unwrap();
                model[first as usize..(first + n) as usize].fill(Hole);
            }
            4 => {
                // A few non-zero bytes inside a page make it data; zeroes over a hole keep it one.
                let at = first * P + rnd() % (P - 8);
                if rnd() % 2 == 0 {
                    store.write(&mut ctx, at, b"12345678").unwrap();
                    model[first as usize] = Data;
                } else {
                    store.write_zeroes(&mut ctx, first * P, n * P).unwrap();
                    model[first as usize..(first + n) as usize].fill(Hole);
                }
            }
            _ => {
                let offset = rnd() % (PAGES * P);
                let len = 1 + rnd() % (PAGES * P - offset);
                let got = extents(&store, offset, len);
                assert_eq!(got.iter().map(|e| e.0).sum::<u64>(), len, "step {step}: extents cover the range");
                let mut pos = offset;
                for (k, &(bytes, state)) in got.iter().enumerate() {
                    assert!(bytes > 0);
                    if k > 0 {
                        assert_ne!(state, got[k - 1].1, "step {step}: adjacent extents are merged");
                    }
                    for p in pos / P..(pos + bytes).div_ceil(P) {
                        assert_eq!(state, model[p as usize], "step {step}: page {p}");
                    }
                    pos += bytes;
                }
            }
        }
    }
}

#[test]
fn pages_on_the_backing_device_are_data() {
    let mut cfg = Config::with_disksize(8 * P);
    let mut b = BackingConfig::new("memory");
    b.incompressible = true; // incompressible pages go straight to the device
    b.segment_bytes = 16 << 10;
    cfg.backing = Some(b);
    let store = Store::with_backing_device(cfg, Box::new(TestDevice::memory(4 << 20))).unwrap();
    let mut ctx = store.context();
    store.write(&mut ctx, 2 * P, &page(Kind::Random, 2, 1)).unwrap();
    assert_eq!(store.stats().bd_count, 1, "the random page is on the backing device");
    assert_eq!(extents(&store, 0, 8 * P), vec![(2 * P, Hole), (P, Data), (5 * P, Hole)]);
    store.discard(2 * P, P).unwrap();
    assert_eq!(extents(&store, 0, 8 * P), vec![(8 * P, Hole)]);
}
