//! The `compcache` command (work in progress).
fn main() {}
