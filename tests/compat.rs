//! gomux with the `futures::io` traits, through `tokio_util::compat`, both ways round:
//!
//! - a [`gomux::Stream`] used as a `futures::io::AsyncRead + AsyncWrite` (for code written
//!   against the `futures` traits), and
//! - a session running on a transport that speaks only `futures::io` (what non-tokio
//!   runtimes and libraries hand out), adapted to tokio's traits.
//!
//! For the second, the transport is an in-memory duplex pipe made only of `futures` parts (a
//! bounded `futures::channel::mpsc` channel each way, read through
//! `TryStreamExt::into_async_read`), so no tokio I/O type is hidden underneath it.

mod common;

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::channel::mpsc;
use futures::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use futures::stream::IntoAsyncRead;
use futures::TryStreamExt;
use gomux::{Error, Session};
use tokio_util::compat::{
    FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt,
};

use common::{assert_same, pattern, round_trip, spawn_echo, within, Transport};

#[tokio::test]
async fn a_stream_reads_and_writes_through_the_futures_traits() {
    let (client, server) = common::sessions(Transport::Duplex(64 * 1024)).await;

    // The server echoes with futures-io code only: each half of the stream adapted on its
    // own, and `futures::io::copy` between them. `close` on the write half is the half-close.
    let echo = tokio::spawn(async move {
        let (reader, writer) = server.accept().await.expect("accept").into_split();
        let mut writer = writer.compat_write();
        let copied = futures::io::copy(reader.compat(), &mut writer)
            .await
            .expect("copy");
        writer.close().await.expect("half-close the echo");
        copied
    });

    // The client adapts the whole stream, then splits it the futures way.
    let stream = client.open().await.expect("open").compat();
    let (mut reader, mut writer) = stream.split();
    let data = pattern(7, 300 * 1024);
    let send = async {
        writer.write_all(&data).await.expect("write_all");
        writer.close().await.expect("close, i.e. half-close");
    };
    let receive = async {
        let mut echoed = Vec::new();
        reader.read_to_end(&mut echoed).await.expect("read_to_end");
        echoed
    };
    let ((), echoed) = within("the echo", async { tokio::join!(send, receive) }).await;

    assert_same(&echoed, &data, "echo through futures-io");
    let copied = within("the server's copy", echo).await.expect("no panic");
    assert_eq!(copied, data.len() as u64);
}

#[tokio::test]
async fn a_write_after_close_fails_through_the_futures_traits() {
    let (client, server) = common::sessions(Transport::Duplex(64 * 1024)).await;
    let mut stream = client.open().await.expect("open").compat();
    stream.write_all(b"last words").await.expect("write");
    stream.close().await.expect("half-close");

    let error = stream
        .write_all(b"more")
        .await
        .expect_err("writing after close fails");
    assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    assert!(matches!(
        common::gomux_error(&error),
        Some(Error::WriteClosed)
    ));

    // The peer got everything up to the close, then end-of-stream.
    let mut inbound = server.accept().await.expect("accept").compat();
    let mut got = Vec::new();
    within("the peer's read", inbound.read_to_end(&mut got))
        .await
        .expect("read");
    assert_eq!(got, b"last words");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_on_a_futures_io_transport() {
    // Each end of the pipe implements only the futures traits; `compat()` gives tokio's.
    let (a, b) = pipe();
    let client = Session::client(a.compat());
    let server = Session::server(b.compat());
    let _echo = spawn_echo(server.clone());

    // Several streams at once, in both directions, so frames of different streams interleave
    // on the pipe and flow control works through the adapters.
    let streams: Vec<_> = (0..8)
        .map(|seed| {
            let client = client.clone();
            tokio::spawn(async move {
                let data = pattern(seed, 200 * 1024);
                let stream = client.open().await.expect("open");
                let echoed = round_trip(stream, &data).await;
                assert_same(&echoed, &data, &format!("stream {seed}"));
            })
        })
        .collect();
    for stream in streams {
        within("an echo over the pipe", stream)
            .await
            .expect("no panic");
    }

    // A graceful close reaches the other end through the adapters too.
    within("the close", client.close()).await.expect("close");
    let reason = within("the server's end", server.closed()).await;
    assert!(matches!(reason, Error::ClosedByPeer), "{reason}");
}

// ---------------------------------------------------------------------------------------------
// An in-memory duplex pipe with only the futures-io traits
// ---------------------------------------------------------------------------------------------

/// One chunk of bytes in flight; the error type is what `into_async_read` asks for.
type Chunk = io::Result<Vec<u8>>;

/// Chunks in flight per direction before the writer waits: the pipe's backpressure.
const PIPE_CHUNKS: usize = 16;

/// One end of the pipe: writes go to the other end as chunks on a bounded channel, reads come
/// from the other end's channel.
struct PipeEnd {
    incoming: IntoAsyncRead<mpsc::Receiver<Chunk>>,
    outgoing: mpsc::Sender<Chunk>,
}

/// Two connected ends.
fn pipe() -> (PipeEnd, PipeEnd) {
    let (a_out, b_in) = mpsc::channel(PIPE_CHUNKS);
    let (b_out, a_in) = mpsc::channel(PIPE_CHUNKS);
    (
        PipeEnd {
            incoming: a_in.into_async_read(),
            outgoing: a_out,
        },
        PipeEnd {
            incoming: b_in.into_async_read(),
            outgoing: b_out,
        },
    )
}

/// The other end is gone: as a socket whose peer has closed would report.
fn peer_gone(_: mpsc::SendError) -> io::Error {
    io::Error::from(io::ErrorKind::BrokenPipe)
}

impl AsyncRead for PipeEnd {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.incoming).poll_read(cx, buf)
    }
}

impl AsyncWrite for PipeEnd {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // An empty chunk would read as end-of-file at the other end.
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.outgoing.poll_ready(cx)).map_err(peer_gone)?;
        self.outgoing
            .start_send(Ok(buf.to_vec()))
            .map_err(peer_gone)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A sent chunk is already with the reader: nothing is buffered on this side.
        Poll::Ready(Ok(()))
    }

    fn poll_close(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The other end reads end-of-file once it has taken the chunks in flight.
        self.outgoing.close_channel();
        Poll::Ready(Ok(()))
    }
}
