//! Fuzz target `store_ops`: see `compcache_fuzz::store_ops` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::store_ops::run);
    compcache_fuzz::store_ops::warm();
    afl::fuzz!(|data: &[u8]| compcache_fuzz::store_ops::run(data));
}
