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
//! open streams.
//!
//! # Flow control
//!
//! Each direction of each stream has a credit window, 64 KiB at the start. A writer waits when
//! its credit is spent; the reader returns credit as the application reads, at the latest when
//! the stream's buffer is empty (so a Go sender, which waits for room for a whole 64 KiB chunk,
//! never stalls). A stream that is not read therefore holds at most its window, and never
//! stops the others: the session keeps reading the connection whatever the application does.
//!
//! # Bad input
//!
//! A peer that breaks the protocol (oversized frame, data beyond its credit, credit overflow,
//! unknown frame kind, duplicate or wrong-parity stream id, data after its close) ends the
//! session with [`Error::Protocol`]; every stream sees it, and the connection is closed after a
//! best-effort CloseMux. Frames for unknown or closed streams are ignored, since they race with
//! local closes.
//!
//! # Modules
//!
//! - [`frame`] and [`codec`]: the wire format, usable on their own with `tokio_util`'s `Framed`.
//! - [`Session`], [`Stream`]: the multiplexer. [`Config`]: its knobs and their bounds.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub)]

pub mod codec;
mod config;
mod error;
mod flow;
pub mod frame;
mod session;
pub mod stream;

pub use crate::config::{Config, Role};
pub use crate::error::{CodecError, Error, ProtocolError};
pub use crate::session::{Connection, Incoming, Session};
pub use crate::stream::Stream;

#[cfg(test)]
mod tests {
    fn assert_traits<T: Send + Sync + Unpin + 'static>() {}

    #[test]
    fn handles_are_send_sync_unpin_static() {
        assert_traits::<crate::Session>();
        assert_traits::<crate::Stream>();
        assert_traits::<crate::stream::ReadHalf>();
        assert_traits::<crate::stream::WriteHalf>();
        assert_traits::<crate::Error>();
        assert_traits::<crate::Connection<tokio::net::TcpStream>>();
    }
}
