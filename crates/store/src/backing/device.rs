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
//! around the record, through an aligned bounce buffer. Writes are buffered `pwrite`s, made
//! durable by `sync`; with O_DIRECT reads, each write also starts the range's writeout
//! (`sync_file_range`), so that a later direct read does not have to wait for it.

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
    /// Reads exactly `buf.len()` bytes at `offset`; a short read is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
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
            let want = if size_bytes != 0 { size_bytes } else if meta.len() == 0 { default_bytes } else { meta.len() };
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

/// Reads `buf.len()` bytes at `offset` through O_DIRECT: the aligned blocks around them into
/// an aligned bounce buffer, then the bytes asked for.
fn read_direct(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let start = offset / ALIGN * ALIGN;
    let end = (offset + buf.len() as u64).div_ceil(ALIGN) * ALIGN;
    let n = (end - start) as usize;
    let mut bounce = vec![0u8; n + ALIGN as usize];
    let shift = bounce.as_ptr().align_offset(ALIGN as usize);
    let aligned = &mut bounce[shift..shift + n];
    file.read_exact_at(aligned, start)?;
    let from = (offset - start) as usize;
    buf.copy_from_slice(&aligned[from..from + buf.len()]);
    Ok(())
}

impl BackingDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(f) => read_direct(f, buf, offset),
            None => self.file.read_exact_at(buf, offset),
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
        drop(d);
        let d = FileDevice::open(&path, 2 << 20, 1).unwrap();
        assert_eq!((d.size_bytes(), std::fs::metadata(&path).unwrap().len()), (2 << 20, 2 << 20));
        d.discard(0, 1 << 20).unwrap();
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [0; 5], "a punched hole reads as zeroes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
