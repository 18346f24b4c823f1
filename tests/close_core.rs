//! The session core's close paths: a `close` that waits for its own frames and no longer, a
//! drain that ends once the streams have nothing left to do (handles may stay), settings of
//! any duration, the draining signal, and `stopped()` with several waiters.
//!
//! All on paused time: the runtime jumps ahead whenever every task waits, so a wait that ends
//! only at a timeout shows up as the full timeout, and a bound such as [`PROMPT`] is exact.

mod common;

use std::time::Duration;

use common::{duplex_pair, raw_session, within_for};
use gomux::frame::{Frame, Kind};
use gomux::stream::Stopped;
use gomux::{Config, Error, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

/// How long an operation may take to notice what it waits for: "at once" on paused time, and
/// well below the 10 s close timeout that a missed wake-up falls back on.
const PROMPT: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// Finding 1: a lost wake-up in `close`.

/// Stream A's data and half-close are in the batch being written while the transport stalls;
/// meanwhile stream B's reader returns credit and the peer then half-closes B, which makes that
/// credit entry stale. A `close` of A's write half waits for A's frames. Once the transport
/// takes the batch, the peer has A's frames, and `close` must return then. It used to wait
/// for the control queue's end at the time it started waiting, which only the stale entry
/// stood for, and a batch of stale entries writes nothing, so no write ever reported it:
/// `close` returned only at its 10 s close timeout.
#[tokio::test(start_paused = true)]
async fn close_returns_once_its_frames_are_written_though_a_stale_credit_entry_is_queued() {
    let (session, _driver, faults, mut raw) = raw_session(Role::Client, Config::default());
    let a = session.open().await.expect("open A");
    let mut b = session.open().await.expect("open B");
    let (a_id, b_id) = (a.id(), b.id());
    raw.recv_until(a_id, Kind::OpenStream).await;
    raw.recv_until(b_id, Kind::OpenStream).await;

    // A's data and half-close go into a batch the stalled transport does not take.
    faults.stall_writes(true);
    let (_a_read, mut a_write) = a.into_split();
    a_write.write_all(b"last words").await.expect("write A");
    a_write.shutdown().await.expect("half-close A");
    tokio::time::sleep(Duration::from_millis(10)).await;

    // B's reader consumes enough to owe credit (queued), then the peer half-closes B: the
    // credit entry is stale, nothing will be written for it.
    raw.send(Frame::data(b_id, vec![7u8; 40_000])).await;
    let mut got = vec![0u8; 40_000];
    within_for(PROMPT, "read B", b.read_exact(&mut got))
        .await
        .expect("read B");
    raw.send(Frame::control(b_id, Kind::CloseRead)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;

    let closing = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let result = a_write.close().await;
        (result, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    faults.stall_writes(false);

    let data = raw.recv_until(a_id, Kind::Data).await;
    assert_eq!(&data.payload[..], b"last words");
    raw.recv_until(a_id, Kind::CloseRead).await;
    let (result, took) = within_for(Duration::from_secs(60), "close A", closing)
        .await
        .expect("the close task");
    result.expect("close A");
    assert!(
        took < PROMPT,
        "close returned {took:?} after it started, though its frames were written at once"
    );
    drop(b);
}

// ---------------------------------------------------------------------------------------------
// Finding 2: a drain waits for streams with work left, not for handles.

/// A server serves a stream, closes it (CloseStream written, both directions done) and keeps
/// the handle, as a server that logs or pools its streams may. `graceful_close` must close the
/// session at once, and `wait_idle` resolve: nothing is left to do on the stream. Counting
/// handles, it timed out with `GracefulCloseTimedOut { streams: 1 }`, and `wait_idle` never
/// resolved.
#[tokio::test(start_paused = true)]
async fn a_closed_stream_whose_handle_is_kept_does_not_hold_a_graceful_close() {
    let (client, server) = duplex_pair().await;
    let mut request = client.open().await.expect("open");
    request.write_all(b"ping").await.expect("write");
    request.shutdown().await.expect("half-close");
    let mut served = within_for(PROMPT, "accept", server.accept())
        .await
        .expect("accept");
    let mut text = Vec::new();
    within_for(PROMPT, "read the request", served.read_to_end(&mut text))
        .await
        .expect("read");
    served.write_all(b"pong").await.expect("reply");
    within_for(PROMPT, "close the served stream", served.close())
        .await
        .expect("close");

    within_for(PROMPT, "wait_idle", server.wait_idle()).await;
    let started = tokio::time::Instant::now();
    let closed = within_for(
        Duration::from_secs(60),
        "graceful close",
        server.graceful_close(Duration::from_secs(2)),
    )
    .await;
    assert!(
        closed.is_ok(),
        "graceful close with a finished stream kept: {closed:?}"
    );
    assert!(started.elapsed() < PROMPT, "it closed at once");
    assert_eq!(server.stream_count(), 1, "the handle still counts as state");
    let mut reply = Vec::new();
    within_for(PROMPT, "read the reply", request.read_to_end(&mut reply))
        .await
        .expect("the client reads the whole reply");
    assert_eq!(reply, b"pong");
    drop(served);
}

/// Both directions ended, one by each side, with data received and never read: the stream is
/// done, and the drain does not wait for the reader. A stream still open in one direction does
/// hold it, until the deadline, and is the one counted as cut.
#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_open_directions_not_for_unread_data() {
    let (client, server) = duplex_pair().await;
    // Done: the client sends data and half-closes; the server only half-closes its side.
    let mut done = client.open().await.expect("open");
    done.write_all(b"never read").await.expect("write");
    done.shutdown().await.expect("half-close");
    let mut unread = within_for(PROMPT, "accept", server.accept())
        .await
        .expect("accept");
    unread.shutdown().await.expect("server half-close");
    // Not done: the client's side of this one stays open.
    let _open = client.open().await.expect("open");
    let mut busy = within_for(PROMPT, "accept", server.accept())
        .await
        .expect("accept");
    busy.shutdown().await.expect("server half-close");
    tokio::time::sleep(Duration::from_millis(10)).await;

    let idle = timeout(Duration::from_secs(5), server.wait_idle()).await;
    assert!(idle.is_err(), "one stream's peer may still send");
    let closed = within_for(
        Duration::from_secs(60),
        "graceful close",
        server.graceful_close(Duration::from_secs(2)),
    )
    .await;
    match closed {
        Err(Error::GracefulCloseTimedOut { streams }) => assert_eq!(streams, 1),
        other => panic!("expected one stream cut, got {other:?}"),
    }
    // The unread data stays readable after the close.
    let mut text = Vec::new();
    unread.read_to_end(&mut text).await.expect("read");
    assert_eq!(text, b"never read");
}

// ---------------------------------------------------------------------------------------------
// Finding 3: settings of any duration.

/// A session with `config` opens a stream, carries data through a brief write stall (so the
/// write-stall clock runs), lives an hour, and closes with its CloseMux.
async fn works_and_closes_with(config: Config, what: &str) {
    let (session, driver, faults, mut raw) = raw_session(Role::Client, config);
    let mut stream = session.open().await.expect("open");
    let id = stream.id();
    raw.recv_until(id, Kind::OpenStream).await;
    faults.stall_writes(true);
    stream.write_all(b"data").await.expect("write");
    tokio::time::sleep(Duration::from_millis(10)).await;
    faults.stall_writes(false);
    let data = raw.recv_until(id, Kind::Data).await;
    assert_eq!(&data.payload[..], b"data", "{what}");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(session.close_reason().is_none(), "{what}: still running");

    let closing = tokio::spawn(async move { session.close().await });
    raw.recv_until(0, Kind::CloseMux).await;
    drop(raw);
    within_for(PROMPT, what, closing)
        .await
        .expect("the close task")
        .unwrap_or_else(|e| panic!("{what}: close failed: {e}"));
    let driven = within_for(PROMPT, what, driver)
        .await
        .unwrap_or_else(|e| panic!("{what}: the driver panicked: {e}"));
    assert!(driven.is_ok(), "{what}: {driven:?}");
}

/// Each duration setter takes `Duration::MAX` ("never", in effect). The driver added them to
/// an instant with `+`, and panicked on its first poll ("overflow when adding duration to
/// instant").
#[tokio::test(start_paused = true)]
async fn settings_of_duration_max_neither_panic_nor_stop_the_session() {
    let max = Duration::MAX;
    let cases = [
        (
            Config::default().keepalive_interval(Some(max)),
            "keepalive_interval",
        ),
        (Config::default().idle_timeout(Some(max)), "idle_timeout"),
        (
            Config::default().write_stall_timeout(Some(max)),
            "write_stall_timeout",
        ),
        (Config::default().close_timeout(max), "close_timeout"),
        (
            Config::default()
                .keepalive_interval(Some(max))
                .idle_timeout(Some(max))
                .write_stall_timeout(Some(max))
                .close_timeout(max),
            "all four",
        ),
    ];
    for (config, what) in cases {
        works_and_closes_with(config, what).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The draining signal.

/// `draining` resolves for every waiter when this side starts a graceful close, and a future
/// dropped before leaves nothing behind.
#[tokio::test(start_paused = true)]
async fn draining_resolves_for_every_waiter_at_a_graceful_close() {
    let (_client, server) = duplex_pair().await;
    assert!(!server.is_draining());
    // Cancelled waits leave nothing behind (the waiter list is cancel safe).
    for _ in 0..3 {
        assert!(timeout(Duration::from_millis(5), server.draining())
            .await
            .is_err());
    }
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move { server.draining().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "nothing drains yet"
    );
    // A stream being served keeps the session draining rather than ended.
    let _opened = _client.open().await.expect("open");
    let served = within_for(PROMPT, "accept", server.accept())
        .await
        .expect("accept");
    let closing = {
        let server = server.clone();
        tokio::spawn(async move { server.graceful_close(Duration::from_secs(30)).await })
    };
    for waiter in waiters {
        within_for(PROMPT, "a draining waiter", waiter)
            .await
            .expect("the waiter task");
    }
    assert!(server.is_draining());
    assert!(server.close_reason().is_none(), "still draining, not ended");
    drop(served);
    within_for(Duration::from_secs(60), "the graceful close", closing)
        .await
        .expect("the close task")
        .expect("graceful close");
}

/// Any end counts as draining: the peer's CloseMux, and a local close.
#[tokio::test(start_paused = true)]
async fn draining_resolves_when_the_session_ends_for_any_reason() {
    let (client, server) = duplex_pair().await;
    let waiting = {
        let server = server.clone();
        tokio::spawn(async move { server.draining().await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiting.is_finished());
    client.close().await.expect("the client closes");
    within_for(PROMPT, "draining after the peer's CloseMux", waiting)
        .await
        .expect("the waiter task");
    assert!(server.is_draining());

    let (client, _server) = duplex_pair().await;
    let local = client.clone();
    let waiting = tokio::spawn(async move { local.draining().await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    client.close().await.expect("close");
    within_for(PROMPT, "draining after a local close", waiting)
        .await
        .expect("the waiter task");
}

// ---------------------------------------------------------------------------------------------
// `Stream::stopped` with several waiters.

/// Two tasks wait in `stopped()` on one stream: the peer's CloseWrite wakes both. One waker
/// per stream woke only the task that polled last; the other waited for ever (here: until
/// the step's limit).
#[tokio::test(start_paused = true)]
async fn stopped_wakes_every_task_waiting_on_it() {
    let (session, _driver, _faults, mut raw) = raw_session(Role::Client, Config::default());
    let stream = std::sync::Arc::new(session.open().await.expect("open"));
    let id = stream.id();
    raw.recv_until(id, Kind::OpenStream).await;
    let waiter = |stream: &std::sync::Arc<gomux::Stream>| {
        let stream = stream.clone();
        tokio::spawn(async move { stream.stopped().await })
    };
    let first = waiter(&stream);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = waiter(&stream);
    // A cancelled waiter between them gives its slot back.
    assert!(timeout(Duration::from_millis(5), stream.stopped())
        .await
        .is_err());
    tokio::time::sleep(Duration::from_millis(10)).await;
    raw.send(Frame::control(id, Kind::CloseWrite)).await;
    for waiter in [first, second] {
        let how = within_for(PROMPT, "a stopped() waiter", waiter)
            .await
            .expect("the waiter task")
            .expect("stopped");
        assert_eq!(how, Stopped::ReadClosed);
    }
}
