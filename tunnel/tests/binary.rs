//! The `gomux-tunnel` binary as people run it: keys made with `keygen`, both ends started with
//! pinned TLS (or `--insecure`) on ports the system picks, which each prints on standard
//! output, and what each logs on standard error.
//!
//! The bad-input test drives everything a stranger may send at an exposed tunnel (a port
//! scanner, garbage, a TLS client without the pinned key, a handshake that never finishes, a
//! SOCKS5 request for a forbidden target, a wrong password) while a client's transfer runs
//! through it, and checks that each is refused and logged once with its address (a SOCKS5
//! refusal by the entry too, with the SOCKS5 client's), and that the transfer's bytes arrive
//! intact.

mod common;
mod process;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gomux_tunnel::config::Handshakes;
use gomux_tunnel::{Identity, Meeting, Security};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

use common::{assert_same, pattern, within};
use process::{echo_server, private, End, Scratch, BINARY};

/// Runs `gomux-tunnel keygen --out DIR` and returns the fingerprint it printed, checking it
/// against `gomux-tunnel fingerprint --key DIR`.
async fn keygen(dir: &Path) -> String {
    let made = Command::new(BINARY)
        .arg("keygen")
        .arg("--out")
        .arg(dir)
        .output()
        .await
        .expect("run keygen");
    assert!(made.status.success(), "keygen: {made:?}");
    let fingerprint = String::from_utf8(made.stdout)
        .expect("text")
        .trim()
        .to_owned();
    assert_eq!(fingerprint.len(), 64, "a SHA-256 in hex: {fingerprint:?}");
    let read = Command::new(BINARY)
        .arg("fingerprint")
        .arg("--key")
        .arg(dir)
        .output()
        .await
        .expect("run fingerprint");
    assert_eq!(
        String::from_utf8(read.stdout).expect("text").trim(),
        fingerprint
    );
    fingerprint
}

/// A SOCKS5 client that authenticates with `user` and `password` (RFC 1929) and asks to
/// connect to `target`. Returns the connection and the reply code of the request, or `None`
/// when the authentication was refused.
async fn socks_connect(
    proxy: SocketAddr,
    user: &str,
    password: &str,
    target: SocketAddr,
) -> (TcpStream, Option<u8>) {
    let mut client = TcpStream::connect(proxy).await.expect("connect");
    client.write_all(&[5, 1, 2]).await.expect("greet");
    let mut answer = [0; 2];
    within("the method", client.read_exact(&mut answer))
        .await
        .expect("read the method");
    assert_eq!(answer, [5, 2], "username/password chosen");
    let mut auth = vec![1, user.len() as u8];
    auth.extend_from_slice(user.as_bytes());
    auth.push(password.len() as u8);
    auth.extend_from_slice(password.as_bytes());
    client.write_all(&auth).await.expect("authenticate");
    within("the authentication status", client.read_exact(&mut answer))
        .await
        .expect("read the status");
    if answer[1] != 0 {
        return (client, None);
    }
    let std::net::IpAddr::V4(ip) = target.ip() else {
        panic!("IPv4 only")
    };
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&ip.octets());
    request.extend_from_slice(&target.port().to_be_bytes());
    client.write_all(&request).await.expect("request");
    let mut reply = [0; 10];
    within("the reply", client.read_exact(&mut reply))
        .await
        .expect("read the reply");
    (client, Some(reply[1]))
}

/// Reads until the other side closes; true when it did (end of file, or a reset).
async fn closed_by_peer(socket: &mut TcpStream) -> bool {
    let mut sink = [0; 4096];
    within("the connection to be closed", async {
        loop {
            match socket.read(&mut sink).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_logged_once_and_costs_a_running_transfer_nothing() {
    let scratch = Scratch::new("bad-input");
    let entry_fp = keygen(&scratch.path("entry")).await;
    let exit_fp = keygen(&scratch.path("exit")).await;
    std::fs::write(scratch.path("password"), "sesame\n").expect("password file");
    private(&scratch.path("password"));
    let echo = echo_server().await;
    let forbidden = echo_server().await;
    let (key_entry, key_exit) = (scratch.path("entry"), scratch.path("exit"));
    let password_file = scratch.path("password");

    // A short handshake timeout, so that the one that never finishes is refused quickly.
    let allow = format!("127.0.0.1:{}", echo.port());
    let exit = End::start(
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--socks",
            "--key",
            key_exit.to_str().expect("path"),
            "--peer-fingerprint",
            &entry_fp,
            "--allow",
            &allow,
            "--socks-user",
            "ann",
            "--socks-password-file",
            password_file.to_str().expect("path"),
            "--handshake-timeout",
            "1",
        ],
        1,
    )
    .await;
    let exit_addr = exit.addr("entries").to_string();
    let entry = End::start(
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            &exit_addr,
            "--key",
            key_entry.to_str().expect("path"),
            "--peer-fingerprint",
            &exit_fp,
        ],
        1,
    )
    .await;
    let proxy = entry.addr("clients");

    // The client's transfer: it goes on sending, in chunks, until every bad input is done.
    let (mut client, reply) = socks_connect(proxy, "ann", "sesame", echo).await;
    assert_eq!(reply, Some(0), "the allowed target is reached");
    let done = Arc::new(AtomicBool::new(false));
    let (mut reader, mut writer) = client.split();
    let sending = {
        let done = Arc::clone(&done);
        async move {
            let mut sent = Vec::new();
            for seed in 0.. {
                let chunk = pattern(seed, 16 * 1024);
                writer.write_all(&chunk).await.expect("send");
                sent.extend_from_slice(&chunk);
                if done.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            writer.shutdown().await.expect("half-close");
            sent
        }
    };
    let receiving = async {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.expect("receive");
        got
    };
    let strangers = async {
        let exit_addr = exit.addr("entries");

        // A port scanner: connect, close.
        let scanner = TcpStream::connect(exit_addr).await.expect("connect");
        let scanner_addr = scanner.local_addr().expect("address").to_string();
        drop(scanner);
        exit.await_log(&["handshake failed", &scanner_addr], true)
            .await;

        // Garbage.
        let mut garbage = TcpStream::connect(exit_addr).await.expect("connect");
        let garbage_addr = garbage.local_addr().expect("address").to_string();
        garbage
            .write_all(&pattern(99, 4096))
            .await
            .expect("send garbage");
        assert!(closed_by_peer(&mut garbage).await);
        exit.await_log(&["handshake failed", &garbage_addr], true)
            .await;

        // A TLS client with a key the exit does not pin.
        let stranger = Identity::generate().expect("a key");
        let exit_fp = exit_fp.parse().expect("fingerprint");
        let security = Security::pinned(&stranger, exit_fp).expect("TLS settings");
        let meeting = Meeting {
            security,
            handshakes: Handshakes::default(),
        };
        let tcp = TcpStream::connect(exit_addr).await.expect("connect");
        let tls_addr = tcp.local_addr().expect("address").to_string();
        // TLS 1.3 lets the client finish before the server has checked its certificate: the
        // refusal arrives as the first read fails.
        if let Ok(mut tls) = meeting.security.dialled(tcp).await {
            let mut byte = [0; 1];
            let read = within("the refusal", tls.read(&mut byte)).await;
            assert!(matches!(read, Ok(0) | Err(_)), "refused: {read:?}");
        }
        exit.await_log(&["handshake failed", &tls_addr], true).await;

        // A handshake that never finishes: one byte of a TLS record, then silence.
        let started = Instant::now();
        let mut slow = TcpStream::connect(exit_addr).await.expect("connect");
        let slow_addr = slow.local_addr().expect("address").to_string();
        slow.write_all(&[0x16]).await.expect("send a byte");
        assert!(closed_by_peer(&mut slow).await);
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "closed at the handshake timeout, not before: {:?}",
            started.elapsed()
        );
        exit.await_log(&["handshake timed out", &slow_addr], true)
            .await;

        // A SOCKS5 request for a target outside the allow-list.
        let (mut denied, reply) = socks_connect(proxy, "ann", "sesame", forbidden).await;
        assert_eq!(reply, Some(2), "connection not allowed by ruleset");
        assert!(closed_by_peer(&mut denied).await);
        exit.await_log(&["not allowed", &forbidden.to_string()], true)
            .await;
        // The exit knows only the entry; the entry logs the refusal with the client's address.
        let denied_addr = denied.local_addr().expect("address").to_string();
        entry
            .await_log(&["not allowed", &forbidden.to_string(), &denied_addr], true)
            .await;

        // A wrong password.
        let (mut wrong, reply) = socks_connect(proxy, "ann", "open", echo).await;
        assert_eq!(reply, None, "authentication refused");
        assert!(closed_by_peer(&mut wrong).await);
        exit.await_log(&["wrong SOCKS5 user name or password"], true)
            .await;
        let wrong_addr = wrong.local_addr().expect("address").to_string();
        entry
            .await_log(
                &["wrong SOCKS5 user name or password", &wrong_addr, "ann"],
                true,
            )
            .await;

        done.store(true, Ordering::SeqCst);
    };
    let ((sent, got), ()) = within("the transfer and the strangers", async {
        tokio::join!(async { tokio::join!(sending, receiving) }, strangers)
    })
    .await;
    assert!(sent.len() >= 16 * 1024 * 10, "the transfer ran throughout");
    assert_same(&got, &sent, "the client's echo");

    // One authenticated connection all along: the entry never had to dial again.
    entry.await_log(&["connected to the exit"], true).await;
    // Its only warnings are the two SOCKS5 refusals, once each.
    let log = entry.log();
    let warnings = log.lines().filter(|line| line.contains("WARN")).count();
    assert_eq!(warnings, 2, "entry log:\n{log}");
}

/// An `--insecure` exit in front of an echo server and an entry dialling it, each with
/// `extra` options besides.
async fn insecure_ends(exit_extra: &[&str], entry_extra: &[&str]) -> (End, End) {
    let echo = echo_server().await;
    let target = echo.to_string();
    let mut args = vec![
        "exit",
        "--listen",
        "127.0.0.1:0",
        "--target",
        &target,
        "--insecure",
    ];
    args.extend_from_slice(exit_extra);
    let exit = End::start(&args, 1).await;
    let exit_addr = exit.addr("entries").to_string();
    let mut args = vec![
        "entry",
        "--listen",
        "127.0.0.1:0",
        "--exit",
        &exit_addr,
        "--insecure",
    ];
    args.extend_from_slice(entry_extra);
    let entry = End::start(&args, 1).await;
    (exit, entry)
}

/// Sends `len` bytes of pattern `seed` through the entry's clients' port, half-closes, and
/// checks that the echo comes back whole.
async fn echo_through(entry: &End, seed: u64, len: usize) {
    let mut client = TcpStream::connect(entry.addr("clients"))
        .await
        .expect("connect");
    let data = pattern(seed, len);
    client.write_all(&data).await.expect("send");
    client.shutdown().await.expect("half-close");
    let mut got = Vec::new();
    within("the echo", client.read_to_end(&mut got))
        .await
        .expect("receive");
    assert_same(&got, &data, "the echo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_mode_says_so_and_carries_as_before() {
    let (exit, entry) = insecure_ends(&[], &[]).await;
    for end in [&exit, &entry] {
        end.await_log(&["--insecure", "neither authenticated nor encrypted"], true)
            .await;
    }
    echo_through(&entry, 7, 256 * 1024).await;
}

/// The threads process `pid` runs, from /proc.
fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("Threads")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_runs_on_one_thread_unless_given_more() {
    let (exit, entry) = insecure_ends(&[], &["--threads", "3"]).await;
    echo_through(&entry, 11, 512 * 1024).await;
    // The exit carried a stream on its one thread; the entry has three workers besides the
    // thread that started it.
    assert_eq!(threads_of(exit.child.id().expect("running")), 1);
    assert!(threads_of(entry.child.id().expect("running")) >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ends_with_mismatched_pins_carry_nothing() {
    let scratch = Scratch::new("mismatch");
    let entry_fp = keygen(&scratch.path("entry")).await;
    let _exit_fp = keygen(&scratch.path("exit")).await;
    let other_fp = keygen(&scratch.path("other")).await;
    let echo = echo_server().await;
    let target = echo.to_string();
    let (key_entry, key_exit) = (scratch.path("entry"), scratch.path("exit"));

    let exit = End::start(
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--target",
            &target,
            "--key",
            key_exit.to_str().expect("path"),
            "--peer-fingerprint",
            &entry_fp,
        ],
        1,
    )
    .await;
    // The entry pins a certificate that is not the exit's.
    let exit_addr = exit.addr("entries").to_string();
    let entry = End::start(
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            &exit_addr,
            "--key",
            key_entry.to_str().expect("path"),
            "--peer-fingerprint",
            &other_fp,
        ],
        1,
    )
    .await;
    entry
        .await_log(
            &["cannot reach the exit", "invalid peer certificate"],
            false,
        )
        .await;
    // A client gets nothing through: no echo comes back (the entry turns it away once no
    // connection can be had, after a wait longer than this test's).
    let mut client = TcpStream::connect(entry.addr("clients"))
        .await
        .expect("connect");
    let _ = client.write_all(b"hello").await;
    let mut byte = [0; 1];
    let read = tokio::time::timeout(Duration::from_secs(1), client.read(&mut byte)).await;
    assert!(
        matches!(read, Err(_) | Ok(Ok(0)) | Ok(Err(_))),
        "nothing echoed: {read:?}"
    );
    assert!(!exit.log().contains("entry connected"), "{}", exit.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_beyond_the_handshake_limit_takes_the_oldest_silent_place() {
    let scratch = Scratch::new("limit");
    let entry_fp = keygen(&scratch.path("entry")).await;
    let key_exit = scratch.path("exit");
    keygen(&key_exit).await;
    let echo = echo_server().await.to_string();
    let exit = End::start(
        &[
            "exit",
            "--listen",
            "127.0.0.1:0",
            "--target",
            &echo,
            "--key",
            key_exit.to_str().expect("path"),
            "--peer-fingerprint",
            &entry_fp,
            "--max-handshakes",
            "2",
            "--handshake-timeout",
            "60",
        ],
        1,
    )
    .await;
    let exit_addr = exit.addr("entries");

    // Two silent connections hold both places, and two more are let in (up to twice the
    // limit) while the first are younger than a second...
    let started = Instant::now();
    let mut first = TcpStream::connect(exit_addr).await.expect("connect");
    let first_addr = first.local_addr().expect("address").to_string();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = TcpStream::connect(exit_addr).await.expect("connect");
    let second_addr = second.local_addr().expect("address").to_string();
    let _more = [
        TcpStream::connect(exit_addr).await.expect("connect"),
        TcpStream::connect(exit_addr).await.expect("connect"),
    ];
    // ... then a newcomer takes the oldest one's place, which is closed at once.
    tokio::time::sleep(Duration::from_millis(1150).saturating_sub(started.elapsed())).await;
    let _newcomer = TcpStream::connect(exit_addr).await.expect("connect");
    assert!(closed_by_peer(&mut first).await);
    assert!(
        started.elapsed() < Duration::from_millis(1800),
        "closed for the newcomer, not at the first-bytes timeout: {:?}",
        started.elapsed()
    );
    exit.await_log(&["to make room for a newcomer", &first_addr], true)
        .await;
    // The others, silent, are closed at the first-bytes timeout, long before the handshake
    // timeout.
    assert!(closed_by_peer(&mut second).await);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(30),
        "closed at the first-bytes timeout: {waited:?}"
    );
    exit.await_log(&["nothing sent", &second_addr], true).await;
}
