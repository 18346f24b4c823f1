//! When a session has gone quiet, so that its driver gives its buffers back.
//!
//! A busy session keeps its read buffer, its outgoing queues and its pool of stream buffers, so
//! that it allocates nothing per frame (`tests/alloc.rs`). A session that neither read nor
//! wrote anything for [`LINGER`] gives them all back: most sessions of a server holding
//! thousands are idle, and an idle session then holds no buffer at all (`tests/idle_memory.rs`,
//! `benches/idle_sessions.rs`). Its next frame allocates them again, as a new session's first
//! one does.
//!
//! The timer that wakes the driver when the linger is over exists only while there is
//! something to give back: it is dropped with the buffers, so an idle session holds no timer
//! for it either.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How long a session must be quiet before it gives its buffers back. Long enough that a
/// session trading requests and answers a few times a second keeps them; short against the
/// time sessions stay idle.
pub(crate) const LINGER: Duration = Duration::from_secs(1);

pub(crate) struct Linger {
    /// When the driver last read or wrote something.
    last: Instant,
    /// Whether buffers may be held since the session was last released.
    holding: bool,
    /// Wakes the driver once the linger may be over. Its deadline is the end of the linger as
    /// it stood when it was armed: activity since only moves the real end later, and the timer
    /// is re-armed when it fires early, at most once per linger.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Linger {
    pub(crate) fn new() -> Linger {
        Linger {
            last: Instant::now(),
            holding: false,
            sleep: None,
        }
    }

    /// The driver read or wrote at `now`.
    pub(crate) fn touch(&mut self, now: Instant) {
        self.last = now;
        self.holding = true;
    }

    /// Whether the session has been quiet for the whole linger while holding buffers: the
    /// caller gives them back. Otherwise, when it holds some, arranges for `cx` to be woken
    /// when the linger may be over.
    pub(crate) fn poll_quiet(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.holding {
            return false;
        }
        let due = self.last + LINGER;
        if Instant::now() >= due {
            self.holding = false;
            self.sleep = None;
            return true;
        }
        match &mut self.sleep {
            Some(sleep) => {
                if sleep.as_mut().poll(cx).is_ready() {
                    // It fired for an earlier end of the linger.
                    sleep.as_mut().reset(due);
                    let _ = sleep.as_mut().poll(cx);
                }
            }
            None => {
                let mut sleep = Box::pin(tokio::time::sleep_until(due));
                let _ = sleep.as_mut().poll(cx);
                self.sleep = Some(sleep);
            }
        }
        false
    }
}
