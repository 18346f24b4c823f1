//! What an idle stream costs on the heap: 10,000 streams opened by a client and accepted by a
//! server, every handle kept, nobody writing. Both sessions, their drivers and the application
//! run on the test's thread (a current-thread runtime), so the counting allocator sees all of
//! it: stream state, id maps, handles, the queues the opens went through, the runtime's own
//! bookkeeping.
//!
//! `cargo test --test idle_stream_memory -- --nocapture` prints the figure. The resident-set
//! figure of the benchmarks (`examples/many_streams.rs`) is a different measure: it counts the
//! pages the process touches, after the allocator's own reuse, on two threads.

mod common;
mod counting;

use std::time::Duration;

use common::within;
use gomux::{Config, Role, Session};

const STREAMS: usize = 10_000;

/// Heap bytes per idle stream end, handles included, that the crate's docs allow.
const BOUND: usize = 350;

#[tokio::test]
async fn an_idle_stream_end_costs_a_few_hundred_heap_bytes_handles_included() {
    let config = Config::default().max_streams(2 * STREAMS);
    let (a, b) = tokio::io::duplex(64 * 1024);
    let client = Session::with_config(a, Role::Client, config.clone());
    let server = Session::with_config(b, Role::Server, config);
    // Warm up: the runtime, the drivers and the transports allocate their working buffers.
    let warm = client.open().await.expect("open");
    let warm_in = within("accept", server.accept()).await.expect("accept");
    drop((warm, warm_in));
    tokio::time::sleep(Duration::from_millis(50)).await;

    counting::start_counting();
    let mut opened = Vec::with_capacity(STREAMS);
    let mut accepted = Vec::with_capacity(STREAMS);
    for _ in 0..STREAMS {
        opened.push(client.open().await.expect("open"));
        accepted.push(within("accept", server.accept()).await.expect("accept"));
    }
    // Let the drivers write and read everything the opens queued.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let live = counting::live();
    let per_end = live / (2 * STREAMS);
    println!(
        "{STREAMS} idle streams, both ends on one thread: {live} heap bytes live, {per_end} per stream end, handles included"
    );
    assert_eq!(server.stream_count(), STREAMS);
    assert!(
        per_end <= BOUND,
        "an idle stream end takes {per_end} heap bytes, over {BOUND}"
    );
    drop((opened, accepted));
}
