//! Protocol tests: a real server on one end of a socketpair, the crate's minimal client (or
//! hand-made bytes) on the other. Every command, the handshake options, and a malformed-client
//! run after which a good client must find its data intact.

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

// ---------------------------------------------------------------- handshake

#[test]
fn go_reports_size_flags_and_block_sizes() {
    let srv = server();
    let (c, t) = connect(&srv);
    assert_eq!(c.info.size, SIZE);
    assert_eq!(c.info.flags, TRANSMISSION_FLAGS);
    assert_ne!(c.info.flags & FLAG_CAN_MULTI_CONN, 0);
    assert_eq!(c.info.block_size, Some((1, 4096, MAX_PAYLOAD_BYTES)));
    assert_eq!(c.info.name.as_deref(), Some(NAME));
    assert_eq!(c.info.description.as_deref(), Some("test device"));
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn default_export_name_is_accepted() {
    let srv = server();
    let (s, t) = raw(&srv);
    let c = Client::handshake(s, "").unwrap();
    assert_eq!(c.info.size, SIZE);
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn info_list_unsupported_and_unknown_export_then_go() {
    let srv = server();
    let (mut s, t) = raw(&srv);
    client::greet(&mut s).unwrap();

    // INFO does not leave haggling.
    let info = client::info_or_go(&mut s, OPT_INFO, NAME).unwrap();
    assert_eq!(info.size, SIZE);

    // LIST: one SERVER reply with our name, then ACK.
    client::send_option(&mut s, OPT_LIST, &[]).unwrap();
    let (_, rep, data) = client::recv_option_reply(&mut s).unwrap();
    assert_eq!(rep, REP_SERVER);
    assert_eq!(be32(&data) as usize, NAME.len());
    assert_eq!(&data[4..4 + NAME.len()], NAME.as_bytes());
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);

    // LIST with data is invalid, and haggling goes on.
    client::send_option(&mut s, OPT_LIST, b"x").unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);

    // Unsupported options: ERR_UNSUP with a message (STARTTLS without TLS: tls.rs tests).
    for opt in [OPT_EXTENDED_HEADERS, 4242] {
        client::send_option(&mut s, opt, &[]).unwrap();
        let (o, rep, msg) = client::recv_option_reply(&mut s).unwrap();
        assert_eq!((o, rep), (opt, REP_ERR_UNSUP));
        assert!(String::from_utf8_lossy(&msg).contains("not supported"));
    }

    // Unknown export: ERR_UNKNOWN, then GO with the right name works.
    match client::info_or_go(&mut s, OPT_GO, "nope") {
        Err(ClientError::OptionRefused { reply, message }) => {
            assert_eq!(reply, REP_ERR_UNKNOWN);
            assert!(message.contains("unknown export"), "{message}");
        }
        other => panic!("expected ERR_UNKNOWN, got {other:?}"),
    }
    // Malformed GO data: ERR_INVALID.
    client::send_option(&mut s, OPT_GO, &[0, 0, 0, 9, 0, 0]).unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);

    let info = client::info_or_go(&mut s, OPT_GO, NAME).unwrap();
    assert_eq!(info.size, SIZE);
    let mut c = client_from(s, info);
    c.write(0, b"hello").unwrap();
    assert_eq!(c.read(0, 5).unwrap(), b"hello");
    c.disconnect().unwrap();
    t.join().unwrap();
}

/// Builds a client on a stream already in transmission (the handshake done by hand).
fn client_from(s: UnixStream, info: client::ExportInfo) -> Client<UnixStream> {
    Client::in_transmission(s, info)
}

#[test]
fn export_name_with_and_without_zeroes() {
    for no_zeroes in [true, false] {
        let srv = server();
        let (mut s, t) = raw(&srv);
        assert_eq!(read_u64(&mut s).unwrap(), NBDMAGIC);
        assert_eq!(read_u64(&mut s).unwrap(), IHAVEOPT);
        assert_eq!(read_u16(&mut s).unwrap(), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        let cflags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
        s.write_all(&cflags.to_be_bytes()).unwrap();
        client::send_option(&mut s, OPT_EXPORT_NAME, NAME.as_bytes()).unwrap();
        assert_eq!(read_u64(&mut s).unwrap(), SIZE);
        assert_eq!(read_u16(&mut s).unwrap(), TRANSMISSION_FLAGS);
        if !no_zeroes {
            let mut z = [1u8; 124];
            s.read_exact(&mut z).unwrap();
            assert_eq!(z, [0u8; 124]);
        }
        let mut c = client_from(s, client::ExportInfo { size: SIZE, ..Default::default() });
        c.write(4096, b"abc").unwrap();
        assert_eq!(c.read(4096, 3).unwrap(), b"abc");
        c.disconnect().unwrap();
        t.join().unwrap();
    }
}

#[test]
fn export_name_for_an_unknown_export_closes() {
    let srv = server();
    let (mut s, t) = raw(&srv);
    client::greet(&mut s).unwrap();
    client::send_option(&mut s, OPT_EXPORT_NAME, b"other").unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    t.join().unwrap();
}

#[test]
fn abort_is_acknowledged() {
    let srv = server();
    let (mut s, t) = raw(&srv);
    client::greet(&mut s).unwrap();
    client::send_option(&mut s, OPT_ABORT, &[]).unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    t.join().unwrap();
}

#[test]
fn unknown_client_flags_close_the_connection() {
    let srv = server();
    let (mut s, t) = raw(&srv);
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&0x8000_0001u32.to_be_bytes()).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    t.join().unwrap();
}

#[test]
fn oversized_option_is_refused_or_closed() {
    let srv = server();
    let (mut s, t) = raw(&srv);
    client::greet(&mut s).unwrap();
    // 100 KiB: skipped and refused, haggling goes on.
    client::send_option(&mut s, 4242, &vec![7u8; 100 << 10]).unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ERR_TOO_BIG);
    // 2 GiB announced: closed without reading it.
    s.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    s.write_all(&OPT_GO.to_be_bytes()).unwrap();
    s.write_all(&0x8000_0000u32.to_be_bytes()).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    t.join().unwrap();
}

// ---------------------------------------------------------------- transmission

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

// ---------------------------------------------------------------- malformed clients

/// Connects, sends `bytes`, half-closes, and drains whatever the server says until it closes.
fn misbehave(srv: &Arc<Server>, bytes: &[u8]) {
    let (mut s, t) = raw(srv);
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    drop(s);
    t.join().expect("the connection thread must not panic");
}

/// A valid greeting answer and GO, as bytes, so malformed transmission traffic can follow.
fn go_prefix() -> Vec<u8> {
    let mut b = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    let data = client::info_request(NAME, &[]);
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(&data);
    b
}

fn header(cmd: u16, flags: u16, offset: u64, len: u32) -> Vec<u8> {
    Request { flags, cmd, handle: 0x1234, offset, len }.encode().to_vec()
}

#[test]
fn malformed_clients_lose_nothing() {
    let srv = server();
    let (mut good, tg) = connect(&srv);
    let keep = pattern(7, 64 << 10);
    good.write(1 << 20, &keep).unwrap();

    let mut cases: Vec<Vec<u8>> = vec![
        vec![],                                // connect and leave
        vec![0, 0],                            // half the client flags
        0xffff_ffffu32.to_be_bytes().to_vec(), // unknown client flags
        {
            let mut b = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
            b.extend_from_slice(b"NOTMAGIC\0\0\0\x07\0\0\0\0"); // wrong option magic
            b
        },
        {
            let mut b = go_prefix();
            b.truncate(b.len() - 3); // truncated GO
            b
        },
        {
            let mut b = go_prefix();
            b.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]); // wrong request magic
            b.extend_from_slice(&[0u8; 24]);
            b
        },
        {
            let mut b = go_prefix();
            b.extend_from_slice(&header(CMD_WRITE, 0, 0, 4096)[..20]); // truncated header
            b
        },
        {
            let mut b = go_prefix();
            b.extend_from_slice(&header(CMD_WRITE, 0, 1 << 20, 4096)); // truncated payload over kept data
            b.extend_from_slice(&[0x55; 1000]);
            b
        },
        {
            let mut b = go_prefix();
            b.extend_from_slice(&header(CMD_WRITE, 0, 0, u32::MAX)); // 4 GiB payload announced
            b
        },
        {
            let mut b = go_prefix();
            b.extend_from_slice(&header(CMD_READ, 0, 0, u32::MAX)); // huge read
            b.extend_from_slice(&header(99, 0, 0, 1)); // unknown command
            b.extend_from_slice(&header(CMD_READ, 0, u64::MAX, 4096)); // overflow
            b
        },
    ];
    // Random garbage, raw and after a valid GO.
    for seed in 0..24u64 {
        let noise = pattern(1000 + seed, 64 + (seed as usize * 97) % 3000).iter().map(|b| b.wrapping_mul(5)).collect::<Vec<_>>();
        let mut b = match seed % 3 {
            0 => vec![],                                       // instead of the client flags
            1 => FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec(), // instead of options
            _ => go_prefix(),                                  // instead of requests
        };
        b.extend_from_slice(&noise);
        cases.push(b);
    }
    for bytes in &cases {
        misbehave(&srv, bytes);
    }

    // The good client, connected all along, still works and its data is intact.
    assert_eq!(good.read(1 << 20, keep.len() as u32).unwrap(), keep);
    good.write(0, b"still here").unwrap();
    assert_eq!(good.read(0, 10).unwrap(), b"still here");
    good.disconnect().unwrap();
    tg.join().unwrap();

    // And a new client too.
    let (mut fresh, tf) = connect(&srv);
    assert_eq!(fresh.read(1 << 20, keep.len() as u32).unwrap(), keep);
    fresh.disconnect().unwrap();
    tf.join().unwrap();
    assert_eq!(srv.open_connections(), 0);
}

#[test]
fn concurrent_clients_keep_their_own_data() {
    let srv = server();
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let srv = srv.clone();
            std::thread::spawn(move || {
                let (mut c, th) = connect(&srv);
                let base = t * (4 << 20);
                // Pipelined writes of whole and unaligned pieces, then a read-back.
                for i in 0..64u64 {
                    c.send(CMD_WRITE, 0, base + i * 4096, 4096, &pattern(t * 1000 + i, 4096)).unwrap();
                }
                for _ in 0..64 {
                    assert_eq!(c.recv().unwrap().error, 0);
                }
                c.write(base + 100, b"unaligned overwrite").unwrap();
                for i in 0..64u64 {
                    let mut expect = pattern(t * 1000 + i, 4096);
                    if i == 0 {
                        expect[100..119].copy_from_slice(b"unaligned overwrite");
                    }
                    assert_eq!(c.read(base + i * 4096, 4096).unwrap(), expect, "client {t} page {i}");
                }
                c.disconnect().unwrap();
                th.join().unwrap();
            })
        })
        .collect();
    for w in writers {
        w.join().expect("a client thread failed");
    }
    let stats = srv.export.store.stats();
    assert_eq!(stats.failed_writes + stats.failed_reads + stats.invalid_io, 0);
    assert_eq!(stats.orig_data_size, 4 * 64 * 4096);
}

#[test]
fn a_client_that_stops_reading_stalls_only_itself() {
    let srv = server();
    let (mut stuck, t_stuck) = connect(&srv);
    // 96 reads of 1 MiB each, replies never read: far more than the socket buffers and the
    // connection's in-flight budget hold, so its workers block writing and its reader waits.
    for i in 0..96u64 {
        stuck.send(CMD_READ, 0, (i % 16) << 20, 1 << 20, &[]).unwrap();
    }
    // Another client is served as usual meanwhile.
    let (mut good, t_good) = connect(&srv);
    good.write(0, b"unaffected").unwrap();
    assert_eq!(good.read(0, 10).unwrap(), b"unaffected");
    good.disconnect().unwrap();
    t_good.join().unwrap();
    // When the stuck client goes away, its connection unwinds completely.
    drop(stuck);
    t_stuck.join().expect("the stuck connection ends when its client leaves");
    assert_eq!(srv.open_connections(), 0);
}

/// Random requests of every kind (aligned, unaligned, past the end) against a plain byte
/// array that models the device: every READ must match the model, every error must be the
/// one the protocol prescribes.
#[test]
fn random_requests_match_a_model_device() {
    const DEV: u64 = 1 << 20;
    let srv = server_with(Config::with_disksize(DEV));
    let (mut c, t) = connect(&srv);
    let mut model = vec![0u8; DEV as usize];
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for step in 0..3000u64 {
        let aligned = rnd(2) == 0;
        let len = if aligned { (1 + rnd(8)) * 4096 } else { 1 + rnd(3 * 4096) };
        let offset = if aligned { rnd(DEV / 4096 + 2) * 4096 } else { rnd(DEV + 4096) };
        let in_range = offset + len <= DEV;
        let (o, l) = (offset as usize, len as usize);
        match rnd(6) {
            0 | 1 => {
                // Compressible, same-filled or random data.
                let data = match rnd(3) {
                    0 => pattern(step, l),
                    1 => vec![(step % 251) as u8; l],
                    _ => (0..l).map(|_| rnd(256) as u8).collect(),
                };
                match c.write(offset, &data) {
                    Ok(()) => model[o..o + l].copy_from_slice(&data),
                    Err(e) => assert!(!in_range && matches!(e, ClientError::Nbd(ENOSPC)), "step {step}: {e}"),
                }
            }
            2 => match c.trim(offset, len as u32) {
                Ok(()) => {
                    // Whole pages inside the range are freed; partial pages are left alone.
                    let first = offset.div_ceil(4096) * 4096;
                    let end = (offset + len) / 4096 * 4096;
                    if end > first {
                        model[first as usize..end as usize].fill(0);
                    }
                }
                Err(e) => assert!(!in_range && matches!(e, ClientError::Nbd(EINVAL)), "step {step}: {e}"),
            },
            3 => match c.write_zeroes(offset, len as u32, if rnd(2) == 0 { CMD_FLAG_NO_HOLE } else { 0 }) {
                Ok(()) => model[o..o + l].fill(0),
                Err(e) => assert!(!in_range && matches!(e, ClientError::Nbd(ENOSPC)), "step {step}: {e}"),
            },
            _ => match c.read(offset, len as u32) {
                Ok(data) => assert!(data == model[o..o + l], "step {step}: READ at {offset} length {len} differs from the model"),
                Err(e) => assert!(!in_range && matches!(e, ClientError::Nbd(EINVAL)), "step {step}: {e}"),
            },
        }
    }
    // A last full read-back.
    for page in (0..DEV).step_by(256 << 10) {
        assert!(c.read(page, 256 << 10).unwrap() == model[page as usize..(page + (256 << 10)) as usize]);
    }
    let stats = srv.export.store.stats();
    assert_eq!(stats.failed_reads + stats.failed_writes, 0);
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn seed_corpus_replays_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut seeds: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    seeds.sort();
    assert!(seeds.len() >= 10, "the seed corpus is in {}", dir.display());
    let srv = server();
    let (mut good, tg) = connect(&srv);
    let keep = pattern(11, 32 << 10);
    good.write(2 << 20, &keep).unwrap();
    for seed in &seeds {
        misbehave(&srv, &std::fs::read(seed).unwrap());
    }
    assert_eq!(good.read(2 << 20, keep.len() as u32).unwrap(), keep);
    good.disconnect().unwrap();
    tg.join().unwrap();
    assert_eq!(srv.open_connections(), 0);
}

// ---------------------------------------------------------------- workers and ordering

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

// ---------------------------------------------------------------- structured replies, block status

/// A reply off the wire once structured replies are negotiated: a simple reply (successes
/// without data) or one structured chunk.
#[derive(Debug)]
enum Wire {
    Simple { error: u32, handle: u64 },
    Chunk { flags: u16, kind: u16, handle: u64, payload: Vec<u8> },
}

fn recv_wire(s: &mut impl Read) -> Wire {
    match read_u32(s).unwrap() {
        SIMPLE_REPLY_MAGIC => Wire::Simple { error: read_u32(s).unwrap(), handle: read_u64(s).unwrap() },
        STRUCTURED_REPLY_MAGIC => {
            let (flags, kind, handle) = (read_u16(s).unwrap(), read_u16(s).unwrap(), read_u64(s).unwrap());
            let mut payload = vec![0u8; read_u32(s).unwrap() as usize];
            s.read_exact(&mut payload).unwrap();
            Wire::Chunk { flags, kind, handle, payload }
        }
        m => panic!("bad reply magic {m:#x}"),
    }
}

/// An error reply's (error, message): an error chunk's, or an option's (reply type, message).
type ErrorReply = (u32, String);

/// The (error, message) of an error chunk's payload.
fn error_payload(p: &[u8]) -> ErrorReply {
    let n = be16(&p[4..6]) as usize;
    assert_eq!(p.len(), 6 + n, "an ERROR chunk is error, message length, message");
    (be32(&p[0..4]), String::from_utf8(p[6..].to_vec()).expect("messages are UTF-8"))
}

/// LIST/SET_META_CONTEXT option data.
fn meta_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// Sends a meta context option; Ok with the contexts (id, name) replied before ACK, or Err
/// with the error reply and its message.
fn meta_option(s: &mut UnixStream, opt: u32, data: &[u8]) -> Result<Vec<(u32, String)>, ErrorReply> {
    client::send_option(s, opt, data).unwrap();
    let mut contexts = Vec::new();
    loop {
        let (o, rep, d) = client::recv_option_reply(s).unwrap();
        assert_eq!(o, opt);
        match rep {
            REP_META_CONTEXT => contexts.push((be32(&d[0..4]), String::from_utf8(d[4..].to_vec()).unwrap())),
            REP_ACK => return Ok(contexts),
            r => return Err((r, String::from_utf8_lossy(&d).into())),
        }
    }
}

/// Connects with structured replies and, when `queries` is not empty, SET_META_CONTEXT with
/// them; returns the client, its server thread and the contexts the server selected.
fn connect_structured(srv: &Arc<Server>, queries: &[&str]) -> (Client<UnixStream>, JoinHandle<()>, Vec<(u32, String)>) {
    let (mut s, t) = raw(srv);
    client::greet(&mut s).unwrap();
    client::send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
    let contexts =
        if queries.is_empty() { vec![] } else { meta_option(&mut s, OPT_SET_META_CONTEXT, &meta_request(NAME, queries)).unwrap() };
    let info = client::info_or_go(&mut s, OPT_GO, NAME).unwrap();
    (client_from(s, info), t, contexts)
}

/// BLOCK_STATUS: Ok((context id, descriptors as (length, flags))) or Err((error, message)).
fn block_status(c: &mut Client<UnixStream>, flags: u16, offset: u64, len: u32) -> Result<(u32, Vec<(u32, u32)>), ErrorReply> {
    let h = c.send(CMD_BLOCK_STATUS, flags, offset, len, &[]).unwrap();
    match recv_wire(c.stream()) {
        Wire::Chunk { flags, kind, handle, payload } => {
            assert_eq!((handle, flags), (h, REPLY_FLAG_DONE), "one chunk per reply, the last");
            match kind {
                REPLY_TYPE_BLOCK_STATUS => {
                    assert!(payload.len() >= 12 && (payload.len() - 4) % 8 == 0, "context id and at least one descriptor");
                    let d = payload[4..].chunks_exact(8).map(|d| (be32(&d[0..4]), be32(&d[4..8]))).collect();
                    Ok((be32(&payload[0..4]), d))
                }
                REPLY_TYPE_ERROR => Err(error_payload(&payload)),
                k => panic!("unexpected chunk type {k} for BLOCK_STATUS"),
            }
        }
        w => panic!("BLOCK_STATUS must get a structured reply, got {w:?}"),
    }
}

/// A READ with structured replies: Ok(data) from its OFFSET_DATA chunks, or Err((error,
/// message)); also returns how many chunks it took.
fn structured_read(c: &mut Client<UnixStream>, flags: u16, offset: u64, len: u32) -> (Result<Vec<u8>, ErrorReply>, usize) {
    let h = c.send(CMD_READ, flags, offset, len, &[]).unwrap();
    let mut data = vec![0u8; len as usize];
    let (mut chunks, mut error, mut covered) = (0, None, 0usize);
    loop {
        let Wire::Chunk { flags, kind, handle, payload } = recv_wire(c.stream()) else {
            panic!("a READ never gets a simple reply with structured replies")
        };
        assert_eq!(handle, h);
        chunks += 1;
        match kind {
            REPLY_TYPE_OFFSET_DATA => {
                let at = (be64(&payload[0..8]) - offset) as usize;
                data[at..at + payload.len() - 8].copy_from_slice(&payload[8..]);
                covered += payload.len() - 8;
            }
            REPLY_TYPE_ERROR => error = Some(error_payload(&payload)),
            k => panic!("unexpected chunk type {k} for READ"),
        }
        if flags & REPLY_FLAG_DONE != 0 {
            break;
        }
    }
    match error {
        Some(e) => (Err(e), chunks),
        None => {
            assert_eq!(covered, len as usize, "the chunks cover the whole read");
            (Ok(data), chunks)
        }
    }
}

const HOLE_ZERO: u32 = STATE_HOLE | STATE_ZERO;

#[test]
fn structured_replies_and_meta_contexts_are_negotiated() {
    let srv = server();
    let (mut s, t) = raw(&srv);
    client::greet(&mut s).unwrap();

    // Meta contexts need structured replies first.
    for opt in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
        let (rep, msg) = meta_option(&mut s, opt, &meta_request(NAME, &["base:allocation"])).unwrap_err();
        assert_eq!(rep, REP_ERR_INVALID);
        assert!(msg.contains("NBD_OPT_STRUCTURED_REPLY first"), "{msg}");
    }
    // STRUCTURED_REPLY takes no data.
    client::send_option(&mut s, OPT_STRUCTURED_REPLY, b"x").unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);
    client::send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);

    let base = |id| vec![(id, "base:allocation".to_string())];
    let list = |s: &mut UnixStream, export: &str, q: &[&str]| meta_option(s, OPT_LIST_META_CONTEXT, &meta_request(export, q));
    assert_eq!(list(&mut s, NAME, &[]), Ok(base(0)), "LIST without queries lists every context, with id 0");
    assert_eq!(list(&mut s, "", &["base:"]), Ok(base(0)), "the base: wildcard, on the default export");
    assert_eq!(
        list(&mut s, NAME, &["x-other:thing", "base:nothing", "qemu:dirty-bitmap:b"]),
        Ok(vec![]),
        "unknown namespaces and leaves are ignored"
    );
    assert_eq!(list(&mut s, NAME, &["allocation"]).unwrap_err().0, REP_ERR_INVALID, "a query without a namespace");
    let (rep, msg) = list(&mut s, "nope", &["base:allocation"]).unwrap_err();
    assert_eq!(rep, REP_ERR_UNKNOWN);
    assert!(msg.contains("unknown export"), "{msg}");
    let mut truncated = meta_request(NAME, &["base:allocation"]);
    truncated.pop();
    assert_eq!(meta_option(&mut s, OPT_LIST_META_CONTEXT, &truncated).unwrap_err().0, REP_ERR_INVALID);

    // SET: the wildcard selects nothing; the context asked twice is selected once.
    let set = |s: &mut UnixStream, q: &[&str]| meta_option(s, OPT_SET_META_CONTEXT, &meta_request(NAME, q));
    assert_eq!(set(&mut s, &["base:"]), Ok(vec![]));
    let selected = set(&mut s, &["base:allocation", "x-unknown:y", "base:allocation"]).unwrap();
    assert_eq!(selected.len(), 1);
    let (id, name) = selected[0].clone();
    assert_eq!(name, "base:allocation");

    // GO advertises DF (structured replies), and transmission uses the context's id.
    let info = client::info_or_go(&mut s, OPT_GO, NAME).unwrap();
    assert_eq!(info.flags, TRANSMISSION_FLAGS | FLAG_SEND_DF);
    let mut c = client_from(s, info);
    assert_eq!(block_status(&mut c, 0, 0, 4096), Ok((id, vec![(4096, HOLE_ZERO)])));
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn block_status_without_a_context_is_einval() {
    let srv = server();
    // Structured replies, but a SET that selects nothing (an unknown namespace).
    let (mut c, t, contexts) = connect_structured(&srv, &["qemu:dirty-bitmap:x"]);
    assert!(contexts.is_empty());
    assert_eq!(c.info.flags, TRANSMISSION_FLAGS | FLAG_SEND_DF);
    let (error, msg) = block_status(&mut c, 0, 0, 4096).unwrap_err();
    assert_eq!(error, EINVAL);
    assert!(msg.contains("NBD_OPT_SET_META_CONTEXT"), "the error chunk says why: {msg}");
    // The connection goes on.
    c.write(0, b"after").unwrap();
    assert_eq!(structured_read(&mut c, 0, 0, 5).0, Ok(b"after".to_vec()));
    c.disconnect().unwrap();
    t.join().unwrap();

    // A later SET replaces an earlier one: the last selected nothing.
    let (mut s, t) = raw(&srv);
    client::greet(&mut s).unwrap();
    client::send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
    assert_eq!(meta_option(&mut s, OPT_SET_META_CONTEXT, &meta_request(NAME, &["base:allocation"])).unwrap().len(), 1);
    assert_eq!(meta_option(&mut s, OPT_SET_META_CONTEXT, &meta_request(NAME, &[])), Ok(vec![]));
    let info = client::info_or_go(&mut s, OPT_GO, NAME).unwrap();
    let mut c = client_from(s, info);
    assert_eq!(block_status(&mut c, 0, 0, 4096).unwrap_err().0, EINVAL);
    c.disconnect().unwrap();
    t.join().unwrap();
    assert_eq!(srv.export.store.stats().invalid_io, 2);
}

#[test]
fn block_status_reports_holes_zeroes_and_data() {
    const P: u32 = 4096;
    let srv = server();
    let (mut c, t, contexts) = connect_structured(&srv, &["base:allocation"]);
    let id = contexts[0].0;
    // Pages: 0-1 data, 2 written with zeroes, 3 same-filled with a non-zero word, 4-5
    // unwritten, 6-7 data then trimmed, 8-9 data then WRITE_ZEROES, 10 data, the rest unwritten.
    c.write(0, &pattern(1, 2 * P as usize)).unwrap();
    c.write(2 * P as u64, &[0u8; P as usize]).unwrap();
    c.write(3 * P as u64, &[0xa5u8; P as usize]).unwrap();
    c.write(6 * P as u64, &pattern(2, 4 * P as usize)).unwrap();
    c.trim(6 * P as u64, 2 * P).unwrap();
    c.write_zeroes(8 * P as u64, 2 * P, 0).unwrap();
    c.write(10 * P as u64, &pattern(3, P as usize)).unwrap();

    let rest = SIZE as u32 - 11 * P;
    assert_eq!(
        block_status(&mut c, 0, 0, SIZE as u32),
        Ok((id, vec![(2 * P, 0), (P, HOLE_ZERO), (P, 0), (6 * P, HOLE_ZERO), (P, 0), (rest, HOLE_ZERO)])),
        "the whole device: data, zero-filled and unwritten pages, merged"
    );
    // Unaligned: cut at the request's ends, never past them.
    assert_eq!(block_status(&mut c, 0, P as u64 + 7, 3 * P), Ok((id, vec![(P - 7, 0), (P, HOLE_ZERO), (P, 0), (7, HOLE_ZERO)])));
    // REQ_ONE: one descriptor, no longer than the request.
    assert_eq!(block_status(&mut c, CMD_FLAG_REQ_ONE, 4 * P as u64, 2 * P), Ok((id, vec![(2 * P, HOLE_ZERO)])));
    assert_eq!(block_status(&mut c, CMD_FLAG_REQ_ONE, 11 * P as u64, 100), Ok((id, vec![(100, HOLE_ZERO)])));
    assert_eq!(block_status(&mut c, CMD_FLAG_REQ_ONE | CMD_FLAG_FUA, 0, SIZE as u32), Ok((id, vec![(2 * P, 0)])));

    // Errors are error chunks, and the connection goes on.
    let (e, msg) = block_status(&mut c, 0, SIZE - P as u64, 2 * P).unwrap_err();
    assert_eq!(e, EINVAL);
    assert!(msg.contains("past the end"), "{msg}");
    assert_eq!(block_status(&mut c, CMD_FLAG_NO_HOLE, 0, P).unwrap_err().0, EINVAL);
    assert_eq!(block_status(&mut c, 0, 0, 0).unwrap_err().0, EINVAL);

    // A query is no access: nothing was read.
    let st = srv.export.store.stats();
    assert_eq!((st.num_reads, st.failed_reads), (0, 0));
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn a_range_with_more_extents_than_a_reply_holds_is_answered_in_part() {
    // Every other page data: one extent per page, more than MAX_EXTENTS of them.
    let pages = crate::meta::MAX_EXTENTS as u64 + 100;
    let srv = server_with(Config::with_disksize(pages * 4096));
    let (mut c, t, contexts) = connect_structured(&srv, &["base:allocation"]);
    for i in (0..pages).step_by(2) {
        let h = c.send(CMD_WRITE, 0, i * 4096, 4096, &pattern(i, 4096)).unwrap();
        assert!(
            matches!(recv_wire(c.stream()), Wire::Simple { error: 0, handle } if handle == h),
            "a successful WRITE gets a simple reply"
        );
    }
    let (id, d) = block_status(&mut c, 0, 0, (pages * 4096) as u32).unwrap();
    assert_eq!(id, contexts[0].0);
    assert_eq!(d.len(), crate::meta::MAX_EXTENTS, "as many as one reply holds");
    assert!(d.iter().enumerate().all(|(k, &(len, flags))| len == 4096 && flags == if k % 2 == 0 { 0 } else { HOLE_ZERO }));
    // The client asks on from where the reply ended.
    let from = crate::meta::MAX_EXTENTS as u64 * 4096;
    let (_, d) = block_status(&mut c, 0, from, (pages * 4096 - from) as u32).unwrap();
    assert_eq!(d.len(), 100);
    c.disconnect().unwrap();
    t.join().unwrap();
}

#[test]
fn structured_reads_are_one_data_chunk_and_errors_are_error_chunks() {
    let mut cfg = Config::with_disksize(SIZE);
    cfg.mem_limit_bytes = 64 << 10;
    let srv = server_with(cfg);
    let (mut c, t, _) = connect_structured(&srv, &[]);
    let data = pattern(5, 3 * 4096 + 100);
    c.write(4000, &data).unwrap();
    assert_eq!(structured_read(&mut c, 0, 4000, data.len() as u32), (Ok(data.clone()), 1), "one OFFSET_DATA chunk with DONE");
    assert_eq!(structured_read(&mut c, CMD_FLAG_DF, 4000, 10), (Ok(data[..10].to_vec()), 1), "DF: one chunk");
    assert_eq!(structured_read(&mut c, 0, SIZE - 4096, 4096), (Ok(vec![0u8; 4096]), 1), "unwritten data reads as zeroes");

    // Rejected READs: an error chunk with the reason, never a simple reply.
    let (e, msg) = structured_read(&mut c, 0, SIZE - 10, 11).0.unwrap_err();
    assert_eq!(e, EINVAL);
    assert!(msg.contains("past the end"), "{msg}");
    let (e, msg) = structured_read(&mut c, CMD_FLAG_NO_HOLE, 0, 1).0.unwrap_err();
    assert_eq!(e, EINVAL);
    assert!(msg.contains("flags 0x2"), "{msg}");
    // Other commands' errors too: a rejected WRITE (its payload skipped), and a store error
    // (the memory limit) with the store's message.
    c.send(CMD_WRITE, 0, SIZE, 4, b"over").unwrap();
    let Wire::Chunk { kind: REPLY_TYPE_ERROR, flags: REPLY_FLAG_DONE, payload, .. } = recv_wire(c.stream()) else {
        panic!("an error chunk")
    };
    assert_eq!(error_payload(&payload).0, ENOSPC);
    let mut enospc = None;
    for i in 16..200u64 {
        let mut x = i.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        c.send(CMD_WRITE, 0, i * 4096, 4096, &noise).unwrap();
        match recv_wire(c.stream()) {
            Wire::Simple { error: 0, .. } => {}
            Wire::Chunk { kind: REPLY_TYPE_ERROR, flags: REPLY_FLAG_DONE, payload, .. } => {
                enospc = Some(error_payload(&payload));
                break;
            }
            w => panic!("{w:?}"),
        }
    }
    let (e, msg) = enospc.expect("a 64 KiB limit is reached by 736 KiB of noise");
    assert_eq!(e, ENOSPC);
    assert!(!msg.is_empty(), "the store's error is explained");
    // Earlier data is intact, and the connection goes on.
    assert_eq!(structured_read(&mut c, 0, 4000, data.len() as u32).0, Ok(data));
    c.disconnect().unwrap();
    t.join().unwrap();
}

/// Random writes (compressible, zero, same-filled, partial), trims and write-zeroes against a
/// byte array modelling the device; structured READs must match it, and every BLOCK_STATUS
/// must be exact: a descriptor is HOLE|ZERO if and only if every page it touches reads as
/// zeroes in the model (the store drops zero pages and keeps every other one), descriptors
/// are merged, cover the range (less only when REQ_ONE, then one), never more.
#[test]
fn block_status_and_structured_reads_match_a_model_device() {
    const DEV: u64 = 1 << 20;
    const P: u64 = 4096;
    let srv = server_with(Config::with_disksize(DEV));
    let (mut c, t, _) = connect_structured(&srv, &["base:allocation"]);
    let mut model = vec![0u8; DEV as usize];
    let mut x: u64 = 0x0dd_ba11_5eed;
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let zero_page = |m: &[u8], p: u64| m[(p * P) as usize..((p + 1) * P) as usize].iter().all(|&b| b == 0);
    for step in 0..2000u64 {
        let aligned = rnd(2) == 0;
        let len = if aligned { (1 + rnd(6)) * P } else { 1 + rnd(3 * P) };
        let offset = if aligned { rnd(DEV / P) * P } else { rnd(DEV) };
        let len = len.min(DEV - offset);
        let (o, l) = (offset as usize, len as usize);
        match rnd(7) {
            0 | 1 => {
                let data = match rnd(4) {
                    0 => pattern(step, l),
                    1 => vec![0u8; l],
                    2 => vec![1 + (step % 250) as u8; l],
                    _ => (0..l).map(|_| if rnd(8) == 0 { rnd(256) as u8 } else { 0 }).collect(),
                };
                c.write(offset, &data).unwrap();
                model[o..o + l].copy_from_slice(&data);
            }
            2 => {
                c.trim(offset, len as u32).unwrap();
                let (first, end) = (offset.div_ceil(P) * P, (offset + len) / P * P);
                if end > first {
                    model[first as usize..end as usize].fill(0);
                }
            }
            3 => {
                c.write_zeroes(offset, len as u32, 0).unwrap();
                model[o..o + l].fill(0);
            }
            4 => assert!(structured_read(&mut c, 0, offset, len as u32).0.unwrap() == model[o..o + l], "step {step}: READ differs"),
            _ => {
                let req_one = rnd(3) == 0;
                let (_, d) = block_status(&mut c, if req_one { CMD_FLAG_REQ_ONE } else { 0 }, offset, len as u32).unwrap();
                let total: u64 = d.iter().map(|e| e.0 as u64).sum();
                if req_one {
                    assert!(d.len() == 1 && total <= len, "step {step}: REQ_ONE gets one descriptor within the range");
                } else {
                    assert_eq!(total, len, "step {step}: the descriptors cover the range");
                }
                let mut pos = offset;
                for (k, &(dlen, flags)) in d.iter().enumerate() {
                    assert!(dlen > 0);
                    assert!(k == 0 || flags != d[k - 1].1, "step {step}: adjacent descriptors are merged");
                    for p in pos / P..(pos + dlen as u64).div_ceil(P) {
                        let expect = if zero_page(&model, p) { HOLE_ZERO } else { 0 };
                        assert_eq!(flags, expect, "step {step}: descriptor {k} at {pos} length {dlen}, page {p}");
                    }
                    pos += dlen as u64;
                }
            }
        }
    }
    let stats = srv.export.store.stats();
    assert_eq!(stats.failed_reads + stats.failed_writes + stats.invalid_io, 0);
    c.disconnect().unwrap();
    t.join().unwrap();
}
