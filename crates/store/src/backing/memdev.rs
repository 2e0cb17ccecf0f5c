//! [`MemDevice`]: the cold tier's device. The backing tier's records (16-byte header + page,
//! written back to back by its log) are kept in RAM, compressed with zstd 64 KiB at a time, so
//! idle pages cost what multi-page compression units cost (cross-page redundancy: about 15%
//! less than per-page compression) without changing slots or the pool.
//!
//! # Blocks
//! The device is a table of aligned blocks of [`BLOCK_BYTES`], each empty (reads as zeroes) or
//! a blob: a tag byte, then either the raw 64 KiB (`RAW`: the block did not compress below 64
//! KiB) or one zstd frame without checksum, content size or dictionary id (`ZSTD`, or
//! `ZSTD_DICT` when compressed with the device's dictionary). The blobs live in a region of a
//! memfd (`blocks.rs`, which states the layout and the crash-consistency rules): the store's
//! state file, so that a successor takes them over ([`MemDevice::take_over`]), or a memfd of
//! the device's own ([`MemDevice::new`]). A write covering a whole block compresses it; a
//! partial write decompresses the old block (or zeroes), patches it and compresses it again. A
//! blob that does not decode to exactly 64 KiB (bad tag, length or frame) fails the read with
//! `InvalidData`, never wrong data; the records above it are checksummed or authenticated
//! besides (`seal.rs`).
//!
//! # Dictionary
//! The first [`DICT_SAMPLE_BYTES`] of data written are copied aside (the bytes `write_at` is
//! given, in order: a block patched record by record is not sampled once per record, nor its
//! zero tail); then a dictionary of at most 16 KiB is trained on them (as 4 KiB samples, on the
//! writer's thread, once: a failure leaves the device without one) and the samples are freed.
//! Later blocks are compressed with it. It is installed once (a `OnceLock`, and stored in the
//! region before any blob uses it) and never changes or goes while the device exists, so every
//! `ZSTD_DICT` blob decodes; older `ZSTD` blobs decode without it. A successor loads the
//! dictionary from the region; the samples are not kept, so a successor whose predecessor died
//! before training samples its own writes from zero and trains then. Each reading thread's
//! decompression context holds no dictionary (the call passes the device's), so one context
//! serves every device, before and after.
//!
//! # Locking
//! Writers (and `discard`) are serialized by the writer mutex, which also owns the compression
//! context, the samples and the region's writer token (`blocks.rs` rule 1): a writer takes it,
//! then for each block copies the current blob out, decodes and patches and encodes it, and
//! publishes the new blob (copy-on-write). Hence two writers of different ranges of one block
//! never lose each other's bytes, and a reader sees each block before or after a write, whole.
//! Readers take no lock at all: they copy a blob out and retry if its entry changed meanwhile
//! (`blocks.rs` rule 4). The cold tier's only writer is its maintenance thread (requests do not
//! overflow into it), but any number of writers is correct: they wait for each other.
//!
//! # Memory ([`MemDevice::mem_bytes`], a running count)
//! The region's header page, dictionary pages and block table (8 bytes a block, counted whole);
//! each blob's pages (its length rounded up to 4 KiB: what it makes resident in the memfd); the
//! dictionary (its bytes, and zstd's own `sizeof` of the decoder's copy); the writer's buffers;
//! its zstd context while a write runs (~0.7 MiB at level 3, ~2.3 MiB at 19: made by each
//! `write_at` and freed at its end, so an idle tier does not hold it); the samples as they fill
//! (reserved at full size, resident as written). Not counted: each reading thread's context
//! (one zstd decompression context and two 64 KiB buffers, ~230 KiB, made when the thread makes
//! a store context (`prepare_reader`) or on its first read, and shared by every `MemDevice`),
//! the warm-up frame it decodes (a few KiB, one per process), and zero pages a reader racing
//! with a write faulted back into a freed slot (`blocks.rs` rule 5).
//!
//! # Costs
//! A read decompresses each block it touches (a record: one, or two when it straddles a
//! boundary), whatever the level: 50-100 microseconds per 64 KiB block as measured here (plus
//! copying the blob out of the region, a few microseconds), and no allocation on a thread that
//! made a store context first (or after its first read); a thread's next read of the same,
//! unchanged block copies from what it decoded. A write compresses each block it touches, a
//! partial one whole: about 0.4 ms per block at level 3, 12 ms at level 19, so records should
//! come in batches (a block written record by record is compressed once per record). The
//! dictionary's training (once) holds the writer mutex for a few hundred milliseconds.

use std::cell::RefCell;
use std::fmt::Display;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use zstd::zstd_safe::{get_error_name, CCtx, CParameter, DCtx, DDict};

use super::blocks::{self, Blocks, Got, WriterToken, COPY_BYTES, DICT_MAX_BYTES};
use super::device::BackingDevice;
use crate::compress::dict::fastcover;
use crate::shm::{Region, StateMap};

/// Bytes per compressed block (declared with the configuration, which checks segment sizes
/// against it).
pub use crate::config::COLD_BLOCK_BYTES as BLOCK_BYTES;
/// Data written before the dictionary is trained (576 pages).
pub const DICT_SAMPLE_BYTES: u64 = 576 * 4096;
const BLOCK: usize = BLOCK_BYTES as usize;
const SAMPLE: usize = 4096;
const RAW: u8 = 0;
const ZSTD: u8 = 1;
const ZSTD_DICT: u8 = 2;

/// Gives each device a number of its own, for readers' caches (`Scratch::last`).
static DEVICES: AtomicU64 = AtomicU64::new(1);

/// A backing device in RAM, compressed in 64 KiB blocks (see the module docs).
pub struct MemDevice {
    size_bytes: u64,
    level: i32,
    id: u64,
    blocks: Blocks,
    /// The decoder's dictionary, set once by the writer before any blob uses it.
    ddict: OnceLock<DDict<'static>>,
    writer: Mutex<Writer>,
    mem: AtomicU64,
    stored: AtomicU64,
    compressed: AtomicU64,
}

/// What writers share, under the writer mutex.
struct Writer {
    /// Compresses blocks; holds the dictionary once there is one. Made by each `write_at` and
    /// dropped at its end: at level 19 it is about 2.3 MiB, which an idle tier (most of its
    /// life) should not hold; making one costs about a millisecond, against ~12 ms per block.
    cctx: Option<CCtx<'static>>,
    /// The trained dictionary's bytes, loaded into each new `cctx`.
    dict: Option<Vec<u8>>,
    /// A block being patched.
    block: Box<[u8]>,
    /// The blob being made: the tag and up to `BLOCK` bytes; also the old blob copied out
    /// (`COPY_BYTES`) before it is decoded.
    out: Box<[u8]>,
    /// The right to change the region (`blocks.rs` rule 1).
    token: WriterToken,
    samples: Vec<u8>,
    sample_bytes: usize,
    /// The dictionary was trained (or failed to be, or none is wanted): no more samples.
    trained: bool,
    /// What of `MemDevice::mem` is this state's own memory.
    counted: u64,
}

impl Writer {
    fn own_bytes(&self) -> u64 {
        let cctx = self.cctx.as_ref().map_or(0, |c| c.sizeof());
        let dict = self.dict.as_ref().map_or(0, |d| d.len());
        (cctx + dict + self.block.len() + self.out.len() + self.samples.len()) as u64
    }
}

/// A compression context at `level` for blocks (no checksum, content size or dictionary id),
/// with `dict` loaded.
fn make_cctx(level: i32, dict: Option<&[u8]>) -> io::Result<CCtx<'static>> {
    let mut cctx = CCtx::try_create().ok_or_else(|| io::Error::other("zstd could not make a compression context"))?;
    for p in [
        CParameter::CompressionLevel(level),
        CParameter::ChecksumFlag(false),
        CParameter::ContentSizeFlag(false),
        CParameter::DictIdFlag(false),
    ] {
        cctx.set_parameter(p).map_err(|c| io::Error::other(format!("zstd refused a parameter: {}", get_error_name(c))))?;
    }
    if let Some(d) = dict {
        cctx.load_dictionary(d).map_err(|c| io::Error::other(format!("zstd could not load the dictionary: {}", get_error_name(c))))?;
    }
    Ok(cctx)
}

/// A reading thread's decompression state (one per thread, for every device: it holds no
/// dictionary, which each call passes), and the block it decoded last.
struct Scratch {
    dctx: DCtx<'static>,
    /// A blob copied out of the region (`COPY_BYTES`).
    blob: Box<[u8]>,
    /// The decoded bytes of `last`, when there is one.
    block: Box<[u8]>,
    /// The blob `block` holds decoded, as (device, block, entry bits): a read of another record
    /// of the same blob copies from `block` instead of decoding again (records are written
    /// back in runs, so neighbouring pages, which swap readahead and a multi-page request ask
    /// for together, share blocks). An entry's generation changes at every publication of its
    /// block (`blocks.rs`), so the same key is this very blob, unchanged.
    last: Option<(u64, usize, u64)>,
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's scratch, made on first use (the read path's only allocation).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let new = || Scratch {
        dctx: DCtx::create(),
        blob: vec![0u8; COPY_BYTES].into_boxed_slice(),
        block: vec![0u8; BLOCK].into_boxed_slice(),
        last: None,
    };
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(s.get_or_insert_with(new)),
        Err(_) => f(&mut new()), // re-entered (nothing here does): a private one
    })
}

/// The blocks `offset..offset + len` touches: (block, offset in the block, range in the buffer).
fn spans(offset: u64, len: usize) -> impl Iterator<Item = (usize, usize, Range<usize>)> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        (pos < len).then(|| {
            let at = offset + pos as u64;
            let from = (at % BLOCK_BYTES) as usize;
            let n = (BLOCK - from).min(len - pos);
            pos += n;
            ((at / BLOCK_BYTES) as usize, from, pos - n..pos)
        })
    })
}

/// One block of words and noise (literals, matches and both kinds of entropy tables),
/// compressed at level 3: what `prepare_reader` decodes to write a thread's decompression
/// state. A few KiB, made once per process (the same bytes for every device).
fn warm_frame() -> io::Result<&'static [u8]> {
    static FRAME: OnceLock<Box<[u8]>> = OnceLock::new();
    if FRAME.get().is_none() {
        let _ = FRAME.set(make_warm_frame()?); // another thread's equal frame may win
    }
    Ok(FRAME.get().expect("set above"))
}

fn make_warm_frame() -> io::Result<Box<[u8]>> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut block = Vec::with_capacity(BLOCK + 64);
    while block.len() < BLOCK {
        let r = next();
        if r % 4 == 0 {
            block.extend_from_slice(&r.to_le_bytes());
        } else {
            block.extend_from_slice(format!("key{} = value {}; ", r % 97, (r >> 8) % 10_000).as_bytes());
        }
    }
    block.truncate(BLOCK);
    let mut out = vec![0u8; BLOCK];
    let n = make_cctx(3, None)?
        .compress2(&mut out[..], &block)
        .map_err(|c| io::Error::other(format!("zstd could not compress the warm-up block: {}", get_error_name(c))))?;
    out.truncate(n);
    Ok(out.into_boxed_slice())
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Checks a device's size and level; returns its number of blocks.
fn check_geometry(size_bytes: u64, level: i32) -> io::Result<usize> {
    if size_bytes == 0 || size_bytes % BLOCK_BYTES != 0 {
        return Err(invalid(format!(
            "a memory device of {size_bytes} bytes: its size must be a non-zero multiple of {BLOCK_BYTES} (64 KiB); round it up"
        )));
    }
    if !(1..=22).contains(&level) {
        return Err(invalid(format!("zstd level {level} for a memory device is outside 1..=22; choose one in that range")));
    }
    usize::try_from(size_bytes / BLOCK_BYTES).map_err(|_| invalid(format!("{size_bytes} bytes is too large")))
}

impl MemDevice {
    /// A device of `size_bytes` (a non-zero multiple of [`BLOCK_BYTES`]) compressing at zstd
    /// `level` (1..=22), every block empty, in a memfd of its own (no successor can take it
    /// over: the store's cold tier lives in its state file instead, [`MemDevice::create`]).
    pub fn new(size_bytes: u64, level: i32) -> io::Result<MemDevice> {
        MemDevice::with_sample_bytes(size_bytes, level, DICT_SAMPLE_BYTES as usize)
    }

    /// [`MemDevice::new`] training its dictionary after `sample_bytes` (0: never).
    pub(crate) fn with_sample_bytes(size_bytes: u64, level: i32, sample_bytes: usize) -> io::Result<MemDevice> {
        let blocks = check_geometry(size_bytes, level)?;
        let len = blocks::region_bytes(blocks);
        let region = Region { map: Arc::new(StateMap::create(len)?), offset: 0, len };
        MemDevice::create_with(&region, size_bytes, level, sample_bytes)
    }

    /// Bytes of the state file's region a device of `size_bytes` keeps its blocks in (address
    /// space: memory is taken by the blobs' pages as they are written).
    pub(crate) fn region_bytes(size_bytes: u64) -> usize {
        blocks::region_bytes((size_bytes / BLOCK_BYTES) as usize)
    }

    /// A new device in `region` of a new state file ([`MemDevice::region_bytes`]).
    pub(crate) fn create(region: &Region, size_bytes: u64, level: i32) -> io::Result<MemDevice> {
        MemDevice::create_with(region, size_bytes, level, DICT_SAMPLE_BYTES as usize)
    }

    fn create_with(region: &Region, size_bytes: u64, level: i32, sample_bytes: usize) -> io::Result<MemDevice> {
        let blocks = check_geometry(size_bytes, level)?;
        if region.len < blocks::region_bytes(blocks) {
            return Err(invalid(format!("a region of {} bytes for a memory device of {size_bytes} bytes", region.len)));
        }
        let (blocks, token) = Blocks::create(region, blocks);
        MemDevice::build(size_bytes, level, blocks, token, sample_bytes, None, (0, 0, 0))
    }

    /// A dead server's device in `region` (`blocks.rs`: the write it was making is undone, its
    /// dictionary loaded), and whether a write was undone; the error is one line. Blocks with
    /// a corrupt entry are kept as they are: their reads fail with `InvalidData`.
    pub(crate) fn take_over(region: &Region, size_bytes: u64, level: i32) -> Result<(MemDevice, bool), String> {
        let blocks = check_geometry(size_bytes, level).map_err(|e| e.to_string())?;
        let (blocks, token, o) = Blocks::open(region, blocks)?;
        if o.corrupt > 0 {
            compcache_log::warning(
                "compcache",
                &format!("cold tier: {} blocks have a corrupt entry: their pages read as errors", o.corrupt),
            );
        }
        let counts = (o.blocks, o.blob_bytes, o.resident_bytes);
        let dev = MemDevice::build(size_bytes, level, blocks, token, DICT_SAMPLE_BYTES as usize, o.dict, counts)
            .map_err(|e| format!("cannot set its cold tier up: {e}"))?;
        Ok((dev, o.cut_write))
    }

    /// `counts`: blocks stored, their blobs' bytes and their resident bytes.
    fn build(
        size_bytes: u64,
        level: i32,
        blocks: Blocks,
        token: WriterToken,
        sample_bytes: usize,
        dict: Option<Vec<u8>>,
        counts: (u64, u64, u64),
    ) -> io::Result<MemDevice> {
        // Made once now so that a level zstd refuses fails here, not at the first write.
        make_cctx(level, None)?;
        // Made now so that a failure is the device's, not a reader's (`prepare_reader`).
        warm_frame()?;
        let ddict = OnceLock::new();
        if let Some(d) = &dict {
            let dd = DDict::try_create(d).ok_or_else(|| io::Error::other("zstd could not load the kept dictionary"))?;
            let _ = ddict.set(dd);
        }
        let trained = sample_bytes == 0 || dict.is_some();
        let w = Writer {
            cctx: None,
            dict,
            block: vec![0u8; BLOCK].into_boxed_slice(),
            out: vec![0u8; COPY_BYTES].into_boxed_slice(),
            token,
            samples: Vec::new(),
            sample_bytes,
            trained,
            counted: 0,
        };
        let dict_len = w.dict.as_ref().map_or(0, |d| d.len());
        let fixed = blocks.fixed_bytes(dict_len) + ddict.get().map_or(0, |d: &DDict<'static>| d.sizeof() as u64);
        let dev = MemDevice {
            size_bytes,
            level,
            id: DEVICES.fetch_add(1, Relaxed),
            blocks,
            ddict,
            writer: Mutex::new(w),
            mem: AtomicU64::new(fixed + counts.2),
            stored: AtomicU64::new(counts.0),
            compressed: AtomicU64::new(counts.1),
        };
        dev.recount(&mut dev.writer.lock());
        Ok(dev)
    }

    /// Bytes of RAM this device uses now (see the module docs for what is counted).
    pub fn mem_bytes(&self) -> u64 {
        self.mem.load(Relaxed)
    }

    /// Blocks holding a blob.
    pub fn stored_blocks(&self) -> u64 {
        self.stored.load(Relaxed)
    }

    /// The sum of the blobs' lengths.
    pub fn compressed_bytes(&self) -> u64 {
        self.compressed.load(Relaxed)
    }

    /// Whether a dictionary was trained and is in use.
    pub fn has_dict(&self) -> bool {
        self.ddict.get().is_some()
    }

    fn check(&self, offset: u64, len: u64, what: &str) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(invalid(format!(
                "{what} of {len} bytes at byte {offset} passes the end of the memory device ({} bytes)",
                self.size_bytes
            ))),
        }
    }

    fn corrupt(b: usize, what: impl Display) -> io::Error {
        let at = b as u64 * BLOCK_BYTES;
        let msg = format!("memory device block at bytes {at}..{} is corrupt ({what}): its records are lost", at + BLOCK_BYTES);
        io::Error::new(io::ErrorKind::InvalidData, msg)
    }

    /// Decodes block `b`'s `blob` into `dst` (`BLOCK` bytes), exactly or not at all.
    fn decode(&self, b: usize, blob: &[u8], dst: &mut [u8], dctx: &mut DCtx<'static>) -> io::Result<()> {
        #[cfg(test)]
        tests::DECODES.set(tests::DECODES.get() + 1);
        let r = match blob.split_first() {
            Some((&RAW, raw)) if raw.len() == BLOCK => {
                dst.copy_from_slice(raw);
                return Ok(());
            }
            Some((&ZSTD, frame)) => dctx.decompress(dst, frame),
            Some((&ZSTD_DICT, frame)) => match self.ddict.get() {
                Some(d) => dctx.decompress_using_ddict(dst, frame, d),
                None => return Err(Self::corrupt(b, "it names a dictionary the device does not have")),
            },
            _ => return Err(Self::corrupt(b, format_args!("a blob of {} bytes with an unknown tag or length", blob.len()))),
        };
        match r {
            Ok(BLOCK) => Ok(()),
            Ok(n) => Err(Self::corrupt(b, format_args!("it decodes to {n} bytes instead of {BLOCK}"))),
            Err(c) => Err(Self::corrupt(b, format_args!("zstd: {}", get_error_name(c)))),
        }
    }

    /// Publishes `blob` as block `b`'s, or empties it (`None`), under the writer mutex, and
    /// counts the change.
    fn install(&self, w: &mut Writer, b: usize, blob: Option<&[u8]>) -> io::Result<()> {
        let before = self.blocks.resident_bytes(&w.token);
        let old = match blob {
            Some(x) => self.blocks.publish(&mut w.token, b, x),
            None => self.blocks.clear(&mut w.token, b),
        }
        .map_err(|e| Self::corrupt(b, format_args!("the state file refused a change: {e}")))?;
        // The blobs' pages (heads and shared tail pages) as they are now: under the writer
        // mutex, so no other change comes between the two looks.
        let after = self.blocks.resident_bytes(&w.token);
        self.mem.fetch_add(after, Relaxed);
        self.mem.fetch_sub(before, Relaxed);
        if let Some(n) = blob.map(|x| x.len()) {
            self.compressed.fetch_add(n as u64, Relaxed);
            self.stored.fetch_add(1, Relaxed);
        }
        if old > 0 {
            self.compressed.fetch_sub(old as u64, Relaxed);
            self.stored.fetch_sub(1, Relaxed);
        }
        Ok(())
    }

    /// Brings the count of the writer's own memory up to date.
    fn recount(&self, w: &mut Writer) {
        let now = w.own_bytes();
        self.mem.fetch_add(now, Relaxed);
        self.mem.fetch_sub(std::mem::replace(&mut w.counted, now), Relaxed);
    }

    fn write_blocks(&self, w: &mut Writer, buf: &[u8], offset: u64) -> io::Result<()> {
        for (b, from, r) in spans(offset, buf.len()) {
            let src = &buf[r];
            let whole = if src.len() == BLOCK {
                src
            } else {
                // The one writer: the blob cannot change while it is copied and decoded.
                let (_, got) = self.blocks.read(b, &mut w.out, |_, n| 0..n).map_err(|e| Self::corrupt(b, e))?;
                match got {
                    Got::Empty => w.block.fill(0),
                    Got::Blob(n) => with_scratch(|s| self.decode(b, &w.out[..n], &mut w.block, &mut s.dctx))?,
                }
                w.block[from..from + src.len()].copy_from_slice(src);
                &w.block
            };
            // A frame must fit in BLOCK - 1 bytes (a blob below the raw one), or the block is
            // stored raw; a compression error only costs the space.
            let tag = if self.has_dict() { ZSTD_DICT } else { ZSTD };
            let cctx = w.cctx.as_mut().expect("write_at made the context");
            let n = match cctx.compress2(&mut w.out[1..BLOCK], whole) {
                Ok(n) => {
                    w.out[0] = tag;
                    1 + n
                }
                Err(_) => {
                    w.out[0] = RAW;
                    w.out[1..1 + BLOCK].copy_from_slice(whole);
                    1 + BLOCK
                }
            };
            let out = std::mem::take(&mut w.out);
            let r = self.install(w, b, Some(&out[..n]));
            w.out = out;
            r?;
            if !w.trained {
                if w.samples.capacity() == 0 {
                    w.samples.reserve_exact(w.sample_bytes);
                }
                let take = (w.sample_bytes - w.samples.len()).min(src.len());
                w.samples.extend_from_slice(&src[..take]);
                if w.samples.len() == w.sample_bytes {
                    self.train(w);
                }
            }
        }
        Ok(())
    }

    /// Trains the dictionary on the samples and frees them; on success both the compression
    /// context and the decoder's dictionary hold it.
    fn train(&self, w: &mut Writer) {
        w.trained = true;
        let samples = std::mem::take(&mut w.samples);
        let sizes = vec![SAMPLE; samples.len() / SAMPLE];
        let r = fastcover(&samples[..sizes.len() * SAMPLE], &sizes, DICT_MAX_BYTES).and_then(|dict| {
            let ddict = DDict::try_create(&dict).ok_or("zstd could not load the trained dictionary")?;
            let cctx = w.cctx.as_mut().expect("training happens inside write_at");
            if let Err(c) = cctx.load_dictionary(&dict) {
                let _ = cctx.load_dictionary(&[]); // no half-loaded dictionary
                return Err(format!("zstd could not load the trained dictionary: {}", get_error_name(c)));
            }
            // Stored before any blob that needs it is published (`blocks.rs` rule 6).
            self.blocks.set_dict(&mut w.token, &dict);
            self.mem.fetch_add(dict.len().next_multiple_of(crate::PAGE_SIZE) as u64, Relaxed);
            w.dict = Some(dict);
            Ok(ddict)
        });
        match r {
            Ok(ddict) => {
                self.mem.fetch_add(ddict.sizeof() as u64, Relaxed);
                let _ = self.ddict.set(ddict); // only here, once: `trained` was false
            }
            Err(e) => compcache_log::warning("compcache", &format!("{}: no dictionary ({e})", self.describe())),
        }
    }
}

impl BackingDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64, "a read")?;
        for (b, from, r) in spans(offset, buf.len()) {
            let dst = &mut buf[r];
            let part = dst.len() < BLOCK;
            with_scratch(|s| {
                if part && s.last == Some((self.id, b, self.blocks.current(b).bits())) {
                    dst.copy_from_slice(&s.block[from..from + dst.len()]);
                    return Ok(());
                }
                // Of a raw block only the part asked for is copied out.
                let raw = |tag: u8, n: usize| part && tag == RAW && n == 1 + BLOCK;
                let want = |tag: u8, n: usize| if raw(tag, n) { 1 + from..1 + from + dst.len() } else { 0..n };
                let (e, got) = self.blocks.read(b, &mut s.blob, want).map_err(|e| Self::corrupt(b, e))?;
                let n = match got {
                    Got::Empty => {
                        dst.fill(0);
                        return Ok(());
                    }
                    Got::Blob(n) => n,
                };
                if raw(s.blob[0], n) {
                    dst.copy_from_slice(&s.blob[1 + from..][..dst.len()]);
                } else if !part {
                    self.decode(b, &s.blob[..n], dst, &mut s.dctx)?;
                } else {
                    // `block` is overwritten: it holds no blob until it decodes this one.
                    s.last = None;
                    self.decode(b, &s.blob[..n], &mut s.block, &mut s.dctx)?;
                    s.last = Some((self.id, b, e.bits()));
                    dst.copy_from_slice(&s.block[from..from + dst.len()]);
                }
                io::Result::Ok(())
            })?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64, "a write")?;
        let mut w = self.writer.lock();
        w.cctx = Some(make_cctx(self.level, w.dict.as_deref())?);
        self.recount(&mut w);
        let r = self.write_blocks(&mut w, buf, offset);
        w.cctx = None;
        self.recount(&mut w);
        r
    }

    /// Drops the blocks entirely inside the range; the partial ones at its ends keep their bytes.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len, "a discard")?;
        let mut w = self.writer.lock();
        for b in offset.div_ceil(BLOCK_BYTES)..(offset + len) / BLOCK_BYTES {
            self.install(&mut w, b as usize, None)?;
        }
        Ok(())
    }

    /// Drops every block and the training samples (page data); keeps the dictionary.
    fn discard_all(&self) -> io::Result<()> {
        let mut w = self.writer.lock();
        let r = (0..self.blocks.num_blocks()).try_for_each(|b| self.install(&mut w, b, None));
        w.samples = Vec::new();
        self.recount(&mut w);
        r
    }

    fn describe(&self) -> String {
        format!("memory (zstd-{}, 64 KiB blocks)", self.level)
    }

    /// Makes this thread's scratch and runs one decode through it (a block of text and noise,
    /// compressed when the device was made), so that its decompression context's tables and
    /// buffers, and the buffer blobs are copied into, are written now: a swap server's I/O
    /// thread then reads cold pages without allocating or faulting in memory (its `mlockall`
    /// keeps what is here resident). The scratch keeps no blob from it. Nothing to do on a
    /// thread that has its scratch already.
    fn prepare_reader(&self) {
        // Once per thread: a thread that has its scratch made it here or read with it.
        if SCRATCH.with(|s| s.try_borrow().map_or(true, |s| s.is_some())) {
            return;
        }
        let Ok(frame) = warm_frame() else { return }; // made by `new`: cannot fail here
        with_scratch(|s| {
            let r = s.dctx.decompress(&mut s.block[..], frame);
            debug_assert_eq!(r, Ok(BLOCK), "the warm-up frame decodes");
            s.last = None;
            std::hint::black_box(&mut s.block);
            // The buffer blobs are copied into: written now, so its pages are mapped (and
            // locked) before the first read needs them.
            s.blob.fill(1);
            std::hint::black_box(&mut s.blob);
        })
    }

    fn mem_bytes(&self) -> u64 {
        MemDevice::mem_bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Blocks this thread decoded (`decode` counts them).
        pub(super) static DECODES: Cell<u64> = const { Cell::new(0) };
    }

    fn rng(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    /// Text-like bytes (compressible, different for every seed).
    fn text(len: usize, mut seed: u64) -> Vec<u8> {
        const WORDS: [&str; 8] = ["user", "status=active", "id", "name=\"alice\"", "quota", "path=/var/lib", "ok", "mtime"];
        let mut v = Vec::with_capacity(len + 64);
        while v.len() < len {
            let (w, n) = (WORDS[rng(&mut seed) as usize % 8], rng(&mut seed) % 1000);
            v.extend_from_slice(format!("{w} {n}; ").as_bytes());
        }
        v.truncate(len);
        v
    }

    fn random(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len).map(|_| rng(&mut seed) as u8).collect()
    }

    fn read(d: &MemDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0xa5; len];
        d.read_at(&mut v, offset).unwrap();
        v
    }

    #[test]
    fn random_writes_read_back_as_a_plain_buffer_would() {
        let d = MemDevice::new(1 << 20, 3).unwrap();
        let mut model = vec![0u8; 1 << 20];
        let mut seed = 7;
        for i in 0..400u64 {
            let len = (rng(&mut seed) % (if i % 5 == 0 { 200_000 } else { 9000 }) + 1) as usize;
            let off = rng(&mut seed) % ((1 << 20) - len as u64 + 1);
            let data = match i % 3 {
                0 => random(len, i),
                1 => text(len, i),
                _ => vec![(i % 7) as u8; len],
            };
            d.write_at(&data, off).unwrap();
            model[off as usize..][..len].copy_from_slice(&data);
            let (l, o) = ((rng(&mut seed) % 140_000 + 1) as usize, rng(&mut seed));
            let o = o % ((1 << 20) - l as u64 + 1);
            assert_eq!(read(&d, o, l), model[o as usize..][..l], "read {l} at {o} after write {i}");
        }
        assert_eq!(read(&d, 0, 1 << 20), model);
        assert_eq!(d.stored_blocks(), 16);
        assert!(d.read_at(&mut [0; 2], (1 << 20) - 1).is_err() && d.write_at(&[0; 2], u64::MAX).is_err(), "past the end");
    }

    /// Records written as the tier does: 16 + 4096 bytes each, back to back from `from`.
    fn records(d: &MemDevice, from: u64, n: u64, seed: u64) -> Vec<u8> {
        let all: Vec<u8> = (0..n).flat_map(|k| text(4112, seed + k)).collect();
        all.chunks(4112).enumerate().for_each(|(k, r)| d.write_at(r, from + k as u64 * 4112).unwrap());
        all
    }

    fn blob(d: &MemDevice, b: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; COPY_BYTES];
        match d.blocks.read(b, &mut buf, |_, n| 0..n).unwrap() {
            (_, Got::Empty) => None,
            (_, Got::Blob(n)) => Some(buf[..n].to_vec()),
        }
    }

    fn blob_len(d: &MemDevice, b: usize) -> (u8, usize) {
        blob(d, b).map_or((RAW, 0), |x| (x[0], x.len()))
    }

    #[test]
    fn a_dictionary_is_trained_once_and_every_block_reads_back() {
        let d = MemDevice::with_sample_bytes(4 << 20, 3, 512 << 10).unwrap();
        let plain = MemDevice::with_sample_bytes(4 << 20, 3, 0).unwrap();
        let n = (3 << 20) / 4112;
        let data = records(&d, 0, n, 1);
        assert!(d.has_dict(), "trained after 512 KiB");
        assert_eq!(read(&d, 0, data.len()), data, "blocks from before and after the dictionary");
        records(&plain, 0, n, 1);
        assert!(!plain.has_dict());
        assert_eq!((blob_len(&d, 0).0, blob_len(&d, 20).0, blob_len(&plain, 20).0), (ZSTD, ZSTD_DICT, ZSTD));
        let (with, without): (usize, usize) =
            (10..46).map(|b| (blob_len(&d, b).1, blob_len(&plain, b).1)).fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
        println!("36 blocks: {with} bytes with the dictionary, {without} without");
        assert!(with <= without, "{with} > {without}");
        d.discard_all().unwrap();
        assert!(d.has_dict(), "kept");
        records(&d, 0, 40, 9);
        assert_eq!(blob_len(&d, 0).0, ZSTD_DICT);
    }

    #[test]
    fn a_thread_decodes_a_block_once_for_its_records_and_again_once_it_changed() {
        let d = MemDevice::with_sample_bytes(1 << 20, 3, 0).unwrap();
        let data = records(&d, 0, 15, 40); // 61,680 bytes: block 0 only
        let decodes = || DECODES.get();
        let before = decodes();
        for k in 0..15 {
            assert_eq!(read(&d, k * 4112, 4112), data[k as usize * 4112..][..4112], "record {k}");
        }
        assert_eq!(decodes() - before, 1, "15 records of one unchanged block: one decode");
        // A record rewritten: the block is a new blob, decoded again, and nothing stale is read.
        let new = text(4112, 99);
        d.write_at(&new, 4112).unwrap();
        let before = decodes();
        assert_eq!(read(&d, 4112, 4112), new);
        assert_eq!(read(&d, 0, 4112), data[..4112]);
        assert_eq!(decodes() - before, 1);
        // Another device's block 0, read by the same thread, is its own.
        let e = MemDevice::with_sample_bytes(1 << 20, 3, 0).unwrap();
        let other = records(&e, 0, 2, 7);
        for _ in 0..3 {
            assert_eq!(read(&e, 0, 4112), other[..4112]);
            assert_eq!(read(&d, 0, 4112), data[..4112]);
        }
        // Discarded, the block reads as zeroes, not as what the thread decoded before.
        d.discard(0, BLOCK_BYTES).unwrap();
        assert!(read(&d, 0, 4112).iter().all(|&x| x == 0));
    }

    #[test]
    fn discard_frees_whole_blocks_only_and_discard_all_everything() {
        let d = MemDevice::new(1 << 20, 3).unwrap();
        let data = random(4 * BLOCK, 3);
        d.write_at(&data, 0).unwrap();
        let before = d.mem_bytes();
        d.discard(1000, 3 * BLOCK_BYTES - 1000).unwrap();
        assert_eq!(d.stored_blocks(), 2, "blocks 1 and 2 went");
        assert!(d.mem_bytes() + 2 * BLOCK_BYTES <= before, "{} then {before}", d.mem_bytes());
        assert_eq!(read(&d, 0, BLOCK), data[..BLOCK], "a partial block keeps its bytes");
        assert!(read(&d, BLOCK_BYTES, 2 * BLOCK).iter().all(|&x| x == 0));
        assert_eq!(read(&d, 3 * BLOCK_BYTES, BLOCK), data[3 * BLOCK..]);
        d.discard_all().unwrap();
        assert_eq!((d.compressed_bytes(), d.stored_blocks()), (0, 0));
        assert!(read(&d, 0, 4 * BLOCK).iter().all(|&x| x == 0));
    }

    #[test]
    fn a_corrupt_blob_fails_the_read_never_returns_wrong_data() {
        let d = MemDevice::new(1 << 20, 3).unwrap();
        let data = text(3 * BLOCK, 5);
        d.write_at(&data, 0).unwrap();
        let good = blob(&d, 0).unwrap();
        let bad: [Vec<u8>; 4] = [
            [&[ZSTD][..], &random(3000, 1)].concat(),
            good[..good.len() / 2].to_vec(),
            [&[RAW][..], &data[..1000]].concat(),
            [&[9][..], &good[1..]].concat(),
        ];
        for (k, blob) in bad.into_iter().enumerate() {
            d.blocks.publish(&mut d.writer.lock().token, 0, &blob).unwrap();
            let e = d.read_at(&mut [0u8; 100], 10).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "blob {k}: {e}");
            assert!(d.read_at(&mut vec![0u8; BLOCK + 10], 0).is_err(), "blob {k}: a read across it");
            assert!(d.write_at(&[1; 10], 5).is_err(), "blob {k}: a partial write cannot patch it");
        }
        assert_eq!(read(&d, BLOCK_BYTES, 2 * BLOCK), data[BLOCK..], "the other blocks still read");
    }

    #[test]
    fn readers_of_a_block_never_see_wrong_data_while_other_ranges_of_it_are_written() {
        let d = MemDevice::new(16 * BLOCK_BYTES, 3).unwrap();
        // Stable: 16 KiB either side of every block boundary; written: the middle 32 KiB.
        let stable = text(16 * BLOCK, 11);
        d.write_at(&stable, 0).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let (d, stable, stop) = (&d, &stable, &stop);
                s.spawn(move || {
                    let mut seed = t;
                    while !stop.load(Relaxed) {
                        let b = 1 + rng(&mut seed) % 15;
                        let at = b * BLOCK_BYTES - 16384 + rng(&mut seed) % 28000;
                        let len = (rng(&mut seed) % 4112 + 1) as usize;
                        assert_eq!(read(d, at, len), stable[at as usize..][..len], "at {at}");
                    }
                });
            }
            for round in 0..20u64 {
                for b in 0..16u64 {
                    let rec = text(32768, round * 100 + b);
                    for (k, r) in rec.chunks(4112).enumerate() {
                        d.write_at(r, b * BLOCK_BYTES + 16384 + k as u64 * 4112).unwrap();
                    }
                }
            }
            stop.store(true, Relaxed);
        });
        assert_eq!(read(&d, 16384, 32768), text(32768, 1900));
    }

    #[test]
    fn bad_sizes_and_levels_are_refused() {
        for (size, level) in [(0, 3), (1000, 3), (BLOCK_BYTES + 1, 3), (BLOCK_BYTES, 0), (BLOCK_BYTES, 23), (BLOCK_BYTES, -1)] {
            let e = MemDevice::new(size, level).err().expect("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains(if level == 3 { "multiple of 65536" } else { "1..=22" }), "{e}");
        }
        assert_eq!(MemDevice::new(BLOCK_BYTES, 22).unwrap().describe(), "memory (zstd-22, 64 KiB blocks)");
    }

    #[test]
    fn memory_is_counted() {
        // Highly compressible pages, each different.
        let page = |k: u64| [format!("page {k:08} ").as_bytes(), &b"compressible ".repeat(314)].concat()[..4096].to_vec();
        let block = |b: u64| (b * 16..b * 16 + 16).flat_map(page).collect::<Vec<u8>>();
        // Without a dictionary: each block compresses to under 4 KiB, a blob that is all tail,
        // so the blobs of 1 MiB share tail pages: beyond the fixed cost (the region's header
        // and tables, the writer's buffers and its zstd context, sized by its first
        // compression, and the first blob's tail page) they cost the pages their bytes fill,
        // not a page each.
        let d = MemDevice::with_sample_bytes(1 << 20, 3, 0).unwrap();
        d.write_at(&block(0), 0).unwrap();
        let fixed = d.mem_bytes();
        (1..16).for_each(|b| d.write_at(&block(b), b * BLOCK_BYTES).unwrap());
        println!("fixed {fixed}, 1 MiB compressible {}", d.mem_bytes());
        let extra = d.mem_bytes() - fixed;
        assert!(extra <= d.compressed_bytes().next_multiple_of(4096) && extra < 15 * 4096 / 4, "{extra}");
        // The samples are counted until the dictionary is trained, then freed.
        let d = MemDevice::new(16 << 20, 3).unwrap();
        (0..16).for_each(|b| d.write_at(&block(b), b * BLOCK_BYTES).unwrap());
        assert!(!d.has_dict() && d.mem_bytes() > 1 << 20, "{}", d.mem_bytes());
        let t = std::time::Instant::now();
        (16..256).for_each(|b| d.write_at(&block(b), b * BLOCK_BYTES).unwrap());
        println!("16 MiB compressible: {} bytes, {} in blobs; {:?}", d.mem_bytes(), d.compressed_bytes(), t.elapsed());
        assert!(d.has_dict() && d.mem_bytes() < (16 << 20) / 8);
        // Random data costs at least itself.
        let r = MemDevice::new(1 << 20, 3).unwrap();
        r.write_at(&random(1 << 20, 2), 0).unwrap();
        assert!(r.mem_bytes() >= 1 << 20, "{}", r.mem_bytes());
        d.discard_all().unwrap();
        assert_eq!(d.compressed_bytes(), 0);
        println!("after discard_all: {} (a reader's context: {})", d.mem_bytes(), DCtx::create().sizeof());
    }

    #[test]
    fn a_successor_reads_every_block_and_keeps_the_dictionary() {
        let size = 4 << 20;
        let len = MemDevice::region_bytes(size);
        let region = Region { map: Arc::new(StateMap::create(len).unwrap()), offset: 0, len };
        let d = MemDevice::create_with(&region, size, 3, 512 << 10).unwrap();
        let data = records(&d, 0, (3 << 20) / 4112, 1);
        assert!(d.has_dict());
        assert_eq!(blob_len(&d, 20).0, ZSTD_DICT);
        let (mem, stored, compressed) = (d.mem_bytes(), d.stored_blocks(), d.compressed_bytes());
        drop(d); // as a kill would: nothing is discarded
        let (s, cut) = MemDevice::take_over(&region, size, 3).unwrap();
        assert!(!cut && s.has_dict(), "the dictionary is in the region");
        assert_eq!((s.stored_blocks(), s.compressed_bytes()), (stored, compressed));
        assert!(s.mem_bytes() <= mem && s.mem_bytes() >= compressed, "{} of {mem}", s.mem_bytes());
        assert_eq!(read(&s, 0, data.len()), data, "blocks from before and after the dictionary");
        let more = records(&s, 0, 40, 9);
        assert_eq!(blob_len(&s, 0).0, ZSTD_DICT, "the successor compresses with the kept dictionary");
        assert_eq!(read(&s, 0, more.len()), more);
        assert!(MemDevice::take_over(&region, 2 * size, 3).is_err(), "another size");
        // A device that died before training: its successor has no dictionary and samples anew.
        let region = Region { map: Arc::new(StateMap::create(len).unwrap()), offset: 0, len };
        let d = MemDevice::create_with(&region, size, 3, 512 << 10).unwrap();
        let few = records(&d, 0, 20, 3);
        drop(d);
        let (s, _) = MemDevice::take_over(&region, size, 3).unwrap();
        assert!(!s.has_dict() && !s.writer.lock().trained);
        assert_eq!(read(&s, 0, few.len()), few);
    }

    /// The memory the blobs cost in the state file (page-rounded) against what they cost as
    /// heap allocations (the device before issue 29: length rounded to 16 plus 32 bytes of
    /// malloc header and `Arc` counters), on real pages: `COMPCACHE_PAGES=a.bin,b.bin` (raw
    /// 4 KiB pages, tools/pagedump), `COMPCACHE_COLD_LEVEL` (default 19, the tier's). Pages
    /// are written as the tier's writeback writes them: records (16-byte header + page) back
    /// to back, same-filled pages left out (they stay in RAM), whole blocks at a time.
    #[test]
    #[ignore = "a measurement: needs COMPCACHE_PAGES"]
    fn measure_the_memory_of_blobs_in_pages_against_the_heap() {
        let Ok(files) = std::env::var("COMPCACHE_PAGES") else { return };
        let level = std::env::var("COMPCACHE_COLD_LEVEL").ok().and_then(|l| l.parse().ok()).unwrap_or(19);
        for f in files.split(',') {
            let bytes = std::fs::read(f).unwrap();
            let mut recs = Vec::new();
            let mut seed = 1u64;
            let mut pages = 0u64;
            for (k, p) in bytes.chunks_exact(4096).enumerate() {
                if p.chunks_exact(8).all(|w| w == &p[..8]) {
                    continue;
                }
                recs.extend_from_slice(&(k as u64).to_le_bytes());
                recs.extend_from_slice(&(rng(&mut seed) as u32).to_le_bytes());
                recs.extend_from_slice(&4096u32.to_le_bytes());
                recs.extend_from_slice(p);
                pages += 1;
            }
            recs.truncate(recs.len() / BLOCK * BLOCK);
            let size = recs.len() as u64;
            let len = MemDevice::region_bytes(size);
            let region = Region { map: Arc::new(StateMap::create(len).unwrap()), offset: 0, len };
            let d = MemDevice::create(&region, size, level).unwrap();
            for (k, c) in recs.chunks(16 * BLOCK).enumerate() {
                d.write_at(c, (k * 16 * BLOCK) as u64).unwrap();
            }
            let lens: Vec<usize> = (0..d.blocks.num_blocks()).map(|b| blob_len(&d, b).1).collect();
            let heap: u64 = lens.iter().map(|&n| (n as u64).next_multiple_of(16) + 32).sum();
            let whole: u64 = lens.iter().map(|&n| n.next_multiple_of(4096) as u64).sum();
            let paged = d.blocks.resident_bytes(&d.writer.lock().token);
            let (heap_off, heap_len) = blocks::heap_range(d.blocks.num_blocks());
            let (tails_off, tails_len) = blocks::tail_pages_range(d.blocks.num_blocks());
            assert_eq!(heap_off + heap_len, tails_off);
            let resident: usize = region.map.data_ranges(heap_off, heap_len + tails_len).iter().map(|r| r.len()).sum();
            let blob: u64 = lens.iter().map(|&n| n as u64).sum();
            println!(
                "{f} level {level}: {pages} pages ({} MiB of records) in {} blocks: blobs {blob} bytes; heap {heap} bytes; \
                 state file {paged} bytes counted, {resident} resident (SEEK_DATA); state file / heap {:.4}; \
                 each blob in whole pages / heap {:.3}; records / state file {:.2}; dictionary {}",
                size >> 20,
                lens.len(),
                paged as f64 / heap as f64,
                whole as f64 / heap as f64,
                size as f64 / paged as f64,
                d.has_dict()
            );
            assert_eq!(resident as u64, paged, "what mem_bytes counts is what is resident");
        }
    }
}
