//! The core's open line seen from outside, where its unit tests cannot reach: the wait for a
//! greeting that never comes, and a wait in line that outlasts the wait for the greeting.
//! Virtual time (tokio's paused clock) makes every figure the same on every run.

mod common;

use std::time::Duration;

use common::{raw_session, settle, within};
use gomux::frame::{Frame, Kind, GREETING_ID};
use gomux::{Config, Role};
use tokio::time::Instant;

/// Towards a peer that says nothing (a Go peer greets no one), opens beyond the backlog are
/// held for a greeting for a second at most, then go: the peer may not be counting them.
#[tokio::test(start_paused = true)]
async fn opens_beyond_the_backlog_go_once_the_wait_for_a_greeting_is_over() {
    let (client, _driver, _faults, _peer) =
        raw_session(Role::Client, Config::default().open_backlog(2));
    let started = Instant::now();
    let _a = within("open", client.open()).await.expect("open");
    let _b = within("open", client.open()).await.expect("open");
    assert_eq!(started.elapsed(), Duration::ZERO);
    let _c = within("an open beyond the backlog", client.open())
        .await
        .expect("open");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited <= Duration::from_millis(1100),
        "held for {waited:?}"
    );
}

/// Towards a peer of this crate, an open waiting in line for the backlog is let in by the
/// peer's acknowledgement, also when that comes long after the wait for a greeting is over.
#[tokio::test(start_paused = true)]
async fn an_open_waiting_in_line_past_the_greeting_wait_is_let_in_by_an_acknowledgement() {
    let (client, _driver, _faults, mut peer) =
        raw_session(Role::Client, Config::default().open_backlog(1));
    peer.send(Frame::control(GREETING_ID, Kind::Keepalive))
        .await;
    settle().await;
    let a = within("open", client.open()).await.expect("open");
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.open().await.map(|s| s.id()) }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!waiting.is_finished(), "the backlog holds the second open");
    peer.recv_until(a.id(), Kind::OpenStream).await;
    peer.send(Frame::window_update(a.id(), 0)).await;
    let opened = within("the open let in", waiting)
        .await
        .expect("the task")
        .expect("open");
    assert_ne!(opened, a.id());
}
