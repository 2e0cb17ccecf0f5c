//! The page arena: the pool's source of 4 KiB pages, standing in for the kernel's page
//! allocator under zsmalloc.
//!
//! The pages are a region of the state file (`shm.rs`: a memfd mapped shared, sparse, so
//! address space only until written), handed out page by page, named by page frame numbers
//! (pfn, `u32`: position-independent, so a successor process that maps the file elsewhere
//! finds every page). Memory becomes resident when a page is first written and is returned to
//! the kernel with `madvise(MADV_REMOVE)` when the pool frees it. Under `mlockall` that madvise
//! fails; the page then stays resident on the free list and is reused first (memory reserved
//! for the hot path, which is what a swap server wants).
//!
//! Free pages are kept on two lists: *resident* (their memory is still there: madvise failed,
//! or `prefault` made them) and *cold* (given back to the kernel; touching one faults).
//! Allocation takes resident pages first. In *fault-free* mode it takes only resident pages
//! and fails rather than fault: a swap server's I/O path must not wait in reclaim for memory
//! that only its own progress can free. `prefault` fills the resident list, touching pages
//! with no lock held, so a keeper thread that waits in reclaim there blocks nobody.
//!
//! Each pfn also has a small descriptor (`PageDesc`, the pool's `struct page`), which the
//! owning size class uses for zspage bookkeeping; the descriptors are a region of the state
//! file too. The free lists are this process's own: recovery rebuilds them
//! ([`Arena::recovered`]).
//!
//! Background threads need not poll the arena: the reserve's keeper registers with
//! [`Arena::low_watch`] and is woken by the allocation that leaves fewer resident free pages
//! than its mark; the writeback thread registers with [`Arena::high_watch`] and is woken by
//! the allocation that takes the pages in use past its mark ([`Watch`]: `Thread::unpark`, no
//! allocation, no lock; one futex wake, once per look). So an idle server's threads sleep
//! instead of waking many times a second to look.
//!
//! Locking: `free` (the free-page list) is one mutex for the whole arena. It is taken once per
//! zspage created or destroyed, not per object, and always last (lock order in `slot.rs`).

use parking_lot::Mutex;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;

use crate::shm::StateMap;
use crate::zeroed::{Zeroable, ZeroedSlice};
use crate::PAGE_SIZE;

/// Per-page descriptor. All fields are written under the lock of the size class that owns the
/// page's zspage; they are atomics only so that the arena can be shared without `UnsafeCell`.
/// `next` alone is also read without the class lock, by readers that hold a slot lock
/// pinning an object on this zspage (rule 2 in `slot.rs`): it never changes while the zspage lives.
///
/// The class's partial list is threaded through the first pages' descriptors (`list_prev`,
/// `list_next`), as the kernel threads zspages through `struct page`: putting a zspage on the
/// list or taking it off never allocates, so the I/O path of a swap server in fault-free mode
/// cannot fault there.
pub(super) struct PageDesc {
    /// The next page of this zspage's chain (`NONE` at the end).
    pub next: AtomicU32,
    /// First page only: objects in use.
    pub inuse: AtomicU32,
    /// First page only: head of the free-object list (object index). In the huge class,
    /// whose zspages hold one headerless object, it holds that object's owner slot instead.
    pub free_head: AtomicU32,
    /// First page only: the previous zspage on the class's partial list, or one of
    /// `OFF_LIST`, `ISOLATED` (being emptied by compaction) and `LIST_HEAD` (first on the list).
    pub list_prev: AtomicU32,
    /// First page only, while on the partial list: the next zspage on it (`NONE` at the end).
    pub list_next: AtomicU32,
}

// SAFETY: PageDesc is five AtomicU32; every bit pattern (all-zero, or a dead process's) is a
// valid value of each.
unsafe impl Zeroable for PageDesc {}

pub(super) const NONE: u32 = u32::MAX;
/// `list_prev` of a zspage not on the partial list.
pub(super) const OFF_LIST: u32 = NONE;
/// `list_prev` of a zspage being emptied by compaction: not on the partial list, not to be
/// released by `free` (compaction releases it).
pub(super) const ISOLATED: u32 = NONE - 1;
/// `list_prev` of the zspage at the head of the partial list.
pub(super) const LIST_HEAD: u32 = NONE - 2;

/// Where the arena's pages and descriptors are in the state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArenaRegions {
    pub descs_offset: usize,
    pub pages_offset: usize,
}

pub(super) struct Arena {
    map: Arc<StateMap>,
    pages_offset: usize,
    base: NonNull<u8>,
    capacity_pages: u32,
    descs: ZeroedSlice<PageDesc>,
    state: Mutex<FreeState>,
    used_pages: AtomicU64,
    limit_pages: AtomicU64,
    max_used_pages: AtomicU64,
    fault_free: AtomicBool,
    /// Woken when resident free pages fall below its mark (the reserve's keeper).
    low: Watch,
    /// Woken when the pages in use pass its mark (the writeback thread).
    high: Watch,
}

/// A thread to wake when an allocation crosses a mark (`Arena::low_watch`, `Arena::high_watch`).
/// `signalled` is set by the allocation that wakes it and cleared by the thread when it looks
/// again (`rearm`), so it is woken once per look, not once per allocation.
pub(crate) struct Watch {
    thread: std::sync::OnceLock<std::thread::Thread>,
    mark: AtomicU64,
    signalled: AtomicBool,
}

impl Watch {
    fn new(mark: u64) -> Watch {
        Watch { thread: std::sync::OnceLock::new(), mark: AtomicU64::new(mark), signalled: AtomicBool::new(false) }
    }

    /// Registers the calling thread (the first to call; a later call only moves the mark).
    pub fn watch(&self, mark: u64) {
        self.thread.get_or_init(std::thread::current);
        self.mark.store(mark, Relaxed);
    }

    /// The watcher is about to look: the next crossing wakes it again. Call before each look,
    /// then park (an unpark that comes in between is kept for the park).
    ///
    /// Ordering: the watcher clears `signalled` and then reads the counter it watches; an
    /// allocation changes the counter and then reads `signalled` (in `poke`). With a SeqCst
    /// fence between the two steps on each side, at least one of them sees the other's write:
    /// the watcher sees the crossing, or the allocation sees the cleared flag and wakes it.
    /// (The keeper's counter is read under the arena's mutex, which orders it too; writeback's
    /// `used_pages` is a plain atomic.)
    pub fn rearm(&self) {
        self.signalled.store(false, Relaxed);
        fence(SeqCst);
    }

    /// Wakes the watcher if `crossed` (judged against `mark()`, after the allocation changed
    /// the counter) and it was not woken since it last looked. Called with no lock held.
    fn poke(&self, crossed: bool) {
        if !crossed {
            return;
        }
        fence(SeqCst);
        if !self.signalled.swap(true, Relaxed) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    fn mark(&self) -> u64 {
        self.mark.load(Relaxed)
    }
}

struct FreeState {
    /// Pages never handed out start at `next_unused`.
    next_unused: u32,
    /// Free pages whose memory is resident.
    resident: Vec<u32>,
    /// Free pages given back to the kernel.
    cold: Vec<u32>,
}

// SAFETY: `base` points into the state file's mapping, kept alive by `map`. The arena
// hands out disjoint pages; who may touch a page's bytes is governed by the pool's locking rules
// (slot.rs), not by the arena, which itself only touches pages in `madvise` after they are freed.
unsafe impl Send for Arena {}
// SAFETY: as for Send; all shared mutable state is in atomics or behind `state`'s mutex.
unsafe impl Sync for Arena {}

impl Arena {
    /// The arena of `capacity_pages` pages in `map` at `at`. `limit_pages` 0 means no limit.
    /// Its free lists start empty with every page unused: a new state file's arena. A
    /// recovered one then gets its lists from [`Arena::recovered`].
    pub fn new(map: &Arc<StateMap>, at: ArenaRegions, capacity_pages: u32, limit_pages: u64) -> Arena {
        assert!(capacity_pages < LIST_HEAD, "pfns must stay below the list markers");
        assert!(at.pages_offset + capacity_pages as usize * PAGE_SIZE <= map.len(), "the arena outside the state file");
        let descs = ZeroedSlice::in_map(map, at.descs_offset, capacity_pages as usize);
        Arena {
            map: map.clone(),
            pages_offset: at.pages_offset,
            base: map.at(at.pages_offset),
            capacity_pages,
            descs,
            state: Mutex::new(FreeState { next_unused: 0, resident: Vec::new(), cold: Vec::new() }),
            used_pages: AtomicU64::new(0),
            limit_pages: AtomicU64::new(limit_pages),
            max_used_pages: AtomicU64::new(0),
            fault_free: AtomicBool::new(false),
            low: Watch::new(0),
            high: Watch::new(u64::MAX),
        }
    }

    pub fn capacity_pages(&self) -> u32 {
        self.capacity_pages
    }

    /// Recovery: the pages in `used` (sorted, distinct) hold live zspages; every other page is
    /// free. A free page whose memory is still there (data in the file: the dead process's
    /// reserve, or pages it freed under `mlock`) goes on the resident list, as it would have
    /// stayed there in the dead process: so a swap server's successor finds the reserve its
    /// predecessor had made and need not fault it in again, perhaps while memory is short and
    /// its own device is the swap that would free some. The others are holes and go on the
    /// cold list. Nothing is punched: the memory is what the dead process held.
    pub fn recovered(&self, used: &[u32]) -> std::io::Result<()> {
        let pages_len = self.capacity_pages as usize * PAGE_SIZE;
        let base = self.page_offset(0);
        // The resident pages, walked from the file's data ranges rather than listed (a
        // successor taking over while memory is short touches as little new heap as it can).
        let ranges = self.map.data_ranges(base, pages_len);
        let resident_pages = || {
            ranges.iter().flat_map(|r| {
                let (first, last) = (((r.start - base) / PAGE_SIZE) as u32, ((r.end - base).div_ceil(PAGE_SIZE)) as u32);
                first..last.min(self.capacity_pages)
            })
        };
        let last_resident = ranges.last().map_or(0, |r| ((r.end - base).div_ceil(PAGE_SIZE) as u32).min(self.capacity_pages));
        let next_unused = used.last().map_or(0, |&p| p + 1).max(last_resident);
        let (mut resident, mut cold) = (Vec::new(), Vec::new());
        let (mut u, mut r) = (used.iter().peekable(), resident_pages().peekable());
        for pfn in 0..next_unused {
            while r.peek().is_some_and(|&p| p < pfn) {
                r.next();
            }
            if u.peek() == Some(&&pfn) {
                u.next();
            } else if r.peek() == Some(&pfn) {
                resident.push(pfn);
            } else {
                cold.push(pfn);
            }
        }
        let mut st = self.state.lock();
        st.next_unused = next_unused;
        st.resident = resident;
        st.cold = cold;
        self.used_pages.store(used.len() as u64, Relaxed);
        self.max_used_pages.store(used.len() as u64, Relaxed);
        drop(st);
        self.grow_free_lists();
        Ok(())
    }

    fn page_offset(&self, pfn: u32) -> usize {
        self.pages_offset + pfn as usize * PAGE_SIZE
    }

    pub fn desc(&self, pfn: u32) -> &PageDesc {
        &self.descs[pfn as usize]
    }

    /// The address of page `pfn`. Dereferencing it is governed by the pool's locking rules.
    pub fn page_ptr(&self, pfn: u32) -> *mut u8 {
        assert!(pfn < self.capacity_pages, "pfn {pfn} outside the arena");
        // SAFETY: pfn < capacity_pages, so the offset stays inside the mapping.
        unsafe { self.base.as_ptr().add(pfn as usize * PAGE_SIZE) }
    }

    /// Takes `n` pages at once (one zspage), all or none, resident ones first. Fails when the
    /// limit or the reservation would be exceeded, or, in fault-free mode, when too few
    /// resident pages are free.
    pub fn alloc(&self, n: usize, out: &mut [u32]) -> Result<(), (u64, u64)> {
        let limit = self.limit_pages.load(Relaxed);
        let fault_free = self.fault_free.load(Relaxed);
        let mut st = self.state.lock();
        let used = self.used_pages.load(Relaxed);
        let mut available = st.resident.len() as u64;
        if !fault_free {
            available += st.cold.len() as u64 + (self.capacity_pages - st.next_unused) as u64;
        }
        if (limit != 0 && used + n as u64 > limit) || available < n as u64 {
            let cap = match (fault_free, limit) {
                (true, _) => used + st.resident.len() as u64,
                (false, 0) => self.capacity_pages as u64,
                (false, l) => l,
            };
            let left = st.resident.len() as u64;
            drop(st);
            self.low.poke(left < self.low.mark());
            return Err((used, cap));
        }
        for slot in out.iter_mut().take(n) {
            *slot = match st.resident.pop().or_else(|| st.cold.pop()) {
                Some(pfn) => pfn,
                None => {
                    st.next_unused += 1;
                    st.next_unused - 1
                }
            };
        }
        let now = self.used_pages.fetch_add(n as u64, Relaxed) + n as u64;
        self.max_used_pages.fetch_max(now, Relaxed);
        let left = st.resident.len() as u64;
        drop(st);
        self.low.poke(left < self.low.mark());
        self.high.poke(now > self.high.mark());
        Ok(())
    }

    /// The watch woken by the allocation that leaves fewer resident free pages than its mark.
    pub fn low_watch(&self) -> &Watch {
        &self.low
    }

    /// The watch woken by the allocation that takes the pages in use past its mark.
    pub fn high_watch(&self) -> &Watch {
        &self.high
    }

    /// Returns pages to the arena and their memory to the kernel where it can (not under
    /// mlock: those stay resident and are reused first).
    pub fn free(&self, pfns: &[u32]) {
        let mut given_back = [false; super::class::MAX_CHAIN];
        for (i, &pfn) in pfns.iter().enumerate() {
            assert!(pfn < self.capacity_pages, "pfn {pfn} outside the arena");
            // SAFETY: the page is inside the arena; the pool calls free only after the last
            // object on it is gone, so no reference to its bytes remains.
            given_back[i] = unsafe { self.map.remove(self.page_offset(pfn), PAGE_SIZE) };
        }
        let mut st = self.state.lock();
        for (i, &pfn) in pfns.iter().enumerate() {
            if given_back[i] {
                st.cold.push(pfn);
            } else {
                st.resident.push(pfn);
            }
        }
        self.used_pages.fetch_sub(pfns.len() as u64, Relaxed);
    }

    /// Makes up to `n` never-used pages resident and files them as free, within the limit.
    /// Returns how many were added.
    ///
    /// Everything that the I/O path will touch because of these pages is made resident here,
    /// with no lock held, so that fault-free mode takes no page fault: the pages themselves,
    /// their descriptors, and room on the free lists for every page ever handed out (a page is
    /// on at most one list, so `free` then never grows a list).
    pub fn prefault(&self, n: u64) -> u64 {
        let first = {
            let mut st = self.state.lock();
            let mut k = n.min((self.capacity_pages - st.next_unused) as u64);
            let limit = self.limit_pages.load(Relaxed);
            if limit != 0 {
                let held = self.used_pages.load(Relaxed) + st.resident.len() as u64;
                k = k.min(limit.saturating_sub(held));
            }
            let first = st.next_unused;
            st.next_unused += k as u32;
            first..first + k as u32
        };
        for pfn in first.clone() {
            // SAFETY: the page is inside the mapping and was just taken from the never-used
            // range under the lock, so no other thread refers to it; a volatile write makes
            // the kernel fault it in (and lock it, under mlockall).
            unsafe { std::ptr::write_volatile(self.page_ptr(pfn), 0u8) };
            // The descriptor too, by a store (a read would map the shared zero page, and an
            // idempotent read-modify-write may be compiled to a read); nobody uses it yet.
            self.desc(pfn).list_prev.store(OFF_LIST, Relaxed);
        }
        self.grow_free_lists();
        let added = first.len() as u64;
        self.state.lock().resident.extend(first);
        added
    }

    /// Gives both free lists room for every page handed out so far. The new lists are
    /// allocated and touched outside the lock and swapped in under it.
    fn grow_free_lists(&self) {
        loop {
            let need = {
                let st = self.state.lock();
                let need = st.next_unused as usize;
                if st.resident.capacity() >= need && st.cold.capacity() >= need {
                    return;
                }
                need
            };
            // Headroom, so that each top-up of the reserve does not copy the lists again.
            let room = (need + need / 2).max(1024);
            let fresh = || {
                let mut v: Vec<u32> = Vec::with_capacity(room);
                v.spare_capacity_mut().iter_mut().for_each(|e| {
                    e.write(0);
                });
                v
            };
            let (mut resident, mut cold) = (fresh(), fresh());
            let mut st = self.state.lock();
            if st.next_unused as usize > room {
                continue; // grown past the new room meanwhile: size again
            }
            resident.extend_from_slice(&st.resident);
            cold.extend_from_slice(&st.cold);
            std::mem::swap(&mut st.resident, &mut resident);
            std::mem::swap(&mut st.cold, &mut cold);
            drop(st);
            return; // the old lists are freed here, outside the lock
        }
    }

    /// In fault-free mode, whether `prefault` may still add pages: the memory limit and the
    /// reservation leave room. (An allocation that failed for want of a resident page may
    /// then succeed after the reserve's keeper has run.)
    pub fn may_refill(&self) -> bool {
        let st = self.state.lock();
        let limit = self.limit_pages.load(Relaxed);
        let held = self.used_pages.load(Relaxed) + st.resident.len() as u64;
        self.fault_free.load(Relaxed) && st.next_unused < self.capacity_pages && (limit == 0 || held < limit)
    }

    /// Free pages whose memory is resident.
    pub fn resident_free_pages(&self) -> u64 {
        self.state.lock().resident.len() as u64
    }

    /// In fault-free mode allocations take only resident pages.
    pub fn is_fault_free(&self) -> bool {
        self.fault_free.load(Relaxed)
    }

    pub fn set_fault_free(&self, on: bool) {
        self.fault_free.store(on, Relaxed);
    }

    pub fn used_pages(&self) -> u64 {
        self.used_pages.load(Relaxed)
    }
    pub fn max_used_pages(&self) -> u64 {
        self.max_used_pages.load(Relaxed)
    }
    pub fn set_limit_pages(&self, pages: u64) {
        self.limit_pages.store(pages, Relaxed);
    }
    pub fn reset_max(&self) {
        self.max_used_pages.store(self.used_pages(), Relaxed);
    }
}
