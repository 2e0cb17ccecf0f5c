//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, host-wide switch
//! `/sys/module/fuse/parameters/enable_uring`): the transport that carries the device file's
//! requests and replies through io_uring instead of `read`/`writev` on `/dev/fuse`.
//!
//! Protocol (kernel `Documentation/filesystems/fuse/fuse-io-uring.rst`,
//! `include/uapi/linux/fuse.h`, `fs/fuse/dev_uring.c`; structures in [`crate::abi`]):
//! - INIT (answered by fuser on the classic descriptor) must have negotiated
//!   `FUSE_OVER_IO_URING`; [`crate::fs::InitFs`] asks for it and records the answer.
//! - The kernel has one queue per possible CPU (`num_possible_cpus()`); a request goes to the
//!   queue of the CPU its sender runs on. Here each queue has its own thread and its own
//!   io_uring with 128-byte SQEs (`IORING_SETUP_SQE128`: the command is
//!   `struct fuse_uring_cmd_req` in the SQE's 80-byte command area).
//! - Each queue has `depth` entries; an entry is a header buffer (`struct
//!   fuse_uring_req_header`, 288 bytes) and a payload buffer of at least
//!   max(`FUSE_MIN_READ_BUFFER`, `max_write`, `max_pages` pages). All are allocated, written
//!   and `mlock`ed when the queue starts, and handed to the kernel once, by one
//!   `FUSE_IO_URING_CMD_REGISTER` per entry (`IORING_OP_URING_CMD` on a `/dev/fuse` descriptor
//!   of the connection, `sqe->addr` = two iovecs, header then payload, `sqe->len` = 2).
//! - Only when every queue has an entry does the kernel switch the connection to the rings;
//!   until then (and always for FORGET and INTERRUPT) requests come through `/dev/fuse`, which
//!   the classic threads ([`crate::classic`]) keep serving.
//! - A request arrives as the completion of the entry's last command: `in_out` holds the
//!   `fuse_in_header`, `op_in` the operation's fixed argument, the payload buffer the rest
//!   (`ring_ent_in_out.payload_sz` bytes: a write's data, a lookup's name). The reply goes in
//!   the same buffers (`fuse_out_header` in `in_out`, the body in the payload,
//!   `ring_ent_in_out.payload_sz` its length), and one `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`
//!   (with `commit_id` from the request) both completes it and re-arms the entry.
//! - At unmount (or abort) the kernel ends every entry's command with an error (ENOTCONN);
//!   a queue thread ends when all its entries have.
//!
//! What the I/O path does per request: no allocation, no system call besides the one
//! `io_uring_enter` that submits the replies and waits (several replies per call under load).
//! A read's data is decompressed straight into the entry's payload buffer, a write's data is
//! compressed straight from it: no copy between buffers on our side.
//!
//! The queue threads are started by the thread that mounted, after the swap server's
//! `PR_SET_IO_FLUSHER` and `mlockall`, so they inherit both (as the classic threads do); each is
//! pinned to its queue's CPU (`pin_to_cpu`).
//!
//! Locking: each queue's ring, entries and compression context belong to its thread alone;
//! the store is shared (`Store` is `Sync`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use compcache_log::Rejects;
use compcache_store::{Context, PAGE_SIZE};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::abi;
use crate::answer::{dispatch, Device};

/// `sqe->len` lies at this byte offset of an SQE (`struct io_uring_sqe`: opcode, flags, ioprio,
/// fd, off, addr, then len).
const SQE_LEN_OFFSET: usize = 24;

/// The queue threads serving the rings.
pub struct Rings {
    threads: Vec<JoinHandle<()>>,
    served: Arc<AtomicU64>,
}

impl Rings {
    /// Requests answered through the rings so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Waits for the queue threads; they end when the connection is torn down (unmount).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The number of queues the kernel makes: one per possible CPU.
pub fn kernel_queues() -> usize {
    // "0-3" or "0"; the kernel's num_possible_cpus() for contiguous ids.
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| s.trim().rsplit(['-', ',']).next().and_then(|n| n.parse::<usize>().ok()))
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |last| last + 1)
}

/// Whether the kernel lets a FUSE server negotiate io_uring: `Ok(true)` when the module
/// parameter exists and is `Y`, `Ok(false)` when it exists and is `N`, `Err` with the reason
/// when the kernel has no FUSE over io_uring at all.
pub fn kernel_enabled() -> Result<bool, String> {
    match std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring") {
        Ok(s) => Ok(s.trim() == "Y"),
        Err(_) => Err("this kernel has no FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING)".into()),
    }
}

/// Starts one thread per kernel queue, each registering `depth` entries with payload buffers
/// that hold the device's largest request (`dev.max_request`), on `fd` (a `/dev/fuse` descriptor of the mounted connection, which
/// negotiated `FUSE_OVER_IO_URING`). Returns once every entry is registered, or the first
/// error (then the connection stays on `/dev/fuse`: the kernel switches only when all queues
/// have entries).
pub fn start(fd: OwnedFd, dev: Arc<Device>, depth: usize) -> io::Result<Rings> {
    let fd = Arc::new(fd);
    let queues = kernel_queues();
    let payload_bytes = dev.max_request.max(abi::FUSE_MIN_READ_BUFFER).next_multiple_of(PAGE_SIZE);
    let (tx, rx) = mpsc::channel::<io::Result<()>>();
    let served = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::with_capacity(queues);
    for qid in 0..queues {
        let (fd, dev, tx, served) = (Arc::clone(&fd), Arc::clone(&dev), tx.clone(), Arc::clone(&served));
        let t = std::thread::Builder::new().name(format!("fuse-uring-{qid}")).spawn(move || {
            pin_to_cpu(qid);
            compcache_store::make_stack_resident();
            let mut q = match Queue::new(qid as u16, &fd, &dev, &served, depth.max(1), payload_bytes) {
                Ok(q) => q,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let registered = q.register();
            let ok = registered.is_ok();
            let _ = tx.send(registered);
            if ok {
                q.serve();
            }
        })?;
        threads.push(t);
    }
    drop(tx);
    let mut first_err = None;
    for _ in 0..queues {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(io::Error::other("a FUSE io_uring queue thread ended before registering"));
            }
        }
    }
    match first_err {
        // The threads that did register stay until the unmount ends their entries.
        Some(e) => Err(e),
        None => Ok(Rings { threads, served }),
    }
}

/// Runs the calling thread on CPU `cpu` only (best effort: an offline CPU, or one outside
/// the process's allowed set, leaves it unpinned). The kernel puts a request on the queue of
/// the CPU its sender runs on, so queue `cpu`'s thread is woken on that CPU, and the kernel's
/// copy of the request into the entry (task work in this thread) runs there too, as libfuse
/// pins its ring threads.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it for
    // cpu < CPU_SETSIZE (checked); sched_setaffinity(0, ..) applies to the calling thread and
    // only reads the set.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// One kernel queue: its ring, entries and compression context.
struct Queue<'a> {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    fd: &'a OwnedFd,
    dev: &'a Device,
    served: &'a AtomicU64,
    ctx: Context,
    /// `depth` header buffers. Written by the kernel while an entry's command is in flight
    /// and by this thread only between its completion and the next commit, so accesses go
    /// through raw pointers, never through references held across a submission.
    headers: *mut abi::UringReqHeader,
    /// `depth` payload buffers of `payload_bytes`, one allocation (same access rule).
    payloads: *mut u8,
    payload_bytes: usize,
    /// The REGISTER commands' iovecs (header, payload per entry), kept for the queue's life.
    iovecs: Box<[[libc::iovec; 2]]>,
    /// Backing storage of `headers` and `payloads` (owned here, freed on drop after the ring).
    _header_mem: Box<[abi::UringReqHeader]>,
    _payload_mem: Box<[u8]>,
    depth: usize,
    /// Entries whose command the kernel has not ended with an error.
    live: usize,
    rejects: Rejects,
}

impl<'a> Queue<'a> {
    fn new(qid: u16, fd: &'a OwnedFd, dev: &'a Device, served: &'a AtomicU64, depth: usize, payload_bytes: usize) -> io::Result<Queue<'a>> {
        // 128-byte SQEs (the builder sets IORING_SETUP_SQE128 for Entry128). Task work (the
        // kernel copying a request into an entry) runs when this thread enters the kernel to
        // wait, which it does whenever it has nothing to do.
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_coop_taskrun()
            .setup_defer_taskrun()
            .setup_cqsize((depth * 2) as u32)
            .build(depth.next_power_of_two() as u32)?;
        // Written (0x5a) so that the pages exist now, then locked: nothing on the I/O path
        // faults or allocates. (The swap server also runs under mlockall.)
        let mut header_mem = vec![abi::UringReqHeader::default(); depth].into_boxed_slice();
        let mut payload_mem = vec![0x5au8; depth * payload_bytes].into_boxed_slice();
        for (p, len) in [
            (header_mem.as_ptr().cast::<libc::c_void>(), size_of_val(&*header_mem)),
            (payload_mem.as_ptr().cast::<libc::c_void>(), payload_mem.len()),
        ] {
            // SAFETY: mlock on memory this queue owns; failure (no privilege, RLIMIT_MEMLOCK)
            // leaves it unlocked, which only weakens the no-fault guarantee (as without mlockall).
            unsafe { libc::mlock(p, len) };
        }
        let headers = header_mem.as_mut_ptr();
        let payloads = payload_mem.as_mut_ptr();
        let iovecs = (0..depth)
            .map(|i| {
                // SAFETY: i < depth, so both offsets lie within the allocations above.
                let (h, p) = unsafe { (headers.add(i), payloads.add(i * payload_bytes)) };
                [
                    libc::iovec { iov_base: h.cast(), iov_len: size_of::<abi::UringReqHeader>() },
                    libc::iovec { iov_base: p.cast(), iov_len: payload_bytes },
                ]
            })
            .collect();
        Ok(Queue {
            qid,
            ring,
            fd,
            dev,
            served,
            ctx: dev.store.context(),
            headers,
            payloads,
            payload_bytes,
            iovecs,
            _header_mem: header_mem,
            _payload_mem: payload_mem,
            depth,
            live: 0,
            rejects: Rejects::new("compcache-fuse-uring"),
        })
    }

    /// An `IORING_OP_URING_CMD` SQE for entry `idx` with `cmd`.
    fn sqe(&self, idx: usize, cmd_op: u32, cmd: &abi::UringCmdReq, iov: Option<&[libc::iovec; 2]>) -> squeue::Entry128 {
        let mut b = opcode::UringCmd80::new(types::Fd(self.fd.as_raw_fd()), cmd_op).cmd(cmd.to_cmd());
        if let Some(iov) = iov {
            b = b.addr(Some(iov.as_ptr() as u64));
        }
        let mut sqe = b.build().user_data(idx as u64);
        if iov.is_some() {
            // io-uring 0.7's UringCmd80 has no `len` setter; REGISTER needs sqe->len = 2 (the
            // number of iovecs).
            // SAFETY: Entry128 is #[repr(C)] of a 64-byte `struct io_uring_sqe` and 64 bytes
            // of command data, all plain integers (no padding, any bit pattern valid);
            // SQE_LEN_OFFSET + 4 <= 64 (checked by the test `register_sqe_layout`).
            unsafe {
                let p = (&mut sqe as *mut squeue::Entry128).cast::<u8>().add(SQE_LEN_OFFSET);
                std::ptr::write_unaligned(p.cast::<u32>(), 2);
            }
        }
        sqe
    }

    /// One REGISTER per entry; errors the kernel reports at once (EOPNOTSUPP when io_uring
    /// was not negotiated, EINVAL for a payload buffer smaller than it requires) fail this.
    fn register(&mut self) -> io::Result<()> {
        let cmd = abi::UringCmdReq { qid: self.qid, ..abi::UringCmdReq::default() };
        for idx in 0..self.depth {
            let sqe = self.sqe(idx, abi::FUSE_IO_URING_CMD_REGISTER, &cmd, Some(&self.iovecs[idx]));
            // SAFETY: the iovecs and the buffers they point to live as long as the queue
            // (which outlives the ring's use of them: the kernel ends every entry at unmount,
            // and the ring is dropped, cancelling what remains, before the buffers).
            unsafe { self.ring.submission().push(&sqe) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
            self.live += 1;
        }
        self.ring.submit()?;
        // A REGISTER that succeeded posts nothing until a request arrives; one that failed
        // completes at once with the error.
        let mut err = None;
        let mut ready = Vec::new();
        for cqe in self.ring.completion() {
            if cqe.result() < 0 {
                self.live -= 1;
                err.get_or_insert(io::Error::from_raw_os_error(-cqe.result()));
            } else {
                ready.push(cqe.user_data() as usize);
            }
        }
        if let Some(e) = err {
            return Err(io::Error::new(e.kind(), format!("FUSE_IO_URING_CMD_REGISTER on queue {}: {e}", self.qid)));
        }
        for idx in ready {
            self.answer(idx)?;
        }
        Ok(())
    }

    /// Serves requests until the kernel has ended every entry.
    fn serve(&mut self) {
        while self.live > 0 {
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                compcache_log::error("compcache-fuse", &format!("io_uring queue {}: io_uring_enter: {e}; the queue stops", self.qid));
                return;
            }
            // Completions are taken one at a time so that the completion queue is not
            // borrowed while replies are pushed to the submission queue.
            loop {
                let Some(cqe) = self.ring.completion().next() else { break };
                let idx = cqe.user_data() as usize;
                if cqe.result() < 0 {
                    // ENOTCONN/ECANCELED at teardown: the entry is gone.
                    self.live -= 1;
                    continue;
                }
                if idx >= self.depth || self.answer(idx).is_err() {
                    self.live -= 1;
                }
            }
        }
    }

    /// Answers the request in entry `idx` and queues its COMMIT_AND_FETCH.
    fn answer(&mut self, idx: usize) -> io::Result<()> {
        // SAFETY: idx < depth; the kernel wrote the header before completing the command and
        // does not touch it again until the commit below.
        let hdr = unsafe { std::ptr::read_volatile(self.headers.add(idx)) };
        let inh: abi::InHeader = abi::read(&hdr.in_out);
        let ent = hdr.ring_ent_in_out;
        // SAFETY: the entry's payload buffer, payload_bytes long, owned by this queue; the
        // kernel does not access it until the commit.
        let payload = unsafe { std::slice::from_raw_parts_mut(self.payloads.add(idx * self.payload_bytes), self.payload_bytes) };
        let in_len = (ent.payload_sz as usize).min(payload.len());
        let (error, out_len) = match dispatch(self.dev, &mut self.ctx, &self.rejects, &inh, &hdr.op_in, in_len, payload) {
            Ok(n) => (0, n),
            Err(errno) => (-errno, 0),
        };
        let out = abi::OutHeader { len: (size_of::<abi::OutHeader>() + out_len) as u32, error, unique: inh.unique };
        let mut reply = abi::UringReqHeader::default();
        reply.in_out[..size_of::<abi::OutHeader>()].copy_from_slice(abi::bytes(&out));
        reply.ring_ent_in_out = abi::UringEntInOut { payload_sz: out_len as u32, ..ent };
        // SAFETY: as above; the kernel reads it after the commit is submitted.
        unsafe { std::ptr::write_volatile(self.headers.add(idx), reply) };
        let cmd = abi::UringCmdReq { commit_id: ent.commit_id, qid: self.qid, ..abi::UringCmdReq::default() };
        let sqe = self.sqe(idx, abi::FUSE_IO_URING_CMD_COMMIT_AND_FETCH, &cmd, None);
        // SAFETY: the SQE refers to no memory beyond the entry's registered buffers.
        while unsafe { self.ring.submission().push(&sqe) }.is_err() {
            // Full (more replies than SQ slots between two submissions): flush them.
            self.ring.submit()?;
        }
        self.served.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_sqe_layout() {
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(1);
        let Ok(_ring) = ring else { return }; // io_uring disabled (sysctl): nothing to check against
        let iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
        let cmd = abi::UringCmdReq { qid: 1, ..abi::UringCmdReq::default() };
        let sqe = opcode::UringCmd80::new(types::Fd(fd.as_raw_fd()), abi::FUSE_IO_URING_CMD_REGISTER)
            .cmd(cmd.to_cmd())
            .addr(Some(iov.as_ptr() as u64))
            .build();
        // SAFETY: reading the bytes of a #[repr(C)] plain-integer struct.
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        // addr (8 bytes before len) carries the iovec pointer; len is still 0 for us to set.
        assert_eq!(raw[SQE_LEN_OFFSET - 8..SQE_LEN_OFFSET], (iov.as_ptr() as u64).to_ne_bytes());
        assert_eq!(raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4], [0; 4]);
        // cmd_op (opcode REGISTER) at offset 8; the command area starts at byte 48.
        assert_eq!(raw[48 + 16..48 + 18], 1u16.to_ne_bytes());
    }
}
