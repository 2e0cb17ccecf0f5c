//! Tests of the control server's limits and of a client's trust: the client cap and the
//! deadlines (crate docs, "Limits"), and that a control socket of another user is not believed.

use crate::{self as control, ControlState, DeviceInfo, Limits, MAX_CLIENTS};
use compcache_store::{Config, Store};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const SIZE: u64 = 16 << 20;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("compcache-limits-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    d
}

fn control_server(dir: &std::path::Path, limits: Limits) -> PathBuf {
    let path = dir.join("c.ctl");
    let listener = control::bind(&path).unwrap();
    let store = Arc::new(Store::new(Config::with_disksize(SIZE)).unwrap());
    let state = Arc::new(ControlState { store, device: DeviceInfo { export_name: "t".into(), ..DeviceInfo::default() } });
    std::thread::spawn(move || control::serve_with(state, listener, limits));
    path
}

/// One control request on an open connection; the answer.
fn ask(s: &mut BufReader<UnixStream>) -> serde_json::Value {
    s.get_mut().write_all(b"{\"cmd\":\"info\"}\n").unwrap();
    let mut line = String::new();
    s.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

/// Reads until the server closes the connection (EOF, or reset); panics if it is still open
/// after a generous 20 seconds (the deadlines under test are well under a second).
fn closed_by_server(s: &mut UnixStream) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

#[test]
fn idle_clients_make_room_for_a_new_one() {
    let dir = temp_dir("ctl-cap");
    let path = control_server(&dir, Limits::default());
    // Every slot taken: some clients asked once and stayed, some sent nothing, some half a
    // request. None of them may keep `compcache stat` out.
    let mut held: Vec<BufReader<UnixStream>> = Vec::new();
    for i in 0..MAX_CLIENTS {
        let mut c = BufReader::new(UnixStream::connect(&path).unwrap());
        match i % 3 {
            0 => assert_eq!(ask(&mut c)["ok"], true, "each of the first {MAX_CLIENTS} is served"),
            1 => {}
            _ => c.get_mut().write_all(b"{\"cmd\":").unwrap(),
        }
        held.push(c);
    }
    // The first held client asked and has been idle the longest.
    for round in 0..3 {
        let served = control::request(&path, &json!({"cmd": "info"})).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(served["device"]["export_name"], "t");
    }
    closed_by_server(held[0].get_mut());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_client_that_sends_half_a_request_or_nothing_is_closed_at_its_deadline() {
    let dir = temp_dir("ctl-deadline");
    let limits = Limits { request_deadline: Duration::from_millis(300), ..Limits::default() };
    let path = control_server(&dir, limits);
    let mut silent = UnixStream::connect(&path).unwrap();
    let mut half = UnixStream::connect(&path).unwrap();
    half.write_all(b"{\"cmd\":\"st").unwrap();
    // One byte at a time, each well within the deadline: the whole line is what is timed.
    let mut trickle = UnixStream::connect(&path).unwrap();
    let trickler = std::thread::spawn(move || {
        for b in b"{\"cmd\":\"stat\"}" {
            if trickle.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        closed_by_server(&mut trickle);
        trickle
    });
    closed_by_server(&mut silent);
    closed_by_server(&mut half);
    let mut trickle = trickler.join().unwrap();
    assert!(trickle.write_all(b"\n").is_err() || read_nothing(&mut trickle), "the trickling client got an answer");
    // A client that asks in time is answered, and may ask again within the deadline of its answer.
    let mut ok = BufReader::new(UnixStream::connect(&path).unwrap());
    assert_eq!(ask(&mut ok)["ok"], true);
    assert_eq!(ask(&mut ok)["ok"], true);
    closed_by_server(ok.get_mut());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether reading `s` gives nothing more (the server closed it without an answer).
fn read_nothing(s: &mut UnixStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn a_client_that_never_reads_its_answers_is_closed_and_delays_no_one() {
    let dir = temp_dir("ctl-noread");
    let limits = Limits { reply_deadline: Duration::from_millis(300), ..Limits::default() };
    let path = control_server(&dir, limits);
    // Requests pipelined without reading a single answer, until the socket is full both ways.
    let mut hog = UnixStream::connect(&path).unwrap();
    hog.set_nonblocking(true).unwrap();
    let request = b"{\"cmd\":\"stat\"}\n";
    let mut sent = 0usize;
    loop {
        match hog.write(request) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(sent > 64 * request.len(), "only {sent} bytes sent");
    // Meanwhile another client is answered.
    assert_eq!(control::request(&path, &json!({"cmd": "stat"})).unwrap()["ok"], true);
    // The hog's answers stopped at its deadline: the server closed it, and the answers that
    // made it into the socket are far fewer than the requests.
    hog.set_nonblocking(false).unwrap();
    std::thread::sleep(Duration::from_secs(1)); // past the reply deadline, with the socket full
                                                // Closed: the end of the stream, or a reset (the server closed it with requests unread).
    hog.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut answers, mut buf) = (0, [0u8; 65536]);
    loop {
        match hog.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answers += buf[..n].iter().filter(|&&b| b == b'\n').count(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
    assert!(answers < sent / request.len(), "{answers} answers to {} requests", sent / request.len());
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
    let path = control_server(&dir, Limits::default());
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

#[test]
fn stat_and_info_say_what_the_device_uses() {
    use compcache_store::{BackingConfig, DictSource, RecompressConfig};
    let ask = |cfg: Config| {
        let state = ControlState { store: Arc::new(Store::new(cfg).unwrap()), device: DeviceInfo::default() };
        let stat = control::answer(&state, r#"{"cmd":"stat"}"#);
        assert_eq!(stat["uses"], control::answer(&state, r#"{"cmd":"info"}"#)["uses"]);
        assert_eq!(stat["protocol"], 3);
        serde_json::from_value::<control::Uses>(stat["uses"].clone()).unwrap()
    };
    assert_eq!(ask(Config::with_disksize(SIZE)), control::Uses::default(), "a plain device uses none of them");
    let dir = temp_dir("uses");
    let backing = Config {
        mem_limit_bytes: 4 << 20,
        backing: Some(BackingConfig { size_bytes: 8 << 20, ..BackingConfig::new(dir.join("b.img")) }),
        ..Config::with_disksize(SIZE)
    };
    assert_eq!(ask(backing), control::Uses { backing: true, ..Default::default() }, "from the configuration: nothing is written back yet");
    let plain_recompress = RecompressConfig { dict: DictSource::None, ..RecompressConfig::default() };
    let u = ask(Config { recompress: Some(plain_recompress), ..Config::with_disksize(SIZE) });
    assert_eq!(u, control::Uses { recompress: true, ..Default::default() });
    let trained = RecompressConfig { dict: DictSource::Train, ..RecompressConfig::default() };
    let u = ask(Config { recompress: Some(trained), ..Config::with_disksize(SIZE) });
    assert_eq!(u, control::Uses { recompress: true, dictionary: true, ..Default::default() });
    std::fs::remove_dir_all(&dir).unwrap();
}
