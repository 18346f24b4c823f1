//! Named services from config files, as operators run them: both ends started with
//! `--config`, services added and removed by a SIGHUP reload while clients are being relayed,
//! a file that does not check, `check --config`, a stream for a service the exit does not have,
//! and the metrics endpoint scraped and parsed as Prometheus would.

mod common;
mod process;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ring::digest::{digest, SHA256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;

use common::{pattern, within};
use process::{echo_server, text, End, Scratch, BINARY};

/// Size of the download that runs across the reload.
const DOWNLOAD: usize = 16 << 20;

/// A server that sends [`DOWNLOAD`] bytes of `pattern(7, ..)` to each client, then closes.
async fn download_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let content = pattern(7, DOWNLOAD);
        while let Ok((mut socket, _)) = listener.accept().await {
            let content = content.clone();
            tokio::spawn(async move {
                let _ = socket.write_all(&content).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    addr
}

/// A loopback port free a moment ago.
async fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address")
}

/// Sends `data` through `addr` and checks that it comes back (the services' targets echo).
async fn echoes(addr: SocketAddr, data: &[u8]) {
    let mut client = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    within("echo", async {
        client.write_all(data).await.expect("write");
        let mut back = vec![0; data.len()];
        client.read_exact(&mut back).await.expect("read back");
        assert!(back == data, "the echo differs");
    })
    .await;
}

/// Whether a client at `addr` is closed without a byte: refused at connect, or closed at once.
async fn refused(addr: SocketAddr) -> bool {
    let Ok(mut client) = TcpStream::connect(addr).await else {
        return true;
    };
    let _ = client.write_all(b"anyone?").await;
    let mut byte = [0; 1];
    matches!(
        within("a close", client.read(&mut byte)).await,
        Ok(0) | Err(_)
    )
}

/// Sends SIGHUP to an end.
async fn hangup(end: &End) {
    let pid = end.child.id().expect("running").to_string();
    let status = Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .await
        .expect("kill");
    assert!(status.success());
}

/// The text of an exit's config file with `services` (name, target) and `extra` keys.
fn exit_file(services: &[(&str, SocketAddr)], extra: &str) -> String {
    let mut file = format!("listen = \"127.0.0.1:0\"\ninsecure = true\ndrain = 20\n{extra}\n");
    for (name, target) in services {
        file += &format!("\n[[service]]\nname = \"{name}\"\ntarget = \"{target}\"\n");
    }
    file
}

/// The text of an entry's config file with `services` (name, listen) and `extra` keys.
fn entry_file(exit: SocketAddr, services: &[(&str, &str)], extra: &str) -> String {
    let mut file = format!("exit = \"{exit}\"\ninsecure = true\ndrain = 20\n{extra}\n");
    for (name, listen) in services {
        file += &format!("\n[[service]]\nname = \"{name}\"\nlisten = \"{listen}\"\n");
    }
    file
}

/// Starts an end from the config file at `path`, waiting for `listeners` printed addresses.
async fn start(mode: &str, path: &Path, listeners: usize) -> End {
    End::start(&[mode, "--config", text(path)], listeners).await
}

/// Three services, reloaded three times: `gamma` removed while a client of it is being
/// relayed and a download runs through `bulk` (both finish intact, and `gamma` takes no new
/// client), then `delta` added (it works), then a file that does not check (nothing
/// changes).
#[tokio::test]
async fn reloads_start_and_stop_services_while_others_carry_on() {
    let scratch = Scratch::new("services-reload");
    let (alpha, gamma, delta) = (
        echo_server().await,
        echo_server().await,
        echo_server().await,
    );
    let bulk = download_server().await;
    let exit_path = scratch.path("exit.toml");
    let entry_path = scratch.path("entry.toml");
    let three = [("alpha", alpha), ("bulk", bulk), ("gamma", gamma)];
    std::fs::write(&exit_path, exit_file(&three, "")).expect("write");
    let exit = start("exit", &exit_path, 1).await;
    let listen = ["127.0.0.1:0"; 3];
    let names = [
        ("alpha", listen[0]),
        ("bulk", listen[1]),
        ("gamma", listen[2]),
    ];
    std::fs::write(&entry_path, entry_file(exit.addr("entries"), &names, "")).expect("write");
    let entry = start("entry", &entry_path, 3).await;
    let (at_alpha, at_bulk, at_gamma) = (
        entry.addr("service.alpha"),
        entry.addr("service.bulk"),
        entry.addr("service.gamma"),
    );
    echoes(at_alpha, b"alpha before").await;
    echoes(at_gamma, b"gamma before").await;

    // A client of gamma, and a download through bulk, both under way across the reload.
    let mut gamma_client = TcpStream::connect(at_gamma).await.expect("connect");
    gamma_client.write_all(b"first").await.expect("write");
    let mut first = [0; 5];
    within("gamma's echo", gamma_client.read_exact(&mut first))
        .await
        .expect("echo");
    let mut download = TcpStream::connect(at_bulk).await.expect("connect");
    let mut received = vec![0; 64 * 1024];
    within("the download's start", download.read_exact(&mut received))
        .await
        .expect("read");

    // gamma removed, delta added, at both ends.
    let delta_listen = free_port().await.to_string();
    let reloaded = [("alpha", alpha), ("bulk", bulk), ("delta", delta)];
    std::fs::write(&exit_path, exit_file(&reloaded, "")).expect("write");
    let names = [
        ("alpha", listen[0]),
        ("bulk", listen[1]),
        ("delta", delta_listen.as_str()),
    ];
    // alpha and bulk keep their keys (and so their listeners, and the ports they were given).
    std::fs::write(&entry_path, entry_file(exit.addr("entries"), &names, "")).expect("write");
    hangup(&exit).await;
    exit.await_log(&["config file reloaded", "removed=gamma"], true)
        .await;
    hangup(&entry).await;
    entry
        .await_log(
            &["config file reloaded", "added=delta", "removed=gamma"],
            true,
        )
        .await;

    // gamma's client goes on; gamma takes no new one.
    within("gamma's client after the reload", async {
        gamma_client.write_all(b"second").await.expect("write");
        let mut second = [0; 6];
        gamma_client.read_exact(&mut second).await.expect("echo");
        assert_eq!(&second, b"second");
    })
    .await;
    assert!(refused(at_gamma).await, "gamma still takes clients");
    drop(gamma_client);
    entry
        .await_log(&["service removed: every client finished", "gamma"], true)
        .await;

    // The download finishes intact.
    within(
        "the rest of the download",
        download.read_to_end(&mut received),
    )
    .await
    .expect("read");
    let want = pattern(7, DOWNLOAD);
    assert_eq!(received.len(), want.len(), "the download's length");
    assert_eq!(
        digest(&SHA256, &received).as_ref(),
        digest(&SHA256, &want).as_ref(),
        "the download's SHA-256"
    );

    // delta works, alpha still does.
    let at_delta: SocketAddr = delta_listen.parse().expect("address");
    echoes(at_delta, b"delta after").await;
    echoes(at_alpha, b"alpha after").await;

    // A file that does not check changes nothing.
    std::fs::write(
        &entry_path,
        "exit = \"127.0.0.1:1\"\n[[service]]\nname = 3\n",
    )
    .expect("write");
    hangup(&entry).await;
    entry
        .await_log(&["ERROR", "does not check", "entry.toml:3"], true)
        .await;
    echoes(at_delta, b"delta still").await;
    echoes(at_alpha, b"alpha still").await;
    assert!(refused(at_gamma).await, "gamma came back");
}

/// A stream for a service the exit does not have is refused (its client closed, nothing
/// relayed), and logged at both ends with the service's name.
#[tokio::test]
async fn a_stream_for_an_unknown_service_is_refused_and_logged_at_both_ends() {
    let scratch = Scratch::new("services-unknown");
    let alpha = echo_server().await;
    let exit_path = scratch.path("exit.toml");
    let metrics = "metrics = \"127.0.0.1:0\"";
    std::fs::write(&exit_path, exit_file(&[("alpha", alpha)], metrics)).expect("write");
    let exit = start("exit", &exit_path, 2).await;
    let entry_path = scratch.path("entry.toml");
    let names = [("alpha", "127.0.0.1:0"), ("ghost", "127.0.0.1:0")];
    std::fs::write(
        &entry_path,
        entry_file(exit.addr("entries"), &names, metrics),
    )
    .expect("write");
    let entry = start("entry", &entry_path, 3).await;

    assert!(refused(entry.addr("service.ghost")).await, "ghost relayed");
    exit.await_log(&["WARN", "no such service", "ghost"], true)
        .await;
    entry
        .await_log(&["WARN", "the exit has no such service", "ghost"], true)
        .await;
    // The connection and the other service carry on.
    echoes(entry.addr("service.alpha"), b"still here").await;

    // Both ends count the refusal: the entry under the service's name, the exit (which has
    // no such service) under none.
    let refused = "gomux_tunnel_service_refused_total";
    let reason = ("reason", "unknown_service");
    let scraped = scrape(entry.addr("metrics")).await;
    assert_eq!(
        value(&scraped, refused, &[("service", "ghost"), reason]),
        Some(1.0)
    );
    let scraped = scrape(exit.addr("metrics")).await;
    assert_eq!(
        value(&scraped, refused, &[("service", ""), reason]),
        Some(1.0)
    );
}

/// A config-mode exit refuses the streams of an entry run with flags, which carry no
/// preface, and says why.
#[tokio::test]
async fn a_config_mode_exit_refuses_a_flag_mode_entry_and_says_why() {
    let scratch = Scratch::new("services-mixed");
    let alpha = echo_server().await;
    let exit_path = scratch.path("exit.toml");
    std::fs::write(&exit_path, exit_file(&[("alpha", alpha)], "")).expect("write");
    let exit = start("exit", &exit_path, 1).await;
    let exits = exit.addr("entries").to_string();
    let entry = End::start(
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            &exits,
            "--insecure",
        ],
        1,
    )
    .await;
    assert!(
        refused(entry.addr("clients")).await,
        "relayed without a preface"
    );
    exit.await_log(
        &["WARN", "without a service preface", "run with flags"],
        true,
    )
    .await;
}

/// A handshake that fails at a listening end is counted by reason.
#[tokio::test]
async fn failed_handshakes_are_counted_by_reason() {
    let scratch = Scratch::new("services-handshakes");
    let (_, exit_key) = scratch.identity("exit-key");
    let (entry_identity, _) = scratch.identity("entry-key");
    let exit_file = format!(
        "listen = \"127.0.0.1:0\"\nkey = \"{}\"\npeer_fingerprint = \"{}\"\n\
         metrics = \"127.0.0.1:0\"\n\n[[service]]\nname = \"a\"\ntarget = \"127.0.0.1:9\"\n",
        text(&exit_key),
        entry_identity.fingerprint(),
    );
    let exit_path = scratch.path("exit.toml");
    std::fs::write(&exit_path, exit_file).expect("write");
    let exit = start("exit", &exit_path, 2).await;
    let mut stranger = TcpStream::connect(exit.addr("entries"))
        .await
        .expect("connect");
    stranger
        .write_all(b"GET / HTTP/1.0\r\n\r\n")
        .await
        .expect("write");
    let mut rest = Vec::new();
    let _ = within("the close", stranger.read_to_end(&mut rest)).await;
    // Counted as the connection is closed: wait for it.
    let failures = "gomux_tunnel_handshake_failures_total";
    let counted = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let scraped = scrape(exit.addr("metrics")).await;
            if let Some(count) = value(&scraped, failures, &[("reason", "not_tls")]) {
                return count;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(counted.ok(), Some(1.0), "log:\n{}", exit.log());
}

/// An exit that restarts is dialled again (when the next client comes): the entry counts a
/// reconnect, and its connection is up again.
#[tokio::test]
async fn a_reconnect_is_counted() {
    let scratch = Scratch::new("services-reconnect");
    let alpha = echo_server().await;
    let exit_path = scratch.path("exit.toml");
    let exits = free_port().await;
    let exit_text = exit_file(&[("alpha", alpha)], "").replace("127.0.0.1:0", &exits.to_string());
    std::fs::write(&exit_path, &exit_text).expect("write");
    let mut exit = start("exit", &exit_path, 1).await;
    let entry_path = scratch.path("entry.toml");
    let names = [("alpha", "127.0.0.1:0")];
    let metrics = "metrics = \"127.0.0.1:0\"";
    std::fs::write(&entry_path, entry_file(exits, &names, metrics)).expect("write");
    let entry = start("entry", &entry_path, 2).await;
    echoes(entry.addr("service.alpha"), b"before").await;

    exit.child.kill().await.expect("kill the exit");
    exit = start("exit", &exit_path, 1).await;
    // The next client brings the entry's dial (it waits for it, up to `exit_wait`).
    echoes(entry.addr("service.alpha"), b"after").await;
    let reconnects = "gomux_tunnel_reconnects_total";
    let counted = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let scraped = scrape(entry.addr("metrics")).await;
            let up = value(&scraped, "gomux_tunnel_connection_up", &[]);
            if value(&scraped, reconnects, &[]) == Some(1.0) && up == Some(1.0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "no reconnect counted; log:\n{}",
        entry.log()
    );
    drop(exit);
}

/// The value of the sample of `name` with `labels` in `scrape`, if there is one.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

/// `check --config` says whether a file is valid, by its exit status, and where it is not.
#[tokio::test]
async fn check_validates_without_starting() {
    let scratch = Scratch::new("services-check");
    let good = scratch.path("good.toml");
    let target: SocketAddr = "127.0.0.1:9".parse().expect("address");
    std::fs::write(&good, exit_file(&[("a", target), ("b", target)], "")).expect("write");
    let typo = scratch.path("typo.toml");
    std::fs::write(
        &typo,
        "listen = \"127.0.0.1:0\"\ninsecure = true\nmax_stream = 3\n",
    )
    .expect("write");

    let check = |path: &Path| {
        Command::new(BINARY)
            .args(["check", "--config", text(path)])
            .output()
    };
    let ok = check(&good).await.expect("run check");
    assert!(ok.status.success(), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout).contains("valid (exit, 2 services)"));
    let bad = scratch.path("bad.toml");
    std::fs::write(
        &bad,
        "listen = \"127.0.0.1:0\"\ninsecure = true\n\n[[service]]\nname = \"a\"\n\
         target = \"127.0.0.1:9\"\nallow = [\"nowhere\"]\n",
    )
    .expect("write");
    let failed = check(&bad).await.expect("run check");
    assert!(!failed.status.success());
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(said.contains("bad.toml:4: service \"a\""), "{said}");
    let failed = check(&typo).await.expect("run check");
    assert!(!failed.status.success());
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(said.contains("typo.toml:3:"), "{said}");
    assert!(said.contains("max_stream"), "{said}");
}

/// A scrape of each end's metrics endpoint, parsed as Prometheus parses it, counts the known
/// traffic of each service: clients accepted, and bytes each way.
#[tokio::test]
async fn the_metrics_count_each_service() {
    let scratch = Scratch::new("services-metrics");
    let (alpha, beta) = (echo_server().await, echo_server().await);
    let exit_path = scratch.path("exit.toml");
    let metrics = "metrics = \"127.0.0.1:0\"";
    std::fs::write(
        &exit_path,
        exit_file(&[("alpha", alpha), ("beta", beta)], metrics),
    )
    .expect("write");
    let exit = start("exit", &exit_path, 2).await;
    let entry_path = scratch.path("entry.toml");
    let names = [("alpha", "127.0.0.1:0"), ("beta", "127.0.0.1:0")];
    std::fs::write(
        &entry_path,
        entry_file(exit.addr("entries"), &names, metrics),
    )
    .expect("write");
    let entry = start("entry", &entry_path, 3).await;

    for i in 0..3 {
        echoes(entry.addr("service.alpha"), &pattern(i, 1000)).await;
    }
    echoes(entry.addr("service.beta"), &pattern(9, 5000)).await;

    for end in [&entry, &exit] {
        // The last bytes are counted as they are written: a moment after the client read them.
        let mut last = String::new();
        let done = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let scrape = scrape(end.addr("metrics")).await;
                let want = [
                    (
                        value(
                            &scrape,
                            "gomux_tunnel_service_clients_accepted_total",
                            &[("service", "alpha")],
                        ),
                        3.0,
                    ),
                    (
                        value(
                            &scrape,
                            "gomux_tunnel_service_clients_accepted_total",
                            &[("service", "beta")],
                        ),
                        1.0,
                    ),
                    (
                        value(
                            &scrape,
                            "gomux_tunnel_service_bytes_total",
                            &[("service", "alpha"), ("direction", "to_target")],
                        ),
                        3000.0,
                    ),
                    (
                        value(
                            &scrape,
                            "gomux_tunnel_service_bytes_total",
                            &[("service", "alpha"), ("direction", "to_client")],
                        ),
                        3000.0,
                    ),
                    (
                        value(
                            &scrape,
                            "gomux_tunnel_service_bytes_total",
                            &[("service", "beta"), ("direction", "to_client")],
                        ),
                        5000.0,
                    ),
                    (
                        value(
                            &scrape,
                            "gomux_tunnel_service_clients_active",
                            &[("service", "alpha")],
                        ),
                        0.0,
                    ),
                    (value(&scrape, "gomux_tunnel_connection_up", &[]), 1.0),
                ];
                if want.iter().all(|(got, want)| *got == Some(*want)) {
                    return;
                }
                last = format!("{want:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(done.is_ok(), "the figures (got, want): {last}");
    }
}

/// Scrapes `addr`'s `GET /metrics`, checks the content type, and parses the answer.
async fn scrape(addr: SocketAddr) -> prometheus_parse::Scrape {
    let mut socket = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .expect("write");
    let mut answer = String::new();
    within("the answer", socket.read_to_string(&mut answer))
        .await
        .expect("read");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let lines = body.lines().map(|line| Ok(line.to_owned()));
    prometheus_parse::Scrape::parse(lines).expect("parse")
}

/// `--metrics` on an address that is not loopback is refused unless `--metrics-public` says
/// so.
#[tokio::test]
async fn public_metrics_need_saying_so() {
    let run = |extra: &'static [&'static str]| {
        let mut args = vec![
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            "127.0.0.1:1",
            "--insecure",
        ];
        args.extend_from_slice(extra);
        Command::new(BINARY).args(args).output()
    };
    let refused = within("entry", run(&["--metrics", "0.0.0.0:0"]))
        .await
        .expect("run");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("--metrics-public"), "{said}");

    // With it, the end starts and serves them.
    let end = End::start(
        &[
            "entry",
            "--listen",
            "127.0.0.1:0",
            "--exit",
            "127.0.0.1:1",
            "--insecure",
            "--metrics",
            "0.0.0.0:0",
            "--metrics-public",
        ],
        2,
    )
    .await;
    let port = end.addr("metrics").port();
    let scrape = scrape(SocketAddr::from(([127, 0, 0, 1], port))).await;
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric == "gomux_tunnel_connection_up"));
}
