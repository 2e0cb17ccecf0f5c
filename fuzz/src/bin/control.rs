//! Fuzz target `control`: see `compcache_fuzz::control` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::control::run);
    afl::fuzz!(|data: &[u8]| compcache_fuzz::control::run(data));
}
