//! Whether `compcache swapon` runs in a container, where zram-generator does nothing (a
//! container cannot make block devices of its own, and its memory is the host's to manage).
//!
//! zram-generator asks `systemd-detect-virt --quiet --container` and treats a failure to run it
//! as "not a container". compcache does the same on the real root, and, where the program is
//! missing, reads `/run/systemd/container`, which systemd's container managers (and
//! systemd-detect-virt itself) use, and looks for Docker's `/.dockerenv`. Under another root
//! (`swapon --config-root DIR`, the tests) only `DIR/run/systemd/container` and
//! `DIR/.dockerenv` are read: that is how a test says "container".

use std::path::Path;
use std::process::{Command, Stdio};

/// The container this runs in (its kind, e.g. `docker`), or `None`.
pub(super) fn detect(root: &Path) -> Option<String> {
    if root == Path::new("/") {
        match Command::new("systemd-detect-virt").arg("--container").stdin(Stdio::null()).stderr(Stdio::null()).output() {
            Ok(out) if out.status.success() => {
                let kind = String::from_utf8_lossy(&out.stdout).trim().to_string();
                return Some(if kind.is_empty() { "container".into() } else { kind });
            }
            Ok(_) => return None,
            Err(_) => {} // no systemd-detect-virt: the file below
        }
    }
    from_file(&root.join("run/systemd/container")).or_else(|| root.join(".dockerenv").exists().then(|| "docker".to_string()))
}

/// What `/run/systemd/container` says: the manager's name, if the file exists.
fn from_file(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let kind = text.trim();
    Some(if kind.is_empty() { "container".into() } else { kind.to_string() })
}

/// The message when swapon stands down in container `kind`.
pub(super) fn standing_down(kind: &str) -> String {
    format!(
        "compcache: running in a container ({kind}): no swap devices set up from the configuration, as \
         zram-generator sets none up in containers; pass --ignore-container to set them up anyway, or ask for \
         one device with --size SIZE"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::zramconf::paths::tests::FakeRoot;

    #[test]
    fn a_fake_root_says_container_with_run_systemd_container() {
        let r = FakeRoot::new("container");
        assert_eq!(detect(&r.0), None);
        r.write("run/systemd/container", "docker\n");
        assert_eq!(detect(&r.0).as_deref(), Some("docker"));
        r.write("run/systemd/container", "");
        assert_eq!(detect(&r.0).as_deref(), Some("container"));
        let d = FakeRoot::new("dockerenv");
        d.write(".dockerenv", "");
        assert_eq!(detect(&d.0).as_deref(), Some("docker"));
        assert!(standing_down("docker").contains("--ignore-container"));
    }
}
