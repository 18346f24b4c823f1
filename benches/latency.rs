//! Round-trip latency: a 64-byte message to an echoing peer and back, on one stream that stays
//! open, over loopback TCP.
//!
//! Rows of the one `latency` group: `tcp` (a raw connection: the floor), `gomux-tcp` and
//! `yamux-tcp`. The connection and the stream are set up once per row, outside the timed part.
//!
//! ```text
//! cargo bench --bench latency
//! ```

use std::sync::Arc;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, measurement::WallTime, BenchmarkGroup, Criterion, Throughput,
};
use gomux::Config;
use tokio::runtime::Runtime;

mod support;
use support::Connector;

/// Bytes sent each way per round trip.
const MESSAGE: usize = 64;

fn latency(c: &mut Criterion) {
    let rt = support::runtime();
    let mut group = c.benchmark_group("latency");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Bytes(MESSAGE as u64));

    let tcp = rt
        .block_on(support::Tcp::bind())
        .expect("loopback listener");
    ping(&mut group, &rt, "tcp", tcp);
    let gomux = rt.block_on(support::gomux_tcp(Config::default()));
    ping(&mut group, &rt, "gomux-tcp", gomux.expect("gomux over TCP"));
    let yamux = rt.block_on(support::yamux_tcp()).expect("yamux over TCP");
    ping(&mut group, &rt, "yamux-tcp", yamux);
    group.finish();
}

/// One row: round trips on one stream of `connector`, whose peer echoes.
fn ping<C: Connector>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    connector: C,
) {
    let connector = Arc::new(connector);
    let server = {
        let _runtime = rt.enter();
        support::serve_echo(Arc::clone(&connector))
    };
    // The stream moves into each batch's task and comes back with its time.
    let mut stream = Some(rt.block_on(connector.open()).expect("open a stream"));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let io = stream.take().expect("the stream came back");
            let (io, elapsed) =
                support::run_on(rt, support::round_trips(io, MESSAGE, iters)).expect("round trips");
            stream = Some(io);
            elapsed
        })
    });
    server.abort();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1));
    targets = latency
}
criterion_main!(benches);
