//! Threads writing, reading, discarding and compacting the same slots at once. Every read must
//! return a page that was written to that index (whole, never torn, never another index's),
//! or zeroes after a discard; the statistics must balance when the threads are done.

mod common;

use common::stress::{self, Extra, Stress};
use common::PAGE;
use compcache_store::{Config, Store};
use std::sync::Arc;

const PAGES: u64 = 256;

#[test]
fn concurrent_io_and_compaction_never_return_wrong_data() {
    let store = Arc::new(Store::new(Config::with_disksize(PAGES * PAGE as u64)).unwrap());
    let stress = Stress { pages: PAGES, threads: 4, ops_per_thread: 20_000, seed: 1, extra: Extra::WriteZeroes };
    let rounds = stress::run(&store, stress, |store, _| {
        store.compact();
    });
    assert!(rounds > 0);

    // Balance: discarding everything returns every pool page and zeroes every counter of data.
    store.discard(0, PAGES * PAGE as u64).unwrap();
    let s = store.stats();
    assert_eq!((s.orig_data_size, s.compr_data_size, s.same_pages, s.huge_pages, s.mem_used_total), (0, 0, 0, 0, 0));
    assert_eq!(s.failed_reads + s.failed_writes, 0);
}

#[test]
fn partial_writes_to_one_page_from_many_threads_lose_nothing() {
    // Each thread owns a disjoint byte range of the same page; read-modify-write must not let
    // one thread's update overwrite another's.
    let store = Arc::new(Store::new(Config::with_disksize(4 * PAGE as u64)).unwrap());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut ctx = store.context();
                for round in 0..500u32 {
                    let byte = t.wrapping_mul(50).wrapping_add(round as u8) | 1;
                    store.write(&mut ctx, PAGE as u64 + t as u64 * 1024, &[byte; 1024]).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let mut ctx = store.context();
    let mut p = vec![0u8; PAGE];
    store.read_page(&mut ctx, 1, &mut p).unwrap();
    for t in 0..4u8 {
        let want = t.wrapping_mul(50).wrapping_add(499u32 as u8) | 1;
        assert!(p[t as usize * 1024..][..1024].iter().all(|&b| b == want), "quarter {t} lost its last write");
    }
}
