//! Queue buffers made before they are needed, for a takeover.
//!
//! A standby (a successor started in advance, docs/swap.md) takes a device over the moment its
//! server dies, and that is often when memory is shortest: the kernel holds every swap-out to
//! the device meanwhile, so reclaim cannot free anonymous memory, and a page the takeover
//! touches for the first time waits in reclaim until the device serves again, which is what the
//! page was for (seen in the VM test's `global-kill` step: a standby's queue thread in
//! `do_anonymous_page` -> `try_to_free_pages` before its first fetch). So a standby makes each
//! queue's buffer (one of the largest request: the device moves its data by user copy,
//! `user_copy.rs`) with [`IoBuffers::allocate`] before it waits, every page written so that it
//! is resident (and locked, under the caller's `mlockall`), and [`crate::recover`]'s queue
//! threads take them ([`IoBuffers::take`]) instead of allocating.
//!
//! Buffers of another size than the device's largest request are not used (the queue makes its
//! own); nor are they for a device without user copy, whose queues need a buffer per tag, nor
//! for a queue past the number made.

use std::sync::Mutex;

use libublk::helpers::IoBuf;

use crate::user_copy::make_resident;

/// One buffer per queue, made in advance.
pub struct IoBuffers {
    /// Per queue, until its thread takes it.
    queues: Mutex<Vec<Option<IoBuf<u8>>>>,
    bytes: u32,
}

impl IoBuffers {
    /// A buffer of `bytes` (`Options::io_buf_bytes`) for each of `queues` queues
    /// (`Options::nr_queues`), each page written once so that it is resident.
    pub fn allocate(queues: u16, bytes: u32) -> IoBuffers {
        let bufs = (0..queues)
            .map(|_| {
                let b = IoBuf::<u8>::new(bytes as usize);
                make_resident(&b);
                Some(b)
            })
            .collect();
        IoBuffers { queues: Mutex::new(bufs), bytes }
    }

    /// Bytes the buffers take.
    pub fn total_bytes(&self) -> u64 {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.len() as u64 * self.bytes as u64
    }

    /// Queue `qid`'s buffer, if it was made `bytes` long and not taken yet.
    pub(crate) fn take(&self, qid: u16, bytes: u32) -> Option<IoBuf<u8>> {
        if bytes != self.bytes {
            return None;
        }
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.get_mut(qid as usize).and_then(Option::take)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_takes_its_buffer_once_and_only_of_its_size() {
        let b = IoBuffers::allocate(2, 16 << 10);
        assert_eq!(b.total_bytes(), 2 * (16 << 10));
        assert!(b.take(0, 64 << 10).is_none(), "another size is not used");
        let q0 = b.take(0, 16 << 10).expect("queue 0's");
        assert_eq!(q0.len(), 16 << 10);
        assert!(q0.as_slice().iter().step_by(4096).all(|&x| x == 0));
        assert!(b.take(0, 16 << 10).is_none(), "taken once");
        assert!(b.take(1, 16 << 10).is_some());
        assert!(b.take(2, 16 << 10).is_none(), "no third queue");
    }
}
