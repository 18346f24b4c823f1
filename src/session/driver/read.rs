//! Reading: the transport's bytes, decoded into frames and applied to the core.

use super::{Collected, Connection};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::error::{CodecError, Error};
use crate::frame::{Header, Kind, HEADER_LEN};
use crate::session::core::recv_buf::{Payload, PIN_MIN};
use crate::session::core::{Now, PeerKind};

/// Bytes read in one poll before the driver yields to other tasks, so a peer that floods the
/// connection cannot monopolise a runtime thread.
const READ_BUDGET: usize = 1024 * 1024;

/// A session holding no read buffer (a new one, or one quiet long enough to give it back)
/// reads into this much stack first. The small frames that wake an idle session (a
/// keepalive, a request, a window update) are applied from there, and no read buffer is
/// allocated for them: an idle server's sessions woken now and then allocate nothing, and
/// nothing is left to free, as a hole in the heap, when they go quiet again
/// (`benches/idle_sessions.rs`). A partial frame, a long payload (handed out as a slice of
/// the read buffer) or a read that fills it moves the rest to a read buffer.
const STACK_READ: usize = 512;

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    // Reading.

    /// Applies the frames already buffered, then reads and applies more until the transport
    /// has nothing, the budget is spent, or the control queue is over its bound. Returns whether
    /// the budget ran out (the driver should yield and come back).
    pub(super) fn poll_read_frames(&mut self, cx: &mut Context<'_>) -> bool {
        let mut budget = READ_BUDGET;
        // The time of the last read: of the frames it brought, and of the peer's last word
        // (one clock read serves both; the first frames, buffered before, get a time of their
        // own).
        let mut now = Now::later();
        loop {
            if self.read_closed {
                // After a CloseMux or a broken frame, what follows is not the session's.
                return false;
            }
            if !self.read_buf.is_empty() || self.read_paused {
                match self.apply_frames(&now) {
                    Ok(true) => {
                        // The peer sends faster than it reads our answers: wait for the
                        // transport to take them (the writer wakes us when it does).
                        self.read_paused = true;
                        return false;
                    }
                    Ok(false) => self.read_paused = false,
                    Err(error) => {
                        // Nothing after a CloseMux or a broken frame is read: the session is
                        // over, and what follows a CloseMux stays for `into_inner`.
                        self.read_closed = true;
                        self.end_by_peer(error);
                        return false;
                    }
                }
            }
            if self.read_closed {
                return false;
            }
            now = Now::later();
            let (read, space) = if self.read_buf.is_unallocated() && !self.codec.in_frame() {
                (self.poll_read_stack(cx, &now), STACK_READ)
            } else {
                let missing = self.codec.payload_missing(self.read_buf.get_mut());
                let space = self.read_buf.prepare(missing);
                let read_buf = self.read_buf.get_mut();
                let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, read_buf);
                (read.map_ok(Ok), space)
            };
            let n = match read {
                Poll::Pending => {
                    self.read_buf.drained();
                    return false;
                }
                Poll::Ready(Ok(Ok(0))) => {
                    self.read_closed = true;
                    let error = if let Some((error, _)) = self.write_failed.as_deref() {
                        error.clone()
                    } else if self.read_buf.is_empty() && !self.codec.in_frame() {
                        Error::ConnectionClosed
                    } else {
                        Error::UnexpectedEof
                    };
                    self.end(error, false);
                    return false;
                }
                Poll::Ready(Ok(Err(error))) => {
                    self.read_closed = true;
                    self.end_by_peer(error);
                    return false;
                }
                Poll::Ready(Ok(Ok(n))) => {
                    if n == space {
                        self.read_buf.filled();
                    }
                    n
                }
                Poll::Ready(Err(e)) => {
                    self.read_closed = true;
                    self.end(e.into(), false);
                    return false;
                }
            };
            self.timers.read(self.clock.tick(now.get()));
            budget = budget.saturating_sub(n);
            if budget == 0 {
                // Apply what was read before yielding, so that the readers it wakes run on
                // this thread next (tokio's LIFO slot) rather than after the driver, perhaps
                // on another thread; the next poll reads on.
                match self.apply_frames(&now) {
                    Ok(paused) => self.read_paused = paused,
                    Err(error) => {
                        self.read_closed = true;
                        self.end_by_peer(error);
                        return false;
                    }
                }
                return !self.read_paused;
            }
        }
    }

    /// Ends the session for what the peer sent: a peer that broke the protocol is told so,
    /// best effort; one that sent CloseMux is closing already.
    pub(super) fn end_by_peer(&mut self, error: Error) {
        let close_mux = matches!(error, Error::Protocol(_));
        self.peer_closed = matches!(error, Error::ClosedByPeer);
        self.end(error, close_mux);
    }

    /// Reads into the stack (see [`STACK_READ`]) and applies what was read: the bytes read, or
    /// the error the frames were found to make.
    fn poll_read_stack(
        &mut self,
        cx: &mut Context<'_>,
        now: &Now,
    ) -> Poll<std::io::Result<Result<usize, Error>>> {
        // Left uninitialised: the transport writes what it reads, and only that is looked at.
        let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); STACK_READ];
        let mut buf = ReadBuf::uninit(&mut stack);
        match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled();
                let applied = self
                    .apply_stack_frames(read, now.get())
                    .map(|()| read.len());
                Poll::Ready(Ok(applied))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Applies the frames of a read made on the stack (see [`STACK_READ`]) that are whole and
    /// have short payloads, and moves the rest to the read buffer, from where the next
    /// `apply_frames` takes it. The control queue's bound is left to that too.
    fn apply_stack_frames(&mut self, mut bytes: &[u8], now: Instant) -> Result<(), Error> {
        let source = self.read_buf.source();
        let mut wakers = Collected::new();
        let mut inner = self.shared.lock();
        let result = loop {
            if inner.control_over_limit() || bytes.len() < HEADER_LEN {
                break Ok(());
            }
            let (kind, length) = (
                bytes[7],
                u32::from_le_bytes([bytes[4], bytes[5], bytes[6], 0]),
            );
            let length = length as usize;
            if kind == Kind::Data as u8 && (length >= PIN_MIN || bytes.len() < HEADER_LEN + length)
            {
                break Ok(());
            }
            match self.codec.decode_complete_slice(&mut bytes) {
                Ok(Some(header)) => {
                    let len = payload_len(&header);
                    let payload = Payload::Borrowed(&bytes[..len]);
                    let applied = inner.on_received(header, payload, source, now, wakers.list());
                    bytes = &bytes[len..];
                    if let Err(error) = applied {
                        break Err(error);
                    }
                }
                // Not reached: the frame was checked whole.
                Ok(None) => break Ok(()),
                Err(error) => break decode_failure(error).map_or(Ok(()), Err),
            }
        };
        let kind = inner.peer_kind();
        drop(inner);
        self.after_frames(kind, wakers);
        if result.is_ok() && !bytes.is_empty() {
            self.read_buf.extend_from_read(bytes);
        }
        result
    }

    /// Decodes the whole frames in the read buffer and applies them, under one lock, until the
    /// control queue is over its bound. Returns whether it is (reading must pause).
    pub(super) fn apply_frames(&mut self, now: &Now) -> Result<bool, Error> {
        let now = now.get();
        let source = self.read_buf.source();
        let mut wakers = Collected::new();
        let mut inner = self.shared.lock();
        let result = loop {
            if inner.control_over_limit() {
                break Ok(true);
            }
            let buf = self.read_buf.get_mut();
            match self.codec.decode_complete(buf) {
                Ok(Some(header)) => {
                    let len = payload_len(&header);
                    // A long payload stays a slice of the read buffer; a short one (and the
                    // empty one of other kinds) is copied out by the stream straight from here.
                    let (payload, rest) = if len >= PIN_MIN {
                        (Payload::Shared(buf.split_to(len).freeze()), 0)
                    } else {
                        (Payload::Borrowed(&buf[..len]), len)
                    };
                    let applied = inner.on_received(header, payload, source, now, wakers.list());
                    buf.advance(rest);
                    if let Err(error) = applied {
                        break Err(error);
                    }
                }
                Ok(None) => break Ok(false),
                Err(error) => break decode_failure(error).map_or(Ok(false), Err),
            }
        };
        let kind = inner.peer_kind();
        drop(inner);
        self.after_frames(kind, wakers);
        result
    }

    /// Once frames were applied (the lock released): learns the peer's kind from its first
    /// frame, and wakes the tasks the frames made ready.
    fn after_frames(&mut self, kind: PeerKind, wakers: Collected) {
        wakers.wake();
        if !self.peer_known {
            self.learn_peer(kind);
        }
    }

    /// Once the peer's first frame told what it is: a peer of this crate that announced a
    /// keepalive interval is expected to send something at least that often, so twice that
    /// silence ends the session. (A keepalive goes out after an interval without writes, so a
    /// live peer is never silent longer than one interval plus the way here.)
    pub(super) fn learn_peer(&mut self, kind: PeerKind) {
        match kind {
            PeerKind::Unknown => {}
            PeerKind::Greeted {
                keepalive: Some(interval),
            } => {
                self.peer_known = true;
                self.timers.peer_keepalive(interval);
            }
            PeerKind::Greeted { keepalive: None } | PeerKind::Plain => self.peer_known = true,
        }
    }
}

/// The payload's length: a Data frame's `length`; other kinds carry none.
fn payload_len(header: &Header) -> usize {
    match header.kind {
        Kind::Data => header.length as usize,
        _ => 0,
    }
}

/// The error a decoding failure ends the session with; `None` for what only the encoder
/// reports.
fn decode_failure(error: CodecError) -> Option<Error> {
    match error {
        CodecError::Protocol(e) => Some(e.into()),
        CodecError::Io(e) => Some(e.into()),
        CodecError::InvalidFrame(_) => None,
    }
}
