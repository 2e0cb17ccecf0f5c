//! Protocol tests: a real server on one end of a socketpair, the crate's minimal client (or
//! hand-made bytes) on the other. Every command, the handshake options, and a malformed-client
//! run after which a good client must find its data intact. They drive the whole server, so
//! they are grouped by protocol phase, one file each; the harness they share is here. (Unit
//! tests of one part sit beside it: `transmission/request.rs`, `inflight.rs`, `buffer.rs`.)

use crate::client::{self, Client, ClientError};
use crate::wire::*;
use crate::{Export, Server, ServerOptions, MAX_PAYLOAD_BYTES, TRANSMISSION_FLAGS};
use compcache_store::{Config, Store};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

const SIZE: u64 = 16 << 20;
const NAME: &str = "compcache";

fn server_with(cfg: Config) -> Arc<Server> {
    let store = Arc::new(Store::new(cfg).unwrap());
    Arc::new(Server::new(Export { name: NAME.into(), description: "test device".into(), store }, ServerOptions::default()))
}

fn server() -> Arc<Server> {
    server_with(Config::with_disksize(SIZE))
}

/// Connects a raw stream to `server`, served on its own thread.
fn raw(server: &Arc<Server>) -> (UnixStream, JoinHandle<()>) {
    let (a, b) = UnixStream::pair().unwrap();
    let s = server.clone();
    let t = std::thread::spawn(move || s.serve_connection(b, "test"));
    (a, t)
}

fn connect(server: &Arc<Server>) -> (Client<UnixStream>, JoinHandle<()>) {
    let (s, t) = raw(server);
    (Client::handshake(s, NAME).unwrap(), t)
}

/// Deterministic bytes (xorshift), compressible enough to exercise the compressor but not
/// same-filled.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            if i % 4 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
            }
            (x >> ((i % 4) * 8)) as u8 & 0x3f
        })
        .collect()
}

fn nbd_err<T: std::fmt::Debug>(r: Result<T, ClientError>) -> u32 {
    match r {
        Err(ClientError::Nbd(e)) => e,
        other => panic!("expected an NBD error reply, got {other:?}"),
    }
}

/// Builds a client on a stream already in transmission (the handshake done by hand).
fn client_from(s: UnixStream, info: client::ExportInfo) -> Client<UnixStream> {
    Client::in_transmission(s, info)
}

mod handover;
mod handshake;
mod malformed;
mod ordering;
mod requests;
mod structured;
