//! Structured replies (`NBD_OPT_STRUCTURED_REPLY`): the headers of the chunks compcache
//! sends, and error chunks. Encoding only, into fixed-size arrays: nothing here allocates, so
//! the I/O path stays allocation-free with structured replies (transmission.rs rule 5).
//!
//! What compcache sends once structured replies are negotiated:
//! - `READ`: one `OFFSET_DATA` chunk with `DONE`, the whole range (so `NBD_CMD_FLAG_DF` is
//!   honoured by construction and `NBD_FLAG_SEND_DF` is advertised). Its header is written in
//!   front of the data in the worker's buffer: header and data leave in one write.
//! - `BLOCK_STATUS`: one `BLOCK_STATUS` chunk with `DONE` for the one context, built the same
//!   way in the worker's buffer.
//! - every error, of any command, including a request refused by validation: one `ERROR`
//!   chunk with `DONE`, carrying the error and a message (the spec: a READ must never get a
//!   simple reply then, and errors SHOULD be structured so that a person sees why).
//! - successes of the other commands: a simple reply, as the spec allows (no payload).

use crate::wire::*;
use std::fmt::{self, Write as _};

/// Room kept in front of the data in a worker's buffer for the reply header written there:
/// the largest is a READ's `OFFSET_DATA` chunk (20-byte chunk header + 8-byte offset); 32 keeps
/// the data 8-byte aligned.
pub const HEADROOM: usize = 32;

/// The header of a READ's single `OFFSET_DATA` chunk: chunk header, then the offset; `data_len`
/// bytes of data follow.
pub fn offset_data_header(handle: u64, offset: u64, data_len: u32) -> [u8; CHUNK_HEADER_BYTES + 8] {
    let mut b = [0u8; CHUNK_HEADER_BYTES + 8];
    b[..CHUNK_HEADER_BYTES].copy_from_slice(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, handle, 8 + data_len));
    b[CHUNK_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// The header of a `BLOCK_STATUS` chunk: chunk header, then the context id;
/// `descriptor_bytes` of descriptors follow.
pub fn block_status_header(handle: u64, context_id: u32, descriptor_bytes: u32) -> [u8; CHUNK_HEADER_BYTES + 4] {
    let mut b = [0u8; CHUNK_HEADER_BYTES + 4];
    b[..CHUNK_HEADER_BYTES].copy_from_slice(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, handle, 4 + descriptor_bytes));
    b[CHUNK_HEADER_BYTES..].copy_from_slice(&context_id.to_be_bytes());
    b
}

/// The longest message an error chunk carries (cut at a character boundary); the server's log
/// line has the whole of it.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 256;
const ERROR_CHUNK_MAX_BYTES: usize = CHUNK_HEADER_BYTES + 6 + MAX_ERROR_MESSAGE_BYTES;

/// An `ERROR` chunk with `DONE`: the error value and a message, formatted on the stack.
pub struct ErrorChunk {
    bytes: [u8; ERROR_CHUNK_MAX_BYTES],
    len: usize,
}

impl ErrorChunk {
    /// The final error chunk for request `handle`: `error` (non-zero) and `message`.
    pub fn new(handle: u64, error: u32, message: impl fmt::Display) -> ErrorChunk {
        debug_assert!(error != 0, "an error chunk carries a non-zero error");
        let mut bytes = [0u8; ERROR_CHUNK_MAX_BYTES];
        let msg_at = CHUNK_HEADER_BYTES + 6;
        let mut w = Truncating { buf: &mut bytes[msg_at..], len: 0 };
        let _ = write!(w, "{message}");
        let msg_len = w.len;
        let payload = 6 + msg_len;
        bytes[..CHUNK_HEADER_BYTES].copy_from_slice(&chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, payload as u32));
        bytes[CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + 4].copy_from_slice(&error.to_be_bytes());
        bytes[CHUNK_HEADER_BYTES + 4..msg_at].copy_from_slice(&(msg_len as u16).to_be_bytes());
        ErrorChunk { bytes, len: CHUNK_HEADER_BYTES + payload }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// A `fmt::Write` into a fixed buffer that keeps what fits, whole characters only (the
/// protocol's strings are UTF-8).
struct Truncating<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl fmt::Write for Truncating<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            Err(fmt::Error)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_data_and_block_status_headers() {
        let h = offset_data_header(0x1122, 1 << 40, 4096);
        assert_eq!(be32(&h[0..4]), STRUCTURED_REPLY_MAGIC);
        assert_eq!((be16(&h[4..6]), be16(&h[6..8])), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
        assert_eq!(be64(&h[8..16]), 0x1122);
        assert_eq!(be32(&h[16..20]), 8 + 4096, "the length covers the offset and the data");
        assert_eq!(be64(&h[20..28]), 1 << 40);
        assert!(h.len() <= HEADROOM);

        let b = block_status_header(7, 3, 16);
        assert_eq!((be16(&b[4..6]), be16(&b[6..8])), (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS));
        assert_eq!(be32(&b[16..20]), 4 + 16);
        assert_eq!(be32(&b[20..24]), 3);
    }

    #[test]
    fn error_chunks_carry_the_error_and_a_bounded_message() {
        let c = ErrorChunk::new(9, EINVAL, format_args!("flags {:#x} are not valid", 4));
        let b = c.as_bytes();
        assert_eq!((be16(&b[4..6]), be16(&b[6..8])), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR));
        assert_eq!(be64(&b[8..16]), 9);
        assert_eq!(be32(&b[16..20]) as usize, b.len() - CHUNK_HEADER_BYTES);
        assert_eq!(be32(&b[20..24]), EINVAL);
        assert_eq!(be16(&b[24..26]) as usize, b.len() - 26);
        assert_eq!(&b[26..], b"flags 0x4 are not valid");

        // A long message is cut, at a character boundary.
        let long = "é".repeat(MAX_ERROR_MESSAGE_BYTES);
        let c = ErrorChunk::new(1, EIO, &long);
        let msg = &c.as_bytes()[26..];
        assert_eq!(msg.len(), MAX_ERROR_MESSAGE_BYTES);
        assert!(std::str::from_utf8(msg).is_ok());
        let odd = format!("x{long}");
        let msg_len = ErrorChunk::new(1, EIO, &odd).as_bytes().len() - 26;
        assert_eq!(msg_len, MAX_ERROR_MESSAGE_BYTES - 1, "half a character is dropped");
    }
}
