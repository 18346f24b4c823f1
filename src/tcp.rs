//! TCP socket settings for running a session over a network (feature `tcp`).
//!
//! A session's streams share one connection, so whatever waits in the connection's queues waits
//! in front of every stream's next bytes: a small write of one stream lands behind the bulk
//! another stream wrote before it. Two of those queues are the kernel's, and [`configure`]
//! keeps both small:
//!
//! - Nagle's algorithm holds a small write back until the previous one is acknowledged, a round
//!   trip, whenever data is unacknowledged; `TCP_NODELAY` turns it off.
//! - The socket's send buffer grows (Linux tunes it up to `net.ipv4.tcp_wmem`'s maximum, 4 MiB
//!   by default) until it holds what the path can carry plus whatever the application wrote
//!   beyond that. Bytes not yet sent are a FIFO nobody can reorder any more: over a 20 Mbit/s
//!   link, 1 MiB of them is 400 ms in front of the next ping. `TCP_NOTSENT_LOWAT` makes the
//!   socket writable only while fewer than that many bytes are unsent, so the rest waits in the
//!   session, where the session's writer still decides the order.
//!
//! Without `TCP_NOTSENT_LOWAT` (on platforms other than Linux and Android, where it is not set
//! here), [`configure`] sets `TCP_NODELAY` only.
//!
//! What it changes over an emulated slow link, ping latency beside a bulk stream of the same
//! session with and without it, is in BENCHMARKS.md ("Latency under load over an emulated
//! link"; `cargo bench --features tcp --bench latency_under_load`). The session's own scheduler
//! lets a ping pass the bulk queued in the session; what is left is what the kernel holds
//! unsent (with the option, what it had when it last had room, below [`NOTSENT_LOWAT`], plus
//! the write it took then: Linux takes a whole write, and appends small writes to a packet not
//! yet sent, while it has room), what the path holds, and the batch the session's writer has in
//! hand (a quarter of what the socket took between its last two push-backs, at least 4 KiB).
//! The bulk stream keeps the link's rate.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let addr = listener.local_addr()?;
//! # tokio::spawn(async move {
//! #     let (socket, _) = listener.accept().await?;
//! #     gomux::tcp::configure(&socket)?;
//! #     gomux::Session::server(socket).closed().await;
//! #     std::io::Result::Ok(())
//! # });
//! let tcp = tokio::net::TcpStream::connect(addr).await?;
//! gomux::tcp::configure(&tcp)?; // on both ends
//! assert!(tcp.nodelay()?);
//! let session = gomux::Session::client(tcp);
//! # session.close().await.map_err(std::io::Error::from)?;
//! # Ok(())
//! # }
//! ```

use std::io;

use tokio::net::TcpStream;

/// The `TCP_NOTSENT_LOWAT` that [`configure`] sets: 4 KiB, a few packets. The socket then
/// wakes its writer when fewer than 2 KiB are unsent (Linux wakes a waiting writer below half
/// the setting), and each write it takes goes on top of those, so the kernel still has the
/// writer's next batch before it runs out on a fast path, while a slow one holds little in
/// front of the next frame.
pub const NOTSENT_LOWAT: u32 = 4 * 1024;

/// Turns Nagle's algorithm off and sets `TCP_NOTSENT_LOWAT` to [`NOTSENT_LOWAT`] on `stream`:
/// the settings for a connection a session runs on.
///
/// # Errors
///
/// The operating system refused one of the settings.
pub fn configure(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    set_notsent_lowat(stream, NOTSENT_LOWAT)
}

/// Sets `TCP_NOTSENT_LOWAT` on `stream` to `bytes`: the socket is writable only while fewer than
/// `bytes` written bytes are not yet sent. Does nothing where the option is not available here
/// (platforms other than Linux and Android).
///
/// # Errors
///
/// The operating system refused the setting.
pub fn set_notsent_lowat(stream: &TcpStream, bytes: u32) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    socket2::SockRef::from(stream).set_tcp_notsent_lowat(bytes)?;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (stream, bytes);
    Ok(())
}
