//! [`Stopped`]: how the peer stopped taking data on a stream. Its own module, below both the
//! stream handles and the session core that reports it.

/// How the peer stopped taking data on a stream, from [`Stream::stopped`](crate::Stream::stopped).
///
/// The protocol has no refusal frame and no error codes: a peer refuses a stream (its accept
/// backlog is full, or it drains) by closing it at once. A peer of this crate acknowledges
/// every stream its application accepts, so a stream of ours it closed before anything came
/// back is reported as refused, and its reads and writes fail with
/// [`Error::Refused`](crate::Error::Refused). A Go peer acknowledges nothing: a stream it
/// closes unanswered may have been handled, and is reported as [`Stopped::Closed`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use gomux::stream::Stopped;
///
/// # let (a, b) = tokio::io::duplex(64 * 1024);
/// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
/// let stream = client.open().await?;
/// drop(server.accept().await?); // the server's application takes the stream, then closes it
/// match stream.stopped().await? {
///     Stopped::Closed => {}                   // the peer's application had it
///     Stopped::ReadClosed => unreachable!(),  // it would still send
///     Stopped::Refused => unreachable!(),     // it never reached the peer's application
///     _ => unreachable!(),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stopped {
    /// The peer stopped reading (CloseWrite, from its `close_read` or Go's `CloseRead`); it may
    /// still send.
    ReadClosed,
    /// The peer closed the stream (CloseStream), after its application had it.
    Closed,
    /// A peer of this crate closed the stream (CloseStream) before its application accepted
    /// it: refused, and safe to retry.
    Refused,
}
