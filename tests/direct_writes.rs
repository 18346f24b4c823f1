//! Direct writes: on a spawned session, a writer whose frame would be the only thing to write
//! writes it to the transport itself, without waking the driver task (`src/session/direct.rs`).
//!
//! - A message on an idle session is written from the writer's own task, in one transport
//!   call with its header, though the transport has no vectored writes.
//! - A transport that takes a few bytes per call (with vectored writes and without): the rest
//!   of a frame a direct write left goes out before anything else, and every stream's bytes
//!   arrive whole and in order while several streams write at once.
//! - A transport that holds written bytes until flushed, and whose flush does not finish at
//!   once: the driver finishes the flush a direct write started, even when nothing else is
//!   written.
//! - While messages go out directly the session sends no keepalive.
//! - A writer does not write into a frame the driver has in hand; a write of nothing sends no
//!   frame; the transport is closed when the driver ends, though a stream handle is held,
//!   and shut down first when the session closes gracefully.
//!   (These were found by mutation testing, `scripts/mutants.sh --part core`.)
//! - A driver that found the transport taken by a writer is woken when the writer lets go.
//! - A burst of small messages on many streams goes out in a few transport calls, not one per
//!   message; so do the frames of a writer sending bulk.
//!
//! Both ends closing while busy over TCP, with direct writes in flight, is in
//! `tests/core_findings_b.rs` (`closing_a_busy_session_*`) and `tests/close_paths.rs`.

mod common;

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use common::{assert_same, pattern, spawn_echo, within, within_for};
use gomux::frame::{Header, Kind, HEADER_LEN};
use gomux::{Config, Role, Session, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

/// A test transport: an in-memory pipe whose writing side `S` shapes (how much a write takes,
/// when a flush finishes, what a shutdown writes, what is recorded). Reads are the pipe's.
struct Shaped<S> {
    inner: DuplexStream,
    shape: S,
}

/// How a [`Shaped`] transport writes; the defaults are the pipe's own.
trait Shape: Unpin {
    fn write(
        &mut self,
        inner: &mut DuplexStream,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(inner).poll_write(cx, buf);
        self.wrote(&result);
        result
    }

    /// Sees what a write (the pipe's own, by default `write`) came to.
    fn wrote(&mut self, _result: &Poll<io::Result<usize>>) {}

    fn flush(&mut self, inner: &mut DuplexStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(inner).poll_flush(cx)
    }

    fn shutdown(&mut self, inner: &mut DuplexStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(inner).poll_shutdown(cx)
    }

    /// Whether it takes vectored writes, and how many bytes a write takes at most.
    fn vectored(&self) -> Option<usize> {
        None
    }
}

fn shaped<S: Shape>(inner: DuplexStream, shape: S) -> Shaped<S> {
    Shaped { inner, shape }
}

impl<S: Shape> AsyncRead for Shaped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: Shape> AsyncWrite for Shaped<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.shape.write(&mut this.inner, cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // As much as a write takes, across the slices (a header and its payload at once).
        let most = self.shape.vectored().unwrap_or(usize::MAX);
        let mut joined = Vec::new();
        for buf in bufs {
            joined.extend_from_slice(&buf[..buf.len().min(most - joined.len())]);
            if joined.len() == most {
                break;
            }
        }
        self.poll_write(cx, &joined)
    }

    fn is_write_vectored(&self) -> bool {
        self.shape.vectored().is_some()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.shape.flush(&mut this.inner, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.shape.shutdown(&mut this.inner, cx)
    }
}

/// Each write call the transport took bytes in: the task it ran in, and how many bytes.
type Calls = Arc<Mutex<Vec<(Option<tokio::task::Id>, usize)>>>;

/// Records which task each write ran in.
struct Recording {
    calls: Calls,
}

impl Shape for Recording {
    fn wrote(&mut self, result: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = *result {
            if n > 0 {
                let mut calls = self.calls.lock().expect("calls");
                calls.push((tokio::task::try_id(), n));
            }
        }
    }
}

#[tokio::test]
async fn a_message_on_an_idle_session_is_written_from_the_writers_task() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let calls = Calls::default();
    let client = Session::client(shaped(
        a,
        Recording {
            calls: Arc::clone(&calls),
        },
    ));
    let _server = spawn_echo(Session::server(b));
    let recorded = Arc::clone(&calls);
    let writer = tokio::spawn(async move {
        let mut stream = client.open().await.expect("open");
        let mut echoed = [0; 4];
        // The first message goes with the stream's open (written by this task, or by the
        // driver if it took the open first).
        stream.write_all(b"open").await.expect("write");
        stream.read_exact(&mut echoed).await.expect("echo");
        recorded.lock().expect("calls").clear();
        for i in 0..10u32 {
            stream.write_all(&i.to_le_bytes()).await.expect("write");
            stream.read_exact(&mut echoed).await.expect("echo");
            assert_eq!(echoed, i.to_le_bytes());
        }
        (tokio::task::id(), client, stream)
    });
    let (writer_task, _client, _stream) = within("ten round trips", writer)
        .await
        .expect("the writer finishes");
    let calls = calls.lock().expect("calls").clone();
    // Each message is a 12-byte frame (an 8-byte header and 4 bytes), with the control frames
    // queued meanwhile (here the credit for each echo read) ahead of it.
    let from_writer: Vec<usize> = calls
        .iter()
        .filter(|&&(task, _)| task == Some(writer_task))
        .map(|&(_, n)| n)
        .collect();
    assert!(
        from_writer.iter().sum::<usize>() >= 10 * 12,
        "every message was written by its writer, not the driver: {calls:?}"
    );
    // In one piece: this transport has no vectored writes, and a small frame is not offered to
    // it part by part (the credit before it, the header, the payload: three calls before).
    assert_eq!(
        from_writer.len(),
        10,
        "one transport call per message: {calls:?}"
    );
}

/// Many streams that each write a small message at once (a server answering many clients;
/// the echoes of `examples/many_streams.rs`): the first writer writes its frame itself, the
/// others queue theirs, and the driver, which lets them all run before it takes its batch,
/// writes them together. Before, every frame was written by its writer (on TCP a system call
/// each): 128 calls here, this transport taking one part (header, payload) a call. Every
/// message arrives on its own stream.
#[tokio::test]
async fn a_burst_of_small_messages_on_many_streams_takes_few_transport_calls() {
    const STREAMS: usize = 64;
    let (a, b) = tokio::io::duplex(1 << 20);
    let calls = Calls::default();
    let client = Session::client(shaped(
        a,
        Recording {
            calls: Arc::clone(&calls),
        },
    ));
    let server = Session::server(b);
    let mut outbound = Vec::new();
    let mut inbound = Vec::new();
    for _ in 0..STREAMS {
        outbound.push(client.open().await.expect("open"));
        inbound.push(within("accept", server.accept()).await.expect("accept"));
    }
    calls.lock().expect("calls").clear();
    let writers: Vec<_> = outbound
        .into_iter()
        .enumerate()
        .map(|(i, mut stream)| {
            tokio::spawn(async move {
                stream.write_all(&[i as u8; 100]).await.expect("write");
                stream
            })
        })
        .collect();
    let mut written = Vec::new();
    for writer in writers {
        written.push(within("the writers", writer).await.expect("a writer"));
    }
    for (i, stream) in inbound.iter_mut().enumerate() {
        let mut message = [0; 100];
        within("read", stream.read_exact(&mut message))
            .await
            .expect("read");
        assert!(message == [i as u8; 100], "stream {i} got its own message");
    }
    let calls = calls.lock().expect("calls").clone();
    // The first writer's frame (its header and payload, this transport taking one part a
    // call), then the batch of the 63 others.
    assert!(
        calls.len() <= 4,
        "{STREAMS} messages took {} transport calls: {calls:?}",
        calls.len()
    );
    drop(written);
}

/// A writer sending bulk writes its first frame itself and queues the next ones while the
/// driver has not run since, so the driver writes them in batches: far fewer transport calls
/// than frames. Before, every 64 KiB frame went to the transport on its own (on TCP a system
/// call each, waking the peer's reading thread each time): 64 calls here for the 32 frames,
/// this transport taking the header and the payload in a call each; now 10, the batches
/// growing as the transport takes them whole. Every byte arrives, in order.
#[tokio::test]
async fn a_writer_sending_bulk_leaves_its_frames_to_the_drivers_batches() {
    const FRAMES: usize = 32;
    const FRAME: usize = 64 * 1024;
    let (a, b) = tokio::io::duplex(4 << 20);
    let calls = Calls::default();
    let client = Session::client(shaped(
        a,
        Recording {
            calls: Arc::clone(&calls),
        },
    ));
    // A window that takes every frame at once, so the writer never waits for credit.
    let window = (FRAMES * FRAME) as u32;
    let server = Session::with_config(
        b,
        Role::Server,
        Config::default()
            .receive_window(window)
            .max_receive_window(window),
    );
    let mut outbound = client.open().await.expect("open");
    let mut inbound = within("accept", server.accept()).await.expect("accept");
    // The OpenStream is written: only the bulk's transport calls are counted.
    calls.lock().expect("calls").clear();
    let message = pattern(3, FRAMES * FRAME);
    let sent = message.clone();
    let writer = tokio::spawn(async move {
        for frame in sent.chunks(FRAME) {
            outbound.write_all(frame).await.expect("write");
        }
        outbound
    });
    let mut received = vec![0; message.len()];
    within("read", inbound.read_exact(&mut received))
        .await
        .expect("read");
    assert!(received == message, "every byte arrives, in order");
    let _outbound = within("writer", writer).await.expect("writer");
    let calls = calls.lock().expect("calls").clone();
    let data: usize = calls.iter().map(|&(_, n)| n).sum();
    assert!(data >= message.len(), "{data} bytes written: {calls:?}");
    assert!(
        calls.len() <= FRAMES / 2,
        "{FRAMES} frames took {} transport calls: {:?}",
        calls.len(),
        calls.iter().map(|&(_, n)| n).collect::<Vec<_>>()
    );
}

/// A writer may write before its session's driver has made its first transport call, with no
/// waker of the driver's to leave with the transport yet: it writes anyway, and what a
/// transport that pushes back leaves of the frame is the driver's. Every byte arrives, in
/// order, and the first transport call was the writer's.
#[tokio::test]
async fn a_write_before_the_drivers_first_transport_call_is_finished_by_the_driver() {
    let (a, b) = tokio::io::duplex(256);
    let calls = Calls::default();
    let recorded = Arc::clone(&calls);
    let message = pattern(7, 64 * 1024);
    let sent = message.clone();
    // The session is made in the writer's task, whose first poll opens and writes before the
    // driver it spawned has run at all.
    let writer = tokio::spawn(async move {
        let client = Session::client(shaped(a, Recording { calls: recorded }));
        let mut stream = client.open().await.expect("open");
        stream.write_all(&sent).await.expect("write");
        stream.shutdown().await.expect("shutdown");
        (tokio::task::id(), client, stream)
    });
    let server = Session::server(b);
    let mut inbound = within("accept", server.accept()).await.expect("accept");
    let mut received = Vec::new();
    within("read", inbound.read_to_end(&mut received))
        .await
        .expect("read");
    assert!(received == message, "every byte arrives, in order");
    let (writer_task, _client, _stream) = within("writer", writer).await.expect("writer");
    let calls = calls.lock().expect("calls").clone();
    assert_eq!(
        calls.first().map(|&(task, _)| task),
        Some(Some(writer_task)),
        "the first transport call was the writer's: {:?}",
        &calls[..calls.len().min(4)]
    );
}

/// Sessions running on one thread borrow its one write batch in turn, and one that meets a
/// push-back keeps the batch it holds: two sessions moving bulk both ways at once through
/// small pipes, all four drivers on one thread, deliver every byte, in order.
#[tokio::test]
async fn sessions_on_one_thread_move_bulk_both_ways_through_small_pipes() {
    const SIZE: usize = 1 << 20;
    let (mut sessions, mut ends) = (Vec::new(), Vec::new());
    for seed in 0..2u64 {
        let (a, b) = tokio::io::duplex(4096);
        let (client, server) = (Session::client(a), Session::server(b));
        let outbound = client.open().await.expect("open");
        let inbound = within("accept", server.accept()).await.expect("accept");
        sessions.push((client, server));
        for (end, stream) in [(0, outbound), (1, inbound)] {
            let (mut reader, mut writer) = tokio::io::split(stream);
            let mine = pattern(seed * 2 + end, SIZE);
            let theirs = pattern(seed * 2 + (1 - end), SIZE);
            ends.push(tokio::spawn(async move {
                let write = async {
                    writer.write_all(&mine).await.expect("write");
                    writer.shutdown().await.expect("shutdown");
                };
                let read = async {
                    let mut received = Vec::new();
                    reader.read_to_end(&mut received).await.expect("read");
                    received
                };
                let ((), received) = tokio::join!(write, read);
                assert_same(&received, &theirs, "every byte arrives, in order");
            }));
        }
    }
    for end in ends {
        within("bulk both ways", end).await.expect("no panic");
    }
    drop(sessions);
}

/// Takes at most `most` bytes per write call, vectored or not.
struct Trickle {
    most: usize,
    vectored: bool,
}

impl Shape for Trickle {
    fn write(
        &mut self,
        inner: &mut DuplexStream,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(inner).poll_write(cx, &buf[..self.most.min(buf.len())])
    }

    fn vectored(&self) -> Option<usize> {
        self.vectored.then_some(self.most)
    }
}

/// Messages of varied sizes, each sent and its echo checked before the next, on `streams`
/// streams at once.
async fn messages_arrive_whole(client: Session, streams: u64) {
    let mut tasks = Vec::new();
    for seed in 0..streams {
        let mut stream: Stream = client.open().await.expect("open");
        tasks.push(tokio::spawn(async move {
            for round in 0..40u64 {
                let size = 1 + ((seed * 977 + round * 389) % 3000) as usize;
                let message = pattern(seed * 1000 + round, size);
                stream.write_all(&message).await.expect("write");
                let mut echoed = vec![0; size];
                stream.read_exact(&mut echoed).await.expect("echo");
                assert!(
                    echoed == message,
                    "stream {seed}, message {round} came back intact"
                );
            }
        }));
    }
    for task in tasks {
        task.await.expect("a stream's messages all came back");
    }
}

async fn trickle_case(vectored: bool) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(shaped(a, Trickle { most: 5, vectored }));
    let _server = spawn_echo(Session::server(b));
    within(
        "messages over a trickling transport",
        messages_arrive_whole(client, 4),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_a_transport_takes_five_bytes_at_a_time_of_arrive_whole() {
    trickle_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_a_transport_without_vectored_writes_takes_five_bytes_at_a_time_of_arrive_whole() {
    trickle_case(false).await;
}

/// Keeps what is written until flushed, and finishes a flush only on every other call (it
/// asks to be polled again at once, as a TLS stream whose socket is busy would be later).
#[derive(Default)]
struct HeldUntilFlushed {
    held: Vec<u8>,
    flushes: u64,
}

impl Shape for HeldUntilFlushed {
    fn write(
        &mut self,
        _inner: &mut DuplexStream,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn flush(&mut self, inner: &mut DuplexStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flushes += 1;
        if self.flushes % 2 == 1 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        while !self.held.is_empty() {
            let n = std::task::ready!(Pin::new(&mut *inner).poll_write(cx, &self.held))?;
            self.held.drain(..n);
        }
        Pin::new(inner).poll_flush(cx)
    }

    fn shutdown(&mut self, inner: &mut DuplexStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.flush(inner, cx))?;
        Pin::new(inner).poll_shutdown(cx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_a_direct_write_left_unfinished_is_finished_by_the_driver() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(shaped(a, HeldUntilFlushed::default()));
    let _server = spawn_echo(Session::server(b));
    within(
        "messages over a transport that holds them until flushed",
        messages_arrive_whole(client, 2),
    )
    .await;
}

/// While a writer's messages go out directly, the session sends no keepalive: the peer hears
/// from this side all the while. The driver, which writes nothing itself here (the peer only
/// reads), learns of the direct writes when it next runs (for the credit the peer returns) and
/// counts them as the writes they are. Paused clock: 10 s of messages, one every 200 ms, with
/// keepalives due after 1 s without a write.
#[tokio::test(start_paused = true)]
async fn a_session_writing_directly_sends_no_keepalive() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::with_config(
        a,
        Role::Client,
        Config::default().keepalive_interval(Some(Duration::from_secs(1))),
    );
    let server = Session::server(b);
    let reader = tokio::spawn(async move {
        let mut stream = server.accept().await.expect("accept");
        let mut got = [0; 4];
        for i in 0..51u32 {
            stream.read_exact(&mut got).await.expect("read");
            assert_eq!(got, i.to_le_bytes());
        }
        server
    });
    let mut stream = client.open().await.expect("open");
    stream.write_all(&0u32.to_le_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = client.stats();
    for i in 1..51u32 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stream.write_all(&i.to_le_bytes()).await.expect("write");
    }
    let _server = within("the peer reads every message", reader)
        .await
        .expect("the peer read every message in order");
    let after = client.stats();
    assert_eq!(
        after.keepalives_sent - before.keepalives_sent,
        0,
        "keepalives sent while messages went out every 200 ms"
    );
    assert_eq!(after.frames_sent - before.frames_sent, 50, "{after:?}");
}

/// Each stream's Data payloads in `bytes`, whole frames only, with how many bytes those took;
/// panics on a frame of an undefined kind (bytes that are not a frame's start).
fn data_by_stream(bytes: &[u8]) -> (std::collections::BTreeMap<u32, Vec<u8>>, usize) {
    let mut streams = std::collections::BTreeMap::<u32, Vec<u8>>::new();
    let mut at = 0;
    while let Some(raw) = bytes.get(at..at + HEADER_LEN) {
        let header = Header::from_bytes(raw.try_into().expect("8 bytes"))
            .unwrap_or_else(|kind| panic!("a frame of kind {kind} at byte {at}"));
        let payload = match header.kind {
            Kind::Data => header.length as usize,
            _ => 0,
        };
        let Some(data) = bytes.get(at + HEADER_LEN..at + HEADER_LEN + payload) else {
            break;
        };
        streams
            .entry(header.id)
            .or_default()
            .extend_from_slice(data);
        at += HEADER_LEN + payload;
    }
    (streams, at)
}

/// A writer does not write its frame itself while the driver has a batch in hand: here the
/// rest of another stream's 10 KB frame, which the transport (4 KiB of room, the peer not
/// reading yet) did not take. When the peer reads a little, the room it frees goes to the rest
/// of that frame, and the new message follows it, instead of being written into the middle of
/// it. Current-thread runtime: the driver, woken by the peer's read, runs only after the
/// second write.
#[tokio::test]
async fn a_writer_does_not_write_into_a_frame_the_driver_has_in_hand() {
    let (a, mut peer) = tokio::io::duplex(4096);
    let client = Session::client(a);
    let mut first = client.open().await.expect("open");
    let mut second = client.open().await.expect("open");
    let bulk = pattern(7, 10_000);
    first.write_all(&bulk).await.expect("write");
    // The driver takes what is left to write and finds the transport full.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut got = vec![0; 100];
    peer.read_exact(&mut got).await.expect("read");
    second.write_all(b"hello").await.expect("write");
    let read_all = async {
        loop {
            let (streams, _) = data_by_stream(&got);
            if streams.get(&first.id()).map_or(0, Vec::len) >= bulk.len()
                && streams.get(&second.id()).map_or(0, Vec::len) >= 5
            {
                return streams;
            }
            let mut buf = [0; 4096];
            let n = peer.read(&mut buf).await.expect("read");
            assert!(n > 0, "the transport closed");
            got.extend_from_slice(&buf[..n]);
        }
    };
    let streams = within("both streams' data", read_all).await;
    assert!(streams[&first.id()] == bulk, "the first stream's bytes");
    assert_eq!(streams[&second.id()], b"hello");
}

/// The flush a direct write left unfinished is finished by the driver even when nothing else
/// is written: one message at a time goes one way, each sent only once the peer has read the
/// one before, so no later write pushes a held message out (the transport holds what is
/// written until a flush finishes, and finishes every other flush).
#[tokio::test]
async fn a_message_whose_flush_a_direct_write_left_unfinished_arrives_alone() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(shaped(a, HeldUntilFlushed::default()));
    let server = Session::server(b);
    let (read, mut reads) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        let mut stream = server.accept().await.expect("accept");
        let mut got = [0; 4];
        for i in 0..20u32 {
            stream.read_exact(&mut got).await.expect("read");
            assert_eq!(got, i.to_le_bytes());
            read.send(()).expect("the writer waits");
        }
        server
    });
    let mut stream = client.open().await.expect("open");
    let messages = async {
        for i in 0..20u32 {
            stream.write_all(&i.to_le_bytes()).await.expect("write");
            reads.recv().await.expect("the peer read the message");
        }
    };
    within("twenty messages, one at a time", messages).await;
    reader.await.expect("the peer read them in order");
}

/// Reads from `peer` into `got` until its whole Data frames carry `bytes` bytes in all.
async fn read_data(got: &mut Vec<u8>, peer: &mut DuplexStream, bytes: usize) {
    let read = async {
        let mut buf = vec![0; 4096];
        loop {
            let (streams, _) = data_by_stream(got);
            if streams.values().map(Vec::len).sum::<usize>() >= bytes {
                return;
            }
            let n = peer.read(&mut buf).await.expect("read");
            assert!(n > 0, "the transport closed");
            got.extend_from_slice(&buf[..n]);
        }
    };
    within("the messages", read).await;
}

/// A write of nothing puts nothing on the wire, whether the writer could write its frame
/// itself (an idle session) or would queue it (the driver has a batch in hand: the rest of a
/// 10 KB frame a 4 KiB transport did not take): the peer sees each message's frame and no
/// empty one between them.
#[tokio::test]
async fn an_empty_write_on_a_spawned_session_sends_no_frame() {
    let (a, mut peer) = tokio::io::duplex(4096);
    let client = Session::client(a);
    let mut stream = client.open().await.expect("open");
    let mut got = Vec::new();
    stream.write_all(b"a").await.expect("write");
    read_data(&mut got, &mut peer, 1).await;
    // Idle: the writer would write a frame itself.
    assert_eq!(stream.write(&[]).await.expect("write"), 0);
    stream.write_all(b"b").await.expect("write");
    // The driver has the rest of a large frame in hand: a frame would be queued.
    let bulk = pattern(3, 10_000);
    stream.write_all(&bulk).await.expect("write");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(stream.write(&[]).await.expect("write"), 0);
    stream.write_all(b"c").await.expect("write");
    read_data(&mut got, &mut peer, 3 + bulk.len()).await;
    let (_, end) = data_by_stream(&got);
    let mut lengths = Vec::new();
    let mut at = 0;
    while at < end {
        let header = Header::from_bytes(got[at..at + HEADER_LEN].try_into().expect("8 bytes"))
            .expect("a frame");
        if header.kind == Kind::Data {
            lengths.push(header.length);
            at += header.length as usize;
        }
        at += HEADER_LEN;
    }
    assert_eq!(lengths, vec![1, 1, 10_000, 1], "Data frames' lengths");
}

/// The transport is closed as soon as the driver is done with it, not when the last stream
/// handle goes: here the session ends on a frame of an undefined kind from the peer while a
/// stream is still held, and the peer's writes then fail.
#[tokio::test]
async fn the_transport_is_closed_when_the_driver_ends_though_a_stream_is_held() {
    let (a, mut peer) = tokio::io::duplex(64 * 1024);
    let client = Session::client(a);
    let stream = client.open().await.expect("open");
    peer.write_all(&[0, 0, 0, 0, 0, 0, 0, 0xee])
        .await
        .expect("write");
    within("the session ends", client.closed()).await;
    let closed = async {
        loop {
            match peer.write(&[0; 8]).await {
                Err(_) => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    };
    within("the transport closes", closed).await;
    drop(stream);
}

/// Writes `GOODBYE` when shut down, as a TLS stream sends its close_notify.
struct Goodbye {
    said: usize,
}

const GOODBYE: &[u8] = b"goodbye";

impl Shape for Goodbye {
    fn shutdown(&mut self, inner: &mut DuplexStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.said < GOODBYE.len() {
            let rest = &GOODBYE[self.said..];
            self.said += std::task::ready!(Pin::new(&mut *inner).poll_write(cx, rest))?;
        }
        Pin::new(inner).poll_shutdown(cx)
    }
}

/// A spawned session closed gracefully shuts its transport down (a TLS stream then sends its
/// close_notify) before letting go of it: the peer reads the transport's last words, then the
/// end of the stream, and answers with its CloseMux.
#[tokio::test]
async fn a_spawned_session_closed_gracefully_shuts_its_transport_down() {
    let (a, mut peer) = tokio::io::duplex(1024);
    let client = Session::client(shaped(a, Goodbye { said: 0 }));
    let answer = async {
        let mut seen = Vec::new();
        peer.read_to_end(&mut seen).await.expect("read");
        peer.write_all(&Header::new(0, Kind::CloseMux).to_bytes())
            .await
            .expect("write");
        seen
    };
    let (closed, seen) = within("close", async { tokio::join!(client.close(), answer) }).await;
    closed.expect("graceful close");
    assert!(
        seen.ends_with(GOODBYE),
        "the transport was shut down: {seen:?}"
    );
}

/// Holds the thread of the next write after it is armed, once that write is in the pipe: says
/// so on `entered`, then waits for `release`. The transport stays taken (by the writer) all the
/// while, so a driver that runs meanwhile finds it taken.
struct HoldOnce {
    armed: Arc<Mutex<Option<Hold>>>,
}

/// Where a held write says it has the transport, and where it waits to let go.
type Hold = (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>);

impl Shape for HoldOnce {
    fn wrote(&mut self, _result: &Poll<io::Result<usize>>) {
        let hold = self.armed.lock().expect("armed").take();
        if let Some((entered, release)) = hold {
            entered.send(()).expect("the test waits");
            release.recv().expect("the test releases");
        }
    }

    /// Vectored: the frame's header and payload in one call, so that the peer has the whole
    /// message while the writer still holds the transport.
    fn vectored(&self) -> Option<usize> {
        Some(usize::MAX)
    }
}

/// A driver that wanted the transport while a writer had it is woken when the writer lets go
/// (`IoCell::released`). The session is quiet (keepalives off, nothing left to linger over), so
/// nothing else would wake it: the echo of the writer's message arrives while the writer still
/// holds the transport (its thread blocked in the write for 300 ms), the driver finds the
/// transport taken, and the echo is read only if the writer's release wakes the driver. Without
/// that wake the read waits forever and the test fails on its time limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_found_the_transport_taken_is_woken_when_the_writer_lets_go() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let armed = Arc::default();
    let client = Session::with_config(
        shaped(
            a,
            HoldOnce {
                armed: Arc::clone(&armed),
            },
        ),
        Role::Client,
        Config::default().keepalive_interval(None),
    );
    // The peer runs on a runtime of its own: woken from the writer's worker thread, its task
    // would otherwise wait in that worker's slot for the next task, unstolen, until the
    // writer lets go.
    let peer = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let server = Session::server(b);
            while let Ok(stream) = server.accept().await {
                common::echo(stream).await;
            }
        });
    });
    let mut stream = within("open", client.open()).await.expect("open");
    let mut echoed = [0; 4];
    within("the first echo", async {
        stream.write_all(b"open").await.expect("write");
        stream.read_exact(&mut echoed).await.expect("echo");
    })
    .await;
    // Past the linger (1 s): the session holds no buffers and has no timer running.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    *armed.lock().expect("armed") = Some((entered_tx, release_rx));
    let writer = tokio::spawn(async move {
        stream.write_all(b"ping").await.expect("write");
        stream
    });
    tokio::task::spawn_blocking(move || entered.recv().expect("the writer writes"))
        .await
        .expect("entered");
    // The echo comes back and the driver, woken to read it, finds the transport taken.
    tokio::time::sleep(Duration::from_millis(300)).await;
    release.send(()).expect("the writer waits");
    let mut stream = within("the write", writer).await.expect("writer");
    within_for(
        Duration::from_secs(10),
        "the echo read after the writer let go of the transport",
        stream.read_exact(&mut echoed),
    )
    .await
    .expect("echo");
    assert_eq!(&echoed, b"ping");
    drop((stream, client));
    tokio::task::spawn_blocking(move || peer.join().expect("the peer ends"))
        .await
        .expect("join");
}
