//! Whether a store's RAM state outlives its process, and taking it over: the two store calls a
//! takeover needs (`Store::state_fd`, `Store::recover`), in one place.
//!
//! TEMPORARY TEST SHIM. `Store::state_fd` and `Store::recover` are being written on the branch
//! `shared-state` and are not in this tree yet. Until they are, every store's state dies with
//! its process (`state_fd` says `None`), except under `COMPCACHE_TEST_TAKEOVER_SHIM=1`, a test
//! switch that pretends otherwise so that the FUSE takeover mechanics can be tested: the
//! "state" is a memfd holding only the device's size, and `recover` makes an EMPTY store of
//! that size. Every page is lost at a takeover: with the switch on, a successor serves zeros
//! where data was. Never set it outside the tests (tests/test_takeover.py). When the store's
//! calls land, the two functions below call them and the switch goes.

use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use compcache_store::{Config, Store};

/// The test switch (module docs).
pub const TEST_SHIM_ENV: &str = "COMPCACHE_TEST_TAKEOVER_SHIM";

fn shim_on() -> bool {
    std::env::var_os(TEST_SHIM_ENV).is_some_and(|v| v == "1")
}

/// The shim's "state": one memfd per process, made on first use.
static SHIM_STATE: OnceLock<Option<OwnedFd>> = OnceLock::new();

fn shim_memfd(disksize_bytes: u64) -> Option<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name and flags; returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"compcache-test-shim-state".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    f.write_all(format!("compcache-test-shim v1 disksize={disksize_bytes}\n").as_bytes()).ok()?;
    Some(f.into())
}

/// The descriptor holding `store`'s RAM state, when it outlives the process
/// (`Store::state_fd`); `None`: the store dies with its process.
pub fn state_fd(store: &Store) -> Option<BorrowedFd<'_>> {
    if !shim_on() {
        return None;
    }
    SHIM_STATE.get_or_init(|| shim_memfd(store.disksize_bytes())).as_ref().map(|f| f.as_fd())
}

/// Takes over the state a dead or stopped store left in `fd` (`Store::recover`): the store, and
/// one line saying what was recovered. The error is one line saying why not.
pub fn recover(cfg: Config, fd: OwnedFd) -> Result<(Store, String), String> {
    if !shim_on() {
        return Err("this compcache cannot take a store's state over (Store::recover is not in this build)".into());
    }
    let mut f = std::fs::File::from(fd);
    let mut text = String::new();
    f.rewind().and_then(|_| f.read_to_string(&mut text)).map_err(|e| format!("reading the state: {e}"))?;
    let want = format!("compcache-test-shim v1 disksize={}\n", cfg.disksize_bytes);
    if text != want {
        return Err(format!("the state is not this device's: {:?}, expected {:?}", text.trim(), want.trim()));
    }
    let store = Store::new(cfg).map_err(|e| format!("{e}"))?;
    let _ = SHIM_STATE.set(Some(f.into()));
    Ok((store, "TEST SHIM: an empty store (no page was kept)".into()))
}
