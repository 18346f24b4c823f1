//! Memory under a hostile peer: whatever a peer sends, and however long it goes on, a session
//! holds no more than its configuration allows.
//!
//! The peer is a scripted transport that makes up frames as the session reads them (so the peer
//! itself allocates nothing), and the test thread counts the bytes it has allocated and not
//! freed. Each case runs on a current-thread runtime, so the session, its driver and the
//! application all run on that thread; the global allocator counts per thread, so tests running
//! in parallel do not disturb each other. `--nocapture` prints the figures.

mod counting;
mod scripted;

use std::sync::atomic::Ordering;
use std::time::Duration;

use counting::{peak, start_counting};
use gomux::frame::{Header, Kind, HEADER_LEN};
use gomux::{Config, Role, Session, Stream};
use scripted::{Peer, Script, Sink};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

// ---------------------------------------------------------------------------------------------
// Scripts.

/// Opens stream after stream (client ids), each followed by a whole window of data in 4 KiB
/// frames, `streams` times.
struct OpensWithData {
    streams: u32,
    next_id: u32,
    frames_left: u32,
}

impl Script for OpensWithData {
    fn next_frame(&mut self) -> Option<Header> {
        if self.frames_left > 0 {
            self.frames_left -= 1;
            return Some(Header {
                id: self.next_id - 2,
                length: 4096,
                kind: Kind::Data,
            });
        }
        if self.next_id / 2 >= self.streams {
            return None;
        }
        let id = self.next_id;
        self.next_id += 2;
        self.frames_left = 16; // 16 × 4 KiB: the whole initial window.
        Some(Header::new(id, Kind::OpenStream))
    }
}

/// Opens `streams` streams and sends nothing else.
struct BareOpens {
    streams: u32,
    next: u32,
}

impl Script for BareOpens {
    fn next_frame(&mut self) -> Option<Header> {
        (self.next < self.streams).then(|| {
            self.next += 1;
            Header::new(2 * (self.next - 1), Kind::OpenStream)
        })
    }
}

/// Opens stream 0, then `frames` frames that each carry nothing to keep: window updates of 1
/// on it, keepalives, and frames of every kind for streams that do not exist.
struct Chatter {
    frames: u32,
    sent: u32,
}

impl Script for Chatter {
    fn next_frame(&mut self) -> Option<Header> {
        if self.sent > self.frames {
            return None;
        }
        let n = self.sent;
        self.sent += 1;
        if n == 0 {
            return Some(Header::new(0, Kind::OpenStream));
        }
        let unknown = 1000 + 2 * (n % 5000);
        Some(match n % 6 {
            0 | 1 => Header {
                id: 0,
                length: 1,
                kind: Kind::WindowUpdate,
            },
            2 => Header::new(0, Kind::Keepalive),
            3 => Header {
                id: unknown,
                length: 65_536,
                kind: Kind::WindowUpdate,
            },
            4 => Header {
                id: unknown,
                length: 100,
                kind: Kind::Data,
            },
            _ => Header::new(unknown, Kind::CloseStream),
        })
    }
}

/// Accepts every stream and keeps it, unread, until the end of the test.
fn hoard(session: &Session) -> tokio::task::JoinHandle<Vec<Stream>> {
    let session = session.clone();
    tokio::spawn(async move {
        let mut streams = Vec::with_capacity(1024);
        while let Ok(stream) = session.accept().await {
            streams.push(stream);
        }
        streams
    })
}

/// Lets the session take in all the peer will send (on paused time, the sleep ends once every
/// task waits).
async fn until_quiet() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn streams_beyond_the_limit_hold_nothing_while_each_holds_a_window() {
    const MAX_STREAMS: usize = 64;
    const STREAMS: u32 = 2000; // 128 MiB of data, 31 times what the limit lets the session hold.
    let config = Config::default()
        .max_streams(MAX_STREAMS)
        .write_buffer_size(64 * KIB);
    start_counting();
    let script = OpensWithData {
        streams: STREAMS,
        next_id: 0,
        frames_left: 0,
    };
    let (peer, fed) = Peer::new(script, Sink::Discard);
    let session = Session::with_config(peer, Role::Server, config);
    let hoarder = hoard(&session);
    until_quiet().await;
    let held = peak();
    let per_stream = HEADER_LEN + 16 * (HEADER_LEN + 4096);
    assert_eq!(
        fed.load(Ordering::Relaxed),
        STREAMS as usize * per_stream,
        "all of it was read"
    );
    assert!(!session.is_closed(), "{:?}", session.close_reason());
    assert_eq!(session.stream_count(), MAX_STREAMS);
    // Received data: max_streams × 64 KiB, copied (small frames) into buffers that may be up
    // to twice its size; the read buffer and its spares; the outgoing queue; per-stream state.
    let bound = MAX_STREAMS * 64 * KIB * 2 + 13 * MIB + 64 * KIB + 64 * KIB + 2 * MIB;
    println!("{STREAMS} streams × 64 KiB against max_streams {MAX_STREAMS}: peak {held} bytes live, bound {bound}");
    assert!(held <= bound, "peak of {held} bytes live, bound {bound}");
    session.close().await.expect("close");
    drop(hoarder.await.expect("no panic"));
}

#[tokio::test(start_paused = true)]
async fn endless_opens_from_a_peer_that_never_reads_stop_being_read() {
    const BACKLOG: usize = 128;
    let config = Config::default().accept_backlog(BACKLOG);
    start_counting();
    let script = BareOpens {
        streams: 10_000_000,
        next: 0,
    };
    // Nobody accepts, and the peer never reads the refusals.
    let (peer, fed) = Peer::new(script, Sink::Never);
    let session = Session::with_config(peer, Role::Server, config);
    until_quiet().await;
    let held = peak();
    let fed = fed.load(Ordering::Relaxed);
    assert!(
        fed < MIB,
        "the session read {fed} bytes of opens it could not answer"
    );
    assert!(!session.is_closed(), "{:?}", session.close_reason());
    assert_eq!(session.stream_count(), BACKLOG, "the backlog, no more");
    // The session stopped reading once its refusals piled up, so what it holds stays small: the
    // queued streams, the refusals, the read buffer.
    let bound = 2 * MIB;
    println!("endless opens, peer never reads: peak {held} bytes live, bound {bound}");
    assert!(held <= bound, "peak of {held} bytes live, bound {bound}");
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_frames_that_carry_nothing_to_keep_keeps_nothing() {
    const FRAMES: u32 = 1_000_000;
    start_counting();
    let script = Chatter {
        frames: FRAMES,
        sent: 0,
    };
    let (peer, fed) = Peer::new(script, Sink::Discard);
    let session = Session::with_config(peer, Role::Server, Config::default());
    let stream = session.accept().await.expect("stream 0");
    until_quiet().await;
    let held = peak();
    let data_bytes = (1..=FRAMES).filter(|n| n % 6 == 4).count() * 100;
    assert_eq!(
        fed.load(Ordering::Relaxed),
        (FRAMES as usize + 1) * HEADER_LEN + data_bytes,
        "all of it was read"
    );
    assert!(!session.is_closed(), "{:?}", session.close_reason());
    assert_eq!(session.stream_count(), 1);
    let bound = MIB;
    println!("{FRAMES} window updates, keepalives and frames for unknown streams: peak {held} bytes live, bound {bound}");
    assert!(held <= bound, "peak of {held} bytes live, bound {bound}");
    drop(stream);
}
