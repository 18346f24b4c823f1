//! The write side: batches taken from the core, written as the transport takes them.

use super::{Collected, Connection};
use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

use crate::config::deadline_after;
use crate::error::Error;
use crate::session::core::{Batch, Now};
use crate::session::out_queue::{Cursor, OutQueue, MAX_SLICES};

/// Outgoing queues grow to the largest batch written (up to about `write_buffer_size`, twice:
/// the queue being filled and the batch being written) and keep that capacity while traffic
/// lasts. When the driver finds nothing to write and it finished its last batch larger than
/// `QUEUE_KEEP` at least `QUEUE_LINGER` ago, it gives both back to the allocator, so a burst's
/// buffers are not held by a session gone quiet. It looks whenever it runs: an idle driver runs
/// at the latest when the keepalive is due (30 s by default), or with keepalives off at the
/// next activity.
pub(super) const QUEUE_KEEP: usize = 64 * 1024;
pub(super) const QUEUE_LINGER: Duration = Duration::from_secs(1);

/// How many times in a row the driver finds the queues empty, with no data taken in between,
/// while room it handed out stands unclaimed before it takes that room back and hands it on
/// (the writers woken for it may have been cancelled). Not at once: a woken task may run only
/// after the driver has run a few times more (`block_on`'s future runs after a round of spawned
/// tasks), and a writer whose grant was taken back waits for room again, at the front of the
/// line. Control frames alone
/// (credit for inbound data) do not restart the count, or a cancelled writer's grant would
/// hold its room for as long as the peer sends.
pub(super) const GRANT_PATIENCE: u8 = 16;

/// A batch holds at least this much data (when there is that much), and at first at most
/// [`FIRST_BUDGET`]. Its size then follows what the transport takes. While the transport has
/// taken every batch whole, each batch is twice the last one (up to `write_buffer_size`).
/// Once it pushes back, a batch is [`ROUND_SHARE`] of what it took in the round that ended
/// there (the bytes it took since the push-back before), and grows while the next round goes
/// on to that share of what the round has taken so far. So on a slow link the batch in hand
/// when the socket pushes back, which a frame of another stream queued meanwhile waits behind,
/// is a fraction of what the socket takes at a time (with `TCP_NOTSENT_LOWAT`, see
/// `gomux::tcp`, a socket takes a whole write while it has room, so a batch as large as a
/// round would be taken whole and the next would wait in hand), while a fast one gets large
/// writes.
pub(super) const MIN_BUDGET: usize = 4 * 1024;
pub(super) const FIRST_BUDGET: usize = 64 * 1024;

/// The part of a round (what the transport took between two push-backs) that a batch holds
/// once the transport has pushed back: a quarter.
const ROUND_SHARE: usize = 4;

/// The largest batch: `write_buffer_size`, at least [`MIN_BUDGET`], in 32 bits (the budget is
/// kept in the driver's task, where every byte counts for an idle session).
pub(super) fn max_budget(write_buffer_size: usize) -> u32 {
    write_buffer_size.clamp(MIN_BUDGET, u32::MAX as usize) as u32
}

/// The batch being written, and the buffers it is built in. Kept apart from the driver's task,
/// and held by a session only while it needs one of its own (see [`SPARE_BATCH`]): an idle
/// session's task is then smaller by this much, and it holds no buffers
/// (`benches/idle_sessions.rs`).
pub(super) struct WriteBatch {
    /// Its control frames, written first…
    pub(super) control_buf: Vec<u8>,
    control_done: usize,
    /// …then its data, frames taken from the streams' send queues (see `SendQueues::take`).
    pub(super) write_buf: OutQueue,
    written: Cursor,
    /// Where the batch lies in the core's queues, and how much of its data is written.
    batch: Batch,
    batch_data_done: u64,
    /// Where frames of the batch start (some of them): where control frames may go in.
    boundaries: VecDeque<u64>,
    /// When the driver last finished writing a batch larger than [`QUEUE_KEEP`], until it
    /// releases the buffers.
    large_batch_at: Option<Instant>,
    /// The bytes the transport took since it last pushed back, and whether it did since the
    /// last batch was taken: what the next batch's budget (`Connection::budget`) learns from.
    /// A batch lent by the thread starts a new round.
    round_taken: usize,
    pushed_back: bool,
    /// The transport pushed back while this batch was being written: the session keeps it
    /// (until it goes quiet, or its large buffers are released) instead of handing it back
    /// to the thread once written, since its next batches will likely wait too.
    held: bool,
}

thread_local! {
    /// One written batch per thread, lent to the drivers that run on it. A driver without a
    /// batch of its own borrows it, and hands it back once the transport took the whole
    /// batch, which is how most batches of most sessions end: so sessions that write a little
    /// now and then (an exchange, a keepalive) hold no batch at all between their writes, and
    /// allocate none. A driver that meets a push-back keeps the batch it holds until the
    /// session goes quiet (`session::linger`), as a session's own, so that a slow link never
    /// makes the drivers take turns allocating. It costs each thread that runs drivers one
    /// batch, with the capacity of the largest it carried: freed by the first driver that
    /// borrows it once it has not carried more than [`QUEUE_KEEP`] for [`QUEUE_LINGER`].
    pub(super) static SPARE_BATCH: Cell<Option<Box<WriteBatch>>> = const { Cell::new(None) };
}

/// The thread's batch, or a new one; as a batch starts out, with a new round.
fn borrow_batch() -> Box<WriteBatch> {
    let Some(mut write) = SPARE_BATCH.try_with(Cell::take).ok().flatten() else {
        return Box::new(WriteBatch::new());
    };
    if write
        .large_batch_at
        .is_some_and(|at| at.elapsed() >= QUEUE_LINGER)
    {
        *write = WriteBatch::new();
    }
    write.round_taken = 0;
    write.pushed_back = false;
    write
}

/// Hands a written batch to the thread, unless it has one: then it is returned. Emptied first
/// (its capacity kept), so that the thread keeps no payload of the session alive.
fn lend_back(mut write: Box<WriteBatch>) -> Option<Box<WriteBatch>> {
    write.control_buf.clear();
    write.control_done = 0;
    write.write_buf.clear();
    write.written = Cursor::default();
    write.boundaries.clear();
    SPARE_BATCH
        .try_with(|spare| match spare.take() {
            None => {
                spare.set(Some(write));
                None
            }
            Some(other) => {
                spare.set(Some(other));
                Some(write)
            }
        })
        .unwrap_or(None)
}

/// The write-stall timeout (from the configuration, `None` when off) and its timer. Made at the
/// transport's first push-back, so that later ones read the configuration no more, and dropped
/// with the buffers when the session goes quiet.
pub(super) struct Stall {
    /// The clock runs: the transport has taken nothing since it was started.
    armed: bool,
    timeout: Option<Duration>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Stall {
    /// The transport took bytes (or nothing waits for it): the write-stall clock stops.
    /// (On the slot, so that a caller holding the batch can call it too.)
    pub(super) fn disarm(slot: &mut Option<Box<Stall>>) {
        if let Some(stall) = slot.as_deref_mut() {
            stall.armed = false;
        }
    }
}

impl WriteBatch {
    fn new() -> WriteBatch {
        WriteBatch {
            control_buf: Vec::new(),
            control_done: 0,
            write_buf: OutQueue::new(),
            written: Cursor::default(),
            batch: Batch::default(),
            batch_data_done: 0,
            boundaries: VecDeque::new(),
            large_batch_at: None,
            round_taken: 0,
            pushed_back: false,
            held: false,
        }
    }

    fn is_written(&self) -> bool {
        self.control_done == self.control_buf.len() && self.write_buf.is_written(&self.written)
    }
}

impl<T> Connection<T>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    // Writing.

    pub(super) fn batch_written(&self) -> bool {
        self.write.as_deref().is_none_or(WriteBatch::is_written)
    }

    /// Everything taken is written: a batch the transport never pushed back on goes back to
    /// the thread (see [`SPARE_BATCH`]). A batch the session keeps (the thread has one)
    /// stays until the session goes quiet.
    fn lend_batch_back(&mut self) {
        if let Some(write) = self.write.take_if(|w| !w.held && w.is_written()) {
            self.write = lend_back(write);
        }
    }

    /// Writes queued frames until the transport would block or nothing is queued, then flushes.
    /// Each batch starts with every control frame queued so far, then frames from the send queues, up to the budget. Progress
    /// is reported to the core after every transport write. `Ready(Ok)` means everything
    /// queued so far is written and flushed.
    pub(super) fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            if self.batch_written() {
                let mut wakers = Collected::new();
                let mut inner = self.shared.lock();
                if inner.take_flush_wanted() {
                    self.unflushed = true;
                }
                if inner.direct_writes() != self.direct_writes {
                    // Writers wrote since the driver last looked: the session is busy, so its
                    // buffers stay (a queued write after a release would allocate them again).
                    self.direct_writes = inner.direct_writes();
                    // Nor is a keepalive needed: the peer heard from this side.
                    let (now, tick) = self.clock.now();
                    self.timers.wrote(tick);
                    if let Some(write) = self.write.as_deref_mut() {
                        if write.large_batch_at.is_some() {
                            write.large_batch_at = Some(now);
                        }
                    }
                }
                if inner.direct_busy() {
                    // A writer is writing its frame itself: nothing may go before it is done,
                    // and it wakes this task then (a closing session's CloseMux waited here).
                    inner.set_driver_waker(cx.waker(), false);
                    drop(inner);
                    wakers.wake();
                    self.lend_batch_back();
                    return Poll::Pending;
                }
                if !inner.has_output() {
                    // (A yield is only made with output queued, which only a batch takes:
                    // this is a reset for safety, not a path a yield leads to.)
                    inner.nothing_to_take();
                    // Room nobody has claimed: the tasks woken for it may have been cancelled.
                    // Pass it on once it has stood unclaimed for a while, and come back to
                    // check again until nobody waits, since nothing else may wake this task.
                    let waiting = if self.grants_unclaimed < GRANT_PATIENCE {
                        self.grants_unclaimed += 1;
                        inner.room_waiting()
                    } else {
                        self.grants_unclaimed = 0;
                        inner.void_room_grants();
                        inner.wake_room(wakers.list())
                    };
                    if waiting {
                        cx.waker().wake_by_ref();
                    }
                    let large_at = self.write.as_ref().and_then(|w| w.large_batch_at);
                    if large_at.is_some_and(|at| at.elapsed() >= QUEUE_LINGER) {
                        inner.release_data_buffers();
                        self.write = None;
                    }
                    drop(inner);
                    wakers.wake();
                    self.lend_batch_back();
                    break;
                }
                if inner.yield_to_writers() {
                    // A small batch: the tasks ready to run go first (a self-wake puts this
                    // task behind them), and the frames their writers queue meanwhile go in
                    // the batch taken on the next poll, which the check before sleeping in
                    // `poll_phases` leaves to that poll.
                    drop(inner);
                    wakers.wake();
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let max_budget = max_budget(inner.config.write_buffer_size);
                let write = self.write.get_or_insert_with(borrow_batch);
                write.control_buf.clear();
                write.control_done = 0;
                write.write_buf.clear();
                write.written = Cursor::default();
                write.batch_data_done = 0;
                write.boundaries.clear();
                if !write.pushed_back {
                    self.budget = if write.held {
                        let share = write.round_taken / ROUND_SHARE;
                        self.budget.max(share.min(u32::MAX as usize) as u32)
                    } else {
                        self.budget.saturating_mul(2)
                    };
                }
                self.budget = self.budget.min(max_budget);
                write.pushed_back = false;
                write.batch = inner.take_batch(
                    &Now::later(),
                    self.budget as usize,
                    &mut write.control_buf,
                    &mut write.write_buf,
                    &mut write.boundaries,
                    wakers.list(),
                );
                self.control_waiting = false;
                // Taking data hands out the room it frees: those grants get their time. A batch
                // of control frames alone frees no room, and leaves the count running: with
                // credit going out for inbound traffic all the time, a grant whose writer was
                // cancelled would otherwise be kept for as long as that traffic lasts.
                if !write.write_buf.is_empty() {
                    self.grants_unclaimed = 0;
                }
                drop(inner);
                wakers.wake();
                continue;
            }
            let data_limit = self.control_in_batch();
            let Some(write) = self.write.as_deref() else {
                // Not reached: a batch not yet written is held.
                break;
            };
            let io = Pin::new(&mut self.io);
            let control = &write.control_buf[write.control_done..];
            let result = if io.is_write_vectored() {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let mut count = 0;
                if !control.is_empty() {
                    slices[0] = IoSlice::new(control);
                    count = 1;
                }
                count += write
                    .write_buf
                    .slices(&write.written, &mut slices[count..], data_limit);
                io.poll_write_vectored(cx, &slices[..count])
            } else if !control.is_empty() {
                io.poll_write(cx, control)
            } else {
                let next = write.write_buf.next_slice(&write.written);
                io.poll_write(cx, &next[..next.len().min(data_limit)])
            };
            match result {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(
                        std::io::Error::from(std::io::ErrorKind::WriteZero).into()
                    ))
                }
                Poll::Ready(Ok(n)) => self.advance(n),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => {
                    if let Some(write) = self.write.as_deref_mut() {
                        // Bounded by the largest batch when the next one is taken.
                        self.budget = (write.round_taken / ROUND_SHARE)
                            .clamp(MIN_BUDGET, u32::MAX as usize)
                            as u32;
                        write.round_taken = 0;
                        write.pushed_back = true;
                        write.held = true;
                    }
                    self.arm_stall(cx);
                    return Poll::Pending;
                }
            }
        }
        Stall::disarm(&mut self.stall);
        if self.unflushed {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => {
                    self.arm_stall(cx);
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Control frames queued while the batch is written go out between two of its frames: at
    /// a recorded frame start, the driver takes them now; before one, it writes data only up
    /// to it. Returns how much data the next write may carry.
    pub(super) fn control_in_batch(&mut self) -> usize {
        let Some(write) = self.write.as_deref_mut() else {
            return usize::MAX;
        };
        if !self.control_waiting || write.control_done < write.control_buf.len() {
            return usize::MAX;
        }
        let at = write.batch.data_start + write.batch_data_done;
        while write.boundaries.front().is_some_and(|&start| start < at) {
            write.boundaries.pop_front();
        }
        match write.boundaries.front() {
            Some(&start) if start == at => {
                write.control_buf.clear();
                write.control_done = 0;
                let mut wakers = Collected::new();
                let mut inner = self.shared.lock();
                write.batch.control_end =
                    inner.take_control(&Now::later(), &mut write.control_buf, wakers.list());
                drop(inner);
                wakers.wake();
                self.control_waiting = false;
                usize::MAX
            }
            Some(&start) => (start - at) as usize,
            // No frame starts in the rest of the batch: the control goes first in the next.
            None => usize::MAX,
        }
    }

    /// Moves past `n` bytes the transport took, and tells the core.
    pub(super) fn advance(&mut self, n: usize) {
        let Some(write) = self.write.as_deref_mut() else {
            // Not reached: the transport took bytes of a batch held.
            return;
        };
        let control = n.min(write.control_buf.len() - write.control_done);
        write.control_done += control;
        let data = n - control;
        write.round_taken += n;
        write.write_buf.advance(&mut write.written, data);
        write.batch_data_done += data as u64;
        self.unflushed = true;
        Stall::disarm(&mut self.stall);
        let (now, tick) = self.clock.now();
        self.timers.wrote(tick);
        if write.write_buf.is_written(&write.written) {
            if write.write_buf.len() > QUEUE_KEEP {
                write.large_batch_at = Some(now);
            }
            // The batch's slices of the streams' queue buffers go before the core hears of
            // it, so that the queues it frees find their buffers theirs alone, to be used
            // again at once.
            write.write_buf.clear();
            write.written = Cursor::default();
        }
        let control_pos = if write.control_done == write.control_buf.len() {
            write.batch.control_end
        } else {
            0
        };
        let data_pos = write.batch.data_start + write.batch_data_done;
        let mut wakers = Collected::new();
        let mut inner = self.shared.lock();
        inner.written(data_pos, control_pos, n as u64, wakers.list());
        self.control_waiting = inner.control_waiting();
        drop(inner);
        wakers.wake();
    }

    /// Whether the write-stall clock runs.
    pub(super) fn stall_armed(&self) -> bool {
        self.stall.as_ref().is_some_and(|stall| stall.armed)
    }

    /// The transport takes nothing of what waits for it: start the write-stall clock, unless
    /// it runs already.
    pub(super) fn arm_stall(&mut self, cx: &mut Context<'_>) {
        if self.stall_armed() {
            return;
        }
        let shared = &self.shared;
        let stall = self.stall.get_or_insert_with(|| {
            Box::new(Stall {
                armed: false,
                timeout: shared.lock().config.write_stall_timeout,
                sleep: None,
            })
        });
        stall.armed = true;
        let Some(timeout) = stall.timeout else {
            return;
        };
        let deadline = deadline_after(Instant::now(), timeout);
        let sleep = match &mut stall.sleep {
            Some(sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => stall
                .sleep
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        let _ = sleep.as_mut().poll(cx);
    }

    /// Whether the transport took nothing for the whole write-stall timeout.
    pub(super) fn poll_stalled(&mut self, cx: &mut Context<'_>) -> bool {
        self.stall_armed()
            && self
                .stall
                .as_mut()
                .and_then(|stall| stall.sleep.as_mut())
                .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }
}
