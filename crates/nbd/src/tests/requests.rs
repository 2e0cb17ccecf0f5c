//! Transmission: every command round trip, rejected requests and store errors, pipelining,
//! connections sharing one device.

use super::*;

#[test]
fn every_command_round_trips() {
    let srv = server();
    let (mut c, t) = connect(&srv);
    let data = pattern(1, 3 * 4096);
    c.write(8192, &data).unwrap();
    assert_eq!(c.read(8192, data.len() as u32).unwrap(), data);

    // Unaligned, crossing a page boundary.
    c.write(4096 - 3, b"unaligned!").unwrap();
    assert_eq!(c.read(4096 - 3, 10).unwrap(), b"unaligned!");

    // FUA is accepted; FLUSH succeeds.
    c.write_fua(SIZE - 4096, &pattern(2, 4096)).unwrap();
    c.flush().unwrap();
    assert_eq!(c.read(SIZE - 4096, 4096).unwrap(), pattern(2, 4096));

    // TRIM frees whole pages: they read back as zeroes.
    c.trim(8192, 8192).unwrap();
    assert_eq!(c.read(8192, 8192).unwrap(), vec![0u8; 8192]);
    assert_eq!(c.read(16384, 4096).unwrap(), data[8192..]);

    // WRITE_ZEROES, with NO_HOLE accepted; partial pages zeroed exactly.
    c.write_zeroes(16384 + 100, 200, CMD_FLAG_NO_HOLE).unwrap();
    let mut expect = data[8192..].to_vec();
    expect[100..300].fill(0);
    assert_eq!(c.read(16384, 4096).unwrap(), expect);

    let stats = srv.export.store.stats();
    assert!(stats.num_writes > 0 && stats.num_reads > 0);
    assert_eq!(stats.invalid_io, 0);
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn bad_requests_get_errors_and_the_connection_goes_on() {
    let srv = server();
    let (mut c, t) = connect(&srv);
    c.write(0, b"keep me").unwrap();

    assert_eq!(nbd_err(c.read(SIZE - 10, 11)), EINVAL, "read past the end");
    assert_eq!(nbd_err(c.write(SIZE, b"x")), ENOSPC, "write past the end");
    assert_eq!(nbd_err(c.trim(u64::MAX - 5, 10)), EINVAL, "offset overflow");
    assert_eq!(nbd_err(c.write_zeroes(SIZE - 1, 2, 0)), ENOSPC);
    assert_eq!(nbd_err(c.read(0, MAX_PAYLOAD_BYTES + 1)), EINVAL, "read above max payload");
    assert_eq!(nbd_err(c.read(0, 0)), EINVAL, "zero length");

    // Unknown command, unadvertised commands, unknown flags.
    for (cmd, flags) in
        [(77u16, 0u16), (CMD_CACHE, 0), (CMD_BLOCK_STATUS, 0), (CMD_READ, CMD_FLAG_DF), (CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO)]
    {
        let h = c.send(cmd, flags, 0, 512, &[]).unwrap();
        let r = c.recv().unwrap();
        assert_eq!((r.handle, r.error), (h, EINVAL), "cmd {cmd} flags {flags:#x}");
        assert!(r.data.is_empty());
    }

    // A write above the max payload: its payload is skipped, EINVAL, and the stream stays in sync.
    let big = vec![0xabu8; MAX_PAYLOAD_BYTES as usize + 4096];
    assert_eq!(nbd_err(c.write(0, &big)), EINVAL);

    assert_eq!(c.read(0, 7).unwrap(), b"keep me");
    let invalid = srv.export.store.stats().invalid_io;
    assert_eq!(invalid, 12, "every rejected request is counted");
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn write_failures_map_store_errors() {
    // A memory limit far below what random data needs: writes fail with ENOSPC, earlier data stays.
    let mut cfg = Config::with_disksize(SIZE);
    cfg.mem_limit_bytes = 64 << 10;
    let srv = server_with(cfg);
    let (mut c, t) = connect(&srv);
    c.write(0, &pattern(9, 4096)).unwrap();
    let mut saw_enospc = false;
    for i in 1..256u64 {
        let mut noise = vec![0u8; 4096];
        let mut x = i.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
        for b in noise.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        match c.write(i * 4096, &noise) {
            Ok(()) => {}
            Err(ClientError::Nbd(e)) => {
                assert_eq!(e, ENOSPC);
                saw_enospc = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(saw_enospc, "a 64 KiB limit must be hit by 1 MiB of random pages");
    assert_eq!(c.read(0, 4096).unwrap(), pattern(9, 4096));
    assert!(srv.export.store.stats().failed_writes > 0);
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn pipelined_requests_are_all_answered() {
    let srv = server();
    let (mut c, t) = connect(&srv);
    let n = 64u64;
    let mut handles = std::collections::HashSet::new();
    for i in 0..n {
        handles.insert(c.send(CMD_WRITE, 0, i * 4096, 4096, &pattern(100 + i, 4096)).unwrap());
    }
    for _ in 0..n {
        let r = c.recv().unwrap();
        assert_eq!(r.error, 0);
        assert!(handles.remove(&r.handle));
    }
    let mut reads = std::collections::HashMap::new();
    for i in 0..n {
        reads.insert(c.send(CMD_READ, 0, i * 4096, 4096, &[]).unwrap(), i);
    }
    for _ in 0..n {
        let r = c.recv().unwrap();
        let i = reads.remove(&r.handle).expect("a reply per handle");
        assert_eq!(r.data, pattern(100 + i, 4096), "page {i}");
    }
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn connections_share_one_device() {
    let srv = server();
    let (mut a, ta) = connect(&srv);
    let (mut b, tb) = connect(&srv);
    a.write(12345, b"multi-conn").unwrap();
    a.flush().unwrap();
    assert_eq!(b.read(12345, 10).unwrap(), b"multi-conn");
    a.disconnect().unwrap();
    b.disconnect().unwrap();
    ta.join().unwrap();
    tb.join().unwrap();
}
