//! Fuzz target `nbd_transmission`: see `compcache_fuzz::nbd_transmission` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::nbd_transmission::run);
    afl::fuzz!(|data: &[u8]| compcache_fuzz::nbd_transmission::run(data));
}
