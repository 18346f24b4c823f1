//! What a session sends and in which order, in five files:
//!
//! | file | what it owns |
//! |---|---|
//! | `outgoing.rs` | the state ([`Outgoing`]), and frames queued into the streams' send queues |
//! | `control.rs` | the control queue: credit, refusals, keepalives, and when they go |
//! | `room.rs` | the tasks waiting for room in the send queues, or for their bytes to be written |
//! | `direct_admit.rs` | when a writer writes its frame to the transport itself, and what it leaves |
//! | `batch.rs` | the driver's batches: what each takes, and what writing it reports |
//!
//! - Each stream's **send queue** (`send_queue.rs`) holds its opens, Data frames and closes, in
//!   the order it queued them; the driver's batches take from them by priority and round robin.
//!   Writers and openers wait while the queues hold `write_buffer_size` bytes or more.
//! - The **control queue** holds what is not ordered with a stream's frames, and goes out ahead
//!   of the data.
//! - Progress is reported after every transport write, not only once the batch is written, so
//!   a `Stream::close` beside a busy stream returns as soon as its own bytes are written: a
//!   stream's bytes are written once its send queue is gone (emptied, and its last take
//!   written).

pub(super) mod batch;
pub(super) mod control;
mod direct_admit;
mod room;

use std::collections::VecDeque;
use std::task::Waker;

pub(crate) use self::batch::Batch;
pub(super) use self::control::Control;
pub(crate) use self::direct_admit::Admitted;
use self::direct_admit::DirectRest;
use self::room::Waits;
use super::send_queue::{self, SendQueues};
use super::stream_state::{Queued, NO_QUEUE};
use super::Inner;
use crate::frame::{Header, HEADER_LEN};

/// The outgoing side of a session's state: what is queued, what is taken and written, and who
/// waits (see the module docs).
pub(super) struct Outgoing {
    /// The streams' send queues.
    pub(super) queues: SendQueues,
    /// CloseMux waits to go out behind everything the streams queued.
    pub(super) close_mux: bool,
    /// Data-queue positions (bytes ever taken into batches) of the batches' end, and how far
    /// the transport has taken.
    pub(super) data_end: u64,
    pub(super) data_written: u64,
    pub(super) control: VecDeque<Control>,
    /// Control-queue positions (entries ever queued): queued, and written.
    pub(super) control_pushed: u64,
    pub(super) control_written: u64,
    /// Who waits on the outgoing side; made by the first to wait.
    pub(super) waits: Option<Box<Waits>>,
    /// Room promised to the waiters woken for it and not used yet: nobody else may take it,
    /// or a writer that never waited would take it from them every time
    /// (`tests/core_findings_a.rs`, `*_gets_its_turn`).
    pub(super) reserved: usize,
    /// Grants of earlier epochs are void; the epoch moves on when the driver finds room
    /// unclaimed (the woken tasks may have been cancelled).
    pub(super) grant_epoch: u8,
    /// Bytes the transport has taken, for `Stats::bytes_sent`.
    pub(super) bytes_written: u64,
    /// A writer is writing its frame to the transport itself (see `session::direct`): the
    /// driver takes no batch meanwhile, so nothing can come between that frame's bytes.
    pub(super) direct_busy: bool,
    /// The part of a direct write's frame that the transport did not take: at most one frame,
    /// `max_payload + 8` bytes, outside `write_buffer_size`. The driver writes it before
    /// anything else (`Control::DirectRest`). Made by the first partial direct write and kept
    /// (its capacity too) until the session goes quiet, so partial direct writes allocate
    /// nothing in steady state; boxed, since few sessions have one.
    pub(super) direct_rest: Option<Box<DirectRest>>,
    /// A direct write left bytes in the transport that a flush has yet to push out.
    pub(super) flush_wanted: bool,
    /// Direct writes made (wrapping): the driver counts them as activity, so that a session
    /// whose writers write directly keeps its buffers as one whose driver writes does.
    pub(super) direct_writes: u32,
    /// The driver yielded to the writers before taking its next batch: they queue their
    /// frames into it instead of writing them themselves (see `Inner::yield_to_writers`).
    pub(super) coalescing: bool,
    /// A writer wrote its frame itself since the driver last ran: the next writer queues its
    /// frame and wakes the driver instead (see `direct_possible`).
    pub(super) direct_unseen: bool,
    /// The driver's waker, from its first sleep on, kept: the core wakes the driver with it
    /// (once per sleep, see `Inner::driver_asleep`), and direct writes poll the transport with
    /// it (see `session::direct`).
    pub(super) driver_waker: Option<Waker>,
}

impl Outgoing {
    pub(super) fn new() -> Outgoing {
        Outgoing {
            queues: SendQueues::new(),
            close_mux: false,
            data_end: 0,
            data_written: 0,
            // Grows with use and is kept while the session is busy.
            control: VecDeque::new(),
            control_pushed: 0,
            control_written: 0,
            waits: None,
            reserved: 0,
            grant_epoch: 0,
            bytes_written: 0,
            direct_busy: false,
            direct_rest: None,
            flush_wanted: false,
            direct_writes: 0,
            coalescing: false,
            direct_unseen: false,
            driver_waker: None,
        }
    }

    pub(super) fn has_output(&self) -> bool {
        self.queues.has_output() || !self.control.is_empty() || self.close_mux
    }

    pub(super) fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Whether everything queued is written.
    pub(super) fn all_written(&self) -> bool {
        !self.direct_busy
            && self.queues.all_written()
            && !self.close_mux
            && self.data_written >= self.data_end
            && self.control_written >= self.control_pushed
    }

    /// Bytes queued that the transport has not taken yet: the send queues' and the batch's
    /// being written, a header for each control frame, and what a direct write left, for
    /// `Stats::queued`.
    pub(super) fn queued_bytes(&self) -> u64 {
        let batch = self.data_end.saturating_sub(self.data_written);
        // While the rest of a direct write waits, one control entry stands for it.
        let (waiting, taken) = self
            .direct_rest
            .as_ref()
            .map_or((0, 0), |rest| (rest.bytes.len(), rest.taken));
        let rest = waiting + taken;
        let headers = self.control.len().saturating_sub(usize::from(waiting > 0));
        (self.queues.queued as u64)
            .saturating_add(batch)
            .saturating_add((headers * HEADER_LEN + rest) as u64)
    }

    /// Bytes in the send queue `queue` (a stream's `send_queue`), 0 for none.
    pub(super) fn stream_queued(&self, queue: u32) -> u64 {
        if queue == NO_QUEUE {
            return 0;
        }
        self.queues.queued_in(queue as usize) as u64
    }

    /// Gives back the capacity of every queue that is empty: the session has gone quiet (see
    /// `session::linger`). Queues still holding something keep it.
    pub(super) fn release_empty(&mut self) {
        self.queues.release_empty();
        if self.control.is_empty() {
            self.control = VecDeque::new();
        }
        if self
            .direct_rest
            .as_ref()
            .is_some_and(|rest| rest.bytes.is_empty() && rest.taken == 0)
        {
            self.direct_rest = None;
        }
        if self.waits.as_ref().is_some_and(|w| {
            w.room.is_empty() && w.openers.len() == 0 && w.flush_control.is_empty()
        }) {
            self.waits = None;
        }
    }
}

impl Inner {
    /// The stream's send queue, made if it has none.
    fn send_queue_of(&mut self, key: usize) -> Option<usize> {
        let priority = self.priority(key);
        let stream = self.streams.get_mut(key)?;
        if stream.send_queue == NO_QUEUE {
            let queue = self.out.queues.create(key, stream.id, priority);
            stream.send_queue = u32::try_from(queue).ok()?;
        }
        Some(stream.send_queue as usize)
    }

    /// Queues a frame without payload for the stream, behind what it queued before.
    pub(super) fn queue_frame(&mut self, key: usize, header: Header) {
        self.queue(key, header, &[], None);
    }

    /// Queues a Data frame for the stream, its payload copied.
    pub(super) fn queue_data(&mut self, key: usize, header: Header, payload: &[u8]) {
        self.queue(key, header, payload, None);
    }

    /// Queues a Data frame for the stream, its payload spliced in without a copy unless short.
    pub(super) fn queue_data_chunk(&mut self, key: usize, header: Header, payload: bytes::Bytes) {
        self.queue(key, header, &[], Some(payload));
    }

    fn queue(&mut self, key: usize, header: Header, payload: &[u8], chunk: Option<bytes::Bytes>) {
        let Some(queue) = self.send_queue_of(key) else {
            return;
        };
        let spare_limit =
            send_queue::spare_limit(self.config.write_buffer_size, self.config.max_payload);
        self.out
            .queues
            .push(queue, header, payload, chunk, spare_limit);
        self.out.queues.activate(queue);
    }

    /// Sets the stream's send priority (see `Stream::set_priority`).
    pub(crate) fn set_priority(&mut self, key: usize, priority: i32) {
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        stream.queued.set(Queued::PRIORITY, priority != 0);
        if priority != 0 {
            self.rare
                .get_or_insert_with(Box::default)
                .priorities
                .insert(key, priority);
        } else if let Some(rare) = &mut self.rare {
            rare.priorities.remove(&key);
        }
        if stream.send_queue != NO_QUEUE {
            let queue = stream.send_queue as usize;
            self.out.queues.reprioritize(queue, priority);
        }
    }

    /// The stream's send priority.
    pub(crate) fn priority(&self, key: usize) -> i32 {
        self.streams
            .get(key)
            .filter(|s| s.queued.has(Queued::PRIORITY))
            .and_then(|_| self.rare.as_ref()?.priorities.get(&key).copied())
            .unwrap_or(0)
    }

    /// Queues CloseMux behind everything already queued: a graceful close delivers what was
    /// written before it.
    pub(super) fn queue_close_mux(&mut self) {
        self.out.close_mux = true;
    }

    /// Whether the driver has anything to take (or to flush). Never while a writer writes its
    /// frame itself: the writer wakes the driver when it is done, if there is.
    pub(crate) fn has_output(&self) -> bool {
        !self.out.direct_busy && (self.out.has_output() || self.out.flush_wanted)
    }

    /// Bytes in the send queues, for tests.
    #[cfg(test)]
    pub(crate) fn data_len(&self) -> usize {
        self.out.queues.queued
    }

    /// Outgoing buffers' capacity, for the driver's test of releasing them.
    #[cfg(test)]
    pub(crate) fn data_capacity(&mut self) -> usize {
        self.out.queues.capacity()
    }

    /// Gives the send queues' spare buffers back to the allocator (the session is quiet).
    pub(crate) fn release_data_buffers(&mut self) {
        self.out.queues.release_empty();
    }
}
