//! The binary's output can go away at any time, as a log collector's pipe does when it
//! restarts: with standard error and standard output closed at start, or while it serves, the
//! tunnel goes on carrying its clients, and a signal still shuts it down (the third at once).

mod common;
mod process;

use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use common::within;
use process::{echo_server, BINARY};

/// A loopback address with a port that was free a moment ago.
async fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address")
}

/// Starts the binary with both of its outputs on pipes, and `RUST_LOG=debug` so that every
/// client makes log lines.
fn start(args: &[&str]) -> Child {
    Command::new(BINARY)
        .args(args)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gomux-tunnel")
}

/// One echo through the entry at `entry`, retried while the entry is not up yet.
async fn echo_through(entry: SocketAddr, message: &[u8]) {
    within("an echo through the tunnel", async {
        loop {
            let Ok(mut client) = TcpStream::connect(entry).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            client.write_all(message).await.expect("send");
            let mut got = vec![0; message.len()];
            match client.read_exact(&mut got).await {
                Ok(_) => {
                    assert_eq!(got, message);
                    return;
                }
                // Turned away while the ends were still connecting: again.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
}

fn signal(child: &Child, name: &str) {
    let pid = child.id().expect("still running").to_string();
    let sent = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{name} {pid}");
}

async fn ended(child: &mut Child, what: &str) -> ExitStatus {
    within(what, child.wait()).await.expect("wait")
}

/// A plain tunnel on ports picked here (nothing needs to be read from its output).
async fn tunnel(drain: &str) -> (Child, Child, SocketAddr) {
    let echo = echo_server().await.to_string();
    let (exits, clients) = (free_addr().await, free_addr().await);
    let (exits, clients_text) = (exits.to_string(), clients.to_string());
    let exit = start(&[
        "exit",
        "--listen",
        &exits,
        "--target",
        &echo,
        "--insecure",
        "--drain",
        drain,
    ]);
    let entry = start(&[
        "entry",
        "--listen",
        &clients_text,
        "--exit",
        &exits,
        "--insecure",
        "--drain",
        drain,
    ]);
    (exit, entry, clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_outputs_closed_at_start_the_tunnel_serves_and_a_signal_ends_it() {
    let (mut exit, mut entry, clients) = tunnel("5").await;
    // Nobody reads either end's output, from the start.
    for child in [&mut exit, &mut entry] {
        drop(child.stdout.take());
        drop(child.stderr.take());
    }
    for n in 0..10u8 {
        echo_through(clients, &[n; 100]).await;
    }
    for (child, name) in [(&mut entry, "entry"), (&mut exit, "exit")] {
        signal(child, "TERM");
        let status = ended(child, name).await;
        assert!(status.success(), "{name} drained and exited: {status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_outputs_closed_while_serving_the_tunnel_serves_and_signals_end_it() {
    let (mut exit, mut entry, clients) = tunnel("600").await;
    echo_through(clients, b"before").await;
    // Read a few lines of the entry's log, then stop reading: its collector went away.
    let mut log = BufReader::new(entry.stderr.take().expect("stderr")).lines();
    within("a log line", log.next_line())
        .await
        .expect("read")
        .expect("a line");
    drop(log);
    drop(entry.stdout.take());
    drop(exit.stderr.take());
    drop(exit.stdout.take());
    for n in 0..10u8 {
        echo_through(clients, &[n; 100]).await;
    }
    // A client that never finishes holds the drain up: the first signal begins it, the
    // second cuts it, the third would exit at once; each logs into the closed pipe.
    let mut held = TcpStream::connect(clients).await.expect("connect");
    held.write_all(b"held").await.expect("send");
    let mut got = [0; 4];
    within("the held echo", held.read_exact(&mut got))
        .await
        .expect("echo");
    signal(&entry, "TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        entry.try_wait().expect("status").is_none(),
        "draining, not gone"
    );
    signal(&entry, "TERM");
    let status = ended(&mut entry, "the entry, cut by a second signal").await;
    assert!(status.code().is_some(), "exited, not killed: {status:?}");
    assert_ne!(status.code(), Some(101), "no panic");

    // The exit, told three times at once, exits whatever it was doing.
    for _ in 0..3 {
        signal(&exit, "INT");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = ended(&mut exit, "the exit, after three signals").await;
    assert!(status.code().is_some(), "exited: {status:?}");
    assert_ne!(status.code(), Some(101), "no panic");
}
