//! Timers: keepalive, idle timeout, the peer's liveness, the write stall; and the buffers a
//! quiet session gives back.

use std::collections::VecDeque;

use super::Connection;
use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use crate::config::deadline_after;
use crate::error::Error;
use crate::session::out_queue::Cursor;

/// How long a silence timer (idle timeout, the peer's keepalive) waits, once it has expired,
/// before it believes it: a process resumed after a pause (a VM paused, a debugger, a laptop
/// asleep) sees its timers expire before its runtime has polled the transport, where the
/// peer's frames may be waiting. Any sleep makes the runtime poll its I/O first.
const SILENCE_CONFIRM: Duration = Duration::from_millis(50);

/// A periodic check: fires `interval` after the last activity.
pub(super) struct Timer {
    interval: Duration,
    pub(super) last: Instant,
    sleep: Pin<Box<Sleep>>,
    /// For a silence timer: expired once, and waiting [`SILENCE_CONFIRM`] to be sure.
    confirm: Option<bool>,
}

impl Timer {
    pub(super) fn new(interval: Duration) -> Timer {
        let now = Instant::now();
        Timer {
            interval,
            last: now,
            sleep: Box::pin(tokio::time::sleep_until(deadline_after(now, interval))),
            confirm: None,
        }
    }

    /// A timer of the peer's silence: it fires only if nothing arrived for [`SILENCE_CONFIRM`]
    /// more after it expired.
    pub(super) fn silence(interval: Duration) -> Timer {
        Timer {
            confirm: Some(false),
            ..Timer::new(interval)
        }
    }

    /// Ready when `interval` has passed since the last activity; re-arms itself either way.
    pub(super) fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        let deadline = deadline_after(self.last, self.interval);
        let now = Instant::now();
        if now >= deadline && self.confirm == Some(false) {
            self.confirm = Some(true);
            self.sleep.as_mut().reset(now + SILENCE_CONFIRM);
            let _ = self.sleep.as_mut().poll(cx);
            return false;
        }
        if self.confirm.is_some() {
            self.confirm = Some(false);
        }
        if now >= deadline {
            self.last = Instant::now();
            self.sleep
                .as_mut()
                .reset(deadline_after(self.last, self.interval));
            let _ = self.sleep.as_mut().poll(cx);
            return true;
        }
        self.sleep.as_mut().reset(deadline);
        let _ = self.sleep.as_mut().poll(cx);
        false
    }
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    pub(super) fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if !self.timers_started {
            self.timers_started = true;
            self.keepalive = self.keepalive_interval.map(Timer::new);
            self.idle = self.idle_timeout.map(Timer::silence);
        }
        if self.read_paused {
            // Not reading is our doing, not the peer's silence.
            let now = Instant::now();
            for silence in [&mut self.idle, &mut self.liveness].into_iter().flatten() {
                silence.last = now;
            }
        }
        if self.idle.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            self.end(Error::IdleTimeout, true);
        }
        if self.liveness.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            self.end(Error::KeepaliveTimeout, true);
        }
        if self.keepalive.as_mut().is_some_and(|t| t.poll_expired(cx)) {
            self.shared.lock().queue_keepalive();
        }
        if self.poll_stalled(cx) {
            self.stall_armed = false;
            let error = Error::WriteStalled;
            self.write_failed = Some((error.clone(), Box::pin(tokio::time::sleep(Duration::ZERO))));
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
            self.write_buf.release();
            self.written = Cursor::default();
            self.control_buf = Vec::new();
            self.control_done = 0;
            self.boundaries = VecDeque::new();
            self.large_batch_at = None;
        }
        self.wakers = Vec::new();
        self.shared.lock().release_buffers();
    }
}
