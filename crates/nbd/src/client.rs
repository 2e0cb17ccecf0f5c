//! A minimal blocking NBD client: fixed newstyle handshake with `NBD_OPT_GO`, simple replies.
//! Used in production by `compcache-kernel-nbd`, which negotiates each connection with
//! [`greet`] and [`info_or_go`] before handing the socket to the kernel's NBD driver (the
//! kernel does no handshake of its own); and by the test suites of this crate and of the
//! `compcache` command, and tools. The kernel, qemu or libnbd are the real transmission clients.
//!
//! Requests can be pipelined: [`Client::send`] any number, then [`Client::recv`] the replies
//! (in whatever order the server sends them).

use crate::wire::*;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A failed client operation.
#[derive(Debug)]
pub enum ClientError {
    Io(io::Error),
    /// The server broke the protocol (or this client does not understand it).
    Protocol(String),
    /// The server answered an option with an error reply.
    OptionRefused {
        reply: u32,
        message: String,
    },
    /// The server answered a request with this NBD error value.
    Nbd(u32),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Protocol(m) => write!(f, "protocol error: {m}"),
            ClientError::OptionRefused { reply, message } => write!(f, "option refused ({reply:#x}): {message}"),
            ClientError::Nbd(e) => write!(f, "server replied with error {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

/// What the server told about its export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    /// (minimum, preferred, maximum payload), if the server sent NBD_INFO_BLOCK_SIZE.
    pub block_size: Option<(u32, u32, u32)>,
    pub name: Option<String>,
    pub description: Option<String>,
}

/// A reply received by [`Client::recv`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub handle: u64,
    pub error: u32,
    /// READ data (empty on error or for other commands).
    pub data: Vec<u8>,
}

/// A connected client in the transmission phase.
pub struct Client<S: Read + Write> {
    stream: S,
    pub info: ExportInfo,
    next_handle: u64,
    /// Outstanding READs: handle -> length, to know how much data follows their reply.
    pending_reads: HashMap<u64, u32>,
}

impl Client<UnixStream> {
    /// Connects to a Unix socket and enters transmission for export `name` with `NBD_OPT_GO`.
    pub fn connect_unix(path: &Path, name: &str) -> Result<Self, ClientError> {
        Client::handshake(UnixStream::connect(path)?, name)
    }
}

impl Client<TcpStream> {
    pub fn connect_tcp(addr: &str, name: &str) -> Result<Self, ClientError> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Client::handshake(s, name)
    }
}

/// Sends one option (the client half of option haggling).
pub fn send_option(w: &mut impl Write, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    w.write_all(&b)
}

/// Reads one option reply: (option, reply type, data).
pub fn recv_option_reply(r: &mut impl Read) -> Result<(u32, u32, Vec<u8>), ClientError> {
    let magic = read_u64(r)?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(ClientError::Protocol(format!("bad option reply magic {magic:#x}")));
    }
    let opt = read_u32(r)?;
    let reply = read_u32(r)?;
    let len = read_u32(r)?;
    if len > 1 << 20 {
        return Err(ClientError::Protocol(format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    r.read_exact(&mut data)?;
    Ok((opt, reply, data))
}

/// Reads the server greeting and sends client flags; returns the handshake flags.
pub fn greet(s: &mut (impl Read + Write)) -> Result<u16, ClientError> {
    if read_u64(s)? != NBDMAGIC || read_u64(s)? != IHAVEOPT {
        return Err(ClientError::Protocol("not a fixed newstyle NBD server".into()));
    }
    let flags = read_u16(s)?;
    if flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ClientError::Protocol("server does not support fixed newstyle".into()));
    }
    let mut cflags = FLAG_C_FIXED_NEWSTYLE;
    if flags & FLAG_NO_ZEROES != 0 {
        cflags |= FLAG_C_NO_ZEROES;
    }
    s.write_all(&cflags.to_be_bytes())?;
    Ok(flags)
}

/// Encodes INFO/GO option data asking for `requests`.
pub fn info_request(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

/// Sends INFO or GO and collects the information replies up to the final one.
pub fn info_or_go(s: &mut (impl Read + Write), opt: u32, name: &str) -> Result<ExportInfo, ClientError> {
    send_option(s, opt, &info_request(name, &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]))?;
    let mut info = ExportInfo::default();
    let mut have_export = false;
    loop {
        let (o, reply, data) = recv_option_reply(s)?;
        if o != opt {
            return Err(ClientError::Protocol(format!("reply for option {o}, expected {opt}")));
        }
        match reply {
            REP_INFO if data.len() >= 2 => match be16(&data) {
                INFO_EXPORT if data.len() == 12 => {
                    info.size = be64(&data[2..10]);
                    info.flags = be16(&data[10..12]);
                    have_export = true;
                }
                INFO_BLOCK_SIZE if data.len() == 14 => info.block_size = Some((be32(&data[2..6]), be32(&data[6..10]), be32(&data[10..14]))),
                INFO_NAME => info.name = Some(String::from_utf8_lossy(&data[2..]).into()),
                INFO_DESCRIPTION => info.description = Some(String::from_utf8_lossy(&data[2..]).into()),
                _ => {}
            },
            REP_ACK if have_export => return Ok(info),
            REP_ACK => return Err(ClientError::Protocol("ACK without NBD_INFO_EXPORT".into())),
            r if r & (1 << 31) != 0 => return Err(ClientError::OptionRefused { reply: r, message: String::from_utf8_lossy(&data).into() }),
            r => return Err(ClientError::Protocol(format!("unexpected option reply {r:#x}"))),
        }
    }
}

impl<S: Read + Write> Client<S> {
    /// Runs the handshake on a connected stream and enters transmission with `NBD_OPT_GO`.
    pub fn handshake(mut stream: S, name: &str) -> Result<Self, ClientError> {
        greet(&mut stream)?;
        let info = info_or_go(&mut stream, OPT_GO, name)?;
        Ok(Client { stream, info, next_handle: 1, pending_reads: HashMap::new() })
    }

    /// A client on a stream whose handshake was done by other means (by hand, in tests).
    pub fn in_transmission(stream: S, info: ExportInfo) -> Self {
        Client { stream, info, next_handle: 1, pending_reads: HashMap::new() }
    }

    /// The raw stream, for tests that send garbage.
    pub fn stream(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Sends a request (with its payload for WRITE); returns its handle.
    pub fn send(&mut self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> io::Result<u64> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut b = Request { flags, cmd, handle, offset, len }.encode().to_vec();
        b.extend_from_slice(payload);
        self.stream.write_all(&b)?;
        if cmd == CMD_READ {
            self.pending_reads.insert(handle, len);
        }
        Ok(handle)
    }

    /// Receives one reply (of any outstanding request).
    pub fn recv(&mut self) -> Result<Reply, ClientError> {
        let mut h = [0u8; SIMPLE_REPLY_BYTES];
        self.stream.read_exact(&mut h)?;
        if be32(&h[0..4]) != SIMPLE_REPLY_MAGIC {
            return Err(ClientError::Protocol(format!("bad reply magic {:#x}", be32(&h[0..4]))));
        }
        let error = be32(&h[4..8]);
        let handle = be64(&h[8..16]);
        let mut data = Vec::new();
        if let Some(len) = self.pending_reads.remove(&handle) {
            if error == 0 {
                data = vec![0u8; len as usize];
                self.stream.read_exact(&mut data)?;
            }
        }
        Ok(Reply { handle, error, data })
    }

    fn call(&mut self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> Result<Vec<u8>, ClientError> {
        let handle = self.send(cmd, flags, offset, len, payload)?;
        let r = self.recv()?;
        if r.handle != handle {
            return Err(ClientError::Protocol(format!("reply for handle {}, expected {handle}", r.handle)));
        }
        if r.error != 0 {
            return Err(ClientError::Nbd(r.error));
        }
        Ok(r.data)
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, ClientError> {
        self.call(CMD_READ, 0, offset, len, &[])
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.call(CMD_WRITE, 0, offset, data.len() as u32, data).map(drop)
    }

    pub fn write_fua(&mut self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.call(CMD_WRITE, CMD_FLAG_FUA, offset, data.len() as u32, data).map(drop)
    }

    pub fn flush(&mut self) -> Result<(), ClientError> {
        self.call(CMD_FLUSH, 0, 0, 0, &[]).map(drop)
    }

    pub fn trim(&mut self, offset: u64, len: u32) -> Result<(), ClientError> {
        self.call(CMD_TRIM, 0, offset, len, &[]).map(drop)
    }

    pub fn write_zeroes(&mut self, offset: u64, len: u32, flags: u16) -> Result<(), ClientError> {
        self.call(CMD_WRITE_ZEROES, flags, offset, len, &[]).map(drop)
    }

    /// Sends `NBD_CMD_DISC` and waits for the server to close the connection.
    pub fn disconnect(mut self) -> Result<(), ClientError> {
        self.send(CMD_DISC, 0, 0, 0, &[])?;
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest)?;
        if !rest.is_empty() {
            return Err(ClientError::Protocol(format!("{} bytes after NBD_CMD_DISC", rest.len())));
        }
        Ok(())
    }
}
