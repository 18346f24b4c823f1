//! A TCP tunnel in one page: every client connection becomes one gomux stream over a single
//! TCP connection between two ends.
//!
//! ```text
//!  client ──TCP──┐                                        ┌──TCP── target
//!  client ──TCP──┼── entry ══ one gomux connection ══ exit ──┼──TCP── target
//!  client ──TCP──┘                                        └──TCP── target
//! ```
//!
//! Run as it is, it starts an echo server (the target), an exit and an entry in this process,
//! sends a few clients through and checks what comes back:
//!
//! ```text
//! cargo run --example tunnel
//! ```
//!
//! This is the idea, not a tool: no TLS, no reconnecting, no graceful shutdown. The tool
//! built on it, with all of those, SOCKS5 and exposure controls, is `gomux-tunnel` (the
//! `tunnel/` crate of this repository).

use std::error::Error;
use std::net::SocketAddr;

use gomux::{Role, Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // Step 1: the target, an echo server: whatever a client sends comes back.
    let target = TcpListener::bind("127.0.0.1:0").await?;
    let target_addr = target.local_addr()?;
    tokio::spawn(echo_server(target));

    // Step 2: the exit listens for the entry's one connection and serves its streams.
    let exit = TcpListener::bind("127.0.0.1:0").await?;
    let exit_addr = exit.local_addr()?;
    tokio::spawn(run_exit(exit, target_addr));

    // Step 3: the entry dials the exit once, and listens for clients.
    let clients = TcpListener::bind("127.0.0.1:0").await?;
    let entry_addr = clients.local_addr()?;
    tokio::spawn(run_entry(clients, exit_addr));

    // Step 4: clients, all at once; each gets its own stream, their bytes interleave on the
    // one connection and come back to the right client.
    let mut checks = Vec::new();
    for client in 0..8u8 {
        checks.push(tokio::spawn(async move {
            let message = vec![client; 100_000];
            let mut socket = TcpStream::connect(entry_addr).await?;
            socket.write_all(&message).await?;
            // Half-close: "I am done sending". It travels through the tunnel to the target,
            // which then finishes its echo and closes in turn.
            socket.shutdown().await?;
            let mut echoed = Vec::new();
            socket.read_to_end(&mut echoed).await?;
            assert_eq!(echoed, message, "client {client} got its own bytes back");
            Ok::<_, BoxError>(echoed.len())
        }));
    }
    for (client, check) in checks.into_iter().enumerate() {
        println!(
            "tunnel: client {client}: {} bytes echoed intact",
            check.await??
        );
    }
    Ok(())
}

/// The entry: one gomux session over one TCP connection to the exit, one stream per client.
async fn run_entry(clients: TcpListener, exit: SocketAddr) -> Result<(), BoxError> {
    let socket = TcpStream::connect(exit).await?;
    // gomux writes many small frames; without TCP_NODELAY, Nagle's algorithm would hold each
    // back until the previous one is acknowledged, adding a round trip to small exchanges.
    socket.set_nodelay(true)?;
    // The session takes the connection; a task it spawns drives it from now on. The dialling
    // end takes the client role (odd stream ids), the other the server role.
    let session = Session::with_config(socket, Role::Client, gomux::Config::default());
    loop {
        let (client, _) = clients.accept().await?;
        client.set_nodelay(true)?;
        // Opening a stream costs no round trip: the exit learns of it with its first frame.
        let stream = session.open().await?;
        // A task per client, so that a slow one never holds up the others.
        tokio::spawn(relay(client, stream));
    }
}

/// The exit: accepts the entry's connection, then connects each stream to the target.
async fn run_exit(listener: TcpListener, target: SocketAddr) -> Result<(), BoxError> {
    let (socket, _) = listener.accept().await?;
    socket.set_nodelay(true)?;
    let session = Session::with_config(socket, Role::Server, gomux::Config::default());
    // `accept` yields each stream the entry opens, and fails once the session has ended.
    while let Ok(stream) = session.accept().await {
        tokio::spawn(async move {
            match TcpStream::connect(target).await {
                Ok(target) => {
                    let _ = target.set_nodelay(true);
                    relay(target, stream).await;
                }
                // Dropping the stream closes it: its client sees the end, nobody else does.
                Err(error) => eprintln!("tunnel: cannot reach the target: {error}"),
            }
        });
    }
    Ok(())
}

/// Copies bytes both ways between a TCP connection and a gomux stream until both directions
/// are done. A `Stream` is `AsyncRead + AsyncWrite`, so tokio's own `copy_bidirectional`
/// does it, half-closes included: end-of-file on one side shuts down the other's write half
/// (a gomux half-close one way, a TCP FIN the other) while the other direction goes on.
async fn relay(mut tcp: TcpStream, mut stream: Stream) {
    if let Err(error) = tokio::io::copy_bidirectional(&mut tcp, &mut stream).await {
        eprintln!("tunnel: stream {} ended by an error: {error}", stream.id());
    }
}

/// The target: echoes every connection back, then closes its side once the client has.
async fn echo_server(listener: TcpListener) {
    while let Ok((mut socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let (mut reader, mut writer) = socket.split();
            let _ = tokio::io::copy(&mut reader, &mut writer).await;
            let _ = writer.shutdown().await;
        });
    }
}
