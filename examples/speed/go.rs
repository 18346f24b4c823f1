//! The speed tool's modes that run in Go processes: the same transfer between a Go sender and a
//! Go receiver, two processes over loopback TCP, through one of the Go multiplexers:
//!
//! - `go`: Go gomux, through the Go peer (`tests/interop/go`, built against the unmodified Go
//!   gomux beside the clone in `../shared/gomux-go`, with nothing downloaded);
//! - `go-smux` and `go-yamux`: xtaci/smux and hashicorp/yamux with their default
//!   configurations, through `benches/go-compare`, a Go module of its own whose two
//!   dependencies `go build` fetches from the Go module proxy (pinned by its `go.sum`) into the
//!   module cache the first time.
//!
//! The receiver listens, the sender connects, opens the streams and sends the same content
//! with the same `--bytes`/`--file`, `--streams` and `--chunk`, hashing it with the speed
//! tool's checksum (ported to Go bit for bit). The receiver prints its time (from the first
//! stream it accepts to the last byte it reads) and a digest of all streams; the run fails
//! unless the sender's digest equals the one this tool computes for the content and the
//! receiver's equals the sender's.

use std::path::{Path, PathBuf};
use std::process::{self, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::go_peer::{self, GoPeer};
use crate::support::Payload;
use crate::{combine, draw_progress, Checksum, Options, Source};

/// A Go multiplexer the speed tool runs in Go processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GoMux {
    Gomux,
    Smux,
    Yamux,
}

impl GoMux {
    /// The program's words before its role (`send` or `receive`) and its flags.
    fn words(self) -> &'static [&'static str] {
        match self {
            GoMux::Gomux => &["bench"],
            GoMux::Smux => &["smux"],
            GoMux::Yamux => &["yamux"],
        }
    }

    /// Builds the program that runs this multiplexer (once per process), or says why it cannot.
    fn build(self) -> Result<PathBuf, String> {
        match self {
            GoMux::Gomux => go_peer::build(),
            GoMux::Smux | GoMux::Yamux => {
                static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
                BUILT.get_or_init(build_compare).clone()
            }
        }
    }
}

/// Builds the program of a Go mode, or says why it cannot. Exits at once if it cannot and
/// `GOMUX_REQUIRE_GO` is set, before anything is measured.
pub fn prepare(mux: GoMux, mode: &str) -> Result<PathBuf, String> {
    eprint!("building the Go program of the {mode} mode\r");
    let built = mux.build();
    eprint!("\r{:78}\r", "");
    match built {
        Ok(binary) => Ok(binary),
        Err(reason) if go_peer::required() => {
            eprintln!(
                "speed: {mode}: {reason} ({} is set, so the {mode} mode may not be skipped)",
                go_peer::REQUIRE_ENV
            );
            process::exit(1);
        }
        Err(reason) => Err(reason),
    }
}

/// The `go` command: on the PATH, or where the official installer puts it.
fn go_command() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("go"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|go| go.is_file()))
}

/// Builds `benches/go-compare` into `target/gomux-go-compare/`. Its modules come from the Go
/// module proxy: an environment that turns the proxy off (as the interop peer's build does) is
/// overridden for this build, and `-mod=readonly` holds the build to the committed `go.sum`.
fn build_compare() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = root.join("benches/go-compare");
    let go = go_command().ok_or("no `go` command on the PATH or in /usr/local/go/bin")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let out_dir = target.join("gomux-go-compare");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let binary = out_dir.join("gomux-go-compare");
    // Built under another name and renamed, so that a run that starts meanwhile never sees a
    // half-written binary.
    let partial = out_dir.join(format!("gomux-go-compare.{}", process::id()));
    let mut command = Command::new(&go);
    if std::env::var_os("HOME").is_none() {
        // Go finds neither a build cache nor a module cache without a home directory.
        if std::env::var_os("GOCACHE").is_none() {
            command.env("GOCACHE", out_dir.join("cache"));
        }
        if std::env::var_os("GOMODCACHE").is_none() && std::env::var_os("GOPATH").is_none() {
            command.env("GOMODCACHE", out_dir.join("modules"));
        }
    }
    let proxy = std::env::var("GOPROXY")
        .ok()
        .filter(|list| !list.is_empty() && !list.split([',', '|']).any(|p| p == "off"))
        .unwrap_or_else(|| "https://proxy.golang.org,direct".to_string());
    let output = command
        .current_dir(&source)
        .args(["build", "-o"])
        .arg(&partial)
        .arg(".")
        .env("GOFLAGS", "-mod=readonly")
        .env("GOPROXY", proxy)
        .env("GOTOOLCHAIN", "local")
        .output()
        .map_err(|e| format!("running {}: {e}", go.display()))?;
    if !output.status.success() {
        return Err(format!(
            "`go build` in {} failed: {}",
            source.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    std::fs::rename(&partial, &binary)
        .map_err(|e| format!("renaming {}: {e}", binary.display()))?;
    Ok(binary)
}

/// How long the Go processes may take to start, and to end once the transfer is over.
const GO_START: Duration = Duration::from_secs(20);
/// How long a Go process is given to end by itself once the run has failed.
const GO_GONE: Duration = Duration::from_secs(2);
/// How long the Go transfer may go without moving a byte before it is given up.
const GO_STALL: Duration = Duration::from_secs(30);

/// The transfer between a Go sender and a Go receiver of `mux`, two processes of `binary` over
/// loopback TCP. `mode` names the row on the progress line. Returns the receiver's time, once
/// both digests check out.
pub fn run(
    mux: GoMux,
    binary: &Path,
    mode: &str,
    options: &Options,
    payload: &Payload,
) -> Result<Duration, String> {
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

    let args = |role: &str, words: &[&str]| {
        mux.words()
            .iter()
            .chain([role].iter())
            .chain(words)
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
    };
    let mut receiver = GoPeer::spawn(
        binary,
        &args("receive", &["-listen", "127.0.0.1:0", "-streams", &streams]),
    )
    .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let addr = match receiver.listening(GO_START) {
        Ok(addr) => addr,
        Err(e) => return Err(go_failure("the receiver", e, receiver.finish(GO_GONE))),
    };
    let mut sending = args("send", &["-connect", &addr.to_string()]);
    sending.extend(content);
    let mut sender = GoPeer::spawn(binary, &sending)
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;

    let received = match follow_receiver(&mut receiver, mode, payload.total()) {
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
            "cannot read the Go programs' results: sent {sent:?}, received {received:?}"
        ));
    };
    if sent_digest != expected {
        return Err(format!(
            "the Go sender's content or checksum differs from this tool's (digest {sent_digest:016x}, \
             expected {expected:016x}): the Go programs' content (bench_content.go in \
             tests/interop/go, content.go in benches/go-compare) no longer matches \
             benches/support and examples/speed.rs"
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
fn follow_receiver(receiver: &mut GoPeer, mode: &str, total: u64) -> Result<String, String> {
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
        draw_progress(mode, bytes, total, start.elapsed());
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
