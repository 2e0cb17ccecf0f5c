//! LZ4 backends: the reference liblz4 (through the `lz4` crate), the same codec and default
//! acceleration as the kernel's zram lz4, so compressed sizes line up with zram's; and lz4hc,
//! its high-compression mode (zram's `lz4hc`). Both decode with liblz4's bounds-checked
//! `LZ4_decompress_safe`: malformed input is an error, never an overrun.
//!
//! The level means what it means to zram (`algorithm_params level=N`, Linux 6.12+): lz4's
//! acceleration (1 the default, higher is faster and compresses less), lz4hc's compression
//! level (1..=12, default 9).
//!
//! lz4 keeps no state between calls (`LZ4_compress_fast` keeps its table on the stack). lz4hc's
//! one-call API allocates its 256 KiB state on every call (liblz4's `LZ4HC_HEAPMODE`), which
//! the I/O path must not do; each context owns one state instead, made (and touched) with the
//! context, and compresses with `LZ4_compress_HC_extStateHC`.

use std::ffi::{c_char, c_int, c_void};

use super::{Backend, BackendContext};

/// The default lz4 acceleration (liblz4's and zram's).
pub const DEFAULT_ACCELERATION: i32 = 1;
/// The default lz4hc level (liblz4's `LZ4HC_CLEVEL_DEFAULT`, zram's default).
pub const DEFAULT_HC_LEVEL: i32 = 9;

pub struct Lz4 {
    acceleration: i32,
}

impl Lz4 {
    pub fn new(level: Option<i32>) -> Lz4 {
        Lz4 { acceleration: level.unwrap_or(DEFAULT_ACCELERATION) }
    }
}

impl Backend for Lz4 {
    fn name(&self) -> &'static str {
        "lz4"
    }
    fn new_context(&self) -> Box<dyn BackendContext> {
        Box::new(Lz4Context { acceleration: self.acceleration })
    }
}

struct Lz4Context {
    acceleration: i32,
}

impl BackendContext for Lz4Context {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let mode = (self.acceleration != DEFAULT_ACCELERATION).then_some(lz4::block::CompressionMode::FAST(self.acceleration));
        lz4::block::compress_to_buffer(src, mode, false, dst).ok()
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        decompress(src, dst)
    }
}

fn decompress(src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    let want = i32::try_from(dst.len()).map_err(|_| "page too large for lz4".to_string())?;
    match lz4::block::decompress_to_buffer(src, Some(want), dst) {
        Ok(n) if n == dst.len() => Ok(()),
        Ok(n) => Err(format!("lz4 produced {n} bytes, expected {}", dst.len())),
        Err(e) => Err(format!("lz4: {e}")),
    }
}

// liblz4's lz4hc functions that take the caller's state; the `lz4-sys` crate links liblz4
// (lz4hc.c included) but declares only the allocating `LZ4_compress_HC`.
extern "C" {
    fn LZ4_sizeofStateHC() -> c_int;
    fn LZ4_compress_HC_extStateHC(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        level: c_int,
    ) -> c_int;
}

pub struct Lz4hc {
    level: i32,
}

impl Lz4hc {
    pub fn new(level: Option<i32>) -> Lz4hc {
        Lz4hc { level: level.unwrap_or(DEFAULT_HC_LEVEL) }
    }
}

impl Backend for Lz4hc {
    fn name(&self) -> &'static str {
        "lz4hc"
    }
    fn new_context(&self) -> Box<dyn BackendContext> {
        // SAFETY: LZ4_sizeofStateHC has no preconditions.
        let bytes = unsafe { LZ4_sizeofStateHC() } as usize;
        // u64 words: the state wants 8-byte alignment. Written (zeroed) now, so it is resident.
        let state = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
        Box::new(Lz4hcContext { level: self.level, state })
    }
}

struct Lz4hcContext {
    level: i32,
    state: Box<[u64]>,
}

impl BackendContext for Lz4hcContext {
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let (src_len, dst_len) = (c_int::try_from(src.len()).ok()?, c_int::try_from(dst.len()).ok()?);
        // SAFETY: `state` is LZ4_sizeofStateHC() bytes, 8-byte aligned, owned by this context
        // and used by one thread at a time (`&mut self`); liblz4 initialises it on each call.
        // `src` and `dst` are valid for the lengths given, and liblz4 writes at most
        // `dst_len` bytes (it returns 0 when the result does not fit).
        let n = unsafe {
            LZ4_compress_HC_extStateHC(
                self.state.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src_len,
                dst_len,
                self.level,
            )
        };
        (n > 0).then_some(n as usize)
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        decompress(src, dst)
    }
}
