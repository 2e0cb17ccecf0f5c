//! ublk request decoding and execution, without a kernel: the fuzzer's bytes are a sequence of
//! I/O descriptors as the kernel hands them to a queue (`op_flags`, `start_sector`,
//! `nr_sectors`), each decoded by `request::decode` and, when valid, carried out by
//! `request::execute` on a small store, as the queue thread does.
//!
//! Each descriptor starts with a byte whose top bit chooses how the rest is read: raw
//! (`op_flags` u32, `start_sector` u64, `nr_sectors` u32: any value the kernel could send,
//! including overflowing ones), or compact (operation, sector and length made small, so that
//! most descriptors are valid and the store sees real traffic). The low bits pick the content
//! written (kind and seed).
//!
//! Checked: `decode` accepts exactly the page-aligned, in-range requests of a known operation
//! that fit the I/O buffer (data transfers only), and refuses the rest with EOPNOTSUPP, EINVAL
//! or EIO; `execute` succeeds for every accepted request with the byte count of the transfer;
//! every READ returns what the byte-array model says the device holds (the last data written,
//! zeroes after DISCARD or WRITE_ZEROES, and for never-written pages).

use crate::{fill, Bytes, PAGE};
use compcache_store::{Config, Store};
use compcache_ublk::request::{decode, execute, Op};
use libublk::sys;
use std::cell::RefCell;

/// Device size: 64 pages.
pub const DEV: u64 = 64 * PAGE as u64;
/// The queue's I/O buffer: 16 pages (the kernel never sends a transfer larger than it).
pub const BUF: usize = 16 * PAGE;
const SECTOR: u64 = 512;

const OPS: [u32; 8] = [
    sys::UBLK_IO_OP_READ,
    sys::UBLK_IO_OP_WRITE,
    sys::UBLK_IO_OP_FLUSH,
    sys::UBLK_IO_OP_DISCARD,
    sys::UBLK_IO_OP_WRITE_ZEROES,
    sys::UBLK_IO_OP_WRITE_SAME,
    sys::UBLK_IO_OP_ZONE_APPEND,
    sys::UBLK_IO_OP_REPORT_ZONES,
];

/// What `decode` must do with a descriptor, by the rules in crates/ublk/src/request.rs.
fn expected(op_flags: u32, start_sector: u64, nr_sectors: u32) -> Result<(Op, u64, u64), i32> {
    let op = match op_flags & 0xff {
        sys::UBLK_IO_OP_READ => Op::Read,
        sys::UBLK_IO_OP_WRITE => Op::Write,
        sys::UBLK_IO_OP_FLUSH => return Ok((Op::Flush, 0, 0)),
        sys::UBLK_IO_OP_DISCARD => Op::Discard,
        sys::UBLK_IO_OP_WRITE_ZEROES => Op::WriteZeroes,
        _ => return Err(-libc::EOPNOTSUPP),
    };
    let offset = u128::from(start_sector) * u128::from(SECTOR);
    let len = u128::from(nr_sectors) * u128::from(SECTOR);
    if offset > u128::from(u64::MAX) || offset % PAGE as u128 != 0 || len % PAGE as u128 != 0 {
        return Err(-libc::EINVAL);
    }
    if offset + len > u128::from(DEV) {
        return Err(-libc::EIO);
    }
    if matches!(op, Op::Read | Op::Write) && len > BUF as u128 {
        return Err(-libc::EINVAL);
    }
    Ok((op, offset as u64, len as u64))
}

/// The harness's own buffers: the byte model, the I/O buffer and the final read-back. Made once
/// per thread and reused, as allocating and zeroing 576 KiB for every input (and the page faults
/// of memory fresh from the kernel) took about half of each input's time; each input starts by
/// resetting them, so no input sees another's data.
struct Buffers {
    model: Vec<u8>,
    buf: Vec<u8>,
    all: Vec<u8>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> =
        RefCell::new(Buffers { model: vec![0; DEV as usize], buf: vec![0; BUF], all: vec![0; DEV as usize] });
}

pub fn run(data: &[u8]) {
    BUFFERS.with_borrow_mut(|b| run_with(data, b));
}

fn run_with(data: &[u8], b: &mut Buffers) {
    // A fresh store for every input: a reused one would carry its pool's state (zspages,
    // statistics) from input to input, and the fuzzer's coverage would depend on the order.
    let store = Store::new(Config::with_disksize(DEV)).expect("a 64-page store");
    let mut ctx = store.context();
    let Buffers { model, buf, all } = b;
    model.fill(0);
    buf.fill(0);
    let mut input = Bytes::new(data);
    let mut n = 0u64;
    while !input.is_empty() {
        n += 1;
        let head = input.u8();
        let (op_flags, start_sector, nr_sectors) = if head & 0x80 != 0 {
            (input.u32(), input.u64(), input.u32())
        } else {
            let op = OPS[(input.u8() % OPS.len() as u8) as usize] | (u32::from(input.u8() & 1) * sys::UBLK_IO_F_SWAP);
            // Mostly page-aligned, sometimes not; mostly inside the device, sometimes past it.
            let start = u64::from(input.u8()) * 8 + u64::from(head & 0x40 != 0);
            let nr = u32::from(input.u8() % 40) * 8 + u32::from(head & 0x20 != 0);
            (op, start, nr)
        };
        let got = decode(op_flags, start_sector, nr_sectors, DEV, BUF).map(|d| (d.req.op, d.req.offset, d.req.len));
        assert_eq!(got, expected(op_flags, start_sector, nr_sectors), "decode({op_flags:#x}, {start_sector}, {nr_sectors})");
        let Ok(d) = decode(op_flags, start_sector, nr_sectors, DEV, BUF) else {
            continue;
        };
        // FUA is kept only on an operation that modifies (then it is a flush after it).
        let modifies = matches!(d.req.op, Op::Write | Op::WriteZeroes | Op::Discard);
        assert_eq!(d.fua, modifies && op_flags & sys::UBLK_IO_F_FUA != 0, "FUA of {d:?} from {op_flags:#x}");
        let req = d.req;

        let (off, len) = (req.offset as usize, req.len as usize);
        if req.op == Op::Write {
            fill(&mut buf[..len], head & 0x1f, n);
        } else {
            buf.fill(0xEE);
        }
        let res = execute(&store, &mut ctx, &d, buf);
        let want = if matches!(req.op, Op::Read | Op::Write) { len as i32 } else { 0 };
        assert_eq!(res, want, "{req:?} completed with {res}");
        match req.op {
            Op::Read => assert!(buf[..len] == model[off..off + len], "READ at {off} length {len} differs from what was written"),
            Op::Write => model[off..off + len].copy_from_slice(&buf[..len]),
            Op::Discard | Op::WriteZeroes => model[off..off + len].fill(0),
            Op::Flush => {}
        }
    }
    // Everything reads back at the end.
    all.fill(0xEE);
    store.read(&mut ctx, 0, all).expect("reading the whole device");
    assert!(all == model, "the device differs from what was written");
}
