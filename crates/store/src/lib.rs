//! # compcache-store
//!
//! The compressed page store behind compcache: a device of `disksize` bytes addressed in
//! 4 KiB pages (slots), each holding nothing, a same-filled page, a compressed page, a raw
//! ("huge") page, or a page on the backing device. It is a library: no sockets, no async
//! runtime, no threads of its own; its only I/O is the optional backing device's (a file or a
//! block device, `pread`/`pwrite` on the calling thread). Front ends (NBD, ublk, FUSE) reach it
//! through [`Store`] and nothing else.
//!
//! ## Floors
//! The top-level modules are floors: each imports only the floors below it, never one beside
//! or above it (`tests/module_cycles.rs` fails on any import cycle between them, naming it).
//! From the bottom:
//! 1. **The page and its buffers**, importing nothing of the crate: `page` (`PAGE_SIZE`,
//!    `PAGE`, the same-filled check and its inverse), `buf` (buffers made resident when made:
//!    the device-read and origin buffers), [`error`], [`latency`], `shm` (the state file: a
//!    memfd mapped shared, which outlives the process), `zeroed` (lazily-zeroed tables, in
//!    it or in memory of their own), [`units`] (the grammar of the sizes and durations people type, for every
//!    front end).
//! 2. **The codec and the allocator**: [`compress`] (the compressor front end, one file per
//!    backend, the codec a slot records, and the dictionaries with their trainer, as zram keeps
//!    them in `zcomp_params`; it knows nothing of slots, tiers or counters) and `zspool` (size
//!    classes, zspages, handles, compaction; its contract with its one user, the RAM layer).
//! 3. **What every tier shares**: `slot` (the slot table, its packed 16-byte entry and the
//!    per-slot lock: the locking rules), `journal` (what makes an entry change atomic for a
//!    process killed at any instruction), [`stats`] (every tier's counters, with zram's and
//!    ramzswap's names; the snapshot, the unit table, the summary), [`config`] (configuration,
//!    size expressions, and the constants it checks), `context` (the per-worker [`Context`]).
//! 4. **The RAM layer**, `ram`: the one owner of slots, pool, counters, clock, memory limit and
//!    dictionaries; the RAM half of the write and read paths (`Ram::classify`, `Ram::alloc`,
//!    `Ram::fetch`, `Ram::finish`) and the mover (`ram/mover.rs`: find, copy out, install, and
//!    who locks and frees what). The only code that touches the pool, and with it the slots.
//! 5. **The tiers**, each through the RAM layer and never through [`Store`]: [`backing`] (the
//!    device, log-structured records, space map, batch writer, writeback policy and promotion,
//!    GC, the read path of pages on the device), [`recompress`] (background recompression of
//!    idle and raw pages and its dictionary training), [`cache`] (cache mode, zcache: the
//!    store in front of an origin; its paths, S3-FIFO eviction, readahead, range locks).
//! 6. **The facade**, [`store`]: [`Store`] composes the layers and holds every public method;
//!    with no origin, the request paths over the RAM layer and the backing tier. Above it
//!    only [`request`] (one block request and its execution, for the front ends that decode
//!    their own protocol: ublk, FUSE) and `testing` (feature `testing`: what the tests share).
//!
//! Who touches what: the pool only the RAM layer. Slots are locked by the paths that serve a
//! request (the facade's, cache mode's) and read by the tiers through the mover, under the
//! rules in `slot.rs`; an entry taken out of a slot always goes back to the RAM layer
//! (`Mover::replaced`, `Mover::release`), which frees it once.
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
mod journal;
pub mod latency;
mod page;
pub(crate) mod ram;
pub mod recompress;
pub mod request;
mod shm;
pub(crate) mod slot;
pub mod stats;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod units;
mod zeroed;
pub(crate) mod zspool;

pub use backing::tuning::{WritebackSettings, WritebackTuning};
pub use backing::{BackingDevice, DeviceOptions, FileDevice, GcReport, MaintenanceReport, WritebackBudget, WritebackReport};
pub use cache::{FileOrigin, OriginDevice};
pub use compress::Algorithm;
pub use config::{physical_ram_bytes, BackingConfig, Config, DictSource, Medium, OriginConfig, RecompressConfig};
pub use context::{make_stack_resident, Context, SERVING_STACK_BYTES};
pub use error::StoreError;
pub use latency::{Latency, LatencyHistogram};
pub(crate) use page::PAGE;
pub use page::PAGE_SIZE;
pub use ram::Recovered as RecoveryReport;
pub use recompress::{RecompressReport, RecompressSettings, RecompressTuning};
pub use stats::Stats;
pub use store::{Allocation, Extent, Extents, Store, PREFAULT_CHUNK_PAGES};
pub use units::{parse_bytes, parse_duration, parse_secs, parse_size, parse_size_or_none};
