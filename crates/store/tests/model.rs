//! Property test: random sequences of whole-page writes, partial writes, discards,
//! write-zeroes, reads and compactions always read back exactly what a plain byte-array model
//! holds, and the statistics always match what the model can count.

mod common;

use common::model::{ram_op as op, Model, Op};
use common::PAGE;
use compcache_store::{Algorithm, Config, Store};
use proptest::prelude::*;

const PAGES: u64 = 48;

fn same_filled(p: &[u8]) -> bool {
    p.chunks_exact(8).all(|c| c == &p[..8])
}

fn check(alg: Algorithm, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut cfg = Config::with_disksize(PAGES * PAGE as u64);
    cfg.algorithm = alg;
    let store = Store::new(cfg).unwrap();
    let mut ctx = store.context();
    let mut m = Model::new(PAGES);
    for op in ops {
        m.apply(&store, &mut ctx, op)?;
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
    fn lz4_store_matches_the_model(ops in prop::collection::vec(op(PAGES), 1..120)) {
        check(Algorithm::Lz4, ops)?;
    }

    #[test]
    fn zstd_store_matches_the_model(ops in prop::collection::vec(op(PAGES), 1..60)) {
        check(Algorithm::Zstd, ops)?;
    }
}
