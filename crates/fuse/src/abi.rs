//! The FUSE kernel ABI that both transports ([`crate::classic`], [`crate::uring`]) read and
//! write themselves: the request and reply headers, the few per-operation structures of the
//! operations the device file answers, and the FUSE-over-io_uring structures. (fuser's own is
//! used only for the mount and INIT.)
//!
//! Reference: the kernel's `include/uapi/linux/fuse.h` (protocol 7.42, Linux 6.14, which added
//! `FUSE_OVER_IO_URING`, `struct fuse_uring_ent_in_out`, `struct fuse_uring_req_header`,
//! `enum fuse_uring_cmd` and `struct fuse_uring_cmd_req`) and
//! `Documentation/filesystems/fuse/fuse-io-uring.rst`. Every structure is `#[repr(C)]` with the
//! kernel's field order and explicit padding, so there are no implicit padding bytes; the tests
//! below pin each size and the offsets the transport depends on.

/// Opcodes (`enum fuse_opcode`) of the requests the transport answers; any other gets ENOSYS.
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
}

/// `FUSE_OVER_IO_URING` in the INIT flags (bit 41: in `flags2`).
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;
/// `FOPEN_DIRECT_IO` and `FOPEN_PARALLEL_DIRECT_WRITES` (`fuse_open_out.open_flags`).
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
/// `fuse_setattr_in.valid` bits.
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;

/// `enum fuse_uring_cmd`: the `cmd_op` of an `IORING_OP_URING_CMD` on `/dev/fuse`.
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IN_OUT_HEADER_SZ` and `FUSE_URING_OP_IN_OUT_SZ`.
pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;
/// The kernel's smallest payload buffer (`FUSE_MIN_READ_BUFFER`); it requires each entry's
/// payload to be at least max(this, max_write, max_pages * PAGE_SIZE).
pub const FUSE_MIN_READ_BUFFER: usize = 8192;

/// `FUSE_NOTIFY_RESEND` (Linux 6.9+, protocol 7.40): the notification, sent as a reply header
/// with `unique` 0 and this code in `error`, that moves every request read but not answered
/// (the processing queues of all the connection's descriptors) back to the input queue.
pub const FUSE_NOTIFY_RESEND: i32 = 7;
/// `FUSE_UNIQUE_RESEND`: set in `unique` of a request the kernel sent again after
/// [`FUSE_NOTIFY_RESEND`]. The reply must carry the `unique` as read, this bit included.
pub const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

/// `struct fuse_in_header`: at the start of every request (in `in_out` of the ring header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

/// `struct fuse_out_header`: at the start of every reply (in `in_out` on commit).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutHeader {
    pub len: u32,
    /// 0 or a negative errno.
    pub error: i32,
    pub unique: u64,
}

/// `struct fuse_read_in`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_in` (the data follows, in the payload buffer).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_out`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_fallocate_in`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

/// `struct fuse_setattr_in` (only `valid` and `size` are read).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

/// `struct fuse_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// `struct fuse_attr_out` (GETATTR, SETATTR).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

/// `struct fuse_entry_out` (LOOKUP).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

/// `struct fuse_open_out` (OPEN, OPENDIR).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// `struct fuse_statfs_out` (its one member, `struct fuse_kstatfs`, inlined).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `struct fuse_dirent` without its name (which follows, padded to 8 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
}

/// `struct fuse_uring_ent_in_out`: the last part of an entry's header buffer. The kernel
/// writes it with a request (`commit_id` names the request, `payload_sz` is how much of the
/// payload buffer it filled); the server writes `payload_sz` of its reply.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringEntInOut {
    pub flags: u64,
    pub commit_id: u64,
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: an entry's header buffer (`iov[0]` of its REGISTER).
/// `in_out` holds the `fuse_in_header` of a request and the `fuse_out_header` of its reply;
/// `op_in` the operation's fixed argument (`fuse_read_in`, ...); the rest of the request
/// (a write's data, a lookup's name) and the whole reply body go in the payload buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UringReqHeader {
    pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
    pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: UringEntInOut,
}

impl Default for UringReqHeader {
    fn default() -> UringReqHeader {
        UringReqHeader {
            in_out: [0; FUSE_URING_IN_OUT_HEADER_SZ],
            op_in: [0; FUSE_URING_OP_IN_OUT_SZ],
            ring_ent_in_out: UringEntInOut::default(),
        }
    }
}

/// `struct fuse_uring_cmd_req`: at the start of the SQE's 80-byte command area (the rest
/// zero).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringCmdReq {
    pub flags: u64,
    /// The request answered (0 for REGISTER).
    pub commit_id: u64,
    /// The queue (per CPU: 0 .. number of possible CPUs).
    pub qid: u16,
    pub padding: [u8; 6],
}

impl UringCmdReq {
    /// The 80-byte command area of the SQE carrying this command.
    pub fn to_cmd(&self) -> [u8; 80] {
        let mut cmd = [0u8; 80];
        cmd[0..8].copy_from_slice(&self.flags.to_ne_bytes());
        cmd[8..16].copy_from_slice(&self.commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        cmd
    }
}

/// Marks the structures above as plain old data: `#[repr(C)]`, only integer fields and byte
/// arrays, no padding (checked by the size tests below), valid for any bit pattern.
///
/// # Safety
/// Implement only for such types.
pub unsafe trait Pod: Copy + Default {}
// SAFETY: each is #[repr(C)] of integers and byte arrays with explicit padding fields; the
// tests below check that the sizes equal the sums of the fields (no implicit padding).
unsafe impl Pod for InHeader {}
// SAFETY: as above.
unsafe impl Pod for OutHeader {}
// SAFETY: as above.
unsafe impl Pod for ReadIn {}
// SAFETY: as above.
unsafe impl Pod for WriteIn {}
// SAFETY: as above.
unsafe impl Pod for WriteOut {}
// SAFETY: as above.
unsafe impl Pod for FallocateIn {}
// SAFETY: as above.
unsafe impl Pod for SetattrIn {}
// SAFETY: as above.
unsafe impl Pod for AttrOut {}
// SAFETY: as above.
unsafe impl Pod for EntryOut {}
// SAFETY: as above.
unsafe impl Pod for OpenOut {}
// SAFETY: as above.
unsafe impl Pod for StatfsOut {}
// SAFETY: as above.
unsafe impl Pod for Dirent {}
// SAFETY: as above.
unsafe impl Pod for UringEntInOut {}

/// Reads a `T` from the start of `bytes` (unaligned; missing bytes read as zero, as the
/// kernel zero-fills arguments shorter than the structure of an older protocol version).
pub fn read<T: Pod>(bytes: &[u8]) -> T {
    let mut v = T::default();
    let n = bytes.len().min(size_of::<T>());
    // SAFETY: T is Pod (any bit pattern is valid); we copy n <= size_of::<T>() bytes from a
    // slice of at least n bytes into the value's own storage; the two cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut v as *mut T).cast::<u8>(), n) };
    v
}

/// The bytes of a `T`.
pub fn bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: T is Pod without implicit padding, so all size_of::<T>() bytes are initialised;
    // the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn sizes_match_the_kernel_header() {
        // include/uapi/linux/fuse.h; each is also the sum of its fields (no implicit padding).
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<WriteOut>(), 8);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<Dirent>(), 24);
    }

    #[test]
    fn io_uring_structures() {
        assert_eq!(size_of::<UringEntInOut>(), 32);
        assert_eq!(align_of::<UringEntInOut>(), 8);
        assert_eq!(offset_of!(UringEntInOut, commit_id), 8);
        assert_eq!(offset_of!(UringEntInOut, payload_sz), 16);
        // 128 + 128 + 32 bytes: what the kernel requires of iov[0] at REGISTER.
        assert_eq!(size_of::<UringReqHeader>(), 288);
        assert_eq!(offset_of!(UringReqHeader, op_in), 128);
        assert_eq!(offset_of!(UringReqHeader, ring_ent_in_out), 256);
        assert_eq!(size_of::<UringCmdReq>(), 24);
        assert_eq!(offset_of!(UringCmdReq, qid), 16);
        let c = UringCmdReq { flags: 0, commit_id: 0x0102_0304_0506_0708, qid: 3, padding: [0; 6] }.to_cmd();
        assert_eq!(c[8..16], 0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(c[16..18], 3u16.to_ne_bytes());
        assert!(c[18..].iter().all(|&b| b == 0));
    }

    #[test]
    fn field_offsets_the_transport_reads() {
        assert_eq!(offset_of!(InHeader, opcode), 4);
        assert_eq!(offset_of!(InHeader, unique), 8);
        assert_eq!(offset_of!(InHeader, nodeid), 16);
        assert_eq!(offset_of!(OutHeader, error), 4);
        assert_eq!(offset_of!(ReadIn, size), 16);
        assert_eq!(offset_of!(WriteIn, size), 16);
        assert_eq!(offset_of!(FallocateIn, mode), 24);
        assert_eq!(offset_of!(SetattrIn, size), 16);
        assert_eq!(offset_of!(SetattrIn, mode), 68);
        assert_eq!(offset_of!(AttrOut, attr), 16);
        assert_eq!(offset_of!(EntryOut, attr), 40);
        assert_eq!(offset_of!(Attr, mode), 60);
        assert_eq!(offset_of!(StatfsOut, bsize), 40);
    }

    #[test]
    fn read_and_bytes_round_trip() {
        let h = InHeader { len: 80, opcode: op::READ, unique: 77, nodeid: 2, uid: 1, gid: 2, pid: 3, total_extlen: 0, padding: 0 };
        let b = bytes(&h).to_vec();
        assert_eq!(read::<InHeader>(&b), h);
        // A short argument reads as zero-filled.
        assert_eq!(read::<InHeader>(&b[..8]), InHeader { len: 80, opcode: op::READ, ..InHeader::default() });
    }
}
