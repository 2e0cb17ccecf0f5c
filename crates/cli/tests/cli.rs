//! Integration tests of the `compcache` binary: a real `compcache serve` on temporary sockets,
//! driven through NBD (the crate's minimal client, and nbdinfo/nbdcopy when installed) and
//! through `compcache stat`/`compact`. Every server is killed by its PID and its directory
//! removed by a guard, also when a test fails. Tests assert behaviour and never time things.

use compcache_nbd::client::Client;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_compcache");

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("compcache-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `compcache serve`; killed (by PID) on drop. Declared after its TempDir in
/// tests so it is dropped first.
struct ServerGuard {
    child: Option<Child>,
    ready_line: String,
    socket: PathBuf,
    control: PathBuf,
    log: PathBuf,
}

impl ServerGuard {
    /// Starts a server with `args` on sockets in `dir`; returns once it printed its ready line
    /// (it binds every socket before printing).
    fn start(dir: &TempDir, args: &[&str]) -> ServerGuard {
        let socket = dir.path("nbd.sock");
        let control = dir.path("nbd.sock.ctl");
        let mut cmd = Command::new(BIN);
        cmd.arg("serve").args(args);
        if !args.contains(&"--socket") && !args.contains(&"--listen") {
            cmd.arg("--socket").arg(&socket);
        }
        if !args.contains(&"--control") {
            cmd.arg("--control").arg(&control);
        }
        Self::spawn(cmd, socket, control, dir.path("server.log"))
    }

    /// Spawns `cmd`; its stderr goes to `log` (a file: a pipe nobody reads could fill up).
    fn spawn(mut cmd: Command, socket: PathBuf, control: PathBuf, log: PathBuf) -> ServerGuard {
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr).spawn().expect("spawn compcache");
        let mut guard = ServerGuard { child: None, ready_line: String::new(), socket, control, log };
        let stdout = child.stdout.take().unwrap();
        guard.child = Some(child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        if line.is_empty() {
            let status = guard.child.take().unwrap().wait().unwrap();
            panic!("compcache serve exited ({status}) before it was ready: {}", std::fs::read_to_string(&guard.log).unwrap_or_default());
        }
        guard.ready_line = line.trim().to_string();
        guard
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn client(&self) -> Client<std::os::unix::net::UnixStream> {
        Client::connect_unix(&self.socket, "compcache").expect("connect to the NBD socket")
    }

    fn stat_json(&self) -> Value {
        let out = compcache(&["stat", "--json", "--control", self.control.to_str().unwrap()]);
        assert!(out.status.success(), "stat failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("stat --json prints JSON")
    }

    /// Sends SIGTERM and waits; returns the exit status and stderr.
    fn terminate(&mut self) -> (std::process::ExitStatus, String) {
        self.signal(libc::SIGTERM)
    }

    /// Sends `sig` and waits; returns the exit status and stderr.
    fn signal(&mut self, sig: i32) -> (std::process::ExitStatus, String) {
        let child = self.child.take().unwrap();
        // SAFETY: kill has no memory-safety preconditions; the PID is our own child, not yet
        // reaped (we hold its Child), so it cannot have been reused.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait_with_output().unwrap().status;
        (status, std::fs::read_to_string(&self.log).unwrap_or_default())
    }
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // by PID (SIGKILL)
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.control);
    }
}

fn compcache(args: &[&str]) -> Output {
    Command::new(BIN).args(args).stdin(Stdio::null()).output().expect("run compcache")
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn num(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or_else(|| panic!("stat --json has no {k}: {v}"))
}

/// A page of text-like bytes: compresses well but is not same-filled.
fn text_page(i: u64) -> Vec<u8> {
    let line = format!("page {i:08} of compcache test data, compressible and repetitive enough.\n");
    line.as_bytes().iter().cycle().take(4096).copied().collect()
}

#[test]
fn serve_write_read_and_stat() {
    let dir = TempDir::new("serve");
    let srv = ServerGuard::start(&dir, &["--size", "64M"]);
    assert!(srv.ready_line.contains("64M") && srv.ready_line.contains(srv.socket.to_str().unwrap()), "{}", srv.ready_line);

    let before = srv.stat_json();
    assert_eq!(num(&before, "disksize"), 64 << 20);
    assert_eq!(num(&before, "num_writes"), 0);
    assert_eq!(before["comp_algorithm"], "lz4");

    let mut c = srv.client();
    assert_eq!(c.info.size, 64 << 20);
    for i in 0..256u64 {
        c.write(i * 4096, &text_page(i)).unwrap();
    }
    c.write(300 * 4096, &[0u8; 4096]).unwrap(); // a same-filled page
    for i in (0..256u64).step_by(17) {
        assert_eq!(c.read(i * 4096, 4096).unwrap(), text_page(i));
    }

    let after = srv.stat_json();
    assert_eq!(num(&after, "num_writes"), 257);
    assert!(num(&after, "num_reads") >= 16);
    assert_eq!(num(&after, "orig_data_size"), 257 * 4096);
    assert!(num(&after, "compr_data_size") < 256 * 4096 / 2, "text compresses: {after}");
    assert!(num(&after, "mem_used_total") > 0);

    c.trim(0, 128 * 4096).unwrap();
    let trimmed = srv.stat_json();
    assert_eq!(num(&trimmed, "notify_free"), 128);
    assert_eq!(num(&trimmed, "orig_data_size"), 129 * 4096);

    // Out of range: an error for the client, invalid_io for stat.
    assert!(c.read(64 << 20, 1).is_err());
    assert_eq!(num(&srv.stat_json(), "invalid_io"), 1);
    c.disconnect().unwrap();

    // The other views.
    let ctl = srv.control.to_str().unwrap();
    let table = compcache(&["stat", "--control", ctl]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success());
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "ALGORITHM", "DISKSIZE", "DATA", "COMPR", "TOTAL", "RATIO", "LIMIT"]);
    assert!(text.contains("orig_data_size") && text.contains("notify_free") && text.contains("64M"), "{text}");

    let rz = compcache(&["stat", "--ramzswap", "--control", ctl]);
    let rz = String::from_utf8_lossy(&rz.stdout);
    assert!(rz.contains("DiskSize:") && rz.contains("65536 kB") && rz.contains("NotifyFree:"), "{rz}");

    let mm = compcache(&["stat", "--mm-stat", "--control", ctl]);
    let cols: Vec<u64> = String::from_utf8_lossy(&mm.stdout).split_whitespace().map(|c| c.parse().unwrap()).collect();
    assert_eq!(cols.len(), 9, "zram's mm_stat has 9 columns");
    assert_eq!(cols[0], 129 * 4096);

    let compact = compcache(&["compact", "--control", ctl]);
    assert!(compact.status.success(), "{}", stderr_of(&compact));
    assert!(String::from_utf8_lossy(&compact.stdout).contains("pool pages freed"));
}

#[test]
fn sigterm_removes_sockets_and_pid_file() {
    let dir = TempDir::new("sigterm");
    let pid_file = dir.path("server.pid");
    let mut srv = ServerGuard::start(&dir, &["--size", "16M", "--pid-file", pid_file.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap().trim(), srv.pid().to_string());
    assert!(srv.socket.exists() && srv.control.exists());
    // A client still connected does not hold the shutdown up.
    let mut c = srv.client();
    c.write(0, b"in flight").unwrap();
    let (status, stderr) = srv.terminate();
    assert!(c.read(0, 9).is_err(), "the connection ends with the server");
    assert!(status.success(), "exit on SIGTERM: {status}; {stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert!(!srv.socket.exists(), "NBD socket removed");
    assert!(!srv.control.exists(), "control socket removed");
    assert!(!pid_file.exists(), "pid file removed");
}

/// Whether this process ignores `sig` (a child inherits that).
fn ignored_here(sig: i32) -> bool {
    // SAFETY: a null new action only reads the current one into `old`, a plain C struct.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

#[test]
fn sigint_and_sighup_stop_cleanly_too() {
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGHUP, "SIGHUP")] {
        if ignored_here(sig) {
            // The server inherits an ignored signal and rightly keeps ignoring it (nohup).
            eprintln!("skipped {name}: this test runs with {name} ignored");
            continue;
        }
        let dir = TempDir::new(name);
        let mut srv = ServerGuard::start(&dir, &["--size", "16M"]);
        let (status, stderr) = srv.signal(sig);
        assert!(status.success(), "{name}: {status}; {stderr}");
        assert!(stderr.contains(name), "{stderr}");
        assert!(!srv.socket.exists() && !srv.control.exists(), "{name}: sockets removed");
    }
}

#[test]
fn a_live_socket_is_refused_and_a_stale_one_replaced() {
    let dir = TempDir::new("inuse");
    let srv = ServerGuard::start(&dir, &["--size", "16M"]);
    let mut c = srv.client();
    c.write(0, b"first server").unwrap();

    // Second server on the same socket: refused, one clear line, non-zero exit.
    let out = compcache(&[
        "serve",
        "--size",
        "16M",
        "--socket",
        srv.socket.to_str().unwrap(),
        "--control",
        dir.path("other.ctl").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(err.contains("in use by a running server"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!dir.path("other.ctl").exists(), "a refused server leaves nothing behind");

    // The first server is unharmed.
    assert_eq!(c.read(0, 12).unwrap(), b"first server");
    c.disconnect().unwrap();

    // A stale socket file (nobody listening) is replaced.
    let stale = dir.path("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let dir2 = TempDir::new("stale-ctl");
    let srv2 = ServerGuard::start(&dir2, &["--size", "16M", "--socket", stale.to_str().unwrap()]);
    let mut c2 = Client::connect_unix(&stale, "compcache").unwrap();
    c2.write(0, b"x").unwrap();
    c2.disconnect().unwrap();
    drop(srv2);
}

#[test]
fn bad_flags_fail_with_one_clear_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--size", "12Q"], "--size"),
        (&["serve", "--size", "0"], "at least one"),
        (&["serve", "--algorithm", "lzo"], "lz4, lz4hc or zstd"),
        (&["serve", "--algorithm", "zstd", "--level", "40"], "level 40"),
        (&["serve", "--mem-limit", "1000T"], "above physical RAM"),
        (&["serve", "--size", "100000T"], "slot table"),
        (&["serve", "--listen", "nowhere"], "give a port"),
        (&["serve", "--no-such-flag"], "--no-such-flag"),
        (&["stat", "--json", "--ramzswap"], "cannot be used with"),
    ];
    for (args, needle) in cases {
        let out = compcache(args);
        assert!(!out.status.success(), "{args:?} must fail");
        let err = stderr_of(&out);
        assert!(err.contains(needle), "{args:?}: expected {needle:?} in: {err}");
        if args[0] == "serve" && !args.contains(&"--no-such-flag") {
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
            assert!(err.starts_with("compcache: error: "), "{err}");
        }
    }
}

/// A size that rounds to no pages where 0 means "no limit" is an error naming the flag and the
/// smallest value, before any socket is touched: each of these once meant no limit (or no
/// cap), the opposite of what was asked. docs/cli.md, "Sizes and durations".
#[test]
fn a_size_that_rounds_to_zero_is_refused_not_taken_as_no_limit() {
    let dir = TempDir::new("round0");
    let ctl = dir.path("nothing.ctl");
    let ctl = ctl.to_str().unwrap();
    let backing = dir.path("b.img");
    let backing = backing.to_str().unwrap();
    let cases: &[&[&str]] = &[
        // 1e-7 of this machine's RAM is under a page on anything below 38 GiB...
        &["serve", "--size", "64M", "--mem-limit", "0.00001%"],
        // ...and an expression of RAM / 2^40 MiB is under a byte on any machine.
        &["serve", "--size", "64M", "--mem-limit", "ram / 1099511627776"],
        &["serve", "--size", "64M", "--mem-limit", "100"],
        &["set", "--control", ctl, "--mem-limit", "100"],
        &["set", "--control", ctl, "--writeback-rate", "1000/s"],
        &["set", "--control", ctl, "--writeback-limit", "1K"],
        &["writeback", "--control", ctl, "--idle", "0", "--max", "100"],
        &["serve", "--size", "64M", "--backing", backing, "--backing-size", "100"],
    ];
    for args in cases {
        let out = compcache(args);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("would round to 0, which means") && err.contains("give at least 4K"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    }
    assert!(!dir.path("b.img").exists(), "a refused start creates no backing file");
}

/// Every duration flag takes the one grammar (bare seconds stay valid), and says what it
/// accepts when it refuses. Before, only `writeback --idle` took units: `--recompress-idle 1s`
/// and `--cold-idle 10m` said "invalid digit found in string".
#[test]
fn duration_flags_take_units() {
    let dir = TempDir::new("durations");
    let ctl = dir.path("nothing.ctl");
    let ctl = ctl.to_str().unwrap();
    // Accepted: the parse passes and the command fails later, for another reason (a size under
    // the minimum, or no server on the control socket).
    let accepted: &[(&[&str], &str)] = &[
        (&["serve", "--size", "36K", "--recompress-idle", "1s"], "at least 10 pages"),
        (&["serve", "--size", "36K", "--cold-tier", "64M", "--cold-idle", "10m"], "at least 10 pages"),
        (&["serve", "--size", "36K", "--recompress-idle", "90"], "at least 10 pages"),
        (&["writeback", "--control", ctl, "--idle", "2h"], "cannot reach control socket"),
        (&["recompress", "--control", ctl, "--idle", "10m", "--now", "500ms"], "cannot reach control socket"),
    ];
    for (args, later) in accepted {
        let err = stderr_of(&compcache(args));
        assert!(err.contains(later), "{args:?}: expected the later error {later:?}: {err}");
    }
    let refused: &[(&[&str], &str, &str)] = &[
        (&["serve", "--recompress-idle", "1d"], "--recompress-idle", "65535 s (18h12m15s)"),
        (&["serve", "--cold-tier", "64M", "--cold-idle", "500ms"], "--cold-idle", "not a whole number of seconds"),
        (&["serve", "--recompress-idle", "10min"], "--recompress-idle", "give seconds (90), or a number with ms, s, m, h or d"),
        (&["writeback", "--control", ctl, "--idle", "1d"], "--idle", "65535 s"),
        (&["recompress", "--control", ctl, "--now", "2m"], "--now", "at most 1m"),
    ];
    for (args, flag, why) in refused {
        let out = compcache(args);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains(why), "{args:?}: expected {flag} and {why:?}: {err}");
    }
}

#[test]
fn stat_without_a_server_says_what_to_do() {
    let dir = TempDir::new("noserver");
    let out = compcache(&["stat", "--control", dir.path("nothing.ctl").to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(err.contains("is `compcache serve` running? try --control PATH"), "{err}");
    assert_eq!(err.trim().lines().count(), 1);
}

#[test]
fn serve_alone_uses_the_default_socket() {
    // `compcache serve` with no flags: the default size (25% of RAM) and the default socket,
    // which $COMPCACHE_SOCKET points into our temporary directory.
    let dir = TempDir::new("default");
    let socket = dir.path("default.sock");
    let mut cmd = Command::new(BIN);
    cmd.arg("serve").env("COMPCACHE_SOCKET", &socket);
    let srv = ServerGuard::spawn(cmd, socket.clone(), dir.path("default.sock.ctl"), dir.path("server.log"));
    assert!(srv.ready_line.contains(socket.to_str().unwrap()), "{}", srv.ready_line);
    let out = Command::new(BIN).args(["stat", "--json"]).env("COMPCACHE_SOCKET", &socket).output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ram = compcache_store::physical_ram_bytes();
    assert_eq!(num(&stats, "disksize"), ram / 4 / 4096 * 4096);
}

#[test]
fn tcp_on_loopback() {
    let dir = TempDir::new("tcp");
    // Plain TCP only with the explicit opt-out, which warns (TLS: tests/test_tls.py).
    let srv = ServerGuard::start(&dir, &["--size", "16M", "--listen", "127.0.0.1:0", "--name", "swap0", "--insecure-plain-tcp"]);
    let log = std::fs::read_to_string(&srv.log).unwrap();
    assert!(log.contains("WARNING: --insecure-plain-tcp") && log.contains("every local user"), "{log}");
    // The ready line names the port the kernel chose.
    let addr = srv.ready_line.split("tcp:").nth(1).and_then(|s| s.split([';', ' ']).next()).expect("tcp address in the ready line");
    assert!(addr.starts_with("127.0.0.1:"), "{}", srv.ready_line);
    assert!(!srv.socket.exists(), "--listen without --socket serves TCP only");
    let mut c = Client::connect_tcp(addr, "swap0").unwrap();
    c.write(4095, b"over tcp").unwrap();
    assert_eq!(c.read(4095, 8).unwrap(), b"over tcp");
    c.disconnect().unwrap();
}

#[test]
fn tcp_without_tls_refuses_to_start() {
    let dir = TempDir::new("tcp-no-tls");
    let socket = dir.path("nbd.sock");
    let mut child = Command::new(BIN)
        .args(["serve", "--size", "16M", "--listen", "127.0.0.1:0", "--socket"])
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A server that starts prints its ready line; one that refuses closes stdout with nothing.
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut ready).unwrap();
    if !ready.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve --listen without TLS started: {ready}");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(err.contains("TCP needs TLS") && err.contains("--tls-certificates") && err.contains("--insecure-plain-tcp"), "{err}");
    assert!(!socket.exists(), "a refused start leaves no socket behind");
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().map(|s| s.success()).unwrap_or(false)
}

#[test]
fn nbdinfo_and_nbdcopy_round_trip() {
    if !have("nbdinfo") || !have("nbdcopy") {
        eprintln!("skipped: needs nbdinfo and nbdcopy (Debian package libnbd-bin)");
        return;
    }
    let dir = TempDir::new("libnbd");
    let srv = ServerGuard::start(&dir, &["--size", "32M"]);
    let uri = format!("nbd+unix:///compcache?socket={}", srv.socket.display());

    let info = Command::new("nbdinfo").args(["--json", &uri]).output().unwrap();
    assert!(info.status.success(), "{}", stderr_of(&info));
    let info: Value = serde_json::from_slice(&info.stdout).unwrap();
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], 32 << 20);
    for cap in ["can_trim", "can_zero", "can_flush", "can_fua", "can_multi_conn"] {
        assert_eq!(export[cap], true, "{cap}");
    }
    assert_eq!(export["block_size_maximum"], 32 << 20);

    let input = dir.path("in.bin");
    let data: Vec<u8> = (0..(4u64 << 20) / 4096).flat_map(text_page).collect();
    std::fs::write(&input, &data).unwrap();
    let up = Command::new("nbdcopy").args([input.to_str().unwrap(), &uri]).output().unwrap();
    assert!(up.status.success(), "{}", stderr_of(&up));
    let output = dir.path("out.bin");
    let down = Command::new("nbdcopy").args([&uri, output.to_str().unwrap()]).output().unwrap();
    assert!(down.status.success(), "{}", stderr_of(&down));
    let back = std::fs::read(&output).unwrap();
    assert_eq!(back.len(), 32 << 20);
    assert!(back[..data.len()] == data[..], "data read back differs");
    assert!(back[data.len()..].iter().all(|&b| b == 0));

    let stats = srv.stat_json();
    assert!(num(&stats, "orig_data_size") >= data.len() as u64);
    assert_eq!(num(&stats, "failed_writes"), 0);
}

#[test]
fn mlock_keeps_the_server_locked_without_committing_the_device() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: --mlock needs root (or CAP_IPC_LOCK) to lock the store's reservation");
        return;
    }
    let dir = TempDir::new("mlock");
    let srv = ServerGuard::start(&dir, &["--size", "256M", "--mlock"]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", srv.pid())).unwrap();
    let kib = |key: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert!(kib("VmLck:") > 0, "memory is locked: {status}");
    assert!(kib("VmRSS:") < 128 << 10, "MCL_ONFAULT: the 256M device is not committed up front");
    // The program's code is in RAM and locked whole, not page by page as it runs: an untouched
    // page of it could be swapped out (from tmpfs) to the very device the server serves, and
    // the fault on it would wait for that server (docs/swap.md, the `global` step's hang).
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", srv.pid())).unwrap();
    let exe = std::fs::read_link(format!("/proc/{}/exe", srv.pid())).unwrap();
    let mut text_kib = 0;
    for block in smaps.split_inclusive("VmFlags:").filter(|b| b.lines().any(|l| l.contains(" r-xp ") && l.ends_with(exe.to_str().unwrap())))
    {
        let field = |key: &str| -> u64 {
            let line = block.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in {block}"));
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        assert_eq!(field("Rss:"), field("Size:"), "the program's text is resident whole: {block}");
        // (Locked counts shared pages in proportion, as Pss does.)
        assert_eq!(field("Locked:"), field("Pss:"), "and locked: {block}");
        text_kib += field("Size:");
    }
    assert!(text_kib > 0, "found the program's text mapping ({}) in smaps", exe.display());
    let mut c = srv.client();
    c.write(0, &text_page(1)).unwrap();
    assert_eq!(c.read(0, 4096).unwrap(), text_page(1));
    c.disconnect().unwrap();
}

// --- files the server creates: PID file, backing file (issue 10, items 1, 3, 9) ------------

#[test]
fn a_pid_file_that_is_a_symlink_is_refused_and_its_target_not_truncated() {
    let dir = TempDir::new("pid-symlink");
    let target = dir.path("passwd-copy");
    std::fs::write(&target, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    let link = dir.path("server.pid");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out =
        compcache(&["serve", "--size", "16M", "--socket", dir.path("s.sock").to_str().unwrap(), "--pid-file", link.to_str().unwrap()]);
    assert!(!out.status.success(), "a symbolic link as --pid-file is refused");
    let err = stderr_of(&out);
    assert!(err.contains("--pid-file") && err.trim().lines().count() == 1, "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "root:x:0:0:root:/root:/bin/bash\n", "the target is untouched");
    assert!(!dir.path("s.sock").exists(), "a refused start leaves nothing behind");

    // A PID file of a running process is not taken over either; a stale one of ours is.
    let live = dir.path("live.pid");
    std::fs::write(&live, format!("{}\n", std::process::id())).unwrap();
    let out =
        compcache(&["serve", "--size", "16M", "--socket", dir.path("s.sock").to_str().unwrap(), "--pid-file", live.to_str().unwrap()]);
    assert!(!out.status.success() && stderr_of(&out).contains("is running"), "{}", stderr_of(&out));
    assert_eq!(std::fs::read_to_string(&live).unwrap().trim(), std::process::id().to_string());
    let stale = dir.path("stale.pid");
    std::fs::write(&stale, "2147483646\n").unwrap(); // above pid_max: no such process
    let mut srv = ServerGuard::start(&dir, &["--size", "16M", "--pid-file", stale.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&stale).unwrap().trim(), srv.pid().to_string());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&stale).unwrap().permissions().mode() & 0o777, 0o600, "owner-only");
    let (status, _) = srv.terminate();
    assert!(status.success());
    assert!(!stale.exists(), "removed at exit");
}

#[test]
fn a_refused_start_leaves_no_new_backing_file() {
    let dir = TempDir::new("refused-backing");
    let backing = dir.path("backing.img");
    // Refused after the store (and its backing file) exist: the PID file's directory is missing.
    let out = compcache(&[
        "serve",
        "--size",
        "16M",
        "--mem-limit",
        "4M",
        "--backing",
        backing.to_str().unwrap(),
        "--socket",
        dir.path("s.sock").to_str().unwrap(),
        "--pid-file",
        dir.path("no/such/dir/pid").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr_of(&out).contains("--pid-file"), "{}", stderr_of(&out));
    assert!(!backing.exists(), "the backing file made for the refused start is removed");
    assert!(!dir.path("s.sock").exists() && !dir.path("s.sock.ctl").exists());
}

#[test]
fn a_stopped_server_leaves_no_page_data_in_its_backing_file() {
    // Unencrypted, so that the marker is on the file while the server runs and can be seen
    // going when it stops; encrypted (the default), it is never on the file.
    for plaintext in [true, false] {
        backing_file_after_stop(plaintext);
    }
}

fn backing_file_after_stop(plaintext: bool) {
    let dir = TempDir::new("backing-exit");
    let backing = dir.path("backing.img");
    let marker = b"SECRET-swapped-out-password-0123456789";
    let mut flags = vec!["--size", "16M", "--mem-limit", "4M", "--backing", backing.to_str().unwrap(), "--backing-incompressible"];
    if plaintext {
        flags.push("--backing-plaintext");
    }
    let mut srv = ServerGuard::start(&dir, &flags);
    let mut c = srv.client();
    for i in 0..32u64 {
        let mut p = compcache_store::testing::noise(0x9E37_79B9_7F4A_7C15 + i, 4096);
        p[100..100 + marker.len()].copy_from_slice(marker);
        c.write(i * 4096, &p).unwrap();
    }
    let on_file = |p: &std::path::Path| std::fs::read(p).unwrap().windows(marker.len()).any(|w| w == marker);
    assert!(num(&srv.stat_json(), "bd_count") > 0);
    assert_eq!(on_file(&backing), plaintext, "incompressible pages went to the backing file, encrypted unless --backing-plaintext");
    assert_eq!(c.read(5 * 4096, 4096).unwrap()[100..100 + marker.len()], marker[..], "and read back");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&backing).unwrap().permissions().mode() & 0o777, 0o600, "owner-only");
    c.disconnect().unwrap();
    let (status, stderr) = srv.terminate();
    assert!(status.success(), "{stderr}");
    assert!(!on_file(&backing), "swapped-out data outlived the server");
}

/// A page of key=value records (what a dictionary helps with), its number in it.
fn record_page(i: u64) -> Vec<u8> {
    let mut p = Vec::new();
    let mut n = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while p.len() < 4096 {
        n ^= n << 13;
        n ^= n >> 7;
        n ^= n << 17;
        p.extend_from_slice(format!("user={} score={} tags=[a{},b] ", n % 977, n % 1000, n % 7).as_bytes());
    }
    p.truncate(4096);
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

#[test]
fn dict_train_writes_a_private_dictionary_that_a_server_accepts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("dict");
    let dump = dir.path("pages.bin");
    let mut bytes: Vec<u8> = (0..600).flat_map(record_page).collect();
    bytes.extend(vec![0u8; 64 * 4096]); // zero pages, skipped
    std::fs::write(&dump, &bytes).unwrap();
    let dict = dir.path("pages.dict");
    let d = dict.to_str().unwrap();
    let o = compcache(&["dict", "train", "--from", dump.to_str().unwrap(), "--out", d]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("skipped") && said.contains("saves"), "{said}");
    assert_eq!(std::fs::metadata(&dict).unwrap().permissions().mode() & 0o777, 0o600);
    // --json says the same for programs.
    let d2 = dir.path("pages2.dict");
    let o = compcache(&["dict", "train", "--from", dump.to_str().unwrap(), "--out", d2.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["same_filled_skipped"].as_u64(), v["sampled_pages"].as_u64()), (Some(64), Some(600)), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(std::fs::metadata(&d2).unwrap().len()), "{v}");
    // Never over an existing file.
    let o = compcache(&["dict", "train", "--from", dump.to_str().unwrap(), "--out", d]);
    assert!(!o.status.success() && stderr_of(&o).contains("pages.dict"), "{}", stderr_of(&o));
    // A server takes it; one that is not a dictionary is refused with its name.
    let server = ServerGuard::start(&dir, &["--size", "16M", "--recompress", "on", "--dict", d]);
    drop(server);
    let junk = dir.path("junk.dict");
    let mut j = vec![0x37, 0xa4, 0x30, 0xec, 1, 2, 3, 4];
    j.extend([0xffu8; 300]);
    std::fs::write(&junk, j).unwrap();
    let o = compcache(&[
        "serve",
        "--size",
        "16M",
        "--socket",
        dir.path("s2").to_str().unwrap(),
        "--recompress",
        "on",
        "--dict",
        junk.to_str().unwrap(),
    ]);
    assert!(!o.status.success() && stderr_of(&o).contains("junk.dict"), "{}", stderr_of(&o));
}
