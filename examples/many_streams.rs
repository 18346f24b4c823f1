//! Many streams on one session: what each costs, and whether the busy ones still fly.
//!
//! Both ends run in this process, over one loopback TCP connection:
//!
//! ```text
//! cargo run --release --example many_streams                       # 8192 streams, 1 KiB each
//! cargo run --release --example many_streams -- --streams 100000
//! ```
//!
//! 1. **Idle.** The client opens N streams and the server accepts them; both keep every handle
//!    and nobody writes. The resident-set growth this causes, divided by the 2 × N stream ends,
//!    is the memory one idle stream end costs, handles included. This runs first, on a heap
//!    that has not yet been through the echo, so that memory freed by the echo cannot hide the
//!    cost.
//! 2. **Bulk.** With the N idle streams still open, one stream carries `--bulk` bytes (64 MiB
//!    by default): a session's size must not slow down its active streams.
//! 3. **Echo.** Still with the idle streams open, N more streams each send `--bytes` bytes (1 KiB
//!    by default) to the server, which echoes them back; every stream checks its echo. This is
//!    the classic test of an event loop with thousands of clients.
//!
//! The last two lines are for scripts:
//!
//! ```text
//! echo: N streams x B bytes in T ms
//! idle: N streams, X bytes per stream end
//! ```
//!
//! The resident set is read from `/proc/self/statm`, so memory figures are Linux-only (elsewhere
//! they print as 0).

use std::error::Error as StdError;
use std::process;
use std::time::Instant;

use gomux::{Config, Role, Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

const USAGE: &str = "\
usage: many_streams [--streams N] [--bytes B] [--bulk BYTES]
defaults: --streams 8192 --bytes 1024 --bulk 67108864";

type BoxError = Box<dyn StdError + Send + Sync>;

struct Options {
    streams: usize,
    bytes: usize,
    bulk: u64,
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(problem) => {
            eprintln!("many_streams: {problem}\n{USAGE}");
            process::exit(2);
        }
    };
    if let Err(error) = run(options).await {
        eprintln!("many_streams: {error}");
        process::exit(1);
    }
}

async fn run(options: Options) -> Result<(), BoxError> {
    let n = options.streams;
    // Room for the idle streams and the echoing ones at once, and a backlog that lets the
    // client open them all before the server's accept loop gets to run.
    let config = Config::default()
        .max_streams(2 * n + 16)
        .accept_backlog(2 * n + 16);
    let (client, server) = connect(config).await?;

    // 1. Idle streams: measure what holding them costs.
    let before = resident_bytes();
    let accepting = {
        let server = server.clone();
        tokio::spawn(async move {
            let mut held = Vec::with_capacity(n);
            while held.len() < n {
                held.push(server.accept().await?);
            }
            Ok::<_, gomux::Error>(held)
        })
    };
    let mut opened: Vec<Stream> = Vec::with_capacity(n);
    for _ in 0..n {
        opened.push(client.open().await?);
    }
    let accepted = accepting.await??;
    // Both ends hold their N handles now; let the last frames settle before reading the size.
    settle(&client, &server, n).await;
    let idle_growth = resident_bytes().saturating_sub(before);
    let per_end = idle_growth as f64 / (2 * n) as f64;
    eprintln!(
        "idle streams open: {} on each end, resident set +{:.1} MiB",
        client.stream_count(),
        idle_growth as f64 / (1024.0 * 1024.0)
    );

    // 2. One bulk stream beside the idle ones.
    let bulk = bulk_transfer(&client, &server, options.bulk).await?;
    println!(
        "bulk: 1 stream, {} MiB beside {n} idle streams in {:.0} ms ({:.0} MiB/s)",
        options.bulk >> 20,
        bulk * 1e3,
        options.bulk as f64 / (1024.0 * 1024.0) / bulk
    );

    // 3. N streams echoing B bytes each, still beside the idle ones.
    let before = resident_bytes();
    let started = Instant::now();
    let echoed = echo_all(&client, &server, n, options.bytes).await?;
    let elapsed = started.elapsed();
    let growth = resident_bytes().saturating_sub(before);
    println!(
        "echo: resident set +{:.1} MiB during the echo, {:.0} bytes per stream",
        growth as f64 / (1024.0 * 1024.0),
        growth as f64 / n as f64
    );

    drop((opened, accepted));
    client.close().await?;
    println!(
        "echo: {echoed} streams x {} bytes in {} ms",
        options.bytes,
        elapsed.as_millis()
    );
    println!("idle: {n} streams, {per_end:.0} bytes per stream end");
    Ok(())
}

/// A client and a server session over one loopback TCP connection.
async fn connect(config: Config) -> Result<(Session, Session), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let dialing = TcpStream::connect(listener.local_addr()?);
    let (dialed, accepted) = tokio::join!(dialing, listener.accept());
    let (dialed, (accepted, _)) = (dialed?, accepted?);
    dialed.set_nodelay(true)?;
    accepted.set_nodelay(true)?;
    Ok((
        Session::with_config(dialed, Role::Client, config.clone()),
        Session::with_config(accepted, Role::Server, config),
    ))
}

/// Waits until both ends see all `n` streams and the connection has gone quiet (a round trip on
/// a fresh stream), so that the memory reading includes everything the opens cost.
async fn settle(client: &Session, server: &Session, n: usize) {
    let ping = async {
        let mut stream = client.open().await?;
        stream.shutdown().await?;
        stream.read_to_end(&mut Vec::new()).await?;
        Ok::<_, BoxError>(())
    };
    let pong = async {
        let mut stream = server.accept().await?;
        stream.read_to_end(&mut Vec::new()).await?;
        stream.shutdown().await?;
        Ok::<_, BoxError>(())
    };
    let _ = tokio::join!(ping, pong);
    debug_assert!(client.stream_count() >= n && server.stream_count() >= n);
}

/// Sends `bytes` on one new stream to a server task that counts them; returns the seconds taken.
async fn bulk_transfer(client: &Session, server: &Session, bytes: u64) -> Result<f64, BoxError> {
    let receiving = {
        let server = server.clone();
        tokio::spawn(async move {
            let mut stream = server.accept().await?;
            let mut buf = vec![0; 256 * 1024];
            let mut total = 0u64;
            loop {
                match stream.read(&mut buf).await? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            Ok::<_, BoxError>(total)
        })
    };
    let started = Instant::now();
    let mut stream = client.open().await?;
    let chunk = vec![0x5a; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        stream.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    stream.shutdown().await?;
    let received = receiving.await??;
    if received != bytes {
        return Err(format!("bulk stream delivered {received} of {bytes} bytes").into());
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Opens `n` streams that each send `bytes` bytes and read them back from a server that echoes
/// every stream it accepts. Returns how many echoed correctly (all, or an error).
async fn echo_all(
    client: &Session,
    server: &Session,
    n: usize,
    bytes: usize,
) -> Result<usize, BoxError> {
    let serving = {
        let server = server.clone();
        tokio::spawn(async move {
            let mut echoes = JoinSet::new();
            for _ in 0..n {
                let mut stream = server.accept().await?;
                // Zero-copy echo: each received chunk goes back out as it is, so an echoing
                // stream needs no buffer of its own.
                echoes.spawn(async move {
                    while let Some(chunk) = stream.read_chunk(usize::MAX).await? {
                        stream.write_chunk(chunk).await?;
                    }
                    stream.shutdown().await?;
                    Ok::<_, BoxError>(())
                });
            }
            while let Some(done) = echoes.join_next().await {
                done??;
            }
            Ok::<_, BoxError>(())
        })
    };

    let mut clients = JoinSet::new();
    for i in 0..n {
        let client = client.clone();
        clients.spawn(async move {
            // Each stream sends a different pattern, so a mix-up between streams shows.
            let message: Vec<u8> = (0..bytes).map(|j| (i + j * 7) as u8).collect();
            let mut stream = client.open().await?;
            stream.write_all(&message).await?;
            stream.shutdown().await?;
            let mut echo = Vec::with_capacity(bytes);
            stream.read_to_end(&mut echo).await?;
            if echo != message {
                return Err(BoxError::from(format!(
                    "stream {} echoed wrong bytes",
                    stream.id()
                )));
            }
            Ok(())
        });
    }
    let mut echoed = 0;
    while let Some(done) = clients.join_next().await {
        done??;
        echoed += 1;
    }
    serving.await??;
    Ok(echoed)
}

/// The process's resident set in bytes (Linux), or 0 where it cannot be read.
fn resident_bytes() -> u64 {
    const PAGE: u64 = 4096;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * PAGE)
}

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let mut options = Options {
        streams: 8192,
        bytes: 1024,
        bulk: 64 << 20,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: not a number: {value}"))?;
        match flag.as_str() {
            "--streams" if number > 0 => options.streams = number as usize,
            "--bytes" => options.bytes = number as usize,
            "--bulk" => options.bulk = number,
            "--streams" => return Err("--streams must be at least 1".into()),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(Some(options))
}
