//! The handshake: every option, the export name, the client flags, oversized options.

use super::*;

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
