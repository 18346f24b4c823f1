//! `Session::stats`: the counters follow what crosses the connection.

mod common;

use std::time::Duration;

use common::within;
use gomux::{Config, Role, Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pair(config: Config) -> (Session, Session) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    (
        Session::with_config(a, Role::Client, config.clone()),
        Session::with_config(b, Role::Server, config),
    )
}

/// Waits until `stream` holds `n` unread bytes.
async fn buffered(stream: &Stream, n: usize) {
    within("data to arrive", async {
        while stream.buffered() < n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn bytes_frames_and_streams_are_counted_on_both_ends() {
    let (client, server) = pair(Config::default());
    let mut stream = client.open().await.expect("open");
    stream.write_all(&[7; 1000]).await.expect("write");
    stream.flush().await.expect("flush");
    let mut inbound = within("accept", server.accept()).await.expect("accept");
    buffered(&inbound, 1000).await;

    let sent = client.stats();
    assert_eq!(sent.streams_opened, 1);
    assert_eq!(sent.live_streams, 1);
    // The greeting, OpenStream, then one Data frame of 1000 bytes.
    assert_eq!(sent.frames_sent, 3);
    assert_eq!(sent.bytes_sent, 8 + 8 + 8 + 1000);

    let received = server.stats();
    assert_eq!(received.streams_accepted, 1);
    assert_eq!(received.frames_received, 3);
    assert_eq!(received.bytes_received, sent.bytes_sent);
    assert_eq!((received.buffered, received.peak_buffered), (1000, 1000));

    let mut data = [0; 600];
    inbound.read_exact(&mut data).await.expect("read");
    let after = server.stats();
    assert_eq!((after.buffered, after.peak_buffered), (400, 1000));
    // Closing the read side discards the rest, which leaves the buffers too.
    inbound.close_read();
    assert_eq!(server.stats().buffered, 0);
}

#[tokio::test]
async fn unread_data_of_a_dropped_stream_leaves_the_count() {
    let (client, server) = pair(Config::default());
    let mut stream = client.open().await.expect("open");
    stream.write_all(&[1; 300]).await.expect("write");
    let inbound = within("accept", server.accept()).await.expect("accept");
    buffered(&inbound, 300).await;
    assert_eq!(server.stats().buffered, 300);
    drop(inbound);
    assert_eq!(server.stats().buffered, 0);
    assert_eq!(server.stats().peak_buffered, 300);
}

#[tokio::test]
async fn refused_streams_are_counted() {
    let (client, server) = pair(Config::default().accept_backlog(1));
    let mut opened = Vec::new();
    for _ in 0..3 {
        let mut stream = client.open().await.expect("open");
        stream.flush().await.expect("flush");
        opened.push(stream);
    }
    within("the refusals", async {
        while server.stats().streams_refused < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let stats = server.stats();
    assert_eq!((stats.streams_accepted, stats.streams_refused), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn keepalives_are_counted_each_way() {
    let config = Config::default().keepalive_interval(Some(Duration::from_secs(1)));
    let (client, server) = pair(config);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let (sent, received) = (client.stats(), server.stats());
    assert!(sent.keepalives_sent >= 3, "{sent:?}");
    assert!(received.keepalives_received >= 3, "{received:?}");
}
