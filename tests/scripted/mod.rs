//! A hostile peer made of a script, for the memory tests: it makes frames up as the session
//! reads them (a Data frame's payload is made up to match its header), so the peer itself
//! allocates nothing and the counting allocator sees only the session.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use gomux::frame::{Header, Kind, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the peer sends: the next frame's header (a Data frame's payload is made up to match),
/// or `None` once it has sent all it will.
pub trait Script: Unpin {
    fn next_frame(&mut self) -> Option<Header>;
}

/// What the peer does with what the session writes.
#[derive(Clone, Copy)]
pub enum Sink {
    /// Never reads it: every write waits for good.
    Never,
    /// Reads and ignores it.
    Discard,
}

/// The session's transport: reads come from the script, writes go to the sink.
pub struct Peer<S> {
    script: S,
    head: [u8; HEADER_LEN],
    head_sent: usize,
    payload_left: usize,
    sink: Sink,
    /// Bytes the session has read so far.
    fed: Arc<AtomicUsize>,
}

impl<S: Script> Peer<S> {
    /// The peer, and a count of the bytes the session reads from it.
    pub fn new(script: S, sink: Sink) -> (Peer<S>, Arc<AtomicUsize>) {
        let fed = Arc::new(AtomicUsize::new(0));
        let peer = Peer {
            script,
            head: [0; HEADER_LEN],
            head_sent: HEADER_LEN,
            payload_left: 0,
            sink,
            fed: Arc::clone(&fed),
        };
        (peer, fed)
    }
}

/// Payload bytes of the peer's Data frames.
static FILL: [u8; 4096] = [0x5a; 4096];

impl<S: Script> AsyncRead for Peer<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let start = buf.filled().len();
        while buf.remaining() > 0 {
            if self.head_sent < HEADER_LEN {
                let n = (HEADER_LEN - self.head_sent).min(buf.remaining());
                buf.put_slice(&self.head[self.head_sent..self.head_sent + n]);
                self.head_sent += n;
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(buf.remaining()).min(FILL.len());
                buf.put_slice(&FILL[..n]);
                self.payload_left -= n;
            } else if let Some(header) = self.script.next_frame() {
                self.head = header.to_bytes();
                self.head_sent = 0;
                if header.kind == Kind::Data {
                    self.payload_left = header.length as usize;
                }
            } else {
                break;
            }
        }
        let fed = buf.filled().len() - start;
        if fed == 0 {
            // The script is over: the peer goes quiet, the connection stays open.
            return Poll::Pending;
        }
        self.fed.fetch_add(fed, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl<S: Script> AsyncWrite for Peer<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.sink {
            Sink::Never => Poll::Pending,
            Sink::Discard => Poll::Ready(Ok(data.len())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.sink {
            Sink::Never => Poll::Pending,
            Sink::Discard => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}
