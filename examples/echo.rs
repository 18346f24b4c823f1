//! An echo server and client speaking gomux over TCP.
//!
//! The client opens several streams on one TCP connection, writes a stream of pseudo-random
//! bytes on each, and checks that every byte comes back unchanged. The server echoes whatever
//! each stream sends until the client half-closes it.
//!
//! With no arguments, both ends run in this one process, on loopback, and the example prints a
//! one-line summary:
//!
//! ```text
//! cargo run --release --example echo
//! ```
//!
//! The two ends can also run apart, for example in two terminals (the server speaks the same
//! wire protocol as Go gomux, so a Go client can use it too):
//!
//! ```text
//! cargo run --release --example echo -- server 127.0.0.1:7000
//! cargo run --release --example echo -- client 127.0.0.1:7000 --streams 16 --bytes 1048576
//! ```
//!
//! The client exits with status 1 if any stream does not echo exactly what was sent.

use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;
use std::process;
use std::time::{Duration, Instant};

use gomux::{Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Streams the client opens unless told otherwise.
const DEFAULT_STREAMS: usize = 8;

/// Bytes the client sends on each stream unless told otherwise: 4 MiB.
const DEFAULT_BYTES: u64 = 4 * 1024 * 1024;

/// Size of the client's writes and reads: one maximal gomux Data frame.
const CHUNK: usize = 64 * 1024;

const USAGE: &str = "\
usage: echo [--streams N] [--bytes B]          run server and client on loopback
       echo server ADDR                        serve gomux echo sessions on ADDR
       echo client ADDR [--streams N] [--bytes B]
                                               echo N streams of B bytes each through ADDR
defaults: --streams 8 --bytes 4194304";

/// What the command line asked for.
enum Command {
    /// Server and client in this process.
    Demo(Load),
    /// Only the server, on this address.
    Server(String),
    /// Only the client, connecting to this address.
    Client(String, Load),
}

/// How much the client sends.
#[derive(Clone, Copy)]
struct Load {
    streams: usize,
    bytes: u64,
}

#[tokio::main]
async fn main() {
    // Read the command line first, so that a typo prints the usage instead of half-starting.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_args(&args) {
        Ok(Some(command)) => command,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(problem) => {
            eprintln!("echo: {problem}\n{USAGE}");
            process::exit(2);
        }
    };

    let outcome = match command {
        Command::Demo(load) => demo(load).await,
        Command::Server(addr) => run_server(&addr).await,
        Command::Client(addr, load) => run_client(&addr, load).await,
    };

    // Any error, a mismatched echo included, ends the process with a non-zero status.
    if let Err(error) = outcome {
        eprintln!("echo: {error}");
        process::exit(1);
    }
}

/// The self-contained demo: an echo server on an ephemeral loopback port, and a client that
/// talks to it through a real TCP connection.
async fn demo(load: Load) -> Result<(), Box<dyn StdError>> {
    // Port 0 lets the operating system pick a free port, so the demo never collides with
    // anything already listening.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;

    // The server runs as a background task of this same runtime. It is simply abandoned when
    // `main` returns.
    tokio::spawn(serve(listener, false));

    run_client(&addr.to_string(), load).await
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// `echo server ADDR`: binds ADDR and serves until the process is stopped.
async fn run_server(addr: &str) -> Result<(), Box<dyn StdError>> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    println!("echo: serving gomux on {}", listener.local_addr()?);
    serve(listener, true).await?;
    Ok(())
}

/// Accepts TCP connections forever; each one carries one gomux session.
async fn serve(listener: TcpListener, verbose: bool) -> io::Result<()> {
    loop {
        let (socket, peer) = listener.accept().await?;

        // gomux writes many small frames (window updates, closes). Without TCP_NODELAY, Nagle's
        // algorithm would hold them back waiting for an acknowledgement, adding round trips.
        socket.set_nodelay(true)?;

        // One task per connection, so a slow client never holds up the accept loop.
        tokio::spawn(async move {
            let reason = serve_session(socket).await;
            if verbose {
                println!("echo: session with {peer} ended: {reason}");
            }
        });
    }
}

/// Runs the server role of one session until it ends, and returns why it ended.
async fn serve_session(socket: TcpStream) -> gomux::Error {
    // The protocol has no handshake: this end is the server because we say so. `server`
    // spawns the session's driver task, which alone reads and writes the socket.
    let session = Session::server(socket);

    // `accept` hands over each stream the client opens. It fails once the session is over:
    // normally because the client closed it (`Error::ClosedByPeer`).
    loop {
        match session.accept().await {
            Ok(stream) => {
                // Streams are independent: echo each one in its own task, so a stream whose
                // reader is slow does not delay the others.
                tokio::spawn(async move {
                    let id = stream.id();
                    if let Err(error) = echo_stream(stream).await {
                        eprintln!("echo: stream {id}: {error}");
                    }
                });
            }
            Err(reason) => return reason,
        }
    }
}

/// Copies everything the peer writes on `stream` back to it.
async fn echo_stream(stream: Stream) -> io::Result<u64> {
    // Splitting gives a reader and a writer that can be used at the same time: `copy_buf` reads
    // from one while writing to the other.
    let (reader, mut writer) = stream.into_split();

    // A 64 KiB buffer lets each write fill a whole frame (the protocol's largest payload);
    // `tokio::io::copy`'s own 8 KiB buffer would send eight times as many frames.
    let mut reader = tokio::io::BufReader::with_capacity(64 * 1024, reader);

    // `copy_buf` runs until the client's half-close: the client's `shutdown` reaches us as
    // end-of-stream once everything it wrote has been read.
    let echoed = tokio::io::copy_buf(&mut reader, &mut writer).await?;

    // Half-close our side in turn, so the client's read of the echo reaches its end too.
    writer.shutdown().await?;

    // Returning drops both halves, which closes the stream and releases its id.
    Ok(echoed)
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/// `echo client ADDR`: connects, echoes `load` through the server, checks it and prints a
/// summary.
async fn run_client(addr: &str, load: Load) -> Result<(), Box<dyn StdError>> {
    // A gomux session runs over any reliable byte stream; here, one TCP connection.
    let socket = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    socket.set_nodelay(true)?;

    // This end opens streams, so it takes the client role (even stream ids).
    let session = Session::client(socket);

    // Every stream runs in its own task, all at the same time: they share the one connection,
    // and the session interleaves their frames on it.
    let started = Instant::now();
    let mut streams = JoinSet::new();
    for index in 0..load.streams {
        let session = session.clone();
        streams.spawn(async move { echo_one(&session, index as u64, load.bytes).await });
    }

    // Wait for all of them. The first failure ends the run: the remaining tasks are aborted
    // when the `JoinSet` is dropped.
    while let Some(result) = streams.join_next().await {
        result??;
    }
    let elapsed = started.elapsed();

    // Close the session gracefully: the peer is sent CloseMux, then the connection is shut
    // down.
    session.close().await?;

    println!("{}", summary(load, elapsed));
    Ok(())
}

/// Sends `bytes` pseudo-random bytes on a new stream and checks the echo, byte for byte.
async fn echo_one(session: &Session, index: u64, bytes: u64) -> io::Result<()> {
    // Opening a stream costs one frame on the wire and no round trip: data can follow at once.
    let stream = session.open().await?;
    let id = stream.id();

    // Write and read at the same time. Writing everything before reading would deadlock for
    // large streams: the server can echo only as fast as we read. Once its 64 KiB of credit
    // towards us is spent, its copy stops reading what we send, our own credit runs out, and
    // our writes would wait forever.
    let (mut reader, mut writer) = stream.into_split();

    // Each stream gets its own content, so bytes delivered to the wrong stream are caught too.
    let seed = index;

    let send = async move {
        let mut pattern = Pattern::new(seed);
        let mut chunk = vec![0; CHUNK];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            pattern.fill(&mut chunk[..n]);
            writer.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
        // Half-close: the server reads end-of-stream after our last byte, which ends its
        // copy. We can still read.
        writer.shutdown().await
    };

    let check = async move {
        let mut expected = Pattern::new(seed);
        let mut received = vec![0; CHUNK];
        let mut wanted = vec![0; CHUNK];
        let mut total = 0u64;
        loop {
            let n = reader.read(&mut received).await?;
            if n == 0 {
                break; // the server's half-close: the echo is complete
            }
            if total + n as u64 > bytes {
                return Err(mismatch(
                    id,
                    format!("echoed more than the {bytes} bytes sent"),
                ));
            }
            expected.fill(&mut wanted[..n]);
            if let Some(at) = (0..n).find(|&i| received[i] != wanted[i]) {
                let offset = total + at as u64;
                return Err(mismatch(
                    id,
                    format!(
                        "byte {offset} echoed as {:#04x}, sent as {:#04x}",
                        received[at], wanted[at]
                    ),
                ));
            }
            total += n as u64;
        }
        if total != bytes {
            return Err(mismatch(
                id,
                format!("echo ended after {total} of {bytes} bytes"),
            ));
        }
        Ok(())
    };

    // Both must succeed. When this returns, the halves are dropped and the stream closes.
    tokio::try_join!(send, check)?;
    Ok(())
}

fn mismatch(id: u32, what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("stream {id}: {what}"))
}

/// The summary line. MB/s counts the bytes sent (10^6 per MB); as many came back, so twice as
/// many crossed the connection.
fn summary(load: Load, elapsed: Duration) -> String {
    let total = load.streams as u64 * load.bytes;
    let seconds = elapsed.as_secs_f64();
    let rate = total as f64 / 1e6 / seconds.max(1e-9);
    let plural = if load.streams == 1 { "" } else { "s" };
    format!(
        "echo: {} stream{plural} x {} bytes echoed in {:.3} s ({} bytes each way, {:.1} MB/s each way)",
        load.streams, load.bytes, seconds, total, rate
    )
}

// ---------------------------------------------------------------------------------------------
// Test content
// ---------------------------------------------------------------------------------------------

/// An endless, deterministic byte sequence: the SplitMix64 outputs for 0, 1, 2, … under a seed,
/// in little-endian order. The sender and the checker each run their own copy with the same
/// seed, so neither keeps the whole stream in memory, however many bytes are sent.
struct Pattern {
    seed: u64,
    /// Bytes produced so far.
    offset: u64,
}

impl Pattern {
    fn new(seed: u64) -> Pattern {
        Pattern { seed, offset: 0 }
    }

    /// Fills `buf` with the next bytes of the sequence. The sequence does not depend on how it
    /// is cut into calls, so the checker's reads need not line up with the sender's writes.
    fn fill(&mut self, buf: &mut [u8]) {
        let mut done = 0;
        while done < buf.len() {
            let word = splitmix64(self.seed, self.offset / 8).to_le_bytes();
            let start = (self.offset % 8) as usize;
            let n = (8 - start).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&word[start..start + n]);
            done += n;
            self.offset += n as u64;
        }
    }
}

/// Output `index` of SplitMix64 started at `seed`: well mixed, and cheap enough that generating
/// the content does not hide the cost of moving it.
fn splitmix64(seed: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0xD1B5_4A32_D192_ED03)
        .wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------------

/// Parses the arguments after the program name. `Ok(None)` means help was asked for.
fn parse_args(args: &[String]) -> Result<Option<Command>, String> {
    let (first, rest) = match args.split_first() {
        None => return Ok(Some(Command::Demo(default_load()))),
        Some(split) => split,
    };
    match first.as_str() {
        "-h" | "--help" | "help" => Ok(None),
        "server" => match rest {
            [addr] => Ok(Some(Command::Server(checked_addr(addr)?))),
            _ => Err("server takes exactly one argument, the address to listen on".into()),
        },
        "client" => match rest.split_first() {
            Some((addr, options)) if !addr.starts_with('-') => Ok(Some(Command::Client(
                checked_addr(addr)?,
                parse_load(options)?,
            ))),
            _ => Err("client needs the server's address first".into()),
        },
        option if option.starts_with("--") => Ok(Some(Command::Demo(parse_load(args)?))),
        other => Err(format!("unknown command {other:?}")),
    }
}

fn default_load() -> Load {
    Load {
        streams: DEFAULT_STREAMS,
        bytes: DEFAULT_BYTES,
    }
}

/// Parses `--streams N` and `--bytes B`, in any order.
fn parse_load(options: &[String]) -> Result<Load, String> {
    let mut load = default_load();
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let value = options
            .next()
            .ok_or_else(|| format!("{option} needs a value"))?;
        match option.as_str() {
            "--streams" => {
                load.streams =
                    value.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                        format!("--streams wants a positive integer, not {value:?}")
                    })?;
            }
            "--bytes" => {
                load.bytes = value
                    .parse()
                    .map_err(|_| format!("--bytes wants a byte count, not {value:?}"))?;
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(load)
}

/// Checks that `addr` looks like `host:port`, so a mistake is reported before any I/O. A host
/// name (not only an IP address) is fine: it is resolved when used.
fn checked_addr(addr: &str) -> Result<String, String> {
    let port_ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if port_ok || addr.parse::<SocketAddr>().is_ok() {
        Ok(addr.to_owned())
    } else {
        Err(format!("{addr:?} is not an address of the form HOST:PORT"))
    }
}
