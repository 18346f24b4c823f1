//! Building and running the Go peer (`tests/interop/go/`), shared by the interop suite and the
//! speed tool's `go` mode.
//!
//! The Go program is built against the unmodified Go gomux source that lies beside the clone,
//! in `../shared/gomux-go`, through the `replace` directive in its `go.mod`, with
//! `GOFLAGS=-mod=mod GOPROXY=off` so that nothing is downloaded. Where Go or that source is
//! missing, [`build`] says why, and the caller skips visibly (or fails, under
//! `GOMUX_REQUIRE_GO=1`, which CI sets).

// The suite and the speed tool each use their own subset.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The environment variable that turns a skip into a failure.
pub const REQUIRE_ENV: &str = "GOMUX_REQUIRE_GO";

/// The repository's root: the including crate's directory, or its parent for a crate of the
/// workspace (the tunnel's tests use this module too).
fn manifest_dir() -> &'static Path {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    match dir.parent() {
        Some(parent) if !dir.join("tests/interop/go").is_dir() => parent,
        _ => dir,
    }
}

/// Whether the caller must fail rather than skip when the Go peer cannot be built.
pub fn required() -> bool {
    std::env::var_os(REQUIRE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The `go` command: on the PATH, or where the official installer puts it.
fn go_command() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("go"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        let fallback = PathBuf::from("/usr/local/go/bin/go");
        fallback.is_file().then_some(fallback)
    })
}

/// Builds the Go peer (once per process; `go build` itself caches across processes) and returns
/// the path of its binary, or why it could not be built.
pub fn build() -> Result<PathBuf, String> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_now).clone()
}

fn build_now() -> Result<PathBuf, String> {
    let source = manifest_dir().join("tests/interop/go");
    let gomux_go = manifest_dir().join("../shared/gomux-go");
    if !gomux_go.join("mux.go").is_file() {
        return Err(format!(
            "the Go gomux source is not beside the clone (looked for {})",
            gomux_go.display()
        ));
    }
    let go = go_command().ok_or("no `go` command on the PATH or in /usr/local/go/bin")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir().join("target"));
    let out_dir = target.join("gomux-go-peer");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let binary = out_dir.join("gomux-go-peer");
    // Built under another name and renamed, so that a run that starts meanwhile never sees a
    // half-written binary.
    let partial = out_dir.join(format!("gomux-go-peer.{}", std::process::id()));
    let mut command = Command::new(&go);
    if std::env::var_os("GOCACHE").is_none() && std::env::var_os("HOME").is_none() {
        // Go needs a build cache and finds none without a home directory.
        command.env("GOCACHE", out_dir.join("cache"));
    }
    let output = command
        .current_dir(&source)
        .args(["build", "-o"])
        .arg(&partial)
        .arg(".")
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
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
    std::fs::rename(&partial, &binary).map_err(|e| format!("renaming the Go peer: {e}"))?;
    Ok(binary)
}

/// A running Go peer. Killed when dropped, so that a failing caller leaves no process behind.
pub struct GoPeer {
    child: Child,
    /// Lines for the program's stdin (the interop scenarios take "close" and "continue").
    stdin: GoStdin,
    /// Lines the program printed on stdout, as they come.
    stdout: mpsc::Receiver<String>,
    /// Everything it printed on stderr, once it exits.
    stderr: mpsc::Receiver<String>,
    /// Every stdout line seen so far.
    pub lines: Vec<String>,
}

/// What [`GoPeer::poll_line`] found.
pub enum Line {
    /// The rest of the line after the prefix.
    Found(String),
    /// No such line yet.
    NotYet,
    /// The program closed its stdout (it ended) without printing one.
    Ended,
}

/// How a Go peer's run ended.
#[derive(Debug)]
pub enum Exit {
    /// It exited by itself with this status code (`None`: killed by a signal).
    Exited { code: Option<i32>, stderr: String },
    /// It was still running at the deadline, and was killed.
    Hung { stderr: String },
}

impl Exit {
    pub fn success(&self) -> bool {
        matches!(self, Exit::Exited { code: Some(0), .. })
    }

    pub fn stderr(&self) -> &str {
        match self {
            Exit::Exited { stderr, .. } | Exit::Hung { stderr } => stderr,
        }
    }
}

impl GoPeer {
    /// Starts `binary` with `args`.
    pub fn spawn(binary: &Path, args: &[String]) -> std::io::Result<GoPeer> {
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdin = GoStdin(Arc::new(Mutex::new(child.stdin.take())));
        let (line_tx, stdout) = mpsc::channel();
        let out = child.stdout.take().expect("stdout is piped");
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (err_tx, stderr) = mpsc::channel();
        let mut err = child.stderr.take().expect("stderr is piped");
        thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            let _ = err_tx.send(text);
        });
        Ok(GoPeer {
            child,
            stdin,
            stdout,
            stderr,
            lines: Vec::new(),
        })
    }

    /// Waits up to `limit` for a stdout line that starts with `prefix`, and returns the rest of
    /// it.
    pub fn wait_line(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        match self.poll_line(prefix, limit) {
            Line::Found(rest) => Ok(rest),
            Line::NotYet => Err(format!("no line starting with {prefix:?} within {limit:?}")),
            Line::Ended => Err(format!("the Go peer ended before printing {prefix:?}")),
        }
    }

    /// Waits up to `limit` for a stdout line that starts with `prefix`.
    pub fn poll_line(&mut self, prefix: &str, limit: Duration) -> Line {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    self.lines.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return Line::Found(rest.trim().to_owned());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => return Line::NotYet,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Line::Ended,
            }
        }
    }

    /// Waits for the `listening HOST:PORT` line of a peer started with `-listen`.
    pub fn listening(&mut self, limit: Duration) -> Result<SocketAddr, String> {
        let rest = self.wait_line("listening ", limit)?;
        rest.parse()
            .map_err(|e| format!("bad listening address {rest:?}: {e}"))
    }

    /// A handle that sends lines to the program's stdin.
    pub fn stdin(&self) -> GoStdin {
        self.stdin.clone()
    }

    /// Whether the program has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits up to `limit` for the program to exit; kills it if it has not by then. A program
    /// still running at the deadline first gets SIGQUIT, on which a Go program prints the stack
    /// of every goroutine to stderr and exits: the stacks say where it hung.
    pub fn finish(&mut self, limit: Duration) -> Exit {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                _ => break None,
            }
        };
        let status = status.or_else(|| {
            let _ = Command::new("kill")
                .args(["-QUIT", &self.child.id().to_string()])
                .status();
            let quit_deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < quit_deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                thread::sleep(Duration::from_millis(5));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
            None
        });
        while let Ok(line) = self.stdout.recv_timeout(Duration::from_secs(1)) {
            self.lines.push(line);
        }
        let stderr = self
            .stderr
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_default();
        match status {
            Some(status) => Exit::Exited {
                code: status.code(),
                stderr,
            },
            None => Exit::Hung { stderr },
        }
    }
}

/// Sends lines to a Go peer's stdin; cheap to clone.
#[derive(Clone)]
pub struct GoStdin(Arc<Mutex<Option<ChildStdin>>>);

impl GoStdin {
    /// Sends one line. A program that has exited is not an error here: its exit status tells.
    pub fn send(&self, line: &str) {
        let mut stdin = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pipe) = stdin.as_mut() {
            if writeln!(pipe, "{line}")
                .and_then(|()| pipe.flush())
                .is_err()
            {
                *stdin = None;
            }
        }
    }
}

impl Drop for GoPeer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
