//! The Rust side of the interop scenarios: each plays the actor the Go peer does not (see
//! `go/scenario.go`, which describes every scenario), with the same content and the same
//! checks.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use gomux::{Error, Session, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use crate::go_peer::GoStdin;
use crate::pattern::Pattern;

const SEED_FROM_OPENER: u64 = 0x1000;
const SEED_FROM_ACCEPTOR: u64 = 0x2000;
const CHUNK: usize = 64 * 1024;

/// Which scenario, as the Go program names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Echo,
    Bulk,
    HalfClose,
    CloseRead,
    StreamClose,
    SessionClose,
    SlowReader,
    Backlog,
    Idle,
    Audit,
    CloseWhileOpening,
    Unanswered,
}

impl Kind {
    pub fn go_name(self) -> &'static str {
        match self {
            Kind::Echo => "echo",
            Kind::Bulk => "bulk",
            Kind::HalfClose => "half-close",
            Kind::CloseRead => "close-read",
            Kind::StreamClose => "stream-close",
            Kind::SessionClose => "session-close",
            Kind::SlowReader => "slow-reader",
            Kind::Backlog => "backlog",
            Kind::Idle => "idle",
            Kind::Audit => "audit",
            Kind::CloseWhileOpening => "close-opening",
            Kind::Unanswered => "unanswered",
        }
    }
}

/// What the Rust actor of one run needs.
pub struct Ctx {
    pub session: Session,
    pub kind: Kind,
    /// This side opens the scenario's streams.
    pub opens: bool,
    /// This side does the scenario's act (the side `-who` names).
    pub actor: bool,
    pub streams: usize,
    pub bytes: u64,
    /// Bytes per write; 0 for random sizes from 1 B to 200 KiB.
    pub chunk: usize,
    pub expect: usize,
    pub go: GoStdin,
}

/// What the Rust actor did: a summary, and the streams to keep open until the session ends.
pub struct Outcome {
    pub summary: String,
    pub keep: Vec<Stream>,
}

type Result<T> = std::result::Result<T, String>;

fn done(summary: String) -> Result<Outcome> {
    Ok(Outcome {
        summary,
        keep: Vec::new(),
    })
}

/// The gomux error inside an I/O error, if any.
fn gomux_error(e: &io::Error) -> Option<&Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Error>())
}

/// Runs the Rust actor of `ctx.kind`.
pub async fn run(ctx: Ctx) -> Result<Outcome> {
    match ctx.kind {
        Kind::Echo => echo(&ctx).await,
        Kind::Bulk => bulk(&ctx).await,
        Kind::HalfClose => half_close(&ctx).await,
        Kind::CloseRead => close_read(&ctx).await,
        Kind::StreamClose => stream_close(&ctx).await,
        Kind::SessionClose => session_close(&ctx).await,
        Kind::SlowReader => slow_reader(&ctx).await,
        Kind::Backlog => backlog(&ctx).await,
        Kind::Idle => idle(&ctx).await,
        Kind::Audit => audit(&ctx).await,
        Kind::CloseWhileOpening => open_while_closed(&ctx).await,
        Kind::Unanswered => unanswered(&ctx).await,
    }
}

impl Ctx {
    /// The seeds of what this side sends and of what it receives.
    fn seeds(&self) -> (u64, u64) {
        if self.opens {
            (SEED_FROM_OPENER, SEED_FROM_ACCEPTOR)
        } else {
            (SEED_FROM_ACCEPTOR, SEED_FROM_OPENER)
        }
    }

    /// The scenario's one stream: opened or accepted.
    async fn stream(&self) -> Result<Stream> {
        if self.opens {
            self.session.open().await.map_err(|e| format!("open: {e}"))
        } else {
            self.session
                .accept()
                .await
                .map_err(|e| format!("accept: {e}"))
        }
    }
}

/// Sizes of successive writes: fixed, or random from 1 B to 200 KiB (xorshift).
struct Sizes {
    fixed: usize,
    state: u64,
}

impl Sizes {
    fn fixed(size: usize) -> Sizes {
        Sizes {
            fixed: size,
            state: 1,
        }
    }

    fn next(&mut self) -> usize {
        if self.fixed > 0 {
            return self.fixed;
        }
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        1 + (self.state % (200 * 1024)) as usize
    }
}

/// Writes `n` bytes of `pattern` in writes of the sizes `sizes` gives.
async fn send(
    writer: &mut (impl AsyncWrite + Unpin),
    pattern: &mut Pattern,
    mut n: u64,
    sizes: &mut Sizes,
) -> io::Result<()> {
    let mut buf = vec![0; 200 * 1024];
    while n > 0 {
        let k = (sizes.next() as u64).min(n) as usize;
        pattern.fill(&mut buf[..k]);
        writer.write_all(&buf[..k]).await?;
        n -= k as u64;
    }
    Ok(())
}

/// Reads to end-of-stream, checking every byte; returns how many came.
async fn receive(reader: &mut (impl AsyncRead + Unpin), pattern: &mut Pattern) -> Result<u64> {
    let mut buf = vec![0; CHUNK];
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|e| format!("read after {} bytes: {e}", pattern.position()))?;
        if n == 0 {
            return Ok(pattern.position());
        }
        pattern.check(&buf[..n])?;
    }
}

async fn receive_exactly(reader: &mut (impl AsyncRead + Unpin), seed: u64, n: u64) -> Result<()> {
    let got = receive(reader, &mut Pattern::new(seed)).await?;
    if got != n {
        return Err(format!("end of stream after {got} bytes, want {n}"));
    }
    Ok(())
}

/// Sends `out` bytes (in writes of the sizes `sizes` gives) and receives `inn` bytes on one
/// stream at once, then half-closes; with `hold_back > 0`, the last `hold_back` bytes go out
/// only after the peer's end of stream.
async fn exchange_with(
    stream: Stream,
    (out_seed, out): (u64, u64),
    (in_seed, inn): (u64, u64),
    hold_back: u64,
    mut sizes: Sizes,
) -> Result<()> {
    let (mut reader, mut writer) = stream.into_split();
    let read_done = Notify::new();
    let read = async {
        let result = receive_exactly(&mut reader, in_seed, inn).await;
        read_done.notify_one();
        result
    };
    let write = async {
        let mut pattern = Pattern::new(out_seed);
        send(&mut writer, &mut pattern, out - hold_back, &mut sizes)
            .await
            .map_err(|e| format!("write: {e}"))?;
        if hold_back > 0 {
            read_done.notified().await;
            send(&mut writer, &mut pattern, hold_back, &mut sizes)
                .await
                .map_err(|e| format!("write after the peer's half-close: {e}"))?;
        }
        writer
            .shutdown()
            .await
            .map_err(|e| format!("shutdown: {e}"))
    };
    let (read, write) = tokio::join!(read, write);
    write.and(read)
}

/// [`exchange_with`] in writes of 64 KiB.
async fn exchange(stream: Stream, out: (u64, u64), inn: (u64, u64), hold_back: u64) -> Result<()> {
    exchange_with(stream, out, inn, hold_back, Sizes::fixed(CHUNK)).await
}

/// Sends `size` bytes of `seed`'s pattern, half-closes, and checks that they come back.
async fn echo_open(session: &Session, seed: u64, size: u64, sizes: Sizes) -> Result<()> {
    let stream = session.open().await.map_err(|e| format!("open: {e}"))?;
    exchange_with(stream, (seed, size), (seed, size), 0, sizes).await
}

/// Copies a stream back to its sender until end-of-stream, then half-closes.
async fn echo_back(stream: Stream) -> Result<u64> {
    let (mut reader, mut writer) = stream.into_split();
    let n = tokio::io::copy(&mut reader, &mut writer)
        .await
        .map_err(|e| format!("echo: {e}"))?;
    writer
        .shutdown()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;
    Ok(n)
}

/// Runs `f(i)` for `0..n` at once; the first error, if any.
async fn parallel<F, Fut>(n: usize, f: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    for i in 0..n {
        tasks.spawn(f(i));
    }
    while let Some(result) = tasks.join_next().await {
        result.map_err(|e| format!("task: {e}"))??;
    }
    Ok(())
}

/// Accepts `n` streams and echoes each.
async fn echo_accepted(session: &Session, n: usize) -> Result<u64> {
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let stream = session.accept().await.map_err(|e| format!("accept: {e}"))?;
        tasks.spawn(echo_back(stream));
    }
    let mut total = 0;
    while let Some(result) = tasks.join_next().await {
        total += result.map_err(|e| format!("task: {e}"))??;
    }
    Ok(total)
}

async fn echo(ctx: &Ctx) -> Result<Outcome> {
    if ctx.opens {
        let session = ctx.session.clone();
        let (bytes, chunk) = (ctx.bytes, ctx.chunk);
        parallel(ctx.streams, move |i| {
            let session = session.clone();
            let sizes = Sizes {
                fixed: chunk,
                state: i as u64 * 2 + 1,
            };
            async move { echo_open(&session, SEED_FROM_OPENER + i as u64, bytes, sizes).await }
        })
        .await?;
        return done(format!(
            "{} streams x {} bytes echoed and checked",
            ctx.streams, ctx.bytes
        ));
    }
    let total = echo_accepted(&ctx.session, ctx.streams).await?;
    done(format!("echoed {} streams, {total} bytes", ctx.streams))
}

async fn bulk(ctx: &Ctx) -> Result<Outcome> {
    let stream = ctx.stream().await?;
    let (out, inn) = ctx.seeds();
    let start = std::time::Instant::now();
    let (sent, received) = if ctx.actor {
        (ctx.bytes, 0)
    } else {
        (0, ctx.bytes)
    };
    exchange(stream, (out, sent), (inn, received), 0).await?;
    let secs = start.elapsed().as_secs_f64();
    let what = if ctx.actor {
        "sent"
    } else {
        "received and checked"
    };
    done(format!(
        "{} bytes {what} in {secs:.2} s ({:.0} MiB/s)",
        ctx.bytes,
        ctx.bytes as f64 / secs / (1 << 20) as f64
    ))
}

async fn half_close(ctx: &Ctx) -> Result<Outcome> {
    let stream = ctx.stream().await?;
    let (out, inn) = ctx.seeds();
    let hold_back = if ctx.actor { 0 } else { ctx.bytes / 2 };
    exchange(stream, (out, ctx.bytes), (inn, ctx.bytes), hold_back).await?;
    done(format!(
        "{} bytes each way, {hold_back} of them sent after the peer's half-close",
        ctx.bytes
    ))
}

async fn close_read(ctx: &Ctx) -> Result<Outcome> {
    const BEFORE: usize = 256 * 1024;
    let mut stream = ctx.stream().await?;
    let (out, inn) = ctx.seeds();
    if ctx.actor {
        let mut buf = vec![0; BEFORE];
        stream
            .read_exact(&mut buf)
            .await
            .map_err(|e| format!("reading the first {BEFORE} bytes: {e}"))?;
        Pattern::new(inn).check(&buf)?;
        stream.close_read();
        let mut after = [0; 1];
        let n = stream.read(&mut after).await.map_err(|e| e.to_string())?;
        if n != 0 {
            return Err("a read after close_read returned data".into());
        }
        send(
            &mut stream,
            &mut Pattern::new(out),
            ctx.bytes,
            &mut Sizes::fixed(CHUNK),
        )
        .await
        .map_err(|e| format!("write after close_read: {e}"))?;
        stream.shutdown().await.map_err(|e| e.to_string())?;
        return Ok(Outcome {
            summary: format!("read {BEFORE} bytes, closed reading, sent {}", ctx.bytes),
            keep: vec![stream],
        });
    }
    let mut pattern = Pattern::new(out);
    let error = send(
        &mut stream,
        &mut pattern,
        u64::MAX,
        &mut Sizes::fixed(CHUNK),
    )
    .await
    .expect_err("an endless send ends only with an error");
    if !matches!(gomux_error(&error), Some(Error::PeerReadClosed)) {
        return Err(format!(
            "writing after the peer stopped reading: want PeerReadClosed, got {error}"
        ));
    }
    if pattern.position() < BEFORE as u64 {
        return Err(format!(
            "the write failed after {} bytes, before the peer read {BEFORE}",
            pattern.position()
        ));
    }
    receive_exactly(&mut stream, inn, ctx.bytes).await?;
    Ok(Outcome {
        summary: format!(
            "write failed ({error}) after {} bytes; then read {} bytes",
            pattern.position(),
            ctx.bytes
        ),
        keep: vec![stream],
    })
}

/// What `continuous` saw on a stream.
struct Flow {
    read: u64,
    written: u64,
    read_end: io::Result<()>,
    write_end: io::Result<()>,
}

/// Writes and reads on `stream` at once until both fail or end. With `close_after`, closes
/// the stream (CloseStream) once that many bytes were read. `progress` gains a permit when the
/// bytes read pass 1 MiB.
async fn continuous(
    stream: Stream,
    (out, inn): (u64, u64),
    close_after: Option<u64>,
    progress: Option<Arc<Semaphore>>,
) -> Result<Flow> {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let (mut send_pattern, mut check) = (Pattern::new(out), Pattern::new(inn));
    let mut wbuf = vec![0; CHUNK];
    let mut woff = CHUNK;
    let mut rbuf = vec![0; CHUNK];
    let mut read_end = None;
    let mut write_end = None;
    let mut told = false;
    while read_end.is_none() || write_end.is_none() {
        if woff == CHUNK {
            send_pattern.fill(&mut wbuf);
            woff = 0;
        }
        tokio::select! {
            result = reader.read(&mut rbuf), if read_end.is_none() => match result {
                Ok(0) => read_end = Some(Ok(())),
                Ok(n) => {
                    check.check(&rbuf[..n])?;
                    if check.position() >= 1 << 20 && !told {
                        told = true;
                        if let Some(progress) = &progress {
                            progress.add_permits(1);
                        }
                    }
                    if close_after.is_some_and(|limit| check.position() >= limit) {
                        break;
                    }
                }
                Err(e) => read_end = Some(Err(e)),
            },
            result = writer.write(&wbuf[woff..]), if write_end.is_none() => match result {
                Ok(n) => woff += n,
                Err(e) => write_end = Some(Err(e)),
            },
        }
    }
    let written = send_pattern.position() - (CHUNK - woff) as u64;
    let read = check.position();
    if close_after.is_some() {
        let mut stream = reader.unsplit(writer);
        stream.close().await.map_err(|e| format!("close: {e}"))?;
        let mut rest = [0; 1];
        let after_read = stream.read(&mut rest).await;
        let after_write = stream.write(&[0]).await;
        return Ok(Flow {
            read,
            written,
            read_end: match after_read {
                Ok(0) => Ok(()),
                Ok(n) => Err(io::Error::other(format!(
                    "a read after close returned {n} bytes"
                ))),
                Err(e) => Err(e),
            },
            write_end: after_write.map(drop),
        });
    }
    Ok(Flow {
        read,
        written,
        read_end: read_end.unwrap_or(Ok(())),
        write_end: write_end.unwrap_or(Ok(())),
    })
}

async fn stream_close(ctx: &Ctx) -> Result<Outcome> {
    let stream = ctx.stream().await?;
    let seeds = ctx.seeds();
    let summary = if ctx.actor {
        let flow = continuous(stream, seeds, Some(1 << 20), None).await?;
        match (&flow.read_end, &flow.write_end) {
            (Ok(()), Err(e)) if matches!(gomux_error(e), Some(Error::WriteClosed)) => {}
            (read, write) => {
                return Err(format!(
                "after close: read {read:?} (want end of stream), write {write:?} (want WriteClosed)"
            ))
            }
        }
        format!("closed the stream after reading {} bytes", flow.read)
    } else {
        let flow = continuous(stream, seeds, None, None).await?;
        match (&flow.read_end, &flow.write_end) {
            (Ok(()), Err(e)) if matches!(gomux_error(e), Some(Error::PeerReadClosed)) => {}
            (read, write) => {
                return Err(format!(
                "after the peer's close: read {read:?} (want end of stream), write {write:?} (want PeerReadClosed)"
            ))
            }
        }
        format!(
            "peer closed the stream: read {} bytes then end of stream, write failed after {} bytes",
            flow.read, flow.written
        )
    };
    // The session still works.
    if ctx.opens {
        echo_open(
            &ctx.session,
            SEED_FROM_OPENER + 1,
            65536,
            Sizes::fixed(CHUNK),
        )
        .await
    } else {
        echo_accepted(&ctx.session, 1).await.map(drop)
    }
    .map_err(|e| format!("a new stream after the close: {e}"))?;
    done(format!("{summary}; a new stream then echoed 65536 bytes"))
}

async fn session_close(ctx: &Ctx) -> Result<Outcome> {
    let (out, inn) = ctx.seeds();
    let progress = Arc::new(Semaphore::new(0));
    let mut flows = JoinSet::new();
    for i in 0..ctx.streams {
        let stream = ctx.stream().await?;
        let seeds = (out + i as u64, inn + i as u64);
        flows.spawn(continuous(stream, seeds, None, Some(Arc::clone(&progress))));
    }
    let mut close = String::from("not called");
    if ctx.actor {
        let all = u32::try_from(ctx.streams).map_err(|e| e.to_string())?;
        let _ = progress.acquire_many(all).await;
        close = format!("{:?}", ctx.session.close().await);
    }
    let reason = ctx.session.closed().await;
    let (mut read, mut written) = (0, 0);
    while let Some(flow) = flows.join_next().await {
        let flow = flow.map_err(|e| format!("task: {e}"))??;
        if flow.read_end.is_ok() || flow.write_end.is_ok() {
            return Err(format!(
                "a stream did not fail with the session: read {:?}, write {:?}",
                flow.read_end, flow.write_end
            ));
        }
        read += flow.read;
        written += flow.written;
    }
    done(format!(
        "close: {close}; session ended with {reason:?}; {} streams ended after {read} bytes read, {written} written",
        ctx.streams
    ))
}

async fn slow_reader(ctx: &Ctx) -> Result<Outcome> {
    const ECHO_BYTES: u64 = 1 << 20;
    let (out, inn) = ctx.seeds();
    let (b_tx, b_rx) = tokio::sync::oneshot::channel::<Result<()>>();
    let mut a = None;
    if ctx.opens {
        let mut stream = ctx.stream().await?;
        stream.write_all(b"A").await.map_err(|e| e.to_string())?;
        a = Some(stream);
        let session = ctx.session.clone();
        tokio::spawn(async move {
            let result = async {
                let mut b = session.open().await.map_err(|e| format!("open: {e}"))?;
                b.write_all(b"B").await.map_err(|e| e.to_string())?;
                let echoed = (SEED_FROM_OPENER + 7, ECHO_BYTES);
                exchange(b, echoed, echoed, 0).await
            }
            .await;
            let _ = b_tx.send(result);
        });
    } else {
        let mut b_tx = Some(b_tx);
        for _ in 0..2 {
            let mut stream = ctx.stream().await?;
            let mut tag = [0];
            stream
                .read_exact(&mut tag)
                .await
                .map_err(|e| format!("reading the tag: {e}"))?;
            if tag == *b"A" {
                a = Some(stream);
            } else if let Some(b_tx) = b_tx.take() {
                tokio::spawn(async move {
                    let _ = b_tx.send(echo_back(stream).await.map(drop));
                });
            }
        }
    }
    let a = a.ok_or("no stream tagged A")?;
    let b_done = async {
        b_rx.await
            .unwrap_or_else(|_| Err("stream B's task ended".into()))
    };
    if !ctx.actor {
        exchange(a, (out, ctx.bytes), (inn, 0), 0).await?;
        b_done.await.map_err(|e| format!("stream B: {e}"))?;
        return done(format!(
            "sent {} bytes to a slow reader; stream B echoed {ECHO_BYTES} bytes meanwhile",
            ctx.bytes
        ));
    }
    b_done
        .await
        .map_err(|e| format!("stream B, while stream A was not read: {e}"))?;
    let (mut reader, mut writer) = a.into_split();
    let mut pattern = Pattern::new(inn);
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|e| format!("slow read after {} bytes: {e}", pattern.position()))?;
        if n == 0 {
            break;
        }
        pattern.check(&buf[..n])?;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if pattern.position() != ctx.bytes {
        return Err(format!(
            "slow reader got {} bytes, want {}",
            pattern.position(),
            ctx.bytes
        ));
    }
    writer.shutdown().await.map_err(|e| e.to_string())?;
    done(format!(
        "stream B echoed {ECHO_BYTES} bytes while A was unread; then read {} bytes slowly",
        ctx.bytes
    ))
}

/// Polls `ready` until it holds, without a deadline of its own (the run's limit bounds it).
async fn wait_until(mut ready: impl FnMut() -> bool) {
    while !ready() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn backlog(ctx: &Ctx) -> Result<Outcome> {
    let refusals = (ctx.streams - ctx.expect) as u64;
    wait_until(|| ctx.session.stats().streams_refused >= refusals).await;
    let total = echo_accepted(&ctx.session, ctx.expect).await?;
    let stats = ctx.session.stats();
    if stats.streams_refused != refusals {
        return Err(format!(
            "{} streams refused, want {refusals}",
            stats.streams_refused
        ));
    }
    done(format!(
        "backlog {}: refused {refusals} of {} streams with CloseStream, accepted and echoed {} ({total} bytes)",
        ctx.expect, ctx.streams, ctx.expect
    ))
}

async fn idle(ctx: &Ctx) -> Result<Outcome> {
    for round in 0..2 {
        if round == 1 {
            let before = ctx.session.stats().keepalives_sent;
            wait_until(|| ctx.session.stats().keepalives_sent >= before + 3).await;
            if !ctx.opens {
                ctx.go.send("continue");
            }
        }
        if ctx.opens {
            echo_open(
                &ctx.session,
                SEED_FROM_OPENER + round,
                1024,
                Sizes::fixed(1024),
            )
            .await?;
        } else {
            echo_accepted(&ctx.session, 1).await?;
        }
    }
    let stats = ctx.session.stats();
    done(format!(
        "echoed before and after 3 keepalives; {} keepalives sent, {} received",
        stats.keepalives_sent, stats.keepalives_received
    ))
}

async fn audit(ctx: &Ctx) -> Result<Outcome> {
    const ECHO_BYTES: u64 = 1 << 20;
    const UNREAD: usize = 512 * 1024;
    let stream = ctx.stream().await?;
    let (out, inn) = ctx.seeds();
    let echoes = async {
        if ctx.opens {
            let session = ctx.session.clone();
            parallel(ctx.streams, move |i| {
                let session = session.clone();
                let seed = SEED_FROM_OPENER + 1 + i as u64;
                async move { echo_open(&session, seed, ECHO_BYTES, Sizes::fixed(CHUNK)).await }
            })
            .await
        } else {
            echo_accepted(&ctx.session, ctx.streams).await.map(drop)
        }
    };
    let bulk = async {
        // The Go sender can get this far ahead of our reading only with the extra credit our
        // larger receive window grants.
        wait_until(|| stream.buffered() >= UNREAD).await;
        exchange(stream, (out, ctx.bytes), (inn, ctx.bytes), 0).await
    };
    let (echoes, bulk) = tokio::join!(echoes, bulk);
    echoes?;
    bulk.map_err(|e| format!("bulk stream: {e}"))?;
    done(format!(
        "{} bytes each way on one stream (the Go sender ran {UNREAD} bytes ahead of our reads) beside {} streams echoing {ECHO_BYTES} bytes",
        ctx.bytes, ctx.streams
    ))
}

/// Opens streams without pause, sending 1 KiB on each, until the peer's close of the session
/// fails an open or a write.
async fn open_while_closed(ctx: &Ctx) -> Result<Outcome> {
    let mut opened = 0u64;
    let mut streams = Vec::new();
    let error = loop {
        let mut stream = match ctx.session.open().await {
            Ok(stream) => stream,
            Err(e) => break e,
        };
        opened += 1;
        let mut pattern = Pattern::new(SEED_FROM_OPENER + opened);
        if let Err(e) = send(&mut stream, &mut pattern, 1024, &mut Sizes::fixed(1024)).await {
            match gomux_error(&e) {
                Some(error) => break error.clone(),
                None => return Err(format!("write: {e}")),
            }
        }
        // Kept open, so that the Go side has them all to fail when its session ends.
        streams.push(stream);
    };
    if !error.is_session_end() {
        return Err(format!(
            "after {opened} opens: {error}, not the session's end"
        ));
    }
    done(format!(
        "opened {opened} streams until the session ended ({error})"
    ))
}

/// Go accepts each stream and closes it unanswered: an ordinary end of stream here, never
/// `Error::Refused` (a Go peer acknowledges nothing, so its close may follow a handled request).
async fn unanswered(ctx: &Ctx) -> Result<Outcome> {
    for i in 0..ctx.streams {
        let mut stream = ctx
            .session
            .open()
            .await
            .map_err(|e| format!("open {i}: {e}"))?;
        // The write may fail once the close has arrived; the read must end cleanly.
        let _ = stream.write_all(b"request\n").await;
        let mut reply = Vec::new();
        stream
            .read_to_end(&mut reply)
            .await
            .map_err(|e| format!("stream {i}: read {e} (want an end of stream)"))?;
        match stream.peer_stopped() {
            Some(gomux::stream::Stopped::Closed) if reply.is_empty() => {}
            other => {
                return Err(format!(
                    "stream {i}: {} bytes, then {other:?} (want nothing, then Closed)",
                    reply.len()
                ))
            }
        }
    }
    // The session still works.
    echo_open(&ctx.session, SEED_FROM_OPENER, 1024, Sizes::fixed(1024)).await?;
    done(format!(
        "{} streams closed unanswered read as an end of stream, none as refused; then a stream echoed",
        ctx.streams
    ))
}
