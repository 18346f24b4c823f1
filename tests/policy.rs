//! The policy for peer input, one test per item, against a raw peer that writes frames (or raw
//! bytes the encoder would refuse) straight onto the connection.
//!
//! Every violation must end the session with its typed protocol error, seen by
//! `Session::closed` and returned by the driver (which must not panic); the raw peer then
//! receives a CloseMux and end-of-file.

mod common;

use std::io;
use std::time::Duration;

use bytes::Bytes;
use common::{gomux_error, within};
use futures::{SinkExt, StreamExt};
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Header, Kind, MAX_LENGTH_FIELD};
use gomux::{Config, Error, ProtocolError, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;
use tokio_util::codec::Framed;

/// The session under test, its driver, and the raw peer on the other end of its connection.
struct Harness {
    session: Session,
    driver: JoinHandle<Result<(), Error>>,
    raw: Framed<DuplexStream, FrameCodec>,
}

/// A session of `role` whose peer is raw. The pipe is roomy, so the raw peer's writes never
/// wait for the session to read.
fn start(role: Role, config: Config) -> Harness {
    let (io, peer) = tokio::io::duplex(1 << 20);
    let (session, connection) = Session::new(io, role, config);
    Harness {
        session,
        driver: tokio::spawn(connection),
        raw: Framed::new(peer, FrameCodec::new()),
    }
}

/// A server session with default settings: the raw peer is the client and opens even ids.
fn server() -> Harness {
    start(Role::Server, Config::default())
}

impl Harness {
    async fn send(&mut self, frame: Frame) {
        within("raw peer send", self.raw.send(frame))
            .await
            .expect("the raw peer sends a frame");
    }

    /// Writes bytes the codec would refuse to encode. The codec's own write buffer is empty
    /// after every `send`, so ordering is kept.
    async fn send_raw(&mut self, bytes: &[u8]) {
        within("raw peer write", self.raw.get_mut().write_all(bytes))
            .await
            .expect("the raw peer writes bytes");
    }

    async fn open(&mut self, id: u32) {
        self.send(Frame::control(id, Kind::OpenStream)).await;
    }

    /// The next frame from the session, or `None` at end-of-file.
    async fn recv(&mut self) -> Option<Frame> {
        within("raw peer receive", self.raw.next())
            .await
            .map(|frame| frame.expect("the session sends well-formed frames"))
    }

    /// Receives frames until one of `kind` on `id`, skipping others.
    async fn recv_until(&mut self, id: u32, kind: Kind) -> Frame {
        loop {
            let frame = self
                .recv()
                .await
                .unwrap_or_else(|| panic!("end-of-file before {kind:?} on {id}"));
            if frame.header.id == id && frame.header.kind == kind {
                return frame;
            }
        }
    }

    /// Waits for the session's end and checks the error it reports, the driver's outcome and
    /// what the raw peer sees: CloseMux (when `close_mux`), then end-of-file.
    async fn expect_end(mut self, expected: &Error, close_mux: bool) -> Session {
        let reason = within("session end", self.session.closed()).await;
        assert_same_error(&reason, expected, "Session::closed");
        let outcome = within("driver end", &mut self.driver)
            .await
            .expect("the driver did not panic");
        // The driver reports a graceful end for either side's CloseMux, the error otherwise.
        match (outcome, expected) {
            (Ok(()), Error::ClosedLocally | Error::ClosedByPeer) => {}
            (Ok(()), _) => panic!("the driver reported a graceful end instead of {expected:?}"),
            (Err(error), _) => assert_same_error(&error, expected, "driver outcome"),
        }
        let mut frames = Vec::new();
        loop {
            match within("raw peer drain", self.raw.next()).await {
                Some(Ok(frame)) => frames.push(frame),
                Some(Err(error)) => panic!("the raw peer read garbage: {error}"),
                None => break,
            }
        }
        let last = frames.last().map(|f| f.header.kind);
        if close_mux {
            assert_eq!(
                last,
                Some(Kind::CloseMux),
                "CloseMux before EOF: {frames:?}"
            );
        } else {
            assert!(
                frames.iter().all(|f| f.header.kind != Kind::CloseMux),
                "no CloseMux expected: {frames:?}"
            );
        }
        self.session
    }

    async fn expect_protocol_error(self, expected: ProtocolError) -> Session {
        self.expect_end(&Error::Protocol(expected), true).await
    }
}

/// Errors are not `PartialEq` (a transport error holds an `io::Error`); compare the variants
/// this suite produces.
#[track_caller]
fn assert_same_error(got: &Error, want: &Error, what: &str) {
    let same = match (got, want) {
        (Error::Protocol(a), Error::Protocol(b)) => a == b,
        (Error::ClosedLocally, Error::ClosedLocally)
        | (Error::ClosedByPeer, Error::ClosedByPeer)
        | (Error::ConnectionClosed, Error::ConnectionClosed)
        | (Error::UnexpectedEof, Error::UnexpectedEof)
        | (Error::IdleTimeout, Error::IdleTimeout) => true,
        (Error::SessionUnavailable(a), Error::SessionUnavailable(b)) => {
            assert_same_error(a, b, what);
            true
        }
        _ => false,
    };
    assert!(same, "{what}: got {got:?}, want {want:?}");
}

/// A header the codec cannot express: an undefined kind byte.
fn unknown_kind_header(id: u32, kind: u8) -> [u8; 8] {
    let mut bytes = Header::new(id, Kind::Keepalive).to_bytes();
    bytes[7] = kind;
    bytes
}

#[tokio::test]
async fn data_above_the_maximum_payload() {
    let mut h = server();
    h.open(0).await;
    // Only the header: the session must refuse it without waiting for (or reserving) the
    // claimed payload.
    let header = Header {
        id: 0,
        length: 65_537,
        kind: Kind::Data,
    };
    h.send_raw(&header.to_bytes()).await;
    h.expect_protocol_error(ProtocolError::PayloadTooLarge {
        id: 0,
        length: 65_537,
        max: 65_536,
    })
    .await;
}

#[tokio::test]
async fn data_above_a_configured_maximum_payload() {
    let mut h = start(Role::Server, Config::default().max_payload(1024));
    h.open(0).await;
    h.send(Frame::data(0, vec![1u8; 1024])).await;
    h.send(Frame::data(0, vec![2u8; 1025])).await;
    let session = h
        .expect_protocol_error(ProtocolError::PayloadTooLarge {
            id: 0,
            length: 1025,
            max: 1024,
        })
        .await;
    // The frame within the limit was delivered.
    let mut stream = session.accept().await.expect("the stream was queued");
    let mut got = vec![0u8; 1024];
    stream.read_exact(&mut got).await.expect("data before");
    assert!(got.iter().all(|&b| b == 1));
}

#[tokio::test]
async fn data_beyond_the_granted_credit() {
    let mut h = server();
    h.open(0).await;
    // The whole initial window, never read, so no credit comes back; then one byte more.
    h.send(Frame::data(0, vec![0u8; 65_536])).await;
    h.send(Frame::data(0, vec![0u8; 1])).await;
    h.expect_protocol_error(ProtocolError::WindowExceeded {
        id: 0,
        length: 1,
        credit: 0,
    })
    .await;
}

#[tokio::test]
async fn window_update_overflowing_the_credit() {
    let mut h = server();
    h.open(0).await;
    // 65,536 + 255 × 16,777,215 still fits in a u32; the 256th update does not.
    for _ in 0..256 {
        h.send(Frame::window_update(0, MAX_LENGTH_FIELD)).await;
    }
    let credit = 65_536 + 255 * MAX_LENGTH_FIELD;
    h.expect_protocol_error(ProtocolError::WindowOverflow {
        id: 0,
        credit,
        increment: MAX_LENGTH_FIELD,
    })
    .await;
}

#[tokio::test]
async fn unknown_kind() {
    for kind in [8u8, 0x2a, 0xff] {
        let mut h = server();
        h.send_raw(&unknown_kind_header(6, kind)).await;
        h.expect_protocol_error(ProtocolError::UnknownKind { id: 6, kind })
            .await;
    }
}

#[tokio::test]
async fn duplicate_open_for_a_live_stream() {
    let mut h = server();
    h.open(4).await;
    h.open(4).await;
    h.expect_protocol_error(ProtocolError::DuplicateStream { id: 4 })
        .await;
}

#[tokio::test]
async fn duplicate_open_for_an_accepted_stream() {
    let mut h = server();
    h.open(4).await;
    let _stream = within("accept", h.session.accept())
        .await
        .expect("accept the first open");
    h.open(4).await;
    h.expect_protocol_error(ProtocolError::DuplicateStream { id: 4 })
        .await;
}

#[tokio::test]
async fn open_with_the_wrong_parity_on_a_server() {
    let mut h = server();
    h.open(1).await;
    h.expect_protocol_error(ProtocolError::WrongParity { id: 1 })
        .await;
}

#[tokio::test]
async fn open_with_the_wrong_parity_on_a_client() {
    let mut h = start(Role::Client, Config::default());
    h.open(2).await;
    h.expect_protocol_error(ProtocolError::WrongParity { id: 2 })
        .await;
}

#[tokio::test]
async fn data_after_the_peers_close_read() {
    let mut h = server();
    h.open(0).await;
    h.send(Frame::data(0, &b"before"[..])).await;
    h.send(Frame::control(0, Kind::CloseRead)).await;
    h.send(Frame::data(0, &b"after"[..])).await;
    let session = h
        .expect_protocol_error(ProtocolError::DataAfterClose { id: 0 })
        .await;
    let mut stream = session.accept().await.expect("the stream was queued");
    let mut got = [0u8; 6];
    stream.read_exact(&mut got).await.expect("data before");
    assert_eq!(&got, b"before");
}

#[tokio::test]
async fn data_after_the_peers_close_stream_while_the_app_holds_it() {
    let mut h = server();
    h.open(0).await;
    let _held = within("accept", h.session.accept())
        .await
        .expect("accept the stream");
    h.send(Frame::control(0, Kind::CloseStream)).await;
    h.send(Frame::data(0, &b"after"[..])).await;
    h.expect_protocol_error(ProtocolError::DataAfterClose { id: 0 })
        .await;
}

#[tokio::test]
async fn frames_for_unknown_or_closed_streams_are_ignored() {
    let mut h = server();

    // Never opened, of either parity.
    for id in [100, 101] {
        h.send(Frame::data(id, &b"nobody"[..])).await;
        h.send(Frame::window_update(id, 1000)).await;
        h.send(Frame::control(id, Kind::CloseRead)).await;
        h.send(Frame::control(id, Kind::CloseWrite)).await;
        h.send(Frame::control(id, Kind::CloseStream)).await;
    }
    // More than a window's worth on an unknown stream: it is not accounted to anything.
    for _ in 0..3 {
        h.send(Frame::data(102, vec![0u8; 65_536])).await;
    }

    // Closed by the session: frames still in flight from the peer race with the close.
    h.open(0).await;
    h.send(Frame::data(0, &b"early"[..])).await;
    let stream = within("accept", h.session.accept())
        .await
        .expect("accept stream 0");
    drop(stream);
    h.recv_until(0, Kind::CloseStream).await;
    h.send(Frame::data(0, &b"late"[..])).await;
    h.send(Frame::window_update(0, 1000)).await;
    h.send(Frame::control(0, Kind::CloseRead)).await;
    h.send(Frame::control(0, Kind::CloseStream)).await;

    // The session keeps working.
    h.open(2).await;
    h.send(Frame::data(2, &b"ping"[..])).await;
    let mut stream = within("accept", h.session.accept())
        .await
        .expect("accept stream 2");
    assert_eq!(stream.id(), 2);
    let mut got = [0u8; 4];
    within("read", stream.read_exact(&mut got))
        .await
        .expect("read ping");
    assert_eq!(&got, b"ping");
    within("write", stream.write_all(b"pong"))
        .await
        .expect("write pong");
    let reply = h.recv_until(2, Kind::Data).await;
    assert_eq!(&reply.payload[..], b"pong");
    assert!(!h.session.is_closed(), "{:?}", h.session.close_reason());

    // The raw peer closes the connection once it has read the CloseMux, as a Go peer does.
    let (closed, last) = within("close", async {
        let peer = async {
            let mut last = None;
            while let Some(frame) = h.raw.next().await {
                last = Some(frame.expect("well-formed").header.kind);
            }
            h.raw.get_mut().shutdown().await.expect("shutdown");
            last
        };
        tokio::join!(h.session.close(), peer)
    })
    .await;
    closed.expect("graceful close");
    assert_eq!(last, Some(Kind::CloseMux), "CloseMux before EOF");
    let outcome = within("driver end", &mut h.driver).await;
    outcome.expect("no panic").expect("a graceful end");
}

#[tokio::test]
async fn connection_ending_mid_frame() {
    let mut h = server();
    h.open(0).await;
    h.send(Frame::data(0, &b"delivered"[..])).await;
    // A Data header promising 100 bytes, 10 of them, then the end of the connection.
    let header = Header {
        id: 0,
        length: 100,
        kind: Kind::Data,
    };
    h.send_raw(&header.to_bytes()).await;
    h.send_raw(&[9u8; 10]).await;
    within("shutdown", h.raw.get_mut().shutdown())
        .await
        .expect("raw peer shuts down");
    let session = h.expect_end(&Error::UnexpectedEof, false).await;

    let mut stream = session.accept().await.expect("the stream was queued");
    let mut got = [0u8; 9];
    stream.read_exact(&mut got).await.expect("delivered data");
    assert_eq!(&got, b"delivered");
    let mut byte = [0u8; 1];
    let error = stream.read(&mut byte).await.expect_err("then the error");
    assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    assert!(matches!(gomux_error(&error), Some(Error::UnexpectedEof)));
}

#[tokio::test]
async fn connection_ending_mid_header() {
    let mut h = server();
    h.open(0).await;
    h.send_raw(&Header::new(2, Kind::OpenStream).to_bytes()[..5])
        .await;
    within("shutdown", h.raw.get_mut().shutdown())
        .await
        .expect("raw peer shuts down");
    h.expect_end(&Error::UnexpectedEof, false).await;
}

#[tokio::test]
async fn clean_end_of_file_without_close_mux() {
    let mut h = server();
    h.open(0).await;
    h.send(Frame::data(0, &b"bye"[..])).await;
    within("shutdown", h.raw.get_mut().shutdown())
        .await
        .expect("raw peer shuts down");
    let session = h.expect_end(&Error::ConnectionClosed, false).await;
    let mut stream = session.accept().await.expect("the stream was queued");
    let mut got = [0u8; 3];
    stream.read_exact(&mut got).await.expect("delivered data");
    assert_eq!(&got, b"bye");
    let error = stream.read(&mut got).await.expect_err("then the error");
    assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
    assert!(matches!(gomux_error(&error), Some(Error::ConnectionClosed)));
}

#[tokio::test]
async fn close_mux_from_the_peer() {
    let mut h = server();
    h.send(Frame::control(0, Kind::CloseMux)).await;
    // The session closes its side without answering with a CloseMux of its own.
    let session = h.expect_end(&Error::ClosedByPeer, false).await;
    assert!(matches!(
        session.open().await,
        Err(Error::SessionUnavailable(reason)) if matches!(*reason, Error::ClosedByPeer)
    ));
}

/// Reads, writes and accepts waiting when the session ends all return its error.
async fn pending_operations_fail_when(end: impl AsyncFnOnce(&mut Harness), expected: Error) {
    let mut h = server();

    // A read waiting on a stream the peer opened.
    h.open(0).await;
    let mut inbound = within("accept", h.session.accept())
        .await
        .expect("accept stream 0");
    let reader = tokio::spawn(async move {
        let mut byte = [0u8; 1];
        inbound.read(&mut byte).await
    });

    // A write waiting for credit on a stream the session opened: the raw peer never returns
    // any, so a write beyond one window blocks.
    let mut outbound = within("open", h.session.open())
        .await
        .expect("open a stream");
    let id = outbound.id();
    let writer = tokio::spawn(async move { outbound.write_all(&vec![5u8; 100_000]).await });
    let mut received = 0;
    while received < 65_536 {
        received += h.recv_until(id, Kind::Data).await.payload.len();
    }

    // An accept waiting for a stream.
    let session = h.session.clone();
    let acceptor = tokio::spawn(async move { session.accept().await });

    // Give the three a moment to be waiting, and check that they are: an operation that had
    // already ended would prove nothing about what ending the session does to waiters.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for (name, done) in [
        ("read", reader.is_finished()),
        ("write", writer.is_finished()),
        ("accept", acceptor.is_finished()),
    ] {
        assert!(
            !done,
            "the {name} should be waiting before the session ends"
        );
    }
    end(&mut h).await;

    let kind = expected.io_kind();
    let read = within("pending read", reader).await.expect("reader task");
    let error = read.expect_err("the pending read fails");
    assert_eq!(error.kind(), kind);
    assert_same_error(
        gomux_error(&error).expect("a gomux error"),
        &expected,
        "pending read",
    );
    let write = within("pending write", writer).await.expect("writer task");
    let error = write.expect_err("the pending write fails");
    assert_eq!(error.kind(), kind);
    assert_same_error(
        gomux_error(&error).expect("a gomux error"),
        &expected,
        "pending write",
    );
    let accept = within("pending accept", acceptor)
        .await
        .expect("acceptor task");
    assert_same_error(
        &accept.expect_err("the pending accept fails"),
        &expected,
        "pending accept",
    );
    let session = h.session.clone();
    let open = within("open after the end", session.open()).await;
    assert_same_error(
        &open.expect_err("opening fails"),
        &Error::SessionUnavailable(Box::new(expected.clone())),
        "open after the end",
    );
    let close_mux = matches!(expected, Error::Protocol(_));
    h.expect_end(&expected, close_mux).await;
}

#[tokio::test]
async fn pending_operations_fail_on_a_protocol_error() {
    pending_operations_fail_when(
        async |h: &mut Harness| h.send_raw(&unknown_kind_header(0, 9)).await,
        Error::Protocol(ProtocolError::UnknownKind { id: 0, kind: 9 }),
    )
    .await;
}

#[tokio::test]
async fn pending_operations_fail_on_end_of_file() {
    pending_operations_fail_when(
        async |h: &mut Harness| {
            within("shutdown", h.raw.get_mut().shutdown())
                .await
                .expect("raw peer shuts down");
        },
        Error::ConnectionClosed,
    )
    .await;
}

#[tokio::test]
async fn pending_operations_fail_on_the_peers_close_mux() {
    pending_operations_fail_when(
        async |h: &mut Harness| h.send(Frame::control(0, Kind::CloseMux)).await,
        Error::ClosedByPeer,
    )
    .await;
}

#[tokio::test]
async fn no_payload_is_read_for_control_kinds() {
    // A CloseRead whose length field claims 5 bytes is complete with its header (as the Go
    // reader treats it); the Data frame right after it must then be a violation, not payload.
    let mut h = server();
    h.open(0).await;
    let mut header = Header::new(0, Kind::CloseRead);
    header.length = 5;
    h.send_raw(&header.to_bytes()).await;
    h.send(Frame::data(0, Bytes::from_static(b"hello"))).await;
    h.expect_protocol_error(ProtocolError::DataAfterClose { id: 0 })
        .await;
}

#[tokio::test]
async fn consumed_credit_comes_back_without_more_data() {
    // The counterpart of the window check: a peer that keeps to its credit, as a Go sender
    // does by waiting until a whole 64 KiB chunk fits, must get every consumed byte back once
    // the application has read it, without sending anything more first.
    let mut h = server();
    h.open(0).await;
    // Less than half the window: only the rule "an empty buffer returns everything" gives it
    // back.
    const FIRST: u32 = 10_000;
    h.send(Frame::data(0, vec![3u8; FIRST as usize])).await;
    let mut stream = within("accept", h.session.accept())
        .await
        .expect("accept stream 0");
    let mut buf = [0u8; 1000];
    let mut read = 0;
    while read < FIRST as usize {
        read += within("read", stream.read(&mut buf))
            .await
            .expect("read the data");
    }
    // Granting more than was consumed would be legal; less would stall a Go sender for good.
    let mut returned = 0;
    while returned < FIRST {
        let update = h.recv_until(0, Kind::WindowUpdate).await;
        returned += update.header.length;
    }
    // A whole window is within the credit now.
    h.send(Frame::data(0, vec![4u8; 65_536])).await;
    let mut got = vec![0u8; 65_536];
    within("read", stream.read_exact(&mut got))
        .await
        .expect("read the second window");
    assert!(got.iter().all(|&b| b == 4));
    assert!(!h.session.is_closed(), "{:?}", h.session.close_reason());
}

/// A peer that floods OpenStream beyond the backlog while reading nothing makes the session
/// stop reading once its refusals pile up (instead of queueing refusals without end), and
/// resume once the peer reads: every refused id is answered with CloseStream, in order, and the
/// accepted stream still works.
#[tokio::test(start_paused = true)]
async fn open_flood_without_reading_is_answered_in_full_once_the_peer_reads() {
    const OPENS: u32 = 20_000;
    // A small pipe and write buffer, so the refusals fill them long before the flood ends.
    let (io, peer) = tokio::io::duplex(4096);
    let config = Config::default().accept_backlog(1).write_buffer_size(1024);
    let (session, connection) = Session::new(io, Role::Server, config);
    let driver = tokio::spawn(connection);
    let (mut peer_read, mut peer_write) = tokio::io::split(peer);

    let flood = tokio::spawn(async move {
        let mut wire = Vec::with_capacity(OPENS as usize * 8);
        for n in 0..OPENS {
            wire.extend_from_slice(&Header::new(n * 2, Kind::OpenStream).to_bytes());
        }
        // Stream 0 is the one accepted: give it data to check afterwards.
        wire.extend_from_slice(
            &Header {
                id: 0,
                length: 2,
                kind: Kind::Data,
            }
            .to_bytes(),
        );
        wire.extend_from_slice(b"ok");
        peer_write
            .write_all(&wire)
            .await
            .expect("the flood is written");
        peer_write
    });

    // With time paused, this sleep returns only once every task is idle: the session has read
    // all it is willing to read. It must have stopped short of the whole flood, since its
    // refusals have nowhere to go.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !flood.is_finished(),
        "the session kept reading while its refusals piled up"
    );

    // Now the peer reads what came back.
    let mut refused = Vec::new();
    let mut codec = FrameCodec::new();
    let mut buf = bytes::BytesMut::new();
    while refused.len() < (OPENS - 1) as usize {
        let n = within("refusals arrive", peer_read.read_buf(&mut buf))
            .await
            .expect("the peer reads");
        assert_ne!(n, 0, "the session closed instead of answering");
        while let Some(frame) = tokio_util::codec::Decoder::decode(&mut codec, &mut buf)
            .expect("the session writes valid frames")
        {
            if frame.header.kind == Kind::CloseStream {
                refused.push(frame.header.id);
            }
        }
    }
    let want: Vec<u32> = (1..OPENS).map(|n| n * 2).collect();
    assert_eq!(refused, want, "every refused id is answered once, in order");

    let _peer_write = within("flood written", flood).await.expect("no panic");
    let mut stream = within("accept", session.accept()).await.expect("stream 0");
    let mut got = [0u8; 2];
    within("read", stream.read_exact(&mut got))
        .await
        .expect("data on the accepted stream");
    assert_eq!(&got, b"ok");
    assert!(!session.is_closed());
    drop(stream);
    drop(session);
    drop(peer_read);
    let _ = within("driver ends", driver).await;
}
