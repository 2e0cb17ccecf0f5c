//! Fault-free mode, the swap server's guarantee: once `prefault` has filled the reserve, the
//! I/O path takes no page fault at all. A fault there may wait in reclaim for memory that only
//! the swap-outs this server is serving can free (a deadlock the whole machine feels), so
//! every page the path touches (pool pages, their descriptors, the free and partial lists)
//! must already be resident. The tests count this thread's page faults (getrusage) across
//! writes into every size class, overwrites, discards and reads; and, with a backing file,
//! across writes that overflow to it, reads of single pages and of multi-page runs from it,
//! and the writeback thread's work (which holds slot locks that requests wait on).

mod common;

use common::{write_until_error, xorshift, PAGE};
use compcache_store::testing::TempDir;
use compcache_store::{
    BackingConfig, Config, DictSource, FileDevice, RecompressConfig, Store, StoreError, WritebackBudget, PREFAULT_CHUNK_PAGES,
};
use std::sync::Arc;

/// Page faults this thread has taken so far (minor and major).
fn thread_faults() -> u64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    (ru.ru_minflt + ru.ru_majflt) as u64
}

/// A page that compresses to roughly `incompressible` bytes: a random prefix, then text.
fn page_of(index: u64, version: u64, incompressible: usize) -> Vec<u8> {
    let mut rng = xorshift(index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version);
    let mut p: Vec<u8> = b"swapped out page ".iter().copied().cycle().take(PAGE).collect();
    p[..incompressible].iter_mut().for_each(|b| *b = rng() as u8);
    p[..8].copy_from_slice(&index.to_le_bytes());
    p[8..16].copy_from_slice(&version.to_le_bytes());
    p
}

/// Makes resident what a swap server's mlockall makes resident and the store does not own:
/// this thread's stack as deep as the I/O path goes (a server's threads get theirs populated
/// at creation), and the code of the process, its libraries' included. Without the code, a
/// path that runs only now and then (a lock's slow path, which calls `sched_yield` when the
/// recompression thread holds a pool lock) faults its first instruction's page in, and this
/// test would count a fault the server cannot take. The store's own memory is not touched: it
/// is what the tests check.
#[inline(never)]
fn make_resident_what_mlockall_would() {
    let mut deep = [0u8; 256 * 1024];
    std::hint::black_box(&mut deep);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (range, perms) = (fields.next().unwrap(), fields.next().unwrap());
        // Executable mappings only; [vsyscall] cannot be read from user mode.
        if !perms.starts_with("r-x") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (usize::from_str_radix(start, 16).unwrap(), usize::from_str_radix(end, 16).unwrap());
        for addr in (start..end).step_by(PAGE) {
            // SAFETY: `addr` lies in a readable mapping of this process (r-x above), listed
            // just now; code mappings are not unmapped while the test runs. A volatile read so
            // that the load is done.
            unsafe { std::ptr::read_volatile(addr as *const u8) };
        }
    }
}

#[test]
fn the_io_path_takes_no_page_fault_once_the_reserve_is_prefaulted() {
    ram_io_path_faults(Config::with_disksize(RAM_PAGES * PAGE as u64), false);
}

/// The same with recompression running on another thread all along (re-encoding pages,
/// training and installing dictionaries): the I/O thread decodes recompressed pages and still
/// faults nothing.
#[test]
fn recompression_in_the_background_adds_no_page_fault() {
    // An administrator's dictionary (installed whatever its gain), so that the reads decode
    // pages with one.
    let dir = TempDir::new("fault-free-dict");
    let dict = dir.path().join("pages.dict");
    let samples: Vec<Vec<u8>> = (0..300).map(|i| page_of(i + RAM_PAGES, 1, (i * 13 % 3000) as usize)).collect();
    std::fs::write(&dict, zstd::dict::from_samples(&samples, 16 << 10).unwrap()).unwrap();
    let rc = RecompressConfig { idle_secs: 0, min_saving_bytes: 1, dict: DictSource::File(dict), ..RecompressConfig::default() };
    ram_io_path_faults(Config { recompress: Some(rc), ..Config::with_disksize(RAM_PAGES * PAGE as u64) }, true);
}

const RAM_PAGES: u64 = 8192;

fn ram_io_path_faults(cfg: Config, recompress: bool) {
    const RESERVE_PAGES: u64 = 3000;
    const PAGES: u64 = RAM_PAGES;
    let store = Arc::new(Store::new(cfg).unwrap());
    let mut ctx = store.context();
    // What a swap server does before it starts: slot table resident, reserve filled,
    // fault-free on.
    let mut page = vec![0u8; PAGE];
    store.make_slot_table_resident();
    assert_eq!(store.prefault(RESERVE_PAGES), RESERVE_PAGES);
    store.set_fault_free(true);

    // Every payload size from incompressible to nearly nothing, so that most size classes get
    // zspages (and partial lists), in an order that mixes them. Made before counting.
    let sizes = |i: u64| ((i * 2654435761) % 4000) as usize;
    let data: Vec<Vec<u8>> = (0..PAGES).map(|i| page_of(i, 1, sizes(i))).collect();
    let again: Vec<Vec<u8>> = (0..PAGES).map(|i| page_of(i, 2, sizes(i + 7))).collect();
    // Warm this thread's stack and the context's buffers on a page outside the test (with
    // recompression: also its decoders, on a page recompressed with and without dictionary).
    store.write_page(&mut ctx, PAGES - 1, &data[3]).unwrap();
    if recompress {
        store.recompress(std::time::Duration::from_secs(1));
        assert_eq!(store.stats().recomp_dict_pages, 1, "the page is recompressed with the dictionary: {:?}", store.stats());
        store.read_page(&mut ctx, PAGES - 1, &mut page).unwrap();
    }
    store.read_page(&mut ctx, PAGES - 1, &mut page).unwrap();
    store.discard_page(PAGES - 1);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = recompress.then(|| {
        let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                store.recompress(std::time::Duration::from_millis(5));
                rounds += 1;
            }
            rounds
        })
    });

    make_resident_what_mlockall_would();
    let before = thread_faults();
    let mut stored = 0u64;
    let mut refused = 0u64;
    for i in 0..PAGES - 1 {
        match store.write_page(&mut ctx, i, &data[i as usize]) {
            Ok(()) => stored += 1,
            Err(StoreError::NoSpace { .. }) => refused += 1,
            Err(e) => panic!("write {i}: {e}"),
        }
    }
    // Churn: overwrite every third page (full zspages go back on partial lists), discard
    // every fifth (zspages empty and their pages return to the free lists), read all.
    for i in (0..PAGES - 1).step_by(3) {
        let _ = store.write_page(&mut ctx, i, &again[i as usize]);
    }
    for i in (0..PAGES - 1).step_by(5) {
        store.discard_page(i);
    }
    let mut good = 0u64;
    for i in 0..PAGES - 1 {
        if store.read_page(&mut ctx, i, &mut page).is_ok() && (page == data[i as usize] || page == again[i as usize]) {
            good += 1;
        }
    }
    let faults = thread_faults() - before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(bg) = background {
        assert!(bg.join().unwrap() > 0);
        assert!(store.stats().recompress_done > 0, "{:?}", store.stats());
    }

    assert!(stored > 1000 && refused > 0, "the reserve should take some pages and refuse the rest: stored {stored}, refused {refused}");
    assert!(good > 1000, "pages read back: {good}");
    assert_eq!(faults, 0, "the I/O path faulted {faults} times in fault-free mode (stored {stored} pages)");
}

#[test]
fn the_backing_path_takes_no_page_fault_either() {
    const WARM: u64 = 64;
    const RESERVE_PAGES: u64 = 512;
    const PAGES: u64 = 4096 + WARM; // the test's pages (a multiple of 256), then the warm-up's
    let dir = TempDir::new("fault-free");
    let path = dir.file();
    let mut b = BackingConfig::new(&path);
    b.size_bytes = 64 << 20;
    let cfg = Config { mem_limit_bytes: 2 * RESERVE_PAGES * PAGE as u64, backing: Some(b), ..Config::with_disksize(PAGES * PAGE as u64) };
    let store = Arc::new(Store::new(cfg).unwrap());
    // Whether reads go through O_DIRECT (and so the aligned read buffer) here: not on tmpfs.
    // (Probed on a file of its own beside it: the store holds the backing file's lock.)
    let probe = compcache_store::DeviceOptions { size_bytes: 1 << 20, ..Default::default() };
    let direct = FileDevice::open(&dir.path().join("probe.img"), probe).unwrap().direct_reads();
    let mut ctx = store.context();
    let mut page = vec![0u8; PAGE];
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page).unwrap();
        store.discard_page(i);
    }
    store.set_fault_free(true);

    let sizes = |i: u64| ((i * 2654435761) % 4097) as usize; // raw pages too
    let data: Vec<Vec<u8>> = (0..PAGES).map(|i| page_of(i, 1, sizes(i))).collect();
    let again: Vec<Vec<u8>> = (0..PAGES).map(|i| page_of(i, 2, sizes(i + 3))).collect();
    // Nonzero, so that they are written (resident) now, not zero pages faulted in on first use.
    let mut run16 = vec![1u8; 16 * PAGE];
    let mut run256 = vec![1u8; 256 * PAGE];
    // Warm up on pages outside the test, as the RAM test does, before the reserve exists so
    // that these writes overflow: the thread's stack, and the code of the overflow and read
    // paths, whose first run faults its pages of the binary in (a swap server's mlockall makes
    // them resident). A one-page and a two-page read only: the buffers the longer reads below
    // use are the context's, made at its full size with it.
    let warm = PAGES - WARM;
    for i in warm..PAGES {
        store.write_page(&mut ctx, i, &data[i as usize]).unwrap();
    }
    store.read_page(&mut ctx, PAGES - 1, &mut page).unwrap();
    store.read(&mut ctx, (PAGES - 2) * PAGE as u64, &mut run16[..2 * PAGE]).unwrap();
    for i in warm..PAGES {
        store.discard_page(i);
    }
    assert_eq!(store.prefault(RESERVE_PAGES), RESERVE_PAGES);
    assert_eq!(store.stats().bd_overflow_pages, WARM, "the warm-up's writes overflow");

    make_resident_what_mlockall_would();
    let before = thread_faults();
    // Writes: the reserve takes what it can, the rest overflows to the device.
    for i in 0..warm {
        store.write_page(&mut ctx, i, &data[i as usize]).unwrap();
    }
    let write_faults = thread_faults() - before;
    let overflowed = store.stats().bd_overflow_pages;

    // The server's writeback thread (crates/cli/src/backing.rs): moves what is in RAM out.
    // It is not the I/O path, but requests wait for the slot locks it takes, so nothing it
    // does under one may fault; here it faults nothing at all.
    let s = Arc::clone(&store);
    let (wb, writeback_faults) = std::thread::spawn(move || {
        make_resident_what_mlockall_would();
        let before = thread_faults();
        let r = s.writeback_idle(0, WritebackBudget::UNLIMITED);
        (r, thread_faults() - before)
    })
    .join()
    .unwrap();

    let before = thread_faults();
    let mut good = 0u64;
    let mut check = |first: u64, buf: &[u8], versions: &[&Vec<Vec<u8>>]| {
        for (k, p) in buf.chunks_exact(PAGE).enumerate() {
            let i = (first + k as u64) as usize;
            assert!(versions.iter().any(|v| p == v[i]), "page {i} read back wrong");
            good += 1;
        }
    };
    for i in 0..warm {
        store.read_page(&mut ctx, i, &mut page).unwrap();
        check(i, &page, &[&data]);
    }
    for i in (0..warm).step_by(16) {
        store.read(&mut ctx, i * PAGE as u64, &mut run16).unwrap();
        check(i, &run16, &[&data]);
    }
    for i in (0..warm).step_by(256) {
        store.read(&mut ctx, i * PAGE as u64, &mut run256).unwrap();
        check(i, &run256, &[&data]);
    }
    // Overwrites and discards of pages on the device free their records; read all again.
    for i in (0..warm).step_by(3) {
        store.write_page(&mut ctx, i, &again[i as usize]).unwrap();
    }
    for i in (0..warm).step_by(5) {
        store.discard_page(i);
    }
    for i in (0..warm).step_by(256) {
        store.read(&mut ctx, i * PAGE as u64, &mut run256).unwrap();
        for (k, p) in run256.chunks_exact(PAGE).enumerate() {
            let j = i as usize + k;
            assert!(p == data[j] || p == again[j] || (j % 5 == 0 && p.iter().all(|&b| b == 0)), "page {j} read back wrong");
        }
    }
    let read_faults = thread_faults() - before;

    let st = store.stats();
    eprintln!(
        "backing fault-free: O_DIRECT reads {direct}; {overflowed} of {warm} pages overflowed, {} written back in {} pwrites, \
         {} device reads, {} promoted; faults: writes {write_faults}, writeback {writeback_faults}, reads {read_faults}",
        wb.pages, wb.writes, st.bd_reads, st.bd_promoted_pages
    );
    assert!(
        overflowed > 1000 && wb.pages > 200 && wb.writes >= 2,
        "the test should overflow and write back: {overflowed} overflowed, {wb:?}"
    );
    assert!(good == 3 * warm && st.bd_reads > 3 * (warm - 1000), "pages read: {good}, device reads {}", st.bd_reads);
    assert_eq!(
        (write_faults, writeback_faults, read_faults),
        (0, 0, 0),
        "page faults in fault-free mode with a backing device (writes, writeback thread, reads)"
    );
}

/// A write that finds the reserve empty waits for the keeper (bounded), instead of failing
/// at once: the swap server's refusals (kernel "Write-error on swap-device") become rare. At
/// the memory limit no refill can come, and it fails without waiting.
#[test]
fn a_write_waits_for_the_reserve_only_when_a_refill_can_come() {
    use std::time::{Duration, Instant};
    let store = Arc::new(Store::new(Config::with_disksize(256 * PAGE as u64)).unwrap());
    store.set_fault_free(true); // and no reserve yet: every pool allocation fails
    let mut ctx = store.context();
    let p = page_of(1, 1, 2000);
    assert!(matches!(store.write_page(&mut ctx, 1, &p), Err(StoreError::NoSpace { .. })), "no wait by default");

    store.set_reserve_wait(Duration::from_secs(10));
    let keeper = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            store.prefault(16)
        })
    };
    let t = Instant::now();
    store.write_page(&mut ctx, 1, &p).expect("the write waits for the refill");
    let waited = t.elapsed();
    assert_eq!(keeper.join().unwrap(), 16);
    assert!(waited >= Duration::from_millis(25) && waited < Duration::from_secs(10), "waited {waited:?}");
    let mut back = vec![0u8; PAGE];
    store.read_page(&mut ctx, 1, &mut back).unwrap();
    assert!(back == p);

    // The memory limit reached: nothing can refill, so no wait.
    let mut cfg = Config::with_disksize(256 * PAGE as u64);
    cfg.mem_limit_bytes = 2 * PAGE as u64;
    let limited = Store::new(cfg).unwrap();
    limited.set_fault_free(true);
    limited.set_reserve_wait(Duration::from_secs(10));
    assert_eq!(limited.prefault(100), 2, "prefault stops at the limit");
    let mut ctx = limited.context();
    let t = Instant::now();
    let (_, err) = write_until_error(&limited, &mut ctx, |i| page_of(i, 1, 3000));
    assert!(matches!(err, StoreError::NoSpace { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "failed at the limit only after {:?}", t.elapsed());
}

/// A wait that ends with nothing added (a keeper stuck in reclaim) marks the reserve starved:
/// the writes after it fail at once instead of each waiting in turn, until the keeper adds
/// pages again; then writes go through, and a later empty reserve is waited for again.
#[test]
fn after_one_fruitless_wait_writes_fail_at_once_until_the_keeper_adds_pages() {
    use std::time::{Duration, Instant};
    let store = Store::new(Config::with_disksize(256 * PAGE as u64)).unwrap();
    store.set_fault_free(true);
    store.set_reserve_wait(Duration::from_millis(200));
    let mut ctx = store.context();
    let t = Instant::now();
    assert!(matches!(store.write_page(&mut ctx, 1, &page_of(1, 1, 2000)), Err(StoreError::NoSpace { .. })));
    assert!(t.elapsed() >= Duration::from_millis(190), "the first write waited the whole wait: {:?}", t.elapsed());
    let t = Instant::now();
    for i in 2..12 {
        assert!(matches!(store.write_page(&mut ctx, i, &page_of(i, 1, 2000)), Err(StoreError::NoSpace { .. })));
    }
    assert!(t.elapsed() < Duration::from_millis(150), "ten writes while starved took {:?}", t.elapsed());
    // The keeper adds pages: writes go through, and the reserve is waited for again.
    assert_eq!(store.prefault(16), 16);
    store.write_page(&mut ctx, 1, &page_of(1, 1, 2000)).expect("a page to take");
    let t = Instant::now();
    let (_, err) = write_until_error(&store, &mut ctx, |i| page_of(i, 1, 2000));
    assert!(matches!(err, StoreError::NoSpace { .. }), "{err}");
    assert!(t.elapsed() >= Duration::from_millis(190), "waited again once pages had come: {:?}", t.elapsed());
}

/// A keeper's top-up reaches the writes waiting for it a chunk at a time
/// ([`PREFAULT_CHUNK_PAGES`]), not when the whole top-up is done: a keeper whose faults wait
/// in reclaim would otherwise hold back thousands of resident pages while writes fail. Here a
/// write waits on an empty reserve while a top-up of 256 MiB (tens of milliseconds of page
/// faults) runs; it must be stored before the top-up returns.
#[test]
fn a_top_up_feeds_the_waiting_writes_before_it_ends() {
    use std::time::{Duration, Instant};
    const TOP_UP: u64 = 64 * 1024;
    const { assert!(TOP_UP > 100 * PREFAULT_CHUNK_PAGES) };
    let store = Arc::new(Store::new(Config::with_disksize(2 * TOP_UP * PAGE as u64)).unwrap());
    store.set_fault_free(true);
    store.set_reserve_wait(Duration::from_secs(60));
    let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
    let writer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            let mut ctx = store.context();
            waiting_tx.send(()).unwrap();
            store.write_page(&mut ctx, 1, &page_of(1, 1, 2000)).expect("the write waits for the top-up");
            Instant::now()
        })
    };
    waiting_rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    assert_eq!(store.prefault(TOP_UP), TOP_UP);
    let ended = Instant::now();
    let stored = writer.join().unwrap();
    assert!(
        stored < ended,
        "the write was stored {:?} after the top-up ended (which took {:?}): the pages were held back until the end",
        stored - ended,
        ended - started
    );
    let mut back = vec![0u8; PAGE];
    store.read_page(&mut store.context(), 1, &mut back).unwrap();
    assert!(back == page_of(1, 1, 2000));
}

/// The reserve's keeper sleeps until the reserve is used: the write whose allocation leaves
/// fewer resident free pages than the keeper's mark wakes it (once, until it looks again), so
/// an idle swap server's keeper does not poll. Here the keeper parks for up to a minute, and
/// must be woken by the writes long before that.
#[test]
fn the_allocation_that_drains_the_reserve_wakes_its_keeper() {
    use std::time::{Duration, Instant};
    let store = Arc::new(Store::new(Config::with_disksize(1024 * PAGE as u64)).unwrap());
    assert_eq!(store.prefault(64), 64);
    store.set_fault_free(true);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let keeper = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            store.watch_reserve(48);
            store.rearm_reserve_watch();
            ready_tx.send(()).unwrap();
            let start = Instant::now();
            // park may also return spuriously: it is the reserve under the mark that counts.
            while store.reserve_free_pages() >= 48 && start.elapsed() < Duration::from_secs(60) {
                std::thread::park_timeout(Duration::from_secs(60));
            }
            let woken_after = start.elapsed();
            let refilled = store.prefault(64 - store.reserve_free_pages());
            (woken_after, refilled)
        })
    };
    ready_rx.recv().unwrap();
    let mut ctx = store.context();
    let mut i = 0;
    while store.reserve_free_pages() >= 48 {
        store.write_page(&mut ctx, i, &page_of(i, 1, 4000)).unwrap();
        i += 1;
    }
    let (woken_after, refilled) = keeper.join().unwrap();
    assert!(woken_after < Duration::from_secs(30), "the keeper slept {woken_after:?}: no allocation woke it");
    assert!(refilled > 0);
    // Every page written reads back.
    let mut back = vec![0u8; PAGE];
    for j in 0..i {
        store.read_page(&mut ctx, j, &mut back).unwrap();
        assert!(back == page_of(j, 1, 4000), "page {j}");
    }
}

/// The cold tier (the backing tier on a device in RAM, `backing/memdev.rs`): a read of a cold
/// page decodes its 64 KiB block with a zstd context and a buffer of the reading thread's own.
/// Made (and run once) when the thread makes its store context, they cost the I/O path no
/// page fault, even on a new thread's first cold read, single pages and runs alike.
#[test]
fn a_new_thread_reads_cold_pages_without_a_page_fault() {
    const PAGES: u64 = 2048;
    let cfg = Config { backing: Some(BackingConfig::in_memory(16 << 20)), ..Config::with_disksize(PAGES * PAGE as u64) };
    let store = Arc::new(Store::new(cfg).unwrap());
    let data: Arc<Vec<Vec<u8>>> = Arc::new((0..PAGES).map(|i| page_of(i, 1, ((i * 2654435761) % 4097) as usize)).collect());
    let mut ctx = store.context();
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &data[i as usize]).unwrap();
    }
    let wb = store.writeback_idle(0, WritebackBudget::UNLIMITED);
    assert!(wb.error.is_none() && wb.pages == PAGES, "every page goes cold: {wb:?}");
    store.set_fault_free(true);

    let (s, d) = (Arc::clone(&store), Arc::clone(&data));
    let (faults, good) = std::thread::spawn(move || {
        make_resident_what_mlockall_would();
        let mut ctx = s.context();
        let mut page = vec![1u8; PAGE];
        let mut run = vec![1u8; 16 * PAGE];
        let mut good = 0u64;
        let before = thread_faults();
        // Past the promotion window before each pass: these are reads of cold pages.
        s.advance_clock(60);
        for i in (0..PAGES).step_by(3) {
            s.read_page(&mut ctx, i, &mut page).unwrap();
            assert!(page == d[i as usize], "page {i} read back wrong");
            good += 1;
        }
        s.advance_clock(60);
        for i in (0..PAGES).step_by(16) {
            s.read(&mut ctx, i * PAGE as u64, &mut run).unwrap();
            for (k, p) in run.chunks_exact(PAGE).enumerate() {
                assert!(p == d[i as usize + k], "page {} read back wrong", i as usize + k);
                good += 1;
            }
        }
        (thread_faults() - before, good)
    })
    .join()
    .unwrap();
    let st = store.stats();
    eprintln!("cold fault-free: {good} pages read, {} device reads, {} promoted; faults {faults}", st.bd_reads, st.bd_promoted_pages);
    assert!(good == PAGES.div_ceil(3) + PAGES && st.bd_promoted_pages == 0, "{good} pages read, {st:?}");
    assert_eq!(faults, 0, "page faults reading cold pages on a thread that made its context");
}

/// A successor that takes a swap server's store over (`Store::recover`) inherits the reserve:
/// the free pool pages its predecessor had made resident are in the state file, and recovery
/// files them as resident, so the successor stores pages in fault-free mode at once, without
/// faulting a reserve in again (which, while memory is short and its own device is the swap
/// that would free some, might not complete).
#[test]
fn a_successor_inherits_the_reserve_and_stores_at_once() {
    const PAGES: u64 = 2048;
    const RESERVE_PAGES: u64 = 256;
    let cfg = Config::with_disksize(PAGES * PAGE as u64);
    let store = Store::new(cfg.clone()).unwrap();
    let mut ctx = store.context();
    assert_eq!(store.prefault(RESERVE_PAGES), RESERVE_PAGES);
    store.set_fault_free(true);
    let data: Vec<Vec<u8>> = (0..64).map(|i| page_of(i, 1, 1500)).collect();
    for (i, d) in data.iter().enumerate() {
        store.write_page(&mut ctx, i as u64, d).unwrap();
    }
    let reserve = store.reserve_free_pages();
    assert!(reserve > 0 && reserve < RESERVE_PAGES, "{reserve}");
    let fd = store.state_fd().unwrap().try_clone_to_owned().unwrap();
    // The server dies (a drop leaves every page of a store without a backing device).
    drop(ctx);
    drop(store);
    let (succ, report) = Store::recover(cfg, fd).unwrap();
    assert_eq!(report.lost_pages, 0);
    assert_eq!(succ.reserve_free_pages(), reserve, "the reserve is inherited, page for page");
    assert_eq!(succ.stats().mem_reserve_free, reserve * PAGE as u64);
    // Fault-free at once, no prefault: the inherited reserve takes the writes.
    succ.set_fault_free(true);
    let mut ctx = succ.context();
    let more: Vec<Vec<u8>> = (64..128).map(|i| page_of(i, 1, 1500)).collect();
    for (i, d) in more.iter().enumerate() {
        succ.write_page(&mut ctx, 64 + i as u64, d).unwrap();
    }
    assert!(succ.reserve_free_pages() < reserve);
    let mut page = vec![0u8; PAGE];
    for (i, d) in data.iter().chain(more.iter()).enumerate() {
        succ.read_page(&mut ctx, i as u64, &mut page).unwrap();
        assert_eq!(&page, d, "page {i}");
    }
}
