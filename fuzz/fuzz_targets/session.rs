//! Arbitrary bytes as everything a peer sends to a server session whose application accepts
//! streams, reads them and writes back what it read.
//!
//! Input: two bytes of options, then the bytes the peer sends. The first byte:
//!
//! - bits 0–1: how the bytes are cut into transport reads (1, 7, 64 or 4096 bytes at most);
//! - bit 2: whether the connection then ends (0) or goes quiet (1);
//! - bits 3–4: how the peer takes the session's writes: 0 at once, always; 1 with stalls at
//!   random (after a write it takes, the peer may take nothing more for up to 2 s); 2 never
//!   while it still sends (until its input is all read, for at most 20 s), then at once; 3 both.
//!   With any stall the peer also hands its input out one piece per turn (its next read says
//!   "not yet" and wakes itself), so the application runs between the pieces;
//! - bits 5–6: frames the peer adds after each whole frame of the input: 0 none; 1 a
//!   WindowUpdate of 0 for the frame's stream; 2 a frame for a stream that does not exist (Data,
//!   WindowUpdate, CloseRead, CloseWrite or CloseStream, for an id nobody opened); 3 either, or
//!   nothing, at random;
//! - bit 7: the whole frames of the input are sent 16 times over, each time with their stream
//!   ids moved up by 65536 (even, so the opener's parity is kept), then any partial frame.
//!
//! The second byte says whether and how the peer closes the session, at a moment of the
//! input's choosing, while both directions are busy (in these modes the application writes a
//! 64 KiB burst on every stream it accepts before it echoes, so the session has data queued
//! towards the peer whatever the peer sends):
//!
//! - bits 0–1: 0 the peer does not close; 1 it closes as a session of this crate does: a
//!   CloseMux after the chosen frame, then its writing ends (end of file) while it goes on
//!   taking the session's writes; 2 as Go's `Mux.Close` may: the CloseMux, then the whole
//!   connection closes (end of file, and every later write fails with a broken pipe); 3 as 1,
//!   and the application calls `Session::close` the moment the CloseMux is handed to the
//!   session: both close at once;
//! - bits 2–7: where: after whole frame `n × b / 64` of the `n` the peer sends (after the
//!   additions above), `b` being these six bits; with no whole frame, at once.
//!
//! The generated seed corpus (`gen_corpus.py`) uses first bytes 0, 1 and 6 (no stalls, no
//! added frames, no repetition, as before these were added) with a second byte of 0, and
//! first byte 0 with the closes 0x81 and 0x83 (modes 1 and 3, half-way through the input).
//! "At random" means a generator seeded from the input: a run is a deterministic function of
//! its input.
//!
//! Checks:
//!
//! - no panic;
//! - the session never spins: the transport is polled a bounded number of times for the bytes
//!   the peer sends;
//! - no hang: a connection that ends ends the session; a quiet one leaves the session idle, and
//!   closing it then finishes; the driver finishes. Time is paused, so timers (stalls included)
//!   fire as soon as everything waits, and a spin shows up as a poll count instead of a hang;
//! - a peer's close (second byte) ends the session gracefully (`ClosedByPeer`; `ClosedLocally`
//!   when both close at once), unless the input broke the protocol first; when the peer takes
//!   every write at once (no stalls), within [`CLOSE_BOUND`] of the CloseMux reaching the
//!   session, well under the close timeout (5 s), and the application's own `close` in mode 3
//!   returns `Ok` within it too (with stalls, which may add up to more than the close timeout,
//!   that `close` may instead report the timeout, as documented);
//! - the memory bound of the `Config` docs, after everything the transport does: the data
//!   buffered (`Stats::buffered`, and `peak_buffered` at the end) is at most
//!   `max_streams × receive_window + receive_window_budget`, and at most `max_streams` streams
//!   are live;
//! - the outgoing backlog: the frames the session queued (`Stats::frames_sent`) but the peer has
//!   not taken yet must fit in the documented bounds (the `Config` docs, "Memory bounds"): the
//!   data queue and the batch being written, `2 × (write_buffer_size + max_payload + 8 + 16 ×
//!   max_streams)` bytes (a frame takes at least 8 bytes; the application here writes at most
//!   1 KiB per frame, which stands for `max_payload`), and the control queue, `accept_backlog
//!   + 5 × max_streams` frames, plus one frame, a keepalive and CloseMux. A peer that never
//!   reads must therefore not make the session queue answers without end: past its bound, the
//!   session stops reading. (The first session core queued a CloseStream for every stream the
//!   peer opened and half-closed, whatever its backlog: options 0x92, then 256 × (OpenStream,
//!   CloseRead) on ids 0, 2, 4, … left over 1379 frames queued.)
//! - every stream's fate is known: when the peer greeted (its first frame is a Keepalive with
//!   id `GREETING_ID`, as a peer of this crate sends) and the peer took the session's CloseMux,
//!   every stream the application accepted had its acknowledgement (a WindowUpdate for its id)
//!   taken before that CloseMux (unless the input broke the protocol), and no stream is handed
//!   to the application after it. So the
//!   peer can tell the streams that may have been handled (acknowledged) from those that were
//!   not (refused by the CloseMux).

#![no_main]

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use gomux::frame::{Header, Kind, GREETING_ID, HEADER_LEN};
use gomux::{Config, Error, Role, Session};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// Transport polls allowed per byte the peer sends, plus a fixed allowance for timers and
/// closing.
const POLLS_PER_BYTE: usize = 64;
const POLLS_FIXED: usize = 100_000;

/// The session's settings that the checks depend on.
const MAX_STREAMS: usize = 16;
const ACCEPT_BACKLOG: usize = 4;
const WRITE_BUFFER_SIZE: usize = 4096;
const RECEIVE_WINDOW: u64 = 65_536;
const WINDOW_BUDGET: u64 = 256 * 1024;
/// The most the application writes at once, hence the largest Data frame the session sends.
const APP_CHUNK: usize = 1024;

/// Times the input's whole frames are sent with bit 7.
const REPEATS: u32 = 16;
/// How far each repetition moves the stream ids.
const ID_SHIFT: u32 = 0x1_0000;
/// The longest random stall, and the longest stall of a peer that reads nothing while it sends.
const SHORT_STALL_MS: u64 = 2000;
const LONG_STALL: Duration = Duration::from_secs(20);
/// The session's close timeout, and how soon after the peer's CloseMux reaches it a session
/// whose peer takes every write must have ended.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
const CLOSE_BOUND: Duration = Duration::from_secs(2);
/// What the application writes on each stream it accepts before echoing, when the peer closes.
const BURST: usize = 64 * 1024;

/// How the peer closes the session (the second options byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerClose {
    No,
    /// CloseMux, then its writing ends; it goes on taking the session's writes.
    Graceful,
    /// CloseMux, then the connection closes both ways.
    Abrupt,
    /// As `Graceful`, and the application closes the session at the same moment.
    Both,
}

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What the peer sends: the input, with frames added after each whole frame and perhaps
/// repeated (see the module docs); and where each whole frame ends in it.
fn peer_bytes(input: &[u8], inject: u8, repeat: bool, rng: &mut Rng) -> (Vec<u8>, Vec<usize>) {
    // The input's whole frames, and where the partial one at its end starts.
    let mut frames = Vec::new();
    let mut at = 0;
    while input.len() - at >= HEADER_LEN {
        let head = &input[at..at + HEADER_LEN];
        let length = u32::from_le_bytes([head[4], head[5], head[6], 0]) as usize;
        let end = if head[7] == Kind::Data as u8 {
            at + HEADER_LEN + length
        } else {
            at + HEADER_LEN
        };
        if end > input.len() {
            break;
        }
        frames.push(at..end);
        at = end;
    }
    if inject == 0 && !repeat {
        return (
            input.to_vec(),
            frames.iter().map(|range| range.end).collect(),
        );
    }
    let mut ends = Vec::new();
    let mut out = Vec::with_capacity(input.len() * if repeat { 20 } else { 2 });
    for round in 0..if repeat { REPEATS } else { 1 } {
        for range in &frames {
            let start = out.len();
            out.extend_from_slice(&input[range.clone()]);
            let id =
                u32::from_le_bytes([out[start], out[start + 1], out[start + 2], out[start + 3]])
                    .wrapping_add(round * ID_SHIFT);
            out[start..start + 4].copy_from_slice(&id.to_le_bytes());
            let choice = match inject {
                0 => 0,
                1 => 1,
                2 => 2,
                _ => rng.below(3),
            };
            match choice {
                1 => out.extend_from_slice(&frame(id, 0, Kind::WindowUpdate)),
                2 => unknown_frame(&mut out, rng),
                _ => {}
            }
            ends.push(out.len());
        }
    }
    out.extend_from_slice(&input[at..]);
    (out, ends)
}

/// The peer's bytes cut after whole frame `n × at / 64` of their `n`, and a CloseMux there.
fn with_close_mux(mut bytes: Vec<u8>, ends: &[usize], at: u8) -> Vec<u8> {
    let cut = match ends.len() * usize::from(at) / 64 {
        0 => 0,
        k => ends[k - 1],
    };
    bytes.truncate(cut);
    bytes.extend_from_slice(&frame(0, 0, Kind::CloseMux));
    bytes
}

fn frame(id: u32, length: u32, kind: Kind) -> [u8; HEADER_LEN] {
    Header { id, length, kind }.to_bytes()
}

/// A frame for a stream nobody opened: odd ids are the server's, which opens none here; the
/// even ones are far above what an input opens.
fn unknown_frame(out: &mut Vec<u8>, rng: &mut Rng) {
    let id = if rng.below(2) == 0 {
        0x4000_0001 + 2 * rng.below(1000) as u32
    } else {
        0xfff0_0000 + 2 * rng.below(1000) as u32
    };
    match rng.below(5) {
        0 => {
            let length = rng.below(9) as u32;
            out.extend_from_slice(&frame(id, length, Kind::Data));
            out.extend((0..length).map(|i| i as u8));
        }
        1 => out.extend_from_slice(&frame(id, rng.below(1 << 24) as u32, Kind::WindowUpdate)),
        2 => out.extend_from_slice(&frame(id, 0, Kind::CloseRead)),
        3 => out.extend_from_slice(&frame(id, 0, Kind::CloseWrite)),
        _ => out.extend_from_slice(&frame(id, 0, Kind::CloseStream)),
    }
}

/// What the peer and the checks share.
struct Shared {
    polls: Cell<usize>,
    budget: usize,
    /// Frames of the session's output the peer has taken (counted when their header is whole).
    frames_taken: Cell<u64>,
    /// Whether the session has read everything the peer sends.
    input_done: Cell<bool>,
    /// Told when the peer's CloseMux, the last of its bytes, has been handed to the session.
    close_mux_sent: Notify,
    /// The checking task, woken after everything the transport does.
    monitor: RefCell<Option<Waker>>,
    /// The streams the session acknowledged (a WindowUpdate for their id) before its CloseMux,
    /// as the peer took them.
    acknowledged: RefCell<HashSet<u32>>,
    /// The peer has taken the session's CloseMux.
    close_mux_taken: Cell<bool>,
    /// The streams the application accepted.
    accepted: RefCell<Vec<u32>>,
}

impl Shared {
    fn poll(&self, sent: usize) {
        let polls = self.polls.get() + 1;
        self.polls.set(polls);
        assert!(
            polls <= self.budget,
            "the session polled its transport {polls} times for {sent} bytes: it spins"
        );
        if let Some(waker) = self.monitor.borrow().as_ref() {
            waker.wake_by_ref();
        }
    }
}

/// The peer: hands out its bytes in pieces, then ends or goes quiet; takes the session's
/// writes, perhaps with stalls.
struct Peer {
    bytes: Vec<u8>,
    at: usize,
    piece: usize,
    end: bool,
    /// Hand out one piece per turn: say "not yet" (waking itself) after each.
    trickle: bool,
    /// Whether the last read handed out bytes (so the next one says "not yet").
    just_read: bool,
    /// Stall after a write at random.
    random_stalls: bool,
    /// Take nothing until the input is read (or `LONG_STALL` has passed).
    never_read: Option<Instant>,
    /// Its input ends with a CloseMux; after it, writes fail when the connection closes too.
    close: PeerClose,
    stall: Option<Pin<Box<Sleep>>>,
    rng: Rng,
    /// The header of the session's frame being taken, and the payload bytes still to skip.
    header: Vec<u8>,
    skip: usize,
    shared: Rc<Shared>,
}

impl Peer {
    /// Counts the session's frames in `data`, which the peer takes.
    fn count_taken(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                self.skip -= n;
                data = &data[n..];
                continue;
            }
            let n = (HEADER_LEN - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() == HEADER_LEN {
                let shared = &self.shared;
                shared.frames_taken.set(shared.frames_taken.get() + 1);
                let id = u32::from_le_bytes([
                    self.header[0],
                    self.header[1],
                    self.header[2],
                    self.header[3],
                ]);
                if shared.close_mux_taken.get() {
                    // Nothing of the session's follows its CloseMux.
                } else if self.header[7] == Kind::CloseMux as u8 {
                    shared.close_mux_taken.set(true);
                } else if self.header[7] == Kind::WindowUpdate as u8 {
                    shared.acknowledged.borrow_mut().insert(id);
                }
                if self.header[7] == Kind::Data as u8 {
                    self.skip =
                        u32::from_le_bytes([self.header[4], self.header[5], self.header[6], 0])
                            as usize;
                }
                self.header.clear();
            }
        }
    }

    /// `Pending` while the peer takes no writes.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(until) = self.never_read {
            if self.shared.input_done.get() || Instant::now() >= until {
                self.never_read = None;
            } else {
                let sleep = self
                    .stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.never_read = None;
            }
            self.stall = None;
        }
        if let Some(sleep) = self.stall.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.stall = None;
        }
        Poll::Ready(())
    }
}

impl AsyncRead for Peer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.shared.poll(self.bytes.len());
        if self.at == self.bytes.len() {
            self.shared.input_done.set(true);
            // A quiet peer never wakes the reader again.
            return if self.end {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            };
        }
        if self.trickle && self.just_read {
            self.just_read = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = self
            .piece
            .min(buf.remaining())
            .min(self.bytes.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.bytes[at..at + n]);
        self.at += n;
        self.just_read = true;
        if self.at == self.bytes.len() {
            self.shared.input_done.set(true);
            if self.close != PeerClose::No {
                self.shared.close_mux_sent.notify_one();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Peer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.shared.poll(self.bytes.len());
        if self.close == PeerClose::Abrupt && self.shared.input_done.get() {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if self.poll_stalled(cx).is_pending() {
            return Poll::Pending;
        }
        self.count_taken(data);
        if self.random_stalls && self.rng.below(3) == 0 {
            let ms = 1 + self.rng.below(SHORT_STALL_MS);
            self.stall = Some(Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The application: every stream is read and what was read is written back, up to a limit,
/// after a burst of `burst` bytes of its own. It records the streams it accepts, none of them
/// after the session's CloseMux towards a peer that `greeted`. Its tasks run on the same
/// `LocalSet` as the driver, so they take turns with it in order.
async fn serve(session: Session, burst: usize, shared: Rc<Shared>, greeted: bool) {
    while let Ok(mut stream) = session.accept().await {
        assert!(
            !(greeted && shared.close_mux_taken.get()),
            "stream {} was handed to the application after the session's CloseMux",
            stream.id()
        );
        shared.accepted.borrow_mut().push(stream.id());
        tokio::task::spawn_local(async move {
            let mut buf = [0u8; APP_CHUNK];
            for _ in 0..burst / APP_CHUNK {
                if stream.write_all(&buf).await.is_err() {
                    return;
                }
            }
            let mut echoed = 0;
            while echoed < 256 * 1024 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        echoed += n;
                    }
                }
            }
        });
    }
}

/// Checks the bounds after everything the transport does; never finishes.
async fn monitor(session: Session, shared: Rc<Shared>) {
    let buffered_bound = MAX_STREAMS as u64 * RECEIVE_WINDOW + WINDOW_BUDGET;
    // In frames of at least 8 bytes: the data queue and the batch being written, then the
    // control queue, then one frame over its bound, a keepalive and CloseMux.
    let data_bound = 2 * (WRITE_BUFFER_SIZE + APP_CHUNK + HEADER_LEN + 16 * MAX_STREAMS);
    let backlog_bound = (data_bound / HEADER_LEN + ACCEPT_BACKLOG + 5 * MAX_STREAMS + 3) as u64;
    poll_fn(|cx: &mut Context<'_>| {
        *shared.monitor.borrow_mut() = Some(cx.waker().clone());
        let stats = session.stats();
        assert!(
            stats.buffered <= buffered_bound,
            "{} bytes buffered, over the bound {buffered_bound}",
            stats.buffered
        );
        assert!(
            stats.live_streams <= MAX_STREAMS,
            "{} live streams, over max_streams",
            stats.live_streams
        );
        let backlog = stats.frames_sent.saturating_sub(shared.frames_taken.get());
        assert!(
            backlog <= backlog_bound,
            "{backlog} frames queued and not taken by the peer, over the bound \
             {backlog_bound}, after reading {} frames",
            stats.frames_received
        );
        Poll::<()>::Pending
    })
    .await
}

/// The peer closes: the session must end gracefully (unless the input broke the protocol
/// first) and, when the peer takes every write at once, soon after the CloseMux reaches it.
async fn peer_closes(session: &Session, shared: &Shared, close: PeerClose, prompt: bool) {
    let handed = tokio::time::timeout(Duration::from_secs(3600), async {
        tokio::select! {
            _ = shared.close_mux_sent.notified() => true,
            _ = session.closed() => false,
        }
    })
    .await;
    let Ok(handed) = handed else {
        panic!("the session neither read the peer's CloseMux nor ended");
    };
    let bound = if prompt {
        CLOSE_BOUND
    } else {
        Duration::from_secs(3600)
    };
    if handed && close == PeerClose::Both {
        let closed = tokio::time::timeout(bound, session.close()).await;
        let Ok(closed) = closed else {
            panic!("Session::close beside the peer's CloseMux took over {bound:?}");
        };
        // A peer that stalls may take longer than the close timeout to take the final writes
        // (each write it takes may be followed by up to 2 s of nothing): `close` then reports
        // the timeout, as documented. A prompt peer leaves it no excuse.
        let timed_out = matches!(
            &closed,
            Err(Error::Transport(e)) if e.kind() == io::ErrorKind::TimedOut
        );
        assert!(
            closed.is_ok()
                || matches!(session.close_reason(), Some(Error::Protocol(_)))
                || (!prompt && timed_out),
            "Session::close beside the peer's CloseMux failed: {closed:?}"
        );
    }
    let Ok(reason) = tokio::time::timeout(bound, session.closed()).await else {
        panic!("the session did not end within {bound:?} of the peer's CloseMux");
    };
    let graceful = match reason {
        Error::ClosedByPeer | Error::Protocol(_) => true,
        Error::ClosedLocally => close == PeerClose::Both,
        _ => false,
    };
    assert!(
        graceful,
        "the peer's CloseMux ended the session with {reason:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&options, input)) = data.split_first() else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    else {
        return;
    };
    let mut rng = Rng(data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1);
    let Some((&close_options, input)) = input.split_first() else {
        return;
    };
    let close = [
        PeerClose::No,
        PeerClose::Graceful,
        PeerClose::Abrupt,
        PeerClose::Both,
    ][usize::from(close_options & 3)];
    let stalls = (options >> 3) & 3;
    let (mut bytes, ends) = peer_bytes(input, (options >> 5) & 3, options & 0x80 != 0, &mut rng);
    if close != PeerClose::No {
        bytes = with_close_mux(bytes, &ends, close_options >> 2);
    }
    let piece = [1, 7, 64, 4096][usize::from(options & 3)];
    let shared = Rc::new(Shared {
        polls: Cell::new(0),
        budget: POLLS_FIXED + POLLS_PER_BYTE * bytes.len(),
        frames_taken: Cell::new(0),
        input_done: Cell::new(false),
        close_mux_sent: Notify::new(),
        monitor: RefCell::new(None),
        acknowledged: RefCell::new(HashSet::new()),
        close_mux_taken: Cell::new(false),
        accepted: RefCell::new(Vec::new()),
    });
    // A peer of this crate greets first: a Keepalive with the greeting's id.
    let greeted = bytes.len() >= HEADER_LEN
        && bytes[7] == Kind::Keepalive as u8
        && u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) == GREETING_ID;
    // After its CloseMux the peer's writing ends.
    let end = options & 4 == 0 || close != PeerClose::No;
    let config = Config::default()
        .max_streams(MAX_STREAMS)
        .accept_backlog(ACCEPT_BACKLOG)
        .write_buffer_size(WRITE_BUFFER_SIZE)
        .receive_window_budget(WINDOW_BUDGET)
        .keepalive_interval(Some(Duration::from_secs(10)))
        .idle_timeout(Some(Duration::from_secs(60)))
        .close_timeout(CLOSE_TIMEOUT);
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let peer = Peer {
            bytes,
            at: 0,
            piece,
            end,
            trickle: stalls != 0,
            just_read: false,
            random_stalls: stalls & 1 != 0,
            never_read: (stalls & 2 != 0).then(|| Instant::now() + LONG_STALL),
            close,
            stall: None,
            rng: Rng(rng.next() | 1),
            header: Vec::with_capacity(HEADER_LEN),
            skip: 0,
            shared: Rc::clone(&shared),
        };
        let (session, connection) = Session::new(peer, Role::Server, config);
        let driver = tokio::task::spawn_local(connection);
        let burst = if close == PeerClose::No { 0 } else { BURST };
        tokio::task::spawn_local(serve(session.clone(), burst, Rc::clone(&shared), greeted));
        tokio::task::spawn_local(monitor(session.clone(), Rc::clone(&shared)));
        if close != PeerClose::No {
            peer_closes(&session, &shared, close, stalls == 0).await;
        } else if end {
            // The whole input, then end-of-file: the session must end, in bounded time.
            let ended = tokio::time::timeout(Duration::from_secs(3600), session.closed()).await;
            assert!(ended.is_ok(), "the session outlived its connection");
        } else {
            // The whole input, then silence: once everything waits, closing must finish.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let closed = tokio::time::timeout(Duration::from_secs(60), session.close()).await;
            assert!(closed.is_ok(), "closing a quiet session did not finish");
        }
        let finished = tokio::time::timeout(Duration::from_secs(60), driver).await;
        assert!(
            matches!(finished, Ok(Ok(_))),
            "the driver did not finish cleanly"
        );
        // (A peer that broke the protocol is promised nothing about its streams.)
        let broke = matches!(session.close_reason(), Some(Error::Protocol(_)));
        if greeted && shared.close_mux_taken.get() && !broke {
            // Every stream's fate is known to a greeted peer: what it sees acknowledged before
            // the CloseMux may have been handled, the rest was not (it is refused).
            let acknowledged = shared.acknowledged.borrow();
            for id in shared.accepted.borrow().iter() {
                assert!(
                    acknowledged.contains(id),
                    "stream {id} was accepted, but its acknowledgement did not precede the \
                     session's CloseMux"
                );
            }
        }
        let stats = session.stats();
        let bound = MAX_STREAMS as u64 * RECEIVE_WINDOW + WINDOW_BUDGET;
        assert!(
            stats.peak_buffered <= bound,
            "{} bytes buffered at the peak, over the bound {bound}",
            stats.peak_buffered
        );
    });
});
