//! Live interop with Go gomux: every scenario runs against a real Go gomux process (the
//! unmodified source in `../shared/gomux-go`, through the program in `tests/interop/go/`), in
//! both role assignments (Go client with Rust server, Rust client with Go server), over
//! loopback TCP, and prints one verdict line.
//!
//! ```text
//! cargo test --test interop                  # every scenario
//! cargo test --test interop -- close         # the scenarios whose name contains "close"
//! ```
//!
//! Both ends check every byte (the same generated content on both sides), each run is bounded
//! in time, and the Rust side must end cleanly every time. Where the Go side fails with one of
//! its own known faults (see "Talking to Go gomux" in the crate docs), the verdict names the
//! fault, from the Go program's exit and the stacks it prints on SIGQUIT, and the run passes
//! only if the Rust side ended cleanly.
//!
//! Without Go or without `../shared/gomux-go`, the suite prints why it skipped, on a line of its
//! own; with `GOMUX_REQUIRE_GO=1` (CI sets it) a skip is a failure.

#[path = "interop/go_peer.rs"]
mod go_peer;
#[path = "interop/pattern.rs"]
mod pattern;
#[path = "interop/relay.rs"]
mod relay;
#[path = "interop/scenarios.rs"]
mod scenarios;

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use go_peer::{Exit, GoPeer, Line};
use gomux::{Config, Error, Role, Session};
use scenarios::{Ctx, Kind, Outcome};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// Which side opens a scenario's streams.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opens {
    Client,
    Server,
    /// The Go program, whatever its role.
    Go,
    /// This crate, whatever its role.
    Rust,
}

/// Which side does the scenario's act.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Opener,
    Acceptor,
}

struct Spec {
    kind: Kind,
    /// The verdict's name for the run; `{who}` and `{other}` become "Go" and "Rust".
    label: &'static str,
    streams: usize,
    bytes: u64,
    chunk: usize,
    opens: Opens,
    who: Who,
    expect: usize,
    limit: Duration,
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// How long the Go program may take to finish once the Rust side is done: far more than a
/// working Go peer needs, which exits within milliseconds of the session's end.
const GO_GRACE: Duration = Duration::from_secs(5);

/// The close timeout of the Rust sessions: a peer that never answers a CloseMux costs this.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

fn spec(kind: Kind, label: &'static str) -> Spec {
    Spec {
        kind,
        label,
        streams: 1,
        bytes: 64 * KIB,
        chunk: 64 * KIB as usize,
        opens: Opens::Client,
        who: Who::Opener,
        expect: 0,
        limit: Duration::from_secs(30),
    }
}

fn specs() -> Vec<Spec> {
    let both = |kind, label, bytes| {
        [Who::Opener, Who::Acceptor].map(|who| Spec {
            who,
            bytes,
            ..spec(kind, label)
        })
    };
    let mut specs = vec![
        Spec {
            bytes: MIB,
            ..spec(Kind::Echo, "echo, 1 stream x 1 MiB")
        },
        Spec {
            streams: 16,
            bytes: 4 * MIB,
            ..spec(Kind::Echo, "echo, 16 streams x 4 MiB")
        },
        Spec {
            streams: 1000,
            bytes: 64 * KIB,
            ..spec(Kind::Echo, "echo, 1000 streams x 64 KiB")
        },
        Spec {
            streams: 8,
            bytes: 4 * MIB,
            chunk: 0,
            ..spec(
                Kind::Echo,
                "echo, writes of 1 B to 200 KiB, 8 streams x 4 MiB",
            )
        },
        Spec {
            streams: 8,
            bytes: 256 * KIB,
            opens: Opens::Server,
            ..spec(Kind::Echo, "echo on 8 streams opened by the server ({who})")
        },
    ];
    for bulk in both(
        Kind::Bulk,
        "200 MB on one stream, {who} to {other}",
        200_000_000,
    ) {
        specs.push(Spec {
            limit: Duration::from_secs(90),
            ..bulk
        });
    }
    specs.extend(both(
        Kind::HalfClose,
        "half-close: {who} first, {other} still sending (1 MiB each way)",
        MIB,
    ));
    specs.extend(both(
        Kind::CloseRead,
        "close-read by {who} while {other} writes",
        64 * KIB,
    ));
    specs.extend(both(
        Kind::StreamClose,
        "stream close by {who} mid-transfer, then a new stream",
        0,
    ));
    for close in both(
        Kind::SessionClose,
        "session close by {who} with data in flight on 4 streams",
        0,
    ) {
        specs.push(Spec {
            streams: 4,
            limit: Duration::from_secs(15),
            ..close
        });
    }
    specs.push(Spec {
        streams: 100,
        opens: Opens::Rust,
        limit: Duration::from_secs(15),
        ..spec(
            Kind::CloseWhileOpening,
            "session close by Go after 100 of the streams Rust keeps opening",
        )
    });
    specs.push(Spec {
        streams: 8,
        opens: Opens::Rust,
        ..spec(
            Kind::Unanswered,
            "Go closes 8 accepted streams unanswered: an end of stream, not a refusal",
        )
    });
    specs.push(spec(
        Kind::Idle,
        "idle session across Rust keepalives, then a new stream",
    ));
    specs.push(Spec {
        streams: 32,
        expect: 4,
        opens: Opens::Go,
        ..spec(
            Kind::Backlog,
            "accept backlog of 4: Rust refuses 28 of Go's 32 opens",
        )
    });
    specs.extend(both(
        Kind::SlowReader,
        "slow reader ({who}): 4 MiB unread while another stream echoes",
        4 * MIB,
    ));
    specs.push(Spec {
        streams: 16,
        bytes: 16 * MIB,
        ..spec(
            Kind::Audit,
            "credit audit through a frame-parsing relay, 16 MiB each way + 16 echoes",
        )
    });
    specs
}

/// The Rust session's settings for a scenario.
fn config(spec: &Spec) -> Config {
    let config = Config::default().close_timeout(CLOSE_TIMEOUT);
    match spec.kind {
        Kind::Backlog => config.accept_backlog(spec.expect),
        Kind::Idle => config.keepalive_interval(Some(Duration::from_millis(50))),
        // Credit beyond Go's 64 KiB from the start, so the audit sees a Go sender use it.
        Kind::Audit => config.receive_window(MIB as u32),
        _ => config,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Assignment {
    GoClient,
    RustClient,
}

impl Assignment {
    fn name(self) -> &'static str {
        match self {
            Assignment::GoClient => "Go client, Rust server",
            Assignment::RustClient => "Rust client, Go server",
        }
    }
}

enum Verdict {
    Ok(String),
    /// The Go side failed with one of its known faults; the Rust side ended cleanly.
    GoFault(String),
    Fail(String),
}

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let specs: Vec<Spec> = specs()
        .into_iter()
        .filter(|s| {
            filters.is_empty()
                || filters
                    .iter()
                    .any(|f| s.kind.go_name().contains(f.as_str()) || s.label.contains(f.as_str()))
        })
        .collect();
    let runs = 2 * specs.len();
    let binary = match go_peer::build() {
        Ok(binary) => binary,
        Err(why) if go_peer::required() => {
            println!(
                "interop: FAILED: {} is set but the Go peer cannot be built: {why}",
                go_peer::REQUIRE_ENV
            );
            return ExitCode::FAILURE;
        }
        Err(why) => {
            println!("interop: SKIPPED all {runs} runs against Go gomux: {why}");
            return ExitCode::SUCCESS;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    println!(
        "interop: {runs} runs against Go gomux ({})",
        binary.display()
    );
    let (mut ok, mut faults, mut failed) = (0, 0, 0);
    let started = Instant::now();
    for assignment in [Assignment::GoClient, Assignment::RustClient] {
        for spec in &specs {
            let run_started = Instant::now();
            let (label, verdict) = run(&rt, &binary, assignment, spec);
            let secs = run_started.elapsed().as_secs_f64();
            let (status, detail) = match verdict {
                Verdict::Ok(detail) => {
                    ok += 1;
                    ("ok", detail)
                }
                Verdict::GoFault(detail) => {
                    faults += 1;
                    ("ok, Go fault", detail)
                }
                Verdict::Fail(detail) => {
                    failed += 1;
                    ("FAILED", detail)
                }
            };
            println!(
                "interop [{}] {label}: {status} ({secs:.2} s): {detail}",
                assignment.name()
            );
        }
    }
    println!(
        "interop: {runs} runs in {:.1} s: {ok} ok, {faults} ok with a known Go fault (the Rust side ended cleanly), {failed} failed",
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn block_on_within<F: Future>(rt: &Runtime, limit: Duration, f: F) -> Option<F::Output> {
    rt.block_on(async { tokio::time::timeout(limit, f).await })
        .ok()
}

/// A connected pair of loopback TCP sockets.
async fn tcp_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let (a, b) = tokio::join!(
        TcpStream::connect(listener.local_addr()?),
        listener.accept()
    );
    Ok((a?, b?.0))
}

/// Runs one scenario in one role assignment.
fn run(rt: &Runtime, binary: &Path, assignment: Assignment, spec: &Spec) -> (String, Verdict) {
    let rust_server = assignment == Assignment::GoClient;
    let rust_opens = match spec.opens {
        Opens::Client => !rust_server,
        Opens::Server => rust_server,
        Opens::Go => false,
        Opens::Rust => true,
    };
    let rust_actor = (spec.who == Who::Opener) == rust_opens;
    let (who, other) = if rust_actor {
        ("Rust", "Go")
    } else {
        ("Go", "Rust")
    };
    let server = if rust_server { "Rust" } else { "Go" };
    let label = spec
        .label
        .replace(
            "{who}",
            if spec.opens == Opens::Server {
                server
            } else {
                who
            },
        )
        .replace("{other}", other);
    let verdict = match run_verdict(rt, binary, rust_server, rust_opens, rust_actor, spec) {
        Ok(verdict) | Err(verdict) => verdict,
    };
    (label, verdict)
}

fn run_verdict(
    rt: &Runtime,
    binary: &Path,
    rust_server: bool,
    rust_opens: bool,
    rust_actor: bool,
    spec: &Spec,
) -> Result<Verdict, Verdict> {
    let fail = |what: String| Verdict::Fail(what);
    let mut args: Vec<String> = vec!["scenario".into(), spec.kind.go_name().into()];
    let listener = if rust_server {
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .map_err(|e| fail(format!("bind: {e}")))?;
        let addr = listener.local_addr().map_err(|e| fail(e.to_string()))?;
        args.extend(["-connect".into(), addr.to_string()]);
        Some(listener)
    } else {
        args.extend(["-listen".into(), "127.0.0.1:0".into()]);
        None
    };
    let opens = match spec.opens {
        Opens::Client => "client",
        Opens::Server => "server",
        Opens::Go => "go",
        Opens::Rust => "peer",
    };
    let who = match spec.who {
        Who::Opener => "opener",
        Who::Acceptor => "acceptor",
    };
    for (flag, value) in [
        ("-streams", spec.streams.to_string()),
        ("-bytes", spec.bytes.to_string()),
        ("-chunk", spec.chunk.to_string()),
        ("-opens", opens.into()),
        ("-who", who.into()),
        ("-expect", spec.expect.to_string()),
    ] {
        args.extend([flag.into(), value]);
    }
    let mut go = GoPeer::spawn(binary, &args).map_err(|e| fail(format!("starting Go: {e}")))?;

    // The connection to the Go program, and the one the Rust session runs on: the same, or the
    // two ends of the audit's relay.
    let connect = Duration::from_secs(10);
    let go_conn = match listener {
        Some(listener) => {
            block_on_within(rt, connect, listener.accept())
                .ok_or_else(|| fail("the Go client did not connect".into()))?
                .map_err(|e| fail(format!("accept: {e}")))?
                .0
        }
        None => {
            let addr = go.listening(connect).map_err(fail)?;
            rt.block_on(TcpStream::connect(addr))
                .map_err(|e| fail(format!("connect: {e}")))?
        }
    };
    let (rust_conn, relay) = if spec.kind == Kind::Audit {
        let (rust_conn, relay_end) = rt
            .block_on(tcp_pair())
            .map_err(|e| fail(format!("relay: {e}")))?;
        let _ = relay_end.set_nodelay(true);
        let _ = go_conn.set_nodelay(true);
        (rust_conn, Some(rt.spawn(relay::relay(go_conn, relay_end))))
    } else {
        (go_conn, None)
    };
    let _ = rust_conn.set_nodelay(true);
    let role = if rust_server {
        Role::Server
    } else {
        Role::Client
    };
    let session = {
        let _runtime = rt.enter();
        Session::with_config(rust_conn, role, config(spec))
    };
    let ctx = Ctx {
        session: session.clone(),
        kind: spec.kind,
        opens: rust_opens,
        actor: rust_actor,
        streams: spec.streams,
        bytes: spec.bytes,
        chunk: spec.chunk,
        expect: spec.expect,
        go: go.stdin(),
    };
    let mut rust = rt.spawn(scenarios::run(ctx));

    // Both parts, each bounded: the Rust side's and the Go side's "done" line.
    let deadline = Instant::now() + spec.limit;
    let mut rust_result: Option<Result<Outcome, String>> = None;
    let mut go_done: Option<String> = None;
    let mut go_ended = false;
    let mut go_deadline = deadline;
    loop {
        let now = Instant::now();
        if now >= deadline || (rust_result.is_some() && now >= go_deadline) {
            break;
        }
        if rust_result.is_none() && rust.is_finished() {
            let result = rt.block_on(&mut rust);
            rust_result = Some(result.unwrap_or_else(|e| Err(format!("the Rust task: {e}"))));
            go_deadline = Instant::now() + GO_GRACE;
        }
        if matches!(rust_result, Some(Err(_))) {
            break;
        }
        if go_done.is_none() && !go_ended {
            match go.poll_line("done ", Duration::from_millis(5)) {
                Line::Found(summary) => go_done = Some(summary),
                Line::NotYet => {}
                Line::Ended => go_ended = true,
            }
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
        if rust_result.is_some() && (go_done.is_some() || go_ended) {
            break;
        }
    }

    // The end of the session, as every scenario but session-close ends it: the client closes
    // it once both sides are done.
    let both_done = matches!(rust_result, Some(Ok(_))) && go_done.is_some();
    let ends_itself = matches!(spec.kind, Kind::SessionClose | Kind::CloseWhileOpening);
    let mut end = String::new();
    if both_done && !ends_itself {
        if rust_server {
            go.stdin().send("close");
        } else {
            let closed = block_on_within(rt, CLOSE_TIMEOUT * 2, session.close());
            if !matches!(closed, Some(Ok(()))) {
                end = format!("session.close() gave {closed:?}; ");
            }
        }
    }
    let exit = go.finish(if both_done { GO_GRACE } else { Duration::ZERO });
    // However the Go side ended, its process is gone now: the Rust session must end, and a
    // Rust part still running must finish.
    let reason = block_on_within(rt, Duration::from_secs(5), session.closed());
    if rust_result.is_none() {
        rust_result = Some(
            block_on_within(rt, Duration::from_secs(5), &mut rust)
                .map(|r| r.unwrap_or_else(|e| Err(format!("the Rust task: {e}"))))
                .unwrap_or_else(|| {
                    Err(format!(
                        "the Rust side did not finish within {:?}",
                        spec.limit
                    ))
                }),
        );
    }
    rust.abort();
    let Some(reason) = reason else {
        return Err(fail(format!(
            "the Rust session did not end after the Go program did; Go: {}",
            describe(&exit, &go.lines_text())
        )));
    };
    let rust_outcome = rust_result.unwrap_or_else(|| Err("no result".into()));
    let relay_report = relay.map(|relay| block_on_within(rt, Duration::from_secs(5), relay));

    let go_summary = go_done.clone().unwrap_or_default();
    let mut notes = Vec::new();
    // Fault (c): a Go client's Mux.Close can close the connection before its CloseMux went out.
    if rust_server && !ends_itself && both_done && matches!(reason, Error::ConnectionClosed) {
        notes.push("Go closed the connection without its CloseMux (Go fault c)".to_owned());
    } else if both_done && !ends_itself {
        let want = if rust_server {
            Error::ClosedByPeer
        } else {
            Error::ClosedLocally
        };
        if std::mem::discriminant(&reason) != std::mem::discriminant(&want) {
            return Err(fail(format!(
                "{end}the Rust session ended with {reason:?}, want {want:?}"
            )));
        }
    }
    if let Some(report) = relay_report {
        let Some(Ok([from_go, from_rust])) = report else {
            return Err(fail("the relay did not finish".into()));
        };
        if !from_rust.violations.is_empty() || !from_go.violations.is_empty() {
            return Err(fail(format!(
                "Data beyond credit: from Rust {:?}, from Go {:?}",
                from_rust.violations, from_go.violations
            )));
        }
        if from_go.peak_credit <= 65536 {
            return Err(fail(format!(
                "the Go sender never held more than 64 KiB of credit (peak {})",
                from_go.peak_credit
            )));
        }
        notes.push(format!(
            "relay: Rust sent {} Data frames ({} bytes) within Go's credit (peak unspent {}), Go sent {} ({} bytes) within ours (peak unspent {})",
            from_rust.data_frames, from_rust.data_bytes, from_rust.peak_credit,
            from_go.data_frames, from_go.data_bytes, from_go.peak_credit
        ));
    }

    let rust_outcome = match rust_outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            return Err(fail(format!(
                "Rust: {e}; Go: {}",
                describe(&exit, &go.lines_text())
            )))
        }
    };
    drop(rust_outcome.keep);
    let detail = format!(
        "Rust: {}; Go: {}{}",
        rust_outcome.summary,
        if go_summary.is_empty() {
            "-"
        } else {
            &go_summary
        },
        notes.iter().map(|n| format!("; {n}")).collect::<String>()
    );
    if exit.success() && go_done.is_some() {
        return Ok(Verdict::Ok(detail));
    }
    match go_fault(&exit) {
        Some(fault) => Ok(Verdict::GoFault(format!(
            "{fault}; the Rust side ended cleanly ({reason}). {detail}"
        ))),
        None => Err(fail(format!(
            "Go: {}; {detail}",
            describe(&exit, &go.lines_text())
        ))),
    }
}

/// Names the known Go fault an abnormal Go exit shows, if it is one.
fn go_fault(exit: &Exit) -> Option<&'static str> {
    let stderr = exit.stderr();
    if stderr.contains("send on closed channel") {
        return Some("Go fault b: the Go session panicked (send on closed channel) as it ended while streams were being opened");
    }
    if matches!(exit, Exit::Hung { .. })
        && stderr.contains("gomux.(*Mux).setErr")
        && stderr.contains("gomux.(*Mux).bufferFrame")
    {
        return Some("Go fault a: the Go session deadlocked ending while a writer waited for buffer room (setErr against bufferFrame)");
    }
    None
}

fn describe(exit: &Exit, lines: &str) -> String {
    let stderr = exit.stderr().trim();
    let tail: String = stderr.lines().take(12).collect::<Vec<_>>().join(" | ");
    match exit {
        Exit::Exited { code, .. } => format!("exit {code:?}; stdout: {lines}; stderr: {tail}"),
        Exit::Hung { .. } => format!("hung and was killed; stdout: {lines}; stderr: {tail}"),
    }
}

impl GoPeer {
    fn lines_text(&self) -> String {
        self.lines.join(" | ")
    }
}
