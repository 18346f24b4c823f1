//! Transport speed: how fast bytes go through gomux, yamux, the Go multiplexers (Go gomux,
//! xtaci/smux, hashicorp/yamux), raw loopback TCP, TLS over it and in-memory pipes, each doing
//! the same work, so the rows can be compared with each other.
//!
//! ```text
//! cargo run --release --example speed -- [--mode MODE] [--bytes N | --file PATH]
//!                                        [--streams K] [--chunk C] [--no-verify] [--digest]
//! ```
//!
//! - `--mode`: `tcp` (raw loopback TCP), `mux-tcp` (gomux over one loopback TCP connection),
//!   `mux-tcp-zc` (the same through the zero-copy stream API), `tls` (raw bytes over TLS on
//!   loopback TCP), `mux-tls` (gomux over one such TLS connection), `memory` (raw
//!   `tokio::io::duplex` pipes), `mux-memory` (gomux over one such pipe), `yamux-tcp` (yamux
//!   over one loopback TCP connection), `go`, `go-smux` and `go-yamux` (Go gomux, xtaci/smux and
//!   hashicorp/yamux, see below), or `all` (the default: each of them in that order, `tcp`
//!   first since ratios are relative to it).
//! - `--bytes N`: how much to send per mode, default `1G`; sizes take the binary suffixes `K`,
//!   `M`, `G` and `T` (`64K`, `512M`, `1GiB`). Or `--file PATH`: send that file's content,
//!   read into memory first so the disk is not what is measured.
//! - `--streams K`: split the bytes evenly over K streams sent at once, default 1. For the raw
//!   modes (`tcp`, `tls`, `memory`) each stream is its own TCP connection, TLS connection or
//!   pipe.
//! - `--chunk C`: size of every write, default `64K`. The receiver reads into a 64 KiB buffer.
//!   The `tcp` and `tls` modes are the exception on both counts: they write and read at least
//!   1 MiB at a time (see below).
//! - `--no-verify`: both ends only count the bytes, as `iperf3` does, instead of hashing them.
//!   Hashing costs each end a few tenths of a core at these rates, so the rows compared with the
//!   transport's limit are measured this way. The Go modes always hash.
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
//! # The `tls` and `mux-tls` modes
//!
//! rustls (TLS 1.3, the `ring` provider) over loopback TCP, set up as `examples/tls.rs` does,
//! with a self-signed certificate made before the clock starts. `tls` is raw bytes over one TLS
//! connection per stream, with the `tcp` mode's 1 MiB writes and reads: with one stream, what
//! one TLS connection carries, the limit of a multiplexer running over one. Unlike `tcp` it
//! runs on the runtime of the other modes, so that the sender's encryption and the receiver's
//! decryption can each have a core, as they can under `mux-tls`. `mux-tls` is gomux over one
//! TLS connection, whose handshake is done before the clock starts.
//!
//! # The Go modes: `go`, `go-smux` and `go-yamux`
//!
//! The same transfer between a Go sender and a Go receiver, two processes over loopback TCP:
//! Go gomux through the Go peer (`tests/interop/go`, built against the unmodified Go gomux
//! beside the clone in `../shared/gomux-go`, nothing downloaded), xtaci/smux and
//! hashicorp/yamux with their default configurations through `benches/go-compare` (a Go module
//! of its own; `go build` fetches its two dependencies from the Go module proxy the first
//! time). The receiver prints its time (from the first stream it accepts to the last byte it
//! reads) and a digest of all streams; the run fails unless the sender's digest equals the one
//! this tool computes for the content and the receiver's equals the sender's (see
//! `speed/go.rs`). Each Go process has the Go runtime's default of one thread per core; the
//! Rust modes run both ends in this process.
//!
//! Where a Go program cannot be built (no Go, no Go gomux source, no module proxy), its row is
//! replaced by a `# MODE: skipped` line that says why, and the other modes run; with
//! `GOMUX_REQUIRE_GO=1` in the environment that is a failure (exit status 1) instead.

#[path = "speed/go.rs"]
mod go;
#[path = "../tests/interop/go_peer.rs"]
mod go_peer;
#[path = "../benches/support/mod.rs"]
mod support;
#[path = "speed/tls.rs"]
mod tls;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use go::GoMux;
use gomux::Config;
use support::{Connector, Count, Digest, Payload};

const USAGE: &str = "\
usage: speed [--mode MODE] [--bytes N | --file PATH] [--streams K] [--chunk C] [--no-verify]
             [--digest] [--notsent-lowat N]
  MODE: tcp, mux-tcp, mux-tcp-zc, tls, mux-tls, memory, mux-memory, yamux-tcp, go, go-smux,
        go-yamux or all (default all)
  N, C: sizes like 4096, 64K, 512M, 1G (defaults: --bytes 1G, --chunk 64K)
  K: streams sent at once (default 1)
  --no-verify: count the bytes only, instead of hashing them at both ends
  --digest: print the digest of the content instead of sending it
  --notsent-lowat N: TCP_NOTSENT_LOWAT on the mux-tcp mode's sockets (needs --features tcp)
  go, go-smux, go-yamux: Go gomux, xtaci/smux, hashicorp/yamux between two Go processes;
      skipped when Go, ../shared/gomux-go (go) or the Go module proxy (go-smux, go-yamux,
      on their first build) is missing, a failure then if GOMUX_REQUIRE_GO=1";

const MIB: f64 = 1024.0 * 1024.0;

/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tcp,
    MuxTcp,
    /// gomux over TCP through the zero-copy stream API (`write_chunk`, `read_chunk`).
    MuxTcpZeroCopy,
    /// Raw bytes over TLS on loopback TCP, a TLS connection per stream.
    Tls,
    /// gomux over one TLS connection.
    MuxTls,
    Memory,
    MuxMemory,
    YamuxTcp,
    /// A Go multiplexer, sender and receiver in two Go processes over loopback TCP.
    Go(GoMux),
}

impl Mode {
    /// Every mode, in the order `all` runs them.
    const ALL: [Mode; 11] = [
        Mode::Tcp,
        Mode::MuxTcp,
        Mode::MuxTcpZeroCopy,
        Mode::Tls,
        Mode::MuxTls,
        Mode::Memory,
        Mode::MuxMemory,
        Mode::YamuxTcp,
        Mode::Go(GoMux::Gomux),
        Mode::Go(GoMux::Smux),
        Mode::Go(GoMux::Yamux),
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::MuxTcp => "mux-tcp",
            Mode::MuxTcpZeroCopy => "mux-tcp-zc",
            Mode::Tls => "tls",
            Mode::MuxTls => "mux-tls",
            Mode::Memory => "memory",
            Mode::MuxMemory => "mux-memory",
            Mode::YamuxTcp => "yamux-tcp",
            Mode::Go(GoMux::Gomux) => "go",
            Mode::Go(GoMux::Smux) => "go-smux",
            Mode::Go(GoMux::Yamux) => "go-yamux",
        }
    }

    /// Whether the mode is a transport's limit, which writes and reads 1 MiB at a time.
    fn is_limit(self) -> bool {
        matches!(self, Mode::Tcp | Mode::Tls)
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
    // Built before anything is measured, so that the builds do not share the cores with a
    // measurement.
    let go_programs: HashMap<GoMux, Result<PathBuf, String>> = options
        .modes
        .iter()
        .filter_map(|&mode| match mode {
            Mode::Go(mux) => Some((mux, go::prepare(mux, mode.name()))),
            _ => None,
        })
        .collect();

    println!(
        "# {:<11} {:>7} {:>13} {:>9} {:>11} {:>7}",
        "mode", "streams", "bytes", "seconds", "MiB/s", "ratio"
    );
    let mut tcp_rate = None;
    for &mode in &options.modes {
        let outcome = if let Mode::Go(mux) = mode {
            match &go_programs[&mux] {
                Ok(binary) => go::run(mux, binary, mode.name(), &options, &payload),
                Err(reason) => {
                    println!("# {}: skipped: {reason}", mode.name());
                    continue;
                }
            }
        } else {
            let payload = if mode.is_limit() {
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
            Mode::Tls => self.on(tls::Tls::bind().await?).await,
            Mode::MuxTls => {
                let (client, server) = tls::tls_pair().await?;
                self.on(support::gomux_over(client, server, Config::default()))
                    .await
            }
            Mode::YamuxTcp => self.on(support::yamux_tcp().await?).await,
            Mode::Go(_) => unreachable!("the Go modes run in Go processes, see speed/go.rs"),
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
