//! The classic FUSE transport, `read` and `writev` on `/dev/fuse`, served by our own threads
//! (fuser mounts and answers INIT, then its session is kept but never run).
//!
//! Why our own loop: a swap server must not allocate while it serves (an allocation can wait
//! on reclaim, which waits on swap-outs only this server can complete; docs/swap.md, "Memory
//! pressure"). Here every buffer a request touches is made, written and `mlock`ed in
//! [`start`], before the device is used:
//! - each thread has one buffer of `PAGE_SIZE + max_request` bytes (at least
//!   `FUSE_MIN_READ_BUFFER`, and more than the `fuse_in_header` + `fuse_write_in` +
//!   `max_write` the kernel requires of a read on `/dev/fuse`) and one compression context;
//! - a request is read into the buffer whole (the kernel hands one request per `read`); its
//!   header and fixed argument are decoded by copy, and [`answer::dispatch`] gets the rest of
//!   the buffer as the payload: a write's data is compressed straight from it, a read's data is
//!   decompressed straight into it;
//! - the reply is one `writev`: the `fuse_out_header` on the stack, the body from the buffer.
//!
//! Per request: no allocation, no page fault, two system calls (and, while requests keep
//! arriving, the polls of the one spinning thread, below).
//!
//! Waiting: a thread sleeps in `read` until the kernel wakes it with a request. With
//! [`Options::spin`](crate::Options::spin) (off by default) a thread that has just answered a
//! request first polls `/dev/fuse` (`poll` with a zero timeout, in a loop, under
//! `SCHED_IDLE`) for up to that long, one thread of the connection at a time; each request
//! answered starts the window again, so an idle device has every thread asleep after one
//! window. The aim is the wake-up of a sleeping thread, which on a virtual machine whose idle
//! vCPUs halt is an interrupt to a halted vCPU. Measured on this project's 2-vCPU machine
//! under load it made reads slower, at normal priority and at idle priority alike
//! (docs/swap.md, "Where a page fault's time goes"), so it stays an option to measure on
//! other machines.
//!
//! Threads: [`Options::threads`](crate::Options::threads), each with its own descriptor cloned
//! with `FUSE_DEV_IOC_CLONE` (its own processing queue in the kernel, so a reply is matched
//! without contending with the other threads; a kernel without it gets a `dup`). They are
//! started by the thread that mounted, after the swap server's `PR_SET_IO_FLUSHER` and
//! `mlockall`, and inherit both.
//!
//! Requests with no reply (FORGET, BATCH_FORGET, INTERRUPT, NOTIFY_REPLY) are read and
//! dropped: the device's requests complete in microseconds, so an INTERRUPT has nothing to
//! interrupt. A reply the kernel no longer waits for (ENOENT: the request was aborted) is
//! dropped. A thread ends when the connection does (ENODEV: unmounted or aborted).
//!
//! Locking: each thread's descriptor, buffer and context are its own; the store is shared.
//!
//! Handing over ([`Threads::quiesce`], `compcache restart`): the threads stop taking requests
//! and those in flight are answered; a request read after that is left unanswered in its
//! descriptor's processing queue, where the successor's `FUSE_NOTIFY_RESEND` finds it
//! (crate::takeover). The gate is two counters: a thread counts itself busy, then looks at
//! `stopping`; the handing-over thread sets `stopping`, then waits for busy to reach zero
//! (both sequentially consistent, so a request is either answered or left, never half).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use compcache_log::Rejects;
use compcache_store::{Context, PAGE_SIZE};

use crate::abi::{self, op};
use crate::answer::{dispatch, Device};

/// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`, include/uapi/linux/fuse.h.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// The serving threads.
pub struct Threads {
    threads: Vec<JoinHandle<io::Result<()>>>,
    /// The spin window in force ([`Wait::window`]).
    pub spin: Duration,
    gate: Arc<Gate>,
}

/// Whether the threads still take requests, and how many are answering one (module docs,
/// "Handing over").
#[derive(Default)]
struct Gate {
    stopping: AtomicBool,
    busy: AtomicUsize,
}

impl Threads {
    /// Stops taking requests and waits (up to `timeout`) until every request a thread has
    /// started on is answered. Returns whether none is left. Threads that read a request
    /// afterwards leave it unanswered for a successor and sleep until the process exits.
    pub fn quiesce(&self, timeout: Duration) -> bool {
        self.gate.stopping.store(true, Ordering::SeqCst);
        let start = Instant::now();
        while self.gate.busy.load(Ordering::SeqCst) != 0 {
            if start.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    /// Whether any thread still serves (false once the connection has ended).
    pub fn alive(&self) -> bool {
        self.threads.iter().any(|t| !t.is_finished())
    }

    /// Waits for every thread; the first error one of them ended with.
    pub fn join(self) -> io::Result<()> {
        let mut first = Ok(());
        for t in self.threads {
            let r = t.join().unwrap_or_else(|_| Err(io::Error::other("a FUSE thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// The size of each thread's buffer for requests of at most `max_request` bytes of data.
pub fn buffer_bytes(max_request: usize) -> usize {
    (PAGE_SIZE + max_request).max(abi::FUSE_MIN_READ_BUFFER)
}

/// How the connection's threads wait for requests: the spin window, and which thread spins.
pub struct Wait {
    /// How long after answering a request a thread polls for the next one before it sleeps in
    /// `read` (zero: always sleep).
    window: Duration,
    /// Taken by the one thread that polls; the others sleep in `read`.
    spinning: AtomicBool,
}

impl Wait {
    /// Threads that poll for `window` after each request, if this process may bring a thread
    /// back from `SCHED_IDLE` ([`may_leave_idle`]); else threads that never poll.
    pub fn new(window: Duration) -> Wait {
        let window = if window.is_zero() || may_leave_idle() { window } else { Duration::ZERO };
        Wait { window, spinning: AtomicBool::new(false) }
    }

    /// The window in force (zero: the threads never poll).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Polls `fd` until a request is there or the window since `answered` (when this thread
    /// answered its last request) has passed; returns at once when the window is zero or over,
    /// or another thread polls already. Returns whether it polled.
    ///
    /// The poll runs under `SCHED_IDLE`, so that any task woken on its CPU preempts it: on two
    /// CPUs the tasks a read goes through (the loop driver's worker, `ksoftirqd` completing
    /// the loop request, the faulting task) are woken onto this CPU too, and behind a poll at
    /// normal priority they waited out the window (traced: 37 and 53 us; `sched_yield` in the
    /// loop did not help). Under load, reads were slower still with `SCHED_IDLE` (docs/swap.md).
    /// The thread is back at its normal policy before it reads a request, so serving is
    /// never at idle priority.
    fn spin(&self, fd: &OwnedFd, answered: Instant) -> bool {
        if self.window.is_zero() || answered.elapsed() >= self.window {
            return false;
        }
        if self.spinning.swap(true, Ordering::Acquire) {
            return false;
        }
        let polled = set_policy(libc::SCHED_IDLE).is_ok();
        if polled {
            let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd on the stack, for the length 1 given; a zero timeout never
            // blocks. Ready, an error (the read that follows reports it) or the window over.
            while unsafe { libc::poll(&mut p, 1, 0) } == 0 && answered.elapsed() < self.window {
                std::hint::spin_loop();
            }
            // `Wait::new` polls only where the thread may go back (`may_leave_idle`). Should it
            // fail all the same, this thread serves at idle priority: it says so (a path never
            // taken in service, so its message may allocate), and keeps the token so that no
            // thread polls again.
            if let Err(e) = set_policy(libc::SCHED_OTHER) {
                compcache_log::warning("compcache-fuse", &format!("a serving thread could not leave SCHED_IDLE after polling ({e}); it serves at idle priority, and no thread polls any more"));
                return true;
            }
        }
        self.spinning.store(false, Ordering::Release);
        polled
    }
}

/// `CAP_SYS_NICE`, include/uapi/linux/capability.h.
const CAP_SYS_NICE: u32 = 23;

/// Whether a thread of this process may go from `SCHED_IDLE` back to `SCHED_OTHER` at its nice
/// value: with `CAP_SYS_NICE`, or an `RLIMIT_NICE` that allows that nice value (the kernel's
/// rule, `can_nice`). Without either, a thread that polled would stay at idle priority.
pub fn may_leave_idle() -> bool {
    let cap_sys_nice = std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|caps| caps >> CAP_SYS_NICE & 1 == 1)
    });
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit to a live local; getpriority has no preconditions
    // (errno is not checked: -1 is a possible nice value, and a failure reads as nice -1,
    // the stricter answer).
    let (ok, nice) = unsafe { (libc::getrlimit(libc::RLIMIT_NICE, &mut lim) == 0, libc::getpriority(libc::PRIO_PROCESS, 0)) };
    cap_sys_nice || (ok && lim.rlim_cur >= (20 - i64::from(nice)) as libc::rlim_t)
}

/// `sched_setscheduler` of the calling thread to `policy` (`SCHED_IDLE` or `SCHED_OTHER`,
/// priority 0).
fn set_policy(policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a live local read by the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `threads` descriptors of the connection of `session` (a `/dev/fuse` descriptor whose INIT
/// was answered), one per serving thread ([`clone_fd`]).
pub fn clone_fds(session: BorrowedFd<'_>, threads: usize) -> io::Result<Vec<OwnedFd>> {
    (0..threads.max(1)).map(|_| clone_fd(session)).collect()
}

/// Starts one thread per descriptor of `fds` (descriptors of one connection whose INIT was
/// answered), waiting for requests as `spin` says ([`Wait`]). Returns once every thread has
/// its buffer and is about to read its first request: whatever a thread's start costs (its
/// stack, its first allocation) is paid before the device is used.
pub fn start(fds: Vec<OwnedFd>, dev: Arc<Device>, spin: Duration) -> io::Result<Threads> {
    let bytes = buffer_bytes(dev.max_request);
    let n = fds.len();
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no /dev/fuse descriptor to serve"));
    }
    let wait = Arc::new(Wait::new(spin));
    let gate = Arc::new(Gate::default());
    // A bounded channel's buffer is made here, so a thread's `send` allocates nothing.
    let (ready, up) = std::sync::mpsc::sync_channel::<()>(n);
    let mut handles = Vec::with_capacity(n);
    for (i, fd) in fds.into_iter().enumerate() {
        // Written (0x5a) so that the pages exist now, then locked: nothing on the I/O path
        // faults or allocates (the swap server also runs under mlockall).
        let buf = vec![0x5au8; bytes].into_boxed_slice();
        // SAFETY: mlock on memory this function owns (moved into the thread below, not
        // reallocated); failure (no privilege, RLIMIT_MEMLOCK) leaves it unlocked, which only
        // weakens the no-fault guarantee.
        unsafe { libc::mlock(buf.as_ptr().cast(), buf.len()) };
        let ctx = dev.store.context();
        let dev = Arc::clone(&dev);
        let wait = Arc::clone(&wait);
        let gate = Arc::clone(&gate);
        let ready = ready.clone();
        let t = std::thread::Builder::new().name(format!("fuse-{i}")).spawn(move || {
            let rejects = Rejects::new("compcache-fuse");
            compcache_store::make_stack_resident();
            let _ = ready.send(());
            drop(ready);
            serve(&fd, &dev, buf, ctx, &rejects, &wait, &gate)
        })?;
        handles.push(t);
    }
    drop(ready);
    for _ in 0..n {
        up.recv().map_err(|_| io::Error::other("a FUSE thread ended before serving"))?;
    }
    Ok(Threads { threads: handles, spin: wait.window(), gate })
}

/// A descriptor of the same connection: `FUSE_DEV_IOC_CLONE` on a fresh `/dev/fuse`, else (a
/// kernel before 4.5) a `dup`.
pub fn clone_fd(session: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let fresh = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let src = session.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the descriptor to clone) from the pointer,
    // which points at a live local.
    if unsafe { libc::ioctl(fresh.as_raw_fd(), FUSE_DEV_IOC_CLONE, &src) } == 0 {
        return Ok(fresh.into());
    }
    session.try_clone_to_owned()
}

/// The length of the fixed argument (`op_in`) that follows the header of a request with
/// `opcode` (include/uapi/linux/fuse.h, protocol 7.9 and later); the payload comes after it.
/// Operations the device does not answer have none: their requests get ENOSYS unread.
fn fixed_arg_len(opcode: u32) -> usize {
    match opcode {
        op::READ | op::READDIR => size_of::<abi::ReadIn>(),
        op::WRITE => size_of::<abi::WriteIn>(),
        op::SETATTR => size_of::<abi::SetattrIn>(),
        op::FALLOCATE => size_of::<abi::FallocateIn>(),
        // fuse_getattr_in, fuse_fsync_in: 16 bytes; fuse_open_in: 8; fuse_release_in,
        // fuse_flush_in: 24 (read by nobody, skipped so that the payload starts right).
        op::GETATTR | op::FSYNC | op::FSYNCDIR => 16,
        op::OPEN | op::OPENDIR => 8,
        op::RELEASE | op::RELEASEDIR | op::FLUSH => 24,
        _ => 0,
    }
}

/// What to do with the request of `n` bytes read into `buf`: `None` for requests that get no
/// reply; otherwise `(unique, at, result)`, the reply's body (`result`'s length) starting at
/// `buf[at]`.
fn answer(dev: &Device, ctx: &mut Context, rejects: &Rejects, buf: &mut [u8], n: usize) -> Option<(u64, usize, Result<usize, i32>)> {
    let hdr = size_of::<abi::InHeader>();
    if n < hdr {
        // The kernel never sends less than a header; nothing to answer.
        return None;
    }
    let inh: abi::InHeader = abi::read(&buf[..hdr]);
    match inh.opcode {
        op::FORGET | op::BATCH_FORGET | op::INTERRUPT | op::NOTIFY_REPLY => return None,
        op::DESTROY => return Some((inh.unique, 0, Ok(0))),
        _ => {}
    }
    let at = (hdr + fixed_arg_len(inh.opcode)).min(n);
    let (head, payload) = buf.split_at_mut(at);
    let result = dispatch(dev, ctx, rejects, &inh, &head[hdr..], n - at, payload);
    Some((inh.unique, at, result))
}

/// One thread: read a request, answer it, write the reply; until the connection ends.
fn serve(fd: &OwnedFd, dev: &Device, mut buf: Box<[u8]>, mut ctx: Context, rejects: &Rejects, wait: &Wait, gate: &Gate) -> io::Result<()> {
    // When this thread last answered a request (the spin window's start).
    let mut answered: Option<Instant> = None;
    loop {
        if let Some(t) = answered {
            wait.spin(fd, t);
        }
        // SAFETY: reads at most buf.len() bytes into the thread's own buffer.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Interrupted, or the request was aborted before we could read it.
                Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                // Unmounted or aborted: the connection is gone.
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(io::Error::new(e.kind(), format!("reading /dev/fuse: {e}"))),
            }
        }
        gate.busy.fetch_add(1, Ordering::SeqCst);
        if gate.stopping.load(Ordering::SeqCst) {
            // Handing over: this request stays unanswered, for the successor to be sent again.
            gate.busy.fetch_sub(1, Ordering::SeqCst);
            loop {
                std::thread::park();
            }
        }
        let answered_ok = match answer(dev, &mut ctx, rejects, &mut buf, n as usize) {
            None => Ok(true),
            Some((unique, at, result)) => {
                let (error, body) = match result {
                    Ok(len) => (0, &buf[at..at + len]),
                    Err(errno) => (-errno, &buf[at..at]),
                };
                reply(fd, unique, error, body, rejects)
            }
        };
        gate.busy.fetch_sub(1, Ordering::SeqCst);
        if !answered_ok? {
            return Ok(());
        }
        answered = (!wait.window.is_zero()).then(Instant::now);
    }
}

/// Writes one reply; `Ok(false)` when the connection is gone.
fn reply(fd: &OwnedFd, unique: u64, error: i32, body: &[u8], rejects: &Rejects) -> io::Result<bool> {
    let out = abi::OutHeader { len: (size_of::<abi::OutHeader>() + body.len()) as u32, error, unique };
    let head = abi::bytes(&out);
    let iov = [
        libc::iovec { iov_base: head.as_ptr() as *mut libc::c_void, iov_len: head.len() },
        libc::iovec { iov_base: body.as_ptr() as *mut libc::c_void, iov_len: body.len() },
    ];
    let count = if body.is_empty() { 1 } else { 2 };
    loop {
        // SAFETY: both iovecs point into live memory of the given lengths; writev only reads.
        if unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), count) } >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // The kernel no longer waits for this reply (the request was aborted).
            Some(libc::ENOENT) => return Ok(true),
            Some(libc::ENODEV) => return Ok(false),
            _ => {
                rejects.failed(|| format!("writing the reply to request {unique}: {e}"));
                return Ok(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::test_device;

    /// One serving thread's state, without the descriptor: requests are laid into its buffer
    /// as the kernel would and answered.
    struct Thread {
        dev: Device,
        ctx: Context,
        rejects: Rejects,
        buf: Vec<u8>,
    }

    impl Thread {
        fn new() -> Thread {
            let dev = test_device();
            let ctx = dev.store.context();
            let buf = vec![0u8; buffer_bytes(dev.max_request)];
            Thread { dev, ctx, rejects: Rejects::new("test"), buf }
        }

        /// A request as the kernel lays it out in the buffer (header, fixed argument, payload),
        /// answered.
        fn send(&mut self, opcode: u32, nodeid: u64, arg: &[u8], payload: &[u8]) -> Option<(u64, usize, Result<usize, i32>)> {
            let hdr = size_of::<abi::InHeader>();
            let len = hdr + arg.len() + payload.len();
            let h = abi::InHeader { len: len as u32, opcode, unique: 42, nodeid, ..abi::InHeader::default() };
            self.buf[..hdr].copy_from_slice(abi::bytes(&h));
            self.buf[hdr..hdr + arg.len()].copy_from_slice(arg);
            self.buf[hdr + arg.len()..len].copy_from_slice(payload);
            self.answer(len)
        }

        fn answer(&mut self, n: usize) -> Option<(u64, usize, Result<usize, i32>)> {
            answer(&self.dev, &mut self.ctx, &self.rejects, &mut self.buf, n)
        }
    }

    /// A descriptor to poll and the other end of its socket, to make it readable.
    fn socket() -> (OwnedFd, std::os::unix::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        (a.into(), b)
    }

    fn policy() -> libc::c_int {
        // SAFETY: pid 0 is the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_thread_polls_inside_its_window_one_at_a_time_and_serves_at_normal_policy() {
        if !may_leave_idle() {
            eprintln!("skipped: neither CAP_SYS_NICE nor RLIMIT_NICE lets a thread leave SCHED_IDLE");
            return;
        }
        let (fd, mut other) = socket();
        let hour = Duration::from_secs(3600);
        let wait = Wait::new(hour);
        assert_eq!(wait.window(), hour);
        // A request is there: the poll ends at once although the window is an hour long, and
        // the thread is back at its normal policy to serve it.
        std::io::Write::write_all(&mut other, b"x").unwrap();
        assert!(wait.spin(&fd, Instant::now()));
        assert_eq!(policy(), libc::SCHED_OTHER);
        assert!(!wait.spinning.load(Ordering::Relaxed));
        // Another thread polls already: this one goes to sleep in read instead.
        wait.spinning.store(true, Ordering::Relaxed);
        assert!(!wait.spin(&fd, Instant::now()));
        wait.spinning.store(false, Ordering::Relaxed);
        // The window since the last request is over (the device went idle): no poll.
        let long_ago = Instant::now().checked_sub(2 * hour).unwrap_or_else(Instant::now);
        if Instant::now().duration_since(long_ago) >= hour {
            assert!(!wait.spin(&fd, long_ago));
        }
        // Polling off (the default).
        assert!(!Wait::new(Duration::ZERO).spin(&fd, Instant::now()));
    }

    #[test]
    fn the_window_ends_a_poll_that_finds_nothing() {
        if !may_leave_idle() {
            eprintln!("skipped: neither CAP_SYS_NICE nor RLIMIT_NICE lets a thread leave SCHED_IDLE");
            return;
        }
        let (fd, _other) = socket();
        let wait = Wait::new(Duration::from_millis(2));
        assert!(wait.spin(&fd, Instant::now()));
        assert_eq!(policy(), libc::SCHED_OTHER);
        // The token is free for the next thread.
        assert!(!wait.spinning.load(Ordering::Relaxed));
    }

    #[test]
    fn the_buffer_holds_what_the_kernel_requires() {
        // fuse_dev_do_read: at least FUSE_MIN_READ_BUFFER and in_header + write_in + max_write.
        for max in [4096, 128 << 10, 1 << 20] {
            let b = buffer_bytes(max);
            assert!(b >= abi::FUSE_MIN_READ_BUFFER);
            assert!(b >= size_of::<abi::InHeader>() + size_of::<abi::WriteIn>() + max);
            // A read's reply body fits after the largest header + argument.
            assert!(b - size_of::<abi::InHeader>() - size_of::<abi::SetattrIn>() >= max);
        }
    }

    #[test]
    fn write_then_read_framed_as_on_dev_fuse() {
        let mut t = Thread::new();
        let data: Vec<u8> = (0..12288u32).map(|i| (i % 241) as u8 + 1).collect();
        let w = abi::WriteIn { offset: 8192, size: data.len() as u32, ..abi::WriteIn::default() };
        let (unique, at, r) = t.send(op::WRITE, 2, abi::bytes(&w), &data).unwrap();
        assert_eq!((unique, at), (42, 80));
        let len = r.unwrap();
        assert_eq!(abi::read::<abi::WriteOut>(&t.buf[at..at + len]).size, data.len() as u32);

        let rd = abi::ReadIn { offset: 8192, size: data.len() as u32, ..abi::ReadIn::default() };
        let (_, at, r) = t.send(op::READ, 2, abi::bytes(&rd), &[]).unwrap();
        assert_eq!(t.buf[at..at + r.unwrap()], data[..]);

        // The largest read the kernel may send fits in the buffer after its header.
        let max = t.dev.max_request;
        let rd = abi::ReadIn { offset: 0, size: max as u32, ..abi::ReadIn::default() };
        assert_eq!(t.send(op::READ, 2, abi::bytes(&rd), &[]).unwrap().2, Ok(max));
    }

    #[test]
    fn a_resent_request_is_answered_with_its_unique_as_read() {
        // After FUSE_NOTIFY_RESEND the kernel sets FUSE_UNIQUE_RESEND in `unique` and matches
        // the reply on the whole value (fuse_request_find).
        let mut t = Thread::new();
        let hdr = size_of::<abi::InHeader>();
        let rd = abi::ReadIn { offset: 0, size: 4096, ..abi::ReadIn::default() };
        let len = hdr + size_of::<abi::ReadIn>();
        let unique = abi::FUSE_UNIQUE_RESEND | 0x1234;
        let h = abi::InHeader { len: len as u32, opcode: op::READ, unique, nodeid: 2, ..abi::InHeader::default() };
        t.buf[..hdr].copy_from_slice(abi::bytes(&h));
        t.buf[hdr..len].copy_from_slice(abi::bytes(&rd));
        let (got, _, r) = t.answer(len).unwrap();
        assert_eq!((got, r), (unique, Ok(4096)));
    }

    #[test]
    fn a_lookup_name_follows_the_header() {
        let mut t = Thread::new();
        let (_, at, r) = t.send(op::LOOKUP, 1, &[], b"device\0").unwrap();
        let e: abi::EntryOut = abi::read(&t.buf[at..at + r.unwrap()]);
        assert_eq!((e.nodeid, e.attr.size), (2, 1 << 20));
        assert_eq!(t.send(op::LOOKUP, 1, &[], b"devicf\0").unwrap().2, Err(libc::ENOENT));
    }

    #[test]
    fn requests_without_replies_and_short_reads() {
        let mut t = Thread::new();
        for opcode in [op::FORGET, op::BATCH_FORGET, op::INTERRUPT, op::NOTIFY_REPLY] {
            assert!(t.send(opcode, 2, &[0; 16], &[]).is_none(), "opcode {opcode}");
        }
        assert!(t.answer(10).is_none());
        assert_eq!(t.send(op::DESTROY, 0, &[], &[]).unwrap().2, Ok(0));
        // A write whose request is shorter than its fixed argument: nothing past the end is read.
        assert!(t.send(op::WRITE, 2, &[0; 20], &[]).is_some());
        assert_eq!(t.dev.store.stats().num_writes, 0);
    }
}
