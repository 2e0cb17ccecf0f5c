//! # compcache-store
//!
//! The compressed page store behind compcache: a device of `disksize` bytes addressed in
//! 4 KiB pages (slots), each holding nothing, a same-filled page, a compressed page, or a raw
//! ("huge") page. It is a pure library: no sockets, no async runtime, no threads of its own.
//! Front ends (NBD, ublk) reach it through [`Store`] and nothing else.
//!
//! One job per file:
//! - [`slot`]: the slot table, its packed 16-byte entry and the per-slot lock (locking rules there);
//! - [`zspool`]: the allocator for compressed objects (size classes, zspages, handles, compaction);
//! - [`compress`]: the compressor front end and one file per backend;
//! - [`store`]: the read, write and discard paths;
//! - [`stats`]: the counters, with zram's and ramzswap's names;
//! - [`config`]: configuration and size expressions;
//! - [`backing`]: the backing tier (backing device, log-structured packing, writeback, GC).
//!
//! ## Concurrency
//! There is no global lock on the I/O path. A request locks only the slots it touches (one at
//! a time); the allocator locks one size class for an allocation or free; the page arena lock
//! is taken once per zspage created or destroyed. Compression runs outside every lock, in the
//! caller's [`Context`]. Create one [`Context`] per worker thread. The backing tier adds no
//! lock to the RAM path; its own locks and where they sit in the order are in `backing/mod.rs`
//! and `slot.rs`. Writeback and GC run only when a front end calls them, from a thread it owns.

pub mod backing;
pub mod compress;
pub mod config;
pub mod error;
mod mover;
pub(crate) mod slot;
pub mod stats;
pub mod store;
mod zeroed;
pub mod zspool;

pub use backing::{BackingDevice, DeviceOptions, FileDevice, GcReport, MaintenanceReport, WritebackBudget, WritebackReport};
pub use compress::Algorithm;
pub use config::{parse_size, physical_ram_bytes, BackingConfig, Config};
pub use error::StoreError;
pub use stats::Stats;
pub use store::{Allocation, Context, Extent, Extents, Store};

/// The page size the device is addressed in. Everything is in units of it.
pub const PAGE_SIZE: usize = 4096;
