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

/// A periodic check: fires `interval` after the last activity. The timers share one `Sleep`
/// (`Connection::timer_sleep`) with the linger (`session::linger`), set to the earliest moment
/// one of them must look again: a `Sleep` is a boxed 112 bytes, which every session would
/// otherwise hold two or three of (`benches/idle_sessions.rs`), and make again each time it
/// goes quiet.
pub(super) struct Timer {
    interval: Duration,
    pub(super) last: Instant,
    /// For a silence timer that expired: when it believes it.
    confirm_at: Option<Instant>,
}

impl Timer {
    pub(super) fn new(interval: Duration) -> Timer {
        Timer {
            interval,
            last: Instant::now(),
            confirm_at: None,
        }
    }

    /// Whether `interval` has passed since the last activity, as of `now`; a periodic timer
    /// then starts its next interval. A timer of the peer's `silence` (the idle timeout, the
    /// peer's liveness) fires only if nothing arrived for [`SILENCE_CONFIRM`] more after it
    /// expired.
    fn expired(&mut self, now: Instant, silence: bool) -> bool {
        if now < deadline_after(self.last, self.interval) {
            // Something happened since it expired, if it had.
            self.confirm_at = None;
            return false;
        }
        if silence {
            match self.confirm_at {
                None => {
                    self.confirm_at = Some(now + SILENCE_CONFIRM);
                    return false;
                }
                Some(at) if now < at => return false,
                Some(_) => self.confirm_at = None,
            }
        }
        self.last = now;
        true
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
            for timer in [&mut self.keepalive, &mut self.idle].into_iter().flatten() {
                timer.last = now;
            }
        }
        if self.read_paused {
            // Not reading is our doing, not the peer's silence.
            let now = Instant::now();
            for silence in [&mut self.idle, &mut self.liveness].into_iter().flatten() {
                silence.last = now;
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
            if self.idle.as_mut().is_some_and(|t| t.expired(now, true)) {
                self.end(Error::IdleTimeout, true);
            }
            if self.liveness.as_mut().is_some_and(|t| t.expired(now, true)) {
                self.end(Error::KeepaliveTimeout, true);
            }
            if self
                .keepalive
                .as_mut()
                .is_some_and(|t| t.expired(now, false))
            {
                self.shared.lock().queue_keepalive();
            }
            if self.linger.quiet(now) {
                self.release_buffers();
            }
            let next = [&self.idle, &self.liveness, &self.keepalive]
                .into_iter()
                .flatten()
                .map(Timer::next_check)
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
        self.wakers = Vec::new();
        self.shared.lock().release_buffers();
    }
}
