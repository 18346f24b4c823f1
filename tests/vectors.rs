//! Byte-level compatibility with the Go gomux implementation, checked against vectors recorded
//! from it (see `../shared/vectors/README.md`):
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
//! The vectors live beside the project, not in it; without them every test here passes after a
//! notice on stderr.

use std::collections::HashMap;
use std::fmt::Display;
use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Header, Kind, HEADER_LEN, INITIAL_WINDOW, MAX_PAYLOAD};
use gomux::{Error, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::codec::{Decoder, Encoder};

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

fn vectors_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: ../shared/vectors not found (the Go vectors live beside the project)");
        None
    }
}

// ------------------------------------------------------------------------------------------
// frames.jsonl

/// A value of the flat JSON objects in `frames.jsonl`.
#[derive(Debug)]
enum Json {
    Str(String),
    Int(u64),
}

/// Parses one flat JSON object of string and non-negative integer fields. The vectors need no
/// more, and the crate takes no JSON dependency for them.
fn parse_flat_object(line: &str) -> HashMap<String, Json> {
    let mut chars = line.trim().chars().peekable();
    let mut fields = HashMap::new();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
    };
    assert_eq!(chars.next(), Some('{'), "object expected in {line}");
    loop {
        skip_ws(&mut chars);
        if chars.peek() == Some(&'}') {
            chars.next();
            break;
        }
        let key = parse_json_string(&mut chars, line);
        skip_ws(&mut chars);
        assert_eq!(
            chars.next(),
            Some(':'),
            "`:` expected after {key} in {line}"
        );
        skip_ws(&mut chars);
        let value = if chars.peek() == Some(&'"') {
            Json::Str(parse_json_string(&mut chars, line))
        } else {
            let mut digits = String::new();
            while let Some(c) = chars.next_if(char::is_ascii_digit) {
                digits.push(c);
            }
            Json::Int(
                digits
                    .parse()
                    .unwrap_or_else(|_| panic!("integer expected for {key} in {line}")),
            )
        };
        fields.insert(key, value);
        skip_ws(&mut chars);
        match chars.next() {
            Some(',') => {}
            Some('}') => break,
            other => panic!("`,` or `}}` expected, found {other:?} in {line}"),
        }
    }
    skip_ws(&mut chars);
    assert!(
        chars.next().is_none(),
        "trailing text after the object in {line}"
    );
    fields
}

fn parse_json_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, line: &str) -> String {
    assert_eq!(chars.next(), Some('"'), "string expected in {line}");
    let mut text = String::new();
    loop {
        match chars.next() {
            Some('"') => return text,
            Some('\\') => match chars.next() {
                Some('n') => text.push('\n'),
                Some('t') => text.push('\t'),
                Some('r') => text.push('\r'),
                Some('b') => text.push('\u{8}'),
                Some('f') => text.push('\u{c}'),
                Some('u') => {
                    let code: String = chars.by_ref().take(4).collect();
                    let code = u32::from_str_radix(&code, 16)
                        .ok()
                        .and_then(char::from_u32)
                        .unwrap_or_else(|| panic!("bad \\u escape in {line}"));
                    text.push(code);
                }
                Some(c) => text.push(c), // `\"`, `\\` and `\/` stand for themselves.
                None => panic!("unterminated escape in {line}"),
            },
            Some(c) => text.push(c),
            None => panic!("unterminated string in {line}"),
        }
    }
}

fn hex(text: &str) -> Vec<u8> {
    assert!(text.len() % 2 == 0, "odd number of hex digits: {text}");
    (0..text.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&text[i..i + 2], 16)
                .unwrap_or_else(|_| panic!("bad hex digits in {text}"))
        })
        .collect()
}

/// One line of `frames.jsonl`.
struct Vector {
    name: String,
    id: u32,
    length: u32,
    kind: u8,
    payload: Vec<u8>,
    wire: Vec<u8>,
}

fn load_frame_vectors(dir: &Path) -> Vec<Vector> {
    let path = dir.join("frames.jsonl");
    let text =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let vectors: Vec<Vector> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields = parse_flat_object(line);
            let text = |key: &str| match fields.get(key) {
                Some(Json::Str(s)) => s.clone(),
                other => panic!("string field {key} expected, found {other:?} in {line}"),
            };
            let int = |key: &str| match fields.get(key) {
                Some(Json::Int(n)) => *n,
                other => panic!("integer field {key} expected, found {other:?} in {line}"),
            };
            Vector {
                name: text("name"),
                id: u32::try_from(int("id")).expect("id fits in u32"),
                length: u32::try_from(int("length")).expect("length fits in u32"),
                kind: u8::try_from(int("flags")).expect("flags fit in u8"),
                payload: hex(&text("payload_hex")),
                wire: hex(&text("wire_hex")),
            }
        })
        .collect();
    assert!(!vectors.is_empty(), "{} holds no vectors", path.display());
    assert!(
        vectors.iter().any(|v| v.name == HEADER_ONLY),
        "{} lacks the {HEADER_ONLY} vector",
        path.display()
    );
    vectors
}

/// The payload of the header-only vector: byte `i` is `(i * 7) mod 256`.
fn header_only_payload() -> Vec<u8> {
    (0..MAX_PAYLOAD).map(|i| (i * 7 % 256) as u8).collect()
}

/// The frame a vector describes, built with the crate's constructors, and the complete bytes it
/// stands for on the wire (header and payload).
fn vector_frame(vector: &Vector) -> (Frame, Vec<u8>) {
    let name = &vector.name;
    let kind = Kind::from_u8(vector.kind)
        .unwrap_or_else(|| panic!("{name}: kind {} is not defined", vector.kind));
    let mut wire = vector.wire.clone();
    let frame = match kind {
        Kind::Data => {
            let payload = if *name == HEADER_ONLY {
                assert!(vector.payload.is_empty(), "{name}: payload_hex not empty");
                assert_eq!(wire.len(), HEADER_LEN, "{name}: wire_hex is not a header");
                let payload = header_only_payload();
                wire.extend_from_slice(&payload);
                payload
            } else {
                vector.payload.clone()
            };
            let frame = Frame::data(vector.id, payload);
            assert_eq!(frame.header.length, vector.length, "{name}: length field");
            frame
        }
        Kind::WindowUpdate => Frame::window_update(vector.id, vector.length),
        _ => {
            let mut frame = Frame::control(vector.id, kind);
            if vector.length != 0 {
                frame.header.length = vector.length;
            }
            frame
        }
    };
    (frame, wire)
}

#[test]
fn go_frame_vectors_encode_to_the_recorded_bytes() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    for vector in load_frame_vectors(&dir) {
        let name = &vector.name;
        let (frame, wire) = vector_frame(&vector);
        assert_eq!(
            frame.header.to_bytes()[..],
            wire[..HEADER_LEN],
            "{name}: Header::to_bytes"
        );
        let mut encoded = BytesMut::new();
        FrameCodec::new()
            .encode(frame, &mut encoded)
            .unwrap_or_else(|e| panic!("{name}: the encoder refused the frame: {e}"));
        assert_eq!(
            encoded[..HEADER_LEN.min(encoded.len())],
            vector.wire[..HEADER_LEN],
            "{name}: encoded header"
        );
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
    let Some(dir) = vectors_dir() else {
        return;
    };
    for vector in load_frame_vectors(&dir) {
        let name = &vector.name;
        let (expected, wire) = vector_frame(&vector);
        let head: [u8; HEADER_LEN] = wire[..HEADER_LEN].try_into().expect("8 header bytes");
        assert_eq!(
            Header::from_bytes(head),
            Ok(expected.header),
            "{name}: Header::from_bytes"
        );

        let mut codec = FrameCodec::new();
        let mut buf = BytesMut::from(&wire[..]);
        let decoded = codec
            .decode(&mut buf)
            .unwrap_or_else(|e| panic!("{name}: decoding failed: {e}"))
            .unwrap_or_else(|| panic!("{name}: the decoder wants more than the whole frame"));
        assert_eq!(decoded.header, expected.header, "{name}: decoded header");
        assert!(
            decoded.payload == expected.payload,
            "{name}: decoded payload differs (got {} bytes, expected {})",
            decoded.payload.len(),
            expected.payload.len()
        );
        assert!(buf.is_empty(), "{name}: bytes left after the frame");
        assert!(
            codec
                .decode_eof(&mut buf)
                .unwrap_or_else(|e| panic!("{name}: clean end refused: {e}"))
                .is_none(),
            "{name}: a frame out of nothing"
        );

        // A transport may deliver the frame in pieces; one byte at a time is the worst case.
        let mut codec = FrameCodec::new();
        let mut buf = BytesMut::new();
        let mut pieces = Vec::new();
        for byte in &wire {
            buf.extend_from_slice(&[*byte]);
            if let Some(frame) = codec
                .decode(&mut buf)
                .unwrap_or_else(|e| panic!("{name}: decoding byte by byte failed: {e}"))
            {
                pieces.push(frame);
            }
        }
        assert_eq!(pieces.len(), 1, "{name}: frames decoded byte by byte");
        assert!(
            pieces[0] == expected,
            "{name}: byte-by-byte decoding differs"
        );
    }
}

// ------------------------------------------------------------------------------------------
// sessions/NAME

/// One frame of a capture, with the exact bytes it took on the wire.
struct Captured {
    frame: Frame,
    wire: Bytes,
}

/// Both directions of one recorded Go session.
struct Scenario {
    client_to_server: Vec<Captured>,
    server_to_client: Vec<Captured>,
}

/// Decodes a capture frame by frame; panics on bytes that are not whole frames.
fn decode_capture(bytes: &[u8], what: &str) -> Vec<Captured> {
    let mut codec = FrameCodec::new();
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    let mut offset = 0;
    loop {
        let before = buf.len();
        let frame = codec
            .decode(&mut buf)
            .unwrap_or_else(|e| panic!("{what}: frame {} at byte {offset}: {e}", frames.len()));
        let Some(frame) = frame else {
            break;
        };
        let used = before - buf.len();
        frames.push(Captured {
            frame,
            wire: Bytes::copy_from_slice(&bytes[offset..offset + used]),
        });
        offset += used;
    }
    assert!(
        buf.is_empty(),
        "{what}: {} trailing bytes after {} frames",
        buf.len(),
        frames.len()
    );
    assert!(
        codec
            .decode_eof(&mut buf)
            .unwrap_or_else(|e| panic!("{what}: ends inside a frame: {e}"))
            .is_none(),
        "{what}: a frame out of nothing at the end"
    );
    frames
}

fn load_scenario(dir: &Path, name: &str) -> Scenario {
    let read = |file: &str| {
        let path = dir.join("sessions").join(name).join(file);
        fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    };
    Scenario {
        client_to_server: decode_capture(
            &read("client_to_server.bin"),
            &format!("{name}/client_to_server.bin"),
        ),
        server_to_client: decode_capture(
            &read("server_to_client.bin"),
            &format!("{name}/server_to_client.bin"),
        ),
    }
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

/// Frames with their payloads, for comparing what two sides wrote.
fn details(frames: impl IntoIterator<Item = Frame>) -> Vec<(String, Bytes)> {
    frames
        .into_iter()
        .map(|frame| (shape(&frame), frame.payload))
        .collect()
}

/// The frames that say what happened, without the WindowUpdates and Keepalives whose number
/// and place depend on timing.
fn without_credit(frames: &[Frame]) -> Vec<(String, Bytes)> {
    details(
        frames
            .iter()
            .filter(|f| !matches!(f.header.kind, Kind::WindowUpdate | Kind::Keepalive))
            .cloned(),
    )
}

fn frames_of(captured: &[Captured]) -> Vec<Frame> {
    captured.iter().map(|c| c.frame.clone()).collect()
}

/// The index of the first captured frame of `kind` on stream `id`.
fn position(captured: &[Captured], kind: Kind, id: u32) -> usize {
    captured
        .iter()
        .position(|c| c.frame.header.kind == kind && c.frame.header.id == id)
        .unwrap_or_else(|| panic!("the capture has no {kind:?} on stream {id}"))
}

#[test]
fn go_session_captures_decode_frame_by_frame_as_listed() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let sessions = dir.join("sessions");
    let mut names: Vec<String> = fs::read_dir(&sessions)
        .unwrap_or_else(|e| panic!("listing {}: {e}", sessions.display()))
        .map(|entry| {
            entry
                .expect("a directory entry")
                .file_name()
                .into_string()
                .expect("a UTF-8 scenario name")
        })
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no captured sessions");
    for name in names {
        let scenario = load_scenario(&dir, &name);
        let path = sessions.join(&name).join("frames.txt");
        let text =
            fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        for (direction, captured) in [
            ("client_to_server", &scenario.client_to_server),
            ("server_to_client", &scenario.server_to_client),
        ] {
            let decoded: Vec<String> = captured.iter().map(|c| shape(&c.frame)).collect();
            assert_eq!(
                decoded,
                listed_frames(&text, direction),
                "{name}/{direction}.bin against frames.txt"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// The raw peer: replays a Go side's bytes into our session and watches what our session writes.

/// What our session has written to the raw peer so far.
#[derive(Debug, Clone, Default)]
struct Observed {
    frames: Vec<Frame>,
    /// WindowUpdate credit per stream.
    credit: HashMap<u32, u64>,
    /// Data bytes per stream.
    data: HashMap<u32, u64>,
    /// What was wrong with the output, if anything: bytes that are no frame, or data beyond
    /// the credit the raw peer had granted.
    invalid: Option<String>,
    /// Our session closed its end of the connection cleanly, between frames.
    eof: bool,
}

impl Observed {
    fn credit_on(&self, id: u32) -> u64 {
        self.credit.get(&id).copied().unwrap_or(0)
    }

    fn data_on(&self, id: u32) -> u64 {
        self.data.get(&id).copied().unwrap_or(0)
    }

    fn sent(&self, kind: Kind, id: u32) -> bool {
        self.frames
            .iter()
            .any(|f| f.header.kind == kind && f.header.id == id)
    }

    fn payload_on(&self, id: u32) -> Vec<u8> {
        self.frames
            .iter()
            .filter(|f| f.header.kind == Kind::Data && f.header.id == id)
            .flat_map(|f| f.payload.iter().copied())
            .collect()
    }

    fn shapes(&self) -> Vec<String> {
        self.frames.iter().map(shape).collect()
    }

    fn assert_valid(&self) {
        assert!(
            self.invalid.is_none(),
            "our session wrote invalid output: {}",
            self.invalid.as_deref().unwrap_or_default()
        );
        assert!(self.eof, "our session's output did not end cleanly");
    }
}

/// Credit the raw peer has granted our session, per stream (recorded before it is sent).
type Granted = Arc<Mutex<HashMap<u32, u64>>>;

fn granted_on(granted: &Granted, id: u32) -> u64 {
    granted
        .lock()
        .expect("the credit table is never poisoned")
        .get(&id)
        .copied()
        .unwrap_or(0)
}

/// Reads our session's output until it closes the connection, decoding and recording frames.
async fn observe(
    mut reader: ReadHalf<DuplexStream>,
    seen: watch::Sender<Observed>,
    granted: Granted,
) -> Observed {
    let mut codec = FrameCodec::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let record = |frame: Frame| {
        let limit = u64::from(INITIAL_WINDOW) + granted_on(&granted, frame.header.id);
        seen.send_modify(|seen| {
            let Header { id, length, kind } = frame.header;
            match kind {
                Kind::Data => {
                    let total = seen.data_on(id) + u64::from(length);
                    if total > limit && seen.invalid.is_none() {
                        seen.invalid = Some(format!(
                            "{total} data bytes on stream {id} with only {limit} bytes of credit"
                        ));
                    }
                    seen.data.insert(id, total);
                }
                Kind::WindowUpdate => *seen.credit.entry(id).or_default() += u64::from(length),
                _ => {}
            }
            seen.frames.push(frame);
        });
    };
    let fail = |why: String| seen.send_modify(|seen| seen.invalid = Some(why));
    loop {
        match reader.read_buf(&mut buf).await {
            Ok(0) => {
                match codec.decode_eof(&mut buf) {
                    Ok(None) => seen.send_modify(|seen| seen.eof = true),
                    Ok(Some(frame)) => record(frame),
                    Err(e) => fail(format!("the output ends inside a frame: {e}")),
                }
                break;
            }
            Ok(_) => loop {
                match codec.decode(&mut buf) {
                    Ok(Some(frame)) => record(frame),
                    Ok(None) => break,
                    Err(e) => {
                        fail(format!("the output is not a valid frame: {e}"));
                        return seen.borrow().clone();
                    }
                }
            },
            Err(e) => {
                fail(format!("reading our session's output failed: {e}"));
                break;
            }
        }
    }
    let observed = seen.borrow().clone();
    observed
}

/// The far end of our session's connection, standing in for the recorded Go peer.
struct RawPeer {
    writer: WriteHalf<DuplexStream>,
    seen: watch::Receiver<Observed>,
    observer: JoinHandle<Observed>,
    granted: Granted,
    /// Data bytes sent per stream.
    sent: HashMap<u32, u64>,
}

impl RawPeer {
    fn start(raw: DuplexStream) -> RawPeer {
        let (reader, writer) = tokio::io::split(raw);
        let (tx, seen) = watch::channel(Observed::default());
        let granted = Granted::default();
        let observer = tokio::spawn(observe(reader, tx, Arc::clone(&granted)));
        RawPeer {
            writer,
            seen,
            observer,
            granted,
            sent: HashMap::new(),
        }
    }

    /// Waits until what our session wrote satisfies `ready`.
    async fn wait_until(
        &mut self,
        what: &str,
        ready: impl FnMut(&Observed) -> bool,
    ) -> Result<(), String> {
        let outcome = match tokio::time::timeout(LIMIT, self.seen.wait_for(ready)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) => "our session's output ended",
            Err(_) => "timed out",
        };
        let seen = self.seen.borrow();
        Err(format!(
            "{outcome} while waiting for {what}; our session wrote {:?}{}",
            seen.shapes(),
            seen.invalid
                .as_ref()
                .map(|why| format!(" (invalid: {why})"))
                .unwrap_or_default()
        ))
    }

    /// Writes the captured frames in order, each one only once the Go peer could have sent it:
    /// Data within the credit our session granted, a WindowUpdate once our session sent the
    /// data it pays for.
    async fn replay(&mut self, captured: &[Captured]) -> Result<(), String> {
        for frame in captured {
            let Header { id, length, kind } = frame.frame.header;
            let length = u64::from(length);
            match kind {
                Kind::Data => {
                    let total = self.sent.get(&id).copied().unwrap_or(0) + length;
                    let what = format!("credit for {total} bytes in all on stream {id}");
                    self.wait_until(&what, |seen| {
                        u64::from(INITIAL_WINDOW) + seen.credit_on(id) >= total
                    })
                    .await?;
                    self.sent.insert(id, total);
                }
                Kind::WindowUpdate => {
                    let total = granted_on(&self.granted, id) + length;
                    let what = format!("{total} data bytes in all on stream {id}");
                    self.wait_until(&what, |seen| seen.data_on(id) >= total)
                        .await?;
                    self.granted
                        .lock()
                        .expect("the credit table is never poisoned")
                        .insert(id, total);
                }
                _ => {}
            }
            match tokio::time::timeout(LIMIT, self.writer.write_all(&frame.wire)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(format!(
                        "writing {} to our session failed: {e}",
                        shape(&frame.frame)
                    ))
                }
                Err(_) => return Err(format!("timed out writing {}", shape(&frame.frame))),
            }
        }
        Ok(())
    }

    /// Waits until our session has closed its end of the connection; returns all it wrote.
    async fn finish(self) -> Observed {
        let RawPeer {
            writer, observer, ..
        } = self;
        let observed = within("our session to close the connection", observer)
            .await
            .expect("the observer task panicked");
        drop(writer);
        observed
    }
}

/// Our session of `role` on one end of an in-memory connection, the raw peer on the other.
fn connect(role: gomux::Role) -> (Session, RawPeer) {
    let (ours, raw) = tokio::io::duplex(DUPLEX_BUF);
    let session = match role {
        gomux::Role::Client => Session::client(ours),
        gomux::Role::Server => Session::server(ours),
    };
    (session, RawPeer::start(raw))
}

async fn assert_closed_by_peer(session: &Session) {
    let reason = within("the session to end", session.closed()).await;
    assert!(
        matches!(reason, Error::ClosedByPeer),
        "the session ended with {reason:?}, expected ClosedByPeer after the Go peer's CloseMux"
    );
}

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
    let wrong = received
        .iter()
        .enumerate()
        .find(|(i, byte)| **byte != (i % 251) as u8);
    assert!(wrong.is_none(), "bulk byte (index, value) wrong: {wrong:?}");
}

// ------------------------------------------------------------------------------------------
// Replays into a server-role session (the Go client's bytes).

#[tokio::test]
async fn server_echoes_the_go_client_and_returns_the_credit_it_consumed() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "echo");
    let (session, mut peer) = connect(gomux::Role::Server);
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            let mut stream = within("the Go client's stream", session.accept())
                .await
                .expect("accepting the Go client's stream");
            assert_eq!(stream.id(), 0, "the Go client's first stream id");
            let mut text = [0u8; 12];
            within("reading the request", stream.read_exact(&mut text))
                .await
                .expect("reading the request");
            assert_eq!(&text, b"hello, world");
            within("writing the echo", stream.write_all(&text))
                .await
                .expect("writing the echo");
            let mut rest = Vec::new();
            within("end-of-stream", stream.read_to_end(&mut rest))
                .await
                .expect("reading to end-of-stream after the Go client's CloseStream");
            assert!(rest.is_empty(), "unexpected bytes after the request");
        }
    });
    let replayed = peer.replay(&scenario.client_to_server).await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go client's bytes");
    assert_closed_by_peer(&session).await;

    let observed = peer.finish().await;
    observed.assert_valid();
    assert!(
        observed.credit_on(0) >= 12,
        "credit returned on stream 0 is {}, less than the 12 bytes the application read",
        observed.credit_on(0)
    );
    // The Go server wrote the same frames; only their order is a matter of timing.
    let mut ours = details(observed.frames.clone());
    let mut go = details(frames_of(&scenario.server_to_client));
    ours.sort();
    go.sort();
    assert_eq!(
        ours, go,
        "what our server wrote against what the Go server wrote"
    );
}

#[tokio::test]
async fn server_serves_the_four_streams_the_go_client_opens_in_turn() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "four_streams");
    let (session, mut peer) = connect(gomux::Role::Server);
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            for n in 0..4u32 {
                let mut stream = within(format!("stream {}", 2 * n), session.accept())
                    .await
                    .expect("accepting the Go client's stream");
                assert_eq!(stream.id(), 2 * n, "id of the Go client's stream {n}");
                let mut text = [0u8; 15];
                within("reading the request", stream.read_exact(&mut text))
                    .await
                    .expect("reading the request");
                assert_eq!(text, format!("stream number {n}").as_bytes());
                within(
                    "writing the reply",
                    stream.write_all(&text.to_ascii_uppercase()),
                )
                .await
                .expect("writing the reply");
                let mut rest = Vec::new();
                within("end-of-stream", stream.read_to_end(&mut rest))
                    .await
                    .expect("reading to end-of-stream after the Go client's CloseStream");
                assert!(rest.is_empty(), "unexpected bytes after request {n}");
            }
        }
    });
    let replayed = peer.replay(&scenario.client_to_server).await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go client's bytes");
    assert_closed_by_peer(&session).await;

    let observed = peer.finish().await;
    observed.assert_valid();
    for id in [0, 2, 4, 6] {
        assert!(
            observed.credit_on(id) >= 15,
            "credit returned on stream {id} is {}, less than the 15 bytes read",
            observed.credit_on(id)
        );
    }
    let mut ours = details(observed.frames.clone());
    let mut go = details(frames_of(&scenario.server_to_client));
    ours.sort();
    go.sort();
    assert_eq!(
        ours, go,
        "what our server wrote against what the Go server wrote"
    );
}

#[tokio::test]
async fn server_reads_1000_bytes_then_end_of_stream_after_the_go_clients_half_close() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "half_close");
    let (session, mut peer) = connect(gomux::Role::Server);
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            let mut stream = within("the Go client's stream", session.accept())
                .await
                .expect("accepting the Go client's stream");
            assert_eq!(stream.id(), 0);
            let mut received = Vec::new();
            within("end-of-stream", stream.read_to_end(&mut received))
                .await
                .expect("reading to end-of-stream");
            assert!(
                received == half_close_payload(),
                "received {} bytes, expected the 1000-byte pattern",
                received.len()
            );
            within("writing the reply", stream.write_all(b"got 1000 bytes"))
                .await
                .expect("writing the reply after the peer's half-close");
            within("closing the stream", stream.close())
                .await
                .expect("closing the stream");
        }
    });
    // The Go client closed the session only after reading the reply to end-of-stream.
    let close_mux = position(&scenario.client_to_server, Kind::CloseMux, 0);
    let replayed = async {
        peer.replay(&scenario.client_to_server[..close_mux]).await?;
        peer.wait_until("our CloseStream on stream 0", |seen| {
            seen.sent(Kind::CloseStream, 0)
        })
        .await?;
        peer.replay(&scenario.client_to_server[close_mux..]).await
    }
    .await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go client's bytes");
    assert_closed_by_peer(&session).await;

    let observed = peer.finish().await;
    observed.assert_valid();
    assert_eq!(
        without_credit(&observed.frames),
        without_credit(&frames_of(&scenario.server_to_client)),
        "what our server wrote against what the Go server wrote"
    );
}

#[tokio::test]
async fn server_receives_200000_bytes_from_the_go_client_paced_by_the_credit_it_returns() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "bulk_200k");
    let (session, mut peer) = connect(gomux::Role::Server);
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            let mut stream = within("the Go client's stream", session.accept())
                .await
                .expect("accepting the Go client's stream");
            assert_eq!(stream.id(), 0);
            // Reads of at most 10000 bytes, as the Go server did.
            let mut received = Vec::with_capacity(BULK_LEN);
            let mut chunk = vec![0u8; 10_000];
            loop {
                let n = within("bulk data", stream.read(&mut chunk))
                    .await
                    .expect("reading bulk data");
                if n == 0 {
                    break;
                }
                received.extend_from_slice(&chunk[..n]);
            }
            assert_bulk(&received);
            // The Go server left its stream open until the session ended; dropping ours now
            // would send a CloseStream or not depending on whether the Go client's own had
            // arrived yet.
            within("the session to end", session.closed()).await;
            drop(stream);
        }
    });
    let replayed = peer.replay(&scenario.client_to_server).await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go client's bytes");
    assert_closed_by_peer(&session).await;

    let observed = peer.finish().await;
    observed.assert_valid();
    assert!(
        observed
            .frames
            .iter()
            .all(|f| f.header.kind == Kind::WindowUpdate && f.header.id == 0),
        "the Go server wrote only WindowUpdates on stream 0; ours wrote {:?}",
        observed.shapes()
    );
}

#[tokio::test]
async fn server_opening_two_streams_writes_what_the_go_server_wrote() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "server_opens");
    let (session, mut peer) = connect(gomux::Role::Server);
    // The Go client's WindowUpdate left before the Go server closed the session; closing ours
    // first would make that write fail for reasons of the test's timing alone.
    let (replay_done, replay_finished) = tokio::sync::oneshot::channel::<()>();
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            for n in 0..2u32 {
                let mut stream = within("opening a stream", session.open())
                    .await
                    .expect("opening a stream");
                assert_eq!(stream.id(), 2 * n + 1, "server stream ids are odd");
                within(
                    "writing",
                    stream.write_all(format!("from server {n}").as_bytes()),
                )
                .await
                .expect("writing");
                within("closing the stream", stream.close())
                    .await
                    .expect("closing the stream");
            }
            within("the replay", replay_finished)
                .await
                .expect("the replay ends before the session is closed");
            within("closing the session", session.close())
                .await
                .expect("closing the session gracefully");
        }
    });
    let replayed = peer.replay(&scenario.client_to_server).await;
    // An application that already failed has dropped the receiver; its panic is reported next.
    let _ = replay_done.send(());
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go client's bytes");
    let reason = within("the session to end", session.closed()).await;
    assert!(
        matches!(reason, Error::ClosedLocally),
        "the session ended with {reason:?}, expected ClosedLocally"
    );

    let observed = peer.finish().await;
    observed.assert_valid();
    assert_eq!(
        without_credit(&observed.frames),
        without_credit(&frames_of(&scenario.server_to_client)),
        "what our server wrote against what the Go server wrote"
    );
}

// ------------------------------------------------------------------------------------------
// Replays into a client-role session (the Go server's bytes).

#[tokio::test]
async fn client_keeps_the_go_servers_streams_readable_after_its_close_mux() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "server_opens");
    let (session, mut peer) = connect(gomux::Role::Client);
    peer.replay(&scenario.server_to_client)
        .await
        .expect("replaying the Go server's bytes");
    // Everything arrives before the application looks: the session has ended by then, and
    // what it received must still be there.
    assert_closed_by_peer(&session).await;
    for (n, id) in [(0, 1), (1, 3)] {
        let mut stream = within(format!("stream {id}"), session.accept())
            .await
            .expect("accepting a stream the Go server opened before its CloseMux");
        assert_eq!(stream.id(), id, "id of the Go server's stream {n}");
        let mut text = String::new();
        within("end-of-stream", stream.read_to_string(&mut text))
            .await
            .expect("reading the stream to end-of-stream");
        assert_eq!(text, format!("from server {n}"));
    }
    let after = within("accept after the end", session.accept()).await;
    assert!(
        matches!(after, Err(Error::ClosedByPeer)),
        "accept once the queue is empty gave {after:?}, expected ClosedByPeer"
    );
    drop(session);
    peer.finish().await.assert_valid();
}

#[tokio::test]
async fn client_echo_against_the_go_server_writes_what_the_go_client_wrote() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "echo");
    let (session, mut peer) = connect(gomux::Role::Client);
    // The capture's frames for stream 0 need the stream to exist: the client opens it first.
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            let mut stream = within("opening a stream", session.open())
                .await
                .expect("opening a stream");
            assert_eq!(stream.id(), 0, "the client's first stream id");
            within("writing", stream.write_all(b"hello, world"))
                .await
                .expect("writing the request");
            let mut echo = [0u8; 12];
            within("the echo", stream.read_exact(&mut echo))
                .await
                .expect("reading the echo");
            assert_eq!(&echo, b"hello, world");
            within("closing the stream", stream.close())
                .await
                .expect("closing the stream");
        }
    });
    let replayed = peer.replay(&scenario.server_to_client).await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go server's bytes");
    within("closing the session", session.close())
        .await
        .expect("closing the session gracefully");

    let observed = peer.finish().await;
    observed.assert_valid();
    assert_eq!(
        without_credit(&observed.frames),
        without_credit(&frames_of(&scenario.client_to_server)),
        "what our client wrote against what the Go client wrote"
    );
}

#[tokio::test]
async fn client_four_streams_against_the_go_server_write_what_the_go_client_wrote() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "four_streams");
    let (session, mut peer) = connect(gomux::Role::Client);
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            for n in 0..4u32 {
                let mut stream = within("opening a stream", session.open())
                    .await
                    .expect("opening a stream");
                assert_eq!(stream.id(), 2 * n, "client stream ids are even, in order");
                let request = format!("stream number {n}");
                within("writing", stream.write_all(request.as_bytes()))
                    .await
                    .expect("writing the request");
                let mut reply = [0u8; 15];
                within("the reply", stream.read_exact(&mut reply))
                    .await
                    .expect("reading the reply");
                assert_eq!(reply, request.to_ascii_uppercase().as_bytes());
                within("closing the stream", stream.close())
                    .await
                    .expect("closing the stream");
            }
        }
    });
    let replayed = peer.replay(&scenario.server_to_client).await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go server's bytes");
    within("closing the session", session.close())
        .await
        .expect("closing the session gracefully");

    let observed = peer.finish().await;
    observed.assert_valid();
    assert_eq!(
        without_credit(&observed.frames),
        without_credit(&frames_of(&scenario.client_to_server)),
        "what our client wrote against what the Go client wrote"
    );
}

#[tokio::test]
async fn client_half_close_against_the_go_server_reads_its_reply_to_end_of_stream() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "half_close");
    let (session, mut peer) = connect(gomux::Role::Client);
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            let mut stream = within("opening a stream", session.open())
                .await
                .expect("opening a stream");
            assert_eq!(stream.id(), 0);
            within("writing", stream.write_all(&half_close_payload()))
                .await
                .expect("writing 1000 bytes");
            within("the half-close", stream.shutdown())
                .await
                .expect("half-closing the stream");
            let mut reply = String::new();
            within("the reply", stream.read_to_string(&mut reply))
                .await
                .expect("reading the reply to end-of-stream");
            assert_eq!(reply, "got 1000 bytes");
        }
    });
    // The Go server answered only after reading our data to end-of-stream.
    let replayed = async {
        peer.wait_until("our CloseRead on stream 0", |seen| {
            seen.sent(Kind::CloseRead, 0)
        })
        .await?;
        peer.replay(&scenario.server_to_client).await
    }
    .await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go server's bytes");
    within("closing the session", session.close())
        .await
        .expect("closing the session gracefully");

    let observed = peer.finish().await;
    observed.assert_valid();
    assert_eq!(
        without_credit(&observed.frames),
        without_credit(&frames_of(&scenario.client_to_server)),
        "what our client wrote against what the Go client wrote"
    );
}

#[tokio::test]
async fn client_sends_200000_bytes_within_the_credit_the_go_server_granted() {
    let Some(dir) = vectors_dir() else {
        return;
    };
    let scenario = load_scenario(&dir, "bulk_200k");
    let (session, mut peer) = connect(gomux::Role::Client);
    let app = tokio::spawn({
        let session = session.clone();
        async move {
            let mut stream = within("opening a stream", session.open())
                .await
                .expect("opening a stream");
            assert_eq!(stream.id(), 0);
            within("writing", stream.write_all(&bulk_payload()))
                .await
                .expect("writing 200000 bytes");
            within("the half-close", stream.shutdown())
                .await
                .expect("half-closing the stream");
            within("closing the stream", stream.close())
                .await
                .expect("closing the stream");
        }
    });
    let replayed = peer.replay(&scenario.server_to_client).await;
    within("the application", app)
        .await
        .expect("the application task panicked");
    replayed.expect("replaying the Go server's bytes");
    within("closing the session", session.close())
        .await
        .expect("closing the session gracefully");

    // The observer checked every Data frame against the credit granted so far.
    let observed = peer.finish().await;
    observed.assert_valid();
    assert_bulk(&observed.payload_on(0));
    assert!(
        observed
            .frames
            .iter()
            .all(|f| f.payload.len() <= MAX_PAYLOAD),
        "a Data frame above the Go limit of {MAX_PAYLOAD} bytes"
    );
    let shapes = |frames: &[Frame]| -> Vec<String> {
        frames
            .iter()
            .filter(|f| !matches!(f.header.kind, Kind::Data | Kind::WindowUpdate))
            .map(shape)
            .collect()
    };
    assert_eq!(
        shapes(&observed.frames),
        shapes(&frames_of(&scenario.client_to_server)),
        "the frames around the data, ours against the Go client's"
    );
}
