//! The `tracing` feature: session and stream events reach the application's subscriber, with
//! the session's number and the stream's id on them.
//!
//! ```text
//! cargo test --features tracing --test tracing
//! ```

#![cfg(feature = "tracing")]

use std::io::Write;
use std::sync::{Arc, Mutex};

use gomux::Session;
use tokio::io::AsyncWriteExt;

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

#[test]
fn session_and_stream_events_carry_their_ids() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (a, b) = tokio::io::duplex(64 * 1024);
            let (client, server) = (Session::client(a), Session::server(b));
            let mut stream = client.open().await.expect("open");
            stream.write_all(b"hi").await.expect("write");
            let inbound = server.accept().await.expect("accept");
            drop((stream, inbound));
            client.close().await.expect("close");
            server.closed().await;
        });
    });
    let log = String::from_utf8(captured.0.lock().expect("log lock").clone()).expect("utf-8");
    for expected in [
        "session started",
        "stream opened",
        "peer opened a stream",
        "stream closed",
        "session ended",
        "stream=0",
        "session=",
    ] {
        assert!(log.contains(expected), "no {expected:?} in the log:\n{log}");
    }
}
