//! # compcache-fuzz
//!
//! The harnesses of compcache's coverage-guided fuzz targets, one module per input surface.
//! Each module has one `run(data)` function: it turns the fuzzer's bytes into calls on the
//! real code and panics on anything that must never happen (a wrong answer, a broken
//! invariant); panics, aborts and stack overflows are what the fuzzer reports as crashes,
//! and a `run` that does not return is a hang. The binaries in `src/bin/` only wrap `run` in
//! `afl::fuzz!` (AFL++'s persistent mode: many inputs per process); `tests/corpus.rs` replays
//! every committed corpus file through the same `run` under a plain `cargo test`.
//!
//! - [`nbd_handshake`]: the NBD handshake parser (`handshake::negotiate`) on in-memory bytes;
//! - [`nbd_transmission`]: a whole NBD connection (`Server::serve_connection`) on a socketpair;
//! - [`control`]: the control protocol's request lines (`control::answer`);
//! - [`zramconf`]: zram-generator.conf parsing, interpretation and size expressions;
//! - [`ublk_request`]: ublk descriptor decoding and execution, checked against a byte model;
//! - [`store_ops`]: sequences of store operations checked against a byte-array model;
//! - [`cache_ops`]: sequences of operations on a store in cache mode over a fault-injecting
//!   origin, checked against a byte-array model of the origin.
//!
//! Inputs are decoded with [`Bytes`], which reads 0 once the input is used up, so every input
//! means something and short inputs are valid.

pub mod cache_ops;
pub mod control;
pub mod nbd_handshake;
pub mod nbd_transmission;
pub mod store_ops;
pub mod ublk_request;
pub mod zramconf;

/// Sets up the process for fuzzing `run`: called by each target's `main` before `afl::fuzz!`,
/// so once, before AFL's fork server starts, and inherited by every child it forks (AFL's
/// deferred fork server: `afl::fuzz!` starts it).
///
/// - glibc's malloc serves blocks of 128 KiB and more with their own mmap and unmaps them when
///   freed, and gives the top of the heap back above 128 KiB free: a harness whose code under
///   test allocates such a buffer per input (the store's 1 MiB backing-read buffer, the NBD
///   server's request buffers) then pays a mmap, a munmap and a page fault per 4 KiB every
///   time. Keeping such memory in the process lets the next input reuse it. Only the
///   allocator's policy changes; what the code under test does with the memory it gets is the
///   same.
/// - `run` is called once with the empty input: what a harness and the code under test set up
///   once per process (thread-local buffers, the store's huge threshold) is then set up in the
///   fork server, not by the first input of every child, which AFL would see as an input whose
///   path changes from run to run (instability). So a harness must start no thread for the
///   empty input: threads do not survive the fork.
pub fn init(run: fn(&[u8])) {
    // SAFETY: mallopt only changes malloc's thresholds; it is called before any other thread
    // exists (at the start of main), and glibc takes its own lock for it in any case.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
    // A Config computes the store's huge threshold (once per process, `OnceLock`).
    let _ = compcache_store::Config::with_disksize(PAGE as u64);
    run(&[]);
}

/// The page size of the store.
pub const PAGE: usize = compcache_store::PAGE_SIZE;

/// Forced dictionary retrains an input may ask for (`store_ops`, `cache_ops`); later requests
/// are ignored. A training (zstd's trainer on the samples) takes tens to hundreds of
/// milliseconds, so inputs that asked for one in many operations took seconds each, slowed
/// the campaigns to a few executions a second and were saved as "hangs"; two still cover a
/// retrain over a retrain.
pub const MAX_RETRAINS: u32 = 2;

/// A cursor over the fuzzer's input: little-endian integers, 0 past the end.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.data.len());
        b[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        b
    }

    pub fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Fills `buf` with data of one of five kinds, as real memory has them: zeroes, a repeated
/// word, text-like (compressible), random (incompressible), half random. `seed` makes the
/// content differ from write to write, so a stale page cannot pass for the right one.
pub fn fill(buf: &mut [u8], kind: u8, seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    match kind % 5 {
        0 => buf.fill(0),
        1 => {
            let w = next().to_ne_bytes();
            for (i, b) in buf.iter_mut().enumerate() {
                *b = w[i % 8];
            }
        }
        2 => {
            const WORDS: [&[u8]; 5] = [b"page ", b"swap ", b"compressed ", b"memory ", b"slot "];
            let mut i = 0;
            while i < buf.len() {
                let w = WORDS[(next() % 5) as usize];
                let n = w.len().min(buf.len() - i);
                buf[i..i + n].copy_from_slice(&w[..n]);
                i += n;
            }
        }
        3 => {
            for c in buf.chunks_mut(8) {
                let w = next().to_ne_bytes();
                c.copy_from_slice(&w[..c.len()]);
            }
        }
        _ => {
            let half = buf.len() / 2;
            for c in buf[..half].chunks_mut(8) {
                let w = next().to_ne_bytes();
                c.copy_from_slice(&w[..c.len()]);
            }
            buf[half..].fill(0x11);
        }
    }
}
