//! The closing phases: flushing what is queued, shutting the transport down, draining.

use super::{Collected, Connection, Phase};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::Error;
use crate::session::core::Inner;

/// Transport errors that only say the peer has gone, once it has said it was closing.
fn peer_gone(error: &Error) -> bool {
    matches!(error, Error::Transport(e) if matches!(
        e.kind(),
        std::io::ErrorKind::NotConnected
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
    ))
}

/// What `Connection::check_end` does under the session's lock, for a caller that holds it:
/// finishes a drain that is over and wakes `wait_idle` once idle, and when the session has
/// ended queues its final frames and returns true (the driver moves on to flushing). The
/// wakers go to `wakers`, to be woken once the lock is let go.
pub(super) fn ended(inner: &mut Inner, wakers: &mut Collected) -> bool {
    inner.check_draining(wakers.list());
    inner.wake_if_idle(wakers.list());
    if inner.end_reason().is_none() {
        return false;
    }
    inner.queue_final_frames();
    true
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    // Closing.

    /// Moves to closing when the session ended, or drained (see `Inner::check_draining`).
    pub(super) fn check_end(&mut self) {
        let mut wakers = Collected::new();
        let mut inner = self.shared.lock();
        if ended(&mut inner, &mut wakers) {
            self.phase = Phase::Flushing;
        }
        drop(inner);
        wakers.wake();
    }

    pub(super) fn finish(&mut self, close_error: Option<Error>) {
        self.phase = Phase::Done;
        let mut wakers = Collected::new();
        let mut inner = self.shared.lock();
        inner.finish(close_error, wakers.list());
        drop(inner);
        wakers.wake();
    }

    /// Flushing, shutting down and draining, within the close timeout. The transport is read in
    /// every phase, and what arrives is applied (data stays readable): two ends that close at
    /// once while both have bytes queued each flush towards a peer that reads, where reading
    /// only after the flush left both waiting for the other until the close timeout
    /// (`tests/close_paths.rs`, `both_ends_closing_while_busy_*`). Reading stops at the peer's
    /// CloseMux (what follows stays in the transport, for `into_inner`), at a protocol error,
    /// and at the end of the transport.
    pub(super) fn poll_closing(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let shared = &self.shared;
        let deadline = self.close_deadline.get_or_insert_with(|| {
            Box::pin(tokio::time::sleep(shared.lock().config.close_timeout))
        });
        if deadline.as_mut().poll(cx).is_ready() {
            let error = (self.phase != Phase::Draining).then(|| {
                Error::Transport(Arc::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the transport did not accept the final writes within the close timeout",
                )))
            });
            self.finish(error);
            return Poll::Ready(());
        }
        let more_to_read = self.poll_read_frames(cx);
        if self.phase == Phase::Flushing {
            let transport_dead = self.write_failed.is_some()
                || matches!(
                    self.shared.lock().end_reason(),
                    Some(Error::Transport(_) | Error::UnexpectedEof)
                );
            if transport_dead {
                // What was queued cannot be written: a failed write is reported by `close`.
                let failed = self.write_failed.as_deref().map(|(error, _)| error.clone());
                self.finish(failed);
                return Poll::Ready(());
            }
            match self.poll_write_out(cx) {
                Poll::Pending => return self.pending_closing(cx, more_to_read),
                Poll::Ready(Err(e)) if self.peer_closed && peer_gone(&e) => {
                    // The peer closed the session and is gone: nothing of ours was owed to it.
                    self.finish(None);
                    return Poll::Ready(());
                }
                Poll::Ready(Err(e)) => {
                    self.finish(Some(e));
                    return Poll::Ready(());
                }
                Poll::Ready(Ok(())) => self.phase = Phase::ShuttingDown,
            }
        }
        if self.phase == Phase::ShuttingDown {
            match Pin::new(&mut self.io).poll_shutdown(cx) {
                Poll::Pending => return self.pending_closing(cx, more_to_read),
                Poll::Ready(result) => {
                    // A peer that closed first makes shutdown fail; the session is over either
                    // way.
                    let error = result.err().map(Error::from).filter(|e| !peer_gone(e));
                    // Only a close this side started leaves the peer something to say (its
                    // answer to our CloseMux); after its own CloseMux, or a broken protocol,
                    // nothing more of its input is owed anything.
                    let ours =
                        matches!(self.shared.lock().end_reason(), Some(Error::ClosedLocally));
                    if error.is_some() || !ours {
                        self.finish(error);
                        return Poll::Ready(());
                    }
                    self.phase = Phase::Draining;
                }
            }
        }
        // Draining: the peer may still be writing (data, or its own CloseMux). Closing a socket
        // with unread input makes the kernel send a reset, which the peer would see instead of
        // our CloseMux; so read until it closes too. (Both ends of this crate closing at once
        // once saw `ConnectionReset` or `BrokenPipe`: `tests/core_findings_b.rs`,
        // `closing_a_busy_session_*`, `both_ends_closing_at_once_*`.)
        if !self.read_closed {
            return self.pending_closing(cx, more_to_read);
        }
        self.finish(None);
        Poll::Ready(())
    }

    /// Waits in a closing phase: at once again if the read budget ran out (the transport may
    /// have more), otherwise for the transport or the close deadline, both registered.
    pub(super) fn pending_closing(&mut self, cx: &mut Context<'_>, more_to_read: bool) -> Poll<()> {
        if more_to_read {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}
