//! Copying both ways between two byte streams with no buffer of their own: each read borrows a
//! buffer from a small shared pool and gives it back once what it read is written, so a
//! connection that sits idle holds no buffer at all, only the few words of its state.
//!
//! The rules are those of `tokio::io::copy_bidirectional`: bytes are written in the order
//! they are read; the writer is flushed whenever the reader has nothing more for now; the
//! reader is not read again until what it gave has been written (backpressure reaches the
//! sender); a direction whose reader reaches end-of-file shuts its writer down (a
//! half-close) and the other direction carries on; any error ends both.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{ready, Context, Poll};

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::config::COPY_BUFFER;

/// How many free buffers the pool keeps for the next reads; a buffer given back beyond that is
/// freed. The pool therefore holds at most `KEPT × COPY_BUFFER` (2 MiB) while the tunnel is
/// quiet; while it is busy, each read in flight holds one buffer besides, so the memory in use
/// follows the clients that are moving bytes, never the ones that are connected.
const KEPT: usize = 64;

/// How many reads one direction serves in one poll before it lets the runtime run other
/// tasks: a sender and a receiver that are both always ready would otherwise hold the thread.
const READS_PER_POLL: usize = 16;

/// The free buffers, each `COPY_BUFFER` bytes long. The lock is held only to take or put one.
static POOL: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());

/// Takes a buffer from the pool, or makes one when the pool is empty.
fn lend() -> Box<[u8]> {
    let free = POOL.lock().unwrap_or_else(PoisonError::into_inner).pop();
    free.unwrap_or_else(|| vec![0; COPY_BUFFER].into_boxed_slice())
}

/// Gives a buffer back to the pool, or frees it when the pool already keeps enough.
fn give_back(buffer: Box<[u8]>) {
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    if pool.len() < KEPT {
        pool.push(buffer);
    }
}

/// Copies between `a` and `b` both ways until each direction has reached end-of-file and shut
/// its writer down, and returns how many bytes went each way (`a` to `b`, then `b` to `a`).
/// The bytes of each write are also added to `counters` (`a` to `b`, then `b` to `a`), when
/// given: one atomic addition per chunk.
///
/// # Errors
///
/// The first error of a read, a write, a flush or a shutdown on either side, which ends both
/// directions; `WriteZero` when a writer takes no bytes.
///
/// The future returned holds the two directions' state and the two sides' references, nothing
/// more (an async function would also keep its arguments).
pub(crate) fn copy_both_ways<'a, A, B>(
    a: &'a mut A,
    b: &'a mut B,
    counters: [Option<Counter>; 2],
) -> impl Future<Output = io::Result<(u64, u64)>> + 'a
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let [there, back] = counters;
    let mut a_to_b = Direction {
        counter: there,
        ..Direction::default()
    };
    let mut b_to_a = Direction {
        counter: back,
        ..Direction::default()
    };
    poll_fn(move |cx| {
        let there = a_to_b.poll_copy(cx, Pin::new(&mut *a), Pin::new(&mut *b))?;
        let back = b_to_a.poll_copy(cx, Pin::new(&mut *b), Pin::new(&mut *a))?;
        match (there, back) {
            (Poll::Ready(there), Poll::Ready(back)) => Poll::Ready(Ok((there, back))),
            _ => Poll::Pending,
        }
    })
}

/// One direction of the copy.
#[derive(Default)]
struct Direction {
    /// What was read and is not written yet, in a lent buffer; `None` between reads.
    held: Option<Held>,
    /// Bytes written since the writer was last flushed.
    unflushed: bool,
    /// The reader has reached end-of-file; the writer is being shut down.
    ended: bool,
    /// The writer is shut down: this direction is done.
    done: bool,
    /// Bytes written so far.
    copied: u64,
    /// Also counts the bytes written, for the metrics.
    counter: Option<Counter>,
}

/// A lent buffer and the part of it still to write.
struct Held {
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Direction {
    /// Moves bytes from `reader` to `writer` until the reader or the writer has to wait, and
    /// returns the number of bytes copied once the reader has ended and the writer is shut
    /// down.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<io::Result<u64>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        let mut reads = 0;
        loop {
            if self.done {
                return Poll::Ready(Ok(self.copied));
            }
            if let Some(held) = &mut self.held {
                let written = ready!(writer
                    .as_mut()
                    .poll_write(cx, &held.buffer[held.start..held.end]))?;
                if written == 0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "the writer took no bytes",
                    )));
                }
                held.start += written;
                self.copied += written as u64;
                if let Some(counter) = &self.counter {
                    counter.inc_by(written as u64);
                }
                self.unflushed = true;
                if held.start == held.end {
                    if let Some(held) = self.held.take() {
                        give_back(held.buffer);
                    }
                }
                continue;
            }
            if self.ended {
                ready!(writer.as_mut().poll_shutdown(cx))?;
                self.done = true;
                continue;
            }
            if reads == READS_PER_POLL {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            reads += 1;
            let mut buffer = lend();
            let mut read = ReadBuf::new(&mut buffer);
            let polled = reader.as_mut().poll_read(cx, &mut read);
            let filled = read.filled().len();
            match polled {
                Poll::Ready(Ok(())) if filled > 0 => {
                    self.held = Some(Held {
                        buffer,
                        start: 0,
                        end: filled,
                    });
                }
                Poll::Ready(Ok(())) => {
                    give_back(buffer);
                    self.ended = true;
                }
                Poll::Ready(Err(error)) => {
                    give_back(buffer);
                    return Poll::Ready(Err(error));
                }
                Poll::Pending => {
                    // Nothing to read: the buffer goes back, and the writer gets what was
                    // written so far before this direction waits.
                    give_back(buffer);
                    if self.unflushed {
                        ready!(writer.as_mut().poll_flush(cx))?;
                        self.unflushed = false;
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Everything goes through both ways, in order, through pipes much smaller than a buffer
    /// (so every write waits for the other side to read), and each end-of-file travels as a
    /// half-close while the other direction carries on.
    #[tokio::test]
    async fn copies_both_ways_with_backpressure_and_half_closes() {
        let (mut left, mut left_relay) = tokio::io::duplex(512);
        let (mut right_relay, mut right) = tokio::io::duplex(512);
        let relay = tokio::spawn(async move {
            copy_both_ways(&mut left_relay, &mut right_relay, [None, None]).await
        });
        let there: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let back: Vec<u8> = (0..150_000u32).map(|i| (i % 241) as u8).collect();

        let (there_sent, back_sent) = (there.clone(), back.clone());
        let left_side = tokio::spawn(async move {
            left.write_all(&there_sent).await?;
            left.shutdown().await?;
            let mut got = Vec::new();
            left.read_to_end(&mut got).await?;
            io::Result::Ok(got)
        });
        let mut got = Vec::new();
        right.read_to_end(&mut got).await.expect("read to the end");
        assert!(
            got == there,
            "a to b: {} bytes of {}",
            got.len(),
            there.len()
        );
        // The left side has half-closed; the way back still carries everything.
        right.write_all(&back_sent).await.expect("write back");
        right.shutdown().await.expect("half-close back");
        let got_back = left_side.await.expect("no panic").expect("left side");
        assert!(got_back == back, "b to a: {} bytes", got_back.len());
        let copied = relay.await.expect("no panic").expect("relay");
        assert_eq!(copied, (there.len() as u64, back.len() as u64));
    }

    /// A write that fails ends the relay with its error.
    #[tokio::test]
    async fn a_write_error_ends_the_relay() {
        let (mut left, mut left_relay) = tokio::io::duplex(512);
        let (mut right_relay, right) = tokio::io::duplex(512);
        drop(right); // writes to `right_relay` fail from now on
        let relay = tokio::spawn(async move {
            copy_both_ways(&mut left_relay, &mut right_relay, [None, None]).await
        });
        left.write_all(b"nowhere to go").await.expect("write");
        let result = tokio::time::timeout(std::time::Duration::from_secs(20), relay)
            .await
            .expect("the relay ends")
            .expect("no panic");
        match result {
            Ok(copied) => panic!("ended without an error: {copied:?}"),
            Err(error) => assert_eq!(error.kind(), io::ErrorKind::BrokenPipe),
        }
    }
}
