//! The batch writer shared by writeback (`policy.rs`) and GC (`gc.rs`), as zram's writeback
//! and recompression share one post-processing block: place and write the maintenance
//! head's batch, then switch every slot that still holds what was copied to its new record
//! (through the [`Mover`]), and count the pages by what the batch was for. Neither user
//! depends on the other; both depend on this file.

use super::log::BatchError;
use super::{Backing, Maint};
use crate::error::StoreError;
use crate::ram::mover::{Mover, Unchanged};
use crate::slot::{Entry, Mark};
use crate::stats::Counters;

/// What a batch is for: its pages are counted differently, and installed under a different
/// proof that the slot did not change (slot.rs rule 8).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// RAM pages copied out with the MOVING mark.
    Writeback,
    /// Records moved out of segments the collector keeps pinned; may use GC's reserved
    /// segments.
    Gc,
}

/// What writing one batch did.
#[derive(Default)]
pub(super) struct Flushed {
    pub installed: u64,
    pub bytes: u64,
    pub writes: u64,
    pub raced: u64,
    pub full: bool,
    pub error: Option<StoreError>,
}

impl Flushed {
    /// Whether the caller should stop gathering (the device is full or failed).
    pub fn stop(&self) -> bool {
        self.full || self.error.is_some()
    }
}

/// Places and writes `m.batch`, then switches every slot that still holds what was copied to
/// its new location; a copy whose slot changed meanwhile is freed again (dead space for GC).
/// Called under `b.maint` (which `m` is).
pub(super) fn flush_batch(mv: &Mover<'_>, b: &Backing, m: &mut Maint, purpose: Purpose) -> Flushed {
    let mut f = Flushed::default();
    let Maint { head, batch, .. } = m;
    let first = batch.items.first().map_or(u64::MAX, |it| it.index);
    let pages = batch.items.len();
    let written = if b.is_closed() {
        Err(BatchError(std::io::Error::other("the device is closed")))
    } else {
        batch.write(head, &b.space, &*b.dev, &b.run, purpose == Purpose::Gc)
    };
    match written {
        Ok((full, writes)) => {
            f.full = full;
            f.writes = writes;
            let unchanged = match purpose {
                Purpose::Writeback => Unchanged::Marked(Mark::Writeback),
                Purpose::Gc => Unchanged::Pinned,
            };
            for it in &batch.items {
                // A raw page (the cold tier's, or one that did not compress) has no codec.
                let codec = if it.len as usize == crate::PAGE_SIZE { crate::compress::Codec::PRIMARY } else { it.old.codec() };
                if mv.install(it.index, it.old, Entry::Backing { loc: it.loc, len: it.len, codec }, unchanged) {
                    f.installed += 1;
                    f.bytes += it.len as u64;
                } else {
                    b.free(it.loc, it.len);
                    f.raced += 1;
                }
            }
        }
        Err(BatchError(e)) => {
            let what = if purpose == Purpose::Gc { "GC" } else { "writeback" };
            let reason = format!("{what} of {pages} pages failed: {e}; they stay where they were");
            f.error = Some(b.error(first, reason));
        }
    }
    batch.clear();
    let c = &b.ctr;
    match purpose {
        Purpose::Writeback => {
            Counters::add(&mv.counters().bd_writes, f.installed + f.raced);
            Counters::add(&c.writeback_pages, f.installed);
            Counters::add(&c.writeback_bytes, f.bytes);
        }
        Purpose::Gc => Counters::add(&c.gc_pages, f.installed),
    }
    f
}
