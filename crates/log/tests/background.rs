//! The writer thread, in a child process whose stderr is a pipe nobody reads for a while (a
//! write that does not finish, as a write to a log file whose page is swapped out to the
//! server's own device): the threads that log must not wait for it, the lines must come out in
//! order once it is read, those that did not fit must be counted, and the exit must write what
//! was queued.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD: &str = "COMPCACHE_LOG_TEST_CHILD";
/// Lines the child logs: 2 MiB of them, twice what the queue holds.
const LINES: usize = 2048;

fn line_text(i: usize) -> String {
    format!("line {i:05} {}", "x".repeat(1000))
}

/// The child: logs every line with stderr blocked, reports on stdout how long the slowest call
/// took, and exits (the `atexit` flush writes the queue).
fn child() {
    compcache_log::write_in_background().expect("starting the writer thread");
    let mut slowest = Duration::ZERO;
    for i in 0..LINES {
        let t = Instant::now();
        compcache_log::info("t", &line_text(i));
        slowest = slowest.max(t.elapsed());
    }
    println!("slowest_us={}", slowest.as_micros());
}

#[test]
fn lines_are_queued_while_stderr_blocks_and_written_in_order_after() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "lines_are_queued_while_stderr_blocks_and_written_in_order_after", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stdout on a thread: the child's report must come while nobody reads its stderr. A
    // thread that logs by writing stderr itself would block at the pipe's 64 KiB and never
    // report.
    let stdout = c.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints the test's name on the same line first.
            if let Some((_, v)) = l.split_once("slowest_us=") {
                let _ = tx.send(v.trim().parse::<u128>().unwrap());
            }
        }
    });
    let slowest = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(us) => us,
        Err(_) => {
            let _ = c.kill();
            let _ = c.wait();
            panic!("the child did not finish logging while its stderr was not read: a thread that logs waited for stderr");
        }
    };
    // Generous: the machine is shared; a blocked write would never return at all.
    assert!(slowest < 1_000_000, "the slowest log call took {slowest} us");

    let mut err = String::new();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(c.wait().unwrap().success());

    let mut next = 0;
    let mut dropped = 0u64;
    for l in err.lines() {
        if let Some(rest) = l.strip_prefix("t: line ") {
            let i: usize = rest[..5].parse().unwrap();
            assert!(i >= next, "line {i} after line {next}: out of order");
            assert_eq!(l, format!("t: {}", line_text(i)), "a line came out cut or mixed");
            next = i + 1;
        } else if let Some(rest) = l.strip_prefix("compcache-log: warning: ") {
            dropped += rest.split(' ').next().unwrap().parse::<u64>().unwrap();
        }
    }
    let written = err.lines().filter(|l| l.starts_with("t: line ")).count();
    assert!(dropped > 0, "2 MiB of lines fitted a queue of {} bytes", compcache_log::QUEUE_BYTES);
    assert!(written >= compcache_log::QUEUE_BYTES / 1024 - 64, "only {written} lines written: the queue was not written at exit");
    assert_eq!(written as u64 + dropped, LINES as u64, "every line is either written or counted as dropped");
}
