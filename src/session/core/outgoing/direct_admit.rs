//! Direct-write admission: when a writer writes its frame to the transport itself instead of
//! queueing it (see `session::direct`), and what the transport leaves of it.
//!
//! - A writer writes its frame itself only when it goes first and alone, as one message of a
//!   quiet session ([`Inner::direct_possible`]).
//! - Its admission takes the control frames queued (they go first, in the same transport call)
//!   and the driver's waker, and marks the write as under way: the driver takes no batch until
//!   [`Inner::direct_done`] reports what the transport took, so nothing comes between the
//!   frame's bytes. The transport call is made between the two, without the session's lock: a
//!   transport slow to take a write holds up nobody else's use of the state.
//! - The control frames' bytes go into a room lent by the thread ([`DIRECT_CONTROL`]), where a
//!   small frame is copied after them for the transport call, so a direct write allocates
//!   nothing in steady state.
//! - What the transport does not take of the control frames, and of a frame it took part of (at
//!   most one frame, outside `write_buffer_size`), the driver writes before anything else
//!   (`Control::DirectRest`); a frame it took nothing of is queued as any other.

use std::cell::Cell;
use std::task::{ready, Poll, Waker};

use super::super::send::data_header;
use super::super::stream_state::{register, Queued};
use super::super::{Inner, Now};
use super::batch::COALESCE_BELOW;
use super::control::Control;
use crate::error::Error;
use crate::frame::{Header, Kind};
use crate::session::direct::Direct;

/// Control entries a direct write takes with its frame, at most: with more queued the driver
/// writes them (see [`Inner::direct_possible`]).
const DIRECT_CONTROL_MAX: usize = 16;

/// The capacity the thread's room for direct writes' control frames keeps between writes: a
/// room grown past it (by the rest of an earlier direct write, up to a frame) is given back.
/// It holds a small direct write's whole frame too (`session::direct`).
const DIRECT_CONTROL_KEEP: usize = 4 * 1024;
const _: () = assert!(DIRECT_CONTROL_KEEP >= crate::session::direct::SMALL_FRAME);

thread_local! {
    /// Room for the control frames a direct write takes (see [`Inner::admit_write`]), and for
    /// a small frame copied after them for the transport call (`session::direct`), one per
    /// thread, lent to the writer from its admission to [`Inner::direct_done`], which happen in
    /// the same poll of the writer's task: sessions hold none, and direct writes allocate
    /// nothing for it in steady state. It keeps at most [`DIRECT_CONTROL_KEEP`] of capacity.
    static DIRECT_CONTROL: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A write admitted by [`Inner::admit_write`]: its frame's header, its payload's length, and,
/// when the writer writes it to the transport itself, what goes before it.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) header: Header,
    pub(crate) n: usize,
    pub(crate) direct: Option<DirectBatch>,
}

/// The control frames a direct write carries ahead of its frame, taken from the control queue,
/// and the control-queue position after them.
#[derive(Debug)]
pub(crate) struct DirectBatch {
    pub(crate) control: Vec<u8>,
    control_end: u64,
    /// The driver's waker, for the transport call (see `session::direct`).
    pub(crate) waker: Waker,
}

/// What the transport did not take of a direct write (see `Outgoing::direct_rest`).
#[derive(Default)]
pub(in crate::session::core) struct DirectRest {
    /// Waiting for the driver to take it (`Control::DirectRest` in the control queue).
    pub(in crate::session::core) bytes: Vec<u8>,
    /// Taken into the driver's batch, not written yet: its length, and the control-queue
    /// position once it is written (for `Stats::queued`).
    pub(in crate::session::core) taken: usize,
    pub(in crate::session::core) taken_end: u64,
}

impl Inner {
    /// Admits a write of up to `len` bytes (see `grant_write`), but leaves the frame to the
    /// caller. With `direct` (a spawned session's writer, with the time) and nothing to write
    /// before it but control frames (no frame queued, no batch in hand, no direct write under
    /// way), the caller writes the control frames and its frame to the transport itself, then
    /// reports with [`Inner::direct_done`]; meanwhile the driver takes no batch. Otherwise the
    /// caller queues the frame with `queue_data` or `queue_data_chunk`.
    pub(crate) fn admit_write(
        &mut self,
        key: usize,
        waker: &Waker,
        len: usize,
        direct: Option<&Now>,
        wakers: &mut Vec<Waker>,
    ) -> Poll<Result<Admitted, Error>> {
        let (id, n) = ready!(self.grant_write(key, waker, len))?;
        let direct = match direct {
            Some(now) if n > 0 && self.direct_possible(id, n) => {
                self.out.direct_busy = true;
                // The control frames queued go first, as in a batch of the driver's.
                let mut control = DIRECT_CONTROL.try_with(Cell::take).unwrap_or_default();
                let control_end = self.take_control(now, &mut control, wakers);
                // Before the driver's first sleep there is no waker of its own to leave with
                // the transport: the write goes on without one. What the transport leaves of it
                // is the driver's then, which sees it before it sleeps.
                let waker = self
                    .out
                    .driver_waker
                    .clone()
                    .unwrap_or_else(|| Waker::noop().clone());
                Some(DirectBatch {
                    control,
                    control_end,
                    waker,
                })
            }
            _ => None,
        };
        Poll::Ready(Ok(Admitted {
            header: data_header(id, n),
            n,
            direct,
        }))
    }

    /// Admits a write of `data` and queues its frame, unless the returned grant carries a
    /// direct batch (see [`Inner::admit_write`]).
    pub(crate) fn poll_write_admit(
        &mut self,
        key: usize,
        waker: &Waker,
        data: &[u8],
        direct: Option<&Now>,
        wakers: &mut Vec<Waker>,
    ) -> Poll<Result<Admitted, Error>> {
        let admitted = ready!(self.admit_write(key, waker, data.len(), direct, wakers))?;
        if admitted.direct.is_none() && admitted.n > 0 {
            self.queue_data(key, admitted.header, &data[..admitted.n]);
        }
        Poll::Ready(Ok(admitted))
    }

    /// The same for `write_chunk`: a queued frame takes its bytes from `chunk` without
    /// copying, and `chunk` is advanced past them either way.
    pub(crate) fn poll_write_chunk_admit(
        &mut self,
        key: usize,
        waker: &Waker,
        chunk: &mut bytes::Bytes,
        direct: Option<&Now>,
        wakers: &mut Vec<Waker>,
    ) -> Poll<Result<(Admitted, bytes::Bytes), Error>> {
        let admitted = ready!(self.admit_write(key, waker, chunk.len(), direct, wakers))?;
        let payload = chunk.split_to(admitted.n);
        if admitted.direct.is_none() && admitted.n > 0 {
            self.queue_data_chunk(key, admitted.header, payload.clone());
        }
        Poll::Ready(Ok((admitted, payload)))
    }

    /// Whether a frame of `len` bytes of payload on stream `id` may be written by its writer
    /// now. It would go first: nothing but control frames is queued, and the driver has no
    /// batch in hand. And it goes as one message of a quiet session, not as one of a series,
    /// which is the driver's to write in batches instead of one transport call per frame: not
    /// a second time before the driver has run since the last direct write. A writer sending
    /// bulk so writes its first frame itself and queues the next ones, which the driver takes
    /// together as the transport takes them, one transport call per several frames instead of
    /// one per frame, which wakes the peer's reading thread that much less often.
    ///
    /// The control queue holds at most [`DIRECT_CONTROL_MAX`] entries: more are the driver's
    /// to write, and the walk below stays short.
    ///
    /// A small frame (under [`COALESCE_BELOW`]) also waits for a batch:
    /// - while frames of other streams wait in the control queue (the driver was woken for
    ///   them);
    /// - while the driver lets the writers run before it takes its batch
    ///   ([`Inner::yield_to_writers`]).
    fn direct_possible(&self, id: u32, len: usize) -> bool {
        let out = &self.out;
        let control_taken = out.control_pushed - out.control.len() as u64;
        let first = out.control.len() <= DIRECT_CONTROL_MAX
            && !out.direct_busy
            && !out.close_mux
            && out.queues.all_written()
            && !out.queues.has_output()
            && out.data_written >= out.data_end
            && out.control_written >= control_taken
            && self.life.end_reason().is_none();
        first
            && !out.direct_unseen
            && (len >= COALESCE_BELOW || !out.coalescing && !self.others_waiting(id))
    }

    /// Whether frames of streams other than `id` wait in the control queue (a keepalive or a
    /// CloseMux is no stream's).
    fn others_waiting(&self, id: u32) -> bool {
        self.out.control.iter().any(|control| match control {
            Control::Credit { id: other, .. } => *other != id,
            Control::Frame(header) => {
                !matches!(header.kind, Kind::Keepalive | Kind::CloseMux) && header.id != id
            }
            Control::DirectRest => true,
        })
    }

    /// A direct write admitted by [`Inner::admit_write`] is done: the transport took
    /// `outcome.written` bytes of its control frames, `header` and `payload`. A frame it took
    /// nothing of is queued as any other; what it did not take of the control frames, and of a
    /// frame it took part of, the driver writes before anything else, and the stream's close
    /// and `poll_written` wait for it.
    pub(crate) fn direct_done(
        &mut self,
        key: usize,
        header: Header,
        payload: &[u8],
        batch: DirectBatch,
        outcome: Direct,
        wakers: &mut Vec<Waker>,
    ) {
        self.out.direct_busy = false;
        let DirectBatch {
            mut control,
            control_end,
            ..
        } = batch;
        let written = outcome.written;
        self.out.bytes_written += written as u64;
        self.out.flush_wanted |= outcome.unflushed;
        if written >= control.len() {
            // The control frames are out: wake whoever waited for them (closes, flushes).
            let data = self.out.data_written;
            self.written(data, control_end, 0, wakers);
        }
        let frame_taken = written > 0;
        if frame_taken {
            self.stats.frames_sent += 1;
            self.out.direct_writes = self.out.direct_writes.wrapping_add(1);
            self.out.direct_unseen = true;
        }
        // What the transport did not take: of the control frames, and of the frame once the
        // transport took some of the whole (a frame it took nothing of is queued instead).
        let header_bytes = header.to_bytes();
        let parts: [&[u8]; 3] = [&control, &header_bytes, payload];
        let unwritten = if frame_taken { &parts[..] } else { &parts[..1] };
        let total: usize = unwritten.iter().map(|part| part.len()).sum();
        let rest_len = total.saturating_sub(written);
        if rest_len > 0 {
            let rest = self.out.direct_rest.get_or_insert_with(Box::default);
            let mut skip = written;
            for part in unwritten {
                let start = skip.min(part.len());
                rest.bytes.extend_from_slice(&part[start..]);
                skip -= start;
            }
        }
        control.clear();
        if control.capacity() > DIRECT_CONTROL_KEEP {
            control = Vec::new();
        }
        let _ = DIRECT_CONTROL.try_with(|room| room.set(control));
        if !frame_taken {
            self.queue_data(key, header, payload);
        }
        if rest_len == 0 {
            return;
        }
        // First in the control queue: nothing but the control frames taken was to be written
        // when the write was admitted, and the driver took nothing since, so every entry queued
        // meanwhile goes in the same batch, after it.
        self.out.control.push_front(Control::DirectRest);
        self.out.control_pushed += 1;
        let mark = self.out.control_pushed as u32;
        if frame_taken {
            if let Some(stream) = self.streams.get_mut(key) {
                stream.control_mark = mark;
                stream.queued.set(Queued::IN_CONTROL, true);
            }
        }
    }

    /// Direct writes made so far (wrapping), see `Outgoing::direct_writes`.
    pub(crate) fn direct_writes(&self) -> u32 {
        self.out.direct_writes
    }

    /// The driver goes to sleep, to be woken with `waker`: it has run since the last direct
    /// write, and direct writes poll the transport with its waker from now on.
    pub(crate) fn driver_sleeps(&mut self, waker: &Waker) {
        self.out.direct_unseen = false;
        register(&mut self.out.driver_waker, waker);
    }

    /// Whether a writer is writing its frame to the transport itself.
    pub(crate) fn direct_busy(&self) -> bool {
        self.out.direct_busy
    }

    /// Whether a direct write left bytes for the driver to flush; forgets it.
    pub(crate) fn take_flush_wanted(&mut self) -> bool {
        std::mem::take(&mut self.out.flush_wanted)
    }
}
