//! While the exit is down, the entry turns its clients away at once with `--exit-wait 0`
//! (with a SOCKS5 failure reply under `entry --socks`), logs the outage with one warning
//! however many connections it keeps retrying, and one line when the exit is back, with how
//! long it was gone.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use common::within;

const BINARY: &str = env!("CARGO_BIN_EXE_gomux-tunnel");

/// Starts the binary; returns it, its log (kept as it comes), and the first address it prints.
async fn start(args: &[&str]) -> (Child, Arc<Mutex<String>>, SocketAddr) {
    let mut child = Command::new(BINARY)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gomux-tunnel");
    let log = Arc::new(Mutex::new(String::new()));
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
    {
        let log = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                let mut log = log.lock().expect("not poisoned");
                log.push_str(&line);
                log.push('\n');
            }
        });
    }
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = within("the bound address", stdout.next_line())
        .await
        .expect("read")
        .expect("a line");
    let addr = line
        .split_whitespace()
        .nth(2)
        .expect("listening NAME ADDR")
        .parse()
        .expect("an address");
    (child, log, addr)
}

/// A SOCKS5 client asking for 127.0.0.1:9; returns the reply code.
async fn socks_reply(entry: SocketAddr) -> u8 {
    let mut client = TcpStream::connect(entry).await.expect("connect");
    client.write_all(&[5, 1, 0]).await.expect("greet");
    let mut method = [0; 2];
    client.read_exact(&mut method).await.expect("the method");
    assert_eq!(method, [5, 0]);
    client
        .write_all(&[5, 1, 0, 1, 127, 0, 0, 1, 0, 9])
        .await
        .expect("request");
    let mut reply = [0; 10];
    client.read_exact(&mut reply).await.expect("the reply");
    reply[1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_outage_turns_clients_away_at_once_and_is_logged_once() {
    let exits = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("address").to_string()
    };
    let (_entry, log, clients) = start(&[
        "entry",
        "--listen",
        "127.0.0.1:0",
        "--exit",
        &exits,
        "--connections",
        "2",
        "--insecure",
        "--socks",
        "--exit-wait",
        "0",
    ])
    .await;
    for _ in 0..3 {
        let started = Instant::now();
        let reply = within("a SOCKS5 reply", socks_reply(clients)).await;
        assert_eq!(reply, 3, "network unreachable");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "turned away at once: {:?}",
            started.elapsed()
        );
    }
    // Several rounds of retries on both connections.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let warnings = |log: &str| {
        log.lines()
            .filter(|line| line.contains("WARN") && line.contains("cannot reach the exit"))
            .count()
    };
    let text = log.lock().expect("not poisoned").clone();
    assert_eq!(warnings(&text), 1, "one warning for the outage:\n{text}");

    // The exit comes up, and a client brings the next dial: one line says the exit is back,
    // with the time it was down; the client is served (the exit answers for the target).
    let (_exit, _, _) = start(&["exit", "--listen", &exits, "--socks", "--insecure"]).await;
    within("the exit to be back", async {
        while socks_reply(clients).await == 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let text = log.lock().expect("not poisoned").clone();
    let back: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("the exit is back"))
        .collect();
    assert_eq!(back.len(), 1, "{text}");
    assert!(back[0].contains("down_for="), "{text}");
    assert_eq!(warnings(&text), 1, "{text}");
}
