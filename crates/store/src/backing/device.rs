//! The backing device: a block device or a regular file, read and written with `pread` and
//! `pwrite` at byte offsets.
//!
//! [`BackingDevice`] is the narrow interface the backing tier uses, so that tests can stand a
//! failing device (EIO, ENOSPC, torn writes) in for the real file. [`FileDevice`] is the real
//! one: a regular file is created sparse when absent and grown (sparse) to the requested size;
//! a block device is used as it is, up to its size.
//!
//! Reads go through a second descriptor opened with `O_DIRECT` where the file system allows
//! it (not tmpfs): a page read back from the device then really comes from the device, not
//! from the host's page cache, which would be memory the server uses outside any limit (and
//! would flatter benchmarks against disk swap). The read covers the aligned 4 KiB blocks
//! around the record, in an aligned buffer: the worker's [`ReadBuf`] (the store keeps one in
//! each `Context`, sized when the context is made), so that a request's read allocates
//! nothing. Writes are buffered `pwrite`s, made durable by `sync`; with O_DIRECT reads, each
//! write also starts the range's writeout (`sync_file_range`), so that a later direct read
//! does not have to wait for it.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// What the backing tier needs from a device.
///
/// Contract: `write_at` returns only once the bytes are in the device's file (for a file: in
/// the page cache, so that a later `read_at` returns them); `sync` makes every completed
/// `write_at` durable. Offsets and lengths are any bytes inside `0..size_bytes()`; the tier
/// never writes the same byte range from two threads at once. Errors are returned, never
/// retried here: the tier turns them into a request error and a log line.
pub trait BackingDevice: Send + Sync {
    /// Usable bytes.
    fn size_bytes(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`; a short read is an error. May allocate
    /// (GC's segment reads use it); the request path uses [`BackingDevice::read_into`].
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads exactly `len` bytes at `offset` into `scratch` and returns them: the request
    /// path's read, which allocates nothing when `len <= scratch.max_bytes()` (a larger read
    /// grows `scratch` first). The default reads with `read_at` into the start of `scratch`.
    fn read_into<'a>(&self, scratch: &'a mut ReadBuf, offset: u64, len: usize) -> io::Result<&'a [u8]> {
        scratch.ensure(len);
        let buf = &mut scratch.mem[..len];
        self.read_at(buf, offset)?;
        Ok(buf)
    }
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes completed writes durable (`fsync`).
    fn sync(&self) -> io::Result<()>;
    /// Tells the device `offset..offset + len` holds nothing (punches a hole in a file). May
    /// do nothing; the bytes read back as anything afterwards.
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// For messages: the path or a name.
    fn describe(&self) -> String;
}

/// A block device or regular file.
pub struct FileDevice {
    file: File,
    /// The same file opened with O_DIRECT, for reads; `None` where O_DIRECT is refused.
    direct: Option<File>,
    path: PathBuf,
    size_bytes: u64,
    regular: bool,
}

impl FileDevice {
    /// Opens `path` for reading and writing. A missing file is created; a regular file is
    /// grown (sparse) to `size_bytes` when that is larger than the file, or to
    /// `default_bytes` when `size_bytes` is 0 and the file is empty. A block device is used up
    /// to `size_bytes` (0: all of it).
    pub fn open(path: &Path, size_bytes: u64, default_bytes: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let meta = file.metadata()?;
        let ft = meta.file_type();
        let (regular, size_bytes) = if ft.is_block_device() {
            let dev_bytes = (&file).seek(SeekFrom::End(0))?;
            if size_bytes > dev_bytes {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("the block device has {dev_bytes} bytes, fewer than the {size_bytes} asked for"),
                ));
            }
            (false, if size_bytes == 0 { dev_bytes } else { size_bytes })
        } else if ft.is_file() {
            let want = if size_bytes != 0 {
                size_bytes
            } else if meta.len() == 0 {
                default_bytes
            } else {
                meta.len()
            };
            if meta.len() < want {
                file.set_len(want)?; // sparse: no blocks are allocated until written
            }
            (true, want)
        } else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "neither a block device nor a regular file"));
        };
        let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).ok();
        Ok(FileDevice { file, direct, path: path.to_path_buf(), size_bytes, regular })
    }

    /// Whether reads bypass the page cache (O_DIRECT).
    pub fn direct_reads(&self) -> bool {
        self.direct.is_some()
    }
}

/// O_DIRECT alignment of offsets, lengths and buffers.
const ALIGN: u64 = 4096;
const ALIGN_BYTES: usize = ALIGN as usize;

/// Scratch memory for device reads, so that a request's read allocates nothing: one per
/// worker (the store's `Context` keeps it), made once with room for the largest read the
/// worker issues. An O_DIRECT read fills the aligned blocks around the bytes asked for and
/// returns those bytes as a slice of it (no second copy); other reads use its start.
pub struct ReadBuf {
    /// Room for `max_bytes` read at any offset: the aligned span around them (at most
    /// `max_bytes` rounded up plus one block) and up to one block to reach alignment.
    mem: Box<[u8]>,
}

impl ReadBuf {
    /// Room for a read of up to `max_bytes` at any offset, every page of it written once so
    /// that it is resident now: freshly allocated memory may be untouched zero pages, which
    /// the first read would fault in (in the I/O path, where a fault may wait in reclaim).
    pub fn new(max_bytes: usize) -> ReadBuf {
        ReadBuf { mem: super::resident_bytes(Self::mem_bytes(max_bytes)).into_boxed_slice() }
    }

    /// No room: for a store without a backing device (grows on first use if ever used).
    pub fn empty() -> ReadBuf {
        ReadBuf { mem: Box::default() }
    }

    /// The largest read it serves without allocating.
    pub fn max_bytes(&self) -> usize {
        (self.mem.len() / ALIGN_BYTES).saturating_sub(2) * ALIGN_BYTES
    }

    fn mem_bytes(max_bytes: usize) -> usize {
        max_bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES + 2 * ALIGN_BYTES
    }

    /// Makes room for `len` bytes: allocates only when the owner sized it too small (which a
    /// fault-free caller must not do).
    fn ensure(&mut self, len: usize) {
        if len > self.max_bytes() {
            *self = ReadBuf { mem: vec![0u8; Self::mem_bytes(len)].into_boxed_slice() };
        }
    }

    /// `n` bytes at the first aligned address; `n <= max_bytes() + ALIGN`.
    fn aligned(&mut self, n: usize) -> &mut [u8] {
        let shift = self.mem.as_ptr().align_offset(ALIGN_BYTES);
        &mut self.mem[shift..shift + n]
    }
}

/// Reads `len` bytes at `offset` through O_DIRECT: the aligned blocks around them into
/// `scratch`; returns the bytes asked for.
fn read_direct<'a>(file: &File, scratch: &'a mut ReadBuf, offset: u64, len: usize) -> io::Result<&'a [u8]> {
    let start = offset / ALIGN * ALIGN;
    let end = (offset + len as u64).div_ceil(ALIGN) * ALIGN;
    scratch.ensure(len);
    // The span is at most `len` rounded up plus one block, which `ensure` left room for.
    let aligned = scratch.aligned((end - start) as usize);
    file.read_exact_at(aligned, start)?;
    let from = (offset - start) as usize;
    Ok(&aligned[from..from + len])
}

impl BackingDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(f) => {
                // A bounce buffer for this read only (GC, tests): not the request path.
                let mut scratch = ReadBuf::empty();
                buf.copy_from_slice(read_direct(f, &mut scratch, offset, buf.len())?);
                Ok(())
            }
            None => self.file.read_exact_at(buf, offset),
        }
    }

    fn read_into<'a>(&self, scratch: &'a mut ReadBuf, offset: u64, len: usize) -> io::Result<&'a [u8]> {
        match &self.direct {
            Some(f) => read_direct(f, scratch, offset, len),
            None => {
                scratch.ensure(len);
                let buf = &mut scratch.mem[..len];
                self.file.read_exact_at(buf, offset)?;
                Ok(buf)
            }
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        if self.direct.is_some() {
            // Start writing the range out now (asynchronously): an O_DIRECT read of a range
            // still dirty in the page cache must first wait for it to be written.
            // SAFETY: sync_file_range on a descriptor we own, integer arguments only; it
            // touches no memory of this process. Its failure only loses the head start.
            unsafe {
                libc::sync_file_range(
                    self.file.as_raw_fd(),
                    offset as libc::off64_t,
                    buf.len() as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.regular {
            return Ok(()); // BLKDISCARD would do; a swap backing partition does not need it
        }
        // SAFETY: fallocate on a file descriptor we own, with plain integer arguments; it
        // touches no memory of this process.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            e => Err(e),
        }
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_created_sparse_and_an_existing_one_grown() {
        let dir = std::env::temp_dir().join(format!("compcache-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("backing");
        let _ = std::fs::remove_file(&path);
        let d = FileDevice::open(&path, 0, 1 << 20).unwrap();
        assert_eq!(d.size_bytes(), 1 << 20);
        d.write_at(b"hello", 4096).unwrap();
        let mut b = [0u8; 5];
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(&b, b"hello");
        // unaligned, across a block boundary, with or without O_DIRECT
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        d.write_at(&data, 8190).unwrap();
        let mut back = vec![0u8; 5000];
        d.read_at(&mut back, 8190).unwrap();
        assert_eq!(back, data, "direct reads: {}", d.direct_reads());
        assert!(d.read_at(&mut [0u8; 8], (1 << 20) - 4).is_err(), "reads past the end fail");
        // Through a worker's read buffer: the same bytes, and no allocation while it has room.
        let mut scratch = ReadBuf::new(5000);
        let mem = (scratch.mem.as_ptr(), scratch.mem.len());
        assert!(scratch.max_bytes() >= 5000);
        for off in [8190, 8191, 8192, 12287] {
            let got = d.read_into(&mut scratch, off, 5000).unwrap();
            let want = &data[(off - 8190) as usize..];
            assert_eq!(&got[..want.len().min(5000)], &want[..want.len().min(5000)], "at {off}");
        }
        assert_eq!((scratch.mem.as_ptr(), scratch.mem.len()), mem, "no allocation within max_bytes");
        assert_eq!(d.read_into(&mut scratch, 8190, 5000 + 4096 * 2).unwrap().len(), 5000 + 4096 * 2, "grows when too small");
        drop(d);
        let d = FileDevice::open(&path, 2 << 20, 1).unwrap();
        assert_eq!((d.size_bytes(), std::fs::metadata(&path).unwrap().len()), (2 << 20, 2 << 20));
        d.discard(0, 1 << 20).unwrap();
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [0; 5], "a punched hole reads as zeroes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
