//! One module per subcommand.

pub mod compact;
pub mod serve;
pub mod stat;
