//! Session configuration: every knob, its default, and the bound it imposes.

use std::time::Duration;

use crate::frame::{INITIAL_WINDOW, MAX_LENGTH_FIELD, MAX_PAYLOAD};

/// Which end of the connection a session is. The application decides: the protocol has no
/// handshake.
///
/// The client opens even stream ids (0, 2, 4, …) and the server odd ones (1, 3, 5, …). Two
/// sessions of the same role on one connection would collide on ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Opens even stream ids.
    Client,
    /// Opens odd stream ids.
    Server,
}

impl Role {
    /// The first id this role opens.
    pub(crate) fn first_id(self) -> u32 {
        match self {
            Role::Client => 0,
            Role::Server => 1,
        }
    }

    /// Whether `id` is one the *peer* of this role may open.
    pub(crate) fn is_peer_id(self, id: u32) -> bool {
        match self {
            Role::Client => id % 2 == 1,
            Role::Server => id % 2 == 0,
        }
    }
}

/// Settings of a session. Build with [`Config::default`] and the setters.
///
/// ```
/// use std::time::Duration;
/// let config = gomux::Config::default()
///     .max_streams(1024)
///     .idle_timeout(Some(Duration::from_secs(60)));
/// assert_eq!(config.max_streams_limit(), 1024);
/// ```
///
/// What a peer can make a session hold is bounded by these settings: at most
/// `max_streams × receive_window + receive_window_budget` bytes of received data (plus, for
/// small frames, a copy buffer of at most twice the data it holds, and for frames of 16 KiB or more, the read buffer
/// they were received into: at most 192 KiB for each such frame still unread), and about
/// `2 × (write_buffer_size + max_payload) + 8 × max_streams` bytes of outgoing frames (the
/// queue being filled, the batch being written, and control frames).
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) max_payload: usize,
    pub(crate) receive_window: u32,
    pub(crate) max_receive_window: u32,
    pub(crate) receive_window_budget: u64,
    pub(crate) keepalive_interval: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) close_timeout: Duration,
    pub(crate) accept_backlog: usize,
    pub(crate) max_streams: usize,
    pub(crate) write_buffer_size: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_payload: MAX_PAYLOAD,
            receive_window: INITIAL_WINDOW,
            max_receive_window: 16 * 1024 * 1024,
            receive_window_budget: 64 * 1024 * 1024,
            keepalive_interval: Some(Duration::from_secs(30)),
            idle_timeout: None,
            close_timeout: Duration::from_secs(10),
            accept_backlog: 1024,
            max_streams: 8192,
            write_buffer_size: 1024 * 1024,
        }
    }
}

impl Config {
    /// Largest Data payload sent or accepted, default 65536 (the Go limit; a Go peer fails the
    /// session on anything larger, so raise it only between two peers of this crate). A received
    /// Data frame above it ends the session with
    /// [`ProtocolError::PayloadTooLarge`](crate::ProtocolError::PayloadTooLarge). Clamped to
    /// 1..=16,777,215.
    pub fn max_payload(mut self, bytes: usize) -> Config {
        self.max_payload = bytes.clamp(1, MAX_LENGTH_FIELD as usize);
        self
    }

    /// Credit this side keeps granted to the peer on each stream, default 65536 (the protocol's
    /// initial window). A larger value is announced with a WindowUpdate when the stream opens
    /// (legal, and understood by Go peers) and lets one stream carry more per round trip. It is
    /// also the most a stream buffers for a reader that never reads (a window that has grown,
    /// see [`max_receive_window`](Config::max_receive_window), holds up to its new size).
    /// Clamped to 65536..=16,777,215.
    pub fn receive_window(mut self, bytes: u32) -> Config {
        self.receive_window = bytes.clamp(INITIAL_WINDOW, MAX_LENGTH_FIELD);
        self
    }

    /// The most a stream's receive window grows to, default 16 MiB. A stream that receives half
    /// its window within one measured round trip while its application keeps the buffer nearly
    /// empty (so the window, not the reader or the sender, limits it) gets its window doubled, up to this and within
    /// [`receive_window_budget`](Config::receive_window_budget). A window of 64 KiB carries at
    /// most 64 KiB per round trip: 3.2 MB/s at 20 ms. Set it to `receive_window` to keep windows
    /// fixed. Clamped to at least `receive_window`.
    pub fn max_receive_window(mut self, bytes: u32) -> Config {
        self.max_receive_window = bytes;
        self
    }

    /// What all of a session's streams together may add to their windows by growing, default
    /// 64 MiB. It bounds the extra data a peer can make the session buffer; a stream gives its
    /// share back when it closes.
    pub fn receive_window_budget(mut self, bytes: u64) -> Config {
        self.receive_window_budget = bytes;
        self
    }

    /// Send a Keepalive frame after this long without writing anything, default 30 s; `None`
    /// never sends one. Keeps a peer's idle timeout (and NAT state) from expiring.
    pub fn keepalive_interval(mut self, interval: Option<Duration>) -> Config {
        self.keepalive_interval = interval.filter(|d| !d.is_zero());
        self
    }

    /// End the session with [`Error::IdleTimeout`](crate::Error::IdleTimeout) when nothing at
    /// all is received for this long. Default `None` (off), because a Go peer sends a keepalive
    /// only every 10 minutes; set it above the peer's keepalive interval.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Config {
        self.idle_timeout = timeout.filter(|d| !d.is_zero());
        self
    }

    /// How long an ending session keeps trying to flush what is queued (and its CloseMux) into a
    /// transport that does not accept writes before it gives up, default 10 s.
    pub fn close_timeout(mut self, timeout: Duration) -> Config {
        self.close_timeout = timeout;
        self
    }

    /// Inbound streams queued for [`Session::accept`](crate::Session::accept), default 1024. A
    /// stream that arrives while the queue is full is refused with CloseStream (the opener reads
    /// end-of-stream and its writes fail); the session keeps reading. A peer that opens streams in
    /// bursts larger than this, faster than the application accepts, needs a larger backlog.
    /// Queued streams count towards `max_streams`. At least 1.
    pub fn accept_backlog(mut self, streams: usize) -> Config {
        self.accept_backlog = streams.max(1);
        self
    }

    /// Live streams per session, both directions together, default 8192. Opening one more fails
    /// that open with [`Error::TooManyStreams`](crate::Error::TooManyStreams); a peer's open
    /// beyond it is refused with CloseStream. With the receive window this bounds the data a
    /// session buffers (8192 × 64 KiB = 512 MiB at the defaults, plus the 64 MiB
    /// window-growth budget, reached only if no stream is read). At least 1.
    pub fn max_streams(mut self, streams: usize) -> Config {
        self.max_streams = streams.max(1);
        self
    }

    /// Outgoing bytes queued for the transport before writers wait, default 1 MiB. Writes are
    /// coalesced into transport writes of up to this size: with 100 and 1000 streams writing
    /// at once, 1 MiB moved 10–23 % more over loopback TCP than 256 KiB (see BENCHMARKS.md).
    /// Writers (and openers) waiting for room are let in oldest first, as many as the room
    /// fits, so streams writing at once take turns; a frame waits behind at most about twice
    /// this (the queue, and the batch being written) plus what the transport holds. A smaller
    /// queue shortens that wait on a slow link, at the cost of smaller transport writes.
    /// Control frames (window updates, closes) are never held back by it.
    pub fn write_buffer_size(mut self, bytes: usize) -> Config {
        self.write_buffer_size = bytes.max(1);
        self
    }

    /// The most a stream's window may grow to: never below its starting window.
    pub(crate) fn window_ceiling(&self) -> u32 {
        self.max_receive_window.max(self.receive_window)
    }

    /// The configured maximum of live streams.
    pub fn max_streams_limit(&self) -> usize {
        self.max_streams
    }
}
