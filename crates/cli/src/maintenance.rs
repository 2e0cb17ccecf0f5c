//! Background maintenance of a served device: automatic compaction, and the recompression
//! thread.
//!
//! zram compacts only when userspace writes to `compact` or the kernel's shrinker asks. A swap
//! device sees constant overwrite and discard churn, which leaves zspages half empty; here a
//! thread checks once a second how many pool pages compaction could give back and compacts when
//! that is worth it (at least 1/64 of the pool and 1 MiB), so `mem_used_total` stays close to
//! `compr_data_size` without anyone asking. Compaction runs concurrently with I/O (it locks one
//! slot at a time, see the store's locking rules).

use compcache_store::Store;
use std::sync::Arc;
use std::time::Duration;

const PERIOD: Duration = Duration::from_secs(1);
/// Compact when at least this many pages (1 MiB) can be given back...
const MIN_PAGES: u64 = 256;
/// ...and they are at least 1/FRACTION of the pool.
const FRACTION: u64 = 64;

/// Whether compaction is worth running now.
pub fn worth_compacting(compactable_pages: u64, pool_pages: u64) -> bool {
    compactable_pages >= MIN_PAGES && compactable_pages * FRACTION >= pool_pages
}

/// Starts the maintenance thread for `store`. It runs for the life of the process.
pub fn spawn(store: Arc<Store>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("maintenance".into()).spawn(move || loop {
        std::thread::sleep(PERIOD);
        let compactable = store.compactable_pages();
        if worth_compacting(compactable, store.stats().pages_used) {
            store.compact();
        }
    })
}

/// How often the recompression thread takes a step while there is work, or may be.
const RECOMPRESS_PERIOD: Duration = Duration::from_millis(200);
/// The longest it sleeps on a settled device, and never more than a quarter of the idle age.
/// A page that turns idle then waits that much longer to be found on a device of up to
/// 256 MiB (one step scans 65,536 slots); on larger ones a pass takes several steps.
const RECOMPRESS_SETTLED_MAX: Duration = Duration::from_secs(5);
/// The recompression thread's nice value: it yields the CPU to the I/O threads.
const RECOMPRESS_NICE: libc::c_int = 10;

/// The recompression thread's next sleep, after a step that reported `rep`, the last sleep
/// being `last`, with pages recompressed after `idle_secs`: while steps find work (or are
/// skipped for a busy device) every `RECOMPRESS_PERIOD`; after a whole pass over the device
/// found nothing, the sleep doubles, up to `RECOMPRESS_SETTLED_MAX` and a quarter of the idle
/// age. A device that holds only recompressed or young pages (or none) then wakes its thread
/// once in a few seconds instead of five times a second: what a phone or a netbook on battery
/// wants from a process that mostly sleeps.
pub fn next_recompress_sleep(rep: &compcache_store::RecompressReport, last: Duration, idle_secs: u64) -> Duration {
    if !rep.settled {
        return RECOMPRESS_PERIOD;
    }
    let cap = RECOMPRESS_SETTLED_MAX.min(Duration::from_millis(idle_secs.saturating_mul(250))).max(RECOMPRESS_PERIOD);
    (last * 2).clamp(RECOMPRESS_PERIOD, cap)
}

/// Starts the recompression thread for `store` (which has recompression on): a step every
/// 200 ms within the configured CPU share (`Store::recompress_step`), less often while the
/// device is settled (`next_recompress_sleep`), at nice 10. It runs for the life of the
/// process. In a swap server it is started after the memory is pinned, so it inherits
/// `PR_SET_IO_FLUSHER` and its allocations are locked.
pub fn spawn_recompression(store: Arc<Store>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("recompress".into()).spawn(move || {
        // SAFETY: setpriority with PRIO_PROCESS and who = 0 changes this thread's nice value
        // only (Linux: a thread is a "process" to it); no memory is passed.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, RECOMPRESS_NICE) } != 0 {
            crate::log::warning(&format!("recompression thread: cannot lower its priority: {}", std::io::Error::last_os_error()));
        }
        let mut last = std::time::Instant::now();
        let mut sleep = RECOMPRESS_PERIOD;
        loop {
            std::thread::sleep(sleep);
            let rep = store.recompress_step(last.elapsed());
            last = std::time::Instant::now();
            // The idle age only matters once settled (and reading it formats the settings).
            let idle_secs = if rep.settled { store.recompression_settings().map_or(0, |s| s.idle_secs) } else { 0 };
            sleep = next_recompress_sleep(&rep, sleep, idle_secs);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacts_only_when_enough_can_be_given_back() {
        assert!(!worth_compacting(0, 1000));
        assert!(!worth_compacting(255, 300), "under 1 MiB is not worth a pass");
        assert!(!worth_compacting(1000, 100_000), "1% of the pool is not worth a pass");
        assert!(worth_compacting(2000, 100_000));
    }

    #[test]
    fn a_settled_device_wakes_the_recompression_thread_less_and_work_wakes_it_again() {
        use compcache_store::RecompressReport;
        let settled = RecompressReport { settled: true, ..Default::default() };
        let ms = Duration::from_millis;
        let mut sleep = RECOMPRESS_PERIOD;
        let mut sleeps = vec![];
        for _ in 0..7 {
            sleep = next_recompress_sleep(&settled, sleep, 60);
            sleeps.push(sleep.as_millis());
        }
        assert_eq!(sleeps, [400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(next_recompress_sleep(&RecompressReport { done: 1, ..Default::default() }, sleep, 60), RECOMPRESS_PERIOD);
        let busy = RecompressReport { busy: true, ..Default::default() };
        assert_eq!(next_recompress_sleep(&busy, ms(5000), 60), RECOMPRESS_PERIOD, "a busy device is watched closely");
        assert_eq!(next_recompress_sleep(&settled, ms(3200), 4), ms(1000), "at most a quarter of the idle age");
        assert_eq!(next_recompress_sleep(&settled, ms(200), 0), RECOMPRESS_PERIOD, "idle age 0: never slower than the period");
    }

    #[test]
    fn the_thread_compacts_a_fragmented_device() {
        use compcache_store::{Config, PAGE_SIZE};
        let store = Arc::new(Store::new(Config::with_disksize(8192 * PAGE_SIZE as u64)).unwrap());
        let mut ctx = store.context();
        let mut page = vec![0u8; PAGE_SIZE];
        for i in 0..8192u64 {
            // distinct, compressible pages of a few sizes
            for (j, b) in page.iter_mut().enumerate() {
                *b = if j < 600 + (i as usize % 7) * 64 { (i as usize * 7 + j * 13) as u8 } else { 0x20 + (j % 3) as u8 };
            }
            page[..8].copy_from_slice(&i.to_le_bytes());
            store.write_page(&mut ctx, i, &page).unwrap();
        }
        for i in (0..8192u64).filter(|i| i % 8 != 0) {
            store.discard_page(i);
        }
        assert!(worth_compacting(store.compactable_pages(), store.stats().pages_used));
        let before = store.stats().mem_used_total;
        spawn(store.clone()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.stats().pages_compacted == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(store.stats().mem_used_total < before, "the maintenance thread compacted");
    }
}
