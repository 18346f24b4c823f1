//! More unit tests of the send path: what its scheduler and queues do that the tests above
//! leave open (found by mutation testing, `scripts/mutants.sh --part core`).

use std::task::{Poll, Waker};

use bytes::Bytes;

use super::{data_frames, streams_with_credit, write};

/// Queues a payload handed over whole (`Stream::write_chunk`); all of it goes in.
fn write_chunk(core: &mut super::Core, key: usize, bytes: usize) {
    let mut chunk = Bytes::from(vec![9u8; bytes]);
    match core.inner.poll_write_chunk(key, Waker::noop(), &mut chunk) {
        Poll::Ready(Ok(n)) if n == bytes => {}
        other => panic!("the chunk did not go in whole: {other:?}"),
    }
}

/// A stream's `queued` figure (`StreamStats::queued`) is what it queued, headers included,
/// copied or spliced, less what the batches took.
#[test]
fn a_streams_queued_figure_is_what_no_batch_took_yet() {
    let (mut core, streams) = streams_with_credit(2);
    let (key, id) = streams[0];
    assert_eq!(core.inner.stream_stats(key).queued, 0);
    write(&mut core, key, 1000);
    assert_eq!(core.inner.stream_stats(key).queued, 1008);
    // Spliced, not copied: counted all the same.
    write_chunk(&mut core, key, 40_000);
    assert_eq!(core.inner.stream_stats(key).queued, 1008 + 40_008);
    // The first frame fits; the next does not, and is not cut behind another.
    assert_eq!(data_frames(&mut core, 2000), vec![(id, 1000)]);
    assert_eq!(core.inner.stream_stats(key).queued, 40_008);
    assert_eq!(data_frames(&mut core, 10_008), vec![(id, 10_000)]);
    assert_eq!(core.inner.stream_stats(key).queued, 30_000);
    assert_eq!(data_frames(&mut core, 1 << 20), vec![(id, 30_000)]);
    assert_eq!(core.inner.stream_stats(key).queued, 0);
}

/// Streams that each send a message now and then reuse the queue buffers of those before
/// them, however small `write_buffer_size` is: the spare buffers kept hold up to 256 KiB in
/// all (or more with a larger `write_buffer_size`, see `spare_limit`), so that a stream's queue
/// costs no allocation.
#[test]
fn a_written_streams_queue_buffer_is_kept_for_the_next_stream() {
    let mut core = super::Core::new(
        crate::config::Role::Client,
        crate::config::Config::default().write_buffer_size(512),
    );
    let mut held = Vec::new();
    for _ in 0..4 {
        let (key, id) = core.open();
        core.frame(crate::frame::Frame::window_update(id, 1 << 20))
            .expect("credit");
        write(&mut core, key, 16 * 1024);
        let data: u32 = data_frames(&mut core, 1 << 20).iter().map(|f| f.1).sum();
        assert_eq!(data, 16 * 1024);
        assert!(core.inner.poll_written(key, Waker::noop()).is_ready());
        held.push(core.inner.data_capacity());
    }
    assert!(
        held[0] >= 16 * 1024,
        "the written queue's buffer was dropped: {held:?}"
    );
    assert!(
        held.iter().all(|&h| h == held[0]),
        "capacity held: {held:?}"
    );
}

/// What one step of the property test below does.
#[derive(Debug, Clone)]
enum Step {
    /// Stream `.0` writes `.1` bytes, copied into its queue (`write`) or handed over whole
    /// (`write_chunk`, spliced in from 4 KiB on).
    Write(usize, usize, bool),
    /// Stream `.0` shuts its writing down: CloseRead, after its data.
    Shutdown(usize),
    /// Stream `.0` gets priority `.1`.
    Priority(usize, i32),
    /// The driver takes a batch of at most `.0` bytes of data (a cut frame may pass it); the
    /// transport takes it in two writes, the first ending `.1` / 1024 into its data.
    Batch(usize, usize),
}

fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..3usize, 0..70_000usize, any::<bool>()).prop_map(|(s, n, c)| Step::Write(s, n, c)),
        4 => (0..3usize, 0..1200usize, any::<bool>()).prop_map(|(s, n, c)| Step::Write(s, n, c)),
        1 => (0..3usize).prop_map(Step::Shutdown),
        1 => (0..3usize, -1..2i32).prop_map(|(s, p)| Step::Priority(s, p)),
        4 => (1..150_000usize, 0..=1024usize).prop_map(|(n, h)| Step::Batch(n, h)),
        2 => (1..3000usize, 0..=1024usize).prop_map(|(n, h)| Step::Batch(n, h)),
    ]
}

/// The bytes of write number `n`, so that a byte sent twice or out of place shows. They are
/// below 8, so that payload bytes taken for a frame header make a valid one (a byte above 7
/// is no frame kind), and such a mistake shows in what the batches carry.
fn pattern(n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((n * 31 + i) % 251) as u8 & 7).collect()
}

/// Queues all of `data` on the stream, copied or as one chunk.
fn queue_all(core: &mut super::Core, key: usize, data: &[u8], chunk: bool) {
    let mut rest = Bytes::copy_from_slice(data);
    while !rest.is_empty() {
        let step = if chunk {
            core.inner.poll_write_chunk(key, Waker::noop(), &mut rest)
        } else {
            let n = core.inner.poll_write(key, Waker::noop(), &rest);
            if let Poll::Ready(Ok(n)) = n {
                let _ = rest.split_to(n);
            }
            n
        };
        assert!(matches!(step, Poll::Ready(Ok(n)) if n > 0), "{step:?}");
    }
}

/// What the peer of the property test below has seen of three streams.
struct Seen {
    /// The streams' keys and ids.
    keys: Vec<usize>,
    ids: Vec<u32>,
    received: Vec<Vec<u8>>,
    closed: [bool; 3],
    /// What the streams wrote, and which shut their writing down.
    written: Vec<Vec<u8>>,
    shut: [bool; 3],
}

impl Seen {
    fn stream(&self, id: u32) -> usize {
        self.ids.iter().position(|&s| s == id).expect("our stream")
    }

    /// Whether stream `s` has everything it queued received.
    fn done(&self, s: usize) -> bool {
        self.received[s] == self.written[s] && self.closed[s] == self.shut[s]
    }

    /// The driver takes a batch of at most `budget` bytes of data, and the transport takes
    /// it in two writes, the first ending `split` (a fraction of 1024) into its data. Checks
    /// the batch, and which streams count as written after each write; returns its size.
    fn take(&mut self, core: &mut super::Core, budget: usize, split: usize) -> usize {
        use crate::frame::{Header, Kind, HEADER_LEN};
        let frames_before = core.inner.stats().frames_sent;
        let (mut control, mut data) = (Vec::new(), crate::session::out_queue::OutQueue::new());
        let mut wakers = Vec::new();
        let batch = core.take_into(budget, &mut control, &mut data, &mut wakers);
        let data = data.to_vec();
        let frames = super::headers(&control).len() + super::headers(&data).len();
        assert_eq!(
            core.inner.stats().frames_sent - frames_before,
            frames as u64
        );
        assert!(
            data.len() <= budget + HEADER_LEN + 1024,
            "{} bytes in a batch of {budget}",
            data.len()
        );
        // A close goes in the control part when nothing of its stream waits.
        for header in super::headers(&control) {
            let s = self.stream(header.id);
            assert_eq!(header.kind, Kind::CloseRead);
            assert!(!self.closed[s], "a second CloseRead");
            self.closed[s] = true;
        }
        // Where each stream's last frame in the batch ends.
        let mut ends = [0; 3];
        let mut rest = &data[..];
        while !rest.is_empty() {
            let raw: [u8; HEADER_LEN] = rest[..HEADER_LEN].try_into().expect("a whole header");
            let header = Header::from_bytes(raw).expect("a valid header");
            let s = self.stream(header.id);
            assert!(!self.closed[s], "a frame after CloseRead: {header:?}");
            let len = match header.kind {
                Kind::Data => header.length as usize,
                _ => 0,
            };
            match header.kind {
                Kind::Data => {
                    self.received[s].extend_from_slice(&rest[HEADER_LEN..HEADER_LEN + len])
                }
                Kind::CloseRead => self.closed[s] = true,
                other => panic!("unexpected {other:?}"),
            }
            rest = &rest[HEADER_LEN + len..];
            ends[s] = data.len() - rest.len();
        }
        let first = data.len() * split / 1024;
        for (at, last) in [(first, false), (data.len(), true)] {
            core.inner.written(
                batch.data_start + at as u64,
                batch.control_end,
                0,
                &mut wakers,
            );
            for (s, &end) in ends.iter().enumerate() {
                assert_eq!(
                    core.inner.is_written(self.keys[s]),
                    self.done(s) && end <= at,
                    "stream {s}, {at} bytes of {} written",
                    data.len()
                );
            }
            if last {
                break;
            }
        }
        control.len() + data.len()
    }
}

proptest::proptest! {
    /// Whatever the streams write and whatever the batch sizes, the batches carry each
    /// stream's bytes exactly once and in order, in well-formed frames, its CloseRead after
    /// them; a batch passes its budget only by a frame cut to fit (at most a header and
    /// 1 KiB); a stream counts as written once the transport has taken its last frame, and
    /// the session once every stream is; `frames_sent` counts the frames.
    #[test]
    fn batches_carry_every_streams_bytes_once_and_in_order(
        steps in proptest::collection::vec(any_step(), 1..40),
    ) {
        let (mut core, streams) = streams_with_credit(3);
        let mut seen = Seen {
            keys: streams.iter().map(|s| s.0).collect(),
            ids: streams.iter().map(|s| s.1).collect(),
            received: vec![Vec::new(); 3],
            closed: [false; 3],
            written: vec![Vec::new(); 3],
            shut: [false; 3],
        };
        let mut writes = 0;
        for step in steps {
            match step {
                Step::Write(s, len, chunk) if !seen.shut[s] => {
                    let data = pattern(writes, len);
                    writes += 1;
                    queue_all(&mut core, streams[s].0, &data, chunk);
                    seen.written[s].extend_from_slice(&data);
                }
                Step::Write(..) => {}
                Step::Shutdown(s) => {
                    core.inner.shutdown(streams[s].0);
                    seen.shut[s] = true;
                }
                Step::Priority(s, p) => core.inner.set_priority(streams[s].0, p),
                Step::Batch(budget, split) => {
                    seen.take(&mut core, budget, split);
                }
            }
            let all = (0..3).all(|s| seen.done(s));
            assert_eq!(core.inner.out.all_written(), all);
        }
        for (s, &(key, _)) in streams.iter().enumerate() {
            if !seen.shut[s] {
                core.inner.shutdown(key);
                seen.shut[s] = true;
            }
        }
        let mut batches = 0;
        while seen.take(&mut core, 100_000, 512) > 0 {
            batches += 1;
            assert!(batches < 1000, "the queues never empty");
        }
        for (s, &(key, _)) in streams.iter().enumerate() {
            assert!(
                seen.received[s] == seen.written[s],
                "stream {s}: {} bytes sent, {} received",
                seen.written[s].len(),
                seen.received[s].len()
            );
            assert!(seen.closed[s], "stream {s} never sent CloseRead");
            assert!(core.inner.poll_written(key, Waker::noop()).is_ready());
            assert_eq!(core.inner.stream_stats(key).queued, 0);
        }
        assert_eq!(core.inner.data_len(), 0);
        assert!(core.inner.out.all_written());
    }
}

/// The spare queue buffers are bounded: when many streams' queues are written at once, those
/// kept for reuse hold at most `spare_limit` (384 KiB and 16 bytes here, where
/// `write_buffer_size` is 128 KiB: two of it and a frame of 64 KiB), and the rest goes back to
/// the allocator.
#[test]
fn spare_queue_buffers_hold_at_most_their_bound() {
    let mut core = super::Core::new(
        crate::config::Role::Client,
        crate::config::Config::default().write_buffer_size(128 * 1024),
    );
    let mut wakers = Vec::new();
    let (mut end, mut control_end) = (0, 0);
    // Sixteen streams each queue 64 KiB, taken batch after batch and reported written only at
    // the end, so that every queue stays in flight with its buffer and all are freed at once.
    // (The driver itself takes a batch once the one before is written; this is the most it
    // could free at once with a larger `write_buffer_size`.)
    for _ in 0..16 {
        let (key, id) = core.open();
        core.frame(crate::frame::Frame::window_update(id, 1 << 20))
            .expect("credit");
        write(&mut core, key, 64 * 1024);
        let mut data = crate::session::out_queue::OutQueue::new();
        let batch = core.take_into(1 << 20, &mut Vec::new(), &mut data, &mut wakers);
        end = batch.data_start + data.len() as u64;
        control_end = batch.control_end;
    }
    assert!(core.inner.data_capacity() >= 16 * 64 * 1024);
    core.inner.written(end, control_end, 0, &mut wakers);
    // Sixteen new streams each send a byte: what they reuse was kept.
    for _ in 0..16 {
        let (key, id) = core.open();
        core.frame(crate::frame::Frame::window_update(id, 1 << 20))
            .expect("credit");
        write(&mut core, key, 1);
    }
    let held = core.inner.data_capacity();
    let bound = super::super::send_queue::spare_limit(128 * 1024, crate::frame::MAX_PAYLOAD);
    assert_eq!(bound, 2 * (128 * 1024 + 64 * 1024 + 8));
    assert!(held <= bound + 16 * 1024, "{held} bytes held");
}

/// A write of nothing, copied or handed over, is done at once and puts nothing on the wire.
#[test]
fn an_empty_write_sends_no_frame() {
    let (mut core, streams) = streams_with_credit(1);
    let (key, _) = streams[0];
    assert_eq!(core.inner.stats().streams_opened, 1);
    assert!(matches!(
        core.inner.poll_write(key, Waker::noop(), &[]),
        Poll::Ready(Ok(0))
    ));
    let mut empty = Bytes::new();
    assert!(matches!(
        core.inner.poll_write_chunk(key, Waker::noop(), &mut empty),
        Poll::Ready(Ok(0))
    ));
    assert_eq!(core.sent(), vec![]);
    assert_eq!(core.inner.stream_stats(key).queued, 0);
}

/// The wire bytes of each stream's runs of consecutive Data frames in `frames` (the last run
/// left out: it may be cut short by the end of the batches).
fn runs(frames: &[(u32, u32)]) -> Vec<(u32, usize)> {
    let mut runs: Vec<(u32, usize)> = Vec::new();
    for &(id, len) in frames {
        match runs.last_mut() {
            Some(run) if run.0 == id => run.1 += 8 + len as usize,
            _ => runs.push((id, 8 + len as usize)),
        }
    }
    runs.pop();
    runs
}

/// A turn is a turn whatever the batches' size: with batches smaller than a turn, a stream
/// sends its turn's 32 KiB over several of them, then the next stream goes, and so on.
#[test]
fn a_turn_spans_batches_smaller_than_it() {
    let (mut core, streams) = streams_with_credit(3);
    for &(key, _) in &streams {
        write(&mut core, key, 1 << 20);
    }
    let mut frames = Vec::new();
    for _ in 0..40 {
        frames.extend(data_frames(&mut core, 10_000));
    }
    let runs = runs(&frames);
    assert!(runs.len() >= 8, "{runs:?}");
    let quantum = super::super::send_queue::QUANTUM;
    for (i, run) in runs.iter().enumerate() {
        assert!(
            run.1.abs_diff(quantum) <= 1024 + 8,
            "turn {i}: {} bytes of stream {}: {runs:?}",
            run.1,
            run.0
        );
        assert_eq!(run.0, streams[i % 3].1, "{runs:?}");
    }
}

/// Setting a stream's priority to the one it has changes nothing, not even its place in the
/// round; lowering it sends it behind the streams it went ahead of.
#[test]
fn a_priority_set_again_changes_nothing_and_a_lowered_one_goes_last() {
    let (mut core, streams) = streams_with_credit(3);
    let ((a, a_id), (b, b_id), (c, c_id)) = (streams[0], streams[1], streams[2]);
    for key in [a, b, c] {
        write(&mut core, key, 1 << 20);
    }
    // A's turn is under way: it goes on in the next batch, whatever A's priority is set to.
    assert_eq!(
        data_frames(&mut core, 10_000).first().map(|f| f.0),
        Some(a_id)
    );
    core.inner.set_priority(a, 0);
    assert_eq!(
        data_frames(&mut core, 10_000).first().map(|f| f.0),
        Some(a_id)
    );
    // Raised, A goes alone; lowered below the others, it goes after them.
    core.inner.set_priority(a, 10);
    let high = data_frames(&mut core, 100_000);
    assert!(high.iter().all(|f| f.0 == a_id), "{high:?}");
    core.inner.set_priority(a, -1);
    let low = data_frames(&mut core, 100_000);
    assert!(low.iter().all(|f| f.0 == b_id || f.0 == c_id), "{low:?}");
}

/// A queue that never empties does not grow without bound: a stream that always has 64 to
/// 100 KB queued while 13 MB go through its queue (batches of 40 KB, which cut its 64 KiB
/// frames) keeps its queue's buffer within a few times that, as the bytes taken are given
/// back; and what the batches carry stays its Data frames throughout.
#[test]
fn a_queue_that_never_empties_stays_bounded() {
    let (mut core, streams) = streams_with_credit(1);
    let (key, id) = streams[0];
    let mut sent = 0;
    for _ in 0..200 {
        write(&mut core, key, 64 * 1024);
        while core.inner.stream_stats(key).queued > 100_000 {
            let (_, data) = core.take_all(40_000);
            for header in super::headers(&data) {
                assert_eq!((header.id, header.kind), (id, crate::frame::Kind::Data));
                sent += header.length as usize;
            }
        }
    }
    assert!(sent >= 12_000_000, "{sent} sent");
    let held = core.inner.data_capacity();
    assert!(held <= 1 << 20, "{held} bytes held");
}

/// A stream is closed on the wire once: its CloseStream goes out when the application closes
/// it, not again when its handles go; and after the peer's CloseStream, nothing more goes out
/// for it, whatever the application then shuts, closes or drops.
#[test]
fn a_stream_is_closed_on_the_wire_once() {
    use crate::frame::{Frame, Kind};
    let mut core = super::Core::new(
        crate::config::Role::Client,
        crate::config::Config::default(),
    );
    let (key, id) = core.open();
    core.sent();
    core.inner.close_stream(key);
    core.inner.close_stream(key);
    core.inner.release(key, true, true);
    assert_eq!(super::kinds(&core.sent()), vec![(id, Kind::CloseStream)]);
    type Close = fn(&mut super::Inner, usize);
    let closes: [(&str, Close); 4] = [
        ("shutdown", |inner, key| inner.shutdown(key)),
        ("close_read", |inner, key| inner.close_read(key)),
        ("close_stream", |inner, key| inner.close_stream(key)),
        ("release", |inner, key| inner.release(key, true, true)),
    ];
    for (what, close) in closes {
        let (key, id) = core.open();
        core.sent();
        core.frame(Frame::control(id, Kind::CloseStream))
            .expect("the peer's close");
        close(&mut core.inner, key);
        core.inner.release(key, true, true);
        assert_eq!(core.sent(), vec![], "{what} after the peer's CloseStream");
    }
}

/// Towards a peer of this crate, a stream of ours that goes before the peer said anything
/// about it keeps its place in the open backlog until the peer answers it, and an open that
/// gives up its place in line passes it on: with a backlog of one, the open behind it goes
/// once the first stream, gone, is answered.
#[test]
fn a_stream_gone_unacknowledged_keeps_its_place_until_answered_and_an_open_gone_from_the_line_passes_it_on(
) {
    use crate::frame::{Frame, Kind, GREETING_ID};
    let mut core = super::Core::new(
        crate::config::Role::Client,
        crate::config::Config::default().open_backlog(1),
    );
    core.frame(Frame::control(GREETING_ID, Kind::Keepalive))
        .expect("greeting");
    let (first, first_id) = core.open();
    let mut open = |line: &mut Option<usize>| {
        core.inner
            .poll_open(Waker::noop(), &mut None, line, true, &mut Vec::new())
    };
    let (mut second, mut third) = (None, None);
    assert!(open(&mut second).is_pending());
    assert!(open(&mut third).is_pending());
    // The second open goes away, and the first stream with it: unanswered, it holds its place.
    core.inner.open_line_gone(&mut second);
    core.inner.release(first, true, true);
    let mut open = |line: &mut Option<usize>| {
        core.inner
            .poll_open(Waker::noop(), &mut None, line, true, &mut Vec::new())
    };
    assert!(open(&mut third).is_pending(), "the peer has not answered");
    // The peer refuses it: the place is free, and the refusal is counted.
    core.frame(Frame::control(first_id, Kind::CloseStream))
        .expect("the refusal");
    assert_eq!(core.inner.stats().refused_by_peer, 1);
    let opened = core
        .inner
        .poll_open(Waker::noop(), &mut None, &mut third, true, &mut Vec::new());
    assert!(matches!(opened, Poll::Ready(Ok(_))), "{opened:?}");
}

/// A batch takes at most 4096 turns, which bounds its bookkeeping (an entry per turn): with
/// 5000 streams that each wrote a byte, the first batch carries 4096 of their frames, however
/// large its budget, and the next batch the rest.
#[test]
fn a_batch_takes_at_most_4096_turns() {
    let mut core = super::Core::new(
        crate::config::Role::Client,
        crate::config::Config::default(),
    );
    // A peer that did not greet: opens are not held for its acknowledgements.
    core.frame(crate::frame::Frame::control(
        0,
        crate::frame::Kind::Keepalive,
    ))
    .expect("keepalive");
    let streams: Vec<_> = (0..5000).map(|_| core.open()).collect();
    while !core.sent().is_empty() {}
    for &(key, _) in &streams {
        write(&mut core, key, 1);
    }
    let first = core.take_all(usize::MAX).1;
    assert_eq!(super::headers(&first).len(), 4096);
    let second = core.take_all(usize::MAX).1;
    assert_eq!(super::headers(&second).len(), 5000 - 4096);
}

/// A client core with a 4 KiB `write_buffer_size` and `N` streams of its own, each with 1 MiB
/// of credit: their keys and ids.
fn core_with_writers<const N: usize>() -> (super::Core, [(usize, u32); N]) {
    let mut core = super::Core::new(
        crate::config::Role::Client,
        crate::config::Config::default().write_buffer_size(4096),
    );
    let streams = [(); N].map(|()| core.open());
    for &(_, id) in &streams {
        core.frame(crate::frame::Frame::window_update(id, 1 << 20))
            .expect("credit");
    }
    core.sent();
    (core, streams)
}

/// Writers let in together after waiting for room each keep a share of it, and a frame they
/// write uses as much of their share as its size: a writer that never waited finds no room
/// while their shares last, and the shares are not used up faster than they are written.
#[test]
fn a_writer_let_in_uses_as_much_of_its_share_as_it_writes() {
    let (mut core, streams) = core_with_writers::<4>();
    let [a, b, c, d] = streams.map(|(key, _)| key);
    // D fills the queue in one frame; A and B then wait for room for 100 bytes each.
    let data = vec![5u8; 4096];
    assert!(core.inner.poll_write(d, Waker::noop(), &data).is_ready());
    for waiter in [a, b] {
        assert!(core
            .inner
            .poll_write(waiter, Waker::noop(), &data[..100])
            .is_pending());
    }
    // The queue is written: its room goes to A and B, half each.
    core.take_all(1 << 20);
    assert_eq!(core.inner.room_granted(a), 2048);
    assert_eq!(core.inner.room_granted(b), 2048);
    assert!(matches!(
        core.inner.poll_write(a, Waker::noop(), &data[..100]),
        Poll::Ready(Ok(100))
    ));
    // A used 108 bytes of its share (a header and its 100 bytes): the rest is still kept.
    assert_eq!(core.inner.room_granted(a), 2048 - 108);
    assert!(
        core.inner
            .poll_write(c, Waker::noop(), &data[..100])
            .is_pending(),
        "a writer that never waited took room kept for those let in"
    );
}

/// A turn's frames go to the batch as a slice of the queue's buffer, headers and all, at every
/// stream count: only the header of a cut frame's rest is written into the batch. Ten streams
/// with a frame of 60,000 bytes each, in 32 KiB turns, fill a batch with 20 slices and 10
/// headers.
#[test]
fn every_turn_goes_to_the_batch_without_a_copy() {
    let (mut core, streams) = streams_with_credit(10);
    for &(key, _) in &streams {
        write(&mut core, key, 60_000);
    }
    let mut data = crate::session::out_queue::OutQueue::new();
    core.take_into(1 << 20, &mut Vec::new(), &mut data, &mut Vec::new());
    assert!(data.len() >= 10 * 60_000, "{} bytes taken", data.len());
    assert!(
        data.copied() <= 10 * crate::frame::HEADER_LEN,
        "{} bytes copied into the batch",
        data.copied()
    );
    let frames = super::headers(&data.to_vec());
    let sent: u32 = frames.iter().map(|h| h.length).sum();
    assert_eq!(sent, 10 * 60_000);
}

/// A queue whose buffer a batch still holds a part of goes on in another buffer when it needs
/// more room, and the buffers come back into use once the batches holding them are written:
/// batch after batch, with one batch always in flight, the capacity held stays the same.
#[test]
fn a_queue_buffer_held_by_a_batch_is_used_again_once_written() {
    let (mut core, streams) = streams_with_credit(1);
    let (key, id) = streams[0];
    let mut wakers = Vec::new();
    let mut in_flight = None;
    let mut held = Vec::new();
    for round in 0..40 {
        write(&mut core, key, 40_000);
        let mut data = crate::session::out_queue::OutQueue::new();
        let batch = core.take_into(1 << 20, &mut Vec::new(), &mut data, &mut wakers);
        let frames = super::headers(&data.to_vec());
        assert_eq!(
            frames.iter().map(|h| (h.id, h.length)).collect::<Vec<_>>(),
            vec![(id, 40_000)],
            "round {round}"
        );
        // The batch before this one is written now, while this one is in flight.
        if let Some((end, control_end, before)) = in_flight.replace((
            batch.data_start + data.len() as u64,
            batch.control_end,
            data,
        )) {
            core.inner.written(end, control_end, 0, &mut wakers);
            drop::<crate::session::out_queue::OutQueue>(before);
        }
        held.push(core.inner.data_capacity());
    }
    let steady = &held[4..];
    assert!(
        steady.iter().all(|&h| h == steady[0]),
        "capacity held: {held:?}"
    );
    assert!(steady[0] <= 4 * 64 * 1024, "capacity held: {held:?}");
}

/// A stream that keeps its queue (its batches are not written yet) and alternates short
/// messages, which batches copy, with bulk, which goes as a slice of its buffer: every
/// frame goes out as written, batch after batch, and a spliced payload queued last still goes
/// in order. The queue's position counter (`taken`) grows by what each batch took, however it
/// took it: it positions the spliced payloads, and were it to grow faster it would overflow
/// within a few batches.
#[test]
fn a_long_lived_queue_hands_its_buffer_over_batch_after_batch() {
    let (mut core, streams) = streams_with_credit(1);
    let (key, id) = streams[0];
    let mut wakers = Vec::new();
    let mut take = |core: &mut super::Core| {
        let mut data = crate::session::out_queue::OutQueue::new();
        let batch = core.take_into(1 << 20, &mut Vec::new(), &mut data, &mut wakers);
        let bytes = data.to_vec();
        (
            batch.data_start + bytes.len() as u64,
            batch.control_end,
            super::headers(&bytes),
        )
    };
    for _ in 0..12 {
        // 108 bytes: less than [`SPLICE_MIN`], copied into the batch.
        write(&mut core, key, 100);
        let (_, _, frames) = take(&mut core);
        assert_eq!(
            frames.iter().map(|h| (h.id, h.length)).collect::<Vec<_>>(),
            vec![(id, 100)]
        );
        // A slice of the buffer.
        write(&mut core, key, 40_000);
        let (_, _, frames) = take(&mut core);
        assert_eq!(
            frames.iter().map(|h| (h.id, h.length)).collect::<Vec<_>>(),
            vec![(id, 40_000)]
        );
    }
    // Handed over whole, and then a payload spliced in behind copied bytes.
    write(&mut core, key, 100);
    write_chunk(&mut core, key, 40_000);
    let (data_end, control_end, frames) = take(&mut core);
    assert_eq!(
        frames.iter().map(|h| (h.id, h.length)).collect::<Vec<_>>(),
        vec![(id, 100), (id, 40_000)]
    );
    assert!(core.inner.poll_written(key, Waker::noop()).is_pending());
    core.inner
        .written(data_end, control_end, 0, &mut Vec::new());
    assert!(core.inner.poll_written(key, Waker::noop()).is_ready());
}

/// A writer waiting for room whose stream can no longer be written (the peer stopped reading
/// it) is let in with no room when the queue empties, and one let in whose write then fails
/// gives its room back: either way the room goes to writers that will use it, at once.
#[test]
fn a_writer_that_can_no_longer_write_holds_no_room() {
    for granted_first in [false, true] {
        let (mut core, streams) = core_with_writers::<3>();
        let [a, c, d] = streams.map(|(key, _)| key);
        let a_id = streams[0].1;
        let data = vec![5u8; 4096];
        // D fills the queue; A waits for room for a whole frame.
        assert!(core.inner.poll_write(d, Waker::noop(), &data).is_ready());
        assert!(core.inner.poll_write(a, Waker::noop(), &data).is_pending());
        let stop = crate::frame::Frame::control(a_id, crate::frame::Kind::CloseWrite);
        if granted_first {
            core.take_all(1 << 20);
            assert_eq!(core.inner.room_granted(a), 4096 + 8, "a is let in");
            core.frame(stop).expect("the peer stops reading a");
            assert!(matches!(
                core.inner.poll_write(a, Waker::noop(), &data),
                Poll::Ready(Err(crate::error::Error::PeerReadClosed))
            ));
        } else {
            core.frame(stop).expect("the peer stops reading a");
            core.take_all(1 << 20);
        }
        assert_eq!(
            core.inner.room_granted(a),
            0,
            "granted first: {granted_first}"
        );
        assert!(
            matches!(
                core.inner.poll_write(c, Waker::noop(), &data[..100]),
                Poll::Ready(Ok(100))
            ),
            "c found the room kept for a writer that cannot write (granted first: \
             {granted_first})"
        );
    }
}

/// A writer let in whose grant the driver voided before its task ran keeps its place: when it
/// comes back for room, it goes ahead of a writer that started to wait after it was let in.
#[test]
fn a_writer_whose_grant_was_voided_keeps_its_place_in_line() {
    let (mut core, streams) = core_with_writers::<4>();
    let [a, b, c, d] = streams.map(|(key, _)| key);
    let data = vec![5u8; 4096];
    // D fills the queue; A, then B wait for room for a whole frame each.
    assert!(core.inner.poll_write(d, Waker::noop(), &data).is_ready());
    assert!(core.inner.poll_write(a, Waker::noop(), &data).is_pending());
    assert!(core.inner.poll_write(b, Waker::noop(), &data).is_pending());
    core.take_all(1 << 20);
    assert!(core.inner.room_granted(a) > 0, "a is let in");
    // A's task is slow to run: the driver voids its grant and lets B in instead.
    let mut wakers = Vec::new();
    core.inner.void_room_grants();
    core.inner.wake_room(&mut wakers);
    assert!(core.inner.room_granted(b) > 0, "b is let in");
    // C starts to wait; then A's task runs and finds its grant gone; then B writes.
    assert!(core.inner.poll_write(c, Waker::noop(), &data).is_pending());
    assert!(core.inner.poll_write(a, Waker::noop(), &data).is_pending());
    assert!(core.inner.poll_write(b, Waker::noop(), &data).is_ready());
    core.take_all(1 << 20);
    assert!(
        core.inner.room_granted(a) > 0,
        "a, let in before, goes first"
    );
    assert_eq!(core.inner.room_granted(c), 0, "c waits behind a");
}
