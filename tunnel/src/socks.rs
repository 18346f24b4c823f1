//! The SOCKS5 exit (RFC 1928, CONNECT only; with RFC 1929 username and password when asked):
//! every stream starts with a SOCKS5 greeting and request, answered here before the stream is
//! connected to the address requested.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use fast_socks5::server::{PasswordAuthentication, Socks5ServerProtocol, SocksServerError};
use fast_socks5::util::target_addr::TargetAddr;
use fast_socks5::{ReplyError, Socks5Command};
use gomux::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::config::{
    AllowList, Credentials, Handshakes, Priorities, GREETING_TIMEOUT, HANDSHAKE_PLACE_WAIT,
    TARGET_CONNECT_TIMEOUT,
};
use crate::drain::SessionEnd;
use crate::logging::Escaped;
use crate::metrics::ServiceMetrics;
use crate::relay::{carry_with, Carried};

/// The longest SOCKS5 reply: 4 bytes of header, an IPv6 address and a port.
const SOCKS_REPLY_MAX: usize = 4 + 16 + 2;

/// The most read ahead of a SOCKS5 greeting while waiting for it to start.
const READ_AHEAD: usize = 512;

/// The back-off after the first failed password, doubled after each further one until a
/// password is right, up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_millis(50);

/// The longest back-off after a failed password.
pub const BACKOFF_MAX: Duration = Duration::from_secs(3);

/// What every SOCKS5 stream of an exit is served with, shared by all its gomux connections.
pub(crate) struct SocksServer {
    /// The user name and password to ask for, if any.
    pub(crate) credentials: Option<Credentials>,
    /// The targets allowed.
    pub(crate) allow: AllowList,
    /// The streams' send priorities by target.
    pub(crate) priorities: Priorities,
    /// The time and places a handshake has.
    pub(crate) handshakes: Handshakes,
    /// Failed passwords, for the back-off.
    pub(crate) guesses: Guesses,
}

/// The passwords that failed in a row at this exit, across all its connections: each failure
/// is answered only after a back-off that doubles with every failure in a row (from
/// [`BACKOFF_FIRST`] up to [`BACKOFF_MAX`]), and a right password starts over. A guesser
/// holds its stream and its handshake place meanwhile, so a connection with its 64 places
/// tries about 20 passwords a second at most instead of thousands; a right password is
/// answered at once.
#[derive(Default)]
pub(crate) struct Guesses(Mutex<u32>);

impl Guesses {
    /// Counts a failure, and returns how long to wait before answering it.
    pub(crate) fn failed(&self) -> Duration {
        let mut failures = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *failures = failures.saturating_add(1);
        backoff(*failures)
    }

    /// A right password: the count starts over.
    pub(crate) fn succeeded(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = 0;
    }
}

/// The back-off after `failures` failed passwords in a row.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
}

/// The handshake places of one gomux connection: `limit` SOCKS5 handshakes in progress at
/// once, not shared with the exit's other connections.
pub(crate) fn places(handshakes: &Handshakes) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(handshakes.limit))
}

/// Answers the SOCKS5 request at the start of one stream, connects it to the address
/// requested, and relays until both directions are done.
///
/// The greeting offers "no authentication", or only "username/password" (RFC 1929) when the
/// exit has credentials, and the only command served is CONNECT; a host name is resolved here,
/// and only the addresses the allow-list permits are tried. Anything else is answered with the
/// SOCKS5 error that fits, logged once, and the stream closed. Parsing is `fast_socks5`'s: it
/// reads fixed-size fields and lengths of one byte (at most 255 authentication methods, host
/// names, user names and passwords of at most 255 bytes), so a peer cannot make it read or
/// allocate more.
///
/// The greeting must start within [`GREETING_TIMEOUT`]; then it waits up to
/// [`HANDSHAKE_PLACE_WAIT`] for one of the connection's handshake `places`, and holds it
/// until the request is read, within the handshake timeout. A stream that is silent holds no
/// place, so idle connections of strangers at the entry do not keep the clients who speak out.
pub(crate) async fn forward_socks(
    stream: Stream,
    end: SessionEnd,
    server: Arc<SocksServer>,
    places: Arc<Semaphore>,
    service: &ServiceMetrics,
) {
    let mut stream = WholeWrites::new(stream);
    match tokio::time::timeout(GREETING_TIMEOUT, stream.read_ahead()).await {
        Ok(Ok(read)) if read > 0 => {}
        // The client went away.
        Ok(_) => return,
        Err(_) => {
            debug!(timeout = ?GREETING_TIMEOUT, "no SOCKS5 greeting in time; closing the stream");
            return;
        }
    }
    let place = match tokio::time::timeout(HANDSHAKE_PLACE_WAIT, places.acquire_owned()).await {
        Ok(Ok(place)) => place,
        _ => {
            warn!(
                limit = server.handshakes.limit,
                "too many SOCKS5 handshakes in progress on this connection; closing the stream"
            );
            return;
        }
    };
    let request = async {
        let greeted = match &server.credentials {
            None => Socks5ServerProtocol::accept_no_auth(stream).await?,
            Some(credentials) => {
                let (user, password, auth) = Socks5ServerProtocol::start(stream)
                    .negotiate_auth(&[PasswordAuthentication])
                    .await?
                    .read_username_password()
                    .await?;
                if credentials.check(&user, &password) {
                    server.guesses.succeeded();
                    Socks5ServerProtocol::finish_auth(auth.accept().await?)
                } else {
                    tokio::time::sleep(server.guesses.failed()).await;
                    auth.reject().await?;
                    return Err(SocksServerError::AuthenticationRejected);
                }
            }
        };
        greeted.read_command().await
    };
    let timeout = server.handshakes.timeout;
    let (socks, command, requested) = match tokio::time::timeout(timeout, request).await {
        Ok(Ok(request)) => request,
        Ok(Err(SocksServerError::AuthenticationRejected)) => {
            // Answered with the RFC 1929 failure status.
            warn!("wrong SOCKS5 user name or password; closing the stream");
            return;
        }
        Ok(Err(error)) => {
            // Already answered with an error reply where the protocol has one; dropping
            // the stream closes it.
            let error = error.to_string();
            warn!(error = %Escaped(&error), "not a SOCKS5 request this exit serves; closing the stream");
            return;
        }
        Err(_) => {
            warn!(?timeout, "no SOCKS5 request in time; closing the stream");
            return;
        }
    };
    drop(place);
    let requested_text = requested.to_string();
    let shown = Escaped(&requested_text);
    if !matches!(command, Socks5Command::TCPConnect) {
        warn!(?command, requested = %shown, "only SOCKS5 CONNECT is served; refusing");
        let _ = socks.reply_error(&ReplyError::CommandNotSupported).await;
        return;
    }

    let connected = tokio::select! {
        connected = connect_requested(&requested, &server.allow) => connected,
        // As in `forward`.
        () = end.ended.cancelled() => return,
    };
    let socket = match connected {
        Ok(socket) => socket,
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            service.refused("not_allowed");
            warn!(requested = %shown, "the requested address is not allowed (--allow); refusing");
            let _ = socks.reply_error(&ReplyError::ConnectionNotAllowed).await;
            return;
        }
        Err(error) => {
            info!(requested = %shown, %error, "cannot reach the requested address; refusing");
            let _ = socks.reply_error(&socks_reply(&error)).await;
            return;
        }
    };
    // The reply names the address the exit connects from, as RFC 1928 asks.
    let bound = match socket.local_addr() {
        Ok(bound) => bound,
        Err(error) => {
            debug!(%error, "the connection to the requested address failed at once");
            let _ = socks.reply_error(&ReplyError::GeneralFailure).await;
            return;
        }
    };
    let priority = socket
        .peer_addr()
        .map_or(0, |target| server.priorities.of(target));
    let (stream, sent_on) = match socks.reply_success(bound).await {
        Ok(stream) => stream.into_inner(),
        Err(error) => {
            debug!(%error, "the client went away before the SOCKS5 reply");
            return;
        }
    };
    stream.set_priority(priority);
    debug!(requested = %shown, "forwarding");
    let mut socket = socket;
    if !sent_on.is_empty() && socket.write_all(&sent_on).await.is_err() {
        return;
    }
    carry_with(socket, stream, &end, Carried::at_exit(service)).await;
}

/// A gomux stream whose writes are never partial, for `fast_socks5`: it sends each of its
/// replies with a single `write`, which `AsyncWrite` allows to take only part of the bytes, and
/// which a gomux stream does take in part when the room its writer was let in with in the
/// session's queue falls short. What it did not take is kept here and written before anything
/// else is done with the stream: before a read (so a reply is out before the client is waited
/// for), a flush, a shutdown, or the next write.
///
/// It also reads ahead the start of the greeting, so that a silent stream can be told apart
/// before it takes a handshake place; what was read ahead is read first.
struct WholeWrites {
    stream: Stream,
    /// What the stream has not taken yet of an earlier write: at most one SOCKS5 reply.
    rest: Vec<u8>,
    /// What was read ahead and not read yet: at most [`READ_AHEAD`] bytes.
    ahead: Vec<u8>,
}

impl WholeWrites {
    fn new(stream: Stream) -> WholeWrites {
        WholeWrites {
            stream,
            rest: Vec::new(),
            ahead: Vec::new(),
        }
    }

    /// Reads ahead what the client has sent first (0 at the end of the stream).
    async fn read_ahead(&mut self) -> io::Result<usize> {
        let mut first = [0; READ_AHEAD];
        let read = self.stream.read(&mut first).await?;
        self.ahead.extend_from_slice(&first[..read]);
        Ok(read)
    }

    /// The stream, and what was read ahead beyond the request (data a client sent on at
    /// once). Every SOCKS5 reply ends with a flush, so nothing is left to write.
    fn into_inner(self) -> (Stream, Vec<u8>) {
        debug_assert!(self.rest.is_empty(), "taken apart before a flush");
        (self.stream, self.ahead)
    }

    /// Writes what an earlier write left.
    fn poll_rest(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.rest.is_empty() {
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &self.rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.rest.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for WholeWrites {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_rest(cx))?;
        if !this.ahead.is_empty() {
            let n = this.ahead.len().min(buf.remaining());
            buf.put_slice(&this.ahead[..n]);
            this.ahead.drain(..n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WholeWrites {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_rest(cx))?;
        let n = ready!(Pin::new(&mut this.stream).poll_write(cx, data))?;
        // Keep the rest of a reply-sized write; a larger one may stay partial, as its writer
        // has to loop anyway.
        if n < data.len() && data.len() <= SOCKS_REPLY_MAX {
            this.rest.extend_from_slice(&data[n..]);
            return Poll::Ready(Ok(data.len()));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_rest(cx))?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_rest(cx))?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

/// Connects to the address of a SOCKS5 request, resolving a host name here, at the exit, and
/// trying in turn those of its addresses that `allow` permits; all within
/// [`TARGET_CONNECT_TIMEOUT`]. An error of kind `PermissionDenied` when it permits none.
async fn connect_requested(requested: &TargetAddr, allow: &AllowList) -> io::Result<TcpStream> {
    let connecting = async {
        let candidates: Vec<SocketAddr> = match requested {
            TargetAddr::Ip(addr) => vec![*addr],
            TargetAddr::Domain(host, port) => tokio::net::lookup_host((host.as_str(), *port))
                .await?
                .collect(),
        };
        let mut last = io::Error::new(io::ErrorKind::PermissionDenied, "not allowed");
        for addr in candidates.into_iter().filter(|&addr| allow.allows(addr)) {
            match TcpStream::connect(addr).await {
                Ok(socket) => {
                    // As for every connection the tunnel makes: see `relay::connect`.
                    socket.set_nodelay(true)?;
                    return Ok(socket);
                }
                Err(error) => last = error,
            }
        }
        Err(last)
    };
    tokio::time::timeout(TARGET_CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
}

/// The SOCKS5 reply for a failed connect. Names that do not resolve, hosts that do not answer
/// in time and other failures all become "host unreachable", as most SOCKS5 servers answer.
fn socks_reply(error: &io::Error) -> ReplyError {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => ReplyError::ConnectionRefused,
        io::ErrorKind::NetworkUnreachable => ReplyError::NetworkUnreachable,
        _ => ReplyError::HostUnreachable,
    }
}
