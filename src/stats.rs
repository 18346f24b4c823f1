//! [`Stats`]: counters a session keeps about itself, from [`Session::stats`].
//!
//! [`Session::stats`]: crate::Session::stats

/// A snapshot of a session's counters, from [`Session::stats`](crate::Session::stats).
///
/// Counters run from the session's start; the `buffered` figures are the data received and not
/// yet read by the application, over all streams.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let (a, b) = tokio::io::duplex(64 * 1024);
/// let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
/// let mut stream = client.open().await?;
/// stream.write_all(b"hello").await?;
/// let mut inbound = server.accept().await?;
/// let mut hello = [0; 5];
/// inbound.read_exact(&mut hello).await?; // so the client has sent it
///
/// let stats = client.stats();
/// assert_eq!(stats.streams_opened, 1);
/// assert_eq!(stats.live_streams, 1);
/// assert!(stats.bytes_sent >= 8 + 8 + 5); // OpenStream, then a Data frame with 5 bytes
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Bytes written to the transport (and flushed), headers included.
    pub bytes_sent: u64,
    /// Frames queued for the transport, of every kind.
    pub frames_sent: u64,
    /// Bytes of whole frames received, headers included.
    pub bytes_received: u64,
    /// Frames received, of every kind.
    pub frames_received: u64,
    /// Streams with live state now (as [`Session::stream_count`](crate::Session::stream_count)).
    pub live_streams: usize,
    /// Streams this side opened.
    pub streams_opened: u64,
    /// Streams the peer opened that were admitted to the accept queue.
    pub streams_accepted: u64,
    /// Streams the peer opened that were refused (full backlog, stream limit, or no `Session`
    /// handle left to accept them).
    pub streams_refused: u64,
    /// Keepalive frames sent.
    pub keepalives_sent: u64,
    /// Keepalive frames received.
    pub keepalives_received: u64,
    /// Received data not yet read, over all streams, now…
    pub buffered: u64,
    /// …and at its highest so far.
    pub peak_buffered: u64,
}
