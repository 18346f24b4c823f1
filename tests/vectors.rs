//! Byte-level compatibility with the Go gomux implementation, checked against vectors recorded
//! from it, kept in `tests/go-vectors/` (see its `README.md` and `PROVENANCE.md`):
//!
//! - `frames.jsonl`: single frames must encode to the bytes Go produced and decode back;
//! - `sessions/NAME/`: the bytes each side of a Go client/server pair wrote must decode frame by
//!   frame, and replaying one side's bytes into a session of this crate must give its
//!   application what the Go application saw, with this crate writing back what the Go peer did.
//!
//! A replay paces itself the way the Go peer did: it sends Data only within the credit our
//! session granted, sends a WindowUpdate only once our session sent the data it pays for, and
//! where the Go peer waited for an answer (a half-close, a close) it waits for ours.
//!
//! The vectors are part of the repository: a missing or unreadable vector file fails the test
//! that needs it, and each test checks that it covered at least the vectors it was written for.

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::fs;
use std::future::Future;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Header, Kind, HEADER_LEN, INITIAL_WINDOW, MAX_PAYLOAD};
use gomux::{Config, Error, Role, Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::codec::{Decoder, Encoder, FramedRead};

/// Every await is bounded by this, so that a bug shows as a failure rather than a hang.
const LIMIT: Duration = Duration::from_secs(10);

/// Room in each direction of the in-memory connection. Both ends are always drained, so this
/// only needs to hold a few frames.
const DUPLEX_BUF: usize = 256 * 1024;

/// The one vector whose `wire_hex` is the header alone (its payload is generated).
const HEADER_ONLY: &str = "data_max_payload_header_only";

async fn within<T>(what: impl Display, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {LIMIT:?} waiting for {what}"))
}

/// One step of an application: it must finish within the limit, and succeed.
async fn must<T, E: Debug>(what: impl Display, step: impl Future<Output = Result<T, E>>) -> T {
    let result = within(&what, step).await;
    result.unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// The frames `frames.jsonl` records (among them one of every kind and the header-only Data
/// vector, which are checked apart): fewer means vectors went missing.
const MIN_FRAME_VECTORS: usize = 16;

/// The recorded sessions, each replayed by a test below.
const SCENARIOS: [&str; 5] = [
    "bulk_200k",
    "echo",
    "four_streams",
    "half_close",
    "server_opens",
];

/// The frames `frames.txt` lists for all of `SCENARIOS` together, both directions.
const MIN_SESSION_FRAMES: usize = 70;

/// The in-repository copy of the vectors. Its absence is a failure, never a reason to skip.
fn vectors_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/go-vectors");
    assert!(
        dir.is_dir(),
        "the Go vectors are missing: {} is not a directory",
        dir.display()
    );
    dir
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn read_text(path: &Path) -> String {
    String::from_utf8(read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ------------------------------------------------------------------------------------------
// frames.jsonl

/// Splits one line of `frames.jsonl` into its fields. The lines are flat JSON objects of
/// escape-free strings and non-negative integers; that is all this reads (the crate takes no
/// JSON dependency for it), and anything else fails loudly rather than being misread.
fn parse_flat_object(line: &str) -> HashMap<&str, &str> {
    let body = line
        .trim()
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'));
    let body = body.unwrap_or_else(|| panic!("object expected in {line}"));
    assert!(!body.contains('\\'), "escapes are not expected in {line}");
    let field = |field| {
        let (key, value) =
            str::split_once(field, ':').unwrap_or_else(|| panic!("no `:` in {line}"));
        let key = unquote(key).unwrap_or_else(|| panic!("bad key {key} in {line}"));
        (key, value.trim())
    };
    body.split(',').map(field).collect()
}

/// The text of a JSON string without escapes, or `None` if `value` is no such string.
fn unquote(value: &str) -> Option<&str> {
    let text = value.trim().strip_prefix('"')?.strip_suffix('"')?;
    (!text.contains('"')).then_some(text)
}

fn hex(text: &str) -> Vec<u8> {
    assert!(text.len() % 2 == 0, "odd number of hex digits: {text}");
    let byte = |i| u8::from_str_radix(&text[i..i + 2], 16);
    let bytes: Result<Vec<u8>, _> = (0..text.len()).step_by(2).map(byte).collect();
    bytes.unwrap_or_else(|_| panic!("bad hex digits in {text}"))
}

/// One line of `frames.jsonl`: the frame it describes, built with the crate's constructors,
/// and the complete bytes it stands for on the wire (header and payload).
struct Vector {
    name: String,
    frame: Frame,
    wire: Vec<u8>,
}

fn load_frame_vectors(dir: &Path) -> Vec<Vector> {
    let path = dir.join("frames.jsonl");
    let text = read_text(&path);
    let lines = text.lines().filter(|line| !line.trim().is_empty());
    let vectors: Vec<Vector> = lines.map(vector).collect();
    assert!(
        vectors.len() >= MIN_FRAME_VECTORS,
        "{} holds {} vectors, expected at least {MIN_FRAME_VECTORS}",
        path.display(),
        vectors.len()
    );
    for kind in 0..=7 {
        let kind = Kind::from_u8(kind).expect("kinds 0 to 7 are defined");
        assert!(
            vectors.iter().any(|v| v.frame.header.kind == kind),
            "{} has no {kind:?} vector",
            path.display()
        );
    }
    assert!(
        vectors.iter().any(|v| v.name == HEADER_ONLY),
        "{} lacks the {HEADER_ONLY} vector",
        path.display()
    );
    vectors
}

fn vector(line: &str) -> Vector {
    let fields = parse_flat_object(line);
    let field = |key| {
        *fields
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    let text =
        |key| unquote(field(key)).unwrap_or_else(|| panic!("{key}: string expected in {line}"));
    let int = |key| {
        field(key)
            .parse()
            .unwrap_or_else(|_| panic!("{key}: u32 expected in {line}"))
    };
    let (name, id, length) = (text("name").to_owned(), int("id"), int("length"));
    let flags = u8::try_from(int("flags")).expect("flags fit in u8");
    let kind = Kind::from_u8(flags).unwrap_or_else(|| panic!("{name}: kind {flags} undefined"));
    let (mut payload, mut wire) = (hex(text("payload_hex")), hex(text("wire_hex")));
    let frame = match kind {
        Kind::Data => {
            if name == HEADER_ONLY {
                assert!(payload.is_empty(), "{name}: payload_hex not empty");
                assert_eq!(wire.len(), HEADER_LEN, "{name}: wire_hex is not a header");
                // Byte `i` of the generated payload is `(i * 7) mod 256`.
                payload = (0..MAX_PAYLOAD).map(|i| (i * 7 % 256) as u8).collect();
                wire.extend_from_slice(&payload);
            }
            let frame = Frame::data(id, payload);
            assert_eq!(frame.header.length, length, "{name}: length field");
            frame
        }
        Kind::WindowUpdate => Frame::window_update(id, length),
        _ => {
            let mut frame = Frame::control(id, kind);
            if length != 0 {
                frame.header.length = length;
            }
            frame
        }
    };
    Vector { name, frame, wire }
}

/// Compares a decoded frame with the expected one, without printing a 64 KiB payload.
fn assert_same_frame(decoded: &Frame, expected: &Frame, what: &str) {
    assert_eq!(decoded.header, expected.header, "{what}: header");
    assert!(
        decoded.payload == expected.payload,
        "{what}: payload differs (got {} bytes, expected {})",
        decoded.payload.len(),
        expected.payload.len()
    );
}

#[test]
fn go_frame_vectors_encode_to_the_recorded_bytes() {
    let dir = vectors_dir();
    for Vector { name, frame, wire } in load_frame_vectors(&dir) {
        let head = frame.header.to_bytes();
        assert_eq!(head[..], wire[..HEADER_LEN], "{name}: Header::to_bytes");
        let mut encoded = BytesMut::new();
        let result = FrameCodec::new().encode(frame, &mut encoded);
        result.unwrap_or_else(|e| panic!("{name}: the encoder refused the frame: {e}"));
        let encoded_head = &encoded[..HEADER_LEN.min(encoded.len())];
        assert_eq!(encoded_head, &wire[..HEADER_LEN], "{name}: encoded header");
        // Compared apart so that a wrong 64 KiB payload does not flood the report.
        assert_eq!(encoded.len(), wire.len(), "{name}: encoded length");
        assert!(
            encoded[HEADER_LEN..] == wire[HEADER_LEN..],
            "{name}: encoded payload differs from the recorded one"
        );
    }
}

#[test]
fn go_frame_vectors_decode_to_the_frames_they_describe() {
    let dir = vectors_dir();
    for vector in load_frame_vectors(&dir) {
        let (name, expected, wire) = (&vector.name, &vector.frame, &vector.wire);
        let head: [u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().expect("8 header bytes");
        let header = Header::from_bytes(head);
        assert_eq!(header, Ok(expected.header), "{name}: Header::from_bytes");

        // Whole, the bytes must make exactly one frame and end cleanly after it.
        let whole = decode_capture(wire, name);
        assert_eq!(whole.len(), 1, "{name}: frames decoded from the whole");
        assert_same_frame(&whole[0].frame, expected, &format!("{name}: decoded"));

        // A transport may deliver the frame in pieces; one byte at a time is the worst case.
        let mut codec = FrameCodec::new();
        let mut buf = BytesMut::new();
        let mut pieces = Vec::new();
        for byte in wire {
            buf.extend_from_slice(&[*byte]);
            let decoded = codec.decode(&mut buf);
            pieces.extend(decoded.unwrap_or_else(|e| panic!("{name}: byte by byte: {e}")));
        }
        assert_eq!(pieces.len(), 1, "{name}: frames decoded byte by byte");
        assert_same_frame(&pieces[0], expected, &format!("{name}: byte by byte"));
    }
}

// ------------------------------------------------------------------------------------------
// sessions/NAME

/// One frame of a capture, with the exact bytes it took on the wire.
struct Captured {
    frame: Frame,
    wire: Bytes,
}

/// Decodes a capture frame by frame; panics on bytes that are not whole frames.
fn decode_capture(bytes: &[u8], what: &str) -> Vec<Captured> {
    let mut codec = FrameCodec::new();
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    loop {
        let (offset, count) = (bytes.len() - buf.len(), frames.len());
        let frame = codec.decode(&mut buf);
        let frame = frame.unwrap_or_else(|e| panic!("{what}: frame {count} at byte {offset}: {e}"));
        let Some(frame) = frame else {
            break;
        };
        let wire = Bytes::copy_from_slice(&bytes[offset..bytes.len() - buf.len()]);
        frames.push(Captured { frame, wire });
    }
    assert!(
        buf.is_empty(),
        "{what}: {} trailing bytes after {} frames",
        buf.len(),
        frames.len()
    );
    let end = codec.decode_eof(&mut buf);
    let end = end.unwrap_or_else(|e| panic!("{what}: ends inside a frame: {e}"));
    assert!(end.is_none(), "{what}: a frame out of nothing at the end");
    frames
}

const DIRECTIONS: [&str; 2] = ["client_to_server", "server_to_client"];

/// Both directions of one recorded Go session: what the client wrote, what the server wrote.
fn load_scenario(dir: &Path, name: &str) -> [Vec<Captured>; 2] {
    DIRECTIONS.map(|direction| {
        let file = format!("{direction}.bin");
        let path = dir.join("sessions").join(name).join(&file);
        let frames = decode_capture(&read(&path), &format!("{name}/{file}"));
        assert!(!frames.is_empty(), "{name}/{file} holds no frames");
        frames
    })
}

/// A frame as `frames.txt` lists it: `Data id=0 len=12`.
fn shape(frame: &Frame) -> String {
    let Header { id, length, kind } = frame.header;
    format!("{kind:?} id={id} len={length}")
}

/// The frame lines `frames.txt` lists under `DIRECTION frames:`.
fn listed_frames(text: &str, direction: &str) -> Vec<String> {
    let title = format!("{direction} frames:");
    let mut lines = text.lines().skip_while(|line| line.trim() != title);
    assert!(lines.next().is_some(), "no `{title}` section");
    lines
        .take_while(|line| line.starts_with(char::is_whitespace) && !line.trim().is_empty())
        .map(|line| line.trim().to_owned())
        .collect()
}

#[test]
fn go_session_captures_decode_frame_by_frame_as_listed() {
    let dir = vectors_dir();
    let sessions = dir.join("sessions");
    let entries = fs::read_dir(&sessions);
    let entries = entries.unwrap_or_else(|e| panic!("listing {}: {e}", sessions.display()));
    let mut names: Vec<String> = entries
        .map(|entry| entry.expect("a directory entry").file_name())
        .map(|name| name.into_string().expect("a UTF-8 scenario name"))
        .collect();
    names.sort();
    for scenario in SCENARIOS {
        assert!(
            names.iter().any(|name| name == scenario),
            "no captured session {scenario} in {}",
            sessions.display()
        );
    }
    let mut checked = 0;
    for name in names {
        let text = read_text(&sessions.join(&name).join("frames.txt"));
        for (direction, captured) in DIRECTIONS.into_iter().zip(load_scenario(&dir, &name)) {
            let decoded: Vec<String> = captured.iter().map(|c| shape(&c.frame)).collect();
            let listed = listed_frames(&text, direction);
            assert_eq!(decoded, listed, "{name}/{direction}.bin against frames.txt");
            checked += decoded.len();
        }
    }
    assert!(
        checked >= MIN_SESSION_FRAMES,
        "{checked} captured frames checked, expected at least {MIN_SESSION_FRAMES}"
    );
}

// ------------------------------------------------------------------------------------------
// The replay driver: replays a Go side's bytes into our session and watches what ours writes.

/// What our session has written to the raw end of the connection so far.
#[derive(Debug, Clone, Default)]
struct Observed {
    frames: Vec<Frame>,
    /// What was wrong with the output, if anything: bytes that are no frame, or data beyond
    /// the credit the raw end had granted.
    invalid: Option<String>,
    /// Our session closed its end of the connection cleanly, between frames.
    eof: bool,
}

impl Observed {
    fn on(&self, kind: Kind, id: u32) -> impl Iterator<Item = &Frame> {
        let matches = move |f: &&Frame| f.header.kind == kind && f.header.id == id;
        self.frames.iter().filter(matches)
    }

    fn sent(&self, kind: Kind, id: u32) -> bool {
        self.on(kind, id).next().is_some()
    }

    /// The length fields of the `kind` frames on stream `id` added up: data bytes or credit.
    fn total(&self, kind: Kind, id: u32) -> u64 {
        self.on(kind, id).map(|f| u64::from(f.header.length)).sum()
    }
}

/// Length fields added up per kind and stream, as `Observed::total` does, for what the raw end
/// wrote; shared with the observer. A frame is counted before it is sent, so the observer never
/// sees our session answer a frame not counted yet.
type Tally = Arc<Mutex<HashMap<(Kind, u32), u64>>>;

fn tally(tally: &Tally, kind: Kind, id: u32) -> u64 {
    let tally = tally.lock().expect("the tally is never poisoned");
    tally.get(&(kind, id)).copied().unwrap_or(0)
}

/// What a frame of `kind` waits for from the other side before it may be sent, and how much it
/// may be sent without: Data waits for credit beyond the initial window, a WindowUpdate for the
/// data it pays for.
fn paced_by(kind: Kind) -> Option<(Kind, u64)> {
    match kind {
        Kind::Data => Some((Kind::WindowUpdate, u64::from(INITIAL_WINDOW))),
        Kind::WindowUpdate => Some((Kind::Data, 0)),
        _ => None,
    }
}

/// Reads our session's output until it closes the connection, recording its frames and
/// checking that its Data stays within the credit the raw end granted.
async fn observe(reader: ReadHalf<DuplexStream>, seen: watch::Sender<Observed>, raw: Tally) {
    let mut frames = FramedRead::new(reader, FrameCodec::new());
    // Our session greets first (a keepalive, which the Go peer ignores); what the Go side
    // wrote is compared with what follows.
    match frames.next().await {
        Some(Ok(frame))
            if frame.header.kind == Kind::Keepalive
                && frame.header.id == gomux::frame::GREETING_ID => {}
        other => {
            let why = format!("our session's first frame is no greeting: {other:?}");
            seen.send_modify(|seen| seen.invalid = Some(why));
            return;
        }
    }
    while let Some(frame) = frames.next().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                let why = format!("our session's output is not valid frames: {e}");
                seen.send_modify(|seen| seen.invalid = Some(why));
                return;
            }
        };
        let Header { id, kind, .. } = frame.header;
        let limit = u64::from(INITIAL_WINDOW) + tally(&raw, Kind::WindowUpdate, id);
        seen.send_modify(|seen| {
            seen.frames.push(frame);
            let total = seen.total(Kind::Data, id);
            if kind == Kind::Data && total > limit && seen.invalid.is_none() {
                let why = format!("{total} data bytes on stream {id}, credit for {limit}");
                seen.invalid = Some(why);
            }
        });
    }
    seen.send_modify(|seen| seen.eof = true);
}

/// Where the Go peer waited for an answer from the side we stand in for.
struct Pause {
    /// Its first frame of this kind on this stream waited (`None`: its very first frame)...
    before: Option<(Kind, u32)>,
    /// ...until our side had sent a frame of this kind on this stream.
    until_ours: (Kind, u32),
}

type Replayed = Result<(), String>;

/// One recorded scenario replayed into our session of one role, through the raw end of an
/// in-memory connection that stands in for the Go peer.
struct Replay {
    session: Session,
    /// Our side and the Go peer's, for messages.
    names: [&'static str; 2],
    /// What the Go peer wrote: the raw end replays it.
    theirs: Vec<Captured>,
    /// What the Go side in our role wrote: what our session should write.
    go: Vec<Frame>,
    writer: WriteHalf<DuplexStream>,
    seen: watch::Receiver<Observed>,
    observer: JoinHandle<()>,
    raw: Tally,
}

impl Replay {
    /// Loads capture `name` and connects a session of `role` to the raw end.
    fn start(name: &str, role: Role) -> Replay {
        let [mut go, mut theirs] = load_scenario(&vectors_dir(), name);
        let mut names = ["client", "server"];
        if role == Role::Server {
            std::mem::swap(&mut go, &mut theirs);
            names.swap(0, 1);
        }
        let (ours, raw) = tokio::io::duplex(DUPLEX_BUF);
        let session = Session::with_config(ours, role, Config::default());
        let (reader, writer) = tokio::io::split(raw);
        let (tx, seen) = watch::channel(Observed::default());
        let raw = Tally::default();
        let observer = tokio::spawn(observe(reader, tx, Arc::clone(&raw)));
        let go = go.into_iter().map(|c| c.frame).collect();
        Replay {
            session,
            names,
            theirs,
            go,
            writer,
            seen,
            observer,
            raw,
        }
    }

    /// Waits until what our session wrote satisfies `ready`.
    async fn wait_until(&mut self, what: &str, ready: impl FnMut(&Observed) -> bool) -> Replayed {
        let outcome = match tokio::time::timeout(LIMIT, self.seen.wait_for(ready)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) => "our session's output ended",
            Err(_) => "timed out",
        };
        let seen = self.seen.borrow();
        let shapes: Vec<String> = seen.frames.iter().map(shape).collect();
        let invalid = seen.invalid.as_ref();
        let invalid = invalid
            .map(|why| format!(" (invalid: {why})"))
            .unwrap_or_default();
        Err(format!(
            "{outcome} waiting for {what}; ours wrote {shapes:?}{invalid}"
        ))
    }

    /// Writes the Go peer's frames `range` in order, each one only once the Go peer could have
    /// sent it (see `paced_by`).
    async fn send(&mut self, range: Range<usize>) -> Replayed {
        for i in range {
            let Header { id, length, kind } = self.theirs[i].frame.header;
            if let Some((by, allowance)) = paced_by(kind) {
                let total = tally(&self.raw, kind, id) + u64::from(length);
                let what = format!("our {by:?}s on stream {id} to allow {total} of {kind:?}");
                let ready = |seen: &Observed| allowance + seen.total(by, id) >= total;
                self.wait_until(&what, ready).await?;
                let mut raw = self.raw.lock().expect("the tally is never poisoned");
                raw.insert((kind, id), total);
            }
            let shape = shape(&self.theirs[i].frame);
            let write = self.writer.write_all(&self.theirs[i].wire);
            match tokio::time::timeout(LIMIT, write).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(format!("writing {shape} to our session failed: {e}")),
                Err(_) => return Err(format!("timed out writing {shape}")),
            }
            if kind == Kind::CloseMux {
                // The Go peer closes the connection right after its CloseMux (`Mux::Close`).
                let _ = self.writer.shutdown().await;
            }
        }
        Ok(())
    }

    /// Replays all the Go peer wrote, holding back where it waited for our side.
    async fn replay(&mut self, pause: Option<Pause>) -> Replayed {
        let all = self.theirs.len();
        let Some(pause) = pause else {
            return self.send(0..all).await;
        };
        let split = pause.before.map_or(0, |(kind, id)| {
            let mut headers = self.theirs.iter().map(|c| c.frame.header);
            let at = headers.position(|h| h.kind == kind && h.id == id);
            at.unwrap_or_else(|| panic!("the capture has no {kind:?} on stream {id}"))
        });
        self.send(0..split).await?;
        let (kind, id) = pause.until_ours;
        let what = format!("our {kind:?} on stream {id}");
        self.wait_until(&what, |seen| seen.sent(kind, id)).await?;
        self.send(split..all).await
    }

    /// Ends the session as the Go pair did. Where the Go peer sent the CloseMux, ours must have
    /// ended by it. Otherwise the Go side in our role closed the session, and ours does so now:
    /// only after the replay, whose last writes would otherwise fail for reasons of the test's
    /// timing alone. The Go peer closes the connection as soon as it reads our CloseMux
    /// (`setErr` in its mux.go), and ours reads until it does, so the raw end does the same.
    async fn end(&mut self) {
        let mut theirs = self.theirs.iter();
        let by_peer = theirs.any(|c| c.frame.header.kind == Kind::CloseMux);
        if !by_peer {
            let (seen, writer) = (&mut self.seen, &mut self.writer);
            let peer_closes = async {
                let _ = seen.wait_for(|seen| seen.sent(Kind::CloseMux, 0)).await;
                let _ = writer.shutdown().await;
            };
            let closing = async {
                must("closing the session gracefully", self.session.close()).await;
            };
            within("both ends to close", async {
                tokio::join!(closing, peer_closes)
            })
            .await;
        }
        let reason = within("the session to end", self.session.closed()).await;
        let expected = match (by_peer, &reason) {
            (true, Error::ClosedByPeer) | (false, Error::ClosedLocally) => return,
            (true, _) => "ClosedByPeer after the Go peer's CloseMux",
            (false, _) => "ClosedLocally",
        };
        panic!("the session ended with {reason:?}, expected {expected}");
    }

    /// Waits until our session has closed its end of the connection; checks what it wrote was
    /// valid frames, within the credit granted, ending cleanly.
    async fn finish(self) -> Outcome {
        let observer = within("our session to close the connection", self.observer);
        observer.await.expect("the observer task panicked");
        drop(self.writer);
        let observed = self.seen.borrow().clone();
        let invalid = observed.invalid.as_deref();
        let why = invalid.unwrap_or_default();
        assert!(invalid.is_none(), "our session wrote invalid output: {why}");
        assert!(observed.eof, "our session's output did not end cleanly");
        let ours = self.names[0];
        Outcome {
            ours,
            observed,
            go: self.go,
        }
    }

    /// Runs `app` on our session while the Go peer's bytes are replayed, then ends the session
    /// and checks what ours wrote.
    async fn run<F>(mut self, pause: Option<Pause>, app: impl FnOnce(Session) -> F) -> Outcome
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let app = tokio::spawn(app(self.session.clone()));
        let replayed = self.replay(pause).await;
        // A failing application usually stalls the replay too; its own panic says more.
        let app = within("the application", app).await;
        app.expect("the application task panicked");
        let peer = self.names[1];
        replayed.unwrap_or_else(|e| panic!("replaying the Go {peer}'s bytes: {e}"));
        self.end().await;
        self.finish().await
    }
}

/// What our session wrote in a replay, beside what the Go side in its role wrote.
struct Outcome {
    ours: &'static str,
    observed: Observed,
    go: Vec<Frame>,
}

impl Outcome {
    /// Our frames and the Go side's must look the same through `view`.
    fn assert_wrote_what_go_wrote<T: PartialEq + Debug>(&self, view: impl Fn(&[Frame]) -> T) {
        let (ours, go, side) = (view(&self.observed.frames), view(&self.go), self.ours);
        assert_eq!(
            ours, go,
            "what our {side} wrote against what the Go {side} wrote"
        );
    }
}

/// Frames as (shape, payload), for comparing what two sides wrote.
fn details<'a>(frames: impl Iterator<Item = &'a Frame>) -> Vec<(String, Bytes)> {
    frames.map(|f| (shape(f), f.payload.clone())).collect()
}

/// The frames, whatever order timing gave them.
fn in_any_order(frames: &[Frame]) -> Vec<(String, Bytes)> {
    let mut details = details(frames.iter());
    details.sort();
    details
}

/// The frames but for the WindowUpdates and Keepalives whose number and place depend on timing.
fn without_credit(frames: &[Frame]) -> Vec<(String, Bytes)> {
    let timed = |f: &&Frame| matches!(f.header.kind, Kind::WindowUpdate | Kind::Keepalive);
    details(frames.iter().filter(|f| !timed(f)))
}

/// Opens a stream of ours, which must get the id the Go side in our role got.
async fn open(session: &Session, id: u32) -> Stream {
    let stream = must("opening a stream", session.open()).await;
    assert_eq!(stream.id(), id, "id of the stream we opened");
    stream
}

/// Accepts the next stream the Go peer opened, which must be stream `id`.
async fn accept(session: &Session, id: u32) -> Stream {
    let stream = must(format!("accepting stream {id}"), session.accept()).await;
    assert_eq!(stream.id(), id, "id of the Go peer's stream");
    stream
}

// ------------------------------------------------------------------------------------------
// What the Go applications sent.

/// The (request, reply) pairs of `echo` and `four_streams`. The client opens a stream per
/// request (client ids are even: 0, 2, ...), writes it, reads the reply and closes the stream;
/// the server reads the request, replies and reads on to end-of-stream.
type Request = (&'static str, &'static str);
type Requests = &'static [Request];
const ECHO: Requests = &[("hello, world", "hello, world")];
const FOUR_STREAMS: Requests = &[
    ("stream number 0", "STREAM NUMBER 0"),
    ("stream number 1", "STREAM NUMBER 1"),
    ("stream number 2", "STREAM NUMBER 2"),
    ("stream number 3", "STREAM NUMBER 3"),
];

fn with_ids(requests: Requests) -> impl Iterator<Item = (u32, &'static Request)> {
    (0u32..).step_by(2).zip(requests)
}

/// `server_opens`: the server's streams and what it wrote on each before closing it.
const SERVER_OPENS: [(u32, &str); 2] = [(1, "from server 0"), (3, "from server 1")];

/// `half_close`: the server's reply to the client's 1000 bytes.
const HALF_CLOSE_REPLY: &str = "got 1000 bytes";

/// Byte `i` of the half_close payload.
fn half_close_payload() -> Vec<u8> {
    (0..1000usize).map(|i| (i % 256) as u8).collect()
}

const BULK_LEN: usize = 200_000;

/// Byte `i` of the bulk_200k payload.
fn bulk_payload() -> Vec<u8> {
    (0..BULK_LEN).map(|i| (i % 251) as u8).collect()
}

fn assert_bulk(received: &[u8]) {
    assert_eq!(received.len(), BULK_LEN, "bulk bytes received");
    let mut bytes = received.iter().enumerate();
    let wrong = bytes.find(|(i, byte)| **byte != (i % 251) as u8);
    assert!(wrong.is_none(), "bulk byte (index, value) wrong: {wrong:?}");
}

// ------------------------------------------------------------------------------------------
// Replays into a server-role session (the Go client's bytes).

/// Serves the requests of scenario `name`; every byte read must be paid back in credit.
async fn serve_requests(name: &str, requests: Requests) {
    let replay = Replay::start(name, Role::Server);
    let app = move |session: Session| async move {
        for (id, (request, reply)) in with_ids(requests) {
            let mut stream = accept(&session, id).await;
            let mut got = vec![0u8; request.len()];
            must("reading the request", stream.read_exact(&mut got)).await;
            assert_eq!(got, request.as_bytes(), "the request on stream {id}");
            let write = stream.write_all(reply.as_bytes());
            must("writing the reply", write).await;
            let mut rest = Vec::new();
            let to_end = stream.read_to_end(&mut rest);
            must("end-of-stream after the Go client's CloseStream", to_end).await;
            assert!(
                rest.is_empty(),
                "unexpected bytes after the request on {id}"
            );
        }
    };
    let outcome = replay.run(None, app).await;
    for (id, (request, _)) in with_ids(requests) {
        let credit = outcome.observed.total(Kind::WindowUpdate, id);
        assert!(
            credit >= request.len() as u64,
            "credit returned on stream {id} is {credit}, less than the {} bytes read",
            request.len()
        );
    }
    outcome.assert_wrote_what_go_wrote(in_any_order);
}

#[tokio::test]
async fn server_echoes_the_go_client_and_returns_the_credit_it_consumed() {
    serve_requests("echo", ECHO).await;
}

#[tokio::test]
async fn server_serves_the_four_streams_the_go_client_opens_in_turn() {
    serve_requests("four_streams", FOUR_STREAMS).await;
}

#[tokio::test]
async fn server_reads_1000_bytes_then_end_of_stream_after_the_go_clients_half_close() {
    let replay = Replay::start("half_close", Role::Server);
    // The Go client closed the session only after reading the reply to end-of-stream.
    let pause = Pause {
        before: Some((Kind::CloseMux, 0)),
        until_ours: (Kind::CloseStream, 0),
    };
    let app = |session: Session| async move {
        let mut stream = accept(&session, 0).await;
        let mut received = Vec::new();
        let to_end = stream.read_to_end(&mut received);
        must("reading to end-of-stream", to_end).await;
        assert!(
            received == half_close_payload(),
            "received {} bytes, expected the 1000-byte pattern",
            received.len()
        );
        let write = stream.write_all(HALF_CLOSE_REPLY.as_bytes());
        must("writing the reply", write).await;
        must("closing the stream", stream.close()).await;
    };
    let outcome = replay.run(Some(pause), app).await;
    outcome.assert_wrote_what_go_wrote(without_credit);
}

#[tokio::test]
async fn server_receives_200000_bytes_from_the_go_client_paced_by_the_credit_it_returns() {
    let replay = Replay::start("bulk_200k", Role::Server);
    let app = |session: Session| async move {
        let mut stream = accept(&session, 0).await;
        // Reads of at most 10000 bytes, as the Go server did.
        let mut received = Vec::with_capacity(BULK_LEN);
        let mut chunk = vec![0u8; 10_000];
        loop {
            let n = must("reading bulk data", stream.read(&mut chunk)).await;
            if n == 0 {
                break;
            }
            received.extend_from_slice(&chunk[..n]);
        }
        assert_bulk(&received);
        // The Go server left its stream open until the session ended; dropping ours now would
        // send a CloseStream or not depending on whether the Go client's own had arrived yet.
        within("the session to end", session.closed()).await;
        drop(stream);
    };
    let frames = replay.run(None, app).await.observed.frames;
    let update_on_0 = |f: &Frame| f.header.kind == Kind::WindowUpdate && f.header.id == 0;
    assert!(
        frames.iter().all(update_on_0),
        "the Go server wrote only WindowUpdates on stream 0; ours wrote {:?}",
        frames.iter().map(shape).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn server_opening_two_streams_writes_what_the_go_server_wrote() {
    let replay = Replay::start("server_opens", Role::Server);
    // Server stream ids are odd. The Go server closed the session last; `run` does so for ours.
    let app = |session: Session| async move {
        for (id, text) in SERVER_OPENS {
            let mut stream = open(&session, id).await;
            must("writing", stream.write_all(text.as_bytes())).await;
            must("closing the stream", stream.close()).await;
        }
    };
    let outcome = replay.run(None, app).await;
    outcome.assert_wrote_what_go_wrote(without_credit);
}

// ------------------------------------------------------------------------------------------
// Replays into a client-role session (the Go server's bytes).

/// Makes the requests of scenario `name`. The capture's frames on each stream need the stream
/// to exist: our client opens it first.
async fn make_requests(name: &str, requests: Requests) {
    let replay = Replay::start(name, Role::Client);
    let app = move |session: Session| async move {
        for (id, (request, reply)) in with_ids(requests) {
            let mut stream = open(&session, id).await;
            let write = stream.write_all(request.as_bytes());
            must("writing the request", write).await;
            let mut got = vec![0u8; reply.len()];
            must("reading the reply", stream.read_exact(&mut got)).await;
            assert_eq!(got, reply.as_bytes(), "the reply on stream {id}");
            must("closing the stream", stream.close()).await;
        }
    };
    let outcome = replay.run(None, app).await;
    outcome.assert_wrote_what_go_wrote(without_credit);
}

#[tokio::test]
async fn client_keeps_the_go_servers_streams_readable_after_its_close_mux() {
    let mut replay = Replay::start("server_opens", Role::Client);
    let replayed = replay.replay(None).await;
    replayed.expect("replaying the Go server's bytes");
    // Everything arrives before the application looks: the session has ended by then, and
    // what it received must still be there.
    replay.end().await;
    for (id, sent) in SERVER_OPENS {
        let mut stream = accept(&replay.session, id).await;
        let mut text = String::new();
        let to_end = stream.read_to_string(&mut text);
        must("reading to end-of-stream", to_end).await;
        assert_eq!(text, sent, "what the Go server wrote on stream {id}");
    }
    let after = within("accept after the end", replay.session.accept()).await;
    assert!(
        matches!(after, Err(Error::ClosedByPeer)),
        "accept once the queue is empty gave {after:?}, expected ClosedByPeer"
    );
    replay.finish().await;
}

#[tokio::test]
async fn client_echo_against_the_go_server_writes_what_the_go_client_wrote() {
    make_requests("echo", ECHO).await;
}

#[tokio::test]
async fn client_four_streams_against_the_go_server_write_what_the_go_client_wrote() {
    make_requests("four_streams", FOUR_STREAMS).await;
}

#[tokio::test]
async fn client_half_close_against_the_go_server_reads_its_reply_to_end_of_stream() {
    let replay = Replay::start("half_close", Role::Client);
    // The Go server answered only after reading our data to end-of-stream.
    let pause = Pause {
        before: None,
        until_ours: (Kind::CloseRead, 0),
    };
    let app = |session: Session| async move {
        let mut stream = open(&session, 0).await;
        let payload = half_close_payload();
        must("writing 1000 bytes", stream.write_all(&payload)).await;
        must("half-closing the stream", stream.shutdown()).await;
        let mut reply = String::new();
        must("reading the reply", stream.read_to_string(&mut reply)).await;
        assert_eq!(reply, HALF_CLOSE_REPLY);
    };
    let outcome = replay.run(Some(pause), app).await;
    outcome.assert_wrote_what_go_wrote(without_credit);
}

#[tokio::test]
async fn client_sends_200000_bytes_within_the_credit_the_go_server_granted() {
    let replay = Replay::start("bulk_200k", Role::Client);
    let app = |session: Session| async move {
        let mut stream = open(&session, 0).await;
        must("writing 200000 bytes", stream.write_all(&bulk_payload())).await;
        must("half-closing the stream", stream.shutdown()).await;
        must("closing the stream", stream.close()).await;
    };
    // The observer checked every Data frame against the credit granted so far.
    let outcome = replay.run(None, app).await;
    let data = outcome.observed.on(Kind::Data, 0);
    let sent: Vec<u8> = data.flat_map(|f| f.payload.iter().copied()).collect();
    assert_bulk(&sent);
    let frames = &outcome.observed.frames;
    assert!(
        frames.iter().all(|f| f.payload.len() <= MAX_PAYLOAD),
        "a Data frame above the Go limit of {MAX_PAYLOAD} bytes"
    );
    // The frames around the data (whose payloads are all empty).
    let around_data = |frames: &[Frame]| {
        let around = |f: &&Frame| !matches!(f.header.kind, Kind::Data | Kind::WindowUpdate);
        frames.iter().filter(around).map(shape).collect::<Vec<_>>()
    };
    outcome.assert_wrote_what_go_wrote(around_data);
}
