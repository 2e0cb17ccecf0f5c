//! I/O buffers made before they are needed, for a takeover.
//!
//! A standby (a successor started in advance, docs/swap.md) takes a device over the moment its
//! server dies, and that is often when memory is shortest: the kernel holds every swap-out to
//! the device meanwhile, so reclaim cannot free anonymous memory, and an allocation made then
//! waits in reclaim until the device serves again, which is what the allocation was for. Its
//! queues' I/O buffers are the largest allocation a takeover makes (queues x depth x
//! `io_buf_bytes`: 8 MiB for 2 queues of 64 tags of 64 KiB), and were found that way in the VM
//! test's `global-kill` step: both queue threads of the standby in direct reclaim, one in
//! `mlock` of its buffers and one growing its malloc arena for them, until the supervisor gave
//! up on it. So a standby makes them with [`IoBuffers::allocate`] before it waits (every page
//! written, so resident, and locked under the caller's `mlockall`), and [`crate::recover`]'s
//! queue threads take them ([`IoBuffers::take`]) instead of allocating.
//!
//! The device's geometry is the kernel's, read after the takeover begins. Buffers made for
//! another depth or buffer size are freed and every queue allocates its own, as before; a
//! queue past the number made allocates its own too (and buffers made for queues the device
//! does not have stay unused: the standby was started with another queue count).

use std::sync::Mutex;

use libublk::helpers::IoBuf;

/// One set of I/O buffers per queue, made in advance.
pub struct IoBuffers {
    /// Per queue, until its thread takes them.
    queues: Mutex<Vec<Option<Vec<IoBuf<u8>>>>>,
    depth: u16,
    bytes: u32,
}

impl IoBuffers {
    /// Buffers for a device of `queues` queues of `depth` tags (`Options::nr_queues` and
    /// `queue_depth`), each buffer `bytes` long (`Options::io_buf_bytes`), each page written
    /// once so that it is resident (and locked, in a process under `mlockall`) before anything
    /// needs it.
    pub fn allocate(queues: u16, depth: u16, bytes: u32) -> IoBuffers {
        let per_queue = (0..queues)
            .map(|_| {
                let bufs: Vec<IoBuf<u8>> = (0..depth)
                    .map(|_| {
                        let b = IoBuf::<u8>::new(bytes as usize);
                        for off in (0..b.len()).step_by(4096) {
                            // SAFETY: `off` is inside the buffer, which this function owns; a
                            // volatile write, so the page is really touched (written, not read:
                            // a read of an untouched page may map the shared zero page).
                            unsafe { std::ptr::write_volatile(b.as_mut_ptr().add(off), 0) };
                        }
                        b
                    })
                    .collect();
                Some(bufs)
            })
            .collect();
        IoBuffers { queues: Mutex::new(per_queue), depth, bytes }
    }

    /// Bytes the buffers take.
    pub fn total_bytes(&self) -> u64 {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.len() as u64 * self.depth as u64 * self.bytes as u64
    }

    /// Queue `qid`'s buffers, if they were made for a queue of `depth` tags with buffers of
    /// `bytes` and not taken yet; `None` otherwise (the caller allocates its own). Every queue
    /// of a device has the same geometry, so buffers made for another are freed at once, all
    /// of them.
    pub(crate) fn take(&self, qid: u16, depth: u16, bytes: u32) -> Option<Vec<IoBuf<u8>>> {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if (depth, bytes) != (self.depth, self.bytes) {
            queues.clear();
            return None;
        }
        queues.get_mut(qid as usize).and_then(Option::take)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_takes_its_buffers_once_and_another_geometry_frees_them() {
        let b = IoBuffers::allocate(2, 4, 16 << 10);
        assert_eq!(b.total_bytes(), 2 * 4 * (16 << 10));
        let q0 = b.take(0, 4, 16 << 10).expect("queue 0's");
        assert_eq!(q0.len(), 4);
        assert!(q0.iter().all(|buf| buf.len() == 16 << 10 && buf.as_slice().iter().step_by(4096).all(|&x| x == 0)));
        assert!(b.take(0, 4, 16 << 10).is_none(), "taken once");
        assert!(b.take(1, 4, 16 << 10).is_some());
        assert!(b.take(2, 4, 16 << 10).is_none(), "no third queue");
        for other in [(8, 16 << 10), (4, 64 << 10)] {
            let b = IoBuffers::allocate(2, 4, 16 << 10);
            assert!(b.take(1, other.0, other.1).is_none(), "another geometry: {other:?}");
            assert_eq!(b.total_bytes(), 0, "buffers of another geometry are freed, all of them");
            assert!(b.take(0, 4, 16 << 10).is_none());
        }
    }
}
