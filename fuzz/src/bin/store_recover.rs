//! Fuzz target `store_recover`: see `compcache_fuzz::store_recover` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::store_recover::run);
    afl::fuzz!(|data: &[u8]| compcache_fuzz::store_recover::run(data));
}
