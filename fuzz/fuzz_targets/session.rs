//! Arbitrary bytes as everything a peer sends to a server session whose application accepts
//! streams, reads them and writes back what it read.
//!
//! Input: one byte of options (how the bytes are cut into transport reads; whether the
//! connection then ends or goes quiet), then the bytes the peer sends.
//!
//! Checks: no panic; the session never spins (the transport is polled a bounded number of times
//! for the input it is given); a connection that ends ends the session; a quiet one leaves the
//! session idle, and closing it then finishes. Time is paused, so the session's timers fire as
//! soon as everything waits, and a spin shows up as a poll count instead of a hang.

#![no_main]

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use gomux::{Config, Role, Session};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// Transport polls allowed per input byte, plus a fixed allowance for timers and closing.
const POLLS_PER_BYTE: usize = 64;
const POLLS_FIXED: usize = 100_000;

/// The peer: hands out `input` in pieces, then ends or goes quiet; takes every write.
struct Peer {
    input: Vec<u8>,
    at: usize,
    piece: usize,
    end: bool,
    polls: Rc<Cell<usize>>,
    budget: usize,
}

impl Peer {
    fn poll(&self) {
        let polls = self.polls.get() + 1;
        self.polls.set(polls);
        assert!(
            polls <= self.budget,
            "the session polled its transport {polls} times for {} bytes: it spins",
            self.input.len()
        );
    }
}

impl AsyncRead for Peer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll();
        if self.at == self.input.len() {
            // A quiet peer never wakes the reader again.
            return if self.end {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            };
        }
        let n = self
            .piece
            .min(buf.remaining())
            .min(self.input.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.input[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Peer {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll();
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The application: every stream is read and what was read is written back, up to a limit.
async fn serve(session: Session) {
    while let Ok(mut stream) = session.accept().await {
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let mut echoed = 0;
            while echoed < 256 * 1024 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        echoed += n;
                    }
                }
            }
        });
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&options, input)) = data.split_first() else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    else {
        return;
    };
    let polls = Rc::new(Cell::new(0));
    let peer = Peer {
        input: input.to_vec(),
        at: 0,
        piece: [1, 7, 64, 4096][usize::from(options & 3)],
        end: options & 4 == 0,
        polls: Rc::clone(&polls),
        budget: POLLS_FIXED + POLLS_PER_BYTE * input.len(),
    };
    let ends = peer.end;
    let config = Config::default()
        .max_streams(16)
        .accept_backlog(4)
        .write_buffer_size(4096)
        .keepalive_interval(Some(Duration::from_secs(10)))
        .idle_timeout(Some(Duration::from_secs(60)))
        .close_timeout(Duration::from_secs(5));
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let (session, connection) = Session::new(peer, Role::Server, config);
        let driver = tokio::task::spawn_local(connection);
        tokio::spawn(serve(session.clone()));
        if ends {
            // The whole input, then end-of-file: the session must end, in bounded time.
            let ended = tokio::time::timeout(Duration::from_secs(3600), session.closed()).await;
            assert!(ended.is_ok(), "the session outlived its connection");
        } else {
            // The whole input, then silence: once everything waits, closing must finish.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let closed = tokio::time::timeout(Duration::from_secs(60), session.close()).await;
            assert!(closed.is_ok(), "closing a quiet session did not finish");
        }
        let finished = tokio::time::timeout(Duration::from_secs(60), driver).await;
        assert!(
            matches!(finished, Ok(Ok(_))),
            "the driver did not finish cleanly"
        );
    });
});
