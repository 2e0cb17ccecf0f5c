//! One flag group (a `clap::Args`: `StoreArgs`, `ServerArgs`, a command's `Args`) parsed on its
//! own, for the tests of the module that defines it.

use clap::{Args, Parser};

#[derive(Parser)]
struct Only<A: Args> {
    #[command(flatten)]
    flags: A,
}

/// `argv` (the flags alone, no command name) parsed as `A`, or clap's error.
pub fn parse_flags<A: Args>(argv: &[&str]) -> Result<A, clap::Error> {
    Only::<A>::try_parse_from(std::iter::once("compcache").chain(argv.iter().copied())).map(|o| o.flags)
}
