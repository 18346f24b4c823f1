//! One stream's state: what each direction may still do, its receive buffer and credit, and
//! its places in the session's wait queues.
//!
//! Each direction is an explicit enum, so that a reader sees at once what a frame or a call
//! may do to a stream, and combinations the protocol cannot produce cannot be written.

use std::task::Waker;

use super::recv_buf::RecvBuffer;
use crate::error::Error;
use crate::flow::{RecvWindow, Tuner};
use crate::frame::INITIAL_WINDOW;
use crate::stopped::Stopped;

/// `StreamState::send_queue` of a stream with nothing queued nor unwritten.
pub(super) const NO_QUEUE: u32 = u32::MAX;

/// This side's sending direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendState {
    /// Writes go out as credit allows.
    Open,
    /// This side shut it down (sent CloseRead or CloseStream): writes fail with `WriteClosed`.
    Shut,
    /// The peer stopped reading (sent CloseWrite or CloseStream): writes fail with
    /// `PeerReadClosed`.
    PeerStopped,
}

/// This side's receiving direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecvState {
    /// Data arrives within the credit granted.
    Open,
    /// The peer sent CloseRead or CloseStream: reads end once the buffer is drained, and more
    /// data from the peer breaks the protocol.
    PeerShut,
    /// This side stopped reading (sent CloseWrite or CloseStream, or its read half went):
    /// reads end, data still in flight is discarded.
    Stopped,
}

/// Who sent CloseStream, once somebody has. A side that received CloseStream does not send
/// its own, and sends nothing more for the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closed {
    No,
    ByUs,
    ByPeer,
}

/// What the stream's writing side waits for, so that each event wakes only the task it can
/// help: a WindowUpdate a writer waiting for credit, room in the send queues one waiting for
/// room (see `Outgoing`), the driver's progress a flush or close waiting for its bytes to be
/// written. One task at a time writes, flushes or closes a stream (each takes `&mut` of the
/// handle that writes), so one waker serves them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteWait {
    Idle,
    Credit,
    Room,
    Written,
}

pub(super) struct StreamState {
    pub(super) id: u32,
    pub(super) send: SendState,
    pub(super) recv: RecvState,
    pub(super) closed: Closed,
    /// Handles that may read (`Stream`, `OwnedReadHalf`, a place in the accept queue) and that may
    /// write (`Stream`, `OwnedWriteHalf`, the accept queue). When the readers are gone the stream
    /// stops reading on the wire; when the writers are gone it shuts its writing down; when
    /// both are, it closes.
    pub(super) readers: u8,
    pub(super) writers: u8,
    pub(super) buffer: RecvBuffer,
    pub(super) window: RecvWindow,
    pub(super) tuner: Tuner,
    /// Credit the peer granted and this side has not spent.
    pub(super) send_credit: u32,
    /// Its send queue in `SendQueues`, or [`NO_QUEUE`]: it has one while anything it queued
    /// is not written.
    pub(super) send_queue: u32,
    /// The control-queue position (wrapping) just past its last frame there, when `queued`
    /// has `IN_CONTROL`: its OpenStream goes there when the stream is opened, and a close
    /// when the stream has no send queue (nothing of it is unwritten), so that they go out at
    /// once and count in the control queue's bound; so does what a direct write of its
    /// left unwritten. Its flush waits for it.
    pub(super) control_mark: u32,
    /// The session's queues the stream has an entry in.
    pub(super) queued: Queued,
    /// Room kept for its writer, once let in after waiting for room.
    pub(super) room_grant: RoomGrant,
    pub(super) write_wait: WriteWait,
    pub(super) read_waker: Option<Waker>,
    pub(super) write_waker: Option<Waker>,
    /// What the peer has said about the stream (its `stopped()` waiter, if any, waits in
    /// `Inner::stop_waiters`, so that streams nobody asks about pay nothing for it).
    pub(super) peer: PeerSaid,
}

/// What the peer has said about a stream: nothing yet, something (data, credit, a
/// half-close; for a stream it opened, the open), or that it stopped taking data. A stream of
/// ours that a peer of this crate closes before saying anything was refused. A stream of ours
/// in `Nothing` counts in the backlog of unacknowledged streams (`peer.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PeerSaid {
    Nothing,
    Something,
    Stopped(Stopped),
}

impl PeerSaid {
    /// The peer sent something for the stream; true the first time (see `Inner::acknowledged`).
    pub(super) fn heard(&mut self) -> bool {
        let first = *self == PeerSaid::Nothing;
        if first {
            *self = PeerSaid::Something;
        }
        first
    }

    pub(super) fn stopped(self) -> Option<Stopped> {
        match self {
            PeerSaid::Stopped(how) => Some(how),
            _ => None,
        }
    }
}

impl StreamState {
    pub(super) fn new(id: u32, receive_window: u32) -> StreamState {
        StreamState {
            id,
            send: SendState::Open,
            recv: RecvState::Open,
            closed: Closed::No,
            readers: 1,
            writers: 1,
            buffer: RecvBuffer::new(),
            window: RecvWindow::new(receive_window),
            tuner: Tuner::default(),
            send_credit: INITIAL_WINDOW,
            send_queue: NO_QUEUE,
            control_mark: 0,
            queued: Queued::default(),
            room_grant: RoomGrant::default(),
            write_wait: WriteWait::Idle,
            read_waker: None,
            write_waker: None,
            peer: PeerSaid::Nothing,
        }
    }

    /// Whether this side may still send frames for the stream (nobody sent CloseStream).
    pub(super) fn may_send_frames(&self) -> bool {
        self.closed == Closed::No
    }

    /// Whether nothing is left to happen on the stream but writing out what it queued: this
    /// side closed it, or both directions have ended (by either side). Data received and not
    /// read does not count: it is read from the buffer, with no frame on the wire.
    pub(super) fn finished(&self) -> bool {
        self.closed == Closed::ByUs || self.send != SendState::Open && self.recv != RecvState::Open
    }

    /// Whether the peer may still send data (so returning credit is worth a frame).
    pub(super) fn peer_may_send(&self) -> bool {
        self.recv == RecvState::Open && self.closed == Closed::No
    }

    /// Why writing fails, if it does on the stream's own account.
    pub(super) fn write_error(&self) -> Option<Error> {
        if self.refused() {
            return Some(Error::Refused);
        }
        match self.send {
            SendState::Open => None,
            SendState::Shut => Some(Error::WriteClosed),
            SendState::PeerStopped => Some(Error::PeerReadClosed),
        }
    }

    /// Whether a peer of this crate refused the stream: it closed it before its application
    /// accepted it.
    pub(super) fn refused(&self) -> bool {
        self.peer == PeerSaid::Stopped(Stopped::Refused)
    }

    /// The peer sent CloseRead: no more data is coming.
    pub(super) fn on_peer_shut(&mut self) {
        let _ = self.peer.heard();
        if self.recv == RecvState::Open {
            self.recv = RecvState::PeerShut;
        }
    }

    /// The peer sent CloseWrite: it reads no more.
    pub(super) fn on_peer_stopped(&mut self) {
        if self.send == SendState::Open {
            self.send = SendState::PeerStopped;
        }
        if self.peer.stopped().is_none() {
            self.peer = PeerSaid::Stopped(Stopped::ReadClosed);
        }
    }

    /// The peer sent CloseStream. A peer of this crate (`greeted`) acknowledges every stream
    /// its application accepts, so one it closes before anything else came back it refused;
    /// any other peer may have accepted and handled it, so that is an ordinary close.
    pub(super) fn on_peer_closed(&mut self, greeted: bool) {
        let how = match self.peer {
            PeerSaid::Nothing if greeted => Stopped::Refused,
            PeerSaid::Nothing => Stopped::Closed,
            PeerSaid::Something => Stopped::Closed,
            PeerSaid::Stopped(how) => how,
        };
        if self.recv == RecvState::Open {
            self.recv = RecvState::PeerShut;
        }
        if self.send == SendState::Open {
            self.send = SendState::PeerStopped;
        }
        self.peer = PeerSaid::Stopped(how);
        if self.closed == Closed::No {
            self.closed = Closed::ByPeer;
        }
    }

    /// Every waiting task of the stream, to see a change that concerns them all.
    pub(super) fn wake_all(&mut self, wakers: &mut Vec<Waker>) {
        self.write_wait = WriteWait::Idle;
        wakers.extend(self.read_waker.take());
        wakers.extend(self.write_waker.take());
    }

    /// The writer, if it waits for `what`.
    pub(super) fn wake_writer(&mut self, what: WriteWait, wakers: &mut Vec<Waker>) {
        if self.write_wait == what {
            self.write_wait = WriteWait::Idle;
            wakers.extend(self.write_waker.take());
        }
    }

    /// Registers the writer's waker as waiting for `what` (replacing any earlier one).
    pub(super) fn wait_to_write(&mut self, what: WriteWait, waker: &Waker) {
        self.write_wait = what;
        register(&mut self.write_waker, waker);
    }
}

/// The session's queues a stream has an entry in, a bit each (every stream pays for its state,
/// so it is kept small: `core::tests::stream_state_stays_small`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Queued(u8);

impl Queued {
    /// The control queue, for credit the stream owes the peer.
    pub(super) const CREDIT: u8 = 1 << 0;
    /// The queue of writers waiting for room.
    pub(super) const ROOM: u8 = 1 << 1;
    /// `Inner::stop_waiters`, for a task waiting in `stopped()`.
    pub(super) const STOP: u8 = 1 << 3;
    /// The queue of tasks waiting for a close in the control queue to be written.
    pub(super) const FLUSH: u8 = 1 << 2;
    /// Not a queue: `control_mark` holds the position of its last frame in the control queue.
    pub(super) const IN_CONTROL: u8 = 1 << 4;
    /// Not a queue: the stream's send priority is not 0, and kept in `Inner::priorities`.
    pub(super) const PRIORITY: u8 = 1 << 6;
    /// Not a queue either: the stream is finished (see `StreamState::finished`) and counted out
    /// of `Inner::unfinished`.
    pub(super) const FINISHED: u8 = 1 << 5;

    pub(super) fn has(self, queue: u8) -> bool {
        self.0 & queue != 0
    }

    pub(super) fn set(&mut self, queue: u8, on: bool) {
        if on {
            self.0 |= queue;
        } else {
            self.0 &= !queue;
        }
    }
}

/// Room in the data queue kept for a writer let in (see `Inner::wake_room`): bytes in the low
/// 24 bits (at most 16 MiB, more than any share of the queue needs), the grant epoch in the
/// high 8. A grant of an earlier epoch is void.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RoomGrant(u32);

impl RoomGrant {
    const BYTES: u32 = (1 << 24) - 1;

    pub(super) fn new(bytes: usize, epoch: u8) -> RoomGrant {
        let bytes = u32::try_from(bytes).unwrap_or(Self::BYTES).min(Self::BYTES);
        RoomGrant(u32::from(epoch) << 24 | bytes)
    }

    /// Whether room was kept and is void now: granted in an epoch before `epoch`, not used up.
    pub(super) fn voided(self, epoch: u8) -> bool {
        self.0 & Self::BYTES != 0 && self.0 >> 24 != u32::from(epoch)
    }

    /// The room still kept, if the grant is of `epoch`.
    pub(super) fn bytes(self, epoch: u8) -> u32 {
        if self.0 >> 24 == u32::from(epoch) {
            self.0 & Self::BYTES
        } else {
            0
        }
    }
}

/// Stores `waker` in `slot`, cloning only when it would wake a different task.
pub(super) fn register(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(stored) if stored.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}
