//! The close paths, refusals and dead peers: each test here failed on the code before the fix
//! it guards (RELIABILITY.md, "Close paths, refusals and dead peers"), for the reason its
//! comment gives.
//!
//! Most run on tokio's paused clock, where a hang turns into a failure of `within_for` at once
//! rather than after minutes; the few over real TCP use a generous real-time limit.

mod common;

use std::future::Future;
use std::io;
use std::time::Duration;

use common::{
    assert_same, connect, gomux_error, pattern, raw_session, within, within_for, Faulty, Transport,
};
use futures::{SinkExt, StreamExt};
use gomux::frame::{Frame, Kind};
use gomux::stream::Stopped;
use gomux::{Config, Error, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{Framed, LinesCodec};

/// Well under every close timeout these tests set: a close that waits for its timeout fails.
const PROMPT: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// Both ends closing at once while both are busy.

/// Both ends queue 1 MiB on one stream, over a pipe that holds far less, then both call
/// `Session::close` at the same moment. Before the fix neither CloseMux arrived: each driver
/// stopped reading while it flushed, so each waited for the other to read until the close
/// timeout, and both `close` calls failed with `TimedOut`.
async fn both_ends_closing_while_busy(pipe: usize) {
    const BULK: usize = 1 << 20;
    let config = Config::default()
        .receive_window(4 << 20)
        .write_buffer_size(2 << 20)
        .close_timeout(Duration::from_secs(10));
    let (a, b) = tokio::io::duplex(pipe);
    let (client, client_driver) = Session::new(a, Role::Client, config.clone());
    let (server, server_driver) = Session::new(b, Role::Server, config);
    let client_driver = tokio::spawn(client_driver);
    let server_driver = tokio::spawn(server_driver);

    let mut at_client = client.open().await.expect("open");
    at_client.write_all(b"hello").await.expect("first bytes");
    let mut at_server = within("accept", server.accept()).await.expect("accept");
    let mut hello = [0; 5];
    at_server.read_exact(&mut hello).await.expect("first bytes");

    let (up, down) = (pattern(1, BULK), pattern(2, BULK));
    within("queue the bulk", async {
        tokio::try_join!(at_client.write_all(&up), at_server.write_all(&down))
    })
    .await
    .expect("both bulks queued within the credit and the queue");

    let (closed_client, closed_server) = within_for(PROMPT, "both closes", async {
        tokio::join!(client.close(), server.close())
    })
    .await;
    closed_client.expect("the client's close is graceful");
    closed_server.expect("the server's close is graceful");
    within_for(PROMPT, "client driver", client_driver)
        .await
        .expect("driver task")
        .expect("client driver ends gracefully");
    within_for(PROMPT, "server driver", server_driver)
        .await
        .expect("driver task")
        .expect("server driver ends gracefully");

    // Everything each side queued before its close arrived, in order.
    let mut got = vec![0; BULK];
    at_server.read_exact(&mut got).await.expect("buffered data");
    assert_same(&got, &up, "client to server");
    at_client.read_exact(&mut got).await.expect("buffered data");
    assert_same(&got, &down, "server to client");
}

#[tokio::test(start_paused = true)]
async fn both_ends_closing_while_busy_over_a_64_kib_pipe_end_gracefully_with_their_data() {
    both_ends_closing_while_busy(64 * 1024).await;
}

#[tokio::test(start_paused = true)]
async fn both_ends_closing_while_busy_over_a_1_kib_pipe_end_gracefully_with_their_data() {
    both_ends_closing_while_busy(1024).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ends_closing_while_busy_over_tcp_end_gracefully_with_their_data() {
    const BULK: usize = 4 << 20;
    let config = Config::default()
        .receive_window(8 << 20)
        .write_buffer_size(8 << 20);
    let (a, b) = connect(Transport::Tcp).await;
    let client = Session::with_config(a, Role::Client, config.clone());
    let server = Session::with_config(b, Role::Server, config);
    let mut at_client = client.open().await.expect("open");
    at_client.write_all(b"x").await.expect("first byte");
    let mut at_server = within("accept", server.accept()).await.expect("accept");
    at_server.read_exact(&mut [0]).await.expect("first byte");
    let (up, down) = (pattern(3, BULK), pattern(4, BULK));
    within("queue", async {
        tokio::try_join!(at_client.write_all(&up), at_server.write_all(&down))
    })
    .await
    .expect("queued");
    let (a, b) = within("both closes, well within the 10 s close timeout", async {
        tokio::join!(client.close(), server.close())
    })
    .await;
    a.expect("client close");
    b.expect("server close");
    let mut got = vec![0; BULK];
    at_server.read_exact(&mut got).await.expect("buffered");
    assert_same(&got, &up, "client to server");
    at_client.read_exact(&mut got).await.expect("buffered");
    assert_same(&got, &down, "server to client");
}

/// A transport whose writes stall while both ends close busy: the closes finish once it takes
/// writes again, long before the close timeout.
#[tokio::test(start_paused = true)]
async fn both_ends_closing_while_busy_over_a_stalling_transport_finish_once_it_moves() {
    let config = Config::default()
        .receive_window(1 << 20)
        .write_buffer_size(1 << 20)
        .close_timeout(Duration::from_secs(10));
    let (a, b) = tokio::io::duplex(16 * 1024);
    let (a, faults) = Faulty::new(a);
    let client = Session::with_config(a, Role::Client, config.clone());
    let server = Session::with_config(b, Role::Server, config);
    let mut at_client = client.open().await.expect("open");
    at_client.write_all(b"x").await.expect("byte");
    let mut at_server = within("accept", server.accept()).await.expect("accept");
    at_server.read_exact(&mut [0]).await.expect("byte");
    let (up, down) = (pattern(5, 512 * 1024), pattern(6, 512 * 1024));
    faults.stall_writes(true);
    tokio::try_join!(at_client.write_all(&up), at_server.write_all(&down)).expect("queued");
    let closes = tokio::spawn(async move {
        let results = tokio::join!(client.close(), server.close());
        (results, at_client, at_server)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    faults.stall_writes(false);
    let ((a, b), mut at_client, mut at_server) =
        within_for(PROMPT, "closes", closes).await.expect("task");
    a.expect("client close");
    b.expect("server close");
    let mut got = vec![0; up.len()];
    at_server.read_exact(&mut got).await.expect("buffered");
    assert_same(&got, &up, "client to server");
    at_client.read_exact(&mut got).await.expect("buffered");
    assert_same(&got, &down, "server to client");
}

// ---------------------------------------------------------------------------------------------
// Refusals.

fn assert_refused(error: &io::Error, what: &str) {
    assert_eq!(
        error.kind(),
        io::ErrorKind::ConnectionRefused,
        "{what}: {error}"
    );
    assert!(
        matches!(gomux_error(error), Some(Error::Refused)),
        "{what}: the source says refused: {error:?}"
    );
}

/// Before the fix, 7 of these 8 streams read as a clean, empty end of stream: `write_all` and
/// `shutdown` succeeded and `read_to_end` returned `Ok` with nothing, so nothing could decide
/// to retry.
#[tokio::test(start_paused = true)]
async fn streams_refused_for_a_full_accept_backlog_fail_with_connection_refused() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(a);
    let server = Session::with_config(b, Role::Server, Config::default().accept_backlog(1));
    let mut streams = Vec::new();
    for _ in 0..8 {
        let mut stream = client.open().await.expect("open");
        stream.write_all(b"request\n").await.expect("queued");
        stream.shutdown().await.expect("queued");
        streams.push(stream);
    }
    let mut first = streams.remove(0);
    for (i, mut stream) in streams.into_iter().enumerate() {
        let error = within("the refusal", stream.read_to_end(&mut Vec::new()))
            .await
            .expect_err("a refused stream never reads as a clean end");
        assert_refused(&error, &format!("stream {i}"));
        assert_eq!(stream.peer_stopped(), Some(Stopped::Refused));
        let error = stream.write_all(b"more").await.expect_err("writes fail");
        assert_refused(&error, "write after the refusal");
        let error = stream.flush().await.expect_err("flush fails");
        assert_refused(&error, "flush after the refusal");
    }
    // The stream that made it into the backlog is served once accepted.
    let mut served = within("accept", server.accept()).await.expect("accept");
    let mut request = String::new();
    served.read_to_string(&mut request).await.expect("request");
    served.write_all(request.as_bytes()).await.expect("reply");
    served.shutdown().await.expect("end");
    let mut reply = String::new();
    first.read_to_string(&mut reply).await.expect("reply");
    assert_eq!(reply, "request\n");
    assert_eq!(server.stats().streams_refused, 7);
}

/// With a receive window above 64 KiB, the window announcement used to go out when the
/// stream arrived, not when it was accepted, so a stream refused while the server drained
/// showed as `Stopped::Closed`.
#[tokio::test(start_paused = true)]
async fn a_stream_refused_while_the_server_drains_is_refused_whatever_its_window() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(a);
    let server = Session::with_config(b, Role::Server, Config::default().receive_window(1 << 20));
    // One stream keeps the draining server open.
    let mut keep = client.open().await.expect("open");
    keep.write_all(b"k").await.expect("byte");
    let mut kept = within("accept", server.accept()).await.expect("accept");
    kept.read_exact(&mut [0]).await.expect("byte");
    let draining = tokio::spawn({
        let server = server.clone();
        async move { server.graceful_close(Duration::from_secs(60)).await }
    });
    tokio::task::yield_now().await;
    let mut late = client.open().await.expect("open");
    late.write_all(b"too late").await.expect("queued");
    let error = within("refusal", late.read_to_end(&mut Vec::new()))
        .await
        .expect_err("refused");
    assert_refused(&error, "stream opened into a draining server");
    drop((keep, kept));
    within("drain", draining)
        .await
        .expect("task")
        .expect("graceful close ends once the last stream is gone");
}

/// A Go peer never acknowledges a stream, so a stream it closes without a word may have been
/// handled: it must read as an ordinary end of stream, never as "refused, safe to retry".
#[tokio::test(start_paused = true)]
async fn a_stream_a_plain_peer_closes_unanswered_is_an_ordinary_end_of_stream() {
    let (client, _driver, _faults, mut peer) = raw_session(Role::Client, Config::default());
    let greeting = peer.recv().await.expect("the greeting comes first");
    assert_eq!(greeting.header.kind, Kind::Keepalive);
    let mut stream = client.open().await.expect("open");
    stream.write_all(b"request").await.expect("queued");
    peer.recv_until(stream.id(), Kind::OpenStream).await;
    // As Go does when its application closes an accepted stream without replying.
    peer.send(Frame::control(stream.id(), Kind::CloseStream))
        .await;
    let mut reply = Vec::new();
    within("end of stream", stream.read_to_end(&mut reply))
        .await
        .expect("an ordinary end of stream");
    assert!(reply.is_empty());
    assert_eq!(stream.peer_stopped(), Some(Stopped::Closed));
}

/// The refusal also crosses an HTTP client: hyper's error chain holds the gomux refusal, so a
/// client can tell that the request never reached the server's application.
#[tokio::test(start_paused = true)]
async fn hyper_over_a_refusing_server_sees_the_refusal_in_its_error() {
    use http_body_util::Empty;
    use hyper::body::Bytes;

    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(a);
    // A server whose application accepts nothing yet: the backlog of one is taken by `first`.
    let _server = Session::with_config(b, Role::Server, Config::default().accept_backlog(1));
    let first = client.open().await.expect("open");
    let stream = client.open().await.expect("open");
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .expect("handshake");
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get("/")
        .body(Empty::new())
        .expect("request");
    let error = within("the response", sender.send_request(request))
        .await
        .expect_err("no response from a refused stream");
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    let mut refused = false;
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<io::Error>() {
            refused |= io.kind() == io::ErrorKind::ConnectionRefused;
        }
        refused |= matches!(error.downcast_ref::<Error>(), Some(Error::Refused));
        source = error.source();
    }
    assert!(refused, "the error chain says refused: {error:?}");
    let _ = within("connection task", connection).await;
    drop(first);
}

// ---------------------------------------------------------------------------------------------
// The acknowledgement backlog: a burst of opens never overruns the peer.

/// The server of a line protocol: each stream gets its own task, which answers one line.
fn serve_lines(server: Session) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(stream) = server.accept().await {
            tokio::spawn(async move {
                let mut lines = Framed::new(stream, LinesCodec::new());
                if let Some(Ok(line)) = lines.next().await {
                    let _ = lines.send(format!("re: {line}")).await;
                }
            });
        }
    })
}

/// 10,000 streams opened at once, one line each, against a server with the default settings
/// whose accept loop spawns a task per stream. Before the backlog about half of them failed
/// (5,050 of 10,000): the server's driver read the whole burst of opens at once and its accept
/// queue (1,024) overflowed before the accept loop ran.
async fn ten_thousand_line_streams(transport: Transport) {
    const STREAMS: usize = 10_000;
    let (a, b) = connect(transport).await;
    let client = Session::client(a);
    let server = Session::server(b);
    let serving = serve_lines(server.clone());
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        let client = client.clone();
        clients.spawn(async move {
            let stream = client.open().await.map_err(|e| format!("open {i}: {e}"))?;
            let mut lines = Framed::new(stream, LinesCodec::new());
            lines
                .send(format!("line {i}"))
                .await
                .map_err(|e| format!("send {i}: {e}"))?;
            match lines.next().await {
                Some(Ok(reply)) if reply == format!("re: line {i}") => Ok(()),
                Some(Ok(reply)) => Err(format!("stream {i}: wrong reply {reply:?}")),
                Some(Err(e)) => Err(format!("stream {i}: {e}")),
                None => Err(format!("stream {i}: an empty reply")),
            }
        });
    }
    let mut failures = Vec::new();
    within_for(Duration::from_secs(120), "every stream's reply", async {
        while let Some(done) = clients.join_next().await {
            if let Err(failure) = done.expect("client task") {
                failures.push(failure);
            }
        }
    })
    .await;
    assert!(
        failures.is_empty(),
        "{} of {STREAMS} streams failed, the first: {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(server.stats().streams_refused, 0);
    client.close().await.expect("close");
    serving.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_concurrent_line_streams_over_tcp_all_get_their_reply() {
    ten_thousand_line_streams(Transport::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_concurrent_line_streams_over_a_64_kib_pipe_all_get_their_reply() {
    ten_thousand_line_streams(Transport::Duplex(64 * 1024)).await;
}

/// A live peer whose application stops accepting keeps `open` waiting at the backlog; a
/// cancelled wait leaves nothing behind, and an accept lets the next open in.
#[tokio::test(start_paused = true)]
async fn open_waits_while_the_peer_does_not_accept_and_a_cancelled_wait_leaves_nothing() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::with_config(a, Role::Client, Config::default().open_backlog(4));
    let server = Session::server(b);
    let mut opened = Vec::new();
    for _ in 0..4 {
        opened.push(client.open().await.expect("within the backlog"));
    }
    // The server's greeting has arrived by now (the opens above needed a poll of the driver
    // at least); give it time to be sure.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(30), client.open())
            .await
            .is_err(),
        "the fifth open waits for an acknowledgement"
    );
    assert_eq!(
        client.stream_count(),
        4,
        "the cancelled open opened nothing"
    );
    assert!(matches!(client.try_open(), Err(Error::TooManyStreams)));
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.open().await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "still waiting");
    let accepted = within("accept", server.accept()).await.expect("accept");
    let fifth = within("the open let in by the accept", waiting)
        .await
        .expect("task")
        .expect("open");
    assert_eq!(client.stream_count(), 5);
    drop((accepted, fifth, opened));
}

/// A peer that dies while opens wait ends the wait with the session's error.
#[tokio::test(start_paused = true)]
async fn a_session_that_ends_ends_the_wait_of_open() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::with_config(a, Role::Client, Config::default().open_backlog(1));
    let server = Session::server(b);
    let first = client.open().await.expect("open");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.open().await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished());
    server.close().await.expect("close");
    let error = within("the wait ends", waiting)
        .await
        .expect("task")
        .expect_err("the session ended");
    assert!(
        matches!(&error, Error::SessionUnavailable(reason) if matches!(**reason, Error::ClosedByPeer)),
        "{error:?}"
    );
    drop(first);
}

/// Towards a Go peer (its first frame is no greeting) nothing waits: Go acknowledges nothing.
#[tokio::test(start_paused = true)]
async fn opens_towards_a_plain_peer_never_wait_for_acknowledgements() {
    let config = Config::default().open_backlog(2);
    let (client, _driver, _faults, mut peer) = raw_session(Role::Client, config);
    // Go's first frame, whatever it is, is no greeting.
    peer.send(Frame::control(0, Kind::Keepalive)).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let opens = within_for(PROMPT, "300 opens at once", async {
        let mut streams = Vec::new();
        for _ in 0..300 {
            streams.push(client.open().await.expect("open"));
        }
        streams
    })
    .await;
    assert_eq!(opens.len(), 300);
}

/// Until the peer's first frame, opens beyond the backlog wait for it at most a second: a Go
/// peer that says nothing holds a burst up that long, no longer.
#[tokio::test(start_paused = true)]
async fn opens_wait_for_a_silent_peer_at_most_a_second() {
    let config = Config::default().open_backlog(2);
    let (client, _driver, _faults, _peer) = raw_session(Role::Client, config);
    let start = tokio::time::Instant::now();
    let mut streams = Vec::new();
    for _ in 0..10 {
        streams.push(within("open", client.open()).await.expect("open"));
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited <= Duration::from_millis(1100),
        "waited {waited:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Dead peers.

/// With the defaults (a keepalive every 30 s, announced in the greeting), a peer of this crate
/// whose connection goes silent both ways is noticed within twice that. Before, nothing
/// noticed it: keepalives were one-way and the idle timeout off.
#[tokio::test(start_paused = true)]
async fn a_peer_that_dies_idle_is_noticed_within_twice_its_keepalive_interval() {
    let (after, reason) = silent_peer(Config::default(), Duration::from_secs(5)).await;
    assert!(after <= Duration::from_secs(61), "noticed after {after:?}");
    assert!(
        matches!(reason, Some(Error::KeepaliveTimeout)),
        "{reason:?}"
    );
}

/// With an idle timeout as well as the peer's announced keepalive, the shorter silence ends the
/// session, with its own error: the idle timeout's below twice the peer's keepalive interval
/// (60 s with the defaults), the peer's liveness above it.
#[tokio::test(start_paused = true)]
async fn a_silent_peer_ends_the_session_at_the_shorter_of_the_idle_timeout_and_its_liveness() {
    for (idle, expected, within_secs) in [
        (20, Error::IdleTimeout, 21),
        (120, Error::KeepaliveTimeout, 61),
    ] {
        let config = Config::default().idle_timeout(Some(Duration::from_secs(idle)));
        // A second in, the greeting has come: the peer's liveness is known. The silence counts
        // from the last frame read, up to a second before it starts.
        let (after, reason) = silent_peer(config, Duration::from_secs(1)).await;
        assert!(
            after >= Duration::from_secs(within_secs - 3)
                && after <= Duration::from_secs(within_secs),
            "idle timeout {idle} s: noticed after {after:?}"
        );
        assert!(
            reason
                .as_ref()
                .is_some_and(|r| std::mem::discriminant(r) == std::mem::discriminant(&expected)),
            "idle timeout {idle} s: {reason:?}"
        );
    }
}

/// A client session (`config`) and a server of this crate with a stream open; after `settle`
/// the server goes silent both ways without a word. Returns how long after that the client's
/// session ended, and why (paused clock).
async fn silent_peer(config: Config, settle: Duration) -> (Duration, Option<Error>) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (a, faults) = Faulty::new(a);
    let client = Session::with_config(a, Role::Client, config);
    let _server = Session::server(b);
    let stream = client.open().await.expect("open");
    tokio::time::sleep(settle).await;
    faults.pause_reads(true);
    faults.stall_writes(true);
    let silent = tokio::time::Instant::now();
    within_for(Duration::from_secs(200), "the silence noticed", async {
        while client.close_reason().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let after = silent.elapsed();
    drop(stream);
    (after, client.close_reason())
}

/// A writer blocked on the credit of a peer that died learns it too.
#[tokio::test(start_paused = true)]
async fn a_writer_waiting_for_the_credit_of_a_dead_peer_fails_with_timed_out() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (a, faults) = Faulty::new(a);
    let client = Session::client(a);
    let server = Session::server(b);
    let mut stream = client.open().await.expect("open");
    stream.write_all(b"x").await.expect("byte");
    let _held = within("accept", server.accept()).await.expect("accept");
    // The server reads nothing: the writer spends its 64 KiB of credit and waits.
    let writer = tokio::spawn(async move { stream.write_all(&vec![1; 1 << 20]).await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!writer.is_finished(), "blocked on credit");
    faults.pause_reads(true);
    faults.stall_writes(true);
    let error = within_for(Duration::from_secs(70), "the writer fails", writer)
        .await
        .expect("task")
        .expect_err("the peer is dead");
    assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
    assert!(matches!(gomux_error(&error), Some(Error::KeepaliveTimeout)));
}

/// A Go peer sends a keepalive only after ten quiet minutes and may return no credit for as
/// long: fifteen minutes of either never cut it.
#[tokio::test(start_paused = true)]
async fn a_go_like_peer_silent_or_reading_nothing_for_fifteen_minutes_is_not_cut() {
    let (client, driver, _faults, mut peer) = raw_session(Role::Client, Config::default());
    peer.send(Frame::control(0, Kind::Keepalive)).await;
    let mut stream = client.open().await.expect("open");
    // It reads nothing of what the stream sends beyond the first credit.
    let writer = tokio::spawn(async move {
        let _ = stream.write_all(&vec![0; 1 << 20]).await;
        stream
    });
    let silence = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(15 * 60)).await;
        peer
    });
    let _peer = within_for(Duration::from_secs(16 * 60), "fifteen minutes", silence)
        .await
        .expect("task");
    assert!(
        client.close_reason().is_none(),
        "{:?}",
        client.close_reason()
    );
    assert!(
        !writer.is_finished(),
        "still waiting for credit, not failed"
    );
    assert!(!driver.is_finished());
}

/// A peer of this crate that announced no keepalive is never expected to say anything.
#[tokio::test(start_paused = true)]
async fn a_peer_without_keepalives_is_not_cut_for_its_silence() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(a);
    let _server = Session::with_config(b, Role::Server, Config::default().keepalive_interval(None));
    let _stream = client.open().await.expect("open");
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;
    assert!(client.close_reason().is_none());
}

// ---------------------------------------------------------------------------------------------
// A pause is not a death.

/// A transport whose reads see new bytes only a millisecond after they are asked for, as a
/// socket's readiness reaches tokio only when its runtime next polls for I/O.
struct Laggy<T> {
    inner: T,
    lag: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Laggy<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let this = &mut *self;
        let lag = this
            .lag
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(1))));
        if lag.as_mut().poll(cx).is_pending() {
            return std::task::Poll::Pending;
        }
        let polled = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if polled.is_pending() {
            this.lag = None;
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Laggy<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A process paused for longer than its idle timeout (a VM paused, a debugger, a laptop
/// asleep) used to end a healthy session with `IdleTimeout` on resuming: its idle timer
/// fired before its runtime had polled the socket, where seconds of the peer's keepalives
/// were waiting. The driver now looks once more before it believes the silence.
#[tokio::test(start_paused = true)]
async fn a_session_resumed_after_a_pause_reads_what_waits_before_calling_the_peer_idle() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let config = Config::default()
        .idle_timeout(Some(Duration::from_secs(1)))
        .keepalive_interval(None);
    let (client, connection) = Session::new(
        Laggy {
            inner: a,
            lag: None,
        },
        Role::Client,
        config,
    );
    let _server = Session::with_config(
        b,
        Role::Server,
        Config::default().keepalive_interval(Some(Duration::from_millis(100))),
    );
    let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let driver = tokio::spawn({
        let paused = std::sync::Arc::clone(&paused);
        let mut connection = Box::pin(connection);
        async move {
            loop {
                if paused.load(std::sync::atomic::Ordering::SeqCst) {
                    // The whole process stands still: the driver is not polled.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                tokio::select! {
                    result = &mut connection => return result,
                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
        }
    });
    let _stream = client.open().await.expect("open");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(client.close_reason().is_none(), "alive while not paused");
    paused.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    paused.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        client.close_reason().is_none(),
        "the keepalives waiting in the transport show the peer alive: {:?}",
        client.close_reason()
    );
    assert!(!driver.is_finished());
}

/// An open waiting for `max_streams` while the peer has said nothing yet waits for a stream to
/// go, past the greeting's wait too, without spinning; a stream that goes lets it in.
#[tokio::test(start_paused = true)]
async fn an_open_waiting_for_max_streams_past_the_greeting_wait_is_let_in_when_a_stream_goes() {
    let config = Config::default().max_streams(1);
    let (client, _driver, _faults, _peer) = raw_session(Role::Client, config);
    let first = client.open().await.expect("open");
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.open().await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!waiting.is_finished(), "waits for the stream to go");
    drop(first);
    within("the open let in", waiting)
        .await
        .expect("task")
        .expect("open");
}
