//! A whole NBD connection: the fuzzer's bytes are what a client sends on a Unix socketpair
//! into `Server::serve_connection`, which runs on its own thread as in the real server.
//!
//! The first input byte chooses the mode: bit 0 clear puts a valid handshake (client flags,
//! then GO for the export) before the rest, so the bytes reach the transmission phase; set
//! sends them raw (the handshake itself). Bit 1 serves the connection with two workers
//! instead of one (concurrent requests, FLUSH ordering). The client then half-closes and reads
//! everything the server answers until it closes.
//!
//! Checked: no panic on any thread; the connection ends once the client stops sending (a
//! server that does not is a hang, reported by the fuzzer's timeout); no connection is left
//! counted as open; no store call of a validated request fails (the store has no memory
//! limit, so every in-range request must succeed).
//!
//! The server and its store are made once and reused; the store is emptied after each input
//! so that every input starts from the same empty device. Each of the two servers has one
//! thread of its own that serves the connections handed to it one after the other, as a real
//! server's listener hands each to a thread: a new thread per input was a tenth of its time.

use crate::nbd_handshake::{new_export, NAME, SIZE};
use compcache_nbd::client::info_request;
use compcache_nbd::wire::*;
use compcache_nbd::{Server, ServerOptions};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Bytes of input sent at most: what fits in the socket's buffer, so that writing it all never
/// waits for the server (which may be busy writing replies the client has not read yet).
pub const MAX_INPUT: usize = 60_000;

fn servers() -> &'static [Server; 2] {
    static SERVERS: OnceLock<[Server; 2]> = OnceLock::new();
    SERVERS.get_or_init(|| {
        [1, 2].map(|workers| {
            let options = ServerOptions { workers_per_connection: workers, ..ServerOptions::default() };
            Server::new(new_export(), options)
        })
    })
}

/// The way to a server's thread: the connections to serve go in, and one message comes back
/// when the server is done with each (its connection closed and no longer counted).
struct ServerThread {
    conns: Sender<UnixStream>,
    done: Receiver<()>,
}

/// The thread of each server, started on first use. Locked for a whole input: one connection
/// at a time per server, so that the checks after it see that connection's effects only.
fn server_threads() -> &'static [Mutex<ServerThread>; 2] {
    static THREADS: OnceLock<[Mutex<ServerThread>; 2]> = OnceLock::new();
    THREADS.get_or_init(|| {
        [0, 1].map(|i| {
            let (conns, conns_rx) = channel::<UnixStream>();
            let (done_tx, done) = channel();
            std::thread::Builder::new()
                .name(format!("fuzz-server-{i}"))
                .spawn(move || {
                    for end in conns_rx {
                        servers()[i].serve_connection(end, "fuzz");
                        // A panic above ends this thread and drops `done_tx`: the input's
                        // `recv` fails and says so (under the fuzzer the panic has aborted).
                        if done_tx.send(()).is_err() {
                            break;
                        }
                    }
                })
                .expect("starting a server thread");
            Mutex::new(ServerThread { conns, done })
        })
    })
}

/// A valid answer to the greeting and a GO for the export, as a client sends them.
pub fn go_prefix() -> Vec<u8> {
    let mut b = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    let data = info_request(NAME, &[]);
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(&data);
    b
}

pub fn run(data: &[u8]) {
    // Nothing for the empty input: `init` runs it before the fork server, where no thread
    // may be started.
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let which = ((mode >> 1) & 1) as usize;
    let server = &servers()[which];
    let thread = server_threads()[which].lock().unwrap_or_else(PoisonError::into_inner);
    let mut bytes = if mode & 1 == 0 { go_prefix() } else { Vec::new() };
    bytes.extend_from_slice(&rest[..rest.len().min(MAX_INPUT)]);

    let (mut client, end) = UnixStream::pair().expect("socketpair");
    thread.conns.send(end).expect("the server thread is gone");
    // The server may close early (a protocol error): what it did not read is dropped.
    let _ = client.write_all(&bytes);
    let _ = client.shutdown(Shutdown::Write);
    let mut sink = [0u8; 64 << 10];
    while let Ok(n) = client.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
    thread.done.recv().expect("the server thread panicked");

    assert_eq!(server.open_connections(), 0, "a connection is still counted as open");
    let store = &server.export.store;
    let s = store.stats();
    assert_eq!(s.failed_reads + s.failed_writes, 0, "a validated request failed in the store");
    store.discard(0, SIZE).expect("discarding the whole device");
}
