//! Bulk throughput: many streams each writing 64 KiB buffers while the peer reads and discards.
//!
//! One criterion group holds every row, and raw TCP runs again beside each stream count, so the
//! ratios between neighbouring rows hold on a noisy machine:
//!
//! - `tcp-64KiB/1`, `tcp-1MiB/N`: one raw loopback TCP connection, written in 64 KiB and 1 MiB
//!   writes and read 1 MiB at a time (`support::BULK`): what the kernel can do without any
//!   multiplexing. `tcp-1MiB` is the transport's limit: both its ends run on one thread
//!   (`support::limit_runtime`), which moved the most of what was tried. It runs again just
//!   before the rows for each stream count N (always over one connection), so that every row's
//!   ratio to the limit comes from measurements seconds apart.
//! - `gomux-tcp/N`, `gomux-duplex/N`: gomux over one loopback TCP connection and over an
//!   in-memory pipe (which isolates the multiplexer from the kernel), N streams.
//! - `gomux-tcp-zc/N`: as `gomux-tcp`, through the zero-copy API: the writers queue their
//!   64 KiB pieces with `write_chunk` and the readers take `read_chunk`s, so neither copies.
//! - `yamux-tcp/N`: yamux over loopback TCP, same workload (stream limits raised, see
//!   `support::yamux_config`).
//!
//! Each iteration moves [`TOTAL`] bytes split evenly over the streams, and at least
//! [`PER_STREAM`] per stream, so that with a thousand streams each still carries several windows
//! and the row measures steady streaming rather than stream setup. The connection (TCP
//! connect, session start) is set up once per row, outside the timed part; opening the streams
//! is part of each iteration (for the raw TCP rows that is one connect).
//!
//! ```text
//! cargo bench --bench throughput
//! ```

use std::sync::Arc;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, measurement::WallTime, BenchmarkGroup, BenchmarkId, Criterion,
    SamplingMode, Throughput,
};
use gomux::Config;
use tokio::runtime::Runtime;

mod support;
use support::{Connector, Count, Payload, CHUNK};

/// Bytes moved per iteration at low stream counts.
const TOTAL: u64 = 64 << 20;
/// Bytes each stream moves per iteration at least: eight 64 KiB windows.
const PER_STREAM: u64 = 512 << 10;

/// Stream counts measured for each multiplexer.
const STREAMS: [usize; 6] = [1, 2, 10, 100, 500, 1000];

fn throughput(c: &mut Criterion) {
    let rt = support::runtime();
    let limit_rt = support::limit_runtime();
    let total = if support::test_mode() { 4 << 20 } else { TOTAL };
    let mut group = c.benchmark_group("throughput");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(4));
    let mut rows = Rows {
        group,
        rt: &rt,
        limit_rt: &limit_rt,
        total,
    };

    let tcp = rt.block_on(support::Tcp::bind());
    rows.add("tcp-64KiB", tcp.expect("loopback listener"), 1, CHUNK);
    for streams in STREAMS {
        // The transport's limit again before every stream count, so that each row has a baseline
        // measured within seconds of it: the machine's speed drifts more over the run than
        // between neighbouring rows. Labelled with the stream count it goes with; it always
        // uses one connection.
        let tcp = limit_rt.block_on(support::Tcp::bind());
        rows.add_baseline(
            "tcp-1MiB",
            tcp.expect("loopback listener"),
            streams,
            support::BULK,
        );
        // A fresh connection for every row, so no row inherits another's state.
        let gomux_tcp = rt.block_on(support::gomux_tcp(Config::default()));
        rows.add(
            "gomux-tcp",
            gomux_tcp.expect("gomux over TCP"),
            streams,
            CHUNK,
        );
        let gomux_zero_copy = rt.block_on(support::gomux_tcp(Config::default()));
        let gomux_zero_copy = support::ZeroCopyPair(gomux_zero_copy.expect("gomux over TCP"));
        rows.add("gomux-tcp-zc", gomux_zero_copy, streams, CHUNK);
        let gomux_duplex = {
            let _runtime = rt.enter();
            support::gomux_duplex(Config::default())
        };
        rows.add("gomux-duplex", gomux_duplex, streams, CHUNK);
        let yamux_tcp = rt.block_on(support::yamux_tcp());
        rows.add(
            "yamux-tcp",
            yamux_tcp.expect("yamux over TCP"),
            streams,
            CHUNK,
        );
    }
    rows.group.finish();
}

/// The group and what every row shares.
struct Rows<'a> {
    group: BenchmarkGroup<'a, WallTime>,
    rt: &'a Runtime,
    /// Where the transport's limit runs.
    limit_rt: &'a Runtime,
    /// Bytes per iteration, before the per-stream minimum.
    total: u64,
}

impl Rows<'_> {
    /// One row: the total over `streams` streams of `connector`, in writes of `chunk` bytes.
    fn add<C: Connector>(&mut self, name: &str, connector: C, streams: usize, chunk: usize) {
        self.add_labelled(name, connector, streams, streams, chunk, self.rt);
    }

    /// A one-connection row labelled with the stream count `label` of the rows it is a baseline
    /// for.
    fn add_baseline<C: Connector>(&mut self, name: &str, connector: C, label: usize, chunk: usize) {
        self.add_labelled(name, connector, 1, label, chunk, self.limit_rt);
    }

    fn add_labelled<C: Connector>(
        &mut self,
        name: &str,
        connector: C,
        streams: usize,
        label: usize,
        chunk: usize,
        rt: &Runtime,
    ) {
        let connector = Arc::new(connector);
        let total = if support::test_mode() {
            self.total
        } else {
            self.total.max(PER_STREAM * streams as u64)
        };
        let payload = Arc::new(Payload::generated(total, chunk));
        self.group
            .throughput(Throughput::Bytes(total))
            .bench_function(BenchmarkId::new(name, label), |b| {
                b.iter_custom(|iters| {
                    let (connector, payload) = (Arc::clone(&connector), Arc::clone(&payload));
                    support::time_runs(rt, iters, move || {
                        support::transfer::<_, Count>(
                            Arc::clone(&connector),
                            Arc::clone(&payload),
                            streams,
                            Arc::default(),
                        )
                    })
                })
            });
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1));
    targets = throughput
}
criterion_main!(benches);
