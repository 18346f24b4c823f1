//! Transport speed: how fast bytes go through gomux, yamux, Go gomux, raw loopback TCP and
//! in-memory pipes, each doing the same work, so the rows can be compared with each other.
//!
//! ```text
//! cargo run --release --example speed -- [--mode MODE] [--bytes N | --file PATH]
//!                                        [--streams K] [--chunk C] [--no-verify] [--digest]
//! ```
//!
//! - `--mode`: `tcp` (raw loopback TCP), `mux-tcp` (gomux over one loopback TCP connection),
//!   `mux-tcp-zc` (the same through the zero-copy stream API), `memory` (raw
//!   `tokio::io::duplex` pipes), `mux-memory` (gomux over one such pipe), `yamux-tcp` (yamux
//!   over one loopback TCP connection), `go` (Go gomux, see below), or `all` (the default: each
//!   of them in that order, `tcp` first since ratios are relative to it).
//! - `--bytes N`: how much to send per mode, default `1G`; sizes take the binary suffixes `K`,
//!   `M`, `G` and `T` (`64K`, `512M`, `1GiB`). Or `--file PATH`: send that file's content,
//!   read into memory first so the disk is not what is measured.
//! - `--streams K`: split the bytes evenly over K streams sent at once, default 1. For the raw
//!   modes each stream is its own TCP connection or pipe.
//! - `--chunk C`: size of every write, default `64K`. The receiver reads into a 64 KiB buffer.
//!   The `tcp` mode is the exception on both counts: it writes and reads at least 1 MiB at a time
//!   (see below).
//! - `--no-verify`: both ends only count the bytes, as `iperf3` does, instead of hashing them.
//!   Hashing costs each end a few tenths of a core at these rates, so the rows compared with the
//!   transport's limit are measured this way. The `go` mode always hashes.
//! - `--notsent-lowat N`: set `TCP_NOTSENT_LOWAT` to N bytes on both sockets of the `mux-tcp`
//!   mode (`gomux::tcp::set_notsent_lowat`; needs `--features tcp`), to see what it costs the
//!   throughput over loopback. Other modes ignore it.
//! - `--digest`: send nothing; print the digest of what would be sent (the line the Go peer's
//!   `bench digest` prints for the same options, so the two implementations of the content and
//!   checksum can be compared) and exit.
//!
//! Generated content is one pseudo-random 1 MiB block, made once and cut into every write at a
//! moving offset that differs per stream. Both ends hash what goes through each stream (a 64-bit
//! multiply hash over 8-byte words, eight lanes at a time, so it is cheap next to the transfer);
//! a stream whose hash or length differs fails the run with exit status 1. Every mode does
//! exactly the same work, on a tokio runtime with a worker per core (the `tcp` mode on one
//! thread, see below); the time counts from the
//! first stream's open to the last byte read, not the setup of the connection.
//!
//! While a mode runs, stderr shows a line with the MiB received so far and the rate. Then stdout
//! gets one row per mode, whitespace-separated, after a `#` header line:
//!
//! ```text
//! # mode        streams         bytes   seconds       MiB/s   ratio
//! tcp                 1    1073741824     0.412      2485.4    1.00
//! ```
//!
//! `ratio` is the row's MiB/s divided by that of `tcp` in the same run, or `-` when `tcp` was not
//! run. Exit status 2 means the command line was wrong.
//!
//! # The `tcp` mode: the transport's limit
//!
//! Raw TCP writes pieces of at least 1 MiB (`--chunk`, if larger) and reads into a buffer as
//! large, so it costs the fewest system calls, and runs both ends on one thread
//! (`support::limit_runtime`), so that the bytes are copied into the kernel and out of it in
//! one core's cache: the most one connection moved of what was tried (see
//! `benches/support/mod.rs`). A multiplexer running over one such connection cannot do
//! better; against raw TCP read 64 KiB at a time, or spread over two threads, it could, which
//! would flatter it. `iperf3 -l 1M`, which `scripts/benchmarks.sh` runs beside it, is the
//! two-thread figure.
//!
//! # The `go` mode
//!
//! The same transfer between two processes of the Go peer (`tests/interop/go`, built against
//! the unmodified Go gomux beside the clone in `../shared/gomux-go`): `gomux-go-peer bench
//! receive` listens on loopback, `gomux-go-peer bench send` connects, opens the streams and sends
//! the same content with the same `--bytes`/`--file`, `--streams` and `--chunk`, hashing it with
//! the same checksum (ported to Go bit for bit). The receiver prints its time (from the first
//! stream it accepts to the last byte it reads) and a digest of all streams; the run fails unless
//! the sender's digest equals the one this tool computes for the content and the receiver's
//! equals the sender's. Each Go process has the Go runtime's default of one thread per core;
//! the Rust modes run both ends in this process.
//!
//! Where Go or the Go gomux source is missing, the `go` row is replaced by a `# go: skipped`
//! line that says why, and the other modes run; with `GOMUX_REQUIRE_GO=1` in the environment
//! that is a failure (exit status 1) instead.

#[path = "../tests/interop/go_peer.rs"]
mod go_peer;
#[path = "../benches/support/mod.rs"]
mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use go_peer::GoPeer;
use gomux::Config;
use support::{Connector, Count, Digest, Payload};

const USAGE: &str = "\
usage: speed [--mode MODE] [--bytes N | --file PATH] [--streams K] [--chunk C] [--no-verify]
             [--digest] [--notsent-lowat N]
  MODE: tcp, mux-tcp, mux-tcp-zc, memory, mux-memory, yamux-tcp, go or all (default all)
  N, C: sizes like 4096, 64K, 512M, 1G (defaults: --bytes 1G, --chunk 64K)
  K: streams sent at once (default 1)
  --no-verify: count the bytes only, instead of hashing them at both ends
  --digest: print the digest of the content instead of sending it
  --notsent-lowat N: TCP_NOTSENT_LOWAT on the mux-tcp mode's sockets (needs --features tcp)
  go: Go gomux between two Go processes; skipped when Go or ../shared/gomux-go is
      missing, a failure then if GOMUX_REQUIRE_GO=1";

const MIB: f64 = 1024.0 * 1024.0;

/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tcp,
    MuxTcp,
    /// gomux over TCP through the zero-copy stream API (`write_chunk`, `read_chunk`).
    MuxTcpZeroCopy,
    Memory,
    MuxMemory,
    YamuxTcp,
    /// Go gomux, sender and receiver in two Go processes over loopback TCP.
    Go,
}

impl Mode {
    /// Every mode, in the order `all` runs them.
    const ALL: [Mode; 7] = [
        Mode::Tcp,
        Mode::MuxTcp,
        Mode::MuxTcpZeroCopy,
        Mode::Memory,
        Mode::MuxMemory,
        Mode::YamuxTcp,
        Mode::Go,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::MuxTcp => "mux-tcp",
            Mode::MuxTcpZeroCopy => "mux-tcp-zc",
            Mode::Memory => "memory",
            Mode::MuxMemory => "mux-memory",
            Mode::YamuxTcp => "yamux-tcp",
            Mode::Go => "go",
        }
    }
}

/// What to send.
enum Source {
    Generated(u64),
    File(String),
}

/// What the command line asked for.
struct Options {
    modes: Vec<Mode>,
    source: Source,
    streams: usize,
    chunk: usize,
    /// Print the content's digest instead of measuring.
    digest: bool,
    /// Hash what goes through each stream at both ends (otherwise only count it).
    verify: bool,
    /// `TCP_NOTSENT_LOWAT` for the `mux-tcp` mode's sockets.
    notsent_lowat: Option<u32>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = parse_args(&args).unwrap_or_else(|problem| {
        eprintln!("speed: {problem}\n{USAGE}");
        process::exit(2)
    });
    let Some(options) = parsed else {
        println!("{USAGE}");
        return;
    };
    let payload = match &options.source {
        Source::Generated(bytes) => Payload::generated(*bytes, options.chunk),
        Source::File(path) => match std::fs::read(path) {
            Ok(content) => Payload::from_bytes(content, options.chunk),
            Err(error) => {
                eprintln!("speed: cannot read {path}: {error}");
                process::exit(2);
            }
        },
    };
    if options.digest {
        println!(
            "digest streams={} bytes={} digest={:016x}",
            options.streams,
            payload.total(),
            combine(payload.stream_digests::<Checksum>(options.streams))
        );
        return;
    }
    // The limit's content is the same, cut into larger writes.
    let tcp_payload = Arc::new(payload.rechunked(options.chunk.max(support::BULK)));
    let payload = Arc::new(payload);
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    // Built before anything is measured, so that the build does not share the cores with a
    // measurement.
    let go_peer = if options.modes.contains(&Mode::Go) {
        prepare_go()
    } else {
        Err("not asked for".to_string())
    };

    println!(
        "# {:<11} {:>7} {:>13} {:>9} {:>11} {:>7}",
        "mode", "streams", "bytes", "seconds", "MiB/s", "ratio"
    );
    let mut tcp_rate = None;
    for &mode in &options.modes {
        let outcome = if mode == Mode::Go {
            match &go_peer {
                Ok(binary) => run_go(binary, &options, &payload),
                Err(reason) => {
                    println!("# go: skipped: {reason}");
                    continue;
                }
            }
        } else {
            let payload = if mode == Mode::Tcp {
                &tcp_payload
            } else {
                &payload
            };
            let run = Run {
                payload: Arc::clone(payload),
                streams: options.streams,
                verify: options.verify,
                progress: Arc::default(),
                notsent_lowat: options.notsent_lowat,
            };
            let run = run.measure(mode);
            let outcome = if mode == Mode::Tcp {
                support::run_on(&support::limit_runtime(), run)
            } else {
                support::run_on(&rt, run)
            };
            outcome.map_err(|error| error.to_string())
        };
        let elapsed = match outcome {
            Ok(elapsed) => elapsed,
            Err(error) => {
                eprintln!("speed: {}: {error}", mode.name());
                process::exit(1);
            }
        };
        let seconds = elapsed.as_secs_f64();
        let rate = payload.total() as f64 / MIB / seconds;
        if mode == Mode::Tcp {
            tcp_rate = Some(rate);
        }
        let ratio = tcp_rate.map_or_else(|| "-".to_string(), |tcp| format!("{:.2}", rate / tcp));
        println!(
            "{:<13} {:>7} {:>13} {:>9.3} {:>11.1} {:>7}",
            mode.name(),
            options.streams,
            payload.total(),
            seconds,
            rate,
            ratio
        );
    }
}

/// One mode's transfer, whatever its transport.
struct Run {
    payload: Arc<Payload>,
    streams: usize,
    /// Hash the content at both ends, or only count it.
    verify: bool,
    /// Bytes received so far, for the progress line.
    progress: Arc<AtomicU64>,
    /// `TCP_NOTSENT_LOWAT` for the `mux-tcp` mode's sockets.
    notsent_lowat: Option<u32>,
}

impl Run {
    /// Sets up `mode`'s transport, then sends the payload through it while a progress line runs.
    async fn measure(self, mode: Mode) -> std::io::Result<Duration> {
        let ticker = tokio::spawn(show_progress(
            mode.name(),
            self.payload.total(),
            Arc::clone(&self.progress),
        ));
        let outcome = match mode {
            Mode::Tcp => self.on(support::Tcp::bind().await?).await,
            Mode::MuxTcp => {
                let (client, server) = support::tcp_pair().await?;
                if let Some(bytes) = self.notsent_lowat {
                    set_notsent_lowat(&client, bytes)?;
                    set_notsent_lowat(&server, bytes)?;
                }
                self.on(support::gomux_over(client, server, Config::default()))
                    .await
            }
            Mode::MuxTcpZeroCopy => {
                let pair = support::gomux_tcp(Config::default()).await?;
                self.on(support::ZeroCopyPair(pair)).await
            }
            Mode::Memory => self.on(support::Memory::default()).await,
            Mode::MuxMemory => self.on(support::gomux_duplex(Config::default())).await,
            Mode::YamuxTcp => self.on(support::yamux_tcp().await?).await,
            Mode::Go => unreachable!("the go mode runs in Go processes, see run_go"),
        };
        ticker.abort();
        // Clear the progress line before the row goes to stdout.
        eprint!("\r{:78}\r", "");
        outcome
    }

    async fn on<C: Connector>(self, connector: C) -> std::io::Result<Duration> {
        let connector = Arc::new(connector);
        let start = Instant::now();
        if self.verify {
            support::transfer::<C, Checksum>(connector, self.payload, self.streams, self.progress)
                .await?;
        } else {
            support::transfer::<C, Count>(connector, self.payload, self.streams, self.progress)
                .await?;
        }
        Ok(start.elapsed())
    }
}

/// Redraws a line on stderr with what `received` counts, until aborted.
async fn show_progress(name: &str, total: u64, received: Arc<AtomicU64>) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        draw_progress(
            name,
            received.load(Ordering::Relaxed),
            total,
            start.elapsed(),
        );
    }
}

/// Redraws the progress line on stderr.
fn draw_progress(name: &str, received: u64, total: u64, elapsed: Duration) {
    let done = received as f64 / MIB;
    let rate = done / elapsed.as_secs_f64();
    eprint!(
        "\r{name:<11} {done:>10.1} of {:.1} MiB  {rate:>9.1} MiB/s ",
        total as f64 / MIB
    );
    let _ = std::io::stderr().flush();
}

/// Builds the Go peer for the `go` mode, or says why it cannot. Exits at once if it cannot and
/// `GOMUX_REQUIRE_GO` is set, before anything is measured.
fn prepare_go() -> Result<PathBuf, String> {
    eprint!("building the Go peer\r");
    let built = go_peer::build();
    eprint!("\r{:78}\r", "");
    match built {
        Ok(binary) => Ok(binary),
        Err(reason) if go_peer::required() => {
            eprintln!(
                "speed: go: {reason} ({} is set, so the go mode may not be skipped)",
                go_peer::REQUIRE_ENV
            );
            process::exit(1);
        }
        Err(reason) => Err(reason),
    }
}

/// How long the Go processes may take to start, and to end once the transfer is over.
const GO_START: Duration = Duration::from_secs(20);
/// How long a Go process is given to end by itself once the run has failed.
const GO_GONE: Duration = Duration::from_secs(2);
/// How long the Go transfer may go without moving a byte before it is given up.
const GO_STALL: Duration = Duration::from_secs(30);

/// The `go` mode: the transfer between a Go sender and a Go receiver, two processes of the Go
/// peer over loopback TCP. Returns the receiver's time, once both digests check out.
fn run_go(binary: &Path, options: &Options, payload: &Payload) -> Result<Duration, String> {
    // The Rust digest of the same content: a Go sender that agrees with it sends exactly what
    // the Rust modes send.
    let expected = combine(payload.stream_digests::<Checksum>(options.streams));
    let streams = options.streams.to_string();
    let mut content = vec!["-streams".to_string(), streams.clone()];
    match &options.source {
        Source::Generated(bytes) => content.extend(["-bytes".to_string(), bytes.to_string()]),
        Source::File(path) => content.extend(["-file".to_string(), path.clone()]),
    }
    content.extend(["-chunk".to_string(), options.chunk.to_string()]);

    let args = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let mut receiver = GoPeer::spawn(
        binary,
        &args(&[
            "bench",
            "receive",
            "-listen",
            "127.0.0.1:0",
            "-streams",
            &streams,
        ]),
    )
    .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let addr = match receiver.listening(GO_START) {
        Ok(addr) => addr,
        Err(e) => return Err(go_failure("the receiver", e, receiver.finish(GO_GONE))),
    };
    let mut sending = args(&["bench", "send", "-connect", &addr.to_string()]);
    sending.extend(content);
    let mut sender = GoPeer::spawn(binary, &sending)
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;

    let received = match follow_receiver(&mut receiver, payload.total()) {
        Ok(line) => line,
        Err(e) => {
            // The other process says more often than not what went wrong.
            let why = go_failure("the receiver", e, receiver.finish(GO_GONE));
            return Err(go_failure("the sender", why, sender.finish(GO_GONE)));
        }
    };
    let sent = sender.wait_line("sent ", GO_START);
    let (receiver_exit, sender_exit) = (receiver.finish(GO_START), sender.finish(GO_START));
    let sent = match sent {
        Ok(line) if sender_exit.success() => line,
        Ok(_) => return Err(go_failure("the sender", "it failed".into(), sender_exit)),
        Err(e) => return Err(go_failure("the sender", e, sender_exit)),
    };
    if !receiver_exit.success() {
        return Err(go_failure(
            "the receiver",
            "it failed".into(),
            receiver_exit,
        ));
    }

    let sent_digest = field(&sent, "digest").and_then(|hex| u64::from_str_radix(hex, 16).ok());
    let received_digest =
        field(&received, "digest").and_then(|hex| u64::from_str_radix(hex, 16).ok());
    let received_bytes = field(&received, "bytes").and_then(|n| n.parse::<u64>().ok());
    let seconds = field(&received, "seconds").and_then(|s| s.parse::<f64>().ok());
    let (Some(sent_digest), Some(received_digest), Some(received_bytes), Some(seconds)) =
        (sent_digest, received_digest, received_bytes, seconds)
    else {
        return Err(format!(
            "cannot read the Go peers' results: sent {sent:?}, received {received:?}"
        ));
    };
    if sent_digest != expected {
        return Err(format!(
            "the Go sender's content or checksum differs from this tool's (digest {sent_digest:016x}, \
             expected {expected:016x}): tests/interop/go/bench_content.go no longer matches \
             benches/support and this file"
        ));
    }
    if received_digest != sent_digest || received_bytes != payload.total() {
        return Err(format!(
            "the streams arrived different from what was sent: {received_bytes} of {} bytes, \
             digest {received_digest:016x} against {sent_digest:016x} sent",
            payload.total()
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Follows the Go receiver's progress lines, redrawing the progress line, until its result line;
/// returns that line.
fn follow_receiver(receiver: &mut GoPeer, total: u64) -> Result<String, String> {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let line = receiver
            .wait_line("", GO_STALL)
            .map_err(|e| format!("waiting for the receiver's progress and result: {e}"))?;
        if let Some(result) = line.strip_prefix("received ") {
            eprint!("\r{:78}\r", "");
            return Ok(result.to_string());
        }
        let Some(bytes) = line
            .strip_prefix("progress ")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        draw_progress(Mode::Go.name(), bytes, total, start.elapsed());
        if bytes > last.0 {
            last = (bytes, Instant::now());
        } else if last.1.elapsed() > GO_STALL {
            return Err(format!("no progress for {GO_STALL:?} after {bytes} bytes"));
        }
    }
}

/// An error of one of the Go processes, with what it printed on stderr.
fn go_failure(who: &str, error: String, exit: go_peer::Exit) -> String {
    let stderr = exit.stderr().trim();
    let status = match &exit {
        go_peer::Exit::Exited {
            code: Some(code), ..
        } => format!("exit status {code}"),
        go_peer::Exit::Exited { code: None, .. } => "killed by a signal".to_string(),
        go_peer::Exit::Hung { .. } => "still running, killed".to_string(),
    };
    if stderr.is_empty() {
        format!("{error}; {who}: {status}")
    } else {
        format!("{error}; {who}: {status}: {stderr}")
    }
}

/// The value of `name=` in a line of `name=value` words.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

/// One value for the digests of all streams of a transfer, in an order that does not depend on
/// which stream was accepted first: the (length, hash) pairs sorted, then folded with the
/// checksum's multiply step. The Go peer computes it the same way (`combine` in
/// `tests/interop/go/bench_content.go`).
fn combine(mut digests: Vec<(u64, u64)>) -> u64 {
    digests.sort_unstable();
    digests.iter().fold(FNV_OFFSET, |hash, &(len, digest)| {
        let hash = (hash ^ len).wrapping_mul(FNV_PRIME);
        (hash ^ digest).wrapping_mul(FNV_PRIME)
    })
}

/// Per-stream check of content: byte count and a hash of the bytes in order, however they were
/// cut into writes and reads.
///
/// The hash takes 8-byte words into eight independent lanes (FNV-1a's step, on words instead of
/// bytes), so the multiplications overlap: 15 to 18 GiB/s on one core, several times any
/// transfer rate measured here. Bytes of a block that straddles two writes or reads wait in
/// `tail`.
struct Checksum {
    len: u64,
    lanes: [u64; LANES],
    tail: [u8; BLOCK],
    tail_len: usize,
}

const LANES: usize = 8;
const BLOCK: usize = 8 * LANES;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for Checksum {
    fn default() -> Checksum {
        Checksum {
            len: 0,
            lanes: std::array::from_fn(|lane| FNV_OFFSET ^ lane as u64),
            tail: [0; BLOCK],
            tail_len: 0,
        }
    }
}

impl Checksum {
    fn mix(&mut self, block: &[u8]) {
        for (lane, word) in self.lanes.iter_mut().zip(block.chunks_exact(8)) {
            let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            *lane = (*lane ^ word).wrapping_mul(FNV_PRIME);
        }
    }
}

impl Digest for Checksum {
    type Output = (u64, u64);

    fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.tail_len > 0 {
            let take = bytes.len().min(BLOCK - self.tail_len);
            self.tail[self.tail_len..self.tail_len + take].copy_from_slice(&bytes[..take]);
            self.tail_len += take;
            bytes = &bytes[take..];
            if self.tail_len < BLOCK {
                return;
            }
            let block = self.tail;
            self.mix(&block);
            self.tail_len = 0;
        }
        let mut blocks = bytes.chunks_exact(BLOCK);
        for block in &mut blocks {
            self.mix(block);
        }
        let rest = blocks.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
        self.tail_len = rest.len();
    }

    fn finish(mut self) -> (u64, u64) {
        if self.tail_len > 0 {
            let mut block = [0; BLOCK];
            block[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
            self.mix(&block);
        }
        let hash = self
            .lanes
            .iter()
            .fold(self.len, |hash, lane| (hash ^ lane).wrapping_mul(FNV_PRIME));
        (self.len, hash)
    }
}

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let mut options = Options {
        modes: Mode::ALL.to_vec(),
        source: Source::Generated(1 << 30),
        streams: 1,
        chunk: support::CHUNK,
        digest: false,
        verify: true,
        notsent_lowat: None,
    };
    let (mut bytes, mut file) = (None, None);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if flag == "--digest" {
            options.digest = true;
            continue;
        }
        if flag == "--no-verify" {
            options.verify = false;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--mode" => options.modes = parse_mode(value)?,
            "--bytes" => bytes = Some(parse_size(value)?),
            "--file" => file = Some(value.clone()),
            "--streams" => {
                options.streams = value.parse().ok().filter(|&k| k > 0).ok_or_else(|| {
                    format!("--streams takes a positive whole number, not {value}")
                })?;
            }
            "--chunk" => {
                options.chunk = usize::try_from(parse_size(value)?)
                    .ok()
                    .filter(|&c| c > 0)
                    .ok_or_else(|| format!("--chunk must be at least one byte, not {value}"))?;
            }
            "--notsent-lowat" if cfg!(feature = "tcp") => {
                let bytes = parse_size(value)?;
                options.notsent_lowat = Some(
                    u32::try_from(bytes)
                        .ok()
                        .filter(|&b| b > 0)
                        .ok_or_else(|| format!("--notsent-lowat takes 1 to 4G-1, not {value}"))?,
                );
            }
            "--notsent-lowat" => return Err("--notsent-lowat needs --features tcp".to_string()),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    options.source = match (bytes, file) {
        (Some(_), Some(_)) => return Err("--bytes and --file exclude each other".to_string()),
        (_, Some(path)) => Source::File(path),
        (Some(bytes), None) => Source::Generated(bytes),
        (None, None) => options.source,
    };
    Ok(Some(options))
}

#[cfg(feature = "tcp")]
fn set_notsent_lowat(socket: &tokio::net::TcpStream, bytes: u32) -> std::io::Result<()> {
    gomux::tcp::set_notsent_lowat(socket, bytes)
}

#[cfg(not(feature = "tcp"))]
fn set_notsent_lowat(_: &tokio::net::TcpStream, _: u32) -> std::io::Result<()> {
    unreachable!("--notsent-lowat is refused without the tcp feature")
}

fn parse_mode(value: &str) -> Result<Vec<Mode>, String> {
    if value == "all" {
        return Ok(Mode::ALL.to_vec());
    }
    Mode::ALL
        .into_iter()
        .find(|mode| mode.name() == value)
        .map(|mode| vec![mode])
        .ok_or_else(|| format!("unknown mode {value}"))
}

/// A byte count: digits, then optionally `K`, `M`, `G` or `T` (powers of 1024), optionally
/// followed by `B` or `iB`, in any case.
fn parse_size(value: &str) -> Result<u64, String> {
    let bad = || format!("not a size: {value} (try 4096, 64K, 512M, 1G)");
    let upper = value.to_ascii_uppercase();
    let text = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    let number: u64 = digits.parse().map_err(|_| bad())?;
    number.checked_mul(1 << shift).ok_or_else(bad)
}
