//! The TCP forwarder of `examples/tunnel.rs`, run in this process: its entry and exit on
//! ephemeral loopback ports, real TCP clients in front and test targets (or a real Redis
//! server, where one is installed) behind.
//!
//! Between the entry and the exit sits a [`Link`], a plain TCP relay the tests can cut, to
//! play a network failure and to count how many connections the entry made.
//!
//! `RUST_LOG=debug cargo test --test tunnel -- --nocapture` shows the tunnel's logs.

#[allow(dead_code)] // the example's command line is not used here
#[path = "../examples/tunnel.rs"]
mod tunnel;

mod common;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio::task::{AbortHandle, JoinHandle};

use common::{assert_same, pattern, within};
use tunnel::{run_entry, run_exit, EntryOptions};

// ---------------------------------------------------------------------------------------------
// The scenarios
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_clients_each_get_their_own_echo() {
    let (_target, tunnel) = echo_tunnel().await;

    let clients: Vec<_> = (0..48)
        .map(|seed| {
            let entry = tunnel.entry;
            tokio::spawn(async move {
                // Each client sends different content, so bytes delivered to the wrong client
                // are caught as well as lost or reordered ones.
                let data = pattern(seed, 64 * 1024 + seed as usize * 1000);
                let got = round_trip(connect(entry).await, &data).await;
                assert_same(&got, &data, &format!("client {seed}"));
            })
        })
        .collect();
    for client in clients {
        within("a client's echo", client).await.expect("no panic");
    }
    tunnel
        .link
        .assert_connections(1, "all clients share one connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_half_close_reaches_the_target() {
    // This target answers only once it has read end-of-file, then closes: the answer arriving
    // shows that the client's half-close went all the way, and that the other direction still
    // worked after it.
    let target = Target::spawn(|mut socket: TcpStream| async move {
        let mut request = Vec::new();
        socket.read_to_end(&mut request).await?;
        let answer = format!("read {} bytes", request.len());
        socket.write_all(answer.as_bytes()).await?;
        socket.shutdown().await
    })
    .await;
    let tunnel = Tunnel::start(target.addr).await;

    let mut client = connect(tunnel.entry).await;
    client.write_all(&[7; 100_000]).await.expect("write");
    client.shutdown().await.expect("half-close");
    let mut answer = String::new();
    within("the answer", client.read_to_string(&mut answer))
        .await
        .expect("read the answer to its end");
    assert_eq!(answer, "read 100000 bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_half_close_reaches_the_client() {
    // This target greets, half-closes, and then reads what the client still sends.
    let (heard_tx, heard) = tokio::sync::oneshot::channel();
    let heard_tx = Mutex::new(Some(heard_tx));
    let target = Target::spawn(move |mut socket: TcpStream| {
        let heard_tx = heard_tx.lock().expect("not poisoned").take();
        async move {
            socket.write_all(b"hello").await?;
            socket.shutdown().await?;
            let mut rest = Vec::new();
            socket.read_to_end(&mut rest).await?;
            if let Some(heard_tx) = heard_tx {
                let _ = heard_tx.send(rest);
            }
            Ok(())
        }
    })
    .await;
    let tunnel = Tunnel::start(target.addr).await;

    let mut client = connect(tunnel.entry).await;
    let mut greeting = Vec::new();
    within(
        "the greeting and end-of-file",
        client.read_to_end(&mut greeting),
    )
    .await
    .expect("read the greeting to its end");
    assert_eq!(greeting, b"hello");

    // The target's half-close must not have closed the direction towards it.
    client.write_all(b"still heard").await.expect("write");
    client.shutdown().await.expect("half-close");
    let rest = within("what the target heard", heard).await.expect("sent");
    assert_eq!(rest, b"still heard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_ends_only_its_own_stream() {
    let (_target, tunnel) = echo_tunnel().await;

    let mut stays = connect(tunnel.entry).await;
    echo_once(&mut stays, b"before").await;

    // Leave in the middle of a transfer, without a half-close.
    let mut leaves = connect(tunnel.entry).await;
    leaves.write_all(&[1; 200_000]).await.expect("write");
    drop(leaves);

    echo_once(&mut stays, b"after").await;
    let newcomer = round_trip(connect(tunnel.entry).await, b"newcomer").await;
    assert_eq!(newcomer, b"newcomer");
    tunnel
        .link
        .assert_connections(1, "the connection to the exit lived on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_target_ends_only_that_client() {
    let (target, tunnel) = echo_tunnel().await;

    let mut earlier = connect(tunnel.entry).await;
    echo_once(&mut earlier, b"before").await;

    // Nothing listens on the target's port any more: the exit's connect is refused.
    target.stop().await;

    let mut refused = connect(tunnel.entry).await;
    // The write may race with the stream's close; whether it fails does not matter.
    let _ = refused.write_all(b"anyone?").await;
    assert_ended(&mut refused, "the refused client").await;

    // The client connected before, and the connection to the exit, are untouched.
    echo_once(&mut earlier, b"after").await;
    tunnel
        .link
        .assert_connections(1, "the connection to the exit lived on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_closes_its_clients_and_the_entry_dials_again() {
    let (_target, tunnel) = echo_tunnel().await;

    let mut first = connect(tunnel.entry).await;
    let mut second = connect(tunnel.entry).await;
    echo_once(&mut first, b"one").await;
    echo_once(&mut second, b"two").await;

    tunnel.link.cut();

    // Both clients were carried by the lost connection: both are closed, although neither
    // sends anything that could fail.
    assert_ended(&mut first, "the first client").await;
    assert_ended(&mut second, "the second client").await;

    // A new client is carried by a new connection, once the entry has dialled again: it waits
    // for it if it comes too early.
    let got = round_trip(connect(tunnel.entry).await, b"three").await;
    assert_eq!(got, b"three");
    tunnel
        .link
        .assert_connections(2, "the entry dialled once more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waits_for_an_exit_that_is_not_up_yet() {
    let target = Target::spawn(echo).await;

    // Reserve a port for the exit, and leave it closed for now: the entry's dials are refused
    // and it backs off.
    let exit_addr = free_addr().await;
    let entry = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let entry_addr = entry.local_addr().expect("address");
    let _entry = Task::spawn(run_entry(entry, exit_addr, fast_redial()));

    let client = connect(entry_addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // a few failed dials
    let exit = TcpListener::bind(exit_addr).await.expect("bind the exit");
    let _exit = Task::spawn(run_exit(exit, target.addr));

    let got = round_trip(client, b"patience").await;
    assert_eq!(got, b"patience");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_through_the_tunnel() {
    let missing: Vec<_> = ["redis-server", "redis-cli", "redis-benchmark"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    if missing.contains(&"redis-server") {
        eprintln!("skipping: redis-server not found");
        return;
    }
    assert!(
        missing.is_empty(),
        "redis-server is installed but not {missing:?} (apt-get install redis-tools)"
    );

    let redis = Redis::start().await;
    let tunnel = Tunnel::start(redis.addr).await;
    let port = tunnel.entry.port().to_string();

    // A short benchmark: 2000 requests from 10 connections for each of SET and GET.
    let benchmark = run_tool(
        "redis-benchmark",
        &["-p", &port, "-q", "-n", "2000", "-c", "10", "-t", "set,get"],
        None,
    )
    .await;
    // Its progress lines end in carriage returns; the results contain "requests per second".
    let report = String::from_utf8_lossy(&benchmark).replace('\r', "\n");
    let results: Vec<_> = report
        .lines()
        .filter(|line| line.contains("requests per second"))
        .collect();
    eprintln!(
        "redis-benchmark through the tunnel:\n{}",
        results.join("\n")
    );
    for command in ["SET", "GET"] {
        assert!(
            results
                .iter()
                .any(|line| line.starts_with(&format!("{command}: "))),
            "no {command} result in the benchmark output:\n{report}"
        );
    }

    // A 4 MiB value of arbitrary bytes, stored and read back through the tunnel. `redis-cli`
    // prints a value read from a pipe as it is, plus a newline.
    let value = pattern(42, 4 * 1024 * 1024);
    let stored = run_tool(
        "redis-cli",
        &["-p", &port, "-x", "SET", "big"],
        Some(&value),
    )
    .await;
    assert_eq!(stored, b"OK\n");
    let mut read = run_tool("redis-cli", &["-p", &port, "GET", "big"], None).await;
    assert_eq!(
        read.pop(),
        Some(b'\n'),
        "redis-cli ends its output with a newline"
    );
    assert_same(&read, &value, "the value read back through the tunnel");
}

// ---------------------------------------------------------------------------------------------
// The tunnel under test
// ---------------------------------------------------------------------------------------------

/// An entry and an exit in this process, joined by a cuttable [`Link`].
struct Tunnel {
    /// Where clients connect.
    entry: SocketAddr,
    link: Link,
    _tasks: [Task; 2],
}

impl Tunnel {
    async fn start(target: SocketAddr) -> Tunnel {
        init_logs();
        let exit = TcpListener::bind("127.0.0.1:0").await.expect("bind exit");
        let exit_addr = exit.local_addr().expect("exit address");
        let link = Link::spawn(exit_addr).await;
        let entry = TcpListener::bind("127.0.0.1:0").await.expect("bind entry");
        let entry_addr = entry.local_addr().expect("entry address");
        Tunnel {
            entry: entry_addr,
            _tasks: [
                Task::spawn(run_exit(exit, target)),
                Task::spawn(run_entry(entry, link.addr, fast_redial())),
            ],
            link,
        }
    }
}

/// A tunnel in front of a new echo target. Keep the target: dropping it closes its listener.
async fn echo_tunnel() -> (Target, Tunnel) {
    let target = Target::spawn(echo).await;
    let tunnel = Tunnel::start(target.addr).await;
    (target, tunnel)
}

/// Entry settings that re-dial quickly, so the tests do not wait on backoff.
fn fast_redial() -> EntryOptions {
    EntryOptions {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..EntryOptions::default()
    }
}

/// Logs of the tunnel in the test output, filtered by `RUST_LOG` (warnings by default).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Another test of this binary may have installed it already.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A TCP relay between the entry and the exit that counts the connections it carries and can
/// cut them all, as a failing network would.
struct Link {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    live: Arc<Mutex<Vec<AbortHandle>>>,
    _task: Task,
}

impl Link {
    async fn spawn(exit: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind link");
        let addr = listener.local_addr().expect("link address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let live = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (accepted, live) = (Arc::clone(&accepted), Arc::clone(&live));
            Task::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let relay = tokio::spawn(async move {
                        let mut outbound = TcpStream::connect(exit).await?;
                        inbound.set_nodelay(true)?;
                        outbound.set_nodelay(true)?;
                        tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await
                    });
                    live.lock()
                        .expect("not poisoned")
                        .push(relay.abort_handle());
                }
            })
        };
        Link {
            addr,
            accepted,
            live,
            _task: task,
        }
    }

    /// Checks how many connections the entry has made through the link so far.
    #[track_caller]
    fn assert_connections(&self, expected: usize, why: &str) {
        assert_eq!(self.accepted.load(Ordering::SeqCst), expected, "{why}");
    }

    /// Drops every connection the link carries: both of its sockets close at once.
    fn cut(&self) {
        for relay in self.live.lock().expect("not poisoned").drain(..) {
            relay.abort();
        }
    }
}

/// A spawned task that is aborted when this handle is dropped, so each test stops what it
/// started.
struct Task(JoinHandle<()>);

impl Task {
    fn spawn<F>(future: F) -> Task
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Task(tokio::spawn(future))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Targets and clients
// ---------------------------------------------------------------------------------------------

/// A TCP service on a loopback port that serves each connection with a function of ours.
struct Target {
    addr: SocketAddr,
    accepting: Task,
}

impl Target {
    async fn spawn<F, Fut>(serve: F) -> Target
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind target");
        let addr = listener.local_addr().expect("target address");
        let accepting = Task::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                socket.set_nodelay(true).expect("nodelay");
                // Connections outlive `stop`, which closes only the listener.
                tokio::spawn(serve(socket));
            }
        });
        Target { addr, accepting }
    }

    /// Closes the listening socket: connections to the port are refused from now on.
    async fn stop(self) {
        let task = &self.accepting.0;
        task.abort();
        // Wait until the task, and with it the listener, is really gone.
        while !task.is_finished() {
            tokio::task::yield_now().await;
        }
    }
}

/// Echoes everything until end-of-file, then half-closes in turn.
async fn echo(mut socket: TcpStream) -> io::Result<()> {
    let (mut reader, mut writer) = socket.split();
    tokio::io::copy(&mut reader, &mut writer).await?;
    writer.shutdown().await
}

/// A client connection to the entry.
async fn connect(entry: SocketAddr) -> TcpStream {
    let socket = within("connect to the entry", TcpStream::connect(entry))
        .await
        .expect("connect to the entry");
    socket.set_nodelay(true).expect("nodelay");
    socket
}

/// Writes `data` and half-closes while reading everything until end-of-file, both at once
/// (an echo can only go as fast as it is read).
async fn round_trip(socket: TcpStream, data: &[u8]) -> Vec<u8> {
    let (mut reader, mut writer) = socket.into_split();
    let write = async {
        writer.write_all(data).await.expect("write the request");
        writer.shutdown().await.expect("half-close");
    };
    let read = async {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.expect("read to the end");
        got
    };
    within("a round trip", async { tokio::join!(write, read).1 }).await
}

/// Sends `message` on a connection to an echo target and reads it back, leaving the
/// connection open.
async fn echo_once(socket: &mut TcpStream, message: &[u8]) {
    socket.write_all(message).await.expect("write");
    let mut got = vec![0; message.len()];
    within("an echo", socket.read_exact(&mut got))
        .await
        .expect("read the echo");
    assert_eq!(got, message);
}

/// Reads until the connection ends, which must come without data: end-of-file, or a reset
/// (when the entry closed the connection with bytes of ours still unread).
async fn assert_ended(socket: &mut TcpStream, what: &str) {
    let mut got = Vec::new();
    let read = within(what, socket.read_to_end(&mut got)).await;
    assert!(got.is_empty(), "{what}: unexpected data {got:?}");
    if let Err(error) = read {
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ),
            "{what}: unexpected error {error}"
        );
    }
}

/// A loopback address that nothing listens on (it was free a moment ago).
async fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address")
}

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

/// A `redis-server` on a free loopback port, without persistence, killed when dropped.
struct Redis {
    addr: SocketAddr,
    _process: tokio::process::Child,
}

impl Redis {
    async fn start() -> Redis {
        let addr = free_addr().await;
        let port = addr.port().to_string();
        let process = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start redis-server");
        // Ready once it answers a PING.
        within("redis-server to start", async {
            loop {
                let pong = Command::new("redis-cli")
                    .args(["-p", &port, "PING"])
                    .stderr(Stdio::null())
                    .output()
                    .await
                    .expect("run redis-cli");
                if pong.stdout.starts_with(b"PONG") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        Redis {
            addr,
            _process: process,
        }
    }
}

/// Runs a Redis tool against 127.0.0.1 with `input` on its standard input, checks that it
/// succeeded and returns its standard output.
async fn run_tool(tool: &str, args: &[&str], input: Option<&[u8]>) -> Vec<u8> {
    let mut child = Command::new(tool)
        .args(["-h", "127.0.0.1"])
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {tool}: {e}"));
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // Closing stdin afterwards is what tells `redis-cli -x` the value is complete.
        stdin.write_all(input).await.expect("feed stdin");
    }
    let output = within_a_minute(tool, child.wait_with_output())
        .await
        .unwrap_or_else(|e| panic!("wait for {tool}: {e}"));
    assert!(
        output.status.success(),
        "{tool} {args:?}: {}",
        output.status
    );
    output.stdout
}

/// Like [`within`], with room for a benchmark on a slow, shared machine.
async fn within_a_minute<F: Future>(what: &str, future: F) -> F::Output {
    common::within_for(Duration::from_secs(120), what, future).await
}

/// Whether an executable of this name is on `PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}
