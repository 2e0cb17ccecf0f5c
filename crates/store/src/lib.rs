//! # compcache-store
//!
//! The compressed page store behind compcache: a device of `disksize` bytes addressed in
//! 4 KiB pages (slots), each holding nothing, a same-filled page, a compressed page, a raw
//! ("huge") page, or a page on the backing device. It is a library: no sockets, no async
//! runtime, no threads of its own; its only I/O is the optional backing device's (a file or a
//! block device, `pread`/`pwrite` on the calling thread). Front ends (NBD, ublk, FUSE) reach it
//! through [`Store`] and nothing else.
//!
//! One job per file:
//! - [`store`]: every public method of [`Store`]: the read, write and discard paths (the RAM
//!   path), and one call into the backing tier for each maintenance method;
//! - `slot`: the slot table, its packed 16-byte entry and the per-slot lock (locking rules there);
//! - `mover`: the one internal interface for code that moves pages (writeback, GC, promotion,
//!   compaction; later cache mode and recompression): find, copy out, install; its contract says
//!   who locks and who frees what. With the RAM path, the only code touching slots and pool;
//! - `zspool`: the allocator for compressed objects (size classes, zspages, handles, compaction);
//! - [`compress`]: the compressor front end and one file per backend, and the codec a slot
//!   records;
//! - [`recompress`]: background recompression of idle and raw pages, and its dictionaries
//!   (`recompress::dict::train` is also what `compcache dict train` uses);
//! - [`request`]: one block request (operation, range, data) and its execution, for the front
//!   ends that decode their own protocol (ublk, FUSE);
//! - [`stats`]: the counters, with zram's and ramzswap's names, the snapshot, the unit table and
//!   the summary;
//! - [`config`]: configuration and size expressions;
//! - [`cache`]: cache mode (zcache): the store as a compressed cache in front of an origin
//!   device (its read, write and discard paths, S3-FIFO eviction, readahead, range locks);
//! - [`backing`]: the backing tier (device, log-structured records, space map, the batch writer,
//!   writeback policy and promotion, GC, the read path of pages on the device);
//! - `testing` (feature `testing`): helpers the tests share (a temporary directory, a
//!   fault-injecting backing device).
//!
//! ## Concurrency
//! There is no global lock on the I/O path. A request locks only the slots it touches (one at
//! a time); the allocator locks one size class for an allocation or free; the page arena lock
//! is taken once per zspage created or destroyed. Compression runs outside every lock, in the
//! caller's [`Context`]. Create one [`Context`] per worker thread. The backing tier adds no
//! lock to the RAM path; its own locks and where they sit in the order are in `backing/mod.rs`
//! and `slot.rs`. Writeback and GC run only when a front end calls them, from a thread it owns.

pub mod backing;
mod buf;
pub mod cache;
pub mod compress;
pub mod config;
mod context;
pub mod error;
pub mod latency;
mod mover;
mod page;
pub mod recompress;
pub mod request;
pub(crate) mod slot;
pub mod stats;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod zeroed;
pub(crate) mod zspool;

pub use backing::tuning::{WritebackSettings, WritebackTuning};
pub use backing::{BackingDevice, DeviceOptions, FileDevice, GcReport, MaintenanceReport, WritebackBudget, WritebackReport};
pub use cache::{FileOrigin, OriginDevice};
pub use compress::Algorithm;
pub use config::{parse_size, physical_ram_bytes, BackingConfig, Config, DictSource, Medium, OriginConfig, RecompressConfig};
pub use context::Context;
pub use error::StoreError;
pub use latency::{Latency, LatencyHistogram};
pub(crate) use page::PAGE;
pub use page::PAGE_SIZE;
pub use recompress::{RecompressReport, RecompressSettings, RecompressTuning};
pub use stats::Stats;
pub use store::{Allocation, Extent, Extents, Store};
