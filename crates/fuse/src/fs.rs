//! What the filesystem declares to the kernel at INIT. fuser mounts the filesystem and answers
//! INIT through [`InitFs`]; every request after INIT is answered by our own transports
//! ([`crate::classic`], [`crate::uring`]) through [`crate::answer`], so fuser's session is
//! never run and its other `Filesystem` methods are never called.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use fuser::{Filesystem, InitFlags, KernelConfig, Request};

use crate::takeover::Negotiated;

/// The protocol minor fuser 0.18 answers INIT with (its `FUSE_KERNEL_MINOR_VERSION`, not
/// public): the kernel speaks the lower of this and its own.
const FUSER_MINOR: u32 = 40;

/// The one file's name in the mount.
pub const FILE_NAME: &str = "device";

/// The INIT answer: request sizes, asynchronous direct I/O, the background queue, and FUSE over
/// io_uring when wanted.
pub struct InitFs {
    /// The largest read or write the kernel may send: `max_write` and, through it and
    /// `max_readahead`, `max_pages`.
    max_request: usize,
    /// Kernel request queue: `max_background` (asynchronous direct I/O, which the loop driver
    /// issues, counts as background requests).
    max_background: u16,
    /// With FUSE over io_uring wanted ([`InitFs::want_io_uring`]): INIT asks for it and records
    /// here whether the kernel agreed.
    io_uring: Option<Arc<AtomicBool>>,
    /// What INIT agreed, for a successor ([`Negotiated`]); set by `init`.
    negotiated: Arc<Mutex<Option<Negotiated>>>,
}

impl InitFs {
    pub fn new(max_request: usize, max_background: u16) -> InitFs {
        InitFs { max_request, max_background, io_uring: None, negotiated: Arc::default() }
    }

    /// Where `init` records what was agreed.
    pub fn negotiated(&self) -> Arc<Mutex<Option<Negotiated>>> {
        Arc::clone(&self.negotiated)
    }

    /// Asks for `FUSE_OVER_IO_URING` at INIT; `granted` is set to whether the kernel agreed
    /// (it offers it only with `enable_uring` on).
    pub fn want_io_uring(&mut self, granted: Arc<AtomicBool>) {
        self.io_uring = Some(granted);
    }
}

impl Filesystem for InitFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let max = u32::try_from(self.max_request).unwrap_or(u32::MAX);
        // max_pages (the largest read) follows from max(max_write, max_readahead). The
        // transports' buffers are sized for `max_request`: a kernel told a larger max_write
        // would send requests they cannot hold, so a refused value fails the mount.
        config.set_max_write(max).map_err(|limit| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a FUSE request size of {} bytes is not possible (the nearest possible is {limit})", self.max_request),
            )
        })?;
        if let Err(nearest) = config.set_max_readahead(max) {
            let _ = config.set_max_readahead(nearest);
        }
        // Asynchronous direct I/O: the loop driver's requests go out concurrently.
        let mut flags = 0;
        if config.add_capabilities(InitFlags::FUSE_ASYNC_DIO).is_ok() {
            flags |= InitFlags::FUSE_ASYNC_DIO.bits();
        }
        let _ = config.set_max_background(self.max_background);
        let _ = config.set_congestion_threshold(self.max_background / 4 * 3);
        if let Some(granted) = &self.io_uring {
            let ok = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok();
            if ok {
                flags |= InitFlags::FUSE_OVER_IO_URING.bits();
            }
            granted.store(ok, Ordering::Release);
        }
        let n = Negotiated { minor: config.kernel_abi().1.min(FUSER_MINOR), max_write: max, flags, max_background: self.max_background };
        if let Ok(mut slot) = self.negotiated.lock() {
            *slot = Some(n);
        }
        Ok(())
    }
}
