//! Taking over a dead process's RAM state: [`Ram::recover`].
//!
//! The state file (`layout.rs`) is all a successor gets. It trusts nothing the dead process
//! may have been changing and recomputes what it can:
//! 1. the header: this build's layout version, and the geometry and algorithm the successor
//!    is configured with (else one line saying what differs, and nothing is touched);
//! 2. the journal (`journal.rs`): every slot that was locked with a valid record gets its old
//!    words back (an entry change the process did not finish is undone, whole); then every
//!    slot is unlocked and its movers' marks cleared;
//! 3. the dictionaries the file kept (`compress/dict.rs`);
//! 4. each slot's entry is checked: a kind no version writes, a dictionary codec whose
//!    dictionary is missing, a `BACKING` entry the backing tier does not vouch for
//!    ([`KeptRecords`]: its record must lie inside the device and one opened segment; without
//!    a tier every such entry) make the slot LOST; the pool objects the others name are
//!    checked and the pool rebuilt from them (`zspool/recover.rs`), and a slot whose object
//!    fails a check is LOST too;
//! 5. the counters are recomputed from the entries (`Mover::account`), as the writes that
//!    made them did; the cumulative ones (reads, writes, failures) start from zero;
//! 6. every page the file holds is mapped into this process (so locked, under a swap server's
//!    `mlockall`: the dead process's locks died with it).
//!
//! A LOST slot reads as an I/O error, is counted ([`Recovered::lost`]) and logged by the
//! caller; the next write to it replaces it. Nothing a check cannot vouch for is ever
//! returned as data. (The checks are of the structure: the owner in each object's header, the
//! classes, the chains. The bytes of a compressed page are as the dead process left them,
//! as they would be in its memory.)

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::layout::{self, Expect};
use super::mover::Clock;
use super::Ram;
use crate::shm::{Region, StateMap};
use crate::slot::{Entry, Slot};
use crate::zspool::Claim;
use crate::PAGE_SIZE;

const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

/// What [`Ram::recover`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Slots holding a page (in RAM, same-filled, on the backing device) after recovery.
    pub pages: u64,
    /// Of those, pages whose record is on the backing device.
    pub backing_pages: u64,
    /// Slots whose entry could not be vouched for: their reads fail (I/O error).
    pub lost_pages: u64,
    /// Entry changes the dead process had not finished, undone from the journal.
    pub undone: u64,
    /// Pool objects allocated but named by no slot (an unfinished write or move), now free.
    pub freed_objects: u64,
    /// Dictionaries read back.
    pub dicts: u64,
    /// Cold-tier block writes the dead process had not finished (0 or 1): the block reads as
    /// before it, and the half-written slot was freed (`backing/blocks.rs`). Filled in by the
    /// store above this layer.
    pub cold_writes_undone: u64,
    /// Pages of pool memory holding the surviving objects.
    pub pool_pages: u64,
    /// Takeovers of this state so far, this one included.
    pub takeovers: u64,
    pub elapsed: Duration,
}

/// What recovery asks of the tier that keeps the records `BACKING` entries name (the backing
/// tier, a floor above, which this layer does not import).
pub(crate) trait KeptRecords {
    /// Vouches for the record of `len` payload bytes at `loc` that a slot names (it lies inside
    /// the device and inside one segment that was opened) and counts it live; `false`: the
    /// slot is LOST.
    fn claim(&self, loc: u64, len: u16) -> bool;
}

/// A dead process's state file, mapped, its header checked against the successor's
/// configuration; nothing in it changed yet ([`Ram::open_state`]).
pub(crate) struct Opened {
    map: Arc<StateMap>,
    layout: layout::Layout,
    huge_threshold_bytes: usize,
    start: Instant,
}

impl Ram {
    /// Takes over the state file `fd` a dead (or stopped) process left, for a device of
    /// `num_pages` pages compressed with `algorithm` (module docs), with no backing tier (its
    /// `BACKING` entries, if any, are LOST). No other process may use the file any more. The
    /// error is one line saying what is wrong.
    #[cfg(test)]
    pub fn recover(
        fd: OwnedFd,
        num_pages: u64,
        mem_limit_bytes: u64,
        huge_threshold_bytes: usize,
        algorithm: &str,
    ) -> Result<(Ram, Recovered), String> {
        Ram::open_state(fd, num_pages, huge_threshold_bytes, algorithm)?.recover(mem_limit_bytes, None)
    }

    /// Step 1 of recovery: maps the state file `fd` and checks its header; changes nothing, so
    /// that the tiers above can check their own parts (`Opened::tier_region`) before
    /// [`Opened::recover`] does.
    pub fn open_state(fd: OwnedFd, num_pages: u64, huge_threshold_bytes: usize, algorithm: &str) -> Result<Opened, String> {
        let start = Instant::now();
        let map = Arc::new(StateMap::open(fd).map_err(|e| format!("cannot map the state file: {e}"))?);
        let layout = layout::header(&map).check(&map, &Expect { num_pages, huge_threshold: huge_threshold_bytes, algorithm })?;
        Ok(Opened { map, layout, huge_threshold_bytes, start })
    }
}

impl Opened {
    /// The backing tier's region, as the header sizes it (`None`: the dead device had none).
    pub fn tier_region(&self) -> Option<Region> {
        super::tier_region(&self.map, &self.layout)
    }

    /// Steps 2-6 (module docs): takes the state over. `records` vouches for the records of
    /// `BACKING` entries; without it they are LOST.
    pub fn recover(self, mem_limit_bytes: u64, records: Option<&dyn KeptRecords>) -> Result<(Ram, Recovered), String> {
        let Opened { map, layout: l, huge_threshold_bytes, start } = self;
        let header = layout::header(&map);
        let clock = Clock::from_origin(header.clock_origin_ns());
        let ram = Ram::over(map.clone(), &l, mem_limit_bytes, huge_threshold_bytes, clock);
        let mut r = Recovered { takeovers: header.took_over(), ..Recovered::default() };

        // 2. Undo unfinished entry changes, then unlock everything.
        for (index, meta, data) in ram.journal.pending() {
            if let Some(slot) = ram.slots.get(index as usize) {
                if Slot::is_locked(slot.raw().0) {
                    let old = Slot::decode_raw(meta, data).unwrap_or(Entry::Lost);
                    slot.set_recovered(meta, old);
                    r.undone += 1;
                }
            }
        }
        ram.journal.clear();
        // 3.
        r.dicts = ram.dicts.recover();
        // 4. Check every entry; claim the pool objects. Only the parts of the slot table that
        // were ever written are read (the rest are holes: empty slots that cost nothing). The
        // slots are walked twice, not listed: a successor may be taking over while memory is
        // short, and each page of heap it touches then waits for memory (docs/swap.md).
        let table = map.data_ranges(l.slots, l.num_pages as usize * SLOT_BYTES);
        let written = || {
            table
                .iter()
                .flat_map(|r| (r.start - l.slots) / SLOT_BYTES..(r.end - l.slots).div_ceil(SLOT_BYTES))
                .filter(|&i| i < ram.slots.len())
        };
        let mut claims = Vec::new();
        for index in written() {
            let slot = &ram.slots[index];
            let (meta, data) = slot.raw();
            let e = match Slot::decode_raw(meta, data) {
                Some(Entry::Compressed { codec, .. }) if codec.dict().is_some_and(|p| ram.dicts.get(p).is_none()) => Entry::Lost,
                Some(Entry::Backing { codec, .. }) if codec.dict().is_some_and(|p| ram.dicts.get(p).is_none()) => Entry::Lost,
                Some(Entry::Backing { loc, len, .. }) if !records.is_some_and(|k| k.claim(loc, len)) => Entry::Lost,
                None => Entry::Lost,
                Some(e) => e,
            };
            match e {
                Entry::Compressed { handle, len, .. } => claims.push(Claim { handle, owner: index as u32, len: len as u32 }),
                Entry::Huge { handle } => claims.push(Claim { handle, owner: index as u32, len: PAGE_SIZE as u32 }),
                _ => {}
            }
            if meta != 0 || data != 0 {
                slot.set_recovered(meta, e);
            }
        }
        let rebuilt = ram.pool.rebuild(claims).map_err(|e| format!("cannot give free pool pages back: {e}"))?;
        for &owner in &rebuilt.rejected {
            let slot = &ram.slots[owner as usize];
            slot.set_recovered(slot.raw().0, Entry::Lost);
        }
        r.freed_objects = rebuilt.orphans;
        r.pool_pages = rebuilt.pages;
        // 5. Counters, from the entries.
        let mover = ram.mover(None);
        for index in written() {
            let (meta, data) = ram.slots[index].raw();
            if meta == 0 && data == 0 {
                continue; // never written: the common case of a sparse table, touched by nothing
            }
            match Slot::decode_raw(meta, data) {
                Some(Entry::Lost) => r.lost_pages += 1,
                Some(Entry::Empty) | None => {}
                Some(e) => {
                    mover.account(e, true);
                    r.pages += 1;
                    r.backing_pages += u64::from(matches!(e, Entry::Backing { .. }));
                }
            }
        }
        // 6. Map every page the state holds into this process: under the swap server's
        // mlockall(MCL_FUTURE | MCL_ONFAULT) a page is locked when it is mapped, and the dead
        // process's locks died with it, so until this runs the state's pages could be swapped
        // out (to this very device). Without mlockall this only maps them.
        for range in map.data_ranges(0, map.len()) {
            for off in range.step_by(PAGE_SIZE) {
                // SAFETY: inside the mapping; a read of one byte, no other thread runs yet.
                unsafe { std::ptr::read_volatile(map.at(off).as_ptr()) };
            }
        }
        r.elapsed = start.elapsed();
        Ok((ram, r))
    }
}

impl std::fmt::Display for Recovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} pages recovered ({} on the backing device, {} lost), {} unfinished changes undone, {} orphaned objects freed, {} dictionaries, \
             takeover {} of this state, in {:.1} ms",
            self.pages,
            self.backing_pages,
            self.lost_pages,
            self.undone,
            self.freed_objects,
            self.dicts,
            self.takeovers,
            self.elapsed.as_secs_f64() * 1000.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::Entry;

    fn ram() -> Ram {
        Ram::new(64, 0, 3000, "lz4", 0).unwrap()
    }

    fn successor(r: &Ram) -> (Ram, Recovered) {
        Ram::recover(r.state_fd().try_clone_to_owned().unwrap(), 64, 0, 3000, "lz4").unwrap()
    }

    #[test]
    fn a_change_cut_short_between_its_two_stores_is_undone_whole() {
        let r = ram();
        let old = r.alloc(5, super::super::Encoded::Compressed(&[7u8; 100])).unwrap();
        let _ = r.slots()[5].lock().replace(r.journal(), 5, old);
        let new = r.alloc(5, super::super::Encoded::Huge(&[9u8; PAGE_SIZE])).unwrap();
        // The process dies after storing the new `data`, before its `meta`: the slot is locked
        // and holds the new handle with the old kind and length, a torn entry.
        let mut g = r.slots()[5].lock();
        g.replace(r.journal(), 5, new);
        std::mem::forget(g);
        let (s, rep) = successor(&r);
        assert_eq!((rep.undone, rep.lost_pages, rep.pages, rep.freed_objects), (1, 0, 1, 0), "{rep}");
        assert_eq!(s.slots()[5].lock().entry(), old, "the old entry, whole and unlocked");
        // The new object (a huge page of its own) is named by no slot: its page was given back.
        assert_eq!(rep.pool_pages, 1, "{rep}");
    }

    #[test]
    fn a_slot_locked_with_no_change_is_unlocked_and_kept() {
        let r = ram();
        let _ = r.slots()[3].lock().replace(r.journal(), 3, Entry::Same(42));
        std::mem::forget(r.slots()[3].lock());
        let (s, rep) = successor(&r);
        assert_eq!((rep.undone, rep.pages), (0, 1));
        assert_eq!(s.slots()[3].lock().entry(), Entry::Same(42));
    }

    #[test]
    fn an_entry_no_check_vouches_for_is_lost_and_reads_as_an_error() {
        let r = ram();
        let e = r.alloc(9, super::super::Encoded::Compressed(&[1u8; 300])).unwrap();
        let _ = r.slots()[9].lock().replace(r.journal(), 9, e);
        let e2 = r.alloc(10, super::super::Encoded::Compressed(&[2u8; 300])).unwrap();
        let _ = r.slots()[10].lock().replace(r.journal(), 10, e2);
        // Slot 10 now names slot 9's object (a damaged table): its header names slot 9.
        let (_, d9) = r.slots()[9].raw();
        let (m10, _) = r.slots()[10].raw();
        r.slots()[10].set_recovered(m10, Slot::decode_raw(m10, d9).unwrap());
        let (s, rep) = successor(&r);
        assert_eq!((rep.lost_pages, rep.pages), (1, 1), "{rep}");
        assert_eq!(s.slots()[10].lock().entry(), Entry::Lost);
        let lat = std::sync::Arc::new(crate::latency::ThreadLatency::default());
        let mut ctx = crate::context::Context::new(crate::Algorithm::Lz4.backend(None).new_context(), false, 4096, None, None, lat);
        let mut out = vec![0u8; PAGE_SIZE];
        let fetched = s.fetch(&s.slots()[10].lock(), &mut ctx, &mut out, |_| ());
        assert!(matches!(s.finish(&mut ctx, 10, fetched, &mut out), Err(crate::StoreError::Corrupt { .. })));
    }
}
