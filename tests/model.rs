//! Model-based property test: random operations on both ends of random streams, over
//! transports that cut every read and write into small random pieces, checked against a model
//! of what each end must see.
//!
//! The codec's own properties (encode then decode, in any split of the input) are next to it in
//! `src/codec.rs`; this file tests the sessions.
//!
//! Each case runs on its own current-thread runtime with paused time, so a case is a
//! deterministic function of its inputs (proptest can shrink a failure to a short sequence) and
//! an operation that can make no progress is seen at once: the runtime jumps to the operation's
//! deadline instead of waiting for it.
//!
//! Each case also draws a configuration (both sessions get the same): the outgoing queue's
//! `write_buffer_size` (tiny, 1 to 64 bytes, so that nearly every frame waits for room; 4 KiB;
//! or the default 1 MiB), the `receive_window_budget` (none, 256 KiB or the default 64 MiB),
//! which with the receive window bounds the memory a session may hold, and the `open_backlog`
//! (1 to 4 in a third of the mixed cases, so that opens wait for acknowledgements; otherwise
//! the default).
//!
//! Operations never wait for the other side: each is given a short virtual deadline and counts
//! what it did by then (a write that was cut short queued exactly what it reported, since writes
//! are cancel safe). Besides opening, accepting, reading, writing and closing, a case can
//!
//! - stall one side's transport writes for a while (virtual time, at most 2 s, well within the
//!   close timeout) or lift the stall early: the side's outgoing queue fills and its writers,
//!   openers and closers wait; every case lifts all stalls before its final steps;
//! - move bulk data in both directions at once (`Op::Bulk`): several writers, on both sides, on
//!   the same or different streams, write while every end involved reads, and a writer may
//!   close its stream once it is done, all in one task that polls everything;
//! - poll a pending operation (write, read, flush, open, stream close) hundreds of times with
//!   the same waker, as a `select!` loop or a combinator would (`Op::Repoll`);
//! - end a session at a random point: `Session::close`, `Session::graceful_close` (in a task of
//!   its own, while the operations go on), or a broken connection (`Op::Break`: both transports
//!   fail every later call, as when a peer's driver or transport end is dropped).
//!
//! Two properties run these: the first mixes every operation (bulk transfers of up to 192 KiB
//! per writer); the second opens a few streams and runs bulk transfers of up to 3 MiB per
//! writer, three to six writers at once, with stalls between them: large enough for the
//! progress bound below to bite when the queues are small. A third,
//! `both_sides_close_while_busy`, runs a few of the mixed operations, then has both sides queue
//! data on their streams (each direction of at least one stream) and both call
//! `Session::close` in the same step (`Op::BusyClose`): both closes must return `Ok` within
//! [`BUSY_CLOSE`] of virtual time, well under the close timeout (a close that has to wait for
//! the peer's reading while the peer waits for its own must not wait for that timeout).
//!
//! At the end every end shuts down its writing, reads everything left, and all handles are
//! dropped. The invariants:
//!
//! - what an end reads is always a prefix of what its peer's writes reported (nothing lost from
//!   the middle, duplicated, reordered or mixed between streams);
//! - end-of-stream comes only after all of it;
//! - an end that keeps reading, in a session it did not close itself, reads all of it: data
//!   queued before a close, a drop or the peer's session close still arrives;
//! - a write fails only for a reason (this end closed its writing, the peer closed its reading,
//!   a session ended), and always fails once this end closed its writing;
//! - every stream's reported fate is true: a stream reported `Refused` (by a read or a write)
//!   was never accepted by the peer's application; every byte whose write returned is read by a
//!   peer end that keeps reading, unless that end's own session was cut (`Session::close`) or
//!   the connection broke: a close or graceful close of the writer's session loses nothing
//!   written before it began (later writes fail), nor does a graceful close of the reader's;
//!   and a broken connection ends a stream not read to its end with an error, never with
//!   end-of-stream;
//! - the open backlog: once the peer's greeting has arrived (both ends are of this crate, so
//!   it is the first frame), no open starts while `open_backlog` of this side's streams are
//!   unacknowledged (not accepted by the peer's application), those dropped or closed before
//!   the answer included; an open waits only for that, a stall or a session's end;
//! - nothing waits longer than its bound, and both stream tables are empty at the end;
//! - every inbound stream keeps making progress while its reader reads: in a bulk transfer, a
//!   reader whose peer still writes (or whose data is still on its way) receives something
//!   before the connection has carried [`Model::progress_bound`] bytes of other traffic (a
//!   bound derived from the scheduler's rules, see there), and a
//!   `Stream::close` started meanwhile finishes within the same allowance (traffic is counted
//!   only while no transport is stalled);
//! - the session's memory stays within the documented bound (`Config` docs): after every
//!   operation, for each session, `buffered ≤ live_streams × receive_window + budget` and
//!   `peak_buffered ≤ (streams opened + accepted) × receive_window + budget`, and each stream
//!   holds at most `receive_window + budget`;
//! - polling a pending operation again with the same waker registers nothing new: the test's
//!   thread allocates at most [`REPOLL_SLACK`] bytes over [`REPOLLS`] polls (a counting global
//!   allocator measures it; the runtime, the sessions and the test all run on that thread).

mod common;
mod counting;

use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{gomux_error, pattern};
use counting::{live, start_counting};
use gomux::frame::{HEADER_LEN, INITIAL_WINDOW, MAX_PAYLOAD};
use gomux::{Config, Error, Role, Session, Stream};
use proptest::prelude::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::time::{timeout, Instant, Sleep};

/// Deadline of one operation: once every task waits, time jumps here.
const OP: Duration = Duration::from_millis(5);
/// Deadline of a step that must finish (a close, the final reads): a hang if reached.
const MUST: Duration = Duration::from_secs(120);
/// The receive window of every stream (the default).
const WINDOW: u64 = INITIAL_WINDOW as u64;
/// `Config::default().receive_window_budget`.
const DEFAULT_BUDGET: u64 = 64 * 1024 * 1024;
/// The driver's rules that [`Model::progress_bound`] follows (`session::driver::write`,
/// `session::core::send_queue`): a batch's smallest budget, the smallest piece a cut frame
/// sends, a turn of the round robin, and how often the driver finds a grant of room unclaimed
/// before it voids it.
const MIN_BUDGET: u64 = 4 * 1024;
const MIN_CUT: u64 = 1024;
const QUANTUM: u64 = 32 * 1024;
const GRANT_PATIENCE: u32 = 16;
/// Polls of other tasks after which the runtime polls the `block_on` task, where the model's
/// writers run: fewer than [`GRANT_PATIENCE`] (see [`Model::progress_bound`]).
const EVENT_INTERVAL: u32 = 8;
const _: () = assert!(EVENT_INTERVAL < GRANT_PATIENCE);
/// `Config::default().open_backlog`.
const DEFAULT_OPEN_BACKLOG: usize = 256;
/// How long a `Session::graceful_close` lets the streams finish: longer than any case.
const DRAIN: Duration = Duration::from_secs(3600);
/// Polls of one pending operation in `Op::Repoll`.
const REPOLLS: usize = 256;
/// What those polls may allocate after the first one (a registration that piles up costs at
/// least a waker, 16 bytes, per poll: 4 KiB and more).
const REPOLL_SLACK: i64 = 1024;
/// Polls of one bulk transfer before it counts as spinning: this many, plus one per byte.
const BULK_POLLS: u64 = 1_000_000;
/// Transport calls in one case before it counts as spinning (the transport then fails).
const TRANSPORT_CALLS: u64 = 20_000_000;
/// How long both sessions closing at once while busy may take: the longest stall (2 s), and
/// then time enough to write out what is queued, well under the close timeout (10 s).
const BUSY_CLOSE: Duration = Duration::from_secs(4);

// ---------------------------------------------------------------------------------------------
// A transport that cuts I/O into small pieces, and can stall its writes.

/// A stall of one transport's writes: until when, and the task to wake when it is lifted early.
#[derive(Default)]
struct StallState {
    until: Option<Instant>,
    waker: Option<Waker>,
}

/// The switch of one side's stall, shared by the model and that side's transport.
#[derive(Clone, Default)]
struct Stall(Arc<Mutex<StallState>>);

impl Stall {
    fn lock(&self) -> std::sync::MutexGuard<'_, StallState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stalls writes until `until` (extending a stall under way).
    fn set(&self, until: Instant) {
        let mut state = self.lock();
        state.until = Some(state.until.map_or(until, |u| u.max(until)));
    }

    /// Lifts the stall now.
    fn clear(&self) {
        let waker = {
            let mut state = self.lock();
            state.until = None;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Whether writes are stalled now.
    fn active(&self) -> bool {
        self.lock().until.is_some_and(|u| Instant::now() < u)
    }

    /// Whether writes were stalled at some time after `start`.
    fn active_since(&self, start: Instant) -> bool {
        self.lock().until.is_some_and(|u| start < u)
    }
}

/// The connection's fate: once broken, both transports fail every read and write. The tasks
/// that wait on them are woken then, so that both sessions see it at once.
#[derive(Clone, Default)]
struct Link(Arc<Mutex<LinkState>>);

#[derive(Default)]
struct LinkState {
    broken: bool,
    /// The task waiting on each transport's reading and writing: `[side][read, write]`.
    waiting: [[Option<Waker>; 2]; 2],
}

impl Link {
    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails with a reset once the link is broken; otherwise remembers who would wait.
    fn check(&self, side: usize, way: usize, cx: &Context<'_>) -> io::Result<()> {
        let mut state = self.lock();
        if state.broken {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        let slot = &mut state.waiting[side][way];
        if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *slot = Some(cx.waker().clone());
        }
        Ok(())
    }

    fn break_now(&self) {
        let waiting = {
            let mut state = self.lock();
            state.broken = true;
            std::mem::take(&mut state.waiting)
        };
        for waker in waiting.into_iter().flatten().flatten() {
            waker.wake();
        }
    }
}

/// A pipe end that reads and writes at most a random, small number of bytes per call and now
/// and then answers "not yet" (waking itself), so frames arrive in pieces and wake-ups between
/// the pieces are exercised. While its stall is on, writes wait (woken when the stall ends).
struct Chopped {
    inner: DuplexStream,
    rng: u64,
    max: usize,
    stall: Stall,
    /// Armed while a stall is waited out.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Calls so far in this case, over both transports.
    calls: Arc<AtomicU64>,
    link: Link,
    side: usize,
}

impl Chopped {
    fn new(
        inner: DuplexStream,
        seed: u64,
        max: usize,
        stall: Stall,
        calls: Arc<AtomicU64>,
        (link, side): (Link, usize),
    ) -> Chopped {
        Chopped {
            inner,
            rng: seed | 1,
            max,
            stall,
            sleep: None,
            calls,
            link,
            side,
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Fails once the case has called its transports implausibly often: a spin.
    fn count(&self) -> io::Result<()> {
        if self.calls.fetch_add(1, Ordering::Relaxed) >= TRANSPORT_CALLS {
            return Err(io::Error::other("transport called too often: a spin"));
        }
        Ok(())
    }

    /// How much this call may move; `None` to answer "not yet".
    fn piece(&mut self, cx: &mut Context<'_>) -> Option<usize> {
        let r = self.next();
        if r % 8 == 0 {
            cx.waker().wake_by_ref();
            return None;
        }
        Some(1 + (r >> 8) as usize % self.max)
    }

    /// `Pending` while the stall is on (woken when it ends or is lifted).
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let until = {
            let mut state = self.stall.lock();
            match state.until {
                Some(until) if Instant::now() < until => {
                    state.waker = Some(cx.waker().clone());
                    until
                }
                _ => {
                    state.until = None;
                    return Poll::Ready(());
                }
            }
        };
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        if sleep.deadline() != until {
            sleep.as_mut().reset(until);
        }
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Chopped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.count()?;
        self.link.check(self.side, 0, cx)?;
        let Some(n) = self.piece(cx) else {
            return Poll::Pending;
        };
        let n = n.min(buf.remaining());
        let mut small = ReadBuf::new(buf.initialize_unfilled_to(n));
        let polled = Pin::new(&mut self.inner).poll_read(cx, &mut small);
        let filled = small.filled().len();
        if polled.is_ready() {
            buf.advance(filled);
        }
        polled
    }
}

impl AsyncWrite for Chopped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.count()?;
        self.link.check(self.side, 1, cx)?;
        if self.poll_stall(cx).is_pending() {
            return Poll::Pending;
        }
        let Some(n) = self.piece(cx) else {
            return Poll::Pending;
        };
        let n = n.min(data.len());
        Pin::new(&mut self.inner).poll_write(cx, &data[..n])
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// Operations and the model.

/// What `Op::Repoll` polls again and again.
#[derive(Debug, Clone, Copy)]
enum Pending {
    /// `write` of this many bytes (pending when the queue is full or credit is spent).
    Write(usize),
    /// `read` (pending when nothing is buffered).
    Read,
    /// `flush` (pending after a session close, until the stream's bytes are written).
    Flush,
    /// `Session::open` (pending when the queue is full).
    Open,
    /// `Stream::close` (pending until the stream's bytes are written).
    Close,
}

/// One writer of a bulk transfer.
#[derive(Debug, Clone)]
struct BulkWrite {
    side: usize,
    stream: usize,
    len: usize,
    /// Close the stream (`Stream::close`) once everything is written.
    close: bool,
}

/// One step of a case. `side` 0 is the client, 1 the server; `stream` picks among the streams
/// opened so far (modulo their number).
#[derive(Debug, Clone)]
enum Op {
    Open {
        side: usize,
    },
    Accept {
        side: usize,
    },
    Write {
        side: usize,
        stream: usize,
        len: usize,
    },
    Read {
        side: usize,
        stream: usize,
        len: usize,
    },
    Shutdown {
        side: usize,
        stream: usize,
    },
    CloseRead {
        side: usize,
        stream: usize,
    },
    Close {
        side: usize,
        stream: usize,
    },
    Drop {
        side: usize,
        stream: usize,
    },
    SessionClose {
        side: usize,
    },
    /// `Session::graceful_close` on `side`, in a task of its own: the streams open go on, new
    /// ones are refused, and the session closes once they are done (at the latest in the final
    /// steps, which finish every stream).
    GracefulClose {
        side: usize,
    },
    /// The connection breaks: both transports fail every later read and write (a peer whose
    /// driver or transport end is dropped, as far as the other end can tell).
    Break,
    /// Stall `side`'s transport writes for `ms` milliseconds of virtual time.
    Stall {
        side: usize,
        ms: u64,
    },
    /// Lift `side`'s stall.
    Unstall {
        side: usize,
    },
    /// Both sides write at once while every end involved reads.
    Bulk {
        writers: Vec<BulkWrite>,
    },
    Repoll {
        side: usize,
        stream: usize,
        what: Pending,
    },
    /// Each writer queues its bytes (as far as the queue and the credit let it without the
    /// peer's application reading), then both sides call `Session::close` in the same step.
    BusyClose {
        writers: Vec<BulkWrite>,
    },
}

/// Bulk writers, as many as `writers` says: the first on side 0, the second on side 1, the
/// others on either, each of `len` bytes, some (`close` of them) closing their stream once done.
fn bulk(
    streams: usize,
    writers: std::ops::RangeInclusive<usize>,
    len: impl Strategy<Value = usize>,
    close: f64,
) -> impl Strategy<Value = Op> {
    let writer = (0..2usize, 0..streams, len, proptest::bool::weighted(close)).prop_map(
        |(side, stream, len, close)| BulkWrite {
            side,
            stream,
            len,
            close,
        },
    );
    proptest::collection::vec(writer, writers).prop_map(|mut writers| {
        writers[0].side = 0;
        writers[1].side = 1;
        Op::Bulk { writers }
    })
}

fn stall() -> impl Strategy<Value = Op> {
    (0..2usize, prop_oneof![1..20u64, 20..500u64, 500..=2000u64])
        .prop_map(|(side, ms)| Op::Stall { side, ms })
}

fn op(max_write: usize, max_bulk: usize) -> impl Strategy<Value = Op> {
    let side = 0..2usize;
    let stream = 0..8usize;
    let pending = prop_oneof![
        (1..=100_000usize).prop_map(Pending::Write),
        Just(Pending::Read),
        Just(Pending::Flush),
        Just(Pending::Open),
        Just(Pending::Close),
    ];
    prop_oneof![
        3 => side.clone().prop_map(|side| Op::Open { side }),
        3 => side.clone().prop_map(|side| Op::Accept { side }),
        8 => (side.clone(), stream.clone(), 0..=max_write)
            .prop_map(|(side, stream, len)| Op::Write { side, stream, len }),
        8 => (side.clone(), stream.clone(), 1..=max_write.max(1))
            .prop_map(|(side, stream, len)| Op::Read { side, stream, len }),
        1 => (side.clone(), stream.clone()).prop_map(|(side, stream)| Op::Shutdown { side, stream }),
        1 => (side.clone(), stream.clone()).prop_map(|(side, stream)| Op::CloseRead { side, stream }),
        1 => (side.clone(), stream.clone()).prop_map(|(side, stream)| Op::Close { side, stream }),
        1 => (side.clone(), stream.clone()).prop_map(|(side, stream)| Op::Drop { side, stream }),
        2 => stall(),
        1 => side.clone().prop_map(|side| Op::Unstall { side }),
        1 => bulk(8, 2..=4, 0..=max_bulk, 0.2),
        1 => (side, stream, pending).prop_map(|(side, stream, what)| Op::Repoll { side, stream, what }),
    ]
}

/// A case: a few opens to start with, random operations, and in one case out of four an end
/// of the session somewhere among them (more often, and most cases would test only closing):
/// `Session::close` (half of them), `Session::graceful_close`, or a broken connection.
fn ops(max_write: usize, max_bulk: usize) -> impl Strategy<Value = Vec<Op>> {
    (
        proptest::collection::vec((0..2usize).prop_map(|side| Op::Open { side }), 1..4),
        proptest::collection::vec(op(max_write, max_bulk), 5..80),
        proptest::option::weighted(0.25, (0..4usize, 0..2usize, any::<prop::sample::Index>())),
    )
        .prop_map(|(mut opens, mut rest, close)| {
            if let Some((how, side, at)) = close {
                let at = at.index(rest.len() + 1);
                let end = match how {
                    0 | 1 => Op::SessionClose { side },
                    2 => Op::GracefulClose { side },
                    _ => Op::Break,
                };
                rest.insert(at, end);
            }
            opens.append(&mut rest);
            opens
        })
}

/// A bulk case: two to five streams opened by either side and accepted, then bulk transfers of
/// up to 3 MiB per writer (several writers on one side keep its queue full), with stalls
/// between them.
fn bulk_ops() -> impl Strategy<Value = Vec<Op>> {
    let len = prop_oneof![
        1 => 0..64 * 1024usize,
        3 => 256 * 1024..=3 * 1024 * 1024usize,
    ];
    (
        proptest::collection::vec(0..2usize, 2..=5),
        proptest::collection::vec(
            prop_oneof![
                4 => bulk(5, 3..=6, len, 0.3),
                1 => stall(),
                1 => (0..2usize).prop_map(|side| Op::Unstall { side }),
            ],
            1..=4,
        ),
    )
        .prop_map(|(opens, mut rest)| {
            let mut ops: Vec<Op> = opens.iter().map(|&side| Op::Open { side }).collect();
            ops.extend(opens.iter().map(|&side| Op::Accept { side: 1 - side }));
            ops.append(&mut rest);
            ops
        })
}

/// A case that ends with both sides closing while busy: a few streams opened by either side
/// and accepted, a few mixed operations, then [`Op::BusyClose`] with writers on both sides
/// (the first two on one stream, one per direction).
fn busy_close_ops() -> impl Strategy<Value = Vec<Op>> {
    (
        proptest::collection::vec(0..2usize, 1..=4),
        proptest::collection::vec(op(2000, 16 * 1024), 0..12),
        bulk(4, 2..=6, 1..=96 * 1024usize, 0.0),
        0..4usize,
    )
        .prop_map(|(opens, mut rest, busy, stream)| {
            let mut ops: Vec<Op> = opens.iter().map(|&side| Op::Open { side }).collect();
            ops.extend(opens.iter().map(|&side| Op::Accept { side: 1 - side }));
            ops.append(&mut rest);
            if let Op::Bulk { mut writers } = busy {
                writers[0].stream = stream;
                writers[1].stream = stream;
                ops.push(Op::BusyClose { writers });
            }
            ops
        })
}

/// The configuration of a case: both sessions get the same.
#[derive(Debug, Clone, Copy)]
struct Setup {
    write_buffer_size: usize,
    budget: u64,
    open_backlog: usize,
}

impl Setup {
    fn config(&self) -> Config {
        Config::default()
            .write_buffer_size(self.write_buffer_size)
            .receive_window_budget(self.budget)
            .open_backlog(self.open_backlog)
    }
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            2 => 1..=64usize,
            1 => Just(4096usize),
            1 => Just(1024 * 1024usize),
        ],
        prop_oneof![Just(0u64), Just(256 * 1024), Just(DEFAULT_BUDGET)],
        prop_oneof![1 => 1..=4usize, 2 => Just(DEFAULT_OPEN_BACKLOG)],
    )
        .prop_map(|(write_buffer_size, budget, open_backlog)| Setup {
            write_buffer_size,
            budget,
            open_backlog,
        })
}

/// The configurations of bulk cases: mostly small queues and budgets, with which the progress
/// bound is tight enough to matter.
fn bulk_setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            3 => 1..=64usize,
            1 => Just(4096usize),
            1 => Just(1024 * 1024usize),
        ],
        prop_oneof![Just(0u64), Just(256 * 1024)],
    )
        .prop_map(|(write_buffer_size, budget)| Setup {
            write_buffer_size,
            budget,
            open_backlog: DEFAULT_OPEN_BACKLOG,
        })
}

/// One end of one stream as the model sees it.
#[derive(Default)]
struct End {
    /// The handle, once accepted (the opener has it at once) and until dropped.
    handle: Option<Stream>,
    accepted: bool,
    /// This end shut down, closed or dropped its writing.
    write_closed: bool,
    /// This end closed its reading (close_read, close, drop): what arrives is discarded.
    read_closed: bool,
    /// Everything writes on this end reported as written, in order.
    sent: Vec<u8>,
    /// Everything reads on this end returned, in order.
    received: Vec<u8>,
    eof: bool,
}

/// What the model knows of one side's open backlog.
#[derive(Clone, Copy)]
struct Backlog {
    /// Streams of that side the peer's application has not accepted.
    unacknowledged: usize,
    /// The peer's greeting has arrived.
    greeted: bool,
}

/// A stream: its id and its two ends, indexed by side.
struct Pair {
    id: u32,
    /// The side that opened it.
    opener: usize,
    ends: [End; 2],
}

struct Model {
    sessions: [Session; 2],
    /// Which sides closed their session (or began to), or lost it to a broken connection.
    session_closed: [bool; 2],
    /// Which sides' sessions were cut: `Session::close`, or the connection broke. (A graceful
    /// close lets the streams open finish, and the final steps finish them.)
    session_cut: [bool; 2],
    /// The `Session::graceful_close` tasks under way.
    draining: Vec<tokio::task::JoinHandle<Result<(), Error>>>,
    link: Link,
    pairs: Vec<Pair>,
    /// Source of write content, so every write differs.
    writes: u64,
    setup: Setup,
    /// Bytes of buffer in each direction of the pipe.
    pipe: usize,
    /// Each side's transport stall.
    stalls: [Stall; 2],
    /// Transport calls so far.
    calls: Arc<AtomicU64>,
}

/// A `Stream::close` under way: the future owns the handle and gives it back.
type Closing = Pin<Box<dyn Future<Output = (Stream, Result<(), Error>)>>>;

/// One end taking part in a bulk transfer.
struct Part {
    pair: usize,
    side: usize,
    /// What this end writes, and how much of it is written.
    content: Vec<u8>,
    written: usize,
    writing: bool,
    close_when_done: bool,
    /// `Stream::close` under way; the future owns the handle until it finishes.
    closing: Option<Closing>,
    close_done: bool,
    /// Traffic when the close started.
    close_mark: u64,
    reading: bool,
    /// Traffic when this end last received something (or had nothing to wait for).
    mark: u64,
}

/// Traffic counted by a bulk transfer: bytes the sessions received, only while no transport
/// is stalled.
struct Traffic {
    last: u64,
    counted: u64,
    polls: u64,
    /// Polls allowed.
    max_polls: u64,
}

/// Why a write may fail, from what the model knows.
fn write_error_justified(
    error: &io::Error,
    write_closed: bool,
    peer: &End,
    session_closed: bool,
) -> Result<(), TestCaseError> {
    let error = gomux_error(error).cloned();
    let justified = match error {
        Some(Error::WriteClosed) => write_closed,
        Some(Error::PeerReadClosed) => peer.read_closed,
        Some(Error::Refused) => refusal_true(peer, session_closed)?,
        Some(ref e) if e.is_session_end() => session_closed,
        _ => false,
    };
    prop_assert!(justified, "write failed without a reason: {:?}", error);
    Ok(())
}

/// The fate property: a stream reported refused was never accepted by the peer's application
/// (and only a session that ended, in this model, refuses one: no accept backlog fills here).
fn refusal_true(peer: &End, session_closed: bool) -> Result<bool, TestCaseError> {
    prop_assert!(
        !peer.accepted,
        "a stream the peer's application accepted was reported refused"
    );
    Ok(session_closed)
}

/// Polls `future` [`REPOLLS`] times with the same (no-op) waker, or until it finishes; returns
/// its output if it finished, and what the thread allocated after the first poll.
fn repoll<F: Future>(future: Pin<&mut F>) -> (Option<F::Output>, i64) {
    let mut future = future;
    let mut cx = Context::from_waker(Waker::noop());
    if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
        return (Some(output), 0);
    }
    start_counting();
    for _ in 1..REPOLLS {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return (Some(output), 0);
        }
    }
    (None, live() as i64)
}

impl Model {
    fn pair_index(&self, index: usize) -> Option<usize> {
        let len = self.pairs.len();
        (len != 0).then_some(index % len)
    }

    fn pair(&mut self, index: usize) -> Option<&mut Pair> {
        let index = self.pair_index(index)?;
        self.pairs.get_mut(index)
    }

    fn any_session_closed(&self) -> bool {
        self.session_closed.iter().any(|&c| c)
    }

    fn stalled(&self) -> bool {
        self.stalls.iter().any(Stall::active)
    }

    fn budget(&self) -> u64 {
        self.setup.budget
    }

    /// Bytes both sessions received so far.
    fn traffic(&self) -> u64 {
        self.sessions.iter().map(|s| s.stats().bytes_received).sum()
    }

    /// How much traffic (both directions together, counted while no transport is stalled) may
    /// pass while a reader of a bulk transfer waits for data its peer writes, or a
    /// `Stream::close` waits for its bytes to be written; `writers` counts the writers of the
    /// transfer on each side. The bound follows the session's rules, term by term, for a reader
    /// on side `r` of a stream written on side `w`:
    ///
    /// - **The credit leg** (when the writer has spent its credit): the reader's side owes the
    ///   credit once the reader has read (which it does at once), and writes it in its control
    ///   queue, which goes out ahead of the data at the next batch or the next recorded frame
    ///   boundary of the batch in hand. Ahead of it on `r`'s output: what a writer's direct
    ///   write left for the driver, which goes out before anything else and is at most one
    ///   frame, `F = max_payload + 8`, outside `write_buffer_size`; at most one batch, `B`; the
    ///   other control frames, `C`; and what the pipe holds, `P`. A batch is taken up to
    ///   the driver's budget, at most `max(write_buffer_size, 4 KiB)`, and more only to send
    ///   the first piece of a turn, cut to at least 1 KiB: `B = max(write_buffer_size, 4 KiB) +
    ///   1 KiB + 16`. Control frames are 8 bytes: a credit per stream and its closes, `C = 32 ×
    ///   live streams`.
    /// - **The data leg**, on `w`'s output: a direct write's rest (`F`) and the batch in hand
    ///   (`B`); what the send queues held, or had reserved for writers let in, when the writer
    ///   came to wait for room: at most `write_buffer_size + F`, since a writer is let in only
    ///   while less than `write_buffer_size` is queued or reserved and queues one frame (a
    ///   closing stream's own last frame is part of this); the writers ahead of it in the line
    ///   for room, let in first (oldest first), at most one grant each, of at most
    ///   `max(write_buffer_size, F)`: its share of the room, or one frame when that is more;
    ///   once its frame is queued, at most one turn of every other queue in the round robin
    ///   before its own, `QUANTUM + 8` bytes each (a Data frame larger than what is left of a
    ///   turn is cut to fit); then `C` and `P`. The writers on `w` other than this one are at
    ///   most `writers[w] − 1`.
    /// - **The other direction** carries about as much meanwhile: both transports are the same
    ///   chopped pipe, polled in turn by one runtime, so each leg's allowance counts twice.
    ///
    /// A `Stream::close` waits for its own queued frames: at most the data leg. Nothing here
    /// depends on the window or the budget: a frame is at most `max_payload` whatever the
    /// credit, and the writers' credit is what the credit leg returns.
    ///
    /// The line is served oldest first only while every grant of room is claimed or given
    /// back. A writer whose stream can no longer be written (its peer stopped reading, or it
    /// closed) gives its grant back at once. A grant of a writer that is slow to run is voided
    /// when the driver finds it unclaimed [`GRANT_PATIENCE`] times in a row with no data taken
    /// (the writers let in with that room then go first, and the slow one waits again at the
    /// front of the line). The writers run in the runtime's `block_on` task, which the runtime
    /// polls after at most [`EVENT_INTERVAL`] polls of other tasks, fewer than that: every
    /// grant is claimed, as the data leg counts.
    fn progress_bound(&self, writers: [usize; 2]) -> u64 {
        let live: u64 = self
            .sessions
            .iter()
            .map(|s| s.stats().live_streams as u64)
            .sum();
        let wbs = self.setup.write_buffer_size as u64;
        let frame = (MAX_PAYLOAD + HEADER_LEN) as u64;
        let batch = wbs.max(MIN_BUDGET) + MIN_CUT + 2 * HEADER_LEN as u64;
        let control = 32 * live;
        let pipe = self.pipe as u64;
        // What a direct write left over: one frame, written before anything else.
        let direct_rest = frame;
        let credit_leg = direct_rest + batch + control + pipe;
        let ahead = writers.iter().max().map_or(0, |&k| k.saturating_sub(1)) as u64;
        let data_leg = direct_rest
            + batch
            + (wbs + frame)
            + ahead * wbs.max(frame)
            + ahead * (QUANTUM + HEADER_LEN as u64)
            + control
            + pipe;
        2 * (credit_leg + data_leg)
    }

    /// The memory bound of the `Config` docs, on each session and on each stream.
    fn check_memory(&self, after: &str) -> Result<(), TestCaseError> {
        let budget = self.budget();
        for session in &self.sessions {
            let stats = session.stats();
            let now_bound = stats.live_streams as u64 * WINDOW + budget;
            prop_assert!(
                stats.buffered <= now_bound,
                "{:?} buffers {} bytes in {} streams, over the bound {} ({})",
                session.role(),
                stats.buffered,
                stats.live_streams,
                now_bound,
                after
            );
            let streams = stats.streams_opened + stats.streams_accepted;
            let peak_bound = streams * WINDOW + budget;
            prop_assert!(
                stats.peak_buffered <= peak_bound,
                "{:?} buffered {} bytes at its peak with {} streams ever, over the bound {} ({})",
                session.role(),
                stats.peak_buffered,
                streams,
                peak_bound,
                after
            );
        }
        for pair in &self.pairs {
            for end in &pair.ends {
                if let Some(handle) = &end.handle {
                    let buffered = handle.buffered() as u64;
                    prop_assert!(
                        buffered <= WINDOW + budget,
                        "stream {} buffers {} bytes, over its window and the budget ({})",
                        pair.id,
                        buffered,
                        after
                    );
                }
            }
        }
        prop_assert!(
            self.calls.load(Ordering::Relaxed) < TRANSPORT_CALLS,
            "the transports were called {} times: a spin ({})",
            TRANSPORT_CALLS,
            after
        );
        Ok(())
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Open { side } => {
                let start = Instant::now();
                let backlog = self.backlog(side);
                if let Ok(Ok(stream)) = timeout(OP, self.sessions[side].open()).await {
                    self.check_backlog(side, backlog)?;
                    self.opened(side, stream);
                } else {
                    // An open waits for room in the queue while the transport is stalled, and
                    // while the backlog is full (an acknowledgement is on its way while the
                    // peer's transport is stalled).
                    prop_assert!(
                        self.any_session_closed()
                            || self.stalls.iter().any(|s| s.active_since(start))
                            || backlog.unacknowledged >= self.setup.open_backlog,
                        "open failed in a live session"
                    );
                }
            }
            Op::Accept { side } => self.accept(side).await?,
            Op::Write { side, stream, len } => {
                self.writes += 1;
                let content = pattern(self.writes, len);
                let closed = self.any_session_closed();
                let Some(pair) = self.pair(stream) else {
                    return Ok(());
                };
                let (end, peer) = split_ends(pair, side);
                let Some(handle) = end.handle.as_mut() else {
                    return Ok(());
                };
                match timeout(OP, handle.write(&content)).await {
                    Err(_) => {}
                    Ok(Ok(n)) => {
                        prop_assert!(!end.write_closed, "write after this end closed writing");
                        prop_assert!(n <= len);
                        end.sent.extend_from_slice(&content[..n]);
                    }
                    Ok(Err(error)) => {
                        write_error_justified(&error, end.write_closed, peer, closed)?;
                    }
                }
            }
            Op::Read { side, stream, len } => {
                let Some(pair) = self.pair(stream) else {
                    return Ok(());
                };
                let (mine, theirs) = split_ends(pair, side);
                // Out of the model while it is used, so the model can be updated meanwhile.
                let Some(mut handle) = mine.handle.take() else {
                    return Ok(());
                };
                let mut buf = vec![0u8; len];
                let read = timeout(OP, handle.read(&mut buf)).await;
                mine.handle = Some(handle);
                if let Ok(result) = read {
                    record_read(mine, theirs, result.map(|n| &buf[..n]))?;
                }
            }
            Op::Shutdown { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if let Some(handle) = end.handle.as_mut() {
                        end.write_closed = true;
                        let _ = timeout(MUST, handle.shutdown()).await;
                    }
                }
            }
            Op::CloseRead { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if let Some(handle) = end.handle.as_mut() {
                        end.read_closed = true;
                        handle.close_read();
                    }
                }
            }
            Op::Close { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if let Some(handle) = end.handle.as_mut() {
                        end.read_closed = true;
                        end.write_closed = true;
                        let closed = timeout(MUST, handle.close()).await;
                        prop_assert!(closed.is_ok(), "Stream::close hung");
                    }
                }
            }
            Op::Drop { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if end.handle.take().is_some() {
                        end.read_closed = true;
                        end.write_closed = true;
                    }
                }
            }
            Op::SessionClose { side } => {
                self.session_closed[side] = true;
                self.session_cut[side] = true;
                let closed = timeout(MUST, self.sessions[side].close()).await;
                prop_assert!(closed.is_ok(), "Session::close hung");
            }
            Op::GracefulClose { side } => {
                self.session_closed[side] = true;
                let session = self.sessions[side].clone();
                self.draining.push(tokio::spawn(
                    async move { session.graceful_close(DRAIN).await },
                ));
                // Let it start before the next operation.
                tokio::task::yield_now().await;
            }
            Op::Break => {
                self.session_closed = [true; 2];
                self.session_cut = [true; 2];
                self.link.break_now();
            }
            Op::Stall { side, ms } => {
                self.stalls[side].set(Instant::now() + Duration::from_millis(ms));
            }
            Op::Unstall { side } => self.stalls[side].clear(),
            Op::Bulk { ref writers } => self.bulk(writers).await?,
            Op::BusyClose { ref writers } => self.busy_close(writers).await?,
            Op::Repoll { side, stream, what } => self.repoll(side, stream, what)?,
        }
        Ok(())
    }

    /// Both sides queue data, then close their sessions in the same step; see [`Op::BusyClose`].
    async fn busy_close(&mut self, writers: &[BulkWrite]) -> Result<(), TestCaseError> {
        let closed_before = self.any_session_closed();
        for writer in writers {
            self.writes += 1;
            let content = pattern(self.writes, writer.len);
            let Some(pair) = self.pair(writer.stream) else {
                break;
            };
            let (end, peer) = split_ends(pair, writer.side);
            let Some(handle) = end.handle.as_mut() else {
                continue;
            };
            // As much as goes into the queue and the credit without the peer reading: writes
            // are cancel safe, so one cut short by its deadline queued what it reported.
            let mut written = 0;
            while written < content.len() {
                match timeout(OP, handle.write(&content[written..])).await {
                    Err(_) => break,
                    Ok(Ok(n)) => {
                        prop_assert!(!end.write_closed, "write after this end closed writing");
                        prop_assert!(n > 0, "a write of {} bytes wrote nothing", content.len());
                        end.sent.extend_from_slice(&content[written..written + n]);
                        written += n;
                    }
                    Ok(Err(error)) => {
                        write_error_justified(&error, end.write_closed, peer, closed_before)?;
                        break;
                    }
                }
            }
        }
        self.session_closed = [true, true];
        let started = Instant::now();
        let [client, server] = &self.sessions;
        let (client_closed, server_closed) = tokio::join!(
            timeout(BUSY_CLOSE, client.close()),
            timeout(BUSY_CLOSE, server.close())
        );
        for (side, closed) in [("client", client_closed), ("server", server_closed)] {
            match closed {
                Ok(Ok(())) => {}
                // A session closed earlier in the case reports how that close went.
                Ok(Err(_)) if closed_before => {}
                Ok(Err(error)) => {
                    return Err(TestCaseError::fail(format!(
                        "both sides closing at once while busy: the {side}'s Session::close \
                         failed after {:?}: {error:?}; {}",
                        started.elapsed(),
                        describe_sessions(&self.sessions)
                    )))
                }
                Err(_) => {
                    return Err(TestCaseError::fail(format!(
                        "both sides closing at once while busy: the {side}'s Session::close did \
                         not return within {BUSY_CLOSE:?}; {}",
                        describe_sessions(&self.sessions)
                    )))
                }
            }
        }
        Ok(())
    }

    /// The open backlog of `side` as the model sees it, as an open starts.
    fn backlog(&self, side: usize) -> Backlog {
        let unacknowledged = self
            .pairs
            .iter()
            .filter(|p| p.opener == side && !p.ends[1 - side].accepted)
            .count();
        Backlog {
            unacknowledged,
            // Both ends are of this crate: the peer's first frame is its greeting.
            greeted: self.sessions[side].stats().frames_received > 0,
        }
    }

    /// The backlog property: once the peer's greeting has arrived, no open of `side` starts
    /// while `open_backlog` of its streams are unacknowledged, those it dropped or closed
    /// included. A stream is acknowledged once the peer's application accepted it (the model
    /// knows that before the acknowledgement arrives, so it counts no more than the session
    /// does); a refusal comes only from a session that ends, after which nothing is checked.
    fn check_backlog(&self, side: usize, before: Backlog) -> Result<(), TestCaseError> {
        if before.greeted && !self.any_session_closed() {
            prop_assert!(
                before.unacknowledged < self.setup.open_backlog,
                "an open of side {} went ahead with {} of its streams unacknowledged by a \
                 greeted peer (open_backlog {})",
                side,
                before.unacknowledged,
                self.setup.open_backlog
            );
        }
        Ok(())
    }

    fn opened(&mut self, side: usize, stream: Stream) {
        let mut ends = [End::default(), End::default()];
        ends[side].accepted = true;
        let id = stream.id();
        ends[side].handle = Some(stream);
        self.pairs.push(Pair {
            id,
            opener: side,
            ends,
        });
    }

    /// Accepts one stream on `side` if one is waiting, and matches it to its opener.
    async fn accept(&mut self, side: usize) -> Result<(), TestCaseError> {
        let Ok(Ok(stream)) = timeout(OP, self.sessions[side].accept()).await else {
            return Ok(());
        };
        let id = stream.id();
        let pair = self
            .pairs
            .iter_mut()
            .find(|p| p.id == id && !p.ends[side].accepted);
        let Some(pair) = pair else {
            return Err(TestCaseError::fail(format!(
                "accepted stream {id}, which the peer did not open"
            )));
        };
        // Streams are accepted in the order they were opened.
        pair.ends[side].accepted = true;
        pair.ends[side].handle = Some(stream);
        Ok(())
    }

    /// Polls one pending operation again and again with the same waker; it must not register
    /// anything new each time.
    fn repoll(&mut self, side: usize, stream: usize, what: Pending) -> Result<(), TestCaseError> {
        let closed = self.any_session_closed();
        if let Pending::Open = what {
            let session = self.sessions[side].clone();
            let backlog = self.backlog(side);
            let (output, grew) = repoll(pin!(session.open()));
            check_repoll(grew, "Session::open")?;
            if let Some(Ok(stream)) = output {
                self.check_backlog(side, backlog)?;
                self.opened(side, stream);
            }
            return Ok(());
        }
        self.writes += 1;
        let writes = self.writes;
        let Some(pair) = self.pair(stream) else {
            return Ok(());
        };
        let (mine, theirs) = split_ends(pair, side);
        let Some(mut handle) = mine.handle.take() else {
            return Ok(());
        };
        let result = match what {
            Pending::Write(len) => {
                let content = pattern(writes, len);
                let (output, grew) = repoll(pin!(handle.write(&content)));
                match output {
                    Some(Ok(n)) => {
                        prop_assert!(!mine.write_closed, "write after this end closed writing");
                        mine.sent.extend_from_slice(&content[..n]);
                    }
                    Some(Err(error)) => {
                        write_error_justified(&error, mine.write_closed, theirs, closed)?
                    }
                    None => {}
                }
                check_repoll(grew, "write")
            }
            Pending::Read => {
                let mut buf = vec![0u8; 4096];
                let (output, grew) = repoll(pin!(handle.read(&mut buf)));
                if let Some(result) = output {
                    record_read(mine, theirs, result.map(|n| &buf[..n]))?;
                }
                check_repoll(grew, "read")
            }
            Pending::Flush => {
                let (_, grew) = repoll(pin!(handle.flush()));
                check_repoll(grew, "flush")
            }
            Pending::Close => {
                mine.read_closed = true;
                mine.write_closed = true;
                let (_, grew) = repoll(pin!(handle.close()));
                check_repoll(grew, "Stream::close")
            }
            Pending::Open => unreachable!(),
        };
        mine.handle = Some(handle);
        result
    }

    /// Both sides write bulk data at once, while every end involved reads; see [`Op::Bulk`].
    async fn bulk(&mut self, writers: &[BulkWrite]) -> Result<(), TestCaseError> {
        let mut parts: Vec<Part> = Vec::new();
        for writer in writers {
            let side = writer.side;
            let Some(index) = self.pair_index(writer.stream) else {
                return Ok(());
            };
            // The peer end must be there to read (or have stopped reading, so writes fail).
            for _ in 0..self.pairs.len() {
                let peer = &self.pairs[index].ends[1 - side];
                if peer.accepted || peer.read_closed {
                    break;
                }
                let before = self
                    .pairs
                    .iter()
                    .filter(|p| p.ends[1 - side].accepted)
                    .count();
                self.accept(1 - side).await?;
                if before
                    == self
                        .pairs
                        .iter()
                        .filter(|p| p.ends[1 - side].accepted)
                        .count()
                {
                    break;
                }
            }
            let peer = &self.pairs[index].ends[1 - side];
            if self.pairs[index].ends[side].handle.is_none()
                || !(peer.handle.is_some() || peer.read_closed)
            {
                continue;
            }
            self.writes += 1;
            let content = pattern(self.writes, writer.len);
            match parts.iter_mut().find(|p| p.pair == index && p.side == side) {
                Some(part) => {
                    part.content.extend_from_slice(&content);
                    part.close_when_done |= writer.close;
                }
                None => parts.push(Part {
                    pair: index,
                    side,
                    content,
                    written: 0,
                    writing: true,
                    close_when_done: writer.close,
                    closing: None,
                    close_done: false,
                    close_mark: 0,
                    reading: false,
                    mark: 0,
                }),
            }
        }
        if parts.is_empty() {
            return Ok(());
        }
        // Every end of the streams involved reads.
        let pairs: Vec<usize> = parts.iter().map(|p| p.pair).collect();
        for pair in pairs {
            for side in 0..2 {
                if !parts.iter().any(|p| p.pair == pair && p.side == side) {
                    parts.push(Part {
                        pair,
                        side,
                        content: Vec::new(),
                        written: 0,
                        writing: false,
                        close_when_done: false,
                        closing: None,
                        close_done: false,
                        close_mark: 0,
                        reading: false,
                        mark: 0,
                    });
                }
            }
        }
        for part in &mut parts {
            let end = &self.pairs[part.pair].ends[part.side];
            part.reading = end.handle.is_some() && !end.read_closed;
        }
        let mut writers = [0; 2];
        for part in parts.iter().filter(|p| p.writing) {
            writers[part.side] += 1;
        }
        let bound = self.progress_bound(writers);
        let bytes: usize = parts.iter().map(|p| p.content.len()).sum();
        let mut traffic = Traffic {
            last: self.traffic(),
            counted: 0,
            polls: 0,
            max_polls: BULK_POLLS + bytes as u64,
        };
        let mut buf = vec![0u8; 32 * 1024];
        let done = timeout(
            MUST,
            poll_fn(|cx| self.poll_bulk(cx, &mut parts, &mut traffic, &mut buf, bound)),
        )
        .await;
        // Handles still inside close futures go back to the model (dropped if unfinished).
        match done {
            Ok(result) => result,
            Err(_) => Err(TestCaseError::fail(format!(
                "a bulk transfer hung: {}",
                describe(&parts, &self.pairs)
            ))),
        }
    }

    /// One round of a bulk transfer: every writer writes, every closer closes, every reader
    /// reads, as far as each can without waiting; then the progress checks.
    fn poll_bulk(
        &mut self,
        cx: &mut Context<'_>,
        parts: &mut [Part],
        traffic: &mut Traffic,
        buf: &mut [u8],
        bound: u64,
    ) -> Poll<Result<(), TestCaseError>> {
        let result = (|| -> Result<bool, TestCaseError> {
            traffic.polls += 1;
            prop_assert!(
                traffic.polls < traffic.max_polls,
                "a bulk transfer was polled {} times: it spins ({})",
                traffic.max_polls,
                describe(parts, &self.pairs)
            );
            let closed = self.any_session_closed();
            let now = self.traffic();
            if !self.stalled() {
                traffic.counted += now - traffic.last;
            }
            traffic.last = now;
            let counted = traffic.counted;
            let mut progressed = vec![false; parts.len()];
            // Each round starts with the next end (as `tokio::join!` does), so that no stream
            // is always first to find room in the queue.
            let start = traffic.polls as usize;
            for k in 0..parts.len() {
                let i = (start + k) % parts.len();
                let part = &mut parts[i];
                let pair = &mut self.pairs[part.pair];
                let (mine, peer) = split_ends(pair, part.side);
                // Writing, a few frames per round so the others get their turn.
                let mut rounds = 0;
                while part.writing && rounds < 8 {
                    rounds += 1;
                    let Some(handle) = mine.handle.as_mut() else {
                        part.writing = false;
                        break;
                    };
                    let data = &part.content[part.written..];
                    if data.is_empty() {
                        part.writing = false;
                        break;
                    }
                    match Pin::new(handle).poll_write(cx, data) {
                        Poll::Pending => break,
                        Poll::Ready(Ok(n)) => {
                            prop_assert!(!mine.write_closed, "write after this end closed writing");
                            prop_assert!(n > 0 && n <= data.len(), "write reported {} bytes", n);
                            mine.sent.extend_from_slice(&data[..n]);
                            part.written += n;
                        }
                        Poll::Ready(Err(error)) => {
                            write_error_justified(&error, mine.write_closed, peer, closed)?;
                            part.writing = false;
                        }
                    }
                }
                if rounds == 8 && part.writing {
                    cx.waker().wake_by_ref();
                }
                // Closing, once written.
                if !part.writing && part.close_when_done && !part.close_done {
                    if part.closing.is_none() {
                        match mine.handle.take() {
                            Some(mut handle) => {
                                mine.read_closed = true;
                                mine.write_closed = true;
                                part.reading = false;
                                part.close_mark = counted;
                                part.closing = Some(Box::pin(async move {
                                    let closed = handle.close().await;
                                    (handle, closed)
                                }));
                            }
                            None => part.close_done = true,
                        }
                    }
                    if let Some(closing) = part.closing.as_mut() {
                        if let Poll::Ready((handle, closed)) = closing.as_mut().poll(cx) {
                            prop_assert!(
                                closed.is_ok() || self.session_closed.iter().any(|&c| c),
                                "Stream::close failed in a live session: {:?}",
                                closed
                            );
                            mine.handle = Some(handle);
                            part.closing = None;
                            part.close_done = true;
                        } else {
                            prop_assert!(
                                counted - part.close_mark <= bound,
                                "Stream::close of stream {} on side {} made no progress while \
                                 the connection carried {} bytes (bound {}): {}; {}",
                                pair_id(&self.pairs, part.pair),
                                part.side,
                                counted - part.close_mark,
                                bound,
                                describe_one(part),
                                describe_sessions(&self.sessions)
                            );
                        }
                    }
                }
                // Reading.
                let mut rounds = 0;
                while part.reading && rounds < 8 {
                    rounds += 1;
                    let pair = &mut self.pairs[part.pair];
                    let (mine, theirs) = split_ends(pair, part.side);
                    let Some(handle) = mine.handle.as_mut() else {
                        part.reading = false;
                        break;
                    };
                    let mut read_buf = ReadBuf::new(buf);
                    match Pin::new(handle).poll_read(cx, &mut read_buf) {
                        Poll::Pending => break,
                        Poll::Ready(Ok(())) => {
                            let data = read_buf.filled();
                            record_read(mine, theirs, Ok(data))?;
                            if data.is_empty() {
                                part.reading = false;
                            } else {
                                progressed[i] = true;
                            }
                        }
                        Poll::Ready(Err(_)) => part.reading = false,
                    }
                }
                if rounds == 8 && part.reading {
                    cx.waker().wake_by_ref();
                }
            }
            // Done, or every waiting reader still within its allowance?
            let mut all_done = true;
            for i in 0..parts.len() {
                let part = &parts[i];
                let peer_writing = parts
                    .iter()
                    .any(|p| p.pair == part.pair && p.side != part.side && p.writing);
                let pair = &self.pairs[part.pair];
                let (mine, theirs) = (&pair.ends[part.side], &pair.ends[1 - part.side]);
                let caught_up = mine.received.len() == theirs.sent.len();
                let waiting = part.reading && (peer_writing || !caught_up);
                if part.writing || waiting || part.close_when_done && !part.close_done {
                    all_done = false;
                }
                if !waiting || progressed[i] {
                    parts[i].mark = counted;
                } else {
                    prop_assert!(
                        counted - part.mark <= bound,
                        "stream {} starved on side {}: its reader reads, yet received nothing \
                         while the connection carried {} bytes (bound {}); it has {} of {} bytes, \
                         the peer {}: {}; {}",
                        pair.id,
                        part.side,
                        counted - part.mark,
                        bound,
                        mine.received.len(),
                        theirs.sent.len(),
                        if peer_writing {
                            "still writes"
                        } else {
                            "is done writing"
                        },
                        describe(parts, &self.pairs),
                        describe_sessions(&self.sessions)
                    );
                }
            }
            Ok(all_done)
        })();
        match result {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    /// Accepts every stream still queued, shuts down every writer, reads every end to its end,
    /// drops everything, and checks the invariants.
    async fn finish(mut self) -> Result<(), TestCaseError> {
        // Whatever was stalled goes on now, so that everything can finish.
        for stall in &self.stalls {
            stall.clear();
        }
        for side in 0..2 {
            loop {
                let waiting = self.pairs.iter().filter(|p| !p.ends[side].accepted).count();
                if waiting == 0 {
                    break;
                }
                let before = self.pairs.iter().filter(|p| p.ends[side].accepted).count();
                self.accept(side).await?;
                if before == self.pairs.iter().filter(|p| p.ends[side].accepted).count() {
                    // Nothing more is queued: the rest was lost to a session close.
                    prop_assert!(self.any_session_closed(), "an opened stream never arrived");
                    break;
                }
            }
        }
        for pair in &mut self.pairs {
            for end in &mut pair.ends {
                if let Some(handle) = end.handle.as_mut() {
                    end.write_closed = true;
                    prop_assert!(
                        timeout(MUST, handle.shutdown()).await.is_ok(),
                        "shutdown hung"
                    );
                }
            }
        }
        for pair in &mut self.pairs {
            for side in 0..2 {
                let id = pair.id;
                let (mine, theirs) = split_ends(pair, side);
                if mine.read_closed {
                    continue;
                }
                let Some(mut handle) = mine.handle.take() else {
                    continue;
                };
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let read = timeout(MUST, handle.read(&mut buf)).await;
                    prop_assert!(read.is_ok(), "final read on stream {} hung", id);
                    let result = read.unwrap_or(Ok(0));
                    let stop = !matches!(result, Ok(n) if n > 0);
                    record_read(mine, theirs, result.map(|n| &buf[..n]))?;
                    if stop {
                        break;
                    }
                }
                mine.handle = Some(handle);
                // The fate of the bytes written: every byte whose write returned (before the
                // writer's session close began, since later writes fail) is read by this end,
                // which keeps reading, unless its own session was cut (`Session::close`) or the
                // connection broke. A graceful close on either side loses nothing. (A peer's
                // close followed by a failed write of ours must not lose anything either: see
                // `faults::a_peers_close_loses_no_data_when_our_write_fails_first`.)
                if !self.session_cut[side] {
                    prop_assert_eq!(
                        mine.received.len(),
                        theirs.sent.len(),
                        "stream {}: an end that kept reading missed data",
                        id
                    );
                }
            }
        }
        self.check_memory("after the final reads")?;
        for pair in &mut self.pairs {
            for end in &mut pair.ends {
                end.handle = None;
            }
        }
        for session in &self.sessions {
            let emptied = timeout(MUST, async {
                while session.stream_count() != 0 {
                    tokio::time::sleep(OP).await;
                }
            })
            .await;
            prop_assert!(
                emptied.is_ok(),
                "{} streams left in a {:?} table",
                session.stream_count(),
                session.role()
            );
        }
        for task in std::mem::take(&mut self.draining) {
            prop_assert!(
                timeout(MUST, task).await.is_ok(),
                "Session::graceful_close hung once every stream was done"
            );
        }
        for session in &self.sessions {
            prop_assert!(timeout(MUST, session.close()).await.is_ok(), "close hung");
        }
        self.check_memory("at the end")?;
        Ok(())
    }
}

fn check_repoll(grew: i64, what: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        grew <= REPOLL_SLACK,
        "{} polls of a pending {} with the same waker allocated {} bytes: each poll registers \
         the waker again",
        REPOLLS,
        what,
        grew
    );
    Ok(())
}

fn pair_id(pairs: &[Pair], index: usize) -> u32 {
    pairs[index].id
}

fn describe_one(part: &Part) -> String {
    format!(
        "side {} wrote {}/{}{}{}",
        part.side,
        part.written,
        part.content.len(),
        if part.reading { ", reading" } else { "" },
        if part.close_when_done {
            if part.close_done {
                ", closed"
            } else {
                ", closing"
            }
        } else {
            ""
        },
    )
}

/// Both sessions' counters, for failure messages.
fn describe_sessions(sessions: &[Session; 2]) -> String {
    sessions
        .iter()
        .map(|session| {
            let s = session.stats();
            format!(
                "{:?}: sent {} bytes written, {} frames queued; received {} bytes, {} frames; \
                 {} buffered",
                session.role(),
                s.bytes_sent,
                s.frames_sent,
                s.bytes_received,
                s.frames_received,
                s.buffered
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The state of a bulk transfer, for failure messages.
fn describe(parts: &[Part], pairs: &[Pair]) -> String {
    parts
        .iter()
        .map(|part| {
            let pair = &pairs[part.pair];
            format!(
                "[stream {} {}, received {}/{}]",
                pair.id,
                describe_one(part),
                pair.ends[part.side].received.len(),
                pair.ends[1 - part.side].sent.len()
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// This side's end and the peer's end of `pair`.
fn split_ends(pair: &mut Pair, side: usize) -> (&mut End, &mut End) {
    let [client, server] = &mut pair.ends;
    if side == 0 {
        (client, server)
    } else {
        (server, client)
    }
}

/// Checks and records the outcome of a read on `mine`, whose peer end is `theirs`.
fn record_read(
    mine: &mut End,
    theirs: &End,
    result: io::Result<&[u8]>,
) -> Result<(), TestCaseError> {
    match result {
        Ok([]) => {
            if !mine.read_closed {
                // End-of-stream only after everything the peer wrote.
                prop_assert_eq!(
                    mine.received.len(),
                    theirs.sent.len(),
                    "end-of-stream before all the data"
                );
                prop_assert!(
                    theirs.write_closed,
                    "end-of-stream while the peer still writes"
                );
            }
            mine.eof = true;
        }
        Ok(data) => {
            prop_assert!(!mine.eof || mine.read_closed, "data after end-of-stream");
            prop_assert!(!mine.read_closed, "data after this end closed reading");
            let start = mine.received.len();
            prop_assert!(
                start + data.len() <= theirs.sent.len()
                    && theirs.sent[start..start + data.len()] == *data,
                "read bytes {}..{} differ from what the peer wrote ({} bytes)",
                start,
                start + data.len(),
                theirs.sent.len()
            );
            mine.received.extend_from_slice(data);
        }
        Err(error) => {
            if let Some(Error::Refused) = gomux_error(&error) {
                // Refused reads come only at a session's end in this model.
                prop_assert!(
                    !theirs.accepted,
                    "a read reported refused on a stream the peer's application accepted"
                );
            }
        }
    }
    Ok(())
}

/// Runs one case: sessions over chopped pipes, the operations, then the final checks.
fn run(
    ops: Vec<Op>,
    seed: u64,
    chop: usize,
    pipe: usize,
    setup: Setup,
) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .event_interval(EVENT_INTERVAL)
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    runtime.block_on(async move {
        let (a, b) = tokio::io::duplex(pipe);
        let stalls = [Stall::default(), Stall::default()];
        let calls = Arc::new(AtomicU64::new(0));
        let link = Link::default();
        let client = Session::with_config(
            Chopped::new(
                a,
                seed,
                chop,
                stalls[0].clone(),
                Arc::clone(&calls),
                (link.clone(), 0),
            ),
            Role::Client,
            setup.config(),
        );
        let server = Session::with_config(
            Chopped::new(
                b,
                seed.rotate_left(32),
                chop,
                stalls[1].clone(),
                Arc::clone(&calls),
                (link.clone(), 1),
            ),
            Role::Server,
            setup.config(),
        );
        let mut model = Model {
            sessions: [client, server],
            session_closed: [false; 2],
            session_cut: [false; 2],
            draining: Vec::new(),
            link,
            pairs: Vec::new(),
            writes: seed,
            setup,
            pipe,
            stalls,
            calls,
        };
        for (i, op) in ops.iter().enumerate() {
            model.apply(op).await?;
            model.check_memory(&format!("after operation {i}, {op:?}"))?;
        }
        model.finish().await
    })
}

/// A bulk case replayed by hand: `opens` are the sides that open streams in turn, `accepts`
/// the sides that accept them, then one `Op::Bulk` per list of writers `(side, stream, len,
/// close)`. Fails with the model's message.
fn replay(
    opens: &[usize],
    accepts: &[usize],
    transfers: &[&[(usize, usize, usize, bool)]],
    (seed, chop, pipe, write_buffer_size): (u64, usize, usize, usize),
) {
    let mut ops: Vec<Op> = opens.iter().map(|&side| Op::Open { side }).collect();
    ops.extend(accepts.iter().map(|&side| Op::Accept { side }));
    for writers in transfers {
        let writers = writers
            .iter()
            .map(|&(side, stream, len, close)| BulkWrite {
                side,
                stream,
                len,
                close,
            })
            .collect();
        ops.push(Op::Bulk { writers });
    }
    let setup = Setup {
        write_buffer_size,
        budget: 0,
        open_backlog: DEFAULT_OPEN_BACKLOG,
    };
    if let Err(error) = run(ops, seed, chop, pipe, setup) {
        panic!("{error}");
    }
}

/// The case recorded last in `tests/model.proptest-regressions`, replayed by hand: its seed now
/// draws other operations, so the shrunk ones are spelled out. With `write_buffer_size` 34 and
/// a 64-byte pipe, every frame is let in alone through a grant of room (three writers on one
/// side wait in line for it) and cut into pieces by the batches: every wait of a reader and of
/// a `Stream::close` stays within [`Model::progress_bound`], which counts each of those rules.
#[test]
fn bulk_with_a_tiny_queue_keeps_every_stream_within_the_progress_bound() {
    replay(
        &[0, 1, 1, 1, 0],
        &[1, 0, 0, 0, 1],
        &[
            &[
                (0, 1, 1_330_218, false),
                (1, 4, 2_991_091, true),
                (1, 0, 2_513_316, false),
                (1, 0, 2_083_915, false),
                (1, 3, 951_319, false),
                (0, 4, 1_034_495, false),
            ],
            &[
                (0, 0, 2_413_560, true),
                (1, 0, 1_627_774, false),
                (0, 1, 817_800, true),
                (1, 0, 918_820, false),
            ],
        ],
        (5_326_447_705_013_139_533, 531, 64, 34),
    );
}

/// Two random cases with 4 KiB queues and pipes, three bulk writers on one side and two on the
/// other, each with a stream whose writer closes it when done: every reader keeps within
/// [`Model::progress_bound`].
#[test]
fn bulk_with_4k_queues_and_five_writers_keeps_every_stream_within_the_progress_bound() {
    replay(
        &[0, 0, 0, 0],
        &[1, 1, 1, 1],
        &[&[
            (0, 1, 23_159, true),
            (1, 2, 262_144, false),
            (1, 1, 262_144, false),
            (0, 3, 304_932, false),
            (0, 2, 720_769, false),
        ]],
        (2_276_961_822_686_989_573, 1362, 4096, 4096),
    );
    replay(
        &[0, 0, 0, 0],
        &[1, 1, 1, 1],
        &[&[
            (0, 1, 362_018, true),
            (1, 4, 542_642, true),
            (1, 1, 1_920_850, false),
            (0, 4, 1_889_043, false),
            (0, 2, 2_072_833, true),
        ]],
        (4_628_818_100_223_607_034, 2788, 4096, 4096),
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 2000,
        // Shrinking stops after this long.
        max_shrink_time: 45_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn streams_deliver_every_byte_once_in_order_whatever_the_operations(
        (ops, chop) in prop_oneof![
            // Tiny pieces with small writes, larger pieces with writes beyond the window.
            (ops(2000, 16 * 1024), 1..16usize),
            (ops(150_000, 192 * 1024), 256..8192usize),
        ],
        seed in any::<u64>(),
        pipe in prop_oneof![Just(64usize), Just(4096), Just(256 * 1024)],
        setup in setup(),
    ) {
        run(ops, seed, chop, pipe, setup)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 500,
        // A large case takes up to a second in a debug build.
        max_shrink_time: 45_000,
        ..ProptestConfig::default()
    })]

    /// Megabytes in both directions at once on a few streams: every reader keeps receiving,
    /// every close finishes, within the progress bound, and nothing is lost.
    #[test]
    fn bulk_transfers_keep_every_stream_moving(
        ops in bulk_ops(),
        seed in any::<u64>(),
        chop in 256..8192usize,
        pipe in prop_oneof![Just(64usize), Just(4096), Just(256 * 1024)],
        setup in bulk_setup(),
    ) {
        run(ops, seed, chop, pipe, setup)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        max_shrink_iters: 1000,
        max_shrink_time: 45_000,
        ..ProptestConfig::default()
    })]

    /// Both sides have data queued both ways and close their sessions in the same step: both
    /// closes return `Ok` well within the close timeout, and every invariant of the model holds
    /// before and after.
    #[test]
    fn both_sides_close_while_busy(
        ops in busy_close_ops(),
        seed in any::<u64>(),
        chop in prop_oneof![1..16usize, 256..8192usize],
        pipe in prop_oneof![Just(64usize), Just(4096), Just(256 * 1024)],
        setup in setup(),
    ) {
        run(ops, seed, chop, pipe, setup)?;
    }
}
