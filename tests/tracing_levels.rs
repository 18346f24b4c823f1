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
