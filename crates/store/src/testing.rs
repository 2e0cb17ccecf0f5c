//! Helpers the store's tests share (and other crates' tests may use), behind the `testing`
//! feature, as libublk-rs shares its test helpers: a temporary directory and one backing
//! device for tests, in memory or over a real file, that fails on demand.

use parking_lot::Mutex;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::backing::{BackingDevice, DeviceOptions, FileDevice};

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
