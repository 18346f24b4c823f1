//! Counts how often the faults of Go gomux that the crate docs describe ("Talking to Go gomux")
//! show, with a session of this crate at one end of a loopback TCP connection and the Go peer
//! (`tests/interop/go/`, its `fault` roles) at the other.
//!
//! ```sh
//! cargo run --release --example go_faults -- --runs 20
//! cargo run --release --example go_faults -- --runs 200 --config go-peer --only a
//! ```
//!
//! Every run is one Go process and one fresh connection, one after the other. A run is bounded
//! in time: a Go process still running `--hang-secs` seconds after its session should have
//! ended gets SIGQUIT, and its goroutine dump tells where it hung. Each run counts as one of
//!
//! - `hung`: the Go session deadlocked as it ended (the dump shows `Mux.setErr` waiting for a
//!   lock while a stream's `Write` or `Read` holds its own);
//! - `crashed`: the Go process died with "send on closed channel";
//! - `lost data`: the Go side closed normally, but this side did not receive every byte;
//! - `no CloseMux`: every byte arrived, but this side's session ended without the Go side's
//!   CloseMux (the connection closed or was reset first);
//! - `clean`: none of these;
//! - `other`: anything else (a Go process that hung elsewhere or failed): the first such run's
//!   details go to stderr.
//!
//! and one line per scenario gives the counts, e.g.
//! `a: 1 Go stream writing, closed by Go, default: 93 of 200 hung, 107 clean (301 s)`.
//! The scenarios:
//!
//! - a (deadlock as a session ends): 1, 8 or 16 Go streams write 64 KiB writes as fast as
//!   their credit allows while this side reads everything; the session is closed 50 to 300 ms
//!   in (at random), by the Go side (`Mux.Close`, counted from the start) or by this side
//!   ([`Session::close`], counted from the first byte received).
//! - b (crash as a session ends while streams arrive): this side opens streams in a loop, each
//!   writing 16 bytes and closing; the Go side accepts and reads every stream, or accepts
//!   none, and calls `Mux.Close` 50 to 300 ms in; or this side closes the session 300 ms in
//!   while still opening, and the Go side accepts until `AcceptStream` fails and closes then.
//! - c (`Mux.Close` losing the last frames): the Go side writes N bytes on a stream (1000,
//!   64 KiB, 1 MiB, 8 MiB), closes the stream and at once its session; this side reads it.
//!
//! `--config go-peer` runs this side with [`Config::go_peer`] instead of the defaults. Where Go
//! or the Go gomux source is missing, it prints `# go_faults: skipped: ...` and exits 0; with
//! `GOMUX_REQUIRE_GO=1` it fails instead.
//!
//! [`Session::close`]: gomux::Session::close
//! [`Config::go_peer`]: gomux::Config::go_peer

#[path = "../tests/interop/go_peer.rs"]
mod go_peer;

use std::path::Path;
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use go_peer::{Exit, GoPeer};
use gomux::{Config, Error, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const USAGE: &str = "usage: go_faults [--runs N] [--config default|go-peer] [--only a,b,c] \
[--streams 1,8,16] [--hang-secs S] [--verbose]
  --runs N        runs of every scenario (default 20)
  --config C      this side's configuration: default (Config::default) or go-peer (Config::go_peer)
  --only LIST     the faults to run, of a, b and c (default all)
  --streams LIST  fault a: the numbers of Go streams writing, of 1, 8 and 16 (default all)
  --hang-secs S   how long a Go process may take to end once its session should have (default 2)
  --verbose       one line per run";

/// How long the Go process may take to start and connect.
const GO_START: Duration = Duration::from_secs(20);
/// How long this side's session may take to end once the Go process has ended (its own close
/// waits up to `Config::close_timeout`, 10 s, for the Go side's CloseMux).
const RUST_END: Duration = Duration::from_secs(15);

struct Options {
    runs: usize,
    go_peer_config: bool,
    only: Vec<char>,
    streams: Vec<usize>,
    hang: Duration,
    verbose: bool,
}

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let mut options = Options {
        runs: 20,
        go_peer_config: false,
        only: vec!['a', 'b', 'c'],
        streams: vec![1, 8, 16],
        hang: Duration::from_secs(2),
        verbose: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--runs" => {
                options.runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?;
            }
            "--config" => {
                options.go_peer_config = match value()?.as_str() {
                    "default" => false,
                    "go-peer" => true,
                    other => return Err(format!("--config: unknown {other:?}")),
                };
            }
            "--only" => {
                let list = value()?;
                options.only = list
                    .split(',')
                    .filter_map(|s| s.trim().chars().next())
                    .collect();
                if let Some(bad) = options.only.iter().find(|c| !"abc".contains(**c)) {
                    return Err(format!("--only: unknown fault {bad:?}"));
                }
            }
            "--streams" => {
                options.streams = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--streams: {e}"))?;
                if let Some(bad) = options.streams.iter().find(|n| ![1, 8, 16].contains(*n)) {
                    return Err(format!("--streams: {bad} is not one of 1, 8 and 16"));
                }
            }
            "--hang-secs" => {
                let secs: f64 = value()?.parse().map_err(|e| format!("--hang-secs: {e}"))?;
                options.hang = Duration::from_secs_f64(secs.max(0.1));
            }
            "--verbose" => options.verbose = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(options))
}

/// What this side does in a run.
#[derive(Clone, Copy)]
enum RustPart {
    /// Read every stream the Go side opens until the session ends.
    Sink,
    /// Read every stream; close the session this long after the first byte arrived.
    SinkThenClose(Duration),
    /// Open streams in a loop, each writing 16 bytes and closing, until the session ends.
    Opener,
    /// The same, and close the session this long after the start.
    OpenerThenClose(Duration),
}

/// One scenario: a row of the docs' tables.
struct Scenario {
    fault: char,
    label: String,
    /// The Go program's `fault` role and its flags (the endpoint flag is added per run).
    go_mode: &'static str,
    go_flags: Vec<String>,
    /// Whether the Go side listens (and is the gomux server) rather than dials.
    go_listens: bool,
    /// Whether the Go side's close is delayed by a random 50 to 300 ms (`-delay`).
    go_delay: bool,
    /// This side's part; a `SinkThenClose` delay is drawn per run.
    rust: RustPart,
    /// Go streams writing (a).
    streams: usize,
    /// Bytes this side must receive in all (c), if it checks.
    expect_bytes: Option<u64>,
}

fn scenarios() -> Vec<Scenario> {
    let mut list = Vec::new();
    for streams in [1, 8, 16] {
        let plural = if streams == 1 { "stream" } else { "streams" };
        for by_go in [true, false] {
            list.push(Scenario {
                fault: 'a',
                label: format!(
                    "{streams} Go {plural} writing, closed by {}",
                    if by_go { "Go" } else { "this side" }
                ),
                go_mode: if by_go { "write-close" } else { "write" },
                go_flags: vec!["-streams".into(), streams.to_string()],
                go_listens: false,
                go_delay: by_go,
                rust: if by_go {
                    RustPart::Sink
                } else {
                    RustPart::SinkThenClose(Duration::ZERO)
                },
                streams,
                expect_bytes: None,
            });
        }
    }
    for (label, mode, flags, rust) in [
        (
            "Go accepting and reading, closed by Go",
            "accept-close",
            vec![],
            RustPart::Opener,
        ),
        (
            "Go accepting none, closed by Go",
            "accept-close",
            vec!["-accept=false".to_string()],
            RustPart::Opener,
        ),
        (
            "Go accepting and reading, closed by this side at 300 ms",
            "accept",
            vec![],
            RustPart::OpenerThenClose(Duration::from_millis(300)),
        ),
    ] {
        list.push(Scenario {
            fault: 'b',
            label: format!("this side opening, {label}"),
            go_mode: mode,
            go_flags: flags,
            go_listens: true,
            go_delay: mode == "accept-close",
            rust,
            streams: 0,
            expect_bytes: None,
        });
    }
    for (bytes, shown) in [
        (1000, "1000 B"),
        (64 << 10, "64 KiB"),
        (1 << 20, "1 MiB"),
        (8 << 20, "8 MiB"),
    ] {
        list.push(Scenario {
            fault: 'c',
            label: format!("Go writing {shown}, closing the stream and the session"),
            go_mode: "send-close",
            go_flags: vec!["-bytes".into(), bytes.to_string()],
            go_listens: false,
            go_delay: false,
            rust: RustPart::Sink,
            streams: 0,
            expect_bytes: Some(bytes),
        });
    }
    list
}

/// How one run ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Hung,
    Crashed,
    LostData,
    NoCloseMux,
    Clean,
    Other,
}

const OUTCOMES: [(Outcome, &str); 6] = [
    (Outcome::Hung, "hung"),
    (Outcome::Crashed, "crashed"),
    (Outcome::LostData, "lost data"),
    (Outcome::NoCloseMux, "no CloseMux"),
    (Outcome::Clean, "clean"),
    (Outcome::Other, "other"),
];

/// What this side saw in a run (all of it shown in the `--verbose` lines).
#[derive(Debug, Default)]
#[allow(dead_code)]
struct RustReport {
    bytes: u64,
    opened: u64,
    end: Option<Error>,
}

/// A small random number generator for the close delays (xorshift, seeded from the clock).
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(nanos | 1)
    }

    /// Milliseconds from 50 to 300, inclusive.
    fn delay(&mut self) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(50 + self.0 % 251)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(problem) => {
            eprintln!("go_faults: {problem}\n{USAGE}");
            process::exit(2);
        }
    };
    let binary = match go_peer::build() {
        Ok(binary) => binary,
        Err(reason) if go_peer::required() => {
            eprintln!(
                "go_faults: {reason} ({} is set, so this may not be skipped)",
                go_peer::REQUIRE_ENV
            );
            process::exit(1);
        }
        Err(reason) => {
            println!("# go_faults: skipped: {reason}");
            return;
        }
    };
    let config_name = if options.go_peer_config {
        "go-peer"
    } else {
        "default"
    };
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let mut rng = Rng::new();
    for scenario in scenarios() {
        if !options.only.contains(&scenario.fault)
            || (scenario.fault == 'a' && !options.streams.contains(&scenario.streams))
        {
            continue;
        }
        let started = Instant::now();
        let mut counts = [0usize; OUTCOMES.len()];
        let mut told_other = false;
        for run in 0..options.runs {
            let (outcome, detail) = rt.block_on(one_run(&binary, &scenario, &options, &mut rng));
            counts[OUTCOMES
                .iter()
                .position(|(o, _)| *o == outcome)
                .unwrap_or(5)] += 1;
            if options.verbose {
                println!("# {} run {run}: {outcome:?} {detail}", scenario.fault);
            }
            if outcome == Outcome::Other && !told_other {
                told_other = true;
                eprintln!(
                    "go_faults: {}: {}: run {run} ended otherwise: {detail}",
                    scenario.fault, scenario.label
                );
            }
        }
        let primary = match scenario.fault {
            'a' => Outcome::Hung,
            'b' => Outcome::Crashed,
            _ => Outcome::LostData,
        };
        let mut parts = Vec::new();
        for (i, (outcome, name)) in OUTCOMES.iter().enumerate() {
            if *outcome == primary {
                parts.insert(0, format!("{} of {} {name}", counts[i], options.runs));
            } else if counts[i] > 0 {
                parts.push(format!("{} {name}", counts[i]));
            }
        }
        println!(
            "{}: {}, {config_name}: {} ({:.0} s)",
            scenario.fault,
            scenario.label,
            parts.join(", "),
            started.elapsed().as_secs_f64()
        );
    }
}

/// One run: a Go process, a fresh connection, this side's part; returns how it ended and a
/// line of details.
async fn one_run(
    binary: &Path,
    scenario: &Scenario,
    options: &Options,
    rng: &mut Rng,
) -> (Outcome, String) {
    let config = if options.go_peer_config {
        Config::go_peer()
    } else {
        Config::default()
    };
    let mut args = vec!["fault".to_string(), scenario.go_mode.to_string()];
    args.extend(scenario.go_flags.iter().cloned());
    let mut delay = Duration::ZERO;
    if scenario.go_delay {
        delay = rng.delay();
        args.extend(["-delay".to_string(), delay.as_millis().to_string()]);
    }
    let rust = match scenario.rust {
        RustPart::SinkThenClose(_) => {
            delay = rng.delay();
            RustPart::SinkThenClose(delay)
        }
        other => other,
    };

    // The connection: the Go side dials this side's listener, or this side dials the Go side.
    let listener = if scenario.go_listens {
        args.extend(["-listen".to_string(), "127.0.0.1:0".to_string()]);
        None
    } else {
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(e) => return (Outcome::Other, format!("binding a listener: {e}")),
        };
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        args.extend(["-connect".to_string(), addr.to_string()]);
        Some(listener)
    };
    let mut peer = match GoPeer::spawn(binary, &args) {
        Ok(peer) => peer,
        Err(e) => return (Outcome::Other, format!("starting the Go peer: {e}")),
    };
    let socket = match listener {
        Some(listener) => tokio::time::timeout(GO_START, listener.accept())
            .await
            .map_err(|_| "the Go peer did not connect".to_string())
            .and_then(|r| r.map(|(s, _)| s).map_err(|e| e.to_string())),
        None => {
            let (peer_back, addr) = tokio::task::spawn_blocking(move || {
                let addr = peer.listening(GO_START);
                (peer, addr)
            })
            .await
            .expect("the wait for the Go peer's address does not panic");
            peer = peer_back;
            match addr {
                Ok(addr) => TcpStream::connect(addr).await.map_err(|e| e.to_string()),
                Err(e) => Err(e),
            }
        }
    };
    let socket = match socket {
        Ok(socket) => socket,
        Err(e) => {
            let exit = tokio::task::spawn_blocking(move || peer.finish(Duration::ZERO)).await;
            let stderr = exit.map(|e| e.stderr().to_string()).unwrap_or_default();
            return (
                Outcome::Other,
                format!("no connection: {e}; Go stderr: {stderr}"),
            );
        }
    };
    let _ = socket.set_nodelay(true);
    let role = if scenario.go_listens {
        Role::Client
    } else {
        Role::Server
    };
    let session = Session::with_config(socket, role, config);
    let start = Instant::now();
    let rust_task = tokio::spawn(rust_part(session, rust));

    // The session should have ended once the close is done (at most 300 ms after the start, or
    // after the first byte) and the Go side has written what it had: from then on, the Go
    // process has `--hang-secs` to end.
    let limit = Duration::from_millis(1000) + options.hang;
    let (peer, exit) = tokio::task::spawn_blocking(move || {
        let exit = peer.finish(limit);
        (peer, exit)
    })
    .await
    .expect("the wait for the Go peer does not panic");
    let go_ms = start.elapsed().as_millis();
    let report = match tokio::time::timeout(RUST_END, rust_task).await {
        Ok(Ok(report)) => Some(report),
        _ => None,
    };
    let last_line = peer.lines.last().cloned().unwrap_or_default();
    drop(peer);
    let detail = format!(
        "delay={}ms go={{{}}} go_ms={go_ms} rust={report:?}",
        delay.as_millis(),
        match &exit {
            Exit::Exited { code, .. } => format!("exit {code:?}: {last_line}"),
            Exit::Hung { .. } => "hung, sent SIGQUIT".to_string(),
        }
    );
    (
        classify(&exit, report.as_ref(), scenario.expect_bytes),
        detail,
    )
}

fn classify(exit: &Exit, report: Option<&RustReport>, expect_bytes: Option<u64>) -> Outcome {
    let stderr = exit.stderr();
    if stderr.contains("send on closed channel") {
        return Outcome::Crashed;
    }
    match exit {
        Exit::Hung { .. } => {
            let in_set_err = stderr.contains("gomux.(*Mux).setErr");
            let stream_busy =
                stderr.contains("gomux.(*Stream).Write") || stderr.contains("gomux.(*Stream).Read");
            if in_set_err && stream_busy {
                Outcome::Hung
            } else {
                Outcome::Other
            }
        }
        Exit::Exited { code: Some(0), .. } => {
            let Some(report) = report else {
                return Outcome::Other;
            };
            if expect_bytes.is_some_and(|n| report.bytes != n) {
                Outcome::LostData
            } else if expect_bytes.is_some() && !matches!(report.end, Some(Error::ClosedByPeer)) {
                Outcome::NoCloseMux
            } else {
                Outcome::Clean
            }
        }
        Exit::Exited { .. } => Outcome::Other,
    }
}

/// This side's part of a run; returns once its session has ended.
async fn rust_part(session: Session, part: RustPart) -> RustReport {
    let total = Arc::new(AtomicU64::new(0));
    let mut opened = 0;
    match part {
        RustPart::Sink | RustPart::SinkThenClose(_) => {
            let sink = tokio::spawn(sink_all(session.clone(), Arc::clone(&total)));
            if let RustPart::SinkThenClose(delay) = part {
                while total.load(Ordering::Relaxed) == 0 && !session.is_closed() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                tokio::time::sleep(delay).await;
                let _ = session.close().await;
            }
            let _ = sink.await;
        }
        RustPart::Opener | RustPart::OpenerThenClose(_) => {
            let opener = tokio::spawn(open_all(session.clone()));
            if let RustPart::OpenerThenClose(delay) = part {
                tokio::time::sleep(delay).await;
                let _ = session.close().await;
            }
            opened = opener.await.unwrap_or(0);
        }
    }
    let end = session.closed().await;
    RustReport {
        bytes: total.load(Ordering::Relaxed),
        opened,
        end: Some(end),
    }
}

/// Reads every stream the peer opens to its end, counting the bytes, until the session ends.
async fn sink_all(session: Session, total: Arc<AtomicU64>) {
    let mut readers = Vec::new();
    while let Ok(mut stream) = session.accept().await {
        let total = Arc::clone(&total);
        readers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                total.fetch_add(n as u64, Ordering::Relaxed);
            }
        }));
    }
    for reader in readers {
        let _ = reader.await;
    }
}

/// Opens streams in a loop, each writing 16 bytes and closing, until the session ends; returns
/// how many it opened.
async fn open_all(session: Session) -> u64 {
    let mut opened = 0;
    loop {
        match session.open().await {
            Ok(mut stream) => {
                opened += 1;
                tokio::spawn(async move {
                    let _ = stream.write_all(b"0123456789abcdef").await;
                    let _ = stream.close().await;
                });
            }
            Err(e) if e.is_session_end() => return opened,
            Err(_) => tokio::task::yield_now().await,
        }
    }
}
