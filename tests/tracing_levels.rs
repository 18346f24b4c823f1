//! With the `tracing` feature, a session that ends on a fault (here, a protocol error) is
//! logged at WARN, with the error; one that is closed is not.
//!
//! ```text
//! cargo test --features tracing --test tracing_levels
//! ```

#![cfg(feature = "tracing")]

use std::io::Write;
use std::sync::{Arc, Mutex};

use gomux::Session;

/// Log output captured in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The WARN lines (and above) logged while `scenario` runs.
fn warnings(scenario: impl std::future::Future<Output = ()>) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(scenario);
    });
    let log = captured.0.lock().expect("log lock").clone();
    String::from_utf8(log).expect("utf-8")
}

#[test]
fn a_session_that_ends_on_a_protocol_error_logs_a_warning() {
    let log = warnings(async {
        // Both ends think they are the client: the first open breaks the protocol.
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (one, other) = (Session::client(a), Session::client(b));
        let _stream = one.open().await.expect("open");
        other.closed().await;
    });
    assert!(
        log.contains("WARN") && log.contains("session failed") && log.contains("same role"),
        "{log}"
    );
}

#[test]
fn a_closed_session_logs_no_warning() {
    let log = warnings(async {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (client, server) = (Session::client(a), Session::server(b));
        let _stream = client.open().await.expect("open");
        client.close().await.expect("close");
        server.closed().await;
    });
    assert!(log.is_empty(), "{log}");
}

/// A refusal of a stream whose handle was dropped has nobody left to see it: it is logged at
/// WARN with the stream's id (and counted in `Stats::refused_by_peer`).
#[test]
fn a_refusal_of_a_dropped_stream_logs_a_warning_with_its_id() {
    use tokio::io::AsyncWriteExt;
    let log = warnings(async {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (client, server) = (Session::client(a), Session::server(b));
        let mut stream = client.open().await.expect("open");
        stream.write_all(b"request").await.expect("write");
        let id = stream.id();
        drop(stream);
        // The server never accepts it: its graceful close refuses it.
        server
            .graceful_close(std::time::Duration::from_secs(5))
            .await
            .expect("graceful close");
        client.closed().await;
        assert_eq!(client.stats().refused_by_peer, 1, "stream {id}");
    });
    assert!(
        log.contains("WARN") && log.contains("refused a stream") && log.contains("stream=0"),
        "{log}"
    );
}
