//! Timers: keepalive, idle timeout, the peer's liveness, the write stall; and the buffers a
//! quiet session gives back.

use super::Connection;
use std::future::Future;
use std::task::Context;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::config::deadline_after;
use crate::error::Error;

/// How long a silence timer (idle timeout, the peer's keepalive) waits, once it has expired,
/// before it believes it: a process resumed after a pause (a VM paused, a debugger, a laptop
/// asleep) sees its timers expire before its runtime has polled the transport, where the
/// peer's frames may be waiting. Any sleep makes the runtime poll its I/O first.
const SILENCE_CONFIRM: Duration = Duration::from_millis(50);

/// The keepalive: fires `interval` after this side last wrote, and starts the next interval.
/// The timers share one `Sleep` (`Connection::timer_sleep`) with the linger
/// (`session::linger`), set to the earliest moment one of them must look again: a `Sleep` is a
/// boxed 112 bytes, which every session would otherwise hold two or three of
/// (`benches/idle_sessions.rs`), and make again each time it goes quiet.
pub(super) struct Timer {
    interval: Duration,
    pub(super) last: Instant,
}

impl Timer {
    pub(super) fn new(interval: Duration) -> Timer {
        Timer {
            interval,
            last: Instant::now(),
        }
    }

    /// Whether `interval` has passed since the last write, as of `now`; if so the next
    /// interval starts.
    fn expired(&mut self, now: Instant) -> bool {
        if now < self.next_check() {
            return false;
        }
        self.last = now;
        true
    }

    /// When it must be looked at next.
    fn next_check(&self) -> Instant {
        deadline_after(self.last, self.interval)
    }
}

/// The peer's silence: ends the session once nothing arrived for `interval`, the shorter of
/// the idle timeout (`Error::IdleTimeout`) and twice the keepalive interval a peer of this
/// crate announced (`Error::KeepaliveTimeout`). Both count from the last frame read, so one
/// timer serves both: whichever is shorter ends the session first.
pub(super) struct Silence {
    interval: Duration,
    pub(super) last: Instant,
    /// Once it expired: when it believes it (see [`SILENCE_CONFIRM`]).
    confirm_at: Option<Instant>,
    /// The peer's keepalive, not the idle timeout, set `interval`.
    liveness: bool,
}

impl Silence {
    pub(super) fn idle(interval: Duration) -> Silence {
        Silence {
            interval,
            last: Instant::now(),
            confirm_at: None,
            liveness: false,
        }
    }

    /// The peer announced its keepalive: twice that silence ends the session too, if it is
    /// shorter than the idle timeout (a tie is the idle timeout's).
    pub(super) fn with_liveness(silence: Option<Silence>, interval: Duration) -> Silence {
        match silence {
            Some(idle) if idle.interval <= interval => idle,
            Some(idle) => Silence {
                interval,
                liveness: true,
                ..idle
            },
            None => Silence {
                liveness: true,
                ..Silence::idle(interval)
            },
        }
    }

    /// Why the session ends, if `interval` has passed since the last frame read as of `now`
    /// and nothing arrived for [`SILENCE_CONFIRM`] more.
    fn expired(&mut self, now: Instant) -> Option<Error> {
        if now < deadline_after(self.last, self.interval) {
            // Something arrived since it expired, if it had.
            self.confirm_at = None;
            return None;
        }
        match self.confirm_at {
            None => {
                self.confirm_at = Some(now + SILENCE_CONFIRM);
                return None;
            }
            Some(at) if now < at => return None,
            Some(_) => self.confirm_at = None,
        }
        self.last = now;
        Some(if self.liveness {
            Error::KeepaliveTimeout
        } else {
            Error::IdleTimeout
        })
    }

    /// When it must be looked at next.
    fn next_check(&self) -> Instant {
        self.confirm_at
            .unwrap_or_else(|| deadline_after(self.last, self.interval))
    }
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    pub(super) fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if !self.timers_started {
            self.timers_started = true;
            // They count from the first poll, as a `Sleep` made then did.
            let now = Instant::now();
            if let Some(keepalive) = &mut self.keepalive {
                keepalive.last = now;
            }
            if let Some(silence) = &mut self.silence {
                silence.last = now;
            }
        }
        if self.read_paused {
            // Not reading is our doing, not the peer's silence.
            if let Some(silence) = &mut self.silence {
                silence.last = Instant::now();
            }
        }
        // A sleep found ready (its moment passed while the driver was busy) is looked at again
        // at once; should it stay ready, the driver comes back rather than sleep unwoken.
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > 4 {
                cx.waker().wake_by_ref();
                break;
            }
            let now = Instant::now();
            if let Some(error) = self.silence.as_mut().and_then(|t| t.expired(now)) {
                self.end(error, true);
            }
            if self.keepalive.as_mut().is_some_and(|t| t.expired(now)) {
                self.shared.lock().queue_keepalive();
            }
            if self.linger.quiet(now) {
                self.release_buffers();
            }
            let next = self
                .silence
                .as_ref()
                .map(Silence::next_check)
                .into_iter()
                .chain(self.keepalive.as_ref().map(Timer::next_check))
                .chain(self.linger.next_check())
                .min();
            let Some(next) = next else {
                self.timer_sleep = None;
                break;
            };
            let sleep = match &mut self.timer_sleep {
                Some(sleep) => {
                    if sleep.deadline() != next {
                        sleep.as_mut().reset(next);
                    }
                    sleep
                }
                None => self
                    .timer_sleep
                    .insert(Box::pin(tokio::time::sleep_until(next))),
            };
            if sleep.as_mut().poll(cx).is_pending() {
                break;
            }
        }
        if self.poll_stalled(cx) {
            self.stall_armed = false;
            let error = Error::WriteStalled;
            let deadline = Box::pin(tokio::time::sleep(Duration::ZERO));
            self.write_failed = Some(Box::new((error.clone(), deadline)));
            let mut inner = self.shared.lock();
            inner.transport_write_failed(error.clone(), &mut self.wakers);
            inner.end(error, false, &mut self.wakers);
            drop(inner);
            self.wake_collected();
        }
    }

    /// The session has been quiet for the linger: gives back every buffer that holds nothing
    /// (see `session::linger`).
    pub(super) fn release_buffers(&mut self) {
        self.read_buf.release();
        if self.batch_written() {
            self.write = None;
        }
        if !self.stall_armed {
            self.stall = None;
        }
        self.shared.lock().release_buffers();
    }
}
