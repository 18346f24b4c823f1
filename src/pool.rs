//! [`Pool`]: a client's streams spread over several sessions to one server.
//!
//! A session is driven by one task, so one connection uses at most one core at each end. A pool
//! keeps up to K sessions and opens each stream on the one with the fewest live streams, as
//! kcptun's `--conn` and frp's connection pool spread their streams.
//!
//! The pool is a table of slots under one mutex, held only to read or change the table (never
//! across an await, never during I/O). A slot is empty, connecting, or holds a session:
//!
//! | slot | what moves it on |
//! |---|---|
//! | empty, backoff passed | an `open` (or [`Pool::fill`]) starts a connect, in a task of its own |
//! | connecting | the connect's end: a session, or a failure that sets the slot's backoff |
//! | session | it ends (seen by the next `open`) or refuses an open: the slot is empty again |
//!
//! One connect per slot at a time, so openers arriving during a reconnect never connect the
//! same slot twice; they take the live sessions meanwhile, or wait for the connect when none
//! is live.

use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use crate::config::{Config, Role};
use crate::error::Error;
use crate::session::core::WaitList;
use crate::session::Session;
use crate::stream::Stream;

/// Default wait after the second failure in a row of a slot; it doubles with each further one.
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);

/// Default longest wait between two connects of a slot.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Default time a connect may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What stands for "never" when a wait or a backoff is too long for an [`Instant`] (as tokio's
/// own `Interval` does): about 30 years.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// Up to K client sessions to one server, over which streams are opened fewest-first.
///
/// Cheap to clone (`Clone + Send + Sync`, an `Arc` inside): every clone uses the same sessions.
/// The pool connects lazily: the first [`open`](Pool::open) (or [`fill`](Pool::fill)) starts
/// a connect for every slot, in a task of its own, and takes the first session made. Each
/// session takes [`Role::Client`] and the pool's [`Config`].
///
/// # Choosing a session
///
/// [`open`](Pool::open) takes the live session with the fewest streams
/// ([`Session::stream_count`], plus the opens under way on it), starting its search after the
/// session chosen last, so that ties go round. A session that has ended, or whose `open` fails
/// with an error that ends sessions ([`Error::is_session_end`]), leaves its slot, which the
/// pool connects again; opens go to the live sessions meanwhile, and wait for the connect only
/// when none is live.
///
/// # Waiting for a session
///
/// When no session is live, [`open`](Pool::open) waits for one, as tonic's `Channel` and
/// bb8's `get` wait for a connection: across a server's restart, opens made while it is down
/// succeed as soon as a connect does. It waits at most the open timeout (the connect timeout,
/// 10 s, unless [`PoolBuilder::open_timeout`] sets another), and then fails with
/// [`Error::PoolUnavailable`], which carries the latest real failure (a connect's I/O error,
/// or why the last session ended). While it waits, the slots are connected again as their
/// backoff allows; the opens waiting share those connects.
///
/// # Failures and backoff
///
/// A slot fails when its connect fails or takes longer than the connect timeout (10 s by
/// default), or when its session ends, or refuses opens, less than the longest backoff (5 s)
/// after it was made. After a first failure in a row the slot may connect again at once;
/// after the second it waits the initial backoff (100 ms), and twice as long after each
/// further failure, up to the longest. A session that lived at least the longest backoff
/// resets the count. So a server that is down, or that accepts and drops connections, sees at
/// most one connect per slot per backoff period, however many `open` calls there are.
///
/// A session the server closed cleanly (CloseMux, [`Error::ClosedByPeer`]: a graceful
/// restart or a server draining its connections) is not a failure once it lived the initial
/// backoff: the count starts afresh and the slot connects again at once, so a clean restart
/// does not grow the backoff. One closed sooner counts as a failure, so a server that accepts
/// and closes every connection at once is not connected in a loop.
///
/// # Streams the server opens
///
/// A pool is for opening streams; it offers no `accept`. Which of K interchangeable
/// connections the server picks to open a stream on says nothing to the client, and a merged
/// `accept` would have to follow sessions as they are replaced. Streams the server opens wait
/// in their session's accept backlog ([`Config::accept_backlog`], beyond which they are
/// refused) and end with the session. A protocol in which the server opens streams can accept
/// on the sessions of [`sessions`](Pool::sessions), or use plain [`Session`]s.
///
/// # Closing
///
/// [`close`](Pool::close) and [`graceful_close`](Pool::graceful_close) end every session and
/// make later opens fail with [`Error::ClosedLocally`]. When the last handle to the pool is
/// dropped (and its connects under way have finished), its sessions are dropped: each closes
/// itself once its last stream is gone, as a session does whose handles are all dropped.
///
/// # Example
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::net::{TcpListener, TcpStream};
///
/// // A server that echoes every stream of every connection.
/// let listener = TcpListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// tokio::spawn(async move {
///     while let Ok((socket, _)) = listener.accept().await {
///         socket.set_nodelay(true)?;
///         let session = gomux::Session::server(socket);
///         tokio::spawn(async move {
///             while let Ok(stream) = session.accept().await {
///                 tokio::spawn(async move {
///                     let (mut reader, mut writer) = stream.into_split();
///                     tokio::io::copy(&mut reader, &mut writer).await?;
///                     writer.shutdown().await
///                 });
///             }
///         });
///     }
///     std::io::Result::Ok(())
/// });
///
/// // Four connections, each stream on the least busy one.
/// let pool = gomux::Pool::new(4, gomux::Config::default(), move || async move {
///     let socket = TcpStream::connect(addr).await?;
///     socket.set_nodelay(true)?;
///     Ok(socket)
/// });
/// let mut stream = pool.open().await?;
/// stream.write_all(b"hello").await?;
/// stream.shutdown().await?;
/// let mut echo = Vec::new();
/// stream.read_to_end(&mut echo).await?;
/// assert_eq!(echo, b"hello");
/// pool.close().await?;
/// # Ok(())
/// # }
/// ```
pub struct Pool {
    shared: Arc<Shared>,
}

/// How a [`Pool`] is made: its size, the sessions' configuration, its backoff, connect
/// timeout and open timeout. From [`Pool::builder`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), gomux::Error> {
/// use std::time::Duration;
/// use tokio::net::TcpStream;
///
/// # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// # let addr = listener.local_addr()?;
/// # tokio::spawn(async move {
/// #     while let Ok((socket, _)) = listener.accept().await {
/// #         let session = gomux::Session::server(socket);
/// #         tokio::spawn(async move { while session.accept().await.is_ok() {} });
/// #     }
/// # });
/// let pool = gomux::Pool::builder(8)
///     .config(gomux::Config::default().max_streams(10_000))
///     // A failing server is retried after 50 ms, then 100, 200, ... up to every 2 s.
///     .backoff(Duration::from_millis(50), Duration::from_secs(2))
///     .connect_timeout(Duration::from_secs(3))
///     // Across a server's restart, an open waits up to 30 s for a session.
///     .open_timeout(Duration::from_secs(30))
///     .build(move || async move {
///         let socket = TcpStream::connect(addr).await?;
///         socket.set_nodelay(true)?;
///         Ok(socket)
///     });
/// let stream = pool.open().await?;
/// # drop(stream);
/// # pool.close().await
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct PoolBuilder {
    size: usize,
    config: Config,
    backoff: Backoff,
    connect_timeout: Duration,
    /// `None`: the connect timeout.
    open_timeout: Option<Duration>,
}

/// A live session of a [`Pool`], with its place in it.
#[derive(Debug, Clone)]
pub struct PooledSession {
    slot: usize,
    number: u64,
    session: Session,
}

impl Pool {
    /// A pool of `size` sessions (at least 1) with `config`, each made over a transport that
    /// `connect` returns, and the default backoff and connect timeout (see
    /// [`Pool::builder`]).
    ///
    /// `connect` is called once per connect, from a task of its own: a TCP connect with
    /// `set_nodelay(true)`, a TLS handshake after it, anything that yields an
    /// `AsyncRead + AsyncWrite`. Nothing is connected before the first [`open`](Pool::open)
    /// or [`fill`](Pool::fill).
    pub fn new<F, Fut, T>(size: usize, config: Config, connect: F) -> Pool
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<T>> + Send + 'static,
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        Pool::builder(size).config(config).build(connect)
    }

    /// A builder for a pool of `size` sessions (at least 1), with the default [`Config`], a
    /// backoff from 100 ms to 5 s and a connect timeout of 10 s.
    pub fn builder(size: usize) -> PoolBuilder {
        PoolBuilder {
            size: size.max(1),
            config: Config::default(),
            backoff: Backoff {
                initial: BACKOFF_INITIAL,
                max: BACKOFF_MAX,
            },
            connect_timeout: CONNECT_TIMEOUT,
            open_timeout: None,
        }
    }

    /// Opens a stream on the live session with the fewest streams, waiting for one to be
    /// connected if none is live (see [`Pool`], "Waiting for a session").
    ///
    /// Cancel safe: a dropped `open` future has opened nothing (a connect it started goes on
    /// and fills its slot).
    ///
    /// # Errors
    ///
    /// [`Error::SessionUnavailable`] (with [`Error::ClosedLocally`] inside) once the pool is
    /// closed; [`Error::PoolUnavailable`] when no session was live within the open timeout;
    /// [`Error::TooManyStreams`] from the session chosen. Like a session's `open`, no frame
    /// of the stream was written when it fails: every error is safe to retry
    /// ([`Error::is_retry_safe`]).
    pub async fn open(&self) -> Result<Stream, Error> {
        self.open_with_session().await.map(|(stream, _)| stream)
    }

    /// As [`open`](Pool::open), and tells which session the stream is on: to follow that
    /// session's end, or to name it in logs.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// # let connect = || async {
    /// #     let (client, server) = tokio::io::duplex(64 * 1024);
    /// #     let server = gomux::Session::server(server);
    /// #     tokio::spawn(async move { while server.accept().await.is_ok() {} });
    /// #     Ok(client)
    /// # };
    /// let pool = gomux::Pool::new(2, gomux::Config::default(), connect);
    /// let (stream, pooled) = pool.open_with_session().await?;
    /// println!("stream {} on session {} (slot {})", stream.id(), pooled.number(), pooled.slot());
    ///
    /// // Follow the session the stream is on: its end ends the stream too.
    /// let session = pooled.session().clone();
    /// tokio::spawn(async move {
    ///     let reason = session.closed().await;
    ///     println!("the session under the stream ended: {reason}");
    /// });
    /// # drop(stream);
    /// # pool.close().await
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`open`](Pool::open).
    pub async fn open_with_session(&self) -> Result<(Stream, PooledSession), Error> {
        let deadline = later(Instant::now(), self.shared.open_timeout);
        let mut waiting = Waiting {
            shared: &self.shared,
            slot: None,
        };
        let mut timer = pin!(tokio::time::sleep_until(deadline));
        loop {
            let (pooled, _opening) =
                poll_fn(|cx| self.poll_choose(cx, &mut waiting.slot, deadline, timer.as_mut()))
                    .await?;
            // The open waits within the same deadline for room on the session it was given
            // (its `max_streams`, or the peer's backlog of unacknowledged streams).
            let opened = tokio::time::timeout_at(deadline, pooled.session.open()).await;
            let Ok(opened) = opened else {
                return Err(Error::PoolUnavailable {
                    last: Some(Box::new(Error::TooManyStreams)),
                });
            };
            match opened {
                Ok(stream) => return Ok((stream, pooled)),
                // The session is over (or draining): it leaves its slot, and another is tried.
                // Each time one fewer is live, and replacements are bounded by the backoff, so
                // this ends.
                Err(Error::SessionUnavailable(reason)) => {
                    let retired = self.shared.lock().retire(&pooled, *reason, &self.shared);
                    drop(retired);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Connects every slot that has no session and whose backoff has passed, and waits until
    /// those connects have finished. Returns how many sessions are live then.
    ///
    /// Not needed before [`open`](Pool::open), which connects by itself; useful to have all
    /// connections made up front, or to spread the first streams over all of them.
    pub async fn fill(&self) -> usize {
        drop(self.shared.start_connects());
        let mut waiting = Waiting {
            shared: &self.shared,
            slot: None,
        };
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            if state.slots.iter().any(|slot| slot.connecting) {
                state.wait(&mut waiting.slot, cx.waker());
                return Poll::Pending;
            }
            Poll::Ready(state.live().count())
        })
        .await
    }

    /// The live sessions, with their slots: a snapshot.
    pub fn sessions(&self) -> Vec<PooledSession> {
        self.shared.lock().live().cloned().collect()
    }

    /// How many sessions are live (made and not ended).
    pub fn live(&self) -> usize {
        self.shared.lock().live().count()
    }

    /// The number of slots, K.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// How many sessions the pool has made so far, replacements included.
    pub fn connects(&self) -> u64 {
        self.shared.lock().connects
    }

    /// Whether [`close`](Pool::close) or [`graceful_close`](Pool::graceful_close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// Closes the pool: later opens fail with [`Error::ClosedLocally`], nothing is connected
    /// any more, and every session is closed with [`Session::close`], all at once. Connects
    /// under way close the session they make.
    ///
    /// # Errors
    ///
    /// The first error a session's close returned (one that had already ended with an error
    /// returns that error); the other sessions are closed all the same.
    pub async fn close(&self) -> Result<(), Error> {
        let sessions = self.shared.shut();
        let closes = sessions.iter().map(|session| session.close());
        join_all(closes.collect())
            .await
            .into_iter()
            .collect::<Result<Vec<()>, Error>>()
            .map(drop)
    }

    /// Closes the pool gracefully: later opens fail with [`Error::ClosedLocally`], nothing is
    /// connected any more, and every session closes with
    /// [`Session::graceful_close`]`(timeout)`, all at once: the streams already open finish,
    /// then each session closes; at the deadline what is left is cut.
    ///
    /// # Errors
    ///
    /// [`Error::GracefulCloseTimedOut`] with the streams cut in all sessions together when any
    /// were; otherwise the first error a session's close returned.
    pub async fn graceful_close(&self, timeout: Duration) -> Result<(), Error> {
        let sessions = self.shared.shut();
        let closes = sessions
            .iter()
            .map(|session| session.graceful_close(timeout));
        let mut cut = 0;
        let mut first = Ok(());
        for result in join_all(closes.collect()).await {
            match result {
                Err(Error::GracefulCloseTimedOut { streams }) => cut += streams,
                Err(error) if first.is_ok() => first = Err(error),
                _ => {}
            }
        }
        if cut > 0 {
            return Err(Error::GracefulCloseTimedOut { streams: cut });
        }
        first
    }

    /// How many `open` and `fill` calls are waiting now for a session or a connect: a
    /// pool that cannot keep up with its callers, or a server that is away, shows here.
    pub fn waiting(&self) -> usize {
        self.shared.lock().waiting
    }

    /// Chooses the session for an open, starting connects for the slots that need one. When
    /// none is live it waits (registered in `slot`) for a connect to finish, for the next
    /// slot's backoff to pass (`timer`), or until `deadline`, where it fails.
    fn poll_choose(
        &self,
        cx: &mut Context<'_>,
        slot: &mut Option<usize>,
        deadline: Instant,
        mut timer: Pin<&mut Sleep>,
    ) -> Poll<Result<(PooledSession, Opening), Error>> {
        let pooled = loop {
            // Dropped after the lock is let go (declared before it).
            let _retired = self.shared.start_connects();
            let mut state = self.shared.lock();
            if state.closed {
                state.stop_waiting(slot);
                return Poll::Ready(Err(Error::SessionUnavailable(Box::new(
                    Error::ClosedLocally,
                ))));
            }
            if let Some(index) = state.least_loaded() {
                state.stop_waiting(slot);
                state.next = (index + 1) % self.shared.size;
                let entry = &mut state.slots[index];
                entry.opening += 1;
                break entry.session.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                state.stop_waiting(slot);
                let last = state.last_error.clone().map(Box::new);
                return Poll::Ready(Err(Error::PoolUnavailable { last }));
            }
            state.wait(slot, cx.waker());
            // A finished connect wakes the waiters; a slot whose backoff passes does not, so
            // the timer is set for the first of them (or the deadline).
            let wake_at = if state.slots.iter().any(|slot| slot.connecting) {
                deadline
            } else {
                state
                    .slots
                    .iter()
                    .filter_map(|slot| slot.retry_at)
                    .min()
                    .map_or(deadline, |at| at.min(deadline))
            };
            drop(state);
            if timer.deadline() != wake_at {
                timer.as_mut().reset(wake_at);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The time has come already: a slot may connect again, or the deadline passed.
        };
        // `least_loaded` only returns slots that hold a session.
        let pooled = pooled.ok_or(Error::ConnectionClosed)?;
        let opening = Opening {
            shared: Arc::clone(&self.shared),
            number: pooled.number,
            slot: pooled.slot,
        };
        Poll::Ready(Ok((pooled, opening)))
    }
}

impl Clone for Pool {
    fn clone(&self) -> Pool {
        Pool {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Pool")
            .field("size", &self.shared.size)
            .field("live", &state.live().count())
            .field(
                "connecting",
                &state.slots.iter().filter(|slot| slot.connecting).count(),
            )
            .field("connects", &state.connects)
            .field("waiting", &state.waiting)
            .field("closed", &state.closed)
            .finish()
    }
}

impl PoolBuilder {
    /// The configuration of every session (default [`Config::default`]).
    pub fn config(mut self, config: Config) -> PoolBuilder {
        self.config = config;
        self
    }

    /// The wait after a slot's second failure in a row, which doubles with each further one,
    /// and the longest wait (defaults 100 ms and 5 s; `max` is at least `initial`). A session
    /// that lives `max` counts as a success (see [`Pool`], "Failures and backoff"). These bound
    /// how often the pool connects to a server that fails: once per slot per `max` at most,
    /// after the first few attempts.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> PoolBuilder {
        self.backoff = Backoff {
            initial,
            max: max.max(initial),
        };
        self
    }

    /// How long a connect may take before it counts as failed (default 10 s). Also the open
    /// timeout, unless [`open_timeout`](PoolBuilder::open_timeout) sets another.
    pub fn connect_timeout(mut self, timeout: Duration) -> PoolBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// How long an [`open`](Pool::open) waits for a live session, and then for room on it (the
    /// session's `max_streams`, or the peer's backlog of unacknowledged streams), before it
    /// fails with [`Error::PoolUnavailable`] (default: the connect timeout); one that timed out
    /// waiting for room carries [`Error::TooManyStreams`] as its latest failure. [`Duration::ZERO`] never
    /// waits: an open fails at once when no session is live (the connects it starts go on).
    /// [`Duration::MAX`] waits for as long as it takes.
    pub fn open_timeout(mut self, timeout: Duration) -> PoolBuilder {
        self.open_timeout = Some(timeout);
        self
    }

    /// The pool, connecting with `connect` (see [`Pool::new`]). Nothing is connected yet.
    pub fn build<F, Fut, T>(self, connect: F) -> Pool
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<T>> + Send + 'static,
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let PoolBuilder {
            size,
            config,
            backoff,
            connect_timeout,
            open_timeout,
        } = self;
        let connect: ConnectFn = Box::new(move || {
            let transport = connect();
            let config = config.clone();
            Box::pin(async move {
                let transport = transport.await?;
                Ok(Session::with_config(transport, Role::Client, config))
            })
        });
        Pool {
            shared: Arc::new(Shared {
                size,
                backoff,
                connect_timeout,
                open_timeout: open_timeout.unwrap_or(connect_timeout),
                connect,
                state: Mutex::new(State {
                    slots: (0..size).map(|_| Slot::default()).collect(),
                    next: 0,
                    connects: 0,
                    closed: false,
                    last_error: None,
                    waiters: WaitList::new(),
                    waiting: 0,
                }),
            }),
        }
    }
}

impl PooledSession {
    /// The session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Its slot, `0..K`. A replacement takes the slot of the session it replaces.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Its number: the pool's sessions are numbered from 1 in the order they were made, so
    /// two sessions of one pool never have the same.
    pub fn number(&self) -> u64 {
        self.number
    }
}

/// Makes a session: the caller's connect, then the session on the transport.
type ConnectFn =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = io::Result<Session>> + Send>> + Send + Sync>;

struct Shared {
    size: usize,
    backoff: Backoff,
    connect_timeout: Duration,
    open_timeout: Duration,
    connect: ConnectFn,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    initial: Duration,
    max: Duration,
}

struct State {
    slots: Vec<Slot>,
    /// Where the next search for the least loaded session starts.
    next: usize,
    /// Sessions made so far; numbers them.
    connects: u64,
    closed: bool,
    /// Why the latest connect failed, or the latest session left its slot: what `open` reports
    /// when no session can be had.
    last_error: Option<Error>,
    /// Opens and fills waiting for a connect to finish, one slot each (given back on drop).
    waiters: WaitList,
    /// Slots held in `waiters`.
    waiting: usize,
}

#[derive(Default)]
struct Slot {
    session: Option<PooledSession>,
    /// When the session was made.
    since: Option<Instant>,
    /// A connect for this slot is under way (only one at a time).
    connecting: bool,
    /// Opens under way on the session, counted with its streams when choosing.
    opening: usize,
    /// Failures in a row.
    failures: u32,
    /// No connect before this.
    retry_at: Option<Instant>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between any two statements that change it: a panic while
        // it was held leaves nothing half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the ended sessions out of their slots, and starts a connect for every slot that
    /// needs one and may have one. Returns the sessions taken out, to be dropped once the
    /// caller has let go of the lock (dropping a session handle takes the session's lock).
    fn start_connects(self: &Arc<Self>) -> Vec<PooledSession> {
        let now = Instant::now();
        let mut retired = Vec::new();
        let mut start = Vec::new();
        {
            let mut state = self.lock();
            if state.closed {
                return retired;
            }
            for index in 0..self.size {
                let ended = state.slots[index]
                    .session
                    .as_ref()
                    .and_then(|pooled| pooled.session.close_reason());
                if let Some(reason) = ended {
                    let clean = matches!(reason, Error::ClosedByPeer);
                    retired.extend(state.slots[index].retire(now, self.backoff, clean));
                    state.last_error = Some(reason);
                }
                let slot = &mut state.slots[index];
                if slot.session.is_none()
                    && !slot.connecting
                    && slot.retry_at.is_none_or(|at| at <= now)
                {
                    slot.connecting = true;
                    start.push(index);
                }
            }
        }
        for index in start {
            tokio::spawn(connect_slot(Arc::clone(self), index));
        }
        retired
    }

    /// Closes the pool to new opens and connects, wakes the opens waiting, and returns the
    /// sessions to close.
    fn shut(&self) -> Vec<Session> {
        let mut wakers = Vec::new();
        let sessions = {
            let mut state = self.lock();
            state.closed = true;
            state.waiters.wake_all(&mut wakers);
            state
                .slots
                .iter()
                .filter_map(|slot| slot.session.as_ref())
                .map(|pooled| pooled.session.clone())
                .collect()
        };
        wakers.into_iter().for_each(Waker::wake);
        sessions
    }

    /// Records a connect's outcome in its slot, and wakes the opens waiting for one. Returns a
    /// session that came too late (the pool was closed meanwhile).
    fn connected(&self, index: usize, outcome: Result<Session, Error>) -> Option<Session> {
        let now = Instant::now();
        let mut wakers = Vec::new();
        let late = {
            let mut state = self.lock();
            let closed = state.closed;
            let state = &mut *state;
            let slot = &mut state.slots[index];
            slot.connecting = false;
            let late = match outcome {
                Ok(session) if closed => Some(session),
                Ok(session) => {
                    state.connects += 1;
                    slot.session = Some(PooledSession {
                        slot: index,
                        number: state.connects,
                        session,
                    });
                    slot.since = Some(now);
                    slot.opening = 0;
                    None
                }
                Err(error) => {
                    slot.fail(now, self.backoff);
                    state.last_error = Some(error);
                    None
                }
            };
            // Taken last, once the slot is settled: the waiters must see its new state.
            state.waiters.wake_all(&mut wakers);
            late
        };
        wakers.into_iter().for_each(Waker::wake);
        late
    }
}

impl State {
    /// Registers a waiting `open` or `fill` in its `slot` of the waiters.
    fn wait(&mut self, slot: &mut Option<usize>, waker: &Waker) {
        self.waiting += usize::from(slot.is_none());
        self.waiters.register(slot, waker);
    }

    /// Gives up the `slot` of an `open` or `fill` that waits no more.
    fn stop_waiting(&mut self, slot: &mut Option<usize>) {
        self.waiting -= usize::from(slot.is_some());
        self.waiters.remove(slot);
    }

    /// The live sessions.
    fn live(&self) -> impl Iterator<Item = &PooledSession> {
        self.slots
            .iter()
            .filter_map(|slot| slot.session.as_ref())
            .filter(|pooled| !pooled.session.is_closed())
    }

    /// The slot of the live session with the fewest streams and opens under way, searching
    /// from `next` so that ties go round.
    fn least_loaded(&self) -> Option<usize> {
        let size = self.slots.len();
        let mut best: Option<(usize, usize)> = None;
        for index in (0..size).map(|offset| (self.next + offset) % size) {
            let slot = &self.slots[index];
            let Some(pooled) = &slot.session else {
                continue;
            };
            if pooled.session.is_closed() {
                continue;
            }
            let load = pooled.session.stream_count() + slot.opening;
            if best.is_none_or(|(_, least)| load < least) {
                best = Some((index, load));
            }
        }
        best.map(|(index, _)| index)
    }

    /// Takes `pooled` out of its slot after its open failed with `error`, unless it has left
    /// already. Returns it, to be dropped once the lock is let go.
    fn retire(
        &mut self,
        pooled: &PooledSession,
        error: Error,
        shared: &Shared,
    ) -> Option<PooledSession> {
        let slot = &mut self.slots[pooled.slot];
        if slot
            .session
            .as_ref()
            .is_none_or(|current| current.number != pooled.number)
        {
            return None;
        }
        let clean = matches!(error, Error::ClosedByPeer);
        self.last_error = Some(error);
        slot.retire(Instant::now(), shared.backoff, clean)
    }
}

impl Slot {
    /// Empties the slot of its session. A session that lived less than the longest backoff
    /// counts as a failure (a server that accepts and drops connections must not be connected
    /// in a loop); one that lived longer starts the count afresh, as does one the server
    /// closed cleanly (`clean`: CloseMux) after the initial backoff, so that a server's
    /// graceful restart does not grow the backoff.
    fn retire(&mut self, now: Instant, backoff: Backoff, clean: bool) -> Option<PooledSession> {
        let pooled = self.session.take()?;
        let lived = self
            .since
            .take()
            .map(|since| now.saturating_duration_since(since));
        self.opening = 0;
        let enough = if clean { backoff.initial } else { backoff.max };
        if lived.is_some_and(|lived| lived >= enough) {
            self.failures = 0;
            self.retry_at = None;
        } else {
            self.fail(now, backoff);
        }
        Some(pooled)
    }

    /// Counts a failure and sets when the slot may connect again: at once after the first in
    /// a row, then `initial`, doubling up to `max`.
    fn fail(&mut self, now: Instant, backoff: Backoff) {
        let wait = match self.failures {
            0 => Duration::ZERO,
            n => backoff
                .initial
                .saturating_mul(2u32.saturating_pow(n - 1))
                .min(backoff.max),
        };
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(later(now, wait));
    }
}

/// `now + wait`, or far in the future when that is past what an [`Instant`] can hold (a
/// backoff or timeout of [`Duration::MAX`]): never a panic, which would leave the pool's
/// waiters unwoken.
fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// Connects slot `index`, within the connect timeout, and records the outcome.
async fn connect_slot(shared: Arc<Shared>, index: usize) {
    let mut guard = ConnectGuard {
        shared: &shared,
        index,
        done: false,
    };
    let outcome = match tokio::time::timeout(shared.connect_timeout, (shared.connect)()).await {
        Ok(Ok(session)) => Ok(session),
        Ok(Err(error)) => Err(Error::from(error)),
        Err(_) => Err(Error::from(io::Error::new(
            io::ErrorKind::TimedOut,
            "connect timed out",
        ))),
    };
    guard.done = true;
    if let Some(late) = shared.connected(index, outcome) {
        // The pool was closed while this connect was under way.
        let _ = late.close().await;
    }
}

/// Frees a slot whose connect was dropped before it finished (its runtime shut down), so the
/// slot is not left connecting for ever.
struct ConnectGuard<'a> {
    shared: &'a Shared,
    index: usize,
    done: bool,
}

impl Drop for ConnectGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let cancelled = io::Error::new(io::ErrorKind::Interrupted, "connect cancelled");
            drop(self.shared.connected(self.index, Err(cancelled.into())));
        }
    }
}

/// An open under way on a slot's session, counted until dropped.
struct Opening {
    shared: Arc<Shared>,
    slot: usize,
    number: u64,
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let slot = &mut state.slots[self.slot];
        if slot
            .session
            .as_ref()
            .is_some_and(|current| current.number == self.number)
        {
            slot.opening = slot.opening.saturating_sub(1);
        }
    }
}

/// A future's slot among the pool's waiters, given back when the future is dropped.
struct Waiting<'a> {
    shared: &'a Shared,
    slot: Option<usize>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.slot.is_some() {
            self.shared.lock().stop_waiting(&mut self.slot);
        }
    }
}

/// Runs `futures` at once, and returns their outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }

    #[test]
    fn failures_in_a_row_wait_nothing_then_double_up_to_the_longest() {
        let now = Instant::now();
        let mut slot = Slot::default();
        let mut waits = Vec::new();
        for _ in 0..10 {
            slot.fail(now, backoff());
            waits.push(slot.retry_at.map(|at| at - now));
        }
        let ms = Duration::from_millis;
        let expected = [0, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000].map(|m| Some(ms(m)));
        assert_eq!(waits, expected);
        // A count far beyond any real run still saturates at the longest wait.
        slot.failures = u32::MAX;
        slot.fail(now, backoff());
        assert_eq!(slot.retry_at, Some(now + backoff().max));
    }

    #[test]
    fn a_backoff_of_duration_max_saturates_instead_of_panicking() {
        let now = Instant::now();
        let longest = Backoff {
            initial: Duration::MAX,
            max: Duration::MAX,
        };
        let mut slot = Slot::default();
        for _ in 0..3 {
            slot.fail(now, longest);
        }
        assert_eq!(slot.retry_at, Some(now + FAR_FUTURE));
        assert_eq!(later(now, Duration::MAX), now + FAR_FUTURE);
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn a_clean_close_resets_the_count_once_the_session_lived_the_initial_backoff() {
        let now = Instant::now();
        let session_slot = |failures, lived: Duration| {
            let (a, _b) = tokio::io::duplex(64);
            let (session, _driver) = Session::new(a, Role::Client, Config::default());
            Slot {
                session: Some(PooledSession {
                    slot: 0,
                    number: 1,
                    session,
                }),
                since: Some(now - lived),
                failures,
                ..Slot::default()
            }
        };
        // Closed by the server after a second: no failure, connect again at once.
        let mut slot = session_slot(3, Duration::from_secs(1));
        assert!(slot.retire(now, backoff(), true).is_some());
        assert_eq!((slot.failures, slot.retry_at), (0, None));
        // Closed by the server at once: a failure, as a drop would be.
        let mut slot = session_slot(3, Duration::from_millis(10));
        slot.retire(now, backoff(), true);
        assert_eq!(slot.failures, 4);
        assert_eq!(slot.retry_at, Some(now + Duration::from_millis(400)));
        // Dropped after a second: a failure.
        let mut slot = session_slot(3, Duration::from_secs(1));
        slot.retire(now, backoff(), false);
        assert_eq!(slot.failures, 4);
    }
}
