//! Times the harnesses outside the fuzzer: replays every seed and corpus input of each target
//! given (all by default) through its `run`, for a few rounds, and prints inputs per second of
//! this process's CPU time and the slowest inputs. What a change to a harness does to its speed
//! shows here without the fuzzer's (and the machine's load's) noise; `perf record` on this
//! binary shows where the time goes.
//!
//!   cargo run --release --example time_targets -- [--rounds N] [TARGET...]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A target's name and its harness.
type Target = (&'static str, fn(&[u8]));

const TARGETS: [Target; 7] = [
    ("nbd_handshake", compcache_fuzz::nbd_handshake::run),
    ("nbd_transmission", compcache_fuzz::nbd_transmission::run),
    ("control", compcache_fuzz::control::run),
    ("zramconf", compcache_fuzz::zramconf::run),
    ("ublk_request", compcache_fuzz::ublk_request::run),
    ("store_ops", compcache_fuzz::store_ops::run),
    ("cache_ops", compcache_fuzz::cache_ops::run),
];

/// CPU time (user and system) of this process so far: unlike wall time, hardly changed by
/// other work on the machine.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes only into the rusage it is given, a valid local.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF covers every thread of this process (the NBD server's too).
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["seeds", "corpus"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            let data = std::fs::read(&p).unwrap();
            files.push((p, data));
        }
    }
    files.sort();
    files
}

fn main() {
    // As the fuzz targets do (malloc's thresholds), so that the figures match theirs.
    compcache_fuzz::init(|_| {});
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut rounds = 5;
    if args.first().map(String::as_str) == Some("--rounds") {
        rounds = args[1].parse().expect("--rounds N");
        args.drain(..2);
    }
    for (name, run) in TARGETS {
        if !args.is_empty() && !args.iter().any(|a| a == name) {
            continue;
        }
        let files = inputs(name);
        // One untimed round: one-time set-up (the shared servers and stores) is not counted.
        for (_, data) in &files {
            run(data);
        }
        let mut per_input = vec![Duration::ZERO; files.len()];
        let (wall, cpu) = (Instant::now(), cpu_time());
        for _ in 0..rounds {
            for (i, (_, data)) in files.iter().enumerate() {
                let t = Instant::now();
                run(data);
                per_input[i] += t.elapsed();
            }
        }
        let (wall, cpu) = (wall.elapsed(), cpu_time() - cpu);
        let n = (files.len() * rounds) as f64;
        println!(
            "{name}: {} inputs x {rounds} rounds: {:.0} inputs/s of CPU time ({:.0} of wall time), {:.1} us CPU each",
            files.len(),
            n / cpu.as_secs_f64(),
            n / wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / n
        );
        let mut slow: Vec<_> = per_input.iter().zip(&files).collect();
        slow.sort_by(|a, b| b.0.cmp(a.0));
        for (t, (path, data)) in slow.iter().take(3) {
            println!(
                "  slowest: {:.0} us (wall) {} ({} bytes)",
                t.as_secs_f64() * 1e6 / rounds as f64,
                path.file_name().unwrap().to_string_lossy(),
                data.len()
            );
        }
    }
}
