//! Transports, multiplexer adapters and workloads shared by the benches and the `speed` example.
//!
//! Every workload is written once, generic over [`Connector`] (anything that yields connected
//! pairs of byte streams), so gomux, yamux, raw TCP and in-memory pipes run exactly the same
//! code and their numbers can be set side by side: a difference between two rows is the
//! transport's, not the harness's.
//!
//! Every TCP socket has Nagle's algorithm disabled, as a multiplexer's users would set it, so
//! small writes are not held back by delayed ACKs in any row.

// The benches and the example each use their own subset.
#![allow(dead_code)]

use std::fmt;
use std::future::{poll_fn, Future};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use gomux::{Config, Role, Session};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

/// Size of the workloads' writes unless told otherwise, and of every read buffer: one maximal
/// gomux Data frame.
pub const CHUNK: usize = 64 * 1024;

/// Size of raw TCP's reads in every workload, and of its writes where it stands for the
/// transport's limit: large pieces cost the fewest system calls, so one connection moves as much
/// as it can (as `iperf3 -l 1M` does). A multiplexer cannot beat the connection it runs on read
/// this way; read in 64 KiB pieces it could, and the baseline would flatter it.
pub const BULK: usize = 1 << 20;

/// Buffer of each direction of a `tokio::io::duplex` pipe. 1 MiB is of the order of what Linux
/// gives a busy loopback TCP socket, so the in-memory rows differ from the TCP rows by the cost
/// of the kernel and not by a narrower pipe: through a 64 KiB pipe every batch of up to 256 KiB
/// that a session writes would be cut into pieces, each costing a task switch.
pub const DUPLEX_CAPACITY: usize = 1 << 20;

/// Streams a yamux connection may hold in these measurements. Its default of 512 tears the
/// connection down in the larger runs.
pub const YAMUX_MAX_STREAMS: usize = 16 * 1024;

/// Anything a workload can run on.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// How a workload moves bulk data on a stream. By default with `write_all` and `read_buf`,
/// copying into and out of the application's buffers, as most code does; [`ZeroCopy`]
/// overrides both with gomux's chunk API.
pub trait Piecewise: Io {
    /// The capacity of the reader's buffer: how much one read may take.
    const READ_SIZE: usize = CHUNK;

    /// Writes all of `piece`.
    fn send_piece(&mut self, piece: Bytes) -> impl Future<Output = io::Result<()>> + Send {
        async move { self.write_all(&piece).await }
    }

    /// Receives the next bytes and shows them to `seen`; `false` at end of stream. `buf` is the
    /// reader's own buffer, for the implementations that read into one.
    fn receive_piece<F: FnOnce(&[u8]) + Send>(
        &mut self,
        buf: &mut BytesMut,
        seen: F,
    ) -> impl Future<Output = io::Result<bool>> + Send {
        async move {
            buf.clear();
            if self.read_buf(buf).await? == 0 {
                return Ok(false);
            }
            seen(buf);
            Ok(true)
        }
    }
}

impl Piecewise for TcpStream {
    const READ_SIZE: usize = BULK;
}
impl Piecewise for DuplexStream {}
impl Piecewise for gomux::Stream {}
impl Piecewise for Compat<yamux::Stream> {}

/// A gomux stream driven through its zero-copy API: `write_chunk` queues the payload's own
/// bytes, and `read_chunk` hands out the session's receive buffers, so neither end copies.
pub struct ZeroCopy(pub gomux::Stream);

impl Piecewise for ZeroCopy {
    async fn send_piece(&mut self, piece: Bytes) -> io::Result<()> {
        Ok(self.0.write_chunk(piece).await?)
    }

    async fn receive_piece<F: FnOnce(&[u8]) + Send>(
        &mut self,
        _: &mut BytesMut,
        seen: F,
    ) -> io::Result<bool> {
        match self.0.read_chunk(usize::MAX).await? {
            Some(chunk) => {
                seen(&chunk);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

impl AsyncRead for ZeroCopy {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ZeroCopy {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// gomux sessions whose streams use the zero-copy API, see [`ZeroCopy`].
pub struct ZeroCopyPair(pub Pair<Session>);

impl Connector for ZeroCopyPair {
    type Io = ZeroCopy;

    async fn open(&self) -> io::Result<ZeroCopy> {
        Ok(ZeroCopy(self.0.client.open().await?))
    }

    async fn accept(&self) -> io::Result<ZeroCopy> {
        Ok(ZeroCopy(self.0.server.accept().await?))
    }
}

/// A source of connected byte streams: [`open`](Connector::open) gives one end, and the other
/// end comes out of [`accept`](Connector::accept), on whichever side of a connection each
/// belongs to.
pub trait Connector: Send + Sync + 'static {
    /// One end of a stream.
    type Io: Piecewise;

    /// Starts a new stream from this side.
    fn open(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;

    /// Waits for the far end of the next stream opened.
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// The tokio runtime of the benches: two workers whatever the machine, so results do not move
/// with its core count (the machines these benches were tuned on have two).
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The runtime of the transport's limit: raw TCP with both ends on one thread. On the
/// development machine (two cores) that moved 7,974–8,243 MiB/s, against 4,175–5,525 on
/// [`runtime`]'s two workers (`speed --mode tcp --no-verify --bytes 4G`, seven runs each way
/// on 2026-11-22, the two-worker ones from before the mode ran here): likely because the
/// copies into the kernel and out of it stay in one core's cache.
pub fn limit_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs `future` on the runtime's workers (not on the calling thread, which would make a third
/// thread compete for two cores) and waits for its output.
pub fn run_on<F>(rt: &Runtime, future: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    rt.block_on(rt.spawn(future))
        .expect("the measured task panicked")
}

/// Runs `work` `iters` times in a row on the runtime's workers and returns the time all of them
/// took. What `work` captures (connections, listeners) is set up before and not counted.
pub fn time_runs<W, F>(rt: &Runtime, iters: u64, work: W) -> Duration
where
    W: Fn() -> F + Send + 'static,
    F: Future<Output = io::Result<()>> + Send,
{
    run_on(rt, async move {
        let start = Instant::now();
        for _ in 0..iters {
            work().await.expect("workload failed");
        }
        start.elapsed()
    })
}

/// Whether criterion runs this bench binary as a quick test (`cargo test --benches`, or
/// `cargo bench -- --test`) rather than measuring, decided from the arguments as criterion does.
/// The benches then move less data, so the check stays quick even in a debug build.
pub fn test_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|arg| arg == name);
    flag("--test") || !flag("--bench")
}

// ---------------------------------------------------------------------------------------------
// Transports

/// Loopback TCP: every stream is its own connection.
pub struct Tcp {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Tcp {
    /// Listens on an ephemeral loopback port.
    pub async fn bind() -> io::Result<Tcp> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        Ok(Tcp { listener, addr })
    }
}

fn without_nagle(socket: TcpStream) -> io::Result<TcpStream> {
    socket.set_nodelay(true)?;
    Ok(socket)
}

impl Connector for Tcp {
    type Io = TcpStream;

    async fn open(&self) -> io::Result<TcpStream> {
        without_nagle(TcpStream::connect(self.addr).await?)
    }

    async fn accept(&self) -> io::Result<TcpStream> {
        let (socket, _) = self.listener.accept().await?;
        without_nagle(socket)
    }
}

/// One loopback TCP connection: (connecting end, accepted end).
pub async fn tcp_pair() -> io::Result<(TcpStream, TcpStream)> {
    let tcp = Tcp::bind().await?;
    tokio::try_join!(tcp.open(), tcp.accept())
}

/// In-memory pipes (`tokio::io::duplex`, [`DUPLEX_CAPACITY`] each way): every stream is its own
/// pipe.
pub struct Memory {
    far_ends: mpsc::UnboundedSender<DuplexStream>,
    arrivals: Mutex<mpsc::UnboundedReceiver<DuplexStream>>,
}

impl Default for Memory {
    fn default() -> Memory {
        let (far_ends, arrivals) = mpsc::unbounded_channel();
        Memory {
            far_ends,
            arrivals: Mutex::new(arrivals),
        }
    }
}

impl Connector for Memory {
    type Io = DuplexStream;

    async fn open(&self) -> io::Result<DuplexStream> {
        let (near, far) = tokio::io::duplex(DUPLEX_CAPACITY);
        self.far_ends.send(far).map_err(|_| ended())?;
        Ok(near)
    }

    async fn accept(&self) -> io::Result<DuplexStream> {
        next_from(&self.arrivals).await
    }
}

fn ended() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the connection has ended")
}

async fn next_from<T>(queue: &Mutex<mpsc::UnboundedReceiver<T>>) -> io::Result<T> {
    queue.lock().await.recv().await.ok_or_else(ended)
}

// ---------------------------------------------------------------------------------------------
// Multiplexers

/// The two sessions of one multiplexed connection: streams are opened on the client and accepted
/// on the server.
pub struct Pair<M> {
    /// The end that opens.
    pub client: M,
    /// The end that accepts.
    pub server: M,
}

impl<M: Connector> Connector for Pair<M> {
    type Io = M::Io;

    fn open(&self) -> impl Future<Output = io::Result<M::Io>> + Send {
        self.client.open()
    }

    fn accept(&self) -> impl Future<Output = io::Result<M::Io>> + Send {
        self.server.accept()
    }
}

impl Connector for Session {
    type Io = gomux::Stream;

    async fn open(&self) -> io::Result<gomux::Stream> {
        Ok(Session::open(self).await?)
    }

    async fn accept(&self) -> io::Result<gomux::Stream> {
        Ok(Session::accept(self).await?)
    }
}

/// gomux sessions on both ends of `client`/`server`, with the same `config`. Must be called on a
/// tokio runtime: the drivers are spawned on it. Dropping the pair closes both sessions.
pub fn gomux_over<T: Io>(client: T, server: T, config: Config) -> Pair<Session> {
    Pair {
        client: Session::with_config(client, Role::Client, config.clone()),
        server: Session::with_config(server, Role::Server, config),
    }
}

/// gomux over one loopback TCP connection.
pub async fn gomux_tcp(config: Config) -> io::Result<Pair<Session>> {
    let (client, server) = tcp_pair().await?;
    Ok(gomux_over(client, server, config))
}

/// gomux over one in-memory pipe of [`DUPLEX_CAPACITY`] each way.
pub fn gomux_duplex(config: Config) -> Pair<Session> {
    let (client, server) = tokio::io::duplex(DUPLEX_CAPACITY);
    gomux_over(client, server, config)
}

/// Where a yamux driver sends the outcome of one open.
type OpenReply = oneshot::Sender<io::Result<yamux::Stream>>;

/// One end of a yamux connection, with the same open/accept shape as a gomux session.
///
/// A `yamux::Connection` only moves when one task keeps polling it, so a driver task owns it:
/// it polls for inbound streams (which also moves all data) and serves open requests sent to it
/// over a channel. Dropping the handle closes the connection.
pub struct Yamux {
    opens: mpsc::UnboundedSender<OpenReply>,
    arrivals: Mutex<mpsc::UnboundedReceiver<yamux::Stream>>,
}

impl Yamux {
    /// Starts a yamux connection on `io` and spawns its driver on the current tokio runtime.
    pub fn new<T: Io>(io: T, config: yamux::Config, mode: yamux::Mode) -> Yamux {
        let connection = yamux::Connection::new(io.compat(), config, mode);
        let (opens, requests) = mpsc::unbounded_channel();
        let (arrived, arrivals) = mpsc::unbounded_channel();
        tokio::spawn(drive_yamux(connection, requests, arrived));
        Yamux {
            opens,
            arrivals: Mutex::new(arrivals),
        }
    }
}

/// yamux's defaults with the stream limit raised to [`YAMUX_MAX_STREAMS`] and no limit on the
/// connection's total receive window (yamux requires at least 256 KiB per allowed stream).
pub fn yamux_config() -> yamux::Config {
    let mut config = yamux::Config::default();
    config
        .set_max_connection_receive_window(None)
        .set_max_num_streams(YAMUX_MAX_STREAMS);
    config
}

/// yamux over one loopback TCP connection, with [`yamux_config`] on both ends.
pub async fn yamux_tcp() -> io::Result<Pair<Yamux>> {
    let (client, server) = tcp_pair().await?;
    Ok(Pair {
        client: Yamux::new(client, yamux_config(), yamux::Mode::Client),
        server: Yamux::new(server, yamux_config(), yamux::Mode::Server),
    })
}

/// The task that owns a yamux connection; ends when the connection does.
async fn drive_yamux<T>(
    mut connection: yamux::Connection<T>,
    mut requests: mpsc::UnboundedReceiver<OpenReply>,
    arrived: mpsc::UnboundedSender<yamux::Stream>,
) where
    T: futures::AsyncRead + futures::AsyncWrite + Unpin,
{
    let mut waiting: Option<OpenReply> = None;
    let mut closing = false;
    poll_fn(|cx| {
        // Opens are served one at a time: yamux holds an open back while 256 earlier ones are
        // unacknowledged, and wakes this task when it may go on.
        while !closing {
            if waiting.is_none() {
                match requests.poll_recv(cx) {
                    Poll::Ready(Some(reply)) => waiting = Some(reply),
                    Poll::Ready(None) => closing = true,
                    Poll::Pending => break,
                }
                continue;
            }
            let Poll::Ready(opened) = connection.poll_new_outbound(cx) else {
                break;
            };
            if let Some(reply) = waiting.take() {
                // The opener may have given up; the stream is then dropped, which resets it.
                let _ = reply.send(opened.map_err(io::Error::other));
            }
        }
        if closing {
            return connection.poll_close(cx).map(drop);
        }
        loop {
            match connection.poll_next_inbound(cx) {
                Poll::Ready(Some(Ok(stream))) => {
                    // Nobody accepting any more: the stream is dropped, which resets it.
                    let _ = arrived.send(stream);
                }
                Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}

impl Connector for Yamux {
    type Io = Compat<yamux::Stream>;

    async fn open(&self) -> io::Result<Compat<yamux::Stream>> {
        let (reply, opened) = oneshot::channel();
        self.opens.send(reply).map_err(|_| ended())?;
        let stream = opened.await.map_err(|_| ended())??;
        Ok(stream.compat())
    }

    async fn accept(&self) -> io::Result<Compat<yamux::Stream>> {
        Ok(next_from(&self.arrivals).await?.compat())
    }
}

// ---------------------------------------------------------------------------------------------
// Content

/// A summary of the bytes that went through a stream, computed by the sender over what it wrote
/// and by the receiver over what it read; the two must agree.
pub trait Digest: Default + Send + 'static {
    /// The summary.
    type Output: Ord + fmt::Debug + Send + 'static;

    /// Takes in the next bytes of the stream.
    fn update(&mut self, bytes: &[u8]);

    /// The summary of everything taken in.
    fn finish(self) -> Self::Output;
}

/// The cheapest [`Digest`]: the byte count, for measurements where content is not checked.
#[derive(Default)]
pub struct Count(u64);

impl Digest for Count {
    type Output = u64;

    fn update(&mut self, bytes: &[u8]) {
        self.0 += bytes.len() as u64;
    }

    fn finish(self) -> u64 {
        self.0
    }
}

/// Period of generated content: one pseudo-random block of this size is made once and cut into
/// every write, so making content costs nothing during a measurement.
const PERIOD: usize = 1 << 20;

/// Offset between the generated content of consecutive streams, so no two streams carry the
/// same bytes and bytes delivered to the wrong stream are caught. Odd, so streams are not even
/// word-aligned with each other.
const STREAM_SKEW: u64 = 40_961;

/// What a transfer sends: `total` bytes split evenly over the streams, cut into writes of at most
/// `chunk` bytes.
pub struct Payload {
    bytes: Bytes,
    total: u64,
    chunk: usize,
    cyclic: bool,
}

impl Payload {
    /// `total` bytes of deterministic pseudo-random content, different on every stream.
    pub fn generated(total: u64, chunk: usize) -> Payload {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let bytes: Vec<u8> = (0..(PERIOD + chunk).div_ceil(8))
            .flat_map(|_| {
                // xorshift64*
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes()
            })
            .collect();
        Payload {
            bytes: bytes.into(),
            total,
            chunk,
            cyclic: true,
        }
    }

    /// The given bytes, as they are.
    pub fn from_bytes(bytes: Vec<u8>, chunk: usize) -> Payload {
        Payload {
            total: bytes.len() as u64,
            bytes: bytes.into(),
            chunk,
            cyclic: false,
        }
    }

    /// The same content cut into writes of `chunk` bytes.
    pub fn rechunked(&self, chunk: usize) -> Payload {
        if self.cyclic {
            // The generated block must be `chunk` longer than its period; making it again costs a
            // millisecond.
            Payload::generated(self.total, chunk)
        } else {
            Payload {
                bytes: self.bytes.clone(),
                chunk,
                ..*self
            }
        }
    }

    /// Bytes sent over all streams together.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Where the content of `stream` (of `streams`) starts, and its length.
    fn span(&self, stream: usize, streams: usize) -> (u64, u64) {
        let share = |k: usize| (u128::from(self.total) * k as u128 / streams as u128) as u64;
        let (start, end) = (share(stream), share(stream + 1));
        let origin = if self.cyclic {
            (start + stream as u64 * STREAM_SKEW) % PERIOD as u64
        } else {
            start
        };
        (origin, end - start)
    }

    /// The next write of a stream whose content starts at `origin` and is `len` long, `sent`
    /// bytes into it.
    fn piece(&self, origin: u64, len: u64, sent: u64) -> Bytes {
        let mut at = origin + sent;
        if self.cyclic {
            at %= PERIOD as u64;
        }
        let at = at as usize;
        let n = (len - sent).min(self.chunk as u64) as usize;
        self.bytes.slice(at..at + n)
    }

    /// The digest of what each of `streams` streams carries, in stream order, computed without
    /// sending anything: what [`transfer`]'s senders compute, for checking a peer that sends the
    /// same content (the speed tool's `go` mode).
    pub fn stream_digests<D: Digest>(&self, streams: usize) -> Vec<D::Output> {
        (0..streams)
            .map(|stream| {
                let (origin, len) = self.span(stream, streams);
                let mut digest = D::default();
                let mut sent = 0;
                while sent < len {
                    let piece = self.piece(origin, len, sent);
                    digest.update(&piece);
                    sent += piece.len() as u64;
                }
                digest.finish()
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// Waits for every task of `set`; the first error wins, a panic is passed on.
async fn join_all<T: 'static>(mut set: JoinSet<io::Result<T>>) -> io::Result<Vec<T>> {
    let mut outputs = Vec::with_capacity(set.len());
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(output) => outputs.push(output?),
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
    Ok(outputs)
}

/// Sends `payload` over `streams` streams of `connector`, all at once: each stream writes its
/// share in writes of the payload's chunk size and half-closes, while the peer reads it into a
/// buffer of [`Piecewise::READ_SIZE`] bytes, counts it into `progress` and drops it. Fails if the digests of what
/// was sent and what was received differ.
///
/// Streams are opened one after the other and each starts writing as soon as it is open; the
/// time to open them is part of the transfer.
pub async fn transfer<C: Connector, D: Digest>(
    connector: Arc<C>,
    payload: Arc<Payload>,
    streams: usize,
    progress: Arc<AtomicU64>,
) -> io::Result<()> {
    let send_all = async {
        let mut writers = JoinSet::new();
        for stream in 0..streams {
            let io = connector.open().await?;
            writers.spawn(send::<_, D>(io, Arc::clone(&payload), stream, streams));
        }
        join_all(writers).await
    };
    let receive_all = async {
        let mut readers = JoinSet::new();
        for _ in 0..streams {
            let io = connector.accept().await?;
            readers.spawn(receive::<_, D>(io, Arc::clone(&progress)));
        }
        join_all(readers).await
    };
    let (mut sent, mut received) = tokio::try_join!(send_all, receive_all)?;
    // Streams may be accepted in another order than they were opened.
    sent.sort_unstable();
    received.sort_unstable();
    if sent == received {
        return Ok(());
    }
    let unmatched = |these: &[D::Output], those: &[D::Output]| {
        let lost: Vec<_> = these
            .iter()
            .filter(|digest| those.binary_search(digest).is_err())
            .collect();
        (lost.len(), lost.first().map(|digest| format!("{digest:?}")))
    };
    let (count, sent_first) = unmatched(&sent, &received);
    let (_, received_first) = unmatched(&received, &sent);
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{count} of {streams} streams arrived different from what was sent \
             (for example: sent {}, received {})",
            sent_first.unwrap_or_default(),
            received_first.unwrap_or_default(),
        ),
    ))
}

async fn send<I: Piecewise, D: Digest>(
    mut io: I,
    payload: Arc<Payload>,
    stream: usize,
    streams: usize,
) -> io::Result<D::Output> {
    let (origin, len) = payload.span(stream, streams);
    let mut digest = D::default();
    let mut sent = 0;
    while sent < len {
        let piece = payload.piece(origin, len, sent);
        digest.update(&piece);
        sent += piece.len() as u64;
        io.send_piece(piece).await?;
    }
    io.shutdown().await?;
    Ok(digest.finish())
}

async fn receive<I: Piecewise, D: Digest>(
    mut io: I,
    progress: Arc<AtomicU64>,
) -> io::Result<D::Output> {
    // Uninitialised capacity: a thousand readers do not zero 64 MiB before their first byte.
    let mut buf = BytesMut::with_capacity(I::READ_SIZE);
    let mut digest = D::default();
    let seen = |bytes: &[u8], digest: &mut D| {
        digest.update(bytes);
        progress.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    };
    while io
        .receive_piece(&mut buf, |bytes| seen(bytes, &mut digest))
        .await?
    {}
    Ok(digest.finish())
}

/// Echoes one stream: writes back whatever it reads, then half-closes after the peer has.
pub async fn echo<I: Io>(mut io: I) -> io::Result<()> {
    // On the heap: an array here would make every echo task's future 4 KiB, to be zeroed and
    // moved into its task on each spawn, which with thousands of streams costs more than the
    // echo itself (it was 14 % of the 8192-stream echo's profile).
    let mut buf = vec![0; 4096];
    loop {
        let n = io.read(&mut buf).await?;
        if n == 0 {
            return io.shutdown().await;
        }
        io.write_all(&buf[..n]).await?;
        io.flush().await?;
    }
}

/// Accepts streams on `connector` and echoes each in its own task, until accepting fails or the
/// returned task is aborted.
pub fn serve_echo<C: Connector>(connector: Arc<C>) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(io) = connector.accept().await {
            tokio::spawn(echo(io));
        }
    })
}

/// `count` round trips of a `size`-byte message on one stream to an echoing peer. Returns the
/// stream for the next batch and the time the round trips took.
pub async fn round_trips<I: Io>(mut io: I, size: usize, count: u64) -> io::Result<(I, Duration)> {
    let message = vec![0x5a; size];
    let mut back = vec![0; size];
    let start = Instant::now();
    for _ in 0..count {
        io.write_all(&message).await?;
        io.flush().await?;
        io.read_exact(&mut back).await?;
    }
    Ok((io, start.elapsed()))
}

/// Opens a stream, sends `message` to an echoing peer and half-closes, reads the echo to its
/// end and checks it. Dropping the stream afterwards closes it on both sides.
pub async fn open_and_echo<C: Connector>(connector: &C, message: &[u8]) -> io::Result<()> {
    let mut io = connector.open().await?;
    io.write_all(message).await?;
    io.shutdown().await?;
    let mut back = Vec::with_capacity(message.len());
    io.read_to_end(&mut back).await?;
    if back == message {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("sent {} bytes, {} came back", message.len(), back.len()),
        ))
    }
}

/// [`open_and_echo`] on `streams` streams at once, each in its own task; a single stream runs in
/// the calling task, so that measuring one costs no spawn.
pub async fn echo_streams<C: Connector>(
    connector: Arc<C>,
    streams: usize,
    message: Arc<[u8]>,
) -> io::Result<()> {
    if streams == 1 {
        return open_and_echo(&*connector, &message).await;
    }
    let mut set = JoinSet::new();
    for _ in 0..streams {
        let (connector, message) = (Arc::clone(&connector), Arc::clone(&message));
        set.spawn(async move { open_and_echo(&*connector, &message).await });
    }
    join_all(set).await.map(drop)
}
