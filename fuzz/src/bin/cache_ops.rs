//! Fuzz target `cache_ops`: see `compcache_fuzz::cache_ops` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::cache_ops::run);
    compcache_fuzz::cache_ops::warm();
    afl::fuzz!(|data: &[u8]| compcache_fuzz::cache_ops::run(data));
}
