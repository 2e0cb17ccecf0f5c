//! Where sockets live by default, shared by every subcommand (and by `swapon` later).
//!
//! The NBD socket: `$COMPCACHE_SOCKET` if set; otherwise `compcache.sock` in the default
//! directory: as root `/run/compcache`; otherwise `$XDG_RUNTIME_DIR/compcache`, or
//! `/tmp/compcache-$UID` without it. The control socket: the NBD socket path with `.ctl`
//! appended.
//!
//! The default directory is private: `compcache serve` creates it mode 0700 and refuses to
//! use one that is not a directory of its own user, or that others can write ([`private_dir`]),
//! so another user cannot squat the path (a fixed name in /tmp could be taken by anyone before
//! the server starts). Clients check the owner of the socket and of its directory before they
//! believe it (`compcache_control::check_trusted`).

use std::path::{Path, PathBuf};

/// Where compcache swap is enabled from: a block device node of the device's own number named
/// `/dev/zram-compcache-<device>`. /proc/swaps shows the name swapon was given, and systemd,
/// choosing where to write a hibernation image when `resume=` is not set, skips exactly the
/// swap partitions whose name starts with `/dev/zram` (src/shared/hibernate-util.c,
/// `read_swap_entries`): with this name compcache swap, which lives in RAM, is never chosen, as
/// zram is not. (With `resume=` set, systemd uses only that device.) docs/swap.md,
/// "Hibernation".
pub const HIBERNATION_SAFE_PREFIX: &str = "/dev/zram-compcache-";

/// The environment variable that overrides the default NBD socket path.
pub const SOCKET_ENV: &str = "COMPCACHE_SOCKET";

/// The directory the default sockets are in (see the module docs).
pub fn default_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/compcache");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        Some(dir) => Path::new(&dir).join("compcache"),
        None => PathBuf::from(format!("/tmp/compcache-{uid}")),
    }
}

pub fn default_socket() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    default_dir().join("compcache.sock")
}

/// Creates `dir` mode 0700 if it does not exist (its parent must), and checks that it is a
/// directory (not a link) of this user that no other user can write: a server binds its
/// socket there only then. The error says what is wrong and what to do.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    private_dir_for(dir, me)
}

fn private_dir_for(dir: &Path, me: u32) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create the socket directory {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let fix = format!("remove it if it is not yours (it may have been made to squat your socket), or set {SOCKET_ENV} or --socket");
    if !meta.file_type().is_dir() {
        return Err(format!("{} is not a directory (a link or a file): {fix}", dir.display()));
    }
    if meta.uid() != me {
        return Err(format!("socket directory {} belongs to uid {}, not to you (uid {me}): {fix}", dir.display(), meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "socket directory {} has mode {:o}: other users can write it; `chmod 700 {}`",
            dir.display(),
            meta.mode() & 0o7777,
            dir.display()
        ));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn temp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("compcache-paths-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        p
    }

    #[test]
    fn the_default_directory_is_made_private() {
        let dir = temp("new");
        private_dir(&dir).unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        private_dir(&dir).expect("an existing private directory of ours is fine");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_squatted_directory_is_refused() {
        let dir = temp("squat");
        std::fs::create_dir(&dir).unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        // Owned by someone else: pretend to be another user (no chown needed).
        let e = private_dir_for(&dir, me + 1).unwrap_err();
        assert!(e.contains("belongs to uid") && e.contains("squat"), "{e}");
        // Ours, but writable by others.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir_for(&dir, me).unwrap_err();
        assert!(e.contains("chmod 700"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        // A link to a directory is not the directory.
        let real = temp("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, &dir).unwrap();
        let e = private_dir_for(&dir, me).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        std::fs::remove_file(&dir).unwrap();
        std::fs::remove_dir_all(&real).unwrap();
    }

    #[test]
    fn the_default_socket_is_in_a_directory_of_its_own() {
        let s = default_socket();
        if std::env::var_os(SOCKET_ENV).is_none() {
            assert_eq!(s.parent(), Some(default_dir().as_path()));
            assert_ne!(s.parent(), Some(Path::new("/tmp")), "never directly in /tmp: {}", s.display());
            assert_eq!(control_for(&s).file_name().unwrap().to_string_lossy(), "compcache.sock.ctl");
        }
    }
}
