//! The stress harness of the concurrency tests (`concurrency.rs`, `backing.rs`): worker threads
//! write, discard and read random pages of one store while a background thread does the
//! store's own work (compaction, or writeback and GC) in a loop; every read must be plausible
//! (`super::plausible`: some version of that page, never torn, never another page's).

use super::{kind_of, page, plausible, xorshift, PAGE};
use compcache_store::{Store, WritebackBudget};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What the one operation in ten that is not a write, a discard or a single-page read is.
#[derive(Clone, Copy)]
pub enum Extra {
    /// WRITE_ZEROES of the whole page (which keeps the page plausible, unlike a partial write).
    WriteZeroes,
    /// A read of four pages at once (pages on a backing device: one `pread` per adjacent run).
    MultiRead,
}

pub struct Stress {
    pub pages: u64,
    pub threads: u64,
    pub ops_per_thread: u64,
    /// Worker `t` draws from `xorshift(seed + t)`.
    pub seed: u64,
    pub extra: Extra,
}

/// Runs the workers to the end while `background` runs round after round; returns how many
/// rounds it ran. Panics (fails the test) if a worker read a wrong page or got an error.
pub fn run(store: &Arc<Store>, s: Stress, mut background: impl FnMut(&Store, u64) + Send + 'static) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let bg = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                background(&store, rounds);
                rounds += 1;
                std::thread::yield_now();
            }
            rounds
        })
    };
    let pages = s.pages;
    let workers: Vec<_> = (0..s.threads)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut ctx = store.context();
                let mut rng = xorshift(s.seed + t);
                let mut buf = vec![0u8; PAGE];
                let mut multi = vec![0u8; 4 * PAGE];
                for n in 0..s.ops_per_thread {
                    let i = rng() % pages;
                    match rng() % 10 {
                        0..=3 => {
                            let v = (n * 4 + t) * 5 + rng() % 5;
                            store.write_page(&mut ctx, i, &page(kind_of(v), i, v)).unwrap();
                        }
                        4 => store.discard_page(i),
                        5 => match s.extra {
                            Extra::WriteZeroes => store.write_zeroes(&mut ctx, i * PAGE as u64, PAGE as u64).unwrap(),
                            Extra::MultiRead => {
                                let first = i.min(pages - 4);
                                store.read(&mut ctx, first * PAGE as u64, &mut multi).unwrap();
                                for (k, p) in multi.chunks_exact(PAGE).enumerate() {
                                    assert!(plausible(first + k as u64, p), "thread {t}: page {} is wrong", first + k as u64);
                                }
                            }
                        },
                        _ => {
                            store.read_page(&mut ctx, i, &mut buf).unwrap();
                            assert!(plausible(i, &buf), "thread {t}: page {i} holds data never written there");
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker saw wrong data or an error");
    }
    stop.store(true, Ordering::Relaxed);
    bg.join().expect("the background thread failed")
}

/// One round of a backing tier's maintenance thread in a stress run: a `maintain` step (which
/// must report no error), the clock a second on, and every eighth round an idle writeback of
/// pages `idle_secs` old, up to `idle_bytes`.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn maintenance_round(store: &Store, round: u64, idle_secs: u64, idle_bytes: u64) {
    let r = store.maintain(std::time::Duration::from_millis(10));
    assert!(r.writeback.error.is_none() && r.gc.error.is_none(), "{r:?}");
    store.advance_clock(1);
    if round % 8 == 0 {
        let r = store.writeback_idle(idle_secs, WritebackBudget { max_bytes: idle_bytes });
        assert!(r.error.is_none());
    }
}
