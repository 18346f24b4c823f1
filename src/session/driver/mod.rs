//! [`Connection`]: the future that drives one session's transport.
//!
//! It alone reads the transport, and writes it but for the frames writers write themselves
//! (see `session::direct`); it talks to the session's core only through its methods. Each poll
//! it (1) reads whatever the transport has and applies the frames to the core, (2) takes the
//! queued frames (control first, then data) and writes them, (3) runs the keepalive, idle and
//! write-stall timers. Reading never waits for the application: received
//! data goes into per-stream buffers bounded by the credit this side granted, inbound streams
//! beyond the backlog are refused, and a pending transport write does not stop reads (both are
//! polled in the same turn). Reading waits only while the control queue is over its bound,
//! which only a peer that does not read our frames can cause.
//!
//! One file per part, as h2's `proto/` and quinn's `connection/` split theirs:
//!
//! | file | what it owns |
//! |---|---|
//! | `mod.rs` | the `Connection` future: its state, and `poll`'s table of phases |
//! | `read.rs` | reading the transport and applying the frames to the core |
//! | `write.rs` | the write side: batches taken from the core, written as the transport takes them |
//! | `timers.rs` | keepalive, idle, liveness and write-stall timers; buffers given back when quiet |
//! | `closing.rs` | the closing phases: flushing, shutting down, draining |

mod closing;
mod read;
mod timers;
mod write;

use self::timers::{Clock, Timers};
use self::write::{Stall, WriteBatch, FIRST_BUDGET};

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Sleep;

use crate::codec::FrameCodec;
use crate::error::Error;
use crate::session::core::Shared;
use crate::session::read_buf::ReadBuffer;

/// Drives a session: reads, writes and times its transport. Created by
/// [`Session::new`](crate::Session::new); [`Session::client`](crate::Session::client) and the
/// other constructors spawn it for you.
///
/// Resolves when the session has ended and the transport is closed: `Ok(())` after a graceful
/// close by either side, otherwise the error that ended it. Dropping it ends the session: every
/// stream operation then fails with [`Error::ClosedLocally`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A session whose driver runs where you choose: here, in a task of a `JoinSet`.
/// let (io, peer) = tokio::io::duplex(64 * 1024);
/// let (session, connection) = gomux::Session::new(io, gomux::Role::Client, gomux::Config::default());
/// let _server = gomux::Session::server(peer);
/// let mut tasks = tokio::task::JoinSet::new();
/// tasks.spawn(connection);
/// session.close().await?;
/// assert!(tasks.join_next().await.expect("the driver")?.is_ok());
/// # Ok(())
/// # }
/// ```
#[must_use = "a session does nothing unless its connection is polled (spawn it)"]
pub struct Connection<T> {
    io: T,
    /// The session's state, which the driver ends if it goes first (see `EndOnDrop`).
    shared: EndOnDrop,
    codec: FrameCodec,
    read_buf: ReadBuffer,
    /// The timers' clock, and the timers: the keepalive, the peer's silence (the idle timeout,
    /// and twice the keepalive interval a peer of this crate announced once its greeting has
    /// come: silence that long means it is dead, see `Error::KeepaliveTimeout`), and the
    /// linger, after which a quiet session gives its buffers back (see `Timers`).
    clock: Clock,
    timers: Timers,
    /// The batch being written and its buffers: made by the first batch, dropped when the
    /// session goes quiet (see `WriteBatch`).
    write: Option<Box<WriteBatch>>,
    /// Control frames were queued after the batch was taken: they go at the next boundary.
    control_waiting: bool,
    /// How many times in a row the driver found the queues empty while room it handed out
    /// stood unclaimed (see [`write::GRANT_PATIENCE`]).
    grants_unclaimed: u8,
    /// The core's count of direct writes when the driver last looked: writes it did not make
    /// are activity too (see `session::direct`).
    direct_writes: u32,
    /// Whether bytes were written since the transport was last flushed.
    unflushed: bool,
    /// How much data the next batch takes, at most (see [`write::MIN_BUDGET`]): learned from what the
    /// transport takes, and kept when the write batch's buffers are given back, so that a
    /// session pausing on a slow link does not start again with a large batch in hand.
    budget: u32,
    phase: Phase,
    /// Reading waits for the control queue to drain below its bound.
    read_paused: bool,
    /// The transport's read side has ended (end-of-file or an error).
    read_closed: bool,
    /// The peer sent CloseMux: it is closing, so a broken pipe while we finish is no failure.
    peer_closed: bool,
    /// Wakes the driver when one of the timers must look again.
    timer_sleep: Option<Pin<Box<Sleep>>>,
    /// The peer's kind is known, so the peer's liveness is settled.
    peer_known: bool,
    /// The write-stall timer (see `Stall`), armed while the transport takes none of the bytes
    /// waiting for it.
    stall: Option<Box<Stall>>,
    close_deadline: Option<Pin<Box<Sleep>>>,
    /// A write to the transport failed: why, and until when the driver reads on. Boxed, as
    /// the timeouts are left in the configuration, to keep the driver's task small (see
    /// `WriteBatch`).
    write_failed: Option<Box<(Error, Pin<Box<Sleep>>)>>,
    /// `gomux{session, role}`, entered while the driver runs.
    #[cfg(feature = "tracing")]
    span: tracing::Span,
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

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    pub(crate) fn new(io: T, shared: Arc<Shared>) -> Connection<T> {
        let inner = shared.lock();
        let c = &inner.config;
        crate::trace::event!(debug, session = inner.id, role = ?inner.role, "session started");
        let (max_payload, keepalive, idle) = (c.max_payload, c.keepalive_interval, c.idle_timeout);
        #[cfg(feature = "tracing")]
        let span = tracing::debug_span!("gomux", session = inner.id, role = ?inner.role);
        drop(inner);
        Connection {
            io,
            shared: EndOnDrop(shared),
            codec: FrameCodec::with_max_payload(max_payload).without_reserve(),
            read_buf: ReadBuffer::new(),
            clock: Clock::new(),
            timers: Timers::new(keepalive, idle),
            write: None,
            control_waiting: false,
            grants_unclaimed: 0,
            direct_writes: 0,
            unflushed: false,
            budget: FIRST_BUDGET as u32,
            phase: Phase::Active,
            read_paused: false,
            read_closed: false,
            peer_closed: false,
            timer_sleep: None,
            peer_known: false,
            stall: None,
            close_deadline: None,
            write_failed: None,
            #[cfg(feature = "tracing")]
            span,
        }
    }

    /// The transport.
    ///
    /// ```
    /// let (io, _peer) = tokio::io::duplex(1024);
    /// let (_session, connection) = gomux::Session::new(io, gomux::Role::Client, gomux::Config::default());
    /// let _transport: &tokio::io::DuplexStream = connection.get_ref();
    /// ```
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

    /// Ends the session with `error`; `close_mux` says whether the peer should be told.
    fn end(&mut self, error: Error, close_mux: bool) {
        let mut wakers = Collected::new();
        let mut inner = self.shared.lock();
        inner.end(error, close_mux, wakers.list());
        drop(inner);
        wakers.wake();
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
        this.poll_phases(cx)
    }
}

thread_local! {
    /// Room for the wakers a driver collects, one per thread, lent to the driver running on
    /// it (see [`Collected`]): a session holds none between polls, so an idle one holds none
    /// (`benches/idle_sessions.rs`), and a busy one allocates nothing for it. It keeps the
    /// room of the most wakers collected at once on the thread.
    static SPARE_WAKERS: Cell<Vec<Waker>> = const { Cell::new(Vec::new()) };
}

/// Wakers collected under the session's lock, to be woken once it is released, in the
/// thread's room for them (see [`SPARE_WAKERS`]). One at a time per thread: one made while
/// another is held would find no room to borrow.
struct Collected(Vec<Waker>);

impl Collected {
    fn new() -> Collected {
        Collected(SPARE_WAKERS.try_with(Cell::take).unwrap_or_default())
    }

    fn list(&mut self) -> &mut Vec<Waker> {
        &mut self.0
    }

    /// Wakes them (the lock released), and gives the room back.
    fn wake(self) {}
}

impl Drop for Collected {
    fn drop(&mut self) {
        for waker in self.0.drain(..) {
            waker.wake();
        }
        let room = std::mem::take(&mut self.0);
        let _ = SPARE_WAKERS.try_with(|spare| spare.set(room));
    }
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    /// `poll`'s phases; see the table there.
    fn poll_phases(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        let this = self;
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
            match this.write_failed.as_deref_mut() {
                None => {
                    if let Poll::Ready(Err(error)) = this.poll_write_out(cx) {
                        // The peer may have sent data, even its CloseMux, before the connection
                        // failed: read on until the transport ends (for at most the close
                        // timeout), so that none of it is lost. Writes go nowhere meanwhile.
                        let mut wakers = Collected::new();
                        let mut inner = this.shared.lock();
                        let deadline = Box::pin(tokio::time::sleep(inner.config.close_timeout));
                        inner.transport_write_failed(error.clone(), wakers.list());
                        drop(inner);
                        wakers.wake();
                        this.write_failed = Some(Box::new((error, deadline)));
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
            // Whether the session ended (what `check_end` does) and whether to sleep are
            // decided under one lock. `wakers` is declared before `inner`, so that on every
            // way out below the lock is let go before the tasks collected are woken.
            let mut wakers = Collected::new();
            let mut inner = this.shared.lock();
            // A handle finds no waker to take while the driver runs, so a session ended
            // meanwhile (`Session::close` from another thread) must be seen here, or its
            // CloseMux waits for the next keepalive, or for ever.
            if closing::ended(&mut inner, &mut wakers) {
                this.phase = Phase::Flushing;
                continue;
            }
            if more_to_read {
                drop(inner);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Sleep until a handle queues output (it takes this waker) or the transport or a
            // timer wakes us. Checked and registered under the lock taken above, so that
            // nothing a handle did since the checks before it is missed. (A driver that
            // yielded to the writers was woken by itself, and takes its batch on the next
            // poll.)
            let can_take = this.write_failed.is_none() && this.batch_written();
            if can_take && inner.has_output() && !inner.yielded_to_writers()
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

impl std::ops::Deref for EndOnDrop {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

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
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::Connection;
    use crate::session::linger::LINGER;
    use crate::{Config, Role, Session};

    /// A client session over a 64 KiB pipe, its driver for the test to poll, and a server
    /// that reads all of the first stream it accepts and echoes the reads of five bytes.
    fn client_with_reader() -> (Session, Connection<tokio::io::DuplexStream>) {
        let (io, peer) = tokio::io::duplex(64 * 1024);
        let (session, connection) = Session::new(io, Role::Client, Config::default());
        let peer = Session::server(peer);
        tokio::spawn(async move {
            let mut stream = peer.accept().await.expect("accept");
            let mut buf = vec![0; 64 * 1024];
            loop {
                let n = stream.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                if n == 5 {
                    stream.write_all(&buf[..5]).await.expect("echo");
                }
            }
            drop(peer);
        });
        (session, connection)
    }

    /// After a burst, the outgoing queues keep their capacity for `QUEUE_LINGER` and give it
    /// back when the driver next runs after that. (Here the timeouts wake the driver as they
    /// expire; an idle session's keepalive does the same.)
    #[tokio::test(start_paused = true)]
    async fn a_quiet_session_gives_back_its_outgoing_buffers() {
        let (session, mut connection) = client_with_reader();
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
            connection
                .write
                .as_ref()
                .map_or(0, |w| w.write_buf.capacity())
                + connection.shared.lock().data_capacity()
        };
        // The driver writes out what is queued, and runs again as the timeout expires.
        let _ = tokio::time::timeout(super::write::QUEUE_LINGER / 2, &mut connection).await;
        assert!(
            held(&connection) > super::write::QUEUE_KEEP,
            "the burst's buffers are kept at first"
        );
        let _ = tokio::time::timeout(super::write::QUEUE_LINGER, &mut connection).await;
        assert_eq!(
            held(&connection),
            0,
            "and released once the session is quiet"
        );
        drop(stream);
    }

    /// A driver whose batches the transport takes whole holds none between them: it hands
    /// each back to the thread, where the next driver to write borrows it. One that met a
    /// push-back keeps its own until the session goes quiet.
    #[tokio::test(start_paused = true)]
    async fn a_batch_written_whole_goes_back_to_the_thread_and_one_pushed_back_stays() {
        // Whether the thread has a batch, holding nothing of what was written.
        let thread_has_batch = || {
            super::write::SPARE_BATCH.with(|spare| {
                let batch = spare.take();
                let has = batch
                    .as_ref()
                    .is_some_and(|b| b.write_buf.is_empty() && b.control_buf.is_empty());
                spare.set(batch);
                has
            })
        };
        let (session, mut connection) = client_with_reader();
        let exchange = async {
            let mut stream = session.open().await.expect("open");
            stream.write_all(b"hello").await.expect("write");
            let mut echo = [0; 5];
            stream.read_exact(&mut echo).await.expect("echo");
            stream
        };
        let mut stream = tokio::select! {
            stream = exchange => stream,
            _ = &mut connection => panic!("the session ended"),
        };
        let _ = tokio::time::timeout(Duration::from_millis(10), &mut connection).await;
        assert!(connection.write.is_none(), "no batch held between writes");
        assert!(thread_has_batch(), "the thread keeps the batch");

        // 4 MiB into a 64 KiB pipe: the transport pushes back.
        let burst = stream.write_all(&[7; 4 << 20]);
        tokio::select! {
            result = burst => result.expect("write"),
            _ = &mut connection => panic!("the session ended"),
        };
        assert!(connection.write.is_some(), "a batch pushed back on is kept");
        let _ = tokio::time::timeout(LINGER * 2, &mut connection).await;
        assert!(connection.write.is_none(), "until the session goes quiet");
        drop(stream);
    }

    /// tokio allocates a task in steps of 128 bytes: with its header and trailer, a future of
    /// up to 152 bytes gets a 256-byte task (tokio 1.54, measured by spawning futures of known
    /// sizes and recording the allocation), one of 160 a 384-byte one. The driver is every
    /// session's task, so a field added here costs each idle session 128 bytes
    /// (`benches/idle_sessions.rs`). (With the `tracing` feature its span takes 40 more.)
    #[cfg(not(feature = "tracing"))]
    #[test]
    fn the_driver_fits_tokios_256_byte_task() {
        type Spawned = Connection<crate::session::direct::SharedIo<tokio::net::TcpStream>>;
        let size = std::mem::size_of::<Spawned>();
        assert!(size <= 152, "the driver takes {size} bytes");
    }
}
