//! Credit (flow-control) arithmetic for one stream, pure and lock-free.
//!
//! The protocol gives each direction of a stream [`INITIAL_WINDOW`] bytes of credit. A sender
//! spends credit with Data frames and the receiver returns it with WindowUpdate frames. The Go
//! sender waits until a whole chunk (up to 64 KiB) fits in its credit, so a receiver must return
//! every consumed byte once its buffer is empty, or the Go sender stalls for good.

use crate::frame::{INITIAL_WINDOW, MAX_LENGTH_FIELD};

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

    /// Whether a WindowUpdate is due: something is owed and either the stream's buffer is empty
    /// (so a Go sender waiting for a whole chunk can go on) or half the window is owed (so a fast
    /// reader keeps the sender busy without a frame per read).
    pub(crate) fn update_due(&self, buffer_empty: bool) -> bool {
        self.owed > 0 && (buffer_empty || self.owed >= self.target / 2)
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
    fn consumed_credit_is_returned_once_the_buffer_is_empty() {
        let mut window = RecvWindow::new(INITIAL_WINDOW);
        window.receive(1000).expect("within credit");
        window.consume(10);
        assert!(!window.update_due(false), "small reads with data left wait");
        assert!(
            window.update_due(true),
            "an empty buffer returns everything"
        );
        assert_eq!(window.take_update(), Some(10));
        assert_eq!(window.take_update(), None);
        window.consume(990);
        assert!(window.update_due(true));
        assert_eq!(window.take_update(), Some(990));
        // Every byte is back: the peer may send a full window again.
        assert_eq!(window.receive(INITIAL_WINDOW), Ok(()));
    }

    #[test]
    fn half_a_window_owed_is_returned_even_with_data_buffered() {
        let mut window = RecvWindow::new(INITIAL_WINDOW);
        window.receive(INITIAL_WINDOW).expect("within credit");
        window.consume(INITIAL_WINDOW / 2);
        assert!(window.update_due(false));
    }

    #[test]
    fn a_larger_window_is_announced_up_front() {
        let mut window = RecvWindow::new(1 << 20);
        assert!(window.update_due(true));
        assert_eq!(window.take_update(), Some((1 << 20) - INITIAL_WINDOW));
        assert_eq!(window.receive(1 << 20), Ok(()));
        assert_eq!(window.receive(1), Err(0));
    }

    #[test]
    fn send_credit_overflow_is_detected() {
        assert_eq!(add_send_credit(10, 5), Some(15));
        assert_eq!(add_send_credit(u32::MAX - 1, 1), Some(u32::MAX));
        assert_eq!(add_send_credit(u32::MAX, 1), None);
    }
}
