//! [`Stats`]: counters a session keeps about itself, from [`Session::stats`].
//!
//! Always on, and cheap: each counter is bumped under the session's lock by an operation that
//! takes it anyway, with no allocation and no lock of its own. Waits for credit and room are
//! timed by reading the clock only when a write starts or stops waiting, never for a write that
//! goes straight through.
//!
//! Per-stream figures, [`StreamStats`] from [`Stream::stats`](crate::Stream::stats), add
//! nothing to a stream that never waits: an idle stream end is to stay within 256 bytes, so
//! its waits are kept in a table of their own, with an entry only for a stream whose writes
//! have waited (`core::write_waits`), and its queued bytes are its send queue's length.
//!
//! There is no `metrics` facade feature: a snapshot holds everything, costs one lock to take,
//! and an application that exports metrics reads it at the rate its exporter scrapes, rather
//! than paying for a recorder call on every event.
//!
//! [`Session::stats`]: crate::Session::stats

use std::time::Duration;

/// A snapshot of a session's counters, from [`Session::stats`](crate::Session::stats).
///
/// Counters run from the session's start; the `buffered` figures are the data received and not
/// yet read by the application, over all streams. The counts of streams (`streams_*`,
/// `refused_by_peer`) and of keepalives stop at `u32::MAX` (4,294,967,295): a side has 2^31
/// stream ids, and a keepalive a second takes 136 years to get there.
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
    /// Streams this side opened that a peer of this crate refused: closed (CloseStream)
    /// before it sent anything for them, which is how it answers when its backlog is full or
    /// it drains, or left unacknowledged when it ended the session in order (its CloseMux; see
    /// [`Stopped::Refused`](crate::stream::Stopped::Refused)). Streams whose handles were
    /// dropped before the answer count too. `streams_refused` counts the refusals this side
    /// sent.
    pub refused_by_peer: u64,
    /// Writes that found the stream's send window empty and waited for the peer's credit (a
    /// WindowUpdate): how often a window ran dry. A wait counts once however often its task is
    /// polled.
    pub credit_waits: u64,
    /// Time those writes waited, summed over the streams (two streams waiting for one second
    /// each count two seconds), waits under way included. A large share of the session's life
    /// says the peer's reading, or the window it grants, limits the sending.
    pub credit_wait_time: Duration,
    /// Writes that found the session's send queue full
    /// ([`Config::write_buffer_size`](crate::Config::write_buffer_size)) and waited for room.
    pub room_waits: u64,
    /// Time those writes waited, summed over the streams, waits under way included: the
    /// transport (or the peer reading it) limits the sending.
    pub room_wait_time: Duration,
    /// Bytes queued for the transport and not taken by it yet: data frames, and a header for
    /// each control frame.
    pub queued: u64,
    /// The smallest round trip measured on the streams, which the receive-window tuner works
    /// with: from credit written to the peer to the first data it sends beyond the credit it
    /// held then. `None` until a peer has sent data beyond some credit returned to it.
    pub min_rtt: Option<Duration>,
}

/// A snapshot of one stream's figures, from [`Stream::stats`](crate::Stream::stats) (and the
/// halves' `stats`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tokio::io::AsyncWriteExt;
///
/// let (a, b) = tokio::io::duplex(64 * 1024);
/// let (client, _server) = (gomux::Session::client(a), gomux::Session::server(b));
/// let mut stream = client.open().await?;
/// stream.write_all(&[0; 1000]).await?;
/// let stats = stream.stats();
/// assert_eq!(stats.send_credit, 64 * 1024 - 1000); // until the peer returns credit
/// assert_eq!(stats.credit_waits, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// Writes that found the stream's send window empty (the peer had not returned credit)
    /// and waited.
    pub credit_waits: u64,
    /// The time those writes waited, the wait under way included.
    pub credit_wait_time: Duration,
    /// Writes that found the session's send queues full and waited.
    pub room_waits: u64,
    /// The time those writes waited, the wait under way included.
    pub room_wait_time: Duration,
    /// Credit the peer has granted and the stream has not used: what it may still send.
    pub send_credit: u32,
    /// Bytes the stream queued and the transport has not taken yet (headers included), not
    /// counting the batch the driver is writing.
    pub queued: u64,
    /// Bytes received and not read yet.
    pub buffered: u64,
    /// The stream's receive window: what the peer may have in flight towards it (it grows
    /// when the window, not the link or the reader, limits the stream).
    pub receive_window: u32,
    /// The session's round-trip estimate (see [`Stats::min_rtt`]).
    pub min_rtt: Option<Duration>,
    /// Its send priority (see [`Stream::set_priority`](crate::Stream::set_priority)).
    pub priority: i32,
}
