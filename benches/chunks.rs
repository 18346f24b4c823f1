//! The zero-copy stream API against the copying one: messages of 64 B, 1 KiB and 64 KiB on one
//! stream over loopback TCP, sent with `write_all` and read with `read` into the application's
//! buffer (`copy`), or sent with `write_chunk` and read with `read_chunk` (`zero-copy`).
//!
//! One group per message size, `chunks/64B`, `chunks/1KiB` and `chunks/64KiB`, both rows in
//! each, on one connection per row set up outside the timed part.
//!
//! ```text
//! cargo bench --bench chunks
//! ```

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gomux::{Config, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

mod support;

/// Bytes moved per iteration; less in test mode.
const BATCH: usize = 4 << 20;

#[derive(Debug, Clone, Copy)]
enum Path {
    Copy,
    ZeroCopy,
}

fn chunks(c: &mut Criterion) {
    let rt = support::runtime();
    let batch = if support::test_mode() {
        64 << 10
    } else {
        BATCH
    };
    for (name, size) in [("64B", 64), ("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let mut group = c.benchmark_group(format!("chunks/{name}"));
        group
            .sample_size(20)
            .measurement_time(Duration::from_secs(3))
            .throughput(Throughput::Bytes(batch as u64));
        for (row, path) in [("copy", Path::Copy), ("zero-copy", Path::ZeroCopy)] {
            let mut streams = Some(rt.block_on(connect()));
            group.bench_function(row, |b| {
                b.iter_custom(|iters| {
                    let pair = streams.take().expect("the streams came back");
                    let (pair, time) = move_messages(&rt, pair, path, size, batch * iters as usize);
                    streams = Some(pair);
                    time
                })
            });
        }
        group.finish();
    }
}

/// The two ends of one stream on a gomux connection over loopback TCP. The sessions close when
/// the streams' last handles go (the session handles are dropped here).
async fn connect() -> (Stream, Stream) {
    let pair = support::gomux_tcp(Config::default())
        .await
        .expect("gomux over TCP");
    let (sending, receiving) = tokio::join!(pair.client.open(), pair.server.accept());
    (
        sending.expect("open a stream"),
        receiving.expect("accept it"),
    )
}

/// Sends `total` bytes in messages of `size` from one end to the other through `path`, on the
/// runtime's workers; returns the streams and the time taken.
fn move_messages(
    rt: &Runtime,
    (mut sending, mut receiving): (Stream, Stream),
    path: Path,
    size: usize,
    total: usize,
) -> ((Stream, Stream), Duration) {
    support::run_on(rt, async move {
        let start = Instant::now();
        let writer = tokio::spawn(async move {
            let message = Bytes::from(vec![0x5a; size]);
            for _ in 0..total / size {
                match path {
                    Path::Copy => sending.write_all(&message).await.expect("write"),
                    Path::ZeroCopy => sending.write_chunk(message.clone()).await.expect("write"),
                }
            }
            sending
        });
        let mut buf = vec![0; size.max(64 * 1024)];
        let mut left = total / size * size;
        while left > 0 {
            left -= match path {
                Path::Copy => receiving.read(&mut buf[..]).await.expect("read"),
                Path::ZeroCopy => {
                    let chunk = receiving.read_chunk(usize::MAX).await.expect("read");
                    chunk.expect("no end of stream").len()
                }
            };
        }
        let sending = writer.await.expect("the writer finishes");
        ((sending, receiving), start.elapsed())
    })
}

criterion_group!(benches, chunks);
criterion_main!(benches);
