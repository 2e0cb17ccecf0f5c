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
//! - [`store_recover`]: a successor taking a damaged state file over (`Store::recover`);
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
pub mod store_recover;
pub mod ublk_request;
pub mod zramconf;

/// zram-size expressions, which the CLI keeps at its crate's root (crates/cli/src/expr.rs, below
/// its commands) and the zram-generator parser (`zramconf::parser`) reaches as `crate::expr`:
/// compiled in here at the same place, from the same file.
#[allow(dead_code)]
#[rustfmt::skip]
#[path = "../../crates/cli/src/expr.rs"]
pub mod expr;

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
    let _ = text_pool();
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
    let mut next = xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    match kind % 5 {
        0 => buf.fill(0),
        1 => repeat_word(buf, next().to_ne_bytes()),
        2 => text(buf, &mut next),
        3 => random_words(buf, &mut next),
        _ => {
            let half = buf.len() / 2;
            random_words(&mut buf[..half], &mut next);
            buf[half..].fill(0x11);
        }
    }
}

/// A xorshift64 generator from the non-zero state `x`: the words of [`fill`] and [`text_pool`].
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The length of [`text_pool`], and so the number of places a text fill can start at.
const TEXT_POOL: usize = 1 << 16;

/// Text-like bytes made once per process: words of a small vocabulary in a random order
/// (compressible about as well as text is). [`init`] makes it before the fork server, so that
/// no input pays for it or sees its making as a new path.
fn text_pool() -> &'static [u8] {
    static POOL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        const WORDS: [&[u8]; 5] = [b"page ", b"swap ", b"compressed ", b"memory ", b"slot "];
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let mut pool = Vec::with_capacity(TEXT_POOL + 16);
        while pool.len() < TEXT_POOL {
            pool.extend_from_slice(WORDS[(next() % 5) as usize]);
        }
        pool.truncate(TEXT_POOL);
        pool
    })
}

/// Text-like bytes: [`text_pool`] from a place `next` chooses (wrapping around at its end),
/// with one of `next`'s words every 256 bytes, so that no two writes give the same page.
/// Copied rather than made word by word: the fuzz build instruments every iteration of a Rust
/// loop, and a loop over words made this kind a tenth of `store_ops`' time.
fn text(buf: &mut [u8], next: &mut impl FnMut() -> u64) {
    let pool = text_pool();
    let mut from = (next() % TEXT_POOL as u64) as usize;
    let mut i = 0;
    while i < buf.len() {
        let n = (TEXT_POOL - from).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&pool[from..from + n]);
        (i, from) = (i + n, 0);
    }
    for at in (0..buf.len()).step_by(256) {
        let n = 8.min(buf.len() - at);
        buf[at..at + n].copy_from_slice(&next().to_ne_bytes()[..n]);
    }
}

/// Fills `buf` with the words of `next`, one after the other (the last one cut to what is
/// left). Eight words a step, written without an inner loop: the fuzz build instruments every
/// iteration of a Rust loop, and with a word a step the generator (with the text kind's word
/// loop) was a fifth of `store_ops`' time.
fn random_words(buf: &mut [u8], next: &mut impl FnMut() -> u64) {
    let mut blocks = buf.chunks_exact_mut(64);
    for b in &mut blocks {
        let w = [next(), next(), next(), next(), next(), next(), next(), next()];
        let mut block = [0u8; 64];
        block[..8].copy_from_slice(&w[0].to_ne_bytes());
        block[8..16].copy_from_slice(&w[1].to_ne_bytes());
        block[16..24].copy_from_slice(&w[2].to_ne_bytes());
        block[24..32].copy_from_slice(&w[3].to_ne_bytes());
        block[32..40].copy_from_slice(&w[4].to_ne_bytes());
        block[40..48].copy_from_slice(&w[5].to_ne_bytes());
        block[48..56].copy_from_slice(&w[6].to_ne_bytes());
        block[56..].copy_from_slice(&w[7].to_ne_bytes());
        b.copy_from_slice(&block);
    }
    for c in blocks.into_remainder().chunks_mut(8) {
        c.copy_from_slice(&next().to_ne_bytes()[..c.len()]);
    }
}

/// Fills `buf` with `w` repeated from its start (`buf[i] = w[i % 8]`), by doubling copies
/// (memcpy) rather than a loop over bytes: the fuzz build instruments every iteration of a
/// Rust loop, and the byte loop this replaced cost more than the store's work on such a page.
fn repeat_word(buf: &mut [u8], w: [u8; 8]) {
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&w[..n]);
    let mut done = n;
    while done < buf.len() {
        let more = done.min(buf.len() - done);
        buf.copy_within(..more, done);
        done += more;
    }
}

/// Whether every byte of `s` is `b`. Compares a page at a time with slice equality (memcmp,
/// not instrumented) rather than looping over bytes: in the fuzz build every iteration of a
/// Rust loop calls the coverage hook, and the byte loops this replaced (a whole device
/// checked for zeroes at the end of each input) were a fifth of `cache_ops`' time.
pub fn all_bytes(s: &[u8], b: u8) -> bool {
    let block = [b; PAGE];
    s.chunks(PAGE).all(|c| c == &block[..c.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeat_word_repeats_from_the_start_for_every_length() {
        let w = *b"01234567";
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 100, PAGE, 3 * PAGE + 5] {
            let mut buf = vec![0xEE; len];
            repeat_word(&mut buf, w);
            assert!(buf.iter().enumerate().all(|(i, &x)| x == w[i % 8]), "length {len}");
        }
    }

    #[test]
    fn random_words_are_the_generator_s_words_in_order() {
        for len in [0, 5, 8, 63, 64, 65, 100, 2048, PAGE, 3 * PAGE + 3] {
            let mut count = 0u64;
            let mut next = || {
                count += 1;
                count.wrapping_mul(0x0101_0101_0101_0101) ^ 0xF0
            };
            let mut buf = vec![0xEE; len];
            random_words(&mut buf, &mut next);
            let want: Vec<u8> = (1..).flat_map(|i: u64| (i.wrapping_mul(0x0101_0101_0101_0101) ^ 0xF0).to_ne_bytes()).take(len).collect();
            assert_eq!(buf, want, "length {len}");
        }
    }

    #[test]
    fn text_pages_compress_and_differ_from_write_to_write() {
        let (mut a, mut b) = (vec![0u8; PAGE], vec![0u8; PAGE]);
        fill(&mut a, 2, 1);
        fill(&mut b, 2, 2);
        // Every 256-byte part of a page differs between two writes.
        assert!(a.chunks(256).zip(b.chunks(256)).all(|(x, y)| x != y));
        // Text: the vocabulary's letters and spaces apart from the stamped words.
        let letters = a.iter().filter(|c| c.is_ascii_lowercase() || **c == b' ').count();
        assert!(letters > PAGE * 9 / 10, "{letters} of {PAGE} bytes are text");
        // Longer than the pool: it wraps around.
        let mut long = vec![0u8; TEXT_POOL + 3 * PAGE];
        fill(&mut long, 2, 3);
        assert!(long.iter().filter(|c| c.is_ascii_lowercase() || **c == b' ').count() > long.len() * 9 / 10);
    }

    #[test]
    fn all_bytes_finds_one_differing_byte_anywhere() {
        for len in [0, 1, PAGE - 1, PAGE, PAGE + 1, 5 * PAGE] {
            let mut s = vec![7u8; len];
            assert!(all_bytes(&s, 7));
            for at in [0, len / 2, len.saturating_sub(1)] {
                if at < len {
                    s[at] = 8;
                    assert!(!all_bytes(&s, 7), "length {len}, byte {at}");
                    s[at] = 7;
                }
            }
        }
    }
}
