//! Rebuilding a pool from a dead process's state file: from the objects the slot table names
//! (the claims), never from the pool's own lists and counts, which the process may have been
//! changing when it died.
//!
//! What survives a kill and is used: each object's bytes and header (written before its handle
//! was published), each zspage's page chain (`PageDesc::next`, set when the zspage was made and
//! unchanged while it lives) and a huge page's owner (`PageDesc::free_head`). What is rebuilt:
//! every zspage's object count and free-object list, the partial lists, the class counts, the
//! arena's free lists. Everything a claim relies on is checked first, and a claim that fails a
//! check is rejected (its slot is then lost, never read):
//! - the handle's class is the one the claimed length is served by, its object index is in the
//!   zspage, its first page inside the arena;
//! - the zspage's chain has its class's page count, inside the arena, without a repeated page,
//!   and ends there; every claim on the zspage names the same class;
//! - the object's header names the claiming slot (a huge page: its descriptor does);
//! - no page belongs to two zspages (both are rejected).
//!
//! Objects no claim names (a write or a move the process did not finish, a page it freed) are
//! free afterwards, and zspages with no claimed object give their pages back.

use std::sync::atomic::Ordering::Relaxed;

use super::class::{class_for, shape, HEADER, HUGE_CLASS, MAX_CHAIN, NUM_CLASSES};
use super::{ClassState, Handle, ZsPool, ALLOC_TAG, LINK_END, NONE, OFF_LIST};
use crate::PAGE_SIZE;

/// The largest payload a headed object holds.
const MAX_HEADED: usize = PAGE_SIZE - HEADER;
/// The `len` a claim that failed its zspage's checks is marked with (no claim has it: a
/// claim's length is checked to be 1..=`PAGE_SIZE` first).
const REJECTED: u32 = 0;

/// An object a slot names: its handle, the slot (`owner`), and the payload's length (the
/// compressed length, or `PAGE_SIZE` for a raw page).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    pub handle: Handle,
    pub owner: u32,
    pub len: u32,
}

/// What [`ZsPool::rebuild`] did.
#[derive(Debug, Default)]
pub(crate) struct Rebuilt {
    /// The owners of the claims that failed a check.
    pub rejected: Vec<u32>,
    /// Objects allocated but named by no slot, now free.
    pub orphans: u64,
    /// Pages holding live zspages.
    pub pages: u64,
}

/// A zspage some claim names, 16 bytes: one per zspage is held at once, and a successor may
/// be taking over while memory is short. Its pages are not kept: once `walk_chain` has checked
/// the chain, [`ZsPool::chain`] walks it again (nothing changes it during a rebuild).
struct Zspage {
    first: u32,
    /// The claims on this zspage (sorted by object), `claims.0..claims.1`; those rejected have
    /// `len` [`REJECTED`].
    claims: (u32, u32),
    class: u16,
    n_pages: u8,
    rejected: bool,
}

impl Zspage {
    fn claims(&self) -> std::ops::Range<usize> {
        self.claims.0 as usize..self.claims.1 as usize
    }

    fn class(&self) -> usize {
        usize::from(self.class)
    }
}

impl ZsPool {
    /// Rebuilds the pool's lists and counts from `claims` (module docs) and gives every page
    /// no accepted claim uses back to the kernel. The pool must be new (from [`ZsPool::new`]
    /// over a dead process's state file) and unused by any other thread.
    pub fn rebuild(&self, mut claims: Vec<Claim>) -> std::io::Result<Rebuilt> {
        let mut out = Rebuilt::default();
        let capacity = self.arena.capacity_pages();
        // 1. Each claim on its own.
        claims.retain(|c| {
            let ok = self.claim_shape_ok(c, capacity);
            if !ok {
                out.rejected.push(c.owner);
            }
            ok
        });
        claims.sort_unstable_by_key(|c| (c.handle.first_pfn(), c.handle.obj()));
        // 2. Per zspage: one class, a sound chain, headers naming the owners.
        let mut zspages: Vec<Zspage> = Vec::new();
        let mut i = 0;
        while i < claims.len() {
            let first = claims[i].handle.first_pfn();
            let mut j = i;
            while j < claims.len() && claims[j].handle.first_pfn() == first {
                j += 1;
            }
            let class = claims[i].handle.class();
            let mut z = Zspage { first, claims: (i as u32, j as u32), class: class as u16, n_pages: 0, rejected: false };
            let mut accepted = 0;
            if claims[i..j].iter().any(|c| c.handle.class() != class) || !self.walk_chain(&mut z, capacity) {
                z.rejected = true;
            } else {
                let mut last_accepted = None;
                for c in &mut claims[i..j] {
                    // Two slots naming one object: its header names at most one of them.
                    let taken = last_accepted == Some(c.handle.obj());
                    if !taken && self.header_names(&z, c) {
                        last_accepted = Some(c.handle.obj());
                        accepted += 1;
                    } else {
                        out.rejected.push(c.owner);
                        c.len = REJECTED;
                    }
                }
            }
            if z.rejected {
                out.rejected.extend(claims[i..j].iter().map(|c| c.owner));
            } else if accepted > 0 {
                zspages.push(z);
            }
            i = j;
        }
        // 3. No page in two zspages.
        let mut owners: Vec<(u32, u32)> =
            zspages.iter().enumerate().flat_map(|(zi, z)| self.chain(z).map(move |p| (p, zi as u32))).collect();
        owners.sort_unstable();
        for w in owners.windows(2) {
            if w[0].0 == w[1].0 {
                zspages[w[0].1 as usize].rejected = true;
                zspages[w[1].1 as usize].rejected = true;
            }
        }
        for z in zspages.iter().filter(|z| z.rejected) {
            out.rejected.extend(claims[z.claims()].iter().filter(|c| c.len != REJECTED).map(|c| c.owner));
        }
        zspages.retain(|z| !z.rejected);
        // 4. Lists and counts.
        for c in self.classes.iter() {
            *c.state.lock() = ClassState::default();
        }
        for a in self.compactable.iter() {
            a.store(0, Relaxed);
        }
        let mut used: Vec<u32> = Vec::new();
        for z in &zspages {
            out.orphans += self.rebuild_zspage(z, &claims);
            used.extend(self.chain(z));
        }
        used.sort_unstable();
        out.pages = used.len() as u64;
        self.arena.recovered(&used)?;
        out.rejected.sort_unstable();
        out.rejected.dedup();
        Ok(out)
    }

    fn claim_shape_ok(&self, c: &Claim, capacity: u32) -> bool {
        let len = c.len as usize;
        let ci = c.handle.class();
        let expected = match len {
            PAGE_SIZE => HUGE_CLASS,
            1..=MAX_HEADED => self.serving[class_for(len)] as usize,
            _ => return false,
        };
        ci < NUM_CLASSES
            && ci == expected
            && c.handle.first_pfn() < capacity
            && c.handle.obj() < self.classes[ci].shape.objs_per_zspage
            && c.owner & ALLOC_TAG == 0
            && c.handle.0 >> 53 == 0
    }

    /// Follows zspage `z`'s page chain; false if it is not its class's length, leaves the
    /// arena, repeats a page, or does not end there.
    fn walk_chain(&self, z: &mut Zspage, capacity: u32) -> bool {
        let n = shape(z.class()).pages_per_zspage;
        let mut pages = [NONE; MAX_CHAIN];
        let mut pfn = z.first;
        for k in 0..n {
            if pfn >= capacity || pages[..k].contains(&pfn) {
                return false;
            }
            pages[k] = pfn;
            pfn = self.arena.desc(pfn).next.load(Relaxed);
        }
        z.n_pages = n as u8;
        pfn == NONE
    }

    /// The pages of zspage `z`, whose chain `walk_chain` has checked.
    fn chain(&self, z: &Zspage) -> impl Iterator<Item = u32> + '_ {
        let mut pfn = z.first;
        (0..z.n_pages).map(move |_| {
            let p = pfn;
            pfn = self.arena.desc(p).next.load(Relaxed);
            p
        })
    }

    /// Whether the object `c` claims has a header naming `c.owner` (a huge page: its descriptor).
    fn header_names(&self, z: &Zspage, c: &Claim) -> bool {
        if z.class() == HUGE_CLASS {
            return self.arena.desc(z.first).free_head.load(Relaxed) == c.owner;
        }
        self.header(z.class(), z.first, c.handle.obj()) == c.owner | ALLOC_TAG
    }

    fn header(&self, ci: usize, first: u32, obj: usize) -> u32 {
        let mut h = [0u8; 4];
        self.copy_out(ci, first, obj * self.classes[ci].shape.size, &mut h);
        u32::from_ne_bytes(h)
    }

    /// Rebuilds one accepted zspage's count, free list and place on its class's list. Returns
    /// the objects that were allocated but are claimed by no slot (now free).
    fn rebuild_zspage(&self, z: &Zspage, claims: &[Claim]) -> u64 {
        let ci = z.class();
        let shape = self.classes[ci].shape;
        let d = self.arena.desc(z.first);
        let accepted = || claims[z.claims()].iter().filter(|c| c.len != REJECTED);
        let live = accepted().count();
        let mut orphans = 0;
        d.inuse.store(live as u32, Relaxed);
        d.list_prev.store(OFF_LIST, Relaxed);
        d.list_next.store(NONE, Relaxed);
        if ci != HUGE_CLASS {
            let mut claimed = vec![false; shape.objs_per_zspage];
            for c in accepted() {
                claimed[c.handle.obj()] = true;
            }
            let mut head = LINK_END;
            for obj in (0..shape.objs_per_zspage).rev().filter(|&o| !claimed[o]) {
                if self.header(ci, z.first, obj) & ALLOC_TAG != 0 {
                    orphans += 1;
                }
                self.copy_in(ci, z.first, obj * shape.size, &head.to_ne_bytes());
                head = obj as u32;
            }
            d.free_head.store(head, Relaxed);
        }
        let mut st = self.classes[ci].state.lock();
        st.zspages += 1;
        st.objs_inuse += live as u64;
        if live < shape.objs_per_zspage {
            self.list(&mut st, z.first);
        }
        self.note_counts(ci, &st);
        orphans
    }
}

#[cfg(test)]
mod tests {
    use super::super::ArenaRegions;
    use super::*;
    use crate::shm::StateMap;
    use std::sync::Arc;

    fn payload(seed: u32, len: usize) -> Vec<u8> {
        (0..len).map(|i| (seed as usize * 131 + i * 7) as u8).collect()
    }

    fn pool_in(map: &Arc<StateMap>, cap: u32) -> ZsPool {
        let (descs, _) = ZsPool::region_bytes(cap);
        ZsPool::new(map, ArenaRegions { descs_offset: 0, pages_offset: descs.next_multiple_of(PAGE_SIZE) }, cap, 0)
    }

    #[test]
    fn a_second_pool_over_the_same_file_serves_the_claimed_objects_and_reuses_the_rest() {
        let cap = 4096;
        let (descs, pages) = ZsPool::region_bytes(cap);
        let map = Arc::new(StateMap::create(descs.next_multiple_of(PAGE_SIZE) + pages).unwrap());
        let a = pool_in(&map, cap);
        let mut claims = Vec::new();
        let mut data = Vec::new();
        for i in 0..600u32 {
            let len = [20usize, 300, 301, 1000, 2900, PAGE_SIZE][i as usize % 6];
            let d = payload(i, len);
            let h = a.alloc(&d, i).unwrap();
            if (i / 6) % 2 == 0 {
                claims.push(Claim { handle: h, owner: i, len: len as u32 });
                data.push(d);
            } // the others: allocated, then the process "died" before publishing them
        }
        let pages_before = a.total_pages();
        // A bad claim of each kind.
        let (one, two) = (claims[1], claims[2]);
        claims.push(Claim { owner: 9999, ..one }); // the header names another slot
        claims.push(Claim { owner: 8888, len: 17, ..two }); // a length of another class
        let b = pool_in(&map, cap);
        let r = b.rebuild(claims.clone()).unwrap();
        assert_eq!(r.rejected, vec![8888, 9999]);
        assert!(r.orphans > 0 && b.total_pages() < pages_before, "unclaimed objects freed: {r:?}");
        for (c, d) in claims.iter().zip(&data).filter(|(c, _)| !r.rejected.contains(&c.owner)) {
            let mut out = vec![0u8; d.len()];
            // SAFETY: single-threaded test; the claimed object is live.
            unsafe { b.read(c.handle, &mut out) };
            assert_eq!(&out, d);
        }
        // The rebuilt pool allocates and frees as a new one does.
        let more: Vec<_> = (0..600u32).map(|i| b.alloc(&payload(i, 300), 10_000 + i).unwrap()).collect();
        for h in more {
            // SAFETY: freed once.
            unsafe { b.free(h) };
        }
        for c in claims.iter().filter(|c| !r.rejected.contains(&c.owner)) {
            // SAFETY: each surviving claimed object is freed once.
            unsafe { b.free(c.handle) };
        }
        assert_eq!(b.total_pages(), 0);
    }
}
