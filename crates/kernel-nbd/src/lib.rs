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
//! ## One connection
//!
//! A device attached through netlink gets exactly one connection and no request timeout
//! (`NBD_ATTR_TIMEOUT` unset, the kernel's "timeout=0"), whatever [`AttachOptions::connections`]
//! asks, because of what the block layer's timer does to a request in flight
//! (`nbd_xmit_timeout`, Linux 5.7 to at least 6.12):
//!
//! - with more than one connection (or a request timeout) it cuts the connection the request
//!   was sent on and sends the request again on another. For a server that is alive but slow
//!   (a swap server under memory pressure) that is wrong twice: a live connection is lost, and
//!   the first copy of a write may still be carried out after the second, and after a later
//!   write to the same sectors, putting old data over new;
//! - with one connection and no timeout it never fails a request and never cuts a connection:
//!   it logs "Possible stuck request", and if the connection the request was sent on has been
//!   replaced since (`NBD_CMD_RECONFIGURE` after the server died), it sends the request again
//!   on the new one.
//!
//! The second is what a takeover needs. The timer's period is the queue's `io_timeout`, 30 s by
//! default: the first server sets it to [`attach::REQUEUE_PERIOD`], so the requests the dead
//! server had read wait at most that long after a successor reconnects (with 30 s they made
//! every takeover with requests in flight a 30 s stall). New I/O does not wait for them.
//!
//! - [`ioctl`]: the ioctl numbers and thin wrappers (every `unsafe` is here);
//! - [`netlink`]: the `nbd` generic netlink family's connect, reconfigure and disconnect;
//! - [`attach`]: finding a free device, the handshake, attaching and detaching.

pub mod attach;
pub mod ioctl;
pub mod netlink;

pub use attach::{attach, find_free_device, kernel_support, reattach, AttachOptions, Attached, Error};
