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
//! nothing to give back (`driver::timers::Timers` keeps the linger's state).

use std::time::Duration;

/// How long a session must be quiet before it gives its buffers back. Long enough that a
/// session trading requests and answers a few times a second keeps them; short against the
/// time sessions stay idle.
pub(crate) const LINGER: Duration = Duration::from_secs(1);
