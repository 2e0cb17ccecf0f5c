//! The handshake: fixed newstyle negotiation and option haggling, up to the transmission phase.
//!
//! Supported options: `EXPORT_NAME`, `ABORT`, `LIST`, `INFO`, `GO`, `STRUCTURED_REPLY`,
//! `LIST_META_CONTEXT` and `SET_META_CONTEXT` (in [`crate::meta`]), and `STARTTLS` (when the
//! server has TLS credentials: [`crate::tls`] says which modes there are). Everything else
//! (extended headers, unknown options) is answered with `NBD_REP_ERR_UNSUP` and a message,
//! and haggling goes on: the client can fall back. What a client negotiates for the
//! transmission phase is returned in [`Negotiated`]; `STARTTLS` resets it (the client
//! negotiates again inside TLS). The connection is closed only where the protocol says so or
//! where going on is impossible: bad magic, unknown client flags, an `EXPORT_NAME` for an
//! export that does not exist (it cannot carry an error), an option too large to skip, or too
//! many options.

use crate::tls::TlsMode;
use crate::wire::*;
use crate::{meta, Export, MAX_PAYLOAD_BYTES, MINIMUM_BLOCK_BYTES, PREFERRED_BLOCK_BYTES, TRANSMISSION_FLAGS};
use std::fmt;
use std::io::{self, Read, Write};

/// Option data up to this size is read and parsed (names are at most 4096 bytes).
const MAX_OPTION_BYTES: u32 = 16 << 10;
/// Option data above [`MAX_OPTION_BYTES`] and up to this size is skipped and refused with
/// `NBD_REP_ERR_TOO_BIG`; above it, the connection is closed (a client sending megabytes of
/// option data is broken or hostile).
const MAX_SKIPPABLE_OPTION_BYTES: u32 = 1 << 20;
/// Options one client may send before it is disconnected (each is answered; this only stops
/// a client that haggles forever).
const MAX_OPTIONS: usize = 128;

/// What a client negotiated in the handshake that changes the transmission phase. A client
/// that negotiates nothing gets simple replies and the commands of [`TRANSMISSION_FLAGS`].
/// (Whatever would reset the handshake's state, such as `NBD_OPT_STARTTLS`, must reset this:
/// the spec says a client renegotiates these after it.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Negotiated {
    /// `NBD_OPT_STRUCTURED_REPLY` was acknowledged: READ replies and every error are
    /// structured ([`crate::reply`]), and READ accepts `NBD_CMD_FLAG_DF`.
    pub structured_replies: bool,
    /// The last `NBD_OPT_SET_META_CONTEXT` selected `base:allocation`: `NBD_CMD_BLOCK_STATUS`
    /// is served.
    pub base_allocation: bool,
}

impl Negotiated {
    /// The transmission flags for this connection: [`TRANSMISSION_FLAGS`], plus `SEND_DF` with
    /// structured replies (which the spec forbids without them).
    pub fn transmission_flags(&self) -> u16 {
        if self.structured_replies {
            TRANSMISSION_FLAGS | FLAG_SEND_DF
        } else {
            TRANSMISSION_FLAGS
        }
    }
}

/// How the handshake ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Go on to the transmission phase, with what was negotiated.
    Transmission(Negotiated),
    /// The client aborted (`NBD_OPT_ABORT`) or closed the connection between options.
    Closed,
    /// The client sent `NBD_OPT_STARTTLS` and got `NBD_REP_ACK`: the caller runs the TLS
    /// handshake on the socket, then [`resume_in_tls`] with this over the TLS session.
    StartTls(Resume),
}

/// Where haggling stands when TLS starts, for [`resume_in_tls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    no_zeroes: bool,
    /// Options received so far (the [`MAX_OPTIONS`] limit counts both sides of STARTTLS).
    options: usize,
}

/// Where TLS stands on this connection: the mode it started in, or active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tls {
    Before(TlsMode),
    Active,
}

/// Why the handshake failed; the connection is closed after it.
#[derive(Debug)]
pub enum HandshakeError {
    /// Reading or writing the socket failed (mostly: the client went away mid-message).
    Io(io::Error),
    /// The client broke the protocol in a way that leaves no way to go on.
    Protocol(String),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                write!(f, "handshake: client closed the connection in the middle of a message")
            }
            HandshakeError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                write!(f, "handshake: the client did not finish the handshake in time")
            }
            HandshakeError::Io(e) => write!(f, "handshake: {e}"),
            HandshakeError::Protocol(m) => write!(f, "handshake: {m}"),
        }
    }
}

impl From<io::Error> for HandshakeError {
    fn from(e: io::Error) -> Self {
        HandshakeError::Io(e)
    }
}

fn protocol<T>(msg: String) -> Result<T, HandshakeError> {
    Err(HandshakeError::Protocol(msg))
}

/// Runs the server side of the handshake on `r` (reads) and `w` (writes), with TLS as `tls`
/// says (the connection's mode: by transport and the server's options).
pub fn negotiate(r: &mut impl Read, w: &mut impl Write, export: &Export, tls: TlsMode) -> Result<Outcome, HandshakeError> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    // A client that connects and leaves without a word is a liveness probe (`compcache serve`
    // checking whether a socket is in use, test harnesses): no error.
    match w.write_all(&hello) {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => return Ok(Outcome::Closed),
        Err(e) => return Err(e.into()),
    }
    let mut flags = [0u8; 4];
    match read_full(r, &mut flags) {
        Ok(0) => return Ok(Outcome::Closed),
        Ok(4) => {}
        Ok(_) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(Outcome::Closed),
        Err(e) => return Err(e.into()),
    }
    let client_flags = u32::from_be_bytes(flags);
    let known = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    if client_flags & !known != 0 {
        return protocol(format!("unknown client flags {client_flags:#x} (known: {known:#x}), which the protocol says to refuse"));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    haggle(r, w, export, Tls::Before(tls), Resume { no_zeroes, options: 0 })
}

/// Goes on haggling inside the TLS session, after [`Outcome::StartTls`].
pub fn resume_in_tls(r: &mut impl Read, w: &mut impl Write, export: &Export, resume: Resume) -> Result<Outcome, HandshakeError> {
    haggle(r, w, export, Tls::Active, resume)
}

/// Option haggling, from option number `resume.options` on.
fn haggle(r: &mut impl Read, w: &mut impl Write, export: &Export, tls: Tls, resume: Resume) -> Result<Outcome, HandshakeError> {
    let no_zeroes = resume.no_zeroes;
    // Negotiated afresh in each phase: what was agreed before STARTTLS is void inside TLS.
    let mut neg = Negotiated::default();
    // FORCEDTLS: before STARTTLS, nothing but STARTTLS and ABORT is served.
    let tls_required = tls == Tls::Before(TlsMode::Required);
    for options in resume.options..MAX_OPTIONS {
        let magic = match read_u64(r) {
            Ok(m) => m,
            // A client may simply go away between options (nbd-client -l, probes).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Outcome::Closed),
            Err(e) => return Err(e.into()),
        };
        if magic != IHAVEOPT {
            return protocol(format!("bad option magic {magic:#018x} (expected IHAVEOPT {IHAVEOPT:#018x})"));
        }
        let opt = read_u32(r)?;
        let len = read_u32(r)?;
        if len > MAX_OPTION_BYTES {
            if len > MAX_SKIPPABLE_OPTION_BYTES {
                return protocol(format!(
                    "option {} ({opt}) with {len} bytes of data, above the {MAX_SKIPPABLE_OPTION_BYTES}-byte limit",
                    option_name(opt)
                ));
            }
            io::copy(&mut r.take(len as u64), &mut io::sink())?;
            let msg = format!("option data of {len} bytes is above the {MAX_OPTION_BYTES}-byte limit");
            let reply = if tls_required { REP_ERR_TLS_REQD } else { REP_ERR_TOO_BIG };
            write_option_reply(w, opt, reply, msg.as_bytes())?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data)?;

        if tls_required && !matches!(opt, OPT_STARTTLS | OPT_ABORT) {
            if opt == OPT_EXPORT_NAME {
                // EXPORT_NAME cannot carry an error: the protocol says to terminate.
                return protocol("EXPORT_NAME before STARTTLS, and this listener requires TLS".into());
            }
            let msg = format!("option {} ({opt}): this server requires TLS: send NBD_OPT_STARTTLS first", option_name(opt));
            write_option_reply(w, opt, REP_ERR_TLS_REQD, msg.as_bytes())?;
            continue;
        }

        match opt {
            OPT_EXPORT_NAME => {
                if !export.matches(&data) {
                    // EXPORT_NAME cannot carry an error: the protocol says to terminate.
                    return protocol(format!(
                        "EXPORT_NAME asks for unknown export {:?} (this server exports {:?})",
                        String::from_utf8_lossy(&data),
                        export.name
                    ));
                }
                let mut b = Vec::with_capacity(10 + 124);
                b.extend_from_slice(&export.store.disksize_bytes().to_be_bytes());
                b.extend_from_slice(&neg.transmission_flags().to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                w.write_all(&b)?;
                return Ok(Outcome::Transmission(neg));
            }
            OPT_STARTTLS => match tls {
                Tls::Before(TlsMode::Off) => {
                    let msg = "TLS is not configured on this server (it needs --tls-certificates)";
                    write_option_reply(w, opt, REP_ERR_POLICY, msg.as_bytes())?;
                }
                Tls::Active => write_option_reply(w, opt, REP_ERR_INVALID, b"TLS is already active")?,
                Tls::Before(_) if !data.is_empty() => write_option_reply(w, opt, REP_ERR_INVALID, b"STARTTLS takes no data")?,
                Tls::Before(_) => {
                    write_option_reply(w, opt, REP_ACK, &[])?;
                    return Ok(Outcome::StartTls(Resume { no_zeroes, options: options + 1 }));
                }
            },
            OPT_ABORT => {
                // The client may already have closed; a failed ACK is no error.
                let _ = write_option_reply(w, opt, REP_ACK, &[]);
                return Ok(Outcome::Closed);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    write_option_reply(w, opt, REP_ERR_INVALID, b"LIST takes no data")?;
                    continue;
                }
                let name = export.name.as_bytes();
                let mut b = Vec::with_capacity(4 + name.len() + export.description.len());
                b.extend_from_slice(&(name.len() as u32).to_be_bytes());
                b.extend_from_slice(name);
                b.extend_from_slice(export.description.as_bytes());
                write_option_reply(w, opt, REP_SERVER, &b)?;
                write_option_reply(w, opt, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => match parse_info_request(&data) {
                Err(msg) => write_option_reply(w, opt, REP_ERR_INVALID, msg.as_bytes())?,
                Ok((name, _)) if !export.matches(name) => {
                    let msg = format!(
                        "unknown export {:?}: this server exports {:?} (or ask for the default export, \"\")",
                        String::from_utf8_lossy(name),
                        export.name
                    );
                    write_option_reply(w, opt, REP_ERR_UNKNOWN, msg.as_bytes())?
                }
                Ok((_, requests)) => {
                    send_info(w, opt, export, neg.transmission_flags(), &requests)?;
                    write_option_reply(w, opt, REP_ACK, &[])?;
                    if opt == OPT_GO {
                        return Ok(Outcome::Transmission(neg));
                    }
                }
            },
            OPT_STRUCTURED_REPLY if !data.is_empty() => write_option_reply(w, opt, REP_ERR_INVALID, b"STRUCTURED_REPLY takes no data")?,
            OPT_STRUCTURED_REPLY => {
                neg.structured_replies = true;
                write_option_reply(w, opt, REP_ACK, &[])?
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => answer_meta(w, opt, &data, export, &mut neg)?,
            _ => {
                let msg = format!("option {} ({opt}) is not supported by compcache", option_name(opt));
                write_option_reply(w, opt, REP_ERR_UNSUP, msg.as_bytes())?;
            }
        }
    }
    protocol(format!("more than {MAX_OPTIONS} options without entering transmission"))
}

/// Parses the data of INFO/GO: name length, name, number of requests, requests.
fn parse_info_request(data: &[u8]) -> Result<(&[u8], Vec<u16>), String> {
    if data.len() < 6 {
        return Err(format!("INFO/GO data of {} bytes is shorter than the minimum of 6", data.len()));
    }
    let name_len = be32(&data[0..4]) as usize;
    if name_len > data.len() - 6 {
        return Err(format!("INFO/GO name length {name_len} overruns the {}-byte option", data.len()));
    }
    let name = &data[4..4 + name_len];
    let rest = &data[4 + name_len..];
    let n = be16(&rest[0..2]) as usize;
    if rest.len() != 2 + 2 * n {
        return Err(format!("INFO/GO announces {n} information requests but carries {} bytes for them", rest.len() - 2));
    }
    let requests = rest[2..].chunks_exact(2).map(be16).collect();
    Ok((name, requests))
}

/// Answers LIST_META_CONTEXT or SET_META_CONTEXT (see meta.rs's module docs); for SET, records the
/// selection in `neg`.
fn answer_meta(w: &mut impl Write, opt: u32, data: &[u8], export: &Export, neg: &mut Negotiated) -> io::Result<()> {
    let set = opt == OPT_SET_META_CONTEXT;
    if set {
        neg.base_allocation = false;
    }
    if !neg.structured_replies {
        let msg = format!("{} needs structured replies: send NBD_OPT_STRUCTURED_REPLY first", option_name(opt));
        return write_option_reply(w, opt, REP_ERR_INVALID, msg.as_bytes());
    }
    let req = match meta::parse_request(data) {
        Ok(req) => req,
        Err(msg) => return write_option_reply(w, opt, REP_ERR_INVALID, msg.as_bytes()),
    };
    if !export.matches(req.export) {
        let msg = format!(
            "unknown export {:?}: this server exports {:?} (or ask for the default export, \"\")",
            String::from_utf8_lossy(req.export),
            export.name
        );
        return write_option_reply(w, opt, REP_ERR_UNKNOWN, msg.as_bytes());
    }
    // LIST without queries lists everything.
    let mut found = !set && req.queries.is_empty();
    for q in &req.queries {
        match meta::selects_base_allocation(q, !set) {
            Ok(hit) => found |= hit,
            Err(msg) => return write_option_reply(w, opt, REP_ERR_INVALID, msg.as_bytes()),
        }
    }
    if found {
        let id = if set { meta::BASE_ALLOCATION_ID } else { 0 };
        let mut b = id.to_be_bytes().to_vec();
        b.extend_from_slice(meta::BASE_ALLOCATION.as_bytes());
        write_option_reply(w, opt, REP_META_CONTEXT, &b)?;
        neg.base_allocation = set;
    }
    write_option_reply(w, opt, REP_ACK, &[])
}

/// Sends the `NBD_REP_INFO` replies: always EXPORT and BLOCK_SIZE (the latter is harmless
/// unrequested: our constraints are the protocol's defaults), NAME and DESCRIPTION on request.
fn send_info(w: &mut impl Write, opt: u32, export: &Export, flags: u16, requests: &[u16]) -> io::Result<()> {
    let mut info = Vec::with_capacity(12);
    info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    info.extend_from_slice(&export.store.disksize_bytes().to_be_bytes());
    info.extend_from_slice(&flags.to_be_bytes());
    write_option_reply(w, opt, REP_INFO, &info)?;

    let mut bs = Vec::with_capacity(14);
    bs.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    bs.extend_from_slice(&MINIMUM_BLOCK_BYTES.to_be_bytes());
    bs.extend_from_slice(&PREFERRED_BLOCK_BYTES.to_be_bytes());
    bs.extend_from_slice(&MAX_PAYLOAD_BYTES.to_be_bytes());
    write_option_reply(w, opt, REP_INFO, &bs)?;

    if requests.contains(&INFO_NAME) {
        let mut b = INFO_NAME.to_be_bytes().to_vec();
        b.extend_from_slice(export.name.as_bytes());
        write_option_reply(w, opt, REP_INFO, &b)?;
    }
    if requests.contains(&INFO_DESCRIPTION) {
        let mut b = INFO_DESCRIPTION.to_be_bytes().to_vec();
        b.extend_from_slice(export.description.as_bytes());
        write_option_reply(w, opt, REP_INFO, &b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_request_parsing() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        let (name, reqs) = parse_info_request(&d).unwrap();
        assert_eq!(name, b"abc");
        assert_eq!(reqs, vec![INFO_NAME, INFO_BLOCK_SIZE]);

        assert!(parse_info_request(&d[..5]).unwrap_err().contains("shorter"));
        let mut bad = d.clone();
        bad[3] = 200;
        assert!(parse_info_request(&bad).unwrap_err().contains("overruns"));
        let mut short = d.clone();
        short.pop();
        assert!(parse_info_request(&short).unwrap_err().contains("information requests"));
    }
}
