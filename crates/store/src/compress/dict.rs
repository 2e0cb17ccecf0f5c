//! The dictionary table: the zstd dictionaries recompressed pages may point at, one per table
//! place ([`Codec::with_dict`]), each with a version number that only grows.
//!
//! # Lifetime of a dictionary (the invariant readers rely on)
//! A place holds a dictionary from [`Dicts::install`] until [`Dicts::free_unused`] drops it,
//! and `free_unused` drops it only when no slot uses it: the per-codec page count
//! (`Counters::codec_pages`, kept by `Mover::account` in the same step as every entry change,
//! the new entry counted before the old one is released; recompression passes it in) is zero, and it is not the place
//! recompression is installing into. Both run on the recompression thread only (under its
//! mutex), so no install of a new user can race a free. Hence: a reader that finds a slot with
//! a dictionary codec under the slot lock always finds that place filled with the dictionary
//! the page was encoded with, and it takes its own `Arc` of it there ([`Dicts::get`]: a read
//! lock and a reference count, no allocation), so a dictionary freed while a read is in flight
//! is dropped only when that read lets go of it.
//!
//! # In the state file
//! A store's table keeps each dictionary's bytes in the state file too (`shm.rs`; a page of
//! lengths, then a place of [`DICT_ROOM`] bytes per version), so that a successor process has
//! every dictionary its pages name: the bytes are written before the length that makes them
//! valid, and before any page is encoded with them; a freed place's length is cleared before
//! its memory is given back. [`Dicts::recover`] reads them back.
//!
//! # Locking
//! Each place's `RwLock` is a leaf: readers take it shared under a slot lock, for one `Arc`
//! clone; the recompression thread takes it exclusive (no slot lock held) to fill or empty the
//! place. There is no lock over the whole table.

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;

use parking_lot::RwLock;
use zstd::zstd_safe::DDict;

use crate::compress::strong::StrongEncoder;
use crate::compress::{strong, Codec, MAX_COMPRESSED_BYTES};
use crate::shm::StateMap;
use crate::PAGE_SIZE;

/// A dictionary trained by zstd's trainer (`ZDICT_trainFromBuffer`) on pages, and its gain.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The dictionary, in zstd's format.
    pub bytes: Vec<u8>,
    /// Bytes it saves per 1000, against zstd at the same level without it, on the held-out
    /// pages (pages it was not trained on).
    pub gain_permille: u32,
}

/// Trains a dictionary of at most `max_bytes` on `pages` (whole 4 KiB pages, back to back):
/// every ninth page is held out to measure the gain at zstd `level` (interleaved, so that the
/// measure covers the same parts of the device as the training), the others are trained on.
/// What recompression does with its samples, and `compcache dict train` with a page dump.
pub fn train(pages: &[u8], max_bytes: usize, level: i32) -> Result<Trained, String> {
    let n = pages.len() / PAGE_SIZE;
    if n < 9 {
        return Err(format!("{n} pages are too few to train a dictionary on (at least 9)"));
    }
    let (training, held) = split(pages);
    let sizes = vec![PAGE_SIZE; training.len() / PAGE_SIZE];
    let bytes = fastcover(&training, &sizes, max_bytes)?;
    let mut enc = StrongEncoder::new(level);
    enc.set_dict(Some(&bytes))?;
    Ok(Trained { gain_permille: gain_on(&mut enc, &held), bytes })
}

/// The frequency table's size (log2) zstd's trainer uses for `len` bytes of samples: the
/// smallest table with at least twice as many counters as the samples have positions, and never
/// more than `ZDICT_trainFromBuffer`'s fixed 2^20.
fn table_log(len: usize) -> u32 {
    (len.max(1).next_power_of_two().trailing_zeros() + 1).clamp(MIN_TABLE_LOG, DEFAULT_TABLE_LOG)
}

/// `ZDICT_trainFromBuffer`'s frequency-table size (its `f`) and the smallest this file uses.
const DEFAULT_TABLE_LOG: u32 = 20;
const MIN_TABLE_LOG: u32 = 12;

/// zstd's trainer as `ZDICT_trainFromBuffer` runs it (fastCover, d = 8, k searched in four
/// steps, tuned for zstd's default level), but with its frequency table sized to the samples
/// ([`table_log`]). `ZDICT_trainFromBuffer` always counts in 2^20 slots, made for samples of
/// megabytes: about 6 MiB cleared and copied for each of the parameters it tries, whatever the
/// samples' size. More than 256 KiB of samples (recompression's default 576 pages among them)
/// get the same table, hence the very dictionary `ZDICT_trainFromBuffer` gives; fewer get a
/// table still twice the samples' positions, at a fraction of the cost (a recompression store
/// with few samples, `compcache dict train` on a small dump). The cold tier's trainer
/// (`backing/memdev.rs`) is this one too.
pub(crate) fn fastcover(samples: &[u8], sizes: &[usize], max_bytes: usize) -> Result<Vec<u8>, String> {
    assert_eq!(sizes.iter().sum::<usize>(), samples.len(), "sample sizes add up to the samples");
    let mut params = zstd_sys::ZDICT_fastCover_params_t {
        k: 0,
        d: 8,
        f: table_log(samples.len()),
        steps: 4,
        nbThreads: 0,
        splitPoint: 0.0,
        accel: 0,
        shrinkDict: 0,
        shrinkDictMaxRegression: 0,
        zParams: zstd_sys::ZDICT_params_t { compressionLevel: zstd_sys::ZSTD_CLEVEL_DEFAULT as i32, notificationLevel: 0, dictID: 0 },
    };
    let mut dict = vec![0u8; max_bytes];
    let samples_n = u32::try_from(sizes.len()).map_err(|_| format!("{} samples are too many for zstd's trainer", sizes.len()))?;
    // SAFETY: `dict` is writable for `dict.len()` bytes, `samples` readable for the sum of
    // `sizes` (asserted above), `sizes` holds `samples_n` entries, and `params` is a valid,
    // exclusively borrowed parameter block; the trainer keeps none of these pointers after it
    // returns (it runs on this thread: nbThreads 0).
    let n = unsafe {
        zstd_sys::ZDICT_optimizeTrainFromBuffer_fastCover(
            dict.as_mut_ptr().cast(),
            dict.len(),
            samples.as_ptr().cast(),
            sizes.as_ptr(),
            samples_n,
            &mut params,
        )
    };
    // SAFETY: ZDICT_isError only inspects the value it is given.
    if unsafe { zstd_sys::ZDICT_isError(n) } != 0 {
        // SAFETY: ZDICT_getErrorName returns a static NUL-terminated string for any code.
        let name = unsafe { std::ffi::CStr::from_ptr(zstd_sys::ZDICT_getErrorName(n)) };
        return Err(format!("zstd's trainer: {}", name.to_string_lossy()));
    }
    dict.truncate(n);
    Ok(dict)
}

/// `pages` split into the pages [`train`] trains on and those it holds out (every ninth).
fn split(pages: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut training, mut held) = (Vec::with_capacity(pages.len()), Vec::with_capacity(pages.len() / 9 + PAGE_SIZE));
    for (i, p) in pages.chunks_exact(PAGE_SIZE).enumerate() {
        if i % 9 == 8 { &mut held } else { &mut training }.extend_from_slice(p);
    }
    (training, held)
}

/// The pages [`train`] holds out of `pages` to measure a dictionary on.
pub(crate) fn held_out(pages: &[u8]) -> Vec<u8> {
    split(pages).1
}

/// What the dictionary loaded in `enc` saves on `pages` (per 1000 bytes, against `enc` without
/// it).
pub(crate) fn gain_on(enc: &mut StrongEncoder, pages: &[u8]) -> u32 {
    let (mut with, mut without) = (0u64, 0u64);
    let mut out = vec![0u8; MAX_COMPRESSED_BYTES];
    for page in pages.chunks_exact(PAGE_SIZE) {
        let (Some(a), Some(b)) = (enc.compress(page, &mut out, false), enc.compress(page, &mut out, true)) else { continue };
        without += a as u64;
        with += b as u64;
    }
    gain_permille(with, without)
}

/// Bytes saved per 1000 by `with` against `without`.
pub(crate) fn gain_permille(with: u64, without: u64) -> u32 {
    if without == 0 || with >= without {
        return 0;
    }
    ((without - with) * 1000 / without) as u32
}

/// One dictionary version (its number and gain are recompression's counters).
pub(crate) struct Dict {
    /// The raw dictionary, for the encoder.
    pub bytes: Box<[u8]>,
    /// The decoders' form of it.
    pub ddict: DDict<'static>,
}

impl Dict {
    pub fn new(bytes: Vec<u8>) -> Result<Dict, String> {
        let ddict = strong::ddict(&bytes)?;
        Ok(Dict { bytes: bytes.into_boxed_slice(), ddict })
    }
}

/// Room for one dictionary in the state file. zstd's trainer makes dictionaries of ~100 KiB at
/// most by default (compcache's of 16 KiB); a larger file is refused when it is read.
pub const DICT_ROOM: usize = 1 << 20;

/// The bytes of state file a table takes: a page of lengths, then the places.
pub(crate) const DICTS_BYTES: usize = PAGE_SIZE + Codec::DICT_VERSIONS * DICT_ROOM;

/// The table of dictionary versions in use.
pub(crate) struct Dicts {
    places: [RwLock<Option<Arc<Dict>>>; Codec::DICT_VERSIONS],
    /// Where the table is kept in the state file (`None`: nowhere, tests).
    kept: Option<(Arc<StateMap>, usize)>,
}

/// What the table holds, for statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DictsSummary {
    /// Dictionaries held (in use by pages, or the current one).
    pub live: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Dicts {
    /// A table kept nowhere (tests).
    #[cfg(test)]
    pub fn new() -> Dicts {
        Dicts { places: std::array::from_fn(|_| RwLock::new(None)), kept: None }
    }

    /// A table kept in the state file `map` at `offset` ([`DICTS_BYTES`]).
    pub fn in_map(map: &Arc<StateMap>, offset: usize) -> Dicts {
        assert!(offset + DICTS_BYTES <= map.len());
        Dicts { places: std::array::from_fn(|_| RwLock::new(None)), kept: Some((map.clone(), offset)) }
    }

    /// Place `place`'s length word in the state file, and the address of its bytes.
    fn kept(&self, place: usize) -> Option<(&AtomicU64, *mut u8, &StateMap, usize)> {
        let (map, offset) = self.kept.as_ref()?;
        // SAFETY: the first page of the table holds DICT_VERSIONS length words (u64-aligned,
        // any bit pattern valid), alive as long as the map.
        let len = unsafe { &*(map.at(offset + place * 8).as_ptr() as *const AtomicU64) };
        let at = offset + PAGE_SIZE + place * DICT_ROOM;
        Some((len, map.at(at).as_ptr(), map, at))
    }

    /// Reads back the dictionaries a dead process's table kept (a successor's, before any
    /// reader); a place whose bytes are not a dictionary is left empty (its pages are then
    /// lost, which recovery sees). Returns how many were read.
    pub fn recover(&self) -> u64 {
        let mut n = 0;
        for place in 0..Codec::DICT_VERSIONS {
            let Some((len, bytes, _, _)) = self.kept(place) else { return 0 };
            let l = len.load(Acquire) as usize;
            if l == 0 {
                continue;
            }
            // SAFETY: the place's bytes are inside the map; no other thread runs yet.
            let d = (l <= DICT_ROOM).then(|| unsafe { std::slice::from_raw_parts(bytes, l) }.to_vec()).map(Dict::new);
            match d {
                Some(Ok(d)) => {
                    *self.places[place].write() = Some(Arc::new(d));
                    n += 1;
                }
                _ => len.store(0, Relaxed),
            }
        }
        n
    }

    /// The dictionary in `place`, for a reader holding the lock of a slot that names it (see
    /// the module docs: then it is there).
    pub fn get(&self, place: usize) -> Option<Arc<Dict>> {
        self.places[place].read().clone()
    }

    /// Puts `dict` in an empty place and returns the place; `None` if every place is taken.
    /// Recompression thread only.
    pub fn install(&self, dict: Dict) -> Option<usize> {
        let place = self.places.iter().position(|p| p.read().is_none())?;
        if let Some((len, bytes, _, _)) = self.kept(place) {
            assert!(dict.bytes.len() <= DICT_ROOM, "dictionaries are checked against DICT_ROOM when read");
            // SAFETY: the place is empty (no reader, and recovery only at start), so nobody
            // else touches its bytes; the copy stays inside the place.
            unsafe { std::ptr::copy_nonoverlapping(dict.bytes.as_ptr(), bytes, dict.bytes.len()) };
            len.store(dict.bytes.len() as u64, Release);
        }
        *self.places[place].write() = Some(Arc::new(dict));
        Some(place)
    }

    /// Drops every dictionary no page uses (`pages_of` a dictionary codec is 0), except the one
    /// in `keep` (the current one). Returns how many it dropped. Recompression thread only.
    pub fn free_unused(&self, pages_of: impl Fn(Codec) -> u64, keep: Option<usize>) -> u64 {
        let mut freed = 0;
        for (place, lock) in self.places.iter().enumerate() {
            if Some(place) == keep || lock.read().is_none() {
                continue;
            }
            if pages_of(Codec::with_dict(place)) == 0 {
                lock.write().take();
                if let Some((len, _, map, at)) = self.kept(place) {
                    len.store(0, Release);
                    // SAFETY: the place is empty now and no page names it; its bytes are
                    // read by nobody (a successor reads only places with a length).
                    unsafe { map.remove(at, DICT_ROOM) };
                }
                freed += 1;
            }
        }
        freed
    }

    /// Puts `dict` in `place` whatever it held (tests: a damaged dictionary).
    #[cfg(test)]
    pub fn replace(&self, place: usize, dict: Dict) {
        if let Some((len, _, _, _)) = self.kept(place) {
            len.store(0, Release); // a damaged dictionary is not kept for a successor
        }
        *self.places[place].write() = Some(Arc::new(dict));
    }

    pub fn summary(&self) -> DictsSummary {
        let mut s = DictsSummary::default();
        for p in &self.places {
            if let Some(d) = p.read().as_ref() {
                s.live += 1;
                s.bytes += d.bytes.len() as u64;
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trained() -> Vec<u8> {
        let samples: Vec<Vec<u8>> =
            (0..100u32).map(|i| format!("{i:04} the quick brown fox {i:x} jumps ").repeat(60).into_bytes()).collect();
        zstd::dict::from_samples(&samples, 2048).expect("training")
    }

    #[test]
    fn a_dictionary_lives_while_pages_use_it() {
        use crate::stats::Counters;
        let counters = Counters::default();
        let pages_of = |c: Codec| Counters::get(&counters.codec_pages[c.index()]);
        let dicts = Dicts::new();
        let bytes = trained();
        let place = dicts.install(Dict::new(bytes.clone()).unwrap()).unwrap();
        let users = &counters.codec_pages[Codec::with_dict(place).index()];
        Counters::inc(users);
        assert_eq!(dicts.free_unused(pages_of, None), 0, "a page uses it");
        let held = dicts.get(place).expect("installed");
        Counters::sub(users, 1);
        assert_eq!(dicts.free_unused(pages_of, Some(place)), 0, "the current one is kept");
        assert_eq!(dicts.free_unused(pages_of, None), 1);
        assert!(dicts.get(place).is_none());
        assert_eq!(&*held.bytes, &bytes[..], "a reader's Arc outlives the table's");
        assert_eq!(dicts.summary(), DictsSummary::default());
    }

    #[test]
    fn the_table_has_a_fixed_number_of_places() {
        let dicts = Dicts::new();
        let bytes = trained();
        for _ in 0..Codec::DICT_VERSIONS {
            assert!(dicts.install(Dict::new(bytes.clone()).unwrap()).is_some());
        }
        assert!(dicts.install(Dict::new(bytes).unwrap()).is_none());
        assert_eq!(dicts.summary().live, Codec::DICT_VERSIONS as u64);
    }

    /// `n` pages of text-like records with numbers that vary, as a heap of small objects.
    fn pages(n: usize, seed: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * PAGE_SIZE);
        let mut x = seed | 1;
        while out.len() < n * PAGE_SIZE {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let word = ["alpha", "beta", "gamma", "delta", "epsilon"][(x % 5) as usize];
            out.extend_from_slice(format!("{{\"id\":{},\"name\":\"{word}-{}\",\"ok\":{}}},", x % 100_000, x >> 50, x & 1 == 0).as_bytes());
        }
        out.truncate(n * PAGE_SIZE);
        out
    }

    #[test]
    fn the_table_grows_with_the_samples_up_to_zstds_default() {
        assert_eq!(table_log(0), MIN_TABLE_LOG);
        assert_eq!(table_log(8 * PAGE_SIZE), 16, "the 8 pages of the smallest training: 2^15 positions");
        assert_eq!(table_log(256 << 10), 19);
        assert_eq!(table_log((256 << 10) + 1), DEFAULT_TABLE_LOG);
        assert_eq!(table_log(512 * PAGE_SIZE), DEFAULT_TABLE_LOG, "recompression's default samples");
        assert_eq!(table_log(1 << 30), DEFAULT_TABLE_LOG);
    }

    #[test]
    fn large_samples_give_zstds_own_dictionary() {
        // 72 pages (288 KiB): the same table as ZDICT_trainFromBuffer's, so the same bytes.
        let samples = pages(72, 7);
        let sizes = vec![PAGE_SIZE; 72];
        let ours = fastcover(&samples, &sizes, 16 << 10).expect("training");
        let zstds = zstd::dict::from_continuous(&samples, &sizes, 16 << 10).expect("zstd's training");
        assert!(!ours.is_empty());
        assert_eq!(ours, zstds);
    }

    #[test]
    fn small_samples_train_a_dictionary_that_helps() {
        for n in [9, 18, 45] {
            let t = train(&pages(n, n as u64), 16 << 10, 3).expect("training on few pages");
            assert!(!t.bytes.is_empty() && t.bytes.len() <= 16 << 10);
            assert!(t.gain_permille > 0, "{n} pages: the dictionary saves nothing on their held-out pages");
            Dict::new(t.bytes).expect("zstd loads what its trainer made");
        }
    }

    #[test]
    fn samples_the_trainer_refuses_are_an_error() {
        // Below ZDICT_DICTSIZE_MIN (256 bytes): zstd refuses the destination.
        let e = train(&pages(9, 1), 100, 3).expect_err("a 100-byte dictionary");
        assert!(e.starts_with("zstd's trainer: "), "{e}");
    }
}
