//! A stream's received data waiting for the application, and the session's account of the read
//! buffers that data keeps alive.
//!
//! Payloads of [`PIN_MIN`] bytes or more stay slices of the driver's read buffer (no copy);
//! shorter ones are copied into the stream's own buffer. A slice keeps its whole read buffer
//! (up to about 192 KiB) alive, and frames for other streams, or for ids nobody knows, fill the
//! rest of it: 256 streams each holding one unread 16 KiB slice would keep 48 MiB alive for
//! 4 MiB of data. So the session counts, in a [`PinLedger`], every read buffer that buffered slices
//! point into, and when those buffers come to more than twice what is buffered (plus
//! [`PIN_FLOOR`]), it copies the slices out and lets the buffers go, as quinn's assembler does
//! with the datagrams its chunks point into. A copy of 16 KiB or more per 192 KiB buffer freed
//! is cheap, and it only happens when memory, not speed, is what is at stake.
//! `tests/core_findings_b.rs`, `unread_large_frames_do_not_pin_read_buffers_many_times_their_size`,
//! states the bound.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use super::id_hash::SeqMap;

/// Payloads at least this long are kept as slices of the read buffer; shorter ones are copied,
/// so that a few small unread frames do not pin many large read buffers between compactions.
/// The driver copies the shorter ones straight from its read buffer ([`Payload::Borrowed`]).
pub(crate) const PIN_MIN: usize = 16 * 1024;

/// A received Data payload, as the driver hands it over.
pub(crate) enum Payload<'a> {
    /// Its own slice of the read buffer, which the stream may keep.
    Shared(Bytes),
    /// Still in the read buffer, to be copied before the driver moves on.
    Borrowed(&'a [u8]),
}

impl Payload<'_> {
    pub(crate) fn len(&self) -> usize {
        self.bytes().len()
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Shared(bytes) => bytes,
            Payload::Borrowed(slice) => slice,
        }
    }
}

/// Pinned read buffers are compacted once they hold more than twice the buffered data plus
/// this: enough for the buffers that ordinary traffic keeps in use (a few of about 192 KiB),
/// so that compaction is reserved for data left unread across many buffers.
pub(crate) const PIN_FLOOR: usize = 1024 * 1024;

/// Allocation unit of a stream's buffer for copied small payloads.
const TAIL_MIN: usize = 4 * 1024;

/// Drained stream buffers kept for reuse by the session (about `TAIL_MIN` each), so that
/// streams can give their buffer back whenever they are drained without every burst of small
/// frames allocating anew.
pub(super) const TAIL_POOL: usize = 64;

/// Which read buffer a payload was decoded from: the driver numbers its buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source {
    pub(crate) generation: u32,
    pub(crate) capacity: usize,
}

/// The read buffers that buffered slices point into.
#[derive(Default)]
pub(super) struct PinLedger {
    /// Generation → (slices pointing into it, its capacity).
    buffers: SeqMap<u32, (u32, usize)>,
    /// The capacities of those buffers, added up.
    pinned: usize,
}

impl PinLedger {
    fn pin(&mut self, source: Source) {
        let entry = self
            .buffers
            .entry(source.generation)
            .or_insert((0, source.capacity));
        if entry.0 == 0 {
            self.pinned += entry.1;
        }
        entry.0 += 1;
    }

    fn unpin(&mut self, generation: u32) {
        if let Some(entry) = self.buffers.get_mut(&generation) {
            entry.0 -= 1;
            if entry.0 == 0 {
                self.pinned -= entry.1;
                self.buffers.remove(&generation);
            }
        }
    }

    /// Bytes of read buffers kept alive by buffered slices.
    pub(super) fn pinned(&self) -> usize {
        self.pinned
    }

    /// Whether the pinned buffers cost enough more than the data they hold to copy it out.
    pub(super) fn needs_compaction(&self, buffered: u64) -> bool {
        self.pinned as u64 > 2 * buffered + PIN_FLOOR as u64
    }
}

/// A received payload kept as it arrived.
struct Chunk {
    bytes: Bytes,
    /// The read buffer it is a slice of, while it is one.
    pinned: Option<u32>,
}

/// One stream's received data, oldest first.
pub(super) struct RecvBuffer {
    /// Pinned slices and frozen copies…
    ///
    /// (Made on a stream's first long payload instead, as an `Option<Box<_>>`, this took
    /// `StreamState` from 168 to 144 bytes and an idle stream end from about 245 to 225 B
    /// resident, but an idle session end from 2,025 to 2,080: the session's one-entry stream
    /// table, given back at the linger, then leaves a hole of another size class that the
    /// allocator does not fill (`benches/idle_sessions.rs`).)
    chunks: VecDeque<Chunk>,
    /// …followed by copied small payloads still being appended to.
    tail: BytesMut,
    /// Bytes in `chunks` and `tail` together.
    len: u32,
    /// Whether a short payload was ever copied into `tail`: see `copy_to_tail`.
    copied_before: bool,
}

impl RecvBuffer {
    pub(super) fn new() -> RecvBuffer {
        RecvBuffer {
            chunks: VecDeque::new(),
            tail: BytesMut::new(),
            len: 0,
            copied_before: false,
        }
    }

    pub(super) fn len(&self) -> u32 {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn push(
        &mut self,
        payload: Payload<'_>,
        source: Source,
        pool: &mut Vec<BytesMut>,
        ledger: &mut PinLedger,
    ) {
        self.len += payload.len() as u32;
        match payload {
            Payload::Shared(bytes) if bytes.len() >= PIN_MIN => {
                self.freeze_tail();
                ledger.pin(source);
                self.chunks.push_back(Chunk {
                    bytes,
                    pinned: Some(source.generation),
                });
            }
            payload => self.copy_to_tail(payload.bytes(), pool),
        }
    }

    fn copy_to_tail(&mut self, payload: &[u8], pool: &mut Vec<BytesMut>) {
        if self.tail.capacity() - self.tail.len() < payload.len() {
            if self.tail.is_empty() {
                if let Some(spare) = pool.pop() {
                    self.tail = spare;
                }
            }
            // A stream's first short payload gets a buffer of its own size, later ones at least
            // `TAIL_MIN`: thousands of streams receiving one short message each then do not
            // touch a fresh page each (page faults were a fifth of the 8192-stream echo's
            // profile), and a stream that keeps receiving still appends many to one buffer.
            let room = if self.copied_before {
                if pool.capacity() == 0 {
                    // The session's pool, made at its full size when a stream first keeps
                    // receiving (not for one short message, nor when the session starts: an
                    // idle session holds none), so that it never grows while traffic lasts.
                    pool.reserve_exact(TAIL_POOL);
                }
                payload.len().max(TAIL_MIN)
            } else {
                payload.len()
            };
            self.copied_before = true;
            self.tail.reserve(room);
        }
        self.tail.extend_from_slice(payload);
    }

    fn freeze_tail(&mut self) {
        if !self.tail.is_empty() {
            self.chunks.push_back(Chunk {
                bytes: self.tail.split().freeze(),
                pinned: None,
            });
        }
    }

    /// Takes up to `max` bytes from the front without copying.
    pub(super) fn take_chunk(&mut self, max: usize, ledger: &mut PinLedger) -> Bytes {
        let chunk = match self.chunks.front_mut() {
            Some(front) if front.bytes.len() > max => front.bytes.split_to(max),
            Some(_) => match self.chunks.pop_front() {
                Some(Chunk { bytes, pinned }) => {
                    if let Some(generation) = pinned {
                        ledger.unpin(generation);
                    }
                    bytes
                }
                None => Bytes::new(),
            },
            None => {
                let n = max.min(self.tail.len());
                self.tail.split_to(n).freeze()
            }
        };
        self.len -= chunk.len() as u32;
        chunk
    }

    /// Copies buffered data into `dst`, oldest first; returns the count.
    pub(super) fn read_into(
        &mut self,
        dst: &mut tokio::io::ReadBuf<'_>,
        ledger: &mut PinLedger,
    ) -> usize {
        let mut read = 0;
        while dst.remaining() > 0 {
            let source: &mut dyn Buf = match self.chunks.front_mut() {
                Some(chunk) => &mut chunk.bytes,
                None if !self.tail.is_empty() => &mut self.tail,
                None => break,
            };
            let n = source.remaining().min(dst.remaining());
            dst.put_slice(&source.chunk()[..n]);
            source.advance(n);
            read += n;
            if self.chunks.front().is_some_and(|c| c.bytes.is_empty()) {
                if let Some(Chunk {
                    pinned: Some(generation),
                    ..
                }) = self.chunks.pop_front()
                {
                    ledger.unpin(generation);
                }
            }
        }
        self.len -= read as u32;
        read
    }

    /// Drops everything buffered; returns how much that was.
    pub(super) fn discard(&mut self, ledger: &mut PinLedger) -> u32 {
        for chunk in self.chunks.drain(..) {
            if let Some(generation) = chunk.pinned {
                ledger.unpin(generation);
            }
        }
        self.tail.clear();
        std::mem::take(&mut self.len)
    }

    /// Replaces every pinned slice with a copy of its own, so its read buffer can go.
    pub(super) fn compact(&mut self, ledger: &mut PinLedger) {
        for chunk in &mut self.chunks {
            if let Some(generation) = chunk.pinned.take() {
                chunk.bytes = Bytes::copy_from_slice(&chunk.bytes);
                ledger.unpin(generation);
            }
        }
    }

    /// Gives the buffer for small payloads back to the session's pool once everything in it is
    /// read, so a drained stream holds no buffer. A buffer still shared with a chunk handed out
    /// by `read_chunk` is dropped instead (its memory goes when the chunk does).
    pub(super) fn give_back_tail(&mut self, pool: &mut Vec<BytesMut>) {
        if self.len > 0 || self.tail.capacity() == 0 {
            return;
        }
        let mut tail = std::mem::take(&mut self.tail);
        tail.clear();
        if pool.len() < TAIL_POOL && tail.try_reclaim(TAIL_MIN) {
            if pool.capacity() == 0 {
                // Given back while the session was quiet (`Inner::release_buffers`): made again
                // at its full size, so that it does not grow while traffic lasts.
                pool.reserve_exact(TAIL_POOL);
            }
            pool.push(tail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(generation: u32) -> Source {
        Source {
            generation,
            capacity: 192 * 1024,
        }
    }

    #[test]
    fn the_ledger_counts_each_pinned_buffer_once_until_its_last_slice_goes() {
        let mut ledger = PinLedger::default();
        let mut pool = Vec::new();
        let mut a = RecvBuffer::new();
        let mut b = RecvBuffer::new();
        a.push(
            Payload::Shared(Bytes::from(vec![1; PIN_MIN])),
            source(1),
            &mut pool,
            &mut ledger,
        );
        b.push(
            Payload::Shared(Bytes::from(vec![2; PIN_MIN])),
            source(1),
            &mut pool,
            &mut ledger,
        );
        a.push(
            Payload::Shared(Bytes::from(vec![3; 10])),
            source(1),
            &mut pool,
            &mut ledger,
        );
        assert_eq!(ledger.pinned(), 192 * 1024, "one buffer, two slices");
        a.discard(&mut ledger);
        assert_eq!(ledger.pinned(), 192 * 1024, "b still points into it");
        assert_eq!(b.take_chunk(usize::MAX, &mut ledger).len(), PIN_MIN);
        assert_eq!(ledger.pinned(), 0);
    }

    #[test]
    fn borrowed_payloads_are_copied_and_pin_nothing() {
        let mut ledger = PinLedger::default();
        let mut pool = Vec::new();
        let mut stream = RecvBuffer::new();
        let read_buffer = vec![4; 100];
        stream.push(
            Payload::Borrowed(&read_buffer[..60]),
            source(1),
            &mut pool,
            &mut ledger,
        );
        stream.push(
            Payload::Borrowed(&read_buffer[60..]),
            source(1),
            &mut pool,
            &mut ledger,
        );
        drop(read_buffer);
        assert_eq!(ledger.pinned(), 0);
        assert_eq!(stream.len(), 100);
        assert_eq!(
            &stream.take_chunk(usize::MAX, &mut ledger)[..],
            &[4; 100][..]
        );
    }

    #[test]
    fn a_first_short_payload_takes_its_own_size_and_later_ones_share_a_larger_buffer() {
        let (mut ledger, mut pool) = (PinLedger::default(), Vec::new());
        let mut stream = RecvBuffer::new();
        let message = [5; 1000];
        stream.push(
            Payload::Borrowed(&message),
            source(1),
            &mut pool,
            &mut ledger,
        );
        assert!(
            stream.tail.capacity() < 2 * message.len(),
            "sized to the message"
        );
        stream.push(
            Payload::Borrowed(&message),
            source(1),
            &mut pool,
            &mut ledger,
        );
        assert!(stream.tail.capacity() >= TAIL_MIN, "grown for more");
        assert_eq!(stream.len(), 2000);
    }

    #[test]
    fn compaction_frees_the_buffers_and_keeps_the_data() {
        let mut ledger = PinLedger::default();
        let mut pool = Vec::new();
        let mut streams: Vec<RecvBuffer> = (0..4).map(|_| RecvBuffer::new()).collect();
        for (generation, stream) in streams.iter_mut().enumerate() {
            stream.push(
                Payload::Shared(Bytes::from(vec![generation as u8; PIN_MIN])),
                source(generation as u32),
                &mut pool,
                &mut ledger,
            );
        }
        let buffered = (4 * PIN_MIN) as u64;
        assert_eq!(ledger.pinned(), 4 * 192 * 1024);
        assert!(!ledger.needs_compaction(buffered), "below the floor");
        for stream in &mut streams {
            stream.compact(&mut ledger);
        }
        assert_eq!(ledger.pinned(), 0);
        for (i, stream) in streams.iter_mut().enumerate() {
            let mut storage = vec![0; PIN_MIN + 1];
            let mut dst = tokio::io::ReadBuf::new(&mut storage);
            assert_eq!(stream.read_into(&mut dst, &mut ledger), PIN_MIN);
            assert!(dst.filled().iter().all(|&b| b == i as u8));
        }
    }
}
