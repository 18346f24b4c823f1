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
//! What it changes, from the run of `scripts/benchmarks.sh --rounds 2` in BENCHMARKS.md
//! (`cargo bench --features tcp --bench latency_under_load`: a 64-byte ping every 10 ms beside a
//! bulk stream of the same session, through an emulated link with a 16 KiB queue, on a 2-core
//! machine), ping p50 / p99 in ms:
//!
//! | link | idle | gomux | gomux, `configure` | two TCP connections | two, with the option |
//! |---|--:|--:|--:|--:|--:|
//! | 100 Mbit/s, 10 ms each way | 22.4 / 23.9 | 62.6 / 83.4 | 25.5 / 28.5 | 23.5 / 25.2 | 23.7 / 25.3 |
//! | 20 Mbit/s, 20 ms each way | 42.6 / 43.5 | 157.4 / 209.9 | 59.7 / 69.3 | 48.6 / 65.4 | 48.6 / 56.6 |
//!
//! The bulk stream kept the link's rate in every row (11.91 MiB/s and 2.37–2.38 MiB/s). The
//! session's own scheduler lets the ping pass the bulk queued in the session; what is left is
//! what the kernel holds (with the option, at most about 16 KiB unsent) and the batch the
//! session's writer has in hand (about what the socket took at its last write).
//!
//! Over loopback it cost no throughput that the same machine could tell apart:
//! `cargo run --release --features tcp --example speed -- --mode mux-tcp --no-verify --bytes 2G
//! --streams 1`, without and with `--notsent-lowat 16K`, three times interleaved, moved 390, 302
//! and 498 MiB/s without it and 317, 301 and 502 MiB/s with it.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! let tcp = tokio::net::TcpStream::connect("127.0.0.1:7000").await?;
//! gomux::tcp::configure(&tcp)?;
//! let session = gomux::Session::client(tcp);
//! # drop(session);
//! # Ok(())
//! # }
//! ```

use std::io;

use tokio::net::TcpStream;

/// The `TCP_NOTSENT_LOWAT` that [`configure`] sets: 16 KiB, a few packets, enough that the
/// kernel never waits for the application on a fast path.
pub const NOTSENT_LOWAT: u32 = 16 * 1024;

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
