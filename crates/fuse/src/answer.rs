//! The answers to the device file's requests, one `match` on the opcode, shared by both
//! transports: the classic `/dev/fuse` loop ([`crate::classic`]) and FUSE over io_uring
//! ([`crate::uring`]). The filesystem is a root directory (inode 1) holding one regular file,
//! [`crate::fs::FILE_NAME`] (inode 2), of the device's size; its reads, writes, fallocate,
//! fsync and flush go to the store ([`crate::request`]: validate, then one store call). Nothing
//! else can be created, renamed or resized.
//!
//! A transport hands over the request's header, its fixed argument (`op_in`: `fuse_read_in`,
//! `fuse_write_in`, ...) and a payload buffer holding the rest of the request (a write's data,
//! a lookup's name); the reply's body is written to that same buffer. Nothing here allocates,
//! so a transport whose buffers are resident serves without allocating.

use std::io;
use std::sync::Arc;
use std::time::SystemTime;

use compcache_log::Rejects;
use compcache_store::{Context, Store, PAGE_SIZE};

use crate::abi::{self, op, Pod};
use crate::fs::FILE_NAME;
use crate::request::{self, Io};

pub const ROOT_INO: u64 = 1;
pub const FILE_INO: u64 = 2;
/// Attribute and entry timeout (seconds): they never change.
const TTL_SECS: u64 = 3600;

/// What answering needs: the store and the file's fixed attributes.
pub struct Device {
    pub store: Arc<Store>,
    pub size: u64,
    /// The largest read or write (`max_write` at INIT).
    pub max_request: usize,
    pub uid: u32,
    pub gid: u32,
    pub started: SystemTime,
}

impl Device {
    /// The device file over `store`, owned by the calling process's user, of at most
    /// `max_request` bytes per read or write.
    pub fn new(store: Arc<Store>, max_request: usize) -> Device {
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Device { size: store.disksize_bytes(), store, max_request, uid, gid, started: SystemTime::now() }
    }
}

fn put<T: Pod>(payload: &mut [u8], v: &T) -> usize {
    let b = abi::bytes(v);
    payload[..b.len()].copy_from_slice(b);
    b.len()
}

fn attr(dev: &Device, ino: u64) -> abi::Attr {
    let t = dev.started.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let (mode, size, nlink) = if ino == FILE_INO { (libc::S_IFREG | 0o600, dev.size, 1) } else { (libc::S_IFDIR | 0o700, 0, 2) };
    abi::Attr {
        ino,
        size,
        // What the device holds in memory, in 512-byte blocks, as a sparse file would show.
        blocks: if ino == FILE_INO { dev.store.stats().mem_used_total / 512 } else { 0 },
        atime: t.as_secs(),
        mtime: t.as_secs(),
        ctime: t.as_secs(),
        atimensec: t.subsec_nanos(),
        mtimensec: t.subsec_nanos(),
        ctimensec: t.subsec_nanos(),
        mode,
        nlink,
        uid: dev.uid,
        gid: dev.gid,
        rdev: 0,
        blksize: PAGE_SIZE as u32,
        flags: 0,
    }
}

fn attr_out(dev: &Device, ino: u64) -> abi::AttrOut {
    abi::AttrOut { attr_valid: TTL_SECS, attr: attr(dev, ino), ..abi::AttrOut::default() }
}

/// Answers one request: the reply body goes to `payload` (which holds `in_len` bytes of the
/// request's own payload on entry); returns its length, or a positive errno.
pub fn dispatch(
    dev: &Device,
    ctx: &mut Context,
    rejects: &Rejects,
    inh: &abi::InHeader,
    op_in: &[u8],
    in_len: usize,
    payload: &mut [u8],
) -> Result<usize, i32> {
    let ino = inh.nodeid;
    let known = ino == ROOT_INO || ino == FILE_INO;
    let refuse = |what: &str, offset: u64, len: u64, errno: i32| {
        if errno == libc::EINVAL {
            dev.store.note_invalid_io();
            rejects.refused(|| format!("{what} at offset {offset} length {len}: {}", io::Error::from_raw_os_error(errno)));
        }
        errno
    };
    let run = |ctx: &mut Context, req: &request::Request, io: Io| {
        request::execute(&dev.store, ctx, req, io).inspect_err(|&e| {
            rejects
                .failed(|| format!("{:?} at offset {} length {} failed: {}", req.op, req.offset, req.len, io::Error::from_raw_os_error(e)));
        })
    };
    match inh.opcode {
        op::READ => {
            let a: abi::ReadIn = abi::read(op_in);
            if ino != FILE_INO {
                return Err(libc::EISDIR);
            }
            let req = request::decode_read(a.offset, a.size, dev.size, dev.max_request.min(payload.len()))
                .map_err(|e| refuse("read", a.offset, u64::from(a.size), e))?;
            run(ctx, &req, Io::Out(payload))
        }
        op::WRITE => {
            let a: abi::WriteIn = abi::read(op_in);
            if ino != FILE_INO {
                return Err(libc::EISDIR);
            }
            let len = (a.size as usize).min(in_len);
            let req = request::decode_write(a.offset, len, dev.size).map_err(|e| refuse("write", a.offset, len as u64, e))?;
            let n = run(ctx, &req, Io::In(&payload[..len]))?;
            Ok(put(payload, &abi::WriteOut { size: n as u32, padding: 0 }))
        }
        op::FALLOCATE => {
            let a: abi::FallocateIn = abi::read(op_in);
            if ino != FILE_INO {
                return Err(libc::EISDIR);
            }
            let req = request::decode_fallocate(a.offset, a.length, a.mode as i32, dev.size)
                .map_err(|e| refuse("fallocate", a.offset, a.length, e))?;
            run(ctx, &req, Io::None).map(|_| 0)
        }
        op::FSYNC | op::FLUSH => request::execute(&dev.store, ctx, &request::decode_flush(), Io::None).map(|_| 0),
        op::LOOKUP => {
            let name = &payload[..in_len];
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            if ino != ROOT_INO || name != FILE_NAME.as_bytes() {
                return Err(libc::ENOENT);
            }
            let e = abi::EntryOut {
                nodeid: FILE_INO,
                generation: 0,
                entry_valid: TTL_SECS,
                attr_valid: TTL_SECS,
                attr: attr(dev, FILE_INO),
                ..abi::EntryOut::default()
            };
            Ok(put(payload, &e))
        }
        op::GETATTR if known => Ok(put(payload, &attr_out(dev, ino))),
        op::SETATTR if known => {
            let a: abi::SetattrIn = abi::read(op_in);
            // The device has a fixed size and owner; times are not kept (ignored, as on a device).
            let resize = a.valid & abi::FATTR_SIZE != 0 && (ino != FILE_INO || a.size != dev.size);
            if resize || a.valid & (abi::FATTR_MODE | abi::FATTR_UID | abi::FATTR_GID) != 0 {
                return Err(libc::EPERM);
            }
            Ok(put(payload, &attr_out(dev, ino)))
        }
        op::GETATTR | op::SETATTR => Err(libc::ENOENT),
        op::OPEN => {
            if ino != FILE_INO {
                return Err(libc::EISDIR);
            }
            let o = abi::OpenOut { fh: 0, open_flags: abi::FOPEN_DIRECT_IO | abi::FOPEN_PARALLEL_DIRECT_WRITES, backing_id: 0 };
            Ok(put(payload, &o))
        }
        op::OPENDIR => {
            if ino != ROOT_INO {
                return Err(libc::ENOTDIR);
            }
            Ok(put(payload, &abi::OpenOut::default()))
        }
        op::RELEASE | op::RELEASEDIR | op::FSYNCDIR => Ok(0),
        op::READDIR => {
            if ino != ROOT_INO {
                return Err(libc::ENOTDIR);
            }
            let a: abi::ReadIn = abi::read(op_in);
            let limit = (a.size as usize).min(payload.len());
            let entries: [(u64, u32, &[u8]); 3] = [
                (ROOT_INO, libc::DT_DIR as u32, b"."),
                (ROOT_INO, libc::DT_DIR as u32, b".."),
                (FILE_INO, libc::DT_REG as u32, FILE_NAME.as_bytes()),
            ];
            let mut n = 0;
            for (i, (eino, typ, name)) in entries.iter().enumerate().skip(a.offset as usize) {
                let rec = (size_of::<abi::Dirent>() + name.len()).next_multiple_of(8);
                if n + rec > limit {
                    break;
                }
                let d = abi::Dirent { ino: *eino, off: i as u64 + 1, namelen: name.len() as u32, typ: *typ };
                put(&mut payload[n..], &d);
                let at = n + size_of::<abi::Dirent>();
                payload[at..at + name.len()].copy_from_slice(name);
                payload[at + name.len()..n + rec].fill(0);
                n += rec;
            }
            Ok(n)
        }
        op::STATFS => {
            // Block size one page: the loop driver takes its discard granularity from f_bsize.
            let page = PAGE_SIZE as u64;
            let blocks = dev.size / page;
            let used = dev.store.stats().mem_used_total.div_ceil(page).min(blocks);
            let s = abi::StatfsOut {
                blocks,
                bfree: blocks - used,
                bavail: blocks - used,
                files: 2,
                ffree: 0,
                bsize: PAGE_SIZE as u32,
                namelen: 255,
                frsize: PAGE_SIZE as u32,
                ..abi::StatfsOut::default()
            };
            Ok(put(payload, &s))
        }
        _ => Err(libc::ENOSYS),
    }
}

/// A 1 MiB device over a fresh store, 128 KiB requests: the transports' tests share it.
#[cfg(test)]
pub(crate) fn test_device() -> Device {
    Device::new(Arc::new(Store::new(compcache_store::Config::with_disksize(1 << 20)).unwrap()), 128 << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u32, nodeid: u64) -> abi::InHeader {
        abi::InHeader { opcode, nodeid, unique: 9, ..abi::InHeader::default() }
    }

    #[test]
    fn write_then_read_through_dispatch() {
        let dev = test_device();
        let mut ctx = dev.store.context();
        let rejects = Rejects::new("test");
        let mut payload = vec![0u8; 128 << 10];
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 253) as u8 + 1).collect();
        payload[..8192].copy_from_slice(&data);
        let w = abi::WriteIn { offset: 4096, size: 8192, ..abi::WriteIn::default() };
        let n = dispatch(&dev, &mut ctx, &rejects, &header(op::WRITE, FILE_INO), abi::bytes(&w), 8192, &mut payload).unwrap();
        assert_eq!(n, 8);
        assert_eq!(abi::read::<abi::WriteOut>(&payload).size, 8192);
        payload.fill(0);
        let r = abi::ReadIn { offset: 4096, size: 8192, ..abi::ReadIn::default() };
        let n = dispatch(&dev, &mut ctx, &rejects, &header(op::READ, FILE_INO), abi::bytes(&r), 0, &mut payload).unwrap();
        assert_eq!(n, 8192);
        assert_eq!(payload[..8192], data[..]);
        // Past the end: ENOSPC for a write, end of file for a read; a read too large: EINVAL.
        let w = abi::WriteIn { offset: 1 << 20, size: 4096, ..abi::WriteIn::default() };
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(op::WRITE, FILE_INO), abi::bytes(&w), 4096, &mut payload), Err(libc::ENOSPC));
        let r = abi::ReadIn { offset: 1 << 20, size: 4096, ..abi::ReadIn::default() };
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(op::READ, FILE_INO), abi::bytes(&r), 0, &mut payload), Ok(0));
        let r = abi::ReadIn { offset: 0, size: (256 << 10) as u32, ..abi::ReadIn::default() };
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(op::READ, FILE_INO), abi::bytes(&r), 0, &mut payload), Err(libc::EINVAL));
        assert_eq!(dev.store.stats().invalid_io, 1);
    }

    #[test]
    fn metadata_answers() {
        let dev = test_device();
        let mut ctx = dev.store.context();
        let rejects = Rejects::new("test");
        let mut payload = vec![0u8; 8192];
        payload[..7].copy_from_slice(b"device\0");
        let n = dispatch(&dev, &mut ctx, &rejects, &header(op::LOOKUP, ROOT_INO), &[], 7, &mut payload).unwrap();
        let e: abi::EntryOut = abi::read(&payload[..n]);
        assert_eq!((e.nodeid, e.attr.size, e.attr.mode), (FILE_INO, 1 << 20, libc::S_IFREG | 0o600));
        payload[..6].copy_from_slice(b"other\0");
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(op::LOOKUP, ROOT_INO), &[], 6, &mut payload), Err(libc::ENOENT));
        let n = dispatch(&dev, &mut ctx, &rejects, &header(op::OPEN, FILE_INO), &[], 0, &mut payload).unwrap();
        assert_eq!(abi::read::<abi::OpenOut>(&payload[..n]).open_flags, abi::FOPEN_DIRECT_IO | abi::FOPEN_PARALLEL_DIRECT_WRITES);
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(op::OPEN, ROOT_INO), &[], 0, &mut payload), Err(libc::EISDIR));
        let s = abi::SetattrIn { valid: abi::FATTR_SIZE, size: 4096, ..abi::SetattrIn::default() };
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(op::SETATTR, FILE_INO), abi::bytes(&s), 0, &mut payload), Err(libc::EPERM));
        let s = abi::SetattrIn { valid: abi::FATTR_SIZE, size: 1 << 20, ..abi::SetattrIn::default() };
        assert!(dispatch(&dev, &mut ctx, &rejects, &header(op::SETATTR, FILE_INO), abi::bytes(&s), 0, &mut payload).is_ok());
        let r = abi::ReadIn { size: 4096, ..abi::ReadIn::default() };
        let n = dispatch(&dev, &mut ctx, &rejects, &header(op::READDIR, ROOT_INO), abi::bytes(&r), 0, &mut payload).unwrap();
        // ".", ".." and "device": 24 + 8 bytes each for the first two, 24 + 8 for "device".
        assert_eq!(n, 32 * 3);
        let d: abi::Dirent = abi::read(&payload[64..]);
        assert_eq!((d.ino, d.off, d.namelen), (FILE_INO, 3, 6));
        assert_eq!(&payload[64 + 24..64 + 30], b"device");
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(op::STATFS, ROOT_INO), &[], 0, &mut payload), Ok(80));
        assert_eq!(dispatch(&dev, &mut ctx, &rejects, &header(99, ROOT_INO), &[], 0, &mut payload), Err(libc::ENOSYS));
    }
}
