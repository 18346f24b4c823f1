//! A tokio stream multiplexer speaking the gomux wire protocol.
//!
//! `gomux` carries many independent, bidirectional byte streams over one connection (TCP, TLS,
//! a Unix socket, an in-memory pipe: any `AsyncRead + AsyncWrite`), byte-compatible with the Go
//! implementation (github.com/Acebond/gomux, its unencrypted protocol with the 8-byte header).
//! One task per session drives the connection; there is no task and no channel per stream, and
//! every buffer a peer can fill is bounded.
//!
//! # Quick start
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let (a, b) = tokio::io::duplex(64 * 1024); // or a TcpStream on each side, with nodelay
//! let client = gomux::Session::client(a);
//! let server = gomux::Session::server(b);
//!
//! // The server echoes every stream it accepts.
//! tokio::spawn(async move {
//!     while let Ok(stream) = server.accept().await {
//!         tokio::spawn(async move {
//!             let (mut reader, mut writer) = stream.into_split();
//!             tokio::io::copy(&mut reader, &mut writer).await?;
//!             writer.shutdown().await
//!         });
//!     }
//! });
//!
//! let mut stream = client.open().await?;
//! stream.write_all(b"hello").await?;
//! stream.shutdown().await?; // half-close: the peer reads end-of-stream
//! let mut echo = Vec::new();
//! stream.read_to_end(&mut echo).await?;
//! assert_eq!(echo, b"hello");
//! client.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Each end is told its [`Role`] by the application: the gomux protocol has no handshake, and a
//! client opens even stream ids, a server odd ones. Every session of this crate sends a
//! greeting as its first frame, which a Go peer ignores; between two sessions of this crate it
//! is what lets each report refused streams and dead peers (see [`guide::protocol`]).
//!
//! # The API
//!
//! - **Sessions.** [`Session`] is a cloneable handle to one connection: [`Session::client`],
//!   [`Session::server`] and [`Session::with_config`] spawn its driver, [`Session::new`] hands
//!   you the [`Connection`] future to run. [`open`](Session::open) and
//!   [`accept`](Session::accept) (or [`incoming`](Session::incoming), a `futures` stream)
//!   make streams; [`graceful_close`](Session::graceful_close) refuses new streams and lets the
//!   open ones finish, [`wait_idle`](Session::wait_idle) waits for the last one,
//!   [`close`](Session::close) flushes what was written and ends the session without waiting
//!   for the streams.
//! - **Streams.** [`Stream`] is `AsyncRead + AsyncWrite`, splits into owned halves
//!   ([`Stream::into_split`]), and has a zero-copy API ([`Stream::read_chunk`],
//!   [`Stream::write_chunk`]), priorities, and [`Stream::stopped`] to learn that the peer stopped
//!   reading. The [`stream`] module tells how closing, flushing and dropping behave.
//! - **Pool.** [`Pool`] spreads a client's streams over K sessions to one server, replacing
//!   sessions that end and backing off from a server that cannot be reached.
//! - **Codec.** [`frame`] and [`codec`]: the wire format, usable on its own with `tokio_util`'s
//!   `Framed` for tools and tests.
//! - **Config.** [`Config`]: every setting with its default and the memory it bounds;
//!   [`Config::go_peer`] for a Go peer.
//! - **Errors.** [`Error`] is `Clone` (one error that ends a session reaches every stream) and
//!   becomes an [`std::io::Error`] with a fitting kind through `AsyncRead`/`AsyncWrite`;
//!   [`Error::from_io`] gets it back. [`Stats`] and [`StreamStats`] count what happened.
//!
//! # The guide
//!
//! [`guide`] has the long form, one chapter per topic: [streams](guide::streams) (writing,
//! flow control, closing, cancel safety), [talking to Go gomux](guide::talking_to_go) (the
//! settings and the Go implementation's faults), [refusals, retries and dead
//! peers](guide::refusals_retries_and_dead_peers), [memory bounds and the
//! defaults](guide::memory_and_defaults), [tuning for real links](guide::tuning) and [the wire
//! protocol](guide::protocol) with this crate's conventions.
//!
//! # Features
//!
//! - `tcp`: `gomux::tcp`, the TCP socket settings that keep a session's latency low over a
//!   network (Nagle off, `TCP_NOTSENT_LOWAT`).
//! - `tracing`: session and stream events through the `tracing` crate, each with the session's
//!   number and the stream id, and the driver inside a `gomux{session, role}` span.
//! - `futures-io`: re-exports tokio-util's adapters as `gomux::compat`, for `futures::io` users:
//!   `stream.compat()` and `transport.compat()`.
//!
//! # Links
//!
//! In the repository: README.md (install, the examples, the tunnel tool), BENCHMARKS.md (every
//! figure, with its command and machine), RELIABILITY.md (fault tests, fuzzing, soak runs),
//! CHANGELOG.md, and `examples/` (an echo server, a TCP tunnel, HTTP and TLS over gomux).

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod codec;
mod config;
mod error;
mod flow;
pub mod frame;
pub mod guide;
mod pool;
mod session;
mod stats;
mod stopped;
pub mod stream;
#[cfg(feature = "tcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "tcp")))]
pub mod tcp;
mod trace;

pub use crate::config::{Config, Role};
pub use crate::error::{CodecError, Error, InvalidFrame, ProtocolError};
pub use crate::pool::{Pool, PoolBuilder, PooledSession};
pub use crate::session::{Connection, Incoming, Session};
pub use crate::stats::{Stats, StreamStats};

/// tokio-util's adapters between tokio's and `futures::io`'s I/O traits (feature `futures-io`):
/// `stream.compat()` makes a [`Stream`] a `futures::io::AsyncRead + AsyncWrite`, and
/// `transport.compat()` makes a `futures::io` transport usable under a [`Session`].
#[cfg(feature = "futures-io")]
#[cfg_attr(docsrs, doc(cfg(feature = "futures-io")))]
pub mod compat {
    pub use tokio_util::compat::*;
}
pub use crate::stream::Stream;

#[cfg(test)]
mod tests {
    fn assert_traits<T: Send + Sync + Unpin + 'static>() {}

    #[test]
    fn handles_are_send_sync_unpin_static() {
        assert_traits::<crate::Session>();
        assert_traits::<crate::Pool>();
        assert_traits::<crate::Stream>();
        assert_traits::<crate::stream::OwnedReadHalf>();
        assert_traits::<crate::stream::OwnedWriteHalf>();
        assert_traits::<crate::Error>();
        assert_traits::<crate::Connection<tokio::net::TcpStream>>();
    }
}
