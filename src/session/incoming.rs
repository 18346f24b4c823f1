//! [`Incoming`]: the streams the peer opens, as a [`futures_core::Stream`].

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::Session;
use crate::error::Error;
use crate::stream::Stream;

/// The streams the peer opens, from [`Session::incoming`].
#[must_use = "streams do nothing unless polled"]
pub struct Incoming {
    session: Session,
    done: bool,
    /// Its slot among the tasks waiting in `accept`, held while it lives.
    slot: Option<usize>,
}

impl Incoming {
    pub(super) fn new(session: Session) -> Incoming {
        Incoming {
            session,
            done: false,
            slot: None,
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if self.slot.is_some() {
            self.session
                .shared
                .lock()
                .accept_waiter_gone(&mut self.slot);
        }
    }
}

impl futures_core::Stream for Incoming {
    type Item = Result<Stream, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let this = &mut *self;
        match this.session.poll_accept(cx, &mut this.slot) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(stream)) => Poll::Ready(Some(Ok(stream))),
            Poll::Ready(Err(error)) => {
                self.done = true;
                if error.is_graceful() {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Err(error)))
                }
            }
        }
    }
}

impl fmt::Debug for Incoming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming")
            .field("done", &self.done)
            .finish()
    }
}
