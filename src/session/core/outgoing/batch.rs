//! The driver's batches: every control frame queued, then frames from the send queues up to the
//! batch's budget, CloseMux last once they are empty; and what the writing of a batch reports.
//!
//! - A batch records where some of its frames start, at most one per [`BOUNDARY_SPACING`]:
//!   control queued while it is written goes out at the next of them.
//! - Progress is reported after every transport write ([`Inner::written`]): the tasks waiting
//!   for their bytes wake as soon as those are written, not when the whole batch is.
//! - Before a small batch the driver lets the writers ready to run go first
//!   ([`Inner::yield_to_writers`]), so that many small writes cost a few transport calls.

use std::collections::VecDeque;
use std::task::Waker;

use super::super::send_queue;
use super::super::stream_state::{Queued, WriteWait, NO_QUEUE};
use super::super::{Inner, Now};
use super::control::{control_written_to, CONTROL_MARK_SWEEP};
use crate::frame::{Header, Kind};
use crate::session::out_queue::OutQueue;

/// Frame starts in a batch are recorded at most this far apart: control waits behind at most
/// this much data plus one frame, and a batch of 1 MiB records at most 64 of them.
const BOUNDARY_SPACING: u64 = 16 * 1024;

/// The driver yields to the writers before taking a batch only while less data than this is
/// queued (see [`Inner::yield_to_writers`]).
pub(in crate::session::core) const COALESCE_BELOW: usize = 16 * 1024;

/// Where the parts of one batch the driver took lie in their queues.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Batch {
    /// Data-queue position of the batch's first data byte.
    pub(crate) data_start: u64,
    /// Control-queue position after the batch's control frames.
    pub(crate) control_end: u64,
}

impl Inner {
    /// Hands the driver its next batch: every control frame, resolved into bytes in
    /// `control_buf`, then frames from the send queues, up to `budget` bytes of them, in
    /// `data_buf` (both empty on entry), with frame starts recorded in `boundaries`; CloseMux
    /// last, once the queues are empty. Lets in the writers the freed room admits.
    pub(crate) fn take_batch(
        &mut self,
        now: &Now,
        budget: usize,
        control_buf: &mut Vec<u8>,
        data_buf: &mut OutQueue,
        boundaries: &mut VecDeque<u64>,
        wakers: &mut Vec<Waker>,
    ) -> Batch {
        self.out.coalescing = false;
        self.out.direct_unseen = false;
        let control_end = self.take_control(now, control_buf, wakers);
        let data_start = self.out.data_end;
        let mut last = data_start;
        let taken = self.out.queues.take(budget, data_buf, data_start, |at| {
            if last + BOUNDARY_SPACING <= at {
                boundaries.push_back(at);
                last = at;
            }
        });
        self.stats.frames_sent += taken.frames;
        if self.out.close_mux && !self.out.queues.has_output() {
            self.out.close_mux = false;
            data_buf.extend_from_slice(&Header::new(0, Kind::CloseMux).to_bytes());
            self.stats.frames_sent += 1;
        }
        self.out.data_end += data_buf.len() as u64;
        self.wake_room(wakers);
        Batch {
            data_start,
            control_end,
        }
    }

    /// The driver has written the batches' data up to position `data` and the control queue
    /// up to `control`, `bytes` in all since the last call: wakes the tasks waiting for that.
    pub(crate) fn written(&mut self, data: u64, control: u64, bytes: u64, wakers: &mut Vec<Waker>) {
        let out = &mut self.out;
        out.data_written = out.data_written.max(data);
        let before = out.control_written;
        out.control_written = out.control_written.max(control);
        out.bytes_written += bytes;
        if let Some(rest) = out.direct_rest.as_deref_mut() {
            if out.control_written >= rest.taken_end {
                rest.taken = 0;
            }
        }
        if (before ^ out.control_written) >> CONTROL_MARK_SWEEP != 0 {
            self.forget_written_marks();
        }
        let spare_limit =
            send_queue::spare_limit(self.config.write_buffer_size, self.config.max_payload);
        while let Some((key, id)) = self
            .out
            .queues
            .next_written(self.out.data_written, spare_limit)
        {
            if let Some(stream) = self.streams.get_mut(key).filter(|s| s.id == id) {
                stream.send_queue = NO_QUEUE;
                stream.wake_writer(WriteWait::Written, wakers);
            }
        }
        let Some(waits) = self.out.waits.as_deref_mut() else {
            return;
        };
        while let Some(&(mark, key, id)) = waits.flush_control.front() {
            if !control_written_to(self.out.control_written, mark) {
                break;
            }
            waits.flush_control.pop_front();
            if let Some(stream) = self.streams.get_mut(key).filter(|s| s.id == id) {
                stream.queued.set(Queued::FLUSH, false);
                stream.wake_writer(WriteWait::Written, wakers);
            }
        }
    }

    /// Whether the driver, about to take a batch, should first let the tasks ready to run go
    /// ahead of it (once: true marks the yield, and the next call says no): the writers among
    /// them then queue their frames into that batch instead of each writing its own with a
    /// transport call (see `direct_possible`). Many streams writing small frames at once
    /// (8192 echoes, `examples/many_streams.rs`) then cost a few transport calls instead of
    /// one each. Only while less than [`COALESCE_BELOW`] is queued: larger batches gain
    /// nothing, and bulk writers get their fair shares of the room a batch frees only if the
    /// driver takes it as soon as it can (`tests/core_findings_b.rs`, eight tuned streams).
    pub(crate) fn yield_to_writers(&mut self) -> bool {
        let out = &mut self.out;
        if out.coalescing || out.queues.queued >= COALESCE_BELOW {
            return false;
        }
        out.coalescing = true;
        true
    }

    /// The driver yielded to the writers and has not taken its batch yet.
    pub(crate) fn yielded_to_writers(&self) -> bool {
        self.out.coalescing
    }

    /// The driver found nothing to take.
    pub(crate) fn nothing_to_take(&mut self) {
        self.out.coalescing = false;
    }
}
