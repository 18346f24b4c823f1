//! Direct writes: on a spawned session, a writer whose frame would be the only thing to write
//! writes it to the transport itself, without waking the driver task (`src/session/direct.rs`).
//!
//! - A message on an idle session is written from the writer's own task.
//! - A transport that takes a few bytes per call (with vectored writes and without): the rest
//!   of a frame a direct write left goes out before anything else, and every stream's bytes
//!   arrive whole and in order while several streams write at once.
//! - A transport that holds written bytes until flushed, and whose flush does not finish at
//!   once: the driver finishes the flush a direct write started.
//!
//! Both ends closing while busy over TCP, with direct writes in flight, is in
//! `tests/core_findings_b.rs` (`closing_a_busy_session_*`) and `tests/close_paths.rs`.

mod common;

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use common::{pattern, spawn_echo, within};
use gomux::{Session, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

/// Each write call the transport took bytes in: the task it ran in, and how many bytes.
type Calls = Arc<Mutex<Vec<(Option<tokio::task::Id>, usize)>>>;

/// A transport that records which task each write ran in.
struct Recording {
    inner: DuplexStream,
    calls: Calls,
}

impl Recording {
    fn record(&self, result: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = result {
            if *n > 0 {
                let mut calls = self.calls.lock().expect("calls");
                calls.push((tokio::task::try_id(), *n));
            }
        }
    }
}

impl AsyncRead for Recording {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Recording {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.record(&result);
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn a_message_on_an_idle_session_is_written_from_the_writers_task() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let calls = Calls::default();
    let client = Session::client(Recording {
        inner: a,
        calls: Arc::clone(&calls),
    });
    let _server = spawn_echo(Session::server(b));
    let recorded = Arc::clone(&calls);
    let writer = tokio::spawn(async move {
        let mut stream = client.open().await.expect("open");
        let mut echoed = [0; 4];
        // The first message goes with the stream's open, which the driver writes.
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
    // queued meanwhile (here the credit for each echo read) ahead of it. This transport has no
    // vectored writes, so each part is one call.
    let from_writer: usize = calls
        .iter()
        .filter(|&&(task, _)| task == Some(writer_task))
        .map(|&(_, n)| n)
        .sum();
    assert!(
        from_writer >= 10 * 12,
        "every message was written by its writer, not the driver: {calls:?}"
    );
}

/// A transport that takes at most `most` bytes per write call, vectored or not.
struct Trickle {
    inner: DuplexStream,
    most: usize,
    vectored: bool,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let most = self.most.min(buf.len());
        Pin::new(&mut self.inner).poll_write(cx, &buf[..most])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // At most `most` bytes, taken across the slices (a header and its payload at once).
        let mut joined = Vec::new();
        for buf in bufs {
            joined.extend_from_slice(&buf[..buf.len().min(self.most - joined.len())]);
            if joined.len() == self.most {
                break;
            }
        }
        self.poll_write(cx, &joined)
    }

    fn is_write_vectored(&self) -> bool {
        self.vectored
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
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
    let client = Session::client(Trickle {
        inner: a,
        most: 5,
        vectored,
    });
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

/// A transport that keeps what is written until flushed, and whose flush finishes only on
/// every other call (it asks to be polled again at once, as a TLS stream whose socket is busy
/// would be later).
struct HeldUntilFlushed {
    inner: DuplexStream,
    held: Vec<u8>,
    flushes: u64,
}

impl AsyncRead for HeldUntilFlushed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for HeldUntilFlushed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.flushes += 1;
        if this.flushes % 2 == 1 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        while !this.held.is_empty() {
            let n = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, &this.held))?;
            this.held.drain(..n);
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_a_direct_write_left_unfinished_is_finished_by_the_driver() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::client(HeldUntilFlushed {
        inner: a,
        held: Vec::new(),
        flushes: 0,
    });
    let _server = spawn_echo(Session::server(b));
    within(
        "messages over a transport that holds them until flushed",
        messages_arrive_whole(client, 2),
    )
    .await;
}
