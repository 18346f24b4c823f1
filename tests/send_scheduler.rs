//! The send path's scheduler seen from outside: a small message does not wait behind another
//! stream's bulk, priorities order what waits, and streams writing at once share the
//! connection. Virtual time (tokio's paused clock) and in-memory transports make every figure
//! the same on every run; nothing here measures speed.

mod common;
mod link;

use std::time::Duration;

use common::{raw_session, settle, within, within_for};
use gomux::frame::{Frame, Kind};
use gomux::{Config, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const KIB: usize = 1024;

/// Sends a 64-byte ping and waits for its echo: the round trip.
async fn round_trip(ping: &mut gomux::Stream) -> Duration {
    let started = Instant::now();
    let mut message = [7u8; 64];
    ping.write_all(&message).await.expect("ping");
    ping.read_exact(&mut message).await.expect("echo");
    started.elapsed()
}

/// A 64-byte ping every 10 ms on one stream, echoed, while another stream of the same session
/// sends bulk as fast as it can over a slow link (1 MB/s, 10 ms each way, 32 KiB held in the
/// link). The pings' round trips stay within a few batches of the idle one: the bulk stream's
/// data waits in its own queue, and a ping goes at its turn. With one queue for the session, a
/// ping waited behind everything queued before it: up to `write_buffer_size` (1 MiB), a second
/// on this link.
#[tokio::test(start_paused = true)]
async fn a_ping_does_not_wait_behind_another_streams_bulk() {
    let path = link::Link {
        latency: Duration::from_millis(10),
        bandwidth: 1_000_000,
        buffer: 32 * KIB,
    };
    let (a, b) = path.pair();
    let client = Session::client(a);
    let server = Session::server(b);
    let mut bulk = within("open", client.open()).await.expect("open");
    let mut ping = within("open", client.open()).await.expect("open");
    bulk.write_all(b"b").await.expect("write");
    ping.write_all(b"p").await.expect("write");
    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = std::sync::Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok(mut stream) = server.accept().await {
            let counted = std::sync::Arc::clone(&counted);
            tokio::spawn(async move {
                let mut kind = [0];
                stream
                    .read_exact(&mut kind)
                    .await
                    .expect("the stream's first byte");
                let mut buf = vec![0; 64 * KIB];
                loop {
                    let n = stream.read(&mut buf).await.expect("read");
                    if n == 0 {
                        return;
                    }
                    if kind[0] == b'p' {
                        stream.write_all(&buf[..n]).await.expect("echo");
                    } else {
                        counted.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let idle = within("an idle ping", round_trip(&mut ping)).await;
    let writer = tokio::spawn(async move {
        let chunk = vec![0x5a; 64 * KIB];
        while bulk.write_all(&chunk).await.is_ok() {}
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = received.load(std::sync::atomic::Ordering::Relaxed);
    let mut worst = Duration::ZERO;
    for _ in 0..200 {
        let took = within("a ping under load", round_trip(&mut ping)).await;
        worst = worst.max(took);
        tokio::time::sleep(Duration::from_millis(10).saturating_sub(took)).await;
    }
    let moved = received.load(std::sync::atomic::Ordering::Relaxed) - start;
    writer.abort();
    println!("idle ping {idle:?}, worst under bulk {worst:?}, bulk moved {moved} bytes meanwhile");
    assert!(
        moved >= 1_000_000,
        "the bulk stream moved {moved} bytes in over 2 s of a 1 MB/s link"
    );
    // The link's own queue (32 KiB, 33 ms) and the batch being written (16 to 32 KiB here)
    // come on top of the idle round trip; a whole write buffer would be a second.
    assert!(
        worst <= idle + Duration::from_millis(150),
        "a ping took {worst:?} under bulk, {idle:?} idle"
    );
}

/// Priorities under a stalled transport: while nothing can be written, a stream at priority 0
/// queues 512 KiB and one at priority 10 queues 192 KiB after it. When the transport takes
/// bytes again, the priority-10 stream's data all goes before any more of the other's: only
/// the batch the driver held when the transport stalled went ahead of it.
#[tokio::test(start_paused = true)]
async fn a_higher_priority_stream_overtakes_queued_bulk() {
    let (client, _driver, faults, mut peer) = raw_session(Role::Client, Config::default());
    let mut low = within("open", client.open()).await.expect("open");
    let mut high = within("open", client.open()).await.expect("open");
    for stream in [&low, &high] {
        peer.recv_until(stream.id(), Kind::OpenStream).await;
        peer.send(Frame::window_update(stream.id(), 4 << 20)).await;
    }
    settle().await;
    faults.stall_writes(true);
    low.write_all(&[1; 16 * KIB]).await.expect("write");
    settle().await; // the driver takes a batch, which the transport does not take
    low.write_all(&[1; 512 * KIB]).await.expect("write");
    high.set_priority(10);
    assert_eq!((high.priority(), low.priority()), (10, 0));
    high.write_all(&[2; 192 * KIB]).await.expect("write");
    settle().await;
    faults.stall_writes(false);
    let mut order = Vec::new();
    let mut left = (16 + 512 + 192) * KIB;
    while left > 0 {
        let frame = within_for(Duration::from_secs(60), "data", peer.recv())
            .await
            .expect("frames until the data is in");
        if frame.header.kind == Kind::Data {
            left -= frame.payload.len();
            order.push((frame.header.id, frame.payload.len()));
        }
    }
    let first_high = order
        .iter()
        .position(|&(id, _)| id == high.id())
        .expect("the high stream's data");
    let last_high = order
        .iter()
        .rposition(|&(id, _)| id == high.id())
        .expect("the high stream's data");
    let low_before: usize = order[..first_high].iter().map(|f| f.1).sum();
    assert!(
        low_before <= 32 * KIB,
        "{low_before} bytes of the low stream went before the high one"
    );
    assert!(
        order[first_high..=last_high]
            .iter()
            .all(|&(id, _)| id == high.id()),
        "the low stream sent between the high one's frames: {order:?}"
    );
}

/// Eight streams writing at once over a stalled transport share it once it takes bytes again:
/// while every one of them still has data queued, none is more than a turn (32 KiB) ahead of
/// another. (With one queue for the session, each stream's 96 KiB went out whole, in the order
/// they were written.)
#[tokio::test(start_paused = true)]
async fn streams_writing_at_once_take_turns() {
    let (client, _driver, faults, mut peer) = raw_session(Role::Client, Config::default());
    let mut streams = Vec::new();
    for _ in 0..8 {
        let stream = within("open", client.open()).await.expect("open");
        peer.recv_until(stream.id(), Kind::OpenStream).await;
        peer.send(Frame::window_update(stream.id(), 4 << 20)).await;
        streams.push(stream);
    }
    settle().await;
    faults.stall_writes(true);
    streams[0].write_all(&[0; 16 * KIB]).await.expect("write");
    settle().await; // the batch in hand when the transport stalls
    for stream in &mut streams {
        stream.write_all(&[3; 96 * KIB]).await.expect("write");
    }
    settle().await;
    faults.stall_writes(false);
    let ids: Vec<u32> = streams.iter().map(|s| s.id()).collect();
    let mut sent = vec![0usize; 8];
    let mut left = 16 * KIB + 8 * 96 * KIB;
    let mut worst = 0;
    // Skip the batch in hand, which the first stream filled alone.
    let mut skip = 16 * KIB;
    while left > 0 {
        let frame = within_for(Duration::from_secs(60), "data", peer.recv())
            .await
            .expect("frames until the data is in");
        if frame.header.kind != Kind::Data {
            continue;
        }
        left -= frame.payload.len();
        let taken = frame.payload.len().min(skip);
        skip -= taken;
        let index = ids
            .iter()
            .position(|&id| id == frame.header.id)
            .expect("a stream of ours");
        sent[index] += frame.payload.len() - taken;
        if sent.iter().all(|&n| n < 96 * KIB) {
            let (min, max) = (sent.iter().min(), sent.iter().max());
            worst = worst.max(max.unwrap_or(&0) - min.unwrap_or(&0));
        }
    }
    assert!(
        worst <= 32 * KIB + 8,
        "one stream got {worst} bytes ahead of another: {sent:?}"
    );
}
