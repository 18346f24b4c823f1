//! A simulated network link for tests: an in-memory, full-duplex byte pipe that delays every
//! byte by a fixed one-way latency and limits each direction to a bandwidth, like a long fat
//! network path. It runs on tokio's timers, so under paused time (`start_paused`) a transfer
//! over it takes the same virtual time on every run, whatever the machine is doing.
//!
//! Each direction holds at most [`Link::buffer`] bytes written and not yet read (in flight on
//! the "wire" or waiting at the receiver); writers wait beyond that, as on a socket whose send
//! buffer is full.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The shape of the simulated path.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Delay of every byte, each way.
    pub latency: Duration,
    /// Bytes per second, each way.
    pub bandwidth: u64,
    /// Bytes written and not yet read that one direction holds before writes wait.
    pub buffer: usize,
}

/// Bytes accepted by one write at most, so that a large write becomes several packets with
/// their own arrival times.
const PACKET: usize = 64 * 1024;

impl Link {
    /// The two ends of a fresh link.
    pub fn pair(self) -> (LinkEnd, LinkEnd) {
        let ab = Arc::new(Mutex::new(Direction::new(self)));
        let ba = Arc::new(Mutex::new(Direction::new(self)));
        let end = |tx: &Arc<Mutex<Direction>>, rx: &Arc<Mutex<Direction>>| LinkEnd {
            tx: Arc::clone(tx),
            rx: Arc::clone(rx),
            arrival: Box::pin(tokio::time::sleep(Duration::ZERO)),
        };
        (end(&ab, &ba), end(&ba, &ab))
    }
}

/// One direction of a link.
struct Direction {
    link: Link,
    /// Packets with the time they arrive, in order.
    packets: VecDeque<(Instant, Bytes)>,
    /// Bytes in `packets`.
    held: usize,
    /// When the sender's side of the link has finished putting the last packet on the wire.
    wire_free: Instant,
    closed: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

impl Direction {
    fn new(link: Link) -> Direction {
        Direction {
            link,
            packets: VecDeque::new(),
            held: 0,
            wire_free: Instant::now(),
            closed: false,
            reader: None,
            writer: None,
        }
    }
}

/// One end of a [`Link`]: `AsyncRead + AsyncWrite`.
pub struct LinkEnd {
    tx: Arc<Mutex<Direction>>,
    rx: Arc<Mutex<Direction>>,
    /// Wakes the reader when the next packet arrives.
    arrival: Pin<Box<Sleep>>,
}

impl AsyncRead for LinkEnd {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let mut rx = this.rx.lock().expect("link lock");
        let now = Instant::now();
        let mut read = 0;
        while buf.remaining() > 0 {
            let Some((at, packet)) = rx.packets.front_mut() else {
                break;
            };
            if *at > now {
                break;
            }
            let n = packet.len().min(buf.remaining());
            buf.put_slice(&packet[..n]);
            packet.advance(n);
            read += n;
            if packet.is_empty() {
                rx.packets.pop_front();
            }
        }
        if read > 0 {
            rx.held -= read;
            if let Some(writer) = rx.writer.take() {
                writer.wake();
            }
            return Poll::Ready(Ok(()));
        }
        match rx.packets.front() {
            Some((at, _)) => {
                let at = *at;
                drop(rx);
                this.arrival.as_mut().reset(at);
                match this.arrival.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
            None if rx.closed => Poll::Ready(Ok(())),
            None => {
                rx.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for LinkEnd {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut tx = self.tx.lock().expect("link lock");
        if tx.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        let room = tx.link.buffer.saturating_sub(tx.held);
        if room == 0 {
            tx.writer = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = data.len().min(room).min(PACKET);
        let now = Instant::now();
        let start = tx.wire_free.max(now);
        let on_wire = Duration::from_secs_f64(n as f64 / tx.link.bandwidth as f64);
        tx.wire_free = start + on_wire;
        let arrival = tx.wire_free + tx.link.latency;
        tx.packets
            .push_back((arrival, Bytes::copy_from_slice(&data[..n])));
        tx.held += n;
        if let Some(reader) = tx.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut tx = self.tx.lock().expect("link lock");
        tx.closed = true;
        if let Some(reader) = tx.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        for direction in [&self.tx, &self.rx] {
            let mut direction = direction.lock().expect("link lock");
            direction.closed = true;
            let wakers = [direction.reader.take(), direction.writer.take()];
            drop(direction);
            wakers.into_iter().flatten().for_each(Waker::wake);
        }
    }
}
