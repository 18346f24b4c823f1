//! What the application sends: opens, writes, half-closes and closes, flushes, and the stream
//! handles going away.

use std::task::{Poll, Waker};

use super::stream_state::{Closed, PeerSaid, Queued, RecvState, SendState, WriteWait};
use super::write_waits::Blocked;
use super::{bump, Inner};
use crate::error::Error;
use crate::frame::{Header, Kind, HEADER_LEN};
use crate::trace::event;

impl Inner {
    /// Opens a stream: the next free id of this side's parity, announced with OpenStream.
    ///
    /// An `open` future waits, in one line in order of arrival (`line`, see `peer.rs`), while
    /// `max_streams` streams are live or the peer has `open_backlog` of ours unacknowledged;
    /// then, holding its place, for room in the send queues (`slot` among the openers).
    /// `try_open` (`wait` false) waits for nothing: it fails with `TooManyStreams` where `open`
    /// would wait in line, and queues its OpenStream even beyond the data queue's bound (the
    /// streams it may open are bounded by `max_streams`).
    pub(crate) fn poll_open(
        &mut self,
        waker: &Waker,
        slot: &mut Option<usize>,
        line: &mut Option<usize>,
        wait: bool,
        wakers: &mut Vec<Waker>,
    ) -> Poll<Result<(usize, u32), Error>> {
        // Every failure comes before any frame of the stream is queued: an open's error is
        // always safe to retry.
        if let Some(error) = self.life.unusable() {
            return Poll::Ready(Err(Error::SessionUnavailable(Box::new(error.clone()))));
        }
        if self.life.closing_gracefully() {
            return Poll::Ready(Err(Error::SessionUnavailable(Box::new(
                Error::ClosedLocally,
            ))));
        }
        let now = tokio::time::Instant::now();
        if !self.peer.first_in_line(*line) || !self.may_open(now) {
            if !wait {
                return Poll::Ready(Err(Error::TooManyStreams));
            }
            self.peer.wait(line, waker);
            return Poll::Pending;
        }
        if wait && !self.take_opener_grant(*slot) && !self.data_has_room() {
            self.opener_waits(slot, waker);
            return Poll::Pending;
        }
        self.peer.leave(line);
        self.peer.unacked += 1;
        // Ids wrap at 2^32; skip any still live or waiting for its answer. `max_streams` and
        // `open_backlog` are clamped below 2^30 each, which guarantees a free one.
        let mut id = self.next_id;
        while self.ids.contains_key(&id) || self.peer.unanswered.contains(id) {
            id = id.wrapping_add(2);
        }
        self.next_id = id.wrapping_add(2);
        let key = self.insert_stream(id);
        let announce = self
            .streams
            .get_mut(key)
            .and_then(|s| s.window.take_update())
            .map(|credit| Header {
                id,
                length: credit,
                kind: Kind::WindowUpdate,
            });
        self.queue_open(key, Header::new(id, Kind::OpenStream), announce);
        bump(&mut self.stats.streams_opened, 1);
        event!(trace, session = self.id, stream = id, "stream opened");
        // The next in line may open too.
        self.wake_opener_if_able(wakers);
        Poll::Ready(Ok((key, id)))
    }

    /// Queues a Data frame with as much of `chunk` as credit and room allow at once, without
    /// copying it, and advances `chunk` past it (the writers' path without direct writes, for
    /// the core's unit tests).
    #[cfg(test)]
    pub(crate) fn poll_write_chunk(
        &mut self,
        key: usize,
        waker: &Waker,
        chunk: &mut bytes::Bytes,
    ) -> Poll<Result<usize, Error>> {
        self.poll_write_chunk_admit(key, waker, chunk, None, &mut Vec::new())
            .map_ok(|(admitted, _)| admitted.n)
    }

    /// Queues a Data frame with as much of `data` as credit and room allow at once (the
    /// writers' path without direct writes, for the core's unit tests).
    #[cfg(test)]
    pub(crate) fn poll_write(
        &mut self,
        key: usize,
        waker: &Waker,
        data: &[u8],
    ) -> Poll<Result<usize, Error>> {
        self.poll_write_admit(key, waker, data, None, &mut Vec::new())
            .map_ok(|admitted| admitted.n)
    }

    /// Admits a write of up to `len` bytes: the stream's id and how many bytes may go in one
    /// frame now (0 only when `len` is), with the credit for them taken. Pending, with the
    /// waker registered for what is missing, while the stream has no credit or the data queue
    /// no room.
    pub(super) fn grant_write(
        &mut self,
        key: usize,
        waker: &Waker,
        len: usize,
    ) -> Poll<Result<(u32, usize), Error>> {
        // A writer let in writes within the room kept for it, so that the writers let in
        // together stay within the queue's size.
        let granted = self.room_granted(key).saturating_sub(HEADER_LEN);
        let room = granted > 0 || self.data_has_room();
        let waited = self
            .rare
            .as_mut()
            .and_then(|rare| rare.write_waits.take(key));
        let Some(stream) = self.streams.get(key) else {
            return Poll::Ready(Err(Error::WriteClosed));
        };
        let error = stream
            .write_error()
            .or_else(|| self.life.unusable().cloned());
        if let Some(error) = error {
            // A writer let in that fails now never uses its grant.
            self.release_room_grant(key);
            return Poll::Ready(Err(error));
        }
        let Some(stream) = self.streams.get_mut(key) else {
            return Poll::Ready(Err(Error::WriteClosed));
        };
        if len == 0 {
            return Poll::Ready(Ok((stream.id, 0)));
        }
        if stream.send_credit == 0 {
            stream.wait_to_write(WriteWait::Credit, waker);
            self.rare()
                .write_waits
                .blocked(key, Blocked::Credit, waited);
            return Poll::Pending;
        }
        // Use whatever credit there is: a partial frame now beats a whole one later.
        let mut n = len
            .min(stream.send_credit as usize)
            .min(self.config.max_payload);
        if granted > 0 {
            n = n.min(granted);
        }
        if !room {
            self.wait_for_room(key, waker, HEADER_LEN + n);
            self.rare().write_waits.blocked(key, Blocked::Room, waited);
            return Poll::Pending;
        }
        stream.send_credit -= n as u32;
        stream.write_wait = WriteWait::Idle;
        let id = stream.id;
        if granted > 0 {
            self.use_room_grant(key, HEADER_LEN + n);
        }
        Poll::Ready(Ok((id, n)))
    }

    /// `flush` and `shutdown`: ready at once while the session lives and its transport takes
    /// writes, since what the stream queued is then on its way (the driver writes the queues in
    /// order, with no further call); otherwise as [`Inner::poll_written`], so that bytes that
    /// may never be written are reported rather than taken for sent.
    ///
    /// Waiting for the transport every time would cost each flush a wake-up after the driver's
    /// next write, which for thousands of short streams is much of their cost (the `streams`
    /// bench measures it).
    pub(crate) fn poll_flush(&mut self, key: usize, waker: &Waker) -> Poll<Result<(), Error>> {
        if self.refused(key) {
            return Poll::Ready(Err(Error::Refused));
        }
        if self.life.unusable().is_none() {
            return Poll::Ready(Ok(()));
        }
        self.poll_written(key, waker)
    }

    /// Ready once everything the stream queued, closes included, has been written to the
    /// transport.
    pub(crate) fn poll_written(&mut self, key: usize, waker: &Waker) -> Poll<Result<(), Error>> {
        if self.refused(key) {
            // What it wrote never reached the peer's application.
            return Poll::Ready(Err(Error::Refused));
        }
        if self.is_written(key) {
            return Poll::Ready(Ok(()));
        }
        if let Some(error) = self.life.write_failed() {
            return Poll::Ready(Err(error.clone()));
        }
        if self.life.finished() {
            // The driver is gone and this stream's bytes never reached the transport.
            let error = self.end_reason().cloned().unwrap_or(Error::ClosedLocally);
            return Poll::Ready(Err(error));
        }
        if self.wait_written(key, waker) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// Half-close of the write side: CloseRead on the wire, after the data written.
    pub(crate) fn shutdown(&mut self, key: usize) {
        let ended = self.life.ended();
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if stream.send == SendState::Shut {
            return;
        }
        stream.send = SendState::Shut;
        if stream.may_send_frames() && !ended {
            self.queue_close(key, Kind::CloseRead);
        }
        self.note_finished(key);
    }

    /// Close of the read side: CloseWrite on the wire; buffered and arriving data is discarded.
    pub(crate) fn close_read(&mut self, key: usize) {
        let ended = self.life.ended();
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if stream.recv == RecvState::Stopped {
            return;
        }
        let send = stream.may_send_frames() && !ended;
        let discarded = self.stop_reading(key);
        if let Some(stream) = self.streams.get_mut(key) {
            stream.window.consume(discarded);
        }
        if send {
            self.queue_close(key, Kind::CloseWrite);
        }
        self.note_finished(key);
    }

    /// Full close: CloseStream on the wire, after the data written.
    pub(crate) fn close_stream(&mut self, key: usize) {
        let ended = self.life.ended();
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if stream.closed == Closed::ByUs {
            return;
        }
        stream.send = SendState::Shut;
        let send = stream.may_send_frames() && !ended;
        if stream.closed == Closed::No {
            stream.closed = Closed::ByUs;
        }
        self.stop_reading(key);
        if send {
            self.queue_close(key, Kind::CloseStream);
        }
        self.note_finished(key);
    }

    /// A handle goes away: a reading one (`reader`), a writing one (`writer`), or a `Stream`
    /// or a place in the accept queue (both). When the last reader goes the stream stops
    /// reading on the wire, as `close_read` (so a peer blocked on credit learns it, instead of
    /// waiting for ever); when the last writer goes it shuts its writing down, as tokio's
    /// `OwnedWriteHalf` does on drop (so the peer reads end-of-stream). When both are gone it
    /// closes (CloseStream, unless either side already sent one) and its id is free. Data
    /// written before is already queued ahead of these frames. Guarded by
    /// `tests/core_findings_b.rs` (`dropping_*_half_*`).
    pub(crate) fn release(&mut self, key: usize, reader: bool, writer: bool) {
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if reader {
            stream.readers = stream.readers.saturating_sub(1);
        }
        if writer {
            stream.writers = stream.writers.saturating_sub(1);
        }
        match (stream.readers, stream.writers) {
            (0, 0) => self.remove_stream(key),
            (0, _) if reader => self.close_read(key),
            (_, 0) if writer => self.shutdown(key),
            _ => {}
        }
    }

    /// Stops the stream's reading: what it buffered is dropped and counted out. Returns how much
    /// that was.
    fn stop_reading(&mut self, key: usize) -> u32 {
        let Some(stream) = self.streams.get_mut(key) else {
            return 0;
        };
        stream.recv = RecvState::Stopped;
        let discarded = stream.buffer.discard(&mut self.pins);
        self.count_buffered(-i64::from(discarded));
        discarded
    }

    /// Closes the stream for good and forgets it.
    fn remove_stream(&mut self, key: usize) {
        self.release_room_grant(key);
        let ended = self.life.ended();
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        let id = stream.id;
        let send_close = stream.closed == Closed::No && !ended;
        if stream.peer == PeerSaid::Nothing {
            // Ours, unanswered: it keeps its place in the backlog until the peer answers (its
            // CloseStream below, or the one queued already, makes sure the peer does), unless
            // no answer is waited for. Then it leaves the backlog (the caller wakes the next
            // open).
            if !ended
                && self
                    .peer
                    .holds_opens(tokio::time::Instant::now(), self.clock)
            {
                self.peer.unanswered.insert(id);
            } else {
                self.peer.unacked -= 1;
            }
        }
        if let Some(rare) = &mut self.rare {
            // No `stopped()` future outlives the handles; this only keeps the map exact.
            rare.stop_waiters.remove(&key);
            rare.priorities.remove(&key);
        }
        let grown = stream
            .window
            .target()
            .saturating_sub(self.config.receive_window);
        self.window_budget += u64::from(grown);
        let _unread = self.stop_reading(key);
        if send_close {
            self.queue_close(key, Kind::CloseStream);
        }
        if self
            .streams
            .get(key)
            .is_some_and(|s| !s.queued.has(Queued::FINISHED))
        {
            self.unfinished = self.unfinished.saturating_sub(1);
        }
        self.streams.remove(key);
        self.ids.remove(&id);
        if let Some(rare) = &mut self.rare {
            rare.write_waits.forget(key);
        }
        event!(
            trace,
            session = self.id,
            stream = id,
            unread = _unread,
            "stream closed"
        );
    }
}

pub(super) fn data_header(id: u32, n: usize) -> Header {
    Header {
        id,
        length: n as u32,
        kind: Kind::Data,
    }
}

impl Inner {
    /// Whether the peer refused the stream (see [`Error::Refused`]).
    pub(super) fn refused(&self, key: usize) -> bool {
        self.streams.get(key).is_some_and(|s| s.refused())
    }

    /// An `open` future waiting in line is gone: its place goes to the next.
    pub(crate) fn open_line_gone(&mut self, line: &mut Option<usize>) {
        self.peer.leave(line);
        let mut wakers = Vec::new();
        self.wake_opener_if_able(&mut wakers);
        // Under the lock, as the future is dropped where no waker list is at hand; waking
        // only schedules the task.
        wakers.into_iter().for_each(Waker::wake);
    }

    /// When an open waiting in line stops waiting for a greeting that has not come (see
    /// `peer::GREETING_WAIT`), if it waits for one and that time is still to come (past it,
    /// only an acknowledgement or a stream going away lets it in, and those wake it).
    pub(crate) fn open_deadline(&self, line: Option<usize>) -> Option<tokio::time::Instant> {
        let deadline = super::peer::greeting_deadline(self.clock);
        (line.is_some()
            && self.peer.kind == super::PeerKind::Unknown
            && tokio::time::Instant::now() < deadline)
            .then_some(deadline)
    }
}
