//! A request: what it is ([`Command`]), whether it may be served ([`validate`], which
//! rejects with a [`Reject`]), and serving it ([`execute`], the one place requests reach the
//! store). Pure functions of the request, the device size and what the handshake negotiated:
//! no socket, no lock, so each is tested on its own.
//!
//! Rule 1 of [`super`] is defined here: a request is validated completely (command, flags,
//! length, range) before anything is done with it.

use crate::handshake::Negotiated;
use crate::meta;
use crate::wire::*;
use crate::MAX_PAYLOAD_BYTES;
use compcache_store::{Context, Store, StoreError};

/// A validated request: what to do, nothing left to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    /// `base:allocation` of a range (only once negotiated).
    BlockStatus,
    Disconnect,
}

impl Command {
    /// Whether the command changes the device: what a later FLUSH waits for (the module docs
    /// of [`super`], "FUA and FLUSH"). The one definition; the in-flight state keeps the
    /// modifying requests by it.
    pub fn modifies(self) -> bool {
        matches!(self, Command::Write | Command::WriteZeroes | Command::Trim)
    }
}

/// A request refused by validation, with the protocol error to reply and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub error: u32,
    pub reason: String,
}

fn reject<T>(error: u32, reason: String) -> Result<T, Reject> {
    Err(Reject { error, reason })
}

/// Checks everything about a request before anything is done with it, for a connection that
/// negotiated `neg`.
pub fn validate(req: &Request, disksize_bytes: u64, neg: &Negotiated) -> Result<Command, Reject> {
    let name = command_name(req.cmd);
    let (cmd, allowed_flags) = match req.cmd {
        // DF is valid once advertised, with structured replies; a READ is one chunk anyway.
        CMD_READ if neg.structured_replies => (Command::Read, CMD_FLAG_FUA | CMD_FLAG_DF),
        CMD_READ => (Command::Read, CMD_FLAG_FUA),
        CMD_WRITE => (Command::Write, CMD_FLAG_FUA),
        CMD_DISC => return Ok(Command::Disconnect),
        CMD_FLUSH => (Command::Flush, CMD_FLAG_FUA),
        CMD_TRIM => (Command::Trim, CMD_FLAG_FUA),
        CMD_WRITE_ZEROES => (Command::WriteZeroes, CMD_FLAG_FUA | CMD_FLAG_NO_HOLE),
        CMD_BLOCK_STATUS if neg.base_allocation => (Command::BlockStatus, CMD_FLAG_FUA | CMD_FLAG_REQ_ONE),
        CMD_BLOCK_STATUS => {
            return reject(
                EINVAL,
                format!("{name} without a metadata context: select {:?} with NBD_OPT_SET_META_CONTEXT first", meta::BASE_ALLOCATION),
            )
        }
        CMD_CACHE => return reject(EINVAL, format!("{name} is not supported (this server does not advertise it)")),
        other => return reject(EINVAL, format!("unknown command {other}")),
    };
    // FUA is valid on every command once SEND_FUA is advertised (the spec: accept, even by
    // ignoring it); anything else must be documented for the command.
    let bad_flags = req.flags & !allowed_flags;
    if bad_flags != 0 {
        return reject(EINVAL, format!("flags {bad_flags:#x} are not valid for {name}"));
    }
    if cmd == Command::Flush {
        if req.offset != 0 || req.len != 0 {
            return reject(EINVAL, format!("FLUSH with offset {} length {}: both must be 0", req.offset, req.len));
        }
        return Ok(cmd);
    }
    if req.len == 0 {
        return reject(EINVAL, format!("{name} of length 0 at offset {}", req.offset));
    }
    if matches!(cmd, Command::Read | Command::Write) && req.len > MAX_PAYLOAD_BYTES {
        return reject(EINVAL, format!("{name} of {} bytes is above the maximum payload of {MAX_PAYLOAD_BYTES}", req.len));
    }
    if req.offset > disksize_bytes || req.len as u64 > disksize_bytes - req.offset {
        // The spec's choice of error: ENOSPC for writing past the end, EINVAL for the rest.
        let error = if matches!(cmd, Command::Write | Command::WriteZeroes) { ENOSPC } else { EINVAL };
        return reject(
            error,
            format!("{name} at offset {} length {} reaches past the end of the {disksize_bytes}-byte device", req.offset, req.len),
        );
    }
    Ok(cmd)
}

/// A request read and admitted by a worker, served by that same worker.
pub(super) struct Job {
    pub(super) req: Request,
    pub(super) cmd: Command,
    /// Position in the connection's request stream (from 1), for FLUSH ordering.
    pub(super) seq: u64,
}

impl Job {
    /// Bytes of buffer the request holds while in flight (payload in, or data out): what the
    /// in-flight budget counts, and the room its worker's buffer gives it.
    pub(super) fn cost(&self) -> usize {
        match self.cmd {
            Command::Read | Command::Write => self.req.len as usize,
            Command::BlockStatus => self.descriptor_room(),
            _ => 0,
        }
    }

    /// Buffer bytes a BLOCK_STATUS reply's descriptors may take.
    fn descriptor_room(&self) -> usize {
        meta::descriptor_room(self.req.offset, self.req.len, self.req.flags & CMD_FLAG_REQ_ONE != 0)
    }
}

/// The one place requests reach the store: one call per command, and for a modifying command
/// with FUA a `Store::flush` after it ([`super`], "FUA and FLUSH"). `data` is the READ
/// destination, the WRITE payload, or room for BLOCK_STATUS's descriptors; returns how many
/// bytes of it the reply carries.
pub(super) fn execute(store: &Store, ctx: &mut Context, job: &Job, data: &mut [u8]) -> Result<usize, StoreError> {
    let (offset, len) = (job.req.offset, job.req.len as u64);
    let reply_bytes = match job.cmd {
        Command::Read => store.read(ctx, offset, data).map(|()| data.len()),
        Command::Write => store.write(ctx, offset, data).map(|()| 0),
        Command::Flush => store.flush().map(|()| 0),
        Command::Trim => store.discard(offset, len).map(|()| 0),
        Command::WriteZeroes => store.write_zeroes(ctx, offset, len).map(|()| 0),
        // As many extents as `data` has room for (one with REQ_ONE): the spec lets a reply
        // cover less than the range. None reaches past the range (the spec would allow it).
        Command::BlockStatus => store.block_status(offset, len).map(|extents| meta::encode_extents(data, extents)),
        Command::Disconnect => unreachable!("NBD_CMD_DISC ends the reading; it is never served"),
    }?;
    if needs_flush_after(job) {
        store.flush()?;
    }
    Ok(reply_bytes)
}

/// Whether `job` is a modifying command with FUA: its reply must wait until it is durable, so
/// it is followed by `Store::flush` (a no-op but in cache mode, where it is the origin's
/// fdatasync). FUA on a READ or BLOCK_STATUS asks nothing (the spec lets a server ignore it).
fn needs_flush_after(job: &Job) -> bool {
    job.cmd.modifies() && job.req.flags & CMD_FLAG_FUA != 0
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A backing device in memory that counts the calls made to it.
    struct CountingDevice {
        bytes: parking_lot::Mutex<Vec<u8>>,
        calls: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl CountingDevice {
        fn count(&self) {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl compcache_store::BackingDevice for CountingDevice {
        fn size_bytes(&self) -> u64 {
            self.bytes.lock().len() as u64
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.count();
            buf.copy_from_slice(&self.bytes.lock()[offset as usize..][..buf.len()]);
            Ok(())
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
            self.count();
            self.bytes.lock()[offset as usize..][..buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn discard(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
            self.count();
            Ok(())
        }
        fn discard_all(&self) -> std::io::Result<()> {
            Ok(()) // the store's close at drop, not a request
        }
        fn describe(&self) -> String {
            "memory".into()
        }
    }

    /// FUA and FLUSH ask for what every reply already guarantees (the write is in the store,
    /// and later reads find it), also with a backing device, whose records die with the
    /// server: they cost no device I/O (no fsync: the index is in RAM, so it would make
    /// nothing durable; docs/backing.md, "Flush and FUA").
    #[test]
    fn fua_and_flush_cost_no_backing_device_io_and_writes_are_read_back() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let dev = CountingDevice { bytes: parking_lot::Mutex::new(vec![0; 8 << 20]), calls: calls.clone() };
        let mut cfg = compcache_store::Config::with_disksize(1 << 20);
        cfg.backing = Some(compcache_store::BackingConfig::new("memory"));
        let store = Store::with_backing_device(cfg, Box::new(dev)).unwrap();
        let mut ctx = store.context();
        let count = || calls.load(std::sync::atomic::Ordering::Relaxed);
        let job = |cmd, flags| Job { req: req(0, flags, 0, 4096), cmd, seq: 1 };
        for cmd in [Command::Write, Command::WriteZeroes, Command::Trim, Command::Write] {
            let mut data = vec![7u8; 4096];
            execute(&store, &mut ctx, &job(cmd, CMD_FLAG_FUA), &mut data).unwrap();
            execute(&store, &mut ctx, &job(Command::Flush, 0), &mut []).unwrap();
        }
        assert_eq!(count(), 0, "FUA and FLUSH issued device I/O");
        let mut back = vec![0u8; 4096];
        execute(&store, &mut ctx, &job(Command::Read, CMD_FLAG_FUA), &mut back).unwrap();
        assert_eq!(back, vec![7u8; 4096], "the FUA write is what later reads see");
    }

    /// In cache mode FUA on a modifying command is the command, then the origin's sync, before
    /// the reply; without FUA, and on a READ or BLOCK_STATUS, no sync; FLUSH is one sync; a
    /// failed sync fails the request with EIO.
    #[test]
    fn fua_syncs_the_origin_after_modifying_commands_in_cache_mode() {
        use std::sync::atomic::Ordering;
        let origin = compcache_store::testing::FaultyOrigin::memory(1 << 20, &[]);
        let faults = origin.faults();
        let (syncs, fail_sync) = (&faults.syncs, &faults.fail_syncs);
        let mut cfg = compcache_store::Config::with_disksize(1 << 20);
        cfg.mem_limit_bytes = 1 << 20;
        cfg.origin = Some(compcache_store::OriginConfig::new("memory"));
        let store = Store::with_origin(cfg, Box::new(origin)).unwrap();
        assert!(store.is_cache());
        let mut ctx = store.context();
        let mut synced = |cmd, flags| {
            let before = syncs.load(Ordering::Relaxed);
            let mut data = vec![9u8; 4096];
            execute(&store, &mut ctx, &Job { req: req(0, flags, 8192, 4096), cmd, seq: 1 }, &mut data).unwrap();
            syncs.load(Ordering::Relaxed) - before
        };
        for cmd in [Command::Write, Command::WriteZeroes, Command::Trim] {
            assert_eq!(synced(cmd, CMD_FLAG_FUA), 1, "{cmd:?} with FUA");
            assert_eq!(synced(cmd, 0), 0, "{cmd:?} without FUA");
        }
        assert_eq!(synced(Command::Read, CMD_FLAG_FUA), 0, "FUA on a read asks nothing");
        let flush = Job { req: req(0, 0, 0, 0), cmd: Command::Flush, seq: 1 };
        let before = syncs.load(Ordering::Relaxed);
        execute(&store, &mut ctx, &flush, &mut []).unwrap();
        assert_eq!(syncs.load(Ordering::Relaxed) - before, 1, "FLUSH");
        assert_eq!(store.stats().origin_syncs, syncs.load(Ordering::Relaxed), "the store counts the origin's syncs");

        fail_sync.store(true, Ordering::Relaxed);
        let mut data = vec![7u8; 4096];
        let e = execute(&store, &mut ctx, &Job { req: req(0, CMD_FLAG_FUA, 0, 4096), cmd: Command::Write, seq: 1 }, &mut data).unwrap_err();
        assert_eq!(e.errno(), libc::EIO, "a failed sync fails the FUA write: {e}");
        assert_eq!(execute(&store, &mut ctx, &flush, &mut []).unwrap_err().errno(), libc::EIO);
        // Without FUA the write does not wait for the origin's sync, and succeeds.
        execute(&store, &mut ctx, &Job { req: req(0, 0, 0, 4096), cmd: Command::Write, seq: 1 }, &mut data).unwrap();
    }

    pub(in crate::transmission) fn req(cmd: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request { flags, cmd, handle: 7, offset, len }
    }

    const SIZE: u64 = 1 << 20;
    /// A connection that negotiated nothing.
    const NONE: Negotiated = Negotiated { structured_replies: false, base_allocation: false };
    const STRUCTURED: Negotiated = Negotiated { structured_replies: true, base_allocation: false };
    const BLOCK_STATUS: Negotiated = Negotiated { structured_replies: true, base_allocation: true };

    #[test]
    fn negotiation_decides_df_and_block_status() {
        let df = req(CMD_READ, CMD_FLAG_DF, 0, 4096);
        assert!(validate(&df, SIZE, &NONE).unwrap_err().reason.contains("flags 0x4"), "DF needs structured replies");
        assert_eq!(validate(&df, SIZE, &STRUCTURED), Ok(Command::Read));

        let bs = req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 4096, u32::MAX);
        let e = validate(&bs, 1 << 33, &STRUCTURED).unwrap_err();
        assert_eq!(e.error, EINVAL, "no context selected");
        assert!(e.reason.contains("NBD_OPT_SET_META_CONTEXT"), "{}", e.reason);
        assert_eq!(validate(&bs, 1 << 33, &BLOCK_STATUS), Ok(Command::BlockStatus), "no payload limit: a range of 4 GiB");
        assert_eq!(validate(&req(CMD_BLOCK_STATUS, 0, SIZE - 1, 2), SIZE, &BLOCK_STATUS).unwrap_err().error, EINVAL, "past the end");
        assert_eq!(validate(&req(CMD_BLOCK_STATUS, 0, 0, 0), SIZE, &BLOCK_STATUS).unwrap_err().error, EINVAL, "length 0");
        assert!(validate(&req(CMD_BLOCK_STATUS, CMD_FLAG_DF, 0, 1), SIZE, &BLOCK_STATUS).is_err(), "DF is for READ");
        assert!(validate(&req(CMD_WRITE, CMD_FLAG_REQ_ONE, 0, 1), SIZE, &BLOCK_STATUS).is_err(), "REQ_ONE is for BLOCK_STATUS");
        assert_eq!(
            (
                job(Command::BlockStatus, 1, 1 << 20).cost(),
                Job { req: req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20), cmd: Command::BlockStatus, seq: 1 }.cost()
            ),
            (256 * meta::DESCRIPTOR_BYTES, meta::DESCRIPTOR_BYTES),
            "a BLOCK_STATUS holds room for its descriptors in the budget"
        );
    }

    pub(in crate::transmission) fn job(cmd: Command, seq: u64, len: u32) -> Job {
        Job { req: req(0, 0, 0, len), cmd, seq }
    }

    #[test]
    fn valid_requests_pass() {
        assert_eq!(validate(&req(CMD_READ, 0, 0, 4096), SIZE, &NONE), Ok(Command::Read));
        assert_eq!(validate(&req(CMD_WRITE, CMD_FLAG_FUA, SIZE - 1, 1), SIZE, &NONE), Ok(Command::Write));
        assert_eq!(validate(&req(CMD_READ, 0, 3, 5), SIZE, &NONE), Ok(Command::Read), "unaligned is served");
        assert_eq!(validate(&req(CMD_FLUSH, 0, 0, 0), SIZE, &NONE), Ok(Command::Flush));
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, SIZE as u32), SIZE, &NONE), Ok(Command::Trim));
        assert_eq!(validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FUA, 4096, 8192), SIZE, &NONE), Ok(Command::WriteZeroes));
        assert_eq!(validate(&req(CMD_DISC, 0, 0, 0), SIZE, &NONE), Ok(Command::Disconnect));
    }

    #[test]
    fn out_of_range_gets_the_spec_errors() {
        let e = validate(&req(CMD_READ, 0, SIZE - 4095, 4096), SIZE, &NONE).unwrap_err();
        assert_eq!(e.error, EINVAL);
        assert!(e.reason.contains("past the end"), "{}", e.reason);
        assert_eq!(validate(&req(CMD_WRITE, 0, SIZE, 1), SIZE, &NONE).unwrap_err().error, ENOSPC);
        assert_eq!(validate(&req(CMD_WRITE_ZEROES, 0, u64::MAX, 1), SIZE, &NONE).unwrap_err().error, ENOSPC, "no overflow");
        assert_eq!(validate(&req(CMD_TRIM, 0, SIZE + 1, 0x10), SIZE, &NONE).unwrap_err().error, EINVAL);
    }

    #[test]
    fn bad_commands_flags_and_lengths_are_einval() {
        assert!(validate(&req(99, 0, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("unknown command 99"));
        assert!(validate(&req(CMD_BLOCK_STATUS, 0, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("without a metadata context"));
        assert!(validate(&req(CMD_CACHE, 0, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("not supported"));
        assert!(validate(&req(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1), SIZE, &NONE).unwrap_err().reason.contains("flags 0x2"));
        assert!(validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1), SIZE, &NONE).is_err());
        assert!(validate(&req(CMD_FLUSH, 0, 0, 1), SIZE, &NONE).is_err());
        assert!(validate(&req(CMD_READ, 0, 0, 0), SIZE, &NONE).unwrap_err().reason.contains("length 0"));
        let big = validate(&req(CMD_READ, 0, 0, MAX_PAYLOAD_BYTES + 1), 1 << 30, &NONE).unwrap_err();
        assert_eq!(big.error, EINVAL);
        assert!(big.reason.contains("maximum payload"));
        // Commands without payload may exceed the payload limit.
        assert_eq!(validate(&req(CMD_TRIM, 0, 0, u32::MAX), 1 << 33, &NONE), Ok(Command::Trim));
    }
}
