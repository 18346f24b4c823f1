//! HTTP/1.1 over gomux streams with hyper 1.x: many concurrent requests on one TCP connection.
//!
//! A gomux stream is a byte stream like a TCP connection, so hyper runs on it unchanged: the
//! server end serves one HTTP/1.1 connection on every stream it accepts
//! (`hyper::server::conn::http1`), and the client end opens a stream per request and runs a
//! client connection on it (`hyper::client::conn::http1`). Requests sent at once travel side by
//! side on their own streams, each with its own flow control, over a single TCP connection:
//! none waits behind another, as requests on one HTTP/1.1 connection would.
//!
//! The server answers `GET /hello/NAME` with `hello NAME`, and `POST /echo` with the request's
//! body, streamed back as it arrives. The client sends its requests all at once, half of each
//! kind (the POST bodies pseudo-random, of up to 256 KiB), checks every response, and prints a
//! one-line summary.
//!
//! With no arguments, both ends run in this one process, on loopback:
//!
//! ```text
//! cargo run --release --example http
//! cargo run --release --example http -- --requests 1000
//! ```
//!
//! The two ends can also run apart, for example in two terminals:
//!
//! ```text
//! cargo run --release --example http -- server 127.0.0.1:7080
//! cargo run --release --example http -- client 127.0.0.1:7080 --requests 64
//! ```
//!
//! The client exits with status 1 if any response is not the one expected.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::process;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gomux::{Session, Stream};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Requests the client sends unless told otherwise.
const DEFAULT_REQUESTS: usize = 64;

/// The largest POST body the client sends.
const MAX_BODY: usize = 256 * 1024;

const USAGE: &str = "\
usage: http [--requests N]                 run server and client on loopback
       http server ADDR                    serve HTTP/1.1 on every gomux stream, on ADDR
       http client ADDR [--requests N]     send N requests at once, one stream each
default: --requests 64";

/// Errors of this example: anything, across tasks.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// What the command line asked for.
enum Command {
    /// Server and client in this process.
    Demo(usize),
    /// Only the server, on this address.
    Server(String),
    /// Only the client, connecting to this address.
    Client(String, usize),
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_args(&args) {
        Ok(Some(command)) => command,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(problem) => {
            eprintln!("http: {problem}\n{USAGE}");
            process::exit(2);
        }
    };

    let outcome = match command {
        Command::Demo(requests) => demo(requests).await.map(|summary| println!("{summary}")),
        Command::Server(addr) => run_server(&addr).await,
        Command::Client(addr, requests) => {
            async {
                let addr = tokio::net::lookup_host(&addr)
                    .await?
                    .next()
                    .ok_or_else(|| format!("{addr} resolves to no address"))?;
                let summary = run_client(addr, requests).await?;
                println!("{summary}");
                Ok(())
            }
            .await
        }
    };
    // A wrong response included, any error ends the process with a non-zero status.
    if let Err(error) = outcome {
        eprintln!("http: {error}");
        process::exit(1);
    }
}

/// Parses the arguments after the program name; `None` asks for the usage.
fn parse_args(args: &[String]) -> Result<Option<Command>, String> {
    let (mode, rest) = match args.first().map(String::as_str) {
        Some("-h" | "--help" | "help") => return Ok(None),
        Some("server") => match args.get(1..) {
            Some([addr]) => return Ok(Some(Command::Server(addr.clone()))),
            _ => return Err("server takes one address".into()),
        },
        Some("client") => match args.get(1) {
            Some(addr) => (Some(addr.clone()), &args[2..]),
            None => return Err("client needs the server's address".into()),
        },
        _ => (None, args),
    };
    let requests = match rest {
        [] => DEFAULT_REQUESTS,
        [flag, n] if flag == "--requests" => match n.parse() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("--requests needs a positive number, not {n:?}")),
        },
        _ => return Err(format!("unexpected arguments {rest:?}")),
    };
    Ok(Some(match mode {
        Some(addr) => Command::Client(addr, requests),
        None => Command::Demo(requests),
    }))
}

/// The self-contained demo: the server on an ephemeral loopback port, and the client sending
/// `requests` requests to it over one TCP connection.
pub async fn demo(requests: usize) -> Result<Summary, BoxError> {
    // Port 0: the operating system picks a free port, so the demo never collides with
    // anything already listening.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(serve(listener, false));
    let summary = run_client(addr, requests).await;
    server.abort();
    summary
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// `http server ADDR`: binds ADDR and serves until the process is stopped.
async fn run_server(addr: &str) -> Result<(), BoxError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    println!(
        "http: serving HTTP/1.1 over gomux on {}",
        listener.local_addr()?
    );
    serve(listener, true).await?;
    Ok(())
}

/// Accepts TCP connections, each one carrying a gomux session, until the listener fails.
pub async fn serve(listener: TcpListener, verbose: bool) -> io::Result<()> {
    loop {
        let (socket, peer) = listener.accept().await?;
        // Small frames (window updates, closes, short responses) would otherwise wait for
        // the peer's acknowledgements under Nagle's algorithm.
        socket.set_nodelay(true)?;
        tokio::spawn(async move {
            let (reason, streams) = serve_session(socket).await;
            if verbose {
                println!("http: session with {peer} ended after {streams} streams: {reason}");
            }
        });
    }
}

/// Serves HTTP/1.1 on every stream of one session until it ends; returns why it ended and how
/// many streams it carried.
async fn serve_session(socket: TcpStream) -> (gomux::Error, u64) {
    let session = Session::server(socket);
    let mut streams = 0;
    loop {
        match session.accept().await {
            Ok(stream) => {
                streams += 1;
                // One task per stream, so a slow request never holds up the others.
                tokio::spawn(serve_stream(stream, session.clone()));
            }
            Err(reason) => return (reason, streams),
        }
    }
}

/// Runs one HTTP/1.1 connection on a stream, until the client closes its end, or until the
/// session drains (`Session::graceful_close`, the peer's CloseMux, an error): then hyper's
/// `graceful_shutdown` lets the request in flight finish, answered with `Connection: close`,
/// and ends the connection, so that the session's drain is not held up by idle keep-alive
/// connections.
async fn serve_stream(stream: Stream, session: Session) {
    let id = stream.id();
    // `TokioIo` adapts tokio's I/O traits to hyper's.
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service_fn(respond));
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = session.draining() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        eprintln!("http: stream {id}: {error}");
    }
}

/// A response body: a fixed one, or a request's body streamed back.
type Body = BoxBody<Bytes, hyper::Error>;

/// The server's two routes.
async fn respond(request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path();
    let response =
        if let (&Method::GET, Some(name)) = (request.method(), path.strip_prefix("/hello/")) {
            text(StatusCode::OK, format!("hello {name}"))
        } else if request.method() == Method::POST && path == "/echo" {
            // The body goes back as it arrives, chunk by chunk, never whole in memory: the
            // stream's flow control paces the client to what this side sends on.
            Response::new(request.into_body().boxed())
        } else {
            text(StatusCode::NOT_FOUND, "no such route".into())
        };
    Ok(response)
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let body = Full::new(Bytes::from(body))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "text/plain".parse().expect("a valid header"));
    response
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/// What a client run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Requests sent, each answered as expected.
    pub requests: usize,
    /// Of which GET /hello.
    pub gets: usize,
    /// Bytes of POST bodies echoed (each way).
    pub echoed: u64,
    /// gomux streams the client opened, by the session's count.
    pub streams: u64,
    /// From the first request to the last response.
    pub elapsed: Duration,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "http: {} requests at once ({} GET, {} POST echoing {} bytes) on {} gomux streams \
             over one TCP connection in {:.3} s; every response checked",
            self.requests,
            self.gets,
            self.requests - self.gets,
            self.echoed,
            self.streams,
            self.elapsed.as_secs_f64(),
        )
    }
}

/// Connects to the server at `addr`, sends `requests` requests at once, each on a stream of
/// its own, and checks every response.
pub async fn run_client(addr: SocketAddr, requests: usize) -> Result<Summary, BoxError> {
    let socket = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    socket.set_nodelay(true)?;
    let session = Session::client(socket);

    let started = Instant::now();
    let mut exchanges = JoinSet::new();
    for number in 0..requests {
        exchanges.spawn(exchange(session.clone(), number));
    }
    let mut summary = Summary {
        requests,
        gets: 0,
        echoed: 0,
        streams: 0,
        elapsed: Duration::ZERO,
    };
    while let Some(outcome) = exchanges.join_next().await {
        match outcome?? {
            Exchanged::Hello => summary.gets += 1,
            Exchanged::Echo(bytes) => summary.echoed += bytes as u64,
        }
    }
    summary.elapsed = started.elapsed();
    summary.streams = session.stats().streams_opened;
    // Flushes what is left (the streams' closes), then tells the server with CloseMux.
    session.close().await?;
    Ok(summary)
}

/// What one request was.
enum Exchanged {
    Hello,
    /// A POST, with its body's length.
    Echo(usize),
}

/// Sends request `number` on a new stream and checks the response: even numbers GET a
/// greeting, odd ones POST a body to be echoed.
async fn exchange(session: Session, number: usize) -> Result<Exchanged, BoxError> {
    let stream = session.open().await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // The connection does the reading and writing; it ends, and drops (closes) the stream,
    // once `sender` is dropped and the response has been read.
    let connection = tokio::spawn(connection);

    let request = Request::builder().header(HOST, "gomux");
    let (request, expected, exchanged) = if number % 2 == 0 {
        let request = request
            .method(Method::GET)
            .uri(format!("/hello/{number}"))
            .body(Empty::new().boxed())?;
        let expected = Bytes::from(format!("hello {number}"));
        (request, expected, Exchanged::Hello)
    } else {
        let body = Bytes::from(pattern(number as u64, body_len(number)));
        let request = request
            .method(Method::POST)
            .uri("/echo")
            .body(Full::new(body.clone()).boxed())?;
        let len = body.len();
        (request, body, Exchanged::Echo(len))
    };

    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    drop(sender);
    connection.await??;

    if status != StatusCode::OK {
        return Err(format!("request {number}: status {status}").into());
    }
    if body != expected {
        return Err(format!(
            "request {number}: a body of {} bytes came back instead of the {} expected{}",
            body.len(),
            expected.len(),
            match body.iter().zip(&expected[..]).position(|(a, b)| a != b) {
                Some(at) => format!(", differing from byte {at}"),
                None => String::new(),
            }
        )
        .into());
    }
    Ok(exchanged)
}

/// The length of the body of POST request `number`: spread between 1 byte and [`MAX_BODY`],
/// so that some fit in one gomux frame and others take many, and more than a stream's window.
pub fn body_len(number: usize) -> usize {
    1 + number.wrapping_mul(40_503) % MAX_BODY
}

/// `len` pseudo-random bytes (xorshift), different for every `seed`: bytes delivered to the
/// wrong request would not match.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}
