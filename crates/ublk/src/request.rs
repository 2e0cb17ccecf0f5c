//! One ublk request: decode and validate the I/O descriptor completely first, then hand it to
//! the store in one `match`, each arm one call. Results follow the ublk completion
//! convention: bytes transferred for READ and WRITE, 0 for the others, `-errno` on failure.
//!
//! FUA (`UBLK_IO_F_FUA`, which the kernel sets only on a device that declared it: a cache
//! device, `params`) on a WRITE, WRITE_ZEROES or DISCARD is that operation, then
//! `Store::flush` (the origin's fdatasync) before the request completes; a failed flush fails
//! the request.

use compcache_store::request::{self as store_request, Io};
pub use compcache_store::request::{Op, Request};
use compcache_store::{Context, Store, PAGE_SIZE};
use libublk::sys;

use crate::params::SECTOR_SHIFT;

/// A decoded request and whether it must be durable before it completes (FUA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    pub req: Request,
    /// Flush after the operation (the module docs); only ever set on a modifying operation.
    pub fua: bool,
}

/// Decodes one descriptor. `op_flags` is `ublksrv_io_desc.op_flags` (operation in the low 8
/// bits, `UBLK_IO_F_*` above), sectors are 512-byte units whatever the block size.
/// Errors are negative errno values, ready to complete the request with.
pub fn decode(op_flags: u32, start_sector: u64, nr_sectors: u32, dev_bytes: u64, io_buf_bytes: usize) -> Result<Decoded, i32> {
    let req = decode_request(op_flags, start_sector, nr_sectors, dev_bytes, io_buf_bytes)?;
    let modifies = matches!(req.op, Op::Write | Op::WriteZeroes | Op::Discard);
    Ok(Decoded { req, fua: modifies && op_flags & sys::UBLK_IO_F_FUA != 0 })
}

/// The operation and range of one descriptor, validated.
fn decode_request(op_flags: u32, start_sector: u64, nr_sectors: u32, dev_bytes: u64, io_buf_bytes: usize) -> Result<Request, i32> {
    let op = match op_flags & 0xff {
        sys::UBLK_IO_OP_READ => Op::Read,
        sys::UBLK_IO_OP_WRITE => Op::Write,
        sys::UBLK_IO_OP_FLUSH => Op::Flush,
        sys::UBLK_IO_OP_DISCARD => Op::Discard,
        sys::UBLK_IO_OP_WRITE_ZEROES => Op::WriteZeroes,
        _ => return Err(-libc::EOPNOTSUPP),
    };
    if op == Op::Flush {
        return Ok(Request { op, offset: 0, len: 0 });
    }
    let offset = start_sector.checked_shl(SECTOR_SHIFT).ok_or(-libc::EINVAL)?;
    if offset >> SECTOR_SHIFT != start_sector {
        return Err(-libc::EINVAL);
    }
    let len = u64::from(nr_sectors) << SECTOR_SHIFT;
    let page = PAGE_SIZE as u64;
    if offset % page != 0 || len % page != 0 {
        // The declared 4 KiB logical block size makes the block layer refuse these first.
        return Err(-libc::EINVAL);
    }
    match offset.checked_add(len) {
        Some(end) if end <= dev_bytes => {}
        _ => return Err(-libc::EIO),
    }
    if matches!(op, Op::Read | Op::Write) && len > io_buf_bytes as u64 {
        return Err(-libc::EINVAL);
    }
    Ok(Request { op, offset, len })
}

/// Carries out a validated request against the store, then with FUA a flush. `buf` is the
/// tag's I/O buffer: the kernel copies WRITE data into it before, and READ data out of it
/// after, this call.
pub fn execute(store: &Store, ctx: &mut Context, d: &Decoded, buf: &mut [u8]) -> i32 {
    let req = &d.req;
    let len = req.len as usize;
    let io = match req.op {
        Op::Read => Io::Out(&mut buf[..len]),
        Op::Write => Io::In(&buf[..len]),
        Op::Flush | Op::Discard | Op::WriteZeroes => Io::None,
    };
    let flush = Request { op: Op::Flush, offset: 0, len: 0 };
    let done = store_request::execute(store, ctx, req, io).and_then(|n| {
        if d.fua {
            store_request::execute(store, ctx, &flush, Io::None).map(|_| n)
        } else {
            Ok(n)
        }
    });
    match done {
        Ok(n) => n as i32,
        Err(errno) => -errno,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compcache_store::Config;

    const DEV: u64 = 1 << 20;
    const BUF: usize = 64 << 10;

    fn op(o: u32) -> u32 {
        o | sys::UBLK_IO_F_SWAP
    }

    #[test]
    fn decodes_each_operation() {
        let r = decode(op(sys::UBLK_IO_OP_READ), 8, 8, DEV, BUF).unwrap();
        assert_eq!(r, Decoded { req: Request { op: Op::Read, offset: 4096, len: 4096 }, fua: false });
        assert_eq!(decode(sys::UBLK_IO_OP_WRITE, 0, 16, DEV, BUF).unwrap().req.op, Op::Write);
        assert_eq!(decode(sys::UBLK_IO_OP_FLUSH, 0, 0, DEV, BUF).unwrap().req.op, Op::Flush);
        assert_eq!(decode(sys::UBLK_IO_OP_DISCARD, 0, 2048, DEV, BUF).unwrap().req.op, Op::Discard);
        let z = decode(sys::UBLK_IO_OP_WRITE_ZEROES, 8, 2048 - 8, DEV, BUF).unwrap();
        assert_eq!(z.req.op, Op::WriteZeroes);
    }

    #[test]
    fn fua_is_kept_on_modifying_operations_only() {
        let fua = |o| decode(o | sys::UBLK_IO_F_FUA, 0, 8, DEV, BUF).unwrap().fua;
        assert!(fua(sys::UBLK_IO_OP_WRITE));
        assert!(fua(sys::UBLK_IO_OP_WRITE_ZEROES));
        assert!(fua(sys::UBLK_IO_OP_DISCARD));
        assert!(!fua(sys::UBLK_IO_OP_READ), "FUA on a read asks nothing");
        assert!(!decode(sys::UBLK_IO_OP_FLUSH | sys::UBLK_IO_F_FUA, 0, 0, DEV, BUF).unwrap().fua, "a flush flushes once");
        assert!(!decode(sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_SWAP, 0, 8, DEV, BUF).unwrap().fua);
    }

    /// A cache device: a FUA write is on the origin and synced before it completes; a write
    /// without FUA is on the origin, not synced; FLUSH syncs.
    #[test]
    fn fua_writes_sync_the_origin_before_they_complete() {
        use std::sync::atomic::Ordering;
        let origin = compcache_store::testing::FaultyOrigin::memory(DEV as usize, &[]);
        let faults = origin.faults();
        let syncs = &faults.syncs;
        let mut cfg = Config::with_disksize(DEV);
        cfg.mem_limit_bytes = DEV;
        cfg.origin = Some(compcache_store::OriginConfig::new("memory"));
        let store = Store::with_origin(cfg, Box::new(origin)).unwrap();
        let mut ctx = store.context();
        let mut buf = vec![0x3cu8; BUF];
        let w = decode(sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA, 8, 8, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &w, &mut buf), 4096);
        assert_eq!(syncs.load(Ordering::Relaxed), 1, "the FUA write synced the origin");
        let w = decode(sys::UBLK_IO_OP_WRITE, 16, 8, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &w, &mut buf), 4096);
        assert_eq!(syncs.load(Ordering::Relaxed), 1, "a plain write does not sync");
        let z = decode(sys::UBLK_IO_OP_WRITE_ZEROES | sys::UBLK_IO_F_FUA, 24, 8, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &z, &mut buf), 0);
        assert_eq!(syncs.load(Ordering::Relaxed), 2);
        let f = decode(sys::UBLK_IO_OP_FLUSH, 0, 0, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &f, &mut buf), 0);
        assert_eq!(syncs.load(Ordering::Relaxed), 3);
        assert_eq!(store.stats().origin_syncs, 3, "the store counts the syncs that reached the origin");
        let mut back = vec![0u8; BUF];
        let r = decode(sys::UBLK_IO_OP_READ, 8, 16, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &r, &mut back), 8192);
        assert_eq!(back[..8192], buf[..8192], "both writes read back");
    }

    #[test]
    fn rejects_before_touching_the_store() {
        // Unknown operation (zone append, report zones, ...).
        assert_eq!(decode(sys::UBLK_IO_OP_ZONE_APPEND, 0, 8, DEV, BUF), Err(-libc::EOPNOTSUPP));
        // Not page aligned.
        assert_eq!(decode(sys::UBLK_IO_OP_READ, 1, 8, DEV, BUF), Err(-libc::EINVAL));
        assert_eq!(decode(sys::UBLK_IO_OP_READ, 0, 1, DEV, BUF), Err(-libc::EINVAL));
        // Past the end, and an end that overflows.
        assert_eq!(decode(sys::UBLK_IO_OP_WRITE, 2048 - 8, 16, DEV, BUF), Err(-libc::EIO));
        assert_eq!(decode(sys::UBLK_IO_OP_WRITE, (u64::MAX >> 9) & !7, 8, DEV, BUF), Err(-libc::EIO));
        assert_eq!(decode(sys::UBLK_IO_OP_WRITE, !7, 8, DEV, BUF), Err(-libc::EINVAL));
        // Larger than the I/O buffer (a discard may be larger: it carries no data).
        assert_eq!(decode(sys::UBLK_IO_OP_READ, 0, 256, DEV, BUF), Err(-libc::EINVAL));
        assert!(decode(sys::UBLK_IO_OP_DISCARD, 0, 256, DEV, BUF).is_ok());
    }

    #[test]
    fn round_trip_through_the_store() {
        let store = Store::new(Config::with_disksize(DEV)).unwrap();
        let mut ctx = store.context();
        let mut buf = vec![0u8; BUF];
        for (i, b) in buf.iter_mut().enumerate().take(8192) {
            *b = (i % 251) as u8;
        }
        let w = decode(sys::UBLK_IO_OP_WRITE, 16, 16, DEV, BUF).unwrap();
        assert!(!w.fua);
        assert_eq!(execute(&store, &mut ctx, &w, &mut buf), 8192);

        let mut back = vec![0xffu8; BUF];
        let r = decode(sys::UBLK_IO_OP_READ, 16, 16, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &r, &mut back), 8192);
        assert_eq!(back[..8192], buf[..8192]);

        let f = decode(sys::UBLK_IO_OP_FLUSH, 0, 0, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &f, &mut back), 0);

        // Discard frees the first page, write-zeroes the second: both read back as zeros.
        let d = decode(sys::UBLK_IO_OP_DISCARD, 16, 8, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &d, &mut back), 0);
        let z = decode(sys::UBLK_IO_OP_WRITE_ZEROES, 24, 8, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &z, &mut back), 0);
        assert_eq!(execute(&store, &mut ctx, &r, &mut back), 8192);
        assert!(back[..8192].iter().all(|&b| b == 0));
        assert_eq!(store.stats().orig_data_size, 0);
    }
}
