//! Timers: keepalive, idle timeout, the peer's liveness, the write stall; and the buffers a
//! quiet session gives back.

use super::{Collected, Connection};
use std::future::Future;
use std::task::Context;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::error::Error;
use crate::session::linger::LINGER;

/// How long a silence timer (idle timeout, the peer's keepalive) waits, once it has expired,
/// before it believes it: a process resumed after a pause (a VM paused, a debugger, a laptop
/// asleep) sees its timers expire before its runtime has polled the transport, where the
/// peer's frames may be waiting. Any sleep makes the runtime poll its I/O first.
const SILENCE_CONFIRM: Duration = Duration::from_millis(50);

/// The longest timer interval, 2^30 ms (about 12.4 days): longer keepalive intervals and
/// silences are cut to it, so that every moment the timers compare is within 2^31 ms of
/// another, where [`Tick`]s compare right.
const MAX_SPAN_MS: u32 = 1 << 30;

/// A moment of the driver's clock: milliseconds since [`Clock::epoch`], in 32 bits, wrapping
/// (every 49.7 days). The driver's timers keep their moments so, in 4 bytes where an `Instant`
/// takes 16: the driver's task is then small enough for tokio's smaller task size
/// (`benches/idle_sessions.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Tick(u32);

impl Tick {
    /// `ms` milliseconds later.
    fn after(self, ms: u32) -> Tick {
        Tick(self.0.wrapping_add(ms))
    }

    /// Whether `self` is `at` or later (the two within 2^31 ms of each other).
    fn reached(self, at: Tick) -> bool {
        self.0.wrapping_sub(at.0) < 1 << 31
    }

    /// How many milliseconds `self` is after `now`, 0 if it has passed.
    fn ms_after(self, now: Tick) -> u32 {
        if now.reached(self) {
            0
        } else {
            self.0.wrapping_sub(now.0)
        }
    }
}

/// The driver's clock, for its timers.
pub(super) struct Clock {
    epoch: Instant,
}

impl Clock {
    pub(super) fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
        }
    }

    /// Now, and its tick.
    pub(super) fn now(&self) -> (Instant, Tick) {
        let now = Instant::now();
        (now, self.tick(now))
    }

    /// The tick of `at` (milliseconds since the epoch, wrapping: the cast keeps the low bits).
    pub(super) fn tick(&self, at: Instant) -> Tick {
        Tick(self.millis(at) as u32)
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The moment `ms` milliseconds after the tick of `now`: the same `Instant` from every
    /// `now` that sees the same tick ahead, so that the timer is not reset on every poll.
    fn deadline(&self, now: Instant, ms: u32) -> Instant {
        let at = Duration::from_millis(self.millis(now).saturating_add(u64::from(ms)));
        self.epoch.checked_add(at).unwrap_or(now)
    }
}

/// A timer's interval in milliseconds: at least 1 (rounded up), at most [`MAX_SPAN_MS`].
fn span_ms(interval: Duration) -> u32 {
    let ms = interval.as_nanos().div_ceil(1_000_000);
    ms.clamp(1, u128::from(MAX_SPAN_MS)) as u32
}

/// The driver's timers, each an interval from the last read or the last write:
///
/// - the keepalive fires `keepalive` after this side last wrote, and starts the next interval;
/// - the peer's silence ends the session once nothing arrived for `silence`, the shorter of
///   the idle timeout (`Error::IdleTimeout`) and twice the keepalive interval a peer of this
///   crate announced (`Error::KeepaliveTimeout`): both count from the last frame read, so one
///   timer serves both, and whichever is shorter ends the session first;
/// - the linger gives the session's buffers back once it has neither read nor written for
///   [`LINGER`] (see `session::linger`).
///
/// They share one `Sleep` (`Connection::timer_sleep`), set to the earliest moment one of them
/// must look again: a `Sleep` is a boxed 112 bytes, which every session would otherwise hold
/// two or three of (`benches/idle_sessions.rs`), and make again each time it goes quiet.
#[derive(Debug, Default)]
pub(super) struct Timers {
    last_read: Tick,
    last_write: Tick,
    /// In milliseconds, 0 when off.
    keepalive: u32,
    silence: u32,
    /// Once the silence expired (`confirming`): when it believes it (see [`SILENCE_CONFIRM`]).
    confirm_at: Tick,
    /// While buffers may be held (`linger_armed`): when to look next whether the linger is
    /// over. It is the end of the linger as it stood when it was set: activity since only
    /// moves the real end later, and it is set again when it comes early, at most once per
    /// linger, so that the driver's timer is not moved on every frame.
    linger_check: Tick,
    confirming: bool,
    /// The peer's keepalive, not the idle timeout, set `silence`.
    liveness: bool,
    linger_armed: bool,
    /// The timers count from the driver's first poll.
    started: bool,
}

/// What the timers found due.
#[derive(Debug, Default)]
pub(super) struct Due {
    pub(super) keepalive: bool,
    pub(super) silence: Option<Error>,
    pub(super) linger: bool,
}

impl Timers {
    pub(super) fn new(keepalive: Option<Duration>, idle: Option<Duration>) -> Timers {
        Timers {
            keepalive: keepalive.map_or(0, span_ms),
            silence: idle.map_or(0, span_ms),
            ..Timers::default()
        }
    }

    /// The peer announced its keepalive: twice that silence ends the session too, if it is
    /// shorter than the idle timeout (a tie is the idle timeout's).
    pub(super) fn peer_keepalive(&mut self, interval: Duration) {
        let liveness = span_ms(interval.saturating_mul(2));
        if self.silence == 0 || liveness < self.silence {
            self.silence = liveness;
            self.liveness = true;
        }
    }

    /// The driver read something at `now`.
    pub(super) fn read(&mut self, now: Tick) {
        self.last_read = now;
        self.touch(now);
    }

    /// The driver (or a writer, directly) wrote something at `now`.
    pub(super) fn wrote(&mut self, now: Tick) {
        self.last_write = now;
        self.touch(now);
    }

    /// Reading waits on this side's account: the peer's silence does not count meanwhile.
    pub(super) fn hold_silence(&mut self, now: Tick) {
        self.last_read = now;
    }

    fn touch(&mut self, now: Tick) {
        if !self.linger_armed {
            self.linger_armed = true;
            self.linger_check = now.after(LINGER_MS);
        }
    }

    /// Looks at every timer as of `now`: what is due, and when to look again (`None`: no timer
    /// runs, and the session holds no buffer).
    pub(super) fn poll(&mut self, now: Tick) -> (Due, Option<u32>) {
        if !self.started {
            // They count from the first poll, as a `Sleep` made then did.
            self.started = true;
            self.last_read = now;
            self.last_write = now;
        }
        // Moments far behind are moved up to where they still compare right (no timer looks
        // that far back).
        for last in [&mut self.last_read, &mut self.last_write] {
            if now.0.wrapping_sub(last.0) > MAX_SPAN_MS {
                *last = Tick(now.0.wrapping_sub(MAX_SPAN_MS));
            }
        }
        let mut due = Due::default();
        if self.silence != 0 {
            let deadline = self.last_read.after(self.silence);
            if !now.reached(deadline) {
                // Something arrived since it expired, if it had.
                self.confirming = false;
            } else if !self.confirming {
                self.confirming = true;
                self.confirm_at = now.after(SILENCE_CONFIRM.as_millis() as u32);
            } else if now.reached(self.confirm_at) {
                self.confirming = false;
                self.last_read = now;
                due.silence = Some(if self.liveness {
                    Error::KeepaliveTimeout
                } else {
                    Error::IdleTimeout
                });
            }
        }
        if self.keepalive != 0 && now.reached(self.last_write.after(self.keepalive)) {
            self.last_write = now;
            due.keepalive = true;
        }
        if self.linger_armed && now.reached(self.linger_check) {
            let last = if self.last_read.reached(self.last_write) {
                self.last_read
            } else {
                self.last_write
            };
            let end = last.after(LINGER_MS);
            if now.reached(end) {
                self.linger_armed = false;
                due.linger = true;
            } else {
                self.linger_check = end;
            }
        }
        let silence = (self.silence != 0).then(|| {
            if self.confirming {
                self.confirm_at
            } else {
                self.last_read.after(self.silence)
            }
        });
        let keepalive = (self.keepalive != 0).then(|| self.last_write.after(self.keepalive));
        let linger = self.linger_armed.then_some(self.linger_check);
        let next = [silence, keepalive, linger]
            .into_iter()
            .flatten()
            .map(|at| at.ms_after(now))
            .min();
        (due, next)
    }
}

/// [`LINGER`] in milliseconds.
const LINGER_MS: u32 = LINGER.as_millis() as u32;

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    pub(super) fn poll_timers(&mut self, cx: &mut Context<'_>) {
        if self.read_paused {
            // Not reading is our doing, not the peer's silence.
            let (_, tick) = self.clock.now();
            self.timers.hold_silence(tick);
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
            let (now, tick) = self.clock.now();
            let (due, next) = self.timers.poll(tick);
            if let Some(error) = due.silence {
                self.end(error, true);
            }
            if due.keepalive {
                self.shared.lock().queue_keepalive();
            }
            if due.linger {
                self.release_buffers();
            }
            let Some(next) = next else {
                self.timer_sleep = None;
                break;
            };
            let next = self.clock.deadline(now, next);
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
            super::write::Stall::disarm(&mut self.stall);
            let error = Error::WriteStalled;
            let deadline = Box::pin(tokio::time::sleep(Duration::ZERO));
            self.write_failed = Some(Box::new((error.clone(), deadline)));
            let mut wakers = Collected::new();
            let mut inner = self.shared.lock();
            inner.transport_write_failed(error.clone(), wakers.list());
            inner.end(error, false, wakers.list());
            drop(inner);
            wakers.wake();
        }
    }

    /// The session has been quiet for the linger: gives back every buffer that holds nothing
    /// (see `session::linger`).
    pub(super) fn release_buffers(&mut self) {
        self.read_buf.release();
        if self.batch_written() {
            self.write = None;
        }
        if !self.stall_armed() {
            self.stall = None;
        }
        self.shared.lock().release_buffers();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock's ticks wrap every 49.7 days: timers set before the wrap fire on time after
    /// it, the keepalive every interval and the silence once, after its confirmation.
    #[test]
    fn the_timers_fire_on_time_across_the_clocks_wrap() {
        let mut timers = Timers::new(Some(Duration::from_secs(30)), Some(Duration::from_secs(90)));
        let start = Tick(u32::MAX - 10_000);
        let (due, next) = timers.poll(start);
        assert!(!due.keepalive && due.silence.is_none() && !due.linger);
        assert_eq!(next, Some(30_000));
        assert!(!timers.poll(start.after(29_999)).0.keepalive);
        let (due, next) = timers.poll(start.after(30_000));
        assert!(due.keepalive, "after the wrap");
        assert_eq!(next, Some(30_000));
        let (due, next) = timers.poll(start.after(90_000));
        assert!(due.silence.is_none(), "not believed yet");
        assert_eq!(next, Some(50));
        let (due, _) = timers.poll(start.after(90_050));
        assert!(matches!(due.silence, Some(Error::IdleTimeout)));
    }

    /// The linger ends a second after the last read or write, whichever came later, however
    /// long the session was busy before; a read long ago does not count as a late one.
    #[test]
    fn the_linger_counts_from_the_last_activity() {
        let mut timers = Timers::new(None, None);
        let start = Tick(5);
        timers.poll(start);
        timers.read(start);
        timers.wrote(start.after(600));
        let (due, next) = timers.poll(start.after(1_000));
        assert!(!due.linger);
        assert_eq!(next, Some(600), "a second after the write");
        let (due, next) = timers.poll(start.after(1_600));
        assert!(due.linger);
        assert_eq!(next, None, "nothing to look at while nothing is held");
        // Reads stop, writes go on for longer than half the clock's range.
        let later = start.after(3_000_000_000);
        timers.wrote(later);
        let (due, next) = timers.poll(later.after(10));
        assert!(!due.linger);
        assert_eq!(next, Some(990));
    }
}
