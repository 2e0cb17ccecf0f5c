//! Fuzz target `nbd_handshake`: see `compcache_fuzz::nbd_handshake` for what the input means and what is checked.
fn main() {
    compcache_fuzz::init(compcache_fuzz::nbd_handshake::run);
    afl::fuzz!(|data: &[u8]| compcache_fuzz::nbd_handshake::run(data));
}
