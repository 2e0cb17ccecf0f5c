//! systemd's file descriptor store protocol, both ends: the one mechanism by which a server's
//! descriptors outlive it (docs/swap.md, "When the server dies").
//!
//! - Storing: a datagram `FDSTORE=1\nFDNAME=<name>\n` with the descriptors as `SCM_RIGHTS`, to
//!   the socket named by `$NOTIFY_SOCKET` ([`store`]). systemd keeps them in the unit's store
//!   (`FileDescriptorStoreMax=`); compcache's supervisor (`swapon`'s, docs/swap.md) keeps them
//!   itself, reading its own notify socket ([`NotifySocket`]).
//! - Getting them back: `LISTEN_FDS=N` descriptors from 3 on, named by `LISTEN_FDNAMES=a:b:...`
//!   ([`handed`]). systemd sets `LISTEN_PID` to the receiving process; compcache's supervisor
//!   cannot know its child's pid before the exec, so it sets none, and the server takes the
//!   descriptors only when told it takes a device over (`--takeover`).
//!
//! - A standby (a successor started in advance, waiting): compcache's supervisor sends it the
//!   held descriptors on a `SOCK_SEQPACKET` socket pair, one `FDNAME=<name>` message per
//!   name (and per [`MAX_FDS_PER_MESSAGE`]) and then `GO=1` ([`hand_to_standby`]); the standby
//!   takes them ([`wait_as_standby`]) and [`handed`] returns them. The end of the connection
//!   before `GO=1` dismisses it.
//!
//! Every received descriptor is made close-on-exec at once, as systemd's own readers do.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// `SD_LISTEN_FDS_START`: the first handed descriptor.
pub const LISTEN_FDS_START: RawFd = 3;
/// The most descriptors one message carries (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS_PER_MESSAGE: usize = 64;

/// The address `$NOTIFY_SOCKET` names (a path, or `@name` in the abstract namespace).
fn notify_address(name: &std::ffi::OsStr) -> io::Result<std::os::unix::net::SocketAddr> {
    let b = name.as_bytes();
    match b.strip_prefix(b"@") {
        Some(abs) => <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(abs),
        None => std::os::unix::net::SocketAddr::from_pathname(Path::new(name)),
    }
}

/// Sends `text` with `fds` (SCM_RIGHTS) on the connected socket `sock`.
fn send_with_fds(sock: BorrowedFd<'_>, text: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} descriptors in one message (at most {MAX_FDS_PER_MESSAGE})", fds.len()),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let data_bytes = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(data_bytes as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    let mut iov = libc::iovec { iov_base: text.as_ptr() as *mut libc::c_void, iov_len: text.len() };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `control` holds CMSG_SPACE(data_bytes) bytes, room for one header and the
        // descriptors; CMSG_FIRSTHDR of a header with that length is non-null and in it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), data_bytes);
        }
    }
    // SAFETY: `msg` points at `iov` and `control`, both alive for the call; sendmsg only reads.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != text.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "the notify message was cut short"));
    }
    Ok(())
}

/// Sends `text` (newline-separated `KEY=value` lines) with `fds` to the socket `$NOTIFY_SOCKET`
/// names. `Ok(false)`: no `$NOTIFY_SOCKET`, nothing sent.
pub fn notify(text: &str, fds: &[BorrowedFd<'_>]) -> io::Result<bool> {
    let Some(name) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(false) };
    notify_to(&name, text, fds)?;
    Ok(true)
}

/// [`notify`] to the socket `name`.
pub fn notify_to(name: &std::ffi::OsStr, text: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    sock.connect_addr(&notify_address(name)?)?;
    send_with_fds(std::os::fd::AsFd::as_fd(&sock), text, fds)
}

/// Whether a holder is named (`$NOTIFY_SOCKET` is set).
pub fn holder_named() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty())
}

/// Gives `fds` to the holder's store under `name` (`FDSTORE=1`, `FDNAME=`), in messages of at
/// most [`MAX_FDS_PER_MESSAGE`]. `Ok(false)`: no holder is named.
pub fn store(name: &str, fds: &[BorrowedFd<'_>]) -> io::Result<bool> {
    check_name(name)?;
    if !holder_named() {
        return Ok(false);
    }
    for chunk in fds.chunks(MAX_FDS_PER_MESSAGE) {
        notify(&format!("FDSTORE=1\nFDNAME={name}\n"), chunk)?;
    }
    Ok(true)
}

/// systemd's rule for a descriptor name (`fdname_is_valid`): 1..=255 printable ASCII
/// characters, no colon (the separator of `LISTEN_FDNAMES`).
pub fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name.len() > 255 || !name.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b':') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a valid descriptor name")));
    }
    Ok(())
}

/// The descriptors a standby was handed ([`wait_as_standby`]), which [`handed`] returns.
static STANDBY_HANDED: std::sync::Mutex<Option<Vec<(String, OwnedFd)>>> = std::sync::Mutex::new(None);

/// A `SOCK_SEQPACKET` socket pair, both ends close-on-exec: (the supervisor's, the standby's).
pub fn standby_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: socketpair fills the two-int array it is given.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded: two new descriptors nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The supervisor's side: sends `held` (names and descriptors, in order) to the standby on
/// `sock`, then `GO=1`.
pub fn hand_to_standby(sock: BorrowedFd<'_>, held: &[(String, OwnedFd)]) -> io::Result<()> {
    let mut i = 0;
    while i < held.len() {
        let name = &held[i].0;
        let run = held[i..].iter().take_while(|(n, _)| n == name).count().min(MAX_FDS_PER_MESSAGE);
        let fds: Vec<BorrowedFd<'_>> = held[i..i + run].iter().map(|(_, f)| std::os::fd::AsFd::as_fd(f)).collect();
        send_with_fds(sock, &format!("FDNAME={name}\n"), &fds)?;
        i += run;
    }
    send_with_fds(sock, "GO=1\n", &[])
}

/// The supervisor's side: waits up to `timeout` for the standby on `sock` to say it waits
/// (`WAITING=1`: pinned, memory locked). `false`: it did not in time, or it is gone; an older
/// standby never says it.
pub fn standby_waiting(sock: BorrowedFd<'_>, timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd on the stack, for the length 1 given.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n <= 0 {
            return false;
        }
        // Readable: a message (taken at once) or the end of the connection (`None`).
        match recv_message(sock, 0) {
            Ok(Some(m)) if m.get("WAITING") == Some("1") => return true,
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return false,
        }
    }
}

/// The standby's side: waits on `sock` (blocking) for the descriptors of a device to take
/// over. `Ok(true)`: they came (and `GO=1`): [`handed`] returns them; `Ok(false)`: dismissed
/// (the supervisor closed its end, or is gone).
pub fn wait_as_standby(sock: BorrowedFd<'_>) -> io::Result<bool> {
    // Pinned and ready: the supervisor waits for this before a hand-over (`standby_waiting`).
    // A supervisor that does not (an older one) leaves it unread; a send that fails means it
    // is gone, which the receive below finds.
    let _ = send_with_fds(sock, "WAITING=1\n", &[]);
    let mut got = Vec::new();
    loop {
        let m = match recv_message(sock, 0) {
            Ok(Some(m)) => m,
            // Dismissed: a supervisor that closes its end without reading WAITING resets the
            // connection instead of ending it.
            Ok(None) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(false),
            Err(e) => return Err(e),
        };
        if m.get("GO") == Some("1") {
            *STANDBY_HANDED.lock().unwrap_or_else(|p| p.into_inner()) = Some(got);
            return Ok(true);
        }
        let name = m.get("FDNAME").unwrap_or("unknown").to_string();
        got.extend(m.fds.into_iter().map(|fd| (name.clone(), fd)));
    }
}

/// The descriptors handed to this process (`LISTEN_FDS`, `LISTEN_FDNAMES`) with their names,
/// made close-on-exec; the variables are removed so that children do not see them. A standby
/// gets those it was sent instead ([`wait_as_standby`]). With
/// `LISTEN_PID` set, only if it is this process (systemd's rule); without it, only if
/// `!require_pid`: the caller says the descriptors are its own (`--takeover`).
pub fn handed(require_pid: bool) -> io::Result<Vec<(String, OwnedFd)>> {
    if let Some(v) = STANDBY_HANDED.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Ok(v);
    }
    let n: usize = match std::env::var("LISTEN_FDS") {
        Ok(v) => v.trim().parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("LISTEN_FDS={v:?} is not a number")))?,
        Err(_) => return Ok(Vec::new()),
    };
    match std::env::var("LISTEN_PID") {
        Ok(pid) if pid.trim().parse::<u32>().ok() != Some(std::process::id()) => return Ok(Vec::new()),
        Err(_) if require_pid => return Ok(Vec::new()),
        _ => {}
    }
    let names: Vec<String> = std::env::var("LISTEN_FDNAMES").unwrap_or_default().split(':').map(str::to_string).collect();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let fd = LISTEN_FDS_START + i as RawFd;
        // SAFETY: F_GETFD/F_SETFD on a descriptor number; a closed one is EBADF, not UB.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("handed descriptor {fd}: {}", io::Error::last_os_error())));
        }
        // SAFETY: the parent handed this descriptor to this process for it to own (the
        // LISTEN_FDS protocol); nothing else in the process refers to it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        out.push((names.get(i).cloned().unwrap_or_else(|| "unknown".into()), owned));
    }
    for v in ["LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID"] {
        // SAFETY: remove_var needs that no other thread reads or writes the environment
        // meanwhile: this runs on the server's main thread before it starts any other
        // (`run_fuse`, first thing).
        unsafe { std::env::remove_var(v) };
    }
    Ok(out)
}

/// A holder's end: a datagram socket bound to a path, as `$NOTIFY_SOCKET` for children, that
/// receives their `FDSTORE=1` messages and descriptors.
pub struct NotifySocket {
    sock: UnixDatagram,
    path: std::path::PathBuf,
}

/// One message read from a [`NotifySocket`].
pub struct Message {
    pub text: String,
    pub fds: Vec<OwnedFd>,
    /// The sender's pid (SCM_CREDENTIALS), 0 when unknown.
    pub pid: u32,
}

impl Message {
    /// The value of `KEY=` in the message, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.text.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }
}

impl NotifySocket {
    /// Binds `path` (replacing a stale socket there), non-blocking, with the senders'
    /// credentials passed (`SO_PASSCRED`).
    pub fn bind(path: &Path) -> io::Result<NotifySocket> {
        let _ = std::fs::remove_file(path);
        let sock = UnixDatagram::bind(path)?;
        sock.set_nonblocking(true)?;
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads one int from a live local of the given size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        Ok(NotifySocket { sock, path: path.to_path_buf() })
    }

    /// The value for a child's `NOTIFY_SOCKET`.
    pub fn env_value(&self) -> OsString {
        self.path.clone().into_os_string()
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The next message, or `None` when none is queued.
    pub fn recv(&self) -> io::Result<Option<Message>> {
        recv_message(std::os::fd::AsFd::as_fd(&self.sock), libc::MSG_DONTWAIT)
    }
}

/// The next message on `sock` (`flags`: `MSG_DONTWAIT` or none), `None` when none is queued
/// (`MSG_DONTWAIT`) or at the end of a connection (a `SOCK_SEQPACKET` peer gone).
fn recv_message(sock: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<Option<Message>> {
    let mut data = vec![0u8; 4096];
    // Room for MAX_FDS_PER_MESSAGE descriptors and the credentials.
    // SAFETY: CMSG_SPACE is arithmetic.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS_PER_MESSAGE * size_of::<RawFd>()) as u32) + libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) }
            as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `iov` (over `data`) and `control`, alive and writable for
    // their stated lengths; MSG_CMSG_CLOEXEC makes the received descriptors close-on-exec.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ => Err(e),
        };
    }
    if n == 0 && flags & libc::MSG_DONTWAIT == 0 {
        return Ok(None);
    }
    let mut fds = Vec::new();
    let mut pid = 0;
    // SAFETY: the CMSG_* walk stays inside `control` as recvmsg filled it
    // (msg_controllen); each SCM_RIGHTS entry's data is an array of descriptors now owned
    // by this process, taken once each; SCM_CREDENTIALS's data is one ucred.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                pid = cred.pid as u32;
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // Descriptors that did not fit were closed by the kernel: the message is not whole.
        return Err(io::Error::other("a notify message carried more descriptors than a holder takes"));
    }
    Ok(Some(Message { text: String::from_utf8_lossy(&data[..n as usize]).into_owned(), fds, pid }))
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_and_names_reach_the_holder() {
        let dir = std::env::temp_dir().join(format!("compcache-fdstore-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let holder = NotifySocket::bind(&dir.join("notify")).unwrap();
        assert!(holder.recv().unwrap().is_none());
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        notify_to(&holder.env_value(), "FDSTORE=1\nFDNAME=compcache-fuse\n", &[a.as_fd(), b.as_fd()]).unwrap();
        let m = holder.recv().unwrap().unwrap();
        assert_eq!((m.get("FDSTORE"), m.get("FDNAME"), m.fds.len()), (Some("1"), Some("compcache-fuse"), 2));
        assert_eq!(m.pid, std::process::id());
        // The held descriptor is the same socket: what is written on `a` arrives on the held
        // copy of `b`.
        std::io::Write::write_all(&mut &a, b"x").unwrap();
        let held_b = std::os::unix::net::UnixStream::from(m.fds.into_iter().nth(1).unwrap());
        let mut got = [0u8; 1];
        std::io::Read::read_exact(&mut &held_b, &mut got).unwrap();
        assert_eq!(&got, b"x");
        drop(holder);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_standby_gets_every_descriptor_by_name_or_is_dismissed() {
        let (sup, standby) = standby_pair().unwrap();
        // 70 descriptors under one name: two messages.
        let mut held: Vec<(String, OwnedFd)> = Vec::new();
        let pipes: Vec<_> = (0..35).map(|_| std::os::unix::net::UnixStream::pair().unwrap()).collect();
        held.push(("compcache-store".into(), pipes[0].0.try_clone().unwrap().into()));
        for (a, b) in &pipes {
            held.push(("compcache-fuse".into(), a.try_clone().unwrap().into()));
            held.push(("compcache-fuse".into(), b.try_clone().unwrap().into()));
        }
        held.push(("compcache-fuse-init".into(), pipes[1].0.try_clone().unwrap().into()));
        let t = std::thread::spawn(move || {
            assert!(wait_as_standby(standby.as_fd()).unwrap());
            handed(true).unwrap()
        });
        hand_to_standby(sup.as_fd(), &held).unwrap();
        let got = t.join().unwrap();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        let want: Vec<&str> = held.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, want);
        // The same sockets: what is written on the first pair's `a` arrives on the received `b`.
        std::io::Write::write_all(&mut &pipes[0].0, b"y").unwrap();
        let b = std::os::unix::net::UnixStream::from(got.into_iter().nth(2).unwrap().1);
        let mut byte = [0u8; 1];
        std::io::Read::read_exact(&mut &b, &mut byte).unwrap();
        assert_eq!(&byte, b"y");
        // Dismissed: the supervisor's end closed before GO.
        let (sup, standby) = standby_pair().unwrap();
        send_with_fds(sup.as_fd(), "FDNAME=compcache-store\n", &[pipes[2].0.as_fd()]).unwrap();
        drop(sup);
        assert!(!wait_as_standby(standby.as_fd()).unwrap());
    }

    #[test]
    fn descriptor_names_follow_systemds_rule() {
        assert!(check_name("compcache-fuse").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a:b").is_err());
        assert!(check_name("tab\there").is_err());
        assert!(check_name(&"x".repeat(256)).is_err());
    }
}
