//! Property test: random sequences of whole-page writes, partial writes, discards,
//! write-zeroes, reads and compactions always read back exactly what a plain byte-array model
//! holds, and the statistics always match what the model can count.

mod common;

use common::{kind_strategy as kind, page, Kind, PAGE};
use compcache_store::{Algorithm, Config, Store};
use proptest::prelude::*;

const PAGES: u64 = 48;

#[derive(Debug, Clone)]
enum Op {
    Write { index: u64, kind: Kind, version: u64 },
    Partial { offset: u64, len: usize, byte: u8 },
    Discard { offset: u64, len: u64 },
    Zeroes { offset: u64, len: u64 },
    Read { offset: u64, len: usize },
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    let size = PAGES * PAGE as u64;
    prop_oneof![
        6 => (0..PAGES, kind(), 0..1000u64).prop_map(|(index, kind, version)| Op::Write { index, kind, version }),
        2 => (0..size - 1, 1..3 * PAGE, any::<u8>()).prop_map(move |(offset, len, byte)| Op::Partial { offset, len: len.min((size - offset) as usize), byte }),
        2 => (0..size, 1..6 * PAGE as u64).prop_map(move |(offset, len)| Op::Discard { offset, len: len.min(size - offset) }),
        1 => (0..size, 1..3 * PAGE as u64).prop_map(move |(offset, len)| Op::Zeroes { offset, len: len.min(size - offset) }),
        4 => (0..size - 1, 1..3 * PAGE).prop_map(move |(offset, len)| Op::Read { offset, len: len.min((size - offset) as usize) }),
        1 => Just(Op::Compact),
    ]
}

/// The model: bytes, plus whether each page is stored at all (discarded pages are not).
struct Model {
    bytes: Vec<u8>,
    stored: Vec<bool>,
    writes: u64,
    notify_free: u64,
}

fn same_filled(p: &[u8]) -> bool {
    p.chunks_exact(8).all(|c| c == &p[..8])
}

fn check(alg: Algorithm, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut cfg = Config::with_disksize(PAGES * PAGE as u64);
    cfg.algorithm = alg;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    let mut m = Model { bytes: vec![0; PAGES as usize * PAGE], stored: vec![false; PAGES as usize], writes: 0, notify_free: 0 };
    let pages_of = |offset: u64, len: u64| (offset / PAGE as u64)..(offset + len).div_ceil(PAGE as u64);
    for op in ops {
        match op {
            Op::Write { index, kind, version } => {
                let p = page(kind, index, version);
                store.write_page(&mut ctx, index, &p).unwrap();
                m.bytes[index as usize * PAGE..][..PAGE].copy_from_slice(&p);
                m.stored[index as usize] = true;
                m.writes += 1;
            }
            Op::Partial { offset, len, byte } => {
                let data = vec![byte; len];
                store.write(&mut ctx, offset, &data).unwrap();
                m.bytes[offset as usize..][..len].copy_from_slice(&data);
                for i in pages_of(offset, len as u64) {
                    m.stored[i as usize] = true;
                    m.writes += 1;
                }
            }
            Op::Discard { offset, len } => {
                store.discard(offset, len).unwrap();
                for i in offset.div_ceil(PAGE as u64)..(offset + len) / PAGE as u64 {
                    m.bytes[i as usize * PAGE..][..PAGE].fill(0);
                    if std::mem::take(&mut m.stored[i as usize]) {
                        m.notify_free += 1;
                    }
                }
            }
            Op::Zeroes { offset, len } => {
                store.write_zeroes(&mut ctx, offset, len).unwrap();
                m.bytes[offset as usize..][..len as usize].fill(0);
                for i in pages_of(offset, len) {
                    let whole = i * PAGE as u64 >= offset && (i + 1) * PAGE as u64 <= offset + len;
                    if whole {
                        if std::mem::take(&mut m.stored[i as usize]) {
                            m.notify_free += 1;
                        }
                    } else {
                        m.stored[i as usize] = true;
                        m.writes += 1;
                    }
                }
            }
            Op::Read { offset, len } => {
                let mut buf = vec![0xEE; len];
                store.read(&mut ctx, offset, &mut buf).unwrap();
                prop_assert!(buf == m.bytes[offset as usize..][..len], "read at {offset}+{len} differs");
            }
            Op::Compact => {
                store.compact();
            }
        }
        let s = store.stats();
        let stored = m.stored.iter().filter(|&&b| b).count() as u64;
        let same = (0..PAGES as usize).filter(|&i| m.stored[i] && same_filled(&m.bytes[i * PAGE..][..PAGE])).count() as u64;
        prop_assert_eq!(s.orig_data_size, stored * PAGE as u64);
        prop_assert_eq!(s.same_pages, same);
        prop_assert_eq!(s.pages_stored, stored - same);
        prop_assert_eq!(s.num_writes, m.writes);
        prop_assert_eq!(s.notify_free, m.notify_free);
        prop_assert!(s.compr_data_size >= s.huge_pages * PAGE as u64);
        prop_assert!(s.compr_data_size <= (stored - same) * PAGE as u64);
        prop_assert!(s.mem_used_total >= s.compr_data_size);
        prop_assert_eq!(s.failed_reads + s.failed_writes, 0);
    }
    // Everything reads back at the end, page by page.
    for i in 0..PAGES {
        let mut p = vec![0u8; PAGE];
        store.read_page(&mut ctx, i, &mut p).unwrap();
        prop_assert!(p == m.bytes[i as usize * PAGE..][..PAGE], "page {i}");
    }
    // Discarding everything gives every pool page back.
    store.discard(0, PAGES * PAGE as u64).unwrap();
    let s = store.stats();
    prop_assert_eq!((s.mem_used_total, s.compr_data_size, s.orig_data_size), (0, 0, 0));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn lz4_store_matches_the_model(ops in prop::collection::vec(op(), 1..120)) {
        check(Algorithm::Lz4, ops)?;
    }

    #[test]
    fn zstd_store_matches_the_model(ops in prop::collection::vec(op(), 1..60)) {
        check(Algorithm::Zstd, ops)?;
    }
}
