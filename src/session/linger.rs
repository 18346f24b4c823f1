//! When a session has gone quiet, so that its driver gives its buffers back.
//!
//! A busy session keeps its read buffer, its outgoing queues and its pool of stream buffers, so
//! that it allocates nothing per frame (`tests/alloc.rs`). A session that neither read nor
//! wrote anything for [`LINGER`] gives them all back: most sessions of a server holding
//! thousands are idle, and an idle session then holds no buffer at all (`tests/idle_memory.rs`,
//! `benches/idle_sessions.rs`). Its next frame allocates them again, as a new session's first
//! one does.
//!
//! The driver's one timer (`Connection::timer_sleep`, shared with the keepalive and the
//! silence timers) wakes it when the linger may be over; nothing is armed for it while there is
//! nothing to give back.

use std::time::Duration;

use tokio::time::Instant;

/// How long a session must be quiet before it gives its buffers back. Long enough that a
/// session trading requests and answers a few times a second keeps them; short against the
/// time sessions stay idle.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

pub(crate) struct Linger {
    /// When the driver last read or wrote something.
    last: Instant,
    /// While buffers may be held: when to look next whether the linger is over. It is the end
    /// of the linger as it stood when it was set: activity since only moves the real end later,
    /// and it is set again when it comes early, at most once per linger, so that the driver's
    /// timer is not moved on every frame.
    check_at: Option<Instant>,
}

impl Linger {
    pub(crate) fn new() -> Linger {
        Linger {
            last: Instant::now(),
            check_at: None,
        }
    }

    /// The driver read or wrote at `now`.
    pub(crate) fn touch(&mut self, now: Instant) {
        self.last = now;
        if self.check_at.is_none() {
            self.check_at = Some(now + LINGER);
        }
    }

    /// Whether, as of `now`, the session has been quiet for the whole linger while holding
    /// buffers: the caller gives them back.
    pub(crate) fn quiet(&mut self, now: Instant) -> bool {
        match self.check_at {
            Some(at) if now >= at => {
                let due = self.last + LINGER;
                if now >= due {
                    self.check_at = None;
                    return true;
                }
                self.check_at = Some(due);
                false
            }
            _ => false,
        }
    }

    /// When the driver must look again, if it holds buffers.
    pub(crate) fn next_check(&self) -> Option<Instant> {
        self.check_at
    }
}
