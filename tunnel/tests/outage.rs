//! While the exit is down, the entry turns its clients away at once with `--exit-wait 0`
//! (with a SOCKS5 failure reply under `entry --socks`), logs the outage with one warning
//! however many connections it keeps retrying, and one line when the exit is back, with how
//! long it was gone.

mod common;
mod process;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::within;
use process::End;

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
    let entry = End::start(
        &[
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
        ],
        1,
    )
    .await;
    let clients = entry.addr("clients");
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
    let text = entry.log();
    assert_eq!(warnings(&text), 1, "one warning for the outage:\n{text}");

    // The exit comes up, and a client brings the next dial: one line says the exit is back,
    // with the time it was down; the client is served (the exit answers for the target).
    let _exit = End::start(&["exit", "--listen", &exits, "--socks", "--insecure"], 1).await;
    within("the exit to be back", async {
        while socks_reply(clients).await == 3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let text = entry.log();
    let back: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("the exit is back"))
        .collect();
    assert_eq!(back.len(), 1, "{text}");
    assert!(back[0].contains("down_for="), "{text}");
    assert_eq!(warnings(&text), 1, "{text}");
}
