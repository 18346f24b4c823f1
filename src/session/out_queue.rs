//! [`OutQueue`]: a batch's outgoing bytes, in order: frame headers and short runs of frames
//! copied into one growing buffer, with slices spliced in without being copied: the runs of
//! frames a turn takes from a stream's send queue (slices of its buffer), and caller-owned
//! payloads ([`Stream::write_chunk`]).
//!
//! The driver writes a batch with vectored writes where the transport supports them, so a
//! spliced slice goes from its buffer to the kernel untouched, and lets the slices go as soon
//! as the batch is written, so that the queues' buffers are theirs alone again.
//!
//! [`Stream::write_chunk`]: crate::Stream::write_chunk

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::Bytes;

/// Slices shorter than this are copied into the buffer instead: one more slice in a vectored
/// write costs more than copying a few kilobytes, and many small slices would also make the
/// writes short (the driver passes at most [`MAX_SLICES`] slices per write).
pub(crate) const SPLICE_MIN: usize = 4 * 1024;

/// Slices handed to one vectored write.
pub(crate) const MAX_SLICES: usize = 64;

pub(crate) struct OutQueue {
    bytes: Vec<u8>,
    /// Spliced payloads, each sent right after `bytes[..at]` (and after earlier ones at `at`).
    spliced: VecDeque<(usize, Bytes)>,
    spliced_len: usize,
}

/// How far the driver has written a taken [`OutQueue`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// Bytes of `bytes` written.
    byte: usize,
    /// Spliced payloads written in full…
    splice: usize,
    /// …and bytes of the next one written.
    in_splice: usize,
}

impl Default for OutQueue {
    fn default() -> OutQueue {
        OutQueue::new()
    }
}

impl OutQueue {
    pub(crate) fn new() -> OutQueue {
        OutQueue {
            // Grows with use and is kept: idle sessions stay small, busy ones stop allocating.
            bytes: Vec::new(),
            spliced: VecDeque::new(),
            spliced_len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len() + self.spliced_len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn extend_from_slice(&mut self, data: &[u8]) {
        self.bytes.extend_from_slice(data);
    }

    /// Queues `chunk`, spliced in without a copy unless it is short.
    pub(crate) fn push_chunk(&mut self, chunk: Bytes) {
        if chunk.len() < SPLICE_MIN {
            self.bytes.extend_from_slice(&chunk);
        } else {
            self.spliced_len += chunk.len();
            self.spliced.push_back((self.bytes.len(), chunk));
        }
    }

    /// Empties the queue, keeping its buffers' capacity.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.spliced.clear();
        self.spliced_len = 0;
    }

    /// Bytes copied into the queue's own buffer (for tests).
    #[cfg(test)]
    pub(crate) fn copied(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes the queue can hold without growing (for tests).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// The next unwritten slice after `cursor`; empty when everything is written.
    pub(crate) fn next_slice(&self, cursor: &Cursor) -> &[u8] {
        self.segment(cursor)
    }

    /// Fills `dst` with the unwritten slices after `cursor`, in order, holding at most `limit`
    /// bytes together; returns how many.
    pub(crate) fn slices<'a>(
        &'a self,
        cursor: &Cursor,
        dst: &mut [IoSlice<'a>],
        limit: usize,
    ) -> usize {
        let mut at = *cursor;
        let mut count = 0;
        let mut left = limit;
        while count < dst.len() && left > 0 {
            let segment = self.segment(&at);
            if segment.is_empty() {
                break;
            }
            let segment = &segment[..segment.len().min(left)];
            dst[count] = IoSlice::new(segment);
            count += 1;
            left -= segment.len();
            self.step(&mut at, segment.len());
        }
        count
    }

    /// Moves `cursor` past `n` written bytes.
    pub(crate) fn advance(&self, cursor: &mut Cursor, mut n: usize) {
        while n > 0 {
            let segment = self.segment(cursor).len();
            if segment == 0 {
                return;
            }
            let step = n.min(segment);
            self.step(cursor, step);
            n -= step;
        }
    }

    /// Whether everything up to `cursor` is all there is.
    pub(crate) fn is_written(&self, cursor: &Cursor) -> bool {
        cursor.byte == self.bytes.len() && cursor.splice == self.spliced.len()
    }

    /// The segment `cursor` is in, from the cursor on: the rest of a spliced payload, or buffer
    /// bytes up to the next splice point. Only empty at the end: splices are never empty, and
    /// the cursor moves onto a splice as soon as the buffer bytes before it are written.
    fn segment(&self, cursor: &Cursor) -> &[u8] {
        match self.spliced.get(cursor.splice) {
            Some((at, chunk)) if *at == cursor.byte => &chunk[cursor.in_splice..],
            Some((at, _)) => &self.bytes[cursor.byte..*at],
            None => &self.bytes[cursor.byte..],
        }
    }

    /// Moves within the current segment by `n` ≤ its length, onto the next one at its end.
    fn step(&self, cursor: &mut Cursor, n: usize) {
        match self.spliced.get(cursor.splice) {
            Some((at, chunk)) if *at == cursor.byte => {
                cursor.in_splice += n;
                if cursor.in_splice == chunk.len() {
                    cursor.splice += 1;
                    cursor.in_splice = 0;
                }
            }
            _ => cursor.byte += n,
        }
    }

    /// Everything queued, flattened (for tests).
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut all = Vec::with_capacity(self.len());
        let mut cursor = Cursor::default();
        loop {
            let slice = self.next_slice(&cursor);
            if slice.is_empty() {
                return all;
            }
            all.extend_from_slice(slice);
            self.advance(&mut cursor, slice.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(parts: &[(&[u8], bool)]) -> (OutQueue, Vec<u8>) {
        let mut queue = OutQueue::new();
        let mut all = Vec::new();
        for (part, splice) in parts {
            if *splice {
                queue.push_chunk(Bytes::copy_from_slice(part));
            } else {
                queue.extend_from_slice(part);
            }
            all.extend_from_slice(part);
        }
        (queue, all)
    }

    #[test]
    fn small_chunks_are_copied_and_large_ones_spliced() {
        let (queue, all) = queue(&[(b"head", false), (&[1; 10], true), (&[2; SPLICE_MIN], true)]);
        assert_eq!(queue.spliced.len(), 1);
        assert_eq!(queue.len(), all.len());
        assert_eq!(queue.to_vec(), all);
    }

    #[test]
    fn writes_of_any_size_see_every_byte_once_in_order() {
        let big = |b: u8| vec![b; SPLICE_MIN + 3];
        let (a, b, c) = (big(1), big(2), big(3));
        // Splices at the start, back to back, in the middle and at the end.
        let (queue, all) = queue(&[
            (&a, true),
            (&b, true),
            (b"12345678", false),
            (&c, true),
            (b"tail", false),
            (&a, true),
        ]);
        for write in [1, 7, 100, SPLICE_MIN, usize::MAX] {
            let mut cursor = Cursor::default();
            let mut seen = Vec::new();
            while !queue.is_written(&cursor) {
                let mut slices = [IoSlice::new(&[]); 3];
                let count = queue.slices(&cursor, &mut slices, usize::MAX);
                assert!(count > 0);
                let mut n = 0;
                for slice in &slices[..count] {
                    let take = slice.len().min(write - n);
                    seen.extend_from_slice(&slice[..take]);
                    n += take;
                    if n == write {
                        break;
                    }
                }
                queue.advance(&mut cursor, n);
            }
            assert_eq!(seen, all, "writes of {write}");
            assert!(queue.next_slice(&cursor).is_empty());
        }
    }

    #[test]
    fn clear_empties_it() {
        let (mut queue, _) = queue(&[(b"x", false), (&[0; SPLICE_MIN], true)]);
        queue.clear();
        assert!(queue.is_empty());
        assert!(queue.is_written(&Cursor::default()));
    }
}
