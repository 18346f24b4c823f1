//! Stream life cycles, gomux against yamux over loopback TCP.
//!
//! - `streams/open-echo-close`: one stream at a time is opened, carries one byte to an echoing
//!   peer and back, and is closed by both sides: the fixed cost of a short-lived stream.
//!   Counted in streams.
//! - `streams/echo-8192x1KiB`: 8192 streams at once, each opened, echoing 1 KiB and closed; an
//!   iteration is the time for all of them. Counted in bytes echoed (8 MiB).
//!
//! Both multiplexers have their limits raised so that 8192 live streams fit: gomux's stream limit
//! and accept backlog, yamux's stream limit and connection window. The connection is set up once
//! per multiplexer, outside the timed part, and serves both groups.
//!
//! A third row, `memory`, runs the same tasks over in-memory pipes (`tokio::io::duplex`, one per
//! stream, handed to the echo server through a channel) instead of multiplexed streams: the cost
//! of the workload itself (spawning the tasks, allocating their buffers, waking them), which no
//! multiplexer can go below.
//!
//! ```text
//! cargo bench --bench streams
//! ```

use std::sync::Arc;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, measurement::WallTime, BenchmarkGroup, Criterion,
    SamplingMode, Throughput,
};
use gomux::Config;
use tokio::runtime::Runtime;

mod support;
use support::Connector;

/// Streams echoing at once in `echo-8192x1KiB`.
const STREAMS: usize = 8192;

/// What each of those streams echoes.
const MESSAGE: usize = 1024;

/// gomux with room for every stream of the concurrent group, and for the streams of the previous
/// iteration that may still be closing.
fn gomux_config() -> Config {
    Config::default()
        .max_streams(2 * STREAMS)
        .accept_backlog(STREAMS)
}

fn streams(c: &mut Criterion) {
    let rt = support::runtime();
    let rows = Rows::new(&rt);

    let mut one = c.benchmark_group("streams/open-echo-close");
    one.sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    rows.measure(&mut one, 1, Arc::new([1]));
    one.finish();

    let mut many = c.benchmark_group(format!("streams/echo-{STREAMS}x1KiB"));
    many.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Bytes((STREAMS * MESSAGE) as u64));
    rows.measure(&mut many, STREAMS, (0..MESSAGE).map(|i| i as u8).collect());
    many.finish();
}

/// Both multiplexers over loopback TCP, each with an echo server on its accepting end.
struct Rows<'a> {
    rt: &'a Runtime,
    gomux: Arc<support::Pair<gomux::Session>>,
    yamux: Arc<support::Pair<support::Yamux>>,
    memory: Arc<support::Memory>,
}

impl<'a> Rows<'a> {
    fn new(rt: &'a Runtime) -> Rows<'a> {
        let (gomux, yamux) = rt.block_on(async {
            let gomux = support::gomux_tcp(gomux_config()).await;
            let yamux = support::yamux_tcp().await;
            (
                gomux.expect("gomux over TCP"),
                yamux.expect("yamux over TCP"),
            )
        });
        let rows = Rows {
            rt,
            gomux: Arc::new(gomux),
            yamux: Arc::new(yamux),
            memory: Arc::default(),
        };
        let _runtime = rt.enter();
        support::serve_echo(Arc::clone(&rows.gomux));
        support::serve_echo(Arc::clone(&rows.yamux));
        support::serve_echo(Arc::clone(&rows.memory));
        rows
    }

    /// A row per multiplexer and one over pipes: `streams` streams at once each echo `message`.
    fn measure(
        &self,
        group: &mut BenchmarkGroup<'_, WallTime>,
        streams: usize,
        message: Arc<[u8]>,
    ) {
        group.bench_function("gomux-tcp", |b| {
            b.iter_custom(|iters| self.echo(iters, &self.gomux, streams, &message))
        });
        group.bench_function("yamux-tcp", |b| {
            b.iter_custom(|iters| self.echo(iters, &self.yamux, streams, &message))
        });
        group.bench_function("memory", |b| {
            b.iter_custom(|iters| self.echo(iters, &self.memory, streams, &message))
        });
    }

    fn echo<C: Connector>(
        &self,
        iters: u64,
        connector: &Arc<C>,
        streams: usize,
        message: &Arc<[u8]>,
    ) -> Duration {
        let (connector, message) = (Arc::clone(connector), Arc::clone(message));
        support::time_runs(self.rt, iters, move || {
            support::echo_streams(Arc::clone(&connector), streams, Arc::clone(&message))
        })
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1));
    targets = streams
}
criterion_main!(benches);
