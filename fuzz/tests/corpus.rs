//! Replays every committed seed and corpus input of every target through its harness, outside
//! the fuzzer: `cargo afl test --release --target <host triple> --test corpus` in fuzz/. An
//! input that once crashed a target stays in its corpus, so this is also the regression run of
//! everything the fuzzer ever found.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in ["seeds", "corpus"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files {
            run(&std::fs::read(&f).unwrap());
            n += 1;
        }
    }
    assert!(n > 0, "no inputs for {target} in fuzz/seeds or fuzz/corpus");
}

#[test]
fn nbd_handshake() {
    replay("nbd_handshake", compcache_fuzz::nbd_handshake::run);
}

#[test]
fn nbd_transmission() {
    replay("nbd_transmission", compcache_fuzz::nbd_transmission::run);
}

#[test]
fn control() {
    replay("control", compcache_fuzz::control::run);
}

#[test]
fn zramconf() {
    replay("zramconf", compcache_fuzz::zramconf::run);
}

#[test]
fn ublk_request() {
    replay("ublk_request", compcache_fuzz::ublk_request::run);
}

#[test]
fn store_ops() {
    replay("store_ops", compcache_fuzz::store_ops::run);
}

#[test]
fn cache_ops() {
    replay("cache_ops", compcache_fuzz::cache_ops::run);
}

#[test]
fn store_recover() {
    replay("store_recover", compcache_fuzz::store_recover::run);
}
