//! Which files make up a configuration, by zram-generator's rules (the systemd convention for
//! configuration files and drop-ins), under a root directory (`/`, or a fake tree in tests).
//!
//! - The directories, lowest priority first: `usr/lib`, `usr/local/lib`, `etc`, `run`.
//! - The main file (`systemd/zram-generator.conf`): only one is read, the one in the
//!   highest-priority directory that has it; it is read before every drop-in.
//! - Drop-ins (`systemd/zram-generator.conf.d/*.conf`, not hidden files): read after the main
//!   file, in the order of their file names across all directories; a drop-in in a
//!   higher-priority directory replaces one of the same name in a lower one.
//! - A main file or drop-in that is a symlink to `/dev/null` masks: it hides the files of its
//!   name in lower-priority directories, and is read as nothing.
//!
//! compcache's own file (`compcache/compcache.conf` and `compcache/compcache.conf.d`) is found
//! by the same rules.
//!
//! One difference, deliberate: zram-generator skips a drop-in that is a symlink to a regular
//! file (its directory scan does not follow symlinks); compcache reads it, as systemd does with
//! its own drop-ins.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The configuration directories under the root, lowest priority first.
pub const BASE_DIRS: [&str; 4] = ["usr/lib", "usr/local/lib", "etc", "run"];

/// Where one configuration's files are, relative to each of [`BASE_DIRS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub main: &'static str,
    pub drop_ins: &'static str,
}

/// zram-generator's configuration.
pub const ZRAM_GENERATOR: Layout = Layout { main: "systemd/zram-generator.conf", drop_ins: "systemd/zram-generator.conf.d" };
/// compcache's own configuration (its keys over zram-generator's, docs/swap.md).
pub const COMPCACHE: Layout = Layout { main: "compcache/compcache.conf", drop_ins: "compcache/compcache.conf.d" };

/// The files to read, in order, and the ones a `/dev/null` symlink masked (for messages).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub files: Vec<PathBuf>,
    pub masked: Vec<PathBuf>,
}

fn is_mask(path: &Path) -> bool {
    std::fs::read_link(path).is_ok_and(|t| t == Path::new("/dev/null"))
}

/// The files of `layout` under `root`, in the order they are read.
pub fn find(root: &Path, layout: &Layout) -> Found {
    let mut found = Found::default();
    let bases: Vec<PathBuf> = BASE_DIRS.iter().map(|b| root.join(b)).collect();
    // `exists` follows symlinks: a mask (to /dev/null, which exists) is found like a file and
    // then hides the lower ones; a dangling symlink is passed over, as zram-generator does.
    if let Some(main) = bases.iter().rev().map(|b| b.join(layout.main)).find(|p| p.exists()) {
        if is_mask(&main) {
            found.masked.push(main);
        } else {
            found.files.push(main);
        }
    }
    let mut drop_ins: BTreeMap<OsString, PathBuf> = BTreeMap::new();
    for base in &bases {
        let dir = base.join(layout.drop_ins);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut entries: Vec<(OsString, PathBuf)> = entries.flatten().map(|e| (e.file_name(), e.path())).collect();
        entries.sort();
        for (name, path) in entries {
            if name.to_string_lossy().starts_with('.') || path.extension().is_none_or(|x| x != "conf") {
                continue;
            }
            if is_mask(&path) {
                drop_ins.remove(&name);
                found.masked.push(path);
            } else if path.metadata().is_ok_and(|m| m.is_file()) {
                drop_ins.insert(name, path);
            }
        }
    }
    found.files.extend(drop_ins.into_values());
    found
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake root directory, removed on drop.
    pub(crate) struct FakeRoot(pub PathBuf);

    impl FakeRoot {
        pub(crate) fn new(tag: &str) -> FakeRoot {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("compcache-zramconf-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            FakeRoot(dir)
        }
        /// Writes `rel` (relative to the root) with `text`, creating its directories.
        pub(crate) fn write(&self, rel: &str, text: &str) -> &FakeRoot {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
            self
        }
        pub(crate) fn mask(&self, rel: &str) -> &FakeRoot {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            symlink("/dev/null", p).unwrap();
            self
        }
        pub(crate) fn rel(&self, files: &[PathBuf]) -> Vec<String> {
            files.iter().map(|f| f.strip_prefix(&self.0).unwrap().display().to_string()).collect()
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn one_main_file_the_highest_priority_one() {
        let r = FakeRoot::new("main");
        assert_eq!(find(&r.0, &ZRAM_GENERATOR), Found::default(), "no configuration at all");
        r.write("usr/lib/systemd/zram-generator.conf", "").write("usr/local/lib/systemd/zram-generator.conf", "");
        assert_eq!(r.rel(&find(&r.0, &ZRAM_GENERATOR).files), ["usr/local/lib/systemd/zram-generator.conf"]);
        r.write("etc/systemd/zram-generator.conf", "");
        assert_eq!(r.rel(&find(&r.0, &ZRAM_GENERATOR).files), ["etc/systemd/zram-generator.conf"]);
        r.write("run/systemd/zram-generator.conf", "");
        assert_eq!(r.rel(&find(&r.0, &ZRAM_GENERATOR).files), ["run/systemd/zram-generator.conf"]);
    }

    #[test]
    fn a_dev_null_symlink_masks_the_main_file() {
        let r = FakeRoot::new("mask-main");
        r.write("usr/lib/systemd/zram-generator.conf", "").mask("etc/systemd/zram-generator.conf");
        let f = find(&r.0, &ZRAM_GENERATOR);
        assert_eq!((f.files.len(), r.rel(&f.masked)), (0, vec!["etc/systemd/zram-generator.conf".to_string()]));
        // A dangling symlink is not a mask: it is passed over.
        let r = FakeRoot::new("dangling");
        r.write("usr/lib/systemd/zram-generator.conf", "");
        std::fs::create_dir_all(r.0.join("etc/systemd")).unwrap();
        symlink("/nonexistent", r.0.join("etc/systemd/zram-generator.conf")).unwrap();
        assert_eq!(r.rel(&find(&r.0, &ZRAM_GENERATOR).files), ["usr/lib/systemd/zram-generator.conf"]);
    }

    #[test]
    fn drop_ins_ordered_by_name_across_directories() {
        let r = FakeRoot::new("dropins");
        r.write("etc/systemd/zram-generator.conf", "")
            .write("usr/lib/systemd/zram-generator.conf.d/10-vendor.conf", "")
            .write("usr/lib/systemd/zram-generator.conf.d/30-vendor.conf", "")
            .write("etc/systemd/zram-generator.conf.d/20-admin.conf", "")
            .write("etc/systemd/zram-generator.conf.d/30-vendor.conf", "")
            .write("run/systemd/zram-generator.conf.d/05-run.conf", "")
            .write("usr/local/lib/systemd/zram-generator.conf.d/40-local.conf", "")
            .write("etc/systemd/zram-generator.conf.d/.hidden.conf", "")
            .write("etc/systemd/zram-generator.conf.d/README", "")
            .write("etc/systemd/zram-generator.conf.d/50-x.conf.bak", "");
        std::fs::create_dir_all(r.0.join("etc/systemd/zram-generator.conf.d/60-dir.conf")).unwrap();
        assert_eq!(
            r.rel(&find(&r.0, &ZRAM_GENERATOR).files),
            [
                "etc/systemd/zram-generator.conf",
                "run/systemd/zram-generator.conf.d/05-run.conf",
                "usr/lib/systemd/zram-generator.conf.d/10-vendor.conf",
                "etc/systemd/zram-generator.conf.d/20-admin.conf",
                "etc/systemd/zram-generator.conf.d/30-vendor.conf",
                "usr/local/lib/systemd/zram-generator.conf.d/40-local.conf",
            ]
        );
    }

    #[test]
    fn a_dev_null_symlink_masks_a_drop_in() {
        let r = FakeRoot::new("mask-dropin");
        r.write("usr/lib/systemd/zram-generator.conf.d/10-vendor.conf", "")
            .write("usr/lib/systemd/zram-generator.conf.d/20-vendor.conf", "")
            .mask("etc/systemd/zram-generator.conf.d/10-vendor.conf")
            // A higher-priority directory's file of the same name comes back over a mask.
            .mask("etc/systemd/zram-generator.conf.d/20-vendor.conf")
            .write("run/systemd/zram-generator.conf.d/20-vendor.conf", "");
        let f = find(&r.0, &ZRAM_GENERATOR);
        assert_eq!(r.rel(&f.files), ["run/systemd/zram-generator.conf.d/20-vendor.conf"]);
        assert_eq!(f.masked.len(), 2);
        // A symlink to a regular file is read (zram-generator would skip it; systemd reads it).
        let r = FakeRoot::new("link");
        r.write("srv/mine.conf", "");
        std::fs::create_dir_all(r.0.join("etc/compcache/compcache.conf.d")).unwrap();
        symlink(r.0.join("srv/mine.conf"), r.0.join("etc/compcache/compcache.conf.d/10-mine.conf")).unwrap();
        assert_eq!(r.rel(&find(&r.0, &COMPCACHE).files), ["etc/compcache/compcache.conf.d/10-mine.conf"]);
    }
}
