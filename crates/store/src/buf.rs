//! Buffers made resident when they are made, so that the I/O path that uses them neither
//! allocates nor faults: the bottom floor, below everything that keeps one (the per-worker
//! `Context`, the backing tier's batch writer, the origin device).

/// O_DIRECT alignment of offsets, lengths and buffers.
const ALIGN: usize = 4096;

/// A buffer of `bytes` whose every page has been written, so that it is resident now (under
/// the swap servers' `mlockall`, for good). Freshly allocated memory may be untouched zero
/// pages that the first use would fault in; where that first use holds a slot lock or serves a
/// request, the fault could wait in reclaim (docs/swap.md, "Memory pressure"). The fill is not
/// zero so that it cannot become a `calloc`.
pub(crate) fn resident_bytes(bytes: usize) -> Vec<u8> {
    let mut v = vec![0xa5u8; bytes];
    std::hint::black_box(&mut v);
    v
}

/// Scratch memory for device reads, so that a request's read allocates nothing: one per
/// worker (the store's `Context` keeps it), made once with room for the largest read the
/// worker issues. An O_DIRECT read fills the aligned blocks around the bytes asked for and
/// returns those bytes as a slice of it (no second copy); other reads use its start.
pub struct ReadBuf {
    /// Room for `max_bytes` read at any offset: the aligned span around them (at most
    /// `max_bytes` rounded up plus one block) and up to one block to reach alignment.
    pub(crate) mem: Box<[u8]>,
}

impl ReadBuf {
    /// Room for a read of up to `max_bytes` at any offset, every page of it written once so
    /// that it is resident now: freshly allocated memory may be untouched zero pages, which
    /// the first read would fault in (in the I/O path, where a fault may wait in reclaim).
    pub fn new(max_bytes: usize) -> ReadBuf {
        ReadBuf { mem: resident_bytes(Self::mem_bytes(max_bytes)).into_boxed_slice() }
    }

    /// No room: for a store without a backing device (grows on first use if ever used).
    pub fn empty() -> ReadBuf {
        ReadBuf { mem: Box::default() }
    }

    /// The largest read it serves without allocating.
    pub fn max_bytes(&self) -> usize {
        (self.mem.len() / ALIGN).saturating_sub(2) * ALIGN
    }

    fn mem_bytes(max_bytes: usize) -> usize {
        max_bytes.div_ceil(ALIGN) * ALIGN + 2 * ALIGN
    }

    /// Makes room for `len` bytes: allocates only when the owner sized it too small (which a
    /// fault-free caller must not do).
    pub(crate) fn ensure(&mut self, len: usize) {
        if len > self.max_bytes() {
            *self = ReadBuf { mem: vec![0u8; Self::mem_bytes(len)].into_boxed_slice() };
        }
    }

    /// `n` bytes at the first aligned address; `n <= max_bytes() + ALIGN`.
    pub(crate) fn aligned(&mut self, n: usize) -> &mut [u8] {
        let shift = self.mem.as_ptr().align_offset(ALIGN);
        &mut self.mem[shift..shift + n]
    }
}

/// Scratch memory aligned for O_DIRECT: a worker's origin buffer (the store's `Context` keeps
/// one in cache mode), resident when made, so that a request's origin I/O allocates nothing.
pub struct AlignedBuf {
    mem: Box<[u8]>,
}

impl AlignedBuf {
    /// Room for `bytes` (rounded up to whole pages) at an aligned address.
    pub fn new(bytes: usize) -> AlignedBuf {
        AlignedBuf { mem: resident_bytes(bytes.div_ceil(ALIGN) * ALIGN + ALIGN).into_boxed_slice() }
    }

    /// None: a store without an origin.
    pub fn empty() -> AlignedBuf {
        AlignedBuf { mem: Box::default() }
    }

    /// The bytes it holds at an aligned address.
    pub fn capacity(&self) -> usize {
        self.mem.len().saturating_sub(ALIGN)
    }

    /// The first `n` aligned bytes; `n <= capacity()`.
    pub fn bytes_mut(&mut self, n: usize) -> &mut [u8] {
        let shift = self.mem.as_ptr().align_offset(ALIGN);
        &mut self.mem[shift..shift + n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.bytes_mut(8192).as_ptr() as usize % ALIGN, 0);
        assert_eq!(AlignedBuf::empty().capacity(), 0);
    }
}
