//! One module per subcommand.

pub mod compact;
pub mod serve;
pub mod stat;
// Swap set-up (swapon/swapoff) and the ublk / kernel-NBD servers it starts.
pub mod device;
pub mod reserve;
pub mod swapdev;
pub mod swapon;
pub mod zramconf;
// The FUSE front end's server (compcache fuse).
pub mod fuse;
