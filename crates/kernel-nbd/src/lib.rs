//! # compcache-kernel-nbd
//!
//! Makes `/dev/nbdN` appear without a separate client program: compcache does what
//! `nbd-client` does, against its own in-process NBD server.
//!
//! For each connection a `socketpair(AF_UNIX, SOCK_STREAM)` is made; one end is served by
//! [`compcache_nbd::Server::serve_connection`] on its own thread, and on the other end this
//! crate runs the NBD handshake (`NBD_OPT_GO`) and then hands the socket to the kernel with
//! the classic ioctls: `NBD_SET_BLKSIZE` (one page), `NBD_SET_SIZE_BLOCKS`, `NBD_SET_FLAGS`
//! (the transmission flags the server advertised: flush, trim, write-zeroes, multi-conn),
//! `NBD_SET_SOCK` once per connection, and `NBD_DO_IT` on a thread of its own, which blocks
//! for as long as the device is connected. Stopping sends `NBD_DISCONNECT`; the kernel then
//! sends `NBD_CMD_DISC`, `NBD_DO_IT` returns, and the device is cleared.
//!
//! The classic ioctls need no netlink code and exist on every kernel with `nbd.ko`; their one
//! property, that the device dies with the process that called `NBD_DO_IT`, is the failure
//! model wanted when the pages live only in this process: when it dies the kernel must see I/O
//! errors. When the store's state outlives the process instead (held for a successor), the
//! caller asks for a dead-connection timeout and the device is attached through the `nbd`
//! generic netlink family ([`netlink`]): the kernel holds the sockets, queues the I/O when the
//! server dies, and a successor gives it new connections with [`reattach`]
//! (`NBD_CMD_RECONFIGURE`).
//!
//! - [`ioctl`]: the ioctl numbers and thin wrappers (every `unsafe` is here);
//! - [`netlink`]: the `nbd` generic netlink family's connect, reconfigure and disconnect;
//! - [`attach`]: finding a free device, the handshake, attaching and detaching.

pub mod attach;
pub mod ioctl;
pub mod netlink;

pub use attach::{attach, find_free_device, kernel_support, reattach, AttachOptions, Attached, Error};
