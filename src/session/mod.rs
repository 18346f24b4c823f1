//! [`Session`]: the handle to one multiplexed connection, and the driver behind it.

pub(crate) mod core;
pub(crate) mod direct;
mod driver;
mod incoming;
mod linger;
pub(crate) mod now;
mod out_queue;
mod read_buf;
mod waiting;

use std::fmt;
use std::future::poll_fn;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite};

use self::core::{Inner, Shared};
pub use self::driver::Connection;
pub use self::incoming::Incoming;
use self::waiting::Waiting;
use crate::config::{Config, Role};
use crate::error::Error;
use crate::stats::Stats;
use crate::stream::Stream;

/// A handle to one gomux session: opens and accepts streams, and closes the session.
///
/// Cheap to clone (`Clone + Send + Sync`); all clones drive the same session. The connection is
/// driven by a single task ([`Connection`]), spawned by [`client`](Session::client),
/// [`server`](Session::server) and [`with_config`](Session::with_config), or by you after
/// [`Session::new`]. There is no task and no channel per stream.
///
/// When every `Session` handle is dropped, streams opened by the peer are refused, and the
/// session closes itself gracefully once no stream has anything left to do (as
/// [`graceful_close`](Session::graceful_close) does, without a deadline).
///
/// # Shutting down a server gracefully
///
/// Stop taking new streams, let the ones being served finish, then close, with a deadline:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), gomux::Error> {
/// use std::time::Duration;
/// use futures::StreamExt;
/// use tokio::io::AsyncWriteExt;
///
/// # let (a, b) = tokio::io::duplex(64 * 1024);
/// # let (client, session) = (gomux::Session::client(a), gomux::Session::server(b));
/// # let _request = client.open().await?;
/// # let shutdown_signal = async { tokio::task::yield_now().await }; // e.g. tokio::signal::ctrl_c()
/// let mut incoming = session.incoming();
/// tokio::pin!(shutdown_signal);
/// loop {
///     tokio::select! {
///         next = incoming.next() => match next {
///             Some(stream) => {
///                 let mut stream = stream?;
///                 tokio::spawn(async move {
///                     // Serve the stream; the session waits for it below.
///                     stream.write_all(b"hello").await?;
///                     stream.shutdown().await
///                 });
///             }
///             None => break, // the peer closed the session
///         },
///         _ = &mut shutdown_signal => break,
///     }
/// }
/// // Refuse new streams, wait up to 30 s for the served ones, then CloseMux.
/// match session.graceful_close(Duration::from_secs(30)).await {
///     Ok(()) => {}
///     Err(gomux::Error::GracefulCloseTimedOut { streams }) => {
///         eprintln!("{streams} streams were cut at the deadline");
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok(())
/// # }
/// ```
///
/// [`wait_idle`](Session::wait_idle) tells when no stream is left without closing anything.
///
/// # TCP
///
/// Over TCP, call `set_nodelay(true)` on the socket on both ends before starting the session:
/// with Nagle's algorithm on, a small frame written while an earlier one is unacknowledged
/// waits for the peer's (possibly delayed) acknowledgement, which slows every request/response
/// exchange.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let (a, b) = tokio::io::duplex(64 * 1024);
/// let client = gomux::Session::client(a);
/// let server = gomux::Session::server(b);
///
/// let mut stream = client.open().await?;
/// stream.write_all(b"hello").await?;
/// stream.shutdown().await?; // half-close: the peer reads end-of-stream
///
/// let mut inbound = server.accept().await?;
/// let mut text = String::new();
/// inbound.read_to_string(&mut text).await?;
/// assert_eq!(text, "hello");
///
/// client.close().await?; // flush, CloseMux, close the transport
/// # Ok(())
/// # }
/// ```
pub struct Session {
    shared: Arc<Shared>,
}

impl Session {
    /// Starts a client-role session on `io` and spawns its driver on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as [`tokio::spawn`] does).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::net::{TcpListener, TcpStream};
    ///
    /// # let listener = TcpListener::bind("127.0.0.1:0").await?;
    /// # let addr = listener.local_addr()?;
    /// # tokio::spawn(async move { let (socket, _) = listener.accept().await?; let s = gomux::Session::server(socket); s.closed().await; std::io::Result::Ok(()) });
    /// let socket = TcpStream::connect(addr).await?;
    /// socket.set_nodelay(true)?; // small frames must not wait for Nagle's algorithm
    /// let session = gomux::Session::client(socket);
    /// let stream = session.open().await?;
    /// assert_eq!(stream.id() % 2, 0); // a client opens even ids
    /// # drop(stream);
    /// # session.close().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn client<T>(io: T) -> Session
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Session::with_config(io, Role::Client, Config::default())
    }

    /// Starts a server-role session on `io` and spawns its driver on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as [`tokio::spawn`] does).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0").await?;
    /// # let addr = listener.local_addr()?;
    /// # tokio::spawn(async move { let socket = TcpStream::connect(addr).await?; let c = gomux::Session::client(socket); let _s = c.open().await; c.closed().await; std::io::Result::Ok(()) });
    /// let (socket, _) = listener.accept().await?;
    /// socket.set_nodelay(true)?;
    /// let session = gomux::Session::server(socket);
    /// let stream = session.accept().await?;
    /// assert_eq!(stream.id() % 2, 0); // opened by the client
    /// # session.close().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn server<T>(io: T) -> Session
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Session::with_config(io, Role::Server, Config::default())
    }

    /// Starts a session of `role` with `config` on `io` and spawns its driver on the current
    /// tokio runtime (which needs its time driver enabled, as the default runtimes have).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as [`tokio::spawn`] does).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    ///
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// let config = gomux::Config::default()
    ///     .max_streams(1024)
    ///     .idle_timeout(Some(Duration::from_secs(120)));
    /// let server = gomux::Session::with_config(a, gomux::Role::Server, config);
    /// let client = gomux::Session::client(b);
    /// assert_eq!(server.role(), gomux::Role::Server);
    /// # drop(client);
    /// # }
    /// ```
    pub fn with_config<T>(io: T, role: Role, config: Config) -> Session
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // The spawned driver's transport is shared with the writers (`session::direct`).
        let io = direct::IoCell::new(io);
        let (session, connection) = Session::new(direct::SharedIo(Arc::clone(&io)), role, config);
        session.shared.set_direct(io);
        tokio::spawn(connection);
        session
    }

    /// Builds a session without spawning anything: poll (or spawn) the returned [`Connection`]
    /// yourself. Nothing moves on the transport until it is polled.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (io, _peer) = tokio::io::duplex(1024);
    /// let (session, connection) =
    ///     gomux::Session::new(io, gomux::Role::Client, gomux::Config::default());
    /// let driver = tokio::spawn(connection);
    /// session.close().await.expect("graceful close");
    /// assert!(driver.await.expect("no panic").is_ok());
    /// # }
    /// ```
    pub fn new<T>(io: T, role: Role, config: Config) -> (Session, Connection<T>)
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let shared = Arc::new(Shared::new(role, config, tokio::time::Instant::now()));
        let connection = Connection::new(io, Arc::clone(&shared));
        (Session { shared }, connection)
    }

    /// Opens a new stream. The peer learns of it with the first frame; data may follow at once.
    ///
    /// Waits, in one line in order of arrival, while a stream may not be opened yet:
    ///
    /// - [`Config::max_streams`] streams are live;
    /// - a peer of this crate has [`Config::open_backlog`] (256) streams of ours that its
    ///   application has not accepted yet, so that a burst of opens never overruns its accept
    ///   backlog. Towards a Go peer, which acknowledges nothing, this never waits; until the
    ///   peer has sent its first frame it waits at most one second from the session's start;
    /// - the streams' send queues are full (the transport is slower than the writers). While nothing
    ///   waits in the streams' send queues, an open goes out with the control frames instead
    ///   (up to 64 of them waiting at once), and needs no room.
    ///
    /// A peer whose application stops accepting keeps `open` waiting; a session that ends
    /// ends the wait with its error. Wrap it in [`tokio::time::timeout`] to bound the wait, or
    /// use [`try_open`](Session::try_open). Cancel safe: a dropped `open` future has opened
    /// nothing and gives its place in line to the next.
    ///
    /// # Errors
    ///
    /// [`Error::SessionUnavailable`] with the error that ended the session inside, or with
    /// [`Error::ClosedLocally`] once [`graceful_close`](Session::graceful_close) was called.
    /// An open that fails has written no frame of the stream, so every error of `open` and
    /// [`try_open`](Session::try_open) is safe to retry ([`Error::is_retry_safe`]), on
    /// another session if this one is over.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tokio::io::AsyncWriteExt;
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut stream = client.open().await?;
    /// stream.write_all(b"request").await?;
    /// // Bounded: an open towards a peer that stops accepting waits, at most 5 s here.
    /// let second = tokio::time::timeout(Duration::from_secs(5), client.open()).await??;
    /// # drop((stream, second, server));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn open(&self) -> Result<Stream, Error> {
        let mut room = Waiting::new(&self.shared, Inner::opener_gone);
        let mut line = Waiting::new(&self.shared, Inner::open_line_gone);
        let mut greeting_wait: Option<Pin<Box<tokio::time::Sleep>>> = None;
        let (key, id) = poll_fn(|cx| loop {
            let (opened, deadline) = self.shared.with_driver(|inner, wakers| {
                let opened =
                    inner.poll_open(cx.waker(), &mut room.slot, &mut line.slot, true, wakers);
                (opened, inner.open_deadline(line.slot))
            });
            if opened.is_ready() {
                return opened;
            }
            // Held for a greeting that has not come: wake when the wait for it is over.
            let Some(deadline) = deadline else {
                return Poll::Pending;
            };
            let sleep =
                greeting_wait.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            greeting_wait = None;
        })
        .await?;
        Ok(Stream::new(Arc::clone(&self.shared), key, id))
    }

    /// Opens a new stream if one may be opened now, without waiting: the immediate answer
    /// where [`open`](Session::open) would wait in line. Its OpenStream is queued even when the
    /// streams' send queues are full.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// let config = gomux::Config::default().max_streams(1);
    /// let client = gomux::Session::with_config(a, gomux::Role::Client, config);
    /// let _server = gomux::Session::server(b);
    /// let first = client.try_open()?;
    /// assert!(matches!(client.try_open(), Err(gomux::Error::TooManyStreams)));
    /// # drop(first);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::TooManyStreams`] when `max_streams` streams are live, a peer of this crate has
    /// `open_backlog` streams of ours unacknowledged, or opens wait in line already; otherwise
    /// as [`open`](Session::open).
    pub fn try_open(&self) -> Result<Stream, Error> {
        let (mut room, mut line) = (None, None);
        let opened = self.shared.with_driver(|inner, wakers| {
            inner.poll_open(Waker::noop(), &mut room, &mut line, false, wakers)
        });
        match opened {
            Poll::Ready(Ok((key, id))) => Ok(Stream::new(Arc::clone(&self.shared), key, id)),
            Poll::Ready(Err(error)) => Err(error),
            // It waits for nothing.
            Poll::Pending => Err(Error::TooManyStreams),
        }
    }

    /// Waits for the next stream the peer opens.
    ///
    /// Cancel safe: a dropped `accept` future takes no stream out of the queue.
    ///
    /// # Errors
    ///
    /// The error that ended the session, once no queued stream is left.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// # let mut request = client.open().await?;
    /// # request.write_all(b"ping").await?;
    /// # request.shutdown().await?;
    /// // One task per stream; the accept loop ends with the session.
    /// let serving = tokio::spawn(async move {
    ///     while let Ok(mut stream) = server.accept().await {
    ///         tokio::spawn(async move {
    ///             let mut request = Vec::new();
    ///             stream.read_to_end(&mut request).await?;
    ///             stream.write_all(b"pong").await?;
    ///             stream.shutdown().await
    ///         });
    ///     }
    /// });
    /// # let mut reply = Vec::new();
    /// # request.read_to_end(&mut reply).await?;
    /// # assert_eq!(reply, b"pong");
    /// # client.close().await?;
    /// # serving.await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn accept(&self) -> Result<Stream, Error> {
        let mut waiting = Waiting::new(&self.shared, Inner::accept_waiter_gone);
        poll_fn(|cx| self.poll_accept(cx, &mut waiting.slot)).await
    }

    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
        slot: &mut Option<usize>,
    ) -> Poll<Result<Stream, Error>> {
        // Through `with_driver`: accepting queues the stream's acknowledgement.
        let accepted = self
            .shared
            .with_driver(|inner, _| inner.poll_accept(cx.waker(), slot));
        accepted
            .map(|result| result.map(|(key, id)| Stream::new(Arc::clone(&self.shared), key, id)))
    }

    /// The streams the peer opens, as a [`futures_core::Stream`]. Streams already queued are
    /// handed out first; then a graceful end ends it with `None`: this side's
    /// [`close`](Session::close) or [`graceful_close`](Session::graceful_close) (at once, even
    /// while the session drains), or the peer's CloseMux. Any other end (a protocol error, a
    /// failed transport, a timeout) yields that error once, then `None`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// use futures::StreamExt;
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut incoming = server.incoming();
    /// let _streams = [client.open().await?, client.open().await?];
    /// client.close().await?;
    ///
    /// // The two streams, then the session's end (the client closed it), then nothing.
    /// let mut ids = Vec::new();
    /// while let Some(next) = incoming.next().await {
    ///     match next {
    ///         Ok(stream) => ids.push(stream.id()),
    ///         Err(end) => assert!(matches!(end, gomux::Error::ClosedByPeer)),
    ///     }
    /// }
    /// assert_eq!(ids, [0, 2]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn incoming(&self) -> Incoming {
        Incoming::new(self.clone())
    }

    /// Closes the session gracefully: what is already written is flushed, then CloseMux, then
    /// the transport is shut down for writing, and read (discarding what arrives) until the
    /// peer's CloseMux or end of file, so that the peer is not reset while it reads our last
    /// frames. A Go peer, and this crate, close the connection as soon as they read the
    /// CloseMux; a peer that keeps it open makes `close` wait for the close timeout. Streams
    /// fail with [`Error::ClosedLocally`] from now on, but data they hold stays readable.
    ///
    /// # Errors
    ///
    /// When the session had already ended with an error, that error; when the transport failed
    /// (or did not take the final writes within the close timeout), the transport error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut stream = client.open().await?;
    /// stream.write_all(b"flushed before CloseMux").await?;
    /// stream.shutdown().await?;
    /// client.close().await?;
    /// assert!(matches!(client.close_reason(), Some(gomux::Error::ClosedLocally)));
    ///
    /// // The peer still reads what was sent; then its session has ended.
    /// let mut inbound = server.accept().await?;
    /// let mut text = String::new();
    /// inbound.read_to_string(&mut text).await?;
    /// assert_eq!(text, "flushed before CloseMux");
    /// assert!(matches!(server.closed().await, gomux::Error::ClosedByPeer));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&self) -> Result<(), Error> {
        self.shared.with_driver(|inner, wakers| inner.close(wakers));
        self.finished().await;
        self.shared.lock().outcome()
    }

    /// Closes the session gracefully, letting the streams already open finish: from now on the
    /// peer's new streams are refused (CloseStream, as when the accept backlog is full), streams
    /// it opened that were not accepted yet are refused too, `accept` fails with
    /// [`Error::ClosedLocally`] and `open` with [`Error::SessionUnavailable`] (and
    /// [`incoming`](Session::incoming) ends), while open streams
    /// go on reading and writing. Once none of them has anything left to do and everything
    /// queued is written, the session closes as [`close`](Session::close) does. A stream is
    /// done once this side closed it ([`Stream::close`], or dropping it), or both of its
    /// directions have ended, by either side (`shutdown` here, and the peer's end of its
    /// data): a handle kept on it, or data received and not read, does not hold the session
    /// open. If streams still have work after `timeout`, it closes anyway, cutting them.
    ///
    /// [`draining`](Session::draining) tells the tasks serving streams that it started.
    ///
    /// What h2's `graceful_shutdown` and quinn's `wait_idle` give, within what the protocol can
    /// say: it has no frame to tell the peer "no new streams", so the peer learns of the
    /// draining only when its next open is refused.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// use std::time::Duration;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut request = client.open().await?;
    /// request.write_all(b"ping").await?;
    /// request.shutdown().await?;
    ///
    /// let mut stream = server.accept().await?;
    /// let serving = tokio::spawn(async move {
    ///     let mut text = String::new();
    ///     stream.read_to_string(&mut text).await?;
    ///     stream.write_all(b"pong").await?;
    ///     stream.shutdown().await // done: the stream is gone once the handle is dropped
    /// });
    ///
    /// // Shutting down: the stream being served finishes, then the session closes.
    /// server.graceful_close(Duration::from_secs(30)).await?;
    /// # serving.await.unwrap()?;
    /// let mut reply = String::new();
    /// request.read_to_string(&mut reply).await?;
    /// assert_eq!(reply, "pong");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::GracefulCloseTimedOut`] when streams still had work at the deadline (the
    /// session is closed all the same); otherwise as [`close`](Session::close).
    pub async fn graceful_close(&self, timeout: std::time::Duration) -> Result<(), Error> {
        self.shared
            .with_driver(|inner, wakers| inner.start_draining(wakers));
        if tokio::time::timeout(timeout, self.finished()).await.is_ok() {
            return self.shared.lock().outcome();
        }
        let cut = self.shared.lock().unfinished_streams();
        let closed = self.close().await;
        // That streams were cut is what the caller most needs to know; a failure of the
        // close itself stays visible through `close_reason` and the driver's result.
        if cut > 0 {
            return Err(Error::GracefulCloseTimedOut { streams: cut });
        }
        closed
    }

    /// Waits until no stream has anything left to do (none open, none waiting to be accepted;
    /// a stream counts as done as [`graceful_close`](Session::graceful_close) says, handles
    /// kept or not) and everything queued is written, or until the session has ended.
    /// Resolves at once if that is already so; a stream opened afterwards does not matter to
    /// it. With [`graceful_close`](Session::graceful_close), it tells when the draining is
    /// done without closing anything itself.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let stream = client.open().await?;
    /// let idle = {
    ///     let client = client.clone();
    ///     tokio::spawn(async move { client.wait_idle().await })
    /// };
    /// drop(stream); // the last stream goes: the session is idle
    /// idle.await.expect("no panic");
    /// assert_eq!(client.stream_count(), 0);
    /// # drop(server);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_idle(&self) {
        let mut waiting = Waiting::new(&self.shared, Inner::idle_waiter_gone);
        poll_fn(|cx| {
            if self.shared.lock().poll_idle(cx.waker(), &mut waiting.slot) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Waits until the session stops taking new streams: this side started a graceful close
    /// ([`graceful_close`](Session::graceful_close)), or the session is ending for any reason
    /// (a [`close`](Session::close) by either side, an error). Resolves at once if that is
    /// already so. Any number of tasks may wait; cancel safe (a dropped future leaves nothing
    /// behind). For servers: each task serving a stream (or a connection on one, as in
    /// `examples/http.rs`) can finish its current work and stop at this signal.
    ///
    /// The protocol has no frame for a peer's graceful close, so a peer that drains is seen
    /// only when it refuses a new stream, or when its CloseMux ends the session.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// use std::time::Duration;
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (_client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let watcher = server.clone();
    /// let serving = tokio::spawn(async move {
    ///     // A server's loop: serve until the session drains, then wind down.
    ///     watcher.draining().await;
    ///     assert!(watcher.is_draining());
    /// });
    /// assert!(!server.is_draining());
    /// server.graceful_close(Duration::from_secs(5)).await?;
    /// # serving.await.unwrap();
    /// # Ok(())
    /// # }
    /// ```
    pub async fn draining(&self) {
        let mut waiting = Waiting::new(&self.shared, Inner::drain_waiter_gone);
        poll_fn(|cx| {
            if self
                .shared
                .lock()
                .poll_draining(cx.waker(), &mut waiting.slot)
            {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Whether the session stops taking new streams: [`draining`](Session::draining) has
    /// resolved, or would at once.
    pub fn is_draining(&self) -> bool {
        self.shared.lock().is_draining()
    }

    /// Waits until the session has ended and its transport is closed, and returns why it ended
    /// ([`Error::ClosedLocally`] after [`close`](Session::close), [`Error::ClosedByPeer`] after
    /// the peer's CloseMux, or what went wrong).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// // A task that reports how the connection ended, whoever ends it.
    /// let watcher = {
    ///     let server = server.clone();
    ///     tokio::spawn(async move {
    ///         let reason = server.closed().await;
    ///         if !reason.is_graceful() {
    ///             eprintln!("connection lost: {reason}");
    ///         }
    ///         reason
    ///     })
    /// };
    /// client.close().await?;
    /// let reason = watcher.await.expect("no panic");
    /// assert!(matches!(reason, gomux::Error::ClosedByPeer));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn closed(&self) -> Error {
        self.finished().await;
        self.shared
            .lock()
            .end_reason()
            .cloned()
            .unwrap_or(Error::ClosedLocally)
    }

    /// Waits until the driver has finished.
    async fn finished(&self) {
        let mut waiting = Waiting::new(&self.shared, Inner::close_waiter_gone);
        poll_fn(|cx| {
            if self
                .shared
                .lock()
                .poll_finished(cx.waker(), &mut waiting.slot)
            {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Why the session ended, or `None` while it is running.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, _server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// assert!(client.close_reason().is_none());
    /// client.close().await?;
    /// assert!(matches!(client.close_reason(), Some(gomux::Error::ClosedLocally)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn close_reason(&self) -> Option<Error> {
        self.shared.lock().end_reason().cloned()
    }

    /// Whether the session has ended (its driver may still be closing the transport).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// client.close().await?;
    /// assert!(client.is_closed());
    /// server.closed().await; // the peer learns it from the CloseMux
    /// assert!(server.is_closed());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_closed(&self) -> bool {
        self.shared.lock().end_reason().is_some()
    }

    /// This side's role.
    pub fn role(&self) -> Role {
        self.shared.lock().role
    }

    /// Streams with live state: open, or closed by one side while a handle remains. This
    /// counts the streams that have state, handles included: a finished stream whose handle is
    /// kept counts here, though it no longer holds a [`graceful_close`](Session::graceful_close)
    /// or [`wait_idle`](Session::wait_idle).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, _server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let stream = client.open().await?;
    /// assert_eq!(client.stream_count(), 1);
    /// # drop(stream);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stream_count(&self) -> usize {
        self.shared.lock().stream_count()
    }

    /// A snapshot of the session's counters: bytes and frames each way, streams, keepalives,
    /// buffered data. See [`Stats`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::AsyncWriteExt;
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, _server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut stream = client.open().await?;
    /// stream.write_all(&[0; 1000]).await?;
    /// let stats = client.stats();
    /// assert_eq!(stats.streams_opened, 1);
    /// println!("{stats:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        self.shared.lock().stats()
    }
}

impl Clone for Session {
    fn clone(&self) -> Session {
        self.shared.lock().add_session_handle();
        Session {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shared
            .with_driver(|inner, _| inner.drop_session_handle());
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("Session")
            .field("id", &inner.id)
            .field("role", &inner.role)
            .field("streams", &inner.stream_count())
            .field("end", &inner.end_reason())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    use super::Session;

    /// A waker of its own for each task, as different tasks have.
    struct Task;

    impl Wake for Task {
        fn wake(self: Arc<Self>) {}
    }

    #[tokio::test]
    async fn dropped_accept_and_closed_futures_leave_no_waiter_behind() {
        let (io, _peer) = tokio::io::duplex(1024);
        let session = Session::client(io);
        for _ in 0..100 {
            let waker = Waker::from(Arc::new(Task));
            let mut cx = Context::from_waker(&waker);
            // As in a `select!` that another branch wins: polled once, then dropped.
            assert!(pin!(session.accept()).poll(&mut cx).is_pending());
            assert!(pin!(session.closed()).poll(&mut cx).is_pending());
            let mut incoming = session.incoming();
            assert!(futures_core::Stream::poll_next(pin!(&mut incoming), &mut cx).is_pending());
        }
        assert_eq!(session.shared.lock().session_waiters(), (0, 0));
    }
}
