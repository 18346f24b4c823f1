//! The metrics endpoint: a small HTTP/1.1 responder that answers `GET /metrics` with the
//! figures as OpenMetrics text, and anything else with 404, one request per connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::debug;

use super::metrics;
use crate::config::ACCEPT_RETRY;

/// The content type of the answer, as Prometheus asks for OpenMetrics.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The longest request head read; a longer one is answered 431 and closed.
const MAX_HEAD: usize = 8 * 1024;

/// How long a scraper may take to send its request, and to read the answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Scrapes answered at once; a connection beyond waits for a place (its socket only).
const SCRAPES: usize = 8;

/// Answers scrapes on `listener` for as long as the future runs.
pub async fn serve_metrics(listener: TcpListener) {
    let places = Arc::new(Semaphore::new(SCRAPES));
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                debug!(%error, "cannot accept a scrape");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Ok(place) = Arc::clone(&places).acquire_owned().await else {
            return;
        };
        tokio::spawn(async move {
            let _place = place;
            if let Err(error) = tokio::time::timeout(TIMEOUT, answer(socket)).await {
                debug!(%peer, %error, "scrape timed out");
            }
        });
    }
}

/// Reads one request head and answers it.
async fn answer(mut socket: TcpStream) {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let complete = loop {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if head.len() > MAX_HEAD {
            break false;
        }
    };
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (words.next(), words.next());
    let path = path.map(|p| p.split(|&b| b == b'?').next().unwrap_or_default());
    let (status, kind, body) = if !complete {
        (
            "431 Request Header Fields Too Large",
            "text/plain",
            String::new(),
        )
    } else if method == Some(b"GET") && path == Some(b"/metrics") {
        ("200 OK", CONTENT_TYPE, metrics().encode())
    } else {
        ("404 Not Found", "text/plain", "GET /metrics\n".to_owned())
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = socket.write_all(reply.as_bytes()).await;
    let _ = socket.shutdown().await;
}
