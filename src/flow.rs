//! Credit (flow-control) arithmetic for one stream, pure and lock-free.
//!
//! The protocol gives each direction of a stream [`INITIAL_WINDOW`] bytes of credit. A sender
//! spends credit with Data frames and the receiver returns it with WindowUpdate frames. The Go
//! sender waits until a whole chunk (up to 64 KiB) fits in its credit, so a receiver must return
//! what was consumed as soon as the credit the sender holds falls below one such chunk, or the Go
//! sender waits (for good, if the reader has nothing left to read).
//!
//! A fixed window caps a stream at one window per round trip. [`Tuner`] notices when that cap is
//! what limits a stream and lets the session grow its window, see there.

use crate::frame::{INITIAL_WINDOW, MAX_LENGTH_FIELD, MAX_PAYLOAD};

/// The largest chunk a Go sender waits to have credit for.
const ONE_PAYLOAD: u32 = MAX_PAYLOAD as u32;

/// The receive side: how much the peer may still send, and how much this side owes back.
///
/// Invariant: `granted + buffered + owed == target`, where `buffered` is what the stream holds
/// for the application. That is what bounds a stream's receive buffer to `target` bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvWindow {
    /// Credit the peer holds and has not spent yet.
    granted: u32,
    /// Bytes the application consumed (or, at the start, window above the protocol's initial
    /// one) not yet returned to the peer.
    owed: u32,
    /// The window this side keeps granted.
    target: u32,
}

impl RecvWindow {
    /// A window that keeps `target` bytes granted; the part above the protocol's initial window
    /// is owed from the start, so the first WindowUpdate announces it.
    pub(crate) fn new(target: u32) -> RecvWindow {
        let target = target.clamp(INITIAL_WINDOW, MAX_LENGTH_FIELD);
        RecvWindow {
            granted: INITIAL_WINDOW,
            owed: target - INITIAL_WINDOW,
            target,
        }
    }

    /// Accounts for a received Data frame of `len` bytes. Fails with the credit the peer had when
    /// the frame exceeds it.
    pub(crate) fn receive(&mut self, len: u32) -> Result<(), u32> {
        match self.granted.checked_sub(len) {
            Some(left) => {
                self.granted = left;
                Ok(())
            }
            None => Err(self.granted),
        }
    }

    /// Accounts for `len` bytes the application consumed (or discarded).
    pub(crate) fn consume(&mut self, len: u32) {
        self.owed = self.owed.saturating_add(len);
    }

    /// Whether a WindowUpdate is due: something is owed, and either half the window is owed (so
    /// the sender never runs dry while the reader keeps up) or the peer holds less credit than
    /// one maximal payload and what is owed makes it whole (so a Go sender, which waits for
    /// credit for a whole chunk, goes on at once; the stream's buffer is then nearly or wholly
    /// empty). Otherwise the credit waits: a reader that drains a large window promptly costs a
    /// WindowUpdate, and a wake-up of the driver, per half window rather than per read.
    pub(crate) fn update_due(&self) -> bool {
        self.owed > 0
            && (self.owed >= self.target / 2
                || (self.granted < ONE_PAYLOAD && self.granted + self.owed >= ONE_PAYLOAD))
    }

    /// Takes the credit to announce in one WindowUpdate (at most the 24-bit field), counting it
    /// as granted.
    pub(crate) fn take_update(&mut self) -> Option<u32> {
        let credit = self.owed.min(MAX_LENGTH_FIELD);
        if credit == 0 {
            return None;
        }
        self.owed -= credit;
        self.granted = self.granted.saturating_add(credit);
        Some(credit)
    }

    /// Whether credit is still owed after [`take_update`](Self::take_update).
    pub(crate) fn owes(&self) -> bool {
        self.owed > 0
    }

    /// Credit the peer holds and has not spent. Zero means it has nothing in flight: whatever it
    /// sends next, it sends after our next WindowUpdate reached it.
    pub(crate) fn peer_credit(&self) -> u32 {
        self.granted
    }

    /// The window this side keeps granted.
    pub(crate) fn target(&self) -> u32 {
        self.target
    }

    /// Widens the window by `extra` bytes, owed to the peer until the next WindowUpdate.
    pub(crate) fn grow(&mut self, extra: u32) {
        self.target += extra;
        self.owed += extra;
    }
}

/// Receive-window auto-tuning for one stream.
///
/// A window is too small when it, rather than the link, the sender or the reader, limits the
/// stream: the sender then sends a window's worth in a burst and waits a round trip for credit.
/// The rule (a stricter form of the one QUIC and HTTP/2 stacks use): when half a window arrives
/// within one round trip into a buffer the application keeps nearly empty (a quarter of the
/// window at most), *and* the application drains the buffer to that again within one round
/// trip, double the window. A stream limited by its link receives half
/// a window more slowly once the window covers two round trips; a stream whose sender has
/// little to send receives slowly; a stream whose reader is slow is not drained in time: all
/// three keep their window. Arrival alone is not enough: a Go sender sends a whole 64 KiB frame
/// into an empty buffer as soon as it has the credit, which would make every slow reader look
/// window-limited (`tests/core_findings_b.rs`, `a_slow_reader_*`). The bar is one round trip,
/// not two: over loopback the socket buffers deliver queued data in bursts far faster than the
/// steady rate, which a longer bar takes for a window limit, while one round trip still reaches
/// twice the bandwidth-delay product on a real link.
///
/// The protocol has no ping, so the round trip is measured on the streams themselves: when this
/// side writes credit to a peer that holds `c` bytes of credit, the peer can send at most `c`
/// bytes before it has seen the new credit, so the first data beyond those `c` bytes is the
/// answer. The session keeps the smallest such sample. A probe does not wait for a peer with no
/// credit at all: a sender whose frames are cut into turns smaller than a payload always holds
/// some when credit goes back, and such a probe would measure nothing
/// (`tests/core_findings_b.rs`, `eight_tuned_streams_on_one_long_fat_link_get_similar_shares`).
/// The probe starts when the WindowUpdate goes to the transport, not when it is queued,
/// so the sample holds no queueing on this side. Times are microseconds on the session's clock,
/// 0 meaning "not set".
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tuner {
    /// When credit was written to the peer, while a probe runs…
    probe_at: u64,
    /// …and the data it may still receive sent before it saw that credit.
    probe_left: u32,
    /// When the current measurement of arrivals began, and what arrived since; or, with
    /// `epoch_received` at [`LIMITED`], when half a window last arrived within a round trip
    /// (the window grows if the reader drains the buffer within a round trip of this; arrivals
    /// are not measured meanwhile).
    epoch_at: u64,
    epoch_received: u32,
}

/// `Tuner::epoch_received` while the tuner waits to see the reader drain a burst.
const LIMITED: u32 = u32::MAX;

impl Tuner {
    /// Credit is being written to a peer that holds `peer_credit`: start a round-trip probe
    /// unless one runs.
    pub(crate) fn on_credit(&mut self, peer_credit: u32, now: u64) {
        if self.probe_at == 0 {
            self.probe_at = now;
            self.probe_left = peer_credit;
        }
    }

    /// `n` bytes of data arrived on a stream whose window is `target` and whose buffer held
    /// `buffered` bytes before them; `rtt` is the session's round-trip estimate. Returns the
    /// round trip this frame completes, if a probe was running.
    pub(crate) fn on_data(
        &mut self,
        n: u32,
        buffered: u32,
        target: u32,
        rtt: Option<u64>,
        now: u64,
    ) -> Option<u64> {
        let mut sample = None;
        if self.probe_at != 0 {
            if n > self.probe_left {
                sample = Some(now.saturating_sub(self.probe_at));
                self.probe_at = 0;
            } else {
                self.probe_left -= n;
            }
        }
        if self.epoch_received == LIMITED {
            let waiting = rtt.is_some_and(|rtt| now.saturating_sub(self.epoch_at) < rtt);
            if waiting {
                return sample;
            }
            self.epoch_at = 0;
        }
        if self.epoch_at == 0 {
            self.epoch_at = now;
            self.epoch_received = 0;
        }
        self.epoch_received = self.epoch_received.saturating_add(n);
        if self.epoch_received >= target / 2 {
            let elapsed = now.saturating_sub(self.epoch_at);
            // The next epoch starts with the next frame.
            self.epoch_at = 0;
            self.epoch_received = 0;
            // Without the reader keeping up at arrival, loopback windows grew larger and one
            // stream ran at 0.53–0.63 of the rate: the larger batches that came with them ran
            // out of cache (BENCHMARK-HISTORY.md, "Session core v2").
            if buffered <= target / 4 && rtt.or(sample).is_some_and(|rtt| elapsed < rtt) {
                self.epoch_at = now;
                self.epoch_received = LIMITED;
            }
        }
        sample
    }

    /// The application read, leaving the buffer `low` (at most a quarter of the window) or not.
    /// True when that completes the rule: the window should grow. `now` is asked for only
    /// while the rule is under way (most reads are not: see `session::now`).
    pub(crate) fn on_read(
        &mut self,
        low: bool,
        rtt: Option<u64>,
        now: impl FnOnce() -> u64,
    ) -> bool {
        if self.epoch_received != LIMITED {
            return false;
        }
        let now = now();
        let in_time = rtt.is_some_and(|rtt| now.saturating_sub(self.epoch_at) < rtt);
        if !in_time || low {
            self.epoch_at = 0;
            self.epoch_received = 0;
        }
        in_time && low
    }
}

/// Adds a peer's WindowUpdate to the send credit. `None` when the sum would pass `u32::MAX`,
/// which the policy treats as a protocol error (the Go sender would silently wrap).
pub(crate) fn add_send_credit(credit: u32, increment: u32) -> Option<u32> {
    credit.checked_add(increment)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_beyond_the_granted_credit_is_refused() {
        let mut window = RecvWindow::new(INITIAL_WINDOW);
        assert_eq!(window.receive(60_000), Ok(()));
        assert_eq!(window.receive(5_537), Err(5_536));
        assert_eq!(window.receive(5_536), Ok(()));
        assert_eq!(window.receive(1), Err(0));
    }

    #[test]
    fn consumed_credit_is_returned_once_the_peer_cannot_send_a_whole_payload() {
        let mut window = RecvWindow::new(4 * INITIAL_WINDOW);
        assert_eq!(window.take_update(), Some(3 * INITIAL_WINDOW));
        window.receive(1000).expect("within credit");
        window.consume(1000);
        assert!(
            !window.update_due(),
            "the peer still holds more than a payload's credit"
        );
        window
            .receive(3 * INITIAL_WINDOW - 999)
            .expect("within credit");
        assert_eq!(window.peer_credit(), INITIAL_WINDOW - 1);
        window.consume(10);
        assert!(
            window.update_due(),
            "the peer holds less than a payload: what was read goes back"
        );
        assert_eq!(window.take_update(), Some(1010));
        assert_eq!(window.take_update(), None);
        assert!(!window.update_due());
    }

    #[test]
    fn the_initial_window_is_returned_once_the_buffer_is_empty() {
        // One payload is the whole window: the peer can send a whole chunk again only once
        // nothing is buffered, and small reads with data left send nothing.
        let mut window = RecvWindow::new(INITIAL_WINDOW);
        window.receive(1000).expect("within credit");
        window.consume(10);
        assert!(!window.update_due(), "small reads with data left wait");
        window.consume(990);
        assert!(window.update_due(), "an empty buffer returns everything");
        assert_eq!(window.take_update(), Some(1000));
        assert_eq!(window.take_update(), None);
        // Every byte is back: the peer may send a full window again.
        assert_eq!(window.receive(INITIAL_WINDOW), Ok(()));
    }

    #[test]
    fn half_a_window_owed_is_returned_even_with_credit_left() {
        let mut window = RecvWindow::new(8 * INITIAL_WINDOW);
        assert_eq!(window.take_update(), Some(7 * INITIAL_WINDOW));
        window.receive(4 * INITIAL_WINDOW).expect("within credit");
        window.consume(4 * INITIAL_WINDOW - 1);
        assert!(!window.update_due(), "less than half owed, credit left");
        window.consume(1);
        assert!(window.update_due(), "half the window owed");
    }

    #[test]
    fn a_larger_window_is_announced_up_front() {
        let mut window = RecvWindow::new(1 << 20);
        assert!(window.update_due());
        assert_eq!(window.take_update(), Some((1 << 20) - INITIAL_WINDOW));
        assert_eq!(window.receive(1 << 20), Ok(()));
        assert_eq!(window.receive(1), Err(0));
    }

    #[test]
    fn a_grown_window_is_owed_to_the_peer() {
        let mut window = RecvWindow::new(INITIAL_WINDOW);
        window.receive(INITIAL_WINDOW).expect("within credit");
        assert_eq!(window.peer_credit(), 0);
        window.grow(INITIAL_WINDOW);
        assert_eq!(window.target(), 2 * INITIAL_WINDOW);
        window.consume(INITIAL_WINDOW);
        assert_eq!(window.take_update(), Some(2 * INITIAL_WINDOW));
        assert_eq!(window.receive(2 * INITIAL_WINDOW), Ok(()));
        assert_eq!(window.receive(1), Err(0));
    }

    #[test]
    fn a_round_trip_is_measured_from_credit_to_the_first_data_beyond_what_the_peer_held() {
        let mut tuner = Tuner::default();
        let target = 1 << 20;
        assert_eq!(tuner.on_data(10, 0, target, None, 5), None, "no probe runs");
        tuner.on_credit(100, 10);
        tuner.on_credit(0, 15);
        assert_eq!(
            tuner.on_data(60, 0, target, None, 20),
            None,
            "the peer held 100: these may have left before it saw the credit"
        );
        assert_eq!(
            tuner.on_data(40, 0, target, None, 25),
            None,
            "still within the 100"
        );
        assert_eq!(
            tuner.on_data(1, 0, target, None, 80),
            Some(70),
            "the first byte beyond them answers the first grant"
        );
        assert_eq!(
            tuner.on_data(10, 0, target, None, 90),
            None,
            "one sample per probe"
        );
        tuner.on_credit(0, 100);
        assert_eq!(
            tuner.on_data(10, 0, target, None, 140),
            Some(40),
            "a peer that held none"
        );
    }

    #[test]
    fn half_a_window_within_one_round_trip_drained_at_once_means_the_window_limits() {
        let mut tuner = Tuner::default();
        let target = INITIAL_WINDOW;
        let rtt = Some(20);
        // Half the window in 15 µs, round trip 20 µs, and the reader drains it at once.
        tuner.on_data(16_384, 0, target, rtt, 1);
        assert!(!tuner.on_read(true, rtt, || 2), "not half a window yet");
        tuner.on_data(16_384, 0, target, rtt, 16);
        assert!(tuner.on_read(true, rtt, || 17));
        assert!(!tuner.on_read(true, rtt, || 18), "once per burst");
        // Half the window in 30 µs: the link or the sender limits, not the window.
        tuner.on_data(16_384, 0, target, rtt, 100);
        tuner.on_data(16_384, 0, target, rtt, 130);
        assert!(!tuner.on_read(true, rtt, || 131));
        // No round trip measured yet: never.
        let mut unmeasured = Tuner::default();
        unmeasured.on_data(65_536, 0, target, None, 1);
        assert!(!unmeasured.on_read(true, None, || 2));
    }

    #[test]
    fn a_burst_the_reader_drains_slowly_leaves_the_window_alone() {
        let mut tuner = Tuner::default();
        let target = INITIAL_WINDOW;
        let rtt = Some(20);
        // A Go sender's whole window in one frame, into an empty buffer...
        tuner.on_data(65_536, 0, target, rtt, 100);
        // ...read a little at a time: the buffer is not low within the round trip.
        assert!(!tuner.on_read(false, rtt, || 110));
        assert!(!tuner.on_read(false, rtt, || 119));
        assert!(!tuner.on_read(true, rtt, || 125), "drained, but too late");
        assert!(!tuner.on_read(true, rtt, || 126));
    }

    #[test]
    fn a_reader_that_drains_a_burst_in_two_reads_within_the_round_trip_grows_the_window() {
        let mut tuner = Tuner::default();
        let target = INITIAL_WINDOW;
        let rtt = Some(20);
        // Half the window in one frame into an empty buffer...
        tuner.on_data(target / 2, 0, target, rtt, 100);
        // ...read in part, then the rest, both within the round trip.
        assert!(
            !tuner.on_read(false, rtt, || 105),
            "part of the burst is read"
        );
        assert!(
            tuner.on_read(true, rtt, || 110),
            "the rest, within the round trip"
        );
    }

    #[test]
    fn a_burst_counts_only_into_a_buffer_at_most_a_quarter_full() {
        let target = INITIAL_WINDOW;
        let rtt = Some(20);
        for (buffered, grows) in [(target / 4, true), (target / 4 + 1, false)] {
            let mut tuner = Tuner::default();
            tuner.on_data(target / 2, buffered, target, rtt, 100);
            assert_eq!(
                tuner.on_read(true, rtt, || 101),
                grows,
                "{buffered} bytes buffered when the burst arrived"
            );
        }
    }

    #[test]
    fn credit_is_owed_until_taken() {
        let mut window = RecvWindow::new(INITIAL_WINDOW);
        assert!(!window.owes(), "the initial window is the peer's already");
        window.receive(100).expect("within credit");
        window.consume(100);
        assert!(window.owes());
        assert_eq!(window.take_update(), Some(100));
        assert!(!window.owes());
    }

    #[test]
    fn a_peer_holding_exactly_one_payload_of_credit_gets_nothing_early() {
        let mut window = RecvWindow::new(4 * INITIAL_WINDOW);
        assert_eq!(window.take_update(), Some(3 * INITIAL_WINDOW));
        window.receive(3 * INITIAL_WINDOW).expect("within credit");
        assert_eq!(window.peer_credit(), ONE_PAYLOAD);
        window.consume(1);
        assert!(
            !window.update_due(),
            "the peer can still send a whole payload"
        );
        window.receive(1).expect("within credit");
        assert!(window.update_due(), "now it cannot, and what is owed helps");
    }

    #[test]
    fn a_burst_over_exactly_one_round_trip_does_not_count() {
        let mut tuner = Tuner::default();
        let target = INITIAL_WINDOW;
        let rtt = Some(20);
        tuner.on_data(target / 4, 0, target, rtt, 100);
        tuner.on_data(target / 4, 0, target, rtt, 120);
        assert!(!tuner.on_read(true, rtt, || 121));
    }

    #[test]
    fn a_drain_exactly_one_round_trip_after_the_burst_is_too_late() {
        let mut tuner = Tuner::default();
        let target = INITIAL_WINDOW;
        let rtt = Some(20);
        tuner.on_data(target / 2, 0, target, rtt, 100);
        assert!(!tuner.on_read(true, rtt, || 120));
    }

    #[test]
    fn data_within_the_round_trip_after_a_burst_waits_for_the_drain() {
        let target = INITIAL_WINDOW;
        let rtt = Some(20);
        // More data while the tuner waits for the reader leaves the burst standing...
        let mut tuner = Tuner::default();
        tuner.on_data(target / 2, 0, target, rtt, 100);
        tuner.on_data(1000, 0, target, rtt, 110);
        assert!(
            tuner.on_read(true, rtt, || 115),
            "the burst of 100 still counts"
        );
        // ...and data a whole round trip later starts a new measurement: a new burst counts
        // from its own start.
        let mut tuner = Tuner::default();
        tuner.on_data(target / 2, 0, target, rtt, 100);
        tuner.on_data(target / 2, 0, target, rtt, 120);
        assert!(tuner.on_read(true, rtt, || 125), "the burst of 120 counts");
    }

    #[test]
    fn send_credit_overflow_is_detected() {
        assert_eq!(add_send_credit(10, 5), Some(15));
        assert_eq!(add_send_credit(u32::MAX - 1, 1), Some(u32::MAX));
        assert_eq!(add_send_credit(u32::MAX, 1), None);
    }
}
