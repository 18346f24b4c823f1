//! Who waits on the outgoing side: writers and openers for room in the send queues, streams for
//! their bytes to be written.
//!
//! - Writers and openers wait while the send queues hold `write_buffer_size` bytes or more. They
//!   are let in oldest first, each writer with an equal share of the room freed
//!   ([`Inner::wake_room`]), and the room promised to them stays reserved until they use it:
//!   a writer that never waited cannot take it from them (`tests/core_findings_a.rs`,
//!   `*_gets_its_turn`). A writer whose stream can no longer be written gets no room, and gives
//!   back what it holds ([`Inner::release_room_grant`]); one whose grant the driver voided
//!   before its task ran goes back to the front of the line when it returns.
//! - Every waiting future holds at most one entry in a wait queue, and a re-poll replaces its
//!   waker instead of adding one (`tests/core_findings_a.rs`, `*_do_not_pile_up_its_waker`,
//!   `*_leave_no_registrations_behind`); entries of futures gone are dropped once they could be
//!   half of their queue.
//! - A stream's bytes are written once its send queue is gone and its last frame in the control
//!   queue is written ([`Inner::is_written`]).

use std::collections::VecDeque;
use std::task::Waker;

use super::super::slab::Slab;
use super::super::stream_state::{register, Queued, RoomGrant, WriteWait, NO_QUEUE};
use super::super::Inner;
use super::Outgoing;
use crate::frame::HEADER_LEN;

/// A task waiting for room in the send queues.
pub(in crate::session::core) enum RoomWaiter {
    /// A stream's writer, for `want` bytes.
    Stream { key: usize, id: u32, want: usize },
    /// An `open`, by its slot in `Waits::openers`.
    Open { slot: usize },
}

/// An `open` future waiting for room.
pub(in crate::session::core) struct Opener {
    waker: Option<Waker>,
    queued: bool,
    /// Room reserved for it by [`Inner::wake_room`], in that grant epoch.
    granted: Option<u8>,
}

/// The tasks waiting on the outgoing side: writers and openers for room in the send queues,
/// streams for their closes to be written. Boxed apart, made by the first wait and dropped when
/// the session goes quiet with nobody waiting, so that an idle session does not carry it.
#[derive(Default)]
pub(in crate::session::core) struct Waits {
    pub(in crate::session::core) room: VecDeque<RoomWaiter>,
    pub(in crate::session::core) openers: Slab<Opener>,
    /// Tasks waiting for a close of their stream in the control queue to be written: its
    /// position (wrapping), the stream. Positions only grow, so the oldest is first.
    pub(in crate::session::core) flush_control: VecDeque<(u32, usize, u32)>,
}

impl Outgoing {
    /// Whether writers or openers wait for room.
    pub(in crate::session::core) fn room_waiting(&self) -> bool {
        self.waits.as_ref().is_some_and(|w| !w.room.is_empty())
    }

    pub(in crate::session::core) fn waits(&mut self) -> &mut Waits {
        self.waits.get_or_insert_with(Box::default)
    }
}

impl Inner {
    /// Whether writers and openers without a grant may queue more: the data queue and the
    /// room reserved for woken waiters are below the queue's size, and nobody waits for room
    /// (who did not wait does not go ahead of those who do).
    pub(in crate::session::core) fn data_has_room(&self) -> bool {
        self.room_free() && !self.out.room_waiting()
    }

    /// Whether the data queue and the room reserved are below the queue's size.
    fn room_free(&self) -> bool {
        self.out.queues.queued + self.out.reserved < self.config.write_buffer_size
    }

    /// Whether writers wait for room that is free, or that only grants not used up hold (the
    /// data queue is empty): the driver has to let them in, voiding those grants first, or a
    /// writer let in that wrote less than its share would keep the rest reserved, and an
    /// `open` behind it would wait for good (`tests/model.proptest-regressions`).
    pub(in crate::session::core) fn room_to_hand_out(&self) -> bool {
        self.out.room_waiting() && (self.room_free() || self.out.queues.queued == 0)
    }

    /// The stream queued a frame of `size` bytes: what it holds of a grant of room is used up
    /// by as much, and released from the reservation.
    pub(in crate::session::core) fn use_room_grant(&mut self, key: usize, size: usize) {
        let epoch = self.out.grant_epoch;
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        let kept = stream.room_grant.bytes(epoch) as usize;
        let used = size.min(kept);
        stream.room_grant = RoomGrant::new(kept - used, epoch);
        self.out.reserved = self.out.reserved.saturating_sub(used);
    }

    /// The stream's writer can use no room any more (its write failed, or the stream is going
    /// away): it leaves the line for room, and what it holds of a grant goes back at once, not
    /// after the driver's patience with unclaimed grants, which a session busy with other
    /// output may never run out of.
    pub(in crate::session::core) fn release_room_grant(&mut self, key: usize) {
        let epoch = self.out.grant_epoch;
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        // Its entry in the line is skipped when reached.
        stream.queued.set(Queued::ROOM, false);
        let kept = stream.room_grant.bytes(epoch) as usize;
        stream.room_grant = RoomGrant::default();
        self.out.reserved = self.out.reserved.saturating_sub(kept);
    }

    /// The room kept for the stream's writer, if it was let in: it may queue that much even
    /// when the queue looks full.
    pub(in crate::session::core) fn room_granted(&self, key: usize) -> usize {
        self.streams
            .get(key)
            .map_or(0, |s| s.room_grant.bytes(self.out.grant_epoch) as usize)
    }

    /// Takes the opener's grant of room (one OpenStream's worth), if it holds a live one.
    pub(in crate::session::core) fn take_opener_grant(&mut self, slot: Option<usize>) -> bool {
        let epoch = self.out.grant_epoch;
        let waits = self.out.waits.as_deref_mut();
        let Some(opener) = slot.and_then(|key| waits?.openers.get_mut(key)) else {
            return false;
        };
        if opener.granted.take() == Some(epoch) {
            self.out.reserved = self.out.reserved.saturating_sub(HEADER_LEN);
            return true;
        }
        false
    }

    /// Voids every grant of room not used yet: called when the driver finds room unclaimed,
    /// so that a cancelled waiter's share goes to the next one.
    pub(crate) fn void_room_grants(&mut self) {
        self.out.grant_epoch = self.out.grant_epoch.wrapping_add(1);
        self.out.reserved = 0;
    }

    /// Lets in writers and openers waiting for room in the send queues, oldest first, until
    /// what they mean to queue fills the room; returns whether any are left waiting. Each
    /// writer let in gets an equal share of the room (at least what it asked for), which it may
    /// use for several frames: with one frame each, the first of several writers let in at once
    /// would take all the room left over, every batch (`tests/core_findings_b.rs`,
    /// `eight_tuned_streams_on_one_long_fat_link_get_similar_shares`).
    ///
    /// Waking them all instead would wake every blocked task (tens of thousands with as many
    /// streams) for the few that fit, and all but those would queue up again: quadratic work.
    /// A woken task whose write was cancelled leaves its share unused; the driver passes unused
    /// room on (it calls this again whenever it finds the queue empty), so nobody waits behind
    /// it.
    pub(crate) fn wake_room(&mut self, wakers: &mut Vec<Waker>) -> bool {
        let epoch = self.out.grant_epoch;
        let out = &mut self.out;
        let Some(waits) = out.waits.as_deref_mut() else {
            return false;
        };
        let mut room = self
            .config
            .write_buffer_size
            .saturating_sub(out.queues.queued + out.reserved);
        let share = room / waits.room.len().max(1);
        while room > 0 {
            let Some(waiter) = waits.room.pop_front() else {
                break;
            };
            match waiter {
                RoomWaiter::Stream { key, id, want } => {
                    let Some(stream) = self.streams.get_mut(key).filter(|s| s.id == id) else {
                        continue;
                    };
                    if !stream.queued.has(Queued::ROOM) {
                        continue;
                    }
                    stream.queued.set(Queued::ROOM, false);
                    if stream.write_error().is_some() {
                        // Its writer's next poll fails: it is woken for that, and gets no room.
                        stream.wake_writer(WriteWait::Room, wakers);
                        continue;
                    }
                    // A share is at most `write_buffer_size`, and a frame at most 8 + 2^24 - 1.
                    let grant = share.max(want).min(room.max(want));
                    stream.room_grant = RoomGrant::new(grant, epoch);
                    stream.wake_writer(WriteWait::Room, wakers);
                    out.reserved += stream.room_grant.bytes(epoch) as usize;
                    room = room.saturating_sub(grant);
                }
                RoomWaiter::Open { slot } => {
                    let Some(opener) = waits.openers.get_mut(slot) else {
                        continue;
                    };
                    if !opener.queued {
                        continue;
                    }
                    opener.queued = false;
                    opener.granted = Some(epoch);
                    wakers.extend(opener.waker.take());
                    out.reserved += HEADER_LEN;
                    room = room.saturating_sub(HEADER_LEN);
                }
            }
        }
        !waits.room.is_empty()
    }

    pub(crate) fn room_waiting(&self) -> bool {
        self.out.room_waiting()
    }

    /// The stream's writer waits for room for `want` bytes.
    pub(in crate::session::core) fn wait_for_room(
        &mut self,
        key: usize,
        waker: &Waker,
        want: usize,
    ) {
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        stream.wait_to_write(WriteWait::Room, waker);
        if !stream.queued.has(Queued::ROOM) {
            stream.queued.set(Queued::ROOM, true);
            // A writer let in whose grant the driver voided before it ran (its task came late,
            // not cancelled, since it is back) keeps its place: the front of the line.
            let voided = stream.room_grant.voided(self.out.grant_epoch);
            stream.room_grant = RoomGrant::default();
            let id = stream.id;
            let waiter = RoomWaiter::Stream { key, id, want };
            let room = &mut self.out.waits().room;
            if voided {
                room.push_front(waiter);
            } else {
                room.push_back(waiter);
            }
            self.prune_room();
        }
    }

    /// An `open` future waits for room, holding `slot` in the openers until it is dropped.
    pub(in crate::session::core) fn opener_waits(
        &mut self,
        slot: &mut Option<usize>,
        waker: &Waker,
    ) {
        let waits = self.out.waits();
        let key = match slot.filter(|&key| waits.openers.get(key).is_some()) {
            Some(key) => key,
            None => {
                let key = waits.openers.insert(Opener {
                    waker: None,
                    queued: false,
                    granted: None,
                });
                *slot = Some(key);
                key
            }
        };
        let Some(opener) = waits.openers.get_mut(key) else {
            return;
        };
        register(&mut opener.waker, waker);
        if !opener.queued {
            opener.queued = true;
            waits.room.push_back(RoomWaiter::Open { slot: key });
            self.prune_room();
        }
    }

    /// An `open` future is gone: its slot is given back (its queue entry, if any, is skipped).
    pub(crate) fn opener_gone(&mut self, slot: &mut Option<usize>) {
        if let (Some(key), Some(waits)) = (slot.take(), self.out.waits.as_deref_mut()) {
            waits.openers.remove(key);
        }
    }

    /// Drops queue entries of streams and openers that are gone, once they could be half of
    /// the queue, so that the queue stays within twice the futures waiting.
    fn prune_room(&mut self) {
        let Some(waits) = self.out.waits.as_deref_mut() else {
            return;
        };
        let live = self.streams.len() + waits.openers.len();
        if waits.room.len() <= 2 * live + 64 {
            return;
        }
        let (streams, openers) = (&self.streams, &waits.openers);
        waits.room.retain(|waiter| match *waiter {
            RoomWaiter::Stream { key, id, .. } => streams
                .get(key)
                .is_some_and(|s| s.id == id && s.queued.has(Queued::ROOM)),
            RoomWaiter::Open { slot } => openers.get(slot).is_some_and(|o| o.queued),
        });
    }

    /// Whether everything the stream queued, closes included, is written (or it is gone).
    pub(in crate::session::core) fn is_written(&self, key: usize) -> bool {
        self.streams.get(key).is_none_or(|s| {
            s.send_queue == NO_QUEUE
                && (!s.queued.has(Queued::IN_CONTROL)
                    || self.out.control_written_to(s.control_mark))
        })
    }

    /// The stream waits until its bytes are written: ready when they are.
    pub(in crate::session::core) fn wait_written(&mut self, key: usize, waker: &Waker) -> bool {
        if self.is_written(key) {
            return true;
        }
        let Some(stream) = self.streams.get_mut(key) else {
            return true;
        };
        stream.wait_to_write(WriteWait::Written, waker);
        // With a send queue, its end wakes the stream; otherwise the close in the control
        // queue does, once written.
        if stream.send_queue == NO_QUEUE && !stream.queued.has(Queued::FLUSH) {
            stream.queued.set(Queued::FLUSH, true);
            let entry = (stream.control_mark, key, stream.id);
            self.out.waits().flush_control.push_back(entry);
            self.prune_flush();
        }
        false
    }

    /// Drops entries of streams that are gone or no longer wait from the flush queue, once
    /// they could be half of it, so that it stays within twice the futures waiting.
    fn prune_flush(&mut self) {
        let Some(waits) = self.out.waits.as_deref_mut() else {
            return;
        };
        if waits.flush_control.len() <= 2 * self.streams.len() + 64 {
            return;
        }
        let streams = &self.streams;
        waits.flush_control.retain(|&(_, key, id)| {
            streams
                .get(key)
                .is_some_and(|s| s.id == id && s.queued.has(Queued::FLUSH))
        });
    }

    /// Wakes and forgets every waiter of the outgoing side (the session ended, or the transport
    /// refused a write): each sees why when it runs.
    pub(in crate::session::core) fn wake_all_outgoing(&mut self, wakers: &mut Vec<Waker>) {
        for stream in self.streams.iter_mut() {
            stream.queued.set(Queued::ROOM, false);
            stream.queued.set(Queued::FLUSH, false);
            stream.wake_all(wakers);
        }
        self.wake_openers(wakers);
        if let Some(waits) = self.out.waits.as_deref_mut() {
            waits.room.clear();
            waits.flush_control.clear();
        }
    }

    /// Every `open` waiting for room, to see a change that fails it.
    pub(in crate::session::core) fn wake_openers(&mut self, wakers: &mut Vec<Waker>) {
        let Some(waits) = self.out.waits.as_deref_mut() else {
            return;
        };
        for opener in waits.openers.iter_mut() {
            opener.queued = false;
            wakers.extend(opener.waker.take());
        }
    }

    /// Entries in the wait queues, for tests: writers and openers waiting for room, and
    /// streams waiting for their bytes to be written.
    #[cfg(test)]
    pub(in crate::session::core) fn waiting_entries(&self) -> (usize, usize) {
        let flushing = self
            .streams
            .iter()
            .filter(|s| s.write_wait == WriteWait::Written)
            .count();
        let room = self.out.waits.as_ref().map_or(0, |w| w.room.len());
        (room, flushing)
    }
}
