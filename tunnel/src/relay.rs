//! Relaying bytes between a TCP connection and a gomux stream (or, in the plain relay,
//! another TCP connection), and the TCP plumbing both ends share.

mod copy;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use gomux::stream::Stopped;
use gomux::{Error, Stream};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info_span, warn, Instrument};

use crate::config::{ACCEPT_RETRY, DELIVERY_GRACE, TARGET_CONNECT_TIMEOUT};
use crate::drain::{tracked, SessionEnd, Shutdown, ShutdownReport, Work};
use crate::logging::say;
use crate::metrics::metrics;
use crate::metrics::ServiceMetrics;
use crate::preface;

/// Runs a plain TCP relay: every connection accepted on `listener` gets its own connection to
/// `target`, and bytes are copied both ways exactly as the tunnel's ends copy them, half-closes
/// included. No gomux: this is the baseline the tunnel is measured against.
///
/// Shuts down as the tunnel's ends do: once `shutdown` begins, the listener is closed and the
/// connections being relayed finish, or are cut at the drain deadline or when the shutdown is
/// cut short.
pub async fn run_relay(
    listener: TcpListener,
    target: SocketAddr,
    shutdown: Shutdown,
) -> ShutdownReport {
    let work = Work::default();
    // Cancelled to cut the connections still being relayed: each one stands alone until then.
    let cut = CancellationToken::new();
    loop {
        let (client, peer) = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => break,
            accepted = accept(&listener) => accepted,
        };
        let cut = cut.clone();
        let relay = async move {
            let connected = tokio::select! {
                connected = connect(target, TARGET_CONNECT_TIMEOUT) => connected,
                () = cut.cancelled() => return,
            };
            match connected {
                Ok(socket) => bridge(client, socket, || cut.cancelled(), [None, None]).await,
                Err(error) => warn!(%target, %error, "cannot reach the target"),
            }
        };
        let span = info_span!("relay", %peer);
        tokio::spawn(tracked(work.relays.track(), relay).instrument(span));
    }
    drop(listener);

    // Without gomux connections to drain, the deadline and the cut are applied here.
    work.connections
        .store(work.relays.count(), Ordering::Relaxed);
    work.log_start(&shutdown);
    tokio::select! {
        () = work.relays.idle() => {}
        () = tokio::time::sleep(shutdown.drain) => {}
        () = shutdown.cut.cancelled() => {}
    }
    // Counted before they are told, so that none ends uncounted.
    work.cut.store(work.relays.count(), Ordering::Relaxed);
    cut.cancel();
    work.relays.idle().await;
    work.report(&shutdown)
}

/// Relays between a TCP connection and a gomux stream until both directions are done, the
/// other end has closed the stream both ways, or the session carrying the stream ends (see
/// [`SessionEnd`]). See `bridge`.
///
/// When the session ends, the relay stops reading the TCP side, whose bytes could not be sent
/// any more, but goes on writing what the stream still holds to it: when the other end
/// drained and closed the connection, that is the end of a reply, which the client would
/// otherwise lose without knowing. Within [`DELIVERY_GRACE`], unless `end.cut` comes first.
pub fn carry<'a, T>(tcp: T, stream: Stream, end: &'a SessionEnd) -> impl Future<Output = ()> + 'a
where
    T: AsyncRead + AsyncWrite + Unpin + 'a,
{
    carry_with(tcp, stream, end, Carried::default())
}

/// What a relay counts, and whether its stream starts with the exit's answer to a preface.
#[derive(Default)]
pub struct Carried {
    /// Counts the bytes read from the TCP side and written to the stream.
    pub from_tcp: Option<Counter>,
    /// Counts the bytes read from the stream and written to the TCP side.
    pub to_tcp: Option<Counter>,
    /// At a config-mode entry: the service the stream's preface named, whose answer the
    /// stream starts with (see `preface`).
    pub answer_of: Option<String>,
}

impl Carried {
    /// What a relay of the entry counts for `service`: its TCP side is the client. With
    /// `answer_of`, the stream starts with the exit's answer to its preface.
    pub fn at_entry(service: &ServiceMetrics, answer_of: Option<String>) -> Carried {
        Carried {
            from_tcp: Some(service.to_target.clone()),
            to_tcp: Some(service.to_client.clone()),
            answer_of,
        }
    }

    /// What a relay of the exit counts for `service`: its TCP side is the target.
    pub fn at_exit(service: &ServiceMetrics) -> Carried {
        Carried {
            from_tcp: Some(service.to_client.clone()),
            to_tcp: Some(service.to_target.clone()),
            answer_of: None,
        }
    }
}

/// As [`carry`], counting the bytes each way, and at a config-mode entry taking the exit's
/// answer to the stream's preface first: a stream the exit refuses closes the client, and is
/// logged with the service's name.
///
/// The relay is the future returned, built here rather than by an async function, which would
/// keep room for its arguments twice (as arguments, and as the values it moves on): while a
/// client is idle, this future is most of what it costs.
pub fn carry_with<'a, T>(
    tcp: T,
    stream: Stream,
    end: &'a SessionEnd,
    carried: Carried,
) -> impl Future<Output = ()> + 'a
where
    T: AsyncRead + AsyncWrite + Unpin + 'a,
{
    // Its wait for `ended` also wakes a read blocked on the TCP side (see `UntilEnded`).
    let stop = move || async move {
        tokio::select! {
            () = async {
                end.ended.cancelled().await;
                tokio::time::sleep(DELIVERY_GRACE).await;
            } => debug!(grace = ?DELIVERY_GRACE, "the client did not take the rest in time"),
            () = end.cut.cancelled() => {}
        }
    };
    let tcp = UntilEnded {
        io: tcp,
        ended: end.ended.clone(),
    };
    let stream = EndsWhenPeerCloses {
        stream,
        answer: carried.answer_of.map(|service| Answer {
            service,
            got: [0; 2],
            filled: 0,
        }),
    };
    bridge(tcp, stream, stop, [carried.from_tcp, carried.to_tcp])
}

/// Relays between a TCP connection and a gomux stream (or, in the relay, another TCP
/// connection) until both directions are done, or the future `stop` makes resolves (made when
/// the relay starts, and held once: in the relay's own state).
///
/// Half-closes travel through: when one side reads end-of-file, the other side's write half is
/// shut down (a TCP FIN one way, a gomux CloseRead the other), and the other direction keeps
/// flowing until it ends too. Any error ends both.
///
/// A relay holds no buffer while nothing moves: each read borrows one from a shared pool and
/// gives it back once its bytes are written (see `copy`), so an idle client costs the tunnel
/// its sockets and the stream's state, not buffers.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
fn bridge<A, B, S>(
    mut tcp: A,
    mut stream: B,
    stop: impl FnOnce() -> S,
    counters: [Option<Counter>; 2],
) -> impl Future<Output = ()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
    S: Future<Output = ()>,
{
    // The sides are used where the block holds them, not moved into locals of its own.
    async move {
        let relay = copy::copy_both_ways(&mut tcp, &mut stream, counters);
        tokio::select! {
            result = relay => match result {
                Ok((to_mux, from_mux)) => debug!(to_mux, from_mux, "done"),
                Err(error) => debug!(%error, "ended by an error"),
            },
            // A direction blocked reading a TCP side would not notice the end of the session,
            // or of the relay, until that side sent something, which could be never: stop now.
            () = stop() => debug!("stopped"),
        }
        // Returning drops both: the TCP connection closes, and the stream sends its close.
    }
}

/// The TCP side of a relay, which reads as ended once the session carrying the stream has
/// (`ended` is cancelled): nothing it sends could go anywhere. The relay then shuts the stream
/// down, which [`EndsWhenPeerCloses`] lets succeed, and goes on with the other direction, the
/// rest of the stream, untouched. (Dropping the relay instead would lose what it holds.)
///
/// It registers no waker of its own on `ended`: the relay's stop future (see [`carry_with`])
/// waits for `ended` in the same task, and each wake polls the relay again, whose read then
/// finds `ended` cancelled. A read blocked on the TCP side thus wakes when the session ends,
/// at no cost per client beyond the stop future's.
struct UntilEnded<T> {
    io: T,
    ended: CancellationToken,
}

impl<T: AsyncRead + Unpin> AsyncRead for UntilEnded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.ended.is_cancelled() {
            return Poll::Ready(Ok(())); // end of file
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for UntilEnded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A gomux stream whose end of data counts as an error when the other end has also stopped
/// reading it: the other end closed the stream both ways (it refused it, its connection to the
/// target failed, or its client went away), so nothing more can go either way.
///
/// Without this, [`bridge`] would pass the end of data on as a half-close and keep waiting for
/// the TCP side to send (only to find the stream closed) or to close, which a client waiting
/// for an answer may never do. As an error, it ends the relay at once and closes the TCP
/// connection.
///
/// The session tells how the other end stopped ([`Stream::peer_stopped`]); a refusal (the
/// other end is shutting down, or its accept backlog was full) is logged, since it says why
/// the client was turned away.
///
/// At a config-mode entry, it first takes the exit's two-byte answer to the stream's preface
/// (see `preface`), which the client never sees: a refusal ends the relay with an error,
/// logged with the service's name.
struct EndsWhenPeerCloses {
    stream: Stream,
    answer: Option<Answer>,
}

/// The exit's answer to a preface, as far as it has come.
struct Answer {
    service: String,
    got: [u8; 2],
    filled: usize,
}

impl Answer {
    /// Reads the rest of the answer: `Ready(Ok(true))` once it has come and says the exit
    /// relays the stream, `Ready(Ok(false))` when the stream ended first.
    fn poll_take(&mut self, cx: &mut Context<'_>, stream: &mut Stream) -> Poll<io::Result<bool>> {
        while self.filled < self.got.len() {
            let mut read = ReadBuf::new(&mut self.got[self.filled..]);
            ready!(Pin::new(&mut *stream).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(false));
            }
            self.filled += n;
        }
        let service = &self.service;
        match self.got {
            [preface::MAGIC, preface::ACCEPTED] => Poll::Ready(Ok(true)),
            [preface::MAGIC, preface::UNKNOWN] => {
                metrics().refused(service, "unknown_service");
                warn!(%service, "the exit has no such service; closing the client");
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("the exit has no service {service:?}"),
                )))
            }
            got => {
                metrics().refused(service, "no_answer");
                warn!(
                    %service,
                    answer = ?got,
                    "the exit did not answer the service preface (is it run with flags rather \
                     than --config? the two modes do not mix); closing the client"
                );
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the exit did not answer the service preface",
                )))
            }
        }
    }
}

impl AsyncRead for EndsWhenPeerCloses {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let stream = &mut this.stream;
        if let Some(answer) = &mut this.answer {
            if ready!(answer.poll_take(cx, stream))? {
                this.answer = None;
            }
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut *stream).poll_read(cx, buf))?;
        let end_of_data = buf.filled().len() == before && buf.remaining() > 0;
        if end_of_data {
            match stream.peer_stopped() {
                Some(Stopped::Refused) => {
                    warn!(
                        "the other end refused the stream (it is shutting down, or its accept \
                         backlog is full)"
                    );
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "the other end refused the stream",
                    )));
                }
                // Closed, or done sending and no longer reading: nothing more can go either way.
                Some(_) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "the other end closed the stream",
                    )));
                }
                None => {}
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for EndsWhenPeerCloses {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = ready!(Pin::new(&mut self.get_mut().stream).poll_flush(cx));
        Poll::Ready(done_if_session_ended(result))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = ready!(Pin::new(&mut self.get_mut().stream).poll_shutdown(cx));
        Poll::Ready(done_if_session_ended(result))
    }
}

/// A flush or shutdown that failed because the session has ended counts as done: the write
/// half is closed with the session. As an error, it would end the relay, and with it the other
/// direction, which may still be delivering what the stream holds (see [`carry`]).
fn done_if_session_ended(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(error) if Error::from_io(&error).is_some_and(Error::is_session_end) => Ok(()),
        other => other,
    }
}

/// Binds `addr`, and prints `listening NAME ADDR` with the address bound.
pub(crate) async fn bind(addr: &str, name: &str) -> Result<TcpListener, String> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    // Whoever started us may not read it; that is no reason to stop.
    say(format_args!("listening {name} {bound}"));
    Ok(listener)
}

/// Resolves a `host:port` once at start-up; the tunnel then always dials that address.
pub(crate) async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let mut found = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?;
    found
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

/// Dials `addr` with Nagle's algorithm off, giving up after `limit`.
pub(crate) async fn connect(addr: SocketAddr, limit: Duration) -> io::Result<TcpStream> {
    let socket = tokio::time::timeout(limit, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    // gomux frames and request/response protocols both write small messages: without
    // TCP_NODELAY, Nagle's algorithm holds them back for an acknowledgement.
    socket.set_nodelay(true)?;
    Ok(socket)
}

/// Accepts the next connection, with Nagle's algorithm off. A failed accept (out of file
/// descriptors, a connection reset while it waited in the backlog) ends nothing: it is logged
/// and the listener tried again after a pause.
pub(crate) async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => match socket.set_nodelay(true) {
                Ok(()) => return (socket, peer),
                // Only a connection that is already gone refuses the option.
                Err(error) => debug!(%peer, %error, "dropping a connection that failed at once"),
            },
            Err(error) => {
                warn!(%error, "accept failed; retrying");
                tokio::time::sleep(ACCEPT_RETRY).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gomux::Session;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Once the session carrying the stream has ended, the relay stops reading a client that
    /// sends nothing and never closes: with the rest of the stream delivered, it ends at once,
    /// not when the delivery grace runs out (the paused clock would jump there if the relay
    /// waited).
    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_not_read_once_the_session_has_ended() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (opener, acceptor) = (Session::client(a), Session::server(b));
        let mut stream = opener.open().await.expect("open");
        stream.write_all(b"?").await.expect("first bytes");
        let mut peer = acceptor.accept().await.expect("accept");
        let mut first = [0; 1];
        peer.read_exact(&mut first).await.expect("first bytes");
        // The other end sends the rest of its reply and is done sending; it still reads.
        peer.write_all(b"the rest").await.expect("reply");
        peer.shutdown().await.expect("half-close");

        let (mut client, relayed) = tokio::io::duplex(1024);
        let end = SessionEnd::default();
        let started = tokio::time::Instant::now();
        let relay = carry(relayed, stream, &end);
        let ending = async {
            let mut reply = Vec::new();
            client.read_to_end(&mut reply).await.expect("the reply");
            assert_eq!(reply, b"the rest");
            // The client neither sends nor closes: only the session's end can stop the relay
            // reading it.
            end.ended.cancel();
        };
        tokio::join!(relay, ending);
        assert!(
            started.elapsed() < DELIVERY_GRACE,
            "the relay waited {:?} for the client",
            started.elapsed()
        );
    }
}
