//! [`Connection`]: the future that drives one session's transport.
//!
//! It alone reads and writes the transport. Each poll it (1) reads whatever the transport has
//! and applies the frames to the shared state, (2) moves the queued outgoing bytes into its own
//! buffer and writes them, flushing when nothing more is queued, (3) runs the keepalive and idle
//! timers. Reading never waits for the application: received data goes into per-stream buffers
//! bounded by the credit this side granted, inbound streams beyond the backlog are refused, and
//! a pending transport write does not stop reads (both are polled in the same turn).

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};
use tokio_util::codec::Decoder;

use super::out_queue::{Cursor, OutQueue, MAX_SLICES};
use super::read_buf::ReadBuffer;
use super::state::Shared;
use crate::codec::FrameCodec;
use crate::error::{CodecError, Error};
use crate::frame::{Header, Kind};

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
    /// Bytes being written to the transport, swapped with the shared queue when empty.
    write_buf: OutQueue,
    written: Cursor,
    /// `queued_total` at the end of `write_buf`.
    write_mark: u64,
    /// When the driver last finished writing a batch larger than [`QUEUE_KEEP`], until it
    /// releases the queues' memory.
    large_batch_at: Option<Instant>,
    /// Whether bytes were written since the transport was last flushed.
    unflushed: bool,
    phase: Phase,
    /// Wakers collected under the lock, woken after it is released.
    wakers: Vec<Waker>,
    /// Whether reading waits for queued refusals to drain.
    read_paused: bool,
    keepalive_interval: Option<Duration>,
    idle_timeout: Option<Duration>,
    /// Built on the first poll, inside the runtime (a `Sleep` needs its time driver).
    keepalive: Option<Timer>,
    idle: Option<Timer>,
    timers_started: bool,
    close_deadline: Option<Pin<Box<Sleep>>>,
    close_timeout: Duration,
    /// A write to the transport failed: why, and until when the driver reads on.
    write_failed: Option<(Error, Pin<Box<Sleep>>)>,
    /// `gomux{session, role}`, entered while the driver runs.
    #[cfg(feature = "tracing")]
    span: tracing::Span,
    _end_on_drop: EndOnDrop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading and writing.
    Active,
    /// The session has ended: write out what is queued (CloseMux included), then close.
    Flushing,
    /// Everything is written: shutting the transport down.
    ShuttingDown,
    /// The transport is closed or abandoned.
    Done,
}

/// A periodic check: fires `interval` after the last activity.
struct Timer {
    interval: Duration,
    last: Instant,
    sleep: Pin<Box<Sleep>>,
}

impl Timer {
    fn new(interval: Duration) -> Timer {
        let now = Instant::now();
        Timer {
            interval,
            last: now,
            sleep: Box::pin(tokio::time::sleep_until(now + interval)),
        }
    }

    /// Ready when `interval` has passed since the last activity; re-arms itself either way.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        let deadline = self.last + self.interval;
        if Instant::now() >= deadline {
            self.last = Instant::now();
            self.sleep.as_mut().reset(self.last + self.interval);
            let _ = self.sleep.as_mut().poll(cx);
            return true;
        }
        self.sleep.as_mut().reset(deadline);
        let _ = self.sleep.as_mut().poll(cx);
        false
    }
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    pub(crate) fn new(io: T, shared: Arc<Shared>) -> Connection<T> {
        let (max_payload, keepalive, idle, close_timeout) = {
            let inner = shared.lock();
            let c = &inner.config;
            crate::trace::event!(debug, session = inner.id, role = ?inner.role, "session started");
            (
                c.max_payload,
                c.keepalive_interval,
                c.idle_timeout,
                c.close_timeout,
            )
        };
        #[cfg(feature = "tracing")]
        let span = {
            let inner = shared.lock();
            tracing::debug_span!("gomux", session = inner.id, role = ?inner.role)
        };
        let end_on_drop = EndOnDrop(Arc::clone(&shared));
        Connection {
            io,
            shared,
            codec: FrameCodec::with_max_payload(max_payload).without_reserve(),
            read_buf: ReadBuffer::new(),
            write_buf: OutQueue::new(),
            written: Cursor::default(),
            write_mark: 0,
            large_batch_at: None,
            unflushed: false,
            phase: Phase::Active,
            wakers: Vec::new(),
            read_paused: false,
            keepalive_interval: keepalive,
            idle_timeout: idle,
            keepalive: None,
            idle: None,
            timers_started: false,
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

    /// Reads and applies frames until the transport has nothing more or the budget is spent.
    /// Returns whether the budget ran out (the driver should yield and come back).
    fn poll_read_frames(&mut self, cx: &mut Context<'_>) -> bool {
        let mut budget = READ_BUDGET;
        loop {
            if self.read_paused {
                self.read_paused = self.shared.lock().refusals_full();
                if self.read_paused {
                    // The peer opens streams faster than it reads our refusals: wait for the
                    // writer to send them (it wakes us when the transport takes them).
                    return false;
                }
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
                    n
                }
                Poll::Ready(Err(e)) => {
                    self.end(e.into(), false);
                    return false;
                }
            };
            if let Some(idle) = &mut self.idle {
                idle.last = Instant::now();
            }
            match self.apply_frames() {
                Ok(refusals_full) => self.read_paused = refusals_full,
                Err(error) => {
                    // A peer that broke the protocol is told so, best effort; one that sent
                    // CloseMux is closing already.
                    let close_mux = matches!(error, Error::Protocol(_));
                    self.end(error, close_mux);
                    return false;
                }
            }
            budget = budget.saturating_sub(n);
            if budget == 0 {
                return true;
            }
        }
    }

    /// Decodes every whole frame in the read buffer and applies it, under one lock. Returns
    /// whether refusals have piled up enough that reading should pause.
    fn apply_frames(&mut self) -> Result<bool, Error> {
        let mut inner = self.shared.lock();
        let result = loop {
            match self.codec.decode(self.read_buf.get_mut()) {
                Ok(Some(frame)) => {
                    if let Err(error) = inner.on_frame(frame, &mut self.wakers) {
                        break Err(error);
                    }
                }
                Ok(None) => break Ok(inner.refusals_full()),
                Err(CodecError::Protocol(e)) => break Err(e.into()),
                Err(CodecError::Io(e)) => break Err(e.into()),
                // Only the encoder reports it.
                Err(CodecError::InvalidFrame(_)) => break Ok(inner.refusals_full()),
            }
        };
        drop(inner);
        self.wake_collected();
        result
    }

    /// Writes queued bytes until the transport would block or nothing is queued, then flushes.
    /// `Ready(Ok)` means everything queued so far is written and flushed.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let mut took = false;
        loop {
            if self.write_buf.is_written(&self.written) {
                let mut inner = self.shared.lock();
                inner.queue_pending_control();
                if inner.out.is_empty() {
                    // Room nobody has claimed: the tasks woken for it may have been cancelled.
                    // Pass it on (unless it was just handed out), and come back to check again
                    // until nobody waits, since nothing else may wake this task.
                    let waiting = if took {
                        inner.space_waiting()
                    } else {
                        inner.wake_space(&mut self.wakers)
                    };
                    if waiting {
                        cx.waker().wake_by_ref();
                    }
                    if self
                        .large_batch_at
                        .is_some_and(|at| at.elapsed() >= QUEUE_LINGER)
                    {
                        self.large_batch_at = None;
                        inner.out.release();
                        self.write_buf.release();
                        self.written = Cursor::default();
                    }
                    drop(inner);
                    self.wake_collected();
                    break;
                }
                self.write_buf.clear();
                self.written = Cursor::default();
                std::mem::swap(&mut inner.out, &mut self.write_buf);
                self.write_mark = inner.queued_total;
                inner.wake_space(&mut self.wakers);
                took = true;
                drop(inner);
                self.wake_collected();
            }
            let io = Pin::new(&mut self.io);
            let result = if io.is_write_vectored() {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let count = self.write_buf.slices(&self.written, &mut slices);
                io.poll_write_vectored(cx, &slices[..count])
            } else {
                io.poll_write(cx, self.write_buf.next_slice(&self.written))
            };
            match result {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(
                        std::io::Error::from(std::io::ErrorKind::WriteZero).into()
                    ))
                }
                Poll::Ready(Ok(n)) => {
                    self.write_buf.advance(&mut self.written, n);
                    self.unflushed = true;
                    if self.write_buf.len() > QUEUE_KEEP && self.write_buf.is_written(&self.written)
                    {
                        self.large_batch_at = Some(Instant::now());
                    }
                    if let Some(keepalive) = &mut self.keepalive {
                        keepalive.last = Instant::now();
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
        if self.unflushed {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => {
                    self.unflushed = false;
                    let mut inner = self.shared.lock();
                    inner.written(self.write_mark, &mut self.wakers);
                    drop(inner);
                    self.wake_collected();
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if !self.timers_started {
            self.timers_started = true;
            self.keepalive = self.keepalive_interval.map(Timer::new);
            self.idle = self.idle_timeout.map(Timer::new);
        }
        if self.idle.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            self.end(Error::IdleTimeout, true);
        }
        if self.keepalive.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            let mut inner = self.shared.lock();
            inner.queue_header(Header::new(0, Kind::Keepalive));
            inner.stats.keepalives_sent += 1;
        }
    }

    /// Moves to closing when the session ended or nobody uses it any more.
    fn check_end(&mut self) {
        let mut inner = self.shared.lock();
        if inner.session_handles == 0 {
            inner.drop_accept_queue();
        }
        if inner.end.is_none() && inner.abandoned() {
            inner.close(&mut self.wakers);
        }
        if inner.end.is_some() {
            if inner.send_close_mux {
                inner.send_close_mux = false;
                inner.queue_header(Header::new(0, Kind::CloseMux));
            }
            self.phase = Phase::Flushing;
        }
        drop(inner);
        self.wake_collected();
    }

    fn finish(&mut self, close_error: Option<Error>) {
        self.phase = Phase::Done;
        let mut inner = self.shared.lock();
        if inner.close_error.is_none() {
            inner.close_error = close_error;
        }
        inner.finish(&mut self.wakers);
        drop(inner);
        self.wake_collected();
    }

    fn poll_closing(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self
            .close_deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(self.close_timeout)));
        if deadline.as_mut().poll(cx).is_ready() {
            let error = Error::Transport(Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the transport did not accept the final writes within the close timeout",
            )));
            self.finish(Some(error));
            return Poll::Ready(());
        }
        if self.phase == Phase::Flushing {
            let transport_dead = self.write_failed.is_some()
                || matches!(
                    self.shared.lock().end,
                    Some(Error::Transport(_) | Error::UnexpectedEof)
                );
            if transport_dead {
                // What was queued cannot be written: a failed write is reported by `close`.
                let failed = self.write_failed.as_ref().map(|(error, _)| error.clone());
                self.finish(failed);
                return Poll::Ready(());
            }
            match self.poll_write_out(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    self.finish(Some(e));
                    return Poll::Ready(());
                }
                Poll::Ready(Ok(())) => self.phase = Phase::ShuttingDown,
            }
        }
        match Pin::new(&mut self.io).poll_shutdown(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(result) => {
                // A peer that closed first makes shutdown fail; the session is over either way.
                let error = result.err().filter(|e| {
                    !matches!(
                        e.kind(),
                        std::io::ErrorKind::NotConnected
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::ConnectionReset
                    )
                });
                self.finish(error.map(Error::from));
                Poll::Ready(())
            }
        }
    }
}

impl<T> Future for Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let this = &mut *self;
        #[cfg(feature = "tracing")]
        let _span = this.span.clone().entered();
        // States: Active (read, write, time) until the session ends; then Flushing (write what
        // is queued, CloseMux included), ShuttingDown (close the transport), Done.
        loop {
            match this.phase {
                Phase::Done => return Poll::Ready(this.shared.lock().outcome()),
                Phase::Flushing | Phase::ShuttingDown => {
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
            if more_to_read {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Sleep until a handle queues output (it takes this waker) or the transport or a
            // timer wakes us. Checked and registered under one lock, so no output is missed.
            let mut inner = this.shared.lock();
            let write_buf_empty = this.write_buf.is_written(&this.written);
            let can_write = this.write_failed.is_none();
            if can_write && write_buf_empty && inner.has_output()
                || inner.abandoned()
                || this.read_paused && !inner.refusals_full()
            {
                continue;
            }
            if !inner
                .driver_waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                inner.driver_waker = Some(cx.waker().clone());
            }
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
        if inner.finished {
            return;
        }
        inner.end(Error::ClosedLocally, false, &mut wakers);
        inner.finish(&mut wakers);
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
            connection.write_buf.capacity() + connection.shared.lock().out.capacity()
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
