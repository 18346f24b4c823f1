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
//! Bytes are copied into a queue when written and into the batch when taken; payloads handed
//! over as [`Bytes`] (`Stream::write_chunk`) of [`SPLICE_MIN`] or more are spliced in and never
//! copied. A queue lives while it holds something or its last take is not written yet
//! (`in_flight`); emptied queues go to a pool of spare ones, up to twice `write_buffer_size` of capacity
//! in all (a busy stream's queue grows to about that), so that streams that each send a message now and then allocate nothing.
//!
//! [`SPLICE_MIN`]: crate::session::out_queue::SPLICE_MIN

use std::collections::VecDeque;

use bytes::Bytes;

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

/// Turns in one batch, at most: bounds the batch's bookkeeping with many small queues.
const MAX_TURNS: usize = 4096;

/// One stream's queue.
pub(super) struct SendQueue {
    /// The stream it belongs to: its id, and its key (the stream may be gone meanwhile).
    pub(super) id: u32,
    pub(super) stream: usize,
    pub(super) priority: i32,
    /// Frames, headers and copied payloads, from `head` on.
    bytes: Vec<u8>,
    head: usize,
    /// Position in the queue's byte stream (bytes ever taken from `bytes`) of `bytes[head]`.
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
            bytes: Vec::new(),
            head: 0,
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
        self.bytes.len() - self.head + self.spliced_len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.head == self.bytes.len() && self.spliced.is_empty()
    }

    fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    pub(super) fn push_header(&mut self, header: Header) {
        self.bytes.extend_from_slice(&header.to_bytes());
    }

    pub(super) fn push_payload(&mut self, payload: &[u8]) {
        self.bytes.extend_from_slice(payload);
    }

    /// A payload handed over whole: spliced in unless short.
    pub(super) fn push_chunk(&mut self, chunk: Bytes) {
        if chunk.len() < SPLICE_MIN {
            self.bytes.extend_from_slice(&chunk);
        } else {
            let at = self.taken + (self.bytes.len() - self.head) as u64;
            self.spliced_len += chunk.len();
            self.spliced.push_back((at, chunk));
        }
    }

    /// Moves the whole frames at the front of the queue that fit in `allow` bytes into an empty
    /// `out` without copying them, when they are most of what it holds: its buffer goes to
    /// `out` (which gives its own, empty, in exchange), and what does not fit is copied back.
    /// So a stream sending bulk alone costs no copy beyond the one into its queue. Calls
    /// `boundary` with the position of each frame start; returns what it took, or `None` when
    /// the frames are to be taken one by one.
    fn take_whole(
        &mut self,
        allow: usize,
        out: &mut OutQueue,
        position: u64,
        boundary: &mut impl FnMut(u64),
    ) -> Option<(Took, u64)> {
        if self.head != 0 || self.partial != 0 || !self.spliced.is_empty() || !out.is_empty() {
            return None;
        }
        let (mut end, mut frames) = (0, 0);
        while let Some(raw) = self.bytes.get(end..end + HEADER_LEN) {
            let header = Header::from_bytes(raw.try_into().ok()?).ok()?;
            let size = HEADER_LEN
                + match header.kind {
                    Kind::Data => header.length as usize,
                    _ => 0,
                };
            if end + size > allow || end + size > self.bytes.len() {
                break;
            }
            boundary(position + end as u64);
            end += size;
            frames += 1;
        }
        if end < self.bytes.len() / 2 || end < MIN_CUT {
            return None;
        }
        let capacity = self.bytes.capacity();
        if !out.adopt(&mut self.bytes) {
            return None;
        }
        // The two buffers take turns: both grow to the working size at once, so that neither
        // grows later, one frame at a time.
        self.bytes.reserve(capacity);
        // `bytes` is now the batch's old buffer, empty: what did not fit goes back into it.
        out.move_tail(end, &mut self.bytes);
        self.taken += end as u64;
        Some((
            Took {
                wire: end,
                used: end,
            },
            frames,
        ))
    }

    /// Moves the next frame into `out` if it fits in `allow` bytes; if it does not and `cut`
    /// is set, a Data frame's first part that fits (at least [`MIN_CUT`] of payload).
    /// Returns the frame's size in `out` and the queued bytes it used.
    fn take_frame(&mut self, allow: usize, cut: bool, out: &mut OutQueue) -> Option<Took> {
        let mut used = 0;
        let len = if self.partial > 0 {
            self.partial as usize
        } else {
            let raw: [u8; HEADER_LEN] = self
                .bytes
                .get(self.head..self.head + HEADER_LEN)?
                .try_into()
                .ok()?;
            let header = Header::from_bytes(raw).ok()?;
            if header.kind != Kind::Data || header.length == 0 {
                out.extend_from_slice(&raw);
                self.consume(HEADER_LEN);
                return Some(Took {
                    wire: HEADER_LEN,
                    used: HEADER_LEN,
                });
            }
            let len = header.length as usize;
            if HEADER_LEN + len > allow && !cut {
                return None;
            }
            self.consume(HEADER_LEN);
            used += HEADER_LEN;
            len
        };
        if self.partial > 0 && HEADER_LEN + len > allow && !cut {
            return None;
        }
        let n = if HEADER_LEN + len <= allow {
            len
        } else {
            allow.saturating_sub(HEADER_LEN).max(MIN_CUT).min(len)
        };
        out.extend_from_slice(
            &Header {
                id: self.id,
                length: n as u32,
                kind: Kind::Data,
            }
            .to_bytes(),
        );
        match self.spliced.front_mut() {
            Some((at, chunk)) if *at == self.taken => {
                let part = chunk.split_to(n);
                if chunk.is_empty() {
                    self.spliced.pop_front();
                }
                self.spliced_len -= n;
                out.push_chunk(part);
            }
            _ => {
                out.extend_from_slice(&self.bytes[self.head..self.head + n]);
                self.consume(n);
            }
        }
        used += n;
        self.partial = (len - n) as u32;
        Some(Took {
            wire: HEADER_LEN + n,
            used,
        })
    }

    /// Moves past `n` bytes of `bytes`, giving back the space taken once that is worth it: once
    /// three quarters of the buffer are taken, so that moving the rest to the front costs at
    /// most a third of a byte per byte taken (moving it at half, a profile of ten streams sending
    /// at once spent as much time moving queued bytes as copying them in).
    fn consume(&mut self, n: usize) {
        self.head += n;
        self.taken += n as u64;
        if self.head == self.bytes.len() {
            self.bytes.clear();
            self.head = 0;
        } else if self.head >= 64 * 1024 && self.head * 4 >= self.bytes.len() * 3 {
            self.bytes.drain(..self.head);
            self.head = 0;
        }
    }

    /// Empties it for reuse, keeping its buffer's capacity.
    fn reset(&mut self) {
        self.bytes.clear();
        self.head = 0;
        self.taken = 0;
        self.spliced.clear();
        self.spliced_len = 0;
        self.partial = 0;
        self.in_flight = 0;
        self.active = false;
    }
}

/// What one frame taken from a queue came to.
struct Took {
    /// Bytes it takes in the batch.
    wire: usize,
    /// Queued bytes it used up.
    used: usize,
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
    /// Their capacity, in all: at most [`spare_limit`].
    spare_bytes: usize,
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

/// The capacity the spares may hold, in all: twice `write_buffer_size`, at least
/// [`SPARE_BYTES`]. (Computed where used, rather than kept in state every session holds.)
pub(super) fn spare_limit(write_buffer_size: usize) -> usize {
    write_buffer_size.saturating_mul(2).max(SPARE_BYTES)
}

impl SendQueues {
    pub(super) fn new() -> SendQueues {
        SendQueues {
            queues: Slab::new(),
            levels: Vec::new(),
            spare: Vec::new(),
            spare_bytes: 0,
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

    pub(super) fn get_mut(&mut self, key: usize) -> Option<&mut SendQueue> {
        self.queues.get_mut(key)
    }

    /// A new queue for the stream `(stream, id)`; returns its key.
    pub(super) fn create(&mut self, stream: usize, id: u32, priority: i32) -> usize {
        let mut queue = self.spare.pop().unwrap_or_else(SendQueue::new);
        self.spare_bytes = self.spare_bytes.saturating_sub(queue.capacity());
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
        let active_levels = self.levels.iter().filter(|l| !l.round.is_empty()).count();
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
                let mut spent = 0;
                // Handing a queue's buffer over whole only pays when the batch is that queue's
                // alone: appending other queues' frames to it would grow it, batch after batch.
                let only = alone && active_levels == 1;
                let whole = if only {
                    queue.take_whole(allow, out, position, &mut boundary)
                } else {
                    None
                };
                if let Some((took, whole)) = whole {
                    spent += took.wire;
                    position += took.wire as u64;
                    self.queued = self.queued.saturating_sub(took.used);
                    frames += whole;
                }
                while !queue.is_empty() && spent < allow {
                    boundary(position);
                    match queue.take_frame(allow - spent.min(allow), spent == 0, out) {
                        None => break,
                        Some(took) => {
                            spent += took.wire;
                            position += took.wire as u64;
                            self.queued = self.queued.saturating_sub(took.used);
                            frames += 1;
                        }
                    }
                    if spent >= allow {
                        break;
                    }
                }
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
    /// `spare_limit` is [`spare_limit`] of the session's `write_buffer_size`.
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

    /// Forgets the queue, keeping its buffer as a spare if the spares' capacity stays within
    /// `spare_limit`.
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
        if self.spare_bytes + queue.capacity() <= spare_limit {
            self.spare_bytes += queue.capacity();
            self.spare
                .reserve_exact(usize::from(self.spare.capacity() == 0));
            self.spare.push(queue);
        }
    }

    /// Gives back the memory of what holds nothing: the session is quiet.
    pub(super) fn release_empty(&mut self) {
        self.spare = Vec::new();
        self.spare_bytes = 0;
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
        self.spare_bytes + self.queues.iter_mut().map(|q| q.capacity()).sum::<usize>()
    }
}
