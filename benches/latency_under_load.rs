//! Latency under load over an emulated link: a 64-byte ping every 10 ms on one stream, echoed,
//! while another stream of the same session sends bulk data in 64 KiB writes as fast as it can.
//!
//! ```text
//! cargo bench --features tcp --bench latency_under_load -- [--quick] [--seconds S]
//!     [--modes gomux,tcp,go,yamux] [--links 100/10,20/20] [--relays queue,reads]
//!     [--lowat off,conf]
//! ```
//!
//! Every run goes through a userspace relay of this process (`support/link.rs`) that emulates
//! a bottleneck shared by every connection through it: a serial line of R Mbit/s each way and a
//! one-way delay. The links are given as `R/D` (Mbit/s and milliseconds each way); the defaults
//! are 100 Mbit/s with 10 ms and 20 Mbit/s with 20 ms. `--relays` lists the ways the relay takes
//! bytes from its connections, each link run with each:
//!
//! - `queue`: a 16 KiB queue in front of the line, read into only while it has room, 8 KiB
//!   receive buffers on the relay's sockets;
//! - `reads`: a relay as an application would write one: 16 KiB receive buffers, reads of up
//!   to 16 KiB handed to the line one at a time per connection, no queue but the line.
//!
//! Modes, each on its own connection(s) through a fresh relay:
//!
//! - `idle`: the pings alone, on a plain TCP connection: the floor (always run first);
//! - `gomux`: one gomux session over one TCP connection, set up as the README shows
//!   (`Session::client`/`Session::server`, default configuration, Nagle off);
//! - `tcp`: two plain TCP connections, one for the pings and one for the bulk;
//! - `go`: Go gomux, `gomux-go-peer bench loaded` (tests/interop/go) as client and server;
//! - `yamux`: yamux 0.13 over one TCP connection, the benches' configuration.
//!
//! `--lowat` lists the settings of the client's sockets (the sender of the bulk) to run each
//! mode with, the same for every mode: `off` (Nagle off only; the kernel's default for
//! `TCP_NOTSENT_LOWAT`: as many unsent bytes as the send buffer holds), `conf`
//! (`gomux::tcp::configure`: Nagle off and `TCP_NOTSENT_LOWAT` at `gomux::tcp::NOTSENT_LOWAT`)
//! or a size (Nagle off and `TCP_NOTSENT_LOWAT` at that size, set with
//! `gomux::tcp::set_notsent_lowat`, or the Go peer's `-notsent-lowat`). The default is
//! `off,conf`. The `idle` row runs once per link and relay, with `off`.
//!
//! Each row sends bulk for a warm-up second (half a second with `--quick`), then pings for `S`
//! seconds (default 10, 3 with `--quick`), then waits for the last echo. It prints the pings'
//! round-trip p50 and p99 (nearest rank) and the bulk rate the receiver saw over the window
//! (from the receiver's byte count, which the server writes into every echo). Rows go to
//! stdout, whitespace-separated after a `#` header; progress goes to stderr. After each link
//! and relay, a `# ratio` line per multiplexer and setting sets its p50, p99 and bulk rate
//! beside those of `tcp` with the same setting, from the same run.
//!
//! The wire of the measurement is the same in every mode (see `bench_loaded.go`): each stream
//! starts with a byte, `p` or `b`; a ping is 64 bytes, its first 8 the client's send time, and
//! the server writes its bulk byte count into the next 8 before echoing it.
//!
//! Run without `--bench` (as `cargo test --benches` does), it makes a short check of every mode
//! on the first link, through each relay, instead, and says so. The `go` mode is skipped, with the reason, when the Go
//! peer cannot be built (a failure under `GOMUX_REQUIRE_GO=1`).

#[path = "../tests/interop/go_peer.rs"]
mod go_peer;
#[path = "support/link.rs"]
mod link;
mod support;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gomux::{Role, Session};
use support::{Connector, Io};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use link::{Link, Shape};

/// Bytes of every ping and of its echo.
const PING: usize = 64;
/// Time between pings.
const INTERVAL: Duration = Duration::from_millis(10);
/// Size of each bulk write.
const BULK_WRITE: usize = 64 * 1024;
/// Bytes of the queue in front of the emulated line.
const QUEUE: usize = 16 * 1024;
/// How long the client waits, after the window, for the last echoes.
const ECHO_WAIT: Duration = Duration::from_secs(10);

const USAGE: &str = "\
usage: latency_under_load [--quick] [--seconds S] [--modes LIST] [--links LIST] [--relays LIST]
    [--lowat LIST]
  --modes: among gomux, tcp, go, yamux (default all four)
  --links: R/D pairs, Mbit/s and ms each way (default 100/10,20/20)
  --relays: among queue, reads (default both)
  --lowat: the client's socket settings: off, conf (gomux::tcp::configure) or a
           TCP_NOTSENT_LOWAT size like 16K (default off,conf)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Idle,
    Gomux,
    Tcp,
    Go,
    Yamux,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Idle => "idle",
            Mode::Gomux => "gomux",
            Mode::Tcp => "tcp",
            Mode::Go => "go",
            Mode::Yamux => "yamux",
        }
    }
}

/// The client's socket settings, beside Nagle off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lowat {
    /// The kernel's default `TCP_NOTSENT_LOWAT`.
    Off,
    /// `gomux::tcp::configure`.
    Configure,
    /// `TCP_NOTSENT_LOWAT` at this many bytes.
    Bytes(u32),
}

impl Lowat {
    fn label(self) -> String {
        match self {
            Lowat::Off => "off".into(),
            Lowat::Configure => "conf".into(),
            Lowat::Bytes(bytes) => bytes.to_string(),
        }
    }

    /// The bytes of `TCP_NOTSENT_LOWAT` it sets, if any.
    fn bytes(self) -> Option<u32> {
        match self {
            Lowat::Off => None,
            Lowat::Configure => Some(gomux::tcp::NOTSENT_LOWAT),
            Lowat::Bytes(bytes) => Some(bytes),
        }
    }
}

fn shape_name(shape: Shape) -> &'static str {
    match shape {
        Shape::Queue => "queue",
        Shape::Reads => "reads",
    }
}

struct Options {
    modes: Vec<Mode>,
    links: Vec<(u64, u64)>,
    relays: Vec<Shape>,
    lowats: Vec<Lowat>,
    window: Duration,
    warmup: Duration,
}

/// What one row measured.
struct Outcome {
    pings: usize,
    p50: Duration,
    p99: Duration,
    /// MiB/s; `None` for the idle row.
    bulk: Option<f64>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("latency_under_load: {message}\n{USAGE}");
            process::exit(2);
        }
    };
    let go = if options.modes.contains(&Mode::Go) {
        match go_peer::build() {
            Ok(binary) => Some(binary),
            Err(reason) if go_peer::required() => {
                eprintln!("latency_under_load: the Go peer is required: {reason}");
                process::exit(1);
            }
            Err(reason) => {
                println!("# go: skipped: {reason}");
                None
            }
        }
    } else {
        None
    };
    println!(
        "# gomux::tcp::NOTSENT_LOWAT = {} (lowat conf)",
        gomux::tcp::NOTSENT_LOWAT
    );
    println!("# link       relay mode    lowat   pings   p50_ms   p99_ms  bulk_MiB/s");
    let mut failed = false;
    for &(mbit, delay_ms) in &options.links {
        for &shape in &options.relays {
            let link = Link::new(mbit, delay_ms, QUEUE).shaped(shape);
            let label = format!("{mbit}M/{delay_ms}ms");
            let relay = shape_name(shape);
            let mut rows = vec![(Mode::Idle, Lowat::Off)];
            for &mode in &options.modes {
                if mode == Mode::Go && go.is_none() {
                    continue;
                }
                rows.extend(options.lowats.iter().map(|&lowat| (mode, lowat)));
            }
            let mut outcomes = Vec::new();
            for (mode, lowat) in rows {
                let lowat_label = lowat.label();
                eprintln!("{label} {relay} {} lowat {lowat_label}...", mode.name());
                let result = match (mode, &go) {
                    (Mode::Go, Some(binary)) => run_go(binary, link, lowat, &options),
                    _ => run_rust(mode, link, lowat, &options),
                };
                match result {
                    Ok(outcome) => {
                        println!(
                            "{label:<12} {relay:<5} {:<7} {lowat_label:>5} {:>7} {:>8.1} {:>8.1} {:>11}",
                            mode.name(),
                            outcome.pings,
                            millis(outcome.p50),
                            millis(outcome.p99),
                            outcome
                                .bulk
                                .map_or("-".to_string(), |rate| format!("{rate:.2}")),
                        );
                        outcomes.push((mode, lowat, outcome));
                    }
                    Err(error) => {
                        failed = true;
                        println!(
                            "# {label} {relay} {} lowat {lowat_label}: failed: {error}",
                            mode.name()
                        );
                    }
                }
            }
            print_ratios(&label, relay, &outcomes);
        }
    }
    if failed {
        process::exit(1);
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Each multiplexer's row beside the `tcp` row of the same setting: p50, p99 and bulk rate as
/// ratios to those of `tcp`.
fn print_ratios(label: &str, relay: &str, outcomes: &[(Mode, Lowat, Outcome)]) {
    for (mode, lowat, outcome) in outcomes {
        if matches!(mode, Mode::Idle | Mode::Tcp) {
            continue;
        }
        let Some((_, _, tcp)) = outcomes
            .iter()
            .find(|(other, setting, _)| *other == Mode::Tcp && setting == lowat)
        else {
            continue;
        };
        let ratio = |ours: Duration, theirs: Duration| ours.as_secs_f64() / theirs.as_secs_f64();
        let bulk = match (outcome.bulk, tcp.bulk) {
            (Some(ours), Some(theirs)) if theirs > 0.0 => format!("{:.3}", ours / theirs),
            _ => "-".to_string(),
        };
        println!(
            "# ratio {label} {relay} {}/tcp lowat {}: p50 {:.3} p99 {:.3} bulk {bulk}",
            mode.name(),
            lowat.label(),
            ratio(outcome.p50, tcp.p50),
            ratio(outcome.p99, tcp.p99),
        );
    }
}

fn parse(args: &[String]) -> Result<Options, String> {
    // `cargo bench` passes --bench; without it this is a quick check under `cargo test`.
    let measuring = args.iter().any(|arg| arg == "--bench");
    let mut options = Options {
        modes: vec![Mode::Gomux, Mode::Tcp, Mode::Go, Mode::Yamux],
        links: vec![(100, 10), (20, 20)],
        relays: vec![Shape::Queue, Shape::Reads],
        lowats: vec![Lowat::Off, Lowat::Configure],
        window: Duration::from_secs(10),
        warmup: Duration::from_secs(1),
    };
    if !measuring {
        println!(
            "# a short check of every mode on the first link, through each relay \
             (run with --bench to measure)"
        );
        options.links.truncate(1);
        options.window = Duration::from_secs(1);
        options.warmup = Duration::from_millis(200);
    }
    let mut seconds = None;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--bench" => continue,
            "--quick" => {
                options.window = Duration::from_secs(3);
                options.warmup = Duration::from_millis(500);
                continue;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                process::exit(0);
            }
            _ => {}
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seconds" => {
                let s: f64 = value
                    .parse()
                    .map_err(|_| format!("bad --seconds {value}"))?;
                if !(s > 0.0 && s < 3600.0) {
                    return Err(format!("--seconds must be between 0 and 3600, not {value}"));
                }
                seconds = Some(Duration::from_secs_f64(s));
            }
            "--modes" => {
                options.modes = value
                    .split(',')
                    .map(|name| match name {
                        "gomux" => Ok(Mode::Gomux),
                        "tcp" => Ok(Mode::Tcp),
                        "go" => Ok(Mode::Go),
                        "yamux" => Ok(Mode::Yamux),
                        _ => Err(format!("unknown mode {name}")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--links" => {
                options.links = value
                    .split(',')
                    .map(|pair| {
                        let (rate, delay) =
                            pair.split_once('/').ok_or(format!("bad link {pair}"))?;
                        match (rate.parse(), delay.parse()) {
                            (Ok(rate), Ok(delay)) if rate > 0 => Ok((rate, delay)),
                            _ => Err(format!("bad link {pair}")),
                        }
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--relays" => {
                options.relays = value
                    .split(',')
                    .map(|name| match name {
                        "queue" => Ok(Shape::Queue),
                        "reads" => Ok(Shape::Reads),
                        _ => Err(format!("unknown relay {name}")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--lowat" => {
                options.lowats = value
                    .split(',')
                    .map(|setting| match setting {
                        "off" => Ok(Lowat::Off),
                        "conf" => Ok(Lowat::Configure),
                        size => parse_size(size).map(Lowat::Bytes),
                    })
                    .collect::<Result<_, _>>()?;
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if let Some(seconds) = seconds {
        options.window = seconds;
    }
    Ok(options)
}

fn parse_size(text: &str) -> Result<u32, String> {
    let (digits, unit) = match text.strip_suffix(['K', 'k']) {
        Some(digits) => (digits, 1024),
        None => (text, 1),
    };
    digits
        .parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|&n| n > 0)
        .ok_or(format!("bad size {text}"))
}

// ---------------------------------------------------------------------------------------------
// The Rust modes

/// One row of a Rust mode: the server on a loopback port, the relay in front of it, the client
/// through the relay; all of it on a runtime of the row's own, dropped at the end with every
/// task on it.
fn run_rust(mode: Mode, link: Link, lowat: Lowat, options: &Options) -> io::Result<Outcome> {
    let rt = support::runtime();
    let (window, warmup) = (options.window, options.warmup);
    rt.block_on(async move {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let relay = link.relay(listener.local_addr()?)?;
        let received = Arc::new(AtomicU64::new(0));
        let dial = || dial(relay.addr(), lowat);
        let outcome = match mode {
            Mode::Idle | Mode::Tcp => {
                let server_received = Arc::clone(&received);
                tokio::spawn(async move {
                    while let Ok((socket, _)) = listener.accept().await {
                        let _ = socket.set_nodelay(true);
                        tokio::spawn(serve(socket, Arc::clone(&server_received)));
                    }
                });
                let ping = dial().await?;
                let bulk = if mode == Mode::Tcp {
                    Some(dial().await?)
                } else {
                    None
                };
                measure(ping, bulk, window, warmup).await?
            }
            Mode::Gomux => {
                let client = Session::client(dial().await?);
                let (server, _) = listener.accept().await?;
                server.set_nodelay(true)?;
                let server = Session::with_config(server, Role::Server, Default::default());
                let _serving = tokio::spawn(serve_all(server, Arc::clone(&received)));
                let bulk = client.open().await?;
                let ping = client.open().await?;
                measure(ping, Some(bulk), window, warmup).await?
            }
            Mode::Yamux => {
                let config = support::yamux_config();
                let client = support::Yamux::new(dial().await?, config, yamux::Mode::Client);
                let (server, _) = listener.accept().await?;
                server.set_nodelay(true)?;
                let server =
                    support::Yamux::new(server, support::yamux_config(), yamux::Mode::Server);
                let _serving = tokio::spawn(serve_all(server, Arc::clone(&received)));
                let bulk = client.open().await?;
                let ping = client.open().await?;
                measure(ping, Some(bulk), window, warmup).await?
            }
            Mode::Go => unreachable!("the go mode runs in run_go"),
        };
        drop(relay);
        Ok(outcome)
    })
}

/// A client connection through the relay, Nagle off, with `TCP_NOTSENT_LOWAT` as `lowat` says:
/// the same in every mode.
async fn dial(relay: SocketAddr, lowat: Lowat) -> io::Result<TcpStream> {
    let socket = TcpStream::connect(relay).await?;
    match lowat {
        Lowat::Off => socket.set_nodelay(true)?,
        Lowat::Configure => gomux::tcp::configure(&socket)?,
        Lowat::Bytes(bytes) => {
            socket.set_nodelay(true)?;
            gomux::tcp::set_notsent_lowat(&socket, bytes)?;
        }
    }
    Ok(socket)
}

/// Serves every stream a multiplexer's client opens.
async fn serve_all<C: Connector>(server: C, received: Arc<AtomicU64>) {
    while let Ok(stream) = server.accept().await {
        tokio::spawn(serve(stream, Arc::clone(&received)));
    }
}

/// The server's side of one stream: echoes pings with the bulk count written in, or counts bulk.
async fn serve<I: Io>(mut io: I, received: Arc<AtomicU64>) -> io::Result<()> {
    let mut tag = [0; 1];
    io.read_exact(&mut tag).await?;
    if tag[0] == b'p' {
        let mut ping = [0; PING];
        loop {
            io.read_exact(&mut ping).await?;
            ping[8..16].copy_from_slice(&received.load(Ordering::Relaxed).to_le_bytes());
            io.write_all(&ping).await?;
        }
    }
    let mut buf = vec![0; BULK_WRITE];
    loop {
        let n = io.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        received.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The client's side: bulk on `bulk` (if any) from the start, then after `warmup` a ping every
/// [`INTERVAL`] for `window` on `ping`, and the echoes of all of them.
async fn measure<I: Io>(
    mut ping: I,
    bulk: Option<I>,
    window: Duration,
    warmup: Duration,
) -> io::Result<Outcome> {
    let start = Instant::now();
    let loaded = bulk.is_some();
    let bulk_task = bulk.map(|mut bulk| {
        tokio::spawn(async move {
            let mut chunk = vec![0; BULK_WRITE];
            chunk[0] = b'b';
            // Until the row ends and the task is aborted, or the connection goes.
            while bulk.write_all(&chunk).await.is_ok() {
                chunk[0] = 0;
            }
        })
    });
    ping.write_all(b"p").await?;
    tokio::time::sleep(warmup).await;

    let (mut reader, mut writer) = tokio::io::split(ping);
    let (arrived, mut arrivals) = mpsc::unbounded_channel();
    let reading = tokio::spawn(async move {
        let mut echo = [0; PING];
        loop {
            reader.read_exact(&mut echo).await?;
            let now = start.elapsed();
            let sent = Duration::from_nanos(le_u64(&echo, 0));
            let count = le_u64(&echo, 8);
            if arrived
                .send((now.saturating_sub(sent), now, count))
                .is_err()
            {
                return io::Result::Ok(());
            }
        }
    });
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let end = Instant::now() + window;
    let mut sent = 0;
    let mut message = [0; PING];
    while ticks.tick().await < end {
        let stamp = start.elapsed().as_nanos() as u64;
        message[..8].copy_from_slice(&stamp.to_le_bytes());
        writer.write_all(&message).await?;
        sent += 1;
    }
    let mut echoes = Vec::with_capacity(sent);
    let deadline = Instant::now() + ECHO_WAIT;
    while echoes.len() < sent {
        match tokio::time::timeout_at(deadline, arrivals.recv()).await {
            Ok(Some(echo)) => echoes.push(echo),
            Ok(None) => {
                let error = reading.await.map_err(io::Error::other)?.err();
                return Err(error.unwrap_or_else(|| io::Error::other("the echoes ended")));
            }
            Err(_) => {
                return Err(io::Error::other(format!(
                    "{} of {sent} echoes missing after {ECHO_WAIT:?}",
                    sent - echoes.len()
                )))
            }
        }
    }
    reading.abort();
    if let Some(task) = bulk_task {
        task.abort();
    }
    if echoes.len() < 2 {
        return Err(io::Error::other("fewer than two pings in the window"));
    }
    let (_, first_at, first_count) = echoes[0];
    let (_, last_at, last_count) = echoes[echoes.len() - 1];
    let bulk = loaded.then(|| {
        last_count.saturating_sub(first_count) as f64
            / (last_at - first_at).as_secs_f64()
            / (1 << 20) as f64
    });
    let mut rtts: Vec<Duration> = echoes.iter().map(|&(rtt, _, _)| rtt).collect();
    rtts.sort_unstable();
    Ok(Outcome {
        pings: rtts.len(),
        p50: percentile(&rtts, 50),
        p99: percentile(&rtts, 99),
        bulk,
    })
}

/// The little-endian `u64` at `at` in `message`.
fn le_u64(message: &[u8; PING], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&message[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// The nearest-rank percentile `p` of `sorted`, not empty.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

// ---------------------------------------------------------------------------------------------
// Go gomux

/// One row of Go gomux: `gomux-go-peer bench loaded` as server on a loopback port, the relay in
/// front of it, and as client through the relay.
fn run_go(
    binary: &std::path::Path,
    link: Link,
    lowat: Lowat,
    options: &Options,
) -> io::Result<Outcome> {
    let fail = |what: &str, error: String| io::Error::other(format!("{what}: {error}"));
    let mut server = go_peer::GoPeer::spawn(
        binary,
        &["bench", "loaded", "-listen", "127.0.0.1:0"].map(String::from),
    )?;
    let target = server
        .listening(Duration::from_secs(10))
        .map_err(|e| fail("the Go server", e))?;
    let relay = link.relay(target)?;
    let mut args = vec![
        "bench".to_string(),
        "loaded".into(),
        "-connect".into(),
        relay.addr().to_string(),
        "-seconds".into(),
        options.window.as_secs_f64().to_string(),
        "-warmup".into(),
        options.warmup.as_secs_f64().to_string(),
    ];
    if let Some(bytes) = lowat.bytes() {
        args.extend(["-notsent-lowat".to_string(), bytes.to_string()]);
    }
    let mut client = go_peer::GoPeer::spawn(binary, &args)?;
    let limit = options.window + options.warmup + ECHO_WAIT + Duration::from_secs(10);
    let line = client.wait_line("loaded: ", limit);
    let exit = client.finish(Duration::from_secs(5));
    drop(relay);
    let _ = server.finish(Duration::from_secs(5));
    let line = line.map_err(|e| fail("the Go client", format!("{e}; {}", exit.stderr())))?;
    let field = |name: &str| -> io::Result<f64> {
        line.split_whitespace()
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .ok_or_else(|| fail("the Go client's line", format!("no {name} in {line}")))
    };
    Ok(Outcome {
        pings: field("pings")? as usize,
        p50: Duration::from_micros(field("p50_us")? as u64),
        p99: Duration::from_micros(field("p99_us")? as u64),
        bulk: Some(field("bulk_mib_s")?),
    })
}
