//! The driver's read buffer, and the spare buffers that let it be reused.
//!
//! Large payloads are handed to streams as slices of the read buffer (no copy), so a buffer
//! stays allocated until every stream has read its slices. Allocating a fresh buffer each time
//! the current one is full makes the kernel fault in and zero new pages on every read (about a
//! tenth of the CPU in a 1-stream bulk transfer under `perf record`). So the driver keeps retired
//! buffers (see `SPARES`) and switches to one once its slices have all been read, allocating only
//! when none is free yet.

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

pub(crate) struct ReadBuffer {
    buf: BytesMut,
    /// Made by the first switch to another buffer: a session that only trades small messages
    /// never has them, and its driver's task is smaller by this much.
    spares: Option<Box<Spares>>,
    /// How much room the next buffer gets, between `START` and `MAX_SIZE`.
    size: usize,
    /// The current buffer's number and size, for the core's account of pinned buffers.
    source: Source,
    /// No buffer is allocated: none yet, or it was given back while the session was quiet.
    released: bool,
}

struct Spares {
    buffers: Vec<BytesMut>,
    /// When the driver last moved to another buffer.
    last_switch: Instant,
}

impl ReadBuffer {
    pub(crate) fn new() -> ReadBuffer {
        ReadBuffer {
            // Allocated by the first read (see `prepare`).
            buf: BytesMut::new(),
            spares: None,
            size: START,
            source: Source {
                generation: 0,
                capacity: 0,
            },
            released: true,
        }
    }

    /// The buffer to read into and decode from.
    pub(crate) fn get_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Whether no buffer is allocated (none yet, or given back while the session was quiet)
    /// and nothing is buffered: the next read may go to the stack (see
    /// `Connection::poll_read_frames`).
    pub(crate) fn is_unallocated(&self) -> bool {
        self.released && self.buf.is_empty()
    }

    /// Buffers `bytes` read elsewhere (a read made on the stack that left a partial frame, or
    /// one the session hands out as a slice), in a buffer made as for a read.
    pub(crate) fn extend_from_read(&mut self, bytes: &[u8]) {
        self.prepare(bytes.len());
        self.buf.extend_from_slice(bytes);
    }

    /// The buffer that payloads decoded now are slices of.
    pub(crate) fn source(&self) -> Source {
        self.source
    }

    /// Makes room for the next read, and for the `missing` rest of a partial frame so that
    /// decoding it needs no reallocation; returns how much room there is.
    pub(crate) fn prepare(&mut self, missing: usize) -> usize {
        if self.released {
            // Given back while the session was quiet: start again as a new session does, not
            // with a buffer sized for the largest partial frame (a session woken by a
            // keepalive reads 8 bytes).
            self.released = false;
            self.buf = BytesMut::with_capacity(START.max(missing));
            self.next_source();
            return self.space();
        }
        let room = self.size.max(missing);
        // A small first buffer is read into until half of it is used.
        let least = MIN_SPACE.min(self.size / 2).max(missing);
        if self.space() < least && !self.buf.try_reclaim(room) {
            self.switch(room);
        }
        self.space()
    }

    /// A read filled all the room there was: the transport has more, so read bigger next time.
    pub(crate) fn filled(&mut self) {
        self.size = (self.size * 2).min(MAX_SIZE);
    }

    /// A read found the transport empty. If no new buffer was needed for a while, traffic is
    /// light and the spares would only hold memory: drop them. (The keepalive wakes an idle
    /// driver, so this runs even when nothing more arrives.)
    pub(crate) fn drained(&mut self) {
        if self
            .spares
            .as_ref()
            .is_some_and(|spares| spares.last_switch.elapsed() >= SPARE_LINGER)
        {
            self.spares = None;
        }
    }

    /// Gives the buffers back to the allocator: the session has gone quiet (see
    /// `session::linger`). A partial frame keeps only its own bytes, in a buffer of their size;
    /// the next read starts at `START`, as a new session's does. Slices already handed to
    /// streams keep their buffer alive until they are read, as always.
    pub(crate) fn release(&mut self) {
        self.spares = None;
        self.size = START;
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
            self.released = true;
            self.next_source();
        } else if self.buf.capacity() > self.buf.len() {
            self.buf = BytesMut::from(&self.buf[..]);
            self.next_source();
        }
    }

    /// Bytes held: the current buffer and the spares, for tests.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity() + self.spare_buffers().map(BytesMut::capacity).sum::<usize>()
    }

    #[cfg(test)]
    fn spare_buffers(&self) -> impl Iterator<Item = &BytesMut> {
        self.spares.iter().flat_map(|spares| &spares.buffers)
    }

    /// The current buffer is a new one: payloads decoded from now on pin it, not the last.
    fn next_source(&mut self) {
        self.source = Source {
            generation: self.source.generation.wrapping_add(1),
            capacity: self.buf.capacity(),
        };
    }

    fn space(&self) -> usize {
        self.buf.capacity() - self.buf.len()
    }

    /// Moves the unread bytes (a partial frame) to a spare buffer that nothing pins any more, or
    /// to a new one, and retires the current buffer as a spare.
    fn switch(&mut self, room: usize) {
        // Room for the partial frame and a full read: at most 64 KiB + 8 + `MAX_SIZE`.
        let need = self.buf.len() + room;
        let now = Instant::now();
        let spares = self.spares.get_or_insert_with(|| {
            Box::new(Spares {
                buffers: Vec::new(),
                last_switch: now,
            })
        });
        let free = spares.buffers.iter_mut().position(|b| b.try_reclaim(need));
        let mut next = match free {
            Some(index) => spares.buffers.swap_remove(index),
            // Growing from `START`: the next size up, so that a session trading messages of a
            // few KiB gets buffers of their size.
            None if self.size < MIN_SPACE => BytesMut::with_capacity(need.max(self.size)),
            // Sized for the largest partial frame, so that any spare can serve any switch.
            None => BytesMut::with_capacity(need.max(self.size + PARTIAL_MAX)),
        };
        next.extend_from_slice(&self.buf);
        spares.last_switch = now;
        let mut retired = std::mem::replace(&mut self.buf, next);
        // A buffer the session started with is too small to serve a switch once it grew.
        if self.source.capacity >= MIN_SPACE {
            retired.clear();
            if spares.buffers.len() == SPARES {
                spares.buffers.remove(0);
            }
            spares.buffers.push(retired);
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

    #[test]
    fn reuses_a_buffer_once_its_slices_are_dropped() {
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
        assert!(buffer.spares.is_none());
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
        assert!(buffer.spares.is_none());
    }
}
