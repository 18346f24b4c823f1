//! Logging through `tracing`, when the `tracing` feature is on; nothing otherwise.
//!
//! Every event carries the session's number (`session`, unique in the process) and, where one
//! is concerned, the stream's wire id (`stream`). The driver also runs inside a span
//! `gomux{session, role}`, so events from the protocol logic it drives are attributed too.

use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers sessions in the order they are created, for log lines.
pub(crate) fn next_session_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `event!(level, fields…; "message")`: a `tracing` event at `level` (`trace`, `debug`, `info`,
/// `warn`, `error`) when the feature is on. The arguments are those of `tracing`'s macros.
macro_rules! event {
    ($level:ident, $($arg:tt)+) => {
        #[cfg(feature = "tracing")]
        {
            tracing::$level!($($arg)+);
        }
    };
}

pub(crate) use event;

/// Logs a session's end: at WARN when it ended on a fault (the peer broke the protocol, the
/// transport failed), which an operator should see; at DEBUG after a close or a timeout, which
/// are part of a session's normal life.
pub(crate) fn session_ended(_session: u64, _error: &crate::Error) {
    #[cfg(feature = "tracing")]
    if _error.is_fault() {
        tracing::warn!(session = _session, error = %_error, "session failed");
    } else {
        tracing::debug!(session = _session, error = %_error, "session ended");
    }
}
