//! Size classes: which object sizes exist and how many pages a zspage of each class spans.
//!
//! Sizes step by 8 bytes up to 1 KiB and by 16 bytes up to 4 KiB: compressed pages of real
//! memory cluster below 1 KiB, where a 16-byte step would waste 4% or more per object. Each
//! class picks the smallest zspage (1..=MAX_CHAIN pages) whose tail waste is under 1/64, or
//! the least wasteful one: objects span page boundaries inside a zspage, so a 3000-byte
//! class does not waste 1096 bytes per page as it would with one object per page.

use crate::PAGE_SIZE;

/// Bytes before each object's payload: the owner back-pointer (allocated) or the free link.
pub(super) const HEADER: usize = 4;
/// Most pages one zspage may chain (zsmalloc's CONFIG_ZSMALLOC_CHAIN_SIZE).
pub(super) const MAX_CHAIN: usize = 8;
const SMALL_STEP: usize = 8;
const SMALL_MAX: usize = 1024;
const LARGE_STEP: usize = 16;
const MIN_SIZE: usize = 16;
/// Classes 0..HUGE_CLASS hold headed objects; HUGE_CLASS holds raw pages, one per zspage.
pub(super) const HUGE_CLASS: usize = (SMALL_MAX - MIN_SIZE) / SMALL_STEP + 1 + (PAGE_SIZE - SMALL_MAX) / LARGE_STEP;
pub(super) const NUM_CLASSES: usize = HUGE_CLASS + 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ClassShape {
    /// Object size in bytes, header included.
    pub size: usize,
    pub pages_per_zspage: usize,
    pub objs_per_zspage: usize,
}

/// The class whose objects fit a payload of `len` bytes, or HUGE_CLASS for a full raw page.
pub(super) fn class_for(len: usize) -> usize {
    let s = (len + HEADER).max(MIN_SIZE);
    if s <= SMALL_MAX {
        (s - MIN_SIZE).div_ceil(SMALL_STEP)
    } else if s <= PAGE_SIZE {
        (SMALL_MAX - MIN_SIZE) / SMALL_STEP + (s - SMALL_MAX).div_ceil(LARGE_STEP)
    } else {
        assert_eq!(len, PAGE_SIZE, "objects are at most one page");
        HUGE_CLASS
    }
}

fn class_size(i: usize) -> usize {
    let small = (SMALL_MAX - MIN_SIZE) / SMALL_STEP;
    if i <= small {
        MIN_SIZE + i * SMALL_STEP
    } else {
        SMALL_MAX + (i - small) * LARGE_STEP
    }
}

pub(super) fn shape(i: usize) -> ClassShape {
    if i == HUGE_CLASS {
        return ClassShape { size: PAGE_SIZE, pages_per_zspage: 1, objs_per_zspage: 1 };
    }
    let size = class_size(i);
    let waste = |k: usize| (k * PAGE_SIZE) % size;
    let k = (1..=MAX_CHAIN).find(|&k| waste(k) * 64 <= k * PAGE_SIZE).unwrap_or_else(|| {
        (1..=MAX_CHAIN).min_by(|&a, &b| (waste(a) * b * PAGE_SIZE).cmp(&(waste(b) * a * PAGE_SIZE))).expect("MAX_CHAIN >= 1")
    });
    ClassShape { size, pages_per_zspage: k, objs_per_zspage: k * PAGE_SIZE / size }
}

/// The largest payload the pool stores more densely than a raw page. Past it a zspage holds no
/// more objects than it has pages (zsmalloc's "huge class size"), so a raw page costs the same
/// memory and saves decompressing on every read. This is the default huge threshold: the
/// kernel's zram uses zsmalloc's figure the same way (older zram used 3/4 of a page).
///
/// Worked out once per process: every `Config` asks for it, and the search walks some 470
/// sizes (a cost that showed in the fuzz targets, which make a store per input).
pub fn huge_payload_threshold() -> usize {
    static THRESHOLD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THRESHOLD.get_or_init(|| {
        (1..=PAGE_SIZE - HEADER)
            .rev()
            .find(|&len| {
                let s = shape(class_for(len));
                s.objs_per_zspage > s.pages_per_zspage
            })
            .expect("small objects pack more than one per page")
    })
}

/// For each class, the class that serves it. Neighbouring classes whose zspages have the same
/// page count and object count are merged into the largest of them (as zsmalloc merges
/// classes): the larger objects cost no more memory, and fewer classes means fewer
/// half-filled zspages, the fixed overhead of a size-class allocator.
pub(super) fn merged_classes() -> Vec<u16> {
    let mut canon: Vec<u16> = (0..NUM_CLASSES as u16).collect();
    for i in (0..HUGE_CLASS - 1).rev() {
        let (a, b) = (shape(i), shape(i + 1));
        if (a.pages_per_zspage, a.objs_per_zspage) == (b.pages_per_zspage, b.objs_per_zspage) {
            canon[i] = canon[i + 1];
        }
    }
    canon
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_payload_fits_its_class_and_the_class_is_tight() {
        for len in 1..=PAGE_SIZE - HEADER {
            let c = class_for(len);
            let s = shape(c);
            assert!(s.size >= len + HEADER, "len {len} class {c}");
            let step = if s.size <= SMALL_MAX { SMALL_STEP } else { LARGE_STEP };
            assert!(s.size < len + HEADER + step || s.size == MIN_SIZE, "len {len} wastes a step");
        }
        assert_eq!(class_for(PAGE_SIZE), HUGE_CLASS);
        assert_eq!(shape(HUGE_CLASS - 1).size, PAGE_SIZE);
    }

    #[test]
    fn merged_classes_serve_every_size_at_no_extra_cost() {
        let canon = merged_classes();
        let distinct: std::collections::BTreeSet<_> = canon.iter().collect();
        assert!(distinct.len() < NUM_CLASSES * 3 / 4, "{} classes remain", distinct.len());
        for (i, &c) in canon.iter().enumerate() {
            let (a, b) = (shape(i), shape(c as usize));
            assert!(b.size >= a.size && (a.pages_per_zspage, a.objs_per_zspage) == (b.pages_per_zspage, b.objs_per_zspage));
        }
    }

    #[test]
    fn the_huge_threshold_is_where_zspages_stop_saving_memory() {
        let t = huge_payload_threshold();
        assert!(t > PAGE_SIZE * 3 / 4 && t < PAGE_SIZE, "{t}");
        let s = shape(class_for(t));
        assert!(s.objs_per_zspage > s.pages_per_zspage);
        let s = shape(class_for(t + 1));
        assert_eq!(s.objs_per_zspage, s.pages_per_zspage, "one past it gains nothing over raw pages");
    }

    #[test]
    fn zspages_waste_little() {
        for i in 0..HUGE_CLASS {
            let s = shape(i);
            assert!(s.objs_per_zspage >= 1 && s.objs_per_zspage < 4096, "object index fits 12 bits");
            let waste = s.pages_per_zspage * PAGE_SIZE - s.objs_per_zspage * s.size;
            let pct = waste as f64 * 100.0 / (s.pages_per_zspage * PAGE_SIZE) as f64;
            // Classes just above half a page cannot do better than ~5.5% within 8 pages; past
            // 3 KiB a class holds few objects per zspage and waste up to one object per zspage.
            if s.size <= 3072 + HEADER {
                assert!(pct < 6.0, "class {i} size {} wastes {pct:.1}%", s.size);
            }
            assert_eq!(s.size % 8, 0, "headers never straddle a page boundary");
        }
    }
}
