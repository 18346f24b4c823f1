//! The session's core: the state its driver and its handles share, and everything that
//! changes it. Nothing here does I/O, reads a clock or waits: the driver feeds received frames
//! in and takes outgoing bytes out, handles read, write and close through it, and both pass in
//! the time where it matters (as a [`Now`] where it is seldom needed: the clock is read on the
//! caller's behalf then, only if it is).
//!
//! One file per idea, as h2's `proto/streams` splits them:
//!
//! | file | what it owns |
//! |---|---|
//! | `stream_state.rs` | one stream: its send and receive states, credit, waiters |
//! | `recv_buf.rs` | a stream's received data, and the read buffers it pins |
//! | `recv.rs` | received frames, reads, credit returned, window growth |
//! | `send.rs` | opens, writes, closes, flushes, handles going away |
//! | `send_queue.rs` | each stream's send queue, and the scheduler that builds batches from them |
//! | `outgoing/mod.rs` | what the session sends and in which order: the outgoing side's state |
//! | `outgoing/control.rs` | the control queue: credit, refusals, keepalives, and when they go |
//! | `outgoing/room.rs` | writers and openers waiting for room, streams for their bytes to be written |
//! | `outgoing/direct_admit.rs` | when a writer writes its frame to the transport itself |
//! | `outgoing/batch.rs` | the driver's batches, and what writing them reports |
//! | `lifecycle.rs` | how a session ends, and what its handles learn of it |
//! | `peer.rs` | what the peer is (greeted or plain), and the opens waiting for its acknowledgements |
//!
//! One mutex guards it all, and it is never held across an `.await` or a transport call.

mod id_hash;
mod lifecycle;
mod outgoing;
mod peer;
mod recv;
pub(crate) mod recv_buf;
mod send;
mod send_queue;
mod slab;
mod stream_state;
mod wait_list;
mod write_waits;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;

use bytes::BytesMut;
use tokio::time::Instant;

use self::id_hash::IdMap;
use self::lifecycle::Lifecycle;
pub(crate) use self::outgoing::Admitted;
pub(crate) use self::outgoing::Batch;
use self::outgoing::{Control, Outgoing};
use self::peer::Peer;
pub(crate) use self::peer::PeerKind;
use self::recv_buf::PinLedger;
use self::slab::Slab;
use self::stream_state::StreamState;
pub(crate) use self::wait_list::WaitList;
use self::write_waits::WriteWaits;
use crate::config::{Config, Role, Settings};
use crate::session::direct::DirectWrite;
pub(crate) use crate::session::now::Now;
use crate::stats::Stats;
use crate::trace::next_session_id;

/// Microseconds from `start` to `now`, at least 1 (0 means "not set" to a
/// [`crate::flow::Tuner`]).
fn micros_since(start: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(start).as_micros() as u64 + 1
}

/// The mutex-guarded session state, see the module docs.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    /// The transport, for writers that may write their frame themselves (a spawned session's;
    /// see `session::direct`).
    direct: OnceLock<Arc<dyn DirectWrite>>,
}

impl Shared {
    pub(crate) fn new(role: Role, config: Config, now: Instant) -> Shared {
        Shared {
            inner: Mutex::new(Inner::new(role, config, now)),
            direct: OnceLock::new(),
        }
    }

    /// Lets writers write to `io` themselves.
    pub(crate) fn set_direct(&self, io: Arc<dyn DirectWrite>) {
        let _ = self.direct.set(io);
    }

    /// The transport writers may write to, if they may.
    pub(crate) fn direct(&self) -> Option<&dyn DirectWrite> {
        self.direct.get().map(|io| &**io)
    }

    /// Locks the state. A panic elsewhere while it was held cannot leave it half-updated in a
    /// way that matters more than stopping would, so poisoning is ignored rather than spread.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs a handle operation on the state, then wakes the tasks it collected and the driver
    /// (if the operation left it something to do), after unlocking.
    pub(crate) fn with_driver<R>(&self, f: impl FnOnce(&mut Inner, &mut Vec<Waker>) -> R) -> R {
        let mut wakers = Vec::new();
        let mut inner = self.lock();
        let result = f(&mut inner, &mut wakers);
        inner.wake_if_idle(&mut wakers);
        inner.wake_opener_if_able(&mut wakers);
        let driver = if inner.driver_needed() {
            inner.take_driver_waker()
        } else {
            None
        };
        drop(inner);
        wakers.into_iter().for_each(Waker::wake);
        if let Some(driver) = driver {
            driver.wake();
        }
        result
    }
}

/// The counters behind [`Stats`] that the session keeps; the others are computed when a
/// snapshot is taken (every session pays for what is kept: `tests/idle_memory.rs`).
///
/// Counts of streams and keepalives take 32 bits, and stop at `u32::MAX` ([`bump`]): a side
/// opens at most 2^31 streams (its stream ids), and a keepalive every second takes 136 years
/// to get there; a peer sending more opens or keepalives than that sees the counts stop.
#[derive(Debug, Default)]
struct Counters {
    frames_sent: u64,
    bytes_received: u64,
    frames_received: u64,
    buffered: u64,
    peak_buffered: u64,
    streams_opened: u32,
    streams_accepted: u32,
    streams_refused: u32,
    keepalives_sent: u32,
    keepalives_received: u32,
    refused_by_peer: u32,
}

/// Adds `n` to a 32-bit count, which stops at its largest value (see [`Counters`]).
fn bump(count: &mut u32, n: u32) {
    *count = count.saturating_add(n);
}

/// The parts of a session's state that few sessions use, boxed and made on first use, so that
/// the others do not carry them: an idle session's size is what a server holding thousands
/// pays for each (`tests/idle_memory.rs`, `benches/idle_sessions.rs`). Kept once made.
#[derive(Default)]
struct Rare {
    /// The tasks waiting in `stopped()` on a stream, by stream key, each in a slot of its own
    /// (any number of tasks may wait, and all are woken): few streams have one, so the list
    /// is kept here rather than in every stream's state. A list goes when its last future
    /// does.
    stop_waiters: IdMap<usize, WaitList>,
    /// The send priority of every stream whose priority is not 0, by stream key (see
    /// `Stream::set_priority`): few streams have one, so every other stream pays nothing for it.
    priorities: IdMap<usize, i32>,
    /// The writes that waited for credit or room, and how long, for `Session::stats`.
    write_waits: WriteWaits,
}

/// The smallest round trip measured, in microseconds: 8 bytes where an `Option<u64>` takes 16,
/// in state every session holds (`benches/idle_sessions.rs`).
#[derive(Debug, Clone, Copy)]
struct MinRtt(u64);

impl Default for MinRtt {
    fn default() -> MinRtt {
        MinRtt(u64::MAX)
    }
}

impl MinRtt {
    fn get(self) -> Option<u64> {
        (self.0 != u64::MAX).then_some(self.0)
    }

    fn sample(&mut self, micros: u64) {
        self.0 = self.0.min(micros);
    }
}

pub(crate) struct Inner {
    /// The session's number in log lines.
    pub(crate) id: u64,
    pub(crate) role: Role,
    /// Shared with the `Config` it came from and the other sessions made from it.
    pub(crate) config: Arc<Settings>,
    streams: Slab<StreamState>,
    /// Streams not finished yet (see `StreamState::finished`): what a drain and `wait_idle`
    /// wait for, with the queues written out. A handle kept on a finished stream does not
    /// count: it can only read what is buffered.
    unfinished: usize,
    /// Wire id → slab key, for every stream that has state. The key is kept in 32 bits, which
    /// makes an entry half as large (the map is a good part of what an idle stream costs): each
    /// stream with state has its own 32-bit id, so the slab never holds more than 2^32 of them.
    ids: IdMap<u32, u32>,
    next_id: u32,
    /// Inbound streams waiting for `accept`, and the tasks waiting there.
    accept_queue: VecDeque<usize>,
    accept_waiters: WaitList,
    /// What few sessions use: made on first use (see [`Rare`]).
    rare: Option<Box<Rare>>,
    out: Outgoing,
    life: Lifecycle,
    /// What the peer is, its unacknowledged streams, and the opens waiting for them.
    peer: Peer,
    /// The driver sleeps and has not been woken since: whoever gives it something to do wakes
    /// it (with the waker `Outgoing::driver_waker` keeps) and clears this.
    driver_asleep: bool,
    /// The driver sleeps with a batch in hand that the transport does not take yet: the
    /// transport wakes it, and it then takes what was queued meanwhile, so queueing output
    /// need not wake it.
    driver_writing: bool,
    /// When the session started: the origin of its clock for window tuning (see
    /// [`crate::flow::Tuner`]), and of the wait for the peer's greeting (`peer::GREETING_WAIT`).
    clock: Instant,
    /// The smallest round trip measured, in microseconds.
    min_rtt: MinRtt,
    /// Counters for `Session::stats` (the figures it computes are not kept here); `buffered` is
    /// also what the pinned-memory bound and the memory tests read.
    stats: Counters,
    /// Drained stream buffers for reuse, at most [`TAIL_POOL`](recv_buf::TAIL_POOL).
    tail_pool: Vec<BytesMut>,
    /// The read buffers that buffered data keeps alive.
    pins: PinLedger,
    /// What streams may still add to their windows, see `Config::receive_window_budget`.
    window_budget: u64,
}

impl Inner {
    fn new(role: Role, config: Config, now: Instant) -> Inner {
        let config = config.settings();
        let mut inner = Inner {
            id: next_session_id(),
            role,
            streams: Slab::new(),
            unfinished: 0,
            ids: IdMap::default(),
            next_id: role.first_id(),
            accept_queue: VecDeque::new(),
            accept_waiters: WaitList::new(),
            rare: None,
            out: Outgoing::new(),
            life: Lifecycle::new(),
            peer: Peer::new(),
            driver_asleep: false,
            driver_writing: false,
            clock: now,
            min_rtt: MinRtt::default(),
            stats: Counters::default(),
            // Made at its full size (2 KiB, so that it never grows) when a stream first
            // receives a second short payload (`RecvBuffer::copy_to_tail`): a session whose
            // streams moved one message never has it. Given back with the buffers when the
            // session goes quiet (`release_buffers`).
            tail_pool: Vec::new(),
            pins: PinLedger::default(),
            window_budget: config.receive_window_budget,
            config,
        };
        // The greeting goes first, ahead of anything else this side sends (see `peer.rs`).
        let greeting = peer::greeting(inner.config.keepalive_interval);
        inner.queue_control(Control::Frame(greeting));
        inner
    }

    /// What this side knows of its peer.
    pub(crate) fn peer_kind(&self) -> PeerKind {
        self.peer.kind
    }

    /// Whether an open may create a stream at `now`: below `max_streams`, and below the
    /// backlog of unacknowledged streams unless the peer acknowledges none.
    fn may_open(&self, now: Instant) -> bool {
        self.streams.len() < self.config.max_streams
            && (self.peer.unacked < self.config.open_backlog
                || !self.peer.holds_opens(now, self.clock))
    }

    /// Wakes the open first in line if it may open now (a stream was acknowledged or went
    /// away, the peer became known). It wakes the next one when it has opened.
    pub(crate) fn wake_opener_if_able(&mut self, wakers: &mut Vec<Waker>) {
        if self.peer.has_waiting() && self.may_open(Instant::now()) {
            self.peer.wake_next(wakers);
        }
    }

    /// Streams with state: open, or closed by one side while a handle remains.
    pub(crate) fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// Streams with something left to do (see `StreamState::finished`).
    pub(crate) fn unfinished_streams(&self) -> usize {
        self.unfinished
    }

    /// Counts the stream out of the unfinished ones once it is finished. Called after every
    /// change of a stream's directions; a stream never becomes unfinished again.
    fn note_finished(&mut self, key: usize) {
        let Some(stream) = self.streams.get_mut(key) else {
            return;
        };
        if !stream.queued.has(stream_state::Queued::FINISHED) && stream.finished() {
            stream.queued.set(stream_state::Queued::FINISHED, true);
            self.unfinished = self.unfinished.saturating_sub(1);
        }
    }

    /// Whether no stream has anything left to do and everything queued is written: what a
    /// drain and `wait_idle` wait for.
    fn idle(&self) -> bool {
        self.unfinished == 0 && self.out.all_written()
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> Stats {
        let no_waits = WriteWaits::default();
        let waits = self
            .rare
            .as_ref()
            .map_or(&no_waits, |rare| &rare.write_waits);
        let (credit_wait_time, room_wait_time) = waits.times();
        Stats {
            live_streams: self.streams.len(),
            bytes_sent: self.out.bytes_written(),
            credit_waits: waits.credit_waits,
            credit_wait_time,
            room_waits: waits.room_waits,
            room_wait_time,
            queued: self.out.queued_bytes(),
            min_rtt: self.min_rtt.get().map(std::time::Duration::from_micros),
            frames_sent: self.stats.frames_sent,
            bytes_received: self.stats.bytes_received,
            frames_received: self.stats.frames_received,
            streams_opened: self.stats.streams_opened.into(),
            streams_accepted: self.stats.streams_accepted.into(),
            streams_refused: self.stats.streams_refused.into(),
            keepalives_sent: self.stats.keepalives_sent.into(),
            keepalives_received: self.stats.keepalives_received.into(),
            buffered: self.stats.buffered,
            peak_buffered: self.stats.peak_buffered,
            refused_by_peer: self.stats.refused_by_peer.into(),
        }
    }

    /// A snapshot of one stream's figures (defaults for a stream that is gone).
    pub(crate) fn stream_stats(&self, key: usize) -> crate::stats::StreamStats {
        let Some(stream) = self.streams.get(key) else {
            return crate::stats::StreamStats::default();
        };
        let waits = self
            .rare
            .as_ref()
            .map(|rare| rare.write_waits.of_stream(key))
            .unwrap_or_default();
        let queued = self.out.stream_queued(stream.send_queue);
        crate::stats::StreamStats {
            credit_waits: waits.credit_waits,
            credit_wait_time: waits.credit_time,
            room_waits: waits.room_waits,
            room_wait_time: waits.room_time,
            send_credit: stream.send_credit,
            queued,
            buffered: u64::from(stream.buffer.len()),
            receive_window: stream.window.target(),
            min_rtt: self.min_rtt.get().map(std::time::Duration::from_micros),
            priority: self.priority(key),
        }
    }

    /// Bytes of read buffers kept alive by unread data, for tests.
    #[cfg(test)]
    pub(crate) fn pinned(&self) -> usize {
        self.pins.pinned()
    }

    /// The rarely used parts, made now if they were not.
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Counts `n` bytes newly buffered (positive) or taken from the buffers (negative).
    fn count_buffered(&mut self, n: i64) {
        let stats = &mut self.stats;
        stats.buffered = stats.buffered.saturating_add_signed(n);
        stats.peak_buffered = stats.peak_buffered.max(stats.buffered);
    }

    /// Registers the driver's waker, unless it is the one already stored; `writing` says
    /// whether it sleeps with a batch the transport has not taken yet.
    pub(crate) fn set_driver_waker(&mut self, waker: &Waker, writing: bool) {
        self.driver_asleep = true;
        self.driver_writing = writing;
        self.driver_sleeps(waker);
    }

    /// The driver's waker if it sleeps and nobody woke it since; it counts as woken from now.
    fn take_driver_waker(&mut self) -> Option<Waker> {
        if !std::mem::take(&mut self.driver_asleep) {
            return None;
        }
        self.out.driver_waker.clone()
    }

    /// Gives back the buffers kept for reuse, and the capacity of the queues that are empty:
    /// the session has gone quiet (see `session::linger`). What holds data keeps it.
    pub(crate) fn release_buffers(&mut self) {
        self.out.release_empty();
        self.streams.shrink();
        self.accept_waiters.shrink();
        self.tail_pool = Vec::new();
        if self.accept_queue.is_empty() {
            self.accept_queue = VecDeque::new();
        }
    }

    /// Whether the driver has to be woken after a handle operation: output is waiting, the
    /// session ended, or it drains (queued inbound streams are to be refused, and the session
    /// closes itself once no stream is left).
    fn driver_needed(&self) -> bool {
        self.has_output() && !self.driver_writing
            || self.room_to_hand_out()
            || self.life.ended()
            || self.life.draining() && (self.idle() || !self.accept_queue.is_empty())
    }
}

#[cfg(test)]
mod tests;
