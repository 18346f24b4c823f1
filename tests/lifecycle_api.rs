//! What a server author reaches for beyond open, accept and close: graceful close with a
//! deadline, waiting for a session to be idle, accept loops that end by themselves, telling a
//! refused stream from a half-closed one, putting halves back together, and getting the
//! crate's error out of an `io::Error`.

mod common;

use std::time::Duration;

use common::{duplex_pair, gomux_error, raw_session, sessions_with, within, Transport};
use futures::StreamExt;
use gomux::frame::{Frame, Kind};
use gomux::stream::Stopped;
use gomux::{Config, Error, Role};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn graceful_close_lets_open_streams_finish_and_refuses_new_ones() {
    let (client, server) = duplex_pair().await;
    let mut request = client.open().await.expect("open");
    request.write_all(b"GET").await.expect("write");
    let mut serving = server.accept().await.expect("accept");
    // A stream the peer opened that the application has not accepted yet.
    let mut unaccepted = client.open().await.expect("open");
    unaccepted.write_all(b"x").await.expect("write");
    let mut buf = [0; 3];
    serving.read_exact(&mut buf).await.expect("read");

    let closing = tokio::spawn({
        let server = server.clone();
        async move { server.graceful_close(Duration::from_secs(3600)).await }
    });

    // Draining: nothing new either way, the stream not yet accepted is refused...
    let refused = within("the queued stream refused", unaccepted.stopped()).await;
    assert_eq!(refused.expect("session lives"), Stopped::Refused);
    let late = client.open().await.expect("open while the peer drains");
    let refused = within("a new stream refused", late.stopped()).await;
    assert_eq!(refused.expect("session lives"), Stopped::Refused);
    assert!(matches!(server.accept().await, Err(Error::ClosedLocally)));
    assert!(server.incoming().next().await.is_none(), "incoming ends");
    assert!(matches!(
        server.open().await,
        Err(Error::SessionUnavailable(reason)) if matches!(*reason, Error::ClosedLocally)
    ));
    assert!(!closing.is_finished(), "a stream is still being served");

    // ...while the stream being served still works both ways.
    request
        .write_all(b" /")
        .await
        .expect("write while draining");
    request.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    serving.read_to_end(&mut rest).await.expect("read");
    assert_eq!(rest, b" /");
    serving.write_all(b"200 OK").await.expect("reply");
    drop(serving);

    within("the graceful close", closing)
        .await
        .expect("no panic")
        .expect("closed gracefully");
    let mut reply = Vec::new();
    request.read_to_end(&mut reply).await.expect("reply read");
    assert_eq!(
        reply, b"200 OK",
        "the reply written before the close arrives"
    );
    assert!(matches!(client.closed().await, Error::ClosedByPeer));
}

#[tokio::test(start_paused = true)]
async fn graceful_close_cuts_what_is_still_open_at_its_deadline() {
    let (client, server) = duplex_pair().await;
    let _held = client.open().await.expect("open");
    let _accepted = server.accept().await.expect("accept");
    let result = server.graceful_close(Duration::from_secs(5)).await;
    assert!(
        matches!(result, Err(Error::GracefulCloseTimedOut { streams: 1 })),
        "{result:?}"
    );
    assert!(matches!(server.closed().await, Error::ClosedLocally));
}

/// A transport that takes nothing more fails the close at the deadline too: the caller still
/// learns that streams were cut, which matters more than the close's own failure.
#[tokio::test(start_paused = true)]
async fn graceful_close_reports_the_cut_streams_even_when_the_close_fails() {
    let config = Config::default().close_timeout(Duration::from_millis(200));
    let (server, _driver, faults, mut peer) = raw_session(Role::Server, config);
    peer.send(Frame::control(2, Kind::OpenStream)).await;
    let _accepted = within("accept", server.accept()).await.expect("accept");
    faults.stall_writes(true);
    let result = server.graceful_close(Duration::from_millis(100)).await;
    assert!(
        matches!(result, Err(Error::GracefulCloseTimedOut { streams: 1 })),
        "{result:?}"
    );
    assert!(server.is_closed());
}

#[tokio::test]
async fn graceful_close_of_an_idle_session_closes_at_once() {
    let (client, server) = duplex_pair().await;
    within(
        "the close",
        server.graceful_close(Duration::from_secs(3600)),
    )
    .await
    .expect("graceful");
    assert!(matches!(client.closed().await, Error::ClosedByPeer));
}

#[tokio::test]
async fn wait_idle_resolves_when_the_last_stream_is_gone() {
    let (client, server) = duplex_pair().await;
    within("idle at the start", server.wait_idle()).await;
    let stream = client.open().await.expect("open");
    let mut inbound = within("accept", server.accept()).await.expect("accept");
    let idle = tokio::spawn({
        let server = server.clone();
        async move { server.wait_idle().await }
    });
    tokio::task::yield_now().await;
    assert!(!idle.is_finished(), "both ends are open");
    drop(stream);
    // The read ends (end-of-stream or an error) once the server has taken in the client's
    // drop.
    let _ = within(
        "the client's drop reaches the server",
        inbound.read(&mut [0u8; 1]),
    )
    .await;
    // The client closed the stream, so both its directions have ended: it has nothing left to
    // do, and the handle the server still holds does not keep the session busy.
    within("idle once the stream is done, its handle kept", idle)
        .await
        .expect("no panic");
    assert_eq!(server.stream_count(), 1, "the handle is still there");
    drop(inbound);
    assert_eq!(server.stream_count(), 0);
}

#[tokio::test]
async fn incoming_ends_without_an_error_when_the_peer_closes() {
    let (client, server) = duplex_pair().await;
    let _first = client.open().await.expect("open");
    let mut incoming = server.incoming();
    let stream = within("the first stream", incoming.next())
        .await
        .expect("a stream")
        .expect("no error");
    client.close().await.expect("close");
    assert!(within("the end", incoming.next()).await.is_none());
    drop(stream);
    // `accept` reports why, for those who want it.
    assert!(matches!(server.accept().await, Err(Error::ClosedByPeer)));
}

#[tokio::test]
async fn stopped_tells_refused_from_read_closed_from_closed() {
    let server_config = Config::default().accept_backlog(1);
    let (client, server) = sessions_with(
        Transport::Duplex(64 * 1024),
        Config::default(),
        server_config,
    )
    .await;

    // Read closed: the peer stops reading but may still send.
    let stream = client.open().await.expect("open");
    let mut inbound = server.accept().await.expect("accept");
    assert_eq!(stream.peer_stopped(), None);
    inbound.close_read();
    let how = within("close_read seen", stream.stopped()).await;
    assert_eq!(how.expect("session lives"), Stopped::ReadClosed);
    assert_eq!(stream.peer_stopped(), Some(Stopped::ReadClosed));

    // Closed: the peer said something, then closed the stream.
    let (mut reader, writer) = client.open().await.expect("open").into_split();
    let mut inbound = server.accept().await.expect("accept");
    inbound.write_all(b"bye").await.expect("write");
    drop(inbound);
    let how = within("the close seen", writer.stopped()).await;
    assert_eq!(how.expect("session lives"), Stopped::Closed);
    let mut text = String::new();
    reader.read_to_string(&mut text).await.expect("read");
    assert_eq!(text, "bye", "what was sent before the close still arrives");

    // Refused: the backlog of 1 is full, so the second stream is closed at once.
    let _queued = client.open().await.expect("open");
    let refused = client.open().await.expect("open");
    let how = within("the refusal", refused.stopped()).await;
    assert_eq!(how.expect("session lives"), Stopped::Refused);
    assert_eq!(server.stats().streams_refused, 1);
}

/// A session that ends under a stream the peer's application accepted ends its `stopped()`
/// with the session's error; one it never accepted, when the peer ended in order, was refused.
#[tokio::test]
async fn stopped_reports_the_session_end() {
    let (client, server) = duplex_pair().await;
    let stream = client.open().await.expect("open");
    let _accepted = within("accept", server.accept()).await.expect("accept");
    let unaccepted = client.open().await.expect("open");
    let waiting = tokio::spawn(async move { stream.stopped().await });
    let refused = tokio::spawn(async move { unaccepted.stopped().await });
    tokio::task::yield_now().await;
    server.close().await.expect("close");
    let result = within("the end", waiting).await.expect("no panic");
    assert!(matches!(result, Err(Error::ClosedByPeer)), "{result:?}");
    let result = within("the end", refused).await.expect("no panic");
    assert!(matches!(result, Ok(Stopped::Refused)), "{result:?}");
}

#[tokio::test]
async fn halves_reunite_and_the_write_half_closes_and_waits() {
    let (client, server) = duplex_pair().await;
    let (reader, writer) = client.open().await.expect("open").into_split();
    let mut inbound = server.accept().await.expect("accept");
    inbound.write_all(b"abc").await.expect("write");
    let mut stream = reader.reunite(writer).expect("halves of one stream");
    let mut buf = [0; 3];
    stream
        .read_exact(&mut buf)
        .await
        .expect("read after reunite");
    stream.write_all(b"xyz").await.expect("write after reunite");

    // Halves of different streams come back with the error.
    let (a_read, _a_write) = client.open().await.expect("open").into_split();
    let (_b_read, b_write) = client.open().await.expect("open").into_split();
    let (a_id, b_id) = (a_read.id(), b_write.id());
    let error = a_read.reunite(b_write).expect_err("different streams");
    assert_eq!(
        (error.0.id(), error.1.id()),
        (a_id, b_id),
        "both halves come back"
    );

    // The read half tells what is buffered; the write half closes and waits.
    let (reader, mut writer) = stream.into_split();
    inbound.write_all(b"12345").await.expect("write");
    within("buffered data", async {
        while reader.buffered() < 5 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    writer.write_all(b"!").await.expect("write");
    within("the write half's close", writer.close())
        .await
        .expect("closed");
    let mut got = Vec::new();
    inbound
        .read_to_end(&mut got)
        .await
        .expect("read to the end");
    assert_eq!(
        got, b"xyz!",
        "the peer reads everything, then end-of-stream"
    );
    drop(reader);
}

#[tokio::test]
async fn the_crate_error_comes_out_of_an_io_error() {
    let (client, _server) = duplex_pair().await;
    let mut stream = client.open().await.expect("open");
    stream.shutdown().await.expect("shutdown");
    let error = stream
        .write_all(b"late")
        .await
        .expect_err("write after shutdown");
    assert!(matches!(Error::from_io(&error), Some(Error::WriteClosed)));
    assert!(gomux_error(&error).is_some());
    assert!(Error::from_io(&std::io::Error::other("not ours")).is_none());
    assert!(Error::ClosedByPeer.is_graceful() && Error::ClosedLocally.is_graceful());
    assert!(!Error::ConnectionClosed.is_graceful());
}

/// `Session::close` called from one thread while the driver runs on another, just after the
/// driver read the peer's last frames: the close must reach the driver whenever it lands, or
/// the CloseMux waits for the next keepalive (none here: it would wait for ever). The race
/// window is a few instructions wide, so this runs the scenario 2,000 times; on a 2-core
/// machine, before the fix, 10 of 15 runs of this test hung in one of their 2,000 rounds
/// (`for i in $(seq 15); do cargo test --test lifecycle_api a_close_right; done`); after it,
/// none of 15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_right_after_the_peers_last_frames_always_goes_out() {
    for run in 0..2000 {
        let config = Config::default().keepalive_interval(None);
        let (server, _driver, _faults, mut peer) = raw_session(Role::Server, config);
        peer.send(Frame::control(2, Kind::OpenStream)).await;
        peer.send(Frame::data(2, vec![7u8; 1000])).await;
        peer.send(Frame::control(2, Kind::CloseStream)).await;
        let mut stream = within("accept", server.accept()).await.expect("accept");
        let mut data = Vec::new();
        stream.read_to_end(&mut data).await.expect("read");
        assert_eq!(data.len(), 1000);
        let closing = tokio::spawn(async move { server.close().await });
        let what = format!("the CloseMux of run {run}");
        let close_mux = within(&what, async {
            loop {
                match peer.recv().await {
                    Some(frame) if frame.header.kind == Kind::CloseMux => return,
                    Some(_) => {}
                    None => panic!("end-of-file before the CloseMux"),
                }
            }
        });
        close_mux.await;
        drop(peer);
        within("close", closing)
            .await
            .expect("no panic")
            .expect("closed");
    }
}
