//! LZ4 backend (lz4_flex block format). LZ4 keeps no state between calls, so the context is empty.

use super::{Backend, BackendContext};

pub struct Lz4;

impl Backend for Lz4 {
    fn name(&self) -> &'static str {
        "lz4"
    }
    fn new_context(&self) -> Box<dyn BackendContext> {
        Box::new(Lz4Context)
    }
}

struct Lz4Context;

impl BackendContext for Lz4Context {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        lz4_flex::block::compress_into(src, dst).ok()
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        match lz4_flex::block::decompress_into(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(format!("lz4 produced {n} bytes, expected {}", dst.len())),
            Err(e) => Err(format!("lz4: {e}")),
        }
    }
}
