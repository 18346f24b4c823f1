//! The line for room in the send queues: room promised to a writer that will not use it goes
//! to the next in line, however busy the session is otherwise. (A writer whose stream can no
//! longer be written gives its room back at once: `session::core`'s unit tests.)
//!
//! The test runs a client session against a raw peer on paused time, with a 4 KiB
//! `write_buffer_size` so that one writer's grant can hold the whole queue.

mod common;

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use common::{raw_session, within, Faults, RawPeer};
use futures::StreamExt;
use gomux::frame::{Frame, Kind};
use gomux::{Config, Role, Session, Stream};
use tokio::io::AsyncWriteExt;

const KIB: usize = 1024;
/// The peer's stream the session accepts and keeps in its accept queue (its backlog is 1).
const QUEUED: u32 = 1;
/// The first of the peer's streams the session refuses.
const FIRST_REFUSED: u32 = 3;
/// The opens the peer makes before the test calls the waiter starved.
const OPENS_LIMIT: u32 = 10_000;

/// Polls `future` once with a waker that does nothing, then drops it: a cancelled operation.
fn poll_once_and_cancel<F: Future>(future: F) -> bool {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    future.as_mut().poll(&mut cx).is_pending()
}

/// Ready on its second poll, having woken its task at once: the task goes to the back of the
/// runtime's queue, behind the session's driver, as a task woken by I/O would. (`yield_now`
/// defers its wake-up until the runtime has nothing else to run, which a driver that keeps
/// waking itself would never let happen.)
fn next_turn() -> impl Future<Output = ()> {
    let mut woken = false;
    std::future::poll_fn(move |cx| {
        if woken {
            return Poll::Ready(());
        }
        woken = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
}

/// Writes on `a` while the transport takes nothing, until the batch in the driver's hands and
/// the send queue behind it are full: a write then waits for room.
async fn fill_queue(a: &mut Stream) {
    loop {
        next_turn().await;
        if poll_once_and_cancel(a.write(&[1u8; 4 * KIB])) {
            return;
        }
    }
}

/// A client session with streams `a` and `b` (both with 1 MiB of credit), whose accept queue
/// is full with the peer's stream [`QUEUED`].
async fn client_with_two_writers() -> (Session, Stream, Stream, RawPeer, Faults) {
    let config = Config::default()
        .write_buffer_size(4 * KIB)
        .accept_backlog(1);
    let (session, _driver, faults, mut peer) = raw_session(Role::Client, config);
    let a = session.open().await.expect("open a");
    let b = session.open().await.expect("open b");
    for stream in [&a, &b] {
        peer.recv_until(stream.id(), Kind::OpenStream).await;
        peer.send(Frame::window_update(stream.id(), 1 << 20)).await;
    }
    peer.send(Frame::control(QUEUED, Kind::OpenStream)).await;
    (session, a, b, peer, faults)
}

/// The peer opens streams the session refuses (its accept backlog is full), one per turn of
/// the runtime, so that the session writes a control frame (the refusal) all the time, until a
/// Data frame of `waiter` arrives: returns how many opens that took, or panics past
/// [`OPENS_LIMIT`]. The peer runs in a task of its own: the test's own task runs only every
/// few dozen polls of the others, while the driver would have given up on the grant.
fn refusals_until_data_of(mut peer: RawPeer, waiter: u32) -> tokio::task::JoinHandle<u32> {
    tokio::spawn(async move { refuse_until_data_of(&mut peer, waiter).await })
}

async fn refuse_until_data_of(peer: &mut RawPeer, waiter: u32) -> u32 {
    let mut opens = 0;
    loop {
        assert!(
            opens < OPENS_LIMIT,
            "stream {waiter}'s write got no room while the session refused {opens} opens"
        );
        peer.send(Frame::control(FIRST_REFUSED + 2 * opens, Kind::OpenStream))
            .await;
        opens += 1;
        // Every frame the session wrote so far, then the next turn.
        loop {
            tokio::select! {
                biased;
                frame = peer.framed.next() => {
                    let frame = frame.expect("the session's next frame").expect("a frame");
                    if frame.header.id == waiter && frame.header.kind == Kind::Data {
                        return opens;
                    }
                }
                () = next_turn() => break,
            }
        }
    }
}

/// A writer is let in with room for a whole frame, but its write was cancelled before it ran:
/// the room goes to the writer behind it, even while the session writes control frames all the
/// time (a batch of control frames alone does not restart the driver's patience with unclaimed
/// room).
#[tokio::test(start_paused = true)]
async fn a_cancelled_writers_room_goes_to_the_next_while_credit_goes_out() {
    let (_session, mut a, mut b, peer, faults) = client_with_two_writers().await;
    // A fills the queue while the transport takes nothing; A's next write (a frame larger
    // than the queue) waits for room, first in line, and is cancelled; B waits behind it. Once
    // the transport takes writes again, A is let in with room for its whole frame, all there
    // is, and never claims it.
    faults.stall_writes(true);
    fill_queue(&mut a).await;
    assert!(
        poll_once_and_cancel(a.write(&[2u8; 8 * KIB])),
        "a's next write waits for room"
    );
    let b_id = b.id();
    let small = tokio::spawn(async move { b.write_all(b"hello").await.map(|()| b) });
    next_turn().await;
    faults.stall_writes(false);
    let opens = within("b's write gets room", refusals_until_data_of(peer, b_id))
        .await
        .expect("no panic");
    println!("b's 5 bytes went out after {opens} refused opens");
    small.await.expect("no panic").expect("b's write");
    drop(a);
}
