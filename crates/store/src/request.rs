//! One block request as a front end that decodes its own protocol hands it to the store
//! (ublk's descriptors, FUSE's read/write/fallocate/fsync; the NBD front end executes its own
//! commands, which carry more): the operation, its range and its data, and [`execute`], one
//! store call per operation. Validation (alignment, the device's end, buffer sizes) is the
//! front end's, before a [`Request`] exists: each protocol has its own rules for a request
//! that reaches past the end.

use crate::context::Context;
use crate::store::Store;

/// What was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// Every completed write is kept (`Store::flush`).
    Flush,
    /// Free the range (whole pages; partial ones are left as they are, as zram does).
    Discard,
    /// Make the range read as zeros.
    WriteZeroes,
}

/// A request the front end has validated: inside the device, and for reads and writes no
/// larger than the buffer it will pass as [`Io`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    /// Byte offset in the device.
    pub offset: u64,
    /// Length in bytes (0 for a flush).
    pub len: u64,
}

/// The data a request carries: where a read's bytes go, where a write's come from.
pub enum Io<'a> {
    None,
    Out(&'a mut [u8]),
    In(&'a [u8]),
}

/// Carries out a validated request: one store call. Returns the bytes read or written (0 for
/// the others) or a positive errno. `io` must be `Out` for a read and `In` for a write, of at
/// least `req.len` bytes; anything else is a defect in the caller, refused with EINVAL before
/// the store is touched.
pub fn execute(store: &Store, ctx: &mut Context, req: &Request, io: Io<'_>) -> Result<usize, i32> {
    let len = req.len as usize;
    let done = match (req.op, io) {
        (Op::Read, Io::Out(buf)) if buf.len() >= len => store.read(ctx, req.offset, &mut buf[..len]),
        (Op::Write, Io::In(data)) if data.len() >= len => store.write(ctx, req.offset, &data[..len]),
        (Op::Flush, _) => store.flush(),
        (Op::Discard, _) => store.discard(req.offset, req.len),
        (Op::WriteZeroes, _) => store.write_zeroes(ctx, req.offset, req.len),
        (Op::Read | Op::Write, _) => return Err(libc::EINVAL),
    };
    match done {
        Ok(()) if matches!(req.op, Op::Read | Op::Write) => Ok(len),
        Ok(()) => Ok(0),
        Err(e) => Err(e.errno()),
    }
}
