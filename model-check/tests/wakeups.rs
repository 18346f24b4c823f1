//! The wake-up protocol between gomux's handles and its driver, under shuttle's randomized
//! schedulers (`shuttle::check_random`, and `shuttle::check_pct` with depth 3).
//!
//! Each scenario runs two sessions over a `tokio::io::duplex`, their drivers and the
//! application's tasks as shuttle tasks: shuttle decides, at every point where a task returns
//! `Pending` or finishes, which runnable task is polled next, and tries a different order in
//! each iteration. Tokio's timers are never driven (a runtime is entered only so that the
//! crate can create them): a wait that nothing but a timer would end, such as a close that
//! waits for the close timeout, or a task that registered its waker where nobody wakes it, is a
//! deadlock, which shuttle reports with the schedule that led to it.
//!
//! What it does not explore: the core is guarded by a `std::sync::Mutex`, which shuttle does
//! not instrument, so the interleavings it tries are those of whole polls of tasks (each of
//! which takes and releases the lock one or more times), not of two threads inside the core at
//! once. Those are exercised on real threads by the multi-threaded tests of the main crate.
//!
//! Run with `cargo test --manifest-path model-check/Cargo.toml` (debug build: about 30 s for
//! the scenarios of this file on a loaded 2-core machine).

mod support;

use std::time::Duration;

use gomux::stream::Stopped;
use gomux::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::{check, content, sessions};

/// Credit and room: 150 KiB (over two windows) through a 256-byte queue, then `Stream::close`
/// waits for its bytes; the reader reads all of it; then the client closes the session.
#[test]
fn credit_room_and_stream_close() {
    check(|| {
        shuttle::future::block_on(async {
            let (client, server) = sessions();
            let reader = shuttle::future::spawn(async move {
                let mut stream = server.accept().await.expect("accept");
                let mut got = Vec::new();
                stream.read_to_end(&mut got).await.expect("read to the end");
                (got, server)
            });
            let data = content(150 * 1024);
            let mut stream = client.open().await.expect("open");
            stream.write_all(&data).await.expect("write");
            stream.close().await.expect("Stream::close");
            let (got, server) = reader.await.expect("reader");
            assert!(got == data, "read {} of {} bytes", got.len(), data.len());
            client.close().await.expect("Session::close");
            assert!(matches!(server.closed().await, Error::ClosedByPeer));
        });
    });
}

/// Stopped: a writer waiting for credit, and a `stopped()` waiter, both learn that the peer
/// dropped its read half.
#[test]
fn a_dropped_read_half_wakes_the_writer_and_stopped() {
    check(|| {
        shuttle::future::block_on(async {
            let (client, server) = sessions();
            let stream = client.open().await.expect("open");
            let (_read, mut write) = stream.into_split();
            let writer = shuttle::future::spawn(async move {
                let data = content(200 * 1024);
                let wrote = write.write_all(&data).await;
                let stopped = write.stopped().await;
                (wrote, stopped)
            });
            let inbound = server.accept().await.expect("accept");
            let (read_half, _write_half) = inbound.into_split();
            drop(read_half);
            let (wrote, stopped) = writer.await.expect("writer");
            let error = wrote.expect_err("the write must fail once the peer stops reading");
            assert!(
                matches!(Error::from_io(&error), Some(Error::PeerReadClosed)),
                "{error:?}"
            );
            assert_eq!(stopped.expect("stopped"), Stopped::ReadClosed);
            client.close().await.expect("Session::close");
        });
    });
}

/// `wait_idle` and `graceful_close`: the server drains while the stream finishes both ways
/// and is dropped; a third task waits for the session to be idle.
#[test]
fn graceful_close_and_wait_idle_see_the_last_stream_go() {
    check(|| {
        shuttle::future::block_on(async {
            let (client, server) = sessions();
            let mut stream = client.open().await.expect("open");
            stream.write_all(&content(8 * 1024)).await.expect("write");
            stream.shutdown().await.expect("shutdown");
            let mut inbound = server.accept().await.expect("accept");
            let idle_server = server.clone();
            let idle = shuttle::future::spawn(async move { idle_server.wait_idle().await });
            let serving = shuttle::future::spawn(async move {
                let mut got = Vec::new();
                inbound.read_to_end(&mut got).await.expect("server reads");
                inbound.write_all(&got).await.expect("server writes");
                inbound.shutdown().await.expect("server shutdown");
                got.len()
            });
            let closing = shuttle::future::spawn(async move {
                server.graceful_close(Duration::from_secs(3600)).await
            });
            let mut echo = Vec::new();
            stream.read_to_end(&mut echo).await.expect("client reads");
            drop(stream);
            assert_eq!(serving.await.expect("serving"), 8 * 1024);
            assert_eq!(echo.len(), 8 * 1024);
            idle.await.expect("wait_idle");
            closing.await.expect("closing").expect("graceful_close");
            assert!(matches!(client.closed().await, Error::ClosedByPeer));
        });
    });
}
