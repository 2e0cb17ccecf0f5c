//! Fuzz target `zramconf`: see `compcache_fuzz::zramconf` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::zramconf::run);
    afl::fuzz!(|data: &[u8]| compcache_fuzz::zramconf::run(data));
}
