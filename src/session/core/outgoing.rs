//! What a session sends and in which order: the streams' send queues, the control queue, and
//! the tasks waiting for room in the ones or for their bytes to be written.
//!
//! - Each stream's **send queue** (`send_queue.rs`) holds its opens, Data frames and closes, in
//!   the order it queued them; the driver's batches take from them by priority and round robin.
//!   Writers and openers wait while the queues hold `write_buffer_size` bytes or more, oldest
//!   first (see [`Inner::wake_room`]).
//! - The **control queue** holds everything that is not ordered with a stream's frames: credit
//!   owed (WindowUpdate, at most one entry per stream, its amount taken when it is written),
//!   refusals, keepalives. The driver writes all of it ahead of the data at the start of every
//!   batch, as h2 writes its pending WINDOW_UPDATEs before any data, so that a side busy sending
//!   never stops returning credit for what it receives. (Queued only while the data queue had
//!   room, credit once starved every inbound stream for as long as an upload ran:
//!   `tests/core_findings_a.rs`, `credit_flows_back_*`.) Control queued while a batch is being
//!   written goes out at the batch's next frame boundary: the batch records where frames start,
//!   at most one per [`BOUNDARY_SPACING`], and the driver, while control waits, writes data only
//!   up to the next of them. (Once a batch, a 1 MiB batch on a 100 Mbit/s link held credit back
//!   for 80 ms: `core::tests::control_queued_mid_batch_goes_out_at_the_next_boundary`.)
//! - The control queue is bounded by stopping to read: while it holds more than
//!   [`Inner::control_limit`] entries, the driver reads nothing (a peer that never reads our
//!   answers cannot grow it), as h2 and yamux do.
//! - Every waiting future holds at most one entry in a wait queue, and a re-poll replaces its
//!   waker instead of adding one. (A writer re-polled by every WindowUpdate(0) once added a
//!   waker each time: `tests/core_findings_a.rs`, `*_do_not_pile_up_its_waker`, `*_leave_no_registrations_behind`.)
//! - Progress is reported after every transport write, not only once the batch is written, so
//!   a `Stream::close` beside a busy stream returns as soon as its own bytes are written: a
//!   stream's bytes are written once its send queue is gone (emptied, and its last take
//!   written).

use std::cell::Cell;
use std::collections::VecDeque;
use std::task::{ready, Poll, Waker};

use super::send::data_header;
use super::send_queue::{self, SendQueues};
use super::slab::Slab;
use super::stream_state::{register, Queued, RoomGrant, WriteWait, NO_QUEUE};
use super::{micros_since, Inner, Now};
use crate::error::Error;
use crate::frame::{Header, Kind, HEADER_LEN};
use crate::session::direct::Direct;
use crate::session::out_queue::OutQueue;

/// Frame starts in a batch are recorded at most this far apart: control waits behind at most
/// this much data plus one frame, and a batch of 1 MiB records at most 64 of them.
const BOUNDARY_SPACING: u64 = 16 * 1024;

/// An entry of the control queue.
pub(super) enum Control {
    /// Credit owed to the peer on a stream; the amount is taken when the driver writes it.
    Credit { key: usize, id: u32 },
    /// A frame without payload: a refusal, a close, a keepalive.
    Frame(Header),
    /// What the transport did not take of a direct write (`Outgoing::direct_rest`): first in
    /// the queue, and first on the wire.
    DirectRest,
}

/// The driver yields to the writers before taking a batch only while less data than this is
/// queued (see [`Inner::yield_to_writers`]).
pub(super) const COALESCE_BELOW: usize = 16 * 1024;

/// A write admitted by [`Inner::admit_write`]: its frame's header, its payload's length, and,
/// when the writer writes it to the transport itself, what goes before it.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) header: Header,
    pub(crate) n: usize,
    pub(crate) direct: Option<DirectBatch>,
}

/// The control frames a direct write carries ahead of its frame, taken from the control queue,
/// and the control-queue position after them.
#[derive(Debug)]
pub(crate) struct DirectBatch {
    pub(crate) control: Vec<u8>,
    control_end: u64,
}

/// A task waiting for room in the send queues.
enum RoomWaiter {
    /// A stream's writer, for `want` bytes.
    Stream { key: usize, id: u32, want: usize },
    /// An `open`, by its slot in `Waits::openers`.
    Open { slot: usize },
}

/// An `open` future waiting for room.
struct Opener {
    waker: Option<Waker>,
    queued: bool,
    /// Room reserved for it by [`Inner::wake_room`], in that grant epoch.
    granted: Option<u8>,
}

/// Where the parts of one batch the driver took lie in their queues.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Batch {
    /// Data-queue position of the batch's first data byte.
    pub(crate) data_start: u64,
    /// Control-queue position after the batch's control frames.
    pub(crate) control_end: u64,
}

/// What the transport did not take of a direct write (see `Outgoing::direct_rest`).
#[derive(Default)]
struct DirectRest {
    /// Waiting for the driver to take it (`Control::DirectRest` in the control queue).
    bytes: Vec<u8>,
    /// Taken into the driver's batch, not written yet: its length, and the control-queue
    /// position once it is written (for `Stats::queued`).
    taken: usize,
    taken_end: u64,
}

pub(super) struct Outgoing {
    /// The streams' send queues.
    queues: SendQueues,
    /// CloseMux waits to go out behind everything the streams queued.
    close_mux: bool,
    /// Data-queue positions (bytes ever taken into batches) of the batches' end, and how far
    /// the transport has taken.
    data_end: u64,
    data_written: u64,
    control: VecDeque<Control>,
    /// Control-queue positions (entries ever queued): queued, and written.
    control_pushed: u64,
    control_written: u64,
    /// Who waits on the outgoing side; made by the first to wait.
    waits: Option<Box<Waits>>,
    /// Room promised to the waiters woken for it and not used yet: nobody else may take it,
    /// or a writer that never waited would take it from them every time (a bulk writer kept
    /// every other stream out: `tests/core_findings_a.rs`, `*_gets_its_turn`).
    reserved: usize,
    /// Grants of earlier epochs are void; the epoch moves on when the driver finds room
    /// unclaimed (the woken tasks may have been cancelled).
    grant_epoch: u8,
    /// Bytes the transport has taken, for `Stats::bytes_sent`.
    bytes_written: u64,
    /// A writer is writing its frame to the transport itself (see `session::direct`): the
    /// driver takes no batch meanwhile, so nothing can come between that frame's bytes.
    direct_busy: bool,
    /// The part of a direct write's frame that the transport did not take: at most one frame,
    /// `max_payload + 8` bytes, outside `write_buffer_size`. The driver writes it before
    /// anything else (`Control::DirectRest`). Made by the first partial direct write and kept
    /// (its capacity too) until the session goes quiet, so partial direct writes allocate
    /// nothing in steady state; boxed, since few sessions have one.
    direct_rest: Option<Box<DirectRest>>,
    /// A direct write left bytes in the transport that a flush has yet to push out.
    flush_wanted: bool,
    /// Direct writes made (wrapping): the driver counts them as activity, so that a session
    /// whose writers write directly keeps its buffers as one whose driver writes does.
    direct_writes: u32,
    /// The driver yielded to the writers before taking its next batch: they queue their
    /// frames into it instead of writing them themselves (see `Inner::yield_to_writers`).
    coalescing: bool,
    /// A writer wrote its frame itself since the driver last ran: the next writer queues its
    /// frame and wakes the driver instead (see `direct_possible`).
    direct_unseen: bool,
}

/// The tasks waiting on the outgoing side: writers and openers for room in the send queues,
/// streams for their closes to be written. Boxed apart, made by the first wait and dropped when
/// the session goes quiet with nobody waiting, so that an idle session does not carry it.
#[derive(Default)]
struct Waits {
    room: VecDeque<RoomWaiter>,
    openers: Slab<Opener>,
    /// Tasks waiting for a close of their stream in the control queue to be written: its
    /// position (wrapping), the stream. Positions only grow, so the oldest is first.
    flush_control: VecDeque<(u32, usize, u32)>,
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

    /// Whether the control queue is written up to `mark` (a wrapping position).
    fn control_written_to(&self, mark: u32) -> bool {
        control_written_to(self.control_written, mark)
    }

    /// As if `n` more control entries had been pushed (and taken): the position after them.
    #[cfg(test)]
    pub(super) fn pass_control(&mut self, n: u64) -> u64 {
        self.control_pushed += n;
        self.control_pushed
    }

    /// Whether writers or openers wait for room.
    fn room_waiting(&self) -> bool {
        self.waits.as_ref().is_some_and(|w| !w.room.is_empty())
    }

    fn waits(&mut self) -> &mut Waits {
        self.waits.get_or_insert_with(Box::default)
    }
}

/// Whether the control queue is written up to `mark`, a position (wrapping) in it, as of
/// `written`. Right while `mark` is less than 2^31 entries behind or ahead: a mark not yet
/// written is at most the control queue's bound ahead, and [`Inner::forget_written_marks`]
/// drops written marks before they are 2^31 behind.
fn control_written_to(written: u64, mark: u32) -> bool {
    (written as u32).wrapping_sub(mark) < 1 << 31
}

/// Every 2^30 control entries written, streams forget the marks of their frames written by
/// then (see `StreamState::control_mark`): a mark kept is never more than 2^31 behind, where
/// its wrapping comparison would turn back to unwritten (and a flush of a stream whose close
/// went out long before would wait for 2^31 more). One pass over the streams per 2^30 control
/// frames.
const CONTROL_MARK_SWEEP: u32 = 30;

thread_local! {
    /// Room for the control frames a direct write takes (see [`Inner::admit_write`]), one per
    /// thread, lent to the writer from its admission to [`Inner::direct_done`], which happen in
    /// the same poll of the writer's task: sessions hold none, and direct writes allocate
    /// nothing for it in steady state.
    static DIRECT_CONTROL: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Opens go in the control queue only while it holds fewer entries than this (see
/// [`Inner::queue_open`]): with a transport that takes nothing, at most this many opens pass
/// without waiting for room.
pub(super) const OPENS_IN_CONTROL: usize = 64;

impl Inner {
    // -----------------------------------------------------------------------------------------
    // Queueing.

    /// Whether writers and openers without a grant may queue more: the data queue and the
    /// room reserved for woken waiters are below the queue's size, and nobody waits for room
    /// (who did not wait does not go ahead of those who do).
    pub(super) fn data_has_room(&self) -> bool {
        self.room_free() && !self.out.room_waiting()
    }

    /// Whether the data queue and the room reserved are below the queue's size.
    fn room_free(&self) -> bool {
        self.out.queues.queued + self.out.reserved < self.config.write_buffer_size
    }

    /// Whether writers wait for room that is free, or that only grants not used up hold (the
    /// data queue is empty): the driver has to let them in, voiding those grants first. (A
    /// writer let in that wrote less than its share kept the rest reserved, and an `open`
    /// behind it waited for good: found by the model test, `tests/model.proptest-regressions`.)
    pub(super) fn room_to_hand_out(&self) -> bool {
        self.out.room_waiting() && (self.room_free() || self.out.queues.queued == 0)
    }

    /// The stream queued a frame of `size` bytes: what it holds of a grant of room is used up
    /// by as much, and released from the reservation.
    pub(super) fn use_room_grant(&mut self, key: usize, size: usize) {
        let epoch = self.out.grant_epoch;
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        let kept = stream.room_grant.bytes(epoch) as usize;
        let used = size.min(kept);
        stream.room_grant = RoomGrant::new(kept - used, epoch);
        self.out.reserved = self.out.reserved.saturating_sub(used);
    }

    /// The room kept for the stream's writer, if it was let in: it may queue that much even
    /// when the queue looks full.
    pub(super) fn room_granted(&self, key: usize) -> usize {
        self.streams
            .get(key)
            .map_or(0, |s| s.room_grant.bytes(self.out.grant_epoch) as usize)
    }

    /// Takes the opener's grant of room (one OpenStream's worth), if it holds a live one.
    pub(super) fn take_opener_grant(&mut self, slot: Option<usize>) -> bool {
        let epoch = self.out.grant_epoch;
        let waits = self.out.waits.as_deref_mut();
        let Some(opener) = slot.and_then(|key| waits?.openers.get_mut(key)) else {
            return false;
        };
        if opener.granted.take() == Some(epoch) {
            self.out.reserved = self.out.reserved.saturating_sub(HEADER_LEN);
            return true;
        }
        false
    }

    /// Voids every grant of room not used yet: called when the driver finds room unclaimed,
    /// so that a cancelled waiter's share goes to the next one.
    pub(crate) fn void_room_grants(&mut self) {
        self.out.grant_epoch = self.out.grant_epoch.wrapping_add(1);
        self.out.reserved = 0;
    }

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
        let Some(queue) = self.send_queue_of(key) else {
            return;
        };
        if let Some(q) = self.out.queues.get_mut(queue) {
            q.push_header(header);
            self.out.queues.queued += HEADER_LEN;
        }
        self.out.queues.activate(queue);
    }

    /// Queues a Data frame for the stream, its payload copied.
    pub(super) fn queue_data(&mut self, key: usize, header: Header, payload: &[u8]) {
        let Some(queue) = self.send_queue_of(key) else {
            return;
        };
        if let Some(q) = self.out.queues.get_mut(queue) {
            q.push_header(header);
            q.push_payload(payload);
            self.out.queues.queued += HEADER_LEN + payload.len();
        }
        self.out.queues.activate(queue);
    }

    /// Queues a Data frame for the stream, its payload spliced in without a copy unless short.
    pub(super) fn queue_data_chunk(&mut self, key: usize, header: Header, payload: bytes::Bytes) {
        let Some(queue) = self.send_queue_of(key) else {
            return;
        };
        let len = HEADER_LEN + payload.len();
        if let Some(q) = self.out.queues.get_mut(queue) {
            q.push_header(header);
            q.push_chunk(payload);
            self.out.queues.queued += len;
        }
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

    /// Appends an entry to the control queue; returns the position after it.
    pub(super) fn queue_control(&mut self, control: Control) -> u64 {
        if self.out.control.capacity() == 0 {
            // Room for two at first, where the default is four: a session whose control
            // frames are few (its greeting, an open, an acknowledgement) holds half as much
            // until it goes quiet (`benches/idle_sessions.rs`); a busy one grows it as usual.
            self.out.control.reserve_exact(2);
        }
        self.out.control.push_back(control);
        self.out.control_pushed += 1;
        self.out.control_pushed
    }

    /// Queues credit for the stream unless it has some queued already.
    pub(super) fn queue_credit(&mut self, key: usize) {
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if !stream.queued.has(Queued::CREDIT) {
            stream.queued.set(Queued::CREDIT, true);
            let id = stream.id;
            self.queue_control(Control::Credit { key, id });
        }
    }

    /// Queues a close frame of `kind` for the stream: behind its frames in its send queue while
    /// anything of it is unwritten (a close must not overtake the data it ends, nor the
    /// OpenStream that makes the stream known to the peer), otherwise in the control queue, so
    /// that it goes out at once and counts in the control queue's bound. (Found by the model
    /// test: a CloseRead overtook its stream's OpenStream and the peer never read the end of
    /// the stream; `tests/model.proptest-regressions`.)
    pub(super) fn queue_close(&mut self, key: usize, kind: Kind) {
        let Some(stream) = self.streams.get(key) else {
            return;
        };
        let header = Header::new(stream.id, kind);
        if stream.send_queue != NO_QUEUE {
            self.queue_frame(key, header);
            return;
        }
        self.queue_stream_control(key, header);
    }

    /// Queues a frame of the stream in the control queue, and marks the stream as having one
    /// there: its flush and `is_written` wait for it.
    fn queue_stream_control(&mut self, key: usize, header: Header) {
        let mark = self.queue_control(Control::Frame(header));
        if let Some(stream) = self.streams.get_mut(key) {
            stream.control_mark = mark as u32;
            stream.queued.set(Queued::IN_CONTROL, true);
        }
    }

    /// Queues a new stream's OpenStream, and the announcement of a window above the
    /// protocol's initial one right behind it (as a control frame of its own it could reach
    /// the peer before the stream does, and be ignored). While nothing of the send queues is
    /// unwritten, they go in the control queue, which goes out first anyway: no send queue is
    /// made for a stream that has not written, and its first write may go straight to the
    /// transport behind them (see `session::direct`). Otherwise, or once [`OPENS_IN_CONTROL`]
    /// control entries wait (a transport that takes nothing), they go in the stream's send
    /// queue, where they take room and so make the next opens wait for it, and where no later
    /// open can overtake them.
    pub(super) fn queue_open(&mut self, key: usize, header: Header, announce: Option<Header>) {
        let entries = 1 + usize::from(announce.is_some());
        let data_idle = self.out.queues.queued == 0 && self.out.data_written >= self.out.data_end;
        if data_idle && self.out.control.len() + entries <= OPENS_IN_CONTROL {
            self.queue_stream_control(key, header);
            if let Some(announce) = announce {
                self.queue_stream_control(key, announce);
            }
            return;
        }
        self.queue_frame(key, header);
        if let Some(announce) = announce {
            self.queue_frame(key, announce);
        }
    }

    /// Queues a keepalive (id 0), ahead of data.
    pub(crate) fn queue_keepalive(&mut self) {
        self.queue_control(Control::Frame(Header::new(0, Kind::Keepalive)));
        self.stats.keepalives_sent += 1;
    }

    /// Queues CloseMux behind everything already queued: a graceful close delivers what was
    /// written before it.
    pub(super) fn queue_close_mux(&mut self) {
        self.out.close_mux = true;
    }

    /// Control entries beyond which the driver stops reading: one per live stream (credit),
    /// and the accept backlog's worth of refusals. Closes the application asks for add at most
    /// three per stream on top, so the control queue holds at most
    /// `8 × (accept_backlog + 5 × max_streams)` bytes (`Config` docs; measured by
    /// `tests/core_findings_a.rs`, `close_frames_for_dropped_streams_stop_the_reading_at_the_queue_bound`).
    pub(crate) fn control_limit(&self) -> usize {
        self.config.accept_backlog + self.config.max_streams
    }

    /// Entries in the control queue.
    #[cfg(test)]
    pub(super) fn control_len(&self) -> usize {
        self.out.control.len()
    }

    /// Whether the control queue is over its bound, so reading must wait for it to drain.
    pub(crate) fn control_over_limit(&self) -> bool {
        self.out.control.len() > self.control_limit()
    }

    /// Whether the driver has anything to take (or to flush). Never while a writer writes its
    /// frame itself: the writer wakes the driver when it is done, if there is.
    pub(crate) fn has_output(&self) -> bool {
        !self.out.direct_busy && (self.out.has_output() || self.out.flush_wanted)
    }

    /// Direct writes made so far (wrapping), see `Outgoing::direct_writes`.
    pub(crate) fn direct_writes(&self) -> u32 {
        self.out.direct_writes
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

    /// The driver has run since the last direct write.
    pub(crate) fn driver_ran(&mut self) {
        self.out.direct_unseen = false;
    }

    /// Whether a writer is writing its frame to the transport itself.
    pub(crate) fn direct_busy(&self) -> bool {
        self.out.direct_busy
    }

    /// Whether a direct write left bytes for the driver to flush; forgets it.
    pub(crate) fn take_flush_wanted(&mut self) -> bool {
        std::mem::take(&mut self.out.flush_wanted)
    }

    // -----------------------------------------------------------------------------------------
    // Direct writes (see `session::direct`).

    /// Admits a write of up to `len` bytes (see `grant_write`), but leaves the frame to the
    /// caller. With `direct` (a spawned session's writer, with the time) and nothing to write
    /// before it but control frames (no frame queued, no batch in hand, no direct write under
    /// way), the caller writes the control frames and its frame to the transport itself, then
    /// reports with [`Inner::direct_done`]; meanwhile the driver takes no batch. Otherwise the
    /// caller queues the frame with `queue_data` or `queue_data_chunk`.
    pub(crate) fn admit_write(
        &mut self,
        key: usize,
        waker: &Waker,
        len: usize,
        direct: Option<&Now>,
        wakers: &mut Vec<Waker>,
    ) -> Poll<Result<Admitted, Error>> {
        let (id, n) = ready!(self.grant_write(key, waker, len))?;
        let direct = match direct {
            Some(now) if n > 0 && self.direct_possible(id, n) => {
                self.out.direct_busy = true;
                // The control frames queued go first, as in a batch of the driver's.
                let mut control = DIRECT_CONTROL.try_with(Cell::take).unwrap_or_default();
                let control_end = self.take_control(now, &mut control, wakers);
                Some(DirectBatch {
                    control,
                    control_end,
                })
            }
            _ => None,
        };
        Poll::Ready(Ok(Admitted {
            header: data_header(id, n),
            n,
            direct,
        }))
    }

    /// Admits a write of `data` and queues its frame, unless the returned grant carries a
    /// direct batch (see [`Inner::admit_write`]).
    pub(crate) fn poll_write_admit(
        &mut self,
        key: usize,
        waker: &Waker,
        data: &[u8],
        direct: Option<&Now>,
        wakers: &mut Vec<Waker>,
    ) -> Poll<Result<Admitted, Error>> {
        let admitted = ready!(self.admit_write(key, waker, data.len(), direct, wakers))?;
        if admitted.direct.is_none() && admitted.n > 0 {
            self.queue_data(key, admitted.header, &data[..admitted.n]);
        }
        Poll::Ready(Ok(admitted))
    }

    /// The same for `write_chunk`: a queued frame takes its bytes from `chunk` without
    /// copying, and `chunk` is advanced past them either way.
    pub(crate) fn poll_write_chunk_admit(
        &mut self,
        key: usize,
        waker: &Waker,
        chunk: &mut bytes::Bytes,
        direct: Option<&Now>,
        wakers: &mut Vec<Waker>,
    ) -> Poll<Result<(Admitted, bytes::Bytes), Error>> {
        let admitted = ready!(self.admit_write(key, waker, chunk.len(), direct, wakers))?;
        let payload = chunk.split_to(admitted.n);
        if admitted.direct.is_none() && admitted.n > 0 {
            self.queue_data_chunk(key, admitted.header, payload.clone());
        }
        Poll::Ready(Ok((admitted, payload)))
    }

    /// Whether a frame of `len` bytes of payload on stream `id` may be written by its writer
    /// now. It would go first: nothing but control frames is queued, and the driver has no
    /// batch in hand. And it goes as one message of a quiet session, not as one of a series,
    /// which is the driver's to write in batches instead of one transport call per frame: not
    /// a second time before the driver has run since the last direct write. A writer sending
    /// bulk so writes its first frame itself and queues the next ones, which the driver takes
    /// together as the transport takes them: on one stream over loopback TCP, 64 KiB writes
    /// then make one transport call per 270–330 KiB instead of one per frame, and wake the
    /// peer's reading thread that much less often (measured in `CHANGELOG.md`).
    ///
    /// A small frame (under [`COALESCE_BELOW`]) also waits for a batch:
    /// - while frames of other streams wait in the control queue (the driver was woken for
    ///   them);
    /// - while the driver lets the writers run before it takes its batch
    ///   ([`Inner::yield_to_writers`]).
    fn direct_possible(&self, id: u32, len: usize) -> bool {
        let out = &self.out;
        let control_taken = out.control_pushed - out.control.len() as u64;
        let first = !out.direct_busy
            && !out.close_mux
            && out.queues.all_written()
            && !out.queues.has_output()
            && out.data_written >= out.data_end
            && out.control_written >= control_taken
            && self.life.end_reason().is_none();
        first
            && !out.direct_unseen
            && (len >= COALESCE_BELOW || !out.coalescing && !self.others_waiting(id))
    }

    /// Whether frames of streams other than `id` wait in the control queue (a keepalive or a
    /// CloseMux is no stream's).
    fn others_waiting(&self, id: u32) -> bool {
        self.out.control.iter().any(|control| match control {
            Control::Credit { id: other, .. } => *other != id,
            Control::Frame(header) => {
                !matches!(header.kind, Kind::Keepalive | Kind::CloseMux) && header.id != id
            }
            Control::DirectRest => true,
        })
    }

    /// A direct write admitted by [`Inner::admit_write`] is done: the transport took
    /// `outcome.written` bytes of its control frames, `header` and `payload`. A frame it took
    /// nothing of is queued as any other; what it did not take of the control frames, and of a
    /// frame it took part of, the driver writes before anything else, and the stream's close
    /// and `poll_written` wait for it.
    pub(crate) fn direct_done(
        &mut self,
        key: usize,
        header: Header,
        payload: &[u8],
        batch: DirectBatch,
        outcome: Direct,
        wakers: &mut Vec<Waker>,
    ) {
        self.out.direct_busy = false;
        let DirectBatch {
            mut control,
            control_end,
        } = batch;
        let written = outcome.written;
        self.out.bytes_written += written as u64;
        self.out.flush_wanted |= outcome.unflushed;
        if written >= control.len() {
            // The control frames are out: wake whoever waited for them (closes, flushes).
            let data = self.out.data_written;
            self.written(data, control_end, 0, wakers);
        }
        let frame_taken = written > 0;
        if frame_taken {
            self.stats.frames_sent += 1;
            self.out.direct_writes = self.out.direct_writes.wrapping_add(1);
            self.out.direct_unseen = true;
        }
        // What the transport did not take: of the control frames, and of the frame once the
        // transport took some of the whole (a frame it took nothing of is queued instead).
        let header_bytes = header.to_bytes();
        let parts: [&[u8]; 3] = [&control, &header_bytes, payload];
        let unwritten = if frame_taken { &parts[..] } else { &parts[..1] };
        let total: usize = unwritten.iter().map(|part| part.len()).sum();
        let rest_len = total.saturating_sub(written);
        if rest_len > 0 {
            let rest = self.out.direct_rest.get_or_insert_with(Box::default);
            let mut skip = written;
            for part in unwritten {
                let start = skip.min(part.len());
                rest.bytes.extend_from_slice(&part[start..]);
                skip -= start;
            }
        }
        control.clear();
        let _ = DIRECT_CONTROL.try_with(|room| room.set(control));
        if !frame_taken {
            self.queue_data(key, header, payload);
        }
        if rest_len == 0 {
            return;
        }
        // First in the control queue: nothing but the control frames taken was to be written
        // when the write was admitted, and the driver took nothing since, so every entry queued
        // meanwhile goes in the same batch, after it.
        self.out.control.push_front(Control::DirectRest);
        self.out.control_pushed += 1;
        let mark = self.out.control_pushed as u32;
        if frame_taken {
            if let Some(stream) = self.streams.get_mut(key) {
                stream.control_mark = mark;
                stream.queued.set(Queued::IN_CONTROL, true);
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // The driver's side.

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

    /// Whether control frames wait to be taken.
    pub(crate) fn control_waiting(&self) -> bool {
        !self.out.control.is_empty()
    }

    /// Resolves every control frame queued into bytes in `control_buf`; returns the
    /// control-queue position after them. The driver takes them with each batch, and between
    /// two frames of a batch when they arrive while it is written, in both cases once the
    /// control frames taken before are written.
    ///
    /// When nothing is left to write (every entry was stale credit), that position is passed
    /// already and is reported here: no transport write will report it.
    pub(crate) fn take_control(
        &mut self,
        now: &Now,
        control_buf: &mut Vec<u8>,
        wakers: &mut Vec<Waker>,
    ) -> u64 {
        let before = control_buf.len();
        let entries = self.out.control.len();
        for _ in 0..entries {
            let Some(entry) = self.out.control.pop_front() else {
                break;
            };
            let header = match entry {
                Control::Frame(header) => header,
                Control::Credit { key, id } => match self.take_credit(key, id, now) {
                    Some(header) => header,
                    None => continue,
                },
                Control::DirectRest => {
                    let end = self.out.control_pushed - self.out.control.len() as u64;
                    if let Some(rest) = self.out.direct_rest.as_deref_mut() {
                        control_buf.extend_from_slice(&rest.bytes);
                        rest.taken = rest.bytes.len();
                        rest.taken_end = end;
                        rest.bytes.clear();
                    }
                    continue;
                }
            };
            control_buf.extend_from_slice(&header.to_bytes());
            self.stats.frames_sent += 1;
        }
        // Entries queued by `take_credit` (credit beyond one frame's 24 bits) go next time.
        let end = self.out.control_pushed - self.out.control.len() as u64;
        if control_buf.len() == before {
            let data = self.out.data_written;
            self.written(data, end, 0, wakers);
        }
        end
    }

    /// The WindowUpdate a credit entry stands for, if the stream still wants one.
    fn take_credit(&mut self, key: usize, id: u32, now: &Now) -> Option<Header> {
        let clock = self.clock;
        // A stale entry (its stream gone, perhaps its key reused) is skipped: the new stream
        // queues its own.
        let stream = self.streams.get_mut(key).filter(|s| s.id == id)?;
        if !stream.queued.has(Queued::CREDIT) {
            return None;
        }
        stream.queued.set(Queued::CREDIT, false);
        if !stream.peer_may_send() {
            return None; // The peer sends no more: credit would be wasted bytes.
        }
        // The probe starts now, as the frame goes to the transport, so that the round trip
        // measured holds no time this side spent queueing.
        let micros = micros_since(clock, now.get());
        stream.tuner.on_credit(stream.window.peer_credit(), micros);
        let credit = stream.window.take_update()?;
        let header = Header {
            id,
            length: credit,
            kind: Kind::WindowUpdate,
        };
        if stream.window.owes() {
            self.queue_credit(key);
        }
        Some(header)
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
        let spare_limit = send_queue::spare_limit(self.config.write_buffer_size);
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

    /// Streams whose last frame in the control queue is written forget its mark (see
    /// [`CONTROL_MARK_SWEEP`]).
    fn forget_written_marks(&mut self) {
        let written = self.out.control_written;
        for stream in self.streams.iter_mut() {
            if stream.queued.has(Queued::IN_CONTROL)
                && control_written_to(written, stream.control_mark)
            {
                stream.queued.set(Queued::IN_CONTROL, false);
            }
        }
    }

    /// Lets in writers and openers waiting for room in the send queues, oldest first, until
    /// what they mean to queue fills the room; returns whether any are left waiting. Each
    /// writer let in gets an equal share of the room (at least what it asked for), which it may
    /// use for several frames: with one frame each, the first of several writers let in at once
    /// took all the room left over, every batch, and six times the others' share of a link
    /// (`tests/core_findings_b.rs`, `eight_tuned_streams_on_one_long_fat_link_get_similar_shares`).
    ///
    /// Waking them all instead would wake every blocked task (tens of thousands with as many
    /// streams) for the few that fit, and all but those would queue up again: quadratic work.
    /// A woken task whose write was cancelled leaves its share unused; the driver passes unused
    /// room on (it calls this again whenever it finds the queue empty), so nobody waits behind
    /// it.
    pub(crate) fn wake_room(&mut self, wakers: &mut Vec<Waker>) -> bool {
        let epoch = self.out.grant_epoch;
        let out = &mut self.out;
        let Some(waits) = out.waits.as_deref_mut() else {
            return false;
        };
        let mut room = self
            .config
            .write_buffer_size
            .saturating_sub(out.queues.queued + out.reserved);
        let share = room / waits.room.len().max(1);
        while room > 0 {
            let Some(waiter) = waits.room.pop_front() else {
                break;
            };
            match waiter {
                RoomWaiter::Stream { key, id, want } => {
                    let Some(stream) = self.streams.get_mut(key).filter(|s| s.id == id) else {
                        continue;
                    };
                    if !stream.queued.has(Queued::ROOM) {
                        continue;
                    }
                    stream.queued.set(Queued::ROOM, false);
                    // A share is at most `write_buffer_size`, and a frame at most 8 + 2^24 - 1.
                    let grant = share.max(want).min(room.max(want));
                    stream.room_grant = RoomGrant::new(grant, epoch);
                    stream.wake_writer(WriteWait::Room, wakers);
                    out.reserved += stream.room_grant.bytes(epoch) as usize;
                    room = room.saturating_sub(grant);
                }
                RoomWaiter::Open { slot } => {
                    let Some(opener) = waits.openers.get_mut(slot) else {
                        continue;
                    };
                    if !opener.queued {
                        continue;
                    }
                    opener.queued = false;
                    opener.granted = Some(epoch);
                    wakers.extend(opener.waker.take());
                    out.reserved += HEADER_LEN;
                    room = room.saturating_sub(HEADER_LEN);
                }
            }
        }
        !waits.room.is_empty()
    }

    pub(crate) fn room_waiting(&self) -> bool {
        self.out.room_waiting()
    }

    // -----------------------------------------------------------------------------------------
    // Waiting, one entry per waiting future.

    /// The stream's writer waits for room for `want` bytes.
    pub(super) fn wait_for_room(&mut self, key: usize, waker: &Waker, want: usize) {
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        stream.wait_to_write(WriteWait::Room, waker);
        if !stream.queued.has(Queued::ROOM) {
            stream.queued.set(Queued::ROOM, true);
            let id = stream.id;
            let waiter = RoomWaiter::Stream { key, id, want };
            self.out.waits().room.push_back(waiter);
            self.prune_room();
        }
    }

    /// An `open` future waits for room, holding `slot` in the openers until it is dropped.
    pub(super) fn opener_waits(&mut self, slot: &mut Option<usize>, waker: &Waker) {
        let waits = self.out.waits();
        let key = match slot.filter(|&key| waits.openers.get(key).is_some()) {
            Some(key) => key,
            None => {
                let key = waits.openers.insert(Opener {
                    waker: None,
                    queued: false,
                    granted: None,
                });
                *slot = Some(key);
                key
            }
        };
        let Some(opener) = waits.openers.get_mut(key) else {
            return;
        };
        register(&mut opener.waker, waker);
        if !opener.queued {
            opener.queued = true;
            waits.room.push_back(RoomWaiter::Open { slot: key });
            self.prune_room();
        }
    }

    /// An `open` future is gone: its slot is given back (its queue entry, if any, is skipped).
    pub(crate) fn opener_gone(&mut self, slot: &mut Option<usize>) {
        if let (Some(key), Some(waits)) = (slot.take(), self.out.waits.as_deref_mut()) {
            waits.openers.remove(key);
        }
    }

    /// Drops queue entries of streams and openers that are gone, once they could be half of
    /// the queue, so that the queue stays within twice the futures waiting.
    fn prune_room(&mut self) {
        let Some(waits) = self.out.waits.as_deref_mut() else {
            return;
        };
        let live = self.streams.len() + waits.openers.len();
        if waits.room.len() <= 2 * live + 64 {
            return;
        }
        let (streams, openers) = (&self.streams, &waits.openers);
        waits.room.retain(|waiter| match *waiter {
            RoomWaiter::Stream { key, id, .. } => streams
                .get(key)
                .is_some_and(|s| s.id == id && s.queued.has(Queued::ROOM)),
            RoomWaiter::Open { slot } => openers.get(slot).is_some_and(|o| o.queued),
        });
    }

    /// Whether everything the stream queued, closes included, is written (or it is gone).
    pub(super) fn is_written(&self, key: usize) -> bool {
        self.streams.get(key).is_none_or(|s| {
            s.send_queue == NO_QUEUE
                && (!s.queued.has(Queued::IN_CONTROL)
                    || self.out.control_written_to(s.control_mark))
        })
    }

    /// The stream waits until its bytes are written: ready when they are.
    pub(super) fn wait_written(&mut self, key: usize, waker: &Waker) -> bool {
        if self.is_written(key) {
            return true;
        }
        let Some(stream) = self.streams.get_mut(key) else {
            return true;
        };
        stream.wait_to_write(WriteWait::Written, waker);
        // With a send queue, its end wakes the stream; otherwise the close in the control
        // queue does, once written.
        if stream.send_queue == NO_QUEUE && !stream.queued.has(Queued::FLUSH) {
            stream.queued.set(Queued::FLUSH, true);
            let entry = (stream.control_mark, key, stream.id);
            self.out.waits().flush_control.push_back(entry);
            self.prune_flush();
        }
        false
    }

    /// Drops entries of streams that are gone or no longer wait from the flush queue, once
    /// they could be half of it, so that it stays within twice the futures waiting.
    fn prune_flush(&mut self) {
        let Some(waits) = self.out.waits.as_deref_mut() else {
            return;
        };
        if waits.flush_control.len() <= 2 * self.streams.len() + 64 {
            return;
        }
        let streams = &self.streams;
        waits.flush_control.retain(|&(_, key, id)| {
            streams
                .get(key)
                .is_some_and(|s| s.id == id && s.queued.has(Queued::FLUSH))
        });
    }

    /// Wakes and forgets every waiter of the outgoing side (the session ended, or the transport
    /// refused a write): each sees why when it runs.
    pub(super) fn wake_all_outgoing(&mut self, wakers: &mut Vec<Waker>) {
        for stream in self.streams.iter_mut() {
            stream.queued.set(Queued::ROOM, false);
            stream.queued.set(Queued::FLUSH, false);
            stream.wake_all(wakers);
        }
        self.wake_openers(wakers);
        if let Some(waits) = self.out.waits.as_deref_mut() {
            waits.room.clear();
            waits.flush_control.clear();
        }
    }

    /// Every `open` waiting for room, to see a change that fails it.
    pub(super) fn wake_openers(&mut self, wakers: &mut Vec<Waker>) {
        let Some(waits) = self.out.waits.as_deref_mut() else {
            return;
        };
        for opener in waits.openers.iter_mut() {
            opener.queued = false;
            wakers.extend(opener.waker.take());
        }
    }

    /// Entries in the wait queues, for tests: writers and openers waiting for room, and
    /// streams waiting for their bytes to be written.
    #[cfg(test)]
    pub(super) fn waiting_entries(&self) -> (usize, usize) {
        let flushing = self
            .streams
            .iter()
            .filter(|s| s.write_wait == WriteWait::Written)
            .count();
        let room = self.out.waits.as_ref().map_or(0, |w| w.room.len());
        (room, flushing)
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

impl Outgoing {
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
