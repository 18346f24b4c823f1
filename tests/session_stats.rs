//! `Session::stats`, the figures about waiting: writes waiting for credit and for room are
//! counted and timed, refusals are counted on both ends, the bytes queued for the transport
//! show, and the smallest round trip the window tuner measured is reported. Time is tokio's
//! paused clock, so the waits are exact.

mod common;

use std::time::Duration;

use gomux::stream::Stopped;
use gomux::{Config, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::within;

#[tokio::test(start_paused = true)]
async fn a_write_waiting_for_credit_is_counted_and_timed() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (client, server) = (Session::client(a), Session::server(b));
    let mut stream = within("open", client.open()).await.expect("open");
    let before = client.stats();
    assert_eq!(
        (before.credit_waits, before.credit_wait_time),
        (0, Duration::ZERO)
    );

    // 100 KiB against a window of 64 KiB that nobody reads: the write waits for credit.
    let writer = tokio::spawn(async move {
        stream.write_all(&[7; 100 * 1024]).await.expect("write");
        stream
    });
    let mut inbound = within("accept", server.accept()).await.expect("accept");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = client.stats();
    assert_eq!(waiting.credit_waits, 1, "{waiting:?}");
    assert!(
        waiting.credit_wait_time >= Duration::from_secs(2),
        "a wait under way counts: {waiting:?}"
    );
    assert_eq!(waiting.room_waits, 0, "{waiting:?}");

    // The server reads: credit flows back and the write goes through.
    let mut received = vec![0; 100 * 1024];
    within("read", inbound.read_exact(&mut received))
        .await
        .expect("read");
    let _stream = within("the write", writer).await.expect("no panic");
    let done = client.stats();
    assert_eq!(done.credit_waits, 1, "{done:?}");
    assert!(
        done.credit_wait_time >= waiting.credit_wait_time
            && done.credit_wait_time < Duration::from_secs(3),
        "{done:?}"
    );
    // The sender ran out of credit and sent again once it had some: the server measured a
    // round trip.
    assert!(server.stats().min_rtt.is_some(), "{:?}", server.stats());
}

#[tokio::test(start_paused = true)]
async fn a_write_waiting_for_room_is_counted_and_timed_and_the_queue_shows() {
    // Nothing reads the far end of the transport: its 4 KiB buffer fills. The transport takes
    // only 4 KiB of a first write of 6 KiB (the rest waits for the driver); a second, of
    // 8 KiB, fills the send queues (8 KiB), and a third writer waits for room.
    let (a, _unread) = tokio::io::duplex(4 * 1024);
    let config = Config::default().write_buffer_size(8 * 1024);
    let client = Session::with_config(a, Role::Client, config);
    // Opens wait for room too: all three first.
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(within("open", client.open()).await.expect("open"));
    }
    let mut third = streams.pop().expect("three");
    for (stream, size) in streams.iter_mut().zip([6 * 1024, 8 * 1024]) {
        within("a write", stream.write_all(&vec![7; size]))
            .await
            .expect("queued within the credit and the room");
        tokio::task::yield_now().await; // the driver takes what is queued
    }
    let writer = tokio::spawn(async move {
        let _ = third.write_all(&[7; 1024]).await;
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = client.stats();
    assert_eq!(stats.room_waits, 1, "{stats:?}");
    assert!(stats.room_wait_time >= Duration::from_secs(1), "{stats:?}");
    assert_eq!(stats.credit_waits, 0, "{stats:?}");
    // The greeting, three opens and the two Data frames; the transport took 4 KiB.
    // (`queued` counts what a direct write left as well as what waits in the queues.)
    assert_eq!(
        stats.queued,
        8 + 3 * 8 + (8 + 6 * 1024) + (8 + 8 * 1024) - 4 * 1024,
        "what the transport has not taken: {stats:?}"
    );
    writer.abort();
}

#[tokio::test(start_paused = true)]
async fn refusals_are_counted_on_both_ends() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(a);
    let server = Session::with_config(b, Role::Server, Config::default().accept_backlog(1));
    let _first = within("open", client.open()).await.expect("open");
    let second = within("open", client.open()).await.expect("open");
    assert_eq!(
        within("the refusal", second.stopped())
            .await
            .expect("stopped"),
        Stopped::Refused
    );
    assert_eq!(client.stats().refused_by_peer, 1, "{:?}", client.stats());
    assert_eq!(server.stats().streams_refused, 1, "{:?}", server.stats());
    // A stream the peer opened and then closed is not one this side had refused to it.
    assert_eq!(server.stats().refused_by_peer, 0);
}

/// `Stream::stats`: the waits are the stream's own, not the session's; what it queued, its
/// credit and what it buffered show; and a stream that never waited has nothing counted.
#[tokio::test(start_paused = true)]
async fn a_streams_own_figures_show_its_waits_and_queues() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (client, server) = (Session::client(a), Session::server(b));
    let mut waiting = within("open", client.open()).await.expect("open");
    let mut quiet = within("open", client.open()).await.expect("open");
    quiet.write_all(b"hello").await.expect("write");
    let (mut inbound, _second) = (
        within("accept", server.accept()).await.expect("accept"),
        within("accept", server.accept()).await.expect("accept"),
    );
    let stats_id = waiting.id();
    assert_eq!(inbound.id(), stats_id);
    // 100 KiB against a window of 64 KiB that nobody reads: the write waits for credit.
    let writer = tokio::spawn(async move {
        waiting.write_all(&[7; 100 * 1024]).await.expect("write");
        waiting
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let quiet_stats = quiet.stats();
    assert_eq!(
        (quiet_stats.credit_waits, quiet_stats.room_waits),
        (0, 0),
        "{quiet_stats:?}"
    );
    assert_eq!(quiet_stats.send_credit, 64 * 1024 - 5, "{quiet_stats:?}");
    assert_eq!(quiet_stats.credit_wait_time, Duration::ZERO);
    // The reader takes it all; the writer finishes, and its wait is counted.
    let mut all = vec![0; 100 * 1024];
    inbound.read_exact(&mut all).await.expect("read");
    let waiting = within("the write", writer).await.expect("no panic");
    let stats = waiting.stats();
    assert_eq!(stats.credit_waits, 1, "{stats:?}");
    assert!(
        stats.credit_wait_time >= Duration::from_secs(2),
        "{stats:?}"
    );
    assert_eq!((stats.queued, stats.priority), (0, 0), "{stats:?}");
    assert_eq!(stats.receive_window, 64 * 1024, "{stats:?}");
    let inbound_stats = inbound.stats();
    assert_eq!(inbound_stats.buffered, 0, "{inbound_stats:?}");
    assert_eq!(client.stats().credit_waits, 1);
}
