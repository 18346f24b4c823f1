//! Allocations per 64 KiB Data frame in steady state: for a sending session, for a receiving
//! session, and for two sessions talking to each other.
//!
//! The standard is that a session allocates nothing per frame once it is warmed up: its buffers
//! grow to their working size during the first frames and are reused from then on. Each case runs
//! on a current-thread runtime, so the session, its driver, the application and the runtime all
//! run on the test's thread; it moves some frames to warm up, then counts every allocation the
//! thread makes while it moves a fixed number of full frames, and asserts there is none.
//!
//! The sender and the receiver are measured alone against a scripted peer: an in-memory
//! transport that follows the frame headers the session writes and answers as a peer obeying the
//! protocol would (credit back for every Data frame received; Data frames sent only within the
//! credit granted), from buffers prepared before counting starts. The combined case runs a client
//! and a server over `tokio::io::duplex`. Every case runs with the protocol's 64 KiB window and
//! with a 1 MiB window, which keeps several frames in flight.
//!
//! The global allocator counts per thread, so tests running in parallel in this binary do not
//! disturb each other's figures. When a case allocates, the failure message carries the
//! backtraces of its first allocations. `cargo test --test alloc -- --nocapture` prints the
//! figures.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use common::within;
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Header, Kind, HEADER_LEN, INITIAL_WINDOW, MAX_LENGTH_FIELD};
use gomux::{Config, Role, Session, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_util::codec::Encoder;

/// Payload of every Data frame: the largest the protocol allows.
const FRAME: usize = 64 * 1024;
/// Frames moved before counting starts. The cases that take longest to warm up are those with
/// a 1 MiB window: their send queue's buffer (and the second one made beside it, for when a
/// batch holds part of the first) grows to its working size, the whole window queued at once
/// (16 frames, 1,048,704 bytes), only when the writer first gets that far ahead of the reader,
/// which this single-threaded run reaches within its first 50 frames (with 20, one allocation
/// is counted). Ten times that leaves room for changes that make it later.
const WARM_UP: u64 = 500;
/// Frames moved while counting.
const FRAMES: u64 = 2000;
/// Frames `both_ends` moves after counting, so that the end of the transfer is not counted:
/// once the writer stops, the driver takes what is left queued (a whole 1 MiB window) in one
/// piece, and its batch buffer grows once to hold it. That is one allocation per transfer, not
/// per frame; the writer keeping on past the counted frames leaves it out.
const TAIL: u64 = 100;
/// The large window the second run of each case uses.
const LARGE_WINDOW: u32 = 1 << 20;
/// Backtraces kept of the first allocations counted.
const TRACES: usize = 4;

// ---------------------------------------------------------------------------------------------
// Counting allocations.

/// The system allocator, counting the allocations of threads that asked for it.
struct CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

thread_local! {
    /// Whether this thread's allocations are being counted.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Allocations (`alloc`, `alloc_zeroed` and `realloc` calls) counted on this thread.
    static CALLS: Cell<u64> = const { Cell::new(0) };
    /// Bytes those calls asked for.
    static BYTES: Cell<u64> = const { Cell::new(0) };
    /// Where the first allocations counted came from.
    static ORIGINS: RefCell<Vec<Backtrace>> = const { RefCell::new(Vec::new()) };
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Counts one allocation of `bytes` if this thread is counting, and keeps a backtrace of the
/// first few. Counting is off while the backtrace is taken, so its own allocations are neither
/// counted nor traced.
fn count(bytes: usize) {
    // `try_with`: a thread that is exiting has lost its locals, and is not counting anyway.
    let _ = COUNTING.try_with(|counting| {
        if !counting.get() {
            return;
        }
        CALLS.set(CALLS.get() + 1);
        BYTES.set(BYTES.get() + bytes as u64);
        counting.set(false);
        ORIGINS.with_borrow_mut(|origins| {
            if origins.len() < TRACES {
                origins.push(Backtrace::force_capture());
            }
        });
        counting.set(true);
    });
}

/// What the test's thread allocated between [`start_counting`] and [`stop_counting`].
struct Tally {
    calls: u64,
    bytes: u64,
    origins: Vec<Backtrace>,
}

fn start_counting() {
    ORIGINS.with_borrow_mut(Vec::clear);
    CALLS.set(0);
    BYTES.set(0);
    COUNTING.set(true);
}

fn stop_counting() -> Tally {
    COUNTING.set(false);
    Tally {
        calls: CALLS.get(),
        bytes: BYTES.get(),
        origins: ORIGINS.take(),
    }
}

/// Prints a case's figures, `units` of `what` moved, and asserts it allocated at most `limit`
/// times per unit while counting.
fn report(case: &str, tally: &Tally, units: u64, what: &str, limit: f64) {
    let per_unit = tally.calls as f64 / units as f64;
    println!(
        "{case}: {units} {what}, {} allocations ({per_unit:.4} each), {} bytes allocated",
        tally.calls, tally.bytes,
    );
    let origins: String = tally
        .origins
        .iter()
        .enumerate()
        .map(|(i, origin)| format!("\nallocation {}:\n{origin}", i + 1))
        .collect();
    assert!(
        per_unit <= limit,
        "{case}: {} allocations for {units} {what} in steady state, more than {limit} each\
         {origins}",
        tally.calls
    );
}

/// Runs `case` with `window` to completion on a fresh current-thread runtime, on this thread,
/// then reports what it allocated.
fn check<F: Future<Output = Tally>>(name: &str, window: u32, case: fn(u32) -> F) {
    let tally = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(within("the case to finish", case(window)));
    let window = match window % (1 << 20) {
        0 => format!("{} MiB", window >> 20),
        _ => format!("{} KiB", window >> 10),
    };
    let case = format!("{name}, {window} window");
    report(&case, &tally, FRAMES, "frames of 64 KiB", 0.0);
}

// ---------------------------------------------------------------------------------------------
// The scripted peer.

/// Follows the frames in a byte stream that arrives in pieces of any size, without keeping
/// payloads.
#[derive(Default)]
struct FrameScanner {
    header: [u8; HEADER_LEN],
    filled: usize,
    /// The Data frame whose payload is being skipped, and how much of it is left.
    data: Option<(Header, usize)>,
}

impl FrameScanner {
    /// Consumes `bytes`, calling `on_frame` with the header of each frame once it is complete.
    fn scan(&mut self, mut bytes: &[u8], mut on_frame: impl FnMut(Header)) {
        while !bytes.is_empty() {
            if let Some((header, left)) = &mut self.data {
                let n = (*left).min(bytes.len());
                bytes = &bytes[n..];
                *left -= n;
                if *left == 0 {
                    on_frame(*header);
                    self.data = None;
                }
                continue;
            }
            let n = (HEADER_LEN - self.filled).min(bytes.len());
            self.header[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == HEADER_LEN {
                self.filled = 0;
                let header = Header::from_bytes(self.header).expect("a defined frame kind");
                match header.kind {
                    Kind::Data if header.length > 0 => {
                        self.data = Some((header, header.length as usize));
                    }
                    _ => on_frame(header),
                }
            }
        }
    }
}

/// What a scripted peer does: it sees each frame the session writes, and offers the bytes it
/// sends in return.
trait Script {
    /// A frame the session wrote.
    fn on_frame(&mut self, header: Header);
    /// The bytes the peer would send now; empty when it waits for the session.
    fn outgoing(&mut self) -> &[u8];
    /// `n` of the outgoing bytes were delivered to the session.
    fn advance(&mut self, n: usize);
}

/// An in-memory transport whose far end is played by a [`Script`]. Writes always complete;
/// reads wait while the script has nothing to send.
struct Peer<S> {
    script: S,
    scanner: FrameScanner,
    reader: Option<Waker>,
}

impl<S: Script> Peer<S> {
    fn new(script: S) -> Peer<S> {
        Peer {
            script,
            scanner: FrameScanner::default(),
            reader: None,
        }
    }
}

impl<S: Script + Unpin> AsyncRead for Peer<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let outgoing = this.script.outgoing();
        if outgoing.is_empty() {
            match &mut this.reader {
                Some(waker) => waker.clone_from(cx.waker()),
                None => this.reader = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        let n = outgoing.len().min(buf.remaining());
        buf.put_slice(&outgoing[..n]);
        this.script.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: Script + Unpin> AsyncWrite for Peer<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let script = &mut this.script;
        this.scanner.scan(bytes, |header| script.on_frame(header));
        if let Some(reader) = this.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The peer of a sending session: it receives Data frames and returns their credit at once,
/// after announcing `window - 64 KiB` more when the stream opens, as a receiver with a larger
/// window does.
struct ReturnCredit {
    window: u32,
    stream: Option<u32>,
    /// Credit to return.
    owed: u32,
    reply: [u8; HEADER_LEN],
    replied: usize,
    /// Full-size Data frames received; shared with the test.
    frames: Arc<AtomicU64>,
}

impl ReturnCredit {
    fn new(window: u32, frames: Arc<AtomicU64>) -> ReturnCredit {
        ReturnCredit {
            window,
            stream: None,
            owed: 0,
            reply: [0; HEADER_LEN],
            replied: HEADER_LEN,
            frames,
        }
    }
}

impl Script for ReturnCredit {
    fn on_frame(&mut self, header: Header) {
        match header.kind {
            Kind::OpenStream => {
                self.stream = Some(header.id);
                self.owed += self.window - INITIAL_WINDOW;
            }
            Kind::Data if Some(header.id) == self.stream => {
                if header.length as usize == FRAME {
                    self.frames.fetch_add(1, Ordering::Relaxed);
                }
                self.owed += header.length;
            }
            _ => {}
        }
    }

    fn outgoing(&mut self) -> &[u8] {
        if let (HEADER_LEN, Some(id)) = (self.replied, self.stream) {
            if self.owed > 0 {
                let credit = self.owed.min(MAX_LENGTH_FIELD);
                self.owed -= credit;
                self.reply = Header {
                    id,
                    length: credit,
                    kind: Kind::WindowUpdate,
                }
                .to_bytes();
                self.replied = 0;
            }
        }
        &self.reply[self.replied..]
    }

    fn advance(&mut self, n: usize) {
        self.replied += n;
    }
}

/// The peer of a receiving session: it opens stream [`PEER_STREAM`] and sends `frames` full
/// Data frames on it, each only once the credit the session granted covers it whole (as a Go
/// sender does).
struct SendWithinCredit {
    /// OpenStream, then one encoded Data frame, which is sent again and again.
    wire: Vec<u8>,
    /// The part of `wire` being sent.
    sending: std::ops::Range<usize>,
    credit: u64,
    frames: u64,
}

/// The stream the scripted client opens.
const PEER_STREAM: u32 = 0;

impl SendWithinCredit {
    fn new(frames: u64) -> SendWithinCredit {
        let mut wire = BytesMut::new();
        let mut codec = FrameCodec::new();
        for frame in [
            Frame::control(PEER_STREAM, Kind::OpenStream),
            Frame::data(PEER_STREAM, vec![0x5a; FRAME]),
        ] {
            codec.encode(frame, &mut wire).expect("an encodable frame");
        }
        SendWithinCredit {
            wire: wire.to_vec(),
            sending: 0..0,
            credit: u64::from(INITIAL_WINDOW),
            frames,
        }
    }
}

impl Script for SendWithinCredit {
    fn on_frame(&mut self, header: Header) {
        if header.kind == Kind::WindowUpdate && header.id == PEER_STREAM {
            self.credit += u64::from(header.length);
        }
    }

    fn outgoing(&mut self) -> &[u8] {
        if self.sending.is_empty() && self.frames > 0 && self.credit >= FRAME as u64 {
            self.credit -= FRAME as u64;
            self.frames -= 1;
            // The first frame goes out behind the OpenStream.
            let start = if self.sending.end == 0 { 0 } else { HEADER_LEN };
            self.sending = start..self.wire.len();
        }
        &self.wire[self.sending.clone()]
    }

    fn advance(&mut self, n: usize) {
        self.sending.start += n;
    }
}

// ---------------------------------------------------------------------------------------------
// The cases.

/// Settings that keep every stream's receive window at `window`. Windows otherwise grow with the
/// measured round trip, which would make the figures depend on timing.
fn fixed_window(window: u32) -> Config {
    Config::default()
        .receive_window(window)
        .max_receive_window(window)
}

/// A client session writes full frames to a peer that returns credit as it receives them.
async fn sender(window: u32) -> Tally {
    let received = Arc::new(AtomicU64::new(0));
    let peer = Peer::new(ReturnCredit::new(window, Arc::clone(&received)));
    let session = Session::client(peer);
    let mut stream = session.open().await.expect("open a stream");
    let chunk = vec![0xa5; FRAME];
    write_frames(&mut stream, &chunk, WARM_UP).await;
    until_received(&received, WARM_UP).await;
    start_counting();
    write_frames(&mut stream, &chunk, FRAMES).await;
    until_received(&received, WARM_UP + FRAMES).await;
    let tally = stop_counting();
    assert_eq!(
        received.load(Ordering::Relaxed),
        WARM_UP + FRAMES,
        "every write went out as one full Data frame"
    );
    tally
}

/// A server session accepts the stream a peer opens and reads full frames from it, granting
/// `window` of credit.
async fn receiver(window: u32) -> Tally {
    let peer = Peer::new(SendWithinCredit::new(WARM_UP + FRAMES));
    let session = Session::with_config(peer, Role::Server, fixed_window(window));
    let mut stream = session.accept().await.expect("accept the peer's stream");
    read_frames(&mut stream).await
}

/// A client session writes 64 KiB at a time over an in-memory pipe to a server session that
/// reads it; both ends are counted, per 64 KiB moved.
async fn both_ends(window: u32) -> Tally {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let client = Session::with_config(a, Role::Client, fixed_window(window));
    let server = Session::with_config(b, Role::Server, fixed_window(window));
    let writer = tokio::spawn(async move {
        let mut stream = client.open().await.expect("open a stream");
        let chunk = vec![0xa5; FRAME];
        for _ in 0..WARM_UP + FRAMES + TAIL {
            stream.write_all(&chunk).await.expect("write a frame");
        }
        // Returned so that nothing closes before the reader is done counting.
        (client, stream)
    });
    let mut stream = server.accept().await.expect("accept the stream");
    let tally = read_frames(&mut stream).await;
    read_bytes(&mut stream, &mut vec![0; FRAME], TAIL).await;
    writer.await.expect("the writer finishes");
    tally
}

/// Writes `frames` full frames, one `chunk` each (returning once they are queued).
async fn write_frames(stream: &mut Stream, chunk: &[u8], frames: u64) {
    for _ in 0..frames {
        stream.write_all(chunk).await.expect("write a frame");
    }
}

/// Lets the driver run until the scripted peer has received `frames` full Data frames. (A
/// stream's `flush` returns once its bytes are queued, not once the transport took them.)
async fn until_received(received: &AtomicU64, frames: u64) {
    let mut polls = 0u32;
    while received.load(Ordering::Relaxed) < frames {
        polls += 1;
        assert!(polls < 1_000_000, "the driver stopped writing");
        tokio::task::yield_now().await;
    }
}

/// Reads `frames` frames' worth of bytes into `buf`, again and again.
async fn read_bytes(stream: &mut Stream, buf: &mut [u8], frames: u64) {
    let mut left = frames * FRAME as u64;
    while left > 0 {
        let n = stream.read(buf).await.expect("read");
        assert_ne!(n, 0, "end of stream with {left} bytes to go");
        left -= n as u64;
    }
}

/// Reads [`WARM_UP`] frames' worth of bytes, then counts allocations while reading [`FRAMES`]
/// frames' worth, into one reused buffer.
async fn read_frames(stream: &mut Stream) -> Tally {
    let mut buf = vec![0; FRAME];
    read_bytes(stream, &mut buf, WARM_UP).await;
    start_counting();
    read_bytes(stream, &mut buf, FRAMES).await;
    stop_counting()
}

#[test]
fn the_counter_sees_allocations_only_while_counting() {
    start_counting();
    let counted = std::hint::black_box(vec![1u8; 100]);
    let tally = stop_counting();
    let uncounted = std::hint::black_box(vec![2u8; 100]);
    assert_eq!((tally.calls, tally.bytes), (1, 100));
    assert_eq!(tally.origins.len(), 1, "a backtrace of the allocation");
    assert_eq!((CALLS.get(), BYTES.get()), (1, 100));
    drop((counted, uncounted));
}

/// Runs each case `async fn name(window: u32) -> Tally` as two tests in a module of the same
/// name: with the protocol's 64 KiB window and with [`LARGE_WINDOW`].
macro_rules! with_both_windows {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            use super::{check, INITIAL_WINDOW, LARGE_WINDOW};

            #[test]
            fn protocol_window() {
                check(stringify!($case), INITIAL_WINDOW, super::$case);
            }

            #[test]
            fn large_window() {
                check(stringify!($case), LARGE_WINDOW, super::$case);
            }
        }
    )*};
}

with_both_windows!(sender, receiver, both_ends);

// ---------------------------------------------------------------------------------------------
// Messages of several sizes, through the copying and the zero-copy APIs.

/// Messages moved while counting, per case.
const MESSAGES: u64 = 4000;

/// How the application moves its messages.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// `write_all` from the application's buffer, `read_exact` into it.
    Copy,
    /// `write_chunk` of a `Bytes` the application holds, `read_chunk` handing out the
    /// session's buffers.
    ZeroCopy,
}

/// A client writes messages of `size` bytes over an in-memory pipe to a server that reads them,
/// both through `path`; both ends are counted.
async fn messages(path: Path, size: usize) -> Tally {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let client = Session::with_config(a, Role::Client, fixed_window(INITIAL_WINDOW));
    let server = Session::with_config(b, Role::Server, fixed_window(INITIAL_WINDOW));
    // Warm up with at least 8 MiB, so that every buffer has reached its working size.
    let total = MESSAGES as usize + (8 << 20) / size;
    let writer = tokio::spawn(async move {
        let mut stream = client.open().await.expect("open a stream");
        let message = bytes::Bytes::from(vec![0xa5; size]);
        for _ in 0..total {
            match path {
                Path::Copy => stream.write_all(&message).await.expect("write"),
                Path::ZeroCopy => stream.write_chunk(message.clone()).await.expect("write"),
            }
        }
        (client, stream)
    });
    let mut stream = server.accept().await.expect("accept the stream");
    let mut buf = vec![0; size];
    let mut tally = None;
    for i in 0..total {
        if i == total - MESSAGES as usize {
            start_counting();
        }
        match path {
            Path::Copy => {
                stream.read_exact(&mut buf).await.expect("read");
            }
            Path::ZeroCopy => {
                let mut left = size;
                while left > 0 {
                    let chunk = stream.read_chunk(left).await.expect("read");
                    left -= chunk.expect("no end of stream yet").len();
                }
            }
        }
    }
    tally.get_or_insert_with(stop_counting);
    writer.await.expect("the writer finishes");
    tally.expect("counted")
}

/// Runs [`messages`] for `path` and `size` and reports allocations per message.
fn check_messages(path: Path, size: usize, limit: f64) {
    let tally = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
        .block_on(within("the case to finish", messages(path, size)));
    let case = format!("{path:?} path, {size} B messages");
    report(
        &case,
        &tally,
        MESSAGES,
        &format!("messages of {size} B"),
        limit,
    );
}

/// Runs [`check_messages`] for both paths at each size, with the bound each path must meet.
macro_rules! message_sizes {
    ($($name:ident: $size:expr, copy <= $copy:expr, zero_copy <= $zero:expr;)*) => {$(
        mod $name {
            use super::{check_messages, Path};

            #[test]
            fn copy() {
                check_messages(Path::Copy, $size, $copy);
            }

            #[test]
            fn zero_copy() {
                check_messages(Path::ZeroCopy, $size, $zero);
            }
        }
    )*};
}

// Small payloads are copied into the stream's own buffer on arrival (and small chunks into the
// outgoing queue). Chunks `read_chunk` hands out share that buffer, which is reused in place
// once they are dropped; drained buffers go to the session's pool. Large payloads stay in the
// read buffer they arrived in. So neither path allocates per message at any size.
message_sizes! {
    messages_64b: 64, copy <= 0.0, zero_copy <= 0.0;
    messages_1kib: 1024, copy <= 0.0, zero_copy <= 0.0;
    messages_64kib: 64 * 1024, copy <= 0.0, zero_copy <= 0.0;
}
