//! Fault-free mode, the swap server's guarantee: once `prefault` has filled the reserve, the
//! I/O path takes no page fault at all. A fault there may wait in reclaim for memory that only
//! the swap-outs this server is serving can free (a deadlock the whole machine feels), so
//! every page the path touches (pool pages, their descriptors, the free and partial lists)
//! must already be resident. The test counts this thread's page faults (getrusage) across
//! writes into every size class, overwrites, discards and reads.

mod common;

use common::{xorshift, PAGE};
use compcache_store::{Config, Store, StoreError};

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

/// Makes this thread's stack resident as deep as the I/O path goes (a swap server's threads
/// get theirs populated at creation, under mlockall).
#[inline(never)]
fn touch_stack() {
    let mut deep = [0u8; 256 * 1024];
    std::hint::black_box(&mut deep);
}

#[test]
fn the_io_path_takes_no_page_fault_once_the_reserve_is_prefaulted() {
    const RESERVE_PAGES: u64 = 3000;
    const PAGES: u64 = 8192;
    let store = Store::new(Config::with_disksize(PAGES * PAGE as u64)).unwrap();
    let mut ctx = store.context();
    // What a swap server does before it starts: slot table resident (a write and a discard
    // touch each slot's entry), reserve filled, fault-free on.
    let mut page = vec![0u8; PAGE];
    for i in 0..PAGES {
        store.write_page(&mut ctx, i, &page).unwrap();
        store.discard_page(i);
    }
    assert_eq!(store.prefault(RESERVE_PAGES), RESERVE_PAGES);
    store.set_fault_free(true);

    // Every payload size from incompressible to nearly nothing, so that most size classes get
    // zspages (and partial lists), in an order that mixes them. Made before counting.
    let sizes = |i: u64| ((i * 2654435761) % 4000) as usize;
    let data: Vec<Vec<u8>> = (0..PAGES).map(|i| page_of(i, 1, sizes(i))).collect();
    let again: Vec<Vec<u8>> = (0..PAGES).map(|i| page_of(i, 2, sizes(i + 7))).collect();
    // Warm this thread's stack and the context's buffers on a page outside the test.
    store.write_page(&mut ctx, PAGES - 1, &data[0]).unwrap();
    store.read_page(&mut ctx, PAGES - 1, &mut page).unwrap();
    store.discard_page(PAGES - 1);

    touch_stack();
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

    assert!(stored > 1000 && refused > 0, "the reserve should take some pages and refuse the rest: stored {stored}, refused {refused}");
    assert!(good > 1000, "pages read back: {good}");
    assert_eq!(faults, 0, "the I/O path faulted {faults} times in fault-free mode (stored {stored} pages)");
}
