//! Structured replies and block status: negotiation, BLOCK_STATUS, structured READs and errors, a
//! model device.

use super::*;

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
use crate::meta::encode_request as meta_request;

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
        let noise = compcache_store::testing::noise(i.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1, 4096);
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
