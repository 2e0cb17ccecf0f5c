//! Zstandard backend. The level is the shared parameter; each context owns a compression and a
//! decompression context (libzstd's CCtx/DCtx), created once per worker. Frames carry no
//! checksum and no content size: the store knows both, and the bytes matter at 4 KiB.

use super::{Backend, BackendContext};
use zstd::zstd_safe::{CParameter, DParameter};

pub struct Zstd {
    level: i32,
}

impl Zstd {
    pub fn new(level: Option<i32>) -> Zstd {
        Zstd { level: level.unwrap_or(zstd::DEFAULT_COMPRESSION_LEVEL) }
    }
}

impl Backend for Zstd {
    fn name(&self) -> &'static str {
        "zstd"
    }
    fn new_context(&self) -> Box<dyn BackendContext> {
        let mut c = zstd::bulk::Compressor::new(self.level).expect("zstd level was validated");
        // Failures here only lose a few bytes of frame overhead saving; they cannot corrupt data.
        let _ = c.set_parameter(CParameter::ChecksumFlag(false));
        let _ = c.set_parameter(CParameter::ContentSizeFlag(false));
        let _ = c.set_parameter(CParameter::DictIdFlag(false));
        let mut d = zstd::bulk::Decompressor::new().expect("zstd decompression context");
        let _ = d.set_parameter(DParameter::WindowLogMax(27));
        let mut ctx = ZstdContext { c, d };
        // Both contexts resident now: the I/O path must not fault (`super::warm_pages`).
        let (mut buf, mut out) = (vec![0u8; super::MAX_COMPRESSED_BYTES], vec![0u8; crate::PAGE_SIZE]);
        for p in super::warm_pages() {
            if let Some(n) = ctx.compress(&p, &mut buf) {
                let _ = ctx.decompress(&buf[..n], &mut out);
            }
        }
        Box::new(ctx)
    }
}

struct ZstdContext {
    c: zstd::bulk::Compressor<'static>,
    d: zstd::bulk::Decompressor<'static>,
}

impl BackendContext for ZstdContext {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        self.c.compress_to_buffer(src, dst).ok()
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        match self.d.decompress_to_buffer(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(format!("zstd produced {n} bytes, expected {}", dst.len())),
            Err(e) => Err(format!("zstd: {e}")),
        }
    }
}
