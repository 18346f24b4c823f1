//! Transport speed: how fast bytes go through gomux, yamux, raw loopback TCP and in-memory
//! pipes, each doing the same work, so the rows can be compared with each other.
//!
//! ```text
//! cargo run --release --example speed -- [--mode MODE] [--bytes N | --file PATH]
//!                                        [--streams K] [--chunk C]
//! ```
//!
//! - `--mode`: `tcp` (raw loopback TCP), `mux-tcp` (gomux over one loopback TCP connection),
//!   `memory` (raw `tokio::io::duplex` pipes), `mux-memory` (gomux over one such pipe),
//!   `yamux-tcp` (yamux over one loopback TCP connection), or `all` (the default: each of them
//!   in that order, `tcp` first since ratios are relative to it).
//! - `--bytes N`: how much to send per mode, default `1G`; sizes take the binary suffixes `K`,
//!   `M`, `G` and `T` (`64K`, `512M`, `1GiB`). Or `--file PATH`: send that file's content,
//!   read into memory first so the disk is not what is measured.
//! - `--streams K`: split the bytes evenly over K streams sent at once, default 1. For the raw
//!   modes each stream is its own TCP connection or pipe.
//! - `--chunk C`: size of every write, default `64K`. The receiver always reads into a 64 KiB
//!   buffer.
//!
//! Generated content is one pseudo-random 1 MiB block, made once and cut into every write at a
//! moving offset that differs per stream. Both ends hash what goes through each stream (a 64-bit
//! multiply hash over 8-byte words, eight lanes at a time, so it is cheap next to the transfer);
//! a stream whose hash or length differs fails the run with exit status 1. Every mode does
//! exactly the same work, on a tokio runtime with a worker per core; the time counts from the
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

#[path = "../benches/support/mod.rs"]
mod support;

use std::io::Write;
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gomux::Config;
use support::{Connector, Digest, Payload};

const USAGE: &str = "\
usage: speed [--mode MODE] [--bytes N | --file PATH] [--streams K] [--chunk C]
  MODE: tcp, mux-tcp, mux-tcp-zc, memory, mux-memory, yamux-tcp or all (default all)
  N, C: sizes like 4096, 64K, 512M, 1G (defaults: --bytes 1G, --chunk 64K)
  K: streams sent at once (default 1)";

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
}

impl Mode {
    /// Every mode, in the order `all` runs them.
    const ALL: [Mode; 6] = [
        Mode::Tcp,
        Mode::MuxTcp,
        Mode::MuxTcpZeroCopy,
        Mode::Memory,
        Mode::MuxMemory,
        Mode::YamuxTcp,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::MuxTcp => "mux-tcp",
            Mode::MuxTcpZeroCopy => "mux-tcp-zc",
            Mode::Memory => "memory",
            Mode::MuxMemory => "mux-memory",
            Mode::YamuxTcp => "yamux-tcp",
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
    let payload = Arc::new(payload);
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");

    println!(
        "# {:<11} {:>7} {:>13} {:>9} {:>11} {:>7}",
        "mode", "streams", "bytes", "seconds", "MiB/s", "ratio"
    );
    let mut tcp_rate = None;
    for mode in options.modes {
        let run = measure(mode, Arc::clone(&payload), options.streams);
        let elapsed = match support::run_on(&rt, run) {
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

/// Sets up `mode`'s transport, then sends `payload` through it while a progress line runs.
async fn measure(mode: Mode, payload: Arc<Payload>, streams: usize) -> std::io::Result<Duration> {
    let progress = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn(show_progress(
        mode.name(),
        payload.total(),
        Arc::clone(&progress),
    ));
    let run = Run {
        payload,
        streams,
        progress,
    };
    let outcome = match mode {
        Mode::Tcp => run.on(support::Tcp::bind().await?).await,
        Mode::MuxTcp => run.on(support::gomux_tcp(Config::default()).await?).await,
        Mode::MuxTcpZeroCopy => {
            let pair = support::gomux_tcp(Config::default()).await?;
            run.on(support::ZeroCopyPair(pair)).await
        }
        Mode::Memory => run.on(support::Memory::default()).await,
        Mode::MuxMemory => run.on(support::gomux_duplex(Config::default())).await,
        Mode::YamuxTcp => run.on(support::yamux_tcp().await?).await,
    };
    ticker.abort();
    // Clear the progress line before the row goes to stdout.
    eprint!("\r{:78}\r", "");
    outcome
}

/// One mode's transfer, whatever its transport.
struct Run {
    payload: Arc<Payload>,
    streams: usize,
    progress: Arc<AtomicU64>,
}

impl Run {
    async fn on<C: Connector>(self, connector: C) -> std::io::Result<Duration> {
        let start = Instant::now();
        support::transfer::<C, Checksum>(
            Arc::new(connector),
            self.payload,
            self.streams,
            self.progress,
        )
        .await?;
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
        let done = received.load(Ordering::Relaxed) as f64 / MIB;
        let rate = done / start.elapsed().as_secs_f64();
        eprint!(
            "\r{name:<11} {done:>10.1} of {:.1} MiB  {rate:>9.1} MiB/s ",
            total as f64 / MIB
        );
        let _ = std::io::stderr().flush();
    }
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
    };
    let (mut bytes, mut file) = (None, None);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
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
