//! A worker's request buffer: where a WRITE's payload is read into and a READ's or
//! BLOCK_STATUS's reply is assembled, header and data in one slice.
//!
//! Rules 4 and 5 of [`super`] rest on it: a reply with data leaves in one write, and a warm
//! worker allocates nothing for requests up to [`KEEP_BUFFER_BYTES`] (or up to the room it was
//! made with, `ServerOptions::request_buffer_bytes`).

use crate::reply::HEADROOM;

/// A worker's request buffer is kept for the next request up to this data size; a larger one
/// is freed after its request.
pub const KEEP_BUFFER_BYTES: usize = 1 << 20;

/// A worker's buffer for its current request: [`HEADROOM`] for a reply header, then the data
/// (a WRITE's payload coming in, a READ's data or BLOCK_STATUS's descriptors going out), so a
/// reply with data leaves in one write (rule 4). Reused from request to request (rule 5): it
/// grows to the largest request served and is freed after one above [`KEEP_BUFFER_BYTES`],
/// down to what it was made with.
#[derive(Default)]
pub(super) struct RequestBuffer {
    bytes: Vec<u8>,
    /// Bytes it was made with and keeps (`ServerOptions::request_buffer_bytes` plus the headroom).
    kept: usize,
}

impl RequestBuffer {
    /// A buffer with room for `data_bytes` of data, every page written once so that it is
    /// resident (fresh allocations can be untouched zero pages that fault on first use).
    pub(super) fn with_room(data_bytes: usize) -> RequestBuffer {
        let kept = if data_bytes == 0 { 0 } else { HEADROOM + data_bytes };
        RequestBuffer { bytes: vec![0x5a; kept], kept }
    }

    /// The data area for a request of `len` bytes. Its previous contents are left as they are
    /// (no zeroing on the hot path): a WRITE payload overwrites all of it before it is used,
    /// and only what the store filled of it is sent.
    pub(super) fn data(&mut self, len: usize) -> &mut [u8] {
        let end = HEADROOM + len;
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        &mut self.bytes[HEADROOM..end]
    }

    /// A reply: `header` (at most [`HEADROOM`] bytes) written just in front of the first `len`
    /// bytes of [`RequestBuffer::data`], and both as one slice.
    pub(super) fn reply(&mut self, header: &[u8], len: usize) -> &[u8] {
        let start = HEADROOM - header.len();
        self.bytes[start..HEADROOM].copy_from_slice(header);
        &self.bytes[start..HEADROOM + len]
    }

    /// Frees the buffer if the last request made it large (back to what it was made with).
    pub(super) fn trim(&mut self) {
        if self.bytes.len() > (HEADROOM + KEEP_BUFFER_BYTES).max(self.kept) {
            *self = RequestBuffer::with_room(self.kept.saturating_sub(HEADROOM));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply;
    use crate::wire::{simple_reply, SIMPLE_REPLY_BYTES};

    #[test]
    fn request_buffers_are_reused_and_bounded() {
        let mut b = RequestBuffer::default();
        b.data(4096).fill(7);
        let ptr = b.data(4096).as_ptr();
        b.trim();
        assert_eq!(b.data(100).as_ptr(), ptr, "a warm worker reuses its buffer");
        assert_eq!(b.data(100).len(), 100);
        assert_eq!(b.data(4096).as_ptr(), ptr, "a smaller request does not shrink it");
        let reply = b.reply(&simple_reply(0, 0x55), 3);
        assert_eq!(reply.len(), SIMPLE_REPLY_BYTES + 3);
        assert_eq!(reply[..SIMPLE_REPLY_BYTES], simple_reply(0, 0x55));
        assert_eq!(reply[SIMPLE_REPLY_BYTES..], [7, 7, 7], "header and data leave from one buffer");
        let header = reply::offset_data_header(0x55, 4096, 3);
        let reply = b.reply(&header, 3);
        assert_eq!((&reply[..header.len()], &reply[header.len()..]), (&header[..], &[7u8, 7, 7][..]), "a structured header too");
        assert_eq!(b.data(4096).as_ptr(), ptr, "writing headers moves no data");
        b.data(KEEP_BUFFER_BYTES);
        b.trim();
        assert_eq!(b.bytes.len(), HEADROOM + KEEP_BUFFER_BYTES, "up to the limit it is kept");
        b.data(KEEP_BUFFER_BYTES + 1);
        b.trim();
        assert_eq!(b.bytes.capacity(), 0, "above the limit it is freed");
    }

    #[test]
    fn a_preallocated_request_buffer_never_reallocates_within_its_room() {
        let room = 2 * KEEP_BUFFER_BYTES;
        let mut b = RequestBuffer::with_room(room);
        let ptr = b.data(1).as_ptr();
        for len in [4096, room, 1, room] {
            assert_eq!(b.data(len).as_ptr(), ptr, "a request within the room uses the buffer it was made with");
            b.trim();
        }
        assert_eq!(b.bytes.len(), HEADROOM + room, "trim keeps the room, even above KEEP_BUFFER_BYTES");
        b.data(room + 1);
        b.trim();
        assert_eq!(b.bytes.len(), HEADROOM + room, "after a larger request it is back to its room");
    }
}
