//! The kernel NBD driver's ioctls (`include/uapi/linux/nbd.h`), with one safe wrapper each.
//! All take an integer argument (or none), so none of them reads or writes our memory.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

const NBD_IOCTL_TYPE: u32 = 0xab;

/// `_IO(0xab, nr)`: no direction, no size.
const fn io(nr: u32) -> libc::c_ulong {
    ((NBD_IOCTL_TYPE << 8) | nr) as libc::c_ulong
}

pub const NBD_SET_SOCK: libc::c_ulong = io(0);
pub const NBD_SET_BLKSIZE: libc::c_ulong = io(1);
pub const NBD_DO_IT: libc::c_ulong = io(3);
pub const NBD_CLEAR_SOCK: libc::c_ulong = io(4);
pub const NBD_CLEAR_QUE: libc::c_ulong = io(5);
pub const NBD_SET_SIZE_BLOCKS: libc::c_ulong = io(7);
pub const NBD_DISCONNECT: libc::c_ulong = io(8);
pub const NBD_SET_TIMEOUT: libc::c_ulong = io(9);
pub const NBD_SET_FLAGS: libc::c_ulong = io(10);
const _: () = assert!(NBD_SET_SOCK == 0xab00 && NBD_DO_IT == 0xab03 && NBD_SET_FLAGS == 0xab0a);

/// Issues one NBD ioctl with an integer argument on `dev` (an open `/dev/nbdN`).
pub fn nbd_ioctl(dev: &impl AsRawFd, request: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    let fd: RawFd = dev.as_raw_fd();
    // SAFETY: every NBD ioctl takes its argument by value (an integer or a file descriptor
    // number, never a pointer), so the kernel reads no memory of ours; `fd` is open for as
    // long as `dev` is borrowed. The request numbers are checked against nbd.h above.
    let rc = unsafe { libc::ioctl(fd, request as _, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
