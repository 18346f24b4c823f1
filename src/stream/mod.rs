//! [`Stream`]: one bidirectional byte stream of a session, with tokio's `AsyncRead` and
//! `AsyncWrite`, and its owned halves.
//!
//! # Closing
//!
//! - [`AsyncWriteExt::shutdown`](https://docs.rs/tokio/1/tokio/io/trait.AsyncWriteExt.html#method.shutdown) half-closes: the peer
//!   reads end-of-stream after the data already written (CloseRead, kind 3, on the wire). This
//!   side can still read.
//! - [`Stream::close_read`] tells the peer this side reads no more: its writes fail (CloseWrite,
//!   kind 4). Buffered and arriving data is discarded.
//! - [`Stream::close`] closes both ways (CloseStream, kind 5) and waits until everything written
//!   has reached the transport.
//! - Dropping the stream (both halves, if split) closes it like `close` without waiting. Data
//!   already written is queued ahead of the close, so nothing is lost on this side. It can
//!   still meet a refusal: a peer that drains or closes before its application accepts the
//!   stream throws it away. Towards a peer of this crate the dropped stream keeps its place in
//!   the open backlog until the peer answers, and a refusal is counted in
//!   [`Stats::refused_by_peer`](crate::Stats::refused_by_peer) (and logged at WARN with the
//!   `tracing` feature), but nobody is left to retry the request. To learn the answer, keep
//!   the stream: `shutdown` it and read to the end (a refusal reads as
//!   [`Error::Refused`]), or wait for [`Stream::stopped`].
//! - Dropping only the [`OwnedWriteHalf`] shuts writing down, as `shutdown` does (as tokio's
//!   `OwnedWriteHalf` does on drop); dropping only the [`OwnedReadHalf`] stops reading, as
//!   [`Stream::close_read`] does, so a peer waiting for credit learns that nobody reads.
//!
//! # Flushing
//!
//! A write returns once its bytes are in the stream's send queue, which the driver writes to the
//! transport in order without any further call (or once the writer has written them to the
//! transport itself, when nothing was queued before them); the streams' send queues together
//! are bounded by [`Config::write_buffer_size`](crate::Config::write_buffer_size), and writes
//! wait for room.
//! `flush` and `shutdown` therefore return at once while the session lives, as they do on a
//! `TcpStream`, whose kernel buffer plays the same part. Once the transport has refused a write
//! they fail (as do writes), and once the session has ended they wait for the driver to finish
//! and fail if the stream's bytes were not written.
//!
//! Unlike a kernel buffer, the send queue lives in your process: bytes still in it are lost if the
//! runtime or the process stops. To know that everything reached the transport, close with
//! [`Stream::close`], which waits for it, or end the session with
//! [`Session::close`](crate::Session::close), which writes out the queue first.
//!
//! # Cancel safety
//!
//! Reads and writes are cancel safe: a `read` future dropped before it completes has consumed
//! nothing, and a `write` that did not complete has queued nothing (one that completed queued
//! exactly the bytes it reported). `write_all` is not, as in tokio generally: it may have
//! written part of its buffer.
//!
//! # Errors
//!
//! Operations fail with [`std::io::Error`]s wrapping a [`crate::Error`], with the kinds listed
//! there: writes after this side's shutdown or close give `BrokenPipe` (`WriteClosed`), writes
//! after the peer stopped reading give `BrokenPipe` (`PeerReadClosed`), and everything after the
//! session ended gives the session's error. Reads return the buffered data first, then
//! end-of-stream if the peer half-closed or closed the stream, otherwise the session's error.

pub use crate::stopped::Stopped;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod halves;

pub use self::halves::{OwnedReadHalf, OwnedWriteHalf, ReuniteError};
use crate::error::Error;
use crate::session::core::{Admitted, Inner, Now, Shared};
use crate::session::direct::DirectWrite;

/// One multiplexed stream: `AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static`.
///
/// Reading and writing from two tasks at once works with [`Stream::into_split`] (or
/// [`tokio::io::split`](https://docs.rs/tokio/1/tokio/io/fn.split.html)). See the [module docs](crate::stream) for closing and cancel safety.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (a, b) = tokio::io::duplex(64 * 1024);
/// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let mut request = client.open().await?;
/// request.write_all(b"get /").await?;
/// request.shutdown().await?; // end of the request; the answer can still be read
///
/// let mut inbound = server.accept().await?;
/// let mut text = String::new();
/// inbound.read_to_string(&mut text).await?;
/// inbound.write_all(text.to_uppercase().as_bytes()).await?;
/// drop(inbound); // closes it, after the queued answer
///
/// let mut answer = String::new();
/// request.read_to_string(&mut answer).await?;
/// assert_eq!(answer, "GET /");
/// # Ok(())
/// # }
/// ```
pub struct Stream {
    handle: Handle,
}

/// A counted reference to a stream's state, for reading, writing or both. When the last
/// reading one goes the stream stops reading on the wire, when the last writing one goes it
/// shuts its writing down, and when both are gone it closes.
struct Handle {
    shared: Arc<Shared>,
    key: usize,
    id: u32,
    reads: bool,
    writes: bool,
}

impl Handle {
    /// Runs `f` on the state with this stream's key, waking the driver if needed.
    fn with_driver<R>(&self, f: impl FnOnce(&mut Inner, usize) -> R) -> R {
        self.shared.with_driver(|inner, _| f(inner, self.key))
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let now = Now::later();
        self.with_driver(|inner, key| inner.poll_read(key, cx.waker(), &now, buf))
            .map_err(io::Error::from)
    }

    /// Queues a frame of `data`, or writes it to the transport itself when nothing waits to be
    /// written before it (see `session::direct`).
    fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let direct = self.shared.direct();
        let now = Now::later();
        let admitted = ready!(self.shared.with_driver(|inner, wakers| {
            let now = direct.map(|_| &now);
            inner.poll_write_admit(self.key, cx.waker(), data, now, wakers)
        }))?;
        let n = admitted.n;
        self.write_direct(direct, admitted, &data[..n]);
        Poll::Ready(Ok(n))
    }

    /// Writes an admitted frame, with the control frames that go before it, to the transport
    /// when it was admitted to, and reports what the transport took.
    fn write_direct(&self, io: Option<&dyn DirectWrite>, admitted: Admitted, payload: &[u8]) {
        let (Some(io), Some(mut batch)) = (io, admitted.direct) else {
            return;
        };
        let header = admitted.header;
        let outcome = io.write_frame(
            &mut batch.control,
            &header.to_bytes(),
            payload,
            &batch.waker,
        );
        self.shared.with_driver(|inner, wakers| {
            inner.direct_done(self.key, header, payload, batch, outcome, wakers);
        });
    }

    async fn read_chunk(&self, max: usize) -> Result<Option<Bytes>, Error> {
        poll_fn(|cx| {
            let now = Now::later();
            self.with_driver(|inner, key| inner.poll_read_chunk(key, cx.waker(), &now, max))
        })
        .await
    }

    async fn write_chunks(&self, chunks: &mut [Bytes]) -> Result<(), Error> {
        for chunk in chunks {
            while !chunk.is_empty() {
                let direct = self.shared.direct();
                let (admitted, payload) = poll_fn(|cx| {
                    let now = Now::later();
                    self.shared.with_driver(|inner, wakers| {
                        let now = direct.map(|_| &now);
                        inner.poll_write_chunk_admit(self.key, cx.waker(), chunk, now, wakers)
                    })
                })
                .await?;
                self.write_direct(direct, admitted, &payload);
            }
        }
        Ok(())
    }

    fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shared
            .lock()
            .poll_flush(self.key, cx.waker())
            .map_err(io::Error::from)
    }

    fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with_driver(|inner, key| {
            inner.shutdown(key);
            inner.poll_flush(key, cx.waker())
        })
        .map_err(io::Error::from)
    }

    async fn stopped(&self) -> Result<Stopped, Error> {
        /// The future's slot among the stream's `stopped()` waiters, given back when it goes.
        struct Slot<'a>(&'a Handle, Option<usize>);
        impl Drop for Slot<'_> {
            fn drop(&mut self) {
                if self.1.is_some() {
                    let key = self.0.key;
                    self.0.shared.lock().stop_waiter_gone(key, &mut self.1);
                }
            }
        }
        let mut slot = Slot(self, None);
        poll_fn(|cx| {
            self.shared
                .lock()
                .poll_stopped(self.key, cx.waker(), &mut slot.1)
        })
        .await
    }

    fn peer_stopped(&self) -> Option<Stopped> {
        self.shared.lock().peer_stopped(self.key)
    }

    fn buffered(&self) -> usize {
        self.shared.lock().buffered(self.key)
    }

    fn stats(&self) -> crate::stats::StreamStats {
        self.shared.lock().stream_stats(self.key)
    }

    fn set_priority(&self, priority: i32) {
        self.shared.lock().set_priority(self.key, priority);
    }

    fn priority(&self) -> i32 {
        self.shared.lock().priority(self.key)
    }

    /// Queues `close` (a CloseStream or the write side's shutdown) and waits until the
    /// stream's bytes, that frame included, are written, within the close timeout.
    async fn close_with(&self, close: fn(&mut Inner, usize)) -> Result<(), Error> {
        let limit = self.with_driver(|inner, key| {
            // A session that has ended sends no close frame any more: the close takes effect
            // here (reading stops) but did not happen on the wire, and the caller learns why.
            let ended = inner.end_reason().cloned();
            close(inner, key);
            match ended {
                Some(error) => Err(error),
                None => Ok(inner.config.close_timeout),
            }
        })?;
        let flushed = poll_fn(|cx| {
            self.shared
                .with_driver(|inner, _| inner.poll_written(self.key, cx.waker()))
        });
        match tokio::time::timeout(limit, flushed).await {
            Ok(result) => result,
            Err(_) => Err(Error::Transport(Arc::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "the transport did not take the stream's data within the close timeout",
            )))),
        }
    }

    /// The reading and the writing half of a handle for both: the state counts a `Stream` as
    /// one reader and one writer, so nothing changes there.
    fn split(mut self) -> (Handle, Handle) {
        let write = Handle {
            shared: Arc::clone(&self.shared),
            key: self.key,
            id: self.id,
            reads: false,
            writes: self.writes,
        };
        self.writes = false;
        (self, write)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let (reads, writes) = (self.reads, self.writes);
        self.with_driver(|inner, key| inner.release(key, reads, writes));
    }
}

impl Stream {
    pub(crate) fn new(shared: Arc<Shared>, key: usize, id: u32) -> Stream {
        Stream {
            handle: Handle {
                shared,
                key,
                id,
                reads: true,
                writes: true,
            },
        }
    }

    /// The stream's id on the wire (even when the client opened it, odd for the server).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let first = client.open().await?;
    /// let second = client.open().await?;
    /// assert_eq!((first.id(), second.id()), (0, 2)); // the client's ids are even
    /// assert_eq!(server.accept().await?.id(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn id(&self) -> u32 {
        self.handle.id
    }

    /// Bytes received and not yet read.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// let mut stream = client.open().await?;
    /// stream.write_all(b"12345").await?;
    /// stream.shutdown().await?;
    /// let mut inbound = server.accept().await?;
    /// while inbound.buffered() < 5 {
    ///     tokio::task::yield_now().await; // until the driver has read it
    /// }
    /// assert_eq!(inbound.buffered(), 5);
    /// let mut two = [0; 2];
    /// inbound.read_exact(&mut two).await?;
    /// assert_eq!(inbound.buffered(), 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn buffered(&self) -> usize {
        self.handle.buffered()
    }

    /// Sets the priority of what this stream sends, as quinn's `SendStream::set_priority`:
    /// when several streams have data queued, the driver sends from those of the highest
    /// priority first, and streams of equal priority take turns (round robin, a few KiB per
    /// turn). Every stream starts at 0, so by default none waits behind another's bulk; a
    /// stream raised above the others goes first, and one lowered sends only when no stream
    /// above it has anything to send. Local only: the peer is not told, and the wire does not
    /// change. Takes effect for data already queued.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// let client = gomux::Session::client(a);
    /// let _server = gomux::Session::server(b);
    /// let control = client.open().await?;
    /// control.set_priority(10); // ahead of any bulk transfer on this session
    /// assert_eq!(control.priority(), 10);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_priority(&self, priority: i32) {
        self.handle.set_priority(priority);
    }

    /// The priority set with [`Stream::set_priority`] (0 unless changed).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let stream = client.open().await?;
    /// assert_eq!(stream.priority(), 0);
    /// stream.set_priority(-5); // sends only when no stream above it has anything to send
    /// assert_eq!(stream.priority(), -5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn priority(&self) -> i32 {
        self.handle.priority()
    }

    /// A snapshot of the stream's figures: its waits for credit and for room, its credit, what
    /// it has queued and buffered, its receive window (see [`StreamStats`]).
    ///
    /// [`StreamStats`]: crate::StreamStats
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use tokio::io::AsyncWriteExt;
    ///
    /// let mut stream = client.open().await?;
    /// stream.write_all(&[0; 1000]).await?;
    /// let stats = stream.stats();
    /// println!("{stats:?}");
    /// # drop(server);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> crate::StreamStats {
        self.handle.stats()
    }

    /// Waits until the peer stops taking data on this stream, and says how: it stopped
    /// reading, closed the stream, or refused it (see [`Stopped`]). What quinn's `stopped()`
    /// and h2's `poll_reset` tell, as far as the protocol can: a writer learns it without
    /// having to write, and a stream a peer of this crate refused is told apart from one it
    /// closed (reads and writes of a refused stream fail with
    /// [`Error::Refused`]).
    ///
    /// Any number of tasks may wait on it (sharing the stream through an `Arc`, for
    /// example), and all are woken. Cancel safe: a dropped future leaves nothing behind.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// let (a, b) = tokio::io::duplex(64 * 1024);
    /// let client = gomux::Session::client(a);
    /// let config = gomux::Config::default().accept_backlog(1);
    /// let _server = gomux::Session::with_config(b, gomux::Role::Server, config);
    ///
    /// let first = client.open().await?; // fills the server's backlog of 1
    /// let second = client.open().await?;
    /// assert_eq!(second.stopped().await?, gomux::stream::Stopped::Refused);
    /// # drop(first);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The session's error, when it ended before the peer stopped.
    pub async fn stopped(&self) -> Result<Stopped, Error> {
        self.handle.stopped().await
    }

    /// How the peer stopped taking data on this stream, if it has (see [`Stream::stopped`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let stream = client.open().await?;
    /// assert_eq!(stream.peer_stopped(), None);
    /// let mut inbound = server.accept().await?;
    /// inbound.close_read();
    /// stream.stopped().await?;
    /// assert_eq!(stream.peer_stopped(), Some(gomux::stream::Stopped::ReadClosed));
    /// # Ok(())
    /// # }
    /// ```
    pub fn peer_stopped(&self) -> Option<Stopped> {
        self.handle.peer_stopped()
    }

    /// Stops reading: the peer is told (CloseWrite) and its writes fail; buffered and arriving
    /// data is discarded and reads return end-of-stream. Writing still works.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut upload = client.open().await?;
    /// upload.write_all(b"more than the server wants").await?;
    ///
    /// // The server has read enough: it stops reading, and answers all the same.
    /// let mut inbound = server.accept().await?;
    /// inbound.close_read();
    /// inbound.write_all(b"enough").await?;
    /// inbound.shutdown().await?;
    ///
    /// // The client learns that the server stopped, and still reads the answer.
    /// assert_eq!(upload.stopped().await?, gomux::stream::Stopped::ReadClosed);
    /// assert!(upload.write_all(b"ignored").await.is_err());
    /// let mut answer = String::new();
    /// upload.read_to_string(&mut answer).await?;
    /// assert_eq!(answer, "enough");
    /// # Ok(())
    /// # }
    /// ```
    pub fn close_read(&mut self) {
        self.handle.with_driver(|inner, key| inner.close_read(key));
    }

    /// Closes the stream both ways (CloseStream) and waits until everything written on it,
    /// the close included, has been written to the transport, for at most the session's
    /// [close timeout](crate::Config::close_timeout). Afterwards reads return end-of-stream
    /// and writes fail.
    ///
    /// This is not the `close` of yamux's streams or of `futures::io::AsyncWriteExt`, which
    /// only half-close: after this one the peer's writes fail and whatever it still sends is
    /// discarded, so code ported from yamux that closes and then reads the reply loses the
    /// reply. To send end-of-stream and keep reading, half-close with tokio's `shutdown()`
    /// (which is also what futures' `close()` does through `gomux::compat` when the
    /// `futures-io` feature is on) or [`OwnedWriteHalf::close`].
    ///
    /// # Errors
    ///
    /// The session's error when it ended before the stream's data reached the transport, or
    /// the transport's when it refused a write before then; a
    /// [`Error::Transport`] of kind `TimedOut` when the transport did not take it within the
    /// close timeout (it stays queued, and goes out if the transport recovers).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut stream = client.open().await?;
    /// stream.write_all(b"last words").await?;
    /// // Returns once the data and the close are on the transport.
    /// stream.close().await?;
    ///
    /// // The peer reads what was sent, then end-of-stream; its writes fail.
    /// let mut inbound = server.accept().await?;
    /// let mut text = String::new();
    /// inbound.read_to_string(&mut text).await?;
    /// assert_eq!(text, "last words");
    /// assert!(inbound.write_all(b"too late").await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&mut self) -> Result<(), Error> {
        self.handle.close_with(Inner::close_stream).await
    }

    /// Reads up to `max` received bytes without copying them: the returned [`Bytes`] shares the
    /// buffer the data arrived in. `None` is end of stream. Returns as soon as any data is
    /// buffered, like `read`; with `max` 0 it returns an empty chunk then.
    ///
    /// Cancel safe: a dropped `read_chunk` future has taken nothing.
    ///
    /// # Errors
    ///
    /// As [`AsyncRead`] reads (see the [module docs](crate::stream)), as the crate's [`Error`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), gomux::Error> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let mut stream = client.open().await?;
    /// stream.write_chunk(bytes::Bytes::from_static(b"hello")).await?;
    ///
    /// let mut inbound = server.accept().await?;
    /// let chunk = inbound.read_chunk(64 * 1024).await?;
    /// assert_eq!(chunk.as_deref(), Some(&b"hello"[..]));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_chunk(&mut self, max: usize) -> Result<Option<Bytes>, Error> {
        self.handle.read_chunk(max).await
    }

    /// Writes all of `chunk` without copying it (chunks shorter than 4 KiB are copied, which is
    /// cheaper than sending them as a separate slice). Waits for credit and queue room like
    /// `write_all`; the bytes go out in as many Data frames as credit allows.
    ///
    /// Not cancel safe: a dropped future may have queued a prefix of `chunk`. Use
    /// [`write_chunks`](Stream::write_chunks), which tracks progress in its argument, where
    /// that matters.
    ///
    /// # Errors
    ///
    /// As [`AsyncWrite`] writes (see the [module docs](crate::stream)), as the crate's
    /// [`Error`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use bytes::Bytes;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// let reading = tokio::spawn(async move {
    ///     let mut received = Vec::new();
    ///     server.accept().await?.read_to_end(&mut received).await?;
    ///     std::io::Result::Ok(received)
    /// });
    /// let mut stream = client.open().await?;
    /// // More than the initial window: it goes out as the reader returns credit.
    /// let payload = Bytes::from(vec![7u8; 100_000]);
    /// stream.write_chunk(payload.clone()).await?;
    /// stream.shutdown().await?;
    /// assert_eq!(reading.await??, payload);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn write_chunk(&mut self, chunk: Bytes) -> Result<(), Error> {
        self.handle.write_chunks(&mut [chunk]).await
    }

    /// Writes all of `chunks`, in order, without copying them (see
    /// [`write_chunk`](Stream::write_chunk)).
    ///
    /// Cancel safe in the useful sense: each chunk is advanced past the bytes queued from it,
    /// so when the future is dropped, what is left in `chunks` is exactly what was not sent.
    ///
    /// # Errors
    ///
    /// As [`write_chunk`](Stream::write_chunk); `chunks` then shows what was not queued.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use bytes::Bytes;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// let mut stream = client.open().await?;
    /// let mut parts = [Bytes::from_static(b"header;"), Bytes::from(vec![b'x'; 8192])];
    /// stream.write_chunks(&mut parts).await?;
    /// assert!(parts.iter().all(|part| part.is_empty())); // each advanced past what was queued
    /// stream.shutdown().await?;
    /// let mut received = Vec::new();
    /// server.accept().await?.read_to_end(&mut received).await?;
    /// assert_eq!(received.len(), 7 + 8192);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn write_chunks(&mut self, chunks: &mut [Bytes]) -> Result<(), Error> {
        self.handle.write_chunks(chunks).await
    }

    /// Splits the stream into halves that can be used from different tasks. Dropping the
    /// [`OwnedWriteHalf`] shuts the writing down, as `shutdown` does (and as tokio's
    /// `OwnedWriteHalf` does on drop); dropping the [`OwnedReadHalf`] stops reading, as
    /// [`close_read`](Stream::close_read) does; the stream closes when both are dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// // An echo server: one task copies what each stream reads back into it.
    /// tokio::spawn(async move {
    ///     while let Ok(stream) = server.accept().await {
    ///         let (mut reader, mut writer) = stream.into_split();
    ///         tokio::spawn(async move {
    ///             tokio::io::copy(&mut reader, &mut writer).await?;
    ///             writer.shutdown().await // end-of-stream after the echo
    ///         });
    ///     }
    /// });
    ///
    /// // The client writes from one task and reads from another.
    /// let (mut reader, mut writer) = client.open().await?.into_split();
    /// let sending = tokio::spawn(async move {
    ///     writer.write_all(b"echo me").await?;
    ///     writer.shutdown().await
    /// });
    /// let mut echo = String::new();
    /// reader.read_to_string(&mut echo).await?;
    /// sending.await??;
    /// assert_eq!(echo, "echo me");
    /// # Ok(())
    /// # }
    /// ```
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        let (read, write) = self.handle.split();
        (
            OwnedReadHalf { handle: read },
            OwnedWriteHalf { handle: write },
        )
    }
}

/// Implements tokio's I/O traits for a type by handing each call to its `handle`.
macro_rules! delegate_io {
    (AsyncRead for $ty:ty) => {
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                self.handle.poll_read(cx, buf)
            }
        }
    };
    (AsyncWrite for $ty:ty) => {
        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                data: &[u8],
            ) -> Poll<io::Result<usize>> {
                self.handle.poll_write(cx, data)
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.handle.poll_flush(cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.handle.poll_shutdown(cx)
            }
        }
    };
}

delegate_io!(AsyncRead for Stream);
delegate_io!(AsyncRead for OwnedReadHalf);
delegate_io!(AsyncWrite for Stream);
delegate_io!(AsyncWrite for OwnedWriteHalf);

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("id", &self.handle.id)
            .finish()
    }
}
