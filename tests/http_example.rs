//! `examples/http.rs`, run in this process: hyper serving HTTP/1.1 on the gomux streams of one
//! session, and clients sending many requests at once, each on a stream of its own.

#[allow(dead_code)] // the example's `main` and command line are not used here
#[path = "../examples/http.rs"]
mod http_example;

mod common;

use gomux::Session;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::within;
use http_example::{body_len, demo, run_client, serve, Summary};

/// Bytes the POST requests among the first `requests` echo: the odd-numbered ones.
fn echoed(requests: usize) -> u64 {
    (1..requests).step_by(2).map(|n| body_len(n) as u64).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_answers_64_requests_at_once_on_one_connection() {
    let summary = within("the demo", demo(64))
        .await
        .expect("every response right");
    assert_eq!(
        summary,
        Summary {
            requests: 64,
            gets: 32,
            echoed: echoed(64),
            streams: 64,
            elapsed: summary.elapsed,
        }
    );
    // Bodies up to 256 KiB: some of them larger than a stream's initial window.
    assert!(summary.echoed > 64 * 1024 * 16, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_answers_two_clients_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let server = tokio::spawn(serve(listener, false));

    let (first, second) = within("both clients", async {
        tokio::join!(run_client(addr, 100), run_client(addr, 150))
    })
    .await;
    for (summary, requests) in [(first, 100), (second, 150)] {
        let summary = summary.expect("every response right");
        assert_eq!(summary.requests, requests);
        assert_eq!(summary.streams, requests as u64);
        assert_eq!(summary.echoed, echoed(requests));
    }
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_written_by_hand_on_a_stream_gets_an_http_answer() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let server = tokio::spawn(serve(listener, false));
    let session = Session::client(TcpStream::connect(addr).await.expect("connect"));

    // A stream is a byte stream: an HTTP/1.1 request as text gets the server's answer as text.
    for (request, status, body) in [
        ("GET /hello/stream HTTP/1.1", "200 OK", "hello stream"),
        ("GET /nowhere HTTP/1.1", "404 Not Found", "no such route"),
    ] {
        let mut stream = session.open().await.expect("open");
        let text = format!("{request}\r\nHost: gomux\r\nConnection: close\r\n\r\n");
        stream.write_all(text.as_bytes()).await.expect("write");
        let mut response = String::new();
        within("the response", stream.read_to_string(&mut response))
            .await
            .expect("read the response");
        assert!(
            response.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{response}"
        );
        assert!(response.ends_with(&format!("\r\n\r\n{body}")), "{response}");
    }
    session.close().await.expect("close");
    server.abort();
}
