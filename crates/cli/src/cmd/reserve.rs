//! Memory reserved up front for the store's hot path, so that a swap server cannot deadlock
//! when the machine is out of memory.
//!
//! The problem: the kernel swaps a page out to us, and we need memory to store it. If that
//! memory comes from a page fault while the machine is at its minimum watermark, the fault
//! enters direct reclaim, which (the server being an I/O flusher) may not swap, so it can
//! only wait for memory that will be freed when the swap-outs complete, and those wait for
//! us. zram escapes this because its allocations run in the reclaimer's context, allowed to
//! dip into the kernel's reserves; a userspace server is not.
//!
//! The way out: the I/O path never faults for new memory. The store's page arena keeps pages
//! it has freed resident and reuses them first (under `mlockall` they cannot be returned to
//! the kernel), so a *reserve* of resident free pages can be made by writing pages to a
//! private region of the store that the kernel never sees and discarding them again. The
//! store's memory limit is then kept at the resident size: a write that would need a fresh
//! page fails with ENOSPC instead of faulting (the kernel keeps that page in memory, marks
//! it dirty and tries again later: nothing is lost). A keeper thread watches the reserve and
//! tops it up, off the I/O path: its own page faults may wait in reclaim, but while they do
//! the I/O path still stores pages from the reserve, the kernel frees the swapped-out pages,
//! and the fault completes.
//!
//! The keeper's own page faults happen inside a store write (under the store's locks), so it
//! grows the reserve only while the machine has free memory well above the kernel's
//! watermarks (`MemFree` over twice `min_free_kbytes` plus what it takes): then the faults
//! are served at once and never wait in reclaim. Under sustained pressure the reserve stops
//! growing, writes beyond it fail with ENOSPC, and the kernel keeps those pages in RAM (and
//! will OOM-kill the largest process if nothing else gives): no deadlock, nothing lost. Size
//! the reserve (`--reserve`) for the compressed data you expect under pressure to avoid that.
//! The slot table is made resident before the device starts.

use std::sync::Arc;
use std::time::Duration;

use compcache_store::{Store, PAGE_SIZE};

const PAGE: u64 = PAGE_SIZE as u64;
/// How often the keeper looks at the reserve.
const TICK: Duration = Duration::from_millis(10);

/// The reserve's sizes for a machine with `ram_bytes` of RAM: refill below `low`, up to
/// `high`. 1/256 of RAM, within 4..=64 MiB, absorbs a burst of several thousand swapped
/// pages while the keeper waits for memory.
pub fn default_high_bytes(ram_bytes: u64) -> u64 {
    let low = (ram_bytes / 256).clamp(4 << 20, 64 << 20);
    2 * low / PAGE * PAGE
}

/// The keeper of one store's reserve. The store must have `region_pages` pages past the end
/// of what the front end exposes: the keeper's own scratch space.
pub struct Reserve {
    store: Arc<Store>,
    region_offset: u64,
    region_pages: u64,
    low_pages: u64,
    high_pages: u64,
    /// The user's --mem-limit in pages (0: none); the reserve never takes the store past it.
    cap_pages: u64,
    /// Arena pages made resident so far (the limit the I/O path is held to).
    resident_pages: u64,
    page: Vec<u8>,
    seed: u64,
}

impl Reserve {
    /// A keeper whose scratch region is the last `high_bytes` of `store`.
    pub fn new(store: Arc<Store>, high_bytes: u64, user_limit_bytes: u64) -> Reserve {
        let region_pages = (high_bytes / PAGE).max(2);
        let region_offset = store.disksize_bytes() - region_pages * PAGE;
        let cap_pages = if user_limit_bytes > 0 { user_limit_bytes / PAGE + region_pages } else { 0 };
        Reserve {
            store,
            region_offset,
            region_pages,
            low_pages: region_pages / 2,
            high_pages: region_pages,
            cap_pages,
            resident_pages: 0,
            page: vec![0u8; PAGE_SIZE],
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Makes the slot table resident (a read of an empty slot touches its entry) and fills
    /// the reserve; then holds the store to its resident size. Call before the device starts.
    pub fn prime(&mut self) {
        let mut ctx = self.store.context();
        let mut buf = vec![0u8; 64 * PAGE_SIZE];
        let size = self.store.disksize_bytes();
        let mut off = 0;
        while off < size {
            let n = (size - off).min(buf.len() as u64) as usize;
            let _ = self.store.read(&mut ctx, off, &mut buf[..n]);
            off += n as u64;
        }
        self.resident_pages = self.used_pages();
        self.top_up(&mut ctx);
    }

    fn used_pages(&self) -> u64 {
        self.store.stats().mem_used_total / PAGE
    }

    /// Pages the arena holds resident but unused: what the I/O path can still take.
    pub fn free_pages(&self) -> u64 {
        self.resident_pages.saturating_sub(self.used_pages())
    }

    /// Incompressible content (xorshift), so that every page written takes a whole arena page.
    fn fill_random(&mut self) {
        for chunk in self.page.chunks_exact_mut(8) {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            chunk.copy_from_slice(&self.seed.to_ne_bytes());
        }
    }

    /// Brings the free reserve up to `high_pages` (within the cap and the machine's free
    /// memory), then closes the limit at the new resident size.
    fn top_up(&mut self, ctx: &mut compcache_store::Context) {
        let free = self.free_pages();
        let mut want = self.high_pages.saturating_sub(free).min(headroom_pages());
        if self.cap_pages > 0 {
            want = want.min(self.cap_pages.saturating_sub(self.resident_pages));
        }
        if want == 0 {
            self.store.set_mem_limit(self.resident_pages.max(1) * PAGE);
            return;
        }
        self.store.set_mem_limit((self.resident_pages + want) * PAGE);
        let mut written = 0;
        for i in 0..want.min(self.region_pages) {
            self.fill_random();
            if self.store.write(ctx, self.region_offset + i * PAGE, &self.page).is_err() {
                break;
            }
            written += 1;
        }
        let _ = self.store.discard(self.region_offset, written * PAGE);
        let peak = self.store.stats().mem_used_max / PAGE;
        self.resident_pages = self.resident_pages.max(peak).max(self.used_pages());
        self.store.set_mem_limit(self.resident_pages * PAGE);
    }

    /// The keeper's loop: top up whenever the free reserve is below half. Never returns.
    pub fn keep(mut self) {
        let mut ctx = self.store.context();
        loop {
            if self.free_pages() < self.low_pages {
                self.top_up(&mut ctx);
            }
            std::thread::sleep(TICK);
        }
    }
}

/// Pages that can be faulted in now without entering reclaim: `MemFree` above twice the
/// kernel's `min_free_kbytes` (its low and high watermarks lie between one and two times it).
fn headroom_pages() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let free_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemFree:")?.split_whitespace().next()?.parse().ok())
        .unwrap_or(u64::MAX / 2048);
    let min_kib: u64 = std::fs::read_to_string("/proc/sys/vm/min_free_kbytes")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    free_kib.saturating_sub(2 * min_kib) / (PAGE / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use compcache_store::Config;

    #[test]
    fn the_reserve_is_resident_and_bounds_the_io_path() {
        let high = 64 * PAGE;
        let store = Arc::new(Store::new(Config::with_disksize(1024 * PAGE + high)).unwrap());
        let mut r = Reserve::new(Arc::clone(&store), high, 0);
        r.prime();
        assert!(r.free_pages() >= 60, "reserve of {} pages", r.free_pages());
        assert_eq!(store.stats().orig_data_size, 0, "the scratch pages were discarded");

        // The I/O path can store pages while the reserve lasts, then gets ENOSPC, not a fault.
        let mut ctx = store.context();
        let mut stored = 0;
        let mut seed = 1u64;
        for i in 0..1024u64 {
            let page: Vec<u8> = (0..PAGE_SIZE)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect();
            match store.write(&mut ctx, i * PAGE, &page) {
                Ok(()) => stored += 1,
                Err(e) => {
                    assert_eq!(e.errno(), libc::ENOSPC);
                    break;
                }
            }
        }
        assert!(stored > 0 && stored < 1024, "stored {stored}");
        // The keeper tops the reserve up again.
        r.top_up(&mut ctx);
        assert!(r.free_pages() >= 32);
    }

    #[test]
    fn sizes() {
        assert_eq!(default_high_bytes(256 << 20), 8 << 20);
        assert_eq!(default_high_bytes(64 << 30), 128 << 20);
    }
}
