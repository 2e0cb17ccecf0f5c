//! Sequences of operations on a store in cache mode (`compcache_store::cache`), in front of a
//! fault-injecting origin (`compcache_store::testing::FaultyOrigin`), checked against a
//! byte-array model of the origin.
//!
//! The first input byte configures a fresh 64-page store: bit 0 the origin is an image file
//! (on tmpfs, unlinked as soon as it is open; opened as the store opens one) instead of
//! memory, bit 1 zstd instead of lz4, bits 2-3 the memory budget (4, 8, 24 or 48 pages: the
//! first two evict all the time, the last two read ahead, whose window is at most a sixteenth
//! of the budget), bits 4-5 the largest readahead window (none, 2, 16 or 256 pages), bit 6
//! recompression (on by default in the CLI; here every page is idle at once, and dictionaries
//! are trained on 9 samples). The
//! origin starts with pages of every kind (zero, same-filled, text, noise, half noise). Then
//! each operation is an opcode byte and its operands: WRITE (whole pages, or any offset and
//! length: partial pages are read-modify-written), READ (any range, or a run of one-page reads
//! in order, which readahead follows), DISCARD, WRITE_ZEROES, FLUSH, the origin's faults
//! switched on and off (EIO on read, short reads, EIO on write after a torn first page, EIO on
//! sync, EIO on discard and zeroing), a check of every cached page against the origin,
//! compaction, the maintenance step or a recompression run (sometimes after asking for a new
//! dictionary), BLOCK_STATUS.
//!
//! Checked after every operation:
//! - a successful READ returns exactly the model's bytes; a READ fails only while a read
//!   fault is on, with EIO, returns no byte of the failed origin read (each page of the buffer
//!   is the model's page or untouched) and caches nothing;
//! - a WRITE, WRITE_ZEROES or DISCARD fails only while a fault it can meet is on, and always
//!   when the origin refuses it (write-through: every write reaches the origin), with EIO; it
//!   changes the origin only inside its own pages; the model then takes what the origin holds
//!   there, and every later read must agree (nothing stale or unacknowledged is served);
//! - a successful WRITE, WRITE_ZEROES or DISCARD is on the origin when it returns
//!   (write-through); after every successful FLUSH the whole origin equals the model; FLUSH
//!   fails exactly when syncs fail;
//! - every page the cache serves without the origin (reads with the origin's reads failing)
//!   equals the origin's page (the cache's invariant);
//! - BLOCK_STATUS's extents are consecutive, non-empty and cover the range, and a hole reads
//!   as zeroes;
//! - pool memory stays within the budget.
//!
//! At the end, with the faults off, every page reads back as the model says, a FLUSH leaves
//! the origin equal to the model, and discarding the whole device gives all memory back.

use crate::{fill, Bytes, PAGE};
use compcache_store::testing::{FaultyOrigin, OriginFaults};
use compcache_store::{
    Algorithm, Allocation, Config, Context, OriginConfig, OriginDevice, RecompressConfig, RecompressTuning, Store, StoreError,
};
use std::cell::RefCell;
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Device (and origin) size in pages.
pub const PAGES: u64 = 64;
const SIZE: u64 = PAGES * PAGE as u64;
const P: u64 = PAGE as u64;
/// The longest request of the harness, in pages.
const MAX_PAGES: usize = 8;

/// The origin, shared between the store (which owns a box of it) and the harness, which reads
/// what the origin holds directly (not through the cache) to check it against the model.
struct Shared(Arc<FaultyOrigin>);

impl OriginDevice for Shared {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_at(data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.write_zeroes(offset, len)
    }
    fn extent_at(&self, offset: u64) -> Option<(bool, u64)> {
        self.0.extent_at(offset)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

fn image_path() -> std::path::PathBuf {
    let dir = std::path::Path::new("/dev/shm");
    let dir = if dir.is_dir() { dir.to_path_buf() } else { std::env::temp_dir() };
    dir.join(format!("compcache-fuzz-origin-{}.img", std::process::id()))
}

/// The origin's faults as the harness switched them (what `OriginFaults` holds).
#[derive(Clone, Copy, Default)]
struct Faults {
    reads: bool,
    short: bool,
    writes: bool,
    syncs: bool,
    discards: bool,
}

impl Faults {
    fn from_bits(b: u8) -> Faults {
        Faults { reads: b & 1 != 0, short: b & 2 != 0, writes: b & 4 != 0, syncs: b & 8 != 0, discards: b & 16 != 0 }
    }

    fn set(self, f: &OriginFaults) {
        f.fail_reads.store(self.reads, Relaxed);
        f.short_reads.store(self.short, Relaxed);
        f.fail_writes.store(self.writes, Relaxed);
        f.fail_syncs.store(self.syncs, Relaxed);
        f.fail_discards.store(self.discards, Relaxed);
    }

    /// Whether origin reads fail (EIO or short).
    fn read(self) -> bool {
        self.reads || self.short
    }
}

struct Harness<'a> {
    store: Store,
    ctx: Context,
    origin: Arc<FaultyOrigin>,
    switches: Arc<OriginFaults>,
    faults: Faults,
    b: &'a mut Buffers,
}

/// The harness's own buffers, made once per thread and reset by each input (see store_ops).
struct Buffers {
    /// What the origin must hold.
    model: Vec<u8>,
    /// What the origin holds, read directly.
    origin: Vec<u8>,
    /// The origin's first contents: pages of every kind.
    init: Vec<u8>,
    buf: Vec<u8>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers {
        model: vec![0; SIZE as usize],
        origin: vec![0; SIZE as usize],
        init: {
            let mut v = vec![0; SIZE as usize];
            for (i, p) in v.chunks_mut(PAGE).enumerate() {
                fill(p, i as u8, 1000 + i as u64);
            }
            v
        },
        buf: vec![0; MAX_PAGES * PAGE],
    });
}

/// An offset inside the device and a length of 1 up to `max` bytes, cut at the device's end.
fn range(input: &mut Bytes, max: u64) -> (u64, u64) {
    let offset = u64::from(input.u32()) % SIZE;
    let len = 1 + u64::from(input.u16()) % max;
    (offset, len.min(SIZE - offset))
}

/// The pages `offset..offset + len` touches.
fn pages_of(offset: u64, len: u64) -> (usize, usize) {
    ((offset / P) as usize, (offset + len).div_ceil(P) as usize)
}

impl Harness<'_> {
    /// Reads the whole origin into `b.origin`, directly (faults off for it, then as before).
    fn read_origin(&mut self) {
        Faults::default().set(&self.switches);
        self.origin.read_at(&mut self.b.origin, 0).expect("reading the origin directly");
        self.faults.set(&self.switches);
    }

    /// After a successful modification of pages `a..e` (the model updated): the origin holds it
    /// now (write-through).
    fn check_written(&mut self, a: usize, e: usize, what: &str) {
        self.read_origin();
        let (x, y) = (a * PAGE, e * PAGE);
        assert!(self.b.origin[x..y] == self.b.model[x..y], "{what}: pages {a}..{e} are not on the origin when it returns");
    }

    /// After a failed modification of pages `a..e`: checks the error, that the origin changed
    /// nowhere else, and makes the model what the origin holds in `a..e`.
    fn failed(&mut self, e: &StoreError, a: usize, end: usize, what: &str) {
        assert_eq!(e.errno(), libc::EIO, "{what} failed with a non-I/O error: {e}");
        self.read_origin();
        let (x, y) = (a * PAGE, end * PAGE);
        assert!(
            self.b.origin[..x] == self.b.model[..x] && self.b.origin[y..] == self.b.model[y..],
            "{what}: a failed request changed the origin outside its pages {a}..{end}"
        );
        self.b.model[x..y].copy_from_slice(&self.b.origin[x..y]);
    }

    /// READ of `offset..offset + len`.
    fn read(&mut self, offset: u64, len: u64) {
        const UNTOUCHED: u8 = 0xA5;
        let inserts = self.store.stats().cache_inserts;
        let out = &mut self.b.buf[..len as usize];
        out.fill(UNTOUCHED);
        let want = &self.b.model[offset as usize..][..len as usize];
        match self.store.read(&mut self.ctx, offset, out) {
            Ok(()) => assert!(out[..] == want[..], "read at {offset} length {len} differs from the origin's model"),
            Err(e) => {
                assert!(self.faults.read(), "read at {offset} length {len} failed without a read fault: {e}");
                assert_eq!(e.errno(), libc::EIO, "a failed read is not EIO: {e}");
                // Each page's part of the buffer: the right data (a hit before the failed
                // miss) or untouched; never a byte of the failed origin read.
                let mut from = 0;
                while from < out.len() {
                    let to = ((offset + from as u64) / P * P + P - offset).min(len) as usize;
                    let (got, w) = (&out[from..to], &want[from..to]);
                    assert!(
                        got == w || crate::all_bytes(got, UNTOUCHED),
                        "a failed read at {offset} length {len} returned wrong bytes at {from}..{to}"
                    );
                    from = to;
                }
                assert_eq!(self.store.stats().cache_inserts, inserts, "a failed read cached pages");
            }
        }
    }

    /// WRITE of `data` (in `b.buf`, `len` bytes) at `offset`.
    fn write(&mut self, offset: u64, len: u64) {
        let (a, e) = pages_of(offset, len);
        let partial = !offset.is_multiple_of(P) || !(offset + len).is_multiple_of(P);
        let data = &self.b.buf[..len as usize];
        match self.store.write(&mut self.ctx, offset, data) {
            Ok(()) => {
                assert!(
                    !self.faults.writes,
                    "a write at {offset} length {len} succeeded while the origin fails writes: it did not reach the origin"
                );
                self.b.model[offset as usize..][..len as usize].copy_from_slice(data);
                self.check_written(a, e, "write");
            }
            Err(err) => {
                assert!(
                    self.faults.writes || (partial && self.faults.read()),
                    "write at {offset} length {len} failed without a fault it can meet: {err}"
                );
                self.failed(&err, a, e, "write");
            }
        }
    }

    fn write_zeroes(&mut self, offset: u64, len: u64) {
        let (a, e) = pages_of(offset, len);
        let (wf, we) = (offset.div_ceil(P), (offset + len) / P);
        let (whole, partial) = (wf < we, !offset.is_multiple_of(P) || !(offset + len).is_multiple_of(P));
        match self.store.write_zeroes(&mut self.ctx, offset, len) {
            Ok(()) => {
                assert!(
                    !((whole && self.faults.discards) || (partial && self.faults.writes)),
                    "write-zeroes at {offset} length {len} succeeded while the origin refuses it"
                );
                self.b.model[offset as usize..][..len as usize].fill(0);
                self.check_written(a, e, "write-zeroes");
            }
            Err(err) => {
                let can = (whole && self.faults.discards) || (partial && (self.faults.writes || self.faults.read()));
                assert!(can, "write-zeroes at {offset} length {len} failed without a fault it can meet: {err}");
                self.failed(&err, a, e, "write-zeroes");
            }
        }
    }

    fn discard(&mut self, offset: u64, len: u64) {
        let (wf, we) = (offset.div_ceil(P) as usize, ((offset + len) / P) as usize);
        match self.store.discard(offset, len) {
            Ok(()) => {
                assert!(wf >= we || !self.faults.discards, "discard at {offset} length {len} succeeded while the origin fails discards");
                if wf < we {
                    self.b.model[wf * PAGE..we * PAGE].fill(0);
                    self.check_written(wf, we, "discard");
                }
            }
            Err(err) => {
                assert!(wf < we && self.faults.discards, "discard at {offset} length {len} failed without a fault it can meet: {err}");
                self.failed(&err, wf, we, "discard");
            }
        }
    }

    fn flush(&mut self) {
        match self.store.flush() {
            Ok(()) => {
                assert!(!self.faults.syncs, "flush succeeded while the origin's syncs fail");
                self.read_origin();
                assert!(self.b.origin == self.b.model, "the origin differs from the model after a flush");
            }
            Err(e) => {
                assert!(self.faults.syncs, "flush failed without a sync fault: {e}");
                assert_eq!(e.errno(), libc::EIO, "a failed flush is not EIO: {e}");
            }
        }
    }

    /// Every page the cache serves on its own (the origin failing every read meanwhile)
    /// equals the origin's page: the cache's invariant, checked against the origin itself.
    fn check_cached(&mut self) {
        self.read_origin();
        Faults { reads: true, ..self.faults }.set(&self.switches);
        let page = &mut self.b.buf[..PAGE];
        for i in 0..PAGES as usize {
            match self.store.read_page(&mut self.ctx, i as u64, page) {
                Ok(()) => assert!(page[..] == self.b.origin[i * PAGE..][..PAGE], "cached page {i} differs from the origin's"),
                Err(e) => assert_eq!(e.errno(), libc::EIO, "reading page {i} with the origin's reads failing: {e}"),
            }
        }
        self.faults.set(&self.switches);
    }

    fn block_status(&mut self, offset: u64, len: u64) {
        let mut pos = offset;
        for x in self.store.block_status(offset, len).expect("block status of a range inside the device") {
            assert!(x.len_bytes > 0, "an empty extent at {pos}");
            let end = pos + x.len_bytes;
            assert!(end <= offset + len, "an extent at {pos} reaches past the range's end");
            if x.allocation == Allocation::Hole {
                assert!(crate::all_bytes(&self.b.model[pos as usize..end as usize], 0), "a hole at {pos}..{end} that is not zeroes");
            }
            pos = end;
        }
        assert_eq!(pos, offset + len, "the extents do not cover the range");
    }
}

fn config(c: u8, origin: &Shared) -> Config {
    let mut cfg = Config::with_disksize(SIZE);
    if c & 2 != 0 {
        cfg.algorithm = Algorithm::Zstd;
        cfg.level = Some(1);
    }
    cfg.mem_limit_bytes = [4, 8, 24, 48][((c >> 2) & 3) as usize] * P;
    // Only the readahead is taken from it: the origin is the one handed to `with_origin`.
    let mut o = OriginConfig::new(origin.describe());
    o.readahead_max_bytes = [0, 2, 16, 256][((c >> 4) & 3) as usize] * P;
    cfg.origin = Some(o);
    if c & 0x40 != 0 {
        cfg.recompress = Some(RecompressConfig { idle_secs: 0, dict_samples: 9, min_dict_gain_permille: 0, ..RecompressConfig::default() });
    }
    cfg
}

pub fn run(data: &[u8]) {
    BUFFERS.with_borrow_mut(|b| run_with(data, b));
}

/// Runs a store with recompression and zstd over an image file on an empty sequence, once,
/// before the fuzzer forks (see `store_ops::warm`).
pub fn warm() {
    run(&[0x43]);
}

fn run_with(data: &[u8], b: &mut Buffers) {
    let mut input = Bytes::new(data);
    let c = input.u8();
    let origin = if c & 1 != 0 {
        let path = image_path();
        std::fs::write(&path, &b.init).expect("writing the origin image on tmpfs");
        let o = FaultyOrigin::file(&path).expect("opening the origin image");
        // The origin keeps its descriptor; nothing is left behind if the fuzzer kills us.
        let _ = std::fs::remove_file(&path);
        o
    } else {
        FaultyOrigin::memory(SIZE as usize, &b.init)
    };
    b.model.copy_from_slice(&b.init);
    let switches = origin.faults();
    let origin = Arc::new(origin);
    let shared = Shared(origin.clone());
    let cfg = config(c, &shared);
    let budget = cfg.mem_limit_bytes;
    let store = Store::with_origin(cfg, Box::new(shared)).expect("the fuzz cache configuration is valid");
    let ctx = store.context();
    let mut h = Harness { store, ctx, origin, switches, faults: Faults::default(), b };
    let mut n = 0u64;
    let mut retrains = 0;
    while !input.is_empty() {
        n += 1;
        match input.u8() % 12 {
            0 => {
                // Whole pages.
                let index = u64::from(input.u8()) % PAGES;
                let pages = (1 + u64::from(input.u8()) % 4).min(PAGES - index);
                let len = pages * P;
                fill(&mut h.b.buf[..len as usize], input.u8(), n);
                h.write(index * P, len);
            }
            1 => {
                // Any offset and length.
                let (offset, len) = range(&mut input, 3 * P);
                fill(&mut h.b.buf[..len as usize], input.u8(), n);
                h.write(offset, len);
            }
            2 | 3 => {
                let (offset, len) = range(&mut input, MAX_PAGES as u64 * P);
                h.read(offset, len);
            }
            4 => {
                // One-page reads in order: a sequential reader, which readahead follows.
                let first = u64::from(input.u8()) % PAGES;
                let count = (1 + u64::from(input.u8()) % 16).min(PAGES - first);
                for i in first..first + count {
                    h.read(i * P, P);
                }
            }
            5 => {
                let (offset, len) = range(&mut input, MAX_PAGES as u64 * P);
                h.discard(offset, len);
            }
            6 => {
                let (offset, len) = range(&mut input, 6 * P);
                h.write_zeroes(offset, len);
            }
            7 => h.flush(),
            8 => {
                h.faults = Faults::from_bits(input.u8());
                h.faults.set(&h.switches);
            }
            9 => h.check_cached(),
            10 => {
                let x = input.u8();
                if x & 1 == 0 {
                    h.store.compact();
                } else if x & 2 != 0 && h.store.recompresses() {
                    if x & 0x80 != 0 && retrains < crate::MAX_RETRAINS {
                        retrains += 1;
                        h.store.tune_recompression(&RecompressTuning { retrain: Some(true), ..Default::default() }).expect("retrain");
                    }
                    // A whole second of CPU: every cached page is taken in one run, whatever
                    // the machine's speed, so that runs repeat.
                    h.store.recompress(Duration::from_secs(1));
                } else {
                    let r = h.store.maintain(Duration::from_millis(u64::from(x) * 10));
                    assert!(r.writeback.error.is_none() && r.gc.error.is_none(), "maintain in cache mode: {r:?}");
                }
            }
            _ => {
                let (offset, len) = range(&mut input, 16 * P);
                h.block_status(offset, len);
            }
        }
        let s = h.store.stats();
        assert!(s.mem_used_total <= budget, "pool memory {} above the budget {budget}", s.mem_used_total);
        assert!(s.orig_data_size <= SIZE, "the cache holds {} bytes of a {SIZE}-byte origin", s.orig_data_size);
    }
    h.faults = Faults::default();
    h.faults.set(&h.switches);
    for first in (0..PAGES).step_by(MAX_PAGES) {
        h.read(first * P, MAX_PAGES as u64 * P);
    }
    h.check_cached();
    h.flush();
    h.discard(0, SIZE);
    h.read_origin();
    assert!(crate::all_bytes(&h.b.origin, 0), "the origin is not zeroes after discarding the whole device");
    let s = h.store.stats();
    assert_eq!((s.mem_used_total, s.compr_data_size, s.orig_data_size), (0, 0, 0), "memory left after discarding everything");
}
