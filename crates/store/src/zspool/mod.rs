//! The allocator for compressed objects, in the spirit of zsmalloc.
//!
//! Objects of similar size share a size class (`class.rs`). A class keeps its objects in
//! zspages: chains of 1..=8 arena pages (`arena.rs`) treated as one run of bytes, so objects
//! may span page boundaries and little is wasted at page ends. Each object starts with a 4-byte
//! header: for an allocated object the index of the slot that owns it (the back-pointer
//! compaction needs); for a free one the index of the next free object (the free list lives in
//! the free objects themselves). Raw 4 KiB ("huge") pages have a class of their own with one
//! page per zspage and no header; their owner lives in the page descriptor.
//!
//! A [`Handle`] names an object by (class, first page of its zspage, object index). It is not
//! stable: compaction moves objects and hands the owner a new handle, under the owner's slot
//! lock (see the locking rules in `slot.rs`).
//!
//! # Contract
//! The pool does not know about slots. Its one user, the RAM layer (`ram/mod.rs` and
//! `ram/mover.rs`: the only code that allocates, reads or frees an object; the facade sees
//! only the pool's gauges and knobs, through `Ram::pool`), guarantees:
//! 1. An object's bytes are read ([`ZsPool::read`]) only while the caller holds the lock of
//!    the slot that owns it, and freed ([`ZsPool::free`]) at most once, by its owner.
//! 2. During [`ZsPool::compact`], the `relocate` callback holds the owner's slot lock while it
//!    calls the mover and installs the new handle before it returns, and calls the mover only
//!    if the slot still holds the handle it was given. (The pool frees the old copy after the
//!    callback returns.)
//!
//! With that, an object never moves or disappears under a reader, and a zspage is released
//! only after every object on it has moved away under its owner's lock.
//!
//! # A process that dies
//! The pages and their descriptors are in the state file (`shm.rs`) and outlive the process;
//! the class lists, counts and free-object lists are rebuilt by a successor from the objects
//! the slot table names ([`ZsPool::rebuild`], `recover.rs`), never trusted. For that every
//! step keeps an object readable by whoever names it until the name changes: an object is
//! written before its handle is published, and compaction frees the old copy only after the
//! owner's slot names the new one.
//!
//! # Locking
//! One mutex per size class (its partial-zspage list and every zspage's free list and counts);
//! allocation and free of an object take only its class lock, so writers of different classes
//! never meet. The arena lock is taken under a class lock, once per zspage created or destroyed.
//! Reads take no pool lock at all: the object is pinned by the caller's slot lock.
//! [`ZsPool::compactable_pages`] takes none either: each class publishes its share in an atomic
//! under its lock whenever its counts change.

mod arena;
mod class;
mod recover;

pub(crate) use arena::ArenaRegions;
use arena::{Arena, ISOLATED, LIST_HEAD, NONE, OFF_LIST};
pub use class::huge_payload_threshold;
use class::{class_for, merged_classes, shape, ClassShape, HEADER, HUGE_CLASS, MAX_CHAIN, NUM_CLASSES};
use parking_lot::Mutex;
pub(crate) use recover::Claim;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::shm::StateMap;
use crate::{PAGE, PAGE_SIZE};

/// Names an allocated object. Bit layout: class (bits 44..=52), first pfn of its zspage
/// (12..=43), object index within the zspage (0..=11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle(pub u64);

impl Handle {
    fn new(class: usize, first_pfn: u32, obj: usize) -> Handle {
        debug_assert!(class < NUM_CLASSES && obj < 4096);
        Handle(((class as u64) << 44) | ((first_pfn as u64) << 12) | obj as u64)
    }
    fn class(self) -> usize {
        (self.0 >> 44) as usize & 0x1ff
    }
    fn first_pfn(self) -> u32 {
        (self.0 >> 12) as u32
    }
    fn obj(self) -> usize {
        self.0 as usize & 0xfff
    }
}

/// The callback [`ZsPool::compact`] calls for each object it wants to move:
/// `relocate(owner_slot, handle, mover)`; `mover()` moves the object and returns its new handle.
pub type Relocate<'a> = dyn FnMut(u32, Handle, &mut dyn FnMut() -> Option<Handle>) + 'a;

/// Allocation failed: the memory limit (or the reserved address space) is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFull {
    pub used_bytes: u64,
    pub limit_bytes: u64,
}

/// Header tag of an allocated object; the free-list link never has it (objects < 4096).
const ALLOC_TAG: u32 = 1 << 31;
/// End of a zspage's free-object list, as stored in an object header: like every link it
/// lacks ALLOC_TAG, so compaction never mistakes the last free object for a live one.
const LINK_END: u32 = ALLOC_TAG - 1;

#[repr(align(64))] // one class lock per cache line: neighbouring classes do not false-share
struct Class {
    shape: ClassShape,
    state: Mutex<ClassState>,
}

struct ClassState {
    /// First pfn of the first zspage with at least one free object (`NONE`: none). The list
    /// runs through the zspages' descriptors (`PageDesc::list_next`); the most recently
    /// listed zspage comes first, and allocation takes from it.
    partial_head: u32,
    partial_len: u64,
    zspages: u64,
    objs_inuse: u64,
}

impl Default for ClassState {
    fn default() -> Self {
        ClassState { partial_head: NONE, partial_len: 0, zspages: 0, objs_inuse: 0 }
    }
}

pub struct ZsPool {
    arena: Arena,
    classes: Box<[Class]>,
    /// `class_for` index -> the (merged) class that serves it.
    serving: Vec<u16>,
    /// Per class: the pages compaction could give back in it (`compactable_share`). Written
    /// under the class lock by every change of the class's counts (`note_counts`), and only
    /// when the share changes, so allocations of different classes rarely write the same
    /// cache line; read without any lock by [`ZsPool::compactable_pages`].
    compactable: Box<[AtomicU64]>,
    pages_compacted: AtomicU64,
}

impl ZsPool {
    /// A pool of up to `capacity_pages` pages in the state file `map` (at `at`), and at most
    /// `limit_pages` pages of memory (0: no limit). Empty: a recovered pool then gets its
    /// objects back from [`ZsPool::rebuild`].
    pub fn new(map: &Arc<StateMap>, at: ArenaRegions, capacity_pages: u32, limit_pages: u64) -> ZsPool {
        let classes = (0..NUM_CLASSES).map(|i| Class { shape: shape(i), state: Mutex::default() }).collect();
        ZsPool {
            arena: Arena::new(map, at, capacity_pages, limit_pages),
            classes,
            serving: merged_classes(),
            compactable: (0..NUM_CLASSES).map(|_| AtomicU64::new(0)).collect(),
            pages_compacted: AtomicU64::new(0),
        }
    }

    /// The bytes of state file a pool of `capacity_pages` needs: (descriptors, pages).
    pub fn region_bytes(capacity_pages: u32) -> (usize, usize) {
        (capacity_pages as usize * std::mem::size_of::<arena::PageDesc>(), capacity_pages as usize * PAGE_SIZE)
    }

    /// A pool in a state file of its own (tests, benchmarks).
    #[cfg(test)]
    pub fn private(capacity_pages: u32, limit_pages: u64) -> std::io::Result<ZsPool> {
        let (descs, pages) = Self::region_bytes(capacity_pages);
        let descs = descs.next_multiple_of(PAGE_SIZE);
        let map = Arc::new(StateMap::create(descs + pages)?);
        Ok(ZsPool::new(&map, ArenaRegions { descs_offset: 0, pages_offset: descs }, capacity_pages, limit_pages))
    }

    /// Stores `payload` (at most one page) as a new object owned by slot `owner`.
    /// O(1): pops a free object of the class, or creates one zspage when the class has none.
    pub fn alloc(&self, payload: &[u8], owner: u32) -> Result<Handle, PoolFull> {
        assert!(owner & ALLOC_TAG == 0, "slot index {owner} too large for the owner header");
        let ci = self.serving[class_for(payload.len())] as usize;
        let class = &self.classes[ci];
        let mut st = class.state.lock();
        let first = match st.partial_head {
            NONE => self.new_zspage(ci, &mut st)?,
            pfn => pfn,
        };
        let obj = self.take_free_obj(ci, &mut st, first);
        if ci == HUGE_CLASS {
            self.arena.desc(first).free_head.store(owner, Relaxed);
            self.copy_in(ci, first, 0, payload);
        } else {
            let off = obj * class.shape.size;
            self.copy_in(ci, first, off, &(owner | ALLOC_TAG).to_ne_bytes());
            self.copy_in(ci, first, off + HEADER, payload);
        }
        Ok(Handle::new(ci, first, obj))
    }

    /// Copies the first `out.len()` payload bytes of `h` into `out`.
    ///
    /// # Safety
    /// `h` is a live object and the caller holds the lock of its owner slot (contract rule 1).
    pub unsafe fn read(&self, h: Handle, out: &mut [u8]) {
        let (ci, first) = (h.class(), h.first_pfn());
        let off = if ci == HUGE_CLASS { 0 } else { h.obj() * self.classes[ci].shape.size + HEADER };
        self.copy_out(ci, first, off, out);
    }

    /// Frees object `h`; releases its zspage when it was the last object on it.
    ///
    /// # Safety
    /// `h` is a live object, freed once, by its owner (contract rule 1).
    pub unsafe fn free(&self, h: Handle) {
        let (ci, first) = (h.class(), h.first_pfn());
        let mut st = self.classes[ci].state.lock();
        self.put_free_obj(ci, &mut st, first, h.obj());
        let d = self.arena.desc(first);
        if d.inuse.load(Relaxed) == 0 && d.list_prev.load(Relaxed) != ISOLATED {
            self.release_zspage(ci, &mut st, first);
        }
    }

    /// Moves objects out of sparsely used zspages into fuller ones and releases the emptied
    /// zspages, class by class. For each object to move, calls `relocate(owner, handle, mover)`;
    /// the callback must follow contract rule 2, and the mover returns the object's new handle
    /// (or `None` when there is no room to move it). Returns the number of pages released.
    pub fn compact(&self, relocate: &mut Relocate<'_>) -> u64 {
        let mut freed = 0;
        for ci in 0..HUGE_CLASS {
            freed += self.compact_class(ci, relocate);
        }
        self.pages_compacted.fetch_add(freed, Relaxed);
        freed
    }

    pub fn total_pages(&self) -> u64 {
        self.arena.used_pages()
    }
    pub fn max_pages(&self) -> u64 {
        self.arena.max_used_pages()
    }
    pub fn reset_max(&self) {
        self.arena.reset_max()
    }
    pub fn set_limit_pages(&self, pages: u64) {
        self.arena.set_limit_pages(pages)
    }
    /// See [`Arena::prefault`]: makes up to `pages` pool pages resident and free.
    pub fn prefault(&self, pages: u64) -> u64 {
        self.arena.prefault(pages)
    }
    pub fn resident_free_pages(&self) -> u64 {
        self.arena.resident_free_pages()
    }
    /// See [`Arena::low_watch`]: resident free pages under the mark.
    pub fn low_watch(&self) -> &arena::Watch {
        self.arena.low_watch()
    }
    /// See [`Arena::high_watch`]: pages in use over the mark.
    pub fn high_watch(&self) -> &arena::Watch {
        self.arena.high_watch()
    }
    pub fn set_fault_free(&self, on: bool) {
        self.arena.set_fault_free(on)
    }
    pub fn is_fault_free(&self) -> bool {
        self.arena.is_fault_free()
    }
    /// See [`Arena::may_refill`].
    pub fn may_refill(&self) -> bool {
        self.arena.may_refill()
    }
    pub fn pages_compacted(&self) -> u64 {
        self.pages_compacted.load(Relaxed)
    }

    /// Pages that compaction could give back now: per class, zspages' worth of free objects
    /// beyond one zspage. An estimate taken without locks: each class's share as of its last
    /// change (the cache's eviction asks on every round, so it must not take ~300 class locks).
    pub fn compactable_pages(&self) -> u64 {
        self.compactable.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// A class's share of [`ZsPool::compactable_pages`] with these counts.
    fn compactable_share(shape: ClassShape, st: &ClassState) -> u64 {
        let free_objs = st.zspages * shape.objs_per_zspage as u64 - st.objs_inuse;
        (free_objs / shape.objs_per_zspage as u64).saturating_sub(1) * shape.pages_per_zspage as u64
    }

    /// Publishes class `ci`'s share after its counts changed; under the class lock, called by
    /// each of the four places that change `zspages` or `objs_inuse`. The huge class has no
    /// share: compaction leaves raw pages alone.
    fn note_counts(&self, ci: usize, st: &ClassState) {
        if ci == HUGE_CLASS {
            return;
        }
        let share = Self::compactable_share(self.classes[ci].shape, st);
        let slot = &self.compactable[ci];
        if slot.load(Relaxed) != share {
            slot.store(share, Relaxed);
        }
    }

    // --- zspage bookkeeping (all under the class lock) -------------------------------------

    fn new_zspage(&self, ci: usize, st: &mut ClassState) -> Result<u32, PoolFull> {
        let shape = self.classes[ci].shape;
        let mut pfns = [0u32; MAX_CHAIN];
        self.arena
            .alloc(shape.pages_per_zspage, &mut pfns)
            .map_err(|(used, limit)| PoolFull { used_bytes: used * PAGE, limit_bytes: limit * PAGE })?;
        let pfns = &pfns[..shape.pages_per_zspage];
        for w in pfns.windows(2) {
            self.arena.desc(w[0]).next.store(w[1], Relaxed);
        }
        let first = pfns[0];
        self.arena.desc(*pfns.last().expect("at least one page")).next.store(NONE, Relaxed);
        let d = self.arena.desc(first);
        d.inuse.store(0, Relaxed);
        d.list_prev.store(OFF_LIST, Relaxed);
        if ci == HUGE_CLASS {
            d.free_head.store(NONE, Relaxed); // holds the owner once allocated
        } else {
            // Thread the free list through the objects: object i links to i + 1.
            for i in 0..shape.objs_per_zspage {
                let next = if i + 1 < shape.objs_per_zspage { (i + 1) as u32 } else { LINK_END };
                self.copy_in(ci, first, i * shape.size, &next.to_ne_bytes());
            }
            d.free_head.store(0, Relaxed);
        }
        self.list(st, first);
        st.zspages += 1;
        self.note_counts(ci, st);
        Ok(first)
    }

    /// Pops a free object from zspage `first` (which is on the partial list).
    fn take_free_obj(&self, ci: usize, st: &mut ClassState, first: u32) -> usize {
        let shape = self.classes[ci].shape;
        let d = self.arena.desc(first);
        let obj = if ci == HUGE_CLASS {
            0
        } else {
            let head = d.free_head.load(Relaxed) as usize;
            let mut link = [0u8; 4];
            self.copy_out(ci, first, head * shape.size, &mut link);
            d.free_head.store(u32::from_ne_bytes(link), Relaxed);
            head
        };
        let inuse = d.inuse.load(Relaxed) + 1;
        d.inuse.store(inuse, Relaxed);
        st.objs_inuse += 1;
        self.note_counts(ci, st);
        if inuse as usize == shape.objs_per_zspage {
            self.unlist(st, first);
        }
        obj
    }

    /// Returns object `obj` to zspage `first`'s free list; relists a zspage that was full.
    fn put_free_obj(&self, ci: usize, st: &mut ClassState, first: u32, obj: usize) {
        let shape = self.classes[ci].shape;
        let d = self.arena.desc(first);
        if ci != HUGE_CLASS {
            let head = d.free_head.load(Relaxed);
            self.copy_in(ci, first, obj * shape.size, &head.to_ne_bytes());
            d.free_head.store(obj as u32, Relaxed);
        }
        let inuse = d.inuse.load(Relaxed);
        assert!(inuse > 0, "double free in class {ci}");
        d.inuse.store(inuse - 1, Relaxed);
        st.objs_inuse -= 1;
        self.note_counts(ci, st);
        if d.list_prev.load(Relaxed) == OFF_LIST {
            self.list(st, first);
        }
    }

    /// Puts zspage `first` (off the list) at the head of the partial list.
    fn list(&self, st: &mut ClassState, first: u32) {
        let d = self.arena.desc(first);
        debug_assert!(matches!(d.list_prev.load(Relaxed), OFF_LIST | ISOLATED), "zspage {first} listed twice");
        if st.partial_head != NONE {
            self.arena.desc(st.partial_head).list_prev.store(first, Relaxed);
        }
        d.list_next.store(st.partial_head, Relaxed);
        d.list_prev.store(LIST_HEAD, Relaxed);
        st.partial_head = first;
        st.partial_len += 1;
    }

    /// Takes zspage `first` off the partial list. O(1), allocates nothing.
    fn unlist(&self, st: &mut ClassState, first: u32) {
        let d = self.arena.desc(first);
        let (prev, next) = (d.list_prev.load(Relaxed), d.list_next.load(Relaxed));
        debug_assert!(prev <= LIST_HEAD, "zspage {first} is not on the partial list");
        if prev == LIST_HEAD {
            st.partial_head = next;
        } else {
            self.arena.desc(prev).list_next.store(next, Relaxed);
        }
        if next != NONE {
            self.arena.desc(next).list_prev.store(prev, Relaxed);
        }
        d.list_prev.store(OFF_LIST, Relaxed);
        st.partial_len -= 1;
    }

    /// The zspages on the partial list, head first.
    fn partials<'a>(&'a self, st: &ClassState) -> impl Iterator<Item = u32> + 'a {
        std::iter::successors(Some(st.partial_head).filter(|&p| p != NONE), move |&p| {
            Some(self.arena.desc(p).list_next.load(Relaxed)).filter(|&n| n != NONE)
        })
    }

    fn release_zspage(&self, ci: usize, st: &mut ClassState, first: u32) {
        if self.arena.desc(first).list_prev.load(Relaxed) <= LIST_HEAD {
            self.unlist(st, first);
        }
        let mut pfns = [0u32; MAX_CHAIN];
        let n = self.classes[ci].shape.pages_per_zspage;
        let mut pfn = first;
        for p in pfns.iter_mut().take(n) {
            *p = pfn;
            pfn = self.arena.desc(pfn).next.load(Relaxed);
        }
        st.zspages -= 1;
        self.note_counts(ci, st);
        self.arena.free(&pfns[..n]);
    }

    // --- compaction ----------------------------------------------------------------------------

    fn compact_class(&self, ci: usize, relocate: &mut Relocate<'_>) -> u64 {
        let shape = self.classes[ci].shape;
        let mut freed = 0;
        loop {
            // Pick the emptiest partial zspage, if the others have room for all its objects.
            let src = {
                let mut st = self.classes[ci].state.lock();
                if st.partial_len < 2 {
                    break;
                }
                let inuse = |pfn: u32| self.arena.desc(pfn).inuse.load(Relaxed) as usize;
                let src = self.partials(&st).min_by_key(|&p| inuse(p)).expect("two or more partials");
                let room: usize = self.partials(&st).filter(|&p| p != src).map(|p| shape.objs_per_zspage - inuse(p)).sum();
                if room < inuse(src) {
                    break;
                }
                self.unlist(&mut st, src);
                self.arena.desc(src).list_prev.store(ISOLATED, Relaxed);
                src
            };
            // Move its objects out a chunk at a time: owners read under the class lock into an
            // array on the stack, relocated without it. Nothing here allocates (a write that
            // finds the pool full compacts on the I/O path, which must not fault). The zspage
            // is off the partial list, so no object appears on it meanwhile; one freed
            // meanwhile is simply not seen (or not moved: `relocate` checks the handle).
            const CHUNK: usize = 64;
            let mut next_obj = 0;
            while next_obj < shape.objs_per_zspage {
                let mut victims = [(0u32, Handle(0)); CHUNK];
                let mut n = 0;
                {
                    let _st = self.classes[ci].state.lock();
                    while next_obj < shape.objs_per_zspage && n < CHUNK {
                        let mut hdr = [0u8; 4];
                        self.copy_out(ci, src, next_obj * shape.size, &mut hdr);
                        let hdr = u32::from_ne_bytes(hdr);
                        if hdr & ALLOC_TAG != 0 {
                            victims[n] = (hdr & !ALLOC_TAG, Handle::new(ci, src, next_obj));
                            n += 1;
                        }
                        next_obj += 1;
                    }
                }
                for &(owner, h) in &victims[..n] {
                    let mut moved = false;
                    relocate(owner, h, &mut || {
                        let new = self.migrate(ci, h);
                        moved = new.is_some();
                        new
                    });
                    if moved {
                        // The owner's slot names the copy now (contract rule 2): the old
                        // one is freed only after, so a process that dies in between leaves
                        // the slot naming a live object either way.
                        let mut st = self.classes[ci].state.lock();
                        self.put_free_obj(ci, &mut st, src, h.obj());
                    }
                }
            }
            let mut st = self.classes[ci].state.lock();
            let d = self.arena.desc(src);
            if d.inuse.load(Relaxed) == 0 {
                d.list_prev.store(OFF_LIST, Relaxed);
                self.release_zspage(ci, &mut st, src);
                freed += shape.pages_per_zspage as u64;
            } else {
                // Some owners were busy or rewrote their page meanwhile: put it back and stop
                // here rather than spin on it.
                self.list(&mut st, src);
                break;
            }
        }
        freed
    }

    /// Copies object `h` (on an isolated zspage) into another zspage of its class, header
    /// (owner) included. Runs inside `relocate`, under the owner's slot lock; the caller frees
    /// `h` once the owner names the copy.
    fn migrate(&self, ci: usize, h: Handle) -> Option<Handle> {
        let shape = self.classes[ci].shape;
        let mut st = self.classes[ci].state.lock();
        let dst = Some(st.partial_head).filter(|&p| p != NONE)?;
        let obj = self.take_free_obj(ci, &mut st, dst);
        let mut buf = [0u8; PAGE_SIZE];
        let bytes = &mut buf[..shape.size];
        self.copy_out(ci, h.first_pfn(), h.obj() * shape.size, bytes);
        self.copy_in(ci, dst, obj * shape.size, bytes);
        Some(Handle::new(ci, dst, obj))
    }

    // --- byte access across a zspage's page chain -------------------------------------------

    /// Calls `f(page_address, range_in_buffer)` for each page piece of bytes `off..off + len`
    /// of the zspage starting at `first`.
    fn for_each_piece(&self, first: u32, off: usize, len: usize, mut f: impl FnMut(*mut u8, std::ops::Range<usize>)) {
        let mut pfn = first;
        for _ in 0..off / PAGE_SIZE {
            pfn = self.arena.desc(pfn).next.load(Relaxed);
        }
        let mut in_page = off % PAGE_SIZE;
        let mut done = 0;
        while done < len {
            let n = (PAGE_SIZE - in_page).min(len - done);
            // SAFETY: in_page + n <= PAGE_SIZE, so the address stays inside page `pfn`.
            f(unsafe { self.arena.page_ptr(pfn).add(in_page) }, done..done + n);
            done += n;
            in_page = 0;
            if done < len {
                pfn = self.arena.desc(pfn).next.load(Relaxed);
            }
        }
    }

    fn copy_in(&self, ci: usize, first: u32, off: usize, src: &[u8]) {
        debug_assert!(off + src.len() <= self.classes[ci].shape.pages_per_zspage * PAGE_SIZE);
        self.for_each_piece(first, off, src.len(), |p, r| {
            // SAFETY: `p` addresses r.len() bytes inside an arena page of this zspage (see
            // for_each_piece); the bytes belong to an object this thread may write: a free or
            // just-allocated object under the class lock, or a header under the class lock.
            // They cannot overlap `src`, which is caller memory outside the arena or another object.
            unsafe { std::ptr::copy_nonoverlapping(src[r.clone()].as_ptr(), p, r.len()) }
        });
    }

    fn copy_out(&self, ci: usize, first: u32, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= self.classes[ci].shape.pages_per_zspage * PAGE_SIZE);
        self.for_each_piece(first, off, dst.len(), |p, r| {
            // SAFETY: as in copy_in; the bytes are pinned by the caller (slot lock or class
            // lock), so no thread writes them during the copy.
            unsafe { std::ptr::copy_nonoverlapping(p, dst[r.clone()].as_mut_ptr(), r.len()) }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn payload(seed: u32, len: usize) -> Vec<u8> {
        (0..len).map(|i| (seed as usize * 31 + i * 7) as u8).collect()
    }

    #[test]
    fn objects_read_back_across_page_boundaries() {
        let pool = ZsPool::private(4096, 0).unwrap();
        let mut live = Vec::new();
        for (i, len) in [1usize, 13, 700, 1021, 2000, 3000, 3071, 4092, 4096].iter().cycle().take(300).enumerate() {
            let data = payload(i as u32, *len);
            live.push((pool.alloc(&data, i as u32).unwrap(), data));
        }
        for (h, data) in &live {
            let mut out = vec![0u8; data.len()];
            // SAFETY: single-threaded test; each handle is live and read by its only user.
            unsafe { pool.read(*h, &mut out) };
            assert_eq!(&out, data);
        }
        for (h, _) in live {
            // SAFETY: each live handle is freed exactly once.
            unsafe { pool.free(h) };
        }
        assert_eq!(pool.total_pages(), 0, "every zspage released");
    }

    #[test]
    fn the_limit_refuses_new_zspages_and_keeps_old_objects() {
        let pool = ZsPool::private(1024, 4);
        let pool = pool.unwrap();
        let mut n = 0;
        let err = loop {
            match pool.alloc(&[0xab; 4096], n) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(n, 4);
        assert_eq!(err, PoolFull { used_bytes: 4 * 4096, limit_bytes: 4 * 4096 });
    }

    #[test]
    fn compaction_releases_pages_and_keeps_every_object() {
        let pool = ZsPool::private(1 << 16, 0).unwrap();
        // owner -> (handle, data); the map plays the slot table.
        let mut slots: HashMap<u32, (Handle, Vec<u8>)> = HashMap::new();
        for i in 0..4000u32 {
            let data = payload(i, 300 + (i as usize % 5) * 8);
            slots.insert(i, (pool.alloc(&data, i).unwrap(), data));
        }
        let full = pool.total_pages();
        for i in (0..4000u32).filter(|i| i % 4 != 0) {
            let (h, _) = slots.remove(&i).unwrap();
            // SAFETY: freed once by its owner.
            unsafe { pool.free(h) };
        }
        let before = pool.total_pages();
        assert!(before > full / 2, "churn leaves sparse zspages ({before} of {full})");
        let freed = pool.compact(&mut |owner, h, mv| {
            let entry = slots.get_mut(&owner).expect("owner header names a live slot");
            if entry.0 == h {
                if let Some(new) = mv() {
                    entry.0 = new;
                }
            }
        });
        assert!(freed > 0 && pool.total_pages() == before - freed);
        assert!(pool.total_pages() <= full / 4 + 5 * 8 * 2, "dense again: {} pages", pool.total_pages());
        assert_eq!(pool.pages_compacted(), freed);
        assert_eq!(pool.compactable_pages(), counted_compactable(&pool), "after compaction");
        for (h, data) in slots.values() {
            let mut out = vec![0u8; data.len()];
            // SAFETY: single-threaded; handles are current after relocation.
            unsafe { pool.read(*h, &mut out) };
            assert_eq!(&out, data);
        }
    }

    /// `compactable_pages` computed afresh from every class's counts, under its lock.
    fn counted_compactable(pool: &ZsPool) -> u64 {
        (0..HUGE_CLASS).map(|ci| ZsPool::compactable_share(pool.classes[ci].shape, &pool.classes[ci].state.lock())).sum()
    }

    #[test]
    fn the_compactable_estimate_follows_every_alloc_and_free() {
        let pool = ZsPool::private(1 << 16, 0).unwrap();
        let mut live: Vec<Handle> = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut seen_nonzero = false;
        for i in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Allocations of many classes (huge pages too), frees at random: sparse zspages.
            if live.is_empty() || x % 5 < 3 {
                let len = [24, 100, 300, 301, 700, 1500, 3000, 4096][(x >> 8) as usize % 8];
                live.push(pool.alloc(&payload(i, len), i).unwrap());
            } else {
                let h = live.swap_remove((x >> 16) as usize % live.len());
                // SAFETY: each handle leaves `live` when it is freed, so it is freed once.
                unsafe { pool.free(h) };
            }
            if i % 97 == 0 {
                let c = pool.compactable_pages();
                assert_eq!(c, counted_compactable(&pool), "after operation {i}");
                seen_nonzero |= c > 0;
            }
        }
        assert!(seen_nonzero, "the churn left something to compact");
        for h in live {
            // SAFETY: as above.
            unsafe { pool.free(h) };
        }
        assert_eq!((pool.compactable_pages(), pool.total_pages()), (0, 0));
    }
}
