//! The time of a call into the session's core, read from the clock only if the call needs it.
//!
//! Most calls do not: a read needs the time only while its stream's window is being measured
//! for growth, a direct write only when credit goes out with it. A clock read is a system call
//! or a vDSO call on every read and write of a small message, a measurable share of a short
//! round trip (BENCHMARK-HISTORY.md, "Small direct writes in one piece, and the clock read when
//! needed"), so a [`Now`] reads the clock the first time it is asked, and never otherwise.

use std::cell::OnceCell;

use tokio::time::Instant;

/// A moment, fixed when the value is made (`Now::at`, in tests) or on the first [`Now::get`]
/// ([`Now::later`]); every `get` returns the same moment.
pub(crate) struct Now(OnceCell<Instant>);

impl Now {
    /// The moment `at` (the core's tests, on a clock of their own).
    #[cfg(test)]
    pub(crate) fn at(at: Instant) -> Now {
        Now(OnceCell::from(at))
    }

    /// The moment of the first `get`: tokio's clock then (paused in tests that pause it).
    pub(crate) fn later() -> Now {
        Now(OnceCell::new())
    }

    pub(crate) fn get(&self) -> Instant {
        *self.0.get_or_init(Instant::now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_later_moment_is_read_once_on_the_first_get() {
        let now = Now::later();
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        let first = now.get();
        assert_eq!(
            first,
            Instant::now(),
            "read at the first get, not when made"
        );
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        assert_eq!(now.get(), first, "the same moment on every get");
        let fixed = Instant::now();
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        assert_eq!(Now::at(fixed).get(), fixed);
    }
}
