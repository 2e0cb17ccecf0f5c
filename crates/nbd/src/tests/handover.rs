//! Handing a listening socket over to a successor (crate docs, "Handing over to a
//! successor"): the first server stops accepting and reading, its client's connection closes
//! after the requests it had sent are answered, a client that connects meanwhile waits in the
//! listen backlog, and the successor (another `Server` over the same store, on the same
//! listening socket) serves it what the first server stored.

use super::*;
use crate::listener::serve_unix_until;
use compcache_control::socket::AcceptGate;
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

/// Serves `listener` on a thread until the returned gate is closed.
fn accepting(server: &Arc<Server>, listener: &UnixListener) -> (Arc<AcceptGate>, JoinHandle<std::io::Result<()>>) {
    let gate = Arc::new(AcceptGate::new().unwrap());
    let (s, l, g) = (server.clone(), listener.try_clone().unwrap(), gate.clone());
    (gate, std::thread::spawn(move || serve_unix_until(s, &l, &g)))
}

fn wait_until_closed(server: &Server) {
    let start = Instant::now();
    while server.open_connections() > 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "{} connection(s) still open", server.open_connections());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_successor_serves_the_clients_that_waited_in_the_backlog() {
    let dir = std::env::temp_dir().join(format!("compcache-nbd-handover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nbd.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();

    let first = server();
    let (gate, loop_thread) = accepting(&first, &listener);
    let mut old_client = Client::connect_unix(&path, NAME).unwrap();
    let data = pattern(7, 64 << 10);
    old_client.write(4096, &data).unwrap();

    // The hand-over: no more accepting, then no more reading.
    gate.close();
    loop_thread.join().unwrap().unwrap();
    first.stop_reading();
    wait_until_closed(&first);
    assert!(old_client.read(4096, 4096).is_err(), "a connection of the server that handed over still answers");

    // A client that connects now waits in the backlog (nobody accepts)...
    let waiting = {
        let path = path.clone();
        std::thread::spawn(move || Client::connect_unix(&path, NAME).and_then(|mut c| c.read(4096, data.len() as u32)))
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!waiting.is_finished(), "a client was served while no server accepted");

    // ...until the successor accepts on the same listening socket.
    let store = first.export.store.clone();
    let successor = Arc::new(Server::new(Export { name: NAME.into(), description: "successor".into(), store }, ServerOptions::default()));
    let (gate, loop_thread) = accepting(&successor, &listener);
    assert_eq!(waiting.join().unwrap().unwrap(), pattern(7, 64 << 10));

    gate.close();
    loop_thread.join().unwrap().unwrap();
    successor.stop_reading();
    wait_until_closed(&successor);
    drop(listener);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_server_that_stopped_reading_closes_new_connections() {
    let s = server();
    s.stop_reading();
    let (mut a, t) = raw(&s);
    t.join().unwrap();
    assert!(client::greet(&mut a).is_err(), "a connection after stop_reading got a greeting");
    assert_eq!(s.open_connections(), 0);
}
