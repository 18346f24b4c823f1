//! Helpers shared by the integration tests: bounded waiting, connected transports, sessions on
//! them, test content and error inspection.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::time::Duration;

use gomux::{Config, Role, Session, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
