//! A tokio stream multiplexer speaking the gomux wire protocol.
//!
//! `gomux` carries many independent, bidirectional byte streams over one connection (TCP, TLS,
//! a Unix socket, an in-memory pipe: any `AsyncRead + AsyncWrite`), byte-compatible with the Go
//! implementation (github.com/Acebond/gomux, its unencrypted protocol with the 8-byte header).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let (a, b) = tokio::io::duplex(64 * 1024); // or a TcpStream on each side
//! let client = gomux::Session::client(a);
//! let server = gomux::Session::server(b);
//!
//! // The server echoes every stream it accepts.
//! tokio::spawn(async move {
//!     while let Ok(stream) = server.accept().await {
//!         tokio::spawn(async move {
//!             let (mut reader, mut writer) = stream.into_split();
//!             tokio::io::copy(&mut reader, &mut writer).await?;
//!             writer.shutdown().await
//!         });
//!     }
//! });
//!
//! let mut stream = client.open().await?;
//! stream.write_all(b"hello").await?;
//! stream.shutdown().await?; // half-close: the peer reads end-of-stream
//! let mut echo = Vec::new();
//! stream.read_to_end(&mut echo).await?;
//! assert_eq!(echo, b"hello");
//! client.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Roles
//!
//! The protocol has no handshake: the application tells each end whether it is the
//! [`Role::Client`] (opens even stream ids) or the [`Role::Server`] (odd ids). Either side may
//! open streams; the names say nothing else. Two ends of the same role on one connection would
//! collide on ids.
//!
//! # Sessions and their driver
//!
//! A [`Session`] is a cheap, cloneable handle; one task, the [`Connection`] future, alone reads
//! and writes the transport. [`Session::client`], [`Session::server`] and
//! [`Session::with_config`] spawn it; [`Session::new`] hands it to you (to run it on a runtime
//! of your choice, or to take the transport back with [`Connection::into_inner`]). There is no
//! task and no channel per stream: streams are entries in the session's table, and their
//! handles lock the session's state briefly to read, write or close.
//!
//! The driver never stops reading because the application is slow: received data goes into
//! per-stream buffers bounded by the credit granted, inbound streams beyond the accept backlog
//! are refused, and a transport that blocks writes does not block reads. It stops reading only
//! while its queue of control frames is over its bound, which only a peer that does not read
//! what this side sends can cause (see [`Config`], "Memory bounds").
//!
//! # Several connections: [`Pool`]
//!
//! One session is one driver task, so one connection uses at most one core at each end. A
//! client that carries many streams to one server can spread them over K connections with a
//! [`Pool`]: it makes K client sessions through a connect function of yours (TCP, TLS, ...),
//! opens each stream on the session with the fewest, replaces a session that ends, and backs
//! off from a server that cannot be reached (`open` waits for a session, across a server's
//! restart, up to its open timeout). The server needs nothing special: it accepts K
//! connections and serves each as usual.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), gomux::Error> {
//! // Here the "server" is four in-memory pipes; with TCP, connect and set_nodelay(true).
//! let pool = gomux::Pool::new(4, gomux::Config::default(), || async {
//!     let (client, server) = tokio::io::duplex(64 * 1024);
//!     let server = gomux::Session::server(server);
//!     tokio::spawn(async move { while server.accept().await.is_ok() {} });
//!     Ok(client)
//! });
//! assert_eq!(pool.fill().await, 4);
//! let streams = [pool.open().await?, pool.open().await?];
//! // One stream on each of two sessions: the fewest-first choice spreads them.
//! let busy = pool.sessions().iter().filter(|s| s.session().stream_count() > 0).count();
//! assert_eq!(busy, 2);
//! # drop(streams);
//! pool.close().await
//! # }
//! ```
//!
//! # Reading and writing
//!
//! [`Stream`] implements tokio's `AsyncRead` and `AsyncWrite`, so `tokio::io::copy`, codecs,
//! TLS and HTTP libraries work on it as on a `TcpStream`. [`Stream::into_split`] gives owned
//! halves for two tasks. Beside them, a zero-copy API: [`Stream::read_chunk`] hands out
//! received payload as [`bytes::Bytes`] sharing the buffer it arrived in, and
//! [`Stream::write_chunk`] / [`Stream::write_chunks`] queue the caller's `Bytes` without copying
//! them (the driver writes them with vectored writes).
//!
//! Writes are coalesced: every writer appends frames to one outgoing queue of
//! [`Config::write_buffer_size`] bytes (1 MiB), which the driver writes in large transport
//! writes. That merges what is queued at once, not what comes one write at a time: a lone small
//! frame (a request, a credit update) goes out on its own, and over TCP with Nagle's algorithm
//! on it waits for the peer's acknowledgement of the previous one, which the peer may delay.
//! **Set `TCP_NODELAY`**
//! ([`TcpStream::set_nodelay(true)`](https://docs.rs/tokio/1/tokio/net/struct.TcpStream.html#method.set_nodelay))
//! on both ends of a TCP transport, as HTTP/2 and QUIC stacks do.
//!
//! A writer whose frame would go first (nothing queued, no batch being written, no frame
//! written this way since the driver last ran) on a session whose driver was spawned for you
//! ([`Session::client`] and the other constructors) writes it to the transport itself, with any
//! control frames queued ahead of it, instead of waking the driver task to do it: a request
//! and its response then cost one task wake-up each rather than two (64-byte round trip over
//! loopback TCP: 1.16 to 1.18 × the raw connection's when this came in, against 1.53 to 1.60 ×
//! before; `cargo bench --bench latency -- 'latency/(tcp|gomux-tcp)$'`, two runs each, beside a
//! build without them; 1.12 × in BENCHMARKS.md's run of commit 4ab5e9a). The writer only tries
//! the transport's lock and polls it once: if the driver holds it, or the transport takes only
//! part of the frame, the driver writes the rest before anything else. A session whose
//! [`Connection`] you poll yourself ([`Session::new`]) always queues.
//!
//! Each stream's frames wait in a queue of its own, and the driver builds each transport write
//! by taking turns between the streams with something to send (32 KiB per turn, higher
//! [priorities](Stream::set_priority) first), so a small frame waits for a turn of each busy
//! stream and for the batch being written, never behind what other streams queued before it.
//! A batch's size follows what the transport takes, so over a slow link set up with
//! `gomux::tcp::configure` (feature `tcp`) it stays small. Writers waiting for room in the queues
//! are let in oldest first, with room kept for them. Control frames (credit returned, refusals,
//! closes of streams with nothing queued, keepalives) have a queue of their own, which the
//! driver writes ahead of the data at the start of every batch: a side busy sending keeps
//! returning credit for what it receives.
//!
//! # Flow control
//!
//! Each direction of each stream has a credit window, 64 KiB at the start. A writer waits when
//! its credit is spent; the reader returns credit as the application reads: once half the
//! window is owed, or as soon as the sender holds less than a whole 64 KiB chunk of credit and
//! what was read makes one up (a Go sender waits for room for a whole chunk; with the initial
//! window that is when the stream's buffer is empty). A stream that is not read therefore holds
//! at most its window, and never stops the others.
//!
//! A fixed 64 KiB window carries at most 64 KiB per round trip (1.6 MB/s at 40 ms). So windows
//! tune themselves: a stream whose window, rather than its reader or the link, limits it gets
//! its window doubled, up to [`Config::max_receive_window`] (16 MiB), within a per-session
//! [`Config::receive_window_budget`] (64 MiB) that bounds what a peer can make the session
//! hold. The extra credit is announced with ordinary WindowUpdate frames, which Go peers add
//! to their window like any other.
//!
//! # Closing: half-close, close, drop
//!
//! | what you call | on the wire | this side afterwards | the peer |
//! |---|---|---|---|
//! | `shutdown()` (`AsyncWriteExt`) | CloseRead | can still read | reads end-of-stream after the data |
//! | [`Stream::close_read`] | CloseWrite | reads end, arriving data discarded | its writes fail |
//! | [`Stream::close`] | CloseStream | both ways closed; waits until written | reads end-of-stream, writes fail |
//! | dropping the [`OwnedWriteHalf`](stream::OwnedWriteHalf) | CloseRead | can still read | as for `shutdown()` |
//! | dropping the [`OwnedReadHalf`](stream::OwnedReadHalf) | CloseWrite | can still write | as for `close_read` |
//! | dropping the `Stream` (both halves) | CloseStream | | as for `close` |
//! | [`Session::close`] | CloseMux; the transport is shut down for writing, then read until the peer's CloseMux or end of file | every stream fails with [`Error::ClosedLocally`] (buffered data stays readable) | [`Error::ClosedByPeer`] |
//!
//! Data written before any of these is queued ahead of the close, so it is delivered unless
//! the transport fails. `flush` and `shutdown` return once it is queued, as on a socket (but
//! the queue is in your process: stopping the runtime or the process loses what is still in
//! it); [`Stream::close`] and [`Session::close`] wait until it is written to the transport.
//! When the last [`Session`] handle is dropped, inbound streams are refused and the session
//! closes itself once its last stream is gone.
//!
//! # Refusals, acknowledgements and dead peers
//!
//! The protocol has no handshake, no acknowledgement and no refusal frame, and its keepalive
//! only sends. Between two sessions of this crate three conventions fill the gaps, each
//! invisible to a Go peer:
//!
//! - **A greeting.** Every session's first frame is a Keepalive whose id is
//!   [`frame::GREETING_ID`] and whose length field is its keepalive interval in milliseconds.
//!   A Go peer does nothing with any keepalive. The peer's first frame tells this side whether
//!   it talks to a peer of this crate (it greeted) or not.
//! - **Acknowledgements.** When the application of a greeted peer accepts a stream, its
//!   session sends a WindowUpdate for it (of 0, or of the window above 64 KiB), before any
//!   other frame of the stream. A stream that a greeted peer closes before anything came back
//!   for it never reached its application: its reads, writes and flushes fail with
//!   [`Error::Refused`] (`io::ErrorKind::ConnectionRefused`), which says the request is safe to
//!   retry. A stream that a Go peer closes unanswered reads as an ordinary end of stream,
//!   since a Go peer never refuses and may have handled the request.
//! - **An open backlog.** [`Session::open`] waits while [`Config::open_backlog`] (256) streams
//!   of ours are unacknowledged by a greeted peer, so a burst of opens never overruns its
//!   accept backlog (1024): two sessions of this crate with default settings refuse each other's
//!   streams only when draining, at `max_streams`, or when the application stops accepting for
//!   longer than the backlog covers. Towards a Go peer nothing waits; before the peer's first
//!   frame, opens beyond the backlog wait for it at most one second.
//! - **Liveness.** A greeted peer promises a frame at least every keepalive interval it
//!   announced (it sends a Keepalive after that long without writing). Twice that interval of
//!   silence ends the session with [`Error::KeepaliveTimeout`]: with the defaults (30 s), a
//!   peer of this crate that died, idle or busy, is noticed within 60 s, and every stream and
//!   every writer waiting for its credit learns it. A timer that expires looks once more (50 ms
//!   later) before it believes the silence, so a process resumed from a pause reads what waits
//!   in the socket first. With [`Config::go_peer`] the same holds towards a peer of this
//!   crate. Nothing notices a dead Go peer by default: its keepalive comes only after ten
//!   quiet minutes, and a slow Go reader may return no credit for as long. Set
//!   [`Config::idle_timeout`] above 600 s (see "Talking to Go gomux"),
//!   [`Config::write_stall_timeout`] for a peer that stops reading, or TCP keepalives on the
//!   socket.
//!
//! | the peer | dies idle | dies busy (we wait for its credit) | paused |
//! |---|---|---|---|
//! | this crate, defaults | ≤ 60 s, `KeepaliveTimeout` | ≤ 60 s, `KeepaliveTimeout` | as dead once silent for 60 s |
//! | this crate, `keepalive_interval(None)` at the peer | not noticed | not noticed | not noticed |
//! | Go gomux | not noticed (`idle_timeout` > 600 s notices it) | not noticed (`write_stall_timeout` if our writes stop moving) | not noticed |
//!
//! (Measured on tokio's paused clock by `tests/close_paths.rs`:
//! `a_peer_that_dies_idle_*`, `a_writer_waiting_for_the_credit_of_a_dead_peer_*`,
//! `a_go_like_peer_silent_or_reading_nothing_for_fifteen_minutes_is_not_cut`.)
//!
//! # Cancel safety
//!
//! `read`, `read_chunk`, `write`, `write_chunks`, [`Session::open`] and [`Session::accept`] are
//! cancel safe: a future dropped before it completes has taken or queued nothing (or, for
//! `write_chunks`, exactly what it advanced its argument past). `write_all` and
//! [`Stream::write_chunk`] may have queued a prefix, as `write_all` does everywhere in tokio.
//!
//! # Errors
//!
//! Session and stream operations fail with [`Error`], which is `Clone` (one error that ends a
//! session reaches every stream) and converts into [`std::io::Error`] with a fitting kind
//! where it surfaces through `AsyncRead`/`AsyncWrite`. A peer that breaks the protocol
//! (oversized frame, data beyond its credit, credit overflow, unknown frame kind, duplicate or
//! wrong-parity stream id, data after its close) ends the session with [`Error::Protocol`]
//! carrying a [`ProtocolError`], and the connection is closed after a best-effort CloseMux.
//! Frames for unknown or closed streams are ignored, since they race with local closes. Opening
//! past the stream limit fails that open only ([`Error::TooManyStreams`]).
//!
//! # Configuration, defaults and limits
//!
//! | [`Config`] setter | default | bounds |
//! |---|---|---|
//! | [`max_streams`](Config::max_streams) | 8192 | live streams, both directions |
//! | [`accept_backlog`](Config::accept_backlog) | 1024 | inbound streams waiting for `accept`; more are refused |
//! | [`open_backlog`](Config::open_backlog) | 256 | our streams a peer of this crate has not acknowledged; `open` waits beyond it |
//! | [`receive_window`](Config::receive_window) | 64 KiB | data buffered per stream for a reader that does not read |
//! | [`max_receive_window`](Config::max_receive_window) | 16 MiB | how far one stream's window grows |
//! | [`receive_window_budget`](Config::receive_window_budget) | 64 MiB | growth of all windows together |
//! | [`write_buffer_size`](Config::write_buffer_size) | 1 MiB | outgoing bytes queued before writers wait |
//! | [`max_payload`](Config::max_payload) | 64 KiB | largest Data frame sent or accepted (Go's limit) |
//! | [`keepalive_interval`](Config::keepalive_interval) | 30 s | silence before a Keepalive is sent |
//! | [`idle_timeout`](Config::idle_timeout) | off | silence from the peer before the session ends |
//! | [`close_timeout`](Config::close_timeout) | 10 s | how long a closing session tries to flush, and waits for the peer to close |
//! | [`write_stall_timeout`](Config::write_stall_timeout) | off | how long the transport may take nothing of what waits for it |
//!
//! An idle stream holds no buffer until data arrives. What it costs per end, handles included,
//! depends on what is counted:
//!
//! - **Resident memory: about 250 bytes.** The growth of the process's resident set while the
//!   streams are open, divided by the stream ends: 242–257 bytes over three runs of 8192
//!   streams, 245 and 247 over two of 10,000 (`cargo run --release --example many_streams --
//!   --streams 8192`, the benchmark's setting, or `-- --streams 10000`; its `idle:` line).
//! - **Heap bytes: about 310.** Every byte allocated and not freed while 10,000 streams open,
//!   counted by the allocator, both ends and their handles on one thread: 313 bytes per end
//!   (`cargo test --test idle_stream_memory -- --nocapture`, which fails above 350). It
//!   counts capacity the maps and vectors reserved and have not touched yet, which the
//!   resident set does not.
//!
//! A session that has read and written nothing for a second gives back its read
//! buffer, its outgoing queues and its pool of stream buffers, and keeps only its state; one
//! woken by small frames reads them on the stack and allocates no read buffer. An idle
//! session end with one idle stream costs 2,030 bytes resident (heap in use 1,868), its
//! socket's registration with tokio and its driver task included, against Go gomux's 26,630
//! in the same run (`cargo bench --bench idle_sessions`: 10,000 sessions over loopback TCP),
//! and 1,692 bytes
//! of heap on an in-memory pipe (`cargo test --test idle_memory -- --nocapture`). The
//! resident figure is above the heap's because the allocator cannot give back the pages that
//! a session's long-lived allocations share with freed ones. See [`Config`], "Memory bounds".
//!
//! With a Go peer, start from [`Config::go_peer`]: the defaults with the windows kept at 64 KiB
//! (see the next section).
//!
//! # Talking to Go gomux
//!
//! Before connecting to a Go peer:
//!
//! - Give the two ends different roles: a Go `gomux.Client` talks to a [`Role::Server`]
//!   session, a Go `gomux.Server` to a [`Role::Client`] one (see "Roles" below).
//! - Use [`Config::go_peer`]: windows kept at the 64 KiB a Go peer grants, which makes its
//!   faults below rarer.
//! - Leave [`Config::idle_timeout`] off or above 600 s: a healthy Go peer is silent for 10
//!   minutes at a time.
//! - Let this side end the session, once every stream is finished (each side has read the
//!   other's to end-of-stream), and have the Go side accept streams promptly.
//! - Run it over TLS, or another secure transport, if it crosses a network you do not trust:
//!   the protocol has no encryption of its own.
//!
//! A Go client and this crate's server, one stream each way:
//!
//! ```text
//! // Go: dial, then open streams as a gomux client (even ids).
//! conn, err := net.Dial("tcp", "127.0.0.1:7000")
//! if err != nil { return err }
//! mux, _ := gomux.Client(conn)
//! stream, err := mux.OpenStream()
//! if err != nil { return err }
//! stream.Write([]byte("hello"))
//! stream.CloseWrite()              // kind 3: our end-of-stream
//! reply, _ := io.ReadAll(stream)   // the server's answer, to its end-of-stream
//! stream.Close()
//! ```
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! // Rust: accept the connection, then serve its streams as the server (odd ids).
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7000").await?;
//! let (socket, _) = listener.accept().await?;
//! socket.set_nodelay(true)?;
//! let session = gomux::Session::with_config(socket, gomux::Role::Server, gomux::Config::go_peer());
//! while let Ok(mut stream) = session.accept().await {
//!     let mut request = Vec::new();
//!     stream.read_to_end(&mut request).await?; // until the Go side's CloseWrite
//!     stream.write_all(b"hi from Rust").await?;
//!     stream.shutdown().await?; // the Go side's ReadAll returns
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The wire format is that of github.com/Acebond/gomux at its unencrypted revision (March 2023,
//! 8-byte header); the tests check it against frames and sessions recorded from that code
//! (`tests/go-vectors/`). Encryption and authentication belong under the session: run it over
//! TLS (tokio-rustls) or any other secure transport. The figures below were measured against
//! that Go code, a Go program at one end of a loopback TCP connection and a session of this
//! crate at the other, a fresh connection for every run, on a 2-core Linux machine.
//!
//! ## Roles
//!
//! Either end may dial; what matters is that the applications give the two ends different
//! roles. A Go `gomux.Client` opens even stream ids and talks to a [`Role::Server`] session; a
//! Go `gomux.Server` opens odd ids and talks to a [`Role::Client`] one. A Go peer checks no ids:
//! paired with a session of its own role, the first stream it opens ends this session with
//! [`ProtocolError::WrongParity`], while its `Write` on that stream reports no error.
//!
//! ## Frames and credit
//!
//! Keep [`Config::max_payload`] at its default of 65536: a Go reader fails the session on a
//! larger Data frame. A Go receiver grants each stream 64 KiB of credit and never more, so a
//! stream towards a Go peer carries at most 64 KiB per round trip whatever this side's
//! configuration. The other way, this side grows its windows (up to
//! [`Config::max_receive_window`], 16 MiB by default) and sends the extra credit in WindowUpdate frames, which the Go
//! sender simply adds up. A Go writer can then hold more credit than its session's write
//! buffer (ten 64 KiB frames) has room for, which makes the first fault below much likelier.
//! [`Config::go_peer`] keeps the windows at 64 KiB.
//!
//! ## Keepalive and idle timeout
//!
//! A Go peer sends a Keepalive only after 10 minutes without writing anything, ignores ours
//! (they do not reset its clock), and has no timeout of its own. On an idle session its
//! Keepalives arrived every 600 s, to the second.
//!
//! - [`Config::idle_timeout`] must be above 600 s, or off (the default). At 590 s an idle
//!   session with a healthy Go peer ended with [`Error::IdleTimeout`] after 590.2 s, having
//!   received nothing; at 630 s one stayed up for the 72 minutes it was watched. To notice a
//!   dead Go peer sooner, have the Go application write something more often (a heartbeat on a
//!   stream) and set the timeout above that period.
//! - [`Config::keepalive_interval`] may be anything as far as the Go peer is concerned; the
//!   default of 30 s keeps NAT and proxy state alive.
//! - The Go side notices a dead peer only if the connection fails. A Go session whose peer
//!   process was stopped (SIGSTOP) kept waiting for the 41 minutes it was watched, its
//!   Keepalives written into the socket without error. A Go application that must notice sets
//!   deadlines on its streams or watches the connection itself.
//!
//! ## Faults of the Go implementation
//!
//! The Go code has faults that this crate cannot repair from its side. Each was reproduced
//! with a Go program against a session of this crate; what helps is given with each.
//! `cargo run --release --example go_faults` runs the scenarios of the counts below again, one
//! Go process (the Go peer's `fault` roles, `tests/interop/go/`) and one fresh loopback
//! connection per run (`--help` lists its options; `--config go-peer` runs this side with
//! [`Config::go_peer`]). The counts in the tables came from an earlier program that ran the
//! same scenarios with all runs of a row in one Go process; with each fault, the counts of
//! `go_faults` follow.
//!
//! **A Go session can deadlock as it ends.** Its end (`setErr`: after its `Mux.Close`, the
//! peer's CloseMux or a connection error) takes the session's lock, then each stream's lock.
//! A Go `Write` or `Read` holds its stream's lock while it takes the session's lock to queue a
//! frame (Data, or the credit a read returns), and a `Write` holds it while it waits for room
//! in the write buffer. When the two meet, no Go `Close`, `Write` or `Read` on that session
//! returns again and the Go side never closes the connection. This side is not stuck: after
//! the Go side's CloseMux its session ends as usual, and after its own [`Session::close`] it
//! waits for the Go side to close for [`Config::close_timeout`], then ends (10.0 s in each hung
//! run; a shorter close timeout shortens that wait). Runs in which the Go side hung (still
//! stuck 10 s later; goroutine dumps showed `setErr` waiting for a stream's lock held by a
//! `Write` or `Read`), with Go streams writing 64 KiB writes as fast as their credit allowed,
//! this side reading everything, and the session closed 50 to 300 ms in:
//!
//! | Go streams writing | closed by | defaults | [`Config::go_peer`] |
//! |---|---|---|---|
//! | 1 | the Go side (`Mux.Close`) | 21 of 200 | 0 of 200 |
//! | 1 | this side ([`Session::close`]) | 8 of 200 | 0 of 200 |
//! | 8 | the Go side | | 0 of 100 |
//! | 8 | this side | | 2 of 100, 4 of 250 more |
//! | 16 | the Go side | 97 of 100 | 36 of 100 |
//! | 16 | this side | 59 of 100 | 7 of 100 |
//!
//! `cargo run --release --example go_faults -- --runs 200 --only a --streams 1 --hang-secs 2`
//! (a run counts as hung when its Go process is still running 3 s in and its goroutine dump
//! shows `setErr` waiting while a stream's `Write` or `Read` holds its lock) counted more hangs
//! with the defaults: 93 of 200 closed by the Go side, 24 of 200 by this side; with
//! `--config go-peer`, 1 and 0 of 200. With `--runs 20 --hang-secs 5` and the defaults, 8
//! streams hung in 19 of 20 runs (closed by Go) and 14 of 20 (this side), 16 streams in 18 of
//! 20 and 7 of 20.
//!
//! With 64 KiB windows a Go writer waits for buffer room only when about ten or more streams
//! write at once (their credit then exceeds the buffer); what remains is the race for the two
//! locks, which the dumps of the hung runs with eight streams showed (writers waiting for the
//! session's lock, not for room). Go readers take part too: when a Go side that was reading
//! streams closed its session, 14 of 100 runs hung (15 of 100 with [`Config::go_peer`]), a
//! `Read` returning credit holding the lock. Two Go peers meet the same deadlock: with a Go
//! session at the other end instead of this crate's, the Go side closing hung in 1 of 200
//! runs with one stream writing, 2 of 100 with eight and 21 of 100 with sixteen.
//!
//! What helps: use [`Config::go_peer`] with a Go peer, and end a session only when nothing is
//! being written or read on the Go side: let every stream finish first (each side reads the
//! other's to end-of-stream), then close the session from this side. With 16 Go streams each
//! writing 4 MiB and closing, and this side reading all of them to the end before calling
//! [`Session::close`], no Go side hung in 200 runs, with either configuration.
//!
//! **A Go session can crash as it ends while streams arrive.** Its reader hands every new
//! stream to a channel that the session's end closes; a stream that arrives at that moment,
//! or while the accept queue (256) is full and the reader is blocked on it, makes the reader
//! send on the closed channel, and the Go process dies with "send on closed channel". With this
//! side opening streams in a loop (each writing 16 bytes, then closing) and the Go side calling
//! `Mux.Close` 50 to 300 ms in:
//!
//! - the Go side accepting and reading every stream: 61 of 100 Go processes crashed, and 14
//!   more hung as above (61 and 15 with [`Config::go_peer`]);
//! - the Go side accepting none: 100 of 100 crashed;
//! - this side closing the session instead (300 ms in, while still opening), the Go side
//!   accepting until `AcceptStream` failed and calling `Mux.Close` only then: none of 100
//!   crashed or hung.
//!
//! `cargo run --release --example go_faults -- --runs 100 --only b --hang-secs 2` counted 57
//! crashed and 12 hung of 100, 100 of 100 crashed, and none of 100 crashed or hung.
//!
//! What helps: let the side that opens streams, this one, end the session, or stop opening
//! streams before the Go side ends its own (agree on it in the application protocol); and have
//! the Go side accept streams promptly.
//!
//! **`Mux.Close` can lose the last frames.** It queues CloseMux, waits until its write buffer
//! has been handed to the writer, and closes the connection without waiting for that write to
//! finish. Data the Go side wrote just before, its stream close and its CloseMux may then never
//! arrive: this side's session ends with [`Error::ConnectionClosed`] or a connection reset
//! ([`Error::Transport`]) instead of [`Error::ClosedByPeer`]. With the Go side writing N bytes
//! on a stream, closing the stream and at once the session, runs in which this side did not
//! receive all N bytes:
//!
//! | N | defaults | [`Config::go_peer`] |
//! |---|---|---|
//! | 1000 | 1 of 1000 | 0 of 1000 |
//! | 64 KiB | 1 of 1000 | 0 of 1000 |
//! | 1 MiB | 0 of 1000, 1 of 200 more | 0 of 1000, 0 of 200 more |
//! | 8 MiB | 7 of 1000 | 0 of 1000 |
//!
//! Below 8 MiB the two columns do not differ beyond chance.
//! `cargo run --release --example go_faults -- --runs 1000 --only c` counted, for 1000, 64 KiB,
//! 1 MiB and 8 MiB, 2, 0, 0 and 5 of 1000 with the defaults, and 0, 1, 0 and 0 of 1000 with
//! `--config go-peer`.
//!
//! What helps: the Go side should not close right after writing. Either it waits for an answer
//! (it half-closes with `CloseWrite`, reads this side's reply to end-of-stream, then closes:
//! all data arrived in 1000 of 1000 runs each with 1 MiB and 8 MiB, though once the CloseMux
//! itself was lost and the session ended with [`Error::ConnectionClosed`]), or it leaves the
//! closing to this side (this side reads the stream to its end, then calls [`Session::close`]:
//! all data arrived in 1000 of 1000 runs each with 1 MiB and 8 MiB). On this side, take the end
//! of a session whose Go peer closed it as no proof that everything the peer wrote arrived:
//! only what the application protocol acknowledges has.
//!
//! **Keepalives only every 10 minutes, and no timeout**: see "Keepalive and idle timeout"
//! above.
//!
//! # Features
//!
//! - `tracing`: session and stream events through the `tracing` crate, each with the session's
//!   number and the stream id, and the driver inside a `gomux{session, role}` span.
//! - `futures-io`: re-exports tokio-util's adapters as `gomux::compat`, for `futures::io` users:
//!   `stream.compat()` and `transport.compat()`.
//!
//! # Modules
//!
//! - [`frame`] and [`codec`]: the wire format, usable on their own with `tokio_util`'s `Framed`.
//! - [`Session`], [`Stream`]: the multiplexer. [`Config`]: its knobs and their bounds.
//! - [`Pool`]: a client's streams spread over several sessions to one server.
//!   [`Stats`]: its counters.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(rust_2018_idioms, unreachable_pub, missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod codec;
mod config;
mod error;
mod flow;
pub mod frame;
mod pool;
mod session;
mod stats;
mod stopped;
pub mod stream;
#[cfg(feature = "tcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "tcp")))]
pub mod tcp;
mod trace;

pub use crate::config::{Config, Role};
pub use crate::error::{CodecError, Error, InvalidFrame, ProtocolError};
pub use crate::pool::{Pool, PoolBuilder, PooledSession};
pub use crate::session::{Connection, Incoming, Session};
pub use crate::stats::{Stats, StreamStats};

/// tokio-util's adapters between tokio's and `futures::io`'s I/O traits (feature `futures-io`):
/// `stream.compat()` makes a [`Stream`] a `futures::io::AsyncRead + AsyncWrite`, and
/// `transport.compat()` makes a `futures::io` transport usable under a [`Session`].
#[cfg(feature = "futures-io")]
#[cfg_attr(docsrs, doc(cfg(feature = "futures-io")))]
pub mod compat {
    pub use tokio_util::compat::*;
}
pub use crate::stream::Stream;

#[cfg(test)]
mod tests {
    fn assert_traits<T: Send + Sync + Unpin + 'static>() {}

    #[test]
    fn handles_are_send_sync_unpin_static() {
        assert_traits::<crate::Session>();
        assert_traits::<crate::Pool>();
        assert_traits::<crate::Stream>();
        assert_traits::<crate::stream::OwnedReadHalf>();
        assert_traits::<crate::stream::OwnedWriteHalf>();
        assert_traits::<crate::Error>();
        assert_traits::<crate::Connection<tokio::net::TcpStream>>();
    }
}
