//! The operations the model tests (`model.rs`, `backing.rs`) run against the store, their
//! strategies, and the byte-array model with its apply step: one `Op` enum and one loop body
//! for both.

use super::{kind_strategy as kind, page, Kind, PAGE};
use compcache_store::{Context, Store, WritebackBudget};
use proptest::prelude::*;

#[derive(Debug, Clone)]
pub enum Op {
    Write { index: u64, kind: Kind, version: u64 },
    Partial { offset: u64, len: usize, byte: u8 },
    Discard { offset: u64, len: u64 },
    Zeroes { offset: u64, len: u64 },
    Read { offset: u64, len: usize },
    Compact,
    // With a backing device:
    Age { secs: u64 },
    Writeback { idle_secs: u64 },
    Gc,
    // With recompression:
    Recompress,
}

fn write(pages: u64) -> impl Strategy<Value = Op> {
    (0..pages, kind(), 0..1000u64).prop_map(|(index, kind, version)| Op::Write { index, kind, version })
}
fn partial(size: u64) -> impl Strategy<Value = Op> {
    (0..size - 1, 1..3 * PAGE, any::<u8>()).prop_map(move |(offset, len, byte)| Op::Partial {
        offset,
        len: len.min((size - offset) as usize),
        byte,
    })
}
fn discard(size: u64, max_pages: u64) -> impl Strategy<Value = Op> {
    (0..size, 1..max_pages * PAGE as u64).prop_map(move |(offset, len)| Op::Discard { offset, len: len.min(size - offset) })
}
fn zeroes(size: u64) -> impl Strategy<Value = Op> {
    (0..size, 1..3 * PAGE as u64).prop_map(move |(offset, len)| Op::Zeroes { offset, len: len.min(size - offset) })
}
fn read(size: u64) -> impl Strategy<Value = Op> {
    (0..size - 1, 1..3 * PAGE).prop_map(move |(offset, len)| Op::Read { offset, len: len.min((size - offset) as usize) })
}

/// The mix of a store without a backing device, over `pages` pages.
pub fn ram_op(pages: u64) -> impl Strategy<Value = Op> {
    let size = pages * PAGE as u64;
    prop_oneof![
        6 => write(pages),
        2 => partial(size),
        2 => discard(size, 6),
        1 => zeroes(size),
        4 => read(size),
        1 => Just(Op::Compact),
    ]
}

/// The mix of a store with a backing device: writeback, GC and the passing of time too.
pub fn backing_op(pages: u64) -> impl Strategy<Value = Op> {
    let size = pages * PAGE as u64;
    prop_oneof![
        8 => write(pages),
        2 => partial(size),
        2 => discard(size, 8),
        1 => zeroes(size),
        5 => read(size),
        1 => (1..30u64).prop_map(|secs| Op::Age { secs }),
        2 => (0..10u64).prop_map(|idle_secs| Op::Writeback { idle_secs }),
        1 => Just(Op::Gc),
        1 => Just(Op::Compact),
    ]
}

/// The mix of a store with recompression (and a backing device, if `backing`): pages age, get
/// recompressed (and trained on), written back, read, rewritten.
pub fn recompress_op(pages: u64, backing: bool) -> impl Strategy<Value = Op> {
    let size = pages * PAGE as u64;
    let wb = if backing { 2 } else { 0 };
    prop_oneof![
        8 => write(pages),
        2 => partial(size),
        2 => discard(size, 8),
        1 => zeroes(size),
        5 => read(size),
        2 => (1..30u64).prop_map(|secs| Op::Age { secs }),
        3 => Just(Op::Recompress),
        wb => (0..10u64).prop_map(|idle_secs| Op::Writeback { idle_secs }),
        wb => Just(Op::Gc),
        1 => Just(Op::Compact),
    ]
}

/// The model: bytes, plus whether each page is stored at all (discarded pages are not), and
/// the counts the statistics must match.
pub struct Model {
    pub bytes: Vec<u8>,
    pub stored: Vec<bool>,
    pub writes: u64,
    pub notify_free: u64,
}

impl Model {
    pub fn new(pages: u64) -> Model {
        Model { bytes: vec![0; pages as usize * PAGE], stored: vec![false; pages as usize], writes: 0, notify_free: 0 }
    }

    /// Page `i` of the model.
    pub fn page(&self, i: u64) -> &[u8] {
        &self.bytes[i as usize * PAGE..][..PAGE]
    }

    /// Runs `op` on the store and the model; a read must return what the model holds, and
    /// writeback and GC must report no error.
    pub fn apply(&mut self, store: &Store, ctx: &mut Context, op: Op) -> Result<(), TestCaseError> {
        let pages_of = |offset: u64, len: u64| (offset / PAGE as u64)..(offset + len).div_ceil(PAGE as u64);
        match op {
            Op::Write { index, kind, version } => {
                let p = page(kind, index, version);
                store.write_page(ctx, index, &p).unwrap();
                self.bytes[index as usize * PAGE..][..PAGE].copy_from_slice(&p);
                self.stored[index as usize] = true;
                self.writes += 1;
            }
            Op::Partial { offset, len, byte } => {
                let data = vec![byte; len];
                store.write(ctx, offset, &data).unwrap();
                self.bytes[offset as usize..][..len].copy_from_slice(&data);
                for i in pages_of(offset, len as u64) {
                    self.stored[i as usize] = true;
                    self.writes += 1;
                }
            }
            Op::Discard { offset, len } => {
                store.discard(offset, len).unwrap();
                for i in offset.div_ceil(PAGE as u64)..(offset + len) / PAGE as u64 {
                    self.bytes[i as usize * PAGE..][..PAGE].fill(0);
                    if std::mem::take(&mut self.stored[i as usize]) {
                        self.notify_free += 1;
                    }
                }
            }
            Op::Zeroes { offset, len } => {
                store.write_zeroes(ctx, offset, len).unwrap();
                self.bytes[offset as usize..][..len as usize].fill(0);
                for i in pages_of(offset, len) {
                    let whole = i * PAGE as u64 >= offset && (i + 1) * PAGE as u64 <= offset + len;
                    if whole {
                        if std::mem::take(&mut self.stored[i as usize]) {
                            self.notify_free += 1;
                        }
                    } else {
                        self.stored[i as usize] = true;
                        self.writes += 1;
                    }
                }
            }
            Op::Read { offset, len } => {
                let mut buf = vec![0xEE; len];
                store.read(ctx, offset, &mut buf).unwrap();
                prop_assert!(buf == self.bytes[offset as usize..][..len], "read at {offset}+{len} differs");
            }
            Op::Compact => {
                store.compact();
            }
            Op::Age { secs } => store.advance_clock(secs),
            Op::Writeback { idle_secs } => {
                let r = store.writeback_idle(idle_secs, WritebackBudget::UNLIMITED);
                prop_assert!(r.error.is_none(), "{:?}", r.error);
                let r = store.writeback(WritebackBudget::UNLIMITED);
                prop_assert!(r.error.is_none(), "{:?}", r.error);
            }
            Op::Gc => {
                let r = store.gc(u64::MAX);
                prop_assert!(r.error.is_none() && r.corrupt == 0, "{:?}", r);
            }
            Op::Recompress => {
                store.recompress(std::time::Duration::from_secs(1));
            }
        }
        Ok(())
    }
}
