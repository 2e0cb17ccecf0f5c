//! The recompression codec ([`super::Codec::STRONG`] and the dictionary codecs): zstd at a
//! high level, optionally with a dictionary trained from the device's own pages
//! (`recompress/`). Only the recompression thread encodes ([`StrongEncoder`]); any worker
//! decodes ([`StrongDecoder`], one per `Context`), with the dictionary its slot names.
//!
//! Frames carry no content size and no dictionary id (the slot knows the length and the
//! codec, and at 4 KiB every byte of frame header is a byte per page), but they do carry
//! zstd's 4-byte content checksum: a page decoded with a damaged or wrong dictionary, or from a
//! damaged frame, fails the check and is an I/O error, never wrong data. It costs 4 bytes per
//! recompressed page (about 0.4% of a typical one) and a 32-bit xxhash per read.

use std::sync::OnceLock;

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, DDict, DParameter};

use crate::PAGE_SIZE;

/// A worker's decoder for recompressed pages. Made once per `Context`: decoding takes no lock
/// and allocates nothing (a single-shot `ZSTD_decompress_usingDDict` into the caller's page).
pub(crate) struct StrongDecoder {
    d: DCtx<'static>,
}

impl StrongDecoder {
    pub fn new() -> StrongDecoder {
        let mut d = DCtx::create();
        // Caps what a damaged frame can ask for; ours use a window of at most a page.
        let _ = d.set_parameter(DParameter::WindowLogMax(27));
        let mut dec = StrongDecoder { d };
        dec.warm();
        dec
    }

    /// Makes the context's memory resident now (`super::warm_pages`), so that decoding on
    /// the I/O path does not fault.
    fn warm(&mut self) {
        let mut out = vec![0u8; PAGE_SIZE];
        for frame in warm_frames() {
            let _ = self.decompress(frame, &mut out, None);
        }
    }

    /// Decodes `src` into `dst`, which it must fill exactly, with `dict` if the page was
    /// encoded with one. Any other outcome is an error message (a corrupt page).
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8], dict: Option<&DDict<'static>>) -> Result<(), String> {
        let want = dst.len();
        let r = match dict {
            Some(dd) => self.d.decompress_using_ddict(dst, src, dd),
            None => self.d.decompress(dst, src),
        };
        match r {
            Ok(n) if n == want => Ok(()),
            Ok(n) => Err(format!("zstd (recompressed) produced {n} bytes, expected {want}")),
            Err(code) => Err(format!("zstd (recompressed): {}", zstd_safe::get_error_name(code))),
        }
    }
}

/// `super::warm_pages` encoded at levels 1 and 19, what [`StrongDecoder::warm`] decodes. Made
/// once per process: they are the same bytes every time, and encoding them at level 19 for
/// every new decoder took about 2.4 ms (every `Context`, and each recompression step makes one).
fn warm_frames() -> &'static [Vec<u8>] {
    static FRAMES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    FRAMES.get_or_init(|| {
        let mut c = vec![0u8; crate::compress::MAX_COMPRESSED_BYTES];
        let mut frames = Vec::new();
        for level in [1, 19] {
            let mut enc = StrongEncoder::new(level);
            for p in &super::warm_pages() {
                if let Some(len) = enc.compress(p, &mut c, false) {
                    frames.push(c[..len].to_vec());
                }
            }
        }
        frames
    })
}

/// The recompression thread's encoder: one context without a dictionary, one with the current
/// dictionary loaded (so that a page can be encoded both ways to measure the dictionary's gain).
pub(crate) struct StrongEncoder {
    plain: CCtx<'static>,
    with_dict: CCtx<'static>,
    has_dict: bool,
}

impl StrongEncoder {
    /// An encoder at zstd `level` (validated by the configuration).
    pub fn new(level: i32) -> StrongEncoder {
        let make = || {
            let mut c = CCtx::create();
            // Failures here only cost a few bytes of frame header; they cannot corrupt data.
            let _ = c.set_parameter(CParameter::CompressionLevel(level));
            let _ = c.set_parameter(CParameter::ChecksumFlag(true));
            let _ = c.set_parameter(CParameter::ContentSizeFlag(false));
            let _ = c.set_parameter(CParameter::DictIdFlag(false));
            c
        };
        StrongEncoder { plain: make(), with_dict: make(), has_dict: false }
    }

    /// Loads `dict` (raw dictionary bytes) for [`StrongEncoder::compress`] with a dictionary;
    /// `None` unloads it.
    pub fn set_dict(&mut self, dict: Option<&[u8]>) -> Result<(), String> {
        let r = match dict {
            Some(d) => self.with_dict.load_dictionary(d),
            None => self.with_dict.load_dictionary(&[]),
        };
        self.has_dict = dict.is_some() && r.is_ok();
        r.map(|_| ()).map_err(|code| format!("zstd cannot load the dictionary: {}", zstd_safe::get_error_name(code)))
    }

    /// Encodes `src` into `dst` with the loaded dictionary (`with_dict`, which must be loaded)
    /// or without. `None` if the result does not fit in `dst`.
    pub fn compress(&mut self, src: &[u8], dst: &mut [u8], with_dict: bool) -> Option<usize> {
        debug_assert!(!with_dict || self.has_dict, "no dictionary loaded");
        let c = if with_dict { &mut self.with_dict } else { &mut self.plain };
        c.compress2(dst, src).ok()
    }
}

/// A dictionary in the form decoders use (`ZSTD_createDDict` copies the bytes).
pub(crate) fn ddict(bytes: &[u8]) -> Result<DDict<'static>, String> {
    DDict::try_create(bytes).ok_or_else(|| "zstd cannot load the dictionary (not a dictionary, or out of memory)".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress::MAX_COMPRESSED_BYTES;
    use crate::PAGE_SIZE;

    fn page(seed: u64) -> Vec<u8> {
        let mut p = Vec::with_capacity(PAGE_SIZE);
        let mut n = seed;
        while p.len() < PAGE_SIZE {
            n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            p.extend_from_slice(format!("record {} value {:08x}; ", n % 97, n >> 40).as_bytes());
        }
        p.truncate(PAGE_SIZE);
        p
    }

    #[test]
    fn pages_round_trip_with_and_without_a_dictionary() {
        let samples: Vec<Vec<u8>> = (0..200).map(page).collect();
        let dict = zstd::dict::from_samples(&samples, 4096).expect("training");
        let dd = ddict(&dict).unwrap();
        let mut enc = StrongEncoder::new(9);
        enc.set_dict(Some(&dict)).unwrap();
        let mut dec = StrongDecoder::new();
        for seed in 1000..1010 {
            let p = page(seed);
            let mut c = vec![0u8; MAX_COMPRESSED_BYTES];
            let mut out = vec![0u8; PAGE_SIZE];
            let plain = enc.compress(&p, &mut c, false).unwrap();
            dec.decompress(&c[..plain], &mut out, None).unwrap();
            assert_eq!(out, p);
            let n = enc.compress(&p, &mut c, true).unwrap();
            assert!(n < plain, "the dictionary helps pages like its samples: {n} vs {plain}");
            dec.decompress(&c[..n], &mut out, Some(&dd)).unwrap();
            assert_eq!(out, p);
            // Without its dictionary, or with another one, the frame is an error, never data.
            assert!(dec.decompress(&c[..n], &mut out, None).is_err());
            let other: Vec<Vec<u8>> = (5000..5200).map(|s| page(s).iter().rev().copied().collect()).collect();
            let other = ddict(&zstd::dict::from_samples(&other, 4096).unwrap()).unwrap();
            assert!(dec.decompress(&c[..n], &mut out, Some(&other)).is_err());
        }
    }

    #[test]
    fn damaged_frames_and_dictionaries_are_errors() {
        let mut dec = StrongDecoder::new();
        let mut out = vec![0u8; PAGE_SIZE];
        assert!(dec.decompress(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 1], &mut out, None).is_err());
        let mut enc = StrongEncoder::new(3);
        let p = page(7);
        let mut c = vec![0u8; MAX_COMPRESSED_BYTES];
        let n = enc.compress(&p, &mut c, false).unwrap();
        assert!(dec.decompress(&c[..n / 2], &mut out, None).is_err(), "truncated");
        // A dictionary's magic number followed by entropy tables that are junk.
        let mut damaged = vec![0x37, 0xa4, 0x30, 0xec, 1, 2, 3, 4];
        damaged.extend(std::iter::repeat_n(0xff, 256));
        assert!(ddict(&damaged).is_err(), "a damaged dictionary");
    }
}
