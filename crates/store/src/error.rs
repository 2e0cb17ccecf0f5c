//! The one error type of the store, with an `errno()` bridge for front ends that answer a
//! kernel or a wire protocol (NBD replies and ublk completions carry errno values).

use thiserror::Error;

/// Everything that can go wrong in a store operation. Each variant says what was wrong and
/// carries the data needed to act on it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The request reaches past the end of the device. Counted as `invalid_io`.
    #[error("request at offset {offset} length {len} lies outside the device of {disksize_bytes} bytes")]
    OutOfRange { offset: u64, len: u64, disksize_bytes: u64 },

    /// Storing the page would take the pool over `mem_limit` (or the pool's address space is
    /// exhausted). Nothing stored before is affected: an overwrite that fails leaves the old
    /// contents readable.
    #[error("compressed memory is full ({used_bytes} of {limit_bytes} bytes in use): raise --mem-limit or add a backing device")]
    NoSpace { used_bytes: u64, limit_bytes: u64 },

    /// Stored data failed to decompress or failed its checksum. The page is reported as an I/O
    /// error, never returned as data.
    #[error("page {index} is corrupt: {reason}")]
    Corrupt { index: u64, reason: String },

    /// The backing device failed (read, write, or it is full).
    #[error("backing device error on page {index}: {reason}")]
    Backing { index: u64, reason: String },

    /// Cache mode: the origin failed a read, write, discard, zeroing or sync. The request
    /// fails; nothing read from a failed origin read is returned or cached.
    #[error("origin {origin}: {op} at byte {offset} failed: {reason}")]
    Origin { origin: String, op: &'static str, offset: u64, reason: String },

    /// The configuration cannot work (size zero, too large, unknown algorithm level, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl StoreError {
    /// The errno a front end should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            StoreError::OutOfRange { .. } => libc::EINVAL,
            StoreError::NoSpace { .. } => libc::ENOSPC,
            StoreError::Corrupt { .. } | StoreError::Backing { .. } | StoreError::Origin { .. } => libc::EIO,
            StoreError::Config(_) => libc::EINVAL,
        }
    }
}
