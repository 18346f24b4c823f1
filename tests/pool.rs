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
use gomux::{Error, Pool, PoolBuilder, Session};
use tokio::io::DuplexStream;
use tokio::sync::watch;
use tokio::time::Instant;

use common::{assert_same, pattern, round_trip, spawn_echo, within, Faults, Faulty};

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
    /// The server's session of each connection made, in order.
    sessions: Arc<Mutex<Vec<Session>>>,
    /// When each connect was attempted, and whether it succeeded.
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
}

impl Server {
    fn new() -> Server {
        Server {
            attempts: Arc::new(AtomicUsize::new(0)),
            up: Arc::new(AtomicBool::new(true)),
            gate: watch::Sender::new(true),
            connections: Arc::new(Mutex::new(Vec::new())),
            sessions: Arc::new(Mutex::new(Vec::new())),
            log: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A pool of `size` sessions to this server, built with `builder`.
    fn pool_with(&self, builder: PoolBuilder) -> Pool {
        let server = self.clone();
        builder.build(move || {
            let server = server.clone();
            async move { server.connect().await }
        })
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
        let up = self.up.load(Ordering::SeqCst);
        self.log
            .lock()
            .expect("not poisoned")
            .push((Instant::now(), up));
        if !up {
            return Err(io::ErrorKind::ConnectionRefused.into());
        }
        let (client, server) = tokio::io::duplex(256 * 1024);
        let (client, faults) = Faulty::new(client);
        let session = Session::server(server);
        self.sessions
            .lock()
            .expect("not poisoned")
            .push(session.clone());
        spawn_echo(session);
        self.connections.lock().expect("not poisoned").push(faults);
        Ok(client)
    }

    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::SeqCst)
    }

    /// When the first connect that succeeded was made.
    fn first_success(&self) -> Option<Instant> {
        let log = self.log.lock().expect("not poisoned");
        log.iter().find(|(_, up)| *up).map(|&(at, _)| at)
    }

    /// The server's session of the latest connection made.
    fn latest_session(&self) -> Session {
        let sessions = self.sessions.lock().expect("not poisoned");
        sessions.last().cloned().expect("a connection was made")
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

#[tokio::test(start_paused = true)]
async fn opens_waiting_for_a_reconnect_share_one_connect() {
    let server = Server::new();
    let pool = server.pool(1);
    assert_eq!(within("fill", pool.fill()).await, 1);
    server.kill(0);
    until("the session to end", || pool.live() == 0).await;

    // Connects now wait at the gate, which only this test opens: twenty opens find no live
    // session, and every one of them waits in the pool while the one connect is held.
    server.gate.send_replace(false);
    let opens: Vec<_> = (0..20)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.open().await })
        })
        .collect();
    until("all twenty opens to wait in the pool", || {
        pool.waiting() == 20
    })
    .await;
    assert_eq!(server.attempts(), 2, "one connect started for the twenty");
    // However long it is held (no backoff runs while a connect is under way), no other starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!((server.attempts(), pool.waiting()), (2, 20));

    server.gate.send_replace(true);
    let _streams: Vec<_> = within("the opens", join_all(opens))
        .await
        .into_iter()
        .map(|open| open.expect("no panic").expect("open after the reconnect"))
        .collect();
    assert_eq!(server.attempts(), 2, "one connect for all of them");
    assert_eq!(pool.connects(), 2);
    assert_eq!(pool.waiting(), 0);
    assert_eq!(counts(&pool), [(0, 20)]);
}

#[tokio::test(start_paused = true)]
async fn open_waits_while_the_server_is_down_without_hammering_it_and_recovers() {
    let server = Server::new();
    server.up.store(false, Ordering::SeqCst);
    let pool = server.pool_with(
        Pool::builder(2)
            .backoff(Duration::from_millis(10), Duration::from_millis(200))
            .open_timeout(Duration::from_secs(1)),
    );

    // Five opens wait out the open timeout together, then fail saying why.
    let start = Instant::now();
    let opens = (0..5).map(|_| pool.open());
    for outcome in within("the opens to fail", join_all(opens)).await {
        let error = outcome.expect_err("the server is down");
        match &error {
            Error::PoolUnavailable { last: Some(last) } => assert!(
                matches!(&**last, Error::Transport(e) if e.kind() == io::ErrorKind::ConnectionRefused),
                "{last:?}"
            ),
            other => panic!("unexpected error {other:?}"),
        }
        assert_eq!(error.io_kind(), io::ErrorKind::ConnectionRefused);
        assert!(error.to_string().contains("open timeout"), "{error}");
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_millis(1100),
        "{waited:?}"
    );
    // Backoff held the connects down, however many opens waited: per slot two at once, then
    // at 10, 30, 70, 150, 310, 510, 710 and 910 ms.
    assert!(
        server.attempts() <= 2 * 10,
        "{} connects",
        server.attempts()
    );
    assert_eq!(pool.live(), 0);

    // The server comes back: the next open connects as soon as the backoff allows.
    server.up.store(true, Ordering::SeqCst);
    let stream = within("open once up", pool.open()).await.expect("open");
    assert!(start.elapsed() < Duration::from_millis(1300));
    assert_eq!(within("echo", round_trip(stream, b"back")).await, b"back");
}

#[tokio::test(start_paused = true)]
async fn opens_made_while_the_server_is_down_succeed_with_its_first_connect() {
    let server = Server::new();
    server.up.store(false, Ordering::SeqCst);
    let pool = server.pool_with(Pool::builder(2));

    // Twenty opens while the server is down; it comes back after half a second.
    let opens: Vec<_> = (0..20)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let stream = pool.open().await;
                (stream, Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.up.store(true, Ordering::SeqCst);
    let mut done = Vec::new();
    for outcome in within("the opens", join_all(opens)).await {
        let (stream, at) = outcome.expect("no panic");
        stream.expect("every open waits for the server rather than failing");
        done.push(at);
    }
    let first = server.first_success().expect("a connect succeeded");
    for at in done {
        assert!(
            at.saturating_duration_since(first) <= Duration::from_millis(100),
            "an open finished {:?} after the first successful connect",
            at.saturating_duration_since(first)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_clean_close_by_the_server_does_not_grow_the_backoff() {
    let server = Server::new();
    // The default backoff: a session that lives under 5 s and fails counts as a failure.
    let pool = server.pool_with(Pool::builder(1));
    assert_eq!(within("fill", pool.fill()).await, 1);
    for restart in 1..=5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The server closes its session cleanly (CloseMux), as a graceful restart does.
        let closed = server.latest_session();
        within("the server's close", closed.close())
            .await
            .expect("a clean close");
        let at = Instant::now();
        // No open fails with the closed session's error, and none waits for a backoff.
        let stream = within("open after the close", pool.open())
            .await
            .unwrap_or_else(|error| panic!("open after restart {restart}: {error}"));
        assert!(
            at.elapsed() < Duration::from_millis(50),
            "restart {restart}: the open waited {:?}",
            at.elapsed()
        );
        assert_eq!(within("echo", round_trip(stream, b"again")).await, b"again");
    }
    assert_eq!(server.attempts(), 6, "one connect per restart");
}

#[tokio::test(start_paused = true)]
async fn a_server_that_closes_every_session_at_once_is_backed_off_from() {
    let server = Server::new();
    let pool = server.pool_with(Pool::builder(1).open_timeout(Duration::from_secs(2)));
    // Every session the server makes is closed cleanly as soon as it is made.
    let closer = {
        let server = server.clone();
        tokio::spawn(async move {
            let mut closed = 0;
            loop {
                let sessions: Vec<Session> = server.sessions.lock().expect("not poisoned").clone();
                for session in &sessions[closed..] {
                    let _ = session.close().await;
                }
                closed = sessions.len();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        // Opens may catch a session before its close; what counts is how often it connects.
        let _ = within("an open", pool.open()).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    closer.abort();
    // Sessions closed within the initial backoff count as failures: in 2 s, connects at once,
    // once more at once, then 100, 200, 400 and 800 ms apart.
    assert!(
        server.attempts() <= 7,
        "{} connects in 2 s",
        server.attempts()
    );
}

#[tokio::test(start_paused = true)]
async fn a_backoff_of_duration_max_neither_panics_nor_strands_the_waiting_opens() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let pool = {
        let attempts = Arc::clone(&attempts);
        Pool::builder(1)
            .backoff(Duration::MAX, Duration::MAX)
            .open_timeout(Duration::from_secs(2))
            .build(move || {
                attempts.fetch_add(1, Ordering::SeqCst);
                async { Err::<DuplexStream, _>(io::Error::from(io::ErrorKind::ConnectionRefused)) }
            })
    };
    // Failures in a row: the first retries at once, the second waits `Duration::MAX`, which no
    // `Instant` can hold. The opens waiting meanwhile must still be woken, and fail in time.
    let opens = (0..3).map(|_| pool.open());
    for outcome in within("the opens", join_all(opens)).await {
        assert!(
            matches!(outcome, Err(Error::PoolUnavailable { last: Some(_) })),
            "{outcome:?}"
        );
    }
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "no connect after the second failure"
    );
    // The second failure was recorded (a panic there would have left the slot connecting for
    // ever), and the pool still answers, and still fails in time.
    let state = format!("{pool:?}");
    assert!(state.contains("connecting: 0"), "{state}");
    let outcome = within("a later open", pool.open()).await;
    assert!(
        matches!(outcome, Err(Error::PoolUnavailable { .. })),
        "{outcome:?}"
    );

    // Every duration at its largest, and a server that answers: it just works.
    let server = Server::new();
    let pool = server.pool_with(
        Pool::builder(1)
            .backoff(Duration::MAX, Duration::MAX)
            .connect_timeout(Duration::MAX)
            .open_timeout(Duration::MAX),
    );
    let stream = within("open", pool.open()).await.expect("open");
    assert_eq!(within("echo", round_trip(stream, b"max")).await, b"max");
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
    assert!(matches!(
        pool.open().await,
        Err(Error::SessionUnavailable(reason)) if matches!(*reason, Error::ClosedLocally)
    ));
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
    assert!(matches!(
        pool.open().await,
        Err(Error::SessionUnavailable(reason)) if matches!(*reason, Error::ClosedLocally)
    ));
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

/// The open timeout covers the wait for room on the session too: with the session at its
/// `max_streams`, an open fails at the timeout with `PoolUnavailable`, carrying
/// `TooManyStreams`, instead of waiting for ever; once a stream goes, opens go through again.
#[tokio::test(start_paused = true)]
async fn an_open_waiting_for_room_on_a_full_session_times_out() {
    let server = Server::new();
    let pool = server.pool_with(
        Pool::builder(1)
            .config(gomux::Config::default().max_streams(2))
            .open_timeout(Duration::from_secs(1)),
    );
    let first = within("open", pool.open()).await.expect("open");
    let _second = within("open", pool.open()).await.expect("open");
    let started = Instant::now();
    let error = within("open", pool.open()).await.expect_err("no room");
    assert!(
        matches!(&error, gomux::Error::PoolUnavailable { last: Some(last) } if matches!(**last, gomux::Error::TooManyStreams)),
        "{error:?}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    drop(first);
    within("open", pool.open()).await.expect("room again");
}
