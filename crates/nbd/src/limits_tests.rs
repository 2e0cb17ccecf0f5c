//! Tests of the server's limits (lib.rs "Limits"): the server-wide byte budget, payloads taken
//! as they arrive, the request deadline (a client that stalls mid-request or does not read its
//! replies is dropped), the absolute handshake deadline, and the connection caps (room kept for
//! local clients, a cap per client). (The control client cap and socket trust are tested in
//! `compcache-control`.)

use crate::budget::GUARANTEED_REQUEST_BYTES;
use crate::client::{self, Client};
use crate::wire::*;
use crate::Transport;
use crate::{Export, Server, ServerOptions};
use compcache_store::{Config, Store};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
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

/// A request header, sent raw.
fn header(cmd: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(REQUEST_HEADER_BYTES);
    h.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h.extend_from_slice(&0u16.to_be_bytes());
    h.extend_from_slice(&cmd.to_be_bytes());
    h.extend_from_slice(&handle.to_be_bytes());
    h.extend_from_slice(&offset.to_be_bytes());
    h.extend_from_slice(&len.to_be_bytes());
    h
}

/// A client in transmission on `srv`, over a socket pair it gets back raw.
fn transmitting(srv: &Arc<Server>) -> (UnixStream, JoinHandle<()>) {
    let (a, t) = raw(srv, Transport::Unix);
    let mut c = Client::handshake(a, NAME).unwrap();
    (c.stream().try_clone().unwrap(), t)
}

/// Waits (without timing anything) until `done` holds, giving up with a panic after far
/// longer than any deadline in these tests: the guard against a hang, not a measurement.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < give_up, "still waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn writes_announced_and_never_sent_hold_no_budget_and_stall_no_one() {
    let srv = server(ServerOptions { max_server_inflight_bytes: 4 << 20, ..ServerOptions::default() });
    // Three clients announce an 8 MiB WRITE (twice the server budget) and send one byte of it:
    // that used to take the whole payload from the budget (the first, on an idle server) and
    // keep it.
    let mut stuck = Vec::new();
    for i in 0..3u64 {
        let (mut s, t) = transmitting(&srv);
        s.write_all(&header(CMD_WRITE, i, 0, 8 << 20)).unwrap();
        s.write_all(&[0x5a]).unwrap();
        stuck.push((s, t));
    }
    wait_until("a stuck WRITE to take budget", || srv.budget.in_flight_bytes() > 0);
    // A well-behaved client's 1 MiB read and write go through meanwhile.
    let (b, t_good) = raw(&srv, Transport::Unix);
    let mut good = Client::handshake(b, NAME).unwrap();
    // A stall shows as a timeout (here and for the payload's write), not as a hang.
    good.stream().set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    good.stream().set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let data = vec![0x3cu8; 1 << 20];
    good.write(8 << 20, &data).expect("a good client's write while others stall");
    assert_eq!(good.read(8 << 20, 1 << 20).expect("a good client's read while others stall"), data);
    good.disconnect().unwrap();
    t_good.join().unwrap();
    // The stalled writers hold one chunk each at most, not their announced payloads.
    assert!(srv.budget.in_flight_bytes() <= 3 * (256 << 10), "{:?}", srv.budget.state.lock());
    for (s, t) in stuck {
        drop(s);
        t.join().unwrap();
    }
    assert_eq!(srv.budget.in_flight_bytes(), 0, "everything is given back ({:?})", srv.budget.state.lock());
}

#[test]
fn clients_that_fill_the_budget_do_not_make_a_good_client_wait() {
    let srv = server(ServerOptions { max_server_inflight_bytes: 2 << 20, ..ServerOptions::default() });
    // Connections that never read the replies of READs as large as the whole budget: the
    // first holds it all, the others wait for room.
    let mut stuck = Vec::new();
    for i in 0..3u64 {
        let (mut s, t) = transmitting(&srv);
        s.write_all(&header(CMD_READ, i, 0, 2 << 20)).unwrap();
        stuck.push((s, t));
    }
    wait_until("a stuck READ to hold the budget", || srv.budget.in_flight_bytes() >= 2 << 20);
    // A connection that holds nothing gets 1 MiB through from the reserve, read and write,
    // without waiting for them (before: it waited for as long as they stayed).
    let (b, t_good) = raw(&srv, Transport::Unix);
    let mut good = Client::handshake(b, NAME).unwrap();
    // A stall shows as a timeout (here and for the payload's write), not as a hang.
    good.stream().set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    good.stream().set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let data = vec![0x6bu8; 1 << 20];
    good.write(4 << 20, &data).expect("a good client's write while the budget is full");
    assert_eq!(good.read(4 << 20, 1 << 20).expect("a good client's read while the budget is full"), data);
    good.disconnect().unwrap();
    t_good.join().unwrap();
    // All of them leave (a connection waiting for room notices only once the holder leaves).
    let (sockets, threads): (Vec<_>, Vec<_>) = stuck.into_iter().unzip();
    drop(sockets);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(srv.budget.in_flight_bytes(), 0, "everything is given back ({:?})", srv.budget.state.lock());
}

#[test]
fn a_client_that_trickles_a_payload_is_dropped_at_the_deadline() {
    let srv = server(ServerOptions { request_deadline: Some(Duration::from_millis(300)), ..ServerOptions::default() });
    let (mut s, t) = transmitting(&srv);
    // A byte of a 2000-byte WRITE every 10 ms: every byte would reset an idle timer.
    s.write_all(&header(CMD_WRITE, 1, 0, 2000)).unwrap();
    let mut sent = 0;
    while sent < 2000 {
        if t.is_finished() || s.write_all(&[0x5a]).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(sent < 2000, "the trickling client finished its payload: no deadline ended it");
    t.join().unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no reply to the unfinished write");
    assert_eq!(srv.budget.in_flight_bytes(), 0, "what it held is given back");
    // The write was never applied.
    let (b, t_good) = raw(&srv, Transport::Unix);
    let mut good = Client::handshake(b, NAME).unwrap();
    assert_eq!(good.read(0, 2000).unwrap(), vec![0u8; 2000]);
    good.disconnect().unwrap();
    t_good.join().unwrap();
}

#[test]
fn a_client_that_stops_mid_payload_is_dropped_and_its_budget_returned() {
    let srv = server(ServerOptions {
        request_deadline: Some(Duration::from_millis(300)),
        max_server_inflight_bytes: 1 << 20,
        ..ServerOptions::default()
    });
    let (mut s, t) = transmitting(&srv);
    // Three quarters of a 1 MiB payload (the whole server budget), then nothing.
    s.write_all(&header(CMD_WRITE, 1, 0, 1 << 20)).unwrap();
    s.write_all(&vec![0x5au8; 768 << 10]).unwrap();
    // The connection ends on its own (before: it held its 1 MiB for as long as it stayed).
    wait_until("the stalled connection to be dropped", || t.is_finished());
    t.join().unwrap();
    assert_eq!(srv.budget.in_flight_bytes(), 0, "what it held is given back");
    drop(s);
}

#[test]
fn a_client_that_does_not_read_its_replies_is_dropped_and_its_budget_returned() {
    let srv = server(ServerOptions {
        request_deadline: Some(Duration::from_millis(300)),
        max_server_inflight_bytes: 2 << 20,
        ..ServerOptions::default()
    });
    let (mut s, t) = transmitting(&srv);
    // More READ data than the socket holds, never read: the server's send blocks.
    for i in 0..16u64 {
        s.write_all(&header(CMD_READ, i, i << 20, 1 << 20)).unwrap();
    }
    wait_until("the connection that does not read to be dropped", || t.is_finished());
    t.join().unwrap();
    assert_eq!(srv.budget.in_flight_bytes(), 0, "what its READs held is given back");
    // A good client has the whole budget again.
    let (b, t_good) = raw(&srv, Transport::Unix);
    let mut good = Client::handshake(b, NAME).unwrap();
    assert_eq!(good.read(0, 2 << 20).unwrap().len(), 2 << 20);
    good.disconnect().unwrap();
    t_good.join().unwrap();
    drop(s);
}

#[test]
fn a_client_that_stops_in_a_request_header_is_dropped() {
    let srv = server(ServerOptions { request_deadline: Some(Duration::from_millis(300)), ..ServerOptions::default() });
    let (mut s, t) = transmitting(&srv);
    s.write_all(&header(CMD_READ, 1, 0, 4096)[..10]).unwrap();
    wait_until("the connection stopped mid-header to be dropped", || t.is_finished());
    t.join().unwrap();
    drop(s);
}

#[test]
fn one_client_cannot_take_every_connection_slot() {
    // TCP on loopback: every connection of this test comes from one address, one client.
    let srv = server(ServerOptions { max_connections_per_client: 2, allow_plain_tcp: true, ..ServerOptions::default() });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = |srv: &Arc<Server>| {
        let (stream, _) = listener.accept().unwrap();
        let s = srv.clone();
        std::thread::spawn(move || s.serve_connection_over(stream, "tcp", Transport::Tcp))
    };
    let mut open = Vec::new();
    for _ in 0..2 {
        let c = TcpStream::connect(addr).unwrap();
        let t = accept(&srv);
        open.push((Client::handshake(c, NAME).expect("below the per-client cap"), t));
    }
    let c = TcpStream::connect(addr).unwrap();
    let t = accept(&srv);
    assert!(Client::handshake(c, NAME).is_err(), "a third connection of the same client is refused");
    t.join().unwrap();
    // Another client (here a local one: this very process's socket pairs are not counted, as
    // `compcache nbd-attach`'s) still gets in.
    let (b, t_local) = raw(&srv, Transport::Unix);
    let other = Client::handshake(b, NAME).expect("another client gets in");
    other.disconnect().unwrap();
    t_local.join().unwrap();
    // A slot given back can be taken again.
    let (c, t) = open.pop().unwrap();
    c.disconnect().unwrap();
    t.join().unwrap();
    let c = TcpStream::connect(addr).unwrap();
    let t = accept(&srv);
    open.push((Client::handshake(c, NAME).expect("a slot given back is free again"), t));
    for (c, t) in open {
        c.disconnect().unwrap();
        t.join().unwrap();
    }
}

#[test]
fn a_client_is_told_by_its_process_or_its_address() {
    use crate::connection::{client_of, ClientKey};
    use std::os::fd::AsFd;
    let (a, _b) = UnixStream::pair().unwrap();
    assert_eq!(client_of(a.as_fd()), None, "this very process is not counted");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(client_of(s.as_fd()), Some(ClientKey::Address([127, 0, 0, 1].into())));
}
