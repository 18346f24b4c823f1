//! More unit tests of the receive path: what arrives, as the application and the session's
//! figures see it (found by mutation testing, `scripts/mutants.sh --part core`).

use std::task::{Poll, Waker};

use crate::config::{Config, Role};
use crate::error::Error;
use crate::frame::{Frame, Kind, GREETING_ID};
use crate::stopped::Stopped;

use super::{kinds, Core, Now};

/// The greeting a peer of this crate sends first (no keepalives).
fn greeting() -> Frame {
    Frame::control(GREETING_ID, Kind::Keepalive)
}

/// A peer's keepalives count up to `u32::MAX` and stop there (the `Stats` docs), however many
/// more it sends: the count never wraps to a small number, and the frames are still taken.
#[test]
fn the_keepalive_count_stops_at_its_largest_value() {
    let mut core = Core::new(Role::Server, Config::default());
    core.frame(greeting()).expect("greeting");
    core.inner.stats.keepalives_received = u32::MAX - 1;
    for _ in 0..3 {
        core.frame(Frame::control(0, Kind::Keepalive))
            .expect("keepalive");
    }
    let stats = core.inner.stats();
    assert_eq!(stats.keepalives_received, u64::from(u32::MAX));
    assert_eq!(stats.frames_received, 4);
}

/// The session's receive counters count what arrived: frames and their bytes, keepalives,
/// streams accepted and refused.
#[test]
fn the_receive_counters_count_what_arrived() {
    let mut core = Core::new(Role::Server, Config::default().accept_backlog(1));
    core.frame(greeting()).expect("greeting");
    let key = core.accepted(0);
    core.frame(Frame::data(0, vec![7; 1000])).expect("data");
    core.frame(Frame::control(0, Kind::Keepalive))
        .expect("keepalive");
    core.frame(Frame::control(0, Kind::Keepalive))
        .expect("keepalive");
    core.frame(Frame::control(2, Kind::OpenStream))
        .expect("open");
    core.frame(Frame::control(4, Kind::OpenStream))
        .expect("open, refused");
    let stats = core.inner.stats();
    // The greeting, OpenStream, Data, two keepalives, two OpenStreams.
    assert_eq!(stats.frames_received, 7);
    assert_eq!(stats.bytes_received, 7 * 8 + 1000);
    assert_eq!(stats.keepalives_received, 3);
    assert_eq!(stats.streams_accepted, 2);
    assert_eq!(stats.streams_refused, 1);
    assert_eq!(stats.buffered, 1000);
    assert_eq!(core.inner.buffered(key), 1000);
    assert_eq!(core.read(key, 600), 600);
    assert_eq!(core.inner.buffered(key), 400);
    assert_eq!(core.inner.stats().buffered, 400);
    assert_eq!(core.inner.stats().peak_buffered, 1000);
}

/// Towards a peer of this crate, which acknowledges every stream it accepts, a stream it
/// closes before saying anything else was refused: writes fail with `Refused`, and the session
/// counts it. Towards a peer that did not greet (a Go peer), that is an ordinary close.
#[test]
fn a_stream_closed_unacknowledged_is_refused_only_by_a_greeting_peer() {
    for greeted in [true, false] {
        let mut core = Core::new(Role::Client, Config::default());
        let first = if greeted {
            greeting()
        } else {
            Frame::control(0, Kind::Keepalive)
        };
        core.frame(first).expect("first frame");
        let (key, id) = core.open();
        let (other, other_id) = core.open();
        core.frame(Frame::window_update(other_id, 0))
            .expect("acknowledgement");
        core.frame(Frame::control(id, Kind::CloseStream))
            .expect("close");
        core.frame(Frame::control(other_id, Kind::CloseStream))
            .expect("close");
        let (refused, closed) = if greeted {
            (Stopped::Refused, 1)
        } else {
            (Stopped::Closed, 0)
        };
        assert_eq!(core.inner.peer_stopped(key), Some(refused), "{greeted}");
        assert_eq!(core.inner.peer_stopped(other), Some(Stopped::Closed));
        assert_eq!(core.inner.stats().refused_by_peer, closed, "{greeted}");
        let write = core.inner.poll_write(key, Waker::noop(), b"x");
        if greeted {
            assert!(
                matches!(write, Poll::Ready(Err(Error::Refused))),
                "{write:?}"
            );
            // What it wrote never reached the peer's application: flushing says so.
            let flush = core.inner.poll_flush(key, Waker::noop());
            assert!(
                matches!(flush, Poll::Ready(Err(Error::Refused))),
                "{flush:?}"
            );
        } else {
            assert!(matches!(write, Poll::Ready(Err(_))), "{write:?}");
        }
    }
}

/// The peer's acknowledgements let opens beyond the backlog in: with a backlog of two, a third
/// open waits until the peer has said something about one of the first two.
#[test]
fn an_acknowledgement_lets_the_next_open_in() {
    let mut core = Core::new(Role::Client, Config::default().open_backlog(2));
    core.frame(greeting()).expect("greeting");
    let (_, first) = core.open();
    core.open();
    let mut line = None;
    let third = core
        .inner
        .poll_open(Waker::noop(), &mut None, &mut line, true, &mut Vec::new());
    assert!(third.is_pending(), "{third:?}");
    core.frame(Frame::window_update(first, 0))
        .expect("acknowledgement");
    let third = core
        .inner
        .poll_open(Waker::noop(), &mut None, &mut line, true, &mut Vec::new());
    assert!(matches!(third, Poll::Ready(Ok(_))), "{third:?}");
}

/// The peer's CloseRead ends the stream for the reader, after the data that came before it;
/// `read_chunk` hands the data out as it came.
#[test]
fn the_reader_gets_the_data_then_the_end_of_the_stream() {
    let mut core = Core::new(Role::Server, Config::default());
    let key = core.accepted(0);
    core.frame(Frame::data(0, vec![1; 500])).expect("data");
    core.frame(Frame::data(0, vec![2; 300])).expect("data");
    core.frame(Frame::control(0, Kind::CloseRead))
        .expect("close");
    let mut chunks = Vec::new();
    loop {
        match core
            .inner
            .poll_read_chunk(key, Waker::noop(), &Now::at(core.now), 400)
        {
            Poll::Ready(Ok(Some(chunk))) if !chunk.is_empty() => chunks.push(chunk),
            Poll::Ready(Ok(_)) => break,
            other => panic!("{other:?}"),
        }
    }
    let got: Vec<u8> = chunks.concat();
    let mut want = vec![1; 500];
    want.extend_from_slice(&[2; 300]);
    assert_eq!(got, want);
    assert!(chunks.iter().all(|c| c.len() <= 400));
    assert_eq!(core.read(key, 100), 0, "the end of the stream");
}

/// A session's streams keep it from being idle until they are done.
#[test]
fn a_live_stream_keeps_the_session_from_idle() {
    let mut core = Core::new(Role::Client, Config::default());
    let (key, id) = core.open();
    core.sent();
    assert!(!core.inner.idle());
    core.inner.release(key, true, true);
    assert_eq!(
        kinds(&core.sent()),
        vec![(id, Kind::CloseStream)],
        "the stream is closed"
    );
    assert!(core.inner.idle());
}

/// A `stopped()` future that goes away leaves no waiter behind.
#[test]
fn a_stopped_waiter_that_goes_leaves_nothing() {
    let mut core = Core::new(Role::Client, Config::default());
    let (key, _) = core.open();
    let mut slot = None;
    assert!(core
        .inner
        .poll_stopped(key, Waker::noop(), &mut slot)
        .is_pending());
    let stop_waiters = |inner: &crate::session::core::Inner| {
        inner
            .rare
            .as_ref()
            .map_or(0, |rare| rare.stop_waiters.len())
    };
    assert_eq!(stop_waiters(&core.inner), 1);
    core.inner.stop_waiter_gone(key, &mut slot);
    assert_eq!(stop_waiters(&core.inner), 0);
}

/// Accepting fails once a graceful close has started, even with streams queued to accept.
#[test]
fn accept_fails_once_a_graceful_close_has_started() {
    let mut core = Core::new(Role::Server, Config::default());
    core.frame(Frame::control(0, Kind::OpenStream))
        .expect("open");
    core.inner.start_draining(&mut Vec::new());
    let accept = core.inner.poll_accept(Waker::noop(), &mut None);
    assert!(
        matches!(accept, Poll::Ready(Err(Error::ClosedLocally))),
        "{accept:?}"
    );
}

/// Closing the read side drops what was buffered, and the session's buffered figure follows.
#[test]
fn closing_the_read_side_drops_what_was_buffered() {
    let mut core = Core::new(Role::Server, Config::default());
    let key = core.accepted(0);
    core.frame(Frame::data(0, vec![1; 1000])).expect("data");
    assert_eq!(core.inner.stats().buffered, 1000);
    core.inner.close_read(key);
    assert_eq!(core.inner.buffered(key), 0);
    assert_eq!(core.inner.stats().buffered, 0);
    assert_eq!(core.read(key, 100), 0);
}

/// A stream whose peer has finished sending does not grow its window, however promptly it is
/// read: the session's window budget is kept for streams that still receive. (The same reads
/// grow the window of a stream still open: `a_window_that_limits_a_fast_reader_doubles`.)
#[test]
fn a_finished_stream_does_not_grow_its_window() {
    let mut core = Core::new(Role::Server, Config::default());
    let key = super::first_round(&mut core);
    core.frame(Frame::data(0, vec![7; 65_536]))
        .expect("in credit");
    core.frame(Frame::control(0, Kind::CloseRead))
        .expect("close");
    assert_eq!(core.read(key, 1 << 20), 65_536);
    assert_eq!(core.inner.stream_stats(key).receive_window, 65_536);
    assert_eq!(
        core.inner.window_budget,
        Config::default().receive_window_budget_setting()
    );
}
