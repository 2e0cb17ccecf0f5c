//! Which running device a command talks to: the one rule of `stat`, `compact`, `set`,
//! `writeback` and `recompress` ([`Target`]), and how `list` and they find the devices on the
//! machine ([`control_sockets`], [`answering`]).
//!
//! A device is named as `list` and `swapoff` name it: its block device (`/dev/ublkb0`, or just
//! `ublkb0`, or the hibernation-safe name /proc/swaps shows, `/dev/zram-compcache-ublkb0`),
//! whose control socket is `<default directory>/<name>.ctl`; or `serve`'s NBD socket path,
//! whose control socket is that path + `.ctl`; or a control socket itself. `--control PATH`
//! names the socket directly. Neither: `$COMPCACHE_SOCKET`'s control socket if that is set;
//! otherwise the device on the machine if there is exactly one (every `*.ctl` socket in the
//! default directory that answers, as `list` finds them), and with several, an error that
//! lists them and says how to pick one.

use crate::failure::Failure;
use crate::paths;
use compcache_control::{self as control, ControlError};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

use crate::paths::HIBERNATION_SAFE_PREFIX;

/// The device a command talks to (flattened into the commands' arguments).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct Target {
    /// The device: as `compcache list` names it (/dev/ublkb0 or ublkb0, serve's NBD socket
    /// path), or a control socket [default: the only device on the machine].
    #[arg(value_name = "DEVICE", conflicts_with = "control")]
    pub device: Option<String>,
    /// Control socket of the server (instead of DEVICE).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

impl Target {
    /// The control socket to ask (module docs).
    pub fn control_socket(&self) -> Result<PathBuf, Failure> {
        if let Some(path) = &self.control {
            return Ok(path.clone());
        }
        if let Some(name) = &self.device {
            return by_name(name, &paths::default_dir());
        }
        if std::env::var_os(paths::SOCKET_ENV).is_some_and(|p| !p.is_empty()) {
            return Ok(paths::default_control());
        }
        only_device(&paths::default_dir())
    }
}

/// The control socket of the device called `name` (module docs); `dir`: the default directory.
fn by_name(name: &str, dir: &Path) -> Result<PathBuf, Failure> {
    use std::os::unix::fs::FileTypeExt;
    let path = Path::new(name);
    // A socket path: a control socket itself, or an NBD socket with its control socket beside.
    if name.contains('/') && std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        if path.extension().is_some_and(|x| x == "ctl") {
            return Ok(path.to_path_buf());
        }
        let ctl = paths::control_for(path);
        if ctl.exists() {
            return Ok(ctl);
        }
    }
    let base = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let base = base.strip_prefix(HIBERNATION_SAFE_PREFIX.trim_start_matches("/dev/")).unwrap_or(&base).to_string();
    let ctl = dir.join(format!("{base}.ctl"));
    if base.is_empty() || !ctl.exists() {
        return Err(Failure::new(format!(
            "no compcache device {name:?}: no control socket {} (`compcache list` shows the devices and their names; or give --control PATH)",
            ctl.display()
        )));
    }
    Ok(ctl)
}

/// The control socket of the one device that answers in `dir`; an error naming them all when
/// there are several, or saying how to start one when there is none.
fn only_device(dir: &Path) -> Result<PathBuf, Failure> {
    let found = answering(&control_sockets(dir, &[]), &json!({"cmd": "info"}));
    match found.as_slice() {
        [(ctl, _)] => Ok(ctl.clone()),
        [] => Err(Failure::new(format!(
            "no compcache device is running (no control socket in {} answers): start one with `compcache serve` or `compcache swapon`, \
             or name its control socket with --control PATH",
            dir.display()
        ))),
        several => {
            let names: Vec<String> = several
                .iter()
                .map(|(ctl, a)| format!("  {}", crate::metrics::name_of(a).unwrap_or_else(|| ctl.display().to_string())))
                .collect();
            let example = several.iter().find_map(|(_, a)| crate::metrics::name_of(a)).unwrap_or_default();
            Err(Failure::usage(format!(
                "{} compcache devices are running; name one (e.g. `compcache stat {}`), or give --control PATH:\n{}",
                several.len(),
                short_name(&example),
                names.join("\n")
            )))
        }
    }
}

/// How a device is best named on the command line: `ublkb0` for `/dev/ublkb0`; a socket path
/// as it is.
fn short_name(name: &str) -> &str {
    name.strip_prefix("/dev/").unwrap_or(name)
}

/// The control sockets on the machine: `*.ctl` sockets in `dir` (sorted), then `extra`, each
/// once.
pub fn control_sockets(dir: &Path, extra: &[PathBuf]) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "ctl"))
        .collect();
    found.sort();
    for p in extra {
        if !found.contains(p) {
            found.push(p.clone());
        }
    }
    found
}

/// The answers to `req` of the sockets that answer it: a stale socket (nobody answers) is
/// skipped silently, one not believed or answering wrongly with a warning.
pub fn answering(sockets: &[PathBuf], req: &Value) -> Vec<(PathBuf, Value)> {
    sockets.iter().filter_map(|ctl| ask(ctl, req).map(|a| (ctl.clone(), a))).collect()
}

fn ask(ctl: &Path, req: &Value) -> Option<Value> {
    match control::request(ctl, req) {
        Ok(a) if a.get("device").is_some_and(Value::is_object) => Some(a),
        Ok(_) => {
            crate::log::warning(&format!("{}: the answer names no device (a different program?); skipped", ctl.display()));
            None
        }
        // A stale socket file (its server is gone) or one removed meanwhile.
        Err(ControlError::Unreachable { source, .. })
            if matches!(source.kind(), std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound) =>
        {
            None
        }
        Err(e) => {
            crate::log::warning(&format!("{e}; skipped"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compcache_control::{ControlState, DeviceInfo};
    use compcache_store::{Config, Store};
    use std::sync::Arc;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("compcache-target-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    /// A real control server for a device called `dev` (a swap server's naming) in `dir`.
    fn device(dir: &Path, dev: &str) -> PathBuf {
        let name = Path::new(dev).file_name().unwrap().to_string_lossy().into_owned();
        let ctl = dir.join(format!("{name}.ctl"));
        let listener = control::bind(&ctl).unwrap();
        let store = Arc::new(Store::new(Config::with_disksize(16 << 20)).unwrap());
        let device = DeviceInfo {
            export_name: dev.into(),
            control_socket: ctl.display().to_string(),
            frontend: "ublk".into(),
            ..DeviceInfo::default()
        };
        let state = Arc::new(ControlState { store, device });
        std::thread::spawn(move || control::serve(state, listener));
        ctl
    }

    #[test]
    fn a_device_is_found_by_any_of_its_names() {
        let dir = temp("names");
        let ctl = device(&dir, "/dev/ublkb7");
        for name in ["/dev/ublkb7", "ublkb7", "/dev/zram-compcache-ublkb7", ctl.to_str().unwrap()] {
            assert_eq!(by_name(name, &dir).unwrap(), ctl, "{name}");
        }
        // serve's NBD socket names its control socket beside it.
        let nbd = dir.join("nbd.sock");
        let _l = std::os::unix::net::UnixListener::bind(&nbd).unwrap();
        let nbd_ctl = device(&dir, "nbd.sock");
        assert_eq!(by_name(nbd.to_str().unwrap(), &dir).unwrap(), nbd_ctl);
        let e = by_name("ublkb9", &dir).unwrap_err().to_string();
        assert!(e.contains("no compcache device \"ublkb9\"") && e.contains("compcache list"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_name_the_only_device_is_used_and_several_are_listed() {
        let dir = temp("only");
        let e = only_device(&dir).unwrap_err().to_string();
        assert!(e.contains("no compcache device is running") && e.contains("compcache swapon"), "{e}");
        // A stale socket (its server gone) is no device.
        drop(std::os::unix::net::UnixListener::bind(dir.join("gone.ctl")).unwrap());
        let first = device(&dir, "/dev/ublkb0");
        assert_eq!(only_device(&dir).unwrap(), first);
        device(&dir, "/dev/nbd3");
        let e = only_device(&dir).unwrap_err();
        let t = e.to_string();
        assert!(t.starts_with("2 compcache devices are running") && t.contains("compcache stat nbd3"), "{t}");
        assert!(t.contains("\n  /dev/nbd3") && t.contains("\n  /dev/ublkb0") && !t.contains("gone"), "{t}");
        assert_eq!(e.exit_code(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sockets_are_found_in_the_directory_and_given_ones_added_once() {
        let dir = temp("list");
        let a = std::os::unix::net::UnixListener::bind(dir.join("b.ctl")).unwrap();
        let b = std::os::unix::net::UnixListener::bind(dir.join("a.ctl")).unwrap();
        let c = std::os::unix::net::UnixListener::bind(dir.join("compcache.sock")).unwrap(); // NBD, not control
        std::fs::write(dir.join("file.ctl"), "").unwrap(); // not a socket
        let extra = [dir.join("a.ctl"), PathBuf::from("/elsewhere/x.ctl")];
        assert_eq!(control_sockets(&dir, &extra), [dir.join("a.ctl"), dir.join("b.ctl"), PathBuf::from("/elsewhere/x.ctl")]);
        drop((a, b, c));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
