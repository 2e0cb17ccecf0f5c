//! Fuzz target `ublk_request`: see `compcache_fuzz::ublk_request` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::ublk_request::run);
    afl::fuzz!(|data: &[u8]| compcache_fuzz::ublk_request::run(data));
}
