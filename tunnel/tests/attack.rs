//! The binary under attack, as a stranger (or the holder of the entry's key) would try it on
//! loopback: strangers connect from 127.0.0.2 and up, the real client and entry from
//! 127.0.0.1 (Linux routes all of 127/8 to the loopback interface).
//!
//! - Idle connections at the entry's client port do not keep a real SOCKS5 client out, nor
//!   idle connections at the exit's port a reconnecting entry: 10 of 10 each, each within 2 s,
//!   with 64 and with 256 strangers that reopen every connection closed.
//! - An entry that opens streams that never read, over many connections, leaves the exit
//!   under 128 MiB resident.
//! - Secrets stay out of the log at any level, peer strings are escaped, refusals from one
//!   address are summarised, failed passwords back off.

mod common;
mod process;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gomux::{Config, Role, Session};
use gomux_tunnel::config::Handshakes;
use gomux_tunnel::{Identity, Meeting, Security};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::process::Command;

use common::within;
use process::{echo_server, text, End, Scratch, BINARY};

/// The `n`th stranger's address: 127.0.0.2 and up.
fn stranger(n: usize) -> IpAddr {
    let n = n as u32 + 2;
    IpAddr::from([127, 0, (n >> 8) as u8, n as u8])
}

/// `count` strangers, each keeping one idle connection to `to` from its own address, and
/// opening another as soon as it is closed, until dropped. They run on a thread of their own,
/// as another machine's would, not among the real client's tasks.
struct Strangers {
    stop: Arc<AtomicBool>,
}

impl Strangers {
    fn start(count: usize, to: SocketAddr) -> Strangers {
        let stop = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the strangers");
        let handle = runtime.handle().clone();
        {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                runtime.block_on(async {
                    while !stop.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            });
        }
        for n in 0..count {
            let stop = Arc::clone(&stop);
            handle.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let socket = TcpSocket::new_v4().expect("socket");
                    socket
                        .bind(SocketAddr::new(stranger(n), 0))
                        .expect("bind a stranger's address");
                    let Ok(mut idle) = socket.connect(to).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    // Sends nothing; waits to be closed, then opens again.
                    let mut byte = [0; 1];
                    let _ =
                        tokio::time::timeout(Duration::from_secs(60), idle.read(&mut byte)).await;
                }
            });
        }
        Strangers { stop }
    }
}

impl Drop for Strangers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A SOCKS5 exchange with user name and password, to `target`, and one echo through it.
/// Returns the RFC 1929 status byte, and the reply code of the request if authenticated.
async fn socks_echo<S>(mut client: S, user: &str, password: &str, target: SocketAddr) -> (u8, u8)
where
    S: AsyncReadExt + AsyncWriteExt + Unpin,
{
    client.write_all(&[5, 1, 2]).await.expect("greet");
    let mut answer = [0; 2];
    client.read_exact(&mut answer).await.expect("the method");
    assert_eq!(answer, [5, 2], "username/password chosen");
    let mut auth = vec![1, user.len() as u8];
    auth.extend_from_slice(user.as_bytes());
    auth.push(password.len() as u8);
    auth.extend_from_slice(password.as_bytes());
    client.write_all(&auth).await.expect("authenticate");
    client.read_exact(&mut answer).await.expect("the status");
    if answer[1] != 0 {
        return (answer[1], 0xff);
    }
    let IpAddr::V4(ip) = target.ip() else {
        panic!("IPv4 only")
    };
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&ip.octets());
    request.extend_from_slice(&target.port().to_be_bytes());
    client.write_all(&request).await.expect("request");
    let mut reply = [0; 10];
    client.read_exact(&mut reply).await.expect("the reply");
    if reply[1] == 0 {
        client.write_all(b"ping").await.expect("send");
        let mut echo = [0; 4];
        client.read_exact(&mut echo).await.expect("the echo");
        assert_eq!(&echo, b"ping");
    }
    (0, reply[1])
}

/// A SOCKS5 exit with a password and an entry dialling it, both with pinned TLS; the entry's
/// identity is returned too, to dial the exit as a reconnecting entry would.
struct SocksTunnel {
    _scratch: Scratch,
    exit: End,
    entry: End,
    entry_identity: Identity,
    exit_fingerprint: String,
    echo: SocketAddr,
}

impl SocksTunnel {
    async fn start(log_level: &str) -> SocksTunnel {
        let scratch = Scratch::new("socks");
        let (entry_identity, entry_key) = scratch.identity("entry");
        let (exit_identity, exit_key) = scratch.identity("exit");
        let password = scratch.password("sesame");
        let echo = echo_server().await;
        let allow = format!("127.0.0.1:{}", echo.port());
        let (entry_fp, exit_fp) = (
            entry_identity.fingerprint().to_string(),
            exit_identity.fingerprint().to_string(),
        );
        let exit = End::start_logging(
            &[
                "exit",
                "--listen",
                "127.0.0.1:0",
                "--socks",
                "--allow",
                &allow,
                "--socks-user",
                "ann",
                "--socks-password-file",
                text(&password),
                "--key",
                text(&exit_key),
                "--peer-fingerprint",
                &entry_fp,
            ],
            1,
            log_level,
        )
        .await;
        let exit_addr = exit.addr("entries").to_string();
        let entry = End::start_logging(
            &[
                "entry",
                "--listen",
                "127.0.0.1:0",
                "--exit",
                &exit_addr,
                "--key",
                text(&entry_key),
                "--peer-fingerprint",
                &exit_fp,
            ],
            1,
            log_level,
        )
        .await;
        SocksTunnel {
            _scratch: scratch,
            exit,
            entry,
            entry_identity,
            exit_fingerprint: exit_fp,
            echo,
        }
    }

    /// A new connection to the exit, authenticated as the entry, as a session's client; dialled
    /// again after a failure, 100 ms later, as the entry does (its first backoff).
    async fn dial_as_entry(&self) -> Session {
        loop {
            match self.dial_once_as_entry().await {
                Ok(session) => return session,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn dial_once_as_entry(&self) -> std::io::Result<Session> {
        let meeting = Meeting {
            security: Security::pinned(
                &self.entry_identity,
                self.exit_fingerprint.parse().expect("fingerprint"),
            )
            .expect("TLS settings"),
            handshakes: Handshakes::default(),
        };
        let tcp = TcpStream::connect(self.exit.addr("entries")).await?;
        let tls = meeting.security.dialled(tcp).await?;
        Ok(Session::with_config(tls, Role::Client, Config::default()))
    }
}

/// Held by the tests that load the machine (hundreds of strangers, thousands of streams), so
/// that they run one at a time rather than slow each other down.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn strangers_do_not_keep_out_a_client_or_a_reconnecting_entry(strangers: usize) {
    let _heavy = HEAVY.lock().await;
    let tunnel = SocksTunnel::start("info").await;
    let _at_entry = Strangers::start(strangers, tunnel.entry.addr("clients"));
    let _at_exit = Strangers::start(strangers, tunnel.exit.addr("entries"));
    // Let them take every place they can.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let limit = Duration::from_secs(2);
    for attempt in 0..10 {
        let started = Instant::now();
        let exchange = async {
            let client = TcpStream::connect(tunnel.entry.addr("clients"))
                .await
                .expect("connect");
            socks_echo(client, "ann", "sesame", tunnel.echo).await
        };
        let outcome = tokio::time::timeout(limit, exchange).await;
        assert_eq!(
            outcome.ok(),
            Some((0, 0)),
            "client attempt {attempt} with {strangers} strangers, after {:?}; exit log:\n{}",
            started.elapsed(),
            tunnel.exit.log()
        );
    }
    for attempt in 0..10 {
        let started = Instant::now();
        let exchange = async {
            let session = tunnel.dial_as_entry().await;
            let stream = session.open().await.expect("open a stream");
            let outcome = socks_echo(stream, "ann", "sesame", tunnel.echo).await;
            let _ = session.close().await;
            outcome
        };
        let outcome = tokio::time::timeout(limit, exchange).await;
        assert_eq!(
            outcome.ok(),
            Some((0, 0)),
            "entry attempt {attempt} with {strangers} strangers, after {:?}; exit log:\n{}",
            started.elapsed(),
            tunnel.exit.log()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_idle_strangers_keep_out_neither_a_client_nor_an_entry() {
    strangers_do_not_keep_out_a_client_or_a_reconnecting_entry(64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fifty_six_idle_strangers_keep_out_neither_a_client_nor_an_entry() {
    strangers_do_not_keep_out_a_client_or_a_reconnecting_entry(256).await;
}

/// A target that sends 64 KiB to every connection, then waits for it to close.
async fn firehose() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = socket.write_all(&[7; 64 * 1024]).await;
                let mut sink = [0; 1024];
                while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_opening_streams_that_never_read_cannot_grow_the_exit_without_bound() {
    let _heavy = HEAVY.lock().await;
    let scratch = Scratch::new("memory");
    let (entry_identity, _) = scratch.identity("entry");
    let (exit_identity, exit_key) = scratch.identity("exit");
    let target = firehose().await.to_string();
    let entry_fp = entry_identity.fingerprint().to_string();
    let exit = End::start_logging(
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--target",
            &target,
            "--key",
            text(&exit_key),
            "--peer-fingerprint",
            &entry_fp,
        ],
        1,
        "warn",
    )
    .await;
    let meeting = Meeting {
        security: Security::pinned(&entry_identity, exit_identity.fingerprint())
            .expect("TLS settings"),
        handshakes: Handshakes::default(),
    };
    // Three connections, 4096 streams each, none ever read: 12,288 streams, each of which
    // the exit would connect to the firehose and fill with its 64 KiB.
    let mut sessions = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..3 {
        let tcp = TcpStream::connect(exit.addr("entries"))
            .await
            .expect("connect");
        let tls = within("the TLS handshake", meeting.security.dialled(tcp))
            .await
            .expect("TLS handshake");
        let session = Session::with_config(tls, Role::Client, Config::default());
        for _ in 0..4096 {
            match within("a stream to open", session.open()).await {
                Ok(stream) => streams.push(stream),
                Err(_) => break,
            }
        }
        sessions.push(session);
    }
    // Time for the exit to serve what it takes on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = exit.peak_resident_kib();
    println!(
        "exit peak resident: {} MiB, {} streams opened over {} connections",
        peak / 1024,
        streams.len(),
        sessions.len()
    );
    assert!(
        peak < 128 * 1024,
        "the exit peaked at {} MiB resident with {} streams opened; log:\n{}",
        peak / 1024,
        streams.len(),
        exit.log()
    );
    drop(streams);
    drop(sessions);
}

/// A SOCKS5 request for a host name, after the right password; returns the reply code.
async fn socks_domain(proxy: SocketAddr, host: &[u8]) -> u8 {
    let mut client = TcpStream::connect(proxy).await.expect("connect");
    client.write_all(&[5, 1, 2]).await.expect("greet");
    let mut answer = [0; 2];
    client.read_exact(&mut answer).await.expect("the method");
    client
        .write_all(b"\x01\x03ann\x06sesame")
        .await
        .expect("authenticate");
    client.read_exact(&mut answer).await.expect("the status");
    assert_eq!(answer, [1, 0], "authenticated");
    let mut request = vec![5, 1, 0, 3, host.len() as u8];
    request.extend_from_slice(host);
    request.extend_from_slice(&80u16.to_be_bytes());
    client.write_all(&request).await.expect("request");
    let mut reply = [0; 10];
    within("the reply", client.read_exact(&mut reply))
        .await
        .expect("the reply");
    reply[1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_and_no_raw_peer_string_reaches_the_log_at_any_level() {
    let tunnel = SocksTunnel::start("trace").await;
    let proxy = tunnel.entry.addr("clients");
    let client = TcpStream::connect(proxy).await.expect("connect");
    let (status, _) = socks_echo(client, "ann", "hunter2-wrong", tunnel.echo).await;
    assert_ne!(status, 0, "a wrong password is refused");
    tunnel
        .exit
        .await_log(&["wrong SOCKS5 user name or password"], false)
        .await;

    // A host name that would forge a log line and clear a terminal.
    let forged = b"evil.invalid\nFORGED  INFO the log says what I want\r\x1b[2J";
    let reply = socks_domain(proxy, forged).await;
    assert_ne!(reply, 0, "no such host");
    tunnel.exit.await_log(&["evil.invalid"], false).await;

    for (name, log) in [("exit", tunnel.exit.log()), ("entry", tunnel.entry.log())] {
        // Neither as text nor as the bytes' list ("h", "u", "n", "t", ...).
        assert!(
            !log.contains("hunter2"),
            "{name} log holds the password:\n{log}"
        );
        assert!(
            !log.contains("104, 117, 110, 116"),
            "{name} log holds the password's bytes:\n{log}"
        );
        assert!(
            !log.lines().any(|line| line.starts_with("FORGED")),
            "{name} log has a forged line:\n{log}"
        );
        assert!(!log.contains('\x1b'), "{name} log has an escape sequence");
        assert!(!log.contains('\r'), "{name} log has a carriage return");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_of_one_address_are_summarised_and_failed_passwords_back_off() {
    let tunnel = SocksTunnel::start("info").await;
    // 200 connections of garbage from one stranger's address.
    let exit_addr = tunnel.exit.addr("entries");
    for _ in 0..200 {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(stranger(1), 0))
            .expect("bind the stranger's address");
        let mut garbage = socket.connect(exit_addr).await.expect("connect");
        let _ = garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").await;
    }
    let stranger = stranger(1).to_string();
    // Refused as not TLS, or closed for a newcomer: either way a line each, at first.
    tunnel.exit.await_log(&["WARN", &stranger], false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = tunnel.exit.log();
    let lines = log.lines().filter(|line| line.contains(&stranger)).count();
    assert!(
        (1..=6).contains(&lines),
        "{lines} lines about one stranger:\n{log}"
    );

    // Wrong passwords in a row are answered ever later; the right one at once.
    let proxy = tunnel.entry.addr("clients");
    let mut last = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let client = TcpStream::connect(proxy).await.expect("connect");
        let (status, _) = socks_echo(client, "ann", "guess", tunnel.echo).await;
        assert_ne!(status, 0);
        last = started.elapsed();
    }
    assert!(
        last >= Duration::from_millis(700),
        "the fifth wrong password in a row answered after {last:?}"
    );
    let started = Instant::now();
    let client = TcpStream::connect(proxy).await.expect("connect");
    assert_eq!(
        socks_echo(client, "ann", "sesame", tunnel.echo).await,
        (0, 0)
    );
    assert!(started.elapsed() < Duration::from_millis(700));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_is_told_what_is_wrong() {
    let scratch = Scratch::new("operator");
    let (entry_identity, entry_key) = scratch.identity("entry");
    let (exit_identity, exit_key) = scratch.identity("exit");
    let (other, _) = scratch.identity("other");
    let echo = echo_server().await.to_string();
    let entry_fp = entry_identity.fingerprint().to_string();
    let exit = End::start_logging(
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--target",
            &echo,
            "--key",
            text(&exit_key),
            "--peer-fingerprint",
            &entry_fp,
        ],
        1,
        "info",
    )
    .await;
    let exit_addr = exit.addr("entries").to_string();

    // A wrong pin: both fingerprints named.
    let other_fp = other.fingerprint().to_string();
    let entry = End::start_logging(
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            &exit_addr,
            "--key",
            text(&entry_key),
            "--peer-fingerprint",
            &other_fp,
        ],
        1,
        "info",
    )
    .await;
    let exit_fp = exit_identity.fingerprint().to_string();
    entry.await_log(&[&exit_fp, &other_fp], false).await;
    drop(entry);

    // An --insecure entry facing a TLS exit: the exit says so.
    let entry = End::start_logging(
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            &exit_addr,
            "--insecure",
        ],
        1,
        "info",
    )
    .await;
    let _client = TcpStream::connect(entry.addr("clients")).await;
    exit.await_log(&["not TLS", "--insecure"], false).await;

    // A SOCKS exit without an allow-list says it is an open proxy.
    let open = End::start_logging(
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--socks",
            "--key",
            text(&exit_key),
            "--peer-fingerprint",
            &entry_fp,
        ],
        1,
        "info",
    )
    .await;
    open.await_log(&["gomux-tunnel: --socks without --allow"], false)
        .await;

    // A JSON log holds nothing but JSON objects, the start-up warning included.
    let json = End::start_logging(
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--target",
            &echo,
            "--insecure",
            "--log-format",
            "json",
        ],
        1,
        "info",
    )
    .await;
    json.await_log(&["--insecure", "\"level\":\"WARN\""], false)
        .await;
    let log = json.log();
    assert!(
        log.lines()
            .all(|line| line.starts_with('{') && line.ends_with('}')),
        "{log}"
    );

    // A usage error is one line and a hint; --version is one line.
    let wrong = Command::new(BINARY)
        .args(["entry", "--listen"])
        .output()
        .await
        .expect("run");
    assert_eq!(wrong.status.code(), Some(2));
    let said = String::from_utf8(wrong.stderr).expect("text");
    assert_eq!(said.lines().count(), 2, "{said}");
    assert!(said.contains("--help"), "{said}");
    let version = Command::new(BINARY)
        .arg("--version")
        .output()
        .await
        .expect("run");
    let said = String::from_utf8(version.stdout).expect("text");
    assert!(said.starts_with("gomux-tunnel 0."), "{said}");

    // A password file, or a key, that others can read is refused at start.
    use std::os::unix::fs::PermissionsExt;
    let password = scratch.password("sesame");
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let refused = Command::new(BINARY)
        .args([
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--socks",
            "--insecure",
            "--socks-user",
            "ann",
            "--socks-password-file",
            text(&password),
        ])
        .output()
        .await
        .expect("run");
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8(refused.stderr).expect("text");
    assert!(said.contains("chmod 600"), "{said}");
}
