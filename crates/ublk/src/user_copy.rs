//! Moving a request's data with user copy (`UBLK_F_USER_COPY`), and making a queue's buffer
//! resident before the first fetch.
//!
//! With user copy the kernel copies nothing into the server's memory on its own: a queue
//! thread reads a write's data from `/dev/ublkcN` with `pread`, and writes a read's data there
//! with `pwrite`, at a position naming the queue, the tag and the offset in the request
//! (`UblkIOCtx::ublk_user_copy_pos`); the kernel allows it only while the request is the
//! server's (fetched, not yet completed). Why compcache uses it: target.rs, "Data".

use compcache_store::PAGE_SIZE;
use libublk::helpers::IoBuf;
use libublk::io::UblkIOCtx;

use crate::request::{Op, Request};

/// Writes every page of `b` once, so that it is resident before any request needs it (a
/// write, not a read: a read of an untouched page may map the shared zero page).
pub(crate) fn make_resident(b: &IoBuf<u8>) {
    for off in (0..b.len()).step_by(PAGE_SIZE) {
        // SAFETY: `off` is inside the buffer, which the caller owns and nothing else uses yet.
        unsafe { std::ptr::write_volatile(b.as_mut_ptr().add(off), 0) };
    }
}

/// One queue's side of user copy: its requests' data moved with `pread`/`pwrite` on the char
/// device, at the position that names the queue and the tag (`UblkIOCtx::ublk_user_copy_pos`).
pub(crate) struct UserCopy {
    /// The char device's descriptor (libublk's, open while the device is served).
    pub(crate) fd: i32,
    pub(crate) qid: u16,
}

impl UserCopy {
    /// Runs `execute` on one request with its data in `buf`: a write's data read from the
    /// kernel first, a read's written to it after. A copy the kernel refuses or cuts short
    /// fails the request with EIO (nothing stored for a write; the read is not answered with
    /// a partial page).
    pub(crate) fn serve(&self, tag: u16, req: &Request, buf: &mut [u8], execute: impl FnOnce(&mut [u8]) -> i32) -> i32 {
        let pos = UblkIOCtx::ublk_user_copy_pos(self.qid, tag, 0) as libc::off_t;
        let len = req.len as usize;
        if req.op == Op::Write {
            // SAFETY: `buf` is valid for `len` bytes (`decode` refused a request longer than
            // the buffer); the kernel writes at most `len` bytes into it.
            let n = unsafe { libc::pread(self.fd, buf.as_mut_ptr().cast(), len, pos) };
            if n != len as isize {
                return -libc::EIO;
            }
        }
        let res = execute(buf);
        if req.op == Op::Read && res > 0 {
            // SAFETY: `buf` is valid for `res` bytes, which the store filled (`res` <= `len`).
            let n = unsafe { libc::pwrite(self.fd, buf.as_ptr().cast(), res as usize, pos) };
            if n != res as isize {
                return -libc::EIO;
            }
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::FileExt;

    /// A sparse memfd stands in for the char device: the same positions, the same calls.
    fn device() -> std::fs::File {
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"user-copy-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor just opened, owned by nothing else.
        unsafe { std::fs::File::from_raw_fd(fd) }
    }

    #[test]
    fn a_write_reads_its_data_first_and_a_read_writes_its_data_after() {
        let dev = device();
        let (qid, tag) = (0, 3);
        let pos = UblkIOCtx::ublk_user_copy_pos(qid, tag, 0);
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        dev.write_all_at(&data, pos).unwrap();
        let copy = UserCopy { fd: dev.as_raw_fd(), qid };
        let mut buf = vec![0u8; 16384];

        let write = Request { op: Op::Write, offset: 4096, len: 8192 };
        let seen = copy.serve(tag, &write, &mut buf, |b| {
            assert_eq!(&b[..8192], &data[..], "the store is given the request's data");
            8192
        });
        assert_eq!(seen, 8192);

        let read = Request { op: Op::Read, offset: 0, len: 4096 };
        let res = copy.serve(tag, &read, &mut buf, |b| {
            b[..4096].fill(0xa5);
            4096
        });
        assert_eq!(res, 4096);
        let mut back = vec![0u8; 4096];
        dev.read_exact_at(&mut back, pos).unwrap();
        assert!(back.iter().all(|&x| x == 0xa5), "the read's data reached the request");

        // Another tag's position is another request's.
        let other = UblkIOCtx::ublk_user_copy_pos(qid, tag + 1, 0);
        assert_eq!(other - pos, 1 << libublk::sys::UBLK_TAG_OFF);
    }

    #[test]
    fn a_copy_cut_short_or_refused_fails_the_request_and_a_failed_read_copies_nothing() {
        let dev = device();
        let copy = UserCopy { fd: dev.as_raw_fd(), qid: 0 };
        let mut buf = vec![0u8; 8192];
        // Nothing at the position: the "kernel" gives 0 bytes of the 4096 asked.
        let write = Request { op: Op::Write, offset: 0, len: 4096 };
        let mut stored = false;
        assert_eq!(
            copy.serve(0, &write, &mut buf, |_| {
                stored = true;
                4096
            }),
            -libc::EIO
        );
        assert!(!stored, "a write whose data could not be read stores nothing");

        // A read the store fails is not copied.
        let read = Request { op: Op::Read, offset: 0, len: 4096 };
        assert_eq!(copy.serve(0, &read, &mut buf, |_| -libc::EIO), -libc::EIO);
        assert_eq!(dev.metadata().unwrap().len(), 0, "nothing written for a failed read");

        // A descriptor the kernel refuses.
        let closed = UserCopy { fd: -1, qid: 0 };
        assert_eq!(closed.serve(0, &read, &mut buf, |_| 4096), -libc::EIO);
    }
}
