//! A connection's setup, from the accepted socket to transmission: its label, the connection
//! cap (with room kept for local clients), the TLS mode of its transport, the three handles on
//! its socket, and the handshake under its absolute deadline (STARTTLS and the haggling inside
//! TLS included). Only a connection whose handshake ended in transmission reaches
//! [`transmission::run`], with the handshake's receive timeout cleared: transmission has no
//! timeout (the kernel's client may rightly stay idle for days).

use crate::handshake::{self, HandshakeError, Outcome, Resume};
use crate::listener::{Deadline, Stream};
use crate::transmission::{self, READ_BUFFER_BYTES};
use crate::{log, warn, Server, Transport};
use std::io::BufReader;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Serves one client that came in over `transport` until it disconnects; blocks. Errors are
/// logged (one line) and end only this connection.
pub(crate) fn serve<S: Stream + AsFd>(server: &Server, stream: S, peer: &str, transport: Transport) {
    let id = server.next_client_id.fetch_add(1, Ordering::Relaxed);
    let label = format!("client {id} ({peer})");
    let open = server.connections.fetch_add(1, Ordering::AcqRel) + 1;
    let _count = ConnectionCount(&server.connections);
    let limit = match transport {
        Transport::Unix => server.options.max_connections,
        Transport::Tcp => server.options.max_connections.saturating_sub(server.options.reserved_local_connections),
    };
    if open as usize > limit {
        let kind = if transport == Transport::Tcp { " for TCP clients (the rest are kept for local ones)" } else { "" };
        warn(&label, &format!("refused: {} connections already open (the limit{kind})", open - 1));
        stream.shutdown_both();
        return;
    }
    let Some(tls) = server.tls_mode(transport) else {
        warn(&label, "refused: TCP without TLS is not allowed (no TLS credentials, no allow_plain_tcp)");
        stream.shutdown_both();
        return;
    };
    if server.options.verbose {
        log(&label, "connected");
    }
    let Some(mut h) = Handles::split(stream, &label) else {
        return;
    };
    // An absolute deadline, not an idle timer: a client that trickles a byte now and then
    // must still finish within it, the TLS handshake and the haggling inside TLS included.
    let deadline = Instant::now() + server.options.handshake_deadline;
    let outcome = handshake::negotiate(&mut Deadline::new(&mut h.reader, &h.shutdown, deadline), &mut h.writer, &server.export, tls);
    match outcome {
        Ok(Outcome::StartTls(resume)) => start_tls(server, h, resume, deadline, &label),
        outcome => transmit(server, outcome, h, &label),
    }
}

/// Counts a connection as open for as long as it lives.
struct ConnectionCount<'a>(&'a AtomicU64);

impl Drop for ConnectionCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The three handles of a connection: the buffered receive half, the send half, and one to
/// shut it down with (a worker may be blocked in `read` or `write` on the other two).
struct Handles<S: Stream> {
    reader: BufReader<S>,
    writer: S,
    shutdown: S,
}

impl<S: Stream> Handles<S> {
    fn split(stream: S, label: &str) -> Option<Handles<S>> {
        match (stream.try_clone_stream(), stream.try_clone_stream()) {
            (Ok(writer), Ok(shutdown)) => Some(Handles { reader: BufReader::with_capacity(READ_BUFFER_BYTES, stream), writer, shutdown }),
            (Err(e), _) | (_, Err(e)) => {
                warn(label, &format!("cannot set up the connection ({e}); closing it"));
                None
            }
        }
    }
}

/// The TLS handshake and the rest of haggling, inside TLS, under the same deadline.
fn start_tls<S: Stream + AsFd>(server: &Server, h: Handles<S>, resume: Resume, deadline: Instant, label: &str) {
    let Some(config) = server.options.tls.as_ref().map(|t| t.config.clone()) else {
        // Unreachable: STARTTLS is accepted only in the modes that need TLS options.
        warn(label, "STARTTLS accepted without TLS credentials; closing the connection");
        h.shutdown.shutdown_both();
        return;
    };
    let stream = match crate::tls::accept(h.reader, config, deadline) {
        Ok(stream) => stream,
        Err(e) => {
            warn(label, &format!("TLS handshake failed: {e}; closing the connection"));
            h.shutdown.shutdown_both();
            return;
        }
    };
    if server.options.verbose {
        log(label, &crate::tls::describe(&stream));
    }
    let Some(mut h) = Handles::split(stream, label) else {
        return;
    };
    let outcome = handshake::resume_in_tls(&mut Deadline::new(&mut h.reader, &h.shutdown, deadline), &mut h.writer, &server.export, resume);
    transmit(server, outcome, h, label)
}

/// Transmission, if the handshake ended in it; else the connection is closed (with a line
/// saying why, unless the client just left).
fn transmit<S: Stream>(server: &Server, outcome: Result<Outcome, HandshakeError>, h: Handles<S>, label: &str) {
    let _ = h.shutdown.set_receive_timeout(None);
    let negotiated = match outcome {
        Ok(Outcome::Transmission(negotiated)) => negotiated,
        Ok(Outcome::StartTls(_)) => {
            // Only a plain connection starts TLS (see `serve`).
            warn(label, "STARTTLS inside TLS; closing the connection");
            h.shutdown.shutdown_both();
            return;
        }
        Ok(Outcome::Closed) => {
            if server.options.verbose {
                log(label, "closed during the handshake");
            }
            h.shutdown.shutdown_both();
            return;
        }
        Err(e) => {
            warn(label, &format!("{e}; closing the connection"));
            h.shutdown.shutdown_both();
            return;
        }
    };
    transmission::run(server, negotiated, h.reader, h.writer, h.shutdown, label)
}
