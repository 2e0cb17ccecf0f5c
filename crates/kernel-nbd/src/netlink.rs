//! The kernel NBD driver's generic netlink family "nbd" (`include/uapi/linux/nbd-netlink.h`):
//! the three commands compcache sends (`NBD_CMD_CONNECT`, `NBD_CMD_RECONFIGURE`,
//! `NBD_CMD_DISCONNECT`), built by hand on a `NETLINK_GENERIC` socket. Every `unsafe` of
//! this module is a system call on the socket with buffers it owns.
//!
//! A message is a `nlmsghdr`, a `genlmsghdr` and attributes (`nlattr`: length, type, payload
//! padded to 4 bytes); nested attributes carry attributes. The family's number is asked of the
//! generic netlink controller (`CTRL_CMD_GETFAMILY`) once per socket. Each request asks for an
//! acknowledgement, and its error code is the result.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const NETLINK_GENERIC: libc::c_int = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const NBD_GENL_VERSION: u8 = 1;
const NBD_CMD_CONNECT: u8 = 1;
const NBD_CMD_DISCONNECT: u8 = 2;
const NBD_CMD_RECONFIGURE: u8 = 3;
const NBD_ATTR_INDEX: u16 = 1;
const NBD_ATTR_SIZE_BYTES: u16 = 2;
const NBD_ATTR_BLOCK_SIZE_BYTES: u16 = 3;
const NBD_ATTR_SERVER_FLAGS: u16 = 5;
const NBD_ATTR_SOCKETS: u16 = 7;
const NBD_ATTR_DEAD_CONN_TIMEOUT: u16 = 8;
const NBD_SOCK_ITEM: u16 = 1;
const NBD_SOCK_FD: u16 = 1;

const NLMSG_HDR_BYTES: usize = 16;
const GENL_HDR_BYTES: usize = 4;
const NLA_HDR_BYTES: usize = 4;

/// How a device is configured by [`Nbd::connect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub index: u32,
    pub size_bytes: u64,
    pub block_bytes: u64,
    /// The transmission flags the server advertised (`NBD_FLAG_*`).
    pub server_flags: u64,
    /// How long the kernel queues I/O when every connection is dead, for a successor to
    /// reconnect (`NBD_CMD_RECONFIGURE`); 0: it fails the I/O at once.
    pub dead_conn_timeout_s: u64,
}

/// A message under construction: attributes appended, nests closed by position.
struct Message(Vec<u8>);

impl Message {
    fn new(family: u16, cmd: u8, version: u8) -> Message {
        let mut b = vec![0u8; NLMSG_HDR_BYTES + GENL_HDR_BYTES];
        b[4..6].copy_from_slice(&family.to_ne_bytes());
        b[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        b[NLMSG_HDR_BYTES] = cmd;
        b[NLMSG_HDR_BYTES + 1] = version;
        Message(b)
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) -> &mut Message {
        let len = (NLA_HDR_BYTES + payload.len()) as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        while self.0.len() % 4 != 0 {
            self.0.push(0);
        }
        self
    }

    fn u32(&mut self, kind: u16, v: u32) -> &mut Message {
        self.attr(kind, &v.to_ne_bytes())
    }

    fn u64(&mut self, kind: u16, v: u64) -> &mut Message {
        self.attr(kind, &v.to_ne_bytes())
    }

    /// Opens a nested attribute; [`Message::end`] with the returned position closes it.
    fn begin(&mut self, kind: u16) -> usize {
        let at = self.0.len();
        self.attr(kind, &[]);
        at
    }

    fn end(&mut self, at: usize) {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// The socket items of `NBD_ATTR_SOCKETS`, one per descriptor.
    fn sockets(&mut self, fds: &[RawFd]) -> &mut Message {
        let socks = self.begin(NBD_ATTR_SOCKETS);
        for &fd in fds {
            let item = self.begin(NBD_SOCK_ITEM);
            self.u32(NBD_SOCK_FD, fd as u32);
            self.end(item);
        }
        self.end(socks);
        self
    }

    fn finish(&mut self, seq: u32) -> &[u8] {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0[8..12].copy_from_slice(&seq.to_ne_bytes());
        &self.0
    }
}

/// A generic netlink socket that knows the "nbd" family's number.
pub struct Nbd {
    sock: OwnedFd,
    family: u16,
    seq: u32,
}

impl Nbd {
    /// Opens the socket and looks the family up. `ErrorKind::NotFound`: the kernel has no
    /// "nbd" family (nbd.ko not loaded, or older than 4.12).
    pub fn open() -> io::Result<Nbd> {
        // SAFETY: socket(2) with constant arguments; returns a new descriptor or -1.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_GENERIC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut nl = Nbd { sock, family: GENL_ID_CTRL, seq: 1 };
        let mut m = Message::new(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1);
        m.attr(CTRL_ATTR_FAMILY_NAME, b"nbd\0");
        let reply = nl.request(&mut m).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => io::Error::new(io::ErrorKind::NotFound, "the kernel has no \"nbd\" generic netlink family"),
            _ => e,
        })?;
        let id = reply
            .and_then(|r| attrs(&r[NLMSG_HDR_BYTES + GENL_HDR_BYTES..]).find(|(k, _)| *k == CTRL_ATTR_FAMILY_ID).map(|(_, v)| v.to_vec()))
            .filter(|v| v.len() >= 2)
            .ok_or_else(|| io::Error::other("the controller's reply names no family id"))?;
        nl.family = u16::from_ne_bytes([id[0], id[1]]);
        Ok(nl)
    }

    /// `NBD_CMD_CONNECT`: configures device `cfg.index` with the sockets `fds` (the kernel
    /// takes a reference to each; the caller may close its descriptors afterwards).
    pub fn connect(&mut self, cfg: &Config, fds: &[RawFd]) -> io::Result<()> {
        let mut m = Message::new(self.family, NBD_CMD_CONNECT, NBD_GENL_VERSION);
        m.u32(NBD_ATTR_INDEX, cfg.index)
            .u64(NBD_ATTR_SIZE_BYTES, cfg.size_bytes)
            .u64(NBD_ATTR_BLOCK_SIZE_BYTES, cfg.block_bytes)
            .u64(NBD_ATTR_SERVER_FLAGS, cfg.server_flags)
            .u64(NBD_ATTR_DEAD_CONN_TIMEOUT, cfg.dead_conn_timeout_s)
            .sockets(fds);
        self.request(&mut m).map(|_| ())
    }

    /// `NBD_CMD_RECONFIGURE`: gives device `index` the sockets `fds` in place of dead ones.
    /// The kernel replaces as many dead connections as it has, in order, and ignores the rest
    /// without an error (`nbd_genl_reconfigure`): call it once every old connection is dead.
    pub fn reconfigure(&mut self, index: u32, fds: &[RawFd]) -> io::Result<()> {
        let mut m = Message::new(self.family, NBD_CMD_RECONFIGURE, NBD_GENL_VERSION);
        m.u32(NBD_ATTR_INDEX, index).sockets(fds);
        self.request(&mut m).map(|_| ())
    }

    /// `NBD_CMD_DISCONNECT`: the kernel sends `NBD_CMD_DISC` on each connection, shuts them
    /// down and clears the device.
    pub fn disconnect(&mut self, index: u32) -> io::Result<()> {
        let mut m = Message::new(self.family, NBD_CMD_DISCONNECT, NBD_GENL_VERSION);
        m.u32(NBD_ATTR_INDEX, index);
        self.request(&mut m).map(|_| ())
    }

    /// Sends `m` and reads until its acknowledgement; the first reply that is not one (if
    /// any) is returned. A negative acknowledgement is the error.
    fn request(&mut self, m: &mut Message) -> io::Result<Option<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = m.finish(seq);
        // SAFETY: `sockaddr_nl` is plain data; all-zero is the kernel's address (pid 0).
        let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `bytes` and `to` are valid for the lengths given for the whole call.
        let n = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                0,
                (&to as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut reply = None;
        let mut buf = vec![0u8; 16384];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= NLMSG_HDR_BYTES {
                let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                let rseq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
                if len < NLMSG_HDR_BYTES || len > rest.len() {
                    return Err(io::Error::other("a truncated netlink reply"));
                }
                let msg = &rest[..len];
                rest = &rest[align4(len).min(rest.len())..];
                if rseq != seq {
                    continue;
                }
                match kind {
                    NLMSG_ERROR if msg.len() >= NLMSG_HDR_BYTES + 4 => {
                        let code = i32::from_ne_bytes([msg[16], msg[17], msg[18], msg[19]]);
                        return match code {
                            0 => Ok(reply),
                            c => Err(io::Error::from_raw_os_error(-c)),
                        };
                    }
                    NLMSG_DONE => return Ok(reply),
                    _ if reply.is_none() => reply = Some(msg.to_vec()),
                    _ => {}
                }
            }
        }
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The attributes in `b`: (type without flag bits, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < NLA_HDR_BYTES {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < NLA_HDR_BYTES || len > b.len() {
            return None;
        }
        let payload = &b[NLA_HDR_BYTES..len];
        b = &b[align4(len).min(b.len())..];
        Some((kind, payload))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_message_nests_its_sockets() {
        let mut m = Message::new(0x20, NBD_CMD_CONNECT, NBD_GENL_VERSION);
        m.u32(NBD_ATTR_INDEX, 3).sockets(&[7, 9]);
        let b = m.finish(5).to_vec();
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize, b.len());
        assert_eq!((b[16], b[17]), (NBD_CMD_CONNECT, NBD_GENL_VERSION));
        let top: Vec<_> = attrs(&b[20..]).collect();
        assert_eq!(top[0], (NBD_ATTR_INDEX, &3u32.to_ne_bytes()[..]));
        assert_eq!(top[1].0, NBD_ATTR_SOCKETS);
        let items: Vec<_> = attrs(top[1].1).collect();
        assert_eq!(items.len(), 2);
        let fds: Vec<u32> =
            items.iter().map(|(_, p)| attrs(p).next().map(|(_, v)| u32::from_ne_bytes(v.try_into().unwrap())).unwrap()).collect();
        assert_eq!(fds, [7, 9]);
    }

    #[test]
    fn the_family_or_why_not() {
        // On a kernel without nbd.ko (this project's build machine) the family is missing.
        match Nbd::open() {
            Ok(n) => assert_ne!(n.family, GENL_ID_CTRL),
            Err(e) => eprintln!("skipped: {e}"),
        }
    }
}
