//! Page contents for tests: each kind stands for a kind of real memory.
#![allow(dead_code)]

pub mod model;
pub mod stress;

/// The store's page size, under the short name the tests use.
pub const PAGE: usize = compcache_store::PAGE_SIZE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Zero,
    Same,
    Text,
    Random,
    Mixed,
}

pub fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    x |= 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// A page of `kind` whose content is determined by (index, version), so a reader can tell
/// which write it sees and that it belongs to this index.
pub fn page(kind: Kind, index: u64, version: u64) -> Vec<u8> {
    let seed = index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut rng = xorshift(seed);
    let mut p = vec![0u8; PAGE];
    match kind {
        Kind::Zero => {}
        Kind::Same => {
            // The fill word names the page: index in the low half, version in the high half.
            let w = (version << 32) | (index & 0xffff_ffff);
            p.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&w.to_ne_bytes()));
        }
        Kind::Text => {
            let words: [&[u8]; 6] = [b"page ", b"swap ", b"compressed ", b"memory ", b"zram ", b"slot "];
            let mut i = 0;
            while i < PAGE {
                let w = words[(rng() % 6) as usize];
                let n = w.len().min(PAGE - i);
                p[i..i + n].copy_from_slice(&w[..n]);
                i += n;
            }
        }
        Kind::Random => p.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&rng().to_ne_bytes())),
        Kind::Mixed => {
            for c in p[..PAGE / 2].chunks_exact_mut(8) {
                c.copy_from_slice(&rng().to_ne_bytes());
            }
        }
    }
    // Stamp identity into every non-uniform page so that a wrong page cannot pass as right.
    if !matches!(kind, Kind::Zero | Kind::Same) {
        p[..8].copy_from_slice(&index.to_le_bytes());
        p[8..16].copy_from_slice(&version.to_le_bytes());
    }
    p
}

/// The page kind a concurrency test writes for `version` (mixed, so that every path runs).
pub fn kind_of(version: u64) -> Kind {
    [Kind::Text, Kind::Mixed, Kind::Random, Kind::Text, Kind::Same][(version % 5) as usize]
}

/// True when `p` is some version of index `i` written with `kind_of`, or zeroes: what a
/// concurrent reader may see, never torn and never another index's page.
pub fn plausible(i: u64, p: &[u8]) -> bool {
    if p.iter().all(|&b| b == 0) {
        return true;
    }
    if p[..8] == i.to_le_bytes() {
        let v = u64::from_le_bytes(p[8..16].try_into().unwrap());
        return p == page(kind_of(v), i, v);
    }
    // Same-filled pages name their index in the low half of the fill word.
    let w = u64::from_ne_bytes(p[..8].try_into().unwrap());
    w & 0xffff_ffff == i && p.chunks_exact(8).all(|c| c == &p[..8])
}

/// A proptest strategy over every page kind.
pub fn kind_strategy() -> impl proptest::strategy::Strategy<Value = Kind> {
    use proptest::prelude::*;
    prop_oneof![Just(Kind::Zero), Just(Kind::Same), Just(Kind::Text), Just(Kind::Random), Just(Kind::Mixed)]
}

/// Writes `make(i)` at pages 0, 1, 2, ... until a write fails: how many were stored, and the
/// error that stopped it (tests of what fills the store up).
pub fn write_until_error(
    store: &compcache_store::Store,
    ctx: &mut compcache_store::Context,
    mut make: impl FnMut(u64) -> Vec<u8>,
) -> (u64, compcache_store::StoreError) {
    let mut written = 0;
    loop {
        match store.write_page(ctx, written, &make(written)) {
            Ok(()) => written += 1,
            Err(e) => return (written, e),
        }
    }
}
