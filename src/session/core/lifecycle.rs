//! How a session ends, and what its handles learn of it.
//!
//! A session is *live* until it *ends* (a local or peer close, a protocol error, a transport
//! failure, a timeout): from then on every stream operation fails with the reason, though data
//! already received stays readable. The driver then writes out what is queued and closes the
//! transport; once it has, the session is *finished*. Before it ends, a transport that refused
//! a write makes writes, opens and flushes fail at once, while the driver reads on for a while.

use std::task::Waker;

use super::outgoing::Control;
use super::wait_list::WaitList;
use super::Inner;
use crate::error::Error;
use crate::frame::{Header, Kind};
use crate::trace::event;

pub(super) struct Lifecycle {
    /// Why the session ended, once it has. Stream operations fail with it from then on.
    end: Option<Error>,
    /// Whether the driver should send CloseMux before closing the transport (until it queues
    /// it).
    send_close_mux: bool,
    /// The session ended with this side's CloseMux to send (kept once it is queued).
    close_mux_ours: bool,
    /// The driver has finished: the transport is closed or abandoned.
    finished: bool,
    /// What went wrong with the transport, once something has (boxed: few sessions need it).
    transport: Option<Box<TransportErrors>>,
    /// Tasks waiting for the driver to finish.
    close_waiters: WaitList,
    /// Live `Session` handles. When none is left, the session drains (see `draining`).
    pub(super) session_handles: usize,
    /// `Session::graceful_close` was called: inbound streams are refused, opens fail, and the
    /// session closes itself once no stream has anything left to do.
    closing_gracefully: bool,
    /// Tasks waiting for the session to have no stream with anything left to do
    /// (`Session::wait_idle`).
    idle_waiters: WaitList,
    /// Tasks waiting for the session to drain or end (`Session::draining`).
    drain_waiters: WaitList,
}

#[derive(Default)]
struct TransportErrors {
    /// A transport error met while closing, reported by `Session::close`.
    close_error: Option<Error>,
    /// The transport refused a write, so nothing queued will be sent.
    write_failed: Option<Error>,
}

impl Lifecycle {
    pub(super) fn new() -> Lifecycle {
        Lifecycle {
            end: None,
            send_close_mux: false,
            close_mux_ours: false,
            finished: false,
            transport: None,
            close_waiters: WaitList::new(),
            session_handles: 1,
            closing_gracefully: false,
            idle_waiters: WaitList::new(),
            drain_waiters: WaitList::new(),
        }
    }

    pub(super) fn end_reason(&self) -> Option<&Error> {
        self.end.as_ref()
    }

    pub(super) fn ended(&self) -> bool {
        self.end.is_some()
    }

    pub(super) fn finished(&self) -> bool {
        self.finished
    }

    pub(super) fn write_failed(&self) -> Option<&Error> {
        self.transport.as_ref()?.write_failed.as_ref()
    }

    fn close_error(&self) -> Option<&Error> {
        self.transport.as_ref()?.close_error.as_ref()
    }

    fn transport_errors(&mut self) -> &mut TransportErrors {
        self.transport.get_or_insert_with(Box::default)
    }

    /// The error a new operation fails with: the session's end, or a refused transport write.
    pub(super) fn unusable(&self) -> Option<&Error> {
        self.end.as_ref().or_else(|| self.write_failed())
    }

    /// Whether the session takes no new streams and closes once its last one is gone: it is
    /// closing gracefully, or nobody holds a `Session` handle to accept or open any more.
    pub(super) fn draining(&self) -> bool {
        self.closing_gracefully || self.session_handles == 0
    }

    /// Whether `Session::graceful_close` was called (opens and accepts fail from then on).
    pub(super) fn closing_gracefully(&self) -> bool {
        self.closing_gracefully
    }

    /// Whether the session ended with a CloseMux of this side's, queued or to be.
    pub(super) fn sends_close_mux(&self) -> bool {
        self.close_mux_ours
    }
}

impl Inner {
    /// Why the session ended, if it has.
    pub(crate) fn end_reason(&self) -> Option<&Error> {
        self.life.end.as_ref()
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.life.finished
    }

    /// Ends the session with `error` (the first reason wins) and wakes everything waiting, so
    /// that each operation sees the end.
    pub(crate) fn end(&mut self, error: Error, send_close_mux: bool, wakers: &mut Vec<Waker>) {
        if self.life.end.is_some() {
            return;
        }
        crate::trace::session_ended(self.id, &error);
        self.life.end = Some(error);
        self.life.send_close_mux = send_close_mux;
        self.life.close_mux_ours = send_close_mux;
        if send_close_mux && self.peer.greeted() {
            // The peer takes every stream of its that is not acknowledged before our CloseMux
            // as refused: the queued ones will never be handed out (see `poll_accept`).
            while let Some(key) = self.accept_queue.pop_front() {
                self.release(key, true, true);
            }
        }
        self.wake_all_outgoing(wakers);
        self.peer.wake_all(wakers);
        self.accept_waiters.wake_all(wakers);
        self.life.idle_waiters.wake_all(wakers);
        self.life.drain_waiters.wake_all(wakers);
        // The lists stay until their futures go: each gives its slot back when dropped.
        if let Some(rare) = &mut self.rare {
            for list in rare.stop_waiters.values_mut() {
                list.wake_all(wakers);
            }
        }
        wakers.extend(self.take_driver_waker());
    }

    /// Starts a graceful close: no new stream either way, queued inbound streams refused, and
    /// the session closes itself once the streams already open are done.
    pub(crate) fn start_draining(&mut self, wakers: &mut Vec<Waker>) {
        if self.life.closing_gracefully || self.life.ended() {
            return;
        }
        event!(
            debug,
            session = self.id,
            streams = self.unfinished,
            "graceful close started"
        );
        self.life.closing_gracefully = true;
        self.life.drain_waiters.wake_all(wakers);
        self.accept_waiters.wake_all(wakers);
        self.wake_openers(wakers);
        self.peer.wake_all(wakers);
        self.check_draining(wakers);
    }

    /// Starts a graceful close from this side.
    pub(crate) fn close(&mut self, wakers: &mut Vec<Waker>) {
        self.end(crate::Error::ClosedLocally, true, wakers);
    }

    /// Once the session has ended: queues its CloseMux if it is to send one, once.
    pub(crate) fn queue_final_frames(&mut self) {
        if std::mem::take(&mut self.life.send_close_mux) {
            self.queue_close_mux();
        }
    }

    /// How the session went, once the driver is done: `Ok` after a graceful close by either side
    /// whose final writes and shutdown succeeded, otherwise the error.
    pub(crate) fn outcome(&self) -> Result<(), Error> {
        if let Some(error) = self.life.close_error() {
            return Err(error.clone());
        }
        match &self.life.end {
            None | Some(Error::ClosedLocally | Error::ClosedByPeer) => Ok(()),
            Some(error) => Err(error.clone()),
        }
    }

    /// Records that the transport refused a write: everything waiting to write or for its
    /// bytes to be written is woken to fail.
    pub(crate) fn transport_write_failed(&mut self, error: Error, wakers: &mut Vec<Waker>) {
        if self.life.write_failed().is_some() {
            return;
        }
        self.life.transport_errors().write_failed = Some(error);
        self.wake_all_outgoing(wakers);
    }

    /// Marks the driver finished (with the transport error met while closing, if any) and
    /// wakes those waiting for it.
    pub(crate) fn finish(&mut self, close_error: Option<Error>, wakers: &mut Vec<Waker>) {
        if let Some(error) = close_error.filter(|_| self.life.close_error().is_none()) {
            self.life.transport_errors().close_error = Some(error);
        }
        self.life.finished = true;
        self.life.close_waiters.wake_all(wakers);
        // Nothing will be written any more: flushes still waiting learn it now.
        self.wake_all_outgoing(wakers);
    }

    /// Registers a task to wake when the driver finishes; true once it has.
    pub(crate) fn poll_finished(&mut self, waker: &Waker, slot: &mut Option<usize>) -> bool {
        if self.life.finished {
            return true;
        }
        self.life.close_waiters.register(slot, waker);
        false
    }

    /// A `closed()` future is gone.
    pub(crate) fn close_waiter_gone(&mut self, slot: &mut Option<usize>) {
        self.life.close_waiters.remove(slot);
    }

    pub(crate) fn add_session_handle(&mut self) {
        self.life.session_handles += 1;
    }

    pub(crate) fn drop_session_handle(&mut self) {
        self.life.session_handles -= 1;
    }

    /// Moves a draining session towards its end: inbound streams nobody will accept are
    /// refused (CloseStream), and once no stream has anything left to do and everything
    /// queued is written, the session closes itself. Finished streams whose handles are kept
    /// do not hold it. (Counting handles, a server that closed a stream and kept its handle
    /// timed out: `tests/close_core.rs`, `a_closed_stream_whose_handle_is_kept_*`.)
    pub(crate) fn check_draining(&mut self, wakers: &mut Vec<Waker>) {
        if !self.life.draining() {
            return;
        }
        while let Some(key) = self.accept_queue.pop_front() {
            self.refuse_closed_by_opener(key);
            self.release(key, true, true);
        }
        if self.life.end.is_none() && self.idle() {
            self.close(wakers);
        }
    }

    /// A greeted peer waits for an answer to every stream it opened, even one it closed
    /// already (see `peer::Unanswered`): one that goes unaccepted is refused with CloseStream,
    /// which `release` does not send for a stream the peer closed.
    fn refuse_closed_by_opener(&mut self, key: usize) {
        let closed_by_opener = self
            .streams
            .get(key)
            .is_some_and(|stream| !stream.may_send_frames());
        if closed_by_opener && self.peer.greeted() && !self.life.ended() {
            if let Some(stream) = self.streams.get(key) {
                let refusal = Header::new(stream.id, Kind::CloseStream);
                self.queue_control(Control::Frame(refusal));
            }
        }
    }

    /// Whether the session is draining and idle, so the driver should close it.
    pub(crate) fn drained(&self) -> bool {
        self.life.draining() && self.idle()
    }

    /// Registers a task to wake when no stream has anything left to do and everything queued
    /// is written (or the session has ended); true once so.
    pub(crate) fn poll_idle(&mut self, waker: &Waker, slot: &mut Option<usize>) -> bool {
        if self.idle() || self.life.ended() {
            return true;
        }
        self.life.idle_waiters.register(slot, waker);
        false
    }

    /// Whether the session drains or has ended: `Session::is_draining`.
    pub(crate) fn is_draining(&self) -> bool {
        self.life.draining() || self.life.ended()
    }

    /// Registers a task to wake when the session starts draining or ends; true once it has.
    pub(crate) fn poll_draining(&mut self, waker: &Waker, slot: &mut Option<usize>) -> bool {
        if self.is_draining() {
            return true;
        }
        self.life.drain_waiters.register(slot, waker);
        false
    }

    /// A `draining()` future is gone.
    pub(crate) fn drain_waiter_gone(&mut self, slot: &mut Option<usize>) {
        self.life.drain_waiters.remove(slot);
    }

    /// A `wait_idle()` future is gone.
    pub(crate) fn idle_waiter_gone(&mut self, slot: &mut Option<usize>) {
        self.life.idle_waiters.remove(slot);
    }

    /// Wakes the tasks waiting for the session to be idle, if it is.
    pub(crate) fn wake_if_idle(&mut self, wakers: &mut Vec<Waker>) {
        if !self.life.idle_waiters.is_empty() && self.idle() {
            self.life.idle_waiters.wake_all(wakers);
        }
    }

    /// Waiters in the lists of `accept` and `closed`, for tests.
    #[cfg(test)]
    pub(crate) fn session_waiters(&self) -> (usize, usize) {
        (self.accept_waiters.len(), self.life.close_waiters.len())
    }
}
