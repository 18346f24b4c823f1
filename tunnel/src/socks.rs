//! The SOCKS5 exit (RFC 1928, CONNECT only; with RFC 1929 username and password when asked):
//! every stream starts with a SOCKS5 greeting and request, answered here before the stream is
//! connected to the address requested.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use fast_socks5::server::{Socks5ServerProtocol, SocksServerError};
use fast_socks5::util::target_addr::TargetAddr;
use fast_socks5::{ReplyError, Socks5Command};
use gomux::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, info, warn};

use crate::config::{AllowList, TARGET_CONNECT_TIMEOUT};
use crate::drain::SessionEnd;
use crate::exit::Serving;
use crate::relay::carry;

/// The longest SOCKS5 reply: 4 bytes of header, an IPv6 address and a port.
const SOCKS_REPLY_MAX: usize = 4 + 16 + 2;

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
/// `permit` counts this handshake among those in progress until the request is read.
pub(crate) async fn forward_socks(
    stream: Stream,
    end: SessionEnd,
    serving: Arc<Serving>,
    permit: OwnedSemaphorePermit,
) {
    let stream = WholeWrites::new(stream);
    let request = async {
        let greeted = match &serving.credentials {
            None => Socks5ServerProtocol::accept_no_auth(stream).await?,
            Some(credentials) => {
                Socks5ServerProtocol::accept_password_auth(stream, |user, password| {
                    credentials.check(&user, &password)
                })
                .await?
                .0
            }
        };
        greeted.read_command().await
    };
    let timeout = serving.socks_timeout;
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
            warn!(%error, "not a SOCKS5 request this exit serves; closing the stream");
            return;
        }
        Err(_) => {
            warn!(?timeout, "no SOCKS5 request in time; closing the stream");
            return;
        }
    };
    drop(permit);
    if !matches!(command, Socks5Command::TCPConnect) {
        warn!(?command, "only SOCKS5 CONNECT is served; refusing");
        let _ = socks.reply_error(&ReplyError::CommandNotSupported).await;
        return;
    }

    let connected = tokio::select! {
        connected = connect_requested(&requested, &serving.allow) => connected,
        // As in `forward`.
        () = end.ended.cancelled() => return,
    };
    let socket = match connected {
        Ok(socket) => socket,
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            warn!(%requested, "the requested address is not allowed (--allow); refusing");
            let _ = socks.reply_error(&ReplyError::ConnectionNotAllowed).await;
            return;
        }
        Err(error) => {
            info!(%requested, %error, "cannot reach the requested address; refusing");
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
        .map_or(0, |target| serving.priorities.of(target));
    let stream = match socks.reply_success(bound).await {
        Ok(stream) => stream.into_inner(),
        Err(error) => {
            debug!(%error, "the client went away before the SOCKS5 reply");
            return;
        }
    };
    stream.set_priority(priority);
    debug!(%requested, "forwarding");
    carry(socket, stream, &end).await;
}

/// A gomux stream whose writes are never partial, for `fast_socks5`: it sends each of its
/// replies with a single `write`, which `AsyncWrite` allows to take only part of the bytes, and
/// which a gomux stream does take in part when the room its writer was let in with in the
/// session's queue falls short. What it did not take is kept here and written before anything
/// else is done with the stream: before a read (so a reply is out before the client is waited
/// for), a flush, a shutdown, or the next write.
struct WholeWrites {
    stream: Stream,
    /// What the stream has not taken yet of an earlier write: at most one SOCKS5 reply.
    rest: Vec<u8>,
}

impl WholeWrites {
    fn new(stream: Stream) -> WholeWrites {
        WholeWrites {
            stream,
            rest: Vec::new(),
        }
    }

    /// The stream. Every SOCKS5 reply ends with a flush, so nothing is left behind.
    fn into_inner(self) -> Stream {
        debug_assert!(self.rest.is_empty(), "taken apart before a flush");
        self.stream
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
