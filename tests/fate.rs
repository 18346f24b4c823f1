//! Every stream's fate is known at the edges of a session's life: a stream dropped before the
//! peer answered it keeps its place in the open backlog until the answer comes; a refusal of
//! such a stream is counted; a peer of this crate that ends the session in order refuses every
//! stream it had not acknowledged, and acknowledges every one it accepted before its CloseMux;
//! and every error of `open` is safe to retry, because no frame of the stream was written.
//!
//! All on paused time, so the waits are exact and a hang is a failure, not a slow test.

mod common;

use std::time::Duration;

use common::{duplex_pair, raw_session, sessions_with, within, Transport};
use gomux::frame::{Frame, Kind, GREETING_ID};
use gomux::{Config, Error, Role, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads the stream to its end; the error that ended it otherwise.
async fn read_all(stream: &mut Stream) -> Result<Vec<u8>, Error> {
    let mut got = Vec::new();
    match stream.read_to_end(&mut got).await {
        Ok(_) => Ok(got),
        Err(error) => Err(Error::from_io(&error).expect("a gomux error").clone()),
    }
}

/// Finding 1: a client that opens 200 streams, writes a message on each and drops it, against
/// a server that starts accepting one second later: every message arrives. The backlog of 16
/// holds the opens back until the server answers, so its accept backlog of 64 is never
/// overrun. (When a dropped stream left the backlog at once, 136 of the 200 were refused by the
/// server while every write had returned `Ok`, and the client's statistics said nothing.)
#[tokio::test(start_paused = true)]
async fn write_and_drop_never_overruns_the_peers_accept_backlog() {
    const STREAMS: usize = 200;
    let (client, server) = sessions_with(
        Transport::Duplex(1 << 20),
        Config::default().open_backlog(16),
        Config::default().accept_backlog(64),
    )
    .await;
    let opener = tokio::spawn(async move {
        for n in 0..STREAMS {
            let mut stream = client.open().await.expect("open");
            stream
                .write_all(format!("message {n}\n").as_bytes())
                .await
                .expect("write");
            drop(stream);
        }
        client
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut delivered = Vec::new();
    for _ in 0..STREAMS {
        let mut stream = within("accept", server.accept()).await.expect("accept");
        let got = within("read", read_all(&mut stream)).await.expect("read");
        delivered.push(String::from_utf8(got).expect("text"));
    }
    let client = within("opener", opener).await.expect("opener");
    delivered.sort_by_key(|line| line[8..line.len() - 1].parse::<usize>().expect("number"));
    let want: Vec<String> = (0..STREAMS).map(|n| format!("message {n}\n")).collect();
    assert_eq!(delivered, want, "every message, once");
    assert_eq!(client.stats().refused_by_peer, 0);
    assert_eq!(server.stats().streams_refused, 0);
}

/// Finding 1, the other half: a stream dropped before the peer answered it, which the peer then
/// refuses (it closes gracefully with the stream still queued), is counted in
/// `Stats::refused_by_peer`, and its place in the backlog is given back.
#[tokio::test(start_paused = true)]
async fn a_refusal_of_a_dropped_stream_is_counted_and_frees_its_place() {
    let (client, server) = sessions_with(
        Transport::Duplex(1 << 20),
        Config::default().open_backlog(2),
        Config::default(),
    )
    .await;
    for _ in 0..2 {
        let mut stream = client.open().await.expect("open");
        stream.write_all(b"request").await.expect("write");
        drop(stream);
    }
    // Both places are held by the dropped streams.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        matches!(client.try_open(), Err(Error::TooManyStreams)),
        "the backlog is full of dropped, unanswered streams"
    );
    // The server never accepts them: a graceful close refuses what is queued.
    let closing = tokio::spawn(async move { server.graceful_close(Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(client.stats().refused_by_peer, 2, "both refusals counted");
    within("graceful close", closing)
        .await
        .expect("task")
        .expect("graceful close");
}

/// Finding 2: a server that accepts 30 of 100 requests and then closes gracefully. Every
/// request either got its reply, or failed with `Refused`: none failed with an error that
/// leaves the client guessing, and the server accepted exactly the requests that were answered.
#[tokio::test(start_paused = true)]
async fn a_peer_that_closes_in_order_refuses_every_stream_it_did_not_accept() {
    for close_abruptly in [false, true] {
        const REQUESTS: usize = 100;
        const SERVED: usize = 30;
        let (client, server) = duplex_pair().await;
        let server_task = tokio::spawn(async move {
            for _ in 0..SERVED {
                let mut stream = server.accept().await.expect("accept");
                let mut request = [0u8; 8];
                stream.read_exact(&mut request).await.expect("request");
                stream.write_all(&request).await.expect("reply");
                stream.shutdown().await.expect("shutdown");
            }
            if close_abruptly {
                server.close().await.expect("close");
            } else {
                server
                    .graceful_close(Duration::from_secs(5))
                    .await
                    .expect("graceful close");
            }
            SERVED
        });
        let mut requests = Vec::new();
        for n in 0..REQUESTS {
            let mut stream = client.open().await.expect("open");
            stream
                .write_all(&(n as u64).to_le_bytes())
                .await
                .expect("write");
            requests.push(tokio::spawn(async move { read_all(&mut stream).await }));
        }
        let (mut replies, mut refused) = (0, 0);
        for (n, request) in requests.into_iter().enumerate() {
            match within("reply", request).await.expect("task") {
                Ok(reply) => {
                    assert_eq!(reply, (n as u64).to_le_bytes(), "request {n}");
                    replies += 1;
                }
                Err(Error::Refused) => refused += 1,
                Err(other) => panic!("request {n} failed with {other}: was it handled or not?"),
            }
        }
        let accepted = within("server", server_task).await.expect("server");
        assert_eq!(replies, accepted, "closing abruptly: {close_abruptly}");
        assert_eq!(
            refused,
            REQUESTS - accepted,
            "closing abruptly: {close_abruptly}"
        );
        assert_eq!(client.stats().refused_by_peer, refused as u64);
    }
}

/// Finding 2, on the wire: the acknowledgement of every stream the application accepted goes
/// out before the CloseMux, and no stream is handed out once the CloseMux is queued (it could
/// not be acknowledged before it). A stream its opener closed already is acknowledged too.
#[tokio::test(start_paused = true)]
async fn every_acknowledgement_goes_before_the_close_mux() {
    let (session, _driver, _faults, mut raw) = raw_session(Role::Server, Config::default());
    raw.send(Frame::control(GREETING_ID, Kind::Keepalive)).await;
    let ids: Vec<u32> = (0..10).map(|n| n * 2).collect();
    for &id in &ids {
        raw.send(Frame::control(id, Kind::OpenStream)).await;
        raw.send(Frame::data(id, b"x".to_vec())).await;
    }
    // The opener closed the last stream before it was accepted.
    raw.send(Frame::control(ids[9], Kind::CloseStream)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut accepted = Vec::new();
    for _ in 0..5 {
        accepted.push(within("accept", session.accept()).await.expect("accept"));
    }
    let closing = tokio::spawn({
        let session = session.clone();
        async move { session.close().await }
    });
    tokio::task::yield_now().await;
    assert!(
        session.accept().await.is_err(),
        "nothing is handed out once the CloseMux is queued"
    );
    let mut acknowledged = Vec::new();
    loop {
        let frame = raw.recv().await.expect("frames until the CloseMux");
        match frame.header.kind {
            Kind::WindowUpdate => acknowledged.push(frame.header.id),
            Kind::CloseMux => break,
            _ => {}
        }
    }
    let want: Vec<u32> = accepted.iter().map(Stream::id).collect();
    assert_eq!(
        acknowledged, want,
        "each accepted stream, before the CloseMux"
    );
    drop(raw);
    let _ = within("close", closing).await;

    // The stream its opener closed: acknowledged when accepted.
    let (session, _driver, _faults, mut raw) = raw_session(Role::Server, Config::default());
    raw.send(Frame::control(GREETING_ID, Kind::Keepalive)).await;
    raw.send(Frame::control(4, Kind::OpenStream)).await;
    raw.send(Frame::data(4, b"last".to_vec())).await;
    raw.send(Frame::control(4, Kind::CloseStream)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut stream = within("accept", session.accept()).await.expect("accept");
    let ack = raw.recv_until(4, Kind::WindowUpdate).await;
    assert_eq!(ack.header.length, 0);
    assert_eq!(read_all(&mut stream).await.expect("read"), b"last");
}

/// The accepting side answers a stream its opener closed before it was accepted, also when it
/// drops it unaccepted: with CloseStream, so that the opener's record of it ends.
#[tokio::test(start_paused = true)]
async fn a_stream_closed_by_its_opener_and_never_accepted_is_refused() {
    let (session, _driver, _faults, mut raw) = raw_session(Role::Server, Config::default());
    raw.send(Frame::control(GREETING_ID, Kind::Keepalive)).await;
    raw.send(Frame::control(6, Kind::OpenStream)).await;
    raw.send(Frame::data(6, b"ignored".to_vec())).await;
    raw.send(Frame::control(6, Kind::CloseStream)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let closing = tokio::spawn(async move { session.graceful_close(Duration::from_secs(5)).await });
    raw.recv_until(6, Kind::CloseStream).await;
    raw.recv_until(0, Kind::CloseMux).await;
    drop(raw);
    let _ = within("graceful close", closing).await;
}

/// Towards a plain (Go) peer nothing changes: it answers nothing, so a dropped stream leaves
/// the backlog at once, and a stream it closed is not acknowledged or refused again.
#[tokio::test(start_paused = true)]
async fn towards_a_plain_peer_dropped_streams_wait_for_nothing() {
    let (session, _driver, _faults, mut raw) =
        raw_session(Role::Client, Config::default().open_backlog(1));
    raw.send(Frame::control(0, Kind::Keepalive)).await; // Not a greeting: a plain peer.
    tokio::time::sleep(Duration::from_millis(10)).await;
    for _ in 0..10 {
        let mut stream = within("open", session.open()).await.expect("open");
        stream.write_all(b"x").await.expect("write");
    }
    assert_eq!(session.stats().streams_opened, 10);
}

/// Finding 3: every error of `open` and `try_open` is safe to retry, and says so; the errors of
/// a stream whose request may have been handled say it is not.
#[tokio::test(start_paused = true)]
async fn open_errors_are_safe_to_retry_and_stream_errors_say_whether_they_are() {
    let (client, server) = duplex_pair().await;
    // A stream the server accepted and read, then the server closed the session: the request
    // may have been handled.
    let mut stream = client.open().await.expect("open");
    stream.write_all(b"ping").await.expect("write");
    let mut accepted = within("accept", server.accept()).await.expect("accept");
    let mut got = [0u8; 4];
    accepted.read_exact(&mut got).await.expect("read");
    server.close().await.expect("close");
    let error = within("read", read_all(&mut stream))
        .await
        .expect_err("the session ended");
    assert!(matches!(error, Error::ClosedByPeer), "{error}");
    assert!(!error.is_retry_safe());

    // Opens on the ended session: nothing written, safe to retry elsewhere.
    let error = client.open().await.expect_err("ended");
    assert!(
        matches!(&error, Error::SessionUnavailable(reason) if matches!(**reason, Error::ClosedByPeer)),
        "{error}"
    );
    assert!(error.is_retry_safe() && error.is_session_end());
    assert_eq!(error.io_kind(), std::io::ErrorKind::ConnectionAborted);
    let error = client.try_open().expect_err("ended");
    assert!(error.is_retry_safe(), "{error}");

    // Opens on a session closing gracefully: the same.
    let (client, _server) = duplex_pair().await;
    let closing = client.clone();
    let _drain = tokio::spawn(async move { closing.graceful_close(Duration::from_secs(5)).await });
    tokio::task::yield_now().await;
    let error = client.open().await.expect_err("closing");
    assert!(
        matches!(&error, Error::SessionUnavailable(reason) if matches!(**reason, Error::ClosedLocally)),
        "{error}"
    );
    assert!(error.is_retry_safe() && error.is_graceful());

    // This side's mistake: not retry-safe.
    assert!(!Error::WriteClosed.is_retry_safe());
    assert!(Error::Refused.is_retry_safe());
}

/// Nothing of an open that failed reaches the wire.
#[tokio::test(start_paused = true)]
async fn an_open_that_fails_writes_nothing() {
    let (session, _driver, _faults, mut raw) = raw_session(Role::Client, Config::default());
    let greeting = raw.recv().await.expect("greeting");
    assert_eq!(greeting.header.id, GREETING_ID);
    session.close().await.expect("close");
    assert!(session.open().await.expect_err("closed").is_retry_safe());
    let frame = raw.recv().await.expect("the CloseMux");
    assert_eq!(frame.header.kind, Kind::CloseMux, "no OpenStream before it");
}
