//! `ZeroedSlice<T>`: a large slice of a type that is valid when all-zero, backed by an
//! anonymous mapping, or by a region of the state file (`shm.rs`), so that memory is committed
//! only for the parts that are touched (the slot table of a sparse device, the arena's page
//! descriptors).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::shm::StateMap;

/// Marks types whose all-zero bit pattern is a valid value.
///
/// # Safety
/// Implement only for types for which `mem::zeroed()` is a valid, initialized value.
pub(crate) unsafe trait Zeroable {}

// SAFETY: atomics of integers are valid as zero.
unsafe impl Zeroable for std::sync::atomic::AtomicU32 {}
// SAFETY: as above.
unsafe impl Zeroable for std::sync::atomic::AtomicU64 {}

/// Reserves `bytes` of private anonymous memory (tests: the store's tables are in its state
/// file) (`MAP_NORESERVE`: address space only; pages are
/// zero-filled by the kernel when first touched). The caller owns the mapping and unmaps it.
#[cfg(test)]
pub(crate) fn map_anonymous(bytes: usize) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(NonNull::new(p as *mut u8).expect("mmap returned a non-null address"))
}

pub(crate) struct ZeroedSlice<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    /// The state file the slice lives in (kept mapped while the slice lives); `None`: a
    /// private mapping of its own, unmapped on drop.
    map: Option<Arc<StateMap>>,
    _owns: PhantomData<T>,
}

// SAFETY: ZeroedSlice owns its elements like a Box<[T]>; it is Send/Sync when T is.
unsafe impl<T: Zeroable + Send> Send for ZeroedSlice<T> {}
// SAFETY: as above; shared access only hands out &T.
unsafe impl<T: Zeroable + Sync> Sync for ZeroedSlice<T> {}

impl<T: Zeroable> ZeroedSlice<T> {
    /// A slice in private memory of its own (tests).
    #[cfg(test)]
    pub fn new(len: usize) -> std::io::Result<Self> {
        let bytes = (len.max(1)).checked_mul(std::mem::size_of::<T>()).expect("slice size overflows");
        const { assert!(std::mem::align_of::<T>() <= 4096, "mmap gives page alignment") };
        Ok(ZeroedSlice { ptr: map_anonymous(bytes)?.cast(), len, map: None, _owns: PhantomData })
    }

    /// `len` elements at byte `offset` (page-aligned) of the state file. Their bytes are what
    /// the file holds: zeros in a new file, a dead process's values in a recovered one (each
    /// a valid `T`, since every bit pattern of the types used here is one: integers and atomics).
    pub fn in_map(map: &Arc<StateMap>, offset: usize, len: usize) -> Self {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).expect("slice size overflows");
        assert!(offset % 4096 == 0 && offset + bytes <= map.len(), "region {offset}+{bytes} outside the state file");
        const { assert!(std::mem::align_of::<T>() <= 4096, "regions are page-aligned") };
        ZeroedSlice { ptr: map.at(offset).cast(), len, map: Some(map.clone()), _owns: PhantomData }
    }

    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

impl<T: Zeroable> std::ops::Deref for ZeroedSlice<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` elements, zero-initialized by the kernel, and T is
        // Zeroable, so every element is a valid T; the mapping lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> Drop for ZeroedSlice<T> {
    fn drop(&mut self) {
        if self.map.is_some() {
            return; // the state file's mapping is unmapped with its last holder
        }
        // SAFETY: unmaps exactly the mapping made in `new`; no borrows outlive self.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len.max(1) * std::mem::size_of::<T>()) };
    }
}
