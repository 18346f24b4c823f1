//! An idle session end gives its buffers back, and wakes up correctly.
//!
//! A session that has read and written nothing for a second gives back its read buffer, its
//! outgoing queues and its pool of stream buffers (src/session/linger.rs). These tests hold a
//! session of this crate against a scripted peer that writes raw frames into an in-memory
//! pipe, on tokio's paused clock, and count the bytes the test's thread has allocated and not
//! freed (tests/counting): the session's, its driver task's, its stream's and the pipe's.
//!
//! Then the session must answer its next frame whatever its size: a 64 KiB Data frame arriving
//! after the release, and one whose first part arrived before the release and the rest after.

mod common;
mod counting;

use std::time::Duration;

use common::within;
use gomux::{Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// Longer than the session's linger (one second), so that it has gone quiet.
const QUIET: Duration = Duration::from_secs(2);
/// What the session end holds once quiet, the pipe and the stream included, at most. Measured
/// at 1,692 bytes here (`cargo test --test idle_memory -- --nocapture`) since the driver's
/// task is 256 bytes (from 384: its timers keep millisecond ticks, its write batch and the
/// room for the wakers it collects are the thread's, lent while it writes or is polled) and
/// the shared state lost 24 more; 1,884 since sessions made
/// from one `Config` share its settings (the shared state is 112 bytes smaller); 1,996 since
/// the driver's task went from 512 bytes to 384 (its read buffer boxed apart, one timer for the peer's
/// silence, the batch size kept with the write batch) and the shared state lost 24 bytes;
/// 2,148 since the state of
/// waits and failures moved out of the session's shared state (it is 944 bytes, from 1,144),
/// 2,348 before that; since the driver's write batch and read spares are kept apart from its
/// task and dropped when the session goes quiet, and the linger shares the driver's timer
/// (its task is 512 bytes, from 896); 2,732 before that; 2,588 once the state
/// few sessions use (write-wait figures, `stopped()` and priority tables, wait lists nobody
/// waits on) was made on first use, then 144 more for the transport's cell that a spawned
/// session shares with its writers (direct writes); 2,948 before both; before idle sessions gave their buffers back,
/// 13,420 (an 8 KiB read buffer, a 4 KiB stream buffer kept for reuse and the 2 KiB list it
/// was kept in).
///
/// The bound leaves 20 bytes over that, about what the resident size of an idle session end
/// (`benches/idle_sessions.rs`, held to 2 KiB) has to spare.
const IDLE_BOUND: usize = 1712;
/// The read buffer's state (its box in the driver), which a session keeping a partial frame
/// keeps with it: 88 bytes, and the allocator's rounding.
const READ_STATE: usize = 128;
/// The pipe's buffer.
const PIPE: usize = 4096;
/// The largest Data payload.
const FRAME: usize = 64 * 1024;

const OPEN: u8 = 2;
const DATA: u8 = 0;
const KEEPALIVE: u8 = 1;

/// Counts from here on, once what every session of the process or the thread shares exists:
/// the default settings, made by the first session and shared by all, and the thread's write
/// batch, which the drivers running on it borrow and hand back once their writes are done.
/// Neither is any one session's cost.
async fn start_counting() {
    let (one, other) = tokio::io::duplex(PIPE);
    let (client, server) = (Session::client(one), Session::server(other));
    let mut stream = client.open().await.expect("open");
    stream.write_all(b"warm").await.expect("write");
    let mut accepted = within("accept", server.accept()).await.expect("accept");
    let mut warm = [0; 4];
    within("read", accepted.read_exact(&mut warm))
        .await
        .expect("read");
    drop((stream, accepted));
    within("close", client.close()).await.expect("close");
    within("closed", server.closed()).await;
    drop((client, server));
    // The drivers' tasks end and free their state.
    tokio::time::sleep(QUIET).await;
    counting::start_counting();
}

fn header(id: u32, length: usize, kind: u8) -> [u8; 8] {
    let mut header = [0; 8];
    header[..4].copy_from_slice(&id.to_le_bytes());
    header[4..7].copy_from_slice(&(length as u32).to_le_bytes()[..3]);
    header[7] = kind;
    header
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// A server session, and the scripted client's end of the pipe after it opened stream 0 and
/// moved one 16-byte message on it, which the session's application has read.
async fn one_stream_that_moved_a_message() -> (Session, Stream, DuplexStream) {
    // A small pipe, so that it holds little of what goes through it.
    let (mut peer, io) = tokio::io::duplex(PIPE);
    let session = Session::server(io);
    peer.write_all(&header(0, 0, OPEN)).await.expect("open");
    peer.write_all(&header(0, 16, DATA)).await.expect("header");
    peer.write_all(&[9; 16]).await.expect("payload");
    let mut stream = within("accept", session.accept()).await.expect("accept");
    let mut message = [0; 16];
    within("message", stream.read_exact(&mut message))
        .await
        .expect("message");
    assert_eq!(message, [9; 16]);
    (session, stream, peer)
}

/// Reads frames from the session until a Data frame, and returns its payload.
async fn next_data(peer: &mut DuplexStream) -> Vec<u8> {
    loop {
        let mut header = [0; 8];
        within("header", peer.read_exact(&mut header))
            .await
            .expect("header");
        if header[7] != DATA {
            continue;
        }
        let length = u32::from_le_bytes([header[4], header[5], header[6], 0]) as usize;
        let mut payload = vec![0; length];
        within("payload", peer.read_exact(&mut payload))
            .await
            .expect("payload");
        return payload;
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_end_gives_its_buffers_back() {
    start_counting().await;
    let (session, stream, peer) = one_stream_that_moved_a_message().await;
    let busy = counting::live();
    tokio::time::sleep(QUIET).await;
    let idle = counting::live();
    println!("one session end with one stream: {busy} bytes while busy, {idle} once quiet");
    // Its frames were small and whole: it read them on the stack and holds no read buffer, and
    // its driver handed the write batch back to the thread once its frames were written; but
    // the room its queues and wait lists made (96 bytes here) is kept for the linger.
    assert!(
        busy > idle + 64,
        "a session that just moved a message holds buffers it gives back once quiet \
         ({busy} bytes, {idle} once quiet)"
    );
    assert!(
        idle <= IDLE_BOUND,
        "an idle session end holds {idle} bytes, more than {IDLE_BOUND}"
    );
    drop((session, stream, peer));
}

#[tokio::test(start_paused = true)]
async fn a_full_frame_after_the_release_is_read_whole() {
    start_counting().await;
    let (session, mut stream, mut peer) = one_stream_that_moved_a_message().await;
    tokio::time::sleep(QUIET).await;
    assert!(
        counting::live() <= IDLE_BOUND,
        "the buffers were given back ({} bytes)",
        counting::live()
    );

    // The largest frame the peer may send, in one write.
    let payload = pattern(FRAME);
    let mut frame = header(0, FRAME, DATA).to_vec();
    frame.extend_from_slice(&payload);
    within("frame", peer.write_all(&frame))
        .await
        .expect("frame");
    let mut received = vec![0; FRAME];
    within("read", stream.read_exact(&mut received))
        .await
        .expect("read");
    assert!(received == payload, "the payload arrived intact");

    // The session writes again too.
    within("write", stream.write_all(b"after the quiet"))
        .await
        .expect("write");
    within("flush", stream.flush()).await.expect("flush");
    assert_eq!(next_data(&mut peer).await, b"after the quiet");
    drop(session);
}

#[tokio::test(start_paused = true)]
async fn a_frame_split_across_the_release_is_read_whole() {
    let payload = pattern(FRAME);
    let first = 30_000;
    let mut part = header(0, FRAME, DATA).to_vec();
    part.extend_from_slice(&payload[..first]);
    let mut received = vec![0; FRAME];
    start_counting().await;
    let (session, mut stream, mut peer) = one_stream_that_moved_a_message().await;
    within("first part", peer.write_all(&part))
        .await
        .expect("first part");
    // Let the session read the first part, then go quiet with it.
    tokio::task::yield_now().await;
    let busy = counting::live();
    tokio::time::sleep(QUIET).await;
    let held = counting::live();
    println!("a partial frame of {first} bytes: {busy} bytes while busy, {held} once quiet");
    assert!(
        busy > FRAME,
        "the session reads the frame into a buffer with room for all of it ({busy} bytes)"
    );
    assert!(
        held <= first + PIPE + IDLE_BOUND + READ_STATE,
        "the session keeps the partial frame, not the buffer it was read into ({held} bytes)"
    );

    within("rest", peer.write_all(&payload[first..]))
        .await
        .expect("rest");
    within("read", stream.read_exact(&mut received))
        .await
        .expect("read");
    assert!(received == payload, "the payload arrived intact");
    drop(session);
}

#[tokio::test(start_paused = true)]
async fn small_frames_that_wake_an_idle_session_allocate_no_read_buffer() {
    start_counting().await;
    let (session, mut stream, mut peer) = one_stream_that_moved_a_message().await;
    tokio::time::sleep(QUIET).await;
    let idle = counting::live();

    // A keepalive (which gets no answer) and a short message on the stream, each read and
    // applied from the stack, then a frame cut in two, whose first part must be kept.
    within("keepalive", peer.write_all(&header(0, 0, KEEPALIVE)))
        .await
        .expect("keepalive");
    tokio::task::yield_now().await;
    let after_keepalive = counting::live();
    let mut frames = header(0, 5, DATA).to_vec();
    frames.extend_from_slice(b"hello");
    frames.extend_from_slice(&header(0, 7, DATA));
    frames.extend_from_slice(b"wor");
    within("frames", peer.write_all(&frames))
        .await
        .expect("frames");
    let mut received = [0; 5];
    within("read", stream.read_exact(&mut received))
        .await
        .expect("read");
    assert_eq!(&received, b"hello");
    within("rest", peer.write_all(b"ld!!")).await.expect("rest");
    let mut received = [0; 7];
    within("read", stream.read_exact(&mut received))
        .await
        .expect("read");
    assert_eq!(&received, b"world!!");
    println!("idle {idle} bytes, {after_keepalive} after a keepalive");
    assert!(
        after_keepalive < idle + 128,
        "a keepalive woke the session without a read buffer ({idle} bytes idle, \
         {after_keepalive} after it)"
    );
    drop(session);
}
