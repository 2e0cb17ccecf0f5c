//! The backing device: a block device or a regular file, read and written with `pread` and
//! `pwrite` at byte offsets.
//!
//! [`BackingDevice`] is the narrow interface the backing tier uses, so that tests can stand a
//! failing device (EIO, ENOSPC, torn writes) in for the real file. [`FileDevice`] is the real
//! one.
//!
//! # Opening: what compcache takes, and what it refuses
//! The device holds other processes' swapped-out memory, so it is opened as the kernel treats
//! swap: private to its owner, used by one server at a time, and emptied when it is done.
//! - A missing path is created with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600 whatever the
//!   umask: never through a symbolic link, never another program's file that appeared at the
//!   same moment. It is a sparse regular file; [`FileDevice::created`] says so, and
//!   [`BackingDevice::remove_if_created`] removes it (only if the path still names it) when the
//!   start it was made for is refused.
//! - An existing path is opened with `O_NOFOLLOW` (a symbolic link is refused, unless it
//!   leads to a block device and it, and every link after it, belongs to root or this user,
//!   as udev's `/dev/disk/by-*` links do) and `O_EXCL`, which for a block device is the kernel's exclusive claim: a mounted
//!   device, an active swap device or one another program holds gives EBUSY, refused with a
//!   message that says so (for a regular file Linux ignores `O_EXCL` without `O_CREAT`).
//! - A regular file is locked with `flock(LOCK_EX | LOCK_NB)` for as long as it is open: a
//!   second server on the same file is refused with a message naming it.
//! - An existing regular file is taken only if it carries compcache's signature (the
//!   superblock below) and is private: owned by this user, mode without group or other bits,
//!   one link. Anything else is refused untouched, the message saying how to fix it (`chmod
//!   600`, another path), unless `force`: then it is taken over, set to mode 0600 and owned by
//!   this user. A block device is taken as it is (as zram's `backing_dev` and swap partitions
//!   are): its contents are destroyed.
//!
//! # Layout
//! ```text
//! 0 .. 4096                 superblock: MAGIC (24 bytes) | format version u32 LE | zeroes
//! 4096 .. 4096 + size_bytes the data area: what `read_at`/`write_at`/`discard` offsets address
//! ```
//! The superblock is written when the device is opened; it holds nothing about the data (the
//! index lives in the server's RAM, and records are useless to any other run: `seal.rs`).
//!
//! # Stale contents
//! The data area is discarded when the device is opened (not when a successor reopens it to
//! take a dead server's records over: [`FileDevice::reopen`]) and again by
//! [`BackingDevice::discard_all`] when the tier is closed (`Backing`'s drop, or
//! `Store::close_backing` from a server about to exit): a regular file is truncated to its
//! superblock and extended again (sparse, no page data left, on every file system); a block
//! device gets `BLKDISCARD` where it supports it (best effort: a line in the log where it does
//! not; records of another run never verify anyway). Freed segments are punched out of a file
//! (`FALLOC_FL_PUNCH_HOLE`) or discarded on a block device as GC frees them.
//!
//! # Reads and writes
//! Reads go through a second descriptor opened with `O_DIRECT` where the file system allows
//! it (not tmpfs): a page read back from the device then really comes from the device, not
//! from the host's page cache, which would be memory the server uses outside any limit (and
//! would flatter benchmarks against disk swap). It is the same file reopened through
//! `/proc/self/fd`, never the path again. The read covers the aligned 4 KiB blocks around the
//! record, in an aligned buffer: the worker's [`ReadBuf`] (the store keeps one in each
//! `Context`, sized when the context is made), so that a request's read allocates nothing.
//! Writes are buffered `pwrite`s; with O_DIRECT reads, each write also starts the range's
//! writeout (`sync_file_range`), so that a later direct read does not have to wait for it.
//! Nothing is ever fsync'd: the index of the records lives in the server's memory, so they
//! are useless once it is gone, and fsync would make nothing durable (see `Store::flush`).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

pub use crate::buf::ReadBuf;

/// What the backing tier needs from a device.
///
/// Contract: `write_at` returns only once the bytes are in the device's file (for a file: in
/// the page cache, so that a later `read_at` returns them). Offsets and lengths are any bytes
/// inside `0..size_bytes()`; the tier never writes the same byte range from two threads at
/// once. Errors are returned, never retried here: the tier turns them into a request error
/// and a log line. Records outlive the process only for a successor that takes the device
/// over (`keep.rs`), which reopens it by path: nothing is fsync'd.
pub trait BackingDevice: Send + Sync {
    /// Usable bytes.
    fn size_bytes(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`; a short read is an error. May allocate
    /// (GC's segment reads use it); the request path uses [`BackingDevice::read_into`].
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads exactly `len` bytes at `offset` into `scratch` and returns them (mutable: records
    /// are opened in place): the request path's read, which allocates nothing when `len <=
    /// scratch.max_bytes()` (a larger read grows `scratch` first). The default reads with
    /// `read_at` into the start of `scratch`.
    fn read_into<'a>(&self, scratch: &'a mut ReadBuf, offset: u64, len: usize) -> io::Result<&'a mut [u8]> {
        scratch.ensure(len);
        let buf = &mut scratch.mem[..len];
        self.read_at(buf, offset)?;
        Ok(buf)
    }
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Tells the device `offset..offset + len` holds nothing (punches a hole in a file,
    /// discards on a block device). May do nothing; the bytes read back as anything
    /// afterwards.
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// Discards the whole data area: the end (or the start) of the device's life, after which
    /// no page data of this run may be left on it. The default discards `0..size_bytes()`.
    fn discard_all(&self) -> io::Result<()> {
        self.discard(0, self.size_bytes())
    }
    /// Removes the file if this device created it and the path still names it: a start refused
    /// after the device was opened leaves nothing behind. Returns whether it removed it.
    fn remove_if_created(&self) -> io::Result<bool> {
        Ok(false)
    }
    /// For messages: the path or a name.
    fn describe(&self) -> String;
    /// RAM the device itself holds (the cold tier's compressed blocks, `memdev.rs`), counted
    /// in `mem_used_total`; 0 for a file or block device.
    fn mem_bytes(&self) -> u64 {
        0
    }
    /// Makes the calling thread ready to read without allocating or faulting in memory of its
    /// own (the cold tier's per-thread decompression state): called by `Store::context`, so an
    /// I/O thread pays at its start, not on its first read under memory pressure. Nothing to
    /// do for a file or block device.
    fn prepare_reader(&self) {}
    /// What names the device to a successor process ([`FileDevice::reopen`]); `None` for a
    /// device no other process can open again (the cold tier, a test's device): then the
    /// tier's state is not kept and the store is not taken over.
    fn identity(&self) -> Option<Identity> {
        None
    }
}

/// What names a backing device across processes: a successor that takes the device over checks
/// that the path it is given leads to the device the state file's records are on
/// (`keep.rs`), the same size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// A regular file: its file system's device number and its inode (`st_dev`, `st_ino`);
    /// 0 for a block device.
    pub dev: u64,
    pub ino: u64,
    /// A block device's number (`st_rdev`); 0 for a regular file.
    pub rdev: u64,
    /// Usable bytes (after the superblock).
    pub size_bytes: u64,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.rdev != 0 {
            write!(f, "block device {}:{}", libc::major(self.rdev), libc::minor(self.rdev))
        } else {
            write!(f, "file {} on device {}:{}", self.ino, libc::major(self.dev), libc::minor(self.dev))
        }
    }
}

fn identity_of(meta: &std::fs::Metadata, size_bytes: u64) -> Identity {
    if meta.file_type().is_block_device() {
        Identity { dev: 0, ino: 0, rdev: meta.rdev(), size_bytes }
    } else {
        Identity { dev: meta.dev(), ino: meta.ino(), rdev: 0, size_bytes }
    }
}

/// Bytes before the data area: the superblock (see the module docs). A multiple of the
/// O_DIRECT alignment, so that data offsets keep theirs.
pub const SUPERBLOCK_BYTES: u64 = 4096;
/// The signature at the start of every backing device compcache writes.
pub const MAGIC: &[u8; 24] = b"compcache backing device";
/// The format of the records (`log.rs`). 2: records carry the run identifier. Records never
/// outlive their run (the data area is discarded when the device opens), so the later change
/// to sealed records (`seal.rs`: 16-byte headers, encrypted by default) needs no new version:
/// a file of version 2 is taken as before.
pub const FORMAT_VERSION: u32 = 2;

/// `ioctl(BLKDISCARD)`: `_IO(0x12, 119)`, a `[u64; 2]` byte range.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Usable bytes (after the superblock); 0: a block device's size, an existing file's size,
    /// or `default_bytes` for a new file.
    pub size_bytes: u64,
    /// The usable bytes of a new (or empty) file when `size_bytes` is 0.
    pub default_bytes: u64,
    /// Fewer usable bytes than this are refused, before anything is written.
    pub min_bytes: u64,
    /// Take over an existing regular file without compcache's signature, or one that is not
    /// private (wrong mode, owner, links): it is set to mode 0600 and this user.
    pub force: bool,
}

/// A block device or regular file.
pub struct FileDevice {
    file: File,
    /// The same file opened with O_DIRECT, for reads; `None` where O_DIRECT is refused.
    direct: Option<File>,
    path: PathBuf,
    /// Usable bytes, after the superblock.
    size_bytes: u64,
    regular: bool,
    /// This open created the file.
    created: bool,
    /// The block device refused a discard: do not ask again.
    no_discard: AtomicBool,
    identity: Identity,
}

/// An error about the path, with what to do.
fn refuse(path: &Path, kind: io::ErrorKind, what: String) -> io::Error {
    io::Error::new(kind, format!("{}: {what}", path.display()))
}

impl FileDevice {
    /// Opens `path` for reading and writing as the module docs say: creates a missing file
    /// (mode 0600, sparse), refuses symbolic links, foreign or shared files (unless
    /// `opts.force`), and devices or files in use; locks it; writes the superblock; discards
    /// the data area. A regular file gets `SUPERBLOCK_BYTES` + the usable size.
    pub fn open(path: &Path, opts: DeviceOptions) -> io::Result<FileDevice> {
        let (file, created) = open_or_create(path)?;
        let dev = (|| {
            let meta = file.metadata()?;
            let ft = meta.file_type();
            if ft.is_block_device() {
                return FileDevice::block(path, file.try_clone()?, opts);
            }
            if !ft.is_file() {
                return Err(refuse(path, io::ErrorKind::InvalidInput, "is neither a block device nor a regular file".into()));
            }
            lock(path, &file)?;
            if !created {
                check_existing(path, &file, &meta, opts.force)?;
            }
            let len = meta.len();
            let usable = match opts.size_bytes {
                0 if !created && len > SUPERBLOCK_BYTES => len - SUPERBLOCK_BYTES,
                0 => opts.default_bytes,
                n => n,
            };
            too_small(path, usable, opts.min_bytes)?;
            // No page data of an earlier run survives: truncate to the superblock (which frees
            // every block on every file system) and extend, sparse, to the size wanted.
            file.set_len(0)?;
            file.set_len(SUPERBLOCK_BYTES + usable)?;
            write_superblock(&file)?;
            Ok(FileDevice {
                direct: reopen_direct(&file),
                file: file.try_clone()?,
                path: path.to_path_buf(),
                size_bytes: usable,
                regular: true,
                created,
                no_discard: AtomicBool::new(false),
                identity: identity_of(&meta, usable),
            })
        })();
        if dev.is_err() && created {
            // Refused after we made it: take away what we made (only that: we still hold it).
            let _ = remove_if_same(path, &file);
        }
        dev
    }

    fn block(path: &Path, file: File, opts: DeviceOptions) -> io::Result<FileDevice> {
        let dev_bytes = (&file).seek(SeekFrom::End(0))?;
        let avail = dev_bytes.saturating_sub(SUPERBLOCK_BYTES);
        if opts.size_bytes > avail {
            return Err(refuse(
                path,
                io::ErrorKind::InvalidInput,
                format!(
                    "the block device has {avail} usable bytes (after a {SUPERBLOCK_BYTES}-byte superblock), fewer than the {} asked for",
                    opts.size_bytes
                ),
            ));
        }
        let usable = if opts.size_bytes == 0 { avail } else { opts.size_bytes };
        too_small(path, usable, opts.min_bytes)?;
        write_superblock(&file)?;
        let d = FileDevice {
            direct: reopen_direct(&file),
            identity: identity_of(&file.metadata()?, usable),
            file,
            path: path.to_path_buf(),
            size_bytes: usable,
            regular: false,
            created: false,
            no_discard: AtomicBool::new(false),
        };
        d.discard_all()?;
        Ok(d)
    }

    /// Opens `path` again for a successor that takes a dead server's device over (`keep.rs`):
    /// as [`FileDevice::open`] opens an existing one (no symbolic link but a trusted one to a
    /// block device, the exclusive claim, the lock, a regular file's signature and privacy),
    /// but it must be the device `want` names, of its size, and nothing on it is changed: no
    /// superblock written, no discard (the records are the dead server's, and the successor
    /// reads them). The dead server's lock died with it.
    pub fn reopen(path: &Path, want: Identity) -> io::Result<FileDevice> {
        let file = match open_existing(path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => match trusted_link_to_block_device(path) {
                Some(real) => open_existing(&real).map_err(|e| refuse(path, e.kind(), format!("cannot open it: {e}")))?,
                None => {
                    return Err(refuse(
                        path,
                        e.kind(),
                        "is a symbolic link not to a block device, or not owned by root or this user".into(),
                    ))
                }
            },
            Err(e) => return Err(refuse(path, e.kind(), format!("cannot open it: {e}"))),
        };
        let meta = file.metadata()?;
        let ft = meta.file_type();
        let avail = if ft.is_block_device() {
            (&file).seek(SeekFrom::End(0))?.saturating_sub(SUPERBLOCK_BYTES)
        } else if ft.is_file() {
            lock(path, &file)?;
            check_existing(path, &file, &meta, false)?;
            meta.len().saturating_sub(SUPERBLOCK_BYTES)
        } else {
            return Err(refuse(path, io::ErrorKind::InvalidInput, "is neither a block device nor a regular file".into()));
        };
        let got = identity_of(&meta, want.size_bytes);
        if (got.dev, got.ino, got.rdev) != (want.dev, want.ino, want.rdev) {
            return Err(refuse(
                path,
                io::ErrorKind::InvalidInput,
                format!("is {got}, but the state file's records are on {want}: give the backing path the device was started with"),
            ));
        }
        let fits = if ft.is_file() { avail == want.size_bytes } else { avail >= want.size_bytes };
        if !fits {
            return Err(refuse(
                path,
                io::ErrorKind::InvalidInput,
                format!(
                    "has {avail} usable bytes, but the state file's records are on a device of {} bytes: it was resized",
                    want.size_bytes
                ),
            ));
        }
        Ok(FileDevice {
            direct: reopen_direct(&file),
            file,
            path: path.to_path_buf(),
            size_bytes: want.size_bytes,
            regular: ft.is_file(),
            created: false,
            no_discard: AtomicBool::new(false),
            identity: want,
        })
    }

    /// Whether reads bypass the page cache (O_DIRECT).
    pub fn direct_reads(&self) -> bool {
        self.direct.is_some()
    }

    /// Whether this open created the file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// BLKDISCARD of `offset..offset + len` of the data area, best effort: a device that
    /// cannot is logged once and not asked again.
    fn blk_discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 || self.no_discard.load(Relaxed) {
            return Ok(());
        }
        let range: [u64; 2] = [SUPERBLOCK_BYTES + offset, len];
        // SAFETY: BLKDISCARD reads a `[u64; 2]` (start, length) from the pointer, which points
        // to `range`, alive for the call; the descriptor is ours.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => {
                if !self.no_discard.swap(true, Relaxed) {
                    compcache_log::warning(
                        "compcache",
                        &format!(
                            "backing device {}: no discard support ({e}): freed space keeps its old bytes until overwritten (records of another run never verify)",
                            self.path.display()
                        ),
                    );
                }
                Ok(())
            }
            _ => Err(e),
        }
    }
}

fn too_small(path: &Path, usable: u64, min_bytes: u64) -> io::Result<()> {
    if usable >= min_bytes {
        return Ok(());
    }
    Err(refuse(
        path,
        io::ErrorKind::InvalidInput,
        format!("{usable} usable bytes are too few: at least {min_bytes} are needed (--backing-size)"),
    ))
}

/// Creates `path` exclusively (0600, no symlink), or opens what is there without following a
/// symbolic link and, for a block device, claiming it exclusively. Returns the file and
/// whether it was created.
fn open_or_create(path: &Path) -> io::Result<(File, bool)> {
    for _ in 0..3 {
        let created = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path);
        match created {
            Ok(f) => {
                // The umask can only take bits away from 0600; make it exactly 0600.
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                return Ok((f, true));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(refuse(path, e.kind(), format!("cannot create it: {e}"))),
        }
        let existing = match open_existing(path) {
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => match trusted_link_to_block_device(path) {
                Some(real) => open_existing(&real).and_then(|f| match f.metadata()?.file_type().is_block_device() {
                    true => Ok(f),
                    false => Err(io::Error::from_raw_os_error(libc::ELOOP)),
                }),
                None => Err(e),
            },
            r => r,
        };
        match existing {
            Ok(f) => return Ok((f, false)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // removed meanwhile: create it
            Err(e) => {
                let what = match e.raw_os_error() {
                    Some(libc::ELOOP) => "is a symbolic link: compcache follows one only to a block device, and only a link owned by root or this user (as udev's /dev/disk/by-* links); another user could point it at any file; give the path of the file or device itself".to_string(),
                    Some(libc::EBUSY) => "is in use (mounted, active swap, or claimed by another program such as another compcache server): the kernel refused the exclusive open; free it or give another device".to_string(),
                    _ => format!("cannot open it: {e}"),
                };
                return Err(refuse(path, e.kind(), what));
            }
        }
    }
    Err(refuse(path, io::ErrorKind::Other, "appears and disappears while it is being opened: is another program using it?".into()))
}

/// Opens what is at `path` without following a final symbolic link; `O_EXCL` claims a block
/// device exclusively (Linux ignores it for a regular file without `O_CREAT`).
fn open_existing(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_EXCL | libc::O_CLOEXEC).open(path)
}

/// Where a symbolic link at `path` leads, if compcache may follow it: to a block device, and
/// every link on the way belongs to root or to this user (udev's /dev/disk/by-* links, and
/// chains of them such as LVM's). A link someone else planted is never followed, also not as
/// the second link of a chain that starts with a trusted one.
pub(crate) fn trusted_link_to_block_device(path: &Path) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mut at = path.to_path_buf();
    // At most 40 links, the kernel's MAXSYMLINKS.
    for _ in 0..40 {
        let meta = std::fs::symlink_metadata(&at).ok()?;
        if !meta.file_type().is_symlink() {
            return meta.file_type().is_block_device().then_some(at);
        }
        if meta.uid() != 0 && meta.uid() != uid {
            return None;
        }
        let target = std::fs::read_link(&at).ok()?;
        at = match at.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    None
}

/// One server per backing file: an exclusive, non-blocking `flock` held as long as the file
/// is open (it goes with the descriptor).
fn lock(path: &Path, file: &File) -> io::Result<()> {
    // SAFETY: flock on a descriptor we own; integer arguments only.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(refuse(
            path,
            io::ErrorKind::WouldBlock,
            "is in use by another compcache server (it holds the file's lock): stop that server or give another path".into(),
        ));
    }
    Err(refuse(path, e.kind(), format!("cannot lock it: {e}")))
}

/// The checks an existing regular file must pass before it is reused (module docs).
fn check_existing(path: &Path, file: &File, meta: &std::fs::Metadata, force: bool) -> io::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mode = meta.mode() & 0o7777;
    let mut sb = [0u8; MAGIC.len() + 4];
    let signed = meta.len() >= SUPERBLOCK_BYTES && file.read_exact_at(&mut sb, 0).is_ok() && sb[..MAGIC.len()] == MAGIC[..];
    let version = u32::from_le_bytes(sb[MAGIC.len()..].try_into().expect("4 bytes"));
    let problem = if !signed {
        Some(format!(
            "exists and is not a compcache backing file (no signature in its first {SUPERBLOCK_BYTES} bytes): using it would destroy its contents; remove it or choose another path (or pass --force to take it over)"
        ))
    } else if version != FORMAT_VERSION {
        Some(format!("is a compcache backing file of format {version}, not {FORMAT_VERSION}: remove it (or pass --force to take it over)"))
    } else if meta.uid() != uid {
        Some(format!(
            "belongs to uid {}, not to this user (uid {uid}): its owner could read swapped-out memory; remove it or choose another path (or pass --force to take it over)",
            meta.uid()
        ))
    } else if mode & 0o077 != 0 {
        Some(format!(
            "has mode {mode:04o}: group or other users could read swapped-out memory; run `chmod 600 {}` (or pass --force, which does that)",
            path.display()
        ))
    } else if meta.nlink() != 1 {
        Some(format!(
            "has {} hard links: another name could read swapped-out memory; remove the other links (or pass --force)",
            meta.nlink()
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) if !force => Err(refuse(path, io::ErrorKind::PermissionDenied, p)),
        Some(p) => {
            compcache_log::warning("compcache", &format!("backing file {}: {p}; taking it over (--force)", path.display()));
            if meta.uid() != uid {
                std::os::unix::fs::fchown(file, Some(uid), None)
                    .map_err(|e| refuse(path, e.kind(), format!("--force: cannot make it this user's: {e}")))?;
            }
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(|e| refuse(path, e.kind(), format!("--force: cannot set mode 0600: {e}")))
        }
    }
}

fn write_superblock(file: &File) -> io::Result<()> {
    let mut sb = vec![0u8; SUPERBLOCK_BYTES as usize];
    sb[..MAGIC.len()].copy_from_slice(MAGIC);
    sb[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    file.write_all_at(&sb, 0)
}

/// The same open file again, with O_DIRECT, through `/proc/self/fd` (never the path, which
/// could name something else by now); `None` where that fails.
fn reopen_direct(file: &File) -> Option<File> {
    let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    OpenOptions::new().read(true).custom_flags(libc::O_DIRECT | libc::O_CLOEXEC).open(fd_path).ok()
}

/// Removes `path` if it still names the file `file` is open on.
fn remove_if_same(path: &Path, file: &File) -> io::Result<bool> {
    let ours = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.dev() == ours.dev() && m.ino() == ours.ino() => std::fs::remove_file(path).map(|()| true),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// O_DIRECT alignment of offsets, lengths and buffers.
const ALIGN: u64 = 4096;

/// Reads `len` bytes at `offset` through O_DIRECT: the aligned blocks around them into
/// `scratch`; returns the bytes asked for.
fn read_direct<'a>(file: &File, scratch: &'a mut ReadBuf, offset: u64, len: usize) -> io::Result<&'a mut [u8]> {
    let start = offset / ALIGN * ALIGN;
    let end = (offset + len as u64).div_ceil(ALIGN) * ALIGN;
    scratch.ensure(len);
    // The span is at most `len` rounded up plus one block, which `ensure` left room for.
    let aligned = scratch.aligned((end - start) as usize);
    file.read_exact_at(aligned, start)?;
    let from = (offset - start) as usize;
    Ok(&mut aligned[from..from + len])
}

impl BackingDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let offset = SUPERBLOCK_BYTES + offset;
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

    fn read_into<'a>(&self, scratch: &'a mut ReadBuf, offset: u64, len: usize) -> io::Result<&'a mut [u8]> {
        let offset = SUPERBLOCK_BYTES + offset;
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
        let offset = SUPERBLOCK_BYTES + offset;
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

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.regular {
            return self.blk_discard(offset, len);
        }
        // SAFETY: fallocate on a file descriptor we own, with plain integer arguments; it
        // touches no memory of this process.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (SUPERBLOCK_BYTES + offset) as libc::off_t,
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

    fn discard_all(&self) -> io::Result<()> {
        if !self.regular {
            return self.blk_discard(0, self.size_bytes);
        }
        // Truncating frees every block on every file system (punching may be unsupported).
        // The superblock goes too and is written again: the file stays recognisably ours.
        self.file.set_len(0)?;
        self.file.set_len(SUPERBLOCK_BYTES + self.size_bytes)?;
        write_superblock(&self.file)
    }

    fn remove_if_created(&self) -> io::Result<bool> {
        if !self.created {
            return Ok(false);
        }
        remove_if_same(&self.path, &self.file)
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn identity(&self) -> Option<Identity> {
        Some(self.identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(size_bytes: u64, default_bytes: u64) -> DeviceOptions {
        DeviceOptions { size_bytes, default_bytes, ..Default::default() }
    }

    #[test]
    fn a_missing_file_is_created_sparse_after_its_superblock_and_resized_on_reuse() {
        let dir = std::env::temp_dir().join(format!("compcache-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("backing");
        let _ = std::fs::remove_file(&path);
        let d = FileDevice::open(&path, opts(0, 1 << 20)).unwrap();
        assert!(d.created());
        assert_eq!(d.size_bytes(), 1 << 20);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), SUPERBLOCK_BYTES + (1 << 20));
        assert_eq!(&std::fs::read(&path).unwrap()[..MAGIC.len()], MAGIC, "signed");
        d.write_at(b"hello", 4096).unwrap();
        let mut b = [0u8; 5];
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(&b, b"hello");
        assert_eq!(&std::fs::read(&path).unwrap()[(SUPERBLOCK_BYTES + 4096) as usize..][..5], b"hello", "after the superblock");
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
        d.discard(0, 1 << 16).unwrap();
        d.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [0; 5], "a punched hole reads as zeroes");
        drop(d);
        let d = FileDevice::open(&path, opts(2 << 20, 1)).unwrap();
        assert!(!d.created(), "ours, reused");
        assert_eq!((d.size_bytes(), std::fs::metadata(&path).unwrap().len()), (2 << 20, SUPERBLOCK_BYTES + (2 << 20)));
        let mut back = vec![1u8; 5000];
        d.read_at(&mut back, 8190).unwrap();
        assert!(back.iter().all(|&b| b == 0), "nothing of the earlier run is left");
        drop(d);
        let d = FileDevice::open(&path, opts(0, 1)).unwrap();
        assert_eq!(d.size_bytes(), 2 << 20, "an existing file's size, less the superblock");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_reopen_takes_only_the_same_device_of_the_same_size_and_changes_nothing() {
        let dir = std::env::temp_dir().join(format!("compcache-reopen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let d = FileDevice::open(&a, opts(0, 1 << 20)).unwrap();
        d.write_at(b"a dead server's record", 8000).unwrap();
        let id = d.identity().unwrap();
        drop(d); // as a kill would: nothing discarded
        let r = FileDevice::reopen(&a, id).unwrap();
        let mut back = [0u8; 22];
        r.read_at(&mut back, 8000).unwrap();
        assert_eq!(&back, b"a dead server's record", "not discarded");
        assert_eq!((r.size_bytes(), r.created()), (1 << 20, false));
        let e = FileDevice::reopen(&a, id).err().unwrap().to_string();
        assert!(e.contains("in use by another compcache server"), "{e}");
        drop(r);
        drop(FileDevice::open(&b, opts(0, 1 << 20)).unwrap());
        let e = FileDevice::reopen(&b, id).err().unwrap().to_string();
        assert!(e.contains("/b: is file") && e.contains("records are on file"), "another file: {e}");
        let e = FileDevice::reopen(&a, Identity { size_bytes: 2 << 20, ..id }).err().unwrap().to_string();
        assert!(e.contains("resized"), "another size: {e}");
        let e = FileDevice::reopen(&dir.join("gone"), id).err().unwrap().to_string();
        assert!(e.contains("cannot open it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
