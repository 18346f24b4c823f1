//! Shutting down: the two-step trigger a signal fires, the count of the work under way, and the
//! drain of a gomux connection (or of the entry's pool of them).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gomux::{Error, Pool, Session};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Tells an end to shut down, in two steps (`main` takes them on a first and a second signal).
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// Cancelled to begin: the end takes no new clients and no new gomux connections, dials no
    /// more, and closes its gomux connections once the connections they relay have finished.
    pub begin: CancellationToken,
    /// Cancelled to cut at once the connections still being relayed (after `begin`).
    pub cut: CancellationToken,
    /// How long the connections being relayed get to finish once the shutdown has begun; what
    /// is left then is cut.
    pub drain: Duration,
}

impl Shutdown {
    pub fn new(drain: Duration) -> Shutdown {
        Shutdown {
            begin: CancellationToken::new(),
            cut: CancellationToken::new(),
            drain,
        }
    }
}

/// How an end's shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Client connections (at the exit: streams) being handled when the shutdown began.
    pub connections: usize,
    /// Those still open at the drain deadline, or when the drain was cut short, and cut.
    pub cut: usize,
}

/// What an end has under way, so that its shutdown can say how much there is and wait for it.
#[derive(Clone, Default)]
pub(crate) struct Work {
    /// Tasks that make gomux connections (dialling, accepting) or own one.
    pub(crate) sessions: Tracker,
    /// Tasks that each handle one client connection (at the exit: one stream).
    pub(crate) relays: Tracker,
    /// Connections being relayed when the shutdown began, as each drain found them.
    pub(crate) connections: Arc<AtomicUsize>,
    /// Connections cut by the shutdown, as each drain reports them.
    pub(crate) cut: Arc<AtomicUsize>,
}

impl Work {
    /// Waits for the work under way to finish, once the shutdown has begun and nothing new is
    /// taken: each gomux connection drains (see [`drain()`]) and is closed, cutting what is left
    /// at the deadline or when the shutdown is cut short, and the relays end with it. Logs how
    /// it went, and reports it.
    pub(crate) async fn wind_down(&self, shutdown: &Shutdown) -> ShutdownReport {
        self.log_start(shutdown);
        tokio::select! {
            () = async {
                self.sessions.idle().await;
                self.relays.idle().await;
            } => {}
            // The drains cut their relays. Relays whose session had ended before may still be
            // delivering what their stream holds, within `DELIVERY_GRACE`: not waited for.
            () = shutdown.cut.cancelled() => self.sessions.idle().await,
        }
        self.report(shutdown)
    }

    pub(crate) fn log_start(&self, shutdown: &Shutdown) {
        info!(
            drain = ?shutdown.drain,
            "shutting down: taking no new connections, letting those being relayed finish"
        );
    }

    pub(crate) fn report(&self, shutdown: &Shutdown) -> ShutdownReport {
        let connections = self.connections.load(Ordering::Relaxed);
        let cut = self.cut.load(Ordering::Relaxed);
        if cut == 0 {
            info!(connections, "shut down: every connection finished");
        } else if shutdown.cut.is_cancelled() {
            warn!(connections, cut, "shut down: the drain was cut short");
        } else {
            warn!(connections, cut, drain = ?shutdown.drain, "shut down: the drain deadline passed");
        }
        ShutdownReport { connections, cut }
    }
}

/// Counts the tasks of one kind under way, and tells when none is left.
#[derive(Clone)]
pub(crate) struct Tracker(Arc<watch::Sender<usize>>);

impl Default for Tracker {
    fn default() -> Tracker {
        Tracker(Arc::new(watch::Sender::new(0)))
    }
}

impl Tracker {
    /// Counts one more task until the guard is dropped. Take it before spawning the task, so
    /// that a wait for none cannot miss a task that has not started yet.
    pub(crate) fn track(&self) -> Tracked {
        self.0.send_modify(|count| *count += 1);
        Tracked(Arc::clone(&self.0))
    }

    pub(crate) fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until no task is counted.
    pub(crate) async fn idle(&self) {
        // The sender lives in `self`, so the wait cannot fail.
        let _ = self.0.subscribe().wait_for(|&count| count == 0).await;
    }
}

/// One task counted by a [`Tracker`], until dropped (with the task's future, however it ends).
pub(crate) struct Tracked(Arc<watch::Sender<usize>>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count -= 1);
    }
}

/// Drains one gomux connection (or the entry's pool of them, all at once) once the shutdown
/// has begun: the other end's new streams are refused, the streams open go on until they
/// finish, then the connection is closed. At the drain deadline, or when the shutdown is cut
/// short, the streams left are cut, and so are their relays, through `end`. Counts both in
/// `work`.
///
/// The only one to cut the relays of a live session, and only once it has counted them: a
/// relay cut earlier would take its stream with it, uncounted.
pub(crate) async fn drain(
    session: &impl Drain,
    shutdown: &Shutdown,
    work: &Work,
    end: &SessionEnd,
) {
    if session.is_closed() {
        return; // it ended by itself meanwhile: nothing to drain
    }
    let streams = session.stream_count();
    let connections = session.connections();
    work.connections.fetch_add(streams, Ordering::Relaxed);
    // A pool drains all its connections at once: the log says how many.
    info!(streams, connections, "draining");
    let outcome = tokio::select! {
        // Checked first: once the shutdown is cut short, a drain that has not finished yet
        // has nothing left to wait for.
        biased;
        () = shutdown.cut.cancelled() => {
            let streams = session.stream_count();
            // Stops waiting for the streams, though not for the other end's answer to our
            // CloseMux, which an end of this program sends at once (and which the session's
            // close timeout bounds).
            let _ = session.close().await;
            Err(Error::GracefulCloseTimedOut { streams })
        }
        outcome = session.graceful_close(shutdown.drain) => outcome,
    };
    match outcome {
        Ok(()) => info!(connections, "drained and closed"),
        Err(Error::GracefulCloseTimedOut { streams }) => {
            // Cut means cut: a relay does not go on delivering what its stream still holds.
            end.cut.cancel();
            work.cut.fetch_add(streams, Ordering::Relaxed);
            warn!(
                streams,
                connections, "cut the streams still open, and closed"
            );
        }
        Err(error) => warn!(%error, connections, "failed while draining"),
    }
}

/// What [`drain()`] closes: a session, or the entry's pool of sessions to the exit.
pub(crate) trait Drain {
    /// Whether there is nothing left to drain.
    fn is_closed(&self) -> bool;
    /// The streams being relayed.
    fn stream_count(&self) -> usize;
    /// The gomux connections that drain: one for a session, those live for a pool.
    fn connections(&self) -> usize;
    fn graceful_close(&self, timeout: Duration) -> impl Future<Output = Result<(), Error>>;
    fn close(&self) -> impl Future<Output = Result<(), Error>>;
}

impl Drain for Session {
    fn is_closed(&self) -> bool {
        Session::is_closed(self)
    }
    fn stream_count(&self) -> usize {
        Session::stream_count(self)
    }
    fn connections(&self) -> usize {
        1
    }
    fn graceful_close(&self, timeout: Duration) -> impl Future<Output = Result<(), Error>> {
        Session::graceful_close(self, timeout)
    }
    fn close(&self) -> impl Future<Output = Result<(), Error>> {
        Session::close(self)
    }
}

impl Drain for Pool {
    fn is_closed(&self) -> bool {
        self.live() == 0
    }
    fn stream_count(&self) -> usize {
        let sessions = self.sessions();
        sessions.iter().map(|s| s.session().stream_count()).sum()
    }
    fn connections(&self) -> usize {
        self.live()
    }
    fn graceful_close(&self, timeout: Duration) -> impl Future<Output = Result<(), Error>> {
        Pool::graceful_close(self, timeout)
    }
    fn close(&self) -> impl Future<Output = Result<(), Error>> {
        Pool::close(self)
    }
}

/// How the relays of one gomux connection learn that it has ended.
///
/// Through tokens that one task per session cancels, rather than each relay waiting on
/// [`Session::closed`]: a token forgets a waiter as soon as it stops waiting, so a session that
/// carries millions of short connections keeps nothing of them.
#[derive(Clone, Default)]
pub struct SessionEnd {
    /// Cancelled once the session has ended. A relay then stops reading its TCP side (nothing
    /// can be sent on the stream any more), and delivers what its stream still holds: all the
    /// rest, when the other end finished sending before it closed the connection. Within
    /// [`DELIVERY_GRACE`](crate::config::DELIVERY_GRACE), then it is cut.
    pub ended: CancellationToken,
    /// Cancelled to cut the relays at once: the drain deadline passed, or the shutdown was cut
    /// short.
    pub cut: CancellationToken,
}

/// Runs `future`, counted by `guard` until it finishes or is dropped. The guard is taken by
/// the caller, before the future is spawned.
pub(crate) async fn tracked<F: Future>(guard: Tracked, future: F) -> F::Output {
    let _guard = guard;
    future.await
}

/// Calls [`JoinHandle::abort`] when dropped, so a spawned helper task ends with its owner.
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
