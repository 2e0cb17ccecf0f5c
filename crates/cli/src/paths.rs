//! Where sockets live by default, shared by every subcommand (and by `swapon` later).
//!
//! The NBD socket: `$COMPCACHE_SOCKET` if set; as root `/run/compcache/compcache.sock`;
//! otherwise `$XDG_RUNTIME_DIR/compcache.sock`, or `/tmp/compcache-$UID.sock` without it.
//! The control socket: the NBD socket path with `.ctl` appended.

use std::path::{Path, PathBuf};

/// The environment variable that overrides the default NBD socket path.
pub const SOCKET_ENV: &str = "COMPCACHE_SOCKET";

pub fn default_socket() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/compcache/compcache.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        Some(dir) => Path::new(&dir).join("compcache.sock"),
        None => PathBuf::from(format!("/tmp/compcache-{uid}.sock")),
    }
}

/// The control socket that belongs to an NBD socket path.
pub fn control_for(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".ctl");
    PathBuf::from(s)
}

/// The control socket to use when none is given: the default socket's.
pub fn default_control() -> PathBuf {
    control_for(&default_socket())
}
