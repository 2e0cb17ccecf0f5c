//! The page: its size, and the two helpers every floor above uses on one, the same-filled
//! check ([`same_filled`], the write path's first test, as zram's `page_same_filled`) and its
//! inverse ([`fill_same`]). The bottom floor: it imports nothing of the crate.

/// The page size the device is addressed in. Everything is in units of it.
pub const PAGE_SIZE: usize = 4096;
/// [`PAGE_SIZE`] for byte arithmetic in `u64` (offsets, sizes); its only other spelling.
pub(crate) const PAGE: u64 = PAGE_SIZE as u64;

/// Fills `out` (a page) with the word `w` repeated: the inverse of [`same_filled`]. A word of
/// one repeated byte (zero pages, most same-filled pages) is a memset; any other word is
/// written once and then doubled by copies.
///
/// Both are done by memset and memcpy rather than by a loop over words so that the fuzz build
/// stays fast: there every iteration of a Rust loop calls the coverage hook, and the word loop
/// this replaced was a tenth of `cache_ops`' time.
pub(crate) fn fill_same(out: &mut [u8], w: u64) {
    let bytes = w.to_ne_bytes();
    if w == u64::from_ne_bytes([bytes[0]; 8]) {
        out.fill(bytes[0]);
        return;
    }
    out[..8].copy_from_slice(&bytes);
    let mut done = 8;
    while done < out.len() {
        let more = done.min(out.len() - done);
        out.copy_within(..more, done);
        done += more;
    }
}

/// The fill word if every 8-byte word of `page` is the same (zero pages included).
///
/// A page is one word repeated exactly when it equals itself shifted by a word, so after the
/// cheap check of the last word against the first (most pages that are not same-filled differ
/// there) this is one memcmp, not a loop (see [`fill_same`] on loops in the fuzz build).
pub(crate) fn same_filled(page: &[u8]) -> Option<u64> {
    debug_assert!(page.len() >= 8 && page.len() % 8 == 0, "a page is whole words");
    let first = u64::from_ne_bytes(page[..8].try_into().expect("8 bytes"));
    let last = u64::from_ne_bytes(page[page.len() - 8..].try_into().expect("8 bytes"));
    (last == first && page[8..] == page[..page.len() - 8]).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_filled_finds_one_differing_byte_anywhere() {
        let w = 0x0123_4567_89ab_cdefu64;
        let mut page = vec![0u8; PAGE_SIZE];
        fill_same(&mut page, w);
        assert_eq!(same_filled(&page), Some(w));
        for at in [0, 7, 8, 9, 2047, 2048, PAGE_SIZE - 9, PAGE_SIZE - 8, PAGE_SIZE - 1] {
            page[at] ^= 1;
            assert_eq!(same_filled(&page), None, "byte {at} changed");
            page[at] ^= 1;
        }
        // A page with a period other than 8 bytes is not one word repeated.
        let mut page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 16) as u8).collect();
        assert_eq!(same_filled(&page), None);
        page.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 4) as u8);
        assert_eq!(same_filled(&page), Some(u64::from_ne_bytes([0, 1, 2, 3, 0, 1, 2, 3])));
    }

    #[test]
    fn fill_same_is_the_inverse_of_same_filled() {
        // Zero, one repeated byte, and words whose bytes differ (one of them differing only in
        // its last byte, which the memset path must not take for a repeated byte).
        for w in [0, u64::MAX, 0x5a5a_5a5a_5a5a_5a5a, 0x0123_4567_89ab_cdef, 0x5a5a_5a5a_5a5a_5a5b, 0xff] {
            let mut page = vec![0xEEu8; PAGE_SIZE];
            fill_same(&mut page, w);
            assert_eq!(same_filled(&page), Some(w), "word {w:#x}");
            assert!(page.chunks_exact(8).all(|c| c == w.to_ne_bytes()), "word {w:#x}");
        }
    }
}
