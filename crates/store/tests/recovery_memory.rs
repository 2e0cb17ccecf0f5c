//! How much heap a takeover (`Store::recover`) needs: a successor may have to take a device
//! over while the machine is out of memory (its pages are in the device it takes over), and
//! every byte of heap it first touches then is a page fault that waits for memory
//! (docs/swap.md, "A standby, started in advance"). This binary counts the heap the recovery
//! asks for at its peak (a counting global allocator; the test is alone in its process), per
//! page the state holds, and holds it to a bound.

mod common;

use common::{page, Kind, PAGE};
use compcache_store::{Config, Store};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only the counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(l.size(), Relaxed) + l.size();
        PEAK.fetch_max(live, Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        // SAFETY: as allocated by `alloc` above with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > l.size() {
            let live = LIVE.fetch_add(new - l.size(), Relaxed) + new - l.size();
            PEAK.fetch_max(live, Relaxed);
        } else {
            LIVE.fetch_sub(l.size() - new, Relaxed);
        }
        // SAFETY: as allocated with layout `l`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Heap per page the state holds that a recovery may ask for at its peak (beside 512 KiB for
/// the store's own structures): the claims (16 bytes per object), one record per zspage, a
/// list of the pool's pages. It was 126 bytes per page (with 4 slots per page: a list of every
/// written slot, a vector per zspage) before 2026-11-28; 40 since.
const BOUND_BYTES_PER_PAGE: usize = 32;

#[test]
fn a_recovery_asks_for_little_heap_per_page() {
    const PAGES: u64 = 32768; // 128 MiB of pages
    let cfg = || Config::with_disksize(4 * PAGES * PAGE as u64);
    let store = Store::new(cfg()).unwrap();
    let mut ctx = store.context();
    let kinds = [Kind::Text, Kind::Mixed, Kind::Text, Kind::Random, Kind::Same];
    for i in 0..PAGES {
        // Spread over a device four times the size: the table has holes, as a swap device's has.
        store.write_page(&mut ctx, i * 4, &page(kinds[i as usize % kinds.len()], i, 1)).unwrap();
    }
    let fd = store.state_fd().unwrap().try_clone_to_owned().unwrap();
    drop((ctx, store));
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    let (store, report) = Store::recover(cfg(), fd).unwrap();
    let peak = PEAK.load(Relaxed) - before;
    let kept = LIVE.load(Relaxed) - before;
    assert_eq!(report.pages, PAGES, "{report}");
    let per_page = peak as f64 / PAGES as f64;
    eprintln!("recovery of {PAGES} pages: heap peak {peak} bytes ({per_page:.1} per page), kept {kept} bytes");
    assert!(
        peak <= BOUND_BYTES_PER_PAGE * PAGES as usize + (512 << 10),
        "recovery asked for {peak} bytes of heap at its peak ({per_page:.1} per page)"
    );
    drop(store);
}
