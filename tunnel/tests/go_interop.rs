//! The tunnel's plain mode (`--insecure`) against a tunnel end built on Go gomux: the Go peer's
//! `tunnel entry` and `tunnel exit` (`tests/interop/go/tunnel.go`), built against the
//! unmodified Go gomux source beside the clone (`../shared/gomux-go`).
//!
//! Both pairings, the `gomux-tunnel` binary's entry with the Go exit and the Go entry with the
//! binary's exit, each with the entry dialling the exit (`--exit`) and reversed, with the exit
//! dialling the entry (`--entry`, `--accept-exit`): so each implementation opens the streams
//! both as the gomux client and as the gomux server. The exit forwards to an echo server in
//! this process. Through each, several
//! connections at once move 1 MiB each way, and a few more make short request/response
//! exchanges; every byte is compared with the pattern sent, every connection must end with an
//! end of file on both the client's side and the server's (no reset, nothing lost), and
//! neither end may log a warning or an error.
//!
//! Without Go or the Go gomux source the tests say so and pass, unless `CI` or
//! `GOMUX_REQUIRE_TOOLS=1` (or `GOMUX_REQUIRE_GO=1`) is set: then they fail.

mod common;
#[path = "../../tests/interop/go_peer.rs"]
mod go_peer;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use common::{assert_same, pattern, within, within_for};

const BINARY: &str = env!("CARGO_BIN_EXE_gomux-tunnel");

/// Connections that each move [`BULK`] bytes both ways at once.
const BULK_CONNECTIONS: usize = 4;
/// What each bulk connection sends (and gets back).
const BULK: usize = 1024 * 1024;
/// Connections that make [`EXCHANGES`] short request/response exchanges each.
const SHORT_CONNECTIONS: usize = 3;
const EXCHANGES: usize = 20;

/// How long a whole pairing may take before it counts as a hang: 8 MiB over loopback takes
/// well under a second; this is for a machine busy building.
const PAIRING: Duration = Duration::from_secs(120);

/// Whether a test that cannot run must fail rather than skip: under CI, or with
/// `GOMUX_REQUIRE_TOOLS=1` or `GOMUX_REQUIRE_GO=1`.
fn required() -> bool {
    // CI services set `CI=true`; `CI=false` or an empty one is no CI.
    std::env::var("CI").is_ok_and(|value| !["", "0", "false"].contains(&&*value))
        || std::env::var("GOMUX_REQUIRE_TOOLS").is_ok_and(|value| value == "1")
        || std::env::var("GOMUX_REQUIRE_GO").is_ok_and(|value| !value.is_empty() && value != "0")
}

/// The Go peer (`tests/interop/go`, built by the interop suite's `go_peer::build`); `None` (with a visible line) when it cannot be
/// built and the tests may skip, a failure when they may not.
fn go_peer_binary() -> Option<PathBuf> {
    match go_peer::build() {
        Ok(binary) => Some(binary),
        Err(why) if required() => panic!("the Go peer cannot be built: {why}"),
        Err(why) => {
            eprintln!(
                "SKIPPED: the Go peer cannot be built ({why}); with CI or GOMUX_REQUIRE_TOOLS=1 \
                 set, this fails"
            );
            None
        }
    }
}

/// One end of a tunnel running as a process, killed when dropped, its standard error kept.
struct End {
    name: &'static str,
    _child: Child,
    log: Arc<Mutex<String>>,
    /// The addresses it printed, in the order of the prefixes it was started with.
    listening: Vec<SocketAddr>,
}

impl End {
    /// Runs `program` with `args`, and waits for the lines of standard output that start with
    /// each of `prefixes` in turn and end with an address.
    async fn start(name: &'static str, program: &Path, args: &[&str], prefixes: &[&str]) -> End {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({}): {e}", program.display()));
        let log = Arc::new(Mutex::new(String::new()));
        tokio::spawn(keep_lines(
            child.stderr.take().expect("stderr"),
            Arc::clone(&log),
        ));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut listening = Vec::new();
        for prefix in prefixes {
            let addr = loop {
                let line = within("the address it printed", stdout.next_line())
                    .await
                    .expect("read stdout");
                let Some(line) = line else {
                    let log = log.lock().expect("not poisoned").clone();
                    panic!("{name} ended before it printed {prefix:?}; its log:\n{log}");
                };
                if let Some(addr) = line.strip_prefix(prefix) {
                    break addr.trim().parse().expect("an address");
                }
            };
            listening.push(addr);
        }
        // The rest of standard output is not needed, but must not fill its pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        End {
            name,
            _child: child,
            log,
            listening,
        }
    }

    fn log(&self) -> String {
        self.log.lock().expect("not poisoned").clone()
    }

    /// Checks that the log has no line that says something went wrong: a Rust end's warnings
    /// and errors, any line of the Go peer's (it writes to standard error only a failed dial or
    /// copy).
    #[track_caller]
    fn assert_quiet(&self) {
        let log = self.log();
        let go = self.name.contains("Go");
        let bad: Vec<&str> = log
            .lines()
            .filter(|line| go || line.contains("WARN") || line.contains("ERROR"))
            .collect();
        assert!(
            bad.is_empty(),
            "{} logged trouble: {bad:#?}\nits whole log:\n{log}",
            self.name
        );
    }
}

/// Appends every line `from` gives to `log`.
async fn keep_lines(from: impl AsyncRead + Unpin, log: Arc<Mutex<String>>) {
    let mut lines = BufReader::new(from).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut log = log.lock().expect("not poisoned");
        log.push_str(&line);
        log.push('\n');
    }
}

/// How one connection to the echo server went, seen from the server.
#[derive(Debug)]
struct Served {
    /// Bytes received (and echoed).
    bytes: usize,
    /// Whether it ended with an end of file, after which the echo's own end was sent.
    clean: bool,
}

/// An echo server on a loopback port that reports how each connection went.
async fn echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<Served>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (report, reports) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let report = report.clone();
            tokio::spawn(async move {
                let (mut reader, mut writer) = socket.split();
                let (bytes, clean) = match tokio::io::copy(&mut reader, &mut writer).await {
                    Ok(bytes) => (bytes, writer.shutdown().await.is_ok()),
                    Err(_) => (0, false),
                };
                let bytes = usize::try_from(bytes).expect("fits");
                let _ = report.send(Served { bytes, clean });
            });
        }
    });
    (addr, reports)
}

/// Sends [`BULK`] bytes of the pattern `seed` through the tunnel while reading the echo,
/// half-closes, and checks that every byte comes back and then an end of file.
async fn bulk(entry: SocketAddr, seed: u64) {
    let mut client = TcpStream::connect(entry).await.expect("connect");
    let data = pattern(seed, BULK);
    let (mut reader, mut writer) = client.split();
    let sending = async {
        writer.write_all(&data).await.expect("send");
        writer.shutdown().await.expect("half-close");
    };
    let receiving = async {
        let mut got = Vec::with_capacity(BULK);
        // Ok only at an end of file: a reset is an error.
        reader
            .read_to_end(&mut got)
            .await
            .expect("the echo, then an end of file");
        got
    };
    let ((), got) = tokio::join!(sending, receiving);
    assert_same(&got, &data, &format!("bulk connection {seed}"));
}

/// Makes [`EXCHANGES`] request/response exchanges of a few bytes each, every response awaited
/// before the next request, then half-closes and checks that an end of file follows.
async fn short(entry: SocketAddr, seed: u64) -> usize {
    let mut client = TcpStream::connect(entry).await.expect("connect");
    let mut sent = 0;
    for exchange in 0..EXCHANGES {
        let request = pattern(seed * 1000 + exchange as u64, 1 + exchange * 7);
        client.write_all(&request).await.expect("request");
        let mut response = vec![0; request.len()];
        client
            .read_exact(&mut response)
            .await
            .expect("the response");
        assert_same(
            &response,
            &request,
            &format!("connection {seed}, exchange {exchange}"),
        );
        sent += request.len();
    }
    client.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    client
        .read_to_end(&mut rest)
        .await
        .expect("an end of file after the last response");
    assert!(rest.is_empty(), "nothing after the last response: {rest:?}");
    sent
}

/// Runs the bulk and short connections at once through the tunnel whose clients connect to
/// `addr`, at `entry`, then checks what the echo server saw of each and that neither end
/// complained.
async fn exercise(
    addr: SocketAddr,
    entry: &End,
    exit: &End,
    reports: &mut mpsc::UnboundedReceiver<Served>,
) -> (usize, usize) {
    let bulks = (0..BULK_CONNECTIONS).map(|i| tokio::spawn(bulk(addr, i as u64)));
    let shorts = (0..SHORT_CONNECTIONS).map(|i| tokio::spawn(short(addr, 100 + i as u64)));
    let (bulks, shorts): (Vec<_>, Vec<_>) = (bulks.collect(), shorts.collect());
    let mut short_bytes = Vec::new();
    within_for(PAIRING, "every connection through the tunnel", async {
        for task in bulks {
            task.await.expect("a bulk connection");
        }
        for task in shorts {
            short_bytes.push(task.await.expect("a short connection"));
        }
    })
    .await;

    // The server's side of each: everything arrived, and the end of each was an end of file.
    let mut served = Vec::new();
    within("the echo server's reports", async {
        while served.len() < BULK_CONNECTIONS + SHORT_CONNECTIONS {
            served.push(reports.recv().await.expect("the echo server runs"));
        }
    })
    .await;
    assert!(
        served.iter().all(|s| s.clean),
        "every connection ended cleanly at the server: {served:?}"
    );
    let mut sizes: Vec<usize> = served.iter().map(|s| s.bytes).collect();
    let mut want: Vec<usize> = short_bytes;
    want.extend([BULK; BULK_CONNECTIONS]);
    sizes.sort_unstable();
    want.sort_unstable();
    assert_eq!(sizes, want, "bytes the echo server received, by connection");

    // No connection more than the test's made it through.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(reports.try_recv().is_err(), "no other connection arrived");
    entry.assert_quiet();
    exit.assert_quiet();
    (served.len(), sizes.iter().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_entry_with_go_exit() {
    let Some(go) = go_peer_binary() else { return };
    let (echo, mut reports) = echo_server().await;
    let target = echo.to_string();
    let exit = End::start(
        "the Go exit",
        &go,
        &[
            "tunnel",
            "exit",
            "-listen",
            "127.0.0.1:0",
            "-target",
            &target,
        ],
        &["tunnel exit listening "],
    )
    .await;
    let exit_addr = exit.listening[0].to_string();
    let entry = End::start(
        "the Rust entry",
        Path::new(BINARY),
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            &exit_addr,
            "--insecure",
        ],
        &["listening clients "],
    )
    .await;
    let clients = entry.listening[0];
    let (connections, bytes) = exercise(clients, &entry, &exit, &mut reports).await;
    eprintln!("Rust entry, Go exit: {connections} connections, {bytes} bytes each way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_entry_with_rust_exit() {
    let Some(go) = go_peer_binary() else { return };
    let (echo, mut reports) = echo_server().await;
    let target = echo.to_string();
    let exit = End::start(
        "the Rust exit",
        Path::new(BINARY),
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--target",
            &target,
            "--insecure",
        ],
        &["listening entries "],
    )
    .await;
    let exit_addr = exit.listening[0].to_string();
    let entry = End::start(
        "the Go entry",
        &go,
        &[
            "tunnel",
            "entry",
            "-listen",
            "127.0.0.1:0",
            "-exit",
            &exit_addr,
        ],
        &["tunnel entry listening "],
    )
    .await;
    let clients = entry.listening[0];
    let (connections, bytes) = exercise(clients, &entry, &exit, &mut reports).await;
    eprintln!("Go entry, Rust exit: {connections} connections, {bytes} bytes each way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_exit_dials_rust_entry() {
    let Some(go) = go_peer_binary() else { return };
    let (echo, mut reports) = echo_server().await;
    let target = echo.to_string();
    let entry = End::start(
        "the Rust entry",
        Path::new(BINARY),
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--accept-exit",
            "127.0.0.1:0",
            "--insecure",
        ],
        &["listening clients ", "listening exits "],
    )
    .await;
    let (clients, exits) = (entry.listening[0], entry.listening[1].to_string());
    let exit = End::start(
        "the Go exit",
        &go,
        &["tunnel", "exit", "-entry", &exits, "-target", &target],
        &["tunnel exit connected "],
    )
    .await;
    let (connections, bytes) = exercise(clients, &entry, &exit, &mut reports).await;
    eprintln!("Rust entry, Go exit dialling it: {connections} connections, {bytes} bytes each way");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_exit_dials_go_entry() {
    let Some(go) = go_peer_binary() else { return };
    let (echo, mut reports) = echo_server().await;
    let target = echo.to_string();
    let entry = End::start(
        "the Go entry",
        &go,
        &[
            "tunnel",
            "entry",
            "-listen",
            "127.0.0.1:0",
            "-accept-exit",
            "127.0.0.1:0",
        ],
        &["tunnel entry accepting-exit ", "tunnel entry listening "],
    )
    .await;
    let (entry_addr, clients) = (entry.listening[0].to_string(), entry.listening[1]);
    // Prints no address: it dials. The Go entry serves clients once it has connected.
    let exit = End::start(
        "the Rust exit",
        Path::new(BINARY),
        &[
            "exit",
            "--entry",
            &entry_addr,
            "--target",
            &target,
            "--insecure",
        ],
        &[],
    )
    .await;
    let (connections, bytes) = exercise(clients, &entry, &exit, &mut reports).await;
    eprintln!("Go entry, Rust exit dialling it: {connections} connections, {bytes} bytes each way");
}
