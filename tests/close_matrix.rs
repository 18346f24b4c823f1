//! The close matrix: every way to end a stream or a session, by this side, by the peer or by
//! both at once, idle or busy, over several transports, each case checked against the results
//! the docs promise, within a bound well under the close timeout.
//!
//! The cases are generated from four enums (`cargo test --test close_matrix -- --nocapture`
//! prints how many ran, and every failing case by name):
//!
//! - **how it ends** ([`Way`]): `Stream::close`, `shutdown`, dropping the `Stream`, dropping
//!   its `OwnedWriteHalf`, dropping its `OwnedReadHalf`, `Session::close`,
//!   `Session::graceful_close` (twice: the application drops each stream once it is done, as
//!   the docs describe; or it keeps the handles of finished streams until the close returned),
//!   dropping every `Session` handle, and dropping the driver (the `Connection` that
//!   `Session::new` returns);
//! - **who ends it** ([`Who`]): the client ("this side"), the server ("the peer"), or both in
//!   the same step;
//! - **load** ([`Load`]): idle (nothing queued), busy one way (the client has queued 1 MiB
//!   towards the server), busy both ways (each side has queued 1 MiB), with receive windows of
//!   4 MiB so that the whole megabyte is queued at once, far beyond what the transport holds;
//! - **transport** ([`Transport`]): `tokio::io::duplex` of 64 KiB and of 1 KiB, a 64 KiB duplex
//!   whose writes stall for 100 ms (at the first write, after every further 256 KiB, and at the
//!   first write after the case's end begins), and loopback TCP.
//!
//! Every case sets up one stream, opened by the client and accepted by the server, on which
//! each side has sent and read a 16-byte greeting, then queues its load (`write_all`, then
//! `flush`, both of which return once the bytes are queued), then ends the way the case says.
//! A side that does not end it plays a well-behaved application: it reads the stream to its
//! end, and having read end-of-stream shuts its own writing down.
//!
//! Each case must reach the documented results within [`BOUND`] (2 s) of virtual time on
//! tokio's paused clock, with `close_timeout` at 10 s, so that a close that waits for the
//! timeout fails instead of passing slowly; over TCP, on real time, within [`TCP_BOUND`]
//! (20 s). The set-up, the end and the clean-up (handles dropped, `wait_idle` on the sessions
//! still up, sessions closed, drivers' results) are each bounded so. The checks:
//!
//! - **no byte is lost** that a side queued and flushed (`flush`, `shutdown` and `close`
//!   returned `Ok` for it) while the receiving end keeps reading: the receiver reads exactly the
//!   bytes written (content, a seeded pattern, not only lengths). Where the receiver stopped
//!   reading (it closed the stream, dropped it or its read half, closed its session) or a
//!   driver was dropped, what it read must still be a prefix of what was written;
//! - every operation ends as the docs say (`src/lib.rs` "Closing: half-close, close, drop",
//!   `src/stream.rs` "Closing", the `Session` and `Connection` docs): end-of-stream after a
//!   half-close or a stream close; `Error::ClosedByPeer` for the peer of `Session::close` and
//!   `Error::ClosedLocally` for its own streams (their buffered data readable first); the
//!   peer's writes failing with `Error::PeerReadClosed` after a stream close or a dropped read
//!   half, and `Stream::stopped` telling which; `close`, `graceful_close` and the drivers
//!   ending with `Ok`;
//! - **dropping the driver** throws queued bytes away by design: its row checks that every
//!   handle of that side fails at once (each call completes on its first poll): `open`,
//!   `accept`, `write`, `Stream::close` fail with `Error::ClosedLocally`, reads hand out what
//!   is buffered and then fail with it, `closed()` reports it; and that the peer's session ends
//!   with a non-graceful error within the bound;
//! - after the handles are dropped, the stream tables of the sessions still up are empty
//!   (`wait_idle` returns), and every driver ends with the expected result.
//!
//! # Choices where the docs are silent or say two things
//!
//! - The greeting makes sure each side sent something before the end: a stream closed by a
//!   peer that never sent anything counts as refused (`Stopped::Refused`), which is not what
//!   these cases are about.
//! - A side that closes its session (`Session::close`), or both sides closing at once, stop
//!   reading: the docs keep *buffered* data readable but say that a closing session reads and
//!   discards what arrives. So only a prefix is required towards a side that closed its session,
//!   and both closing at once must both return `Ok` within the bound, with nothing required of
//!   the data in flight.
//! - `graceful_close` waits, in its docs, until every stream is "gone (closed or dropped by
//!   this side, its data written)", while `wait_idle` and `stream_count` count "streams with
//!   live state". A stream that has nothing left to do (this side shut its writing down and its
//!   bytes went out, and it read the peer's end-of-stream) is taken here as done, whether or not
//!   the application still holds its handle: the row `graceful close, handles kept` requires
//!   `graceful_close` and `wait_idle` to return within the bound while the handles of finished
//!   streams live on. The row `graceful close` drops each stream once finished, as the docs'
//!   example does.
//! - `Session::close` after the driver was dropped: the docs say the session "ended with an
//!   error" returns it, but `Error::ClosedLocally` is also the graceful end. Only that it
//!   returns at once is checked. `flush` then fails if the stream's bytes were not all written;
//!   whether they were depends on how far the driver got, so only that it returns at once is
//!   checked.
//! - Dropping the read half: the write half "can still write", so the ender writes 4 KiB more
//!   after dropping it and closes the write half with `OwnedWriteHalf::close`; all of it must
//!   arrive. When both sides drop their read halves at once, each one's CloseWrite makes the
//!   other's writes fail (`PeerReadClosed`) from the moment it arrives: the write and the close
//!   may succeed or fail so, and `stopped()` must say `ReadClosed`.
//! - The docs of `Connection` say that once it is dropped "every stream operation then fails
//!   with `Error::ClosedLocally`", and `Stream::close` promises to wait until its CloseStream is
//!   written: after the driver was dropped, `Stream::close` must fail, even when the stream's
//!   data had all been written before.
//! - The peer of a dropped driver sees the transport end (end of file, or a reset over TCP):
//!   any non-graceful session end (`ConnectionClosed`, `UnexpectedEof`, `Transport`) is
//!   accepted.

mod common;

use std::fmt;
use std::future::Future;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use gomux::stream::{OwnedReadHalf, OwnedWriteHalf, Stopped};
use gomux::{Config, Connection, Error, Role, Session, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

use common::{connect, pattern, BoxIo};

/// Each phase of a case on the paused clock: well under [`CLOSE_TIMEOUT`].
const BOUND: Duration = Duration::from_secs(2);
/// Each phase of a case over TCP, on real time: long enough for a loaded machine, short enough
/// that a hang is a failure.
const TCP_BOUND: Duration = Duration::from_secs(20);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// The deadline given to `graceful_close`: above [`BOUND`], so that a graceful close that
/// waits for it fails the bound instead of returning `GracefulCloseTimedOut` in time.
const GRACE: Duration = Duration::from_secs(5);
/// Data each busy side queues.
const LOAD: usize = 1024 * 1024;
/// Receive window of every stream: the whole load fits in the credit.
const WINDOW: u32 = 4 * 1024 * 1024;
/// Written after dropping the read half.
const TAIL: usize = 4096;
const GREETING: usize = 16;
/// The stalling transport: how long a stall lasts, and how many bytes go between two.
const STALL: Duration = Duration::from_millis(100);
const STALL_EVERY: u64 = 256 * 1024;
/// Threads that run TCP cases at once (they mostly wait).
const TCP_THREADS: usize = 6;

// ---------------------------------------------------------------------------------------------
// The dimensions.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    StreamClose,
    Shutdown,
    DropStream,
    DropWriteHalf,
    DropReadHalf,
    SessionClose,
    GracefulClose,
    GracefulCloseHandlesKept,
    DropSessions,
    DropDriver,
}

const WAYS: [Way; 10] = [
    Way::StreamClose,
    Way::Shutdown,
    Way::DropStream,
    Way::DropWriteHalf,
    Way::DropReadHalf,
    Way::SessionClose,
    Way::GracefulClose,
    Way::GracefulCloseHandlesKept,
    Way::DropSessions,
    Way::DropDriver,
];

impl fmt::Display for Way {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Way::StreamClose => "Stream::close",
            Way::Shutdown => "shutdown",
            Way::DropStream => "drop of the stream",
            Way::DropWriteHalf => "drop of the write half",
            Way::DropReadHalf => "drop of the read half",
            Way::SessionClose => "Session::close",
            Way::GracefulClose => "graceful close",
            Way::GracefulCloseHandlesKept => "graceful close, handles kept",
            Way::DropSessions => "drop of every Session handle",
            Way::DropDriver => "drop of the driver",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// The client.
    Local,
    /// The server.
    Peer,
    Both,
}

const WHOS: [Who; 3] = [Who::Local, Who::Peer, Who::Both];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    Idle,
    /// The client has queued [`LOAD`] bytes towards the server.
    OneWay,
    /// Each side has queued [`LOAD`] bytes.
    BothWays,
}

const LOADS: [Load; 3] = [Load::Idle, Load::OneWay, Load::BothWays];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Duplex64K,
    Duplex1K,
    /// A 64 KiB duplex whose writes stall now and then (see [`Stalling`]).
    Stalling,
    Tcp,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Duplex64K => "duplex 64 KiB",
            Transport::Duplex1K => "duplex 1 KiB",
            Transport::Stalling => "duplex 64 KiB with stalling writes",
            Transport::Tcp => "loopback TCP",
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    way: Way,
    who: Who,
    load: Load,
    transport: Transport,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match self.who {
            Who::Local => "this side (client)",
            Who::Peer => "the peer (server)",
            Who::Both => "both at once",
        };
        let load = match self.load {
            Load::Idle => "idle",
            Load::OneWay => "busy client to server",
            Load::BothWays => "busy both ways",
        };
        write!(
            f,
            "[{} by {who}, {load}, over {}]",
            self.way, self.transport
        )
    }
}

/// Side 0 is the client, side 1 the server.
const NAMES: [&str; 2] = ["client", "server"];

impl Case {
    fn all(transport: Transport) -> Vec<Case> {
        let mut cases = Vec::new();
        for way in WAYS {
            for who in WHOS {
                for load in LOADS {
                    cases.push(Case {
                        way,
                        who,
                        load,
                        transport,
                    });
                }
            }
        }
        cases
    }

    /// Whether `side` ends the stream or session the case's way.
    fn ends(&self, side: usize) -> bool {
        match self.who {
            Who::Local => side == 0,
            Who::Peer => side == 1,
            Who::Both => true,
        }
    }

    /// Whether `side` keeps reading the stream to its end.
    fn reads(&self, side: usize) -> bool {
        !self.ends(side)
            || matches!(
                self.way,
                Way::Shutdown
                    | Way::DropWriteHalf
                    | Way::GracefulClose
                    | Way::GracefulCloseHandlesKept
                    | Way::DropSessions
            )
    }

    /// Whether everything written towards `side` must arrive there.
    fn must_deliver(&self, side: usize) -> bool {
        self.way != Way::DropDriver && self.reads(side)
    }

    fn load(&self, side: usize) -> usize {
        match (self.load, side) {
            (Load::Idle, _) | (Load::OneWay, 1) => 0,
            _ => LOAD,
        }
    }

    fn bound(&self) -> Duration {
        match self.transport {
            Transport::Tcp => TCP_BOUND,
            _ => BOUND,
        }
    }

    fn seed(&self, side: usize) -> u64 {
        let index = WAYS.iter().position(|w| *w == self.way).unwrap_or(0);
        (index as u64) << 8 | (self.load as u64) << 4 | (self.who as u64) << 2 | side as u64
    }
}

// ---------------------------------------------------------------------------------------------
// A transport whose writes stall now and then.

/// Wraps a transport: its writes wait [`STALL`] at the first write, after every further
/// [`STALL_EVERY`] bytes, and at the first write after its switch is armed.
struct Stalling {
    inner: BoxIo,
    written: u64,
    next_stall: u64,
    armed: Arc<AtomicBool>,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Stalling {
    fn new(inner: BoxIo) -> (Stalling, Arc<AtomicBool>) {
        let armed = Arc::new(AtomicBool::new(false));
        let stalling = Stalling {
            inner,
            written: 0,
            next_stall: 0,
            armed: Arc::clone(&armed),
            sleep: None,
        };
        (stalling, armed)
    }

    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.sleep.is_none() {
            let due = self.written >= self.next_stall;
            if due {
                self.next_stall = self.written + STALL_EVERY;
            }
            if self.armed.swap(false, Ordering::Relaxed) || due {
                self.sleep = Some(Box::pin(tokio::time::sleep(STALL)));
            }
        }
        if let Some(sleep) = self.sleep.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
        }
        Poll::Ready(())
    }
}

impl AsyncRead for Stalling {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stalling {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_stall(cx));
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, data))?;
        self.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_stall(cx));
        let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, bufs))?;
        self.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// A driver the test can drop.

/// The driver task: it polls the `Connection` until it resolves or until it is told to drop
/// it. `None` means it was dropped.
struct Driver {
    cancel: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Option<Result<(), Error>>>>,
    result: Option<Option<Result<(), Error>>>,
}

impl Driver {
    fn spawn(connection: Connection<BoxIo>) -> Driver {
        let (cancel, cancelled) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = cancelled => None,
                result = connection => Some(result),
            }
        });
        Driver {
            cancel: Some(cancel),
            task: Some(task),
            result: None,
        }
    }

    /// Drops the `Connection` (unless it had finished) and waits until it is gone.
    async fn drop_connection(&mut self) -> Result<(), String> {
        if let Some(cancel) = self.cancel.take() {
            let _ = cancel.send(());
        }
        self.join().await.map(drop)
    }

    /// How the driver ended.
    async fn join(&mut self) -> Result<&Option<Result<(), Error>>, String> {
        if let Some(task) = self.task.take() {
            let result = task
                .await
                .map_err(|e| format!("the driver task panicked: {e}"))?;
            self.result = Some(result);
        }
        self.result
            .as_ref()
            .ok_or_else(|| "the driver task was lost".to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// One side of a case.

struct Side {
    name: &'static str,
    session: Option<Session>,
    driver: Driver,
    stream: Option<Stream>,
    read_half: Option<OwnedReadHalf>,
    write_half: Option<OwnedWriteHalf>,
    /// Everything this side wrote after the greeting, in order.
    sent: Vec<u8>,
    /// The stall switch of this side's transport, when it stalls.
    stall: Option<Arc<AtomicBool>>,
}

impl Side {
    fn session(&self) -> Result<&Session, String> {
        self.session
            .as_ref()
            .ok_or_else(|| format!("{}: no session handle", self.name))
    }

    fn take_stream(&mut self) -> Result<Stream, String> {
        self.stream
            .take()
            .ok_or_else(|| format!("{}: no stream handle", self.name))
    }
}

type Check = Result<(), String>;

/// Awaits `future` until `deadline`, failing with `what` if it is not done by then.
async fn step<F: Future>(
    deadline: Instant,
    what: impl Into<String>,
    future: F,
) -> Result<F::Output, String> {
    let what = what.into();
    tokio::time::timeout_at(deadline, future)
        .await
        .map_err(|_| format!("{what} did not finish within the bound"))
}

/// Polls `future` once: it must be done at once.
fn at_once<F: Future>(what: &str, future: F) -> Result<F::Output, String> {
    future
        .now_or_never()
        .ok_or_else(|| format!("{what} did not complete at once"))
}

/// Reads until end-of-stream (`Ok`) or an error, appending what it reads to `got`.
async fn read_all<R: AsyncRead + Unpin>(reader: &mut R, got: &mut Vec<u8>) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        got.extend_from_slice(&buf[..n]);
    }
}

fn describe_io(error: &io::Error) -> String {
    match Error::from_io(error) {
        Some(gomux) => format!("{gomux:?}"),
        None => format!("{error:?}"),
    }
}

fn expect_ok<T, E: fmt::Debug>(what: &str, result: Result<T, E>) -> Result<T, String> {
    result.map_err(|e| format!("{what} failed: {e:?}"))
}

fn expect_io_ok<T>(what: &str, result: io::Result<T>) -> Result<T, String> {
    result.map_err(|e| format!("{what} failed: {}", describe_io(&e)))
}

fn expect_eof(what: &str, result: io::Result<()>, got: &[u8]) -> Check {
    result.map_err(|e| {
        format!(
            "{what} ended with {} after {} bytes, not with end-of-stream",
            describe_io(&e),
            got.len()
        )
    })
}

/// The io error must carry a gomux error that `want` accepts.
fn expect_io_err<T: fmt::Debug>(
    what: &str,
    result: io::Result<T>,
    want: fn(&Error) -> bool,
    expected: &str,
) -> Check {
    match result {
        Ok(value) => Err(format!("{what} succeeded ({value:?}); expected {expected}")),
        Err(error) => match Error::from_io(&error) {
            Some(gomux) if want(gomux) => Ok(()),
            _ => Err(format!(
                "{what} failed with {}; expected {expected}",
                describe_io(&error)
            )),
        },
    }
}

fn expect_err<T: fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    want: fn(&Error) -> bool,
    expected: &str,
) -> Check {
    match result {
        Ok(value) => Err(format!("{what} succeeded ({value:?}); expected {expected}")),
        Err(error) if want(&error) => Ok(()),
        Err(error) => Err(format!("{what} failed with {error:?}; expected {expected}")),
    }
}

fn closed_locally(e: &Error) -> bool {
    matches!(e, Error::ClosedLocally)
}

fn closed_by_peer(e: &Error) -> bool {
    matches!(e, Error::ClosedByPeer)
}

fn peer_read_closed(e: &Error) -> bool {
    matches!(e, Error::PeerReadClosed)
}

fn broken(e: &Error) -> bool {
    e.is_session_end() && !e.is_graceful()
}

// ---------------------------------------------------------------------------------------------
// A case.

fn config() -> Config {
    Config::default()
        .close_timeout(CLOSE_TIMEOUT)
        .receive_window(WINDOW)
        .max_receive_window(WINDOW)
}

/// Two sessions, one stream with the greeting exchanged, the load queued and flushed.
async fn set_up(case: &Case) -> Result<[Side; 2], String> {
    let (client_io, server_io): (BoxIo, BoxIo) = match case.transport {
        Transport::Duplex64K => connect(common::Transport::Duplex(64 * 1024)).await,
        Transport::Duplex1K => connect(common::Transport::Duplex(1024)).await,
        Transport::Tcp => connect(common::Transport::Tcp).await,
        Transport::Stalling => connect(common::Transport::Duplex(64 * 1024)).await,
    };
    let mut stalls = [None, None];
    let ios = if case.transport == Transport::Stalling {
        let (a, stall_a) = Stalling::new(client_io);
        let (b, stall_b) = Stalling::new(server_io);
        stalls = [Some(stall_a), Some(stall_b)];
        [Box::new(a) as BoxIo, Box::new(b) as BoxIo]
    } else {
        [client_io, server_io]
    };
    let mut sides = Vec::with_capacity(2);
    for ((io, role), (stall, name)) in ios
        .into_iter()
        .zip([Role::Client, Role::Server])
        .zip(stalls.into_iter().zip(NAMES))
    {
        let (session, connection) = Session::new(io, role, config());
        sides.push(Side {
            name,
            session: Some(session),
            driver: Driver::spawn(connection),
            stream: None,
            read_half: None,
            write_half: None,
            sent: Vec::new(),
            stall,
        });
    }
    let [mut client, mut server]: [Side; 2] = sides
        .try_into()
        .map_err(|_| "two sides expected".to_string())?;

    let deadline = Instant::now() + case.bound();
    let greet = async {
        let mut opened = expect_ok("open", client.session()?.open().await)?;
        opened
            .write_all(&pattern(10, GREETING))
            .await
            .map_err(|e| format!("client greeting: {e}"))?;
        let mut accepted = expect_ok("accept", server.session()?.accept().await)?;
        let mut greeting = [0u8; GREETING];
        expect_io_ok(
            "server reads the greeting",
            accepted.read_exact(&mut greeting).await,
        )?;
        if greeting[..] != pattern(10, GREETING)[..] {
            return Err("the client's greeting arrived garbled".to_string());
        }
        expect_io_ok(
            "server greeting",
            accepted.write_all(&pattern(11, GREETING)).await,
        )?;
        expect_io_ok(
            "client reads the greeting",
            opened.read_exact(&mut greeting).await,
        )?;
        if greeting[..] != pattern(11, GREETING)[..] {
            return Err("the server's greeting arrived garbled".to_string());
        }
        Ok::<_, String>((opened, accepted))
    };
    let (opened, accepted) = step(deadline, "set-up: greeting", greet).await??;
    client.stream = Some(opened);
    server.stream = Some(accepted);

    // The load: queued by both at once, as a busy application would.
    client.sent = pattern(case.seed(0), case.load(0));
    server.sent = pattern(case.seed(1), case.load(1));
    let (client_stream, server_stream) = match (client.stream.as_mut(), server.stream.as_mut()) {
        (Some(c), Some(s)) => (c, s),
        _ => return Err("set-up lost a stream".to_string()),
    };
    let (c, s) = step(deadline, "set-up: queueing the load", async {
        tokio::join!(
            queue_load(client_stream, &client.sent, "client"),
            queue_load(server_stream, &server.sent, "server")
        )
    })
    .await?;
    c?;
    s?;
    Ok([client, server])
}

/// Queues `data` and flushes: both return once the bytes are queued.
async fn queue_load(stream: &mut Stream, data: &[u8], name: &str) -> Check {
    let wrote = stream.write_all(data).await;
    expect_io_ok(&format!("{name}: write_all of the load"), wrote)?;
    expect_io_ok(&format!("{name}: flush"), stream.flush().await)
}

/// What the side that ends the case does.
async fn end(case: &Case, side: &mut Side, deadline: Instant) -> Result<Vec<u8>, String> {
    let name = side.name;
    let what = |step: &str| format!("{name}: {step}");
    let mut got = Vec::new();
    match case.way {
        Way::StreamClose => {
            let mut stream = side.take_stream()?;
            let closed = step(deadline, what("Stream::close"), stream.close()).await?;
            expect_ok(&what("Stream::close"), closed)?;
            let mut buf = [0u8; 16];
            let read = at_once(&what("read after Stream::close"), stream.read(&mut buf))?;
            if !matches!(read, Ok(0)) {
                return Err(format!(
                    "{}: gave {read:?}, not end-of-stream",
                    what("read after Stream::close")
                ));
            }
            side.stream = Some(stream);
        }
        Way::Shutdown => {
            let stream = side.stream.as_mut().ok_or("no stream")?;
            let shut = step(deadline, what("shutdown"), stream.shutdown()).await?;
            expect_io_ok(&what("shutdown"), shut)?;
            let read = step(
                deadline,
                what("reading to the end"),
                read_all(stream, &mut got),
            );
            expect_eof(&what("reading"), read.await?, &got)?;
        }
        Way::DropStream => drop(side.take_stream()?),
        Way::DropWriteHalf => {
            let (mut read_half, write_half) = side.take_stream()?.into_split();
            drop(write_half);
            let read = step(
                deadline,
                what("reading to the end"),
                read_all(&mut read_half, &mut got),
            );
            expect_eof(&what("reading"), read.await?, &got)?;
            side.read_half = Some(read_half);
        }
        Way::DropReadHalf => {
            let (read_half, mut write_half) = side.take_stream()?.into_split();
            drop(read_half);
            let tail = pattern(case.seed(side_index(name)) + 1000, TAIL);
            let wrote = step(
                deadline,
                what("writing after dropping the read half"),
                write_half.write_all(&tail),
            )
            .await?;
            let closed = step(deadline, what("OwnedWriteHalf::close"), write_half.close()).await?;
            if case.who == Who::Both {
                // The peer dropped its read half too: writes fail once its CloseWrite is in,
                // and nobody reads what went before.
                let stopped = step(deadline, what("stopped()"), write_half.stopped()).await?;
                if !matches!(stopped, Ok(Stopped::ReadClosed)) {
                    return Err(format!(
                        "{}: {stopped:?}, not ReadClosed",
                        what("stopped()")
                    ));
                }
                if let Err(error) = wrote {
                    expect_io_err::<()>(
                        &what("writing after both dropped their read halves"),
                        Err(error),
                        peer_read_closed,
                        "success or PeerReadClosed",
                    )?;
                }
                if let Err(error) = closed {
                    expect_err::<()>(
                        &what("OwnedWriteHalf::close after both dropped their read halves"),
                        Err(error),
                        peer_read_closed,
                        "success or PeerReadClosed",
                    )?;
                }
            } else {
                expect_io_ok(&what("writing after dropping the read half"), wrote)?;
                side.sent.extend_from_slice(&tail);
                expect_ok(&what("OwnedWriteHalf::close"), closed)?;
            }
            side.write_half = Some(write_half);
        }
        Way::SessionClose => {
            let session = side.session()?;
            let closed = step(deadline, what("Session::close"), session.close()).await?;
            expect_ok(&what("Session::close"), closed)?;
            let reason = step(deadline, what("closed()"), session.closed()).await?;
            if !closed_locally(&reason) {
                return Err(format!(
                    "{}: {reason:?}, not ClosedLocally",
                    what("closed()")
                ));
            }
            let stream = side.stream.as_mut().ok_or("no stream")?;
            let read = step(deadline, what("reading"), read_all(stream, &mut got)).await?;
            expect_io_err(
                &what("reading after Session::close"),
                read,
                closed_locally,
                "ClosedLocally after the buffered data",
            )?;
        }
        Way::GracefulClose | Way::GracefulCloseHandlesKept => {
            let kept = case.way == Way::GracefulCloseHandlesKept;
            let session = side.session.as_ref().ok_or("no session")?;
            let mut stream = side.stream.take().ok_or("no stream")?;
            let got = &mut got;
            let app = async move {
                let shut = stream.shutdown().await;
                let read = read_all(&mut stream, got).await;
                (shut, read, kept.then_some(stream))
            };
            let idle = async {
                if kept {
                    session.wait_idle().await;
                }
            };
            let (closed, app, idle) = tokio::join!(
                step(
                    deadline,
                    what("graceful_close"),
                    session.graceful_close(GRACE)
                ),
                step(deadline, what("shutdown and reading to the end"), app),
                step(deadline, what("wait_idle"), idle),
            );
            let (shut, read, stream) = app?;
            side.stream = stream;
            expect_io_ok(&what("shutdown"), shut)?;
            expect_eof(&what("reading"), read, &[])?;
            expect_ok(&what("graceful_close"), closed?)?;
            idle?;
        }
        Way::DropSessions => {
            side.session = None;
            let mut stream = side.take_stream()?;
            let shut = step(deadline, what("shutdown"), stream.shutdown()).await?;
            expect_io_ok(&what("shutdown"), shut)?;
            let read = step(
                deadline,
                what("reading to the end"),
                read_all(&mut stream, &mut got),
            );
            expect_eof(&what("reading"), read.await?, &got)?;
        }
        Way::DropDriver => {
            step(
                deadline,
                what("dropping the driver"),
                side.driver.drop_connection(),
            )
            .await??;
            let session = side.session.as_ref().ok_or("no session")?;
            let mut stream = side.stream.take().ok_or("no stream")?;
            let reason = at_once(&what("closed()"), session.closed())?;
            if !closed_locally(&reason) {
                return Err(format!(
                    "{}: {reason:?}, not ClosedLocally",
                    what("closed()")
                ));
            }
            expect_err(
                &what("open"),
                at_once(&what("open"), session.open())?,
                |error| {
                    matches!(error, Error::SessionUnavailable(reason) if closed_locally(reason))
                        && error.is_retry_safe()
                },
                "SessionUnavailable(ClosedLocally), safe to retry",
            )?;
            expect_err(
                &what("accept"),
                at_once(&what("accept"), session.accept())?,
                closed_locally,
                "ClosedLocally",
            )?;
            expect_io_err(
                &what("write"),
                at_once(&what("write"), stream.write(b"late"))?,
                closed_locally,
                "ClosedLocally",
            )?;
            // Whether it fails depends on whether the driver had written the stream's bytes.
            let _ = at_once(&what("flush"), stream.flush())?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match at_once(&what("read"), stream.read(&mut buf))? {
                    Ok(0) => return Err(format!("{}: end-of-stream", what("read"))),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => {
                        expect_io_err::<()>(
                            &what("read past the buffered data"),
                            Err(e),
                            closed_locally,
                            "ClosedLocally",
                        )?;
                        break;
                    }
                }
            }
            expect_err(
                &what("Stream::close"),
                at_once(&what("Stream::close"), stream.close())?,
                closed_locally,
                "ClosedLocally",
            )?;
            let _ = at_once(&what("Session::close"), session.close())?;
            at_once(&what("wait_idle"), session.wait_idle())?;
            side.stream = Some(stream);
        }
    }
    Ok(got)
}

fn side_index(name: &str) -> usize {
    NAMES.iter().position(|n| *n == name).unwrap_or(0)
}

/// What the side that does not end the case does: it reads to the end, and answers
/// end-of-stream with its own shutdown.
async fn respond(case: &Case, side: &mut Side, deadline: Instant) -> Result<Vec<u8>, String> {
    let name = side.name;
    let what = |step: &str| format!("{name}: {step}");
    let mut got = Vec::new();
    let stream = side.stream.as_mut().ok_or("no stream")?;
    match case.way {
        Way::StreamClose | Way::DropStream => {
            let read = step(
                deadline,
                what("reading to the end"),
                read_all(stream, &mut got),
            );
            expect_eof(&what("reading"), read.await?, &got)?;
            let stopped = stream.peer_stopped();
            if stopped != Some(Stopped::Closed) {
                return Err(format!("{}: {stopped:?}, not Closed", what("peer_stopped")));
            }
            let wrote = step(deadline, what("write"), stream.write(b"late")).await?;
            expect_io_err(
                &what("write after the peer closed"),
                wrote,
                peer_read_closed,
                "PeerReadClosed",
            )?;
        }
        Way::Shutdown
        | Way::DropWriteHalf
        | Way::GracefulClose
        | Way::GracefulCloseHandlesKept
        | Way::DropSessions => {
            let read = step(
                deadline,
                what("reading to the end"),
                read_all(stream, &mut got),
            );
            expect_eof(&what("reading"), read.await?, &got)?;
            let shut = step(deadline, what("shutdown"), stream.shutdown()).await?;
            expect_io_ok(&what("shutdown"), shut)?;
            if case.way != Way::Shutdown && case.way != Way::DropWriteHalf {
                let session = side.session.as_ref().ok_or("no session")?;
                let reason = step(deadline, what("closed()"), session.closed()).await?;
                if !closed_by_peer(&reason) {
                    return Err(format!(
                        "{}: {reason:?}, not ClosedByPeer",
                        what("closed()")
                    ));
                }
            }
        }
        Way::DropReadHalf => {
            let stopped = step(deadline, what("stopped()"), stream.stopped()).await?;
            if !matches!(stopped, Ok(Stopped::ReadClosed)) {
                return Err(format!(
                    "{}: {stopped:?}, not ReadClosed",
                    what("stopped()")
                ));
            }
            let wrote = step(deadline, what("write"), stream.write(b"late")).await?;
            expect_io_err(
                &what("write after the peer dropped its read half"),
                wrote,
                peer_read_closed,
                "PeerReadClosed",
            )?;
            let read = step(
                deadline,
                what("reading to the end"),
                read_all(stream, &mut got),
            );
            expect_eof(&what("reading"), read.await?, &got)?;
        }
        Way::SessionClose => {
            let read = step(
                deadline,
                what("reading to the end"),
                read_all(stream, &mut got),
            );
            expect_io_err(
                &what("reading"),
                read.await?,
                closed_by_peer,
                "ClosedByPeer after all the data",
            )?;
            let wrote = step(deadline, what("write"), stream.write(b"late")).await?;
            expect_io_err(
                &what("write after the peer's Session::close"),
                wrote,
                closed_by_peer,
                "ClosedByPeer",
            )?;
            let session = side.session.as_ref().ok_or("no session")?;
            let reason = step(deadline, what("closed()"), session.closed()).await?;
            if !closed_by_peer(&reason) {
                return Err(format!(
                    "{}: {reason:?}, not ClosedByPeer",
                    what("closed()")
                ));
            }
        }
        Way::DropDriver => {
            let session = side.session.as_ref().ok_or("no session")?;
            let reason = step(deadline, what("closed()"), session.closed()).await?;
            if !broken(&reason) {
                return Err(format!(
                    "{}: {reason:?}, not a non-graceful end",
                    what("closed()")
                ));
            }
            let read = step(deadline, what("reading"), read_all(stream, &mut got));
            expect_io_err(
                &what("reading"),
                read.await?,
                broken,
                "the session's error after the buffered data",
            )?;
            let wrote = step(deadline, what("write"), stream.write(b"late")).await?;
            expect_io_err(&what("write"), wrote, broken, "the session's error")?;
        }
    }
    Ok(got)
}

async fn play(
    case: &Case,
    index: usize,
    side: &mut Side,
    deadline: Instant,
) -> Result<Vec<u8>, String> {
    if case.ends(index) {
        end(case, side, deadline).await
    } else {
        respond(case, side, deadline).await
    }
}

/// Drops every handle, waits for the stream tables of the sessions still up to empty, closes
/// them, and checks how each driver ended.
async fn clean_up(case: &Case, sides: &mut [Side; 2], deadline: Instant) -> Check {
    for side in sides.iter_mut() {
        side.stream = None;
        side.read_half = None;
        side.write_half = None;
    }
    for side in sides.iter() {
        if let Some(session) = side.session.as_ref().filter(|s| !s.is_closed()) {
            let what = format!("{}: wait_idle after every handle was dropped", side.name);
            step(deadline, &what, session.wait_idle()).await?;
            let left = session.stream_count();
            if left != 0 && !session.is_closed() {
                return Err(format!("{what}: {left} streams left"));
            }
        }
    }
    for side in sides.iter() {
        if let Some(session) = side.session.as_ref() {
            let what = format!("{}: Session::close at the end", side.name);
            let closed = step(deadline, &what, session.close()).await?;
            if case.way != Way::DropDriver {
                expect_ok(&what, closed)?;
            }
        }
    }
    for (index, side) in sides.iter_mut().enumerate() {
        let what = format!("{}: the driver", side.name);
        let ended = step(deadline, &what, side.driver.join()).await??;
        match (case.way == Way::DropDriver && case.ends(index), ended) {
            (true, None) => {}
            (true, Some(result)) => {
                return Err(format!(
                    "{what} ran to its end ({result:?}) instead of being dropped"
                ))
            }
            (false, None) => return Err(format!("{what} was dropped")),
            (false, Some(result)) if case.way == Way::DropDriver => {
                expect_err(&what, result.clone(), broken, "a non-graceful end")?;
            }
            (false, Some(result)) => expect_ok(&what, result.clone())?,
        }
    }
    Ok(())
}

async fn run_case(case: Case) -> Check {
    let mut sides = set_up(&case).await?;
    let deadline = Instant::now() + case.bound();
    for side in &sides {
        if let Some(stall) = &side.stall {
            stall.store(true, Ordering::Relaxed);
        }
    }
    let [client, server] = &mut sides;
    let (client_got, server_got) = tokio::join!(
        play(&case, 0, client, deadline),
        play(&case, 1, server, deadline)
    );
    let got = [client_got?, server_got?];
    for (to, got) in got.iter().enumerate() {
        let from = 1 - to;
        let sent = &sides[from].sent;
        let first_difference = got.iter().zip(sent).position(|(a, b)| a != b);
        let direction = format!("{} to {}", NAMES[from], NAMES[to]);
        if first_difference.is_some() || got.len() > sent.len() {
            return Err(format!(
                "{direction}: read {} bytes that are not a prefix of the {} written (first \
                 difference at {first_difference:?})",
                got.len(),
                sent.len()
            ));
        }
        if case.must_deliver(to) && got.len() != sent.len() {
            return Err(format!(
                "{direction}: {} of {} bytes flushed arrived; the rest was lost",
                got.len(),
                sent.len()
            ));
        }
    }
    let deadline = Instant::now() + case.bound();
    clean_up(&case, &mut sides, deadline)
        .await
        .map_err(|e| format!("clean-up: {e}"))
}

fn run_one(case: Case) -> Check {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    if case.transport != Transport::Tcp {
        builder.start_paused(true);
    }
    let runtime = builder.build().map_err(|e| e.to_string())?;
    match catch_unwind(AssertUnwindSafe(|| runtime.block_on(run_case(case)))) {
        Ok(result) => result,
        Err(panic) => Err(match panic.downcast_ref::<String>() {
            Some(text) => format!("panicked: {text}"),
            None => match panic.downcast_ref::<&str>() {
                Some(text) => format!("panicked: {text}"),
                None => "panicked".to_string(),
            },
        }),
    }
}

/// Runs every case over `transport` on `threads` threads and fails with the list of the
/// cases that failed, each named.
fn run_matrix(transport: Transport, threads: usize) {
    let cases = Case::all(transport);
    let started = std::time::Instant::now();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(&case) = cases.get(index) else {
                    break;
                };
                if let Err(error) = run_one(case) {
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((index, format!("{case}: {error}")));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort();
    println!(
        "close matrix over {transport}: {} cases, {} failed, in {:.1?}",
        cases.len(),
        failures.len(),
        started.elapsed()
    );
    let list: Vec<String> = failures.into_iter().map(|(_, text)| text).collect();
    assert!(
        list.is_empty(),
        "{} of {} cases over {transport} failed:\n{}",
        list.len(),
        cases.len(),
        list.join("\n")
    );
}

#[test]
fn close_matrix_over_a_64_kib_duplex() {
    run_matrix(Transport::Duplex64K, 1);
}

#[test]
fn close_matrix_over_a_1_kib_duplex() {
    run_matrix(Transport::Duplex1K, 1);
}

#[test]
fn close_matrix_over_a_duplex_whose_writes_stall() {
    run_matrix(Transport::Stalling, 1);
}

#[test]
fn close_matrix_over_loopback_tcp() {
    run_matrix(Transport::Tcp, TCP_THREADS);
}
