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
//! - `user_copy`: moving a request's data with `pread`/`pwrite` on the char device;
//! - [`buffers`]: the queues' buffers a standby makes before it waits;
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
//! cache, no FUA, no zoned mode, no zero copy; the data is moved with user copy
//! (`UBLK_F_USER_COPY`, target.rs "Data").
//!
//! ## Failure model
//! By default the device is created *without* `UBLK_F_USER_RECOVERY`: when the pages live
//! only in this process's memory, a server that restarted after a crash would have nothing to
//! serve and a device taken over by it would return zeros where the swap map expects data.
//! Without recovery the kernel aborts the device when the server dies: every queued and later
//! request fails with an I/O error (a swap-in error kills the process owning the page), never
//! with stale data.
//!
//! When the store's state outlives the process (`Store::state_fd`) and someone holds it to
//! start a successor (compcache's swap supervisor, systemd's file descriptor store), the caller
//! sets [`Options::user_recovery`]: the device is created with `UBLK_F_USER_RECOVERY |
//! UBLK_F_USER_RECOVERY_REISSUE`, so that when the server dies the kernel quiesces the device,
//! requeues the requests the dead server had taken, and holds all I/O until a successor calls
//! [`recover`] on the same device number with the store recovered from that state. Nothing is
//! guessed: the successor serves what the dead server stored (pages the store cannot vouch for
//! read as I/O errors). If no successor ever comes, the I/O waits (Linux 6.12 has no
//! `UBLK_F_USER_RECOVERY_FAIL_IO`) until the device is deleted ([`remove_orphan`]), which
//! fails it.

pub mod buffers;
pub mod error;
pub mod params;
pub mod request;
pub mod target;
mod user_copy;

pub use buffers::IoBuffers;
pub use error::Error;
pub use target::{kernel_support, recover, remove_orphan, serve, Device, Options, CONTROL_PATH};
