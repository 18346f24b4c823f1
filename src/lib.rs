//! A tokio stream multiplexer speaking the gomux wire protocol.
//!
//! `gomux` carries many independent, bidirectional byte streams over one connection (TCP, TLS,
//! a Unix socket, an in-memory pipe: any `AsyncRead + AsyncWrite`), byte-compatible with the Go
//! implementation (github.com/Acebond/gomux, its unencrypted protocol with the 8-byte header).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let (a, b) = tokio::io::duplex(64 * 1024); // or a TcpStream on each side
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
//! # Roles
//!
//! The protocol has no handshake: the application tells each end whether it is the
//! [`Role::Client`] (opens even stream ids) or the [`Role::Server`] (odd ids). Either side may
//! open streams; the names say nothing else. Two ends of the same role on one connection would
//! collide on ids.
//!
//! # Sessions and their driver
//!
//! A [`Session`] is a cheap, cloneable handle; one task, the [`Connection`] future, alone reads
//! and writes the transport. [`Session::client`], [`Session::server`] and
//! [`Session::with_config`] spawn it; [`Session::new`] hands it to you (to run it on a runtime
//! of your choice, or to take the transport back with [`Connection::into_inner`]). There is no
//! task and no channel per stream: streams are entries in the session's table, and their
//! handles lock the session's state briefly to read, write or close.
//!
//! The driver never stops reading because the application is slow: received data goes into
//! per-stream buffers bounded by the credit granted, inbound streams beyond the accept backlog
//! are refused, and a transport that blocks writes does not block reads. It stops reading only
//! while its queue of control frames is over its bound, which only a peer that does not read
//! what this side sends can cause (see [`Config`], "Memory bounds").
//!
//! # Reading and writing
//!
//! [`Stream`] implements tokio's `AsyncRead` and `AsyncWrite`, so `tokio::io::copy`, codecs,
//! TLS and HTTP libraries work on it as on a `TcpStream`. [`Stream::into_split`] gives owned
//! halves for two tasks. Beside them, a zero-copy API: [`Stream::read_chunk`] hands out
//! received payload as [`bytes::Bytes`] sharing the buffer it arrived in, and
//! [`Stream::write_chunk`] / [`Stream::write_chunks`] queue the caller's `Bytes` without copying
//! them (the driver writes them with vectored writes).
//!
//! Writes are coalesced: every writer appends frames to one outgoing queue of
//! [`Config::write_buffer_size`] bytes (1 MiB), which the driver writes in large transport
//! writes. That merges what is queued at once, not what comes one write at a time: a lone small
//! frame (a request, a credit update) goes out on its own, and over TCP with Nagle's algorithm
//! on it waits for the peer's acknowledgement of the previous one, which the peer may delay.
//! **Set `TCP_NODELAY`**
//! ([`TcpStream::set_nodelay(true)`](https://docs.rs/tokio/1/tokio/net/struct.TcpStream.html#method.set_nodelay))
//! on both ends of a TCP transport, as HTTP/2 and QUIC stacks do.
//!
//! Writers waiting for room in the queue are let in oldest first, with room kept for them, so
//! streams writing at once share the connection, and a small frame waits behind at most that
//! queue and what the transport holds, never behind another stream's whole transfer. Control frames (credit returned, refusals,
//! closes of streams with nothing queued, keepalives) have a queue of their own, which the
//! driver writes ahead of the data at the start of every batch: a side busy sending keeps
//! returning credit for what it receives.
//!
//! # Flow control
//!
//! Each direction of each stream has a credit window, 64 KiB at the start. A writer waits when
//! its credit is spent; the reader returns credit as the application reads, at the latest when
//! the stream's buffer is empty (so a Go sender, which waits for room for a whole 64 KiB chunk,
//! never stalls). A stream that is not read therefore holds at most its window, and never
//! stops the others.
//!
//! A fixed 64 KiB window carries at most 64 KiB per round trip (1.6 MB/s at 40 ms). So windows
//! tune themselves: a stream whose window, rather than its reader or the link, limits it gets
//! its window doubled, up to [`Config::max_receive_window`] (16 MiB), within a per-session
//! [`Config::receive_window_budget`] (64 MiB) that bounds what a peer can make the session
//! hold. The extra credit is announced with ordinary WindowUpdate frames, which Go peers add
//! to their window like any other.
//!
//! # Closing: half-close, close, drop
//!
//! | what you call | on the wire | this side afterwards | the peer |
//! |---|---|---|---|
//! | `shutdown()` (`AsyncWriteExt`) | CloseRead | can still read | reads end-of-stream after the data |
//! | [`Stream::close_read`] | CloseWrite | reads end, arriving data discarded | its writes fail |
//! | [`Stream::close`] | CloseStream | both ways closed; waits until written | reads end-of-stream, writes fail |
//! | dropping the [`OwnedWriteHalf`](stream::OwnedWriteHalf) | CloseRead | can still read | as for `shutdown()` |
//! | dropping the [`OwnedReadHalf`](stream::OwnedReadHalf) | CloseWrite | can still write | as for `close_read` |
//! | dropping the `Stream` (both halves) | CloseStream | | as for `close` |
//! | [`Session::close`] | CloseMux; the transport is shut down for writing, then read until the peer's CloseMux or end of file | every stream fails with [`Error::ClosedLocally`] (buffered data stays readable) | [`Error::ClosedByPeer`] |
//!
//! Data written before any of these is queued ahead of the close, so it is delivered unless
//! the transport fails. `flush` and `shutdown` return once it is queued, as on a socket (but
//! the queue is in your process: stopping the runtime or the process loses what is still in
//! it); [`Stream::close`] and [`Session::close`] wait until it is written to the transport.
//! When the last [`Session`] handle is dropped, inbound streams are refused and the session
//! closes itself once its last stream is gone.
//!
//! # Cancel safety
//!
//! `read`, `read_chunk`, `write`, `write_chunks`, [`Session::open`] and [`Session::accept`] are
//! cancel safe: a future dropped before it completes has taken or queued nothing (or, for
//! `write_chunks`, exactly what it advanced its argument past). `write_all` and
//! [`Stream::write_chunk`] may have queued a prefix, as `write_all` does everywhere in tokio.
//!
//! # Errors
//!
//! Session and stream operations fail with [`Error`], which is `Clone` (one error that ends a
//! session reaches every stream) and converts into [`std::io::Error`] with a fitting kind
//! where it surfaces through `AsyncRead`/`AsyncWrite`. A peer that breaks the protocol
//! (oversized frame, data beyond its credit, credit overflow, unknown frame kind, duplicate or
//! wrong-parity stream id, data after its close) ends the session with [`Error::Protocol`]
//! carrying a [`ProtocolError`], and the connection is closed after a best-effort CloseMux.
//! Frames for unknown or closed streams are ignored, since they race with local closes. Opening
//! past the stream limit fails that open only ([`Error::TooManyStreams`]).
//!
//! # Configuration, defaults and limits
//!
//! | [`Config`] setter | default | bounds |
//! |---|---|---|
//! | [`max_streams`](Config::max_streams) | 8192 | live streams, both directions |
//! | [`accept_backlog`](Config::accept_backlog) | 1024 | inbound streams waiting for `accept`; more are refused |
//! | [`receive_window`](Config::receive_window) | 64 KiB | data buffered per stream for a reader that does not read |
//! | [`max_receive_window`](Config::max_receive_window) | 16 MiB | how far one stream's window grows |
//! | [`receive_window_budget`](Config::receive_window_budget) | 64 MiB | growth of all windows together |
//! | [`write_buffer_size`](Config::write_buffer_size) | 1 MiB | outgoing bytes queued before writers wait |
//! | [`max_payload`](Config::max_payload) | 64 KiB | largest Data frame sent or accepted (Go's limit) |
//! | [`keepalive_interval`](Config::keepalive_interval) | 30 s | silence before a Keepalive is sent |
//! | [`idle_timeout`](Config::idle_timeout) | off | silence from the peer before the session ends |
//! | [`close_timeout`](Config::close_timeout) | 10 s | how long a closing session tries to flush, and waits for the peer to close |
//! | [`write_stall_timeout`](Config::write_stall_timeout) | off | how long the transport may take nothing of what waits for it |
//!
//! An idle stream costs about 220 bytes per end, handles included, and holds no buffer until
//! data arrives.
//!
//! # Interoperating with Go gomux
//!
//! The wire format is that of github.com/Acebond/gomux (unencrypted, 8-byte header). Encryption
//! and authentication belong under the session: run it over TLS (tokio-rustls) or any other
//! secure transport. Things to know: a Go peer never sends frames larger than 64 KiB and fails
//! the session on larger ones (keep [`Config::max_payload`] at its default); it sends a
//! keepalive only every 10 minutes (set an idle timeout above that, or none); it understands
//! the extra credit of tuned windows.
//!
//! # Features
//!
//! - `tracing`: session and stream events through the `tracing` crate, each with the session's
//!   number and the stream id, and the driver inside a `gomux{session, role}` span.
//! - `futures-io`: re-exports tokio-util's adapters as `gomux::compat`, for `futures::io` users:
//!   `stream.compat()` and `transport.compat()`.
//!
//! # Modules
//!
//! - [`frame`] and [`codec`]: the wire format, usable on their own with `tokio_util`'s `Framed`.
//! - [`Session`], [`Stream`]: the multiplexer. [`Config`]: its knobs and their bounds.
//!   [`Stats`]: its counters.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod codec;
mod config;
mod error;
mod flow;
pub mod frame;
mod session;
mod stats;
pub mod stream;
mod trace;

pub use crate::config::{Config, Role};
pub use crate::error::{CodecError, Error, InvalidFrame, ProtocolError};
pub use crate::session::{Connection, Incoming, Session};
pub use crate::stats::Stats;

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
        assert_traits::<crate::Stream>();
        assert_traits::<crate::stream::OwnedReadHalf>();
        assert_traits::<crate::stream::OwnedWriteHalf>();
        assert_traits::<crate::Error>();
        assert_traits::<crate::Connection<tokio::net::TcpStream>>();
    }
}
