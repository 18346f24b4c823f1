//! [`Connection`]: the future that drives one session's transport.
//!
//! It alone reads and writes the transport, and talks to the session's core only through its
//! methods. Each poll it (1) reads whatever the transport has and applies the frames to the
//! core, (2) takes the queued frames (control first, then data) and writes them, (3) runs the
//! keepalive, idle and write-stall timers. Reading never waits for the application: received
//! data goes into per-stream buffers bounded by the credit this side granted, inbound streams
//! beyond the backlog are refused, and a pending transport write does not stop reads (both are
//! polled in the same turn). Reading waits only while the control queue is over its bound,
//! which only a peer that does not read our frames can cause.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use super::core::recv_buf::{Payload, PIN_MIN};
use super::core::{Batch, PeerKind, Shared};
use super::linger::Linger;
use super::out_queue::{Cursor, OutQueue, MAX_SLICES};
use super::read_buf::ReadBuffer;
use crate::codec::FrameCodec;
use crate::config::deadline_after;
use crate::error::{CodecError, Error};
use crate::frame::Kind;

/// Bytes read in one poll before the driver yields to other tasks, so a peer that floods the
/// connection cannot monopolise a runtime thread.
const READ_BUDGET: usize = 1024 * 1024;

/// Outgoing queues grow to the largest batch written (up to about `write_buffer_size`, twice:
/// the queue being filled and the batch being written) and keep that capacity while traffic
/// lasts. When the driver finds nothing to write and it finished its last batch larger than
/// `QUEUE_KEEP` at least `QUEUE_LINGER` ago, it gives both back to the allocator, so a burst's
/// buffers are not held by a session gone quiet. It looks whenever it runs: an idle driver runs
/// at the latest when the keepalive is due (30 s by default), or with keepalives off at the
/// next activity.
const QUEUE_KEEP: usize = 64 * 1024;
const QUEUE_LINGER: Duration = Duration::from_secs(1);

/// A batch holds at least this much data (when there is that much), and at first at most
/// [`FIRST_BUDGET`]. Its size then follows what the transport takes: twice the last one while
/// the transport takes whole batches (up to `write_buffer_size`), and what it took before
/// pushing back when it does. So on a slow link the batch in hand, which a frame queued
/// meanwhile waits behind, stays about as small as what the socket takes at a time (with
/// `TCP_NOTSENT_LOWAT`, see `gomux::tcp`), while a fast one gets large writes.
const MIN_BUDGET: usize = 16 * 1024;
const FIRST_BUDGET: usize = 64 * 1024;

/// Drives a session: reads, writes and times its transport. Created by
/// [`Session::new`](crate::Session::new); [`Session::client`](crate::Session::client) and the
/// other constructors spawn it for you.
///
/// Resolves when the session has ended and the transport is closed: `Ok(())` after a graceful
/// close by either side, otherwise the error that ended it. Dropping it ends the session: every
/// stream operation then fails with [`Error::ClosedLocally`].
#[must_use = "a session does nothing unless its connection is polled (spawn it)"]
pub struct Connection<T> {
    io: T,
    shared: Arc<Shared>,
    codec: FrameCodec,
    read_buf: ReadBuffer,
    /// When the session has gone quiet and gives its buffers back.
    linger: Linger,
    /// The batch being written: its control frames, written first…
    control_buf: Vec<u8>,
    control_done: usize,
    /// …then its data, frames taken from the streams' send queues (see `SendQueues::take`).
    write_buf: OutQueue,
    written: Cursor,
    /// Where the batch lies in the core's queues, and how much of its data is written.
    batch: Batch,
    batch_data_done: u64,
    /// Where frames of the batch start (some of them): where control frames may go in.
    boundaries: VecDeque<u64>,
    /// Control frames were queued after the batch was taken: they go at the next boundary.
    control_waiting: bool,
    /// When the driver last finished writing a batch larger than [`QUEUE_KEEP`], until it
    /// releases the queues' memory.
    large_batch_at: Option<Instant>,
    /// Whether bytes were written since the transport was last flushed.
    unflushed: bool,
    /// How much data the next batch takes, at most (see [`MIN_BUDGET`]); its upper bound; the
    /// bytes the transport took since it last pushed back; whether it did since the last batch
    /// was taken.
    budget: usize,
    max_budget: usize,
    round_taken: usize,
    pushed_back: bool,
    phase: Phase,
    /// Wakers collected under the lock, woken after it is released.
    wakers: Vec<Waker>,
    /// Reading waits for the control queue to drain below its bound.
    read_paused: bool,
    /// The transport's read side has ended (end-of-file or an error).
    read_closed: bool,
    /// The peer sent CloseMux: it is closing, so a broken pipe while we finish is no failure.
    peer_closed: bool,
    keepalive_interval: Option<Duration>,
    idle_timeout: Option<Duration>,
    write_stall_timeout: Option<Duration>,
    /// Built on the first poll, inside the runtime (a `Sleep` needs its time driver).
    keepalive: Option<Timer>,
    idle: Option<Timer>,
    /// Twice the keepalive interval a peer of this crate announced: silence that long means
    /// it is dead (see `Error::KeepaliveTimeout`). Set once its greeting has come.
    liveness: Option<Timer>,
    /// The peer's kind is known, so `liveness` is settled.
    peer_known: bool,
    timers_started: bool,
    /// Armed while the transport takes none of the bytes waiting for it.
    stall: Option<Pin<Box<Sleep>>>,
    stall_armed: bool,
    close_deadline: Option<Pin<Box<Sleep>>>,
    close_timeout: Duration,
    /// A write to the transport failed: why, and until when the driver reads on.
    write_failed: Option<(Error, Pin<Box<Sleep>>)>,
    /// `gomux{session, role}`, entered while the driver runs.
    #[cfg(feature = "tracing")]
    span: tracing::Span,
    _end_on_drop: EndOnDrop,
}

impl<T> fmt::Debug for Connection<T> {
    /// The session and where the driver is in its life; not the transport, which need not be
    /// `Debug`, nor the buffers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("Connection")
            .field("session", &inner.id)
            .field("role", &inner.role)
            .field("phase", &self.phase)
            .field("streams", &inner.stream_count())
            .field("read_closed", &self.read_closed)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading, writing and timing.
    Active,
    /// The session has ended: write out what is queued (CloseMux included).
    Flushing,
    /// Everything is written: shut the transport's writing down.
    ShuttingDown,
    /// Read and discard until the peer closes too, so that no unread input makes the kernel
    /// reset the connection under the peer's last reads.
    Draining,
    /// The transport is closed or abandoned.
    Done,
}

/// How long a silence timer (idle timeout, the peer's keepalive) waits, once it has expired,
/// before it believes it: a process resumed after a pause (a VM paused, a debugger, a laptop
/// asleep) sees its timers expire before its runtime has polled the transport, where the
/// peer's frames may be waiting. Any sleep makes the runtime poll its I/O first.
const SILENCE_CONFIRM: Duration = Duration::from_millis(50);

/// A periodic check: fires `interval` after the last activity.
struct Timer {
    interval: Duration,
    last: Instant,
    sleep: Pin<Box<Sleep>>,
    /// For a silence timer: expired once, and waiting [`SILENCE_CONFIRM`] to be sure.
    confirm: Option<bool>,
}

impl Timer {
    fn new(interval: Duration) -> Timer {
        let now = Instant::now();
        Timer {
            interval,
            last: now,
            sleep: Box::pin(tokio::time::sleep_until(deadline_after(now, interval))),
            confirm: None,
        }
    }

    /// A timer of the peer's silence: it fires only if nothing arrived for [`SILENCE_CONFIRM`]
    /// more after it expired.
    fn silence(interval: Duration) -> Timer {
        Timer {
            confirm: Some(false),
            ..Timer::new(interval)
        }
    }

    /// Ready when `interval` has passed since the last activity; re-arms itself either way.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        let deadline = deadline_after(self.last, self.interval);
        let now = Instant::now();
        if now >= deadline && self.confirm == Some(false) {
            self.confirm = Some(true);
            self.sleep.as_mut().reset(now + SILENCE_CONFIRM);
            let _ = self.sleep.as_mut().poll(cx);
            return false;
        }
        if self.confirm.is_some() {
            self.confirm = Some(false);
        }
        if now >= deadline {
            self.last = Instant::now();
            self.sleep
                .as_mut()
                .reset(deadline_after(self.last, self.interval));
            let _ = self.sleep.as_mut().poll(cx);
            return true;
        }
        self.sleep.as_mut().reset(deadline);
        let _ = self.sleep.as_mut().poll(cx);
        false
    }
}

/// Transport errors that only say the peer has gone, once it has said it was closing.
fn peer_gone(error: &Error) -> bool {
    matches!(error, Error::Transport(e) if matches!(
        e.kind(),
        std::io::ErrorKind::NotConnected
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
    ))
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    pub(crate) fn new(io: T, shared: Arc<Shared>) -> Connection<T> {
        let inner = shared.lock();
        let c = &inner.config;
        crate::trace::event!(debug, session = inner.id, role = ?inner.role, "session started");
        let max_budget = c.write_buffer_size.max(MIN_BUDGET);
        let (max_payload, keepalive, idle, stall, close_timeout) = (
            c.max_payload,
            c.keepalive_interval,
            c.idle_timeout,
            c.write_stall_timeout,
            c.close_timeout,
        );
        #[cfg(feature = "tracing")]
        let span = tracing::debug_span!("gomux", session = inner.id, role = ?inner.role);
        drop(inner);
        let end_on_drop = EndOnDrop(Arc::clone(&shared));
        Connection {
            io,
            shared,
            codec: FrameCodec::with_max_payload(max_payload).without_reserve(),
            read_buf: ReadBuffer::new(),
            linger: Linger::new(),
            control_buf: Vec::new(),
            control_done: 0,
            write_buf: OutQueue::new(),
            written: Cursor::default(),
            batch: Batch::default(),
            batch_data_done: 0,
            boundaries: VecDeque::new(),
            control_waiting: false,
            large_batch_at: None,
            unflushed: false,
            budget: FIRST_BUDGET.min(max_budget),
            max_budget,
            round_taken: 0,
            pushed_back: false,
            phase: Phase::Active,
            wakers: Vec::new(),
            read_paused: false,
            read_closed: false,
            peer_closed: false,
            keepalive_interval: keepalive,
            idle_timeout: idle,
            write_stall_timeout: stall,
            keepalive: None,
            idle: None,
            liveness: None,
            peer_known: false,
            timers_started: false,
            stall: None,
            stall_armed: false,
            close_deadline: None,
            close_timeout,
            write_failed: None,
            #[cfg(feature = "tracing")]
            span,
            _end_on_drop: end_on_drop,
        }
    }

    /// The transport.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Takes the transport back. Once this future has resolved the session is over and the
    /// transport was shut down (after a graceful close) or failed; before that, this ends the
    /// session as dropping the driver would, without a CloseMux, leaving the transport as it
    /// is, perhaps in the middle of a frame.
    ///
    /// Only a driver you poll yourself ([`Session::new`](crate::Session::new)) can be taken
    /// apart: the constructors that spawn it keep it inside the task, which drops the
    /// transport when the session ends.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// let (io, _peer) = tokio::io::duplex(1024);
    /// let (session, mut connection) =
    ///     gomux::Session::new(io, gomux::Role::Client, gomux::Config::default());
    /// let (closed, driven) = tokio::join!(session.close(), &mut connection);
    /// closed?;
    /// driven?;
    /// let io: tokio::io::DuplexStream = connection.into_inner();
    /// # drop(io);
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_inner(self) -> T {
        self.io
    }

    fn wake_collected(&mut self) {
        for waker in self.wakers.drain(..) {
            waker.wake();
        }
    }

    /// Ends the session with `error`; `close_mux` says whether the peer should be told.
    fn end(&mut self, error: Error, close_mux: bool) {
        let mut inner = self.shared.lock();
        inner.end(error, close_mux, &mut self.wakers);
        drop(inner);
        self.wake_collected();
    }

    // -----------------------------------------------------------------------------------------
    // Reading.

    /// Applies the frames already buffered, then reads and applies more until the transport
    /// has nothing, the budget is spent, or the control queue is over its bound. Returns whether
    /// the budget ran out (the driver should yield and come back).
    fn poll_read_frames(&mut self, cx: &mut Context<'_>) -> bool {
        let mut budget = READ_BUDGET;
        loop {
            if self.read_closed {
                // After a CloseMux or a broken frame, what follows is not the session's.
                return false;
            }
            if !self.read_buf.is_empty() || self.read_paused {
                match self.apply_frames() {
                    Ok(true) => {
                        // The peer sends faster than it reads our answers: wait for the
                        // transport to take them (the writer wakes us when it does).
                        self.read_paused = true;
                        return false;
                    }
                    Ok(false) => self.read_paused = false,
                    Err(error) => {
                        // Nothing after a CloseMux or a broken frame is read: the session is
                        // over, and what follows a CloseMux stays for `into_inner`.
                        self.read_closed = true;
                        self.end_by_peer(error);
                        return false;
                    }
                }
            }
            if self.read_closed {
                return false;
            }
            let missing = self.codec.payload_missing(self.read_buf.get_mut());
            let space = self.read_buf.prepare(missing);
            let read_buf = self.read_buf.get_mut();
            let n = match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, read_buf) {
                Poll::Pending => {
                    self.read_buf.drained();
                    return false;
                }
                Poll::Ready(Ok(0)) => {
                    self.read_closed = true;
                    let error = if let Some((error, _)) = &self.write_failed {
                        error.clone()
                    } else if self.read_buf.is_empty() && !self.codec.in_frame() {
                        Error::ConnectionClosed
                    } else {
                        Error::UnexpectedEof
                    };
                    self.end(error, false);
                    return false;
                }
                Poll::Ready(Ok(n)) => {
                    if n == space {
                        self.read_buf.filled();
                    }
                    self.linger.touch(Instant::now());
                    n
                }
                Poll::Ready(Err(e)) => {
                    self.read_closed = true;
                    self.end(e.into(), false);
                    return false;
                }
            };
            let now = Instant::now();
            for silence in [&mut self.idle, &mut self.liveness].into_iter().flatten() {
                silence.last = now;
            }
            budget = budget.saturating_sub(n);
            if budget == 0 {
                // Apply what was read before yielding, so that the readers it wakes run on
                // this thread next (tokio's LIFO slot) rather than after the driver, perhaps
                // on another thread; the next poll reads on.
                match self.apply_frames() {
                    Ok(paused) => self.read_paused = paused,
                    Err(error) => {
                        self.read_closed = true;
                        self.end_by_peer(error);
                        return false;
                    }
                }
                return !self.read_paused;
            }
        }
    }

    /// Ends the session for what the peer sent: a peer that broke the protocol is told so,
    /// best effort; one that sent CloseMux is closing already.
    fn end_by_peer(&mut self, error: Error) {
        let close_mux = matches!(error, Error::Protocol(_));
        self.peer_closed = matches!(error, Error::ClosedByPeer);
        self.end(error, close_mux);
    }

    /// Decodes the whole frames in the read buffer and applies them, under one lock, until the
    /// control queue is over its bound. Returns whether it is (reading must pause).
    fn apply_frames(&mut self) -> Result<bool, Error> {
        let now = Instant::now();
        let source = self.read_buf.source();
        let mut inner = self.shared.lock();
        let result = loop {
            if inner.control_over_limit() {
                break Ok(true);
            }
            let buf = self.read_buf.get_mut();
            match self.codec.decode_complete(buf) {
                Ok(Some(header)) => {
                    let len = match header.kind {
                        Kind::Data => header.length as usize,
                        _ => 0,
                    };
                    // A long payload stays a slice of the read buffer; a short one (and the
                    // empty one of other kinds) is copied out by the stream straight from here.
                    let (payload, rest) = if len >= PIN_MIN {
                        (Payload::Shared(buf.split_to(len).freeze()), 0)
                    } else {
                        (Payload::Borrowed(&buf[..len]), len)
                    };
                    let applied = inner.on_received(header, payload, source, now, &mut self.wakers);
                    buf.advance(rest);
                    if let Err(error) = applied {
                        break Err(error);
                    }
                }
                Ok(None) => break Ok(false),
                Err(CodecError::Protocol(e)) => break Err(e.into()),
                Err(CodecError::Io(e)) => break Err(e.into()),
                // Only the encoder reports it.
                Err(CodecError::InvalidFrame(_)) => break Ok(false),
            }
        };
        let kind = inner.peer_kind();
        drop(inner);
        if !self.peer_known {
            self.learn_peer(kind);
        }
        self.wake_collected();
        result
    }

    /// Once the peer's first frame told what it is: a peer of this crate that announced a
    /// keepalive interval is expected to send something at least that often, so twice that
    /// silence ends the session. (A keepalive goes out after an interval without writes, so a
    /// live peer is never silent longer than one interval plus the way here.)
    fn learn_peer(&mut self, kind: PeerKind) {
        match kind {
            PeerKind::Unknown => {}
            PeerKind::Greeted {
                keepalive: Some(interval),
            } => {
                self.peer_known = true;
                self.liveness = Some(Timer::silence(interval.saturating_mul(2)));
            }
            PeerKind::Greeted { keepalive: None } | PeerKind::Plain => self.peer_known = true,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Writing.

    fn batch_written(&self) -> bool {
        self.control_done == self.control_buf.len() && self.write_buf.is_written(&self.written)
    }

    /// Writes queued frames until the transport would block or nothing is queued, then flushes.
    /// Each batch starts with every control frame queued so far, then frames from the send queues, up to the budget. Progress
    /// is reported to the core after every transport write. `Ready(Ok)` means everything
    /// queued so far is written and flushed.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let mut took = false;
        loop {
            if self.batch_written() {
                let mut inner = self.shared.lock();
                if !inner.has_output() {
                    // Room nobody has claimed: the tasks woken for it may have been cancelled.
                    // Pass it on (unless it was just handed out), and come back to check again
                    // until nobody waits, since nothing else may wake this task.
                    let waiting = if took {
                        inner.room_waiting()
                    } else {
                        inner.void_room_grants();
                        inner.wake_room(&mut self.wakers)
                    };
                    if waiting {
                        cx.waker().wake_by_ref();
                    }
                    if self
                        .large_batch_at
                        .is_some_and(|at| at.elapsed() >= QUEUE_LINGER)
                    {
                        self.large_batch_at = None;
                        inner.release_data_buffers();
                        self.write_buf.release();
                        self.written = Cursor::default();
                        self.control_buf = Vec::new();
                        self.control_done = 0;
                    }
                    drop(inner);
                    self.wake_collected();
                    break;
                }
                self.control_buf.clear();
                self.control_done = 0;
                self.write_buf.clear();
                self.written = Cursor::default();
                self.batch_data_done = 0;
                self.boundaries.clear();
                if !self.pushed_back {
                    self.budget = (self.budget * 2).min(self.max_budget);
                }
                self.pushed_back = false;
                self.batch = inner.take_batch(
                    Instant::now(),
                    self.budget,
                    &mut self.control_buf,
                    &mut self.write_buf,
                    &mut self.boundaries,
                    &mut self.wakers,
                );
                self.control_waiting = false;
                took = true;
                drop(inner);
                self.wake_collected();
                continue;
            }
            let data_limit = self.control_in_batch();
            let io = Pin::new(&mut self.io);
            let control = &self.control_buf[self.control_done..];
            let result = if io.is_write_vectored() {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let mut count = 0;
                if !control.is_empty() {
                    slices[0] = IoSlice::new(control);
                    count = 1;
                }
                count += self
                    .write_buf
                    .slices(&self.written, &mut slices[count..], data_limit);
                io.poll_write_vectored(cx, &slices[..count])
            } else if !control.is_empty() {
                io.poll_write(cx, control)
            } else {
                let next = self.write_buf.next_slice(&self.written);
                io.poll_write(cx, &next[..next.len().min(data_limit)])
            };
            match result {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(
                        std::io::Error::from(std::io::ErrorKind::WriteZero).into()
                    ))
                }
                Poll::Ready(Ok(n)) => self.advance(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => {
                    self.budget = self.round_taken.clamp(MIN_BUDGET, self.max_budget);
                    self.round_taken = 0;
                    self.pushed_back = true;
                    self.arm_stall(cx);
                    return Poll::Pending;
                }
            }
        }
        self.stall_armed = false;
        if self.unflushed {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => {
                    self.arm_stall(cx);
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Control frames queued while the batch is written go out between two of its frames: at
    /// a recorded frame start, the driver takes them now; before one, it writes data only up
    /// to it. Returns how much data the next write may carry.
    fn control_in_batch(&mut self) -> usize {
        if !self.control_waiting || self.control_done < self.control_buf.len() {
            return usize::MAX;
        }
        let at = self.batch.data_start + self.batch_data_done;
        while self.boundaries.front().is_some_and(|&start| start < at) {
            self.boundaries.pop_front();
        }
        match self.boundaries.front() {
            Some(&start) if start == at => {
                self.control_buf.clear();
                self.control_done = 0;
                let mut inner = self.shared.lock();
                self.batch.control_end =
                    inner.take_control(Instant::now(), &mut self.control_buf, &mut self.wakers);
                drop(inner);
                self.wake_collected();
                self.control_waiting = false;
                usize::MAX
            }
            Some(&start) => (start - at) as usize,
            // No frame starts in the rest of the batch: the control goes first in the next.
            None => usize::MAX,
        }
    }

    /// Moves past `n` bytes the transport took, and tells the core.
    fn advance(&mut self, n: usize) {
        let control = n.min(self.control_buf.len() - self.control_done);
        self.control_done += control;
        let data = n - control;
        self.round_taken += n;
        self.write_buf.advance(&mut self.written, data);
        self.batch_data_done += data as u64;
        self.unflushed = true;
        self.stall_armed = false;
        let now = Instant::now();
        self.linger.touch(now);
        if let Some(keepalive) = &mut self.keepalive {
            keepalive.last = now;
        }
        if self.write_buf.len() > QUEUE_KEEP && self.write_buf.is_written(&self.written) {
            self.large_batch_at = Some(now);
        }
        let control_pos = if self.control_done == self.control_buf.len() {
            self.batch.control_end
        } else {
            0
        };
        let data_pos = self.batch.data_start + self.batch_data_done;
        let mut inner = self.shared.lock();
        inner.written(data_pos, control_pos, n as u64, &mut self.wakers);
        self.control_waiting = inner.control_waiting();
        drop(inner);
        self.wake_collected();
    }

    /// The transport takes nothing of what waits for it: start the write-stall clock, unless
    /// it runs already.
    fn arm_stall(&mut self, cx: &mut Context<'_>) {
        let Some(timeout) = self.write_stall_timeout else {
            return;
        };
        if self.stall_armed {
            return;
        }
        self.stall_armed = true;
        let deadline = deadline_after(Instant::now(), timeout);
        match &mut self.stall {
            Some(sleep) => sleep.as_mut().reset(deadline),
            None => self.stall = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        if let Some(sleep) = &mut self.stall {
            let _ = sleep.as_mut().poll(cx);
        }
    }

    /// Whether the transport took nothing for the whole write-stall timeout.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> bool {
        self.stall_armed
            && self
                .stall
                .as_mut()
                .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }

    fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if !self.timers_started {
            self.timers_started = true;
            self.keepalive = self.keepalive_interval.map(Timer::new);
            self.idle = self.idle_timeout.map(Timer::silence);
        }
        if self.read_paused {
            // Not reading is our doing, not the peer's silence.
            let now = Instant::now();
            for silence in [&mut self.idle, &mut self.liveness].into_iter().flatten() {
                silence.last = now;
            }
        }
        if self.idle.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            self.end(Error::IdleTimeout, true);
        }
        if self.liveness.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            self.end(Error::KeepaliveTimeout, true);
        }
        if self.keepalive.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            self.shared.lock().queue_keepalive();
        }
        if self.poll_stalled(cx) {
            self.stall_armed = false;
            let error = Error::WriteStalled;
            self.write_failed = Some((error.clone(), Box::pin(tokio::time::sleep(Duration::ZERO))));
            let mut inner = self.shared.lock();
            inner.transport_write_failed(error.clone(), &mut self.wakers);
            inner.end(error, false, &mut self.wakers);
            drop(inner);
            self.wake_collected();
        }
    }

    /// The session has been quiet for the linger: gives back every buffer that holds nothing
    /// (see `session::linger`).
    fn release_buffers(&mut self) {
        self.read_buf.release();
        if self.batch_written() {
            self.write_buf.release();
            self.written = Cursor::default();
            self.control_buf = Vec::new();
            self.control_done = 0;
            self.boundaries = VecDeque::new();
            self.large_batch_at = None;
        }
        self.wakers = Vec::new();
        self.shared.lock().release_buffers();
    }

    // -----------------------------------------------------------------------------------------
    // Closing.

    /// Moves to closing when the session ended, or drained (see `Inner::check_draining`).
    fn check_end(&mut self) {
        let mut inner = self.shared.lock();
        inner.check_draining(&mut self.wakers);
        inner.wake_if_idle(&mut self.wakers);
        if inner.end_reason().is_some() {
            inner.queue_final_frames();
            self.phase = Phase::Flushing;
        }
        drop(inner);
        self.wake_collected();
    }

    fn finish(&mut self, close_error: Option<Error>) {
        self.phase = Phase::Done;
        let mut inner = self.shared.lock();
        inner.finish(close_error, &mut self.wakers);
        drop(inner);
        self.wake_collected();
    }

    /// Flushing, shutting down and draining, within the close timeout. The transport is read in
    /// every phase, and what arrives is applied (data stays readable): two ends that close at
    /// once while both have bytes queued each flush towards a peer that reads, where reading
    /// only after the flush left both waiting for the other until the close timeout
    /// (`tests/close_paths.rs`, `both_ends_closing_while_busy_*`). Reading stops at the peer's
    /// CloseMux (what follows stays in the transport, for `into_inner`), at a protocol error,
    /// and at the end of the transport.
    fn poll_closing(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self
            .close_deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(self.close_timeout)));
        if deadline.as_mut().poll(cx).is_ready() {
            let error = (self.phase != Phase::Draining).then(|| {
                Error::Transport(Arc::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the transport did not accept the final writes within the close timeout",
                )))
            });
            self.finish(error);
            return Poll::Ready(());
        }
        let more_to_read = self.poll_read_frames(cx);
        if self.phase == Phase::Flushing {
            let transport_dead = self.write_failed.is_some()
                || matches!(
                    self.shared.lock().end_reason(),
                    Some(Error::Transport(_) | Error::UnexpectedEof)
                );
            if transport_dead {
                // What was queued cannot be written: a failed write is reported by `close`.
                let failed = self.write_failed.as_ref().map(|(error, _)| error.clone());
                self.finish(failed);
                return Poll::Ready(());
            }
            match self.poll_write_out(cx) {
                Poll::Pending => return self.pending_closing(cx, more_to_read),
                Poll::Ready(Err(e)) if self.peer_closed && peer_gone(&e) => {
                    // The peer closed the session and is gone: nothing of ours was owed to it.
                    self.finish(None);
                    return Poll::Ready(());
                }
                Poll::Ready(Err(e)) => {
                    self.finish(Some(e));
                    return Poll::Ready(());
                }
                Poll::Ready(Ok(())) => self.phase = Phase::ShuttingDown,
            }
        }
        if self.phase == Phase::ShuttingDown {
            match Pin::new(&mut self.io).poll_shutdown(cx) {
                Poll::Pending => return self.pending_closing(cx, more_to_read),
                Poll::Ready(result) => {
                    // A peer that closed first makes shutdown fail; the session is over either
                    // way.
                    let error = result.err().map(Error::from).filter(|e| !peer_gone(e));
                    // Only a close this side started leaves the peer something to say (its
                    // answer to our CloseMux); after its own CloseMux, or a broken protocol,
                    // nothing more of its input is owed anything.
                    let ours =
                        matches!(self.shared.lock().end_reason(), Some(Error::ClosedLocally));
                    if error.is_some() || !ours {
                        self.finish(error);
                        return Poll::Ready(());
                    }
                    self.phase = Phase::Draining;
                }
            }
        }
        // Draining: the peer may still be writing (data, or its own CloseMux). Closing a socket
        // with unread input makes the kernel send a reset, which the peer would see instead of
        // our CloseMux; so read until it closes too. (Both ends of this crate closing at once
        // once saw `ConnectionReset` or `BrokenPipe`: `tests/core_findings_b.rs`,
        // `closing_a_busy_session_*`, `both_ends_closing_at_once_*`.)
        if !self.read_closed {
            return self.pending_closing(cx, more_to_read);
        }
        self.finish(None);
        Poll::Ready(())
    }

    /// Waits in a closing phase: at once again if the read budget ran out (the transport may
    /// have more), otherwise for the transport or the close deadline, both registered.
    fn pending_closing(&mut self, cx: &mut Context<'_>, more_to_read: bool) -> Poll<()> {
        if more_to_read {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl<T> Future for Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    type Output = Result<(), Error>;

    /// | phase | does | until |
    /// |---|---|---|
    /// | `Active` | reads and applies frames, writes batches, runs timers | the session ends |
    /// | `Flushing` | writes what is queued, CloseMux included | all written (or the close timeout) |
    /// | `ShuttingDown` | shuts the transport's writing down | done |
    /// | `Draining` | reads and discards | the peer closes (or the close timeout) |
    /// | `Done` | resolves with the session's outcome | |
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let this = &mut *self;
        #[cfg(feature = "tracing")]
        let _span = this.span.clone().entered();
        loop {
            match this.phase {
                Phase::Done => return Poll::Ready(this.shared.lock().outcome()),
                Phase::Flushing | Phase::ShuttingDown | Phase::Draining => {
                    if this.poll_closing(cx).is_pending() {
                        return Poll::Pending;
                    }
                    continue;
                }
                Phase::Active => {}
            }
            let more_to_read = this.poll_read_frames(cx);
            this.check_end();
            if this.phase != Phase::Active {
                continue;
            }
            match &mut this.write_failed {
                None => {
                    if let Poll::Ready(Err(error)) = this.poll_write_out(cx) {
                        // The peer may have sent data, even its CloseMux, before the connection
                        // failed: read on until the transport ends (for at most the close
                        // timeout), so that none of it is lost. Writes go nowhere meanwhile.
                        let deadline = Box::pin(tokio::time::sleep(this.close_timeout));
                        let mut inner = this.shared.lock();
                        inner.transport_write_failed(error.clone(), &mut this.wakers);
                        drop(inner);
                        this.wake_collected();
                        this.write_failed = Some((error, deadline));
                        continue;
                    }
                }
                Some((error, deadline)) => {
                    if deadline.as_mut().poll(cx).is_ready() {
                        let error = error.clone();
                        this.end(error, false);
                        this.check_end();
                        continue;
                    }
                }
            }
            this.poll_timers(cx);
            this.check_end();
            if this.phase != Phase::Active {
                continue;
            }
            if this.linger.poll_quiet(cx) {
                this.release_buffers();
            }
            if more_to_read {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Sleep until a handle queues output (it takes this waker) or the transport or a
            // timer wakes us. Checked and registered under one lock, so that nothing a handle
            // did since the checks above is missed: a handle finds no waker to take while the
            // driver runs, so a session ended meanwhile (`Session::close` from another thread)
            // must be seen here, or its CloseMux waits for the next keepalive, or for ever.
            let mut inner = this.shared.lock();
            let can_take = this.write_failed.is_none() && this.batch_written();
            if can_take && inner.has_output()
                || inner.end_reason().is_some()
                || inner.drained()
                || this.read_paused && !inner.control_over_limit()
            {
                continue;
            }
            let writing = this.write_failed.is_none() && !this.batch_written();
            inner.set_driver_waker(cx.waker(), writing);
            return Poll::Pending;
        }
    }
}

/// Ends the session when the driver goes away before it finished (dropped, or taken apart by
/// [`Connection::into_inner`]): every stream operation then fails with
/// [`Error::ClosedLocally`] instead of waiting for a driver that is gone.
struct EndOnDrop(Arc<Shared>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        let mut wakers = Vec::new();
        let mut inner = self.0.lock();
        if inner.is_finished() {
            return;
        }
        inner.end(Error::ClosedLocally, false, &mut wakers);
        inner.finish(None, &mut wakers);
        drop(inner);
        for waker in wakers {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::Connection;
    use crate::{Config, Role, Session};

    /// After a burst, the outgoing queues keep their capacity for `QUEUE_LINGER` and give it
    /// back when the driver next runs after that. (Here the timeouts wake the driver as they
    /// expire; an idle session's keepalive does the same.)
    #[tokio::test(start_paused = true)]
    async fn a_quiet_session_gives_back_its_outgoing_buffers() {
        let (io, peer) = tokio::io::duplex(64 * 1024);
        let (session, mut connection) = Session::new(io, Role::Client, Config::default());
        let peer = Session::server(peer);
        tokio::spawn(async move {
            let mut stream = peer.accept().await.expect("accept");
            let mut buf = vec![0; 64 * 1024];
            while stream.read(&mut buf).await.expect("read") > 0 {}
        });
        let burst = async {
            let mut stream = session.open().await.expect("open");
            stream.write_all(&[7; 4 << 20]).await.expect("write");
            stream
        };
        let stream = tokio::select! {
            stream = burst => stream,
            _ = &mut connection => panic!("the session ended"),
        };
        let held = |connection: &Connection<_>| {
            connection.write_buf.capacity() + connection.shared.lock().data_capacity()
        };
        // The driver writes out what is queued, and runs again as the timeout expires.
        let _ = tokio::time::timeout(super::QUEUE_LINGER / 2, &mut connection).await;
        assert!(
            held(&connection) > super::QUEUE_KEEP,
            "the burst's buffers are kept at first"
        );
        let _ = tokio::time::timeout(super::QUEUE_LINGER, &mut connection).await;
        assert_eq!(
            held(&connection),
            0,
            "and released once the session is quiet"
        );
        drop(stream);
    }
}
