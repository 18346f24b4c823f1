//! [`PoolBuilder`]: how a [`Pool`] is made.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use super::slots::{Backoff, ConnectFn, Shared};
use super::Pool;
use crate::config::{Config, Role};
use crate::session::Session;

/// Default wait after the second failure in a row of a slot; it doubles with each further one.
const BACKOFF_INITIAL: Duration = Duration::from_millis(100);

/// Default longest wait between two connects of a slot.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Default time a connect may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

impl PoolBuilder {
    /// The defaults for a pool of `size` slots (at least 1), as [`Pool::builder`] documents.
    pub(super) fn new(size: usize) -> PoolBuilder {
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
    /// fails with [`Error::PoolUnavailable`](crate::Error::PoolUnavailable) (default: the connect timeout); one that timed out
    /// waiting for room carries [`Error::TooManyStreams`](crate::Error::TooManyStreams) as its latest failure. [`Duration::ZERO`] never
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
            shared: Shared::new(size, backoff, connect_timeout, open_timeout, connect),
        }
    }
}
