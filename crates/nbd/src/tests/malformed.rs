//! Malformed and hostile clients: after broken handshakes, garbage, truncated requests and random
//! bytes a good client finds its data intact; concurrent clients, a client that stops reading, a
//! model device, the seed corpus.

use super::*;

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
