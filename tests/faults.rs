//! Faults of the transport, the peer and the application, one test per case: a connection that
//! breaks or stops taking writes, a silent peer, races between closes, cancelled operations,
//! tasks left behind, and limits that must fail one operation rather than the session.
//!
//! The bad-input policy itself is tested item by item in `tests/policy.rs`; memory under a
//! hostile peer in `tests/fault_memory.rs`. RELIABILITY.md maps every case to its test.
//!
//! Tests on in-memory transports run on paused time: the runtime jumps ahead whenever every task
//! waits, so timeouts of seconds cost nothing and a bound like "within the close timeout" is
//! exact. The race tests run on two worker threads instead, on real time, so that the racing
//! sides really run at once.

mod common;
mod link;

use std::io;
use std::time::Duration;

use common::{
    assert_same, duplex_pair, gomux_error, pattern, raw_session, round_trip, sessions_with, settle,
    spawn_echo, stream_error, within, within_for, Faults, Faulty, RawPeer, Transport,
};
use gomux::frame::{Frame, Header, Kind};
use gomux::{Config, Error, Role, Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

const KIB: usize = 1024;
/// The credit each stream direction starts with.
const WINDOW: usize = 64 * KIB;
/// How long a failure may take to reach a waiting operation: "promptly" on paused time.
const PROMPT: Duration = Duration::from_secs(1);
/// Bound for whole scenarios on paused time.
const VIRTUAL_STEP: Duration = Duration::from_secs(600);
/// The close timeout the stalled-transport cases configure.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------------------------------------
// The transport ends mid-frame or is reset.

/// Operations of every kind left waiting on a server session whose raw peer never returns
/// credit and whose transport takes no more writes, plus a stream holding unread data.
struct Waiting {
    session: Session,
    driver: JoinHandle<Result<(), Error>>,
    faults: Faults,
    raw: RawPeer,
    /// A stream with `b"buffered"` unread.
    holder: Stream,
    read: JoinHandle<io::Result<usize>>,
    write: JoinHandle<io::Result<()>>,
    open: JoinHandle<Result<Vec<Stream>, Error>>,
    accept: JoinHandle<Result<Stream, Error>>,
}

async fn start_waiting() -> Waiting {
    let config = Config::default().write_buffer_size(1);
    let (session, driver, faults, mut raw) = raw_session(Role::Server, config);
    raw.send(Frame::control(0, Kind::OpenStream)).await;
    raw.send(Frame::data(0, &b"buffered"[..])).await;
    raw.send(Frame::control(2, Kind::OpenStream)).await;
    let holder = within("accept 0", session.accept())
        .await
        .expect("stream 0");
    let mut idle = within("accept 2", session.accept())
        .await
        .expect("stream 2");
    let mut writer = within("open", session.open()).await.expect("open");

    let read = tokio::spawn(async move { idle.read(&mut [0u8; 16]).await });
    // More than the window: the raw peer never returns credit, so this waits for it.
    let write = tokio::spawn(async move { writer.write_all(&vec![1u8; WINDOW + 1]).await });
    settle().await;
    // From here on the transport takes nothing: opens wait for room in the outgoing queue.
    faults.stall_writes(true);
    let opener = session.clone();
    let open = tokio::spawn(async move {
        let mut opened = Vec::new();
        loop {
            opened.push(opener.open().await?);
            if opened.len() > 1000 {
                panic!("opens never waited on a transport that takes no writes");
            }
        }
    });
    let acceptor = session.clone();
    let accept = tokio::spawn(async move { acceptor.accept().await });
    settle().await;
    for (name, done) in [
        ("read", read.is_finished()),
        ("write", write.is_finished()),
        ("open", open.is_finished()),
        ("accept", accept.is_finished()),
    ] {
        assert!(!done, "the {name} should be waiting before the fault");
    }
    Waiting {
        session,
        driver,
        faults,
        raw,
        holder,
        read,
        write,
        open,
        accept,
    }
}

impl Waiting {
    /// Checks that every waiting operation fails promptly with an error `is_expected` accepts,
    /// that the session reports it, and that the buffered data is still readable.
    async fn expect_failures(self, is_expected: impl Fn(&Error) -> bool) {
        let check = |error: &Error, what: &str| {
            assert!(is_expected(error), "{what}: unexpected {error:?}");
        };
        let read = within_for(PROMPT, "waiting read fails", self.read).await;
        check(&stream_error(read.expect("reader task"), "read"), "read");
        let write = within_for(PROMPT, "waiting write fails", self.write).await;
        check(&stream_error(write.expect("writer task"), "write"), "write");
        let open = within_for(PROMPT, "waiting open fails", self.open).await;
        match open.expect("opener task").expect_err("open") {
            Error::SessionUnavailable(reason) => check(&reason, "open"),
            other => panic!("open: unexpected {other:?}"),
        }
        let accept = within_for(PROMPT, "waiting accept fails", self.accept).await;
        check(
            &accept.expect("acceptor task").expect_err("accept"),
            "accept",
        );
        check(
            &within_for(PROMPT, "session end", self.session.closed()).await,
            "Session::closed",
        );
        let outcome = within_for(PROMPT, "driver end", self.driver).await;
        check(
            &outcome.expect("no panic").expect_err("driver outcome"),
            "driver",
        );

        let mut holder = self.holder;
        let mut got = [0u8; 8];
        holder.read_exact(&mut got).await.expect("buffered data");
        assert_eq!(&got, b"buffered");
        let error = stream_error(holder.read(&mut got).await, "read after the data");
        check(&error, "read after the data");
        drop(self.raw);
    }
}

fn is_reset(error: &Error) -> bool {
    matches!(error, Error::Transport(e) if e.kind() == io::ErrorKind::ConnectionReset)
}

#[tokio::test(start_paused = true)]
async fn reset_fails_every_waiting_operation_and_keeps_buffered_data() {
    let waiting = start_waiting().await;
    waiting.faults.reset();
    waiting.expect_failures(is_reset).await;
}

#[tokio::test(start_paused = true)]
async fn end_mid_frame_fails_every_waiting_operation_and_keeps_buffered_data() {
    let mut waiting = start_waiting().await;
    // Half of a Data header, then the end of the connection.
    let header = Header {
        id: 0,
        length: 100,
        kind: Kind::Data,
    };
    waiting.raw.send_raw(&header.to_bytes()[..4]).await;
    waiting
        .raw
        .framed
        .get_mut()
        .shutdown()
        .await
        .expect("raw peer ends its side");
    waiting
        .expect_failures(|e| matches!(e, Error::UnexpectedEof))
        .await;
}

// ---------------------------------------------------------------------------------------------
// The transport stops accepting writes.

/// A client session on a transport that takes no writes at all and delivers nothing.
fn stalled(config: Config) -> (Session, JoinHandle<Result<(), Error>>, RawPeer) {
    let (session, driver, faults, raw) = raw_session(Role::Client, config);
    faults.stall_writes(true);
    (session, driver, raw)
}

fn is_timed_out(error: &Error) -> bool {
    matches!(error, Error::Transport(e) if e.kind() == io::ErrorKind::TimedOut)
}

#[tokio::test(start_paused = true)]
async fn session_close_gives_up_after_the_close_timeout_when_writes_stall() {
    let (session, driver, _raw) = stalled(Config::default().close_timeout(CLOSE_TIMEOUT));
    let mut stream = within("open", session.open()).await.expect("open");
    stream.write_all(b"never sent").await.expect("queued");
    let start = Instant::now();
    let closed = within_for(CLOSE_TIMEOUT + PROMPT, "close", session.close()).await;
    let error = closed.expect_err("the final writes did not happen");
    assert!(is_timed_out(&error), "{error:?}");
    assert!(start.elapsed() >= CLOSE_TIMEOUT, "not before the timeout");
    let outcome = within_for(PROMPT, "driver", driver)
        .await
        .expect("no panic");
    assert!(is_timed_out(&outcome.expect_err("driver outcome")));
    // The stream's own close learns that its data never left.
    let error = within_for(PROMPT, "stream close", stream.close()).await;
    assert!(error.is_err(), "{error:?}");
}

#[tokio::test(start_paused = true)]
async fn stream_close_finishes_within_the_close_timeout_when_writes_stall() {
    let (session, _driver, _raw) = stalled(Config::default().close_timeout(CLOSE_TIMEOUT));
    let mut stream = within("open", session.open()).await.expect("open");
    stream.write_all(b"never sent").await.expect("queued");
    // The session itself stays up: only this stream is being closed.
    let closed = timeout(CLOSE_TIMEOUT + PROMPT, stream.close()).await;
    assert!(
        closed.is_ok(),
        "Stream::close still waiting {:?} after it began, on a transport that takes no writes",
        CLOSE_TIMEOUT + PROMPT
    );
    assert!(closed.is_ok_and(|r| r.is_err()), "its data never left");
}

/// `flush` and `shutdown` return once the bytes are queued, as on a socket, so a transport that
/// takes no writes does not hold them up (`Stream::close` is what waits for the transport). Once
/// the session has ended, they report the bytes it never wrote.
#[tokio::test(start_paused = true)]
async fn flush_and_shutdown_return_once_queued_and_report_what_an_ended_session_never_wrote() {
    let (session, driver, _raw) = stalled(Config::default().close_timeout(CLOSE_TIMEOUT));
    let mut flushed = within("open", session.open()).await.expect("open");
    flushed.write_all(b"queued").await.expect("queued");
    within("flush", flushed.flush())
        .await
        .expect("flush while the session lives");
    let mut shut = within("open", session.open()).await.expect("open");
    shut.write_all(b"queued too").await.expect("queued");
    within("shutdown", shut.shutdown())
        .await
        .expect("shutdown while the session lives");
    // The driver goes away with all of it still queued.
    driver.abort();
    assert!(driver.await.is_err_and(|e| e.is_cancelled()));
    for (stream, what) in [(&mut flushed, "flush"), (&mut shut, "shutdown")] {
        let result = within(what, stream.flush()).await;
        let error = stream_error(result, "the bytes were never written");
        assert!(matches!(error, Error::ClosedLocally), "{what}: {error:?}");
    }
    let error = stream_error(within("shutdown", shut.shutdown()).await, "shutdown");
    assert!(matches!(error, Error::ClosedLocally), "{error:?}");
}

/// After the transport refused a write, the session reads on for a while (so that nothing the
/// peer sent is lost) but writes nothing more: opens, writes, flushes and closes fail at once
/// instead of queueing or reporting bytes that will never be sent.
#[tokio::test(start_paused = true)]
async fn after_a_failed_transport_write_nothing_reports_success() {
    let (session, _driver, faults, _raw) =
        raw_session(Role::Client, Config::default().close_timeout(CLOSE_TIMEOUT));
    let mut stream = within("open", session.open()).await.expect("open");
    stream.write_all(b"sent").await.expect("queued");
    settle().await;
    faults.break_writes();
    stream
        .write_all(b"never sent")
        .await
        .expect("queued before the driver tries to write it");
    settle().await;
    assert!(session.close_reason().is_none(), "the session reads on");
    let is_broken_pipe = |error: &Error| matches!(error, Error::Transport(e) if e.kind() == io::ErrorKind::BrokenPipe);
    let error = stream_error(within("flush", stream.flush()).await, "flush");
    assert!(is_broken_pipe(&error), "flush: {error:?}");
    let error = stream_error(within("write", stream.write_all(b"more")).await, "write");
    assert!(is_broken_pipe(&error), "write: {error:?}");
    let error = stream_error(within("shutdown", stream.shutdown()).await, "shutdown");
    assert!(is_broken_pipe(&error), "shutdown: {error:?}");
    let error = within("open", session.open()).await.expect_err("open");
    assert!(
        matches!(&error, Error::SessionUnavailable(reason) if is_broken_pipe(reason)),
        "open: {error:?}"
    );
    let error = within("close", stream.close()).await.expect_err("close");
    assert!(is_broken_pipe(&error), "close: {error:?}");
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_fires_while_writes_stall() {
    const IDLE: Duration = Duration::from_secs(5);
    let config = Config::default()
        .idle_timeout(Some(IDLE))
        .keepalive_interval(Some(Duration::from_secs(1)))
        .close_timeout(CLOSE_TIMEOUT);
    let (session, driver, _raw) = stalled(config);
    let mut stream = within("open", session.open()).await.expect("open");
    stream.write_all(&vec![3u8; WINDOW]).await.expect("queued");
    sleep(IDLE - PROMPT).await;
    assert!(session.close_reason().is_none(), "not before the timeout");
    sleep(2 * PROMPT).await;
    let reason = session.close_reason();
    assert!(matches!(reason, Some(Error::IdleTimeout)), "{reason:?}");
    // Its CloseMux cannot be written either: the close timeout abandons the transport.
    within_for(
        CLOSE_TIMEOUT + PROMPT,
        "transport abandoned",
        session.closed(),
    )
    .await;
    let outcome = within_for(PROMPT, "driver", driver).await;
    assert!(is_timed_out(
        &outcome.expect("no panic").expect_err("outcome")
    ));
}

/// Finding 9: a peer that keeps the connection open but stops reading is detected. With a
/// write-stall timeout, a transport that takes none of the waiting bytes for that long ends the
/// session with `WriteStalled`, and a writer waiting for room learns it, instead of every
/// writer waiting for ever (as they do with the timeout off, the default).
#[tokio::test(start_paused = true)]
async fn a_transport_that_takes_nothing_for_the_write_stall_timeout_ends_the_session() {
    const STALL: Duration = Duration::from_secs(5);
    let config = Config::default()
        .write_stall_timeout(Some(STALL))
        .write_buffer_size(4 * KIB);
    let (session, driver, _raw) = stalled(config);
    let mut stream = within("open", session.open()).await.expect("open");
    let start = Instant::now();
    let data = pattern(9, 2 * WINDOW);
    let write = stream.write_all(&data);
    let error = stream_error(
        within_for(STALL + PROMPT, "the stalled write", write).await,
        "a write into a stalled transport",
    );
    assert!(matches!(error, Error::WriteStalled), "{error:?}");
    assert!(start.elapsed() >= STALL, "not before the timeout");
    assert!(matches!(session.close_reason(), Some(Error::WriteStalled)));
    let outcome = within_for(PROMPT, "driver", driver)
        .await
        .expect("no panic");
    assert!(matches!(outcome, Err(Error::WriteStalled)), "{outcome:?}");
}

/// A slow link is no stall: a transfer that takes many times the write-stall timeout, over a
/// link that takes a little at a time, completes.
#[tokio::test(start_paused = true)]
async fn a_slow_link_that_keeps_taking_bytes_is_not_a_stall() {
    const STALL: Duration = Duration::from_millis(500);
    let link = link::Link {
        latency: Duration::from_millis(20),
        bandwidth: 100_000,
        buffer: 16 * KIB,
    };
    let (a, b) = link.pair();
    let config = Config::default().write_stall_timeout(Some(STALL));
    let client = Session::with_config(a, Role::Client, config.clone());
    let server = Session::with_config(b, Role::Server, config);
    spawn_echo(server.clone());
    let data = pattern(10, 600 * KIB);
    let stream = within("open", client.open()).await.expect("open");
    let started = Instant::now();
    let echoed = within_for(VIRTUAL_STEP, "the echo", round_trip(stream, &data)).await;
    assert_same(&echoed, &data, "the echo over a slow link");
    assert!(
        started.elapsed() > 10 * STALL,
        "the transfer took {:?}: long enough that a stall timer that ignored progress would \
         have fired",
        started.elapsed()
    );
    assert!(
        client.close_reason().is_none(),
        "{:?}",
        client.close_reason()
    );
}

// ---------------------------------------------------------------------------------------------
// A silent peer.

#[tokio::test(start_paused = true)]
async fn a_peer_that_never_sends_a_byte_is_timed_out() {
    const IDLE: Duration = Duration::from_secs(30);
    let config = Config::default().idle_timeout(Some(IDLE));
    let (session, driver, _faults, mut raw) = raw_session(Role::Server, config);
    let start = Instant::now();
    let reason = within_for(VIRTUAL_STEP, "idle timeout", session.closed()).await;
    assert!(matches!(reason, Error::IdleTimeout), "{reason:?}");
    assert!(start.elapsed() >= IDLE, "not before the timeout");
    // Our own keepalives (every 30 s by default) do not count as hearing from the peer.
    let mut kinds = Vec::new();
    while let Some(frame) = raw.recv().await {
        kinds.push(frame.header.kind);
    }
    assert_eq!(kinds.last(), Some(&Kind::CloseMux), "{kinds:?}");
    let outcome = within_for(PROMPT, "driver", driver)
        .await
        .expect("no panic");
    assert!(matches!(outcome, Err(Error::IdleTimeout)));
}

// ---------------------------------------------------------------------------------------------
// Stream ids.

#[tokio::test(start_paused = true)]
async fn peer_stream_ids_wrap_around() {
    let (session, _driver, _faults, mut raw) = raw_session(Role::Server, Config::default());
    // A client that has counted up to the last even id goes on at 0.
    for id in [u32::MAX - 1, 0, 2] {
        raw.send(Frame::control(id, Kind::OpenStream)).await;
        raw.send(Frame::data(id, id.to_le_bytes().to_vec())).await;
    }
    for id in [u32::MAX - 1, 0, 2] {
        let mut stream = within("accept", session.accept()).await.expect("accept");
        assert_eq!(stream.id(), id);
        let mut got = [0u8; 4];
        stream.read_exact(&mut got).await.expect("read");
        assert_eq!(u32::from_le_bytes(got), id);
        stream.write_all(b"ok").await.expect("write");
        let reply = raw.recv_until(id, Kind::Data).await;
        assert_eq!(&reply.payload[..], b"ok");
    }
    assert!(!session.is_closed(), "{:?}", session.close_reason());
}

// ---------------------------------------------------------------------------------------------
// Races. Two worker threads, real time, each case repeated to meet many interleavings.

const RACE_ROUNDS: u64 = 20;

/// A client and a server on a small in-memory pipe (so frames split across transport calls),
/// the server echoing every stream.
async fn echo_pair() -> (Session, Session) {
    let (client, server) = sessions_with(
        Transport::Duplex(4 * KIB),
        Config::default(),
        Config::default(),
    )
    .await;
    spawn_echo(server.clone());
    (client, server)
}

/// Waits until both sessions have no stream state left.
async fn streams_gone(sessions: &[&Session]) {
    within("stream tables empty", async {
        while sessions.iter().any(|s| s.stream_count() != 0) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stream_closes_race_a_session_close() {
    for round in 0..RACE_ROUNDS {
        let (client, server) = echo_pair().await;
        let mut closers = Vec::new();
        for i in 0..32u64 {
            let mut stream = client.open().await.expect("open");
            stream.write_all(&pattern(i, 3000)).await.expect("write");
            closers.push(tokio::spawn(async move {
                // Half of them close and wait, half just drop.
                if (i + round) % 2 == 0 {
                    let _ = stream.close().await;
                } else {
                    drop(stream);
                }
            }));
        }
        let closed = within("session close", client.close()).await;
        assert!(closed.is_ok(), "round {round}: {closed:?}");
        for closer in closers {
            within("stream close", closer).await.expect("no panic");
        }
        assert!(matches!(
            within("peer end", server.closed()).await,
            Error::ClosedByPeer
        ));
        streams_gone(&[&client]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_a_session_close_deliver_exactly_what_they_reported() {
    for round in 0..RACE_ROUNDS {
        let (client, server) = sessions_with(
            Transport::Duplex(4 * KIB),
            Config::default(),
            Config::default(),
        )
        .await;
        let mut stream = client.open().await.expect("open");
        let body = pattern(round, 512 * KIB);
        let writer = tokio::spawn(async move {
            let mut sent = 0;
            while sent < body.len() {
                match stream
                    .write(&body[sent..(sent + 3000).min(body.len())])
                    .await
                {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
            sent
        });
        let reader = tokio::spawn(async move {
            let mut inbound = server.accept().await.expect("accept");
            let mut got = Vec::new();
            // The data, then the session's end (the peer's CloseMux) or end-of-stream.
            let _ = inbound.read_to_end(&mut got).await;
            got
        });
        sleep(Duration::from_micros(100 * round)).await;
        let _ = within("close", client.close()).await;
        let sent = within("writer", writer).await.expect("no panic");
        let got = within("reader", reader).await.expect("no panic");
        // Every byte a write reported was queued ahead of the CloseMux, so it arrives; nothing
        // else does.
        assert_same(&got, &pattern(round, 512 * KIB)[..sent], "delivered");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ends_closing_at_once_finish() {
    for round in 0..RACE_ROUNDS {
        let (a, b) = common::connect(Transport::Duplex(4 * KIB)).await;
        let (client, client_driver) = Session::new(a, Role::Client, Config::default());
        let (server, server_driver) = Session::new(b, Role::Server, Config::default());
        let client_driver = tokio::spawn(client_driver);
        let server_driver = tokio::spawn(server_driver);
        let mut stream = client.open().await.expect("open");
        stream
            .write_all(&pattern(round, 10 * KIB))
            .await
            .expect("write");
        let mut inbound = server.accept().await.expect("accept");
        inbound.write_all(b"reply").await.expect("write");
        let (c, s) = within("both close", async {
            tokio::join!(client.close(), server.close())
        })
        .await;
        // Each side reads until the other has closed too, so neither finds the transport
        // closed under its final writes: both end gracefully, with data in flight both ways.
        for (side, result) in [("client", c), ("server", s)] {
            result.unwrap_or_else(|error| panic!("round {round}: {side} close: {error:?}"));
        }
        for (side, driver) in [("client", client_driver), ("server", server_driver)] {
            let outcome = within("driver", driver).await.expect("no panic");
            outcome.unwrap_or_else(|error| panic!("round {round}: {side} driver: {error:?}"));
        }
        drop((stream, inbound));
        streams_gone(&[&client, &server]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_and_writing_from_two_tasks_while_the_session_closes() {
    for round in 0..RACE_ROUNDS {
        let (client, _server) = echo_pair().await;
        let stream = client.open().await.expect("open");
        let (mut reader, mut writer) = stream.into_split();
        let body = pattern(round, 256 * KIB);
        let sent_body = body.clone();
        let write = tokio::spawn(async move {
            let mut sent = 0;
            while sent < sent_body.len() {
                let end = (sent + 5000).min(sent_body.len());
                match writer.write(&sent_body[sent..end]).await {
                    Ok(n) => sent += n,
                    Err(_) => return sent,
                }
            }
            let _ = writer.shutdown().await;
            sent
        });
        let read = tokio::spawn(async move {
            let mut got = Vec::new();
            let result = reader.read_to_end(&mut got).await;
            (got, result)
        });
        sleep(Duration::from_micros(200 * round)).await;
        within("close", client.close()).await.ok();
        let sent = within("writer", write).await.expect("no panic");
        let (got, result) = within("reader", read).await.expect("no panic");
        assert!(got.len() <= sent, "echoed more than was sent");
        assert_same(&got, &body[..got.len()], "echo prefix");
        if let Err(error) = result {
            assert!(
                matches!(gomux_error(&error), Some(Error::ClosedLocally)),
                "{error:?}"
            );
        }
        streams_gone(&[&client]).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Cancel safety: operations abandoned half-way lose and add nothing.

/// Runs `op` against a short timer; `None` when the timer won (the operation was dropped).
async fn or_cancel<F: std::future::Future>(op: F) -> Option<F::Output> {
    timeout(Duration::from_millis(1), op).await.ok()
}

#[tokio::test(start_paused = true)]
async fn cancelled_reads_lose_nothing() {
    within_for(VIRTUAL_STEP, "cancelled reads", async {
        let (client, server) = duplex_pair().await;
        let body = pattern(11, 300 * KIB);
        let sent = body.clone();
        let writer = tokio::spawn(async move {
            let mut stream = client.open().await.expect("open");
            for (i, chunk) in sent.chunks(7 * KIB).enumerate() {
                stream.write_all(chunk).await.expect("write");
                // Slower than the reader's timer, so reads are dropped while they wait.
                sleep(Duration::from_millis(1 + i as u64 % 3)).await;
            }
            stream.shutdown().await.expect("half-close");
            client
        });
        let mut inbound = server.accept().await.expect("accept");
        let (mut got, mut cancelled) = (Vec::new(), 0);
        let mut buf = vec![0u8; 10 * KIB];
        loop {
            let want = 1 + got.len() % buf.len();
            match or_cancel(inbound.read(&mut buf[..want])).await {
                None => cancelled += 1,
                Some(Ok(0)) => break,
                Some(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Some(Err(e)) => panic!("read failed: {e}"),
            }
        }
        assert!(
            cancelled > 10,
            "reads were cancelled only {cancelled} times"
        );
        assert_same(&got, &body, "read through cancelled reads");
        writer.await.expect("writer");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn cancelled_writes_send_exactly_what_they_reported() {
    within_for(VIRTUAL_STEP, "cancelled writes", async {
        let (client, server) = duplex_pair().await;
        let reader = tokio::spawn(async move {
            let mut inbound = server.accept().await.expect("accept");
            let mut got = Vec::new();
            let mut buf = vec![0u8; 9 * KIB];
            // Slower than the writer's timer, so writes are dropped while they wait for credit.
            loop {
                sleep(Duration::from_millis(2)).await;
                match inbound.read(&mut buf).await.expect("read") {
                    0 => return got,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        let mut stream = client.open().await.expect("open");
        let body = pattern(12, 400 * KIB);
        let (mut sent, mut cancelled) = (0, 0);
        while sent < body.len() {
            let end = (sent + 20 * KIB).min(body.len());
            match or_cancel(stream.write(&body[sent..end])).await {
                None => cancelled += 1,
                Some(n) => sent += n.expect("write"),
            }
        }
        stream.shutdown().await.expect("half-close");
        let got = within_for(VIRTUAL_STEP, "reader", reader)
            .await
            .expect("reader");
        assert!(
            cancelled > 10,
            "writes were cancelled only {cancelled} times"
        );
        assert_same(&got, &body, "written through cancelled writes");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn cancelled_opens_open_nothing() {
    let (io, peer) = tokio::io::duplex(64 * KIB);
    let (io, faults) = Faulty::new(io);
    let client = Session::with_config(io, Role::Client, Config::default().write_buffer_size(1));
    let server = Session::server(peer);
    faults.stall_writes(true);
    // The first opens fill the outgoing queue; then opens wait for room.
    let mut opened = Vec::new();
    let mut cancelled = 0;
    while cancelled < 5 {
        match or_cancel(client.open()).await {
            Some(stream) => opened.push(stream.expect("open")),
            None => cancelled += 1,
        }
        assert!(opened.len() < 100, "opens never waited");
    }
    assert_eq!(
        client.stream_count(),
        opened.len(),
        "a cancelled open left state"
    );
    faults.stall_writes(false);
    opened.push(within("open", client.open()).await.expect("open"));
    // The peer learns of exactly the streams this side holds, in order.
    for stream in &opened {
        let inbound = within("accept", server.accept()).await.expect("accept");
        assert_eq!(inbound.id(), stream.id());
    }
    assert!(
        or_cancel(server.accept()).await.is_none(),
        "the peer saw a stream nobody opened"
    );
    let ids: Vec<u32> = opened.iter().map(Stream::id).collect();
    let want: Vec<u32> = (0..opened.len() as u32).map(|n| 2 * n).collect();
    assert_eq!(ids, want, "no id was spent on a cancelled open");
}

#[tokio::test(start_paused = true)]
async fn cancelled_accepts_take_no_stream() {
    const STREAMS: u64 = 50;
    within_for(VIRTUAL_STEP, "cancelled accepts", async {
        let (client, server) = duplex_pair().await;
        let opener = tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..STREAMS {
                let mut stream = client.open().await.expect("open");
                stream.write_all(&i.to_le_bytes()).await.expect("write");
                ids.push(stream.id());
                sleep(Duration::from_millis(1 + i % 3)).await;
            }
            (client, ids)
        });
        let (mut accepted, mut cancelled) = (Vec::new(), 0);
        while accepted.len() < STREAMS as usize {
            match or_cancel(server.accept()).await {
                None => cancelled += 1,
                Some(stream) => accepted.push(stream.expect("accept")),
            }
        }
        let (_client, ids) = opener.await.expect("opener");
        assert!(
            cancelled > 10,
            "accepts were cancelled only {cancelled} times"
        );
        let accepted_ids: Vec<u32> = accepted.iter().map(Stream::id).collect();
        assert_eq!(accepted_ids, ids, "every stream accepted once, in order");
        for (i, stream) in accepted.iter_mut().enumerate() {
            let mut got = [0u8; 8];
            stream.read_exact(&mut got).await.expect("read");
            assert_eq!(u64::from_le_bytes(got), i as u64);
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// No task outlives its session.

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits until no more tasks are alive than `baseline`.
async fn tasks_back_to(baseline: usize, what: &str) {
    let waited = timeout(VIRTUAL_STEP, async {
        while alive_tasks() > baseline {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{what}: {} tasks alive, {baseline} before",
        alive_tasks()
    );
}

#[tokio::test(start_paused = true)]
async fn no_task_outlives_its_session() {
    let baseline = alive_tasks();

    // A graceful close after traffic, the echo tasks included.
    let (client, server) = duplex_pair().await;
    let echo = spawn_echo(server);
    for i in 0..4 {
        let stream = client.open().await.expect("open");
        assert_eq!(
            round_trip(stream, &pattern(i, 100 * KIB)).await.len(),
            100 * KIB
        );
    }
    client.close().await.expect("close");
    echo.await.expect("echo ends with the session");
    drop(client);
    tasks_back_to(baseline, "graceful close").await;

    // Every handle dropped without a close, streams still open on both sides.
    let (client, server) = duplex_pair().await;
    let mut stream = client.open().await.expect("open");
    stream.write_all(b"x").await.expect("write");
    let inbound = server.accept().await.expect("accept");
    drop((client, server, stream, inbound));
    tasks_back_to(baseline, "handles dropped").await;

    // The transport vanishes under live streams whose handles are kept.
    let (session, driver, _faults, raw) = raw_session(Role::Server, Config::default());
    let held = (
        session.clone(),
        within("open", session.open()).await.expect("open"),
    );
    drop(raw);
    within("driver", driver).await.expect("no panic").ok();
    tasks_back_to(baseline, "transport gone").await;
    drop((held, session));

    // A protocol error from the peer.
    let (session, _driver, _faults, mut raw) = raw_session(Role::Server, Config::default());
    raw.send(Frame::control(1, Kind::OpenStream)).await;
    assert!(matches!(
        within("end", session.closed()).await,
        Error::Protocol(_)
    ));
    tasks_back_to(baseline, "protocol error").await;
    drop((session, raw));
}

// ---------------------------------------------------------------------------------------------
// Limits fail locally.

#[tokio::test(start_paused = true)]
async fn thousands_of_empty_streams_never_wedge_open() {
    const STREAMS: usize = 5000;
    const BACKLOG: usize = 1024;
    within_for(VIRTUAL_STEP, "thousands of opens", async {
        let server_config = Config::default().accept_backlog(BACKLOG);
        // The opener's backlog would hold the burst at 256 unacknowledged streams: let it all
        // through, as an opener that does not wait would.
        let client_config = Config::default().open_backlog(STREAMS);
        let (client, server) =
            sessions_with(Transport::Duplex(16 * KIB), client_config, server_config).await;
        // Nothing is written and nobody accepts: past the backlog, the peer refuses.
        let mut opened = Vec::with_capacity(STREAMS);
        for _ in 0..STREAMS {
            opened.push(
                within_for(PROMPT, "open", client.open())
                    .await
                    .expect("open"),
            );
        }
        settle().await;
        let mut refused = 0;
        for stream in &mut opened {
            if matches!(
                stream
                    .write(b"?")
                    .await
                    .map_err(|e| gomux_error(&e).cloned()),
                Err(Some(Error::Refused))
            ) {
                refused += 1;
            }
        }
        assert_eq!(
            refused,
            STREAMS - BACKLOG,
            "streams past the backlog refused"
        );
        // The queued ones are all there, and the session still carries data.
        for stream in opened.iter().take(BACKLOG) {
            let inbound = within("accept", server.accept()).await.expect("accept");
            assert_eq!(inbound.id(), stream.id());
        }
        drop(opened);
        spawn_echo(server.clone());
        let stream = within("open", client.open()).await.expect("open");
        assert_eq!(round_trip(stream, b"after").await, b"after");
        streams_gone(&[&client, &server]).await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_never_read_by_its_own_side_still_gets_credit() {
    within_for(VIRTUAL_STEP, "write-only stream", async {
        let (client, server) = duplex_pair().await;
        let mut stream = client.open().await.expect("open");
        let body = pattern(13, 16 * WINDOW);
        let peer = tokio::spawn(async move {
            let inbound = server.accept().await.expect("accept");
            // The peer writes too, more than the window, to a side that never reads: its
            // writer blocks, and the client's receive buffer fills up.
            let (mut reader, mut writer) = inbound.into_split();
            let write = async { writer.write_all(&vec![9u8; 2 * WINDOW]).await };
            let read = async {
                let mut got = Vec::new();
                reader.read_to_end(&mut got).await.map(|_| got)
            };
            tokio::select! {
                _ = write => panic!("a write beyond the window finished without a reader"),
                got = read => got.expect("read"),
            }
        });
        // Sixteen windows: each needs credit that comes back while this side reads nothing.
        stream.write_all(&body).await.expect("write");
        stream.shutdown().await.expect("half-close");
        let got = within_for(VIRTUAL_STEP, "peer", peer).await.expect("peer");
        assert_same(&got, &body, "write-only stream");
        assert_eq!(
            stream.buffered(),
            WINDOW,
            "the unread direction holds its window"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// A graceful close by the peer.

#[tokio::test(start_paused = true)]
async fn a_peers_close_loses_no_data_when_our_write_fails_first() {
    let (a, b) = tokio::io::duplex(64 * KIB);
    let (b, faults) = Faulty::new(b);
    let client = Session::client(a);
    let server = Session::server(b);
    let mut stream = client.open().await.expect("open");
    stream.write_all(b"first").await.expect("write");
    let mut inbound = within("accept", server.accept()).await.expect("accept");
    let mut got = [0u8; 5];
    inbound.read_exact(&mut got).await.expect("read");

    // The client's last words reach the server's transport, but the server has not read them
    // yet when it next writes: on TCP, data in flight; here, reads held back.
    faults.pause_reads(true);
    stream.write_all(b"last words").await.expect("write");
    within("client close", client.close())
        .await
        .expect("the client flushed everything and closed gracefully");
    // The client's connection is gone, so this write fails on the transport.
    inbound.write_all(b"too late").await.expect("queued");
    settle().await;
    faults.pause_reads(false);

    // What the client sent before its CloseMux is still delivered.
    let mut got = Vec::new();
    let result = within("read", inbound.read_to_end(&mut got)).await;
    assert_eq!(
        got,
        b"last words",
        "data the peer flushed before closing was lost (read ended with {result:?}, session \
         ended with {:?})",
        server.close_reason()
    );
}
