//! The per-worker context: a compression context and scratch buffers, one per thread, so that
//! the I/O path takes no lock for compression and allocates nothing. It sits below every tier
//! that borrows its buffers (the RAM layer, the backing tier's reads, cache mode's origin I/O,
//! recompression) and knows none of them: the store tells it the sizes.

use std::sync::Arc;

use crate::buf::{resident_bytes, AlignedBuf, ReadBuf};
use crate::compress::strong::StrongDecoder;
use crate::compress::{BackendContext, MAX_COMPRESSED_BYTES};
use crate::latency::ThreadLatency;
use crate::PAGE_SIZE;

/// Per-worker scratch: a compression context and buffers, so that the I/O path takes no lock
/// for compression and does not allocate. Not shared: one per thread.
pub struct Context {
    pub(crate) comp: Box<dyn BackendContext>,
    /// Decodes pages recompression re-encoded (`compress/strong.rs`); only in a store with
    /// recompression (made resident with the context, which takes a few milliseconds).
    pub(crate) strong: Option<StrongDecoder>,
    pub(crate) cbuf: Box<[u8]>,
    pub(crate) page: Box<[u8]>,
    /// A backing record being written: header, then payload; also where a page promoted
    /// from the cold tier is compressed (`policy::maybe_promote`).
    pub(crate) rec: Box<[u8]>,
    /// Reads from the backing device: a single record, or a run of records (up to
    /// `MAX_RUN_BYTES`), in the aligned blocks an O_DIRECT read covers. Made resident at its
    /// full size when the store has a backing device (about 1 MiB), empty otherwise.
    pub(crate) read: ReadBuf,
    /// Cache mode: origin reads and writes, aligned for O_DIRECT (`Cache::io_buf_bytes`);
    /// empty otherwise.
    pub(crate) origin: AlignedBuf,
    /// This context's request latency histograms, registered with the store (`latency.rs`).
    pub(crate) lat: Arc<ThreadLatency>,
}

impl Context {
    /// A context around `comp`, its buffers resident when it is made (written once), so that
    /// their first use in a request does not fault: a strong decoder if `strong` (a store with
    /// recompression), a record buffer of `rec_bytes`, room for device reads of `read_bytes`
    /// (a store with a backing device) and an origin buffer of `origin_bytes` (cache mode).
    pub(crate) fn new(
        comp: Box<dyn BackendContext>,
        strong: bool,
        rec_bytes: usize,
        read_bytes: Option<usize>,
        origin_bytes: Option<usize>,
        lat: Arc<ThreadLatency>,
    ) -> Context {
        Context {
            comp,
            strong: strong.then(StrongDecoder::new),
            cbuf: resident_bytes(MAX_COMPRESSED_BYTES).into_boxed_slice(),
            page: resident_bytes(PAGE_SIZE).into_boxed_slice(),
            rec: resident_bytes(rec_bytes).into_boxed_slice(),
            read: read_bytes.map_or_else(ReadBuf::empty, ReadBuf::new),
            origin: origin_bytes.map_or_else(AlignedBuf::empty, AlignedBuf::new),
            lat,
        }
    }
}
