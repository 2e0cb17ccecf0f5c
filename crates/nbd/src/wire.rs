//! NBD wire format: magic numbers, flags, option/command/reply codes, and the fixed-size
//! messages of the handshake and transmission phases. Values are the NBD protocol's
//! (`doc/proto.md` of the reference implementation); everything is big-endian on the wire.
//!
//! This module only encodes and decodes; it decides nothing. The handshake lives in
//! [`crate::handshake`], request validation and dispatch in [`crate::transmission`].

use std::io::{self, Read, Write};

// --- magic numbers
/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic, also prefixed to every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply (fixed newstyle).
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of every simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of every structured reply chunk (once `NBD_OPT_STRUCTURED_REPLY` is negotiated).
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// --- handshake flags (server, 16 bits)
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

// --- client flags (32 bits)
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// --- transmission flags (16 bits)
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// --- options
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// --- option replies
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR + 1;
pub const REP_ERR_POLICY: u32 = REP_ERR + 2;
pub const REP_ERR_INVALID: u32 = REP_ERR + 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERR + 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR + 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR + 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR + 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERR + 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR + 9;

// --- information types (NBD_OPT_INFO / NBD_OPT_GO)
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// --- commands
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// --- command flags
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// --- structured reply chunks: flags and types
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// --- block status flags of the `base:allocation` context
/// The extent is not allocated: writing to it may allocate (and fail with ENOSPC).
pub const STATE_HOLE: u32 = 1 << 0;
/// The extent reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

// --- error values of the reply (the protocol's, which happen to be Linux errno values)
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Maps an errno from the store (or the OS) onto the protocol's restricted set of error
/// values. The spec asks clients to treat unknown values as EINVAL, so anything unmapped is
/// sent as EIO, the honest "the server failed" answer.
pub fn nbd_error(errno: i32) -> u32 {
    match errno {
        libc::EPERM => EPERM,
        libc::EIO => EIO,
        libc::ENOMEM => ENOMEM,
        libc::EINVAL => EINVAL,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::ENOTSUP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

/// The size of a transmission request header on the wire.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// The size of a simple reply header on the wire.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// The size of a structured reply chunk header on the wire (its payload follows).
pub const CHUNK_HEADER_BYTES: usize = 20;

/// The names of commands, for log lines and error messages.
pub fn command_name(cmd: u16) -> &'static str {
    match cmd {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown command",
    }
}

/// The names of options, for log lines.
pub fn option_name(opt: u32) -> &'static str {
    match opt {
        OPT_EXPORT_NAME => "EXPORT_NAME",
        OPT_ABORT => "ABORT",
        OPT_LIST => "LIST",
        OPT_STARTTLS => "STARTTLS",
        OPT_INFO => "INFO",
        OPT_GO => "GO",
        OPT_STRUCTURED_REPLY => "STRUCTURED_REPLY",
        OPT_LIST_META_CONTEXT => "LIST_META_CONTEXT",
        OPT_SET_META_CONTEXT => "SET_META_CONTEXT",
        OPT_EXTENDED_HEADERS => "EXTENDED_HEADERS",
        _ => "unknown option",
    }
}

/// A transmission request header, decoded but not yet validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub cmd: u16,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    /// Decodes a header; `Err` carries the magic found when it is not [`REQUEST_MAGIC`].
    pub fn decode(b: &[u8; REQUEST_HEADER_BYTES]) -> Result<Request, u32> {
        let magic = be32(&b[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(magic);
        }
        Ok(Request { flags: be16(&b[4..6]), cmd: be16(&b[6..8]), handle: be64(&b[8..16]), offset: be64(&b[16..24]), len: be32(&b[24..28]) })
    }

    /// Encodes a header (used by the client half in tests and tools).
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.cmd.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// Encodes a simple reply header.
pub fn simple_reply(error: u32, handle: u64) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut b = [0u8; SIMPLE_REPLY_BYTES];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// Encodes a structured reply chunk header for a payload of `payload_bytes`.
pub fn chunk_header(flags: u16, kind: u16, handle: u64, payload_bytes: u32) -> [u8; CHUNK_HEADER_BYTES] {
    let mut b = [0u8; CHUNK_HEADER_BYTES];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&payload_bytes.to_be_bytes());
    b
}

/// Writes one option reply: header then `data`.
pub fn write_option_reply(w: &mut impl Write, opt: u32, reply: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&reply.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
pub fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
pub fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

pub fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trips() {
        let r = Request { flags: CMD_FLAG_FUA, cmd: CMD_WRITE, handle: 0xdead_beef_0102_0304, offset: 1 << 40, len: 4096 };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn bad_request_magic_is_reported() {
        let mut b = Request { flags: 0, cmd: 0, handle: 1, offset: 0, len: 1 }.encode();
        b[0] = 0xff;
        assert_eq!(Request::decode(&b), Err(0xff60_9513));
    }

    #[test]
    fn store_errnos_map_to_protocol_errors() {
        assert_eq!(nbd_error(libc::ENOSPC), ENOSPC);
        assert_eq!(nbd_error(libc::EDQUOT), ENOSPC);
        assert_eq!(nbd_error(libc::EINVAL), EINVAL);
        assert_eq!(nbd_error(libc::EIO), EIO);
        assert_eq!(nbd_error(libc::ENOENT), EIO, "unmapped errnos are sent as EIO");
    }

    #[test]
    fn option_reply_layout() {
        let mut v = Vec::new();
        write_option_reply(&mut v, OPT_GO, REP_ACK, &[]).unwrap();
        assert_eq!(v.len(), 20);
        assert_eq!(be64(&v[0..8]), OPTION_REPLY_MAGIC);
        assert_eq!(be32(&v[8..12]), OPT_GO);
        assert_eq!(be32(&v[12..16]), REP_ACK);
        assert_eq!(be32(&v[16..20]), 0);
    }
}
