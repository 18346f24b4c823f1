//! The SOCKS5 exit of `gomux-tunnel` (`exit --socks`), end to end, in both directions:
//! `curl --socks5-hostname` in front of the entry, a small HTTP server behind the exit, and
//! every body checked byte for byte. A raw SOCKS5 client checks the replies to requests the
//! exit cannot serve.
//!
//! The curl tests need `curl` on `PATH`. Without it they print a `socks: SKIPPED` line and
//! pass, unless `CI` or `GOMUX_REQUIRE_TOOLS=1` is set: then they fail. So does the IPv6 test
//! on a machine without loopback IPv6.

mod common;
mod tunnel_support;

use std::io::{self, Write};
use std::net::SocketAddr;
use std::process::Stdio;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::process::Command;

use common::{assert_same, pattern, within};
use gomux_tunnel::Destination;
use tunnel_support::{bind, Direction, Task, Tunnel};

// ---------------------------------------------------------------------------------------------
// curl through the tunnel
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_socks_serves_concurrent_curl_requests() {
    curl_requests_at_once(Direction::Forward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_socks_serves_concurrent_curl_requests() {
    curl_requests_at_once(Direction::Reverse).await;
}

/// Twelve curl processes at once, each fetching a different body through the tunnel, half of
/// them naming the server by host name (resolved by the exit) and half by IPv4 address.
async fn curl_requests_at_once(direction: Direction) {
    if !curl_available() {
        return;
    }
    let http = HttpServer::spawn().await;
    let tunnel = Tunnel::start(direction, Destination::Socks).await;

    let sizes = [0, 1, 1000, 16 * 1024, 64 * 1024, 1024 * 1024];
    let requests: Vec<_> = (0..12u64)
        .map(|seed| {
            let host = if seed % 2 == 0 {
                "localhost"
            } else {
                "127.0.0.1"
            };
            let len = sizes[seed as usize % sizes.len()];
            let url = format!("http://{host}:{}/bytes/{seed}/{len}", http.addr.port());
            let proxy = tunnel.entry;
            tokio::spawn(async move {
                let body = curl(proxy, &url).await;
                assert_same(&body, &pattern(seed, len), &url);
            })
        })
        .collect();
    for request in requests {
        within("a curl request", request).await.expect("no panic");
    }
    tunnel
        .link
        .assert_connections(1, "every request went over one gomux connection");
}

/// Whether a test that cannot run must fail rather than skip: under CI, or with
/// `GOMUX_REQUIRE_TOOLS=1`.
fn skips_fail() -> bool {
    // CI services set `CI=true`; `CI=false` or an empty one is no CI.
    std::env::var("CI").is_ok_and(|value| !["", "0", "false"].contains(&&*value))
        || std::env::var("GOMUX_REQUIRE_TOOLS").is_ok_and(|value| value == "1")
}

/// Whether curl can be run; without it, a visible skip line, or a failure under CI.
fn curl_available() -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join("curl").is_file()));
    if found {
        return true;
    }
    assert!(
        !skips_fail(),
        "curl not found on PATH (apt-get install curl); with CI or GOMUX_REQUIRE_TOOLS=1 set, \
         the SOCKS5 tests must run"
    );
    // Straight to the process's standard error, past the test harness's capture, so that the
    // skip shows in a plain `cargo test`.
    let _ = writeln!(
        io::stderr(),
        "socks: SKIPPED curl tests: curl not found on PATH (apt-get install curl)"
    );
    false
}

/// Fetches `url` with curl through the SOCKS5 proxy at `proxy`, host names resolved by the
/// proxy, and returns the body. Fails the test on any error, HTTP ones included.
async fn curl(proxy: SocketAddr, url: &str) -> Vec<u8> {
    let output = Command::new("curl")
        // Ignore any ~/.curlrc (`-q` must come first), and any proxy settings of the
        // environment: a NO_PROXY naming localhost would let curl bypass the tunnel.
        .args([
            "-q",
            "--silent",
            "--show-error",
            "--fail",
            "--max-time",
            "60",
        ])
        .arg("--socks5-hostname")
        .arg(proxy.to_string())
        .arg(url)
        .env_remove("no_proxy")
        .env_remove("NO_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("http_proxy")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run curl");
    assert!(
        output.status.success(),
        "curl {url}: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

// ---------------------------------------------------------------------------------------------
// Requests the exit cannot serve
// ---------------------------------------------------------------------------------------------

/// SOCKS5 reply codes (RFC 1928, section 6).
const SUCCEEDED: u8 = 0;
const HOST_UNREACHABLE: u8 = 4;
const CONNECTION_REFUSED: u8 = 5;
const COMMAND_NOT_SUPPORTED: u8 = 7;
const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_exit_cannot_serve_get_their_error_reply_and_the_rest_carries_on() {
    let http = HttpServer::spawn().await;
    for direction in [Direction::Forward, Direction::Reverse] {
        let tunnel = Tunnel::start(direction, Destination::Socks).await;
        let what = |problem: &str| format!("{direction:?}: {problem}");

        // Nothing listens on this port: the exit's connect is refused.
        let (_held, closed) = closed_port();
        let mut client = socks_client(tunnel.entry).await;
        let reply = connect_request(&mut client, &ipv4(closed)).await;
        assert_eq!(reply, CONNECTION_REFUSED, "{}", what("a closed port"));
        assert_ended(&mut client, &what("after the refusal")).await;

        // A name in the reserved `.invalid` domain, which never resolves.
        let mut client = socks_client(tunnel.entry).await;
        let reply = connect_request(&mut client, &domain("gomux.invalid", 80)).await;
        assert_eq!(reply, HOST_UNREACHABLE, "{}", what("an unresolvable name"));

        // UDP ASSOCIATE (command 3) is not served.
        let mut client = socks_client(tunnel.entry).await;
        let mut request = vec![5, 3, 0];
        request.extend_from_slice(&ipv4(closed));
        let reply = raw_request(&mut client, &request).await;
        assert_eq!(reply, COMMAND_NOT_SUPPORTED, "{}", what("UDP ASSOCIATE"));

        // An address type that does not exist (2).
        let mut client = socks_client(tunnel.entry).await;
        let reply = raw_request(&mut client, &[5, 1, 0, 2, 127, 0, 0, 1, 0, 80]).await;
        assert_eq!(
            reply,
            ADDRESS_TYPE_NOT_SUPPORTED,
            "{}",
            what("address type 2")
        );

        // A client that offers only username/password authentication gets "no acceptable
        // methods", then the connection ends.
        let mut client = connect(tunnel.entry).await;
        client.write_all(&[5, 1, 2]).await.expect("greet");
        let mut answer = [0; 2];
        within("the method answer", client.read_exact(&mut answer))
            .await
            .expect("read the method answer");
        assert_eq!(answer, [5, 0xff], "{}", what("no acceptable method"));
        assert_ended(&mut client, &what("after no acceptable method")).await;

        // Not SOCKS at all: the stream is closed.
        let mut client = connect(tunnel.entry).await;
        client
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        assert_ended(&mut client, &what("an HTTP request")).await;

        // The same gomux connection still serves a good request, by IPv4 address and by name.
        for request in [ipv4(http.addr), domain("localhost", http.addr.port())] {
            let mut client = socks_client(tunnel.entry).await;
            assert_eq!(connect_request(&mut client, &request).await, SUCCEEDED);
            let body = http_get(&mut client, "/bytes/7/3000").await;
            assert_same(
                &body,
                &pattern(7, 3000),
                &what("a good request after the bad"),
            );
        }
        tunnel
            .link
            .assert_connections(1, &what("one gomux connection throughout"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_an_ipv6_address_is_served() {
    // Loopback IPv6 is missing on some machines (containers without it): then there is no
    // address to test with.
    let Ok(listener) = TcpListener::bind("[::1]:0").await else {
        assert!(
            !skips_fail(),
            "cannot bind [::1]; with CI or GOMUX_REQUIRE_TOOLS=1 set, the IPv6 test must run"
        );
        let _ = writeln!(io::stderr(), "socks: SKIPPED IPv6 test: cannot bind [::1]");
        return;
    };
    let http = HttpServer::on(listener);
    let tunnel = Tunnel::start(Direction::Reverse, Destination::Socks).await;

    let std::net::IpAddr::V6(ip) = http.addr.ip() else {
        unreachable!("bound to [::1]")
    };
    let mut request = vec![4];
    request.extend_from_slice(&ip.octets());
    request.extend_from_slice(&http.addr.port().to_be_bytes());
    let mut client = socks_client(tunnel.entry).await;
    assert_eq!(connect_request(&mut client, &request).await, SUCCEEDED);
    let body = http_get(&mut client, "/bytes/6/100000").await;
    assert_same(&body, &pattern(6, 100_000), "the body over IPv6");
}

// ---------------------------------------------------------------------------------------------
// A raw SOCKS5 client
// ---------------------------------------------------------------------------------------------

async fn connect(addr: SocketAddr) -> TcpStream {
    within("connect to the entry", TcpStream::connect(addr))
        .await
        .expect("connect to the entry")
}

/// A connection to the entry that has offered "no authentication" and had it accepted.
async fn socks_client(entry: SocketAddr) -> TcpStream {
    let mut client = connect(entry).await;
    client.write_all(&[5, 1, 0]).await.expect("greet");
    let mut answer = [0; 2];
    within("the method answer", client.read_exact(&mut answer))
        .await
        .expect("read the method answer");
    assert_eq!(answer, [5, 0], "no authentication accepted");
    client
}

/// A loopback address that refuses connections, for as long as the socket returned is kept: it
/// holds the port, bound but not listening, so that nothing else binds it meanwhile and no
/// outgoing connection takes it as its own port (which would connect to itself).
fn closed_port() -> (TcpSocket, SocketAddr) {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let addr = socket.local_addr().expect("address");
    (socket, addr)
}

/// The address part of a request (type, address, port) for an IPv4 address.
fn ipv4(addr: SocketAddr) -> Vec<u8> {
    let std::net::IpAddr::V4(ip) = addr.ip() else {
        panic!("not IPv4: {addr}")
    };
    let mut bytes = vec![1];
    bytes.extend_from_slice(&ip.octets());
    bytes.extend_from_slice(&addr.port().to_be_bytes());
    bytes
}

/// The address part of a request for a host name.
fn domain(host: &str, port: u16) -> Vec<u8> {
    let mut bytes = vec![3, u8::try_from(host.len()).expect("a short name")];
    bytes.extend_from_slice(host.as_bytes());
    bytes.extend_from_slice(&port.to_be_bytes());
    bytes
}

/// Sends a CONNECT request for `address` and returns the reply code.
async fn connect_request(client: &mut TcpStream, address: &[u8]) -> u8 {
    let mut request = vec![5, 1, 0];
    request.extend_from_slice(address);
    raw_request(client, &request).await
}

/// Sends a request and returns the reply code, having read the whole reply.
async fn raw_request(client: &mut TcpStream, request: &[u8]) -> u8 {
    client.write_all(request).await.expect("send the request");
    within("the reply", async {
        let mut head = [0; 4];
        client.read_exact(&mut head).await.expect("read the reply");
        assert_eq!(head[0], 5, "a SOCKS5 reply");
        let address_len = match head[3] {
            1 => 4,
            4 => 16,
            other => panic!("unexpected address type {other} in the reply"),
        };
        let mut rest = vec![0; address_len + 2];
        client.read_exact(&mut rest).await.expect("read the reply");
        head[1]
    })
    .await
}

/// Sends an HTTP/1.1 GET for `path` on a connected client and returns the body.
async fn http_get(client: &mut TcpStream, path: &str) -> Vec<u8> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    client
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut response = Vec::new();
    within("the response", client.read_to_end(&mut response))
        .await
        .expect("read the response");
    let head_end = find(&response, b"\r\n\r\n").expect("a complete response head") + 4;
    assert!(
        response.starts_with(b"HTTP/1.1 200 "),
        "{}",
        String::from_utf8_lossy(&response[..head_end])
    );
    response.split_off(head_end)
}

/// Reads until the connection ends, which must come without data: end-of-file, or a reset.
async fn assert_ended(client: &mut TcpStream, what: &str) {
    let mut got = Vec::new();
    let read = within(what, client.read_to_end(&mut got)).await;
    assert!(got.is_empty(), "{what}: unexpected data {got:?}");
    if let Err(error) = read {
        assert_eq!(
            error.kind(),
            io::ErrorKind::ConnectionReset,
            "{what}: unexpected error {error}"
        );
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

// ---------------------------------------------------------------------------------------------
// The HTTP server behind the exit
// ---------------------------------------------------------------------------------------------

/// A minimal HTTP/1.1 server: `GET /bytes/SEED/LEN` answers with `LEN` bytes of
/// `pattern(SEED, LEN)`, anything else with 404; one request per connection.
struct HttpServer {
    addr: SocketAddr,
    _task: Task,
}

impl HttpServer {
    async fn spawn() -> HttpServer {
        HttpServer::on(bind().await)
    }

    fn on(listener: TcpListener) -> HttpServer {
        let addr = listener.local_addr().expect("address");
        let task = Task::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve_http(socket));
            }
        });
        HttpServer { addr, _task: task }
    }
}

/// Request heads longer than this are refused: the server reads no more than it must.
const MAX_HEAD: usize = 8 * 1024;

async fn serve_http(mut socket: TcpStream) -> io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0; 1024];
    while find(&head, b"\r\n\r\n").is_none() {
        let n = socket.read(&mut buf).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("");
    let body = match path.strip_prefix("/bytes/").and_then(|rest| {
        let (seed, len) = rest.split_once('/')?;
        Some((seed.parse().ok()?, len.parse().ok()?))
    }) {
        Some((seed, len)) if len <= 16 * 1024 * 1024 => pattern(seed, len),
        _ => {
            let not_found =
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            socket.write_all(not_found.as_bytes()).await?;
            return socket.shutdown().await;
        }
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await?;
    socket.write_all(&body).await?;
    socket.shutdown().await
}
