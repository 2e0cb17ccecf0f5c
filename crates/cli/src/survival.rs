//! Whether a store's RAM state outlives its process, and taking it over: the two store calls a
//! takeover needs (`Store::state_fd`, `Store::recover`), in one place.
//!
//! The state is the store's sealed memfd (crates/store, `ram/recover.rs`): a holder that keeps
//! the descriptor open (swapon's supervisor, systemd's file descriptor store) lets a successor
//! take the device over after this process died at any instruction. A store with a backing
//! device, the cold tier or an origin keeps part of its state outside the file: `state_fd` is
//! then `None` and the store dies with its process, as before.

use std::os::fd::{BorrowedFd, OwnedFd};

use compcache_store::{Config, Store};

/// The descriptor holding `store`'s RAM state, when it outlives the process
/// (`Store::state_fd`); `None`: the store dies with its process.
pub fn state_fd(store: &Store) -> Option<BorrowedFd<'_>> {
    store.state_fd()
}

/// Takes over the state a dead or stopped store left in `fd` (`Store::recover`): the store, and
/// one line saying what was recovered. The error is one line saying why not.
pub fn recover(cfg: Config, fd: OwnedFd) -> Result<(Store, String), String> {
    let (store, report) = Store::recover(cfg, fd).map_err(|e| format!("{e}"))?;
    if report.lost_pages > 0 {
        crate::log::warning(&format!("{} page(s) could not be vouched for: they read as I/O errors until rewritten", report.lost_pages));
    }
    Ok((store, report.to_string()))
}
