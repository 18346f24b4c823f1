//! Both sides closing their sessions at once while data is queued both ways, under shuttle's
//! schedulers (see `wakeups.rs` for how and what is explored). In a file of its own: when
//! shuttle finds a deadlock, the test process aborts while it unwinds, and would take the
//! other scenarios with it.
//!
//! Run with `cargo test --manifest-path model-check/Cargo.toml --test busy_close`.

mod support;

use tokio::io::AsyncWriteExt;

use support::{check, content, sessions};

/// Close and flush: both sides have data queued both ways and close their sessions at once;
/// a flush waiting on a closing session returns.
#[test]
fn both_sides_close_at_once_while_busy() {
    check(|| {
        shuttle::future::block_on(async {
            let (client, server) = sessions();
            let mut stream = client.open().await.expect("open");
            stream.write_all(b"hello").await.expect("write");
            let mut inbound = server.accept().await.expect("accept");
            let data = content(4 * 1024);
            let server_writes = shuttle::future::spawn(async move {
                let _ = inbound.write_all(&content(4 * 1024)).await;
                let _ = inbound.flush().await;
                inbound
            });
            let _ = stream.write_all(&data).await;
            let server_closes = shuttle::future::spawn(async move { server.close().await });
            let client_closed = client.close().await;
            let _ = stream.flush().await;
            let server_closed = server_closes.await.expect("server task");
            drop(server_writes.await.expect("server writer"));
            client_closed.expect("the client's Session::close");
            server_closed.expect("the server's Session::close");
        });
    });
}
