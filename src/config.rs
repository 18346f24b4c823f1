//! Session configuration: every knob, its default, and the bound it imposes.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::frame::{INITIAL_WINDOW, MAX_LENGTH_FIELD, MAX_PAYLOAD};

/// Which end of the connection a session is. The application decides: the protocol has no
/// handshake.
///
/// The client opens even stream ids (0, 2, 4, …) and the server odd ones (1, 3, 5, …). Two
/// sessions of the same role on one connection would collide on ids.
///
/// ```
/// // The two ends of one connection take different roles.
/// let (a, b) = (gomux::Role::Client, gomux::Role::Server);
/// assert_ne!(a, b);
/// ```
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
/// Cloning is cheap: clones share one copy of the settings, and so do the sessions made from
/// them (and every session made from `Config::default()`), so a server holding thousands of
/// sessions keeps the settings once. Build a `Config` once and clone it for each session; a
/// setter called on a clone copies the settings first and leaves the others unchanged.
///
/// ```
/// use std::time::Duration;
/// let config = gomux::Config::default()
///     .max_streams(1024)
///     .idle_timeout(Some(Duration::from_secs(60)));
/// assert_eq!(config.max_streams_limit(), 1024);
/// ```
///
/// # Memory bounds
///
/// What a peer can make a session hold is bounded by these settings (each bound has a test
/// that measures it, named beside it):
///
/// - **Received data**: at most `B = max_streams × receive_window + receive_window_budget`
///   bytes buffered for the application (512 MiB + 64 MiB at the defaults, reached only if no
///   stream is read). The memory holding it stays within `3 × B + 1 MiB`: large payloads are
///   kept as slices of the read buffer they arrived in, and when the read buffers they keep
///   alive come to more than twice the data plus 1 MiB, the data is copied out and the buffers
///   let go; small payloads are copied into per-stream buffers (at most twice the data, plus
///   4 KiB per stream holding some). (`tests/core_findings_b.rs`, `unread_large_frames_do_not_pin_read_buffers_many_times_their_size`)
/// - **Read buffers**: the driver's current one, and up to 64 spares of at most 192 KiB kept
///   for reuse, dropped after a second without use.
/// - **Idle sessions**: a session that has read and written nothing for a second gives back
///   its read buffer (a partial frame keeps only its own bytes), its spares, its outgoing
///   queues and its pool of stream buffers; its next frame allocates them again, as a new
///   session's first one does (small frames are read on the stack and need none). What it
///   keeps is its state (`tests/idle_memory.rs`, `an_idle_session_end_gives_its_buffers_back`,
///   which bounds it; BENCHMARKS.md gives the resident figure beside Go gomux's).
/// - **Outgoing frames**: the streams' send queues hold at most `write_buffer_size +
///   max_payload + 8` bytes written by the application (`session::core::tests::writers_let_in_together_stay_within_the_queue_size`),
///   plus at most 40 bytes per stream (its OpenStream, window announcement and three closes); the batch being written holds at most
///   as much again (its size follows what the transport takes, from 8 KiB up); emptied queues
///   and the buffers batches held parts of keep at most `2 × (write_buffer_size + max_payload
///   + 8)` of capacity for reuse (two buffers of the most a queue holds), given back when the
///   session goes quiet. A direct write (see [`guide::streams`](crate::guide::streams)) that the
///   transport took only part of
///   leaves at most its control frames and one frame (`max_payload + 8` bytes) for the driver,
///   in a buffer kept for reuse. The control queue (credit, refusals, keepalives)
///   holds at most `8 × (accept_backlog + 5 × max_streams)` bytes: reading stops while it is
///   over `accept_backlog + max_streams` frames, which only a peer that does not read our
///   frames can cause. (`tests/core_findings_a.rs`, `close_frames_for_dropped_streams_stop_the_reading_at_the_queue_bound`)
/// - **Waiting tasks**: each waiting future holds at most one entry in a wait queue.
///   (`tests/core_findings_a.rs`, `*_do_not_pile_up_its_waker`, `*_leave_no_registrations_behind`)
///
/// # Choice of defaults
///
/// The defaults suit a Go peer and a busy server: Go's 64 KiB payload limit and initial window;
/// windows that grow to 16 MiB so one stream fills a long fat link; 8192 streams and a backlog of
/// 1024 so bursts of opens are accepted; a 1 MiB write buffer, so that many streams writing at
/// once fill large transport writes; a 30 s keepalive, well under common NAT and proxy idle
/// timeouts. The idle and write-stall timeouts are off, because a Go peer sends a keepalive
/// only every 10 minutes and stops reading the connection while its own accept queue is full:
/// turn them on with values that fit the peer. [`Config::go_peer`] keeps the windows at 64 KiB,
/// which makes a known deadlock of Go peers rarer (see its docs).
/// [`guide::memory_and_defaults`](crate::guide::memory_and_defaults) gives the reason for each
/// default.
#[derive(Debug, Clone)]
pub struct Config {
    /// Shared by every clone, and so by every session made from one `Config` (and every session
    /// made from `Config::default()`): a server holding thousands of sessions holds one copy of
    /// the settings, not one each (`benches/idle_sessions.rs`). A setter copies them first if
    /// they are shared.
    settings: Arc<Settings>,
}

/// The values of a [`Config`], after clamping: what a session reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) max_payload: usize,
    pub(crate) receive_window: u32,
    pub(crate) max_receive_window: u32,
    pub(crate) receive_window_budget: u64,
    pub(crate) keepalive_interval: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) close_timeout: Duration,
    pub(crate) accept_backlog: usize,
    pub(crate) open_backlog: usize,
    pub(crate) max_streams: usize,
    pub(crate) write_buffer_size: usize,
    pub(crate) write_stall_timeout: Option<Duration>,
}

/// How far ahead a deadline of "never" lies: about 30 years, as tokio's own `sleep` caps a
/// `Duration::MAX`.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The instant `after` past `now`, capped at [`FAR_FUTURE`]: a setting of any duration (up to
/// `Duration::MAX`) means "that long, or never", and adding it to an instant must not
/// overflow. Every `Instant + Duration` of a setting goes through here.
/// (`tests/close_core.rs`, `settings_of_duration_max_*`.)
pub(crate) fn deadline_after(now: Instant, after: Duration) -> Instant {
    let after = after.min(FAR_FUTURE);
    // 30 years past any instant a running process can see is representable; should a platform
    // disagree, "now" beats a panic in the driver.
    now.checked_add(after).unwrap_or(now)
}

/// The most live streams a session allows: the search for a free id of this side's parity
/// (2^31 of them) must always find one.
const MAX_STREAMS: usize = 1 << 30;

impl Default for Config {
    fn default() -> Config {
        static DEFAULT: LazyLock<Arc<Settings>> = LazyLock::new(|| Arc::new(Settings::default()));
        Config {
            settings: Arc::clone(&DEFAULT),
        }
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_payload: MAX_PAYLOAD,
            receive_window: INITIAL_WINDOW,
            max_receive_window: 16 * 1024 * 1024,
            receive_window_budget: 64 * 1024 * 1024,
            keepalive_interval: Some(Duration::from_secs(30)),
            idle_timeout: None,
            close_timeout: Duration::from_secs(10),
            accept_backlog: 1024,
            open_backlog: 256,
            max_streams: 8192,
            write_buffer_size: 1024 * 1024,
            write_stall_timeout: None,
        }
    }
}

impl Settings {
    /// The most a stream's window may grow to: never below its starting window.
    pub(crate) fn window_ceiling(&self) -> u32 {
        self.max_receive_window.max(self.receive_window)
    }
}

impl Config {
    /// Settings for a session whose peer is Go gomux: the defaults, except that every stream's
    /// receive window stays at 64 KiB ([`max_receive_window`](Config::max_receive_window) is
    /// 65536), which is also all a Go receiver ever grants.
    ///
    /// A Go writer that holds more credit than its session's write buffer (ten 64 KiB frames)
    /// waits for room in that buffer while holding its stream's lock, and a Go session that
    /// ends meanwhile deadlocks (see [`guide::talking_to_go`](crate::guide::talking_to_go), which
    /// counts how often). With the windows kept at 64 KiB, a Go writer never holds more than one
    /// window per stream. It narrows the deadlock, it does not remove it: with many Go streams
    /// writing at once, their credit together still exceeds the Go write buffer.
    ///
    /// The cost: a stream from the Go peer carries at most 64 KiB per round trip (3.2 MB/s over
    /// a link with a 20 ms round trip). Streams towards the Go peer are unaffected (its own
    /// windows are 64 KiB whatever this side sets). Raising [`receive_window`](Config::receive_window) or
    /// `max_receive_window` afterwards gives the extra credit back.
    ///
    /// ```
    /// let config = gomux::Config::go_peer().max_streams(1024);
    /// assert_eq!(config.max_streams_limit(), 1024);
    /// ```
    pub fn go_peer() -> Config {
        Config::default().max_receive_window(INITIAL_WINDOW)
    }

    /// Largest Data payload sent or accepted, default 65536 (the Go limit; a Go peer fails the
    /// session on anything larger, so raise it only between two peers of this crate). A received
    /// Data frame above it ends the session with
    /// [`ProtocolError::PayloadTooLarge`](crate::ProtocolError::PayloadTooLarge). Clamped to
    /// 1..=16,777,215.
    ///
    /// ```
    /// // Between two peers of this crate only: a Go peer fails the session above 65536.
    /// let config = gomux::Config::default().max_payload(256 * 1024);
    /// assert_eq!(config.max_payload_setting(), 256 * 1024);
    /// assert_eq!(gomux::Config::default().max_payload(0).max_payload_setting(), 1);
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn max_payload(mut self, bytes: usize) -> Config {
        self.edit().max_payload = bytes.clamp(1, MAX_LENGTH_FIELD as usize);
        self
    }

    /// Credit this side keeps granted to the peer on each stream, default 65536 (the protocol's
    /// initial window). A larger value is announced with a WindowUpdate when the stream opens
    /// (legal, and understood by Go peers) and lets one stream carry more per round trip. It is
    /// also the most a stream buffers for a reader that never reads (a window that has grown,
    /// see [`max_receive_window`](Config::max_receive_window), holds up to its new size).
    /// Clamped to 65536..=16,777,215.
    ///
    /// ```
    /// // Each stream may carry 1 MiB per round trip from the start, and may buffer as much.
    /// let config = gomux::Config::default().receive_window(1024 * 1024);
    /// assert_eq!(config.receive_window_setting(), 1024 * 1024);
    /// // Never below the protocol's initial window.
    /// assert_eq!(gomux::Config::default().receive_window(1).receive_window_setting(), 65536);
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn receive_window(mut self, bytes: u32) -> Config {
        self.edit().receive_window = bytes.clamp(INITIAL_WINDOW, MAX_LENGTH_FIELD);
        self
    }

    /// The most a stream's receive window grows to, default 16 MiB. A stream that receives half
    /// its window within one measured round trip while its application keeps the buffer nearly
    /// empty (so the window, not the reader or the sender, limits it) gets its window doubled, up to this and within
    /// [`receive_window_budget`](Config::receive_window_budget). A window of 64 KiB carries at
    /// most 64 KiB per round trip: 3.2 MB/s at 20 ms. Set it to `receive_window` to keep windows
    /// fixed. Clamped to 65536..=16,777,215 (the largest credit one WindowUpdate carries), and
    /// never below `receive_window`.
    ///
    /// ```
    /// // Windows fixed at the initial 64 KiB: at most 64 KiB buffered per unread stream.
    /// let fixed = gomux::Config::default().max_receive_window(65536);
    /// assert_eq!(fixed.max_receive_window_setting(), 65536);
    /// // Never below `receive_window`.
    /// let config = gomux::Config::default().receive_window(1 << 20).max_receive_window(65536);
    /// assert_eq!(config.max_receive_window_setting(), 1 << 20);
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn max_receive_window(mut self, bytes: u32) -> Config {
        self.edit().max_receive_window = bytes.clamp(INITIAL_WINDOW, MAX_LENGTH_FIELD);
        self
    }

    /// What all of a session's streams together may add to their windows by growing, default
    /// 64 MiB. It bounds the extra data a peer can make the session buffer; a stream gives its
    /// share back when it closes.
    ///
    /// ```
    /// // Growth of all windows together bounded at 8 MiB: with 1000 streams of 64 KiB, the
    /// // session buffers at most 1000 × 64 KiB + 8 MiB for readers that do not read.
    /// let config = gomux::Config::default()
    ///     .max_streams(1000)
    ///     .receive_window_budget(8 * 1024 * 1024);
    /// assert_eq!(config.receive_window_budget_setting(), 8 * 1024 * 1024);
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn receive_window_budget(mut self, bytes: u64) -> Config {
        self.edit().receive_window_budget = bytes;
        self
    }

    /// Send a Keepalive frame after this long without writing anything, default 30 s; `None`
    /// never sends one. Keeps a peer's idle timeout (and NAT state) from expiring. Counted in
    /// whole milliseconds (rounded up), at most 2^30 ms (about 12.4 days): a longer interval
    /// is cut to that.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let config = gomux::Config::default().keepalive_interval(Some(Duration::from_secs(10)));
    /// assert_eq!(config.keepalive_interval_setting(), Some(Duration::from_secs(10)));
    /// let silent = gomux::Config::default().keepalive_interval(None); // a peer of this crate then
    /// assert_eq!(silent.keepalive_interval_setting(), None); // cannot tell silence from death
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn keepalive_interval(mut self, interval: Option<Duration>) -> Config {
        self.edit().keepalive_interval = interval.filter(|d| !d.is_zero());
        self
    }

    /// End the session with [`Error::IdleTimeout`](crate::Error::IdleTimeout) when nothing at
    /// all is received for this long. Default `None` (off), because a Go peer sends a keepalive
    /// only every 10 minutes (600 s): set it above the peer's keepalive interval, above 600 s
    /// for a Go peer. Counted in whole milliseconds (rounded up),
    /// at most 2^30 ms (about 12.4 days): a longer timeout is cut to that.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// // Towards a Go peer, whose keepalives come every 600 s: above that.
    /// let config = gomux::Config::go_peer().idle_timeout(Some(Duration::from_secs(630)));
    /// assert_eq!(config.idle_timeout_setting(), Some(Duration::from_secs(630)));
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Config {
        self.edit().idle_timeout = timeout.filter(|d| !d.is_zero());
        self
    }

    /// How long an ending session keeps trying to flush what is queued (and its CloseMux) into a
    /// transport that does not accept writes before it gives up, default 10 s. After a close
    /// this side started, it is also how long the session waits for the peer to close in turn
    /// (see [`Session::close`](crate::Session::close)).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let config = gomux::Config::default().close_timeout(Duration::from_secs(2));
    /// assert_eq!(config.close_timeout_setting(), Duration::from_secs(2));
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn close_timeout(mut self, timeout: Duration) -> Config {
        self.edit().close_timeout = timeout;
        self
    }

    /// Inbound streams queued for [`Session::accept`](crate::Session::accept), default 1024. A
    /// stream that arrives while the queue is full is refused with CloseStream (the opener reads
    /// end-of-stream and its writes fail); the session keeps reading. A peer that opens streams in
    /// bursts larger than this, faster than the application accepts, needs a larger backlog.
    /// Queued streams count towards `max_streams`. At least 1.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// let client = gomux::Session::client(a);
    /// let config = gomux::Config::default().accept_backlog(2);
    /// let server = gomux::Session::with_config(b, gomux::Role::Server, config);
    /// let _queued = [client.open().await?, client.open().await?];
    /// let third = client.open().await?; // the server's backlog is full: refused
    /// assert_eq!(third.stopped().await?, gomux::stream::Stopped::Refused);
    /// assert_eq!(server.stream_count(), 2);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn accept_backlog(mut self, streams: usize) -> Config {
        self.edit().accept_backlog = streams.max(1);
        self
    }

    /// Streams of ours that a peer of this crate has not acknowledged yet, default 256: beyond
    /// it, [`Session::open`](crate::Session::open) waits (in order of arrival, cancel-safe)
    /// until the peer's application accepts one of them, or refuses or closes it. A peer of this
    /// crate acknowledges each stream its application accepts, so a burst of opens never
    /// overruns its accept backlog (1024 by default, well above this): a refusal then means
    /// the peer is closing, at its `max_streams`, or slow to accept for longer than this
    /// backlog covers. Towards a Go peer, which acknowledges nothing, nothing waits; until the
    /// peer's first frame shows which it is, opens beyond the backlog wait for it at most one
    /// second from the session's start. It bounds the streams of ours queued at the peer.
    /// A stream closed or dropped before its answer keeps its place (a record of its id, not
    /// the stream) until the peer accepts or refuses it, so write-and-drop cannot overrun the
    /// peer either. Clamped to 1..=2^30.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// let config = gomux::Config::default().open_backlog(1);
    /// let client = gomux::Session::with_config(a, gomux::Role::Client, config);
    /// let server = gomux::Session::server(b);
    /// let _first = client.open().await?;
    /// // One stream unacknowledged: a second open waits (`try_open` says so at once) ...
    /// assert!(matches!(client.try_open(), Err(gomux::Error::TooManyStreams)));
    /// // ... until the server's application accepts the first.
    /// let _accepted = server.accept().await?;
    /// let _second = client.open().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn open_backlog(mut self, streams: usize) -> Config {
        self.edit().open_backlog = streams.clamp(1, MAX_STREAMS);
        self
    }

    /// Live streams per session, both directions together, default 8192.
    /// [`Session::open`](crate::Session::open) waits while there are as many (in the same line
    /// as for [`open_backlog`](Config::open_backlog)), [`Session::try_open`](crate::Session::try_open)
    /// fails with [`Error::TooManyStreams`](crate::Error::TooManyStreams); a peer's open
    /// beyond it is refused with CloseStream. With the receive window this bounds the data a
    /// session buffers (8192 × 64 KiB = 512 MiB at the defaults, plus the 64 MiB
    /// window-growth budget, reached only if no stream is read). Clamped to 1..=2^30.
    ///
    /// ```
    /// // At most 100 streams of 64 KiB unread, plus a 4 MiB growth budget: about 10 MiB.
    /// let config = gomux::Config::default()
    ///     .max_streams(100)
    ///     .receive_window_budget(4 * 1024 * 1024);
    /// assert_eq!(config.max_streams_setting(), 100);
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn max_streams(mut self, streams: usize) -> Config {
        self.edit().max_streams = streams.clamp(1, MAX_STREAMS);
        self
    }

    /// Outgoing bytes queued for the transport before writers wait, default 1 MiB, in all
    /// streams' send queues together. Each stream queues its frames in its own queue, and the
    /// driver builds each transport write by taking turns between the streams with something
    /// to send (a few KiB each, highest [priority](crate::Stream::set_priority) first), so a
    /// message never waits behind what other streams queued before it: at most behind one turn
    /// of each and the batch being written, whose size follows what the transport takes (up to
    /// this size on a fast link). Writers (and openers) waiting for room are let in oldest
    /// first, as many as the room fits. A larger buffer lets many streams writing at once fill
    /// larger transport writes (BENCHMARK-HISTORY.md compares sizes). Control frames
    /// (window updates, refusals, keepalives) are not held back by it: they have a queue of
    /// their own, written ahead of the data at the start of every batch.
    ///
    /// ```
    /// // A server holding many connections: 128 KiB queued per session at most.
    /// let config = gomux::Config::default().write_buffer_size(128 * 1024);
    /// assert_eq!(config.write_buffer_size_setting(), 128 * 1024);
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn write_buffer_size(mut self, bytes: usize) -> Config {
        self.edit().write_buffer_size = bytes.max(1);
        self
    }

    /// End the session with [`Error::WriteStalled`](crate::Error::WriteStalled) when bytes wait
    /// for the transport and it takes none of them for this long: a peer that keeps the
    /// connection open but stops reading would otherwise leave every writer waiting for ever.
    /// Default `None` (off), because a Go peer stops reading while its accept queue is full,
    /// which a slow application on its side can make last; set it above the longest pause the
    /// peer may take (a minute, say). A slow link is no stall: any progress restarts the clock.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let config = gomux::Config::default().write_stall_timeout(Some(Duration::from_secs(60)));
    /// assert_eq!(config.write_stall_timeout_setting(), Some(Duration::from_secs(60)));
    /// ```
    #[must_use = "a setter returns the changed configuration"]
    pub fn write_stall_timeout(mut self, timeout: Option<Duration>) -> Config {
        self.edit().write_stall_timeout = timeout.filter(|d| !d.is_zero());
        self
    }

    /// The settings, for a session to keep: shared with this `Config` and its clones.
    pub(crate) fn settings(&self) -> Arc<Settings> {
        Arc::clone(&self.settings)
    }

    /// The settings to change, copied first if another `Config` or a session shares them.
    fn edit(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.settings)
    }

    /// The configured maximum of live streams (the same as
    /// [`max_streams_setting`](Config::max_streams_setting)).
    pub fn max_streams_limit(&self) -> usize {
        self.settings.max_streams
    }

    // Getters, one per setter, named `<setter>_setting` (the setters take the plain names):
    // what a session built from this configuration uses, after clamping.

    /// The [`max_payload`](Config::max_payload) setting, in bytes.
    pub fn max_payload_setting(&self) -> usize {
        self.settings.max_payload
    }

    /// The [`receive_window`](Config::receive_window) setting, in bytes.
    pub fn receive_window_setting(&self) -> u32 {
        self.settings.receive_window
    }

    /// The [`max_receive_window`](Config::max_receive_window) setting, in bytes, as it applies:
    /// never below [`receive_window`](Config::receive_window).
    pub fn max_receive_window_setting(&self) -> u32 {
        self.settings.window_ceiling()
    }

    /// The [`receive_window_budget`](Config::receive_window_budget) setting, in bytes.
    pub fn receive_window_budget_setting(&self) -> u64 {
        self.settings.receive_window_budget
    }

    /// The [`keepalive_interval`](Config::keepalive_interval) setting; `None` when off.
    pub fn keepalive_interval_setting(&self) -> Option<Duration> {
        self.settings.keepalive_interval
    }

    /// The [`idle_timeout`](Config::idle_timeout) setting; `None` when off.
    pub fn idle_timeout_setting(&self) -> Option<Duration> {
        self.settings.idle_timeout
    }

    /// The [`close_timeout`](Config::close_timeout) setting.
    pub fn close_timeout_setting(&self) -> Duration {
        self.settings.close_timeout
    }

    /// The [`accept_backlog`](Config::accept_backlog) setting, in streams.
    pub fn accept_backlog_setting(&self) -> usize {
        self.settings.accept_backlog
    }

    /// The [`max_streams`](Config::max_streams) setting, in streams.
    pub fn max_streams_setting(&self) -> usize {
        self.settings.max_streams
    }

    /// The [`write_buffer_size`](Config::write_buffer_size) setting, in bytes.
    pub fn write_buffer_size_setting(&self) -> usize {
        self.settings.write_buffer_size
    }

    /// The [`write_stall_timeout`](Config::write_stall_timeout) setting; `None` when off.
    pub fn write_stall_timeout_setting(&self) -> Option<Duration> {
        self.settings.write_stall_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every getter reads back what its setter stored, after the same clamping.
    #[test]
    fn every_setting_reads_back_through_its_getter() {
        let second = Duration::from_secs(1);
        let config = Config::default()
            .max_payload(0)
            .receive_window(1 << 20)
            .max_receive_window(1)
            .receive_window_budget(7)
            .keepalive_interval(Some(2 * second))
            .idle_timeout(Some(Duration::ZERO))
            .close_timeout(3 * second)
            .accept_backlog(0)
            .max_streams(5)
            .write_buffer_size(0)
            .write_stall_timeout(Some(4 * second));
        assert_eq!(config.max_payload_setting(), 1);
        assert_eq!(config.receive_window_setting(), 1 << 20);
        assert_eq!(config.max_receive_window_setting(), 1 << 20);
        assert_eq!(config.receive_window_budget_setting(), 7);
        assert_eq!(config.keepalive_interval_setting(), Some(2 * second));
        assert_eq!(config.idle_timeout_setting(), None);
        assert_eq!(config.close_timeout_setting(), 3 * second);
        assert_eq!(config.accept_backlog_setting(), 1);
        assert_eq!(config.max_streams_setting(), 5);
        assert_eq!(config.write_buffer_size_setting(), 1);
        assert_eq!(config.write_stall_timeout_setting(), Some(4 * second));
    }

    /// The setters clamp what their docs say they clamp. `max_streams` must stay
    /// below the 2^31 ids of one parity, or the search for a free id could loop for ever.
    #[test]
    fn setters_clamp_to_their_documented_ranges() {
        let config = Config::default()
            .max_receive_window(u32::MAX)
            .max_streams(usize::MAX)
            .receive_window(1);
        assert_eq!(config.settings.max_receive_window, MAX_LENGTH_FIELD);
        assert_eq!(config.settings.max_streams, 1 << 30);
        assert_eq!(config.settings.receive_window, INITIAL_WINDOW);
        let small = Config::default()
            .receive_window(1 << 20)
            .max_receive_window(1);
        assert_eq!(
            small.settings.window_ceiling(),
            1 << 20,
            "never below receive_window"
        );
        assert_eq!(Config::default().max_streams(0).settings.max_streams, 1);
        assert_eq!(
            Config::default()
                .write_stall_timeout(Some(Duration::ZERO))
                .settings
                .write_stall_timeout,
            None
        );
    }

    /// Sessions made from clones of one `Config`, or from `Config::default()`, share one copy
    /// of the settings; a setter on a clone changes that clone only.
    #[test]
    fn clones_share_their_settings_until_one_is_changed() {
        assert!(Arc::ptr_eq(
            &Config::default().settings,
            &Config::default().settings
        ));
        let base = Config::default().max_streams(7);
        let copy = base.clone();
        assert!(Arc::ptr_eq(&base.settings(), &copy.settings()));
        let changed = copy.max_streams(9);
        assert_eq!(base.max_streams_setting(), 7);
        assert_eq!(changed.max_streams_setting(), 9);
        assert!(!Arc::ptr_eq(&base.settings, &changed.settings));
    }

    /// The Go preset keeps every window at the protocol's 64 KiB and changes nothing else.
    #[test]
    fn go_peer_keeps_windows_at_64_kib_and_the_rest_at_the_defaults() {
        let go = Config::go_peer();
        assert_eq!(
            go.settings.window_ceiling(),
            INITIAL_WINDOW,
            "windows never grow"
        );
        assert_eq!(go.settings.receive_window, INITIAL_WINDOW);
        assert_eq!(go.settings.max_payload, MAX_PAYLOAD, "Go's payload limit");
        // Everything but the window ceiling is the default, field by field.
        let default = Config::default();
        let same = Settings {
            max_receive_window: default.settings.max_receive_window,
            ..Settings::clone(&go.settings)
        };
        assert_eq!(format!("{same:?}"), format!("{:?}", default.settings));
        // Raising the starting window later raises the ceiling with it, as documented.
        assert_eq!(
            go.receive_window(1 << 20).settings.window_ceiling(),
            1 << 20
        );
    }
}
