//! Sequences of store operations checked against a byte-array model: reads must return what
//! was written.
//!
//! The first input byte configures a fresh 32-page store: bit 0 a backing file (on tmpfs,
//! unlinked as soon as it is open), bit 1 zstd instead of lz4, bits 2-3 the memory limit (none,
//! 3, 6 or 12 pages), bit 4 incompressible pages straight to the backing file, bit 5 no
//! promotion of pages read back from it, bit 6 recompression (pages idle for 2 s, dictionaries
//! trained on 9 samples and always installed), bit 7 with bit 0 the cold tier instead of the
//! file (RAM compressed 64 KiB at a time, zstd level 1; pages idle 4 s go there by themselves
//! in the maintenance step; a write over the memory limit fails instead of going there).
//! Then each operation is an opcode byte and its operands: WRITE (any offset and length, data
//! of one of five kinds), READ, DISCARD, WRITE_ZEROES, compaction, the clock moving on,
//! writeback (idle pages or down to the watermark), GC, the maintenance step, FLUSH, a
//! recompression run (sometimes after asking for a new dictionary).
//!
//! Checked after every operation:
//! - a READ returns exactly the model's bytes, and a read never fails;
//! - a WRITE or WRITE_ZEROES fails only with "memory full" (NoSpace) or a full backing
//!   device; then each page it covers holds either its old or its new contents (never a mix,
//!   never anything else), pages written before the failing one hold the new contents and the
//!   ones after it the old (the model learns which by reading them back);
//! - pool memory stays within the memory limit; writeback and GC report no error and no
//!   corrupt record; no read ever failed (`failed_reads`).
//!
//! At the end every page reads back as the model says, and discarding the whole device gives
//! all memory back.

use crate::{fill, Bytes, PAGE};
use compcache_store::{Algorithm, BackingConfig, Config, Medium, RecompressConfig, RecompressTuning, Store, StoreError, WritebackBudget};
use std::cell::RefCell;
use std::time::Duration;

/// Device size in pages.
pub const PAGES: u64 = 32;
const SIZE: u64 = PAGES * PAGE as u64;

fn backing_path() -> std::path::PathBuf {
    let dir = std::path::Path::new("/dev/shm");
    let dir = if dir.is_dir() { dir.to_path_buf() } else { std::env::temp_dir() };
    dir.join(format!("compcache-fuzz-{}.img", std::process::id()))
}

fn config(c: u8) -> Config {
    let mut cfg = Config::with_disksize(SIZE);
    if c & 2 != 0 {
        cfg.algorithm = Algorithm::Zstd;
        cfg.level = Some(1);
    }
    cfg.mem_limit_bytes = [0, 3, 6, 12][((c >> 2) & 3) as usize] * PAGE as u64;
    if c & 0x81 == 0x81 {
        let mut b = BackingConfig::in_memory(512 << 10);
        b.segment_bytes = 64 << 10;
        b.medium = Medium::Memory { level: 1 };
        b.idle_secs = 4;
        b.high_pct = 80;
        b.low_pct = 50;
        b.promote = c & 0x20 == 0;
        cfg.backing = Some(b);
    } else if c & 1 != 0 {
        let mut b = BackingConfig::new(backing_path());
        b.size_bytes = 256 << 10;
        b.segment_bytes = 16 << 10;
        b.high_pct = 80;
        b.low_pct = 50;
        b.incompressible = c & 0x10 != 0;
        b.promote = c & 0x20 == 0;
        cfg.backing = Some(b);
    }
    if c & 0x40 != 0 {
        cfg.recompress = Some(RecompressConfig { idle_secs: 2, dict_samples: 9, min_dict_gain_permille: 0, ..RecompressConfig::default() });
    }
    cfg
}

/// Whether `e` is a failure the store may rightly return for a write: out of memory, or the
/// backing device full.
fn allowed_write_error(e: &StoreError, full: &mut bool) -> bool {
    *full |= matches!(e, StoreError::Backing { .. });
    matches!(e, StoreError::NoSpace { .. } | StoreError::Backing { .. })
}

/// An offset and a length inside the device (length at least 1, up to 3 pages).
fn range(input: &mut Bytes) -> (u64, u64) {
    let offset = u64::from(input.u16()) % SIZE;
    let len = 1 + u64::from(input.u16()) % (3 * PAGE as u64);
    (offset, len.min(SIZE - offset))
}

/// After a failed modification of `offset..offset + len` whose new contents are `new` (in
/// `model` the old ones still): reads back each page it touched and checks that it holds the
/// old or the new contents, new ones first; updates the model to what the store holds.
fn resolve_failed(store: &Store, ctx: &mut compcache_store::Context, model: &mut [u8], page: &mut [u8], offset: u64, new: &[u8]) {
    let (start, end) = (offset as usize, offset as usize + new.len());
    let mut seen_old = false;
    for i in start / PAGE..end.div_ceil(PAGE) {
        store.read_page(ctx, i as u64, page).expect("reading back after a failed write");
        let mut want_new = model[i * PAGE..(i + 1) * PAGE].to_vec();
        let (a, b) = (start.max(i * PAGE), end.min((i + 1) * PAGE));
        want_new[a - i * PAGE..b - i * PAGE].copy_from_slice(&new[a - start..b - start]);
        let is_old = page[..] == model[i * PAGE..(i + 1) * PAGE];
        let is_new = page[..] == want_new[..];
        assert!(is_old || is_new, "page {i} after a failed write is neither its old nor its new contents");
        if !is_new {
            seen_old = true;
        }
        assert!(!(seen_old && is_new && !is_old), "page {i} was written after an earlier page of the same write failed");
        model[i * PAGE..(i + 1) * PAGE].copy_from_slice(page);
    }
}

/// The harness's own buffers: the byte model, the operation buffer, a page for reading back
/// after a failed write, and the final read-back. Made once per thread and reused (fresh ones for
/// every input, zeroed and faulted in, were a tenth of each input's time); each input resets
/// them first, so no input sees another's data.
struct Buffers {
    model: Vec<u8>,
    buf: Vec<u8>,
    page: Vec<u8>,
    all: Vec<u8>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers {
        model: vec![0; SIZE as usize],
        buf: vec![0; 3 * PAGE],
        page: vec![0; PAGE],
        all: vec![0; SIZE as usize],
    });
}

pub fn run(data: &[u8]) {
    BUFFERS.with_borrow_mut(|b| run_with(data, b));
}

/// Runs a store with each optional part (a backing file, zstd, recompression, the cold tier)
/// on an empty sequence, once, before the fuzzer forks: what those set up once per process
/// (the decoders' warm-up frames, a thread's cold-tier decompression state) is then set up in
/// the fork server, not by the first input of every child (`crate::init`, instability).
pub fn warm() {
    for c in [0x43, 0xc1] {
        run(&[c]);
    }
}

fn run_with(data: &[u8], b: &mut Buffers) {
    let Buffers { model, buf, page, all } = b;
    model.fill(0);
    buf.fill(0);
    let mut input = Bytes::new(data);
    let c = input.u8();
    let cfg = config(c);
    let limit = cfg.mem_limit_bytes;
    let backed = cfg.backing.as_ref().is_some_and(|b| !b.in_ram());
    let store = Store::new(cfg).expect("the fuzz store configuration is valid");
    if backed {
        // The store keeps its descriptor; nothing is left behind if the fuzzer kills us.
        let _ = std::fs::remove_file(backing_path());
    }
    let mut ctx = store.context();
    let mut n = 0u64;
    // A write failed because the backing device is full (which the device counts as an error).
    let mut full = false;
    let mut retrains = 0;
    while !input.is_empty() {
        n += 1;
        match input.u8() % 11 {
            0 => {
                // A whole page.
                let (index, kind) = (u64::from(input.u8()) % PAGES, input.u8());
                let data = &mut buf[..PAGE];
                fill(data, kind, n);
                match store.write_page(&mut ctx, index, data) {
                    Ok(()) => model[index as usize * PAGE..][..PAGE].copy_from_slice(data),
                    Err(e) => {
                        assert!(allowed_write_error(&e, &mut full), "write_page: {e}");
                        resolve_failed(&store, &mut ctx, model, page, index * PAGE as u64, data);
                    }
                }
            }
            1 => {
                // Any offset and length.
                let (offset, len) = range(&mut input);
                let kind = input.u8();
                let data = &mut buf[..len as usize];
                fill(data, kind, n);
                match store.write(&mut ctx, offset, data) {
                    Ok(()) => model[offset as usize..][..len as usize].copy_from_slice(data),
                    Err(e) => {
                        assert!(allowed_write_error(&e, &mut full), "write at {offset} length {len}: {e}");
                        resolve_failed(&store, &mut ctx, model, page, offset, data);
                    }
                }
            }
            2 | 3 => {
                let (offset, len) = range(&mut input);
                let out = &mut buf[..len as usize];
                out.fill(0xEE);
                store.read(&mut ctx, offset, out).unwrap_or_else(|e| panic!("read at {offset} length {len}: {e}"));
                assert!(out[..] == model[offset as usize..][..len as usize], "read at {offset} length {len} differs from what was written");
            }
            4 => {
                // Frees the whole pages inside the range; partial pages are left as they are.
                let offset = u64::from(input.u16()) % SIZE;
                let len = (1 + u64::from(input.u16()) % (8 * PAGE as u64)).min(SIZE - offset);
                store.discard(offset, len).expect("discard");
                let (first, end) = (offset.div_ceil(PAGE as u64), (offset + len) / PAGE as u64);
                for i in first..end {
                    model[i as usize * PAGE..][..PAGE].fill(0);
                }
            }
            5 => {
                let (offset, len) = range(&mut input);
                match store.write_zeroes(&mut ctx, offset, len) {
                    Ok(()) => model[offset as usize..][..len as usize].fill(0),
                    Err(e) => {
                        assert!(allowed_write_error(&e, &mut full), "write_zeroes at {offset} length {len}: {e}");
                        let zeroes = vec![0u8; len as usize];
                        resolve_failed(&store, &mut ctx, model, page, offset, &zeroes);
                    }
                }
            }
            6 => {
                store.compact();
            }
            7 => store.advance_clock(u64::from(input.u8() % 64)),
            8 => {
                let idle = u64::from(input.u8() % 16);
                let budget = WritebackBudget { max_bytes: u64::from(input.u16()) * 16 };
                for r in [store.writeback_idle(idle, budget), store.writeback(WritebackBudget::UNLIMITED)] {
                    assert!(r.error.is_none() || r.device_full, "writeback: {:?}", r.error);
                    full |= r.device_full;
                }
            }
            9 => {
                let r = store.gc(u64::from(input.u16()) * 64);
                assert!(r.error.is_none() && r.corrupt == 0, "gc: {r:?}");
            }
            _ => {
                let how = input.u8();
                if how % 3 == 2 {
                    if how & 0x80 != 0 && store.recompresses() && retrains < crate::MAX_RETRAINS {
                        retrains += 1;
                        store.tune_recompression(&RecompressTuning { retrain: Some(true), ..Default::default() }).expect("retrain");
                    }
                    // A whole second of CPU: every idle page of the 32 is taken in one run,
                    // whatever the machine's speed, so that runs repeat.
                    store.recompress(Duration::from_secs(1));
                } else if how.is_multiple_of(3) {
                    store.flush().expect("flush");
                } else {
                    let r = store.maintain(Duration::from_millis(u64::from(input.u8()) * 10));
                    assert!(r.writeback.error.is_none() || r.writeback.device_full, "maintain: {r:?}");
                    full |= r.writeback.device_full;
                    assert!(r.gc.error.is_none() && r.gc.corrupt == 0, "maintain: {r:?}");
                }
            }
        }
        let s = store.stats();
        if limit != 0 {
            // The limit bounds the pool; a cold tier's memory is bounded by its size.
            let pool = s.mem_used_total - s.bd_mem_bytes;
            assert!(pool <= limit, "pool memory {pool} above the limit {limit}");
        }
        assert_eq!(s.failed_reads, 0, "a read failed");
        assert!(s.bd_errors == 0 || full, "a backing-device error");
    }
    all.fill(0xEE);
    store.read(&mut ctx, 0, all).expect("reading the whole device");
    for i in 0..PAGES as usize {
        assert!(all[i * PAGE..][..PAGE] == model[i * PAGE..][..PAGE], "page {i} differs from what was written");
    }
    store.discard(0, SIZE).expect("discarding the whole device");
    let _ = store.gc(u64::MAX);
    let s = store.stats();
    // (A cold tier keeps its table, buffers and dictionary samples: `bd_mem_bytes`.)
    let pool = s.mem_used_total - s.bd_mem_bytes;
    assert_eq!((pool, s.compr_data_size, s.orig_data_size), (0, 0, 0), "memory left after discarding everything");
    assert_eq!((s.bd_count, s.bd_bytes), (0, 0), "backing records left after discarding everything");
}
