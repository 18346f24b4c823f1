//! What waits in front of a small message of one stream beside another stream's bulk, on a
//! transport that takes a whole write while it has room and then pushes back until the next
//! round (as a TCP socket with `TCP_NOTSENT_LOWAT` does): the batch the session's writer has in
//! hand when the transport pushes back is a fraction of a round, not a whole one.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use gomux::Session;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

/// Bytes the transport takes per round (each write whole, while any of the round is left).
const ROUND: usize = 64 * 1024;
/// Time between rounds.
const TICK: Duration = Duration::from_millis(1);
/// Pings sent, each at another point of a round.
const PINGS: u32 = 16;
/// The small message: a pattern that the bulk (zeros) never carries.
const PING: [u8; 64] = [0xa5; 64];

#[derive(Default)]
struct Rounds {
    /// What is left of the current round.
    room: usize,
    waker: Option<Waker>,
    /// Bytes written to the transport so far.
    written: usize,
    /// Bytes written before the first byte of [`PING`], once it was written.
    ping_at: Option<usize>,
}

/// The client's end of the connection, taking bytes in rounds.
struct RoundTransport {
    inner: DuplexStream,
    rounds: Arc<Mutex<Rounds>>,
}

impl AsyncWrite for RoundTransport {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let rounds = Arc::clone(&self.rounds);
        let mut rounds = rounds.lock().expect("rounds");
        if rounds.room == 0 {
            rounds.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        if rounds.ping_at.is_none() {
            if let Some(at) = buf[..n].windows(PING.len()).position(|w| w == PING) {
                rounds.ping_at = Some(rounds.written + at);
            }
        }
        rounds.written += n;
        rounds.room = rounds.room.saturating_sub(n);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl AsyncRead for RoundTransport {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[tokio::test(start_paused = true)]
async fn a_small_message_waits_for_a_fraction_of_a_round() {
    let (client_end, server_end) = tokio::io::duplex(16 * 1024 * 1024);
    let rounds = Arc::new(Mutex::new(Rounds::default()));
    let refill = Arc::clone(&rounds);
    let _rounds = tokio::spawn(async move {
        loop {
            tokio::time::sleep(TICK).await;
            let waker = {
                let mut rounds = refill.lock().expect("rounds");
                rounds.room = ROUND;
                rounds.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    });
    let client = Session::client(RoundTransport {
        inner: client_end,
        rounds: Arc::clone(&rounds),
    });
    let server = Session::server(server_end);
    let _draining = tokio::spawn(async move {
        while let Ok(mut stream) = server.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });

    let mut bulk = client.open().await.expect("open bulk");
    let mut ping = client.open().await.expect("open ping");
    let _bulk = tokio::spawn(async move {
        let chunk = vec![0; 64 * 1024];
        while bulk.write_all(&chunk).await.is_ok() {}
    });
    // Many rounds of bulk, so the writer has learned what the transport takes.
    tokio::time::sleep(TICK * 50).await;
    assert!(
        rounds.lock().expect("rounds").written > 20 * ROUND,
        "the bulk did not get going"
    );

    // Pings at different points of a round: the most bulk that went out in front of one.
    let mut most = 0;
    for k in 0..PINGS {
        tokio::time::sleep(TICK * 3 + TICK * k / PINGS).await;
        rounds.lock().expect("rounds").ping_at = None;
        ping.write_all(&PING).await.expect("ping");
        let queued_at = rounds.lock().expect("rounds").written;
        let ping_at = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(at) = rounds.lock().expect("rounds").ping_at {
                    return at;
                }
                tokio::time::sleep(TICK / 10).await;
            }
        })
        .await
        .expect("the ping was never written");
        most = most.max(ping_at.saturating_sub(queued_at));
    }
    // The batch in hand is a quarter of a round (plus a frame header or a cut frame's rest);
    // a batch of a whole round would put all of it in front, and the next round's too.
    assert!(
        most <= ROUND / 2,
        "{most} bytes of bulk went out in front of a ping, in rounds of {ROUND}"
    );
}
