//! Receive-window tuning on a long fat link: one stream over a simulated 20 ms (each way),
//! 1 Gbit/s path, with windows that tune themselves against the protocol's fixed 64 KiB.
//!
//! A fixed 64 KiB window caps a stream at 64 KiB per round trip (1.6 MB/s at 40 ms); a window
//! grown to the path's bandwidth-delay product (5 MB) lets the link itself be the limit. The
//! link runs on tokio's paused clock, so each transfer takes the same virtual time on every run
//! and the ratio is a property of the protocol logic, not of the machine:
//!
//! ```text
//! cargo test --test window_tuning -- --nocapture
//! ```

mod link;

use std::time::Duration;

use gomux::{Config, Role, Session};
use link::Link;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// 20 ms each way, 1 Gbit/s, and a buffer of twice the bandwidth-delay product each way.
const PATH: Link = Link {
    latency: Duration::from_millis(20),
    bandwidth: 125_000_000,
    buffer: 10_000_000,
};

/// The fixed window: the protocol's initial one, never grown.
fn fixed() -> Config {
    Config::default().max_receive_window(64 * 1024)
}

/// Sends `bytes` on one stream from a client to a server over `link`, both with `config`, and
/// returns the throughput in bytes per second of (possibly virtual) time.
async fn throughput(link: Link, config: Config, bytes: usize) -> f64 {
    let (a, b) = link.pair();
    let client = Session::with_config(a, Role::Client, config.clone());
    let server = Session::with_config(b, Role::Server, config);
    let start = Instant::now();
    let sender = tokio::spawn(async move {
        let mut stream = client.open().await.expect("open");
        let chunk = vec![0x5a; 64 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            stream.write_all(&chunk[..n]).await.expect("write");
            left -= n;
        }
        stream.shutdown().await.expect("shutdown");
        client
    });
    let mut stream = server.accept().await.expect("accept");
    let mut buf = vec![0; 256 * 1024];
    let mut received = 0;
    loop {
        match stream.read(&mut buf).await.expect("read") {
            0 => break,
            n => received += n,
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    assert_eq!(received, bytes, "every byte arrives");
    drop(sender.await.expect("the sender finishes"));
    bytes as f64 / seconds
}

fn mb(rate: f64) -> String {
    format!("{:.1} MB/s", rate / 1e6)
}

#[tokio::test(start_paused = true)]
async fn tuned_windows_fill_a_long_fat_link_ten_times_faster_than_fixed_ones() {
    let fixed = throughput(PATH, fixed(), 16 << 20).await;
    let tuned = throughput(PATH, Config::default(), 256 << 20).await;
    println!(
        "20 ms / 1 Gbit/s, virtual time: fixed 64 KiB {}, tuned {} ({:.1}x)",
        mb(fixed),
        mb(tuned),
        tuned / fixed
    );
    // A fixed window delivers one window per round trip, and no more.
    let round_trip = 2.0 * PATH.latency.as_secs_f64();
    assert!(fixed <= 64.0 * 1024.0 / round_trip * 1.05, "{}", mb(fixed));
    assert!(
        tuned >= 10.0 * fixed,
        "tuned {} vs fixed {}",
        mb(tuned),
        mb(fixed)
    );
}

#[tokio::test(start_paused = true)]
async fn tuning_stays_within_the_configured_per_stream_maximum() {
    // A 1 MiB ceiling caps the stream at 1 MiB per round trip: the window grew to it and no
    // further.
    let capped = Config::default().max_receive_window(1 << 20);
    let rate = throughput(PATH, capped, 64 << 20).await;
    let round_trip = 2.0 * PATH.latency.as_secs_f64();
    let ceiling = f64::from(1 << 20) / round_trip;
    println!("1 MiB ceiling: {} (at most {})", mb(rate), mb(ceiling));
    assert!(rate <= ceiling * 1.05, "{} above the ceiling", mb(rate));
    assert!(
        rate >= ceiling * 0.5,
        "{}: the window did not grow",
        mb(rate)
    );
}
