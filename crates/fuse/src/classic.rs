//! The classic FUSE transport, `read` and `writev` on `/dev/fuse`, served by our own threads
//! (fuser mounts and answers INIT, then its session is kept but never run).
//!
//! Why our own loop: a swap server must not allocate while it serves (an allocation can wait
//! on reclaim, which waits on swap-outs only this server can complete; docs/swap.md, "Memory
//! pressure"). Here every buffer a request touches is made, written and `mlock`ed in
//! [`start`], before the device is used:
//! - each thread has one buffer of `PAGE_SIZE + max_request` bytes (at least
//!   `FUSE_MIN_READ_BUFFER`, and more than the `fuse_in_header` + `fuse_write_in` +
//!   `max_write` the kernel requires of a read on `/dev/fuse`) and one compression context;
//! - a request is read into the buffer whole (the kernel hands one request per `read`); its
//!   header and fixed argument are decoded by copy, and [`answer::dispatch`] gets the rest of
//!   the buffer as the payload: a write's data is compressed straight from it, a read's data is
//!   decompressed straight into it;
//! - the reply is one `writev`: the `fuse_out_header` on the stack, the body from the buffer.
//!
//! Per request: no allocation, no page fault, two system calls.
//!
//! Threads: [`Options::threads`](crate::Options::threads), each with its own descriptor cloned
//! with `FUSE_DEV_IOC_CLONE` (its own processing queue in the kernel, so a reply is matched
//! without contending with the other threads; a kernel without it gets a `dup`). They are
//! started by the thread that mounted, after the swap server's `PR_SET_IO_FLUSHER` and
//! `mlockall`, and inherit both.
//!
//! Requests with no reply (FORGET, BATCH_FORGET, INTERRUPT, NOTIFY_REPLY) are read and
//! dropped: the device's requests complete in microseconds, so an INTERRUPT has nothing to
//! interrupt. A reply the kernel no longer waits for (ENOENT: the request was aborted) is
//! dropped. A thread ends when the connection does (ENODEV: unmounted or aborted).
//!
//! Locking: each thread's descriptor, buffer and context are its own; the store is shared.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use compcache_log::Rejects;
use compcache_store::{Context, PAGE_SIZE};

use crate::abi::{self, op};
use crate::answer::{dispatch, Device};

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`, include/uapi/linux/fuse.h.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// The serving threads.
pub struct Threads {
    threads: Vec<JoinHandle<io::Result<()>>>,
}

impl Threads {
    /// Whether any thread still serves (false once the connection has ended).
    pub fn alive(&self) -> bool {
        self.threads.iter().any(|t| !t.is_finished())
    }

    /// Waits for every thread; the first error one of them ended with.
    pub fn join(self) -> io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t.join().unwrap_or_else(|_| Err(io::Error::other("a FUSE thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// The size of each thread's buffer for requests of at most `max_request` bytes of data.
pub fn buffer_bytes(max_request: usize) -> usize {
    (PAGE_SIZE + max_request).max(abi::FUSE_MIN_READ_BUFFER)
}

/// Starts `threads` threads serving the connection of `session` (a `/dev/fuse` descriptor whose
/// INIT was answered). Returns once every thread has its buffer and is about to read its first
/// request: whatever a thread's start costs (its stack, its first allocation) is paid before
/// the device is used.
pub fn start(session: BorrowedFd<'_>, dev: Arc<Device>, threads: usize) -> io::Result<Threads> {
    let bytes = buffer_bytes(dev.max_request);
    let n = threads.max(1);
    // A bounded channel's buffer is made here, so a thread's `send` allocates nothing.
    let (ready, up) = std::sync::mpsc::sync_channel::<()>(n);
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let fd = clone_fd(session)?;
        // Written (0x5a) so that the pages exist now, then locked: nothing on the I/O path
        // faults or allocates (the swap server also runs under mlockall).
        let buf = vec![0x5au8; bytes].into_boxed_slice();
        // SAFETY: mlock on memory this function owns (moved into the thread below, not
        // reallocated); failure (no privilege, RLIMIT_MEMLOCK) leaves it unlocked, which only
        // weakens the no-fault guarantee.
        unsafe { libc::mlock(buf.as_ptr().cast(), buf.len()) };
        let ctx = dev.store.context();
        let dev = Arc::clone(&dev);
        let ready = ready.clone();
        let t = std::thread::Builder::new().name(format!("fuse-{i}")).spawn(move || {
            let rejects = Rejects::new("compcache-fuse");
            let _ = ready.send(());
            drop(ready);
            serve(&fd, &dev, buf, ctx, &rejects)
        })?;
        handles.push(t);
    }
    drop(ready);
    for _ in 0..n {
        up.recv().map_err(|_| io::Error::other("a FUSE thread ended before serving"))?;
    }
    Ok(Threads { threads: handles })
}

/// A descriptor of the same connection: `FUSE_DEV_IOC_CLONE` on a fresh `/dev/fuse`, else (a
/// kernel before 4.5) a `dup`.
fn clone_fd(session: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fresh = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let src = session.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the descriptor to clone) from the pointer,
    // which points at a live local.
    if unsafe { libc::ioctl(fresh.as_raw_fd(), FUSE_DEV_IOC_CLONE, &src) } == 0 {
        return Ok(fresh.into());
    }
    session.try_clone_to_owned()
}

/// The length of the fixed argument (`op_in`) that follows the header of a request with
/// `opcode` (include/uapi/linux/fuse.h, protocol 7.9 and later); the payload comes after it.
/// Operations the device does not answer have none: their requests get ENOSYS unread.
fn fixed_arg_len(opcode: u32) -> usize {
    match opcode {
        op::READ | op::READDIR => size_of::<abi::ReadIn>(),
        op::WRITE => size_of::<abi::WriteIn>(),
        op::SETATTR => size_of::<abi::SetattrIn>(),
        op::FALLOCATE => size_of::<abi::FallocateIn>(),
        // fuse_getattr_in, fuse_fsync_in: 16 bytes; fuse_open_in: 8; fuse_release_in,
        // fuse_flush_in: 24 (read by nobody, skipped so that the payload starts right).
        op::GETATTR | op::FSYNC | op::FSYNCDIR => 16,
        op::OPEN | op::OPENDIR => 8,
        op::RELEASE | op::RELEASEDIR | op::FLUSH => 24,
        _ => 0,
    }
}

/// What to do with the request of `n` bytes read into `buf`: `None` for requests that get no
/// reply; otherwise `(unique, at, result)`, the reply's body (`result`'s length) starting at
/// `buf[at]`.
fn answer(dev: &Device, ctx: &mut Context, rejects: &Rejects, buf: &mut [u8], n: usize) -> Option<(u64, usize, Result<usize, i32>)> {
    let hdr = size_of::<abi::InHeader>();
    if n < hdr {
        // The kernel never sends less than a header; nothing to answer.
        return None;
    }
    let inh: abi::InHeader = abi::read(&buf[..hdr]);
    match inh.opcode {
        op::FORGET | op::BATCH_FORGET | op::INTERRUPT | op::NOTIFY_REPLY => return None,
        op::DESTROY => return Some((inh.unique, 0, Ok(0))),
        _ => {}
    }
    let at = (hdr + fixed_arg_len(inh.opcode)).min(n);
    let (head, payload) = buf.split_at_mut(at);
    let result = dispatch(dev, ctx, rejects, &inh, &head[hdr..], n - at, payload);
    Some((inh.unique, at, result))
}

/// One thread: read a request, answer it, write the reply; until the connection ends.
fn serve(fd: &OwnedFd, dev: &Device, mut buf: Box<[u8]>, mut ctx: Context, rejects: &Rejects) -> io::Result<()> {
    loop {
        // SAFETY: reads at most buf.len() bytes into the thread's own buffer.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Interrupted, or the request was aborted before we could read it.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                // Unmounted or aborted: the connection is gone.
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(io::Error::new(e.kind(), format!("reading /dev/fuse: {e}"))),
            }
        }
        let Some((unique, at, result)) = answer(dev, &mut ctx, rejects, &mut buf, n as usize) else { continue };
        let (error, body) = match result {
            Ok(len) => (0, &buf[at..at + len]),
            Err(errno) => (-errno, &buf[at..at]),
        };
        if !reply(fd, unique, error, body, rejects)? {
            return Ok(());
        }
    }
}

/// Writes one reply; `Ok(false)` when the connection is gone.
fn reply(fd: &OwnedFd, unique: u64, error: i32, body: &[u8], rejects: &Rejects) -> io::Result<bool> {
    let out = abi::OutHeader { len: (size_of::<abi::OutHeader>() + body.len()) as u32, error, unique };
    let head = abi::bytes(&out);
    let iov = [
        libc::iovec { iov_base: head.as_ptr() as *mut libc::c_void, iov_len: head.len() },
        libc::iovec { iov_base: body.as_ptr() as *mut libc::c_void, iov_len: body.len() },
    ];
    let count = if body.is_empty() { 1 } else { 2 };
    loop {
        // SAFETY: both iovecs point into live memory of the given lengths; writev only reads.
        if unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), count) } >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // The kernel no longer waits for this reply (the request was aborted).
            Some(libc::ENOENT) => return Ok(true),
            Some(libc::ENODEV) => return Ok(false),
            _ => {
                rejects.failed(|| format!("writing the reply to request {unique}: {e}"));
                return Ok(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::test_device;

    /// One serving thread's state, without the descriptor: requests are laid into its buffer
    /// as the kernel would and answered.
    struct Thread {
        dev: Device,
        ctx: Context,
        rejects: Rejects,
        buf: Vec<u8>,
    }

    impl Thread {
        fn new() -> Thread {
            let dev = test_device();
            let ctx = dev.store.context();
            let buf = vec![0u8; buffer_bytes(dev.max_request)];
            Thread { dev, ctx, rejects: Rejects::new("test"), buf }
        }

        /// A request as the kernel lays it out in the buffer (header, fixed argument, payload),
        /// answered.
        fn send(&mut self, opcode: u32, nodeid: u64, arg: &[u8], payload: &[u8]) -> Option<(u64, usize, Result<usize, i32>)> {
            let hdr = size_of::<abi::InHeader>();
            let len = hdr + arg.len() + payload.len();
            let h = abi::InHeader { len: len as u32, opcode, unique: 42, nodeid, ..abi::InHeader::default() };
            self.buf[..hdr].copy_from_slice(abi::bytes(&h));
            self.buf[hdr..hdr + arg.len()].copy_from_slice(arg);
            self.buf[hdr + arg.len()..len].copy_from_slice(payload);
            self.answer(len)
        }

        fn answer(&mut self, n: usize) -> Option<(u64, usize, Result<usize, i32>)> {
            answer(&self.dev, &mut self.ctx, &self.rejects, &mut self.buf, n)
        }
    }

    #[test]
    fn the_buffer_holds_what_the_kernel_requires() {
        // fuse_dev_do_read: at least FUSE_MIN_READ_BUFFER and in_header + write_in + max_write.
        for max in [4096, 128 << 10, 1 << 20] {
            let b = buffer_bytes(max);
            assert!(b >= abi::FUSE_MIN_READ_BUFFER);
            assert!(b >= size_of::<abi::InHeader>() + size_of::<abi::WriteIn>() + max);
            // A read's reply body fits after the largest header + argument.
            assert!(b - size_of::<abi::InHeader>() - size_of::<abi::SetattrIn>() >= max);
        }
    }

    #[test]
    fn write_then_read_framed_as_on_dev_fuse() {
        let mut t = Thread::new();
        let data: Vec<u8> = (0..12288u32).map(|i| (i % 241) as u8 + 1).collect();
        let w = abi::WriteIn { offset: 8192, size: data.len() as u32, ..abi::WriteIn::default() };
        let (unique, at, r) = t.send(op::WRITE, 2, abi::bytes(&w), &data).unwrap();
        assert_eq!((unique, at), (42, 80));
        let len = r.unwrap();
        assert_eq!(abi::read::<abi::WriteOut>(&t.buf[at..at + len]).size, data.len() as u32);

        let rd = abi::ReadIn { offset: 8192, size: data.len() as u32, ..abi::ReadIn::default() };
        let (_, at, r) = t.send(op::READ, 2, abi::bytes(&rd), &[]).unwrap();
        assert_eq!(t.buf[at..at + r.unwrap()], data[..]);

        // The largest read the kernel may send fits in the buffer after its header.
        let max = t.dev.max_request;
        let rd = abi::ReadIn { offset: 0, size: max as u32, ..abi::ReadIn::default() };
        assert_eq!(t.send(op::READ, 2, abi::bytes(&rd), &[]).unwrap().2, Ok(max));
    }

    #[test]
    fn a_lookup_name_follows_the_header() {
        let mut t = Thread::new();
        let (_, at, r) = t.send(op::LOOKUP, 1, &[], b"device\0").unwrap();
        let e: abi::EntryOut = abi::read(&t.buf[at..at + r.unwrap()]);
        assert_eq!((e.nodeid, e.attr.size), (2, 1 << 20));
        assert_eq!(t.send(op::LOOKUP, 1, &[], b"devicf\0").unwrap().2, Err(libc::ENOENT));
    }

    #[test]
    fn requests_without_replies_and_short_reads() {
        let mut t = Thread::new();
        for opcode in [op::FORGET, op::BATCH_FORGET, op::INTERRUPT, op::NOTIFY_REPLY] {
            assert!(t.send(opcode, 2, &[0; 16], &[]).is_none(), "opcode {opcode}");
        }
        assert!(t.answer(10).is_none());
        assert_eq!(t.send(op::DESTROY, 0, &[], &[]).unwrap().2, Ok(0));
        // A write whose request is shorter than its fixed argument: nothing past the end is read.
        assert!(t.send(op::WRITE, 2, &[0; 20], &[]).is_some());
        assert_eq!(t.dev.store.stats().num_writes, 0);
    }
}
