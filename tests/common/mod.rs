//! Helpers shared by the integration tests: bounded waiting, connected transports, sessions on
//! them, test content and error inspection.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Kind};
use gomux::{Config, Error, Role, Session, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;

/// How long any single step of a test may take before it counts as a hang.
pub const STEP: Duration = Duration::from_secs(20);

/// Awaits `future`, failing the test with `what` if it does not finish within [`STEP`], so a
/// deadlock shows up as a named failure instead of a stuck test run.
pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    within_for(STEP, what, future).await
}

/// As [`within`], with an explicit limit (for tests on paused time, where it is virtual).
pub async fn within_for<F: Future>(limit: Duration, what: &str, future: F) -> F::Output {
    match tokio::time::timeout(limit, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Anything a session can run on.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A boxed transport end.
pub type BoxIo = Box<dyn Io>;

/// The transports every scenario runs on.
#[derive(Debug, Clone, Copy)]
pub enum Transport {
    /// An in-memory pipe with this many bytes of buffer in each direction.
    Duplex(usize),
    /// Real loopback TCP with Nagle disabled.
    Tcp,
}

/// Two connected transport ends: (client side, server side).
pub async fn connect(transport: Transport) -> (BoxIo, BoxIo) {
    match transport {
        Transport::Duplex(size) => {
            let (a, b) = tokio::io::duplex(size);
            (Box::new(a), Box::new(b))
        }
        Transport::Tcp => {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind a loopback listener");
            let addr = listener.local_addr().expect("listener address");
            let (client, accepted) = within("tcp connect", async {
                tokio::join!(TcpStream::connect(addr), listener.accept())
            })
            .await;
            let client = client.expect("connect to the loopback listener");
            let (server, _) = accepted.expect("accept the loopback connection");
            client.set_nodelay(true).expect("nodelay on the client");
            server.set_nodelay(true).expect("nodelay on the server");
            (Box::new(client), Box::new(server))
        }
    }
}

/// A client and a server session connected over `transport`, drivers spawned.
pub async fn sessions_with(
    transport: Transport,
    client_config: Config,
    server_config: Config,
) -> (Session, Session) {
    let (a, b) = connect(transport).await;
    (
        Session::with_config(a, Role::Client, client_config),
        Session::with_config(b, Role::Server, server_config),
    )
}

/// A client and a server with default settings on a roomy (64 KiB) in-memory pipe.
pub async fn duplex_pair() -> (Session, Session) {
    sessions(Transport::Duplex(64 * 1024)).await
}

/// A client and a server session with default settings.
pub async fn sessions(transport: Transport) -> (Session, Session) {
    sessions_with(transport, Config::default(), Config::default()).await
}

/// Deterministic content that differs per seed and per offset, so lost, duplicated, reordered
/// or cross-stream bytes are all caught.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// Compares large buffers without dumping them: reports lengths and the first difference.
#[track_caller]
pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    panic!(
        "{what}: got {} bytes, want {} bytes, first difference at {:?}",
        got.len(),
        want.len(),
        first
    );
}

/// The gomux error an I/O error from a stream carries.
pub fn gomux_error(error: &io::Error) -> Option<&gomux::Error> {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<gomux::Error>())
}

/// Lets every task run until all of them wait (on paused time, nothing else happens meanwhile).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// The gomux error carried by a failed stream operation.
#[track_caller]
pub fn stream_error<T: std::fmt::Debug>(result: io::Result<T>, what: &str) -> Error {
    let error = result.expect_err(what);
    gomux_error(&error)
        .unwrap_or_else(|| panic!("{what}: no gomux error in {error}"))
        .clone()
}

/// Echoes one stream: everything read is written back, then the write side is shut down.
pub async fn echo(stream: Stream) {
    let (mut reader, mut writer) = stream.into_split();
    // A failure here shows up as wrong or missing content on the other side.
    if tokio::io::copy(&mut reader, &mut writer).await.is_ok() {
        let _ = writer.shutdown().await;
    }
}

/// Accepts streams on `session` and echoes each in its own task, until the session ends.
pub fn spawn_echo(session: Session) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(stream) = session.accept().await {
            tokio::spawn(echo(stream));
        }
    })
}

/// Writes `data` and half-closes while reading everything that comes back until end-of-stream.
/// Both directions run at once, so an echoing peer never waits on credit this side holds.
pub async fn round_trip(stream: Stream, data: &[u8]) -> Vec<u8> {
    let (mut reader, mut writer) = stream.into_split();
    let write = async {
        writer.write_all(data).await.expect("write the request");
        writer
            .shutdown()
            .await
            .expect("half-close after the request");
    };
    let read = async {
        let mut got = Vec::with_capacity(data.len());
        reader
            .read_to_end(&mut got)
            .await
            .expect("read the echo to its end");
        got
    };
    let ((), got) = tokio::join!(write, read);
    got
}

// ---------------------------------------------------------------------------------------------
// Fault injection and a raw peer, for the fault suites.

/// Switches shared between a test and the [`Faulty`] transport it handed to a session.
#[derive(Clone, Default)]
pub struct Faults(Arc<Mutex<FaultState>>);

#[derive(Default)]
struct FaultState {
    pause_reads: bool,
    stall_writes: bool,
    break_writes: bool,
    reset: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

impl Faults {
    fn state(&self) -> MutexGuard<'_, FaultState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// While on, the transport accepts no writes (as if the peer stopped reading and every
    /// buffer on the way filled up).
    pub fn stall_writes(&self, on: bool) {
        self.change(|state| {
            state.stall_writes = on;
            [state.write_waker.take(), None]
        });
    }

    /// While on, the transport delivers nothing (as if the network held the peer's bytes back).
    pub fn pause_reads(&self, on: bool) {
        self.change(|state| {
            state.pause_reads = on;
            [state.read_waker.take(), None]
        });
    }

    /// From now on every write fails with `BrokenPipe`, while reads go on (as when the peer
    /// shut its reading down but still sends).
    pub fn break_writes(&self) {
        self.change(|state| {
            state.break_writes = true;
            [state.write_waker.take(), None]
        });
    }

    /// From now on every read and write fails with `ConnectionReset`, including those waiting.
    pub fn reset(&self) {
        self.change(|state| {
            state.reset = true;
            [state.read_waker.take(), state.write_waker.take()]
        });
    }

    /// Applies `change` and wakes the I/O it returns, after unlocking: a waiting read or write
    /// must see the new switches.
    fn change(&self, change: impl FnOnce(&mut FaultState) -> [Option<Waker>; 2]) {
        let wakers = change(&mut self.state());
        wakers.into_iter().flatten().for_each(Waker::wake);
    }
}

/// A transport end whose faults a test switches on through [`Faults`].
pub struct Faulty<T> {
    inner: T,
    faults: Faults,
}

impl<T> Faulty<T> {
    pub fn new(inner: T) -> (Faulty<T>, Faults) {
        let faults = Faults::default();
        (
            Faulty {
                inner,
                faults: faults.clone(),
            },
            faults,
        )
    }
}

fn reset_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "injected reset")
}

impl<T: AsyncRead + Unpin> AsyncRead for Faulty<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        {
            let mut state = self.faults.state();
            if state.reset {
                return Poll::Ready(Err(reset_error()));
            }
            if state.pause_reads {
                state.read_waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if polled.is_pending() {
            let mut state = self.faults.state();
            if state.reset {
                return Poll::Ready(Err(reset_error()));
            }
            // Kept so that `reset` can wake a read that waits on the inner transport.
            state.read_waker = Some(cx.waker().clone());
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> Faulty<T> {
    /// Ready with an error or pending when a fault applies to writing, `None` otherwise.
    fn write_fault<R>(&self, cx: &mut Context<'_>) -> Option<Poll<io::Result<R>>> {
        let mut state = self.faults.state();
        if state.reset {
            return Some(Poll::Ready(Err(reset_error())));
        }
        if state.break_writes {
            return Some(Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())));
        }
        if state.stall_writes {
            state.write_waker = Some(cx.waker().clone());
            return Some(Poll::Pending);
        }
        None
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Faulty<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(fault) = self.write_fault(cx) {
            return fault;
        }
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(fault) = self.write_fault(cx) {
            return fault;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(fault) = self.write_fault(cx) {
            return fault;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The far end of a session's connection, speaking frames directly (and raw bytes where a test
/// needs what the encoder refuses).
pub struct RawPeer {
    pub framed: Framed<DuplexStream, FrameCodec>,
}

/// A session of `role` on a [`Faulty`] transport, its driver spawned, and the [`RawPeer`] on
/// the other end. The pipe is roomy, so the raw peer's writes never wait for the session.
pub fn raw_session(
    role: Role,
    config: Config,
) -> (
    Session,
    tokio::task::JoinHandle<Result<(), Error>>,
    Faults,
    RawPeer,
) {
    let (io, peer) = tokio::io::duplex(1 << 20);
    let (io, faults) = Faulty::new(io);
    let (session, connection) = Session::new(io, role, config);
    let driver = tokio::spawn(connection);
    let framed = Framed::new(peer, FrameCodec::new());
    (session, driver, faults, RawPeer { framed })
}

impl RawPeer {
    pub async fn send(&mut self, frame: Frame) {
        within("raw peer send", self.framed.send(frame))
            .await
            .expect("the raw peer sends a frame");
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        within("raw peer write", self.framed.get_mut().write_all(bytes))
            .await
            .expect("the raw peer writes bytes");
    }

    /// The next frame from the session, or `None` at end-of-file.
    pub async fn recv(&mut self) -> Option<Frame> {
        within("raw peer receive", self.framed.next())
            .await
            .map(|frame| frame.expect("the session sends well-formed frames"))
    }

    /// Receives frames until one of `kind` on `id`, skipping others.
    pub async fn recv_until(&mut self, id: u32, kind: Kind) -> Frame {
        loop {
            match self.recv().await {
                Some(frame) if frame.header.id == id && frame.header.kind == kind => return frame,
                Some(_) => {}
                None => panic!("end-of-file before {kind:?} on {id}"),
            }
        }
    }
}
