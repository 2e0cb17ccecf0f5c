//! The NBD handshake parser: `handshake::negotiate` reading the fuzzer's bytes as what a
//! client sends after connecting (client flags, then options), writing into memory.
//!
//! Checked: no panic; the server always starts with the fixed-newstyle greeting; every
//! option reply it writes is well formed (magic, and a length that matches the data that
//! follows); an outcome of "transmission" comes only after an ACK to GO or the export data of
//! EXPORT_NAME, and one of "start TLS" only after an ACK to STARTTLS. The TLS policy (off, or
//! required: FORCEDTLS) is chosen by the input's length, so both corpora's inputs reach both.

use compcache_nbd::handshake::{negotiate, Outcome};
use compcache_nbd::tls::TlsMode;
use compcache_nbd::wire::*;
use compcache_nbd::Export;
use compcache_store::{Config, Store};
use std::sync::{Arc, OnceLock};

/// The export name the fuzz servers use (the corpora ask for it).
pub const NAME: &str = "compcache";
/// The device size of the fuzz servers: small, so that whole-device reads stay cheap.
pub const SIZE: u64 = 1 << 20;

/// A new export of a fresh `SIZE`-byte store.
pub fn new_export() -> Export {
    let store = Arc::new(Store::new(Config::with_disksize(SIZE)).expect("a 1 MiB store"));
    Export { name: NAME.into(), description: "fuzz device".into(), store }
}

fn export() -> &'static Export {
    static EXPORT: OnceLock<Export> = OnceLock::new();
    EXPORT.get_or_init(new_export)
}

pub fn run(data: &[u8]) {
    let export = export();
    let mut r = data;
    let mut w = Vec::new();
    let tls = if data.len().is_multiple_of(2) { TlsMode::Off } else { TlsMode::Required };
    let outcome = negotiate(&mut r, &mut w, export, tls);

    // The greeting: NBDMAGIC, IHAVEOPT, handshake flags.
    assert!(w.len() >= 18, "no greeting written");
    assert_eq!(be64(&w[0..8]), NBDMAGIC);
    assert_eq!(be64(&w[8..16]), IHAVEOPT);
    let mut rest = &w[18..];

    // Then option replies (magic, option, type, length, data), possibly followed by the
    // export data of EXPORT_NAME (size, flags, and 124 zero bytes unless NO_ZEROES).
    let mut last_reply = None;
    while rest.len() >= 20 && be64(&rest[0..8]) == OPTION_REPLY_MAGIC {
        let (opt, rep, len) = (be32(&rest[8..12]), be32(&rest[12..16]), be32(&rest[16..20]) as usize);
        assert!(rest.len() >= 20 + len, "option reply announces {len} bytes but {} follow", rest.len() - 20);
        if rep == REP_INFO {
            assert!(len >= 2, "INFO reply without an information type");
        }
        last_reply = Some((opt, rep));
        rest = &rest[20 + len..];
    }
    match outcome {
        Ok(Outcome::StartTls(_)) => {
            assert_eq!(last_reply, Some((OPT_STARTTLS, REP_ACK)), "TLS started without an ACK to STARTTLS");
            assert!(rest.is_empty(), "{} bytes after STARTTLS's ACK", rest.len());
        }
        Ok(Outcome::Transmission(_)) => match last_reply {
            Some((OPT_GO, REP_ACK)) if rest.is_empty() => {}
            _ => {
                // EXPORT_NAME: 8 bytes of size and 2 of flags, then 0 or 124 zeroes.
                assert!(rest.len() == 10 || rest.len() == 134, "transmission without GO's ACK or EXPORT_NAME's data");
                assert_eq!(be64(&rest[0..8]), SIZE);
                assert!(rest[10..].iter().all(|&b| b == 0));
            }
        },
        _ => assert!(rest.is_empty(), "{} bytes after the last option reply are not a reply", rest.len()),
    }
}
