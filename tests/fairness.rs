//! Fairness: streams writing at once share the connection, and a bulk transfer does not starve
//! small request/response streams beside it.
//!
//! The transport is a simulated 1 Gbit/s link with 1 ms of latency each way, on tokio's paused
//! clock: the time a round trip takes is virtual, the same on every run, and set by the bytes
//! queued ahead of it, which is what fairness is about.
//!
//! ```text
//! cargo test --test fairness -- --nocapture
//! ```

mod link;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gomux::{Config, Role, Session};
use link::Link;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// 1 ms each way, 1 Gbit/s, and a quarter of a megabyte of buffering each way.
const PATH: Link = Link {
    latency: Duration::from_millis(1),
    bandwidth: 125_000_000,
    buffer: 256 * 1024,
};

/// Bytes of outgoing frames a session queues before writers wait (the default).
const WRITE_BUFFER: usize = 1024 * 1024;

/// A client and a server session over a fresh simulated link. The server echoes every stream
/// whose first byte is `b'e'` and discards the others.
fn connect() -> (Session, Session) {
    let (a, b) = PATH.pair();
    let config = Config::default().write_buffer_size(WRITE_BUFFER);
    let client = Session::with_config(a, Role::Client, config.clone());
    let server = Session::with_config(b, Role::Server, config);
    let serving = server.clone();
    tokio::spawn(async move {
        while let Ok(mut stream) = serving.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                let echo = matches!(stream.read(&mut buf[..1]).await, Ok(1)) && buf[0] == b'e';
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) if echo => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    (client, server)
}

/// `count` round trips of a 64-byte message on one stream; returns the longest.
async fn slowest_round_trip(client: &Session, count: usize) -> Duration {
    let mut stream = client.open().await.expect("open");
    stream.write_all(b"e").await.expect("write");
    let message = [0x42; 64];
    let mut echo = [0; 64];
    let mut slowest = Duration::ZERO;
    for _ in 0..count {
        let start = Instant::now();
        stream.write_all(&message).await.expect("write");
        stream.read_exact(&mut echo).await.expect("read");
        slowest = slowest.max(start.elapsed());
    }
    slowest
}

/// Writes on a new stream until told to stop; counts the bytes written in `written`. The task
/// ends with the first error, which [`stopped`] reports.
fn bulk(client: &Session, written: Arc<AtomicU64>, stop: Arc<AtomicU64>) -> JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        let mut stream = client.open().await.expect("open");
        let chunk = vec![b'd'; 64 * 1024];
        while stop.load(Ordering::Relaxed) == 0 {
            stream.write_all(&chunk).await.expect("a bulk write");
            written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    })
}

/// Waits for a bulk writer told to stop, and fails with its panic (a failed open or write) if
/// it had one. The limit is virtual time: a writer that never finishes fails the test.
async fn stopped(writer: JoinHandle<()>) {
    match tokio::time::timeout(Duration::from_secs(60), writer).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => std::panic::resume_unwind(error.into_panic()),
        Err(_) => panic!("a bulk writer did not stop"),
    }
}

#[tokio::test(start_paused = true)]
async fn small_round_trips_stay_low_beside_a_bulk_stream() {
    let (client, _server) = connect();
    let quiet = slowest_round_trip(&client, 20).await;

    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU64::new(0));
    let writer = bulk(&client, Arc::clone(&written), Arc::clone(&stop));
    // Let the bulk stream fill every queue on the way first.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = written.load(Ordering::Relaxed);
    let mut small = Vec::new();
    for _ in 0..20 {
        let client = client.clone();
        small.push(tokio::spawn(async move {
            slowest_round_trip(&client, 20).await
        }));
    }
    let mut busy = Duration::ZERO;
    for task in small {
        busy = busy.max(task.await.expect("round trips"));
    }
    let moved = written.load(Ordering::Relaxed) - before;
    stop.store(1, Ordering::Relaxed);
    stopped(writer).await;

    // A small frame waits behind at most what is queued ahead of it: the session's queue and
    // the batch its driver is writing (each up to the write buffer plus one frame), and the
    // link's buffer; plus a millisecond per hop for the timer wheel's granularity. Waiting
    // behind the bulk stream's transfer would take seconds.
    let frame = 64 * 1024 + 8;
    let queued = (2 * (WRITE_BUFFER + frame) + PATH.buffer) as f64 / PATH.bandwidth as f64;
    let bound = quiet + Duration::from_secs_f64(queued) + Duration::from_millis(2);
    println!(
        "slowest 64 B round trip: {quiet:?} alone, {busy:?} beside the bulk stream \
         (bound {bound:?}); the bulk stream moved {} MiB meanwhile",
        moved >> 20
    );
    assert!(busy <= bound, "{busy:?} > {bound:?}");
    assert!(
        moved >= 1 << 20,
        "the bulk stream kept moving: {moved} bytes"
    );
}

#[tokio::test(start_paused = true)]
async fn streams_writing_at_once_share_the_connection_evenly() {
    const TIME: Duration = Duration::from_secs(2);
    let (client, _server) = connect();
    let stop = Arc::new(AtomicU64::new(0));
    let counters: Vec<_> = (0..8).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let writers: Vec<_> = counters
        .iter()
        .map(|written| bulk(&client, Arc::clone(written), Arc::clone(&stop)))
        .collect();
    tokio::time::sleep(TIME).await;
    let shares: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    stop.store(1, Ordering::Relaxed);
    for writer in writers {
        stopped(writer).await;
    }
    let total = shares.iter().sum::<u64>();
    let mean = total / shares.len() as u64;
    println!("bytes written per stream in {TIME:?}: {shares:?}, {total} in all");
    // Evenness means nothing if nothing moved: together the streams keep the link at least
    // half busy (the link carries PATH.bandwidth bytes a second).
    let half_the_link = PATH.bandwidth * TIME.as_secs() / 2;
    assert!(
        total >= half_the_link,
        "{total} bytes in {TIME:?}, under half of what the link carries: {shares:?}"
    );
    for share in &shares {
        assert!(
            *share >= mean / 2,
            "a stream got {share} bytes, under half the mean {mean}: {shares:?}"
        );
    }
}
