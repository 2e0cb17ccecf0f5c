//! One module per subcommand, and what the swap servers share.

pub mod compact;
pub mod dict;
pub mod generate;
pub mod list;
pub mod recompress;
pub mod serve;
pub mod set;
pub mod stat;
pub mod supervise;
pub mod writeback;
// Swap set-up (swapon/swapoff), the servers it starts (ublk and nbd-attach in device.rs, fuse)
// and what they share around the device (session.rs).
pub mod device;
pub mod fuse;
pub mod reserve;
pub mod session;
pub mod swapdev;
pub mod swapon;
pub mod zramconf;
