//! LZ4 backend: the reference liblz4 (through the `lz4` crate), the same codec and default
//! acceleration as the kernel's zram lz4, so compressed sizes line up with zram's. LZ4 keeps no
//! state between calls, so the context is empty. Decompression is liblz4's bounds-checked
//! `LZ4_decompress_safe`: malformed input is an error, never an overrun.

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
        lz4::block::compress_to_buffer(src, None, false, dst).ok()
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        let want = i32::try_from(dst.len()).map_err(|_| "page too large for lz4".to_string())?;
        match lz4::block::decompress_to_buffer(src, Some(want), dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(format!("lz4 produced {n} bytes, expected {}", dst.len())),
            Err(e) => Err(format!("lz4: {e}")),
        }
    }
}
