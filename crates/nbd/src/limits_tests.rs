//! Tests of the server's limits (lib.rs "Limits"): the server-wide byte budget, the absolute
//! handshake deadline, and the connection cap with room kept for local clients. (The control
//! client cap and socket trust are tested in `compcache-control`.)

use crate::budget::GUARANTEED_REQUEST_BYTES;
use crate::client::{self, Client};
use crate::wire::*;
use crate::Transport;
use crate::{Export, Server, ServerOptions};
use compcache_store::{Config, Store};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const SIZE: u64 = 16 << 20;
const NAME: &str = "compcache";

fn server(options: ServerOptions) -> Arc<Server> {
    let store = Arc::new(Store::new(Config::with_disksize(SIZE)).unwrap());
    Arc::new(Server::new(Export { name: NAME.into(), description: "test".into(), store }, options))
}

/// A stream served as if it came over `transport`, on its own thread.
fn raw(srv: &Arc<Server>, transport: Transport) -> (UnixStream, JoinHandle<()>) {
    let (a, b) = UnixStream::pair().unwrap();
    let s = srv.clone();
    (a, std::thread::spawn(move || s.serve_connection_over(b, "test", transport)))
}

#[test]
fn a_stuck_client_cannot_take_the_whole_server_budget() {
    let srv = server(ServerOptions { max_server_inflight_bytes: 1 << 20, ..ServerOptions::default() });
    let (a, t_stuck) = raw(&srv, Transport::Unix);
    let mut stuck = Client::handshake(a, NAME).unwrap();
    // Reads of 1 MiB whose replies are never read: the first takes the whole server budget,
    // the rest wait for it.
    for i in 0..8u64 {
        stuck.send(CMD_READ, 0, i << 20, 1 << 20, &[]).unwrap();
    }
    while srv.budget.in_flight_bytes() == 0 {
        std::thread::yield_now();
    }
    // Another connection still gets requests of up to the guaranteed size through.
    let (b, t_good) = raw(&srv, Transport::Unix);
    let mut good = Client::handshake(b, NAME).unwrap();
    let page = vec![0x5au8; GUARANTEED_REQUEST_BYTES];
    good.write(0, &page).unwrap();
    assert_eq!(good.read(0, GUARANTEED_REQUEST_BYTES as u32).unwrap(), page);
    // The stuck client holds no more than the budget (the good one's last request may not be
    // released yet: it is at most the guaranteed size).
    assert!(srv.budget.in_flight_bytes() <= (1 << 20) + GUARANTEED_REQUEST_BYTES, "{:?}", srv.budget.state.lock());
    good.disconnect().unwrap();
    t_good.join().unwrap();
    drop(stuck);
    t_stuck.join().unwrap();
    assert_eq!(srv.budget.in_flight_bytes(), 0, "everything is given back ({:?})", srv.budget.state.lock());
}

#[test]
fn the_handshake_has_an_absolute_deadline() {
    let srv = server(ServerOptions { handshake_deadline: Duration::from_millis(300), ..ServerOptions::default() });
    let (mut s, t) = raw(&srv, Transport::Unix);
    client::greet(&mut s).unwrap();
    // An INFO option with a long name, sent one byte at a time: every byte resets an idle
    // timer, so only a deadline on the whole handshake ends it.
    let name = "x".repeat(4000);
    let mut option = Vec::new();
    option.extend_from_slice(&IHAVEOPT.to_be_bytes());
    option.extend_from_slice(&OPT_INFO.to_be_bytes());
    let data = client::info_request(&name, &[]);
    option.extend_from_slice(&(data.len() as u32).to_be_bytes());
    option.extend_from_slice(&data);
    let mut sent = 0;
    for byte in &option {
        if t.is_finished() || s.write_all(std::slice::from_ref(byte)).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sent < option.len(), "the trickling client finished its option: the deadline did not end the handshake");
    t.join().unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no reply to the unfinished option");
}

#[test]
fn tcp_clients_cannot_take_the_slots_kept_for_local_ones() {
    // Plain TCP allowed: this is about the connection cap, not TLS.
    let srv =
        server(ServerOptions { max_connections: 4, reserved_local_connections: 2, allow_plain_tcp: true, ..ServerOptions::default() });
    let mut open = Vec::new();
    for _ in 0..2 {
        let (s, t) = raw(&srv, Transport::Tcp);
        open.push((Client::handshake(s, NAME).expect("a TCP client below the TCP limit is served"), t));
    }
    let (s, t) = raw(&srv, Transport::Tcp);
    assert!(Client::handshake(s, NAME).is_err(), "a third TCP client is refused");
    t.join().unwrap();
    for _ in 0..2 {
        let (s, t) = raw(&srv, Transport::Unix);
        open.push((Client::handshake(s, NAME).expect("local clients get the kept slots"), t));
    }
    let (s, t) = raw(&srv, Transport::Unix);
    assert!(Client::handshake(s, NAME).is_err(), "beyond max_connections everyone is refused");
    t.join().unwrap();
    assert_eq!(srv.open_connections(), 4);
    for (c, t) in open {
        c.disconnect().unwrap();
        t.join().unwrap();
    }
}
