//! The compressor front end, after zram's zcomp: a [`Backend`] holds the immutable parameters
//! shared by every worker (algorithm, level); each worker thread owns a [`BackendContext`] with
//! its scratch state, so compression takes no lock. Backends are one small file each.

pub mod dict;
mod lz4;
pub(crate) mod strong;
mod zstd;

use crate::error::StoreError;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// A compression algorithm the store can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// LZ4 (the reference liblz4): the default, as in zram; fastest. Its level is the
    /// acceleration (1, the default, ..=65537: faster, less compression), as zram's.
    Lz4,
    /// LZ4HC, lz4's high-compression mode (level 1..=12, default 9): slower to write, the same
    /// lz4 format and read speed.
    Lz4hc,
    /// Zstandard with a level (1..=22; default 3): better ratio, slower.
    Zstd,
}

impl Algorithm {
    /// Every algorithm, in the order `--help` lists them.
    pub const ALL: [Algorithm; 3] = [Algorithm::Lz4, Algorithm::Lz4hc, Algorithm::Zstd];

    /// The name used on the command line and in statistics (zram's `comp_algorithm` names).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Lz4 => "lz4",
            Algorithm::Lz4hc => "lz4hc",
            Algorithm::Zstd => "zstd",
        }
    }

    /// Checks that `level` means something for this algorithm.
    pub fn check_level(self, level: Option<i32>) -> Result<(), StoreError> {
        match (self, level) {
            (_, None) => Ok(()),
            (Algorithm::Lz4, Some(a)) if (1..=65537).contains(&a) => Ok(()),
            (Algorithm::Lz4, Some(a)) => Err(StoreError::Config(format!("lz4 acceleration {a} is outside 1..=65537"))),
            (Algorithm::Lz4hc, Some(l)) if (1..=12).contains(&l) => Ok(()),
            (Algorithm::Lz4hc, Some(l)) => Err(StoreError::Config(format!("lz4hc level {l} is outside 1..=12"))),
            (Algorithm::Zstd, Some(l)) if (1..=22).contains(&l) || (-7..=-1).contains(&l) => Ok(()),
            (Algorithm::Zstd, Some(l)) => Err(StoreError::Config(format!("zstd level {l} is outside -7..=-1 and 1..=22"))),
        }
    }

    /// Builds the shared backend for this algorithm.
    pub fn backend(self, level: Option<i32>) -> Box<dyn Backend> {
        match self {
            Algorithm::Lz4 => Box::new(lz4::Lz4::new(level)),
            Algorithm::Lz4hc => Box::new(lz4::Lz4hc::new(level)),
            Algorithm::Zstd => Box::new(zstd::Zstd::new(level)),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "lz4" => Ok(Algorithm::Lz4),
            "lz4hc" => Ok(Algorithm::Lz4hc),
            "zstd" => Ok(Algorithm::Zstd),
            other => Err(format!("unknown compression algorithm '{other}' (choose lz4, lz4hc or zstd)")),
        }
    }
}

/// How a stored payload is encoded, as its slot records it (4 bits, `slot.rs`): with the
/// store's own algorithm ([`Codec::PRIMARY`], what every write uses), with the recompression
/// codec (zstd at the recompression level, [`Codec::STRONG`]), or with that codec and one of
/// [`Codec::DICT_VERSIONS`] dictionary versions (`compress/dict.rs`). Raw and same-filled
/// pages are slot kinds of their own and have no codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Codec(u8);

impl Codec {
    pub const PRIMARY: Codec = Codec(0);
    pub const STRONG: Codec = Codec(1);
    /// Dictionary versions that can be in use at once.
    pub const DICT_VERSIONS: usize = 14;
    /// Every codec value.
    pub const COUNT: usize = 2 + Codec::DICT_VERSIONS;

    /// The recompression codec with the dictionary in table place `version`.
    pub fn with_dict(version: usize) -> Codec {
        assert!(version < Codec::DICT_VERSIONS, "dictionary place {version} out of range");
        Codec(2 + version as u8)
    }

    /// The dictionary's table place, for a dictionary codec.
    pub fn dict(self) -> Option<usize> {
        (self.0 >= 2).then(|| (self.0 - 2) as usize)
    }

    /// The 4 bits a slot keeps.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// The codec from a slot's 4 bits.
    pub fn from_bits(bits: u8) -> Codec {
        Codec(bits & 0xf)
    }

    /// An index for per-codec tables (`0..COUNT`).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Immutable, shared compressor parameters. One per store.
pub trait Backend: Send + Sync {
    /// The algorithm's name.
    fn name(&self) -> &'static str;
    /// A fresh per-worker context. Called once per worker, never on the I/O path.
    fn new_context(&self) -> Box<dyn BackendContext>;
}

/// Per-worker compression state. A context is used by one thread at a time (`&mut self`);
/// it may keep scratch memory between calls so that the I/O path does not allocate.
pub trait BackendContext: Send {
    /// Compresses `src` into `dst`. Returns the compressed length, or `None` when the result
    /// does not fit in `dst` (the caller then stores the page raw). `dst` is at least
    /// [`MAX_COMPRESSED_BYTES`] long when the caller wants every result.
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize>;
    /// Decompresses `src`, which must yield exactly `dst.len()` bytes. Any other outcome is
    /// an error message (the store turns it into [`StoreError::Corrupt`]).
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), String>;
}

/// Decodes `src`, encoded by `codec`, into `out` (which it must fill exactly): the store's own
/// algorithm through the worker's `primary` context, the recompression codecs through its
/// `strong` decoder with `dict` (which a dictionary codec needs: the reader took it under the
/// slot lock). Any failure is a message for [`StoreError::Corrupt`]: never wrong data.
pub(crate) fn decode(
    primary: &mut dyn BackendContext,
    strong: Option<&mut strong::StrongDecoder>,
    codec: Codec,
    dict: Option<&dict::Dict>,
    src: &[u8],
    out: &mut [u8],
) -> Result<(), String> {
    if codec == Codec::PRIMARY {
        return primary.decompress(src, out);
    }
    let Some(strong) = strong else {
        return Err(format!("the page is encoded by codec {} and this store does not recompress", codec.bits()));
    };
    match (codec.dict(), dict) {
        (None, _) => strong.decompress(src, out, None),
        (Some(_), Some(d)) => strong.decompress(src, out, Some(&d.ddict)),
        (Some(place), None) => Err(format!("the page needs dictionary place {place}, which holds none")),
    }
}

/// Pages whose decoding, between them, touches every part of a zstd decoding context a page
/// ever can: libzstd allocates a context untouched, and a decode touches only what its frame
/// needs (the literal buffer up to the frame's literals, the entropy tables of its block
/// types). A context that decoded these once does not fault later (on the I/O path, where a
/// fault can wait on the swap-out the server is serving). Made once per context, never on
/// the I/O path.
pub(crate) fn warm_pages() -> Vec<Vec<u8>> {
    let mut n = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        n ^= n << 13;
        n ^= n >> 7;
        n ^= n << 17;
        n
    };
    vec![
        // Literals only, Huffman-coded (16 symbols, no repeats): the largest literal section.
        (0..crate::PAGE_SIZE).map(|_| b"abcdefghijklmnop"[(next() % 16) as usize]).collect(),
        // Random bytes: raw literals, a raw block.
        (0..crate::PAGE_SIZE).map(|_| next() as u8).collect(),
        // Many short matches: the most sequences, every FSE table.
        (0..crate::PAGE_SIZE).map(|i| if i % 7 < 4 { (next() % 4) as u8 } else { b"xyz"[i % 3] }).collect(),
        // Long repeats, then a run of one byte.
        (0..crate::PAGE_SIZE).map(|i| if i < 2048 { (i % 251) as u8 } else { 0x55 }).collect(),
    ]
}

/// Room for the worst-case expansion of one page by any backend.
pub const MAX_COMPRESSED_BYTES: usize = crate::PAGE_SIZE * 2;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PAGE_SIZE;

    fn sample_pages() -> Vec<Vec<u8>> {
        let mut text = Vec::new();
        while text.len() < PAGE_SIZE {
            text.extend_from_slice(b"compcache keeps swapped pages compressed in RAM. ");
        }
        text.truncate(PAGE_SIZE);
        let noise = crate::testing::noise(0x9E37_79B9_7F4A_7C15, PAGE_SIZE);
        vec![vec![0u8; PAGE_SIZE], text, noise]
    }

    /// One test body over every backend, as foyer does for its engines.
    #[test]
    fn every_backend_round_trips_pages() {
        for alg in Algorithm::ALL {
            for level in [None, Some(1), Some(9), Some(12)] {
                let backend = alg.backend(level);
                let mut ctx = backend.new_context();
                for page in sample_pages() {
                    let mut c = vec![0u8; MAX_COMPRESSED_BYTES];
                    let n = ctx.compress(&page, &mut c).expect("fits in the worst-case buffer");
                    let mut out = vec![0u8; PAGE_SIZE];
                    ctx.decompress(&c[..n], &mut out).unwrap();
                    assert_eq!(out, page, "{alg} level {level:?}");
                }
            }
        }
    }

    /// The levels mean what they mean to zram: lz4's is an acceleration (higher: larger
    /// output), lz4hc's a level (higher: smaller output), and lz4hc output is lz4 format.
    #[test]
    fn levels_mean_what_they_mean_to_zram() {
        let mut page = Vec::new();
        let mut n = 7u64;
        while page.len() < PAGE_SIZE {
            n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            page.extend_from_slice(format!("key{} = value {}; ", n >> 58, (n >> 40) % 1000).as_bytes());
        }
        page.truncate(PAGE_SIZE);
        let size = |alg: Algorithm, level: Option<i32>| {
            let mut c = vec![0u8; MAX_COMPRESSED_BYTES];
            alg.backend(level).new_context().compress(&page, &mut c).unwrap()
        };
        let (lz4, fast, hc) = (size(Algorithm::Lz4, None), size(Algorithm::Lz4, Some(64)), size(Algorithm::Lz4hc, Some(12)));
        assert!(fast > lz4 && hc < lz4, "lz4 {lz4}, acceleration 64 {fast}, lz4hc 12 {hc}");
        let mut c = vec![0u8; MAX_COMPRESSED_BYTES];
        let n = Algorithm::Lz4hc.backend(None).new_context().compress(&page, &mut c).unwrap();
        let mut out = vec![0u8; PAGE_SIZE];
        Algorithm::Lz4.backend(None).new_context().decompress(&c[..n], &mut out).unwrap();
        assert_eq!(out, page);
    }

    #[test]
    fn corrupt_input_is_an_error_not_data() {
        for alg in Algorithm::ALL {
            let mut ctx = alg.backend(None).new_context();
            let mut out = vec![0u8; PAGE_SIZE];
            assert!(ctx.decompress(&[0xff, 0x13, 0x00, 0x42, 0x17], &mut out).is_err(), "{alg}");
            let page = sample_pages().remove(1);
            let mut c = vec![0u8; MAX_COMPRESSED_BYTES];
            let n = ctx.compress(&page, &mut c).unwrap();
            assert!(ctx.decompress(&c[..n / 2], &mut out).is_err(), "{alg}: truncated input");
        }
    }

    #[test]
    fn names_parse_back() {
        for alg in Algorithm::ALL {
            assert_eq!(alg.name().parse::<Algorithm>().unwrap(), alg);
        }
        assert!("lzo".parse::<Algorithm>().unwrap_err().contains("lz4, lz4hc or zstd"));
        assert!(Algorithm::Lz4hc.check_level(Some(13)).is_err() && Algorithm::Lz4.check_level(Some(0)).is_err());
        assert!(Algorithm::Zstd.check_level(Some(30)).is_err());
    }
}
