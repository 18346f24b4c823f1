//! Per-stream send queues, and the scheduler that builds each transport write from them.
//!
//! A stream's frames (its OpenStream, Data, half-closes and close) wait in its own queue, in the
//! order it queued them. The driver's batch is built a frame at a time by round robin over the
//! queues with something to send: each queue's turn carries up to [`QUANTUM`] bytes, after which
//! the next queue goes; a queue alone at its priority sends as much as the batch holds. Higher
//! priorities go first (strictly, as quinn's `SendStream::set_priority`), equal ones share.
//! So a small message queued beside another stream's bulk waits for at most one turn of it, and
//! for the batch being written, whose size follows what the transport takes (the driver's
//! `budget`), instead of for everything queued before it.
//!
//! A Data frame is cut when it does not fit what is left of a turn, and is the turn's first:
//! the part taken goes out under a header of its own, and the rest waits, without a header, for
//! the next turn. Frames that fit go out as queued, so a writer alone on the connection sends
//! the frames it wrote.
//!
//! Bytes are copied into a queue when written, and a turn hands what it takes to the batch as a
//! slice of the queue's buffer, without a copy (runs shorter than [`SPLICE_MIN`] are copied:
//! one more slice in a vectored write costs more); payloads handed over as [`Bytes`]
//! (`Stream::write_chunk`) of [`SPLICE_MIN`] or more are spliced in and never copied. While the
//! batch is written, the queue fills the room after what it handed over; when it needs more,
//! it goes on in a buffer the batches are done with (see [`Kept`]). A queue lives while it
//! holds something or its last take is not written yet (`in_flight`); emptied queues go to a
//! pool of spare ones, and with the kept buffers they hold at most [`spare_limit`] of capacity
//! (two of the largest buffers a busy queue grows to), so that streams that each send a message
//! now and then, and bulk batch after batch, allocate nothing.
//!
//! [`SPLICE_MIN`]: crate::session::out_queue::SPLICE_MIN

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use super::slab::Slab;
use crate::frame::{Header, Kind, HEADER_LEN};
use crate::session::out_queue::{OutQueue, SPLICE_MIN};

/// Bytes a queue sends in one turn when other queues of its priority wait.
/// 32 KiB: the frames a turn cuts then carry more than `recv_buf::PIN_MIN` (16 KiB), which the
/// receiver keeps as slices of its read buffer instead of copying them (with 16 KiB turns, ten
/// streams sending at once over loopback spent a fifth of their time copying).
pub(super) const QUANTUM: usize = 32 * 1024;

/// A frame cut to fit a turn carries at least this much payload (or all of it).
const MIN_CUT: usize = 1024;

/// Capacity kept in spare queues, in all, at least (see `spare_limit`).
const SPARE_BYTES: usize = 256 * 1024;

/// A queue whose buffer grows to this size gets a second one beside it (see
/// [`Kept::put_companion`]): a stream with this much queued is the bulk of the session's
/// traffic. Smaller queues, of sessions whose room many streams share, leave their buffer for
/// another the batches are done with, or a new one, only when the batch in flight holds part
/// of it as they need more room.
const COMPANION_MIN: usize = 512 * 1024;

/// Turns in one batch, at most: bounds the batch's bookkeeping with many small queues.
const MAX_TURNS: usize = 4096;

/// One stream's queue.
pub(super) struct SendQueue {
    /// The stream it belongs to: its id, and its key (the stream may be gone meanwhile).
    pub(super) id: u32,
    pub(super) stream: usize,
    pub(super) priority: i32,
    /// Frames, headers and copied payloads, not taken yet. A turn hands the bytes it takes to
    /// the batch as a slice of this buffer (`BytesMut::split_to`), so while the batch is
    /// written the buffer is shared with it; the queue goes on filling the room after them.
    bytes: BytesMut,
    /// Capacity of the allocation `bytes` lies in: what the queue counts for in the bound on
    /// the buffers kept for reuse.
    block: usize,
    /// Position in the queue's byte stream (bytes ever taken from `bytes`) of `bytes[0]`.
    taken: u64,
    /// Spliced payloads, each sent once the byte stream is taken up to its position.
    spliced: VecDeque<(u64, Bytes)>,
    spliced_len: usize,
    /// Payload left of a Data frame cut by the scheduler: it goes first, under a new header.
    partial: u32,
    /// Takes of this queue in batches the transport has not taken in full yet.
    pub(super) in_flight: u32,
    /// It has a turn in its priority's round.
    pub(super) active: bool,
}

impl SendQueue {
    fn new() -> SendQueue {
        SendQueue {
            id: 0,
            stream: 0,
            priority: 0,
            bytes: BytesMut::new(),
            block: 0,
            taken: 0,
            spliced: VecDeque::new(),
            spliced_len: 0,
            partial: 0,
            in_flight: 0,
            active: false,
        }
    }

    /// Bytes queued: headers and payloads as they were queued.
    pub(super) fn len(&self) -> usize {
        self.bytes.len() + self.spliced_len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty() && self.spliced.is_empty()
    }

    /// Makes room for `need` more bytes in `bytes`. The room after the queued bytes is used
    /// while there is enough of it; then the allocation is used again from its start if
    /// nothing else holds part of it (the batches that did are written); else the queued
    /// bytes move to a buffer the batches are done with (`kept`), or to a new one, and this one
    /// is kept for later. A buffer too small for what is queued is replaced by one twice as
    /// large (or as large as needed), as a `Vec` grows; past [`COMPANION_MIN`], a second one
    /// of that size is made with it and kept, for the turn when a batch holds part of the
    /// first (see [`Kept::put_companion`]).
    fn make_room(&mut self, need: usize, kept: &mut Kept) {
        let len = self.bytes.len();
        if self.bytes.capacity() - len >= need {
            return;
        }
        // Asking for the whole allocation moves the queued bytes to its start.
        if len + need <= self.block && self.bytes.try_reclaim(self.block - len) {
            return;
        }
        let want = len + need;
        // Outgrown, it is let go; else it is kept for another turn.
        let grow = want > self.block;
        let (mut fresh, block) = match kept.take(want) {
            Some(kept) => kept,
            None if grow => {
                let block = want.max(2 * self.block);
                if block >= COMPANION_MIN {
                    kept.put_companion(new_buffer(block), block);
                }
                (new_buffer(block), block)
            }
            None => (new_buffer(self.block), self.block),
        };
        fresh.extend_from_slice(&self.bytes);
        let mut old = std::mem::replace(&mut self.bytes, fresh);
        let old_block = std::mem::replace(&mut self.block, block);
        if !grow {
            old.clear();
            kept.put(old, old_block);
        }
    }

    /// Queues a frame's header and the part of its payload that is copied.
    fn push(&mut self, header: Header, payload: &[u8], kept: &mut Kept) {
        self.make_room(HEADER_LEN + payload.len(), kept);
        self.bytes.extend_from_slice(&header.to_bytes());
        self.bytes.extend_from_slice(payload);
    }

    /// A payload handed over whole: spliced in unless short.
    fn push_chunk(&mut self, chunk: Bytes, kept: &mut Kept) {
        if chunk.len() < SPLICE_MIN {
            self.make_room(chunk.len(), kept);
            self.bytes.extend_from_slice(&chunk);
        } else {
            let at = self.taken + self.bytes.len() as u64;
            self.spliced_len += chunk.len();
            self.spliced.push_back((at, chunk));
        }
    }

    /// Takes one turn's frames into `out`: whole frames while they fit in `allow` bytes, and
    /// if the first does not fit, its first part (a Data frame's, at least [`MIN_CUT`] of
    /// payload). Frames go as they were queued, headers included, in one slice of the queue's
    /// buffer; only the rest of a cut frame gets a header of its own. `position` is the
    /// data-queue position of `out`'s end, and `boundary` records frame starts there.
    fn take_turn(
        &mut self,
        allow: usize,
        out: &mut OutQueue,
        position: u64,
        boundary: &mut impl FnMut(u64),
    ) -> Took {
        let mut took = Took::default();
        // Bytes at the front of `bytes` that go to the batch as they are.
        let mut run = 0;
        while took.wire < allow && (self.partial > 0 || run < self.bytes.len()) {
            let first = took.wire == 0;
            let left = allow - took.wire;
            boundary(position + took.wire as u64);
            if self.partial > 0 {
                // The rest of a cut frame, under a header of its own (only ever first: a
                // cut ends the turn).
                let len = self.partial as usize;
                let Some(n) = payload_taken(len, left, first) else {
                    break;
                };
                let header = Header {
                    id: self.id,
                    length: n as u32,
                    kind: Kind::Data,
                };
                out.extend_from_slice(&header.to_bytes());
                self.take_payload(n, &mut run, out);
                self.partial = (len - n) as u32;
                took.add(HEADER_LEN + n, n);
                continue;
            }
            let Some(raw) = self.bytes.get(run..run + HEADER_LEN) else {
                break;
            };
            let Ok(mut header) = Header::from_bytes(raw.try_into().unwrap_or_default()) else {
                break;
            };
            if header.kind != Kind::Data || header.length == 0 {
                run += HEADER_LEN;
                took.add(HEADER_LEN, HEADER_LEN);
                continue;
            }
            let len = header.length as usize;
            let Some(n) = payload_taken(len, left, first) else {
                break;
            };
            if n < len {
                header.length = n as u32;
                self.bytes[run..run + HEADER_LEN].copy_from_slice(&header.to_bytes());
                self.partial = (len - n) as u32;
            }
            run += HEADER_LEN;
            self.take_payload(n, &mut run, out);
            took.add(HEADER_LEN + n, HEADER_LEN + n);
        }
        self.flush_run(&mut run, out);
        took
    }

    /// Takes `n` bytes of payload after the `run` bytes at the front: a part of the spliced
    /// payload there, or `n` more bytes of the run.
    fn take_payload(&mut self, n: usize, run: &mut usize, out: &mut OutQueue) {
        match self.spliced.front() {
            Some(&(at, _)) if at == self.taken + *run as u64 => {
                self.flush_run(run, out);
                let Some((_, chunk)) = self.spliced.front_mut() else {
                    return;
                };
                let part = chunk.split_to(n);
                if chunk.is_empty() {
                    self.spliced.pop_front();
                }
                self.spliced_len -= part.len();
                out.push_chunk(part);
            }
            _ => *run += n,
        }
    }

    /// Moves the `run` bytes at the front of `bytes` to `out`: handed over as a slice of the
    /// buffer, or copied if short (see [`SPLICE_MIN`]).
    fn flush_run(&mut self, run: &mut usize, out: &mut OutQueue) {
        let n = std::mem::take(run);
        if n == 0 {
            return;
        }
        if n < SPLICE_MIN {
            out.extend_from_slice(&self.bytes[..n]);
            self.bytes.advance(n);
        } else {
            out.push_chunk(self.bytes.split_to(n).freeze());
        }
        self.taken += n as u64;
    }

    /// Empties it for reuse, keeping its buffer.
    fn reset(&mut self) {
        self.bytes.clear();
        self.taken = 0;
        self.spliced.clear();
        self.spliced_len = 0;
        self.partial = 0;
        self.in_flight = 0;
        self.active = false;
    }
}

/// A queue buffer of `block` bytes. One that turns may hand over parts of is shared from the
/// start, so that handing over its first part allocates nothing (a `BytesMut`'s first split
/// allocates its reference count).
fn new_buffer(block: usize) -> BytesMut {
    let mut buffer = BytesMut::with_capacity(block);
    if block >= SPLICE_MIN {
        drop(buffer.split_to(0));
    }
    buffer
}

/// How much of a Data frame of `len` payload bytes a turn with `left` bytes left takes: all of
/// it if it fits; else, as the turn's first frame, the part that fits (at least [`MIN_CUT`],
/// at most all of it); else none, and the turn ends.
fn payload_taken(len: usize, left: usize, first: bool) -> Option<usize> {
    if HEADER_LEN + len <= left {
        Some(len)
    } else if first {
        Some(left.saturating_sub(HEADER_LEN).max(MIN_CUT).min(len))
    } else {
        None
    }
}

/// What a turn took from a queue.
#[derive(Default)]
struct Took {
    /// Bytes it takes in the batch.
    wire: usize,
    /// Queued bytes it used up.
    used: usize,
    /// Frames.
    frames: u64,
}

impl Took {
    fn add(&mut self, wire: usize, used: usize) {
        self.wire += wire;
        self.used += used;
        self.frames += 1;
    }
}

/// Buffers kept for reuse: those queues moved out of while batches still held parts of them,
/// in the order they were left (so the first is the first the batches are done with). With
/// the spare queues' buffers they hold at most [`spare_limit`] of capacity.
#[derive(Default)]
struct Kept {
    buffers: VecDeque<(BytesMut, usize)>,
    /// Their allocations' capacity, in all.
    bytes: usize,
    /// What they may hold: [`spare_limit`] less the spare queues' capacity, set before use.
    limit: usize,
}

impl Kept {
    /// A buffer with room for `want` bytes that nothing else holds a part of, if the first
    /// one kept is such; smaller ones in front of it are let go.
    fn take(&mut self, want: usize) -> Option<(BytesMut, usize)> {
        while let Some((buffer, block)) = self.buffers.front_mut() {
            let block = *block;
            if block < want {
                self.buffers.pop_front();
                self.bytes -= block;
                continue;
            }
            if !buffer.try_reclaim(block) {
                return None;
            }
            self.bytes -= block;
            return self.buffers.pop_front();
        }
        None
    }

    /// Keeps `buffer`, made beside a queue's new buffer of the same size, to be taken first;
    /// the buffers kept that are smaller go. A queue whose buffer grows that large carries
    /// bulk: a batch will hold part of the buffer when the queue needs more room, and the
    /// second buffer is then there, made while the queue was growing rather than in the middle
    /// of the transfer; the two then take turns (`tests/alloc.rs` counts no allocation once a
    /// transfer is under way).
    fn put_companion(&mut self, buffer: BytesMut, block: usize) {
        let mut dropped = 0;
        self.buffers.retain(|&(_, kept)| {
            let keep = kept >= block;
            if !keep {
                dropped += kept;
            }
            keep
        });
        self.bytes -= dropped;
        if self.bytes + block > self.limit {
            return;
        }
        self.bytes += block;
        self.buffers.push_front((buffer, block));
    }

    /// Keeps `buffer` (empty; `block` is its allocation's capacity) if there is room for it
    /// within the limit; else lets it go (it is freed once the batches holding parts of it
    /// are written).
    fn put(&mut self, buffer: BytesMut, block: usize) {
        if block == 0 || self.bytes + block > self.limit {
            return;
        }
        self.bytes += block;
        self.buffers.push_back((buffer, block));
    }
}

/// A queue's place in its priority's round, and what is left of its turn.
#[derive(Debug, Clone, Copy)]
struct Turn {
    queue: usize,
    left: usize,
}

/// The queues of one priority with something to send, in turn order.
struct Level {
    priority: i32,
    round: VecDeque<Turn>,
}

/// Every stream's queue, and the rounds that take from them.
pub(super) struct SendQueues {
    queues: Slab<SendQueue>,
    /// By priority, highest first.
    levels: Vec<Level>,
    spare: Vec<SendQueue>,
    /// Their capacity, in all: with `kept`'s, at most [`spare_limit`].
    spare_bytes: usize,
    /// Buffers queues left while batches held parts of them; made when first needed.
    kept: Option<Box<Kept>>,
    /// Bytes queued in all queues, not taken yet: what the session's `write_buffer_size` bounds.
    pub(super) queued: usize,
    /// Each take of a batch: the data-queue position after it, and its queue.
    takes: VecDeque<(u64, usize)>,
}

/// What a batch took from the queues.
pub(super) struct Taken {
    /// Frames.
    pub(super) frames: u64,
}

/// The capacity the spare queues and the kept buffers may hold, in all: two buffers of the
/// most a queue holds (`write_buffer_size` and one frame of `max_payload`), at least
/// [`SPARE_BYTES`]. (Computed where used, rather than kept in state every session holds.)
pub(super) fn spare_limit(write_buffer_size: usize, max_payload: usize) -> usize {
    write_buffer_size
        .saturating_add(max_payload + HEADER_LEN)
        .saturating_mul(2)
        .max(SPARE_BYTES)
}

impl SendQueues {
    pub(super) fn new() -> SendQueues {
        SendQueues {
            queues: Slab::new(),
            levels: Vec::new(),
            spare: Vec::new(),
            spare_bytes: 0,
            kept: None,
            queued: 0,
            takes: VecDeque::new(),
        }
    }

    /// Whether some queue has something to send.
    pub(super) fn has_output(&self) -> bool {
        self.levels.iter().any(|level| !level.round.is_empty())
    }

    /// Bytes queued in queue `key`.
    pub(super) fn queued_in(&self, key: usize) -> usize {
        self.queues.get(key).map_or(0, SendQueue::len)
    }

    /// Queues a frame in queue `key`: its header, and its payload copied (`payload`) or
    /// handed over (`chunk`). `spare_limit` is [`spare_limit`] of the session's settings.
    pub(super) fn push(
        &mut self,
        key: usize,
        header: Header,
        payload: &[u8],
        chunk: Option<Bytes>,
        spare_limit: usize,
    ) {
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        let kept = self.kept.get_or_insert_with(Box::default);
        kept.limit = spare_limit.saturating_sub(self.spare_bytes);
        queue.push(header, payload, kept);
        self.queued += HEADER_LEN + payload.len();
        if let Some(chunk) = chunk {
            self.queued += chunk.len();
            queue.push_chunk(chunk, kept);
        }
    }

    /// A new queue for the stream `(stream, id)`; returns its key.
    pub(super) fn create(&mut self, stream: usize, id: u32, priority: i32) -> usize {
        let mut queue = self.spare.pop().unwrap_or_else(SendQueue::new);
        self.spare_bytes = self.spare_bytes.saturating_sub(queue.block);
        queue.id = id;
        queue.stream = stream;
        queue.priority = priority;
        self.queues.insert(queue)
    }

    /// Gives the queue a turn, if it has none: it has something to send.
    pub(super) fn activate(&mut self, key: usize) {
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        if queue.active || queue.is_empty() {
            return;
        }
        queue.active = true;
        let priority = queue.priority;
        self.level(priority).round.push_back(Turn {
            queue: key,
            left: QUANTUM,
        });
    }

    /// The round of `priority`, made if it is new.
    fn level(&mut self, priority: i32) -> &mut Level {
        let at = match self
            .levels
            .binary_search_by(|level| priority.cmp(&level.priority))
        {
            Ok(at) => at,
            Err(at) => {
                // Room for one level first: most sessions use one priority (see
                // `Slab::insert` on why a first allocation is made no larger than needed).
                self.levels
                    .reserve_exact(usize::from(self.levels.capacity() == 0));
                self.levels.insert(
                    at,
                    Level {
                        priority,
                        round: VecDeque::new(),
                    },
                );
                at
            }
        };
        &mut self.levels[at]
    }

    /// The queue's stream changed its priority: a turn it holds moves to the new round's end.
    pub(super) fn reprioritize(&mut self, key: usize, priority: i32) {
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut queue.priority, priority);
        if old == priority || !queue.active {
            return;
        }
        if let Some(level) = self.levels.iter_mut().find(|l| l.priority == old) {
            level.round.retain(|turn| turn.queue != key);
        }
        self.level(priority).round.push_back(Turn {
            queue: key,
            left: QUANTUM,
        });
    }

    /// Fills `out` with up to `budget` bytes of frames (more only to send one cut frame), by
    /// priority and round robin; `position` is the data-queue position of `out`'s end and
    /// `boundary` records frame starts there. Returns what it took.
    pub(super) fn take(
        &mut self,
        mut budget: usize,
        out: &mut OutQueue,
        mut position: u64,
        mut boundary: impl FnMut(u64),
    ) -> Taken {
        let mut frames = 0;
        let mut turns = 0;
        'levels: for level in &mut self.levels {
            while let Some(&Turn { queue: key, left }) = level.round.front() {
                if budget == 0 || turns == MAX_TURNS {
                    break 'levels;
                }
                let Some(queue) = self.queues.get_mut(key) else {
                    level.round.pop_front();
                    continue;
                };
                let alone = level.round.len() == 1;
                if left == 0 && !alone {
                    // It filled a batch alone: its turn is over, and a queue that came
                    // meanwhile goes first.
                    level.round.pop_front();
                    level.round.push_back(Turn {
                        queue: key,
                        left: QUANTUM,
                    });
                    continue;
                }
                let left = if left == 0 { QUANTUM } else { left };
                let budget_before = budget;
                let allow = if alone { budget } else { left.min(budget) };
                let took = queue.take_turn(allow, out, position, &mut boundary);
                let spent = took.wire;
                position += spent as u64;
                self.queued = self.queued.saturating_sub(took.used);
                frames += took.frames;
                budget = budget.saturating_sub(spent);
                turns += 1;
                if spent > 0 {
                    queue.in_flight += 1;
                    self.takes.push_back((position, key));
                }
                if queue.is_empty() {
                    queue.active = false;
                    level.round.pop_front();
                    continue;
                }
                // Something is left: the turn is over (it was what limited the take), or
                // the batch is full and the turn goes on in the next one. A queue alone ends its
                // turn with the batch, so that one that comes meanwhile goes first in the next.
                if !alone && left <= budget_before {
                    level.round.pop_front();
                    level.round.push_back(Turn {
                        queue: key,
                        left: QUANTUM,
                    });
                } else {
                    if let Some(turn) = level.round.front_mut() {
                        turn.left = if alone { 0 } else { left - spent.min(left) };
                    }
                    break 'levels;
                }
            }
        }
        Taken { frames }
    }

    /// The transport has taken the batches up to data-queue position `written`: returns, one
    /// at a time, the queues left with nothing queued nor in flight, which are freed (their
    /// streams' bytes are all written).
    /// `spare_limit` is [`spare_limit`] of the session's settings.
    pub(super) fn next_written(
        &mut self,
        written: u64,
        spare_limit: usize,
    ) -> Option<(usize, u32)> {
        while let Some(&(end, key)) = self.takes.front() {
            if end > written {
                return None;
            }
            self.takes.pop_front();
            let Some(queue) = self.queues.get_mut(key) else {
                continue;
            };
            queue.in_flight = queue.in_flight.saturating_sub(1);
            if queue.in_flight == 0 && queue.is_empty() && !queue.active {
                let (stream, id) = (queue.stream, queue.id);
                self.free(key, spare_limit);
                return Some((stream, id));
            }
        }
        None
    }

    /// Forgets the queue, keeping it and its buffer as a spare if the capacity kept stays
    /// within `spare_limit`.
    fn free(&mut self, key: usize, spare_limit: usize) {
        let Some(mut queue) = self.queues.remove(key) else {
            return;
        };
        if queue.active {
            for level in &mut self.levels {
                level.round.retain(|turn| turn.queue != key);
            }
        }
        self.queued = self.queued.saturating_sub(queue.len());
        queue.reset();
        let kept = self.kept.as_ref().map_or(0, |kept| kept.bytes);
        if self.spare_bytes + kept + queue.block <= spare_limit {
            self.spare_bytes += queue.block;
            self.spare
                .reserve_exact(usize::from(self.spare.capacity() == 0));
            self.spare.push(queue);
        }
    }

    /// Gives back the memory of what holds nothing: the session is quiet.
    pub(super) fn release_empty(&mut self) {
        self.spare = Vec::new();
        self.spare_bytes = 0;
        self.kept = None;
        if self.takes.is_empty() {
            self.takes = VecDeque::new();
        }
        self.levels.retain(|level| !level.round.is_empty());
        if self.levels.is_empty() {
            self.levels = Vec::new();
        }
        if self.queues.len() == 0 {
            self.queues = Slab::new();
        }
    }

    /// Whether nothing is queued nor in flight.
    pub(super) fn all_written(&self) -> bool {
        self.queues.len() == 0
    }

    /// Capacity held, for tests.
    #[cfg(test)]
    pub(super) fn capacity(&mut self) -> usize {
        self.spare_bytes
            + self.kept.as_ref().map_or(0, |kept| kept.bytes)
            + self.queues.iter_mut().map(|q| q.block).sum::<usize>()
    }
}
