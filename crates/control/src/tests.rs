//! Tests of the control server's limits and of a client's trust: the control client cap
//! (crate docs, `MAX_CLIENTS`), and that a control socket of another user is not believed.

use crate::{self as control, ControlError, ControlState, DeviceInfo, MAX_CLIENTS};
use compcache_store::{Config, Store};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

const SIZE: u64 = 16 << 20;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("compcache-limits-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    d
}

fn control_server(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("c.ctl");
    let listener = control::bind(&path).unwrap();
    let store = Arc::new(Store::new(Config::with_disksize(SIZE)).unwrap());
    let state = Arc::new(ControlState { store, device: DeviceInfo { export_name: "t".into(), ..DeviceInfo::default() } });
    std::thread::spawn(move || control::serve(state, listener));
    path
}

/// One control request on an open connection; the answer.
fn ask(s: &mut BufReader<UnixStream>) -> serde_json::Value {
    s.get_mut().write_all(b"{\"cmd\":\"info\"}\n").unwrap();
    let mut line = String::new();
    s.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

#[test]
fn control_clients_are_capped() {
    let dir = temp_dir("ctl-cap");
    let path = control_server(&dir);
    let mut held: Vec<BufReader<UnixStream>> = (0..MAX_CLIENTS).map(|_| BufReader::new(UnixStream::connect(&path).unwrap())).collect();
    for c in &mut held {
        assert_eq!(ask(c)["ok"], true, "each of the first {MAX_CLIENTS} is served");
    }
    let mut extra = BufReader::new(UnixStream::connect(&path).unwrap());
    let mut line = String::new();
    extra.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().unwrap().contains("too many control clients"), "{v}");
    // A slot that is given back is taken by the next client.
    drop(held.pop());
    let served = loop {
        match control::request(&path, &json!({"cmd": "info"})) {
            Ok(v) => break v,
            Err(ControlError::Refused(m)) if m.contains("too many") => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(served["device"]["export_name"], "t");
    drop(held);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether this process can chown files (root).
fn can_chown() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn chown(path: &std::path::Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), None).unwrap();
}

#[test]
fn a_control_socket_of_another_user_is_not_believed() {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let dir = temp_dir("ctl-owner");
    let path = control_server(&dir);
    assert_eq!(control::request(&path, &json!({"cmd": "info"})).unwrap()["ok"], true, "our own socket is believed");
    let (other, as_uid) = if can_chown() { (65534, 0) } else { (me, me + 1) };
    if can_chown() {
        chown(&path, other);
    }
    // As `as_uid`, a socket of `other` is refused.
    match control::check_trusted(&path, as_uid) {
        Err(control::Distrust::Owner(why)) => {
            assert!(why.contains(&format!("uid {other}")), "{why}")
        }
        r => panic!("a socket of uid {other} was trusted by uid {as_uid}: {r:?}"),
    }
    if can_chown() {
        let e = control::request(&path, &json!({"cmd": "info"})).unwrap_err().to_string();
        assert!(e.contains("not trusting") && e.contains("uid 65534"), "{e}");
        // The socket is ours again but its directory is not.
        chown(&path, 0);
        chown(&dir, 65534);
        let e = control::request(&path, &json!({"cmd": "info"})).unwrap_err().to_string();
        assert!(e.contains("directory") && e.contains("uid 65534"), "{e}");
        chown(&dir, 0);
    } else {
        eprintln!("partly skipped: not root, so the request-level checks (which need chown) did not run");
    }
    // A directory others can write (and not sticky) lets them swap the socket.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(control::check_trusted(&path, me), Err(control::Distrust::Owner(w)) if w.contains("not sticky")));
    std::fs::remove_dir_all(&dir).unwrap();
}
