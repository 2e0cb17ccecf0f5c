//! The parameters the device declares to the kernel.
//!
//! Block sizes are one page: swap writes whole pages, and a 4096-byte logical block size
//! makes the block layer reject anything smaller before it reaches us, so the store never
//! sees a partial page. Discard and write-zeroes are declared with page granularity so that
//! swap's discard (swapon `--discard`, and the per-cluster discard of freed swap slots) and
//! `blkdiscard` reach the store and free memory.
//!
//! A swap device declares no write cache: a completed write is in the store already, so the
//! kernel need not send FLUSH (we still answer one with success if it comes). A cache device
//! (`--origin`) declares a volatile write cache with FUA: a completed write is on the origin
//! but durable only after the origin's fdatasync, so the kernel must send FLUSH (and FUA
//! writes, served as the write then `Store::flush`: `request::execute`) for a file system's
//! journal commits to mean what they say.

use compcache_store::PAGE_SIZE;
use libublk::sys;

/// log2 of the page size: the logical and physical block size shift.
pub const PAGE_SHIFT: u8 = 12;
const _: () = assert!(1usize << PAGE_SHIFT == PAGE_SIZE);

/// Bytes per sector: ublk (like the whole block layer) counts in 512-byte sectors.
pub const SECTOR_SHIFT: u32 = 9;

/// The largest discard or write-zeroes request we accept, in sectors (1 GiB). The kernel
/// splits larger ones; the bound keeps one request's time in the store short.
pub const MAX_DISCARD_SECTORS: u32 = 1 << (30 - SECTOR_SHIFT);

/// The write-cache attributes: none for a RAM device, a volatile cache with FUA for a cache
/// device (`write_cache`), as the module docs say.
pub fn cache_attrs(write_cache: bool) -> u32 {
    if write_cache {
        sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA
    } else {
        0
    }
}

/// Parameters for a device of `dev_bytes` bytes whose requests carry at most
/// `io_buf_bytes` of data each; `write_cache` for a cache device (the module docs).
pub fn device_params(dev_bytes: u64, io_buf_bytes: u32, write_cache: bool) -> sys::ublk_params {
    sys::ublk_params {
        len: std::mem::size_of::<sys::ublk_params>() as u32,
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            attrs: cache_attrs(write_cache),
            logical_bs_shift: PAGE_SHIFT,
            physical_bs_shift: PAGE_SHIFT,
            io_opt_shift: PAGE_SHIFT,
            io_min_shift: PAGE_SHIFT,
            max_sectors: io_buf_bytes >> SECTOR_SHIFT,
            dev_sectors: dev_bytes >> SECTOR_SHIFT,
            ..Default::default()
        },
        discard: sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: PAGE_SIZE as u32,
            max_discard_sectors: MAX_DISCARD_SECTORS,
            max_write_zeroes_sectors: MAX_DISCARD_SECTORS,
            max_discard_segments: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sized_blocks_and_discard_declared() {
        let p = device_params(1 << 30, 64 << 10, false);
        assert_eq!(p.basic.logical_bs_shift, 12);
        assert_eq!(p.basic.physical_bs_shift, 12);
        assert_eq!(p.basic.dev_sectors, (1 << 30) >> 9);
        assert_eq!(p.basic.max_sectors, 128);
        assert_ne!(p.types & sys::UBLK_PARAM_TYPE_DISCARD, 0);
        assert_eq!(p.discard.discard_granularity, 4096);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, 0);
    }

    #[test]
    fn a_cache_device_declares_a_volatile_write_cache_with_fua() {
        let p = device_params(1 << 30, 64 << 10, true);
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, 0, "the kernel must send FLUSH");
        assert_ne!(p.basic.attrs & sys::UBLK_ATTR_FUA, 0, "the kernel may send FUA writes");
        assert_eq!(device_params(1 << 30, 64 << 10, false).basic.attrs, 0, "a RAM device declares neither");
    }
}
