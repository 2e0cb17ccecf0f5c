//! Workers and ordering: NBD_CMD_DISC behind pipelined requests, FLUSH behind writes, any number of
//! workers.

use super::*;

fn server_with_workers(workers: usize) -> Arc<Server> {
    let store = Arc::new(Store::new(Config::with_disksize(SIZE)).unwrap());
    let options = ServerOptions { workers_per_connection: workers, ..ServerOptions::default() };
    Arc::new(Server::new(Export { name: NAME.into(), description: "test device".into(), store }, options))
}

/// NBD_CMD_DISC behind pipelined requests: every request read before it is executed and
/// answered before the server closes (the protocol's orderly disconnect), whatever the
/// number of workers.
#[test]
fn disconnect_finishes_requests_in_flight_first() {
    for workers in [1, 2, 8] {
        let srv = server_with_workers(workers);
        let (mut c, t) = connect(&srv);
        let n = 48u64;
        let mut handles = std::collections::HashSet::new();
        for i in 0..n {
            handles.insert(c.send(CMD_WRITE, 0, i * 8192, 8192, &pattern(500 + i, 8192)).unwrap());
        }
        c.send(CMD_DISC, 0, 0, 0, &[]).unwrap();
        for _ in 0..n {
            let r = c.recv().unwrap();
            assert_eq!(r.error, 0);
            assert!(handles.remove(&r.handle), "workers {workers}: reply for handle {}", r.handle);
        }
        let mut rest = Vec::new();
        c.stream().read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "workers {workers}: nothing after the last reply");
        t.join().unwrap();
        let (mut again, ta) = connect(&srv);
        for i in 0..n {
            assert_eq!(again.read(i * 8192, 8192).unwrap(), pattern(500 + i, 8192), "workers {workers}: page {i}");
        }
        again.disconnect().unwrap();
        ta.join().unwrap();
    }
}

/// A FLUSH pipelined behind writes is answered after them: it covers every modifying request
/// read before it on its connection, not only the ones already answered.
#[test]
fn flush_is_answered_after_the_writes_before_it() {
    for workers in [2, 8] {
        let srv = server_with_workers(workers);
        let (mut c, t) = connect(&srv);
        for round in 0..20u64 {
            let mut writes = std::collections::HashSet::new();
            for i in 0..12u64 {
                let h = match i % 3 {
                    0 => c.send(CMD_WRITE, 0, i * 65536, 65536, &pattern(round * 100 + i, 65536)).unwrap(),
                    1 => c.send(CMD_WRITE_ZEROES, 0, i * 65536, 65536, &[]).unwrap(),
                    _ => c.send(CMD_TRIM, 0, i * 65536, 65536, &[]).unwrap(),
                };
                writes.insert(h);
            }
            let flush = c.send(CMD_FLUSH, 0, 0, 0, &[]).unwrap();
            for _ in 0..12 {
                let r = c.recv().unwrap();
                assert_ne!(r.handle, flush, "workers {workers} round {round}: FLUSH answered before a write read before it");
                assert!(writes.remove(&r.handle));
            }
            let r = c.recv().unwrap();
            assert_eq!((r.handle, r.error), (flush, 0));
        }
        c.disconnect().unwrap();
        t.join().unwrap();
    }
}

/// Pipelined reads and writes of mixed sizes on one connection, over several worker counts
/// (one worker serves everything in turn; many run requests of one connection at once).
#[test]
fn any_number_of_workers_serves_pipelined_mixed_requests() {
    for workers in [1, 3, 16] {
        let srv = server_with_workers(workers);
        let (mut c, t) = connect(&srv);
        let sizes = [512u32, 4096, 12288, 65536, 200_000, 1 << 20];
        let mut offset = 0u64;
        let mut placed = Vec::new();
        for (i, &len) in sizes.iter().cycle().take(24).enumerate() {
            placed.push((offset, len, pattern(900 + i as u64, len as usize)));
            offset += len as u64 + 100; // unaligned starts
        }
        for (o, len, data) in &placed {
            c.send(CMD_WRITE, 0, *o, *len, data).unwrap();
        }
        for _ in 0..placed.len() {
            assert_eq!(c.recv().unwrap().error, 0);
        }
        let mut reads = std::collections::HashMap::new();
        for (k, (o, len, _)) in placed.iter().enumerate() {
            reads.insert(c.send(CMD_READ, 0, *o, *len, &[]).unwrap(), k);
        }
        for _ in 0..placed.len() {
            let r = c.recv().unwrap();
            let k = reads.remove(&r.handle).expect("a reply per handle");
            assert!(r.data == placed[k].2, "workers {workers}: read {k} differs");
        }
        c.disconnect().unwrap();
        t.join().unwrap();
        assert_eq!(srv.export.store.stats().invalid_io, 0);
    }
}
