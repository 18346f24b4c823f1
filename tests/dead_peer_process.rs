//! A peer process stopped with SIGSTOP is noticed as dead: the one real-process check of the
//! liveness that `tests/close_paths.rs` measures on tokio's paused clock.
//!
//! The test runs its own binary again as the peer (the ignored test `peer_process` below, told
//! where to connect through an environment variable), stops that process, and waits for the
//! session to end with `KeepaliveTimeout`. The peer announces a keepalive interval of 500 ms, so
//! its death is due within 1 s; the limit of 20 s turns a hang into a failure on a loaded
//! machine without making the test slow.

use std::process::{Command, Stdio};
use std::time::Duration;

use gomux::{Config, Error, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PEER_ADDRESS: &str = "GOMUX_DEAD_PEER_ADDRESS";

/// Stops (or continues) a process by its id with the `kill` command.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test]
async fn a_peer_process_stopped_with_sigstop_is_noticed_as_dead() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "peer_process", "--ignored", "--nocapture"])
        .env(PEER_ADDRESS, address.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the peer process");
    let (io, _) = tokio::time::timeout(Duration::from_secs(60), listener.accept())
        .await
        .expect("the peer process connects within a minute")
        .expect("accept");
    io.set_nodelay(true).expect("nodelay");
    let session = Session::server(io);
    let mut stream = session.accept().await.expect("the peer's stream");
    let mut hello = [0; 5];
    stream.read_exact(&mut hello).await.expect("hello");
    stream.write_all(b"hello").await.expect("echo");

    signal(child.id(), "-STOP");
    let started = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(20), session.closed()).await;
    let waited = started.elapsed();
    signal(child.id(), "-CONT");
    let _ = child.kill();
    let _ = child.wait();
    let error = ended.expect("the stopped peer is noticed within 20 s");
    assert!(matches!(error, Error::KeepaliveTimeout), "{error:?}");
    eprintln!("the stopped peer was noticed after {waited:?}");
}

/// The peer: connects, opens a stream, says hello, and idles. Run by the test above.
#[tokio::test]
#[ignore = "the peer process of a_peer_process_stopped_with_sigstop_is_noticed_as_dead"]
async fn peer_process() {
    let address = std::env::var(PEER_ADDRESS).expect("started by the test above");
    let io = TcpStream::connect(address).await.expect("connect");
    io.set_nodelay(true).expect("nodelay");
    let config = Config::default().keepalive_interval(Some(Duration::from_millis(500)));
    let session = Session::with_config(io, Role::Client, config);
    let mut stream = session.open().await.expect("open");
    stream.write_all(b"hello").await.expect("hello");
    let mut echo = [0; 5];
    stream.read_exact(&mut echo).await.expect("echo");
    session.closed().await;
}
