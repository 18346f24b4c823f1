//! What an idle session end costs in memory, beside Go gomux doing the same.
//!
//! ```text
//! cargo bench --bench idle_sessions                          # 10,000 sessions, 3 s idle
//! cargo bench --bench idle_sessions -- --sessions 1000 --idle 1 --no-go
//! ```
//!
//! N loopback TCP connections, a gomux session at each end, and on each session one stream that
//! moved one 16-byte message (the client writes it, the server echoes it) and stays open, its
//! handles held. Then every session is left alone for `--idle` seconds. Each process then gives
//! its free memory back to the kernel (glibc's `malloc_trim(0)`) and reads its resident set
//! (`/proc/self/statm`): the growth since before the first connection, divided by the session
//! ends the process holds, is what one idle session end costs: the session, its driver task,
//! its stream, the handles and the socket's registration with the runtime (not the kernel's
//! socket buffers, which are not resident memory of the process).
//!
//! Both ends run in this process when the open-files limit (its soft limit raised to the hard
//! one) has room for the 2N sockets; otherwise the client ends run in a second process (this
//! program, started with `--client ADDR`), and each process reports its own ends. The Go peer
//! (`tests/interop/go`, `bench idle`) then does the same with Go gomux in the same way (one
//! process or two), its memory read after `debug.FreeOSMemory()`; `--no-go` leaves it out.
//!
//! The last lines are for scripts:
//!
//! ```text
//! idle: rust N sessions, X bytes resident per session end (heap in use H)
//! idle: go N sessions, X bytes resident per session end (heap in use H)
//! ```
//!
//! Run as a test (`cargo test --benches`, without cargo bench's `--bench`), it holds 100 sessions
//! for no time, without Go, to check that it works.
//!
//! Memory figures need Linux (`/proc/self/statm`); `malloc_trim` needs glibc, and without it the
//! figures include memory the allocator keeps free. The heap in use is glibc's (`mallinfo2`),
//! 0 elsewhere; Go's is its runtime's `HeapInuse`.

#[path = "../tests/interop/go_peer.rs"]
mod go_peer;

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use go_peer::GoPeer;
use gomux::{Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn StdError + Send + Sync>;

const USAGE: &str = "\
usage: idle_sessions [--sessions N] [--idle SECONDS] [--no-go] [--two-processes]
defaults: --sessions 10000 --idle 3
  --two-processes  run the client ends in a second process even if one has files enough";

/// The one message each session's stream moves.
const MESSAGE: &[u8; 16] = b"idle-sessions-16";
/// Open files a process needs besides its sockets: the runtime's, the standard streams, the
/// listener, the pipes to a child.
const SPARE_FILES: u64 = 64;
/// How long a run of the other process (the Rust client, a Go peer) may take to report.
const REPORT_LIMIT: Duration = Duration::from_secs(600);

struct Options {
    sessions: usize,
    idle: Duration,
    go: bool,
    two_processes: bool,
    /// Set in the second process: the address to dial.
    client: Option<SocketAddr>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(problem) => {
            eprintln!("idle_sessions: {problem}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match options.client {
        Some(addr) => client_process(addr, &options),
        None => run(&options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idle_sessions: {error}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and then this is a check
    // that the program works, not a measurement.
    let measuring = args.iter().any(|a| a == "--bench");
    let mut options = Options {
        sessions: if measuring { 10_000 } else { 100 },
        idle: Duration::from_secs(if measuring { 3 } else { 0 }),
        go: measuring,
        two_processes: false,
        client: None,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--bench" => {}
            "--sessions" => {
                options.sessions = value()?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--sessions takes a positive whole number")?
            }
            "--idle" => {
                let seconds: f64 = value()?
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or("--idle takes a number of seconds")?;
                options.idle = Duration::from_secs_f64(seconds);
            }
            "--no-go" => options.go = false,
            "--two-processes" => options.two_processes = true,
            "--client" => {
                options.client = Some(
                    value()?
                        .parse()
                        .map_err(|e| format!("--client takes an address: {e}"))?,
                )
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Some(options))
}

// ---------------------------------------------------------------------------------------------
// The measurement.

fn run(options: &Options) -> Result<(), BoxError> {
    let n = options.sessions;
    let files = raise_file_limit();
    let one_process = !options.two_processes && files >= 2 * n as u64 + SPARE_FILES;
    println!(
        "# {n} sessions, {} s idle; open-files limit {files}: {}",
        options.idle.as_secs_f64(),
        if one_process {
            "both ends in one process"
        } else {
            "the client ends in a second process"
        }
    );

    let runtime = tokio::runtime::Runtime::new()?;
    let (rust, rust_heap) = runtime.block_on(rust_ends(options, one_process))?;
    drop(runtime);
    println!(
        "idle: rust {n} sessions, {rust:.0} bytes resident per session end \
         (heap in use {rust_heap:.0})"
    );

    if options.go {
        match go_ends(options, one_process)? {
            Some((resident, heap)) => {
                println!(
                    "idle: go {n} sessions, {resident:.0} bytes resident per session end \
                     (heap in use {heap:.0})"
                );
                if rust > 0.0 {
                    println!("# Go gomux holds {:.1}x as much", resident / rust);
                }
            }
            None => println!("# go: skipped"),
        }
    }
    Ok(())
}

/// The Rust sessions: both ends here, or the server ends here and the client ends in a second
/// process. Returns the resident bytes and the heap in use per session end, over all ends.
async fn rust_ends(options: &Options, one_process: bool) -> Result<(f64, f64), BoxError> {
    let n = options.sessions;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let before = Memory::now();
    if one_process {
        let (served, dialed) = tokio::try_join!(serve(listener, n), dial(addr, n))?;
        tokio::time::sleep(options.idle).await;
        let per_end = before.growth_per_end(2 * n);
        println!(
            "# rust, both ends in one process: {:.0} bytes per session end (heap in use {:.0})",
            per_end.0, per_end.1
        );
        drop((served, dialed));
        return Ok(per_end);
    }
    let exe = std::env::current_exe()?;
    let mut client = GoPeer::spawn(
        &exe,
        &[
            "--client".into(),
            addr.to_string(),
            "--sessions".into(),
            n.to_string(),
            "--idle".into(),
            options.idle.as_secs_f64().to_string(),
        ],
    )?;
    let served = serve(listener, n).await?;
    tokio::time::sleep(options.idle).await;
    let server = before.growth_per_end(n);
    println!(
        "# rust server ends: {:.0} bytes per session end (heap in use {:.0})",
        server.0, server.1
    );
    // The client measures with the server's sessions still open.
    let client_line = tokio::task::block_in_place(|| client.wait_line("client ", REPORT_LIMIT))?;
    let figures: Vec<f64> = client_line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the client process's figures {client_line:?}: {e}"))?;
    let [resident, heap] = figures[..] else {
        return Err(format!("the client process's figures: {client_line:?}").into());
    };
    println!("# rust client ends: {resident:.0} bytes per session end (heap in use {heap:.0})");
    drop(served);
    Ok(((server.0 + resident) / 2.0, (server.1 + heap) / 2.0))
}

/// The second process: the client ends. Prints "client BYTES" (per session end), then holds the
/// sessions until its standard input ends or it is killed.
fn client_process(addr: SocketAddr, options: &Options) -> Result<(), BoxError> {
    raise_file_limit();
    let runtime = tokio::runtime::Runtime::new()?;
    let held = runtime.block_on(async {
        let before = Memory::now();
        let dialed = dial(addr, options.sessions).await?;
        tokio::time::sleep(options.idle).await;
        let (resident, heap) = before.growth_per_end(options.sessions);
        println!("client {resident:.0} {heap:.0}");
        Ok::<_, BoxError>(dialed)
    })?;
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    drop(held);
    Ok(())
}

/// Accepts `n` connections, a server session on each, and echoes the one message on each
/// session's one stream.
async fn serve(listener: TcpListener, n: usize) -> Result<Vec<(Session, Stream)>, BoxError> {
    let mut held = Vec::with_capacity(n);
    let mut message = [0; MESSAGE.len()];
    for i in 0..n {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let session = Session::server(tcp);
        let mut stream = session
            .accept()
            .await
            .map_err(|e| format!("session {}: accepting its stream: {e}", i + 1))?;
        stream.read_exact(&mut message).await?;
        stream.write_all(&message).await?;
        stream.flush().await?;
        held.push((session, stream));
    }
    Ok(held)
}

/// Opens `n` connections to `addr`, a client session on each, and sends one message on one
/// stream of each, checking its echo.
async fn dial(addr: SocketAddr, n: usize) -> Result<Vec<(Session, Stream)>, BoxError> {
    let mut held = Vec::with_capacity(n);
    let mut echo = [0; MESSAGE.len()];
    for i in 0..n {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let session = Session::client(tcp);
        let mut stream = session
            .open()
            .await
            .map_err(|e| format!("session {}: opening its stream: {e}", i + 1))?;
        stream.write_all(MESSAGE).await?;
        stream.flush().await?;
        stream.read_exact(&mut echo).await?;
        if &echo != MESSAGE {
            return Err(format!("session {}: echo {echo:?}, sent {MESSAGE:?}", i + 1).into());
        }
        held.push((session, stream));
    }
    Ok(held)
}

/// The Go sessions, as the Go peer measures them: resident and heap-in-use bytes per session
/// end, or `None` when the Go peer cannot be built (and `GOMUX_REQUIRE_GO` is not set).
fn go_ends(options: &Options, one_process: bool) -> Result<Option<(f64, f64)>, BoxError> {
    let binary = match go_peer::build() {
        Ok(binary) => binary,
        Err(why) if !go_peer::required() => {
            println!("# go: {why}");
            return Ok(None);
        }
        Err(why) => return Err(why.into()),
    };
    let common = [
        "-sessions".to_string(),
        options.sessions.to_string(),
        "-idle".into(),
        format!("{}ms", options.idle.as_millis()),
    ];
    let args = |end: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["bench", "idle"].iter().map(|s| s.to_string()).collect();
        args.extend(end.iter().map(|s| s.to_string()));
        args.extend(common.iter().cloned());
        args
    };
    if one_process {
        let mut pair = GoPeer::spawn(&binary, &args(&["-pair"]))?;
        let line = pair.wait_line("idle-sessions: pair ", REPORT_LIMIT)?;
        let figures = parse_go_line(&line)?;
        println!("# go, both ends in one process: {line}");
        return Ok(Some(figures));
    }
    let mut server = GoPeer::spawn(&binary, &args(&["-listen", "127.0.0.1:0"]))?;
    let addr = server.listening(Duration::from_secs(30))?;
    let mut client = GoPeer::spawn(&binary, &args(&["-connect", &addr.to_string()]))?;
    let server_line = server.wait_line("idle-sessions: server ", REPORT_LIMIT)?;
    let client_line = client.wait_line("idle-sessions: client ", REPORT_LIMIT)?;
    println!("# go server ends: {server_line}");
    println!("# go client ends: {client_line}");
    let (server_resident, server_heap) = parse_go_line(&server_line)?;
    let (client_resident, client_heap) = parse_go_line(&client_line)?;
    Ok(Some((
        (server_resident + client_resident) / 2.0,
        (server_heap + client_heap) / 2.0,
    )))
}

/// "N sessions, R bytes resident per session end (heap in use H)" → (R, H).
fn parse_go_line(line: &str) -> Result<(f64, f64), BoxError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let resident = words
        .iter()
        .position(|w| *w == "resident")
        .and_then(|i| i.checked_sub(2))
        .and_then(|i| words.get(i))
        .and_then(|w| w.parse().ok());
    let heap = words
        .last()
        .map(|w| w.trim_end_matches(')'))
        .and_then(|w| w.parse().ok());
    match (resident, heap) {
        (Some(resident), Some(heap)) => Ok((resident, heap)),
        _ => Err(format!("cannot read the Go peer's line {line:?}").into()),
    }
}

// ---------------------------------------------------------------------------------------------
// The process: files and memory.

/// Raises the soft open-files limit to the hard one where allowed; returns the soft limit.
fn raise_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for the call to fill in or read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    #[allow(clippy::unnecessary_cast)] // `rlim_t` is not `u64` on every platform.
    let soft = limit.rlim_cur as u64;
    soft
}

/// The process's memory when a measurement starts: its resident set and glibc's heap in use
/// (the bytes allocated and not freed, which the resident set exceeds by the free memory
/// the allocator could not give back: holes in pages partly in use).
struct Memory {
    resident: u64,
    heap: u64,
}

impl Memory {
    fn now() -> Memory {
        Memory {
            resident: resident_after_trim(),
            heap: heap_in_use(),
        }
    }

    /// The growth of both since `self`, per session end.
    fn growth_per_end(&self, ends: usize) -> (f64, f64) {
        let now = Memory::now();
        let per_end = |now: u64, before: u64| now.saturating_sub(before) as f64 / ends as f64;
        (
            per_end(now.resident, self.resident),
            per_end(now.heap, self.heap),
        )
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let info = unsafe { libc::mallinfo2() };
    u64::try_from(info.uordblks + info.hblkhd).unwrap_or(u64::MAX)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn heap_in_use() -> u64 {
    0
}

/// The resident set in bytes, after the allocator has given its free memory back; 0 where it
/// cannot be read.
fn resident_after_trim() -> u64 {
    trim();
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf only reads a system setting.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only returns free memory of glibc's heaps to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
