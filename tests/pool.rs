//! `Pool`: streams spread fewest-first over K sessions, dead sessions replaced, one connect per
//! slot however many opens wait for it, failures reported (never a hang) with bounded
//! reconnects, and data through it all. The server is in this process: every connect makes an
//! in-memory pipe with an echoing server session at the far end, whose transport a test can
//! reset.

mod common;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use gomux::{Error, Pool, Session};
use tokio::io::DuplexStream;
use tokio::sync::watch;

use common::{assert_same, pattern, round_trip, settle, spawn_echo, within, Faults, Faulty};

/// The far end of every connection a test's pool makes.
#[derive(Clone)]
struct Server {
    /// Connects attempted, failed ones included.
    attempts: Arc<AtomicUsize>,
    /// While false, connects fail with `ConnectionRefused`.
    up: Arc<AtomicBool>,
    /// Connects wait until this is true.
    gate: watch::Sender<bool>,
    /// The connections made, in order: the switch that resets each one's client end.
    connections: Arc<Mutex<Vec<Faults>>>,
}

impl Server {
    fn new() -> Server {
        Server {
            attempts: Arc::new(AtomicUsize::new(0)),
            up: Arc::new(AtomicBool::new(true)),
            gate: watch::Sender::new(true),
            connections: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A pool of `size` sessions to this server, with a short backoff.
    fn pool(&self, size: usize) -> Pool {
        let server = self.clone();
        Pool::builder(size)
            .backoff(Duration::from_millis(10), Duration::from_millis(200))
            .build(move || {
                let server = server.clone();
                async move { server.connect().await }
            })
    }

    /// One connect, as a pool makes it.
    async fn connect(&self) -> io::Result<Faulty<DuplexStream>> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        // The sender lives in `self`: the wait cannot fail.
        let _ = self.gate.subscribe().wait_for(|open| *open).await;
        if !self.up.load(Ordering::SeqCst) {
            return Err(io::ErrorKind::ConnectionRefused.into());
        }
        let (client, server) = tokio::io::duplex(256 * 1024);
        let (client, faults) = Faulty::new(client);
        spawn_echo(Session::server(server));
        self.connections.lock().expect("not poisoned").push(faults);
        Ok(client)
    }

    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// Resets the client end of the `index`th connection made, as a failing network would.
    fn kill(&self, index: usize) {
        self.connections.lock().expect("not poisoned")[index].reset();
    }
}

/// The streams of each live session, by slot.
fn counts(pool: &Pool) -> Vec<(usize, usize)> {
    let mut counts: Vec<_> = pool
        .sessions()
        .iter()
        .map(|pooled| (pooled.slot(), pooled.session().stream_count()))
        .collect();
    counts.sort();
    counts
}

/// Waits until `done` holds, checking between short sleeps (within a test step).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    within(what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test]
async fn streams_go_to_the_session_with_the_fewest() {
    let server = Server::new();
    let pool = server.pool(3);
    assert_eq!(within("fill", pool.fill()).await, 3);

    let mut streams = Vec::new();
    for _ in 0..10 {
        streams.push(
            within("open", pool.open_with_session())
                .await
                .expect("open"),
        );
    }
    let loads: Vec<usize> = counts(&pool).iter().map(|&(_, count)| count).collect();
    assert_eq!(loads.len(), 3, "{loads:?}");
    assert_eq!(loads.iter().sum::<usize>(), 10);
    let (least, most) = (loads.iter().min(), loads.iter().max());
    assert!(
        most.zip(least)
            .is_some_and(|(most, least)| most - least <= 1),
        "spread evenly: {loads:?}"
    );

    // Three streams of one session end: it is now the least loaded by far, and takes the next
    // opens until it is level with the others again.
    let emptied = streams[0].1.slot();
    let before = counts(&pool);
    let mut closed = 0;
    streams.retain(|(_, pooled)| {
        let keep = pooled.slot() != emptied || closed == 3;
        closed += usize::from(!keep);
        keep
    });
    assert_eq!(closed, 3);
    let remaining = before[emptied].1 - 3;
    until("the closed streams to be gone", || {
        counts(&pool)[emptied].1 == remaining
    })
    .await;
    for _ in 0..2 {
        let (stream, pooled) = within("open", pool.open_with_session())
            .await
            .expect("open");
        assert_eq!(pooled.slot(), emptied, "the least loaded session");
        streams.push((stream, pooled));
    }
    assert_eq!(server.attempts(), 3, "no connect beyond the three");
}

#[tokio::test]
async fn a_dead_session_is_replaced_and_the_others_carry_on() {
    let server = Server::new();
    let pool = server.pool(2);
    assert_eq!(within("fill", pool.fill()).await, 2);
    let first = within("open", pool.open_with_session())
        .await
        .expect("open");
    let second = within("open", pool.open_with_session())
        .await
        .expect("open");
    assert_ne!(first.1.slot(), second.1.slot(), "one stream on each");

    // The first connection made fails; one session ends with it.
    server.kill(0);
    until("a session to end", || pool.live() == 1).await;
    let (survivor, dead) = if first.1.session().is_closed() {
        (second, first)
    } else {
        (first, second)
    };
    assert!(dead.1.session().is_closed());

    // New streams are opened, and a new connection is made for the dead one's slot.
    for seed in 0..4 {
        let stream = within("open after the loss", pool.open())
            .await
            .expect("open");
        let data = pattern(seed, 10_000);
        assert_same(
            &within("echo", round_trip(stream, &data)).await,
            &data,
            "echo",
        );
    }
    assert_eq!(
        within("fill", pool.fill()).await,
        2,
        "the slot is filled again"
    );
    assert_eq!(
        server.attempts(),
        3,
        "one connect replaced the dead session"
    );
    assert_eq!(pool.connects(), 3);
    let slots: Vec<usize> = counts(&pool).iter().map(|&(slot, _)| slot).collect();
    assert_eq!(slots, [0, 1], "the replacement took the dead one's slot");

    // The stream on the other session was untouched.
    let data = pattern(9, 100_000);
    assert_same(
        &within("echo on the survivor", round_trip(survivor.0, &data)).await,
        &data,
        "the survivor's echo",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_waiting_for_a_reconnect_share_one_connect() {
    let server = Server::new();
    let pool = server.pool(1);
    assert_eq!(within("fill", pool.fill()).await, 1);
    server.kill(0);
    until("the session to end", || pool.live() == 0).await;

    // Connects now wait at the gate: twenty opens find no live session and wait for the one
    // connect the first of them started.
    server.gate.send_replace(false);
    let opens: Vec<_> = (0..20)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.open().await })
        })
        .collect();
    until("the reconnect to start", || server.attempts() == 2).await;
    settle().await;
    server.gate.send_replace(true);
    let _streams: Vec<_> = within("the opens", join_all(opens))
        .await
        .into_iter()
        .map(|open| open.expect("no panic").expect("open after the reconnect"))
        .collect();
    assert_eq!(server.attempts(), 2, "one connect for all of them");
    assert_eq!(pool.connects(), 2);
    assert_eq!(counts(&pool), [(0, 20)]);
}

#[tokio::test(start_paused = true)]
async fn open_fails_while_the_server_is_down_without_hammering_it_and_recovers() {
    let server = Server::new();
    server.up.store(false, Ordering::SeqCst);
    let pool = server.pool(2);

    // No time passes in this loop (the clock is paused and nothing sleeps): every open fails,
    // and backoff lets each slot connect twice at most (its first failure is retried once).
    for _ in 0..100 {
        let error = within("open to fail", pool.open()).await.expect_err("down");
        match error {
            Error::Transport(error) => assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused),
            other => panic!("unexpected error {other:?}"),
        }
    }
    assert!(server.attempts() <= 4, "{} connects", server.attempts());
    assert_eq!(pool.live(), 0);

    // The server comes back: once the backoff has passed, the next open connects.
    server.up.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stream = within("open once up", pool.open()).await.expect("open");
    assert_eq!(within("echo", round_trip(stream, b"back")).await, b"back");
}

#[tokio::test(start_paused = true)]
async fn a_connect_that_never_finishes_times_out() {
    let pool = Pool::builder(2)
        .connect_timeout(Duration::from_secs(3))
        .build(std::future::pending::<io::Result<DuplexStream>>);
    let error = within("open to fail", pool.open())
        .await
        .expect_err("no server");
    assert_eq!(error.io_kind(), io::ErrorKind::TimedOut, "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_flows_over_every_session() {
    let server = Server::new();
    let pool = server.pool(4);
    assert_eq!(within("fill", pool.fill()).await, 4);

    let clients: Vec<_> = (0..32u64)
        .map(|seed| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let (stream, pooled) = pool.open_with_session().await.expect("open");
                // Different content on each stream, so crossed streams are caught too.
                let data = pattern(seed, 50_000 + seed as usize * 1000);
                assert_same(&round_trip(stream, &data).await, &data, "echo");
                pooled.slot()
            })
        })
        .collect();
    let mut used = Vec::new();
    for slot in within("the echoes", join_all(clients)).await {
        used.push(slot.expect("no panic"));
    }
    used.sort();
    used.dedup();
    assert_eq!(used, [0, 1, 2, 3], "every session carried streams");
}

#[tokio::test]
async fn close_ends_every_session_and_later_opens_fail() {
    let server = Server::new();
    let pool = server.pool(3);
    assert_eq!(within("fill", pool.fill()).await, 3);
    let sessions = pool.sessions();
    within("close", pool.close()).await.expect("close");
    assert!(pool.is_closed());
    for pooled in &sessions {
        assert!(matches!(
            pooled.session().close_reason(),
            Some(Error::ClosedLocally)
        ));
    }
    assert!(matches!(pool.open().await, Err(Error::ClosedLocally)));
    assert_eq!(pool.fill().await, 0);
    assert_eq!(server.attempts(), 3, "nothing connected after the close");
}

#[tokio::test]
async fn a_graceful_close_lets_open_streams_finish() {
    let server = Server::new();
    let pool = server.pool(2);
    let stream = within("open", pool.open()).await.expect("open");
    let closing = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.graceful_close(Duration::from_secs(60)).await })
    };
    until("the pool to close", || pool.is_closed()).await;
    assert!(matches!(pool.open().await, Err(Error::ClosedLocally)));
    // The stream open before goes on, and once it is done the sessions close.
    assert_eq!(within("echo", round_trip(stream, b"last")).await, b"last");
    within("the graceful close", closing)
        .await
        .expect("no panic")
        .expect("every stream finished");
    assert_eq!(pool.live(), 0);
}

#[tokio::test]
async fn a_graceful_close_reports_the_streams_it_cut() {
    let server = Server::new();
    let pool = server.pool(2);
    assert_eq!(within("fill", pool.fill()).await, 2);
    let _held = [
        pool.open().await.expect("open"),
        pool.open().await.expect("open"),
    ];
    let outcome = within("the graceful close", pool.graceful_close(Duration::ZERO)).await;
    assert!(
        matches!(outcome, Err(Error::GracefulCloseTimedOut { streams: 2 })),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn debug_shows_the_pool_at_a_glance() {
    let server = Server::new();
    let pool = server.pool(2);
    assert_eq!(pool.size(), 2);
    within("fill", pool.fill()).await;
    let text = format!("{pool:?}");
    assert!(
        text.contains("size: 2") && text.contains("live: 2"),
        "{text}"
    );
}
