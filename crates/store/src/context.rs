//! The per-worker context: a compression context and scratch buffers, one per thread, so that
//! the I/O path takes no lock for compression and allocates nothing. It sits below every tier
//! that borrows its buffers (the RAM layer, the backing tier's reads, cache mode's origin I/O,
//! recompression) and knows none of them: the store tells it the sizes.

use std::sync::Arc;

use crate::buf::{resident_bytes, AlignedBuf, ReadBuf};
use crate::compress::strong::StrongDecoder;
use crate::compress::{BackendContext, MAX_COMPRESSED_BYTES};
use crate::latency::ThreadLatency;
use crate::PAGE_SIZE;

/// Per-worker scratch: a compression context and buffers, so that the I/O path takes no lock
/// for compression and does not allocate. Not shared: one per thread.
pub struct Context {
    pub(crate) comp: Box<dyn BackendContext>,
    /// Decodes pages recompression re-encoded (`compress/strong.rs`); only in a store with
    /// recompression (made resident with the context, which takes a few milliseconds).
    pub(crate) strong: Option<StrongDecoder>,
    pub(crate) cbuf: Box<[u8]>,
    pub(crate) page: Box<[u8]>,
    /// A backing record being written: header, then payload; also where a page promoted
    /// from the cold tier is compressed (`policy::maybe_promote`).
    pub(crate) rec: Box<[u8]>,
    /// Reads from the backing device: a single record, or a run of records (up to
    /// `MAX_RUN_BYTES`), in the aligned blocks an O_DIRECT read covers. Made resident at its
    /// full size when the store has a backing device (about 1 MiB), empty otherwise.
    pub(crate) read: ReadBuf,
    /// Cache mode: origin reads and writes, aligned for O_DIRECT (`Cache::io_buf_bytes`);
    /// empty otherwise.
    pub(crate) origin: AlignedBuf,
    /// This context's request latency histograms, registered with the store (`latency.rs`).
    pub(crate) lat: Arc<ThreadLatency>,
}

impl Context {
    /// A context around `comp`, its buffers resident when it is made (written once), so that
    /// their first use in a request does not fault: a strong decoder if `strong` (a store with
    /// recompression), a record buffer of `rec_bytes`, room for device reads of `read_bytes`
    /// (a store with a backing device) and an origin buffer of `origin_bytes` (cache mode).
    pub(crate) fn new(
        comp: Box<dyn BackendContext>,
        strong: bool,
        rec_bytes: usize,
        read_bytes: Option<usize>,
        origin_bytes: Option<usize>,
        lat: Arc<ThreadLatency>,
    ) -> Context {
        Context {
            comp,
            strong: strong.then(StrongDecoder::new),
            cbuf: resident_bytes(MAX_COMPRESSED_BYTES).into_boxed_slice(),
            page: resident_bytes(PAGE_SIZE).into_boxed_slice(),
            rec: resident_bytes(rec_bytes).into_boxed_slice(),
            read: read_bytes.map_or_else(ReadBuf::empty, ReadBuf::new),
            origin: origin_bytes.map_or_else(AlignedBuf::empty, AlignedBuf::new),
            lat,
        }
    }
}

/// Stack a serving thread may use to serve a request: the compressors keep their tables there
/// (liblz4's `LZ4_compress_fast`: a 16 KiB `LZ4_stream_t`), with the store's own frames on top.
pub const SERVING_STACK_BYTES: usize = 128 << 10;

/// Makes the next [`SERVING_STACK_BYTES`] of the calling thread's stack resident, by writing
/// them once: a thread that serves requests calls it before its first one. In a process whose
/// new mappings are locked on fault (`mlockall(MCL_FUTURE | MCL_ONFAULT)`: a server that took a
/// device over, docs/swap.md), a thread's stack is otherwise faulted in page by page as
/// requests first reach deeper, and under memory pressure such a fault waits in reclaim for the
/// very swap-outs the thread is there to serve (seen: a successor's ublk queue thread in
/// `do_anonymous_page` -> `try_to_free_pages` while the guest was out of memory). The thread's
/// stack must be larger (a swap server's threads have 512 KiB). It also makes
/// [`SERVING_HEAP_BYTES`] of the thread's malloc arena resident (`make_heap_resident`), for the
/// same reason.
#[inline(never)]
pub fn make_stack_resident() {
    let mut probe = [0u8; SERVING_STACK_BYTES];
    for off in (0..probe.len()).step_by(4096) {
        // SAFETY: `off` is inside the local array; a volatile write so the page is really
        // touched (and not optimised away with the array).
        unsafe { std::ptr::write_volatile(probe.as_mut_ptr().add(off), 1) };
    }
    std::hint::black_box(&probe);
    make_heap_resident();
}

/// How much of the calling thread's malloc arena [`make_stack_resident`] makes resident:
/// room for what a serving thread allocates on its rarer paths (a log line, an error's
/// text), below glibc's default trim threshold (128 KiB) so that the freed block stays in the
/// arena.
pub const SERVING_HEAP_BYTES: usize = 64 << 10;

/// Makes [`SERVING_HEAP_BYTES`] of the calling thread's malloc arena resident: one block of
/// that size, written and freed, goes back to the top of the thread's arena, whose pages then
/// serve the thread's next small allocations without a fault. Why: a successor's ublk queue
/// thread formatting the line of a failed write sat in `malloc` carving a fresh page of its
/// arena, in a page fault in direct reclaim, while the machine was out of memory (the VM
/// test's `global-kill`, 2026-11-29). It covers the first allocations, not a thread that
/// allocates more than this at once.
#[inline(never)]
fn make_heap_resident() {
    let mut block: Vec<u8> = Vec::with_capacity(SERVING_HEAP_BYTES);
    for off in (0..SERVING_HEAP_BYTES).step_by(4096) {
        // SAFETY: `off` is inside the allocation's capacity; a volatile write of one byte so
        // that the page is really touched, into memory this function owns.
        unsafe { std::ptr::write_volatile(block.as_mut_ptr().add(off), 1) };
    }
    std::hint::black_box(&mut block);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resident bytes of this process's mapping that holds `addr`.
    fn rss_of_mapping_holding(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_it = false;
        for line in smaps.lines() {
            let head = line.split_once(' ').map(|(s, _)| s).unwrap_or("");
            if let Some((a, b)) = head.split_once('-').filter(|_| !head.ends_with(':')) {
                let (a, b) = (usize::from_str_radix(a, 16).unwrap_or(1), usize::from_str_radix(b, 16).unwrap_or(0));
                in_it = (a..b).contains(&addr);
            } else if in_it && line.starts_with("Rss:") {
                return line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024;
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn a_serving_threads_stack_is_made_resident_before_its_first_request() {
        // A new thread's stack, of a swap server's size: only the pages it has used are
        // resident until the probe writes the rest of what a request may use.
        let grown = std::thread::Builder::new()
            .stack_size(512 << 10)
            .spawn(|| {
                let here = 0u8;
                let addr = std::ptr::addr_of!(here) as usize;
                let before = rss_of_mapping_holding(addr);
                make_stack_resident();
                rss_of_mapping_holding(addr) - before
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(grown >= (SERVING_STACK_BYTES - (16 << 10)) as u64, "{grown} bytes of stack made resident");
    }

    /// Whether every page of the `len` bytes at `addr` is resident.
    fn all_resident(addr: usize, len: usize) -> bool {
        let (start, end) = (addr & !4095, (addr + len + 4095) & !4095);
        let mut pages = vec![0u8; (end - start) / 4096];
        // SAFETY: mincore only reads this process's page tables for [start, end), a range of
        // the caller's live allocation rounded to pages, and writes one byte per page into
        // `pages`, which has exactly that many.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, end - start, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().all(|p| p & 1 == 1)
    }

    const ARENA_CHILD: &str = "COMPCACHE_ARENA_TEST_CHILD";

    #[test]
    fn a_serving_threads_next_small_allocations_find_resident_pages() {
        // In a process of its own: there a new thread gets a malloc arena of its own, while
        // in the test harness's process arenas are shared with other tests' threads, whose
        // pages may be resident already.
        const NAME: &str = "context::tests::a_serving_threads_next_small_allocations_find_resident_pages";
        if std::env::var_os(ARENA_CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([NAME, "--exact", "--test-threads=1", "--nocapture"])
                .env(ARENA_CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        // After the probe, the next allocations of the thread (below the 64 KiB) take pages
        // that are resident already; without it, those past the arena's first page are not.
        let resident = std::thread::spawn(|| {
            let first = Box::new([0u8; 64]); // the thread's arena is made here
            make_stack_resident();
            let next: Vec<u8> = Vec::with_capacity(SERVING_HEAP_BYTES / 2);
            let r = all_resident(next.as_ptr() as usize, SERVING_HEAP_BYTES / 2);
            drop((first, next));
            r
        })
        .join()
        .unwrap();
        assert!(resident, "the thread's next {} KiB were not resident", SERVING_HEAP_BYTES / 2 / 1024);
    }
}
