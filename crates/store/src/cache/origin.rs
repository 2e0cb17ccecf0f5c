//! The origin: the slower block device or disk image a cache-mode store fronts.
//!
//! [`OriginDevice`] is the narrow interface the cache uses, so that tests can stand a failing
//! origin (EIO on read, write or sync, short reads: `testing::FaultyOrigin`) in for the real
//! one. [`FileOrigin`] is the real one: a regular file (an image) or a block device.
//!
//! # Contract
//! - Offsets and lengths of `read_at`, `write_at`, `discard` and `write_zeroes` are whole
//!   pages (multiples of 4096) inside `0..size_bytes()`; the cache never asks for anything
//!   else. Buffers are aligned to 4096 bytes when they come from the cache's own scratch (the
//!   worker's [`AlignedBuf`]), so an implementation may use O_DIRECT for them; it must still
//!   accept any buffer (tests, other callers).
//! - `read_at` fills all of `buf` or fails: a short read (the file shrank, a device error
//!   after part of the transfer) is an error, never zero-filled data. The cache turns every
//!   error into an I/O error for the request and inserts nothing.
//! - `write_at` returns once the bytes are in the origin as far as a later `read_at` is
//!   concerned (for a file: the page cache or the disk); durability is `sync`'s.
//! - `sync` makes every completed `write_at`, `discard` and `write_zeroes` durable (fdatasync):
//!   the FLUSH and FUA of the front ends.
//! - `discard` tells the origin the range holds nothing; afterwards it reads as zeroes or as
//!   its old bytes, whichever the origin does (the cache drops the range and asks again).
//! - `write_zeroes` makes the range read as zeroes.
//! - The cache never issues two overlapping requests at once (it holds the range's stripes,
//!   `cache/mod.rs`), but requests on different ranges come from many threads at once.
//! - Errors are returned, never retried here.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

pub use crate::buf::AlignedBuf;
use crate::error::StoreError;
use crate::PAGE;

/// What the cache needs from its origin (contract in the module docs).
pub trait OriginDevice: Send + Sync {
    /// The origin's size in bytes: a non-zero multiple of 4096, the device's size.
    fn size_bytes(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`; a short read is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `data` at `offset`.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes completed writes durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Frees `offset..offset + len` (punch a hole, BLKDISCARD).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Makes `offset..offset + len` read as zeroes.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Where the run of bytes in one state (data, or a hole that reads as zeroes) that starts
    /// at `offset` ends, and whether it is data: for block status. `None`: unknown (all data).
    fn extent_at(&self, _offset: u64) -> Option<(bool, u64)> {
        None
    }
    /// For messages: the path or a name.
    fn describe(&self) -> String;
}

/// `ioctl(BLKDISCARD)`: `_IO(0x12, 119)`, a `[u64; 2]` byte range.
const BLKDISCARD: libc::c_ulong = 0x1277;
/// `ioctl(BLKZEROOUT)`: `_IO(0x12, 127)`, a `[u64; 2]` byte range.
const BLKZEROOUT: libc::c_ulong = 0x127f;
/// Bytes of zeroes written at a time where the origin cannot zero a range itself.
const ZERO_CHUNK_BYTES: usize = 1 << 20;

/// A regular file or a block device as an origin.
///
/// Opened `O_RDWR | O_CLOEXEC | O_NOFOLLOW`: a symbolic link is refused (unless it leads to a
/// block device through links owned by root or this user, as udev's `/dev/disk/by-*` links,
/// the backing device's rule), so nobody can point the cache at another file. Used
/// exclusively: a block device with `O_EXCL` (the kernel refuses it while mounted or claimed),
/// a regular file with `flock(LOCK_EX | LOCK_NB)`, so that nobody writes behind the cache's
/// back (a second server gets a clear error). Reads and writes go through a second descriptor
/// opened with `O_DIRECT` when the file system allows it, so that the host's page cache does
/// not keep a second, uncompressed copy of what the cache holds compressed; where `O_DIRECT`
/// is refused (tmpfs) they are buffered and followed by `POSIX_FADV_DONTNEED`, and the log
/// says so once.
pub struct FileOrigin {
    /// The descriptor that holds the lock (or the exclusive claim), for sync, fallocate,
    /// ioctls, lseek, and buffered I/O.
    file: File,
    /// The same file with O_DIRECT; `None` where the file system refuses it.
    direct: Option<File>,
    path: PathBuf,
    size_bytes: u64,
    regular: bool,
}

fn refuse(path: &Path, what: String) -> StoreError {
    StoreError::Config(format!("origin {}: {what}", path.display()))
}

/// Opens `path` as an origin may be opened (no symlink, block device O_EXCL), and checks what
/// it is and its size: the file, its size, and whether it is a regular file.
fn open_checked(path: &Path, write: bool) -> Result<(File, u64, bool), StoreError> {
    let open = |p: &Path| {
        let excl = if write { libc::O_EXCL } else { 0 };
        OpenOptions::new().read(true).write(write).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | excl).open(p)
    };
    let file = match open(path) {
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => match crate::backing::trusted_link_to_block_device(path) {
            Some(real) => open(&real),
            None => Err(e),
        },
        r => r,
    };
    let file = file.map_err(|e| {
        refuse(
            path,
            match e.raw_os_error() {
                Some(libc::ELOOP) => "is a symbolic link: compcache follows one only to a block device, and only a link owned by root or this user (as udev's /dev/disk/by-* links); give the path of the image or device itself".into(),
                Some(libc::EBUSY) => "is in use (mounted, or claimed by another program such as another compcache server): the kernel refused the exclusive open; unmount it or stop that program".into(),
                Some(libc::ENOENT) => "does not exist: give an existing image file or block device".into(),
                _ => format!("cannot open it{}: {e}", if write { " for reading and writing" } else { "" }),
            },
        )
    })?;
    let meta = file.metadata().map_err(|e| refuse(path, format!("cannot stat it: {e}")))?;
    let ft = meta.file_type();
    let (size, regular) = if ft.is_block_device() {
        let size = (&file).seek(SeekFrom::End(0)).map_err(|e| refuse(path, format!("cannot read the block device's size: {e}")))?;
        (size, false)
    } else if ft.is_file() {
        (meta.len(), true)
    } else {
        return Err(refuse(path, "is neither a regular file (an image) nor a block device".into()));
    };
    if size == 0 || size % PAGE != 0 {
        return Err(refuse(
            path,
            format!(
                "is {size} bytes, not a non-zero multiple of {PAGE}: cache mode addresses it in 4 KiB pages; resize the image (e.g. `truncate -s {}`)",
                size.div_ceil(PAGE).max(1) * PAGE
            ),
        ));
    }
    Ok((file, size, regular))
}

/// The size in bytes of the origin at `path` (a regular file or block device), with the
/// checks [`FileOrigin::open`] makes: not a symbolic link, a non-zero multiple of 4096. The
/// CLI reads it to size the device before it creates the store. Opens read-only and claims
/// nothing.
pub fn origin_size(path: &Path) -> Result<u64, StoreError> {
    open_checked(path, false).map(|(_, size, _)| size)
}

impl FileOrigin {
    /// Opens `path` as the type docs say. Errors are one line naming the path and what to do:
    /// missing, a symbolic link, in use (by another compcache server or a mount), the wrong
    /// size.
    pub fn open(path: &Path) -> Result<FileOrigin, StoreError> {
        let (file, size_bytes, regular) = open_checked(path, true)?;
        if regular {
            // SAFETY: flock on a descriptor we own; integer arguments only.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                return Err(refuse(
                    path,
                    match e.raw_os_error() {
                        Some(libc::EWOULDBLOCK) => format!("is in use by another process: it holds the file's lock (another compcache server on the same image?); stop it or give another image ({e})"),
                        _ => format!("cannot lock it: {e}"),
                    },
                ));
            }
        }
        let direct = reopen_direct(&file);
        if direct.is_none() {
            compcache_log::info(
                "compcache",
                &format!(
                    "origin {}: the file system refuses O_DIRECT: buffered I/O, each range dropped from the host's page cache after use (POSIX_FADV_DONTNEED)",
                    path.display()
                ),
            );
        }
        Ok(FileOrigin { file, direct, path: path.to_path_buf(), size_bytes, regular })
    }

    /// Whether reads and writes bypass the host's page cache (O_DIRECT).
    pub fn direct_io(&self) -> bool {
        self.direct.is_some()
    }

    /// The descriptor for an I/O on `buf`: the O_DIRECT one if there is one and the buffer
    /// is aligned (offsets and lengths are whole pages by contract), else the buffered one.
    fn for_io(&self, addr: *const u8, len: usize) -> (&File, bool) {
        match &self.direct {
            Some(d) if (addr as usize) % ALIGN == 0 && len % ALIGN == 0 => (d, true),
            _ => (&self.file, false),
        }
    }

    /// After a buffered I/O: the host's page cache need not keep the range (the cache holds it
    /// compressed). Best effort.
    fn drop_cached(&self, offset: u64, len: usize) {
        // SAFETY: posix_fadvise on a descriptor we own, integer arguments only.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, libc::POSIX_FADV_DONTNEED) };
    }

    fn ioctl_range(&self, req: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKDISCARD and BLKZEROOUT read a `[u64; 2]` (start, length) from the pointer,
        // which points to `range`, alive for the call; the descriptor is ours.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), req as _, range.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on a descriptor we own, integer arguments only.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn write_zeroes_slowly(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut zeroes = AlignedBuf::new(ZERO_CHUNK_BYTES.min(len as usize));
        let zeroes = zeroes.bytes_mut(ZERO_CHUNK_BYTES.min(len as usize));
        zeroes.fill(0);
        let mut pos = offset;
        while pos < offset + len {
            let n = (offset + len - pos).min(zeroes.len() as u64) as usize;
            self.write_at(&zeroes[..n], pos)?;
            pos += n as u64;
        }
        Ok(())
    }

    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<u64> {
        // SAFETY: lseek on a descriptor we own, integer arguments only.
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), offset as libc::off_t, whence) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as u64)
        }
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) | Some(libc::ENOSYS))
}

impl OriginDevice for FileOrigin {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (f, direct) = self.for_io(buf.as_ptr(), buf.len());
        // read_exact_at: a short read (end of file) is UnexpectedEof, never zero-filled data.
        f.read_exact_at(buf, offset)?;
        if !direct {
            self.drop_cached(offset, buf.len());
        }
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let (f, direct) = self.for_io(data.as_ptr(), data.len());
        f.write_all_at(data, offset)?;
        if !direct {
            // Dirty pages cannot be dropped before they are written: start the writeout now,
            // the DONTNEED after `sync` (and the kernel's writeback) finds them clean.
            // SAFETY: sync_file_range on a descriptor we own, integer arguments only.
            unsafe {
                libc::sync_file_range(
                    self.file.as_raw_fd(),
                    offset as libc::off64_t,
                    data.len() as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()?;
        if self.direct.is_none() {
            self.drop_cached(0, 0);
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let r = if self.regular {
            self.fallocate(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
        } else {
            self.ioctl_range(BLKDISCARD, offset, len)
        };
        match r {
            // Discard is advisory: an origin that cannot keeps its bytes, which the cache
            // reads again (it dropped the range).
            Err(e) if unsupported(&e) => Ok(()),
            r => r,
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let r = if self.regular {
            self.fallocate(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
        } else {
            self.ioctl_range(BLKZEROOUT, offset, len)
        };
        match r {
            Err(e) if unsupported(&e) => self.write_zeroes_slowly(offset, len),
            r => r,
        }
    }

    fn extent_at(&self, offset: u64) -> Option<(bool, u64)> {
        if !self.regular || offset >= self.size_bytes {
            return None;
        }
        match self.seek(offset, libc::SEEK_DATA) {
            Ok(d) if d == offset => {
                let hole = self.seek(offset, libc::SEEK_HOLE).ok()?;
                Some((true, hole.min(self.size_bytes)))
            }
            Ok(d) => Some((false, d.min(self.size_bytes))),
            // No data after `offset`: a hole to the end.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Some((false, self.size_bytes)),
            Err(_) => None,
        }
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// The same open file again, with O_DIRECT, through `/proc/self/fd` (never the path, which
/// could name something else by now); `None` where the file system refuses it.
fn reopen_direct(file: &File) -> Option<File> {
    let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT | libc::O_CLOEXEC).open(fd_path).ok()
}

/// O_DIRECT alignment of buffers, offsets and lengths.
const ALIGN: usize = 4096;
