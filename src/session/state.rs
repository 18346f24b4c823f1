//! The state a session shares between its driver and its handles, and everything that changes
//! it: the stream table, the outgoing frame queue, and the handling of received frames.
//!
//! Nothing here does I/O or waits. The driver feeds received frames in and takes queued bytes
//! out; stream handles read, write and close through it. One mutex guards it all, and it is
//! never held across an `.await` or a transport call: writers copy into the outgoing queue under
//! it, the driver swaps that queue out under it and writes outside it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use tokio::time::Instant;

use super::out_queue::OutQueue;
use super::slab::Slab;
use super::wait_list::WaitList;
use crate::config::{Config, Role};
use crate::error::{Error, ProtocolError};
use crate::flow::{add_send_credit, RecvWindow, Tuner};
use crate::frame::{Frame, Header, Kind, HEADER_LEN, INITIAL_WINDOW};
use crate::stats::Stats;
use crate::trace::{event, next_session_id};

/// Payloads at least this long are kept as slices of the read buffer (no copy); shorter ones are
/// copied into the stream's own buffer, so that a few small unread frames cannot pin many large
/// read buffers. With read buffers of at most 192 KiB this bounds the pinned memory to 12 times
/// the unread data.
const PIN_MIN: usize = 16 * 1024;

/// Allocation unit of a stream's buffer for copied small payloads.
const TAIL_MIN: usize = 4 * 1024;

/// Drained stream buffers kept for reuse by the session (at most `TAIL_MIN`-ish each), so that
/// streams can give their buffer back whenever they are drained without every burst of small
/// frames allocating anew.
const TAIL_POOL: usize = 64;

// Stream flags. "Local" is what this side did, "peer" what the peer told us.
/// We sent CloseRead (write side shut down): our writes fail.
const WRITE_SHUT: u16 = 1 << 0;
/// We sent CloseWrite (read side closed): our reads end, arriving data is discarded.
const READ_SHUT: u16 = 1 << 1;
/// We sent CloseStream.
const LOCAL_CLOSED: u16 = 1 << 2;
/// The peer sent CloseRead: reads end once the buffer is drained; more data is a violation.
const PEER_WRITE_SHUT: u16 = 1 << 3;
/// The peer sent CloseWrite: our writes fail.
const PEER_READ_SHUT: u16 = 1 << 4;
/// The peer sent CloseStream: we must not send our own.
const PEER_CLOSED: u16 = 1 << 5;
/// The stream's key is in `credit_queue`.
const CREDIT_QUEUED: u16 = 1 << 6;

/// One stream's state.
pub(crate) struct StreamState {
    pub(crate) id: u32,
    flags: u16,
    /// Handles keeping this state alive: `Stream` or its halves, or a place in the accept queue.
    handles: u8,
    /// Received data not yet read, oldest first: pinned slices and frozen copies…
    chunks: VecDeque<Bytes>,
    /// …followed by copied small payloads still being appended to.
    tail: BytesMut,
    /// Bytes in `chunks` and `tail` together.
    buffered: u32,
    recv_window: RecvWindow,
    tuner: Tuner,
    send_credit: u32,
    /// `queued_total` just after this stream's last queued frame: flushed once the driver has
    /// written that far.
    last_queued: u64,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

impl StreamState {
    fn new(id: u32, handles: u8, receive_window: u32) -> StreamState {
        StreamState {
            id,
            flags: 0,
            handles,
            chunks: VecDeque::new(),
            tail: BytesMut::new(),
            buffered: 0,
            recv_window: RecvWindow::new(receive_window),
            tuner: Tuner::default(),
            send_credit: INITIAL_WINDOW,
            last_queued: 0,
            read_waker: None,
            write_waker: None,
        }
    }

    fn has(&self, flags: u16) -> bool {
        self.flags & flags != 0
    }

    fn push_data(&mut self, payload: Bytes, pool: &mut Vec<BytesMut>) {
        self.buffered += payload.len() as u32;
        if payload.len() >= PIN_MIN {
            if !self.tail.is_empty() {
                self.chunks.push_back(self.tail.split().freeze());
            }
            self.chunks.push_back(payload);
        } else {
            if self.tail.capacity() - self.tail.len() < payload.len() {
                if self.tail.is_empty() {
                    if let Some(spare) = pool.pop() {
                        self.tail = spare;
                    }
                }
                self.tail.reserve(payload.len().max(TAIL_MIN));
            }
            self.tail.extend_from_slice(&payload);
        }
    }

    /// Gives the buffer for small payloads back to the session's pool once everything in it is
    /// read, so a drained stream holds no buffer. A buffer still shared with a chunk handed out
    /// by `read_chunk` is dropped instead (its memory goes when the chunk does).
    fn give_back_tail(&mut self, pool: &mut Vec<BytesMut>) {
        if self.buffered > 0 || self.tail.capacity() == 0 {
            return;
        }
        let mut tail = std::mem::take(&mut self.tail);
        tail.clear();
        if pool.len() < TAIL_POOL && tail.try_reclaim(TAIL_MIN) {
            pool.push(tail);
        }
    }

    /// Takes up to `max` bytes from the front of the buffered data, without copying.
    fn take_chunk(&mut self, max: usize) -> Bytes {
        let chunk = match self.chunks.front_mut() {
            Some(front) if front.len() > max => front.split_to(max),
            Some(_) => self.chunks.pop_front().unwrap_or_default(),
            None => {
                let n = max.min(self.tail.len());
                self.tail.split_to(n).freeze()
            }
        };
        self.buffered -= chunk.len() as u32;
        chunk
    }

    /// Copies buffered data into `dst`, oldest first; returns the count.
    fn read_into(&mut self, dst: &mut tokio::io::ReadBuf<'_>) -> usize {
        let mut read = 0;
        while dst.remaining() > 0 {
            let source: &mut dyn Buf = match self.chunks.front_mut() {
                Some(chunk) => chunk,
                None if !self.tail.is_empty() => &mut self.tail,
                None => break,
            };
            let n = source.remaining().min(dst.remaining());
            dst.put_slice(&source.chunk()[..n]);
            source.advance(n);
            read += n;
            if self.chunks.front().is_some_and(Bytes::is_empty) {
                self.chunks.pop_front();
            }
        }
        self.buffered -= read as u32;
        read
    }

    /// Drops everything buffered, counting it as consumed.
    fn discard_buffered(&mut self) {
        self.recv_window.consume(self.buffered);
        self.chunks.clear();
        self.tail.clear();
        self.buffered = 0;
    }

    fn wake_all(&mut self, wakers: &mut Vec<Waker>) {
        wakers.extend(self.read_waker.take());
        wakers.extend(self.write_waker.take());
    }
}

/// Why writing on `stream` fails, if it does; `end` is the session's end, if it has ended.
fn write_error(stream: &StreamState, end: &Option<Error>) -> Option<Error> {
    if stream.has(WRITE_SHUT | LOCAL_CLOSED) {
        Some(Error::WriteClosed)
    } else if stream.has(PEER_READ_SHUT | PEER_CLOSED) {
        Some(Error::PeerReadClosed)
    } else {
        end.clone()
    }
}

/// The mutex-guarded session state, see the module docs.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
}

impl Shared {
    pub(crate) fn new(role: Role, config: Config) -> Shared {
        Shared {
            inner: Mutex::new(Inner::new(role, config)),
        }
    }

    /// Locks the state. A panic elsewhere while it was held cannot leave it half-updated in a
    /// way that matters more than stopping would, so poisoning is ignored rather than spread.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs a handle operation on the state, then wakes the driver (after unlocking) if the
    /// operation left it something to do.
    pub(crate) fn with_driver<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut inner = self.lock();
        let result = f(&mut inner);
        let driver = if inner.driver_needed() {
            inner.take_driver_waker()
        } else {
            None
        };
        drop(inner);
        if let Some(driver) = driver {
            driver.wake();
        }
        result
    }
}

pub(crate) struct Inner {
    /// The session's number in log lines.
    pub(crate) id: u64,
    pub(crate) role: Role,
    pub(crate) config: Config,
    streams: Slab<StreamState>,
    /// Wire id → slab key, for every stream that has state.
    ids: HashMap<u32, usize>,
    next_id: u32,
    accept_queue: VecDeque<usize>,
    /// Tasks waiting in `accept`.
    pub(crate) accept_waiters: WaitList,

    /// Frames queued for the transport, in order.
    pub(crate) out: OutQueue,
    /// Bytes ever appended to `out`.
    pub(crate) queued_total: u64,
    /// Bytes the driver has written to the transport and flushed.
    pub(crate) written_total: u64,
    /// Streams owing credit back; the driver turns them into WindowUpdates while `out` has room.
    credit_queue: VecDeque<usize>,
    /// Inbound streams refused for want of room, to be answered with CloseStream.
    pub(crate) refusals: VecDeque<u32>,
    /// Writers and openers waiting for `out` to drop below `write_buffer_size`, oldest first,
    /// each with the bytes it means to queue. See [`Inner::wake_space`].
    space_waiters: VecDeque<(Waker, usize)>,
    /// Tasks waiting until `written_total` reaches the mark.
    flush_wakers: VecDeque<(u64, Waker)>,
    pub(crate) driver_waker: Option<Waker>,

    /// Why the session ended, once it has. Stream operations fail with it from then on.
    pub(crate) end: Option<Error>,
    /// Whether the driver should send CloseMux before closing the transport.
    pub(crate) send_close_mux: bool,
    /// The driver has finished: the transport is closed or abandoned.
    pub(crate) finished: bool,
    /// A transport error met while closing, reported by `Session::close`.
    pub(crate) close_error: Option<Error>,
    /// The transport refused a write, so nothing queued will be sent. The driver reads on for
    /// a while (so the session has not ended yet), but opens, writes and flushes fail with it.
    pub(crate) write_failed: Option<Error>,
    /// Tasks waiting for the driver to finish.
    pub(crate) close_waiters: WaitList,
    /// Live `Session` handles. When none is left, inbound streams are refused and the session
    /// closes itself once its last stream is gone.
    pub(crate) session_handles: usize,

    /// The session's clock for window tuning, see [`Tuner`].
    clock: Instant,
    /// The smallest round trip measured, in microseconds.
    min_rtt: Option<u64>,
    /// Counters for `Session::stats`; `live_streams` is filled in when a snapshot is taken.
    pub(crate) stats: Stats,
    /// Drained stream buffers for reuse, at most [`TAIL_POOL`].
    tail_pool: Vec<BytesMut>,
    /// What streams may still add to their windows, see `Config::receive_window_budget`.
    window_budget: u64,
}

/// Microseconds since `clock`, at least 1 (0 means "not set" to a [`Tuner`]).
fn micros(clock: Instant) -> u64 {
    clock.elapsed().as_micros() as u64 + 1
}

impl Inner {
    fn new(role: Role, config: Config) -> Inner {
        Inner {
            id: next_session_id(),
            role,
            streams: Slab::new(),
            ids: HashMap::new(),
            next_id: role.first_id(),
            accept_queue: VecDeque::new(),
            accept_waiters: WaitList::new(),
            out: OutQueue::new(),
            queued_total: 0,
            written_total: 0,
            credit_queue: VecDeque::new(),
            refusals: VecDeque::new(),
            space_waiters: VecDeque::new(),
            flush_wakers: VecDeque::new(),
            driver_waker: None,
            end: None,
            send_close_mux: false,
            finished: false,
            close_error: None,
            write_failed: None,
            close_waiters: WaitList::new(),
            session_handles: 1,
            clock: Instant::now(),
            min_rtt: None,
            stats: Stats::default(),
            // Its full size at once: a few hundred bytes, and no allocation when it fills.
            tail_pool: Vec::with_capacity(TAIL_POOL),
            window_budget: config.receive_window_budget,
            config,
        }
    }

    pub(crate) fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// Whether the driver has nothing left to do for the handles: none is left and no stream is.
    pub(crate) fn abandoned(&self) -> bool {
        self.session_handles == 0 && self.streams.len() == 0
    }

    /// Refusals waiting beyond this make the driver stop reading until they drain: a peer that
    /// opens streams without reading our answers must not grow our queue without end.
    pub(crate) fn refusals_full(&self) -> bool {
        self.refusals.len() >= self.config.accept_backlog.max(64)
    }

    fn out_has_room(&self) -> bool {
        self.out.len() < self.config.write_buffer_size
    }

    pub(crate) fn take_driver_waker(&mut self) -> Option<Waker> {
        self.driver_waker.take()
    }

    // ---------------------------------------------------------------------------------------
    // Outgoing frames.

    pub(crate) fn queue_header(&mut self, header: Header) {
        self.out.extend_from_slice(&header.to_bytes());
        self.queued_total += HEADER_LEN as u64;
        self.stats.frames_sent += 1;
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            live_streams: self.streams.len(),
            bytes_sent: self.written_total,
            ..self.stats.clone()
        }
    }

    /// Counts `n` bytes newly buffered (positive) or taken from the buffers (negative).
    fn count_buffered(&mut self, n: i64) {
        let stats = &mut self.stats;
        stats.buffered = stats.buffered.saturating_add_signed(n);
        stats.peak_buffered = stats.peak_buffered.max(stats.buffered);
    }

    fn queue_data_header(&mut self, id: u32, length: usize) {
        self.queue_header(Header {
            id,
            length: length as u32,
            kind: Kind::Data,
        });
        self.queued_total += length as u64;
    }

    /// Turns pending refusals and owed credit into frames while `out` has room. Frames the
    /// application asked for directly (opens, data, closes) are queued at once instead, which
    /// keeps them in order with the data around them.
    pub(crate) fn queue_pending_control(&mut self) {
        let clock = self.clock;
        while self.out_has_room() {
            let Some(id) = self.refusals.pop_front() else {
                break;
            };
            self.queue_header(Header::new(id, Kind::CloseStream));
        }
        while self.out_has_room() {
            let Some(key) = self.credit_queue.pop_front() else {
                break;
            };
            // A stale key (its stream gone, the slot reused) at worst sends credit a little
            // early for the new stream, which is harmless.
            let Some(stream) = self.streams.get_mut(key) else {
                continue;
            };
            stream.flags &= !CREDIT_QUEUED;
            if stream.has(PEER_WRITE_SHUT | PEER_CLOSED | LOCAL_CLOSED) {
                continue; // The peer sends no more: credit would be wasted bytes.
            }
            stream
                .tuner
                .on_credit(stream.recv_window.peer_credit(), || micros(clock));
            if let Some(credit) = stream.recv_window.take_update() {
                let id = stream.id;
                if stream.recv_window.owes() {
                    stream.flags |= CREDIT_QUEUED;
                    self.credit_queue.push_back(key);
                }
                self.queue_header(Header {
                    id,
                    length: credit,
                    kind: Kind::WindowUpdate,
                });
            }
        }
    }

    /// Whether the driver has anything to take from the queue right now.
    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
            || (!self.refusals.is_empty() || !self.credit_queue.is_empty()) && self.out_has_room()
    }

    /// Wakes writers and openers waiting for room in `out`, oldest first, until what they mean
    /// to queue fills the room; returns whether any are left waiting.
    ///
    /// Waking them all instead would wake every blocked task (tens of thousands with as many
    /// streams) for the few that fit, and all but those would queue up again: quadratic work.
    /// A woken task whose write was cancelled leaves its share unused; the driver passes unused
    /// room on (it calls this again whenever it finds `out` empty), so nobody waits behind it.
    pub(crate) fn wake_space(&mut self, wakers: &mut Vec<Waker>) -> bool {
        let mut room = self.config.write_buffer_size.saturating_sub(self.out.len());
        while room > 0 {
            let Some((waker, want)) = self.space_waiters.pop_front() else {
                break;
            };
            room = room.saturating_sub(want);
            wakers.push(waker);
        }
        !self.space_waiters.is_empty()
    }

    pub(crate) fn space_waiting(&self) -> bool {
        !self.space_waiters.is_empty()
    }

    fn wait_for_space(&mut self, waker: &Waker, want: usize) {
        self.space_waiters.push_back((waker.clone(), want));
    }

    /// Called by the driver once everything up to `total` is written and flushed.
    pub(crate) fn written(&mut self, total: u64, wakers: &mut Vec<Waker>) {
        self.written_total = total;
        while self
            .flush_wakers
            .front()
            .is_some_and(|(mark, _)| *mark <= total)
        {
            if let Some((_, waker)) = self.flush_wakers.pop_front() {
                wakers.push(waker);
            }
        }
    }

    fn queue_credit(&mut self, key: usize) {
        if let Some(stream) = self.streams.get_mut(key) {
            if !stream.has(CREDIT_QUEUED) {
                stream.flags |= CREDIT_QUEUED;
                self.credit_queue.push_back(key);
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Received frames.

    /// Applies one received frame. `Err` ends the session with that error.
    pub(crate) fn on_frame(&mut self, frame: Frame, wakers: &mut Vec<Waker>) -> Result<(), Error> {
        let Header { id, length, kind } = frame.header;
        self.stats.frames_received += 1;
        self.stats.bytes_received += (HEADER_LEN + frame.payload.len()) as u64;
        match kind {
            Kind::Data => self.on_data(id, frame.payload, wakers)?,
            Kind::WindowUpdate => {
                let Some(stream) = self.stream_by_id(id) else {
                    return Ok(()); // Unknown or closed: races with a local close.
                };
                stream.send_credit = add_send_credit(stream.send_credit, length).ok_or(
                    ProtocolError::WindowOverflow {
                        id,
                        credit: stream.send_credit,
                        increment: length,
                    },
                )?;
                wakers.extend(stream.write_waker.take());
            }
            Kind::OpenStream => self.on_open(id, wakers)?,
            Kind::CloseRead => self.on_peer_close(id, PEER_WRITE_SHUT, wakers),
            Kind::CloseWrite => self.on_peer_close(id, PEER_READ_SHUT, wakers),
            Kind::CloseStream => {
                self.on_peer_close(id, PEER_CLOSED | PEER_WRITE_SHUT | PEER_READ_SHUT, wakers)
            }
            Kind::Keepalive => self.stats.keepalives_received += 1,
            Kind::CloseMux => return Err(Error::ClosedByPeer),
        }
        Ok(())
    }

    fn stream_by_id(&mut self, id: u32) -> Option<&mut StreamState> {
        let key = *self.ids.get(&id)?;
        self.streams.get_mut(key)
    }

    fn on_data(&mut self, id: u32, payload: Bytes, wakers: &mut Vec<Waker>) -> Result<(), Error> {
        let Some(&key) = self.ids.get(&id) else {
            return Ok(()); // Unknown or closed: races with a local close.
        };
        let (clock, min_rtt) = (self.clock, self.min_rtt);
        let Some(stream) = self.streams.get_mut(key) else {
            return Ok(()); // Unknown or closed: races with a local close.
        };
        if stream.has(PEER_WRITE_SHUT | PEER_CLOSED) {
            return Err(ProtocolError::DataAfterClose { id }.into());
        }
        let length = payload.len() as u32;
        stream
            .recv_window
            .receive(length)
            .map_err(|credit| ProtocolError::WindowExceeded { id, length, credit })?;
        let target = stream.recv_window.target();
        let arrival = stream
            .tuner
            .on_data(length, target, min_rtt, || micros(clock));
        // Only a reader that keeps its buffer nearly empty shows that the window, not the
        // reader, is what limits the stream.
        let grow = arrival.window_limited && stream.buffered <= target / 4;
        if stream.has(READ_SHUT) {
            // We closed reading; the frame was in flight. Nobody will return its credit: the
            // peer's writes fail from now on anyway.
            return Ok(());
        }
        stream.push_data(payload, &mut self.tail_pool);
        wakers.extend(stream.read_waker.take());
        self.count_buffered(i64::from(length));
        if let Some(sample) = arrival.rtt_sample {
            self.min_rtt = Some(min_rtt.map_or(sample, |rtt| rtt.min(sample)));
        }
        if grow {
            self.grow_window(key);
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
        if self.session_handles == 0
            || self.accept_queue.len() >= self.config.accept_backlog
            || self.streams.len() >= self.config.max_streams
        {
            self.refusals.push_back(id);
            self.stats.streams_refused += 1;
            event!(
                debug,
                session = self.id,
                stream = id,
                "inbound stream refused"
            );
            return Ok(());
        }
        self.stats.streams_accepted += 1;
        event!(
            trace,
            session = self.id,
            stream = id,
            "inbound stream queued"
        );
        // The accept queue holds the stream's one handle until `accept` hands it out.
        let key = self.insert_stream(id, 1);
        self.accept_queue.push_back(key);
        self.accept_waiters.wake_all(wakers);
        Ok(())
    }

    fn on_peer_close(&mut self, id: u32, flags: u16, wakers: &mut Vec<Waker>) {
        if let Some(stream) = self.stream_by_id(id) {
            stream.flags |= flags;
            stream.wake_all(wakers);
        }
    }

    fn insert_stream(&mut self, id: u32, handles: u8) -> usize {
        let stream = StreamState::new(id, handles, self.config.receive_window);
        let announce = stream.recv_window.owes();
        let key = self.streams.insert(stream);
        self.ids.insert(id, key);
        if announce {
            self.queue_credit(key);
        }
        key
    }

    /// Ends the session with `error` (the first reason wins) and wakes everything waiting, so
    /// that each operation sees the end.
    pub(crate) fn end(&mut self, error: Error, send_close_mux: bool, wakers: &mut Vec<Waker>) {
        if self.end.is_some() {
            return;
        }
        event!(debug, session = self.id, error = %error, "session ended");
        self.end = Some(error);
        self.send_close_mux = send_close_mux;
        for stream in self.streams.iter_mut() {
            stream.wake_all(wakers);
        }
        self.accept_waiters.wake_all(wakers);
        wakers.extend(self.space_waiters.drain(..).map(|(waker, _)| waker));
        wakers.extend(self.flush_wakers.drain(..).map(|(_, waker)| waker));
        wakers.extend(self.driver_waker.take());
    }

    /// How the session went, once the driver is done: `Ok` after a graceful close by either side
    /// whose final writes and shutdown succeeded, otherwise the error.
    pub(crate) fn outcome(&self) -> Result<(), Error> {
        if let Some(error) = &self.close_error {
            return Err(error.clone());
        }
        match &self.end {
            None | Some(Error::ClosedLocally | Error::ClosedByPeer) => Ok(()),
            Some(error) => Err(error.clone()),
        }
    }

    /// Records that the transport refused a write: everything waiting to write or for its
    /// bytes to be written is woken to fail (see `write_failed`).
    pub(crate) fn transport_write_failed(&mut self, error: Error, wakers: &mut Vec<Waker>) {
        if self.write_failed.is_some() {
            return;
        }
        self.write_failed = Some(error);
        for stream in self.streams.iter_mut() {
            wakers.extend(stream.write_waker.take());
        }
        wakers.extend(self.space_waiters.drain(..).map(|(waker, _)| waker));
        wakers.extend(self.flush_wakers.drain(..).map(|(_, waker)| waker));
    }

    /// Marks the driver finished and wakes those waiting for it.
    pub(crate) fn finish(&mut self, wakers: &mut Vec<Waker>) {
        self.finished = true;
        self.close_waiters.wake_all(wakers);
        // Nothing will be written any more: flushes that were still waiting learn it now.
        wakers.extend(self.flush_wakers.drain(..).map(|(_, waker)| waker));
        wakers.extend(self.space_waiters.drain(..).map(|(waker, _)| waker));
    }

    // ---------------------------------------------------------------------------------------
    // Session handle operations.

    /// Opens a stream: allocates the next free id of this side's parity and queues OpenStream.
    pub(crate) fn poll_open(&mut self, waker: &Waker) -> Poll<Result<(usize, u32), Error>> {
        if let Some(error) = self.end.as_ref().or(self.write_failed.as_ref()) {
            return Poll::Ready(Err(error.clone()));
        }
        if self.streams.len() >= self.config.max_streams {
            return Poll::Ready(Err(Error::TooManyStreams));
        }
        if !self.out_has_room() {
            self.wait_for_space(waker, HEADER_LEN);
            return Poll::Pending;
        }
        // Ids wrap at 2^32; skip any still live. `max_streams` < 2^31 guarantees a free one.
        let mut id = self.next_id;
        while self.ids.contains_key(&id) {
            id = id.wrapping_add(2);
        }
        self.next_id = id.wrapping_add(2);
        let key = self.insert_stream(id, 1);
        self.queue_header(Header::new(id, Kind::OpenStream));
        self.stats.streams_opened += 1;
        event!(trace, session = self.id, stream = id, "stream opened");
        Poll::Ready(Ok((key, id)))
    }

    /// Hands out the next inbound stream.
    pub(crate) fn poll_accept(
        &mut self,
        waker: &Waker,
        slot: &mut Option<usize>,
    ) -> Poll<Result<(usize, u32), Error>> {
        if let Some(key) = self.accept_queue.pop_front() {
            let id = self.streams.get(key).map_or(0, |s| s.id);
            return Poll::Ready(Ok((key, id)));
        }
        if let Some(error) = &self.end {
            return Poll::Ready(Err(error.clone()));
        }
        self.accept_waiters.register(slot, waker);
        Poll::Pending
    }

    /// Registers a task to wake when the driver finishes.
    pub(crate) fn poll_finished(&mut self, waker: &Waker, slot: &mut Option<usize>) -> bool {
        if self.finished {
            return true;
        }
        self.close_waiters.register(slot, waker);
        false
    }

    /// Starts a graceful close from this side.
    pub(crate) fn close(&mut self, wakers: &mut Vec<Waker>) {
        self.end(Error::ClosedLocally, true, wakers);
    }

    /// Drops the streams nobody can accept any more (the last `Session` handle is gone).
    pub(crate) fn drop_accept_queue(&mut self) {
        while let Some(key) = self.accept_queue.pop_front() {
            self.release(key);
        }
    }

    // ---------------------------------------------------------------------------------------
    // Stream handle operations. `key` is valid: a handle keeps its state alive.

    pub(crate) fn add_handle(&mut self, key: usize) {
        if let Some(stream) = self.streams.get_mut(key) {
            stream.handles += 1;
        }
    }

    /// Drops one handle; the last one closes the stream (CloseStream, unless either side already
    /// sent it) and frees its id. Data written before is already queued ahead of the close.
    pub(crate) fn release(&mut self, key: usize) {
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        stream.handles -= 1;
        if stream.handles > 0 {
            return;
        }
        let id = stream.id;
        let send_close = !stream.has(LOCAL_CLOSED | PEER_CLOSED) && self.end.is_none();
        let grown = stream
            .recv_window
            .target()
            .saturating_sub(self.config.receive_window);
        self.window_budget += u64::from(grown);
        let unread = stream.buffered;
        self.count_buffered(-i64::from(unread));
        self.streams.remove(key);
        self.ids.remove(&id);
        event!(
            trace,
            session = self.id,
            stream = id,
            unread,
            "stream released"
        );
        if send_close {
            self.queue_header(Header::new(id, Kind::CloseStream));
        }
    }

    pub(crate) fn poll_read(
        &mut self,
        key: usize,
        waker: &Waker,
        dst: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<Result<(), Error>> {
        self.poll_read_with(key, waker, |stream| {
            let read = stream.read_into(dst);
            (read, ())
        })
        .map_ok(drop)
    }

    /// Hands out up to `max` buffered bytes without copying them; `None` at end of stream.
    pub(crate) fn poll_read_chunk(
        &mut self,
        key: usize,
        waker: &Waker,
        max: usize,
    ) -> Poll<Result<Option<Bytes>, Error>> {
        self.poll_read_with(key, waker, |stream| {
            let chunk = stream.take_chunk(max);
            (chunk.len(), chunk)
        })
    }

    /// The read path shared by `poll_read` and `poll_read_chunk`: `read` takes buffered data
    /// and says how much. `Ok(None)` is end of stream.
    fn poll_read_with<R>(
        &mut self,
        key: usize,
        waker: &Waker,
        read: impl FnOnce(&mut StreamState) -> (usize, R),
    ) -> Poll<Result<Option<R>, Error>> {
        let Some(stream) = self.streams.get_mut(key) else {
            return Poll::Ready(Ok(None));
        };
        if stream.has(READ_SHUT) {
            return Poll::Ready(Ok(None));
        }
        if stream.buffered > 0 {
            let (count, result) = read(stream);
            stream.recv_window.consume(count as u32);
            stream.give_back_tail(&mut self.tail_pool);
            if self.end.is_none() && stream.recv_window.update_due(stream.buffered == 0) {
                self.queue_credit(key);
            }
            self.count_buffered(-(count as i64));
            return Poll::Ready(Ok(Some(result)));
        }
        if stream.has(PEER_WRITE_SHUT | PEER_CLOSED) {
            return Poll::Ready(Ok(None)); // End of stream.
        }
        if let Some(error) = &self.end {
            return Poll::Ready(Err(error.clone()));
        }
        stream.read_waker = Some(waker.clone());
        Poll::Pending
    }

    pub(crate) fn poll_write(
        &mut self,
        key: usize,
        waker: &Waker,
        data: &[u8],
    ) -> Poll<Result<usize, Error>> {
        self.poll_write_with(key, waker, data.len(), |out, n| {
            out.extend_from_slice(&data[..n])
        })
    }

    /// Queues a Data frame with as much of `chunk` as credit and room allow at once, without
    /// copying it, and advances `chunk` past it; see [`Inner::poll_write`].
    pub(crate) fn poll_write_chunk(
        &mut self,
        key: usize,
        waker: &Waker,
        chunk: &mut Bytes,
    ) -> Poll<Result<usize, Error>> {
        self.poll_write_with(key, waker, chunk.len(), |out, n| {
            out.push_chunk(chunk.split_to(n))
        })
    }

    /// The write path shared by `poll_write` and `poll_write_chunk`: admits up to `len` bytes
    /// (see [`Inner::grant_write`]), queues the Data header, and has `payload` queue the first
    /// `n` bytes behind it.
    fn poll_write_with(
        &mut self,
        key: usize,
        waker: &Waker,
        len: usize,
        payload: impl FnOnce(&mut OutQueue, usize),
    ) -> Poll<Result<usize, Error>> {
        let (id, n) = match self.grant_write(key, waker, len) {
            Poll::Ready(Ok(grant)) => grant,
            other => return other.map_ok(|_| 0),
        };
        if n > 0 {
            self.queue_data_header(id, n);
            payload(&mut self.out, n);
        }
        Poll::Ready(Ok(n))
    }

    /// Admits a write of up to `len` bytes: the stream's id and how many bytes may go in one
    /// frame now (0 only when `len` is), with the credit for them taken. Pending, with the
    /// waker registered, while the stream has no credit or `out` no room.
    fn grant_write(
        &mut self,
        key: usize,
        waker: &Waker,
        len: usize,
    ) -> Poll<Result<(u32, usize), Error>> {
        let room = self.out_has_room();
        let Some(stream) = self.streams.get_mut(key) else {
            return Poll::Ready(Err(Error::WriteClosed));
        };
        if let Some(error) = write_error(stream, &self.end).or_else(|| self.write_failed.clone()) {
            return Poll::Ready(Err(error));
        }
        if len == 0 {
            return Poll::Ready(Ok((stream.id, 0)));
        }
        if stream.send_credit == 0 {
            stream.write_waker = Some(waker.clone());
            return Poll::Pending;
        }
        // Use whatever credit there is: a partial frame now beats a whole one later.
        let n = len
            .min(stream.send_credit as usize)
            .min(self.config.max_payload);
        if !room {
            stream.write_waker = Some(waker.clone());
            self.wait_for_space(waker, HEADER_LEN + n);
            return Poll::Pending;
        }
        stream.send_credit -= n as u32;
        stream.last_queued = self.queued_total + (HEADER_LEN + n) as u64;
        Poll::Ready(Ok((stream.id, n)))
    }

    /// Doubles a stream's receive window, within the per-stream ceiling and the session's
    /// budget (see [`Tuner`]), and queues the new credit.
    fn grow_window(&mut self, key: usize) {
        let ceiling = self.config.window_ceiling();
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if self.end.is_some() || stream.has(READ_SHUT | PEER_WRITE_SHUT | PEER_CLOSED) {
            return; // No more data is coming or wanted.
        }
        let target = stream.recv_window.target();
        let extra = target.min(ceiling.saturating_sub(target));
        let extra = u64::from(extra).min(self.window_budget) as u32;
        if extra == 0 {
            return;
        }
        self.window_budget -= u64::from(extra);
        stream.recv_window.grow(extra);
        event!(
            trace,
            session = self.id,
            stream = stream.id,
            window = target + extra,
            "receive window grown"
        );
        self.queue_credit(key);
    }

    /// `flush` and `shutdown`: ready at once while the session lives and its transport takes
    /// writes, since what the stream queued is then on its way (the driver writes the queue in
    /// order, with no further call); otherwise as [`Inner::poll_written`], so that bytes that
    /// may never be written are reported rather than taken for sent.
    ///
    /// Waiting for the transport every time would cost each flush a wake-up after the driver's
    /// next write: with thousands of short streams, over a third of the time (see the
    /// `streams` bench in BENCHMARKS.md).
    pub(crate) fn poll_flush(&mut self, key: usize, waker: &Waker) -> Poll<Result<(), Error>> {
        if self.end.is_none() && self.write_failed.is_none() {
            return Poll::Ready(Ok(()));
        }
        self.poll_written(key, waker)
    }

    /// Ready once everything the stream queued has been written to the transport and flushed.
    pub(crate) fn poll_written(&mut self, key: usize, waker: &Waker) -> Poll<Result<(), Error>> {
        let last = self.streams.get(key).map_or(0, |s| s.last_queued);
        if self.written_total >= last {
            return Poll::Ready(Ok(()));
        }
        if let Some(error) = &self.write_failed {
            return Poll::Ready(Err(error.clone()));
        }
        if self.finished {
            // The driver is gone and this stream's bytes never reached the transport.
            return Poll::Ready(Err(self.end.clone().unwrap_or(Error::ClosedLocally)));
        }
        // The mark is the queue's end now, so marks in `flush_wakers` only grow.
        self.flush_wakers
            .push_back((self.queued_total, waker.clone()));
        Poll::Pending
    }

    /// Queues `kind` (CloseRead, CloseWrite or CloseStream) for the stream unless the peer
    /// closed it, the session ended, or this side already sent it; sets `flags` in any case.
    fn close_with(&mut self, key: usize, kind: Kind, flags: u16) {
        let live = self.end.is_none();
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        let already = stream.flags & flags == flags;
        let send = live && !already && !stream.has(PEER_CLOSED | LOCAL_CLOSED);
        stream.flags |= flags;
        let mut discarded = 0;
        if flags & READ_SHUT != 0 {
            discarded = stream.buffered;
            stream.discard_buffered();
        }
        if send {
            stream.last_queued = self.queued_total + HEADER_LEN as u64;
            let id = stream.id;
            self.queue_header(Header::new(id, kind));
        }
        self.count_buffered(-i64::from(discarded));
    }

    /// Half-close of the write side: CloseRead on the wire.
    pub(crate) fn shutdown(&mut self, key: usize) {
        self.close_with(key, Kind::CloseRead, WRITE_SHUT);
    }

    /// Close of the read side: CloseWrite on the wire; buffered and arriving data is discarded.
    pub(crate) fn close_read(&mut self, key: usize) {
        self.close_with(key, Kind::CloseWrite, READ_SHUT);
    }

    /// Full close: CloseStream on the wire.
    pub(crate) fn close_stream(&mut self, key: usize) {
        self.close_with(
            key,
            Kind::CloseStream,
            LOCAL_CLOSED | WRITE_SHUT | READ_SHUT,
        );
    }

    /// Bytes buffered for reading on the stream.
    pub(crate) fn buffered(&self, key: usize) -> usize {
        self.streams.get(key).map_or(0, |s| s.buffered as usize)
    }

    /// Whether the driver has to be woken after a handle operation: output is waiting, the
    /// session ended, or the last `Session` handle went away (queued inbound streams are to be
    /// dropped, and the session closes itself once no stream is left).
    fn driver_needed(&self) -> bool {
        self.has_output()
            || self.end.is_some()
            || self.session_handles == 0
                && (self.streams.len() == 0 || !self.accept_queue.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    fn inner(role: Role) -> Inner {
        Inner::new(role, Config::default())
    }

    fn open(inner: &mut Inner) -> (usize, u32) {
        match inner.poll_open(Waker::noop()) {
            Poll::Ready(Ok(opened)) => opened,
            _ => panic!("open did not complete"),
        }
    }

    /// Decodes everything queued in `out` as headers (ignoring payloads).
    fn queued_headers(inner: &mut Inner) -> Vec<Header> {
        inner.queue_pending_control();
        let mut headers = Vec::new();
        let queued = inner.out.to_vec();
        let mut rest = &queued[..];
        while rest.len() >= HEADER_LEN {
            let mut raw = [0; HEADER_LEN];
            raw.copy_from_slice(&rest[..HEADER_LEN]);
            let header = Header::from_bytes(raw).expect("valid kind");
            let payload = if header.kind == Kind::Data {
                header.length as usize
            } else {
                0
            };
            rest = &rest[HEADER_LEN + payload..];
            headers.push(header);
        }
        inner.out.clear();
        headers
    }

    #[test]
    fn ids_wrap_around_and_skip_live_ones() {
        let mut inner = inner(Role::Client);
        let (_, first) = open(&mut inner);
        assert_eq!(first, 0);
        inner.next_id = u32::MAX - 1;
        let (_, last) = open(&mut inner);
        assert_eq!(last, u32::MAX - 1);
        // 0 is still live, so the wrap lands on 2.
        let (_, wrapped) = open(&mut inner);
        assert_eq!(wrapped, 2);
    }

    #[test]
    fn server_ids_are_odd_and_peer_parity_is_checked() {
        let mut inner = inner(Role::Server);
        assert_eq!(open(&mut inner).1, 1);
        assert_eq!(open(&mut inner).1, 3);
        let mut wakers = Vec::new();
        let err = inner
            .on_frame(Frame::control(5, Kind::OpenStream), &mut wakers)
            .expect_err("a server must not accept odd ids from its peer");
        assert!(matches!(
            err,
            Error::Protocol(ProtocolError::WrongParity { id: 5 })
        ));
    }

    #[test]
    fn credit_is_returned_when_the_reader_empties_the_buffer() {
        let mut inner = inner(Role::Server);
        let mut wakers = Vec::new();
        inner
            .on_frame(Frame::control(0, Kind::OpenStream), &mut wakers)
            .expect("valid open");
        inner
            .on_frame(Frame::data(0, vec![7; 3000]), &mut wakers)
            .expect("within credit");
        let Poll::Ready(Ok((key, 0))) = inner.poll_accept(Waker::noop(), &mut None) else {
            panic!("stream not accepted");
        };
        let mut storage = [0u8; 1000];
        let mut buf = tokio::io::ReadBuf::new(&mut storage);
        assert!(inner.poll_read(key, Waker::noop(), &mut buf).is_ready());
        assert!(
            queued_headers(&mut inner).is_empty(),
            "no update while data is buffered and less than half a window is owed"
        );
        let mut storage = [0u8; 4000];
        let mut buf = tokio::io::ReadBuf::new(&mut storage);
        assert!(inner.poll_read(key, Waker::noop(), &mut buf).is_ready());
        assert_eq!(buf.filled().len(), 2000);
        assert_eq!(
            queued_headers(&mut inner),
            vec![Header {
                id: 0,
                length: 3000,
                kind: Kind::WindowUpdate
            }]
        );
    }

    /// A server-side stream with id 0, opened by the peer and accepted.
    fn accepted_stream(inner: &mut Inner) -> usize {
        let mut wakers = Vec::new();
        inner
            .on_frame(Frame::control(0, Kind::OpenStream), &mut wakers)
            .expect("valid open");
        let Poll::Ready(Ok((key, 0))) = inner.poll_accept(Waker::noop(), &mut None) else {
            panic!("stream not accepted");
        };
        key
    }

    /// The peer sends `len` bytes on stream 0, as one frame.
    fn peer_sends(inner: &mut Inner, len: usize) {
        inner
            .on_frame(Frame::data(0, vec![7; len]), &mut Vec::new())
            .expect("within credit");
    }

    /// The application reads everything buffered; returns the credit that goes back.
    fn app_reads_all(inner: &mut Inner, key: usize) -> u32 {
        let mut storage = vec![0u8; 1 << 20];
        let mut buf = tokio::io::ReadBuf::new(&mut storage);
        assert!(inner.poll_read(key, Waker::noop(), &mut buf).is_ready());
        queued_headers(inner)
            .iter()
            .filter(|h| h.kind == Kind::WindowUpdate)
            .map(|h| h.length)
            .sum()
    }

    const RTT: std::time::Duration = std::time::Duration::from_millis(10);

    /// Round 1 of every tuning case: the peer spends its whole initial window, the reader
    /// empties the buffer at once (so credit goes to a sender that had none), and one round trip
    /// passes. Returns the stream's key.
    async fn first_round(inner: &mut Inner) -> usize {
        let key = accepted_stream(inner);
        peer_sends(inner, 65_536);
        assert_eq!(app_reads_all(inner, key), 65_536);
        tokio::time::advance(RTT).await;
        key
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_that_limits_a_fast_reader_doubles() {
        let mut inner = inner(Role::Server);
        let key = first_round(&mut inner).await;
        // Round 2: the answer to credit given to a sender that had none
        // measures the round trip, and half the window arrived well within it.
        peer_sends(&mut inner, 65_536);
        assert_eq!(
            app_reads_all(&mut inner, key),
            2 * 65_536,
            "the consumed 64 KiB plus 64 KiB of new window"
        );
        assert_eq!(
            inner.window_budget,
            Config::default().receive_window_budget - 65_536
        );
        // Closing the stream gives the growth back to the session.
        inner.release(key);
        assert_eq!(inner.window_budget, Config::default().receive_window_budget);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_that_is_not_the_limit_stays() {
        let mut inner = inner(Role::Server);
        let key = first_round(&mut inner).await;
        // The link (or the sender) delivers half a window per round trip: slower than the window
        // allows, so a bigger one would not help.
        for _ in 0..8 {
            peer_sends(&mut inner, 16_384);
            tokio::time::advance(RTT).await;
            peer_sends(&mut inner, 16_384);
            assert_eq!(app_reads_all(&mut inner, key), 32_768);
            tokio::time::advance(RTT).await;
        }
        assert_eq!(inner.window_budget, Config::default().receive_window_budget);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_keeps_its_window_and_the_budget_caps_growth() {
        let config = Config::default().receive_window_budget(65_536 + 1000);
        let mut inner = Inner::new(Role::Server, config);
        let key = first_round(&mut inner).await;
        // Half a window arrives fast, but the reader leaves it buffered: no growth.
        for _ in 0..3 {
            peer_sends(&mut inner, 12_000);
        }
        assert_eq!(inner.window_budget, 65_536 + 1000);
        assert_eq!(app_reads_all(&mut inner, key), 36_000);
        // Now the reader keeps up: the window grows, by no more than the budget has left.
        tokio::time::advance(RTT).await;
        peer_sends(&mut inner, 65_536);
        assert_eq!(app_reads_all(&mut inner, key), 2 * 65_536);
        assert_eq!(inner.window_budget, 1000);
        tokio::time::advance(RTT).await;
        for _ in 0..2 {
            peer_sends(&mut inner, 65_536);
        }
        assert_eq!(app_reads_all(&mut inner, key), 2 * 65_536 + 1000);
        assert_eq!(inner.window_budget, 0);
    }

    #[test]
    fn writes_never_exceed_credit_and_use_partial_credit() {
        let mut inner = inner(Role::Client);
        let (key, id) = open(&mut inner);
        let data = vec![1u8; 100_000];
        let Poll::Ready(Ok(first)) = inner.poll_write(key, Waker::noop(), &data) else {
            panic!("first write blocked");
        };
        assert_eq!(first, 65_536);
        assert!(inner.poll_write(key, Waker::noop(), &data).is_pending());
        let mut wakers = Vec::new();
        inner
            .on_frame(Frame::window_update(id, 10), &mut wakers)
            .expect("valid update");
        let Poll::Ready(Ok(second)) = inner.poll_write(key, Waker::noop(), &data) else {
            panic!("write with credit blocked");
        };
        assert_eq!(second, 10, "a partial frame uses whatever credit there is");
        let headers = queued_headers(&mut inner);
        let data_lengths: Vec<u32> = headers
            .iter()
            .filter(|h| h.kind == Kind::Data)
            .map(|h| h.length)
            .collect();
        assert_eq!(data_lengths, vec![65_536, 10]);
    }

    #[test]
    fn inbound_streams_beyond_the_backlog_are_refused() {
        let mut inner = Inner::new(Role::Server, Config::default().accept_backlog(1));
        let mut wakers = Vec::new();
        for id in [0, 2, 4] {
            inner
                .on_frame(Frame::control(id, Kind::OpenStream), &mut wakers)
                .expect("valid open");
        }
        let refused: Vec<u32> = queued_headers(&mut inner)
            .into_iter()
            .filter(|h| h.kind == Kind::CloseStream)
            .map(|h| h.id)
            .collect();
        assert_eq!(refused, vec![2, 4]);
        assert_eq!(inner.stream_count(), 1);
    }

    #[test]
    fn dropping_the_last_handle_sends_close_stream_after_the_data() {
        let mut inner = inner(Role::Client);
        let (key, id) = open(&mut inner);
        assert!(inner.poll_write(key, Waker::noop(), b"bye").is_ready());
        inner.release(key);
        let kinds: Vec<Kind> = queued_headers(&mut inner)
            .into_iter()
            .map(|h| h.kind)
            .collect();
        assert_eq!(kinds, vec![Kind::OpenStream, Kind::Data, Kind::CloseStream]);
        assert_eq!(inner.stream_count(), 0);
        // Frames racing with the close are ignored.
        let mut wakers = Vec::new();
        inner
            .on_frame(Frame::data(id, &b"late"[..]), &mut wakers)
            .expect("ignored");
    }
}
