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
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the [`Pool`] handle: choosing a session, opening, filling, closing |
//! | `builder.rs` | [`PoolBuilder`]: the pool's size, configuration, backoff and timeouts |
//! | `slots.rs` | the table of slots: connects, their outcomes, backoff after failures |

mod builder;
mod slots;

use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

pub use self::builder::PoolBuilder;
use self::slots::{later, Opening, Shared, Waiting};
use crate::config::Config;
use crate::error::Error;
use crate::session::Session;
use crate::stream::Stream;

/// Up to K client sessions to one server, over which streams are opened fewest-first.
///
/// Cheap to clone (`Clone + Send + Sync`, an `Arc` inside): every clone uses the same sessions.
/// The pool connects lazily: the first [`open`](Pool::open) (or [`fill`](Pool::fill)) starts
/// a connect for every slot, in a task of its own, and takes the first session made. Each
/// session takes [`Role::Client`](crate::Role::Client) and the pool's [`Config`].
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
/// make later opens fail with [`Error::SessionUnavailable`] (with `ClosedLocally` inside). When the last handle to the pool is
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
        PoolBuilder::new(size)
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
    /// use tokio::io::AsyncWriteExt;
    ///
    /// let pool = gomux::Pool::new(2, gomux::Config::default(), connect);
    /// let mut stream = pool.open().await?; // connects every slot on first use
    /// stream.write_all(b"request").await?;
    /// assert!(pool.live() >= 1); // the session of the stream, and perhaps the other already
    /// # Ok(())
    /// # }
    /// ```
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
    /// let pool = gomux::Pool::new(3, gomux::Config::default(), connect);
    /// assert_eq!(pool.live(), 0); // nothing is connected before the first use
    /// assert_eq!(pool.fill().await, 3);
    /// assert_eq!((pool.size(), pool.connects()), (3, 3));
    /// # Ok(())
    /// # }
    /// ```
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

    /// Closes the pool: later opens fail with [`Error::SessionUnavailable`] (with `ClosedLocally` inside), nothing is connected
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

    /// Closes the pool gracefully: later opens fail with [`Error::SessionUnavailable`] (with `ClosedLocally` inside), nothing is
    /// connected any more, and every session closes with
    /// [`Session::graceful_close`]`(timeout)`, all at once: the streams already open finish,
    /// then each session closes; at the deadline what is left is cut.
    ///
    /// # Errors
    ///
    /// [`Error::GracefulCloseTimedOut`] with the streams cut in all sessions together when any
    /// were; otherwise the first error a session's close returned.
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
    /// use std::time::Duration;
    ///
    /// let pool = gomux::Pool::new(2, gomux::Config::default(), connect);
    /// let stream = pool.open().await?;
    /// drop(stream); // done with it
    /// pool.graceful_close(Duration::from_secs(5)).await?;
    /// assert!(pool.is_closed());
    /// let error = pool.open().await.unwrap_err(); // nothing opened: safe to retry elsewhere
    /// assert!(matches!(error, gomux::Error::SessionUnavailable(_)) && error.is_retry_safe());
    /// # Ok(())
    /// # }
    /// ```
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
