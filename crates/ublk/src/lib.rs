//! # compcache-ublk
//!
//! The ublk front end: serves a [`compcache_store::Store`] as `/dev/ublkbN` through the
//! kernel's userspace block driver (`ublk_drv`, Linux 6.0+), built on the `libublk` crate.
//! The kernel hands block requests to this process over io_uring; each queue thread decodes
//! a request, calls the store once, and completes it.
//!
//! One job per file:
//! - [`request`]: decoding and validating one ublk I/O descriptor, and the one `match` that
//!   turns it into a store call (pure: unit-tested on any kernel);
//! - [`params`]: the device parameters we declare to the kernel (block sizes, discard);
//! - [`target`]: creating the device, the queue threads, readiness and clean shutdown;
//! - [`error`]: the error type, with an `errno()` bridge.
//!
//! ## Capabilities declared
//! Logical and physical block size of one page (4096), so every request is whole pages.
//! READ and WRITE go to the store; FLUSH completes with success once `Store::flush` returns,
//! at once: a completed write is in the store already (in RAM, or a record on the backing
//! device whose write returned) and every later read finds it, and the backing device is not
//! fsync'd, since the index of its records lives in this process's memory and an fsync would
//! make nothing durable (docs/backing.md, "Flush and FUA"); DISCARD and WRITE_ZEROES free
//! the slots, as the kernel's swap-free notification did for ramzswap and zram. No volatile
//! cache, no FUA, no zoned mode, no zero copy.
//!
//! ## Failure model
//! The device is created *without* `UBLK_F_USER_RECOVERY`: the pages live in this process's
//! memory, so a server that restarted after a crash would have nothing to serve and a device
//! taken over by it would return zeros where the swap map expects data. Without recovery the
//! kernel aborts the device when the server dies: every queued and later request fails with
//! an I/O error (a swap-in error kills the process owning the page), never with stale data.

pub mod error;
pub mod params;
pub mod request;
pub mod target;

pub use error::Error;
pub use target::{kernel_support, serve, Device, Options, CONTROL_PATH};
