//! The owned halves of a [`Stream`], from [`Stream::into_split`], and [`ReuniteError`].

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::{Handle, Stream};
use crate::error::Error;
use crate::session::core::Inner;
use crate::stopped::Stopped;

/// The reading half of a [`Stream`], from [`Stream::into_split`]; [`reunite`](OwnedReadHalf::reunite)
/// puts the halves back together.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (a, b) = tokio::io::duplex(64 * 1024);
/// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
/// use tokio::io::AsyncReadExt;
///
/// let (mut reader, writer) = client.open().await?.into_split();
/// drop(writer); // the peer reads end-of-stream; this half still reads
/// let mut inbound = server.accept().await?;
/// tokio::io::AsyncWriteExt::write_all(&mut inbound, b"reply").await?;
/// drop(inbound);
/// let mut reply = Vec::new();
/// reader.read_to_end(&mut reply).await?;
/// assert_eq!(reply, b"reply");
/// # Ok(())
/// # }
/// ```
pub struct OwnedReadHalf {
    pub(super) handle: Handle,
}

/// The writing half of a [`Stream`], from [`Stream::into_split`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (a, b) = tokio::io::duplex(64 * 1024);
/// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let (reader, mut writer) = client.open().await?.into_split();
/// drop(reader); // the peer's writes now fail; this half still writes
/// writer.write_all(b"one way").await?;
/// writer.close().await?; // shut down, and wait until it is written
/// let mut inbound = server.accept().await?;
/// let mut text = String::new();
/// inbound.read_to_string(&mut text).await?;
/// assert_eq!(text, "one way");
/// # Ok(())
/// # }
/// ```
pub struct OwnedWriteHalf {
    pub(super) handle: Handle,
}

/// The halves given to [`OwnedReadHalf::reunite`] were not of the same stream; here they are
/// back.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (a, b) = tokio::io::duplex(64 * 1024);
/// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
/// let (read_one, _write_one) = client.open().await?.into_split();
/// let (_read_two, write_two) = client.open().await?.into_split();
/// let error = read_one.reunite(write_two).unwrap_err();
/// let gomux::stream::ReuniteError(read_one, _write_two) = error; // both halves come back
/// assert_eq!(read_one.id(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

impl fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tried to reunite halves of different streams ({} and {})",
            self.0.handle.id, self.1.handle.id
        )
    }
}

impl std::error::Error for ReuniteError {}

impl OwnedReadHalf {
    /// The stream's id on the wire.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (reader, writer) = client.open().await?.into_split();
    /// assert_eq!(reader.id(), writer.id());
    /// # Ok(())
    /// # }
    /// ```
    pub fn id(&self) -> u32 {
        self.handle.id
    }

    /// A snapshot of the stream's figures, as [`Stream::stats`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (reader, _writer) = client.open().await?.into_split();
    /// assert_eq!(reader.stats().buffered, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> crate::StreamStats {
        self.handle.stats()
    }

    /// Stops reading, as [`Stream::close_read`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (mut reader, _writer) = client.open().await?.into_split();
    /// reader.close_read(); // the peer's writes fail from now on
    /// let inbound = server.accept().await?;
    /// assert_eq!(inbound.stopped().await?, gomux::stream::Stopped::ReadClosed);
    /// # Ok(())
    /// # }
    /// ```
    pub fn close_read(&mut self) {
        self.handle.with_driver(|inner, key| inner.close_read(key));
    }

    /// Bytes received and not yet read, as [`Stream::buffered`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use tokio::io::AsyncWriteExt;
    ///
    /// let (reader, _writer) = client.open().await?.into_split();
    /// let mut inbound = server.accept().await?;
    /// inbound.write_all(b"abc").await?;
    /// while reader.buffered() < 3 {
    ///     tokio::task::yield_now().await; // until the driver has read it
    /// }
    /// assert_eq!(reader.buffered(), 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn buffered(&self) -> usize {
        self.handle.buffered()
    }

    /// Puts the halves of one stream back together into a [`Stream`], as tokio's
    /// `OwnedReadHalf::reunite` does for a `TcpStream`.
    ///
    /// # Errors
    ///
    /// [`ReuniteError`], holding both halves, when they are not of the same stream.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let stream = client.open().await?;
    /// let id = stream.id();
    /// let (reader, writer) = stream.into_split();
    /// let stream = reader.reunite(writer)?;
    /// assert_eq!(stream.id(), id);
    /// # Ok(())
    /// # }
    /// ```
    pub fn reunite(mut self, mut other: OwnedWriteHalf) -> Result<Stream, ReuniteError> {
        let same = Arc::ptr_eq(&self.handle.shared, &other.handle.shared)
            && self.handle.key == other.handle.key;
        if !same {
            return Err(ReuniteError(self, other));
        }
        let handle = Handle {
            shared: Arc::clone(&self.handle.shared),
            key: self.handle.key,
            id: self.handle.id,
            reads: self.handle.reads,
            writes: other.handle.writes,
        };
        // The new handle takes over the halves' places among the stream's readers and
        // writers; the halves then go without releasing anything.
        self.handle.reads = false;
        other.handle.writes = false;
        Ok(Stream { handle })
    }

    /// Reads without copying, as [`Stream::read_chunk`].
    ///
    /// # Errors
    ///
    /// As [`Stream::read_chunk`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use tokio::io::AsyncWriteExt;
    ///
    /// let (mut reader, _writer) = client.open().await?.into_split();
    /// let mut inbound = server.accept().await?;
    /// inbound.write_all(b"chunk").await?;
    /// inbound.shutdown().await?;
    /// assert_eq!(reader.read_chunk(1024).await?.as_deref(), Some(&b"chunk"[..]));
    /// assert_eq!(reader.read_chunk(1024).await?, None); // end of stream
    /// # Ok(())
    /// # }
    /// ```
    pub async fn read_chunk(&mut self, max: usize) -> Result<Option<Bytes>, Error> {
        self.handle.read_chunk(max).await
    }
}

impl OwnedWriteHalf {
    /// The stream's id on the wire.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (_reader, writer) = client.open().await?.into_split();
    /// assert_eq!(writer.id(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn id(&self) -> u32 {
        self.handle.id
    }

    /// Sets the priority of what this half sends, as [`Stream::set_priority`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (_reader, writer) = client.open().await?.into_split();
    /// writer.set_priority(3);
    /// assert_eq!(writer.priority(), 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_priority(&self, priority: i32) {
        self.handle.set_priority(priority);
    }

    /// The priority set with [`OwnedWriteHalf::set_priority`] (0 unless changed).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (_reader, writer) = client.open().await?.into_split();
    /// assert_eq!(writer.priority(), 0); // every stream starts at 0
    /// # Ok(())
    /// # }
    /// ```
    pub fn priority(&self) -> i32 {
        self.handle.priority()
    }

    /// A snapshot of the stream's figures, as [`Stream::stats`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (_reader, writer) = client.open().await?.into_split();
    /// println!("{:?}", writer.stats());
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> crate::StreamStats {
        self.handle.stats()
    }

    /// Shuts the writing down (CloseRead: the peer reads end-of-stream) and waits until
    /// everything written on this half, the shutdown included, has been written to the
    /// transport, for at most the session's close timeout. The write half's counterpart of
    /// [`Stream::close`]; the read half keeps reading.
    ///
    /// # Errors
    ///
    /// As [`Stream::close`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// let (mut reader, mut writer) = client.open().await?.into_split();
    /// writer.write_all(b"question").await?;
    /// writer.close().await?; // end-of-stream is on the transport
    /// let mut inbound = server.accept().await?;
    /// let mut question = String::new();
    /// inbound.read_to_string(&mut question).await?;
    /// inbound.write_all(b"answer").await?;
    /// inbound.shutdown().await?;
    /// let mut answer = String::new();
    /// reader.read_to_string(&mut answer).await?; // the read half reads on
    /// assert_eq!((question.as_str(), answer.as_str()), ("question", "answer"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&mut self) -> Result<(), Error> {
        self.handle.close_with(Inner::shutdown).await
    }

    /// Waits until the peer stops taking data, as [`Stream::stopped`].
    ///
    /// # Errors
    ///
    /// As [`Stream::stopped`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (_reader, writer) = client.open().await?.into_split();
    /// drop(server.accept().await?); // the peer closes the stream
    /// assert_eq!(writer.stopped().await?, gomux::stream::Stopped::Closed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn stopped(&self) -> Result<Stopped, Error> {
        self.handle.stopped().await
    }

    /// How the peer stopped taking data, if it has, as [`Stream::peer_stopped`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (_reader, writer) = client.open().await?.into_split();
    /// assert_eq!(writer.peer_stopped(), None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn peer_stopped(&self) -> Option<Stopped> {
        self.handle.peer_stopped()
    }

    /// Writes without copying, as [`Stream::write_chunk`] (not cancel safe).
    ///
    /// # Errors
    ///
    /// As [`Stream::write_chunk`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// let (_reader, mut writer) = client.open().await?.into_split();
    /// writer.write_chunk(bytes::Bytes::from_static(b"no copy")).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn write_chunk(&mut self, chunk: Bytes) -> Result<(), Error> {
        self.handle.write_chunks(&mut [chunk]).await
    }

    /// Writes several chunks without copying, as [`Stream::write_chunks`] (cancel safe).
    ///
    /// # Errors
    ///
    /// As [`Stream::write_chunks`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (a, b) = tokio::io::duplex(64 * 1024);
    /// # let (client, server) = (gomux::Session::client(a), gomux::Session::server(b));
    /// use bytes::Bytes;
    ///
    /// let (_reader, mut writer) = client.open().await?.into_split();
    /// let mut parts = [Bytes::from_static(b"a"), Bytes::from_static(b"b")];
    /// writer.write_chunks(&mut parts).await?;
    /// assert!(parts.iter().all(|part| part.is_empty()));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn write_chunks(&mut self, chunks: &mut [Bytes]) -> Result<(), Error> {
        self.handle.write_chunks(chunks).await
    }
}

impl fmt::Debug for OwnedReadHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedReadHalf")
            .field("id", &self.handle.id)
            .finish()
    }
}

impl fmt::Debug for OwnedWriteHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedWriteHalf")
            .field("id", &self.handle.id)
            .finish()
    }
}
