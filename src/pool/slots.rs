//! The pool's table of slots: which slot holds a session, which is connecting, and when a slot
//! that failed may connect again. One mutex guards it, held only to read or change the table,
//! never across an await or during I/O.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::PooledSession;
use crate::error::Error;
use crate::session::core::WaitList;
use crate::session::Session;

/// What stands for "never" when a wait or a backoff is too long for an [`Instant`] (as tokio's
/// own `Interval` does): about 30 years.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// Makes a session: the caller's connect, then the session on the transport.
pub(super) type ConnectFn =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = io::Result<Session>> + Send>> + Send + Sync>;

pub(super) struct Shared {
    pub(super) size: usize,
    backoff: Backoff,
    connect_timeout: Duration,
    pub(super) open_timeout: Duration,
    connect: ConnectFn,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Backoff {
    pub(super) initial: Duration,
    pub(super) max: Duration,
}

pub(super) struct State {
    pub(super) slots: Vec<Slot>,
    /// Where the next search for the least loaded session starts.
    pub(super) next: usize,
    /// Sessions made so far; numbers them.
    pub(super) connects: u64,
    pub(super) closed: bool,
    /// Why the latest connect failed, or the latest session left its slot: what `open` reports
    /// when no session can be had.
    pub(super) last_error: Option<Error>,
    /// Opens and fills waiting for a connect to finish, one slot each (given back on drop).
    waiters: WaitList,
    /// Slots held in `waiters`.
    pub(super) waiting: usize,
}

#[derive(Default)]
pub(super) struct Slot {
    pub(super) session: Option<PooledSession>,
    /// When the session was made.
    since: Option<Instant>,
    /// A connect for this slot is under way (only one at a time).
    pub(super) connecting: bool,
    /// Opens under way on the session, counted with its streams when choosing.
    pub(super) opening: usize,
    /// Failures in a row.
    failures: u32,
    /// No connect before this.
    pub(super) retry_at: Option<Instant>,
}

impl Shared {
    /// The table of a new pool: `size` empty slots, nothing connected.
    pub(super) fn new(
        size: usize,
        backoff: Backoff,
        connect_timeout: Duration,
        open_timeout: Option<Duration>,
        connect: ConnectFn,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            size,
            backoff,
            connect_timeout,
            open_timeout: open_timeout.unwrap_or(connect_timeout),
            connect,
            state: Mutex::new(State {
                slots: (0..size).map(|_| Slot::default()).collect(),
                next: 0,
                connects: 0,
                closed: false,
                last_error: None,
                waiters: WaitList::new(),
                waiting: 0,
            }),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between any two statements that change it: a panic while
        // it was held leaves nothing half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the ended sessions out of their slots, and starts a connect for every slot that
    /// needs one and may have one. Returns the sessions taken out, to be dropped once the
    /// caller has let go of the lock (dropping a session handle takes the session's lock).
    pub(super) fn start_connects(self: &Arc<Self>) -> Vec<PooledSession> {
        let now = Instant::now();
        let mut retired = Vec::new();
        let mut start = Vec::new();
        {
            let mut state = self.lock();
            if state.closed {
                return retired;
            }
            for index in 0..self.size {
                let ended = state.slots[index]
                    .session
                    .as_ref()
                    .and_then(|pooled| pooled.session.close_reason());
                if let Some(reason) = ended {
                    let clean = matches!(reason, Error::ClosedByPeer);
                    retired.extend(state.slots[index].retire(now, self.backoff, clean));
                    state.last_error = Some(reason);
                }
                let slot = &mut state.slots[index];
                if slot.session.is_none()
                    && !slot.connecting
                    && slot.retry_at.is_none_or(|at| at <= now)
                {
                    slot.connecting = true;
                    start.push(index);
                }
            }
        }
        for index in start {
            tokio::spawn(connect_slot(Arc::clone(self), index));
        }
        retired
    }

    /// Closes the pool to new opens and connects, wakes the opens waiting, and returns the
    /// sessions to close.
    pub(super) fn shut(&self) -> Vec<Session> {
        let mut wakers = Vec::new();
        let sessions = {
            let mut state = self.lock();
            state.closed = true;
            state.waiters.wake_all(&mut wakers);
            state
                .slots
                .iter()
                .filter_map(|slot| slot.session.as_ref())
                .map(|pooled| pooled.session.clone())
                .collect()
        };
        wakers.into_iter().for_each(Waker::wake);
        sessions
    }

    /// Records a connect's outcome in its slot, and wakes the opens waiting for one. Returns a
    /// session that came too late (the pool was closed meanwhile).
    fn connected(&self, index: usize, outcome: Result<Session, Error>) -> Option<Session> {
        let now = Instant::now();
        let mut wakers = Vec::new();
        let late = {
            let mut state = self.lock();
            let closed = state.closed;
            let state = &mut *state;
            let slot = &mut state.slots[index];
            slot.connecting = false;
            let late = match outcome {
                Ok(session) if closed => Some(session),
                Ok(session) => {
                    state.connects += 1;
                    slot.session = Some(PooledSession {
                        slot: index,
                        number: state.connects,
                        session,
                    });
                    slot.since = Some(now);
                    slot.opening = 0;
                    None
                }
                Err(error) => {
                    slot.fail(now, self.backoff);
                    state.last_error = Some(error);
                    None
                }
            };
            // Taken last, once the slot is settled: the waiters must see its new state.
            state.waiters.wake_all(&mut wakers);
            late
        };
        wakers.into_iter().for_each(Waker::wake);
        late
    }
}

impl State {
    /// Registers a waiting `open` or `fill` in its `slot` of the waiters.
    pub(super) fn wait(&mut self, slot: &mut Option<usize>, waker: &Waker) {
        self.waiting += usize::from(slot.is_none());
        self.waiters.register(slot, waker);
    }

    /// Gives up the `slot` of an `open` or `fill` that waits no more.
    pub(super) fn stop_waiting(&mut self, slot: &mut Option<usize>) {
        self.waiting -= usize::from(slot.is_some());
        self.waiters.remove(slot);
    }

    /// The live sessions.
    pub(super) fn live(&self) -> impl Iterator<Item = &PooledSession> {
        self.slots
            .iter()
            .filter_map(|slot| slot.session.as_ref())
            .filter(|pooled| !pooled.session.is_closed())
    }

    /// The slot of the live session with the fewest streams and opens under way, searching
    /// from `next` so that ties go round.
    pub(super) fn least_loaded(&self) -> Option<usize> {
        let size = self.slots.len();
        let mut best: Option<(usize, usize)> = None;
        for index in (0..size).map(|offset| (self.next + offset) % size) {
            let slot = &self.slots[index];
            let Some(pooled) = &slot.session else {
                continue;
            };
            if pooled.session.is_closed() {
                continue;
            }
            let load = pooled.session.stream_count() + slot.opening;
            if best.is_none_or(|(_, least)| load < least) {
                best = Some((index, load));
            }
        }
        best.map(|(index, _)| index)
    }

    /// Takes `pooled` out of its slot after its open failed with `error`, unless it has left
    /// already. Returns it, to be dropped once the lock is let go.
    pub(super) fn retire(
        &mut self,
        pooled: &PooledSession,
        error: Error,
        shared: &Shared,
    ) -> Option<PooledSession> {
        let slot = &mut self.slots[pooled.slot];
        if slot
            .session
            .as_ref()
            .is_none_or(|current| current.number != pooled.number)
        {
            return None;
        }
        let clean = matches!(error, Error::ClosedByPeer);
        self.last_error = Some(error);
        slot.retire(Instant::now(), shared.backoff, clean)
    }
}

impl Slot {
    /// Empties the slot of its session. A session that lived less than the longest backoff
    /// counts as a failure (a server that accepts and drops connections must not be connected
    /// in a loop); one that lived longer starts the count afresh, as does one the server
    /// closed cleanly (`clean`: CloseMux) after the initial backoff, so that a server's
    /// graceful restart does not grow the backoff.
    fn retire(&mut self, now: Instant, backoff: Backoff, clean: bool) -> Option<PooledSession> {
        let pooled = self.session.take()?;
        let lived = self
            .since
            .take()
            .map(|since| now.saturating_duration_since(since));
        self.opening = 0;
        let enough = if clean { backoff.initial } else { backoff.max };
        if lived.is_some_and(|lived| lived >= enough) {
            self.failures = 0;
            self.retry_at = None;
        } else {
            self.fail(now, backoff);
        }
        Some(pooled)
    }

    /// Counts a failure and sets when the slot may connect again: at once after the first in
    /// a row, then `initial`, doubling up to `max`.
    fn fail(&mut self, now: Instant, backoff: Backoff) {
        let wait = match self.failures {
            0 => Duration::ZERO,
            n => backoff
                .initial
                .saturating_mul(2u32.saturating_pow(n - 1))
                .min(backoff.max),
        };
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(later(now, wait));
    }
}

/// `now + wait`, or far in the future when that is past what an [`Instant`] can hold (a
/// backoff or timeout of [`Duration::MAX`]): never a panic, which would leave the pool's
/// waiters unwoken.
pub(super) fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait)
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// Connects slot `index`, within the connect timeout, and records the outcome.
async fn connect_slot(shared: Arc<Shared>, index: usize) {
    let mut guard = ConnectGuard {
        shared: &shared,
        index,
        done: false,
    };
    let outcome = match tokio::time::timeout(shared.connect_timeout, (shared.connect)()).await {
        Ok(Ok(session)) => Ok(session),
        Ok(Err(error)) => Err(Error::from(error)),
        Err(_) => Err(Error::from(io::Error::new(
            io::ErrorKind::TimedOut,
            "connect timed out",
        ))),
    };
    guard.done = true;
    if let Some(late) = shared.connected(index, outcome) {
        // The pool was closed while this connect was under way.
        let _ = late.close().await;
    }
}

/// Frees a slot whose connect was dropped before it finished (its runtime shut down), so the
/// slot is not left connecting for ever.
struct ConnectGuard<'a> {
    shared: &'a Shared,
    index: usize,
    done: bool,
}

impl Drop for ConnectGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            let cancelled = io::Error::new(io::ErrorKind::Interrupted, "connect cancelled");
            drop(self.shared.connected(self.index, Err(cancelled.into())));
        }
    }
}

/// An open under way on a slot's session, counted until dropped.
pub(super) struct Opening {
    pub(super) shared: Arc<Shared>,
    pub(super) slot: usize,
    pub(super) number: u64,
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let slot = &mut state.slots[self.slot];
        if slot
            .session
            .as_ref()
            .is_some_and(|current| current.number == self.number)
        {
            slot.opening = slot.opening.saturating_sub(1);
        }
    }
}

/// A future's slot among the pool's waiters, given back when the future is dropped.
pub(super) struct Waiting<'a> {
    pub(super) shared: &'a Shared,
    pub(super) slot: Option<usize>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.slot.is_some() {
            self.shared.lock().stop_waiting(&mut self.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Role};

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }

    #[test]
    fn failures_in_a_row_wait_nothing_then_double_up_to_the_longest() {
        let now = Instant::now();
        let mut slot = Slot::default();
        let mut waits = Vec::new();
        for _ in 0..10 {
            slot.fail(now, backoff());
            waits.push(slot.retry_at.map(|at| at - now));
        }
        let ms = Duration::from_millis;
        let expected = [0, 100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000].map(|m| Some(ms(m)));
        assert_eq!(waits, expected);
        // A count far beyond any real run still saturates at the longest wait.
        slot.failures = u32::MAX;
        slot.fail(now, backoff());
        assert_eq!(slot.retry_at, Some(now + backoff().max));
    }

    #[test]
    fn a_backoff_of_duration_max_saturates_instead_of_panicking() {
        let now = Instant::now();
        let longest = Backoff {
            initial: Duration::MAX,
            max: Duration::MAX,
        };
        let mut slot = Slot::default();
        for _ in 0..3 {
            slot.fail(now, longest);
        }
        assert_eq!(slot.retry_at, Some(now + FAR_FUTURE));
        assert_eq!(later(now, Duration::MAX), now + FAR_FUTURE);
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn a_clean_close_resets_the_count_once_the_session_lived_the_initial_backoff() {
        let now = Instant::now();
        let session_slot = |failures, lived: Duration| {
            let (a, _b) = tokio::io::duplex(64);
            let (session, _driver) = Session::new(a, Role::Client, Config::default());
            Slot {
                session: Some(PooledSession {
                    slot: 0,
                    number: 1,
                    session,
                }),
                since: Some(now - lived),
                failures,
                ..Slot::default()
            }
        };
        // Closed by the server after a second: no failure, connect again at once.
        let mut slot = session_slot(3, Duration::from_secs(1));
        assert!(slot.retire(now, backoff(), true).is_some());
        assert_eq!((slot.failures, slot.retry_at), (0, None));
        // Closed by the server at once: a failure, as a drop would be.
        let mut slot = session_slot(3, Duration::from_millis(10));
        slot.retire(now, backoff(), true);
        assert_eq!(slot.failures, 4);
        assert_eq!(slot.retry_at, Some(now + Duration::from_millis(400)));
        // Dropped after a second: a failure.
        let mut slot = session_slot(3, Duration::from_secs(1));
        slot.retire(now, backoff(), false);
        assert_eq!(slot.failures, 4);
    }
}
