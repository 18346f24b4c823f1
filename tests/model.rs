//! Model-based property test: random operations on both ends of random streams, over
//! transports that cut every read and write into small random pieces, checked against a model
//! of what each end must see.
//!
//! The codec's own properties (encode then decode, in any split of the input) are next to it in
//! `src/codec.rs`; this file tests the sessions.
//!
//! Each case runs on its own current-thread runtime with paused time, so a case is a
//! deterministic function of its inputs (proptest can shrink a failure to a short sequence) and
//! an operation that can make no progress is seen at once: the runtime jumps to the operation's
//! deadline instead of waiting for it.
//!
//! Operations never wait for the other side: each is given a short virtual deadline and counts
//! what it did by then (a write that was cut short queued exactly what it reported, since writes
//! are cancel safe). At the end every end shuts down its writing, reads everything left, and all
//! handles are dropped. The invariants:
//!
//! - what an end reads is always a prefix of what its peer's writes reported (nothing lost from
//!   the middle, duplicated, reordered or mixed between streams);
//! - end-of-stream comes only after all of it;
//! - an end that keeps reading, in a session it did not close itself, reads all of it: data
//!   queued before a close, a drop or the peer's session close still arrives;
//! - a write fails only for a reason (this end closed its writing, the peer closed its reading,
//!   a session ended), and always fails once this end closed its writing;
//! - nothing waits longer than its bound, and both stream tables are empty at the end.

mod common;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use common::{gomux_error, pattern};
use gomux::{Config, Error, Role, Session, Stream};
use proptest::prelude::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::time::timeout;

/// Deadline of one operation: once every task waits, time jumps here.
const OP: Duration = Duration::from_millis(5);
/// Deadline of a step that must finish (a close, the final reads): a hang if reached.
const MUST: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// A transport that cuts I/O into small pieces.

/// A pipe end that reads and writes at most a random, small number of bytes per call and now
/// and then answers "not yet" (waking itself), so frames arrive in pieces and wake-ups between
/// the pieces are exercised.
struct Chopped {
    inner: DuplexStream,
    rng: u64,
    max: usize,
}

impl Chopped {
    fn new(inner: DuplexStream, seed: u64, max: usize) -> Chopped {
        Chopped {
            inner,
            rng: seed | 1,
            max,
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// How much this call may move; `None` to answer "not yet".
    fn piece(&mut self, cx: &mut Context<'_>) -> Option<usize> {
        let r = self.next();
        if r % 8 == 0 {
            cx.waker().wake_by_ref();
            return None;
        }
        Some(1 + (r >> 8) as usize % self.max)
    }
}

impl AsyncRead for Chopped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let Some(n) = self.piece(cx) else {
            return Poll::Pending;
        };
        let n = n.min(buf.remaining());
        let mut small = ReadBuf::new(buf.initialize_unfilled_to(n));
        let polled = Pin::new(&mut self.inner).poll_read(cx, &mut small);
        let filled = small.filled().len();
        if polled.is_ready() {
            buf.advance(filled);
        }
        polled
    }
}

impl AsyncWrite for Chopped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let Some(n) = self.piece(cx) else {
            return Poll::Pending;
        };
        let n = n.min(data.len());
        Pin::new(&mut self.inner).poll_write(cx, &data[..n])
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// Operations and the model.

/// One step of a case. `side` 0 is the client, 1 the server; `stream` picks among the streams
/// opened so far (modulo their number).
#[derive(Debug, Clone)]
enum Op {
    Open {
        side: usize,
    },
    Accept {
        side: usize,
    },
    Write {
        side: usize,
        stream: usize,
        len: usize,
    },
    Read {
        side: usize,
        stream: usize,
        len: usize,
    },
    Shutdown {
        side: usize,
        stream: usize,
    },
    CloseRead {
        side: usize,
        stream: usize,
    },
    Close {
        side: usize,
        stream: usize,
    },
    Drop {
        side: usize,
        stream: usize,
    },
    SessionClose {
        side: usize,
    },
}

fn op(max_write: usize) -> impl Strategy<Value = Op> {
    let side = 0..2usize;
    let stream = 0..8usize;
    prop_oneof![
        3 => side.clone().prop_map(|side| Op::Open { side }),
        3 => side.clone().prop_map(|side| Op::Accept { side }),
        8 => (side.clone(), stream.clone(), 0..=max_write)
            .prop_map(|(side, stream, len)| Op::Write { side, stream, len }),
        8 => (side.clone(), stream.clone(), 1..=max_write.max(1))
            .prop_map(|(side, stream, len)| Op::Read { side, stream, len }),
        1 => (side.clone(), stream.clone()).prop_map(|(side, stream)| Op::Shutdown { side, stream }),
        1 => (side.clone(), stream.clone()).prop_map(|(side, stream)| Op::CloseRead { side, stream }),
        1 => (side.clone(), stream.clone()).prop_map(|(side, stream)| Op::Close { side, stream }),
        1 => (side, stream).prop_map(|(side, stream)| Op::Drop { side, stream }),
    ]
}

/// A case: a few opens to start with, random operations, and in one case out of four a
/// session close somewhere among them (more often, and most cases would test only closing).
fn ops(max_write: usize) -> impl Strategy<Value = Vec<Op>> {
    (
        proptest::collection::vec((0..2usize).prop_map(|side| Op::Open { side }), 1..4),
        proptest::collection::vec(op(max_write), 5..80),
        proptest::option::weighted(0.25, (0..2usize, any::<prop::sample::Index>())),
    )
        .prop_map(|(mut opens, mut rest, close)| {
            if let Some((side, at)) = close {
                let at = at.index(rest.len() + 1);
                rest.insert(at, Op::SessionClose { side });
            }
            opens.append(&mut rest);
            opens
        })
}

/// One end of one stream as the model sees it.
#[derive(Default)]
struct End {
    /// The handle, once accepted (the opener has it at once) and until dropped.
    handle: Option<Stream>,
    accepted: bool,
    /// This end shut down, closed or dropped its writing.
    write_closed: bool,
    /// This end closed its reading (close_read, close, drop): what arrives is discarded.
    read_closed: bool,
    /// Everything writes on this end reported as written, in order.
    sent: Vec<u8>,
    /// Everything reads on this end returned, in order.
    received: Vec<u8>,
    eof: bool,
}

/// A stream: its id and its two ends, indexed by side.
struct Pair {
    id: u32,
    ends: [End; 2],
}

struct Model {
    sessions: [Session; 2],
    /// Which sides closed their session.
    session_closed: [bool; 2],
    pairs: Vec<Pair>,
    /// Source of write content, so every write differs.
    writes: u64,
}

impl Model {
    fn pair(&mut self, index: usize) -> Option<&mut Pair> {
        let len = self.pairs.len();
        if len == 0 {
            None
        } else {
            self.pairs.get_mut(index % len)
        }
    }

    fn any_session_closed(&self) -> bool {
        self.session_closed.iter().any(|&c| c)
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Open { side } => {
                if let Ok(Ok(stream)) = timeout(OP, self.sessions[side].open()).await {
                    let mut ends = [End::default(), End::default()];
                    ends[side].accepted = true;
                    let id = stream.id();
                    ends[side].handle = Some(stream);
                    self.pairs.push(Pair { id, ends });
                } else {
                    prop_assert!(self.any_session_closed(), "open failed in a live session");
                }
            }
            Op::Accept { side } => self.accept(side).await?,
            Op::Write { side, stream, len } => {
                self.writes += 1;
                let content = pattern(self.writes, len);
                let closed = self.any_session_closed();
                let Some(pair) = self.pair(stream) else {
                    return Ok(());
                };
                let peer_gone = pair.ends[1 - side].read_closed;
                let end = &mut pair.ends[side];
                let Some(handle) = end.handle.as_mut() else {
                    return Ok(());
                };
                match timeout(OP, handle.write(&content)).await {
                    Err(_) => {}
                    Ok(Ok(n)) => {
                        prop_assert!(!end.write_closed, "write after this end closed writing");
                        prop_assert!(n <= len);
                        end.sent.extend_from_slice(&content[..n]);
                    }
                    Ok(Err(error)) => {
                        let error = gomux_error(&error).cloned();
                        let justified = match error {
                            Some(Error::WriteClosed) => end.write_closed,
                            Some(Error::PeerReadClosed) => peer_gone,
                            Some(ref e) if e.is_session_end() => closed,
                            _ => false,
                        };
                        prop_assert!(justified, "write failed without a reason: {:?}", error);
                    }
                }
            }
            Op::Read { side, stream, len } => {
                let Some(pair) = self.pair(stream) else {
                    return Ok(());
                };
                let (mine, theirs) = split_ends(pair, side);
                // Out of the model while it is used, so the model can be updated meanwhile.
                let Some(mut handle) = mine.handle.take() else {
                    return Ok(());
                };
                let mut buf = vec![0u8; len];
                let read = timeout(OP, handle.read(&mut buf)).await;
                mine.handle = Some(handle);
                if let Ok(result) = read {
                    record_read(mine, theirs, result.map(|n| &buf[..n]))?;
                }
            }
            Op::Shutdown { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if let Some(handle) = end.handle.as_mut() {
                        end.write_closed = true;
                        let _ = timeout(MUST, handle.shutdown()).await;
                    }
                }
            }
            Op::CloseRead { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if let Some(handle) = end.handle.as_mut() {
                        end.read_closed = true;
                        handle.close_read();
                    }
                }
            }
            Op::Close { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if let Some(handle) = end.handle.as_mut() {
                        end.read_closed = true;
                        end.write_closed = true;
                        let closed = timeout(MUST, handle.close()).await;
                        prop_assert!(closed.is_ok(), "Stream::close hung");
                    }
                }
            }
            Op::Drop { side, stream } => {
                if let Some(end) = self.pair(stream).map(|p| &mut p.ends[side]) {
                    if end.handle.take().is_some() {
                        end.read_closed = true;
                        end.write_closed = true;
                    }
                }
            }
            Op::SessionClose { side } => {
                self.session_closed[side] = true;
                let closed = timeout(MUST, self.sessions[side].close()).await;
                prop_assert!(closed.is_ok(), "Session::close hung");
            }
        }
        Ok(())
    }

    /// Accepts one stream on `side` if one is waiting, and matches it to its opener.
    async fn accept(&mut self, side: usize) -> Result<(), TestCaseError> {
        let Ok(Ok(stream)) = timeout(OP, self.sessions[side].accept()).await else {
            return Ok(());
        };
        let id = stream.id();
        let pair = self
            .pairs
            .iter_mut()
            .find(|p| p.id == id && !p.ends[side].accepted);
        let Some(pair) = pair else {
            return Err(TestCaseError::fail(format!(
                "accepted stream {id}, which the peer did not open"
            )));
        };
        // Streams are accepted in the order they were opened.
        pair.ends[side].accepted = true;
        pair.ends[side].handle = Some(stream);
        Ok(())
    }

    /// Accepts every stream still queued, shuts down every writer, reads every end to its end,
    /// drops everything, and checks the invariants.
    async fn finish(mut self) -> Result<(), TestCaseError> {
        for side in 0..2 {
            loop {
                let waiting = self.pairs.iter().filter(|p| !p.ends[side].accepted).count();
                if waiting == 0 {
                    break;
                }
                let before = self.pairs.iter().filter(|p| p.ends[side].accepted).count();
                self.accept(side).await?;
                if before == self.pairs.iter().filter(|p| p.ends[side].accepted).count() {
                    // Nothing more is queued: the rest was lost to a session close.
                    prop_assert!(self.any_session_closed(), "an opened stream never arrived");
                    break;
                }
            }
        }
        for pair in &mut self.pairs {
            for end in &mut pair.ends {
                if let Some(handle) = end.handle.as_mut() {
                    end.write_closed = true;
                    prop_assert!(
                        timeout(MUST, handle.shutdown()).await.is_ok(),
                        "shutdown hung"
                    );
                }
            }
        }
        for pair in &mut self.pairs {
            for side in 0..2 {
                let id = pair.id;
                let (mine, theirs) = split_ends(pair, side);
                if mine.read_closed {
                    continue;
                }
                let Some(mut handle) = mine.handle.take() else {
                    continue;
                };
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let read = timeout(MUST, handle.read(&mut buf)).await;
                    prop_assert!(read.is_ok(), "final read on stream {} hung", id);
                    let result = read.unwrap_or(Ok(0));
                    let stop = !matches!(result, Ok(n) if n > 0);
                    record_read(mine, theirs, result.map(|n| &buf[..n]))?;
                    if stop {
                        break;
                    }
                }
                mine.handle = Some(handle);
                // Nothing is lost unless this end's own session close cut the stream short.
                // (A peer's close followed by a failed write of ours must not lose anything
                // either: see `faults::a_peers_close_loses_no_data_when_our_write_fails_first`.)
                if !self.session_closed[side] {
                    prop_assert_eq!(
                        mine.received.len(),
                        theirs.sent.len(),
                        "stream {}: an end that kept reading missed data",
                        id
                    );
                }
            }
        }
        for pair in &mut self.pairs {
            for end in &mut pair.ends {
                end.handle = None;
            }
        }
        for session in &self.sessions {
            let emptied = timeout(MUST, async {
                while session.stream_count() != 0 {
                    tokio::time::sleep(OP).await;
                }
            })
            .await;
            prop_assert!(
                emptied.is_ok(),
                "{} streams left in a {:?} table",
                session.stream_count(),
                session.role()
            );
        }
        for session in &self.sessions {
            prop_assert!(timeout(MUST, session.close()).await.is_ok(), "close hung");
        }
        Ok(())
    }
}

/// This side's end and the peer's end of `pair`.
fn split_ends(pair: &mut Pair, side: usize) -> (&mut End, &mut End) {
    let [client, server] = &mut pair.ends;
    if side == 0 {
        (client, server)
    } else {
        (server, client)
    }
}

/// Checks and records the outcome of a read on `mine`, whose peer end is `theirs`.
fn record_read(
    mine: &mut End,
    theirs: &End,
    result: io::Result<&[u8]>,
) -> Result<(), TestCaseError> {
    match result {
        Ok([]) => {
            if !mine.read_closed {
                // End-of-stream only after everything the peer wrote.
                prop_assert_eq!(
                    mine.received.len(),
                    theirs.sent.len(),
                    "end-of-stream before all the data"
                );
                prop_assert!(
                    theirs.write_closed,
                    "end-of-stream while the peer still writes"
                );
            }
            mine.eof = true;
        }
        Ok(data) => {
            prop_assert!(!mine.eof || mine.read_closed, "data after end-of-stream");
            prop_assert!(!mine.read_closed, "data after this end closed reading");
            let start = mine.received.len();
            prop_assert!(
                start + data.len() <= theirs.sent.len()
                    && theirs.sent[start..start + data.len()] == *data,
                "read bytes {}..{} differ from what the peer wrote ({} bytes)",
                start,
                start + data.len(),
                theirs.sent.len()
            );
            mine.received.extend_from_slice(data);
        }
        Err(_) => {}
    }
    Ok(())
}

/// Runs one case: sessions over chopped pipes, the operations, then the final checks.
fn run(ops: Vec<Op>, seed: u64, chop: usize, pipe: usize) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    runtime.block_on(async move {
        let (a, b) = tokio::io::duplex(pipe);
        let client =
            Session::with_config(Chopped::new(a, seed, chop), Role::Client, Config::default());
        let server = Session::with_config(
            Chopped::new(b, seed.rotate_left(32), chop),
            Role::Server,
            Config::default(),
        );
        let mut model = Model {
            sessions: [client, server],
            session_closed: [false; 2],
            pairs: Vec::new(),
            writes: seed,
        };
        for op in &ops {
            model.apply(op).await?;
        }
        model.finish().await
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn streams_deliver_every_byte_once_in_order_whatever_the_operations(
        (ops, chop) in prop_oneof![
            // Tiny pieces with small writes, larger pieces with writes beyond the window.
            (ops(2000), 1..16usize),
            (ops(150_000), 256..8192usize),
        ],
        seed in any::<u64>(),
        pipe in prop_oneof![Just(64usize), Just(4096), Just(256 * 1024)],
    ) {
        run(ops, seed, chop, pipe)?;
    }
}
