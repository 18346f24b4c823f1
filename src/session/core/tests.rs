//! Unit tests of the core: frames in, frames out, with the time passed in, no runtime.

use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::recv_buf::Source;
use super::{Inner, Now};
use crate::config::{Config, Role};
use crate::error::{Error, ProtocolError};
use crate::frame::{Frame, Header, Kind, GREETING_ID, HEADER_LEN};
use crate::session::out_queue::OutQueue;

/// A core with a clock the test moves by hand.
struct Core {
    inner: Inner,
    now: Instant,
}

const SOURCE: Source = Source {
    generation: 0,
    capacity: 192 * 1024,
};

impl Core {
    fn new(role: Role, config: Config) -> Core {
        let now = Instant::now();
        let mut inner = Inner::new(role, config, now);
        // Every session greets first; the tests look at what follows.
        let mut greeting = Vec::new();
        inner.take_control(&Now::at(now), &mut greeting, &mut Vec::new());
        let header = Header::from_bytes(greeting[..].try_into().expect("one frame"));
        assert_eq!(
            header.map(|h| (h.id, h.kind)),
            Ok((GREETING_ID, Kind::Keepalive))
        );
        Core { inner, now }
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    fn open(&mut self) -> (usize, u32) {
        match self
            .inner
            .poll_open(Waker::noop(), &mut None, &mut None, true, &mut Vec::new())
        {
            Poll::Ready(Ok(opened)) => opened,
            _ => panic!("open did not complete"),
        }
    }

    fn frame(&mut self, frame: Frame) -> Result<(), Error> {
        self.inner
            .on_frame(frame, SOURCE, self.now, &mut Vec::new())
    }

    /// A server-side stream with id `id`, opened by the peer and accepted.
    fn accepted(&mut self, id: u32) -> usize {
        self.frame(Frame::control(id, Kind::OpenStream))
            .expect("valid open");
        let Poll::Ready(Ok((key, got))) = self.inner.poll_accept(Waker::noop(), &mut None) else {
            panic!("stream not accepted");
        };
        assert_eq!(got, id);
        key
    }

    fn read(&mut self, key: usize, max: usize) -> usize {
        let mut storage = vec![0u8; max];
        let mut buf = tokio::io::ReadBuf::new(&mut storage);
        assert!(self
            .inner
            .poll_read(key, Waker::noop(), &Now::at(self.now), &mut buf)
            .is_ready());
        buf.filled().len()
    }

    /// The driver takes a batch and the transport takes all of it: the headers, in the order
    /// written (payloads skipped).
    fn sent(&mut self) -> Vec<Header> {
        let (control, data) = self.take_all(usize::MAX);
        let mut bytes = control;
        bytes.extend_from_slice(&data);
        headers(&bytes)
    }

    /// The driver takes a batch of at most `budget` bytes of data into `control` and `data`,
    /// nothing of it written yet.
    fn take_into(
        &mut self,
        budget: usize,
        control: &mut Vec<u8>,
        data: &mut OutQueue,
        wakers: &mut Vec<Waker>,
    ) -> super::Batch {
        let mut starts = Default::default();
        self.inner.take_batch(
            &Now::at(self.now),
            budget,
            control,
            data,
            &mut starts,
            wakers,
        )
    }

    /// The driver takes a batch of at most `budget` bytes of data, and the transport takes all
    /// of it: its control part and its data part.
    fn take_all(&mut self, budget: usize) -> (Vec<u8>, Vec<u8>) {
        let (mut control, mut data) = (Vec::new(), OutQueue::new());
        let mut wakers = Vec::new();
        let batch = self.take_into(budget, &mut control, &mut data, &mut wakers);
        let data = data.to_vec();
        self.inner.written(
            batch.data_start + data.len() as u64,
            batch.control_end,
            (control.len() + data.len()) as u64,
            &mut wakers,
        );
        (control, data)
    }

    fn credit_sent(&mut self) -> u32 {
        self.sent()
            .iter()
            .filter(|h| h.kind == Kind::WindowUpdate)
            .map(|h| h.length)
            .sum()
    }
}

fn headers(mut rest: &[u8]) -> Vec<Header> {
    let mut headers = Vec::new();
    while rest.len() >= HEADER_LEN {
        let mut raw = [0; HEADER_LEN];
        raw.copy_from_slice(&rest[..HEADER_LEN]);
        let header = Header::from_bytes(raw).expect("valid kind");
        let payload = if header.kind == Kind::Data {
            header.length as usize
        } else {
            0
        };
        rest = &rest[HEADER_LEN + payload..];
        headers.push(header);
    }
    headers
}

fn kinds(headers: &[Header]) -> Vec<(u32, Kind)> {
    headers.iter().map(|h| (h.id, h.kind)).collect()
}

#[test]
fn ids_wrap_around_and_skip_live_ones() {
    let mut core = Core::new(Role::Client, Config::default());
    assert_eq!(core.open().1, 0);
    core.inner.next_id = u32::MAX - 1;
    assert_eq!(core.open().1, u32::MAX - 1);
    // 0 is still live, so the wrap lands on 2.
    assert_eq!(core.open().1, 2);
}

#[test]
fn server_ids_are_odd_and_peer_parity_is_checked() {
    let mut core = Core::new(Role::Server, Config::default());
    assert_eq!(core.open().1, 1);
    assert_eq!(core.open().1, 3);
    let err = core
        .frame(Frame::control(5, Kind::OpenStream))
        .expect_err("a server must not accept odd ids from its peer");
    assert!(matches!(
        err,
        Error::Protocol(ProtocolError::WrongParity { id: 5 })
    ));
}

#[test]
fn credit_is_returned_when_the_reader_empties_the_buffer() {
    let mut core = Core::new(Role::Server, Config::default());
    let key = core.accepted(0);
    core.frame(Frame::data(0, vec![7; 3000]))
        .expect("in credit");
    assert_eq!(core.read(key, 1000), 1000);
    assert!(
        core.sent().is_empty(),
        "no update while data is buffered and less than half a window is owed"
    );
    assert_eq!(core.read(key, 4000), 2000);
    assert_eq!(
        core.sent(),
        vec![Header {
            id: 0,
            length: 3000,
            kind: Kind::WindowUpdate
        }]
    );
}

#[test]
fn credit_waits_while_the_peer_holds_more_than_a_payload_and_less_than_half_is_owed() {
    let mut core = Core::new(Role::Server, Config::default().receive_window(1 << 20));
    let key = core.accepted(0);
    let announced = (1 << 20) - 65_536;
    assert_eq!(
        core.sent(),
        vec![Header {
            id: 0,
            length: announced,
            kind: Kind::WindowUpdate
        }]
    );
    core.frame(Frame::data(0, vec![7; 3000]))
        .expect("in credit");
    assert_eq!(core.read(key, 4000), 3000);
    assert!(
        core.sent().is_empty(),
        "the peer still holds nearly the whole window: no update for a drained buffer"
    );
}

#[test]
fn writes_never_exceed_credit_and_use_partial_credit() {
    let mut core = Core::new(Role::Client, Config::default());
    let (key, id) = core.open();
    let data = vec![1u8; 100_000];
    let Poll::Ready(Ok(first)) = core.inner.poll_write(key, Waker::noop(), &data) else {
        panic!("first write blocked");
    };
    assert_eq!(first, 65_536);
    assert!(core
        .inner
        .poll_write(key, Waker::noop(), &data)
        .is_pending());
    core.frame(Frame::window_update(id, 10))
        .expect("valid update");
    let Poll::Ready(Ok(second)) = core.inner.poll_write(key, Waker::noop(), &data) else {
        panic!("write with credit blocked");
    };
    assert_eq!(second, 10, "a partial frame uses whatever credit there is");
    let data_lengths: Vec<u32> = core
        .sent()
        .iter()
        .filter(|h| h.kind == Kind::Data)
        .map(|h| h.length)
        .collect();
    assert_eq!(data_lengths, vec![65_536, 10]);
}

#[test]
fn inbound_streams_beyond_the_backlog_are_refused() {
    let mut core = Core::new(Role::Server, Config::default().accept_backlog(1));
    for id in [0, 2, 4] {
        core.frame(Frame::control(id, Kind::OpenStream))
            .expect("valid open");
    }
    let refused: Vec<u32> = core
        .sent()
        .into_iter()
        .filter(|h| h.kind == Kind::CloseStream)
        .map(|h| h.id)
        .collect();
    assert_eq!(refused, vec![2, 4]);
    assert_eq!(core.inner.stream_count(), 1);
}

#[test]
fn dropping_the_last_handle_sends_close_stream_after_the_data() {
    let mut core = Core::new(Role::Client, Config::default());
    let (key, id) = core.open();
    assert!(core.inner.poll_write(key, Waker::noop(), b"bye").is_ready());
    core.inner.release(key, true, true);
    assert_eq!(
        kinds(&core.sent()),
        vec![
            (id, Kind::OpenStream),
            (id, Kind::Data),
            (id, Kind::CloseStream)
        ]
    );
    assert_eq!(core.inner.stream_count(), 0);
    // Frames racing with the close are ignored.
    core.frame(Frame::data(id, &b"late"[..])).expect("ignored");
}

/// Control frames go ahead of the data queued before them: a side whose writers keep the data
/// queue full still returns credit, and refuses streams, at every batch.
#[test]
fn control_frames_go_out_ahead_of_queued_data() {
    let config = Config::default().write_buffer_size(1024);
    let mut core = Core::new(Role::Server, config);
    let inbound = core.accepted(0);
    let (outbound, out_id) = core.open();
    // The writer fills the data queue past its size.
    assert!(core
        .inner
        .poll_write(outbound, Waker::noop(), &[1; 4096])
        .is_ready());
    assert!(!core.inner.data_has_room());
    // The peer sends, the application reads, and a refused open arrives.
    core.frame(Frame::data(0, vec![2; 40_000]))
        .expect("in credit");
    assert_eq!(core.read(inbound, 40_000), 40_000);
    std::sync::Arc::make_mut(&mut core.inner.config).accept_backlog = 0;
    core.frame(Frame::control(2, Kind::OpenStream))
        .expect("refused, not an error");
    assert_eq!(
        kinds(&core.sent()),
        vec![
            // Queued in the control queue when the stream was opened, before the others.
            (out_id, Kind::OpenStream),
            (0, Kind::WindowUpdate),
            (2, Kind::CloseStream),
            (out_id, Kind::Data),
        ]
    );
}

/// A close that would overtake the stream's data waits behind it; one for a stream with
/// nothing unwritten goes with the control frames.
#[test]
fn closes_follow_their_data_and_otherwise_go_at_once() {
    let mut core = Core::new(Role::Client, Config::default());
    let (a, a_id) = core.open();
    let (b, b_id) = core.open();
    core.sent();
    assert!(core.inner.poll_write(a, Waker::noop(), b"data").is_ready());
    core.inner.shutdown(a);
    core.inner.shutdown(b);
    core.inner.close_read(a);
    assert_eq!(
        kinds(&core.sent()),
        vec![
            (b_id, Kind::CloseRead),
            (a_id, Kind::Data),
            (a_id, Kind::CloseRead),
            (a_id, Kind::CloseWrite),
        ]
    );
}

/// A stream counts as written once its own bytes are, whatever other streams queued: the
/// driver reports progress after every transport write.
#[test]
fn a_stream_is_written_once_its_own_bytes_are() {
    let mut core = Core::new(Role::Client, Config::default());
    let (a, _) = core.open();
    let (b, _) = core.open();
    core.sent();
    assert!(core
        .inner
        .poll_write(a, Waker::noop(), &[1; 100])
        .is_ready());
    let (mut control, mut data) = (Vec::new(), OutQueue::new());
    let batch = core.take_into(usize::MAX, &mut control, &mut data, &mut Vec::new());
    // B writes behind A's batch, and A closes.
    assert!(core
        .inner
        .poll_write(b, Waker::noop(), &[2; 100])
        .is_ready());
    core.inner.close_stream(a);
    assert!(core.inner.poll_written(a, Waker::noop()).is_pending());
    // The transport takes A's batch: A's data is written, its close (control) is not yet.
    let mut wakers = Vec::new();
    let end = batch.data_start + data.len() as u64;
    core.inner.written(end, batch.control_end, 0, &mut wakers);
    // A's close was queued while its data was unwritten: it follows in the data queue.
    assert!(core.inner.poll_written(a, Waker::noop()).is_pending());
    let headers = kinds(&core.sent());
    assert_eq!(headers.last().map(|h| h.1), Some(Kind::CloseStream));
    assert!(core.inner.poll_written(a, Waker::noop()).is_ready());
}

/// Re-polling a waiting writer, flush or open replaces its registration; nothing accumulates.
#[test]
fn waiting_futures_hold_one_entry_each() {
    let config = Config::default().write_buffer_size(16);
    let mut core = Core::new(Role::Client, config);
    let (key, id) = core.open();
    assert!(core
        .inner
        .poll_write(key, Waker::noop(), &[0; 64])
        .is_ready());
    let mut slot = None;
    for _ in 0..1000 {
        assert!(core
            .inner
            .poll_write(key, Waker::noop(), &[0; 64])
            .is_pending());
        core.frame(Frame::window_update(id, 0)).expect("valid");
        assert!(core.inner.poll_written(key, Waker::noop()).is_pending());
        assert!(core
            .inner
            .poll_open(Waker::noop(), &mut slot, &mut None, true, &mut Vec::new())
            .is_pending());
    }
    assert_eq!(core.inner.waiting_entries(), (2, 1));
    core.inner.opener_gone(&mut slot);
}

#[test]
fn the_control_queue_past_its_bound_stops_reading() {
    let config = Config::default().accept_backlog(1).max_streams(4);
    let mut core = Core::new(Role::Server, config);
    let limit = core.inner.control_limit();
    for i in 0..limit as u32 + 2 {
        core.frame(Frame::control(2 * i, Kind::OpenStream))
            .expect("valid open");
    }
    assert!(core.inner.control_over_limit());
    core.sent();
    assert!(!core.inner.control_over_limit());
}

const RTT: Duration = Duration::from_millis(10);

/// Round 1 of every tuning case: the peer spends its whole initial window, the reader empties
/// the buffer at once, the credit is written to a sender that had none, and one round trip
/// passes. Returns the stream's key.
fn first_round(core: &mut Core) -> usize {
    let key = core.accepted(0);
    core.frame(Frame::data(0, vec![7; 65_536]))
        .expect("in credit");
    assert_eq!(core.read(key, 1 << 20), 65_536);
    assert_eq!(core.credit_sent(), 65_536);
    core.advance(RTT);
    key
}

#[test]
fn a_window_that_limits_a_fast_reader_doubles() {
    let mut core = Core::new(Role::Server, Config::default());
    let key = first_round(&mut core);
    // Round 2: the answer to credit given to a sender that had none measures the round trip;
    // half the window arrived well within it, and the reader drains it at once.
    core.frame(Frame::data(0, vec![7; 65_536]))
        .expect("in credit");
    assert_eq!(core.read(key, 1 << 20), 65_536);
    assert_eq!(
        core.credit_sent(),
        2 * 65_536,
        "the consumed 64 KiB plus 64 KiB of new window"
    );
    assert_eq!(
        core.inner.window_budget,
        Config::default().receive_window_budget_setting() - 65_536
    );
    // Closing the stream gives the growth back to the session.
    core.inner.release(key, true, true);
    assert_eq!(
        core.inner.window_budget,
        Config::default().receive_window_budget_setting()
    );
}

#[test]
fn a_window_that_is_not_the_limit_stays() {
    let mut core = Core::new(Role::Server, Config::default());
    let key = first_round(&mut core);
    // The link (or the sender) delivers half a window per round trip: slower than the window
    // allows, so a bigger one would not help.
    for _ in 0..8 {
        core.frame(Frame::data(0, vec![7; 16_384]))
            .expect("in credit");
        core.advance(RTT);
        core.frame(Frame::data(0, vec![7; 16_384]))
            .expect("in credit");
        assert_eq!(core.read(key, 1 << 20), 32_768);
        assert_eq!(core.credit_sent(), 32_768);
        core.advance(RTT);
    }
    assert_eq!(
        core.inner.window_budget,
        Config::default().receive_window_budget_setting()
    );
}

/// A Go sender sends a whole window in one frame whenever it has the credit: into an empty
/// buffer. A reader that drains it slowly keeps its window.
#[test]
fn a_slow_reader_keeps_its_window_and_the_budget_caps_growth() {
    let config = Config::default().receive_window_budget(65_536 + 1000);
    let mut core = Core::new(Role::Server, config);
    let key = first_round(&mut core);
    for _ in 0..3 {
        core.frame(Frame::data(0, vec![7; 65_536]))
            .expect("in credit");
        // A little at a time, over ten round trips.
        for _ in 0..16 {
            assert_eq!(core.read(key, 4096), 4096);
            core.advance(RTT);
        }
        assert_eq!(core.credit_sent(), 65_536, "the window stays at 64 KiB");
        core.advance(RTT);
    }
    assert_eq!(core.inner.window_budget, 65_536 + 1000);
    // Now the reader keeps up: the window grows, by no more than the budget has left.
    core.frame(Frame::data(0, vec![7; 65_536]))
        .expect("in credit");
    assert_eq!(core.read(key, 1 << 20), 65_536);
    assert_eq!(core.credit_sent(), 2 * 65_536);
    assert_eq!(core.inner.window_budget, 1000);
    core.advance(RTT);
    for _ in 0..2 {
        core.frame(Frame::data(0, vec![7; 65_536]))
            .expect("in credit");
    }
    assert_eq!(core.read(key, 1 << 20), 2 * 65_536);
    assert_eq!(core.credit_sent(), 2 * 65_536 + 1000);
    assert_eq!(core.inner.window_budget, 0);
}

#[test]
fn large_unread_payloads_are_copied_out_when_their_buffers_cost_too_much() {
    let mut core = Core::new(Role::Server, Config::default());
    let mut keys = Vec::new();
    for i in 0..64u32 {
        keys.push(core.accepted(2 * i));
        let source = Source {
            generation: i,
            capacity: 192 * 1024,
        };
        core.inner
            .on_frame(
                Frame::data(2 * i, Bytes::from(vec![i as u8; 16 * 1024])),
                source,
                core.now,
                &mut Vec::new(),
            )
            .expect("in credit");
        let buffered = core.inner.stats.buffered;
        assert!(
            core.inner.pinned() as u64 <= 2 * buffered + super::recv_buf::PIN_FLOOR as u64,
            "pinned {} for {} buffered",
            core.inner.pinned(),
            buffered
        );
    }
    for (i, key) in keys.into_iter().enumerate() {
        let mut storage = vec![0u8; 32 * 1024];
        let mut buf = tokio::io::ReadBuf::new(&mut storage);
        assert!(core
            .inner
            .poll_read(key, Waker::noop(), &Now::at(core.now), &mut buf)
            .is_ready());
        assert_eq!(buf.filled(), &vec![i as u8; 16 * 1024][..]);
    }
}

/// The round-trip probe starts when the driver writes the credit, not when it was queued:
/// time the credit spent behind this side's own queue is no part of the round trip.
#[test]
fn the_round_trip_probe_starts_when_the_credit_is_written() {
    let mut core = Core::new(Role::Server, Config::default());
    let key = core.accepted(0);
    core.frame(Frame::data(0, vec![7; 65_536]))
        .expect("in credit");
    assert_eq!(core.read(key, 1 << 20), 65_536, "the credit is queued now");
    core.advance(Duration::from_millis(50));
    assert_eq!(core.credit_sent(), 65_536, "and written 50 ms later");
    core.advance(Duration::from_millis(10));
    core.frame(Frame::data(0, vec![7; 100])).expect("in credit");
    assert_eq!(core.inner.min_rtt.get(), Some(10_000));
}

/// Frame starts are recorded at most 16 KiB apart, so that control waits behind little data
/// while a batch is written, and a batch of many small frames records few of them.
#[test]
fn frame_starts_are_recorded_sparsely() {
    let mut core = Core::new(Role::Client, Config::default());
    let (key, _) = core.open();
    for _ in 0..64 {
        assert!(core
            .inner
            .poll_write(key, Waker::noop(), &[0; 1000])
            .is_ready());
    }
    let (mut control, mut data, mut starts) = (
        Vec::new(),
        OutQueue::new(),
        std::collections::VecDeque::new(),
    );
    let batch = core.inner.take_batch(
        &Now::at(core.now),
        usize::MAX,
        &mut control,
        &mut data,
        &mut starts,
        &mut Vec::new(),
    );
    let frame = (HEADER_LEN + 1000) as u64;
    // Frames of 1008 bytes (the OpenStream is a control frame): a start every 17 frames.
    let expected: Vec<u64> = (1..=3).map(|i| batch.data_start + 17 * i * frame).collect();
    assert_eq!(Vec::from(starts), expected);
}

/// Nothing about a stream reaches the peer before the stream does. Its OpenStream, and the
/// announcement of a larger window right behind it, go in the control queue when it opens;
/// its closes follow them in that queue, or its data in the send queue, which comes after the
/// control frames taken with it.
#[test]
fn nothing_overtakes_an_unwritten_open() {
    let mut core = Core::new(Role::Client, Config::default().receive_window(1 << 20));
    let (key, id) = core.open();
    core.inner.close_read(key);
    core.inner.shutdown(key);
    assert_eq!(
        kinds(&core.sent()),
        vec![
            (id, Kind::OpenStream),
            (id, Kind::WindowUpdate),
            (id, Kind::CloseWrite),
            (id, Kind::CloseRead)
        ]
    );

    let (key, id) = core.open();
    let (mut control, mut data) = (Vec::new(), OutQueue::new());
    let batch = core.take_into(usize::MAX, &mut control, &mut data, &mut Vec::new());
    assert_eq!(
        kinds(&headers(&control)),
        vec![(id, Kind::OpenStream), (id, Kind::WindowUpdate)]
    );
    // The batch is not written yet: the stream's data and closes come after it.
    write(&mut core, key, 4);
    core.inner.close_read(key);
    core.inner.shutdown(key);
    core.inner
        .written(batch.data_start, batch.control_end, 0, &mut Vec::new());
    assert_eq!(
        kinds(&core.sent()),
        vec![
            (id, Kind::Data),
            (id, Kind::CloseWrite),
            (id, Kind::CloseRead)
        ]
    );
}

/// An open while the control queue holds `OPENS_IN_CONTROL` entries (a transport that takes
/// nothing), or while data of the send queues is unwritten, waits in the stream's send queue,
/// where it takes room, and where no later open overtakes it.
#[test]
fn an_open_behind_a_full_control_queue_or_unwritten_data_goes_in_its_send_queue() {
    let mut core = Core::new(Role::Client, Config::default());
    for _ in 0..super::outgoing::control::OPENS_IN_CONTROL {
        core.inner.queue_keepalive();
    }
    let control = core.inner.control_len();
    let (_, id) = core.open();
    assert_eq!(
        core.inner.control_len(),
        control,
        "not in the control queue"
    );
    let sent = kinds(&core.sent());
    assert_eq!(
        sent.last(),
        Some(&(id, Kind::OpenStream)),
        "behind the control frames"
    );

    let (key, first) = core.open();
    write(&mut core, key, 4);
    let (_, second) = core.open();
    assert_eq!(core.inner.control_len(), 1, "only the first open");
    assert_eq!(
        kinds(&core.sent()),
        vec![
            (first, Kind::OpenStream),
            (first, Kind::Data),
            (second, Kind::OpenStream)
        ]
    );
}

/// What an idle stream costs is mostly this struct (`examples/many_streams.rs` measures the
/// whole, about 280 bytes per stream end): a field added here costs every stream.
#[test]
fn stream_state_stays_small() {
    let size = std::mem::size_of::<super::stream_state::StreamState>();
    assert!(size <= 168, "StreamState takes {size} bytes");
}

/// The data queue's bound in the `Config` docs: writers let in together, each with a share of
/// the room, and writers that never waited, stay within `write_buffer_size + max_payload + 8`
/// bytes of data (closes aside), however many write at once.
#[test]
fn writers_let_in_together_stay_within_the_queue_size() {
    for writers in [2, 3, 5, 40] {
        writers_within_the_queue_size(writers);
    }
}

fn writers_within_the_queue_size(writers: usize) {
    let config = Config::default().write_buffer_size(256 * 1024);
    let bound = 256 * 1024 + 65_536 + HEADER_LEN;
    let mut core = Core::new(Role::Client, config);
    let streams: Vec<(usize, u32)> = (0..writers).map(|_| core.open()).collect();
    for &(_, id) in &streams {
        core.frame(Frame::window_update(id, (1 << 24) - 1))
            .expect("credit");
    }
    let data = vec![7u8; 1 << 20];
    for _ in 0..20 {
        // Every writer writes as much as it is let; a batch is taken between rounds.
        for &(key, _) in &streams {
            while let Poll::Ready(Ok(n)) = core.inner.poll_write(key, Waker::noop(), &data) {
                assert!(n > 0);
                assert!(
                    core.inner.data_len() <= bound,
                    "{} bytes queued by {writers} writers, bound {bound}",
                    core.inner.data_len()
                );
            }
        }
        core.sent();
    }
}

/// A waker that records whether it was woken.
struct WokenFlag(std::sync::atomic::AtomicBool);

impl std::task::Wake for WokenFlag {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_window_update_wakes_a_writer_waiting_for_credit() {
    let mut core = Core::new(Role::Client, Config::default());
    let (key, id) = core.open();
    let data = vec![1u8; 100_000];
    assert!(matches!(
        core.inner.poll_write(key, Waker::noop(), &data),
        Poll::Ready(Ok(65_536))
    ));
    let flag = std::sync::Arc::new(WokenFlag(false.into()));
    let waker = Waker::from(std::sync::Arc::clone(&flag));
    assert!(core.inner.poll_write(key, &waker, &data).is_pending());
    let mut update = |credit: u32| {
        let mut wakers = Vec::new();
        core.inner
            .on_frame(
                Frame::window_update(id, credit),
                SOURCE,
                core.now,
                &mut wakers,
            )
            .expect("valid update");
        wakers.into_iter().for_each(Waker::wake);
        flag.0.load(std::sync::atomic::Ordering::SeqCst)
    };
    assert!(!update(0), "no credit: the writer sleeps on");
    assert!(update(10), "credit: the writer is woken");
    let Poll::Ready(Ok(written)) = core.inner.poll_write(key, Waker::noop(), &data) else {
        panic!("the woken writer found no credit");
    };
    assert_eq!(written, 10);
}

#[test]
fn a_burst_grows_the_window_only_if_a_read_leaves_at_most_a_quarter_of_it() {
    let budget = Config::default().receive_window_budget_setting();
    for (left, grows) in [(16_385, false), (16_384, true)] {
        let mut core = Core::new(Role::Server, Config::default());
        let key = first_round(&mut core);
        // Half a window or more within the round trip, into an empty buffer: the window may be
        // the limit, if the reader keeps the buffer low.
        core.frame(Frame::data(0, vec![7; 65_536]))
            .expect("in credit");
        assert_eq!(core.read(key, 65_536 - left), 65_536 - left);
        assert_eq!(
            core.inner.window_budget < budget,
            grows,
            "{left} bytes left in a 64 KiB window"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The scheduler: per-stream queues, round robin, priorities.

/// The driver takes a batch of at most `budget` bytes of data and the transport takes it all:
/// the Data frames in it, as (stream id, payload length).
fn data_frames(core: &mut Core, budget: usize) -> Vec<(u32, u32)> {
    let (_, data) = core.take_all(budget);
    headers(&data)
        .into_iter()
        .filter(|h| h.kind == Kind::Data)
        .map(|h| (h.id, h.length))
        .collect()
}

/// A core with `n` streams opened (their opens sent) and credit to send 16 MiB each.
fn streams_with_credit(n: usize) -> (Core, Vec<(usize, u32)>) {
    let mut core = Core::new(Role::Client, Config::default().write_buffer_size(64 << 20));
    let streams: Vec<_> = (0..n).map(|_| core.open()).collect();
    for &(_, id) in &streams {
        core.frame(Frame::window_update(id, (1 << 24) - 1))
            .expect("credit");
    }
    core.sent();
    (core, streams)
}

fn write(core: &mut Core, key: usize, bytes: usize) {
    let data = vec![7u8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        match core
            .inner
            .poll_write(key, Waker::noop(), &data[..left.min(data.len())])
        {
            Poll::Ready(Ok(n)) => left -= n,
            other => panic!("write did not go in: {other:?}"),
        }
    }
}

/// A message queued behind another stream's bulk goes out in the next batch, ahead of more of
/// the bulk: the bulk stream had the last batch to itself, and that was its turn. In a batch
/// where both have data, the message waits for one turn of the bulk at most.
#[test]
fn a_small_message_waits_for_one_turn_of_bulk_at_most() {
    let (mut core, streams) = streams_with_credit(2);
    let ((bulk, bulk_id), (ping, ping_id)) = (streams[0], streams[1]);
    write(&mut core, bulk, 4 << 20);
    // The bulk stream is alone: the batch holds whole frames, as written.
    assert_eq!(
        data_frames(&mut core, 4 * (65_536 + 8)),
        vec![(bulk_id, 65_536); 4]
    );
    write(&mut core, ping, 64);
    let next = data_frames(&mut core, 256 * 1024);
    assert_eq!(next.first(), Some(&(ping_id, 64)), "{next:?}");
    // Both have data: the message of the next round waits for one turn of the bulk at most.
    write(&mut core, ping, 64);
    let next = data_frames(&mut core, 256 * 1024);
    let ping_at = next.iter().position(|&(id, _)| id == ping_id);
    let before: u32 = next[..ping_at.expect("the message is in the next batch")]
        .iter()
        .map(|&(_, len)| len)
        .sum();
    assert!(
        before as usize <= super::send_queue::QUANTUM,
        "{before} bytes of bulk went ahead of it"
    );
}

/// Streams of equal priority with data queued share each batch evenly.
#[test]
fn streams_of_equal_priority_take_turns() {
    let (mut core, streams) = streams_with_credit(8);
    for &(key, _) in &streams {
        write(&mut core, key, 2 << 20);
    }
    let mut sent = std::collections::HashMap::<u32, u64>::new();
    for _ in 0..16 {
        for (id, len) in data_frames(&mut core, 256 * 1024) {
            *sent.entry(id).or_default() += u64::from(len);
        }
    }
    let total: u64 = sent.values().sum();
    assert!(total >= 16 * 200 * 1024, "batches carried {total} bytes");
    let (min, max) = (sent.values().min().copied(), sent.values().max().copied());
    assert_eq!(sent.len(), 8, "every stream sent: {sent:?}");
    let (min, max) = (min.unwrap_or(0), max.unwrap_or(0));
    assert!(
        max - min <= super::send_queue::QUANTUM as u64 + 8,
        "shares from {min} to {max}: {sent:?}"
    );
}

/// A stream of higher priority goes first; the lower one sends only what the higher leaves.
#[test]
fn a_higher_priority_goes_first() {
    let (mut core, streams) = streams_with_credit(2);
    let ((low, low_id), (high, high_id)) = (streams[0], streams[1]);
    write(&mut core, low, 1 << 20);
    write(&mut core, high, 300 * 1024);
    core.inner.set_priority(high, 10);
    assert_eq!(core.inner.priority(high), 10);
    let first = data_frames(&mut core, 256 * 1024);
    assert!(first.iter().all(|&(id, _)| id == high_id), "{first:?}");
    let second = data_frames(&mut core, 256 * 1024);
    // The rest of the high stream, then the low one with what is left of the batch.
    assert_eq!(second.first().map(|f| f.0), Some(high_id));
    assert_eq!(second.last().map(|f| f.0), Some(low_id));
    let high_sent: u32 = first
        .iter()
        .chain(&second)
        .filter(|f| f.0 == high_id)
        .map(|f| f.1)
        .sum();
    assert_eq!(high_sent, 300 * 1024);
}

/// A frame larger than a turn is cut: its parts carry the payload in order, and the stream's
/// bytes count as written only once the last part is.
#[test]
fn frames_are_cut_to_the_turn_and_the_stream_is_written_after_the_last_part() {
    let (mut core, streams) = streams_with_credit(2);
    let ((a, a_id), (b, b_id)) = (streams[0], streams[1]);
    write(&mut core, a, 65_536);
    write(&mut core, b, 65_536);
    let mut parts = Vec::new();
    while parts
        .iter()
        .filter(|f: &&(u32, u32)| f.0 == a_id)
        .map(|f| f.1)
        .sum::<u32>()
        < 65_536
    {
        assert!(core.inner.poll_written(a, Waker::noop()).is_pending());
        let batch = data_frames(&mut core, 20_000);
        assert!(!batch.is_empty());
        parts.extend(batch);
    }
    assert!(core.inner.poll_written(a, Waker::noop()).is_ready());
    assert!(parts.iter().any(|f| f.0 == b_id), "b had turns meanwhile");
    assert!(parts
        .iter()
        .all(|f| f.1 as usize <= super::send_queue::QUANTUM));
}

mod send_path;

mod recv_path;

/// A stream whose close went out through the control queue long ago counts as written however
/// many control frames follow: 2^31 of them (the positions compare wrapping, in 32 bits) do not
/// turn it back to unwritten, which would leave a flush of it waiting for 2^31 more.
#[test]
fn a_close_written_long_ago_stays_written() {
    let mut core = Core::new(Role::Client, Config::default());
    let (key, _) = core.open();
    let (mut control, mut data) = (Vec::new(), OutQueue::new());
    let batch = core.take_into(usize::MAX, &mut control, &mut data, &mut Vec::new());
    let written = batch.data_start + data.len() as u64;
    core.inner
        .written(written, batch.control_end, 0, &mut Vec::new());
    // Nothing of it is unwritten: its close goes in the control queue.
    core.inner.shutdown(key);
    let mut control = Vec::new();
    let end = core
        .inner
        .take_control(&Now::at(core.now), &mut control, &mut Vec::new());
    assert_eq!(control.len(), 8, "the CloseWrite");
    core.inner.written(written, end, 8, &mut Vec::new());
    assert!(core.inner.is_written(key));
    // 2^31 control frames later, written in steps of 2^20.
    for _ in 0..1 << 11 {
        let pushed = core.inner.out.pass_control(1 << 20);
        core.inner.written(written, pushed, 0, &mut Vec::new());
    }
    assert!(
        core.inner.is_written(key),
        "the close written 2^31 control frames ago is still written"
    );
}

/// A write of 4 bytes on `key` as a spawned session's writer makes it: written by the writer
/// itself when the core lets it (the transport then takes the whole of it), otherwise queued.
/// Returns whether the writer wrote it.
fn written_directly(core: &mut Core, key: usize) -> bool {
    let payload = [9u8; 4];
    let mut wakers = Vec::new();
    let Poll::Ready(Ok(admitted)) = core.inner.poll_write_admit(
        key,
        Waker::noop(),
        &payload,
        Some(&Now::at(core.now)),
        &mut wakers,
    ) else {
        panic!("the write was not admitted");
    };
    assert_eq!(admitted.n, payload.len());
    let Some(batch) = admitted.direct else {
        return false;
    };
    let outcome = crate::session::direct::Direct {
        written: batch.control.len() + HEADER_LEN + payload.len(),
        unflushed: false,
    };
    core.inner
        .direct_done(key, admitted.header, &payload, batch, outcome, &mut wakers);
    true
}

/// A writer writes its frame itself only when it goes alone, as one message of a quiet
/// session. Not while another stream's frames wait in the control queue (the driver was woken
/// for them, and writes the frame with them); not a second time before the driver has run
/// since the first (a burst of writers is the driver's to batch); not while the driver lets
/// the writers run before it takes its batch. Each time the frame is queued instead, and goes
/// in the driver's next batch.
#[test]
fn a_direct_write_goes_alone_and_a_burst_is_left_to_the_driver() {
    let (mut core, streams) = streams_with_credit(2);
    let ((a, a_id), (b, b_id)) = (streams[0], streams[1]);
    core.sent();
    let data_of = |headers: Vec<Header>| -> Vec<u32> {
        headers
            .iter()
            .filter(|h| h.kind == Kind::Data)
            .map(|h| h.id)
            .collect()
    };

    assert!(written_directly(&mut core, a), "a quiet session");
    assert!(
        !written_directly(&mut core, b),
        "a second writer before the driver ran"
    );
    assert_eq!(data_of(core.sent()), vec![b_id]);
    core.inner.set_driver_waker(Waker::noop(), false);
    assert!(written_directly(&mut core, a), "the driver has run since");

    core.inner.set_driver_waker(Waker::noop(), false);
    core.inner.shutdown(b);
    assert!(
        !written_directly(&mut core, a),
        "another stream's close waits in the control queue"
    );
    assert_eq!(
        kinds(&core.sent()),
        vec![(b_id, Kind::CloseRead), (a_id, Kind::Data)]
    );

    // The driver yields once, while little is queued; the writers that run meanwhile queue.
    core.inner.set_driver_waker(Waker::noop(), false);
    write(&mut core, a, 100);
    assert!(
        core.inner.yield_to_writers(),
        "a small batch waits for the writers"
    );
    assert!(core.inner.yielded_to_writers());
    assert!(
        !written_directly(&mut core, a),
        "the driver yielded to the writers"
    );
    assert!(!core.inner.yield_to_writers(), "once");
    assert_eq!(data_of(core.sent()), vec![a_id, a_id]);
    assert!(!core.inner.yielded_to_writers(), "the batch was taken");
    write(&mut core, a, super::outgoing::batch::COALESCE_BELOW);
    assert!(
        !core.inner.yield_to_writers(),
        "a batch of {} bytes or more is taken at once",
        super::outgoing::batch::COALESCE_BELOW
    );
}
