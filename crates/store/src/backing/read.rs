//! The backing tier's read path: pages whose slots point to records on the device.
//!
//! The RAM path (`store.rs`) finds such a page under its slot lock and hands back a
//! [`Pending`]: the record's place, the page's previous access time and a pin on the record's
//! segment (slot.rs rule 7). Everything after that happens here, with no slot lock held: one
//! record is read and verified ([`read_one`]), or, for a multi-page read, the records are read
//! run by run, one `pread` per run of records adjacent on the device ([`read_pending`];
//! writeback and overflow write neighbouring pages next to each other, and swap reads ahead),
//! then verified and decompressed one by one. A page read twice within a few seconds is then
//! promoted back into RAM (`policy::maybe_promote`), with the same pin: the record cannot be
//! replaced by another in the same place before promotion installs (slot.rs rule 8).

use std::ops::Range;
use std::sync::Arc;

use super::log::HEADER;
use super::policy::maybe_promote;
use super::space::Pin;
use super::Backing;
use crate::compress::dict::Dict;
use crate::compress::strong::StrongDecoder;
use crate::compress::{BackendContext, Codec};
use crate::context::Context;
use crate::error::StoreError;
use crate::ram::mover::Mover;
use crate::slot::Entry;
use crate::stats::Counters;
use crate::PAGE_SIZE;

/// Most bytes one `pread` of adjacent backing records may cover.
pub(crate) const MAX_RUN_BYTES: u64 = 1 << 20;
/// Pages a multi-page read pins and reads at a time (their records fit in a run of
/// `MAX_RUN_BYTES`, nearly): the list of them lives on the stack, so the read allocates nothing.
pub(crate) const READ_CHUNK_PAGES: usize = MAX_RUN_BYTES as usize / PAGE_SIZE;

/// A page whose slot pointed to a record when a read held its lock: what reading the record
/// and promoting the page need.
pub(crate) struct Pending<'a> {
    pub index: u64,
    pub loc: u64,
    /// Payload bytes of the record (compressed length, or `PAGE_SIZE` for a raw page).
    pub len: u16,
    /// How the payload is encoded, and the dictionary it needs (taken under the slot lock,
    /// `compress/dict.rs`).
    pub codec: Codec,
    pub dict: Option<Arc<Dict>>,
    /// The slot's access time before this read touched it (promotion compares against it).
    pub last_access: u16,
    /// Keeps the record's segment from reuse until the read and any promotion are done.
    #[expect(dead_code, reason = "held, never read: dropping it unpins the segment")]
    pub pin: Pin<'a>,
}

impl Pending<'_> {
    /// The slot entry the page had (what promotion installs over, if it is still there).
    pub fn entry(&self) -> Entry {
        Entry::Backing { loc: self.loc, len: self.len, codec: self.codec }
    }

    fn record_bytes(&self) -> u64 {
        (HEADER + self.len as usize) as u64
    }
}

/// Reads, verifies and decodes the record `p` into `out` (one page), through `ctx`'s read
/// buffer; the record is left in `ctx.cbuf[..HEADER + len]`. No promotion: the caller may hold
/// the slot lock (a partial write's read-modify-write).
pub(crate) fn read_one(mv: &Mover<'_>, b: &Backing, ctx: &mut Context, p: &Pending<'_>, out: &mut [u8]) -> Result<(), StoreError> {
    let len = p.len as usize;
    b.read_record(p.index, p.loc, &mut ctx.cbuf[..HEADER + len], &mut ctx.read)?;
    Counters::inc(&mv.counters().bd_reads);
    decode(&mut *ctx.comp, ctx.strong.as_mut(), p, &ctx.cbuf[HEADER..HEADER + len], out)
}

/// [`read_one`], then promotion; the pin is released when both are done. For a whole-page
/// read, which holds no slot lock.
pub(crate) fn read_one_and_promote(
    mv: &Mover<'_>,
    b: &Backing,
    ctx: &mut Context,
    p: Pending<'_>,
    out: &mut [u8],
) -> Result<(), StoreError> {
    read_one(mv, b, ctx, &p, out)?;
    maybe_promote(mv, b, &p, &ctx.cbuf[HEADER..HEADER + p.len as usize], &mut *ctx.comp, &mut ctx.rec);
    Ok(())
}

/// A record's payload into a page: a raw page is copied, anything shorter decoded by its codec.
fn decode(
    comp: &mut dyn BackendContext,
    strong: Option<&mut StrongDecoder>,
    p: &Pending<'_>,
    payload: &[u8],
    out: &mut [u8],
) -> Result<(), StoreError> {
    if payload.len() == PAGE_SIZE {
        out.copy_from_slice(payload);
        Ok(())
    } else {
        crate::compress::decode(comp, strong, p.codec, p.dict.as_deref(), payload, out)
            .map_err(|reason| StoreError::Corrupt { index: p.index, reason })
    }
}

/// The pages of one multi-page read whose records are on the device, in page order; on the
/// stack (about 10 KiB), so the read allocates nothing.
pub(crate) struct PendingList<'a> {
    items: [Option<Pending<'a>>; READ_CHUNK_PAGES],
    len: usize,
}

impl<'a> PendingList<'a> {
    pub fn new() -> Self {
        PendingList { items: [const { None }; READ_CHUNK_PAGES], len: 0 }
    }

    /// Adds a page; at most `READ_CHUNK_PAGES` (one chunk of the read).
    pub fn push(&mut self, p: Pending<'a>) {
        self.items[self.len] = Some(p);
        self.len += 1;
    }

    fn get(&self, i: usize) -> &Pending<'a> {
        self.items[i].as_ref().expect("the first `len` are set")
    }
}

/// Runs of records adjacent on the device, in the order given: each run is a range of
/// indices into the records whose bytes follow each other on the device without a gap,
/// together at most `max_bytes` (a record longer than that is a run of its own).
pub(crate) struct Runs<F> {
    /// Place and length in bytes of record `i`.
    record: F,
    count: usize,
    next: usize,
    max_bytes: u64,
}

/// One run: which records, and the bytes to read for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    pub records: Range<usize>,
    pub loc: u64,
    pub bytes: u64,
}

impl<F: Fn(usize) -> (u64, u64)> Runs<F> {
    pub fn new(count: usize, max_bytes: u64, record: F) -> Self {
        Runs { record, count, next: 0, max_bytes }
    }
}

impl<F: Fn(usize) -> (u64, u64)> Iterator for Runs<F> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        if self.next >= self.count {
            return None;
        }
        let first = self.next;
        let (loc, bytes) = (self.record)(first);
        let mut end = loc + bytes;
        self.next += 1;
        while self.next < self.count {
            let (l, n) = (self.record)(self.next);
            if l != end || end - loc + n > self.max_bytes {
                break;
            }
            end += n;
            self.next += 1;
        }
        Some(Run { records: first..self.next, loc, bytes: end - loc })
    }
}

/// Reads the pages in `pending` (pinned by a multi-page read starting at slot `first`) into
/// their places in `out`, one `pread` per run, and promotes those read again soon. Every page
/// it cannot serve is reported to `fail` (with its own error, or its run's read error), and the
/// others are still served.
pub(crate) fn read_pending(
    mv: &Mover<'_>,
    b: &Backing,
    ctx: &mut Context,
    pending: PendingList<'_>,
    first: u64,
    out: &mut [u8],
    fail: &mut dyn FnMut(StoreError),
) {
    let runs = Runs::new(pending.len, MAX_RUN_BYTES, |i| {
        let p = pending.get(i);
        (p.loc, p.record_bytes())
    });
    for run in runs {
        let index = pending.get(run.records.start).index;
        let bytes = match b.read_raw(index, run.loc, run.bytes as usize, &mut ctx.read) {
            Ok(bytes) => bytes,
            Err(e) => {
                run.records.for_each(|_| fail(e.clone()));
                continue;
            }
        };
        for p in run.records.map(|i| pending.get(i)) {
            let rec = &mut bytes[(p.loc - run.loc) as usize..][..HEADER + p.len as usize];
            if let Err(e) = b.check(p.index, p.loc, rec) {
                fail(e);
                continue;
            }
            Counters::inc(&mv.counters().bd_reads);
            let payload = &rec[HEADER..];
            let page = &mut out[(p.index - first) as usize * PAGE_SIZE..][..PAGE_SIZE];
            if let Err(e) = decode(&mut *ctx.comp, ctx.strong.as_mut(), p, payload, page) {
                fail(e);
                continue;
            }
            maybe_promote(mv, b, p, payload, &mut *ctx.comp, &mut ctx.cbuf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(records: &[(u64, u64)], max_bytes: u64) -> Vec<(Range<usize>, u64, u64)> {
        Runs::new(records.len(), max_bytes, |i| records[i]).map(|r| (r.records, r.loc, r.bytes)).collect()
    }

    #[test]
    fn adjacent_records_merge_into_one_run() {
        assert_eq!(runs(&[(0, 100), (100, 50), (150, 10)], 1 << 20), vec![(0..3, 0, 160)]);
    }

    #[test]
    fn a_gap_or_a_step_back_starts_a_new_run() {
        let r = runs(&[(0, 100), (101, 50), (151, 10), (0, 100)], 1 << 20);
        assert_eq!(r, vec![(0..1, 0, 100), (1..3, 101, 60), (3..4, 0, 100)]);
    }

    #[test]
    fn a_run_stops_at_its_byte_limit_and_a_long_record_stands_alone() {
        let r = runs(&[(0, 60), (60, 40), (100, 1), (101, 500), (601, 10)], 100);
        assert_eq!(r, vec![(0..2, 0, 100), (2..3, 100, 1), (3..4, 101, 500), (4..5, 601, 10)]);
    }

    #[test]
    fn no_records_no_runs() {
        assert!(runs(&[], 100).is_empty());
    }
}
