//! Regression tests for four findings about the session core, each written against the public
//! API only (sessions, streams, stats, and raw frames for a hostile peer), so that they hold for
//! any implementation of the core:
//!
//! 1. Credit starvation: a side whose writers keep its outgoing queue full must still return
//!    credit for what it receives, or every inbound stream stalls for as long as it uploads.
//! 2. False close timeout: `Stream::close` beside a busy stream returns once the stream's bytes
//!    are written, and `Stats::bytes_sent` counts writes while the queue never empties.
//! 3. Waiter growth: a future waiting for room or for its bytes to be written holds one
//!    registration, however often it is polled, woken, or cancelled and retried.
//! 4. Control backlog: close frames for streams a peer opens and never reads the answers to are
//!    bounded like the rest of the outgoing queue: the session stops reading instead.
//!
//! Beside finding 2, two more tests show a fifth problem met while writing them: a write or an
//! open beside a bulk upload that keeps the queue full never gets its turn.
//!
//! Everything runs on paused time (the simulated link of `tests/link` runs on tokio's timers), so
//! each scenario is deterministic and the bounds are in virtual time. `--nocapture` prints the
//! figures.

mod common;
mod counting;
mod link;

use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use common::{assert_same, pattern, raw_session, within, within_for, Faults, RawPeer};
use counting::{peak, start_counting};
use gomux::frame::{Frame, Header, Kind, HEADER_LEN};
use gomux::{Config, Error, Role, Session, Stream};
use link::Link;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// 10 ms each way, 100 Mbit/s, and a buffer of twice the bandwidth-delay product each way.
const LAN: Link = Link {
    latency: Duration::from_millis(10),
    bandwidth: 12_500_000,
    buffer: 500_000,
};

/// Lets every task run until all of them wait (on paused time, nothing else happens meanwhile).
async fn settle() {
    sleep(Duration::from_millis(1)).await;
}

// ---------------------------------------------------------------------------------------------
// Traffic on both directions at once.

/// A writer that sends 64 KiB chunks on `stream` until `stop` is set, then half-closes; counts
/// what it sent in `sent`.
fn endless_upload(
    mut stream: Stream,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> JoinHandle<io::Result<()>> {
    tokio::spawn(async move {
        let chunk = pattern(1, 64 * KIB);
        while !stop.load(Ordering::Relaxed) {
            stream.write_all(&chunk).await?;
            sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        stream.shutdown().await
    })
}

/// Accepts every stream on `session` and reads each to its end in its own task; each task
/// returns what it read.
fn spawn_readers(session: Session) -> JoinHandle<Vec<JoinHandle<io::Result<Vec<u8>>>>> {
    tokio::spawn(async move {
        let mut readers = Vec::new();
        while let Ok(mut stream) = session.accept().await {
            readers.push(tokio::spawn(async move {
                let mut got = Vec::new();
                // Keeps only what a short stream sends; the bulk is counted, not kept.
                let mut buf = vec![0; 256 * KIB];
                loop {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        return Ok(got);
                    }
                    if got.len() < 4096 {
                        got.extend_from_slice(&buf[..n.min(4096)]);
                    }
                }
            }));
        }
        readers
    })
}

/// The client uploads without end on one stream while the server sends `DOWNLOAD` bytes to the
/// client on another, starting `warmup` after the upload. Fails the test unless the download is
/// complete within `limit` of virtual time, with the upload still running; returns the bytes
/// uploaded by then.
async fn download_beside_an_endless_upload(
    client: Session,
    server: Session,
    warmup: Duration,
    limit: Duration,
) -> u64 {
    const DOWNLOAD: usize = MIB;
    let stop = Arc::new(AtomicBool::new(false));
    let uploaded = Arc::new(AtomicU64::new(0));
    let upload_stream = within("open the upload", client.open())
        .await
        .expect("open the upload");
    let upload = endless_upload(upload_stream, Arc::clone(&stop), Arc::clone(&uploaded));
    let readers = spawn_readers(server.clone());
    sleep(warmup).await;
    let want = pattern(2, DOWNLOAD);
    let sent = want.clone();
    let opener = server.clone();
    let sender = tokio::spawn(async move {
        let mut stream = opener.open().await.expect("open the download");
        stream.write_all(&sent).await.expect("write the download");
        stream.shutdown().await.expect("half-close the download");
        stream
    });
    let received = Arc::new(AtomicUsize::new(0));
    let download = async {
        let mut stream = client.accept().await.expect("accept the download");
        let mut got = Vec::with_capacity(DOWNLOAD);
        let mut buf = vec![0; 64 * KIB];
        loop {
            let n = stream.read(&mut buf).await.expect("read the download");
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&buf[..n]);
            received.store(got.len(), Ordering::Relaxed);
        }
    };
    let Ok(got) = timeout(limit, download).await else {
        panic!(
            "the download stalled: {} of {DOWNLOAD} bytes arrived in {limit:?} while the other \
             direction uploaded {} bytes",
            received.load(Ordering::Relaxed),
            uploaded.load(Ordering::Relaxed)
        );
    };
    let during = uploaded.load(Ordering::Relaxed);
    assert!(
        !upload.is_finished(),
        "the upload ended before the download did: {:?}",
        upload.await
    );
    assert_same(&got, &want, "download");
    stop.store(true, Ordering::Relaxed);
    within("the upload stops", upload)
        .await
        .expect("no panic")
        .expect("the upload runs until told to stop");
    drop(within("the sender", sender).await.expect("no panic"));
    client.close().await.expect("close the client");
    drop(readers);
    drop(server);
    during
}

/// How long the upload runs before the download starts: long enough for the uploader's credit
/// to have grown past what the link and the queue hold, so that the queue is full from then on.
const WARMUP: Duration = Duration::from_secs(2);

/// Finding 1, on a LAN-like link: the server grants a 4 MiB window, so the client's uploader
/// always holds more credit than the client's 1 MiB outgoing queue and keeps it full. The client
/// must still return credit for the 1 MiB it downloads meanwhile, or the server's sender stalls
/// after its first window for as long as the upload runs, which for a tunnel or a proxy means
/// for ever. At 64 KiB per round trip behind a full queue (about 0.2 s), the download takes a
/// few seconds; the bound is 60 s.
#[tokio::test(start_paused = true)]
async fn credit_flows_back_while_an_upload_keeps_the_queue_full() {
    let (a, b) = LAN.pair();
    let client = Session::with_config(a, Role::Client, Config::default());
    let server_config = Config::default().receive_window(4 * MIB as u32);
    let server = Session::with_config(b, Role::Server, server_config);
    let uploaded =
        download_beside_an_endless_upload(client, server, WARMUP, Duration::from_secs(60)).await;
    println!("LAN, 4 MiB server window: {uploaded} bytes uploaded by the end of the download");
}

/// Finding 1 with a small outgoing queue: a client with `write_buffer_size` 16 KiB and the
/// default windows, on the same link. Its uploader's credit (64 KiB at the start, grown since)
/// exceeds the queue, so the queue is full at every batch; the 1 MiB download must still
/// complete while the upload goes on.
///
/// (On an in-memory pipe the same settings do not stall: with nothing but the CPU to wait for,
/// the uploader runs short of credit now and then and the queue empties. The link keeps the
/// uploader ahead of the transport, as a real network does.)
#[tokio::test(start_paused = true)]
async fn credit_flows_back_from_a_small_queue_kept_full_by_an_upload() {
    let (a, b) = LAN.pair();
    let client_config = Config::default().write_buffer_size(16 * KIB);
    let client = Session::with_config(a, Role::Client, client_config);
    let server = Session::with_config(b, Role::Server, Config::default());
    let uploaded =
        download_beside_an_endless_upload(client, server, WARMUP, Duration::from_secs(60)).await;
    println!("LAN, 16 KiB queue: {uploaded} bytes uploaded by the end of the download");
}

/// Finding 1 with every setting at its default, on a long fat link (20 ms each way, 1 Gbit/s):
/// once the server's tuned window for the upload has grown past the client's 1 MiB queue, the
/// queue stays full, and the download must still complete. Behind the link's 10 MB buffer a
/// credit round trip takes about 0.12 s, so 1 MiB needs at most about 2 s even with a window
/// that never grows; the bound is 20 s.
#[tokio::test(start_paused = true)]
async fn credit_flows_back_on_a_long_fat_link_with_default_settings() {
    const WAN: Link = Link {
        latency: Duration::from_millis(20),
        bandwidth: 125_000_000,
        buffer: 10_000_000,
    };
    let (a, b) = WAN.pair();
    let client = Session::with_config(a, Role::Client, Config::default());
    let server = Session::with_config(b, Role::Server, Config::default());
    let uploaded =
        download_beside_an_endless_upload(client, server, WARMUP, Duration::from_secs(20)).await;
    println!("20 ms / 1 Gbit/s, defaults: {uploaded} bytes uploaded by the end of the download");
}

// ---------------------------------------------------------------------------------------------
// Finding 2: what counts as written while another stream keeps the queue busy.

/// The close timeout the busy-queue cases configure.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// A client bulk-uploading without end on one stream over [`LAN`] to a server that reads
/// everything; the server grants 4 MiB windows, so the uploader is never short of credit and
/// the client's outgoing queue is refilled before every batch. Beside it, a quiet stream that
/// wrote `b"hello"` before the bulk started.
struct Busy {
    client: Session,
    server: Session,
    quiet: Stream,
    stop: Arc<AtomicBool>,
    upload: JoinHandle<io::Result<()>>,
    readers: JoinHandle<Vec<JoinHandle<io::Result<Vec<u8>>>>>,
}

async fn busy_client() -> Busy {
    let (a, b) = LAN.pair();
    let client_config = Config::default().close_timeout(CLOSE_TIMEOUT);
    let client = Session::with_config(a, Role::Client, client_config);
    let server_config = Config::default().receive_window(4 * MIB as u32);
    let server = Session::with_config(b, Role::Server, server_config);
    let readers = spawn_readers(server.clone());
    let mut quiet = within("open the quiet stream", client.open())
        .await
        .expect("open the quiet stream");
    quiet
        .write_all(b"hello")
        .await
        .expect("write on the quiet stream");
    let stop = Arc::new(AtomicBool::new(false));
    let bulk = within("open the bulk stream", client.open())
        .await
        .expect("open the bulk stream");
    let upload = endless_upload(bulk, Arc::clone(&stop), Arc::new(AtomicU64::new(0)));
    // Well under way: the link is full and so is the queue.
    sleep(Duration::from_millis(500)).await;
    Busy {
        client,
        server,
        quiet,
        stop,
        upload,
        readers,
    }
}

impl Busy {
    /// Stops the bulk upload and closes the sessions; returns what the server read on the quiet
    /// stream (the first stream it accepted).
    async fn finish(self) -> Vec<u8> {
        assert!(
            !self.upload.is_finished(),
            "the bulk upload ended early: {:?}",
            self.upload.await
        );
        self.stop.store(true, Ordering::Relaxed);
        within_for(
            Duration::from_secs(600),
            "the bulk upload stops",
            self.upload,
        )
        .await
        .expect("no panic")
        .expect("the bulk upload runs until told to stop");
        drop(self.quiet);
        self.client.close().await.expect("close the client");
        let readers = within("the server's acceptor ends", self.readers)
            .await
            .expect("no panic");
        let quiet = readers.into_iter().next().expect("the quiet stream");
        let got = within("the server reads the quiet stream", quiet)
            .await
            .expect("no panic");
        drop(self.server);
        got.expect("the server reads the quiet stream to its end")
    }
}

/// Finding 2: stream B wrote a few bytes before stream A started to keep the outgoing queue
/// busy with a bulk upload; now B closes. Its CloseStream leaves with the next batch, a fraction
/// of a second later, so `close` must return `Ok`, rather than wait out the whole close timeout
/// and report that the transport took nothing (a `TimedOut` error that an application would
/// treat as a dead connection).
#[tokio::test(start_paused = true)]
async fn closing_a_stream_beside_a_busy_one_returns_once_its_bytes_are_written() {
    let mut busy = busy_client().await;
    let closed = within_for(Duration::from_secs(600), "close B", busy.quiet.close()).await;
    if let Err(error) = &closed {
        panic!(
            "closing B beside a busy stream failed, though its close went out with the next \
             batch: {error:?}"
        );
    }
    let got = busy.finish().await;
    assert_eq!(got, b"hello", "what the server read on B");
}

/// Finding 2, the counter: `Stats::bytes_sent` is what was written to the transport, so it must
/// grow while a bulk upload runs, even though the upload never lets the outgoing queue empty.
/// Sampled five times, 200 ms of virtual time apart (2.5 MB of link time each).
#[tokio::test(start_paused = true)]
async fn bytes_sent_grows_while_the_queue_never_empties() {
    let busy = busy_client().await;
    let mut samples = vec![busy.client.stats().bytes_sent];
    for _ in 0..5 {
        sleep(Duration::from_millis(200)).await;
        samples.push(busy.client.stats().bytes_sent);
    }
    println!("bytes_sent every 200 ms during the bulk upload: {samples:?}");
    assert!(
        samples.windows(2).all(|pair| pair[1] > pair[0]),
        "bytes_sent stood still while the bulk upload was being written: {samples:?}"
    );
    busy.finish().await;
}

// Beyond the four findings: while the bulk upload keeps the queue full, a small write or an
// open beside it never gets in. Writers waiting for room are woken oldest first, but the room is
// not kept for them: the bulk writer, woken with them and polled first, refills the whole queue,
// and the others go back to the end of the line, every time.

/// A 6-byte write on a stream beside a bulk upload: the queue is documented to let waiting
/// writers in oldest first, so that a frame waits behind at most about twice
/// `write_buffer_size` plus what the transport holds (about 0.2 s on this link). The bound is
/// 10 s of virtual time; the write must not wait for the bulk upload to end.
#[tokio::test(start_paused = true)]
async fn a_small_write_beside_a_bulk_upload_gets_its_turn() {
    let mut busy = busy_client().await;
    within_for(
        Duration::from_secs(10),
        "a 6-byte write beside a bulk upload that keeps the queue full",
        busy.quiet.write_all(b" again"),
    )
    .await
    .expect("write on the quiet stream");
    let got = busy.finish().await;
    assert_eq!(
        got, b"hello again",
        "what the server read on the quiet stream"
    );
}

/// An open beside a bulk upload: opens wait for room like writes (an OpenStream frame is 8
/// bytes), and take their turn like them. Bound: 10 s of virtual time.
#[tokio::test(start_paused = true)]
async fn an_open_beside_a_bulk_upload_gets_its_turn() {
    let busy = busy_client().await;
    let opened = within_for(
        Duration::from_secs(10),
        "an open beside a bulk upload that keeps the queue full",
        busy.client.open(),
    )
    .await
    .expect("open beside the bulk upload");
    drop(opened);
    busy.finish().await;
}

// ---------------------------------------------------------------------------------------------
// Finding 3: registrations of a waiting future.

/// A waker that relays to the task polling the future, so that the clones the session keeps of
/// it can be counted: [`Arc::strong_count`] of the relay counts every clone of a waker built
/// from it.
struct Relay {
    task: Mutex<Option<Waker>>,
}

impl Relay {
    fn new() -> Arc<Relay> {
        Arc::new(Relay {
            task: Mutex::new(None),
        })
    }
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let task = self.task.lock().expect("relay lock").clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// Runs `future`, polling it every time with the same waker built from `relay` (which wakes the
/// task running this). While it runs, `Arc::strong_count(&relay)` is [`RUNNING`] (the caller's
/// `Arc`, this function's and the waker) plus the clones held elsewhere; once it has finished,
/// 1 plus those clones.
async fn relayed<F: Future>(relay: Arc<Relay>, future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::clone(&relay));
    poll_fn(|cx| {
        *relay.task.lock().expect("relay lock") = Some(cx.waker().clone());
        future.as_mut().poll(&mut Context::from_waker(&waker))
    })
    .await
}

/// References to a [`Relay`] that [`relayed`] itself holds while it runs, the caller's included.
const RUNNING: usize = 3;

/// Clones of `relay`'s waker held by others (the session, timers), once nothing is running it.
fn held(relay: &Arc<Relay>) -> usize {
    Arc::strong_count(relay) - 1
}

/// What a waiting future may leave registered: its place among the writers waiting for room,
/// its wake-up for credit, and a timer. Far below the ~10,000 a leak of one per poll gives.
const FEW: usize = 4;

/// A server session whose raw peer opened stream 0 and reads nothing: the transport accepts no
/// writes (`stall_writes`) and the outgoing queue holds 1000 bytes. 1000-byte writes on the
/// stream fill what the session holds (the queue, and a batch being written if it has one) in a
/// few writes; the stream still has most of its 64 KiB of credit, so every further write waits
/// for room.
async fn writer_waiting_for_room() -> (
    Session,
    JoinHandle<Result<(), Error>>,
    Faults,
    RawPeer,
    Stream,
) {
    let config = Config::default().write_buffer_size(1000);
    let (session, driver, faults, mut raw) = raw_session(Role::Server, config);
    faults.stall_writes(true);
    raw.send(Frame::control(0, Kind::OpenStream)).await;
    let mut stream = within("accept", session.accept()).await.expect("stream 0");
    let mut writes = 0;
    // A write that waits (on paused time, 1 ms passes only once every task waits) is dropped
    // having queued nothing: writes are cancel safe.
    while let Ok(written) = timeout(Duration::from_millis(1), stream.write(&[7; 1000])).await {
        written.expect("write");
        writes += 1;
        assert!(
            writes < 16,
            "16 KB written into a 1000-byte queue on a transport that takes nothing"
        );
    }
    (session, driver, faults, raw, stream)
}

/// Finding 3, the WindowUpdate flood: a writer waits for room in a queue the peer never drains,
/// and the peer sends WindowUpdate(id, 0) frames, one at a time, 10,000 of them. Each may wake
/// the writer, which then polls again and waits again; its waker must be registered once, not
/// once more per wake-up, or a peer can grow the session's memory by a waker for every 8 bytes
/// it sends, without end and without ever reading.
#[tokio::test(start_paused = true)]
async fn window_updates_to_a_writer_waiting_for_room_do_not_pile_up_its_waker() {
    const UPDATES: u32 = 10_000;
    let (session, driver, _faults, mut raw, mut stream) = writer_waiting_for_room().await;
    let relay = Relay::new();
    let writer = tokio::spawn(relayed(Arc::clone(&relay), async move {
        let result = stream.write(&[7; 1000]).await;
        (stream, result)
    }));
    settle().await;
    assert!(!writer.is_finished(), "the write should wait for room");
    let before = session.stats().frames_received;
    for _ in 0..UPDATES {
        raw.send(Frame::window_update(0, 0)).await;
        settle().await;
    }
    assert_eq!(
        session.stats().frames_received - before,
        u64::from(UPDATES),
        "the session read every update"
    );
    assert!(!writer.is_finished(), "the write still waits for room");
    let clones = Arc::strong_count(&relay) - RUNNING;
    println!("{UPDATES} zero window updates: the session holds {clones} clones of the waker");
    assert!(
        clones <= FEW,
        "after {UPDATES} WindowUpdate(0, 0) frames the session holds {clones} clones of the \
         waiting writer's waker"
    );
    writer.abort();
    drop((session, driver, raw));
}

/// Finding 3, a write retried under a timeout: the queue is full and stays full, and the
/// application tries `timeout(1 ms, stream.write(..))` 10,000 times, each attempt a new write
/// future polled once and dropped when its time is up. A dropped write must not leave its
/// registration behind (writes are documented as cancel safe), so the task's waker is held a
/// few times at most, not once per attempt.
#[tokio::test(start_paused = true)]
async fn writes_retried_under_a_timeout_leave_no_registrations_behind() {
    const ATTEMPTS: usize = 10_000;
    let (session, driver, _faults, raw, mut stream) = writer_waiting_for_room().await;
    let relay = Relay::new();
    let written = relayed(Arc::clone(&relay), async {
        let mut written = 0;
        for _ in 0..ATTEMPTS {
            if let Ok(result) = timeout(Duration::from_millis(1), stream.write(&[7; 1000])).await {
                written += result.expect("write");
            }
        }
        written
    })
    .await;
    assert_eq!(written, 0, "the queue stayed full: no attempt could write");
    let clones = held(&relay);
    println!("{ATTEMPTS} timed-out writes: the session holds {clones} clones of the waker");
    assert!(
        clones <= FEW,
        "after {ATTEMPTS} cancelled writes the session holds {clones} clones of the task's waker"
    );
    drop((stream, session, driver, raw));
}

/// Finding 3, `Stream::close` polled again and again: the transport takes no writes, so a
/// close waits for its bytes to be written, inside a `select!` with a 1 ms ticker (as a task
/// that also serves a timer does). Every tick polls the close future again; it must keep one
/// registration, not add one per poll, and dropping it must not leave them behind.
#[tokio::test(start_paused = true)]
async fn a_close_polled_again_and_again_holds_one_registration() {
    const TICKS: usize = 10_000;
    let config = Config::default().close_timeout(Duration::from_secs(3600));
    let (session, driver, faults, mut raw) = raw_session(Role::Server, config);
    faults.stall_writes(true);
    raw.send(Frame::control(0, Kind::OpenStream)).await;
    let mut stream = within("accept", session.accept()).await.expect("stream 0");
    stream.write_all(b"bye").await.expect("write");
    let relay = Relay::new();
    let during = relayed(Arc::clone(&relay), async {
        let mut ticker = tokio::time::interval(Duration::from_millis(1));
        let close = stream.close();
        let mut close = pin!(close);
        for _ in 0..TICKS {
            tokio::select! {
                biased;
                result = close.as_mut() => panic!("the close ended on a stalled transport: {result:?}"),
                _ = ticker.tick() => {}
            }
        }
        // The close future is still alive here, waiting.
        Arc::strong_count(&relay) - RUNNING
    })
    .await;
    let after = held(&relay);
    println!(
        "close polled {TICKS} times: {during} clones of the waker held while it waited, {after} \
         after it was dropped"
    );
    assert!(
        during <= FEW,
        "a close polled {TICKS} times left {during} clones of the task's waker registered"
    );
    assert!(
        after <= FEW,
        "the dropped close left {after} clones of the task's waker registered"
    );
    drop((stream, session, driver, raw));
}

/// Finding 3, flushes after the session ended: the session is closing but its transport takes
/// no writes (close timeout one hour), so a flush waits for the stream's bytes to be written.
/// The application retries `timeout(1 ms, stream.flush())` 10,000 times; each dropped flush
/// must take its registration with it.
#[tokio::test(start_paused = true)]
async fn flushes_retried_after_the_session_ended_leave_no_registrations_behind() {
    const ATTEMPTS: usize = 10_000;
    let config = Config::default().close_timeout(Duration::from_secs(3600));
    let (session, driver, faults, mut raw) = raw_session(Role::Server, config);
    faults.stall_writes(true);
    raw.send(Frame::control(0, Kind::OpenStream)).await;
    let mut stream = within("accept", session.accept()).await.expect("stream 0");
    stream.write_all(b"unsent").await.expect("write");
    let closer = session.clone();
    let closing = tokio::spawn(async move { closer.close().await });
    settle().await;
    assert!(session.is_closed(), "the session has ended");
    assert!(!closing.is_finished(), "and waits to write what is queued");
    let relay = Relay::new();
    let flushed = relayed(Arc::clone(&relay), async {
        let mut flushed = 0;
        for _ in 0..ATTEMPTS {
            if timeout(Duration::from_millis(1), stream.flush())
                .await
                .is_ok()
            {
                flushed += 1;
            }
        }
        flushed
    })
    .await;
    assert_eq!(flushed, 0, "nothing was written: every flush waited");
    let clones = held(&relay);
    println!("{ATTEMPTS} timed-out flushes: the session holds {clones} clones of the waker");
    assert!(
        clones <= FEW,
        "after {ATTEMPTS} cancelled flushes the session holds {clones} clones of the task's waker"
    );
    closing.abort();
    drop((stream, session, driver, raw));
}

// ---------------------------------------------------------------------------------------------
// Finding 4: the control backlog. Live bytes are counted with `counting` (per thread), so the
// test runs on a current-thread runtime.

/// A peer that opens stream after stream (client ids 0, 2, 4, …), `opens` in all, and never
/// reads a byte of what the session writes. Its opens arrive a few at a time, each packet a
/// separate read (the next one is ready only after the session has come back for it), so the
/// application keeps up with accepting them, as it would over a network.
struct OpenFlood {
    opens: u32,
    sent: u32,
    /// Opens per packet.
    per_packet: u32,
    head: [u8; HEADER_LEN],
    head_sent: usize,
    /// Whether the next packet has "arrived".
    arrived: bool,
    /// Bytes the session has read so far.
    fed: Arc<AtomicUsize>,
}

impl AsyncRead for OpenFlood {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.sent == this.opens && this.head_sent == HEADER_LEN {
            // All sent: the peer goes quiet, the connection stays open.
            return Poll::Pending;
        }
        if !this.arrived {
            this.arrived = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.arrived = false;
        let start = buf.filled().len();
        let mut budget = this.per_packet as usize * HEADER_LEN;
        while buf.remaining() > 0 && budget > 0 {
            if this.head_sent == HEADER_LEN {
                if this.sent == this.opens {
                    break;
                }
                this.head = Header::new(2 * this.sent, Kind::OpenStream).to_bytes();
                this.head_sent = 0;
                this.sent += 1;
            }
            let n = (HEADER_LEN - this.head_sent)
                .min(buf.remaining())
                .min(budget);
            buf.put_slice(&this.head[this.head_sent..this.head_sent + n]);
            this.head_sent += n;
            budget -= n;
        }
        this.fed
            .fetch_add(buf.filled().len() - start, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for OpenFlood {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Pending
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Pending
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Pending
    }
}

/// Finding 4: a server with `write_buffer_size` 64 KiB and `max_streams` 16 whose peer opens
/// 500,000 streams (4 MB of OpenStream frames) and never reads; the application accepts each
/// stream and drops it at once, so each costs an 8-byte CloseStream. The control queue is
/// documented (`Config`, "Memory bounds") to hold at most
/// `8 × (accept_backlog + 5 × max_streams)` bytes (8,832 here); once the close frames reach
/// its bound, the session must stop reading (as it does for refusals) rather than queue a
/// close for every open the peer sends. (The first core read all 4 MB.) Checked twice: what
/// the session read of the flood must stay within that bound plus a read buffer (64 KiB), and
/// the memory live at the peak within the bound plus 1 MiB for everything else (read buffer,
/// stream table, tasks).
#[tokio::test(start_paused = true)]
async fn close_frames_for_dropped_streams_stop_the_reading_at_the_queue_bound() {
    const OPENS: u32 = 500_000;
    const WRITE_BUFFER: usize = 64 * KIB;
    const MAX_STREAMS: usize = 16;
    const ACCEPT_BACKLOG: usize = 1024;
    let queue_bound = HEADER_LEN * (ACCEPT_BACKLOG + 5 * MAX_STREAMS);
    let read_bound = queue_bound + 64 * KIB;
    let memory_bound = queue_bound + MIB;
    let config = Config::default()
        .write_buffer_size(WRITE_BUFFER)
        .max_streams(MAX_STREAMS)
        .accept_backlog(ACCEPT_BACKLOG);
    start_counting();
    let fed = Arc::new(AtomicUsize::new(0));
    let peer = OpenFlood {
        opens: OPENS,
        sent: 0,
        per_packet: 8,
        head: [0; HEADER_LEN],
        head_sent: HEADER_LEN,
        arrived: false,
        fed: Arc::clone(&fed),
    };
    let session = Session::with_config(peer, Role::Server, config);
    let accepted = Arc::new(AtomicU64::new(0));
    let acceptor = {
        let session = session.clone();
        let accepted = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok(stream) = session.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        })
    };
    // On paused time this ends once every task waits: the flood is over, or the session has
    // stopped reading it.
    sleep(Duration::from_secs(1)).await;
    let held = peak();
    let fed = fed.load(Ordering::Relaxed);
    let stats = session.stats();
    println!(
        "{OPENS} opens offered: the session read {fed} bytes ({} opens), accepted {}, refused {}; \
         peak {held} bytes live; bounds: read {read_bound}, memory {memory_bound}",
        fed / HEADER_LEN,
        accepted.load(Ordering::Relaxed),
        stats.streams_refused,
    );
    assert!(!session.is_closed(), "{:?}", session.close_reason());
    assert!(
        fed <= read_bound,
        "the session read {fed} bytes ({} opens) from a peer that reads nothing, each answered \
         with a queued CloseStream (bound {read_bound}); peak {held} bytes live",
        fed / HEADER_LEN
    );
    assert!(
        held <= memory_bound,
        "peak of {held} bytes live, bound {memory_bound}"
    );
    acceptor.abort();
}

/// Finding 1, at the granularity the issue asks for: control frames go out ahead of data at
/// every transport write, not only at the start of the next batch. A 512 KiB batch is being
/// written into a connection that holds 16 KiB; meanwhile the application reads another stream
/// and owes its credit. The peer then reads the connection and counts the data that comes
/// before the WindowUpdate: at most what was already in the connection, plus the data up to
/// the next recorded frame start (one 64 KiB frame here), plus one write. Taken only with the
/// next batch, as the second core first did, it came after the whole 512 KiB.
#[tokio::test(start_paused = true)]
async fn credit_owed_in_the_middle_of_a_batch_goes_out_at_the_next_frame() {
    const BULK: usize = 512 * KIB;
    let (io, peer) = tokio::io::duplex(16 * KIB);
    let session = Session::with_config(io, Role::Client, Config::default());
    let mut raw = RawPeer {
        framed: tokio_util::codec::Framed::new(peer, gomux::codec::FrameCodec::new()),
    };
    let mut bulk = within("open", session.open()).await.expect("open");
    assert_eq!(
        raw.recv().await.map(|f| (f.header.id, f.header.kind)),
        Some((gomux::frame::GREETING_ID, Kind::Keepalive)),
        "the greeting comes first"
    );
    assert_eq!(
        raw.recv().await.map(|f| f.header.kind),
        Some(Kind::OpenStream)
    );
    raw.send(Frame::window_update(0, MIB as u32)).await;
    let writer = tokio::spawn(async move {
        bulk.write_all(&vec![7; BULK]).await.expect("bulk write");
        bulk
    });
    sleep(Duration::from_millis(10)).await;
    // The whole bulk is queued and the driver is writing it: the connection is full.
    raw.send(Frame::control(1, Kind::OpenStream)).await;
    raw.send(Frame::data(1, vec![1; 32 * KIB])).await;
    let mut inbound = within("accept", session.accept()).await.expect("accept");
    let mut got = vec![0; 32 * KIB];
    within("read", inbound.read_exact(&mut got))
        .await
        .expect("read");
    // The credit for those 32 KiB is owed now.
    let mut data_before = 0;
    loop {
        let frame = raw.recv().await.expect("a frame");
        match (frame.header.kind, frame.header.id) {
            (Kind::WindowUpdate, 1) => break,
            (Kind::Data, 0) => data_before += frame.payload.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
    let bound = 16 * KIB + 64 * KIB + 64 * KIB;
    assert!(
        data_before <= bound,
        "{data_before} bytes of the bulk went out before the credit owed (bound {bound})"
    );
    writer.abort();
}

/// Sends 8 MiB from the client to the server on one stream over `LAN`, while the server writes
/// without pause on `outgoing` streams of its own; returns the stream's rate in bytes per
/// second of virtual time. The server returns the credit for the 8 MiB while its own writers
/// keep its data queue full.
async fn reverse_rate(outgoing: usize) -> f64 {
    const TOTAL: usize = 8 * MIB;
    let (a, b) = LAN.pair();
    let client = Session::with_config(a, Role::Client, Config::default());
    let server = Session::with_config(b, Role::Server, Config::default());
    for _ in 0..outgoing {
        let mut stream = within("open", server.open()).await.expect("open");
        tokio::spawn(async move {
            let chunk = vec![1; 64 * KIB];
            while stream.write_all(&chunk).await.is_ok() {}
        });
    }
    let sink = client.clone();
    tokio::spawn(async move {
        while let Ok(mut stream) = sink.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * KIB];
                while stream.read(&mut buf).await.unwrap_or(0) > 0 {}
            });
        }
    });
    sleep(Duration::from_secs(1)).await;
    let reader = {
        let server = server.clone();
        tokio::spawn(async move {
            let mut stream = server.accept().await.expect("accept");
            let mut buf = vec![0; 64 * KIB];
            let mut received = 0;
            while received < TOTAL {
                received += stream.read(&mut buf).await.expect("read");
            }
        })
    };
    let start = tokio::time::Instant::now();
    let mut stream = within("open", client.open()).await.expect("open");
    let chunk = vec![2; 64 * KIB];
    for _ in 0..TOTAL / chunk.len() {
        stream.write_all(&chunk).await.expect("write");
    }
    within_for(Duration::from_secs(600), "the reverse stream", reader)
        .await
        .expect("the reader finishes");
    TOTAL as f64 / start.elapsed().as_secs_f64()
}

/// Finding 1, below the threshold: a stream towards a side that is busy sending on 16 streams
/// of its own keeps most of the rate it has alone, since the busy side's credit goes out at
/// every write, not behind its data. On `LAN` (paused time, so the ratio is a property of the
/// protocol logic): credit once a batch 0.67, at every write 0.83; what is left is the link's
/// own queue, which the credit waits behind as TCP's acknowledgements would. On the first core
/// the reverse stream starved: the test did not finish (stopped after 60 s).
#[tokio::test(start_paused = true)]
async fn a_stream_towards_a_busy_side_keeps_its_rate() {
    let alone = reverse_rate(0).await;
    let beside = reverse_rate(16).await;
    println!(
        "reverse stream: {:.2} MB/s alone, {:.2} MB/s beside 16 outgoing streams ({:.2})",
        alone / 1e6,
        beside / 1e6,
        beside / alone
    );
    assert!(
        beside >= 0.75 * alone,
        "{beside:.0} B/s beside 16 outgoing streams, {alone:.0} B/s alone"
    );
}
