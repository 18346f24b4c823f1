//! The control queue: what a session sends that is not ordered with a stream's frames. Credit
//! owed (WindowUpdate, at most one entry per stream, its amount taken when it is written),
//! refusals, keepalives, and the opens and closes of streams with nothing in their send queues.
//!
//! - The driver writes all of it ahead of the data at the start of every batch, as h2 writes
//!   its pending WINDOW_UPDATEs before any data, so that a side busy sending never stops
//!   returning credit for what it receives (`tests/core_findings_a.rs`, `credit_flows_back_*`).
//! - Control queued while a batch is being written goes out at the batch's next recorded frame
//!   boundary (`batch.rs`): it waits behind at most `BOUNDARY_SPACING` of data plus one frame
//!   (`core::tests::control_queued_mid_batch_goes_out_at_the_next_boundary`).
//! - The queue is bounded by stopping to read: while it holds more than
//!   [`Inner::control_limit`] entries, the driver reads nothing (a peer that never reads our
//!   answers cannot grow it), as h2 and yamux do.
//! - A stream whose frame waits here keeps the queue position after it (its mark), which its
//!   flush and `is_written` wait for; positions wrap at 32 bits (see [`CONTROL_MARK_SWEEP`]).

use std::task::Waker;

use super::super::stream_state::{Queued, NO_QUEUE};
use super::super::{bump, micros_since, Inner, Now};
use super::Outgoing;
use crate::frame::{Header, Kind};

/// An entry of the control queue.
pub(in crate::session::core) enum Control {
    /// Credit owed to the peer on a stream; the amount is taken when the driver writes it.
    Credit { key: usize, id: u32 },
    /// A frame without payload: a refusal, a close, a keepalive.
    Frame(Header),
    /// What the transport did not take of a direct write (`Outgoing::direct_rest`): first in
    /// the queue, and first on the wire.
    DirectRest,
}

/// Whether the control queue is written up to `mark`, a position (wrapping) in it, as of
/// `written`. Right while `mark` is less than 2^31 entries behind or ahead: a mark not yet
/// written is at most the control queue's bound ahead, and [`Inner::forget_written_marks`]
/// drops written marks before they are 2^31 behind.
pub(in crate::session::core) fn control_written_to(written: u64, mark: u32) -> bool {
    (written as u32).wrapping_sub(mark) < 1 << 31
}

/// Every 2^30 control entries written, streams forget the marks of their frames written by
/// then (see `StreamState::control_mark`): a mark kept is never more than 2^31 behind, where
/// its wrapping comparison would turn back to unwritten (and a flush of a stream whose close
/// went out long before would wait for 2^31 more). One pass over the streams per 2^30 control
/// frames.
pub(in crate::session::core) const CONTROL_MARK_SWEEP: u32 = 30;

/// Opens go in the control queue only while it holds fewer entries than this (see
/// [`Inner::queue_open`]): with a transport that takes nothing, at most this many opens pass
/// without waiting for room.
pub(in crate::session::core) const OPENS_IN_CONTROL: usize = 64;

impl Outgoing {
    /// Whether the control queue is written up to `mark` (a wrapping position).
    pub(in crate::session::core) fn control_written_to(&self, mark: u32) -> bool {
        control_written_to(self.control_written, mark)
    }

    /// As if `n` more control entries had been pushed (and taken): the position after them.
    #[cfg(test)]
    pub(in crate::session::core) fn pass_control(&mut self, n: u64) -> u64 {
        self.control_pushed += n;
        self.control_pushed
    }
}

impl Inner {
    /// Appends an entry to the control queue; returns the position after it.
    pub(in crate::session::core) fn queue_control(&mut self, control: Control) -> u64 {
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
    pub(in crate::session::core) fn queue_credit(&mut self, key: usize) {
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
    /// that it goes out at once and counts in the control queue's bound
    /// (`tests/model.proptest-regressions`).
    pub(in crate::session::core) fn queue_close(&mut self, key: usize, kind: Kind) {
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
    pub(in crate::session::core) fn queue_open(
        &mut self,
        key: usize,
        header: Header,
        announce: Option<Header>,
    ) {
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
        bump(&mut self.stats.keepalives_sent, 1);
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
    pub(in crate::session::core) fn control_len(&self) -> usize {
        self.out.control.len()
    }

    /// Whether the control queue is over its bound, so reading must wait for it to drain.
    pub(crate) fn control_over_limit(&self) -> bool {
        self.out.control.len() > self.control_limit()
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
        let mut taken = false;
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
                        taken |= !rest.bytes.is_empty();
                        rest.taken = rest.bytes.len();
                        rest.taken_end = end;
                        rest.bytes.clear();
                    }
                    continue;
                }
            };
            control_buf.extend_from_slice(&header.to_bytes());
            taken = true;
            self.stats.frames_sent += 1;
        }
        // Entries queued by `take_credit` (credit beyond one frame's 24 bits) go next time.
        let end = self.out.control_pushed - self.out.control.len() as u64;
        if !taken {
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

    /// Streams whose last frame in the control queue is written forget its mark (see
    /// [`CONTROL_MARK_SWEEP`]).
    pub(in crate::session::core) fn forget_written_marks(&mut self) {
        let written = self.out.control_written;
        for stream in self.streams.iter_mut() {
            if stream.queued.has(Queued::IN_CONTROL)
                && control_written_to(written, stream.control_mark)
            {
                stream.queued.set(Queued::IN_CONTROL, false);
            }
        }
    }
}
