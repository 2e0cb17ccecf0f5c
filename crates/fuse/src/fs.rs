//! The filesystem: a root directory holding one regular file, [`FILE_NAME`], of the device's
//! size, whose reads, writes, fallocate, fsync and flush go to the store
//! ([`crate::request`]). Nothing else can be created, renamed or resized.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use compcache_log::Rejects;
use compcache_store::{Context, Store, PAGE_SIZE};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::request::{self, Io};

/// The one file's name in the mount.
pub const FILE_NAME: &str = "device";
const FILE_INO: INodeNo = INodeNo(2);
/// How long the kernel may cache attributes and names: they never change.
const TTL: Duration = Duration::from_secs(3600);

/// What one request needs besides the store: a compression context and a buffer for a read's
/// data. Made up front (resident), never per request.
pub struct Worker {
    pub ctx: Context,
    pub buf: Box<[u8]>,
}

/// A fixed set of workers, one per FUSE event-loop thread.
///
/// Invariant: there are at least as many workers as threads that serve requests, and a
/// thread holds at most one worker at a time (for the duration of one request), so a thread
/// scanning the slots always finds a free one; the scan repeats only when it races another
/// thread for the same slot.
pub struct Workers {
    slots: Box<[Mutex<Worker>]>,
}

impl Workers {
    /// `n` workers with buffers of `buf_bytes`, written once so that they are resident (and,
    /// under `mlockall`, locked) before the first request.
    pub fn new(store: &Store, n: usize, buf_bytes: usize) -> Workers {
        let slots =
            (0..n.max(1)).map(|_| Mutex::new(Worker { ctx: store.context(), buf: vec![0x5a; buf_bytes].into_boxed_slice() })).collect();
        Workers { slots }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Runs `f` with a free worker.
    pub fn with<R>(&self, f: impl FnOnce(&mut Worker) -> R) -> R {
        loop {
            for slot in self.slots.iter() {
                if let Some(mut w) = slot.try_lock() {
                    return f(&mut w);
                }
            }
            std::thread::yield_now();
        }
    }
}

/// The filesystem over one store.
pub struct DeviceFs {
    store: Arc<Store>,
    size: u64,
    workers: Workers,
    /// The largest read or write the kernel may send (declared at INIT as `max_write` and,
    /// through it, `max_pages`); the workers' buffers are this size.
    max_request: usize,
    /// Kernel request queue: `max_background` at INIT (asynchronous direct I/O, which the
    /// loop driver issues, counts as background requests).
    max_background: u16,
    uid: u32,
    gid: u32,
    started: SystemTime,
    /// Refused and failed requests are logged through this (the front ends' one policy).
    rejects: Rejects,
    /// With FUSE over io_uring wanted ([`DeviceFs::want_io_uring`]): INIT asks for it and
    /// records here whether the kernel agreed.
    io_uring: Option<Arc<AtomicBool>>,
}

impl DeviceFs {
    pub fn new(store: Arc<Store>, workers: usize, max_request: usize, max_background: u16) -> DeviceFs {
        let size = store.disksize_bytes();
        let workers = Workers::new(&store, workers, max_request);
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        DeviceFs {
            store,
            size,
            workers,
            max_request,
            max_background,
            uid,
            gid,
            started: SystemTime::now(),
            rejects: Rejects::new("compcache-fuse"),
            io_uring: None,
        }
    }

    /// Asks for `FUSE_OVER_IO_URING` at INIT; `granted` is set to whether the kernel agreed
    /// (it offers it only with `enable_uring` on).
    pub fn want_io_uring(&mut self, granted: Arc<AtomicBool>) {
        self.io_uring = Some(granted);
    }

    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) =
            if ino == FILE_INO { (FileType::RegularFile, 0o600, self.size, 1) } else { (FileType::Directory, 0o700, 0, 2) };
        // What the device holds in memory, in 512-byte blocks, as a sparse file would show.
        let blocks = if ino == FILE_INO { self.store.stats().mem_used_total / 512 } else { 0 };
        FileAttr {
            ino,
            size,
            blocks,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: PAGE_SIZE as u32,
            flags: 0,
        }
    }

    fn known(ino: INodeNo) -> bool {
        ino == INodeNo::ROOT || ino == FILE_INO
    }

    /// Counts a refused request as zram counts `invalid_io` and logs it (`Rejects`: a few
    /// lines a minute), and returns its errno. Only EINVAL is invalid I/O: ENOSPC past the end
    /// and EOPNOTSUPP for a fallocate mode are a file's ordinary answers.
    fn refuse(&self, op: &str, offset: u64, len: u64, errno: i32) -> Errno {
        if errno == libc::EINVAL {
            self.store.note_invalid_io();
            self.rejects.refused(|| format!("{op} at offset {offset} length {len}: {}", std::io::Error::from_raw_os_error(errno)));
        }
        Errno::from_i32(errno)
    }

    /// Logs a request the store failed (`Rejects`; the store counts it), and returns its errno.
    fn failed(&self, req: &request::Request, errno: i32) -> Errno {
        self.rejects.failed(|| {
            format!("{:?} at offset {} length {} failed: {}", req.op, req.offset, req.len, std::io::Error::from_raw_os_error(errno))
        });
        Errno::from_i32(errno)
    }
}

impl Filesystem for DeviceFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let max = self.max_request as u32;
        // max_pages (the largest read) follows from max(max_write, max_readahead).
        let _ = config.set_max_write(max);
        if let Err(nearest) = config.set_max_readahead(max) {
            let _ = config.set_max_readahead(nearest);
        }
        // Asynchronous direct I/O: the loop driver's requests go out concurrently.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(self.max_background);
        let _ = config.set_congestion_threshold(self.max_background / 4 * 3);
        if let Some(granted) = &self.io_uring {
            granted.store(config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok(), Ordering::Release);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == FILE_NAME {
            reply.entry(&TTL, &self.attr(FILE_INO), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if Self::known(ino) {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if !Self::known(ino) {
            return reply.error(Errno::ENOENT);
        }
        // The device has a fixed size and owner; times are not kept (ignored, as on a device).
        let resize = size.is_some_and(|s| ino != FILE_INO || s != self.size);
        if resize || mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        // No page cache: every read and write comes here (the pages are in the store, and the
        // loop device above has its own cache only if it runs buffered), and direct writes may
        // run in parallel (otherwise the kernel serializes them on the inode lock).
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        let req = match request::decode_read(offset, size, self.size, self.max_request) {
            Ok(r) => r,
            Err(e) => return reply.error(self.refuse("read", offset, u64::from(size), e)),
        };
        // The reply is written to /dev/fuse from the worker's buffer, so it is sent while
        // the worker is held.
        self.workers.with(|w| match request::execute(&self.store, &mut w.ctx, &req, Io::Out(&mut w.buf)) {
            Ok(n) => reply.data(&w.buf[..n]),
            Err(e) => reply.error(self.failed(&req, e)),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        let req = match request::decode_write(offset, data.len(), self.size) {
            Ok(r) => r,
            Err(e) => return reply.error(self.refuse("write", offset, data.len() as u64, e)),
        };
        match self.workers.with(|w| request::execute(&self.store, &mut w.ctx, &req, Io::In(data))) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(self.failed(&req, e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: LockOwner, reply: ReplyEmpty) {
        self.sync(reply);
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync(reply);
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        let req = match request::decode_fallocate(offset, length, mode, self.size) {
            Ok(r) => r,
            Err(e) => return reply.error(self.refuse("fallocate", offset, length, e)),
        };
        match self.workers.with(|w| request::execute(&self.store, &mut w.ctx, &req, Io::None)) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(self.failed(&req, e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, FILE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Block size one page: the loop driver takes its discard granularity from f_bsize.
        let page = PAGE_SIZE as u64;
        let blocks = self.size / page;
        let used = self.store.stats().mem_used_total.div_ceil(page).min(blocks);
        reply.statfs(blocks, blocks - used, blocks - used, 2, 0, PAGE_SIZE as u32, 255, PAGE_SIZE as u32);
    }
}

impl DeviceFs {
    fn sync(&self, reply: ReplyEmpty) {
        match self.workers.with(|w| request::execute(&self.store, &mut w.ctx, &request::decode_flush(), Io::None)) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compcache_store::Config;

    #[test]
    fn as_many_threads_as_workers_always_find_one() {
        let store = Arc::new(Store::new(Config::with_disksize(1 << 20)).unwrap());
        let workers = Arc::new(Workers::new(&store, 3, 8192));
        assert_eq!(workers.len(), 3);
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let (store, workers) = (Arc::clone(&store), Arc::clone(&workers));
                std::thread::spawn(move || {
                    for i in 0..500u64 {
                        let page = [(t * 7 + i) as u8 | 1; PAGE_SIZE];
                        let off = (t * 64 + i % 64) * PAGE_SIZE as u64;
                        workers.with(|w| {
                            assert_eq!(w.buf.len(), 8192);
                            store.write(&mut w.ctx, off, &page).unwrap();
                            store.read(&mut w.ctx, off, &mut w.buf[..PAGE_SIZE]).unwrap();
                            assert_eq!(w.buf[..PAGE_SIZE], page[..]);
                        });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
