//! One FUSE request on the device file: decode and validate it completely first (range,
//! flags), then hand it to the store in one `match`, each arm one call. Errors are positive
//! errno values (a reply carries them negated: [`crate::answer`]).
//!
//! The file behaves as the block device it stands for (`blkdev_read_iter`,
//! `blkdev_write_iter`, `blkdev_fallocate`), but at any byte offset, as the store allows:
//! - a read at or past the end reads nothing (end of file), one across the end is cut there;
//! - a write at or past the end fails with ENOSPC (the file cannot grow), one across the end
//!   is cut there (a short write);
//! - fallocate: `PUNCH_HOLE | KEEP_SIZE` frees the range (`Store::discard`; a range whose
//!   ends are not page-aligned goes to `Store::write_zeroes`, which frees the whole pages and
//!   zeroes the partial ones, since a punched range must read back as zeros and `discard`
//!   leaves partial pages as they are, as zram does); `ZERO_RANGE` (with or without
//!   `KEEP_SIZE`) zeroes it (`Store::write_zeroes`). Every other mode (plain allocation,
//!   collapse, insert, unshare, write-zeroes) is EOPNOTSUPP: the file is always fully
//!   "allocated" and cannot change size. A range past the end is cut at the end with
//!   `KEEP_SIZE`; without it, a zeroed range past the end would grow the file: ENOSPC.
//!   (The loop driver sends `PUNCH_HOLE | KEEP_SIZE` for discard and `ZERO_RANGE | KEEP_SIZE`
//!   or `PUNCH_HOLE | KEEP_SIZE` for write-zeroes.)
//! - fsync and flush: `Store::flush`. For a RAM device every completed write is already kept
//!   and it returns at once; for a cache device (`--origin`) it is the origin's fdatasync, and
//!   its error is the fsync's. The loop driver above turns the block layer's FLUSH (and FUA,
//!   which it does not declare, so the block layer sends a FLUSH after the write) into an
//!   fsync of this file, so a file system's journal commits on the loop device reach the
//!   origin's disk.
//!
//! The request and its execution are the store's (`compcache_store::request`), shared with ublk.

pub use compcache_store::request::{execute, Io, Op, Request};
use compcache_store::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// A read of `size` bytes at `offset` of a file of `dev_bytes`, into a buffer of `buf_bytes`.
/// The kernel never sends a read larger than the `max_pages` we declared at INIT, which is
/// `buf_bytes`: a larger one is a defect, refused with EINVAL rather than cut short.
pub fn decode_read(offset: u64, size: u32, dev_bytes: u64, buf_bytes: usize) -> Result<Request, i32> {
    if size as usize > buf_bytes {
        return Err(libc::EINVAL);
    }
    let len = u64::from(size).min(dev_bytes.saturating_sub(offset));
    Ok(Request { op: Op::Read, offset, len })
}

/// A write of `len` bytes at `offset`.
pub fn decode_write(offset: u64, len: usize, dev_bytes: u64) -> Result<Request, i32> {
    if len > 0 && offset >= dev_bytes {
        return Err(libc::ENOSPC);
    }
    let len = (len as u64).min(dev_bytes.saturating_sub(offset));
    Ok(Request { op: Op::Write, offset, len })
}

/// fsync, fdatasync and flush (sent on every close).
pub fn decode_flush() -> Request {
    Request { op: Op::Flush, offset: 0, len: 0 }
}

/// fallocate(2) with `mode` over `offset..offset + length`.
pub fn decode_fallocate(offset: u64, length: u64, mode: i32, dev_bytes: u64) -> Result<Request, i32> {
    const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
    const ZERO_KEEP: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    let op = match mode {
        PUNCH => Op::Discard,
        ZERO | ZERO_KEEP => Op::WriteZeroes,
        _ => return Err(libc::EOPNOTSUPP),
    };
    if length == 0 {
        // vfs_fallocate refuses this first; kept for completeness.
        return Err(libc::EINVAL);
    }
    let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
    if end > dev_bytes && mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
        return Err(libc::ENOSPC);
    }
    let len = end.min(dev_bytes).saturating_sub(offset);
    let op = if op == Op::Discard && (offset % PAGE != 0 || len % PAGE != 0) { Op::WriteZeroes } else { op };
    Ok(Request { op, offset: offset.min(dev_bytes), len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use compcache_store::{Config, Store};

    const DEV: u64 = 1 << 20;
    const BUF: usize = 128 << 10;
    const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;

    #[test]
    fn reads_and_writes_stop_at_the_end_as_on_a_block_device() {
        assert_eq!(decode_read(4096, 8192, DEV, BUF), Ok(Request { op: Op::Read, offset: 4096, len: 8192 }));
        assert_eq!(decode_read(DEV - 100, 4096, DEV, BUF).unwrap().len, 100);
        assert_eq!(decode_read(DEV, 4096, DEV, BUF).unwrap().len, 0);
        assert_eq!(decode_read(u64::MAX, 4096, DEV, BUF).unwrap().len, 0);
        assert_eq!(decode_read(0, BUF as u32 + 1, DEV, BUF), Err(libc::EINVAL));

        assert_eq!(decode_write(10, 5000, DEV), Ok(Request { op: Op::Write, offset: 10, len: 5000 }));
        assert_eq!(decode_write(DEV - 4096, 8192, DEV).unwrap().len, 4096);
        assert_eq!(decode_write(DEV, 1, DEV), Err(libc::ENOSPC));
        assert_eq!(decode_write(u64::MAX, 1, DEV), Err(libc::ENOSPC));
        assert_eq!(decode_write(DEV, 0, DEV).unwrap().len, 0);
    }

    #[test]
    fn fallocate_modes() {
        let d = decode_fallocate(4096, 8192, PUNCH | KEEP, DEV).unwrap();
        assert_eq!(d, Request { op: Op::Discard, offset: 4096, len: 8192 });
        // Unaligned punch: must read back as zeros, so the partial pages are zeroed.
        assert_eq!(decode_fallocate(100, 8192, PUNCH | KEEP, DEV).unwrap().op, Op::WriteZeroes);
        assert_eq!(decode_fallocate(0, 100, PUNCH | KEEP, DEV).unwrap().op, Op::WriteZeroes);
        assert_eq!(decode_fallocate(0, 4096, ZERO, DEV).unwrap().op, Op::WriteZeroes);
        assert_eq!(decode_fallocate(0, 4096, ZERO | KEEP, DEV).unwrap().op, Op::WriteZeroes);
        // Past the end: cut with KEEP_SIZE, refused without (the file would grow).
        assert_eq!(
            decode_fallocate(DEV - 4096, 1 << 30, PUNCH | KEEP, DEV).unwrap(),
            Request { op: Op::Discard, offset: DEV - 4096, len: 4096 }
        );
        assert_eq!(decode_fallocate(DEV + 4096, 4096, PUNCH | KEEP, DEV).unwrap().len, 0);
        assert_eq!(decode_fallocate(DEV - 4096, 8192, ZERO, DEV), Err(libc::ENOSPC));
        assert_eq!(decode_fallocate(u64::MAX - 10, 4096, ZERO | KEEP, DEV), Err(libc::EFBIG));
        assert_eq!(decode_fallocate(0, 0, ZERO, DEV), Err(libc::EINVAL));
    }

    #[test]
    fn unsupported_fallocate_modes_are_eopnotsupp() {
        for mode in [
            0,
            KEEP,
            PUNCH,
            libc::FALLOC_FL_COLLAPSE_RANGE,
            libc::FALLOC_FL_INSERT_RANGE,
            libc::FALLOC_FL_UNSHARE_RANGE,
            PUNCH | KEEP | ZERO,
            0x80, // FALLOC_FL_WRITE_ZEROES (Linux 6.17)
        ] {
            assert_eq!(decode_fallocate(0, 4096, mode, DEV), Err(libc::EOPNOTSUPP), "mode {mode:#x}");
        }
    }

    #[test]
    fn round_trip_through_the_store() {
        let store = Store::new(Config::with_disksize(DEV)).unwrap();
        let mut ctx = store.context();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        // Unaligned write, across pages.
        let w = decode_write(1000, data.len(), DEV).unwrap();
        assert_eq!(execute(&store, &mut ctx, &w, Io::In(&data)), Ok(10_000));
        let mut back = vec![0u8; BUF];
        let r = decode_read(1000, 10_000, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &r, Io::Out(&mut back)), Ok(10_000));
        assert_eq!(back[..10_000], data[..]);
        assert_eq!(execute(&store, &mut ctx, &decode_flush(), Io::None), Ok(0));

        // An unaligned punch zeroes exactly its range.
        let p = decode_fallocate(2000, 5000, PUNCH | KEEP, DEV).unwrap();
        assert_eq!(execute(&store, &mut ctx, &p, Io::None), Ok(0));
        assert_eq!(execute(&store, &mut ctx, &r, Io::Out(&mut back)), Ok(10_000));
        let mut want = data.clone();
        want[1000..6000].fill(0);
        assert_eq!(back[..10_000], want[..]);

        // Aligned punch and zero-range free whole pages: nothing stored remains.
        let p = decode_fallocate(0, 8192, PUNCH | KEEP, DEV).unwrap();
        assert_eq!(p.op, Op::Discard);
        assert_eq!(execute(&store, &mut ctx, &p, Io::None), Ok(0));
        let z = decode_fallocate(8192, 4096, ZERO | KEEP, DEV).unwrap();
        assert_eq!(execute(&store, &mut ctx, &z, Io::None), Ok(0));
        assert_eq!(store.stats().orig_data_size, 0);
        assert_eq!(execute(&store, &mut ctx, &r, Io::Out(&mut back)), Ok(10_000));
        assert!(back[..10_000].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_read_without_a_buffer_is_refused() {
        let store = Store::new(Config::with_disksize(DEV)).unwrap();
        let mut ctx = store.context();
        let r = decode_read(0, 4096, DEV, BUF).unwrap();
        assert_eq!(execute(&store, &mut ctx, &r, Io::None), Err(libc::EINVAL));
        let mut small = [0u8; 100];
        assert_eq!(execute(&store, &mut ctx, &r, Io::Out(&mut small)), Err(libc::EINVAL));
    }
}
