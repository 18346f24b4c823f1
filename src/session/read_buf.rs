//! The driver's read buffer, and the spare buffers that let it be reused.
//!
//! Large payloads are handed to streams as slices of the read buffer (no copy), so a buffer
//! stays allocated until every stream has read its slices. Allocating a fresh buffer each time
//! the current one is full makes the kernel fault in and zero new pages on every read, which
//! shows in the profile of a bulk transfer (BENCHMARKS.md, "What the profiles showed"). So the
//! driver keeps retired buffers (see `SPARES`) and switches to one once its slices have all been
//! read, allocating only when none is free yet.

use std::time::Duration;

use bytes::BytesMut;
use tokio::time::Instant;

use super::core::recv_buf::Source;

/// Reads go into buffers of up to this size, so one read can take several full frames. A
/// session starts with `START` and grows to this only while reads fill the buffer, so idle
/// sessions stay small.
pub(crate) const MAX_SIZE: usize = 128 * 1024;
/// The first buffer of a new session, and of one woken after its buffers were given back: room
/// for a few small frames. A session that trades small messages never needs more, and the
/// buffer it frees when it goes quiet is a small hole in the heap, not 8 KiB of partly used
/// pages that the allocator cannot return (`benches/idle_sessions.rs`: 4,862 bytes resident
/// per idle session end with 8 KiB, 3,760 with 1 KiB, and, with later changes, 2,911 with
/// 1 KiB and 2,798 with 512 bytes). Reads that fill it double it up to `MIN_SPACE`, then move
/// the session to full-size buffers.
const START: usize = 512;
/// The largest partial frame carried over to a new buffer at the default payload limit.
const PARTIAL_MAX: usize = crate::frame::MAX_PAYLOAD + crate::frame::HEADER_LEN;
/// A new buffer is used once less than this is left in the current one.
const MIN_SPACE: usize = 8 * 1024;
/// Retired buffers kept for reuse. A buffer stays pinned until the application has read its
/// slices, so `U` bytes of unread data pin about `U / MAX_SIZE` buffers, and the driver needs
/// that many plus one before the oldest comes free. Spares are memory the session needed at
/// its peak anyway, dropped when traffic turns light; this caps them at 64 × 192 KiB = 12 MiB.
const SPARES: usize = 64;
/// Spares are dropped once the driver has gone this long without needing a new buffer.
const SPARE_LINGER: Duration = Duration::from_secs(1);

/// The read buffer: 16 bytes in the driver, the buffers and their state in a box that exists
/// only while the session has a buffer, so that an idle session's driver task, which tokio
/// allocates in steps of 128 bytes, stays in a smaller step (`benches/idle_sessions.rs`).
pub(crate) struct ReadBuffer {
    /// `None`: no buffer is allocated, none yet or it was given back while the session was
    /// quiet.
    held: Option<Box<Held>>,
    /// How much room the next buffer gets, between `START` and `MAX_SIZE`.
    size: u32,
    /// The current buffer's number, for the core's account of pinned buffers.
    generation: u32,
}

struct Held {
    buf: BytesMut,
    /// The current buffer's capacity when it was made, for the core's account of pinned
    /// buffers.
    capacity: usize,
    /// Retired buffers for reuse: a session that only trades small messages never has any.
    spares: Vec<BytesMut>,
    /// When the driver last moved to another buffer.
    last_switch: Option<Instant>,
}

impl ReadBuffer {
    pub(crate) fn new() -> ReadBuffer {
        ReadBuffer {
            held: None,
            size: START as u32,
            generation: 0,
        }
    }

    /// The buffer, empty and without capacity when none is allocated.
    pub(crate) fn get_mut(&mut self) -> &mut BytesMut {
        &mut self.held_mut().buf
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.held.as_ref().is_none_or(|held| held.buf.is_empty())
    }

    /// No buffer is allocated.
    pub(crate) fn is_unallocated(&self) -> bool {
        self.held.is_none()
    }

    /// Appends what was read elsewhere (into the stack), making room for it.
    pub(crate) fn extend_from_read(&mut self, bytes: &[u8]) {
        self.prepare(bytes.len());
        self.get_mut().extend_from_slice(bytes);
    }

    pub(crate) fn source(&self) -> Source {
        Source {
            generation: self.generation,
            capacity: self.held.as_ref().map_or(0, |held| held.capacity),
        }
    }

    /// Makes room for the next read, at least `missing` bytes (the rest of a frame whose start
    /// is buffered): reuses the buffer's free space, or reclaims the buffer once its slices are
    /// gone, or moves to another. Returns the room.
    pub(crate) fn prepare(&mut self, missing: usize) -> usize {
        let size = self.size as usize;
        let Some(held) = self.held.as_deref_mut() else {
            self.held = Some(Box::new(Held {
                buf: BytesMut::with_capacity(START.max(missing)),
                capacity: 0,
                spares: Vec::new(),
                last_switch: None,
            }));
            self.next_source();
            return self.space();
        };
        let room = size.max(missing);
        let least = MIN_SPACE.min(size / 2).max(missing);
        let space = held.buf.capacity() - held.buf.len();
        if space < least && !held.buf.try_reclaim(room) {
            self.switch(room);
        }
        self.space()
    }

    /// The last read filled the room: the next buffer gets twice as much.
    pub(crate) fn filled(&mut self) {
        self.size = (self.size * 2).min(MAX_SIZE as u32);
    }

    /// Everything read so far is applied: spares go once no new buffer was needed for a while.
    pub(crate) fn drained(&mut self) {
        if let Some(held) = self.held.as_deref_mut() {
            if held
                .last_switch
                .is_some_and(|at| at.elapsed() >= SPARE_LINGER)
            {
                held.spares = Vec::new();
                held.last_switch = None;
            }
        }
    }

    /// The session went quiet: gives the buffers back, but for a partial frame's bytes, kept
    /// in a buffer of their size.
    pub(crate) fn release(&mut self) {
        self.size = START as u32;
        let Some(held) = self.held.as_deref_mut() else {
            return;
        };
        if held.buf.is_empty() {
            self.held = None;
            self.next_source();
            return;
        }
        held.spares = Vec::new();
        held.last_switch = None;
        if held.buf.capacity() > held.buf.len() {
            held.buf = BytesMut::from(&held.buf[..]);
            self.next_source();
        }
    }

    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.held.as_ref().map_or(0, |held| held.buf.capacity())
            + self.spare_buffers().map(BytesMut::capacity).sum::<usize>()
    }

    #[cfg(test)]
    fn spare_buffers(&self) -> impl Iterator<Item = &BytesMut> {
        self.held.iter().flat_map(|held| &held.spares)
    }

    fn held_mut(&mut self) -> &mut Held {
        self.held.get_or_insert_with(|| {
            Box::new(Held {
                buf: BytesMut::new(),
                capacity: 0,
                spares: Vec::new(),
                last_switch: None,
            })
        })
    }

    fn next_source(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if let Some(held) = self.held.as_deref_mut() {
            held.capacity = held.buf.capacity();
        }
    }

    fn space(&self) -> usize {
        self.held
            .as_ref()
            .map_or(0, |held| held.buf.capacity() - held.buf.len())
    }

    fn switch(&mut self, room: usize) {
        let size = self.size as usize;
        let held = self.held_mut();
        let need = held.buf.len() + room;
        let free = held.spares.iter_mut().position(|b| b.try_reclaim(need));
        let mut next = match free {
            Some(index) => held.spares.swap_remove(index),
            None if size < MIN_SPACE => BytesMut::with_capacity(need.max(size)),
            None => BytesMut::with_capacity(need.max(size + PARTIAL_MAX)),
        };
        next.extend_from_slice(&held.buf);
        held.last_switch = Some(Instant::now());
        let mut retired = std::mem::replace(&mut held.buf, next);
        if held.capacity >= MIN_SPACE {
            retired.clear();
            if held.spares.len() == SPARES {
                held.spares.remove(0);
            }
            held.spares.push(retired);
        }
        self.next_source();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(buffer: &mut ReadBuffer, n: usize) {
        let room = buffer.prepare(0);
        assert!(room >= n.min(START));
        buffer.get_mut().extend_from_slice(&vec![7; n.min(room)]);
    }

    /// On tokio's paused clock: spares are dropped once the driver has gone [`SPARE_LINGER`]
    /// without needing a new buffer, which a test thread descheduled that long on a loaded
    /// machine would otherwise see between its fills.
    #[tokio::test(start_paused = true)]
    async fn reuses_a_buffer_once_its_slices_are_dropped() {
        let mut buffer = ReadBuffer::new();
        fill(&mut buffer, usize::MAX);
        let first = buffer.get_mut().split().freeze();
        fill(&mut buffer, usize::MAX);
        // `first` still pins the original allocation: a new one was needed.
        assert_ne!(buffer.get_mut().as_ptr(), first.as_ptr());
        let second = buffer.get_mut().split().freeze();
        let first_ptr = first.as_ptr();
        drop(first);
        fill(&mut buffer, 10);
        // The original allocation is free again and comes back from the spares.
        assert_eq!(buffer.get_mut().as_ptr(), first_ptr);
        drop(second);
    }

    #[test]
    fn keeps_a_partial_frame_across_a_switch() {
        let mut buffer = ReadBuffer::new();
        fill(&mut buffer, MIN_SPACE);
        let filled = buffer.get_mut().len();
        let _pinned = buffer.get_mut().split_to(filled - 3).freeze();
        let room = buffer.prepare(0);
        assert!(room >= START);
        assert_eq!(&buffer.get_mut()[..], &[7, 7, 7]);
    }

    #[test]
    fn small_frames_never_need_more_than_the_first_buffer() {
        let mut buffer = ReadBuffer::new();
        buffer.prepare(0);
        let first = buffer.source();
        for _ in 0..1000 {
            let room = buffer.prepare(0);
            assert!(room >= 100);
            buffer.get_mut().extend_from_slice(&[7; 100]);
            // Decoded, and its short payloads copied out.
            drop(buffer.get_mut().split_to(100));
        }
        assert_eq!(
            buffer.source().generation,
            first.generation,
            "no other buffer"
        );
        assert_eq!(first.capacity, START);
        assert_eq!(buffer.spare_buffers().count(), 0);
    }

    #[test]
    fn reads_that_fill_the_buffer_grow_it_step_by_step_then_to_full_size() {
        let mut buffer = ReadBuffer::new();
        let mut rooms = Vec::new();
        for _ in 0..8 {
            let room = buffer.prepare(0);
            rooms.push(room);
            buffer.get_mut().extend_from_slice(&vec![7; room]);
            buffer.filled();
            drop(buffer.get_mut().split());
        }
        let steps = (MIN_SPACE / START).trailing_zeros() as usize;
        let doubling: Vec<usize> = (0..steps).map(|step| START << step).collect();
        assert_eq!(&rooms[..steps], &doubling[..], "{rooms:?}");
        assert!(
            rooms[steps..].iter().all(|&room| room >= PARTIAL_MAX),
            "{rooms:?}"
        );
    }

    #[test]
    fn release_keeps_only_a_partial_frame_and_starts_small_again() {
        let mut buffer = ReadBuffer::new();
        assert_eq!(
            buffer.capacity(),
            0,
            "nothing is allocated before the first read"
        );
        fill(&mut buffer, 100);
        // Whole frames were decoded; three bytes of the next one wait for the rest.
        drop(buffer.get_mut().split_to(97));
        let before = buffer.source().generation;
        buffer.release();
        assert_eq!(buffer.capacity(), 3);
        assert_ne!(
            buffer.source().generation,
            before,
            "a new buffer, for the pin ledger"
        );
        let room = buffer.prepare(PARTIAL_MAX);
        assert!(room >= PARTIAL_MAX);
        assert_eq!(&buffer.get_mut()[..], &[7, 7, 7]);

        buffer.get_mut().clear();
        buffer.release();
        assert_eq!(buffer.capacity(), 0);
        assert_eq!(
            buffer.prepare(0),
            START,
            "a woken session reads as a new one does"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn spares_are_bounded_and_dropped_when_traffic_turns_light() {
        let mut buffer = ReadBuffer::new();
        let mut pins = Vec::new();
        for _ in 0..10 {
            fill(&mut buffer, MIN_SPACE * 2);
            buffer.filled();
            pins.push(buffer.get_mut().split().freeze());
        }
        assert!(buffer.spare_buffers().count() <= SPARES);
        buffer.drained();
        assert!(
            buffer.spare_buffers().count() > 0,
            "buffers were needed just now"
        );
        tokio::time::advance(SPARE_LINGER).await;
        buffer.drained();
        assert_eq!(buffer.spare_buffers().count(), 0);
    }
}
