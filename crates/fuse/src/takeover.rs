//! Taking over a mounted connection from a server that died or handed over.
//!
//! The kernel ends a FUSE connection when the last reference to its `/dev/fuse` file
//! descriptions goes (`fuse_dev_release`: each description's processing queue, the requests
//! read but not answered, ends with ECONNABORTED; the last one aborts the connection). So a
//! server that is to have a successor gives every descriptor it reads requests from to a holder
//! that outlives it (the supervisor, or systemd's file descriptor store) before it reads the
//! first request. While the holder keeps them, a dead server's requests wait in its
//! descriptors' processing queues and new ones in the input queue: the file's users block.
//!
//! The successor gets the descriptors and what INIT agreed ([`Negotiated`]: what request
//! decoding and the buffers depend on), serves on them ([`crate::take_over`]) and writes
//! `FUSE_NOTIFY_RESEND` ([`notify_resend`], Linux 6.9+): the kernel moves every request still in
//! a processing queue back to the input queue, with [`abi::FUSE_UNIQUE_RESEND`] set in its
//! `unique`, which the reply echoes (our transports copy `unique` as read). A request the
//! predecessor had executed but not answered runs twice: for the device file (reads, writes of
//! whole ranges, discards, flushes) that is idempotent, and the kernel never has two requests
//! on the same range in flight for swap.
//!
//! On a kernel before 6.9 the notification is refused (EINVAL: an unknown notify code); the
//! requests the predecessor had read stay unanswered, and the tasks waiting for them hang
//! until the connection is aborted (`/sys/fs/fuse/connections/N/abort`). New requests are
//! served. The caller says so in its log.
//!
//! FUSE over io_uring is not taken over: a ring's requests belong to the ring's queues, which
//! die with the server's io_uring instances. A server meant to be taken over serves through
//! `/dev/fuse` only.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::abi;

/// What the kernel and the first server agreed at INIT that a successor must serve by:
/// the protocol minor (the layout of the requests' fixed arguments), `max_write` (the buffers:
/// a request is read whole), and the flags asked for and granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The protocol minor in force: the lower of the kernel's and the server's.
    pub minor: u32,
    /// `max_write` (and `max_readahead`, so `max_pages`): the largest request's data.
    pub max_write: u32,
    /// The INIT flags the server asked for that the kernel offered (`FUSE_ASYNC_DIO`, ...).
    pub flags: u64,
    /// `max_background` at INIT.
    pub max_background: u16,
}

/// The oldest protocol minor whose fixed arguments our decoding reads (`fuse_read_in` and
/// `fuse_write_in` grew in 7.9).
pub const MIN_MINOR: u32 = 9;

impl Negotiated {
    /// One line, `fuse-init minor=M max_write=W flags=0xF max_background=B`, as stored next to
    /// the descriptors.
    pub fn to_line(&self) -> String {
        format!(
            "fuse-init minor={} max_write={} flags={:#x} max_background={}",
            self.minor, self.max_write, self.flags, self.max_background
        )
    }

    /// The line [`Negotiated::to_line`] wrote; the error says what is wrong with it.
    pub fn parse(line: &str) -> Result<Negotiated, String> {
        let mut words = line.split_whitespace();
        if words.next() != Some("fuse-init") {
            return Err(format!("not a FUSE INIT record: {line:?}"));
        }
        let (mut minor, mut max_write, mut flags, mut max_background) = (None, None, None, None);
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| format!("{w:?} in the FUSE INIT record is not key=value"))?;
            let bad = || format!("{k}={v} in the FUSE INIT record is not a number");
            match k {
                "minor" => minor = Some(v.parse().map_err(|_| bad())?),
                "max_write" => max_write = Some(v.parse().map_err(|_| bad())?),
                "flags" => flags = Some(u64::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|_| bad())?),
                "max_background" => max_background = Some(v.parse().map_err(|_| bad())?),
                // A newer server's fields are not needed to serve.
                _ => {}
            }
        }
        let missing = |what: &str| format!("the FUSE INIT record has no {what}");
        let n = Negotiated {
            minor: minor.ok_or_else(|| missing("minor"))?,
            max_write: max_write.ok_or_else(|| missing("max_write"))?,
            flags: flags.ok_or_else(|| missing("flags"))?,
            max_background: max_background.ok_or_else(|| missing("max_background"))?,
        };
        if n.minor < MIN_MINOR {
            return Err(format!("FUSE protocol 7.{} is older than this server decodes (7.{MIN_MINOR})", n.minor));
        }
        if n.max_write == 0 {
            return Err("the FUSE INIT record has max_write=0".into());
        }
        Ok(n)
    }
}

/// Writes `FUSE_NOTIFY_RESEND` to `fd`, a descriptor of the connection: every request read but
/// not answered is queued again (module docs). Fails with EINVAL on kernels before 6.9.
pub fn notify_resend(fd: BorrowedFd<'_>) -> io::Result<()> {
    let out = abi::OutHeader { len: size_of::<abi::OutHeader>() as u32, error: abi::FUSE_NOTIFY_RESEND, unique: 0 };
    let b = abi::bytes(&out);
    // SAFETY: writes `b.len()` bytes from a live local; the kernel reads them whole.
    let n = unsafe { libc::write(fd.as_raw_fd(), b.as_ptr().cast(), b.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_record_round_trips_and_refuses_what_it_cannot_serve() {
        let n = Negotiated { minor: 40, max_write: 128 << 10, flags: 1 << 15, max_background: 128 };
        assert_eq!(Negotiated::parse(&n.to_line()), Ok(n));
        assert_eq!(Negotiated::parse(&(n.to_line() + " later=1")), Ok(n), "a newer server's extra fields are ignored");
        assert!(Negotiated::parse("fuse-init minor=8 max_write=4096 flags=0x0 max_background=1").unwrap_err().contains("7.8"));
        assert!(Negotiated::parse("fuse-init minor=40 flags=0x0 max_background=1").unwrap_err().contains("max_write"));
        assert!(Negotiated::parse("store v1").is_err());
        assert!(Negotiated::parse("fuse-init minor=x max_write=1 flags=0 max_background=1").is_err());
    }

    #[test]
    fn the_resend_notification_is_a_bare_header() {
        // fuse_dev_do_write: len equal to what is written, unique 0 (a notification), the code
        // in error; FUSE_NOTIFY_RESEND reads no payload.
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        notify_resend(std::os::fd::AsFd::as_fd(&a)).unwrap();
        let mut got = [0u8; 32];
        let n = std::io::Read::read(&mut &b, &mut got).unwrap();
        assert_eq!(n, 16);
        let h: abi::OutHeader = abi::read(&got[..16]);
        assert_eq!(h, abi::OutHeader { len: 16, error: 7, unique: 0 });
    }
}
