//! Helpers the store's tests share (and other crates' tests may use), behind the `testing`
//! feature, as libublk-rs shares its test helpers: a temporary directory, one backing device
//! and one cache-mode origin for tests, each in memory or over a real file, that fail on
//! demand.

use parking_lot::Mutex;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::backing::{BackingDevice, DeviceOptions, FileDevice};
use crate::cache::OriginDevice;

/// `len` bytes of incompressible noise from `seed` (xorshift64): the same bytes for the same
/// seed, different bytes for different seeds (a seed of 0 is taken as 1: xorshift stays at 0).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A temporary directory, removed on drop (also when a test fails).
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new, empty directory named after `what`, this process and a counter.
    pub fn new(what: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!("compcache-{what}-{}-{}", std::process::id(), N.fetch_add(1, Relaxed)));
        std::fs::create_dir_all(&p).expect("create a temporary directory");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The backing file's path in it (not created).
    pub fn file(&self) -> PathBuf {
        self.0.join("backing.img")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Switches a test flips to make a [`TestDevice`] fail, and what it counted.
#[derive(Default, Debug)]
pub struct Faults {
    /// Writes fail with EIO.
    pub fail_writes: AtomicBool,
    /// Reads fail with EIO.
    pub fail_reads: AtomicBool,
    /// Writes fail with ENOSPC.
    pub full: AtomicBool,
    /// Successful writes and reads so far.
    pub writes: AtomicU64,
    pub reads: AtomicU64,
}

enum Media {
    Memory(Mutex<Vec<u8>>),
    File(FileDevice),
}

/// A backing device for tests: in memory, or a real file; either fails as its [`Faults`] say.
pub struct TestDevice {
    media: Media,
    faults: Arc<Faults>,
}

impl TestDevice {
    /// `bytes` of zeroed memory.
    pub fn memory(bytes: usize) -> TestDevice {
        TestDevice { media: Media::Memory(Mutex::new(vec![0; bytes])), faults: Arc::default() }
    }

    /// A real backing file at `path`, opened as the store would open it.
    pub fn file(path: &Path, opts: DeviceOptions) -> io::Result<TestDevice> {
        Ok(TestDevice { media: Media::File(FileDevice::open(path, opts)?), faults: Arc::default() })
    }

    /// The switches of this device (keep a clone before handing the device to a store).
    pub fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }
}

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

impl BackingDevice for TestDevice {
    fn size_bytes(&self) -> u64 {
        match &self.media {
            Media::Memory(m) => m.lock().len() as u64,
            Media::File(f) => f.size_bytes(),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.faults.fail_reads.load(Relaxed) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        self.faults.reads.fetch_add(1, Relaxed);
        match &self.media {
            Media::Memory(m) => {
                buf.copy_from_slice(&m.lock()[offset as usize..][..buf.len()]);
                Ok(())
            }
            Media::File(f) => f.read_at(buf, offset),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.faults.fail_writes.load(Relaxed) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        if self.faults.full.load(Relaxed) {
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        self.faults.writes.fetch_add(1, Relaxed);
        match &self.media {
            Media::Memory(m) => {
                m.lock()[offset as usize..][..buf.len()].copy_from_slice(buf);
                Ok(())
            }
            Media::File(f) => f.write_at(buf, offset),
        }
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        match &self.media {
            Media::Memory(m) => {
                m.lock()[offset as usize..][..len as usize].fill(0);
                Ok(())
            }
            Media::File(f) => f.discard(offset, len),
        }
    }

    fn describe(&self) -> String {
        match &self.media {
            Media::Memory(_) => "test memory".into(),
            Media::File(f) => format!("faulty {}", f.describe()),
        }
    }
}

/// Switches a test flips to make a [`FaultyOrigin`] fail, and what it counted.
#[derive(Default, Debug)]
pub struct OriginFaults {
    /// Reads fail with EIO.
    pub fail_reads: AtomicBool,
    /// Reads return short: they fill only the first half of the buffer and fail as a short
    /// read does (`UnexpectedEof`), the rest of the buffer overwritten with garbage.
    pub short_reads: AtomicBool,
    /// Writes fail with EIO after writing the first page of the request (a torn write: the
    /// origin holds part of it).
    pub fail_writes: AtomicBool,
    /// Syncs fail with EIO.
    pub fail_syncs: AtomicBool,
    /// Discards and zeroing fail with EIO (after doing nothing).
    pub fail_discards: AtomicBool,
    /// Successful operations so far.
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub syncs: AtomicU64,
}

enum OriginMedia {
    Memory(Mutex<Vec<u8>>),
    File(crate::cache::FileOrigin),
}

/// An origin for tests: in memory, or a real file opened as the store opens one; either
/// fails as its [`OriginFaults`] say and counts what succeeded (the front ends' FUA and FLUSH
/// tests count its syncs).
pub struct FaultyOrigin {
    media: OriginMedia,
    faults: Arc<OriginFaults>,
}

impl FaultyOrigin {
    /// `bytes` of memory holding `init` (zero-padded).
    pub fn memory(bytes: usize, init: &[u8]) -> FaultyOrigin {
        let mut v = vec![0; bytes];
        v[..init.len()].copy_from_slice(init);
        FaultyOrigin { media: OriginMedia::Memory(Mutex::new(v)), faults: Arc::default() }
    }

    /// The image at `path`, opened as `FileOrigin::open` does.
    pub fn file(path: &Path) -> Result<FaultyOrigin, crate::StoreError> {
        Ok(FaultyOrigin { media: OriginMedia::File(crate::cache::FileOrigin::open(path)?), faults: Arc::default() })
    }

    /// The switches (keep a clone before handing the origin to a store).
    pub fn faults(&self) -> Arc<OriginFaults> {
        self.faults.clone()
    }
}

impl OriginDevice for FaultyOrigin {
    fn size_bytes(&self) -> u64 {
        match &self.media {
            OriginMedia::Memory(m) => m.lock().len() as u64,
            OriginMedia::File(f) => f.size_bytes(),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.faults.fail_reads.load(Relaxed) {
            buf.fill(0xee);
            return Err(io::Error::from_raw_os_error(EIO));
        }
        if self.faults.short_reads.load(Relaxed) {
            let half = buf.len() / 2;
            self.read_media(&mut buf[..half], offset)?;
            buf[half..].fill(0xee);
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read (injected)"));
        }
        self.read_media(buf, offset)?;
        self.faults.reads.fetch_add(1, Relaxed);
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if self.faults.fail_writes.load(Relaxed) {
            let torn = data.len().min(crate::PAGE_SIZE);
            self.write_media(&data[..torn], offset)?;
            return Err(io::Error::from_raw_os_error(EIO));
        }
        self.write_media(data, offset)?;
        self.faults.writes.fetch_add(1, Relaxed);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.faults.fail_syncs.load(Relaxed) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        if let OriginMedia::File(f) = &self.media {
            f.sync()?;
        }
        self.faults.syncs.fetch_add(1, Relaxed);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.faults.fail_discards.load(Relaxed) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        match &self.media {
            OriginMedia::Memory(m) => {
                m.lock()[offset as usize..][..len as usize].fill(0);
                Ok(())
            }
            OriginMedia::File(f) => f.discard(offset, len),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.faults.fail_discards.load(Relaxed) {
            return Err(io::Error::from_raw_os_error(EIO));
        }
        match &self.media {
            OriginMedia::Memory(m) => {
                m.lock()[offset as usize..][..len as usize].fill(0);
                Ok(())
            }
            OriginMedia::File(f) => f.write_zeroes(offset, len),
        }
    }

    fn extent_at(&self, offset: u64) -> Option<(bool, u64)> {
        match &self.media {
            OriginMedia::Memory(_) => None,
            OriginMedia::File(f) => f.extent_at(offset),
        }
    }

    fn describe(&self) -> String {
        match &self.media {
            OriginMedia::Memory(_) => "test origin in memory".into(),
            OriginMedia::File(f) => format!("faulty {}", f.describe()),
        }
    }
}

impl FaultyOrigin {
    fn read_media(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.media {
            OriginMedia::Memory(m) => {
                let m = m.lock();
                let end = offset as usize + buf.len();
                if end > m.len() {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"));
                }
                buf.copy_from_slice(&m[offset as usize..end]);
                Ok(())
            }
            OriginMedia::File(f) => f.read_at(buf, offset),
        }
    }

    fn write_media(&self, data: &[u8], offset: u64) -> io::Result<()> {
        match &self.media {
            OriginMedia::Memory(m) => {
                m.lock()[offset as usize..][..data.len()].copy_from_slice(data);
                Ok(())
            }
            OriginMedia::File(f) => f.write_at(data, offset),
        }
    }
}

/// Where each part of a store's state file is, in bytes from its start (`ram/layout.rs`; from
/// [`crate::Store::state_regions`]): for tests that damage it on purpose. Slots are 16 bytes
/// (meta word, then data word: `slot.rs`), page descriptors 20 (`next`, `inuse`, `free_head`,
/// `list_prev`, `list_next`, each a u32: `zspool/arena.rs`), journal records 64.
#[derive(Debug, Clone, Copy)]
pub struct StateRegions {
    pub journal: usize,
    pub dicts: usize,
    pub slots: usize,
    pub descs: usize,
    pub pages: usize,
    pub len: usize,
    pub num_pages: u64,
    pub capacity_pages: u64,
}
