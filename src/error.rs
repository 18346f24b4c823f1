//! Error types.
//!
//! Three layers, from the wire up:
//!
//! - [`ProtocolError`]: what the peer did wrong. Each item of the bad-input policy has a variant.
//! - [`CodecError`]: what [`FrameCodec`](crate::codec::FrameCodec) reports: a protocol error, a
//!   frame the encoder refuses, or the underlying I/O error.
//! - [`Error`]: what the session and its streams report to the application. It is `Clone`,
//!   because one error that ends a session is given to every stream of it, and it converts into
//!   [`std::io::Error`] with a fitting [`io::ErrorKind`] where it surfaces through
//!   `AsyncRead`/`AsyncWrite`.

use std::{error, fmt, io, sync::Arc};

/// A violation of the protocol by the peer. Every one ends the session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A Data frame longer than the configured maximum payload.
    PayloadTooLarge {
        /// Stream id of the frame.
        id: u32,
        /// Length the header claimed.
        length: u32,
        /// The configured maximum.
        max: usize,
    },
    /// A frame kind outside `0..=7`.
    UnknownKind {
        /// Stream id of the frame.
        id: u32,
        /// The undefined kind byte.
        kind: u8,
    },
    /// Data beyond the credit this side granted on the stream.
    WindowExceeded {
        /// Stream id of the frame.
        id: u32,
        /// Length of the Data frame.
        length: u32,
        /// Credit the peer had left.
        credit: u32,
    },
    /// A WindowUpdate that would push the send credit past its limit.
    WindowOverflow {
        /// Stream id of the frame.
        id: u32,
        /// Credit held before the update.
        credit: u32,
        /// Credit the update tried to add.
        increment: u32,
    },
    /// OpenStream for an id that is still live.
    DuplicateStream {
        /// The id opened twice.
        id: u32,
    },
    /// OpenStream for an id of this side's parity (a server receiving an odd id, a client an
    /// even one). Almost always both ends were given the same [`Role`](crate::Role): gomux
    /// has no handshake to catch that, so the first stream the peer opens is where it shows.
    WrongParity {
        /// The offending id.
        id: u32,
    },
    /// Data on a stream after the peer sent CloseRead or CloseStream for it.
    DataAfterClose {
        /// Stream id of the frame.
        id: u32,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::PayloadTooLarge { id, length, max } => write!(
                f,
                "data frame of {length} bytes on stream {id} exceeds the maximum payload of {max}"
            ),
            ProtocolError::UnknownKind { id, kind } => {
                write!(f, "unknown frame kind {kind:#04x} on stream {id}")
            }
            ProtocolError::WindowExceeded { id, length, credit } => write!(
                f,
                "data frame of {length} bytes on stream {id} exceeds the {credit} bytes of credit granted"
            ),
            ProtocolError::WindowOverflow {
                id,
                credit,
                increment,
            } => write!(
                f,
                "window update of {increment} on stream {id} overflows the credit of {credit}"
            ),
            ProtocolError::DuplicateStream { id } => {
                write!(f, "peer opened stream {id}, which is already live")
            }
            ProtocolError::WrongParity { id } => write!(
                f,
                "peer opened stream {id}, an id reserved for this side \
                 (do both ends have the same role? one must be the client, the other the server)"
            ),
            ProtocolError::DataAfterClose { id } => {
                write!(f, "data on stream {id} after the peer closed it")
            }
        }
    }
}

impl error::Error for ProtocolError {}

/// An error from [`FrameCodec`](crate::codec::FrameCodec).
#[derive(Debug)]
#[non_exhaustive]
pub enum CodecError {
    /// The input breaks the protocol.
    Protocol(ProtocolError),
    /// The encoder was handed a frame that cannot be put on the wire.
    InvalidFrame(InvalidFrame),
    /// The underlying transport failed.
    Io(io::Error),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Protocol(e) => write!(f, "protocol error: {e}"),
            CodecError::InvalidFrame(why) => write!(f, "invalid frame: {why}"),
            CodecError::Io(e) => write!(f, "i/o error: {e}"),
        }
    }
}

/// Why [`FrameCodec`](crate::codec::FrameCodec) refused to encode a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidFrame {
    /// The length field does not fit the header's 24 bits.
    LengthTooLarge {
        /// The length given.
        length: u32,
    },
    /// A Data frame whose length field differs from its payload's length.
    LengthMismatch {
        /// The length field.
        length: u32,
        /// The payload's length.
        payload: usize,
    },
    /// A Data payload above the codec's maximum.
    PayloadTooLarge {
        /// The payload's length.
        length: usize,
        /// The codec's maximum payload.
        max: usize,
    },
    /// A payload on a frame of a kind that carries none (every kind but Data).
    UnexpectedPayload {
        /// The frame's kind.
        kind: crate::frame::Kind,
        /// The payload's length.
        length: usize,
    },
}

impl fmt::Display for InvalidFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidFrame::LengthTooLarge { length } => {
                write!(f, "length {length} does not fit the 24-bit field")
            }
            InvalidFrame::LengthMismatch { length, payload } => write!(
                f,
                "data length field {length} differs from the payload length {payload}"
            ),
            InvalidFrame::PayloadTooLarge { length, max } => {
                write!(
                    f,
                    "data payload of {length} bytes above the maximum of {max}"
                )
            }
            InvalidFrame::UnexpectedPayload { kind, length } => {
                write!(
                    f,
                    "payload of {length} bytes on a {kind:?} frame, which has none"
                )
            }
        }
    }
}

impl error::Error for InvalidFrame {}

/// The message names the cause (the protocol violation, the refused frame, the I/O error), so
/// `source` skips it and goes on from the cause's own source: an error-chain printer says each
/// thing once.
impl error::Error for CodecError {
    fn source(&self) -> Option<&(dyn error::Error + 'static)> {
        match self {
            CodecError::Protocol(e) => e.source(),
            CodecError::InvalidFrame(e) => e.source(),
            CodecError::Io(e) => e.source(),
        }
    }
}

impl From<io::Error> for CodecError {
    fn from(e: io::Error) -> CodecError {
        CodecError::Io(e)
    }
}

impl From<ProtocolError> for CodecError {
    fn from(e: ProtocolError) -> CodecError {
        CodecError::Protocol(e)
    }
}

/// Why a session or stream operation failed.
///
/// Cheap to clone. Converts into [`io::Error`] (see the variants for the
/// [`io::ErrorKind`] each becomes).
///
/// Its message names the cause where there is one (the protocol violation, the transport's
/// I/O error), because a stream's error is mostly printed through the `io::Error` it becomes,
/// whose message is this one. So [`source`](std::error::Error::source) does not return that
/// cause again: it goes on from the cause's own source, and an error-chain printer says each
/// thing once. To inspect the cause, match the variant.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::error::Error as _;
///
/// // Two ends that both think they are the client: the first open breaks the protocol.
/// let (a, b) = tokio::io::duplex(64 * 1024);
/// let (one, other) = (gomux::Session::client(a), gomux::Session::client(b));
/// let _stream = one.open().await.expect("queued");
/// let error = other.closed().await;
/// match &error {
///     gomux::Error::Protocol(gomux::ProtocolError::WrongParity { id }) => assert_eq!(*id, 0),
///     other => panic!("unexpected {other}"),
/// }
/// // The message says what went wrong and what to check, once.
/// assert!(error.to_string().contains("same role"), "{error}");
/// assert!(error.source().is_none());
/// // Through a stream it is an `io::Error` of kind `InvalidData`, with the same message.
/// let io = std::io::Error::from(error.clone());
/// assert_eq!(io.kind(), std::io::ErrorKind::InvalidData);
/// assert_eq!(io.to_string(), error.to_string());
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The peer broke the protocol; the session is over. (`InvalidData`)
    Protocol(ProtocolError),
    /// This side closed the session, or its driver was dropped. (`NotConnected`)
    ClosedLocally,
    /// The peer closed the session with CloseMux. (`ConnectionAborted`)
    ClosedByPeer,
    /// The transport reached end-of-file between frames without a CloseMux. (`ConnectionReset`)
    ConnectionClosed,
    /// The transport ended in the middle of a frame. (`UnexpectedEof`)
    UnexpectedEof,
    /// Nothing was received for the configured idle timeout. (`TimedOut`)
    IdleTimeout,
    /// The transport failed. (the I/O error's own kind)
    Transport(Arc<io::Error>),
    /// Opening a stream would exceed the configured maximum of live streams; only this open
    /// failed. (`Other`)
    TooManyStreams,
    /// The stream's write side is closed: this side shut it down or closed the stream. (`BrokenPipe`)
    WriteClosed,
    /// The peer will read no more on this stream (it sent CloseWrite or CloseStream). (`BrokenPipe`)
    PeerReadClosed,
    /// The transport took none of the bytes waiting for it for the configured write-stall
    /// timeout (the peer stopped reading while keeping the connection open); the session is
    /// over. (`TimedOut`)
    WriteStalled,
    /// The peer refused the stream before its application accepted it (its accept backlog was
    /// full, it had reached its `max_streams`, or it was closing): nothing written on the stream
    /// reached the peer's application, so the request is safe to retry, on this session or
    /// another. Only a peer of this crate says so (it acknowledges every stream its application
    /// accepts); a stream that a Go peer closes reads as an ordinary end of stream.
    /// (`ConnectionRefused`)
    Refused,
    /// The peer, which announced that it sends something at least every keepalive interval,
    /// sent nothing for twice that interval: it is dead, paused, or cut off. The session is
    /// over. (`TimedOut`)
    KeepaliveTimeout,
    /// [`Session::graceful_close`](crate::Session::graceful_close) reached its deadline with
    /// streams still open; the session was closed all the same, cutting them. (`TimedOut`)
    GracefulCloseTimedOut {
        /// Streams still open at the deadline.
        streams: usize,
    },
    /// [`Session::open`](crate::Session::open), [`Session::try_open`](crate::Session::try_open)
    /// or [`Pool::open`](crate::Pool::open) found no session that takes new streams: it ended
    /// (the error that ended it is inside) or is closing gracefully (the pool or session was
    /// closed by this side: [`ClosedLocally`](Error::ClosedLocally) inside). The stream was
    /// not opened and no frame of it was written, so the request is safe to retry, on another
    /// session. (The kind of the error inside)
    SessionUnavailable(Box<Error>),
    /// A [`Pool`](crate::Pool) had no live session within its open timeout. Only this open
    /// failed: the pool goes on connecting. (The kind of the latest failure, `TimedOut` when
    /// there was none.)
    PoolUnavailable {
        /// The latest real failure: why the latest connect failed or the latest session
        /// ended, if any did.
        last: Option<Box<Error>>,
    },
}

impl Error {
    /// The gomux error inside an [`io::Error`] that a stream's `AsyncRead`/`AsyncWrite`
    /// returned, if it came from this crate (every error a stream reports does).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::AsyncWriteExt;
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, _server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut stream = client.open().await?;
    /// stream.shutdown().await?;
    /// let error = stream.write_all(b"late").await.unwrap_err();
    /// assert!(matches!(gomux::Error::from_io(&error), Some(gomux::Error::WriteClosed)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_io(error: &io::Error) -> Option<&Error> {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Error>())
    }

    /// Whether this is a graceful end of the session: closed by this side
    /// ([`ClosedLocally`](Error::ClosedLocally)) or by the peer with CloseMux
    /// ([`ClosedByPeer`](Error::ClosedByPeer)), or an open that found the session so ended.
    ///
    /// ```
    /// assert!(gomux::Error::ClosedByPeer.is_graceful());
    /// assert!(!gomux::Error::KeepaliveTimeout.is_graceful());
    /// ```
    pub fn is_graceful(&self) -> bool {
        match self {
            Error::ClosedLocally | Error::ClosedByPeer => true,
            Error::SessionUnavailable(reason) => reason.is_graceful(),
            _ => false,
        }
    }

    /// Whether the request carried by the stream that failed with this error is safe to send
    /// again: it never reached the peer's application. True for the errors of `open` and
    /// `try_open` (no frame of the stream was written: [`SessionUnavailable`],
    /// [`TooManyStreams`], [`PoolUnavailable`]) and for [`Refused`] (a peer of this crate
    /// refused the stream before its application accepted it, or ended the session in order
    /// without having accepted it). False for every other error of a stream's reads, writes,
    /// flushes and closes: the peer's application may have received the request and acted on
    /// it, or this side used the stream after closing it. The guide's chapter on refusals and
    /// retries has the table.
    ///
    /// [`SessionUnavailable`]: Error::SessionUnavailable
    /// [`TooManyStreams`]: Error::TooManyStreams
    /// [`PoolUnavailable`]: Error::PoolUnavailable
    /// [`Refused`]: Error::Refused
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// let (client, _server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// client.close().await.unwrap();
    /// // The session is over: the open wrote nothing, so the request may go elsewhere.
    /// let error = client.open().await.unwrap_err();
    /// assert!(error.is_retry_safe(), "{error}");
    /// assert!(!gomux::Error::ClosedByPeer.is_retry_safe(), "a stream's read may have been handled");
    /// # }
    /// ```
    pub fn is_retry_safe(&self) -> bool {
        matches!(
            self,
            Error::Refused
                | Error::SessionUnavailable(_)
                | Error::TooManyStreams
                | Error::PoolUnavailable { .. }
        )
    }

    /// Whether this error reports the session's end rather than a problem of one operation.
    ///
    /// ```
    /// assert!(gomux::Error::ConnectionClosed.is_session_end());
    /// // A refused stream, or an open over the limit, leaves the session running.
    /// assert!(!gomux::Error::Refused.is_session_end());
    /// assert!(!gomux::Error::TooManyStreams.is_session_end());
    /// ```
    pub fn is_session_end(&self) -> bool {
        !matches!(
            self,
            Error::TooManyStreams
                | Error::WriteClosed
                | Error::PeerReadClosed
                | Error::Refused
                | Error::PoolUnavailable { .. }
        )
    }

    /// Whether a session that ends with this error ended on a fault (the peer broke the
    /// protocol, the transport failed or was cut mid-frame), rather than by a close or a
    /// timeout: what logs report as a warning.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn is_fault(&self) -> bool {
        matches!(
            self,
            Error::Protocol(_) | Error::Transport(_) | Error::UnexpectedEof
        )
    }

    /// The [`io::ErrorKind`] this error becomes when it surfaces through `AsyncRead`/`AsyncWrite`.
    ///
    /// ```
    /// use std::io::ErrorKind;
    ///
    /// assert_eq!(gomux::Error::Refused.io_kind(), ErrorKind::ConnectionRefused);
    /// assert_eq!(gomux::Error::WriteClosed.io_kind(), ErrorKind::BrokenPipe);
    /// let io = std::io::Error::from(gomux::Error::IdleTimeout);
    /// assert_eq!(io.kind(), gomux::Error::IdleTimeout.io_kind());
    /// ```
    pub fn io_kind(&self) -> io::ErrorKind {
        match self {
            Error::Protocol(_) => io::ErrorKind::InvalidData,
            Error::ClosedLocally => io::ErrorKind::NotConnected,
            Error::ClosedByPeer => io::ErrorKind::ConnectionAborted,
            Error::ConnectionClosed => io::ErrorKind::ConnectionReset,
            Error::UnexpectedEof => io::ErrorKind::UnexpectedEof,
            Error::Refused => io::ErrorKind::ConnectionRefused,
            Error::IdleTimeout
            | Error::KeepaliveTimeout
            | Error::WriteStalled
            | Error::GracefulCloseTimedOut { .. } => io::ErrorKind::TimedOut,
            Error::Transport(e) => e.kind(),
            Error::TooManyStreams => io::ErrorKind::Other,
            Error::WriteClosed | Error::PeerReadClosed => io::ErrorKind::BrokenPipe,
            Error::PoolUnavailable { last } => last
                .as_ref()
                .map_or(io::ErrorKind::TimedOut, |last| last.io_kind()),
            Error::SessionUnavailable(reason) => reason.io_kind(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Protocol(e) => write!(f, "protocol error: {e}"),
            Error::ClosedLocally => f.write_str("session closed locally"),
            Error::ClosedByPeer => f.write_str("session closed by peer"),
            Error::ConnectionClosed => f.write_str("connection closed without a session close"),
            Error::UnexpectedEof => f.write_str("unexpected end of connection"),
            Error::IdleTimeout => f.write_str("nothing received within the idle timeout"),
            Error::Transport(e) => write!(f, "transport error: {e}"),
            Error::TooManyStreams => f.write_str("too many streams"),
            Error::WriteClosed => f.write_str("stream closed for writing"),
            Error::PeerReadClosed => f.write_str("peer closed the stream for reading"),
            Error::WriteStalled => {
                f.write_str("the transport took no bytes within the write-stall timeout")
            }
            Error::Refused => f.write_str(
                "stream refused by the peer before its application accepted it (safe to retry)",
            ),
            Error::KeepaliveTimeout => {
                f.write_str("the peer sent nothing for twice its keepalive interval")
            }
            Error::GracefulCloseTimedOut { streams } => write!(
                f,
                "{streams} streams still open at the graceful close's deadline were cut"
            ),
            Error::PoolUnavailable { last: Some(last) } => write!(
                f,
                "no pooled session available within the open timeout; latest failure: {last}"
            ),
            Error::SessionUnavailable(reason) => {
                write!(f, "no stream opened, the session takes none: {reason}")
            }
            Error::PoolUnavailable { last: None } => {
                f.write_str("no pooled session available within the open timeout")
            }
        }
    }
}

/// See [`Error`] for why `source` skips the cause its message names.
impl error::Error for Error {
    fn source(&self) -> Option<&(dyn error::Error + 'static)> {
        match self {
            Error::Protocol(e) => e.source(),
            Error::Transport(e) => e.source(),
            Error::PoolUnavailable { last: Some(last) } => last.source(),
            Error::SessionUnavailable(reason) => reason.source(),
            _ => None,
        }
    }
}

impl From<ProtocolError> for Error {
    fn from(e: ProtocolError) -> Error {
        Error::Protocol(e)
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Transport(Arc::new(e))
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        io::Error::new(e.io_kind(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_conversion_keeps_the_error_as_source() {
        let err = io::Error::from(Error::Protocol(ProtocolError::DataAfterClose { id: 4 }));
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let inner = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<Error>())
            .expect("the gomux error is kept");
        assert!(matches!(
            inner,
            Error::Protocol(ProtocolError::DataAfterClose { id: 4 })
        ));
        assert_eq!(
            io::Error::from(Error::WriteClosed).kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    /// An error with a source of its own, under the transport's `io::Error`.
    #[derive(Debug)]
    struct Tls(io::Error);

    impl fmt::Display for Tls {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("tls alert")
        }
    }

    impl error::Error for Tls {
        fn source(&self) -> Option<&(dyn error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// The messages of `error` and of its sources, as an error-chain printer shows them.
    fn chain(error: &dyn error::Error) -> Vec<String> {
        let mut messages = vec![error.to_string()];
        let mut source = error.source();
        while let Some(next) = source {
            messages.push(next.to_string());
            source = next.source();
        }
        messages
    }

    #[test]
    fn an_error_chain_says_each_thing_once() {
        let transport = || {
            let root = io::Error::other("certificate expired");
            Error::from(io::Error::new(io::ErrorKind::ConnectionReset, Tls(root)))
        };
        let pool = Error::PoolUnavailable {
            last: Some(Box::new(transport())),
        };
        for error in [transport(), pool] {
            let messages = chain(&error);
            let text = messages.join(": ");
            for said in ["tls alert", "certificate expired"] {
                assert_eq!(text.matches(said).count(), 1, "{messages:?}");
            }
            // Through the `io::Error` a stream returns, the same.
            let text = chain(&io::Error::from(error.clone())).join(": ");
            assert_eq!(text.matches("tls alert").count(), 1, "{text}");
        }
        let protocol = Error::Protocol(ProtocolError::WrongParity { id: 1 });
        assert_eq!(chain(&protocol).len(), 1, "{:?}", chain(&protocol));
        let codec = CodecError::Io(io::Error::other("reset"));
        assert_eq!(chain(&codec), ["i/o error: reset"]);
    }

    #[test]
    fn a_pool_without_a_session_reports_its_latest_failure() {
        let refused = Error::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        let error = Error::PoolUnavailable {
            last: Some(Box::new(refused)),
        };
        assert_eq!(error.io_kind(), io::ErrorKind::ConnectionRefused);
        assert!(!error.is_session_end() && !error.is_graceful());
        assert!(error.to_string().contains("refused"), "{error}");
        let error = Error::PoolUnavailable { last: None };
        assert_eq!(error.io_kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn messages_are_lowercase() {
        for e in [
            Error::ClosedLocally,
            Error::ClosedByPeer,
            Error::UnexpectedEof,
            Error::TooManyStreams,
        ] {
            let text = e.to_string();
            assert!(
                text.chars().next().is_some_and(|c| c.is_lowercase()),
                "{text}"
            );
        }
    }
}
