//! What happens to a received frame, and to received data as the application reads it: the
//! receive path, credit returned, and the growth of receive windows.

use std::task::{Poll, Waker};

use bytes::Bytes;
use tokio::time::Instant;

use super::outgoing::Control;
use super::recv_buf::{Payload, RecvBuffer, Source};
use super::stream_state::{PeerSaid, Queued, RecvState, StreamState, WriteWait};
use super::{bump, micros_since, Inner, Now, PeerKind, WaitList};
use crate::error::{Error, ProtocolError};
use crate::flow::add_send_credit;
#[cfg(test)]
use crate::frame::Frame;
use crate::frame::{Header, Kind, HEADER_LEN};
use crate::stopped::Stopped;
use crate::trace::event;

impl Inner {
    /// Applies one received frame; `source` is the read buffer its payload is a slice of. `Err`
    /// ends the session with that error.
    #[cfg(test)]
    pub(crate) fn on_frame(
        &mut self,
        frame: Frame,
        source: Source,
        now: Instant,
        wakers: &mut Vec<Waker>,
    ) -> Result<(), Error> {
        self.on_received(
            frame.header,
            Payload::Shared(frame.payload),
            source,
            now,
            wakers,
        )
    }

    /// Applies one received frame, its header and (for Data) its payload; `source` is the read
    /// buffer the payload is in. `Err` ends the session with that error.
    pub(crate) fn on_received(
        &mut self,
        header: Header,
        payload: Payload<'_>,
        source: Source,
        now: Instant,
        wakers: &mut Vec<Waker>,
    ) -> Result<(), Error> {
        if self.peer.kind == PeerKind::Unknown {
            self.peer.on_first_frame(&header);
            if self.peer.kind == PeerKind::Plain {
                // A plain peer answers nothing: the streams forgotten while it was unknown
                // leave the backlog.
                let forgotten = self.peer.unanswered.clear();
                self.peer.unacked = self.peer.unacked.saturating_sub(forgotten);
            }
            // Opens held for the greeting may go (towards a plain peer, all of them).
            self.wake_opener_if_able(wakers);
        }
        let Header { id, length, kind } = header;
        self.stats.frames_received += 1;
        self.stats.bytes_received += (HEADER_LEN + payload.len()) as u64;
        let about_a_stream = !matches!(kind, Kind::Keepalive | Kind::OpenStream | Kind::CloseMux);
        if self.peer.unanswered.len() > 0 && about_a_stream && self.key_of(id).is_none() {
            // The peer's answer to a stream of ours whose handle is gone: its acknowledgement
            // (or anything else it says first), or its refusal.
            let refused = kind == Kind::CloseStream && self.peer.greeted();
            self.answered_forgotten(id, refused, wakers);
        }
        match kind {
            Kind::Data => self.on_data(id, payload, source, now, wakers)?,
            Kind::WindowUpdate => self.on_window_update(id, length, wakers)?,
            Kind::OpenStream => self.on_open(id, wakers)?,
            Kind::CloseRead => self.on_peer_close(id, wakers, StreamState::on_peer_shut),
            Kind::CloseWrite => self.on_peer_close(id, wakers, StreamState::on_peer_stopped),
            Kind::CloseStream if self.peer.greeted() => {
                self.on_peer_close(id, wakers, |s| s.on_peer_closed(true))
            }
            Kind::CloseStream => self.on_peer_close(id, wakers, |s| s.on_peer_closed(false)),
            Kind::Keepalive => bump(&mut self.stats.keepalives_received, 1),
            Kind::CloseMux => {
                if self.peer.greeted() {
                    self.refuse_unacknowledged(wakers);
                }
                return Err(Error::ClosedByPeer);
            }
        }
        Ok(())
    }

    /// A greeted peer ended the session in order: it writes its CloseMux after every
    /// acknowledgement it queued, and hands its application no stream after it, so each stream
    /// of ours it has not acknowledged never reached its application. They fail with
    /// [`Error::Refused`] (safe to retry), and forgotten ones are counted and logged as
    /// refused.
    fn refuse_unacknowledged(&mut self, wakers: &mut Vec<Waker>) {
        for id in self.peer.unanswered.take_all() {
            self.peer.unacked = self.peer.unacked.saturating_sub(1);
            self.forgotten_refused(id);
        }
        let unacknowledged: Vec<u32> = self
            .streams
            .iter()
            .filter(|stream| stream.peer == PeerSaid::Nothing)
            .map(|stream| stream.id)
            .collect();
        for id in unacknowledged {
            self.on_peer_close(id, wakers, |s| s.on_peer_closed(true));
        }
    }

    /// The peer answered stream `id` of ours, whose handle is gone: it leaves the backlog. A
    /// refusal is counted and logged, as nobody is left to see it.
    fn answered_forgotten(&mut self, id: u32, refused: bool, wakers: &mut Vec<Waker>) {
        if !self.peer.unanswered.remove(id) {
            return;
        }
        if refused {
            self.forgotten_refused(id);
        }
        self.acknowledged(wakers);
    }

    /// Counts and logs the refusal of a stream of ours whose handle is gone.
    fn forgotten_refused(&mut self, _id: u32) {
        bump(&mut self.stats.refused_by_peer, 1);
        event!(
            warn,
            session = self.id,
            stream = _id,
            "the peer refused a stream whose handle was dropped: what was written on it never \
             reached the peer's application"
        );
    }

    fn stream_by_id(&mut self, id: u32) -> Option<&mut StreamState> {
        let key = self.key_of(id)?;
        self.streams.get_mut(key)
    }

    fn on_data(
        &mut self,
        id: u32,
        payload: Payload<'_>,
        source: Source,
        now: Instant,
        wakers: &mut Vec<Waker>,
    ) -> Result<(), Error> {
        let (micros, min_rtt) = (micros_since(self.clock, now), self.min_rtt.get());
        let Some(key) = self.key_of(id) else {
            return Ok(()); // Unknown or closed: races with a local close.
        };
        let Some(stream) = self.streams.get_mut(key) else {
            return Ok(());
        };
        if stream.recv == RecvState::PeerShut {
            return Err(ProtocolError::DataAfterClose { id }.into());
        }
        if stream.peer.heard() {
            // Data before any acknowledgement: the peer's application has the stream.
            self.acknowledged(wakers);
        }
        let Some(stream) = self.streams.get_mut(key) else {
            return Ok(());
        };
        let length = payload.len() as u32;
        stream
            .window
            .receive(length)
            .map_err(|credit| ProtocolError::WindowExceeded { id, length, credit })?;
        let target = stream.window.target();
        let buffered = stream.buffer.len();
        let rtt_sample = stream
            .tuner
            .on_data(length, buffered, target, min_rtt, micros);
        if stream.recv == RecvState::Stopped {
            // This side stopped reading; the frame was in flight. Its credit is not returned:
            // the peer's writes fail from now on anyway.
            return Ok(());
        }
        stream
            .buffer
            .push(payload, source, &mut self.tail_pool, &mut self.pins);
        wakers.extend(stream.read_waker.take());
        self.count_buffered(i64::from(length));
        if let Some(sample) = rtt_sample {
            self.min_rtt.sample(sample);
        }
        if self.pins.needs_compaction(self.stats.buffered) {
            self.compact_pinned();
        }
        Ok(())
    }

    /// Copies every buffered slice of a read buffer out, so the read buffers can go (see
    /// `recv_buf`).
    fn compact_pinned(&mut self) {
        let _before = self.pins.pinned();
        for stream in self.streams.iter_mut() {
            stream.buffer.compact(&mut self.pins);
        }
        event!(
            debug,
            session = self.id,
            pinned = _before,
            buffered = self.stats.buffered,
            "received data compacted"
        );
    }

    fn on_window_update(
        &mut self,
        id: u32,
        increment: u32,
        wakers: &mut Vec<Waker>,
    ) -> Result<(), Error> {
        let Some(stream) = self.stream_by_id(id) else {
            return Ok(()); // Unknown or closed: races with a local close.
        };
        stream.send_credit = add_send_credit(stream.send_credit, increment).ok_or(
            ProtocolError::WindowOverflow {
                id,
                credit: stream.send_credit,
                increment,
            },
        )?;
        let first = stream.peer.heard();
        if increment > 0 {
            stream.wake_writer(WriteWait::Credit, wakers);
        }
        if first {
            // A peer of this crate acknowledges a stream its application accepted with a
            // WindowUpdate, perhaps of 0.
            self.acknowledged(wakers);
        }
        Ok(())
    }

    fn on_open(&mut self, id: u32, wakers: &mut Vec<Waker>) -> Result<(), Error> {
        if !self.role.is_peer_id(id) {
            return Err(ProtocolError::WrongParity { id }.into());
        }
        if self.ids.contains_key(&id) {
            return Err(ProtocolError::DuplicateStream { id }.into());
        }
        if self.life.ended() {
            // The session is closing: the peer's stream fails with our CloseMux, and a refusal
            // would only add to what the closing driver has to write.
            return Ok(());
        }
        if self.life.draining()
            || self.accept_queue.len() >= self.config.accept_backlog
            || self.streams.len() >= self.config.max_streams
        {
            self.queue_control(Control::Frame(Header::new(id, Kind::CloseStream)));
            bump(&mut self.stats.streams_refused, 1);
            event!(
                debug,
                session = self.id,
                stream = id,
                "inbound stream refused"
            );
            return Ok(());
        }
        bump(&mut self.stats.streams_accepted, 1);
        event!(
            trace,
            session = self.id,
            stream = id,
            "peer opened a stream"
        );
        // The accept queue holds the stream's handles until `accept` hands them out. Its
        // window, if above the initial one, is announced when it is accepted: that is the
        // acknowledgement (see `poll_accept`).
        let key = self.insert_stream(id);
        if let Some(stream) = self.streams.get_mut(key) {
            let _ = stream.peer.heard(); // It opened the stream.
        }
        if self.accept_queue.capacity() == 0 {
            // Room for one at first (the default is four): most sessions accept streams one
            // at a time, and an idle one holds less until it goes quiet.
            self.accept_queue.reserve_exact(1);
        }
        self.accept_queue.push_back(key);
        self.accept_waiters.wake_all(wakers);
        Ok(())
    }

    /// The peer said its first word about a stream of ours (acknowledged it, refused or closed
    /// it): it leaves the backlog, and the next open waiting may go.
    fn acknowledged(&mut self, wakers: &mut Vec<Waker>) {
        self.peer.unacked = self.peer.unacked.saturating_sub(1);
        self.wake_opener_if_able(wakers);
    }

    fn on_peer_close(
        &mut self,
        id: u32,
        wakers: &mut Vec<Waker>,
        apply: impl FnOnce(&mut StreamState),
    ) {
        let Some(key) = self.key_of(id) else {
            return;
        };
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        let first = stream.peer == PeerSaid::Nothing;
        apply(stream);
        let refused = first && stream.peer.stopped() == Some(Stopped::Refused);
        bump(&mut self.stats.refused_by_peer, u32::from(refused));
        stream.wake_all(wakers);
        if first {
            self.acknowledged(wakers);
        }
        self.note_finished(key);
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if stream.peer.stopped().is_some() && stream.queued.has(Queued::STOP) {
            // Every waiter, not only the last to poll: the futures give their slots back
            // when they go. (One waker per stream once left all but one task waiting:
            // `tests/close_core.rs`, `stopped_wakes_every_task_waiting_on_it`.)
            if let Some(list) = self
                .rare
                .as_mut()
                .and_then(|rare| rare.stop_waiters.get_mut(&key))
            {
                list.wake_all(wakers);
            }
        }
    }

    /// Adds a stream's state. A receive window above the protocol's initial one is owed to the
    /// peer from the start: `poll_open` announces it behind its OpenStream, `on_open` with the
    /// control frames (the peer knows the stream already).
    pub(super) fn insert_stream(&mut self, id: u32) -> usize {
        let stream = StreamState::new(id, self.config.receive_window);
        let key = self.streams.insert(stream);
        self.unfinished += 1;
        // Every stream with state has its own 32-bit id, so the slab's keys fit in 32 bits.
        self.ids.insert(id, key as u32);
        key
    }

    /// The slab key of the stream with wire id `id`, if it has state.
    fn key_of(&self, id: u32) -> Option<usize> {
        self.ids.get(&id).map(|&key| key as usize)
    }

    // -----------------------------------------------------------------------------------------
    // The application's side.

    /// Hands out the next inbound stream.
    pub(crate) fn poll_accept(
        &mut self,
        waker: &Waker,
        slot: &mut Option<usize>,
    ) -> Poll<Result<(usize, u32), Error>> {
        if self.life.closing_gracefully() && !self.life.ended() {
            return Poll::Ready(Err(Error::ClosedLocally));
        }
        let greeted = self.peer.greeted();
        // Once this side has queued its CloseMux, no acknowledgement could go before it, and a
        // greeted peer takes every stream unacknowledged by then as refused: none is handed
        // out any more.
        let refused_by_close_mux = greeted && self.life.sends_close_mux();
        let next = if refused_by_close_mux {
            None
        } else {
            self.accept_queue.pop_front()
        };
        if let Some(key) = next {
            let ended = self.life.ended();
            let Some(stream) = self.streams.get_mut(key) else {
                return Poll::Ready(Ok((key, 0)));
            };
            let id = stream.id;
            // The acknowledgement a peer of this crate waits for (its backlog, and how it tells
            // a refusal from a close), carrying the window above the initial one if any; sent
            // for a stream it closed already too, whose record in its backlog waits for it. A
            // Go peer needs only the window.
            let credit = stream.window.take_update();
            let acknowledge = greeted && !ended;
            if acknowledge || stream.may_send_frames() && credit.is_some() {
                self.queue_control(Control::Frame(Header {
                    id,
                    length: credit.unwrap_or(0),
                    kind: Kind::WindowUpdate,
                }));
            }
            if self.streams.get(key).is_some_and(|s| s.window.owes()) {
                self.queue_credit(key);
            }
            return Poll::Ready(Ok((key, id)));
        }
        if let Some(error) = self.end_reason() {
            return Poll::Ready(Err(error.clone()));
        }
        self.accept_waiters.register(slot, waker);
        Poll::Pending
    }

    /// An `accept` future (or `Incoming`) is gone.
    pub(crate) fn accept_waiter_gone(&mut self, slot: &mut Option<usize>) {
        self.accept_waiters.remove(slot);
    }

    pub(crate) fn poll_read(
        &mut self,
        key: usize,
        waker: &Waker,
        now: &Now,
        dst: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<Result<(), Error>> {
        self.poll_read_with(key, waker, now, |buffer, pins| {
            let read = buffer.read_into(dst, pins);
            (read, ())
        })
        .map_ok(drop)
    }

    /// Hands out up to `max` buffered bytes without copying them; `None` at end of stream.
    pub(crate) fn poll_read_chunk(
        &mut self,
        key: usize,
        waker: &Waker,
        now: &Now,
        max: usize,
    ) -> Poll<Result<Option<Bytes>, Error>> {
        self.poll_read_with(key, waker, now, |buffer, pins| {
            let chunk = buffer.take_chunk(max, pins);
            (chunk.len(), chunk)
        })
    }

    /// The read path shared by `poll_read` and `poll_read_chunk`: `read` takes buffered data
    /// and says how much. `Ok(None)` is end of stream.
    fn poll_read_with<R>(
        &mut self,
        key: usize,
        waker: &Waker,
        now: &Now,
        read: impl FnOnce(&mut RecvBuffer, &mut super::recv_buf::PinLedger) -> (usize, R),
    ) -> Poll<Result<Option<R>, Error>> {
        let clock = self.clock;
        let (min_rtt, ended) = (self.min_rtt.get(), self.life.ended());
        let Some(stream) = self.streams.get_mut(key) else {
            return Poll::Ready(Ok(None));
        };
        if stream.recv == RecvState::Stopped {
            return Poll::Ready(Ok(None));
        }
        if !stream.buffer.is_empty() {
            let (count, result) = read(&mut stream.buffer, &mut self.pins);
            stream.window.consume(count as u32);
            stream.buffer.give_back_tail(&mut self.tail_pool);
            let target = stream.window.target();
            // Only a reader that drains its buffer promptly shows that the window, not the
            // reader, is what limits the stream.
            let low = stream.buffer.len() <= target / 4;
            let grow = stream
                .tuner
                .on_read(low, min_rtt, || micros_since(clock, now.get()));
            let due = stream.window.update_due();
            let peer_may_send = stream.peer_may_send();
            self.count_buffered(-(count as i64));
            if !ended && peer_may_send {
                if grow {
                    self.grow_window(key);
                } else if due {
                    self.queue_credit(key);
                }
            }
            return Poll::Ready(Ok(Some(result)));
        }
        if stream.refused() {
            return Poll::Ready(Err(Error::Refused));
        }
        if stream.recv == RecvState::PeerShut {
            return Poll::Ready(Ok(None)); // End of stream.
        }
        if let Some(error) = self.life.end_reason() {
            return Poll::Ready(Err(error.clone()));
        }
        super::stream_state::register(&mut stream.read_waker, waker);
        Poll::Pending
    }

    /// Doubles a stream's receive window, within the per-stream ceiling and the session's
    /// budget (see [`crate::flow::Tuner`]), and queues the new credit.
    fn grow_window(&mut self, key: usize) {
        let ceiling = self.config.window_ceiling();
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        let target = stream.window.target();
        let extra = target.min(ceiling.saturating_sub(target));
        let extra = u64::from(extra).min(self.window_budget) as u32;
        if extra > 0 {
            self.window_budget -= u64::from(extra);
            stream.window.grow(extra);
            event!(
                trace,
                session = self.id,
                stream = stream.id,
                window = target + extra,
                "receive window grown"
            );
        }
        if stream.window.update_due() {
            self.queue_credit(key);
        }
    }

    /// How the peer stopped taking data on the stream, once it has; otherwise registers the
    /// task to wake when it does, or when the session ends (then `Err`).
    pub(crate) fn poll_stopped(
        &mut self,
        key: usize,
        waker: &Waker,
        slot: &mut Option<usize>,
    ) -> Poll<Result<Stopped, Error>> {
        let ended = self.life.end_reason().cloned();
        let Some(stream) = self.streams.get_mut(key) else {
            return Poll::Ready(Err(ended.unwrap_or(Error::ClosedLocally)));
        };
        if let Some(how) = stream.peer.stopped() {
            return Poll::Ready(Ok(how));
        }
        if let Some(error) = ended {
            return Poll::Ready(Err(error));
        }
        stream.queued.set(Queued::STOP, true);
        self.rare()
            .stop_waiters
            .entry(key)
            .or_insert_with(WaitList::new)
            .register(slot, waker);
        Poll::Pending
    }

    /// A `stopped()` future on the stream is gone: its slot is given back, and the stream's
    /// list once it is empty.
    pub(crate) fn stop_waiter_gone(&mut self, key: usize, slot: &mut Option<usize>) {
        let Some(rare) = self.rare.as_mut() else {
            *slot = None;
            return;
        };
        let Some(list) = rare.stop_waiters.get_mut(&key) else {
            *slot = None;
            return;
        };
        list.remove(slot);
        if list.is_empty() {
            rare.stop_waiters.remove(&key);
            if let Some(stream) = self.streams.get_mut(key) {
                stream.queued.set(Queued::STOP, false);
            }
        }
    }

    /// How the peer stopped taking data on the stream, if it has.
    pub(crate) fn peer_stopped(&self, key: usize) -> Option<Stopped> {
        self.streams.get(key).and_then(|s| s.peer.stopped())
    }

    /// Bytes buffered for reading on the stream.
    pub(crate) fn buffered(&self, key: usize) -> usize {
        self.streams.get(key).map_or(0, |s| s.buffer.len() as usize)
    }
}
