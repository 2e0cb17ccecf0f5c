//! TLS for NBD (`NBD_OPT_STARTTLS`): loading x509 credentials, the server-side TLS handshake,
//! and [`TlsStream`], a TLS session over a socket that the transmission phase can split into a
//! receive half and a send half like a plain socket.
//!
//! # Credentials
//! The directory layout nbdkit, qemu and libnbd share ([`load_credentials`]):
//! `server-cert.pem` (the server's certificate, optionally followed by its chain),
//! `server-key.pem` (its private key: PKCS#8, PKCS#1 or SEC1 PEM), and, to verify clients
//! (`verify_peer`), `ca-cert.pem` (the CAs whose signature a client certificate must carry) and
//! optionally `ca-crl.pem` (revoked client certificates). The private key must not be
//! accessible to "other" (mode `o-rwx`): a key anyone can read lets anyone impersonate the
//! server. Group access is allowed (Debian keeps keys `0640 root:ssl-cert`).
//! x509 only: rustls has no TLS-PSK, so nbdkit's and qemu's `tls-creds-psk` are not offered.
//!
//! # Modes ([`TlsMode`], the protocol's names)
//! - `Off` (NOTLS): `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_POLICY`.
//! - `Offered` (SELECTIVETLS with no TLS-only export): the client may upgrade or not.
//! - `Required` (FORCEDTLS): every option before `NBD_OPT_STARTTLS` except `NBD_OPT_ABORT` gets
//!   `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` closes the connection; a client without
//!   credentials never learns the export's size, and never reads or writes a byte of it.
//!
//! # [`TlsStream`]: one session, two halves
//! A TLS session is one state machine (sequence numbers and keys for both directions), but the
//! transmission phase reads requests on one thread while other threads write replies. The
//! session sits behind a mutex that is never held across a blocking socket call:
//! - the receive half reads ciphertext from the socket (blocking, without the session lock)
//!   into its own buffer, then, under the session lock, feeds it to rustls and takes out the
//!   plaintext;
//! - the send half encrypts under the session lock into its own buffer, then writes that
//!   ciphertext to the socket without the session lock. Its own lock keeps the ciphertext of
//!   two writers in the order in which it was encrypted.
//!
//! Locks, in the only order in which they nest: the receive lock or the send lock (never both),
//! then the session lock. The receive half never writes to the socket: records rustls queues
//! while reading (a TLS 1.3 key update, alerts) leave with the next reply.
//!
//! # What TLS allocates
//! The transmission phase allocates nothing per request once warm (its rule 5); rustls's
//! buffered API does: about one allocation per 16 KiB TLS record in each direction (the
//! decrypted plaintext is copied into a fresh buffer, each encrypted record is a fresh buffer)
//! and its record deframer may resize its buffer between records. Our own buffers (the
//! ciphertext in, the ciphertext out) are per connection and reused. rustls's `unbuffered` API
//! would avoid the allocations; a swap server that must not allocate under memory pressure
//! should serve the kernel over the Unix socket or `nbd-attach`, which do not use TLS.

use crate::listener::Stream;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Where a connection stands on TLS before option haggling (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Off,
    Offered,
    Required,
}

/// The server's TLS setup: credentials and policy. Plain TCP needs
/// [`crate::ServerOptions::allow_plain_tcp`]; with `TlsOptions` TCP connections must use TLS.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    pub config: Arc<ServerConfig>,
    /// Require TLS on Unix sockets too (they are owner-only already, so by default TLS is only
    /// offered there: clients choose).
    pub require_on_unix: bool,
}

/// Why credentials could not be loaded. Messages say which file and what to do.
#[derive(Debug)]
pub enum TlsError {
    /// A file could not be read.
    Io { path: PathBuf, source: io::Error },
    /// A file holds no usable PEM object of the expected kind.
    Pem { path: PathBuf, what: String },
    /// The private key can be read by users other than its owner and group.
    KeyPermissions { path: PathBuf, mode: u32 },
    /// rustls refused the credentials (key does not match the certificate, bad CA, ...).
    Rejected { what: String },
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            TlsError::Pem { path, what } => write!(f, "{}: {what}", path.display()),
            TlsError::KeyPermissions { path, mode } => write!(
                f,
                "the TLS private key {} has mode {mode:04o}: other users can access it (anyone who reads it can impersonate the server); run `chmod o-rwx {}`",
                path.display(),
                path.display()
            ),
            TlsError::Rejected { what } => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for TlsError {}

fn read_file(path: &Path) -> Result<(Vec<u8>, std::fs::Metadata), TlsError> {
    let io = |source| TlsError::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    // The metadata of the file actually read (not of a path that may change meanwhile).
    let meta = f.metadata().map_err(io)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(io)?;
    Ok((bytes, meta))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let (pem, _) = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { path: path.to_path_buf(), what: format!("not a PEM certificate file: {e}") })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { path: path.to_path_buf(), what: "holds no \"BEGIN CERTIFICATE\" block".into() });
    }
    Ok(certs)
}

/// Loads x509 credentials from `dir` (the layout of the module docs) into a server config.
/// With `verify_peer`, clients must present a certificate signed by `ca-cert.pem` (qemu's
/// `verify-peer=on`, nbdkit's `--tls-verify-peer`).
pub fn load_credentials(dir: &Path, verify_peer: bool) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_path = dir.join("server-cert.pem");
    let key_path = dir.join("server-key.pem");
    let certs = read_certs(&cert_path)?;
    let (key_pem, key_meta) = read_file(&key_path)?;
    if key_meta.mode() & 0o007 != 0 {
        return Err(TlsError::KeyPermissions { path: key_path, mode: key_meta.mode() & 0o7777 });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| TlsError::Pem { path: key_path.clone(), what: format!("no private key (PKCS#8, PKCS#1 or SEC1 PEM) in it: {e}") })?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let rejected = |what: String| TlsError::Rejected { what };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| rejected(format!("TLS setup: {e}")))?;
    let builder = if verify_peer {
        let ca_path = dir.join("ca-cert.pem");
        let mut roots = RootCertStore::empty();
        for ca in read_certs(&ca_path)? {
            roots.add(ca).map_err(|e| rejected(format!("{}: not a usable CA certificate: {e}", ca_path.display())))?;
        }
        let crl_path = dir.join("ca-crl.pem");
        let crls = if crl_path.exists() {
            let (pem, _) = read_file(&crl_path)?;
            CertificateRevocationListDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::Pem { path: crl_path.clone(), what: format!("not a PEM CRL file: {e}") })?
        } else {
            Vec::new()
        };
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .with_crls(crls)
            .build()
            .map_err(|e| rejected(format!("client verification with {}: {e}", ca_path.display())))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| rejected(format!("{} and {} do not make a usable credential: {e}", cert_path.display(), key_path.display())))?;
    Ok(Arc::new(config))
}

/// Runs the server side of the TLS handshake on the socket under `plain` (the handshake's
/// buffered reader, right after `NBD_REP_ACK` to `NBD_OPT_STARTTLS` was sent). The socket's
/// receive timeout (the handshake's) applies. Returns the session as a [`TlsStream`].
/// The TLS handshake must be done by `deadline` (the connection's handshake deadline): each
/// round of it may wait only for the time left.
pub fn accept<S: Stream + AsFd>(plain: BufReader<S>, config: Arc<ServerConfig>, deadline: Instant) -> io::Result<TlsStream<S>> {
    // Bytes the client sent before it could have seen our ACK are plaintext that an attacker
    // may have injected; they must never be taken as part of the TLS session.
    if !plain.buffer().is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the client sent {} bytes after NBD_OPT_STARTTLS before our reply; refusing them", plain.buffer().len()),
        ));
    }
    let mut socket = plain.into_inner();
    let mut session = ServerConnection::new(config).map_err(io::Error::other)?;
    while session.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake did not finish within the handshake deadline"));
        }
        socket.set_receive_timeout(Some(left))?;
        // Blocking reads and writes on this thread only: nothing else uses the socket yet.
        session.complete_io(&mut socket)?;
    }
    // Whatever the handshake left queued (TLS 1.3 session tickets) leaves now.
    while session.wants_write() {
        session.write_tls(&mut socket)?;
    }
    TlsStream::new(socket, session)
}

/// Describes an established session for the log: version, cipher suite, client certificate.
pub fn describe<S: Stream + AsFd>(stream: &TlsStream<S>) -> String {
    let s = stream.shared.session.lock();
    let version = s.protocol_version().map(|v| format!("{v:?}")).unwrap_or_else(|| "?".into());
    let suite = s.negotiated_cipher_suite().map(|c| format!("{:?}", c.suite())).unwrap_or_else(|| "?".into());
    let client = if s.peer_certificates().is_some_and(|c| !c.is_empty()) { ", client certificate verified" } else { "" };
    format!("TLS established ({version}, {suite}{client})")
}

/// Ciphertext read from the socket per call.
const CIPHERTEXT_IN_BYTES: usize = 64 << 10;

/// The receive half: the socket handle it reads from and the ciphertext read but not yet
/// given to rustls (`buf[start..end]`).
struct RecvHalf<S> {
    socket: S,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The socket reached end of file.
    eof: bool,
    /// rustls was told about the end of file.
    eof_fed: bool,
}

/// The send half: the socket handle it writes to and the ciphertext of the current write.
struct SendHalf<S> {
    socket: S,
    buf: Vec<u8>,
}

struct Shared<S> {
    /// The session (innermost lock; never held across a socket call).
    session: Mutex<ServerConnection>,
    recv: Mutex<RecvHalf<S>>,
    send: Mutex<SendHalf<S>>,
    /// A handle for `&self` calls: timeouts, `FIONREAD`, shutdown.
    control: S,
    /// Bytes received but not yet returned by `read`: plaintext in the session plus ciphertext
    /// in the receive half. Written under the receive lock; read by [`Stream::queued_bytes`]
    /// (a hint, so Relaxed).
    buffered_bytes: AtomicUsize,
}

/// A TLS session over a socket; every handle ([`Stream::try_clone_stream`]) is the same
/// session. Reads and writes may run on different threads at once (see the module docs).
pub struct TlsStream<S: Stream + AsFd> {
    shared: Arc<Shared<S>>,
}

impl<S: Stream + AsFd> TlsStream<S> {
    fn new(socket: S, session: ServerConnection) -> io::Result<TlsStream<S>> {
        let recv = RecvHalf {
            socket: socket.try_clone_stream()?,
            buf: vec![0u8; CIPHERTEXT_IN_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            eof_fed: false,
        };
        let send = SendHalf { socket: socket.try_clone_stream()?, buf: Vec::new() };
        Ok(TlsStream {
            shared: Arc::new(Shared {
                session: Mutex::new(session),
                recv: Mutex::new(recv),
                send: Mutex::new(send),
                control: socket,
                buffered_bytes: AtomicUsize::new(0),
            }),
        })
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl<S: Stream> RecvHalf<S> {
    /// Under the session lock: gives rustls the ciphertext we hold and copies out the plaintext,
    /// into `out` as far as it goes. `Ok(None)`: nothing decrypted yet, more ciphertext needed.
    /// `Ok(Some(0))`: the client ended the session (close_notify).
    fn decrypt(&mut self, session: &mut ServerConnection, out: &mut [u8]) -> io::Result<Option<usize>> {
        let mut filled = 0;
        loop {
            match session.reader().read(&mut out[filled..]) {
                Ok(n) => {
                    filled += n;
                    // n == 0: close_notify was received, nothing more will come.
                    if n == 0 || filled == out.len() {
                        return Ok(Some(filled));
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // UnexpectedEof (the socket closed without close_notify) and TLS errors come
                // after the plaintext that preceded them.
                Err(e) => return if filled > 0 { Ok(Some(filled)) } else { Err(e) },
            }
            // The session's plaintext is drained: feed it more ciphertext.
            if self.start == self.end {
                if self.eof && !self.eof_fed {
                    // Tell rustls the stream ended: its reader then returns 0 (after
                    // close_notify) or UnexpectedEof.
                    session.read_tls(&mut io::empty())?;
                    session.process_new_packets().map_err(tls_error)?;
                    self.eof_fed = true;
                    continue;
                }
                if self.eof && filled == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                return Ok(if filled > 0 { Some(filled) } else { None });
            }
            let n = session.read_tls(&mut &self.buf[self.start..self.end])?;
            if n == 0 {
                // rustls takes nothing after close_notify: what is left is ignored, and its
                // reader now returns 0.
                self.start = self.end;
                continue;
            }
            self.start += n;
            session.process_new_packets().map_err(tls_error)?;
        }
    }
}

impl<S: Stream + AsFd> Read for TlsStream<S> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let shared = &*self.shared;
        let mut recv = shared.recv.lock();
        loop {
            let got = {
                let mut session = shared.session.lock();
                let got = recv.decrypt(&mut session, out);
                let plaintext = session.process_new_packets().map(|s| s.plaintext_bytes_to_read()).unwrap_or(0);
                shared.buffered_bytes.store(plaintext + (recv.end - recv.start), Ordering::Relaxed);
                got?
            };
            if let Some(n) = got {
                return Ok(n);
            }
            // Wait for more ciphertext, without the session lock: writers go on meanwhile.
            let RecvHalf { socket, buf, start, end, eof, .. } = &mut *recv;
            match socket.read(buf) {
                Ok(0) => *eof = true,
                Ok(n) => (*start, *end) = (0, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl<S: Stream + AsFd> Write for TlsStream<S> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_all(data)?;
        Ok(data.len())
    }

    /// Encrypts and sends all of `data`, in rounds of at most rustls's buffer limit (64 KiB),
    /// so that a 32 MiB READ reply is never held encrypted in memory whole.
    fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        let shared = &*self.shared;
        let mut send = shared.send.lock();
        let SendHalf { socket, buf } = &mut *send;
        loop {
            buf.clear();
            {
                let mut session = shared.session.lock();
                let n = session.writer().write(data)?;
                data = &data[n..];
                while session.wants_write() {
                    session.write_tls(buf)?;
                }
            }
            if buf.is_empty() {
                if data.is_empty() {
                    return Ok(());
                }
                // The session takes no more (it is closing): do not spin.
                return Err(io::Error::new(io::ErrorKind::WriteZero, "the TLS session accepts no more data"));
            }
            socket.write_all(buf)?;
            if data.is_empty() {
                return Ok(());
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<S: Stream + AsFd> Stream for TlsStream<S> {
    fn try_clone_stream(&self) -> io::Result<Self> {
        Ok(TlsStream { shared: self.shared.clone() })
    }

    /// Sends close_notify if no writer is busy (without blocking: a client that does not read
    /// must not hang the shutdown), then shuts the socket down.
    fn shutdown_both(&self) {
        if let Some(mut send) = self.shared.send.try_lock() {
            let SendHalf { socket, buf } = &mut *send;
            buf.clear();
            {
                let mut session = self.shared.session.lock();
                session.send_close_notify();
                while session.wants_write() {
                    if session.write_tls(buf).is_err() {
                        break;
                    }
                }
            }
            let fd = socket.as_fd().as_raw_fd();
            // SAFETY: `fd` is the open socket owned by `socket`, borrowed for this call;
            // `buf` is valid for reads of `buf.len()` bytes. MSG_DONTWAIT: never block;
            // MSG_NOSIGNAL: a closed peer gives EPIPE, not SIGPIPE. The result is ignored:
            // close_notify is a courtesy, and the socket is shut down next anyway.
            let _ = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        }
        self.shared.control.shutdown_both();
    }

    fn set_receive_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        self.shared.control.set_receive_timeout(timeout)
    }

    fn set_send_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        self.shared.control.set_send_timeout(timeout)
    }

    /// Decrypted and undecrypted bytes held here, plus what waits in the socket.
    fn queued_bytes(&self) -> io::Result<usize> {
        Ok(self.shared.buffered_bytes.load(Ordering::Relaxed) + self.shared.control.queued_bytes()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{self, Client, ClientError};
    use crate::listener::{serve_tcp, Stream};
    use crate::wire::*;
    use crate::{Export, Server, ServerOptions, Transport};
    use compcache_store::{Config, Store};
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType};
    use rustls::pki_types::ServerName;
    use rustls::{ClientConfig, ClientConnection, StreamOwned};
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::os::unix::net::UnixStream;
    use std::thread::JoinHandle;

    const NAME: &str = "compcache";
    const SIZE: u64 = 16 << 20;

    /// A CA, a server certificate for localhost/127.0.0.1 and a client certificate, written in
    /// the credentials layout to a fresh directory (removed on drop).
    struct Creds {
        dir: PathBuf,
        ca: CertificateDer<'static>,
        client_cert: CertificateDer<'static>,
        client_key: Vec<u8>,
    }

    impl Drop for Creds {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn write_file(path: &Path, text: &str, mode: u32) {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn creds(name: &str) -> Creds {
        let dir = std::env::temp_dir().join(format!("compcache-nbd-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        ca_params.distinguished_name.push(DnType::CommonName, "compcache test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();

        let server_key = KeyPair::generate().unwrap();
        let mut sp = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        sp.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = sp.signed_by(&server_key, &ca, &ca_key).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
        cp.distinguished_name.push(DnType::CommonName, "compcache test client");
        cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = cp.signed_by(&client_key, &ca, &ca_key).unwrap();

        write_file(&dir.join("ca-cert.pem"), &ca.pem(), 0o644);
        write_file(&dir.join("server-cert.pem"), &server.pem(), 0o644);
        write_file(&dir.join("server-key.pem"), &server_key.serialize_pem(), 0o600);
        Creds { dir, ca: ca.der().clone(), client_cert: client.der().clone(), client_key: client_key.serialize_der() }
    }

    fn server(tls: Option<TlsOptions>) -> Arc<Server> {
        let store = Arc::new(Store::new(Config::with_disksize(SIZE)).unwrap());
        let options = ServerOptions { tls, ..ServerOptions::default() };
        Arc::new(Server::new(Export { name: NAME.into(), description: "test device".into(), store }, options))
    }

    fn tls_server(c: &Creds, verify_peer: bool) -> Arc<Server> {
        server(Some(TlsOptions { config: load_credentials(&c.dir, verify_peer).unwrap(), require_on_unix: false }))
    }

    /// A raw client on a socketpair, served as if it came in over `transport`.
    fn raw(server: &Arc<Server>, transport: Transport) -> (UnixStream, JoinHandle<()>) {
        let (a, b) = UnixStream::pair().unwrap();
        let s = server.clone();
        (a, std::thread::spawn(move || s.serve_connection_over(b, "test", transport)))
    }

    fn client_config(c: &Creds, with_certificate: bool) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(c.ca.clone()).unwrap();
        let b = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(if with_certificate {
            let key = PrivateKeyDer::try_from(c.client_key.clone()).unwrap();
            b.with_client_auth_cert(vec![c.client_cert.clone()], key).unwrap()
        } else {
            b.with_no_client_auth()
        })
    }

    type TlsClient = StreamOwned<ClientConnection, UnixStream>;

    /// Greets, sends STARTTLS and runs the client side of the TLS handshake.
    fn starttls(mut s: UnixStream, config: Arc<ClientConfig>) -> Result<TlsClient, ClientError> {
        client::greet(&mut s)?;
        client::send_option(&mut s, OPT_STARTTLS, &[])?;
        let (opt, rep, _) = client::recv_option_reply(&mut s)?;
        assert_eq!((opt, rep), (OPT_STARTTLS, REP_ACK));
        let conn = ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
        let mut tls = StreamOwned::new(conn, s);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok(tls)
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(seed as u32) as u8 ^ seed).collect()
    }

    #[test]
    fn starttls_then_go_then_reads_and_writes_inside_tls() {
        let c = creds("go");
        let srv = tls_server(&c, true);
        let (s, t) = raw(&srv, Transport::Tcp);
        let mut tls = starttls(s, client_config(&c, true)).unwrap();
        // Haggling goes on inside TLS; STARTTLS again is invalid there.
        client::send_option(&mut tls, OPT_STARTTLS, &[]).unwrap();
        assert_eq!(client::recv_option_reply(&mut tls).unwrap().1, REP_ERR_INVALID);
        let info = client::info_or_go(&mut tls, OPT_GO, NAME).unwrap();
        assert_eq!(info.size, SIZE);
        let mut cl = Client::in_transmission(tls, info);
        // Small, page-sized and multi-record (4 MiB: many 16 KiB TLS records each way).
        for (i, (offset, len)) in [(3u64, 5usize), (4096, 4096), (1 << 20, 4 << 20)].into_iter().enumerate() {
            let data = pattern(i as u8 + 1, len);
            cl.write(offset, &data).unwrap();
            assert_eq!(cl.read(offset, len as u32).unwrap(), data);
        }
        // Pipelined: several requests in flight on the worker threads, replies interleaved.
        let handles: Vec<u64> = (0..16u64).map(|i| cl.send(CMD_WRITE, 0, i * 65536, 65536, &pattern(i as u8, 65536)).unwrap()).collect();
        for _ in &handles {
            assert_eq!(cl.recv().unwrap().error, 0);
        }
        let handles: Vec<u64> = (0..16u64).map(|i| cl.send(CMD_READ, 0, i * 65536, 65536, &[]).unwrap()).collect();
        for _ in &handles {
            let r = cl.recv().unwrap();
            let i = handles.iter().position(|&h| h == r.handle).unwrap() as u64;
            assert_eq!(r.data, pattern(i as u8, 65536));
        }
        // A clean end: the server closes the TLS session (close_notify) after NBD_CMD_DISC.
        cl.disconnect().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn before_starttls_every_option_gets_tls_reqd_and_nothing_leaks() {
        let c = creds("reqd");
        let srv = tls_server(&c, true);
        let (mut s, t) = raw(&srv, Transport::Tcp);
        client::greet(&mut s).unwrap();
        for (opt, data) in [
            (OPT_LIST, vec![]),
            (OPT_INFO, client::info_request(NAME, &[INFO_NAME])),
            (OPT_GO, client::info_request(NAME, &[])),
            (OPT_STRUCTURED_REPLY, vec![]),
            (4242, vec![1, 2, 3]),
        ] {
            client::send_option(&mut s, opt, &data).unwrap();
            let (o, rep, msg) = client::recv_option_reply(&mut s).unwrap();
            assert_eq!((o, rep), (opt, REP_ERR_TLS_REQD), "option {opt}");
            assert!(String::from_utf8_lossy(&msg).contains("STARTTLS"));
        }
        // EXPORT_NAME cannot be refused: the connection is closed, with no export data sent.
        client::send_option(&mut s, OPT_EXPORT_NAME, NAME.as_bytes()).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{} bytes after EXPORT_NAME without TLS", rest.len());
        t.join().unwrap();
        assert_eq!(srv.export.store.stats().num_reads, 0);

        // ABORT is still served.
        let (mut s, t) = raw(&srv, Transport::Tcp);
        client::greet(&mut s).unwrap();
        client::send_option(&mut s, OPT_ABORT, &[]).unwrap();
        assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
        t.join().unwrap();
    }

    #[test]
    fn a_plain_client_gets_no_export_and_no_data() {
        let c = creds("plain");
        let srv = tls_server(&c, true);
        let (s, t) = raw(&srv, Transport::Tcp);
        match Client::handshake(s, NAME) {
            Err(ClientError::OptionRefused { reply, .. }) => assert_eq!(reply, REP_ERR_TLS_REQD),
            Err(e) => panic!("expected TLS_REQD, got {e}"),
            Ok(_) => panic!("a client without TLS entered transmission"),
        }
        t.join().unwrap();
    }

    #[test]
    fn a_client_without_a_certificate_is_refused_when_peers_are_verified() {
        let c = creds("nocert");
        let srv = tls_server(&c, true);
        let (s, t) = raw(&srv, Transport::Tcp);
        // TLS 1.3: the client finishes its side before the server checks its certificate,
        // so the refusal shows on the first read.
        let result = starttls(s, client_config(&c, false)).and_then(|mut tls| {
            client::info_or_go(&mut tls, OPT_GO, NAME)?;
            Ok(())
        });
        assert!(result.is_err(), "a client without a certificate got the export");
        t.join().unwrap();

        // Without verify-peer, the same client gets in.
        let srv = tls_server(&c, false);
        let (s, t) = raw(&srv, Transport::Tcp);
        let mut tls = starttls(s, client_config(&c, false)).unwrap();
        assert_eq!(client::info_or_go(&mut tls, OPT_GO, NAME).unwrap().size, SIZE);
        Client::in_transmission(tls, Default::default()).disconnect().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn starttls_on_the_unix_socket_is_offered_not_required() {
        let c = creds("unix");
        let srv = tls_server(&c, true);
        // A plain client gets in over the Unix socket...
        let (s, t) = raw(&srv, Transport::Unix);
        Client::handshake(s, NAME).unwrap().disconnect().unwrap();
        t.join().unwrap();
        // ...and a TLS client too; STARTTLS with data is invalid and haggling goes on.
        let (mut s, t) = raw(&srv, Transport::Unix);
        client::greet(&mut s).unwrap();
        client::send_option(&mut s, OPT_STARTTLS, b"x").unwrap();
        assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ERR_INVALID);
        client::send_option(&mut s, OPT_STARTTLS, &[]).unwrap();
        assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
        let conn = ClientConnection::new(client_config(&c, true), ServerName::try_from("localhost").unwrap()).unwrap();
        let mut tls = StreamOwned::new(conn, s);
        let info = client::info_or_go(&mut tls, OPT_GO, NAME).unwrap();
        let mut cl = Client::in_transmission(tls, info);
        cl.write(0, b"hello").unwrap();
        assert_eq!(cl.read(0, 5).unwrap(), b"hello");
        cl.disconnect().unwrap();
        t.join().unwrap();
        // With require_on_unix, the Unix socket requires it as TCP does.
        let srv = server(Some(TlsOptions { config: load_credentials(&c.dir, true).unwrap(), require_on_unix: true }));
        let (s, t) = raw(&srv, Transport::Unix);
        assert!(matches!(Client::handshake(s, NAME), Err(ClientError::OptionRefused { reply: REP_ERR_TLS_REQD, .. })));
        t.join().unwrap();
    }

    #[test]
    fn what_was_negotiated_before_starttls_is_void_inside_tls() {
        let c = creds("reset");
        let srv = tls_server(&c, true);
        let (mut s, t) = raw(&srv, Transport::Unix);
        client::greet(&mut s).unwrap();
        client::send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).unwrap();
        assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
        client::send_option(&mut s, OPT_STARTTLS, &[]).unwrap();
        assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
        let conn = ClientConnection::new(client_config(&c, true), ServerName::try_from("localhost").unwrap()).unwrap();
        let mut tls = StreamOwned::new(conn, s);
        let info = client::info_or_go(&mut tls, OPT_GO, NAME).unwrap();
        assert_eq!(info.flags & FLAG_SEND_DF, 0, "structured replies agreed in plaintext carried over into TLS");
        let mut cl = Client::in_transmission(tls, info);
        cl.write(0, b"x").unwrap();
        assert_eq!(cl.read(0, 1).unwrap(), b"x", "simple replies");
        cl.disconnect().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn plaintext_sent_after_starttls_before_the_ack_is_never_used() {
        let c = creds("inject");
        let srv = tls_server(&c, true);
        let (mut s, t) = raw(&srv, Transport::Tcp);
        client::greet(&mut s).unwrap();
        // STARTTLS and a GO in one write: the GO would be plaintext a man in the middle added.
        let mut b = Vec::new();
        client::send_option(&mut b, OPT_STARTTLS, &[]).unwrap();
        client::send_option(&mut b, OPT_GO, &client::info_request(NAME, &[])).unwrap();
        s.write_all(&b).unwrap();
        assert_eq!(client::recv_option_reply(&mut s).unwrap().1, REP_ACK);
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "the server answered injected plaintext: {rest:?}");
        t.join().unwrap();
    }

    #[test]
    fn without_tls_starttls_is_refused_by_policy_and_tcp_is_not_served() {
        let srv = server(None);
        let (mut s, t) = raw(&srv, Transport::Unix);
        client::greet(&mut s).unwrap();
        client::send_option(&mut s, OPT_STARTTLS, &[]).unwrap();
        let (_, rep, msg) = client::recv_option_reply(&mut s).unwrap();
        assert_eq!(rep, REP_ERR_POLICY);
        assert!(String::from_utf8_lossy(&msg).contains("--tls-certificates"));
        let info = client::info_or_go(&mut s, OPT_GO, NAME).unwrap();
        Client::in_transmission(s, info).disconnect().unwrap();
        t.join().unwrap();

        // TCP without TLS: a client of the listener gets nothing (its accept loop runs on a
        // thread of its own, which ends with the test binary), nor does a connection handed over.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let listening = srv.clone();
        std::thread::spawn(move || serve_tcp(listening, l));
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        let mut got = Vec::new();
        let _ = tcp.read_to_end(&mut got);
        assert!(got.is_empty(), "a TCP client of the listener without TLS got {} bytes", got.len());
        let (mut s, t) = raw(&srv, Transport::Tcp);
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(got.is_empty(), "a TCP client without TLS got {} bytes", got.len());
        t.join().unwrap();

        // allow_plain_tcp: served, TLS not offered.
        let mut opts = ServerOptions { allow_plain_tcp: true, ..ServerOptions::default() };
        opts.workers_per_connection = 1;
        let srv = Arc::new(Server::new(Export { name: NAME.into(), description: String::new(), store: srv.export.store.clone() }, opts));
        assert_eq!(srv.tls_mode(Transport::Tcp), Some(TlsMode::Off));
        let (s, t) = raw(&srv, Transport::Tcp);
        Client::handshake(s, NAME).unwrap().disconnect().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn credentials_are_checked_with_messages_that_say_what_to_do() {
        let c = creds("files");
        assert!(load_credentials(&c.dir, true).is_ok());
        let key = c.dir.join("server-key.pem");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load_credentials(&c.dir, true).unwrap_err().to_string();
        assert!(e.contains("chmod o-rwx") && e.contains("0644"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(load_credentials(&c.dir, true).is_ok(), "group-readable keys (ssl-cert) are accepted");
        std::fs::remove_file(c.dir.join("ca-cert.pem")).unwrap();
        assert!(load_credentials(&c.dir, false).is_ok(), "ca-cert.pem is needed only to verify clients");
        let e = load_credentials(&c.dir, true).unwrap_err().to_string();
        assert!(e.contains("ca-cert.pem"), "{e}");
        std::fs::write(c.dir.join("server-cert.pem"), "not a certificate").unwrap();
        let e = load_credentials(&c.dir, false).unwrap_err().to_string();
        assert!(e.contains("server-cert.pem") && e.contains("CERTIFICATE"), "{e}");
    }

    #[test]
    fn queued_bytes_counts_decrypted_data_not_yet_read() {
        let c = creds("queued");
        let config = load_credentials(&c.dir, false).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let client_cfg = client_config(&c, false);
        let t = std::thread::spawn(move || {
            let conn = ClientConnection::new(client_cfg, ServerName::try_from("localhost").unwrap()).unwrap();
            let mut tls = StreamOwned::new(conn, a);
            tls.write_all(&[7u8; 100]).unwrap();
            tls.flush().unwrap();
            let mut one = [0u8; 1];
            let _ = tls.read(&mut one); // until the server closes
        });
        let mut s = accept(BufReader::new(b), config, Instant::now() + std::time::Duration::from_secs(60)).unwrap();
        let mut first = [0u8; 10];
        s.read_exact(&mut first).unwrap();
        assert!(s.queued_bytes().unwrap() >= 90, "90 decrypted bytes wait: {}", s.queued_bytes().unwrap());
        let mut rest = [0u8; 90];
        s.read_exact(&mut rest).unwrap();
        assert_eq!(s.queued_bytes().unwrap(), 0);
        s.shutdown_both();
        t.join().unwrap();
    }
}
