//! Every file compcache writes outside the store (PID file, statistics, swap state, server
//! logs) goes through here, so that none of them can be turned against its owner or leak:
//! - created with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600 whatever the umask: never through a
//!   symbolic link (which another user could point at /etc/passwd), never truncating a file
//!   that appeared at that path;
//! - an existing file is replaced (by a rename of a new private file over it, which replaces a
//!   symbolic link itself and never writes through it) only if it is a regular file that
//!   belongs to this user; anything else is refused with a message naming it;
//! - directories it makes are mode 0700.
//!
//! (The backing device has its own, stricter rules: `crates/store/src/backing/device.rs`.)

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates `path`, which must not exist, for writing: owner-only, not through a symbolic link.
pub fn create_new(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    // The umask can only take bits away from 0600; make it exactly that.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

/// Whether `path` names a regular file (not a symbolic link) that belongs to this user: one
/// compcache may replace. `Ok(None)` when nothing is there.
pub fn own_regular_file(path: &Path) -> io::Result<Option<bool>> {
    match std::fs::symlink_metadata(path) {
        // SAFETY: geteuid has no preconditions and cannot fail.
        Ok(m) => Ok(Some(m.file_type().is_file() && m.uid() == unsafe { libc::geteuid() })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to `path`: a new private file, renamed over an existing one only if that is
/// this user's regular file (see the module docs).
pub fn write_replacing_own(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if own_regular_file(path)? == Some(false) {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "exists and is not this user's regular file (a symbolic link, another user's file, or not a file): not replaced; remove it or choose another path",
        ));
    }
    let tmp = temporary_beside(path);
    let written = create_new(&tmp).and_then(|mut f| f.write_all(bytes)).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn temporary_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// `create_dir_all` with mode 0700 for the directories it makes (existing ones are left as
/// they are).
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("compcache-private-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn new_files_are_owner_only_and_never_follow_or_take_over() {
        let d = dir("new");
        let old = unsafe_umask(0);
        let f = d.join("a");
        create_new(&f).unwrap();
        unsafe_umask(old);
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o600, "0600 even with umask 0");
        assert!(create_new(&f).is_err(), "an existing file is not taken over");
        let target = d.join("precious");
        std::fs::write(&target, b"precious").unwrap();
        let link = d.join("link");
        symlink(&target, &link).unwrap();
        assert!(create_new(&link).is_err());
        assert!(write_replacing_own(&link, b"x").is_err(), "a symbolic link is not replaced");
        assert_eq!(std::fs::read(&target).unwrap(), b"precious", "nor written through");
        write_replacing_own(&f, b"stats").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"stats", "our own file is replaced");
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn unsafe_umask(m: libc::mode_t) -> libc::mode_t {
        // SAFETY: umask has no preconditions; it changes the process's creation mask only.
        unsafe { libc::umask(m) }
    }
}
