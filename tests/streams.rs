//! Behaviour of sessions and streams between two gomux sessions.
//!
//! Most scenarios run on three transports: a roomy in-memory pipe, a tiny one (64 bytes, so
//! every frame is split across many transport reads and writes, which shakes out deadlocks and
//! lost wake-ups) and real loopback TCP.

mod common;

use std::io;
use std::time::Duration;

use common::{
    assert_same, connect, gomux_error, pattern, round_trip, sessions, sessions_with, spawn_echo,
    within, within_for, Transport,
};
use futures::StreamExt;
use gomux::{Config, Error, Role, Session};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
/// The credit each stream direction starts with.
const WINDOW: usize = 64 * KIB;

/// Runs each named scenario `async fn name(Transport)` once per transport, as separate tests
/// in a module of the same name.
macro_rules! on_every_transport {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::Transport;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn duplex() {
                super::$name(Transport::Duplex(256 * 1024)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn duplex_tiny() {
                super::$name(Transport::Duplex(64)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tcp() {
                super::$name(Transport::Tcp).await;
            }
        }
    )*};
}

on_every_transport!(
    echo_both_roles,
    thousand_concurrent_streams,
    half_close_both_ways,
    close_while_peer_reads,
    close_read_fails_peer_writes,
    session_close_keeps_buffered_data,
    split_into_halves_across_tasks,
    split_with_tokio_across_tasks,
    unread_stream_does_not_stall_others,
    large_transfer,
    drop_closes_without_losing_data,
    max_streams_refuses_only_that_open,
    accept_backlog_overflow_refuses_extra_streams,
    incoming_yields_streams_and_ends,
    dropping_every_handle_ends_the_driver,
    dropping_every_handle_ends_the_driver_after_peer_closed_the_stream,
);

/// Asserts `result` failed with an I/O error of `kind` carrying a gomux error that `check`
/// accepts.
#[track_caller]
fn assert_io_error<T: std::fmt::Debug>(
    result: io::Result<T>,
    kind: io::ErrorKind,
    check: impl FnOnce(&Error) -> bool,
    what: &str,
) {
    let error = result.expect_err(what);
    assert_eq!(error.kind(), kind, "{what}: {error}");
    let inner = gomux_error(&error).unwrap_or_else(|| panic!("{what}: no gomux error in {error}"));
    assert!(check(inner), "{what}: unexpected {inner:?}");
}

async fn echo_both_roles(transport: Transport) {
    within("echo with each role opening", async {
        let (client, server) = sessions(transport).await;
        let _server_echo = spawn_echo(server.clone());
        let _client_echo = spawn_echo(client.clone());

        // More than one window each way, so the echo also needs credit to flow back.
        let request = pattern(1, 200 * KIB);
        let stream = client.open().await.expect("client opens");
        assert_eq!(stream.id() % 2, 0, "the client opens even ids");
        let echoed = round_trip(stream, &request).await;
        assert_same(&echoed, &request, "echo of a client-opened stream");

        let request = pattern(2, 200 * KIB);
        let stream = server.open().await.expect("server opens");
        assert_eq!(stream.id() % 2, 1, "the server opens odd ids");
        let echoed = round_trip(stream, &request).await;
        assert_same(&echoed, &request, "echo of a server-opened stream");

        client.close().await.expect("graceful close");
    })
    .await;
}

async fn thousand_concurrent_streams(transport: Transport) {
    const STREAMS: u64 = 1000;
    within("1000 concurrent echoed streams", async {
        // Opens that arrive while the accept queue is full are refused by design; the queue
        // must hold every stream that may arrive in one burst.
        let server_config = Config::default().accept_backlog(2 * STREAMS as usize);
        let (client, server) = sessions_with(transport, Config::default(), server_config).await;
        let _echo = spawn_echo(server.clone());

        let mut tasks = Vec::new();
        for i in 0..STREAMS {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let request = pattern(i, 2 * KIB + (i as usize * 37) % (4 * KIB));
                let stream = client.open().await.expect("open one of 1000 streams");
                let echoed = round_trip(stream, &request).await;
                assert_same(&echoed, &request, &format!("echo on stream {i}"));
            }));
        }
        for task in tasks {
            task.await.expect("stream task succeeded");
        }
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn half_close_both_ways(transport: Transport) {
    within("half-close in each direction", async {
        let (client, server) = sessions(transport).await;
        // The client's stream, then the server's: the opener stops writing first each time.
        half_close_exchange(&client, &server, b"question", b"answer").await;
        half_close_exchange(&server, &client, b"ping", b"pong").await;
        client.close().await.expect("graceful close");
    })
    .await;
}

/// `opener` sends `request` and half-closes; a write after that fails. The other side reads
/// end-of-stream after the request, can still answer, and half-closes in turn.
async fn half_close_exchange(opener: &Session, acceptor: &Session, request: &[u8], reply: &[u8]) {
    let mut outbound = opener.open().await.expect("open");
    outbound.write_all(request).await.expect("write");
    outbound.shutdown().await.expect("half-close");
    assert_io_error(
        outbound.write_all(b"more").await,
        io::ErrorKind::BrokenPipe,
        |e| matches!(e, Error::WriteClosed),
        "a write after shutdown fails",
    );
    let mut inbound = acceptor.accept().await.expect("accept");
    let mut got = Vec::new();
    inbound.read_to_end(&mut got).await.expect("read to EOF");
    assert_eq!(got, request);
    inbound
        .write_all(reply)
        .await
        .expect("write back after EOF");
    inbound.shutdown().await.expect("half-close back");
    let mut got = Vec::new();
    outbound
        .read_to_end(&mut got)
        .await
        .expect("read the answer");
    assert_eq!(got, reply);
}

async fn close_while_peer_reads(transport: Transport) {
    within("close while the peer reads", async {
        let (client, server) = sessions(transport).await;
        let mut outbound = client.open().await.expect("client opens");
        outbound.write_all(b"x").await.expect("announce the stream");
        let mut inbound = server.accept().await.expect("server accepts");

        // The reader is already waiting when the data and the close arrive.
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            inbound.read_to_end(&mut got).await.expect("read to EOF");
            got
        });
        let body = pattern(3, 100 * KIB);
        outbound.write_all(&body).await.expect("write the body");
        outbound.close().await.expect("stream close flushes");

        let got = reader.await.expect("reader task");
        assert_eq!(got[0], b'x');
        assert_same(&got[1..], &body, "data before the close");

        assert_io_error(
            outbound.write_all(b"late").await,
            io::ErrorKind::BrokenPipe,
            |e| matches!(e, Error::WriteClosed),
            "a write after close fails",
        );
        let mut rest = Vec::new();
        outbound
            .read_to_end(&mut rest)
            .await
            .expect("a closed stream reads end-of-stream");
        assert!(rest.is_empty());
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn close_read_fails_peer_writes(transport: Transport) {
    within("close_read makes the peer's writes fail", async {
        let (client, server) = sessions(transport).await;
        let mut outbound = client.open().await.expect("client opens");
        outbound.write_all(b"hello").await.expect("first write");
        let mut inbound = server.accept().await.expect("server accepts");
        let mut first = [0u8; 5];
        inbound.read_exact(&mut first).await.expect("first read");
        assert_eq!(&first, b"hello");

        inbound.close_read();
        let mut rest = Vec::new();
        inbound
            .read_to_end(&mut rest)
            .await
            .expect("reads end after close_read");
        assert!(rest.is_empty());

        // Writes that left before the CloseWrite arrived succeed; after that they fail.
        let chunk = [7u8; KIB];
        let failure = loop {
            match outbound.write(&chunk).await {
                Ok(n) => assert!(n > 0),
                Err(error) => break error,
            }
        };
        assert_io_error::<()>(
            Err(failure),
            io::ErrorKind::BrokenPipe,
            |e| matches!(e, Error::PeerReadClosed),
            "writes after the peer's close_read",
        );

        // The other direction still works.
        inbound.write_all(b"still here").await.expect("write back");
        inbound.shutdown().await.expect("half-close");
        let mut got = Vec::new();
        outbound.read_to_end(&mut got).await.expect("read back");
        assert_eq!(got, b"still here");
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn session_close_keeps_buffered_data(transport: Transport) {
    within("session close with data buffered at the peer", async {
        let (client, server) = sessions(transport).await;
        let mut outbound = client.open().await.expect("client opens");
        let body = pattern(4, 10 * KIB);
        outbound.write_all(&body).await.expect("write");
        client
            .close()
            .await
            .expect("the closing side's close is Ok");

        assert!(matches!(server.closed().await, Error::ClosedByPeer));
        assert!(matches!(server.close_reason(), Some(Error::ClosedByPeer)));
        // The stream arrived before the CloseMux: it can still be accepted and read.
        let mut inbound = server.accept().await.expect("queued stream");
        let mut got = vec![0u8; body.len()];
        inbound.read_exact(&mut got).await.expect("buffered data");
        assert_same(&got, &body, "data buffered before the close");
        let mut byte = [0u8; 1];
        assert_io_error(
            inbound.read(&mut byte).await,
            io::ErrorKind::ConnectionAborted,
            |e| matches!(e, Error::ClosedByPeer),
            "a read past the buffered data",
        );
        assert!(matches!(server.accept().await, Err(Error::ClosedByPeer)));
        assert!(matches!(client.closed().await, Error::ClosedLocally));
        assert!(matches!(
            client.open().await,
            Err(Error::SessionUnavailable(reason)) if matches!(*reason, Error::ClosedLocally)
        ));
    })
    .await;
}

/// Writes `body` (then half-closes) in one task while another reads to end-of-stream; returns
/// what was read.
async fn write_and_read_in_two_tasks<R, W>(mut reader: R, mut writer: W, body: Vec<u8>) -> Vec<u8>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let write = tokio::spawn(async move {
        writer.write_all(&body).await.expect("write");
        writer.shutdown().await.expect("half-close");
    });
    let read = tokio::spawn(async move {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.expect("read");
        got
    });
    write.await.expect("writer task");
    read.await.expect("reader task")
}

/// A client stream echoed by the server, read and written from two separate tasks, with far
/// more than one window each way so credit updates must flow while both tasks are blocked.
async fn split_into_halves_across_tasks(transport: Transport) {
    within("into_split halves in two tasks", async {
        let (client, server) = sessions(transport).await;
        let _echo = spawn_echo(server.clone());
        let stream = client.open().await.expect("client opens");
        let (reader, writer) = stream.into_split();
        let body = pattern(5, MIB);
        let got = write_and_read_in_two_tasks(reader, writer, body.clone()).await;
        assert_same(&got, &body, "echo through split halves");
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn split_with_tokio_across_tasks(transport: Transport) {
    within("tokio::io::split halves in two tasks", async {
        let (client, server) = sessions(transport).await;
        // The echo side uses tokio's split as well.
        let echo = tokio::spawn(async move {
            let stream = server.accept().await.expect("server accepts");
            let (mut reader, mut writer) = tokio::io::split(stream);
            let copy = tokio::spawn(async move {
                let mut buf = vec![0u8; 8 * KIB];
                loop {
                    let n = reader.read(&mut buf).await.expect("echo read");
                    if n == 0 {
                        break;
                    }
                    writer.write_all(&buf[..n]).await.expect("echo write");
                }
                writer.shutdown().await.expect("echo half-close");
            });
            copy.await.expect("echo copy task");
            server
        });
        let stream = client.open().await.expect("client opens");
        let (reader, writer) = tokio::io::split(stream);
        let body = pattern(6, MIB);
        let got = write_and_read_in_two_tasks(reader, writer, body.clone()).await;
        assert_same(&got, &body, "echo through tokio split halves");
        let _server = echo.await.expect("echo task");
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn unread_stream_does_not_stall_others(transport: Transport) {
    const OTHERS: u64 = 20;
    // Over the 64-byte pipe this moves its megabytes 64 bytes per call: about 13 s of real time
    // on an idle 2-core machine, beside the binary's other tests. The limit only turns a hang
    // into a failure, so it leaves room for a busy machine.
    within_for(
        Duration::from_secs(180),
        "an unread stream does not stall the others",
        async {
            let (client, server) = sessions(transport).await;

            let stuck = client.open().await.expect("open the stream nobody reads");
            let stuck_body = pattern(100, WINDOW + 16 * KIB);
            let sent = stuck_body.clone();
            let mut stuck_writer = tokio::spawn(async move {
                let mut stuck = stuck;
                // Blocks once the window is spent: nobody reads on the other side yet.
                stuck
                    .write_all(&sent)
                    .await
                    .expect("write into the unread stream");
                stuck.shutdown().await.expect("half-close");
            });
            // The server takes the stream but does not read it; wait until its whole window has
            // arrived, so the writer is surely blocked before the other streams start.
            let mut unread = server.accept().await.expect("accept the unread stream");
            while unread.buffered() < WINDOW {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert_eq!(unread.buffered(), WINDOW, "never more than the window");

            let acceptor = tokio::spawn({
                let server = server.clone();
                async move {
                    let mut readers = Vec::new();
                    for _ in 0..OTHERS {
                        let mut stream = server.accept().await.expect("accept");
                        readers.push(tokio::spawn(async move {
                            let mut got = Vec::new();
                            stream.read_to_end(&mut got).await.expect("read");
                            (stream.id(), got)
                        }));
                    }
                    readers
                }
            });
            let mut writers = Vec::new();
            let mut expected = std::collections::HashMap::new();
            for i in 0..OTHERS {
                let mut stream = client.open().await.expect("open");
                let body = pattern(i, MIB);
                expected.insert(stream.id(), body.clone());
                writers.push(tokio::spawn(async move {
                    stream.write_all(&body).await.expect("write 1 MiB");
                    stream.shutdown().await.expect("half-close");
                }));
            }
            for writer in writers {
                writer.await.expect("writer task");
            }
            for reader in acceptor.await.expect("acceptor task") {
                let (id, got) = reader.await.expect("reader task");
                assert_same(&got, &expected[&id], &format!("stream {id}"));
            }

            // The unread stream still holds exactly its window and its writer is still waiting.
            assert_eq!(unread.buffered(), WINDOW);
            assert!(
                tokio::time::timeout(Duration::from_millis(50), &mut stuck_writer)
                    .await
                    .is_err(),
                "the writer of the unread stream cannot have finished"
            );
            let mut got = Vec::new();
            unread.read_to_end(&mut got).await.expect("read late");
            assert_same(&got, &stuck_body, "the late-read stream");
            stuck_writer.await.expect("the blocked writer finished");
            client.close().await.expect("graceful close");
        },
    )
    .await;
}

async fn large_transfer(transport: Transport) {
    within("8 MiB on one stream", async {
        let (client, server) = sessions(transport).await;
        let body = pattern(7, 8 * MIB);
        let sent = body.clone();
        let writer = tokio::spawn(async move {
            let mut stream = client.open().await.expect("client opens");
            stream.write_all(&sent).await.expect("write 8 MiB");
            stream.shutdown().await.expect("half-close");
            client
        });
        let mut inbound = server.accept().await.expect("server accepts");
        let mut got = Vec::with_capacity(body.len());
        inbound.read_to_end(&mut got).await.expect("read 8 MiB");
        assert_same(&got, &body, "large transfer");
        let client = writer.await.expect("writer task");
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn drop_closes_without_losing_data(transport: Transport) {
    within("drop sends CloseStream after the data", async {
        let (client, server) = sessions(transport).await;

        // Small: the whole write fits the window; the stream is dropped before the peer even
        // accepted it.
        let small = pattern(8, 4 * KIB);
        let mut stream = client.open().await.expect("open");
        stream.write_all(&small).await.expect("write");
        drop(stream);
        let mut inbound = server.accept().await.expect("accept");
        let mut got = Vec::new();
        inbound.read_to_end(&mut got).await.expect("read to EOF");
        assert_same(&got, &small, "small write then drop");

        // Large: several windows, read while written; the drop follows the last write at once.
        let large = pattern(9, 300 * KIB);
        let reader = tokio::spawn({
            let server = server.clone();
            async move {
                let mut inbound = server.accept().await.expect("accept");
                let mut got = Vec::new();
                inbound.read_to_end(&mut got).await.expect("read to EOF");
                got
            }
        });
        let mut stream = client.open().await.expect("open");
        stream.write_all(&large).await.expect("write");
        drop(stream);
        let got = reader.await.expect("reader task");
        assert_same(&got, &large, "large write then drop");
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn max_streams_refuses_only_that_open(transport: Transport) {
    within("max_streams", async {
        let client_config = Config::default().max_streams(3);
        let (client, server) = sessions_with(transport, client_config, Config::default()).await;
        let _echo = spawn_echo(server.clone());

        let first = client.open().await.expect("open 1");
        let _second = client.open().await.expect("open 2");
        let _third = client.open().await.expect("open 3");
        // `try_open` answers at once; `open` would wait for a stream to go.
        assert!(matches!(client.try_open(), Err(Error::TooManyStreams)));
        assert!(!client.is_closed(), "only the open failed");

        let echoed = round_trip(first, b"still working").await;
        assert_eq!(echoed, b"still working");

        // The first stream is gone, so there is room for one more.
        let fourth = client.open().await.expect("open after a stream was freed");
        let echoed = round_trip(fourth, b"fourth").await;
        assert_eq!(echoed, b"fourth");
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn accept_backlog_overflow_refuses_extra_streams(transport: Transport) {
    within("accept backlog overflow", async {
        let server_config = Config::default().accept_backlog(2);
        let (client, server) = sessions_with(transport, Config::default(), server_config).await;

        let mut opened = Vec::new();
        for _ in 0..5 {
            opened.push(client.open().await.expect("open"));
        }
        for (i, stream) in opened.iter_mut().take(2).enumerate() {
            stream
                .write_all(format!("queued {i}").as_bytes())
                .await
                .expect("write on a queued stream");
        }
        // Streams 3 to 5 arrived while the queue was full: the server answers CloseStream
        // before any acknowledgement, so their reads and writes fail as refused.
        for stream in opened.iter_mut().skip(2) {
            assert_io_error(
                stream.read_to_end(&mut Vec::new()).await,
                io::ErrorKind::ConnectionRefused,
                |e| matches!(e, Error::Refused),
                "a read on a refused stream",
            );
            assert_io_error(
                stream.write_all(b"refused?").await,
                io::ErrorKind::ConnectionRefused,
                |e| matches!(e, Error::Refused),
                "a write on a refused stream",
            );
        }

        // The queued ones are intact and the session keeps working.
        for (i, stream) in opened.iter_mut().take(2).enumerate() {
            let mut inbound = server.accept().await.expect("accept a queued stream");
            assert_eq!(inbound.id(), stream.id());
            let want = format!("queued {i}");
            let mut got = vec![0u8; want.len()];
            inbound.read_exact(&mut got).await.expect("read");
            assert_eq!(got, want.as_bytes());
            inbound.write_all(b"reply").await.expect("reply");
            let mut reply = [0u8; 5];
            stream.read_exact(&mut reply).await.expect("read reply");
            assert_eq!(&reply, b"reply");
        }
        let mut late = client.open().await.expect("open after the overflow");
        late.write_all(b"late").await.expect("write");
        let mut inbound = server.accept().await.expect("accept the late stream");
        assert_eq!(inbound.id(), late.id());
        let mut got = [0u8; 4];
        inbound.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"late");
        assert!(!server.is_closed() && !client.is_closed());
        client.close().await.expect("graceful close");
    })
    .await;
}

async fn incoming_yields_streams_and_ends(transport: Transport) {
    within("incoming()", async {
        // Ended by the peer: the streams, then the end, with no error for a graceful close.
        let (client, server) = sessions(transport).await;
        let mut incoming = server.incoming();
        let mut ids = Vec::new();
        for i in 0..3u8 {
            let mut stream = client.open().await.expect("open");
            stream.write_all(&[i; 3]).await.expect("write");
            stream.shutdown().await.expect("half-close");
            ids.push(stream.id());
        }
        for (i, id) in ids.into_iter().enumerate() {
            let mut stream = incoming
                .next()
                .await
                .expect("a stream, not the end")
                .expect("not an error");
            assert_eq!(stream.id(), id);
            let mut got = Vec::new();
            stream.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, [i as u8; 3]);
        }
        client.close().await.expect("graceful close");
        assert!(incoming.next().await.is_none());
        assert!(incoming.next().await.is_none(), "it stays ended");

        // Ended locally: no error, just the end.
        let (client, server) = sessions(transport).await;
        let mut incoming = server.incoming();
        let waiting = tokio::spawn(async move { incoming.next().await.is_none() });
        server.close().await.expect("graceful close");
        assert!(waiting.await.expect("incoming task"), "incoming ended");
        assert!(matches!(client.closed().await, Error::ClosedByPeer));
    })
    .await;
}

async fn dropping_every_handle_ends_the_driver(transport: Transport) {
    within("dropping all handles ends the driver", async {
        // No streams at all.
        let (a, b) = connect(transport).await;
        let (client, connection) = Session::new(a, Role::Client, Config::default());
        let driver = tokio::spawn(connection);
        let server = Session::server(b);
        drop(client);
        let outcome = driver.await.expect("the driver did not panic");
        assert!(outcome.is_ok(), "graceful end: {outcome:?}");
        assert!(matches!(server.closed().await, Error::ClosedByPeer));

        // A stream outlives its session handle and keeps working; dropping it ends the driver.
        let (a, b) = connect(transport).await;
        let (client, connection) = Session::new(a, Role::Client, Config::default());
        let driver = tokio::spawn(connection);
        let server = Session::server(b);
        let mut stream = client.open().await.expect("open");
        drop(client);
        stream
            .write_all(b"after the session handle")
            .await
            .expect("write");
        let mut inbound = server.accept().await.expect("accept");
        let mut got = [0u8; 24];
        inbound.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"after the session handle");
        inbound.write_all(b"back").await.expect("write back");
        let mut back = [0u8; 4];
        stream.read_exact(&mut back).await.expect("read back");
        assert_eq!(&back, b"back");
        drop(stream);
        let outcome = driver.await.expect("the driver did not panic");
        assert!(outcome.is_ok(), "graceful end: {outcome:?}");
        assert!(matches!(server.closed().await, Error::ClosedByPeer));
    })
    .await;
}

async fn dropping_every_handle_ends_the_driver_after_peer_closed_the_stream(transport: Transport) {
    within(
        "dropping the last stream, closed by the peer, ends the driver",
        async {
            let (a, b) = connect(transport).await;
            let (client, connection) = Session::new(a, Role::Client, Config::default());
            let driver = tokio::spawn(connection);
            let server = Session::server(b);
            let mut stream = client.open().await.expect("open");
            stream.write_all(b"x").await.expect("write");
            drop(client);
            let mut inbound = server.accept().await.expect("accept");
            let mut got = [0u8; 1];
            inbound.read_exact(&mut got).await.expect("read");
            drop(inbound); // CloseStream to the client.
            let mut rest = Vec::new();
            stream
                .read_to_end(&mut rest)
                .await
                .expect("the peer's close reads as end-of-stream");
            // The stream was closed by the peer, so dropping it sends nothing; the driver must still
            // notice that nothing uses the session any more.
            drop(stream);
            let outcome = within("the driver ends", driver)
                .await
                .expect("the driver did not panic");
            assert!(outcome.is_ok(), "graceful end: {outcome:?}");
            assert!(matches!(server.closed().await, Error::ClosedByPeer));
        },
    )
    .await;
}

// Keepalive and idle timeout run on paused time: the runtime jumps ahead whenever every task
// waits, so minutes pass instantly and the timers are exact.

/// Generous virtual-time bound for the timer tests.
const VIRTUAL_STEP: Duration = Duration::from_secs(600);

#[tokio::test(start_paused = true)]
async fn keepalives_hold_off_the_peers_idle_timeout() {
    within_for(VIRTUAL_STEP, "keepalive", async {
        let client_config = Config::default().keepalive_interval(Some(Duration::from_secs(2)));
        let server_config = Config::default()
            .keepalive_interval(None)
            .idle_timeout(Some(Duration::from_secs(5)));
        let (client, server) =
            sessions_with(Transport::Duplex(64 * KIB), client_config, server_config).await;

        // Twelve idle timeouts' worth of silence from the application.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            server.close_reason().is_none(),
            "{:?}",
            server.close_reason()
        );
        assert!(
            client.close_reason().is_none(),
            "{:?}",
            client.close_reason()
        );

        let _echo = spawn_echo(server.clone());
        let stream = client.open().await.expect("open after the idle period");
        assert_eq!(round_trip(stream, b"alive").await, b"alive");
        client.close().await.expect("graceful close");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_ends_a_silent_session() {
    within_for(VIRTUAL_STEP, "idle timeout", async {
        let client_config = Config::default().keepalive_interval(None);
        let server_config = Config::default()
            .keepalive_interval(None)
            .idle_timeout(Some(Duration::from_secs(5)));
        let (client, server) =
            sessions_with(Transport::Duplex(64 * KIB), client_config, server_config).await;
        let mut stream = server.open().await.expect("open");
        stream.write_all(b"x").await.expect("write");
        let mut inbound = client.accept().await.expect("accept");
        let mut got = [0u8; 1];
        inbound.read_exact(&mut got).await.expect("read");

        let start = tokio::time::Instant::now();
        assert!(matches!(server.closed().await, Error::IdleTimeout));
        assert!(
            start.elapsed() >= Duration::from_secs(4),
            "not before the timeout: {:?}",
            start.elapsed()
        );
        let mut byte = [0u8; 1];
        assert_io_error(
            stream.read(&mut byte).await,
            io::ErrorKind::TimedOut,
            |e| matches!(e, Error::IdleTimeout),
            "a stream of the timed-out session",
        );
        // The peer is told with CloseMux.
        assert!(matches!(client.closed().await, Error::ClosedByPeer));
    })
    .await;
}
