//! Making the gomux connection between the two ends: dialling (and dialling again), or
//! accepting, with the handshake that authenticates the other end before any session starts.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gomux::{Role, Session};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{info, info_span, warn, Instrument};

use crate::admission::{Admission, Newcomer};
use crate::config::{mux_config, Handshakes, FIRST_BYTES_TIMEOUT, HANDSHAKE_GRACE};
use crate::drain::{tracked, Shutdown, Work};
use crate::metrics::metrics;
use crate::outage::Outage;
use crate::refusals::{Refusals, PERIOD};
use crate::relay::{accept, connect};
use crate::security::{Connection, Security};

/// How an end meets the other: the end that dials, or the end that accepts, and how the
/// connection between them is secured.
#[derive(Clone)]
pub struct Meeting {
    /// TLS with the pinned peer, or plain TCP.
    pub security: Security,
    /// Bounds on the TLS handshakes of the connections accepted (and the time one dialled may
    /// take to authenticate).
    pub handshakes: Handshakes,
}

/// Dials `addr` and authenticates the other end, all within `redial.dial_timeout` for the TCP
/// connect and `handshakes.timeout` for the handshake.
pub(crate) async fn dial(
    addr: SocketAddr,
    dial_timeout: Duration,
    meeting: &Meeting,
) -> io::Result<Connection> {
    let tcp = connect(addr, dial_timeout).await?;
    let secured = tokio::time::timeout(meeting.handshakes.timeout, meeting.security.dialled(tcp))
        .await
        .map_err(|_| {
            metrics().handshake_failed("timed_out");
            io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake timed out")
        })?;
    if secured.is_err() {
        metrics().handshake_failed("failed");
    }
    secured
}

/// Accepts the other end's connections on `listener` until the shutdown begins (returning
/// closes the listener: the other end's dials are refused from then on). `other` names it in
/// the logs.
///
/// Each connection is authenticated in a task of its own (see [`Security::accepted`]), within
/// the bounds of [`Handshakes`]: its first bytes within [`FIRST_BYTES_TIMEOUT`], the whole
/// handshake within the handshake timeout, and a place among those in progress, which a
/// newcomer may take from it meanwhile (see `admission`). A connection that fails, times
/// out or loses its place is logged with its address (a few lines per address, then a count:
/// see `refusals`) and closed; nothing of the tunnel was reachable through it. Only then does
/// a gomux session start on it, in the server role, and `serve` run it with its number; with
/// `max_sessions`, one beyond that many at once is closed instead.
///
/// This is the one accept loop of both ends: the exit accepting entries (`exit --listen`) and
/// the entry accepting exits (`entry --accept-exit`).
pub(crate) async fn accept_sessions<F, Fut>(
    listener: TcpListener,
    other: &'static str,
    meeting: Meeting,
    max_sessions: Option<usize>,
    shutdown: Shutdown,
    work: Work,
    serve: F,
) where
    F: Fn(u64, Session) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    let handshakes = meeting.handshakes;
    let admission = Admission::new(
        handshakes.limit,
        handshakes.per_source,
        HANDSHAKE_GRACE,
        2 * handshakes.limit,
    );
    let refusals = Refusals::default();
    let sessions = max_sessions.map(|limit| (limit, Arc::new(Semaphore::new(limit))));
    let mut summaries = tokio::time::interval(PERIOD);
    let mut count = 0u64;
    loop {
        let (mut socket, peer) = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => return,
            _ = summaries.tick() => {
                refusals.summarise(&format!("{other} handshakes refused"));
                continue;
            }
            accepted = accept(&listener) => accepted,
        };
        // The place cannot be taken before the task has looked at the connection: a real
        // peer's first bytes may be on their way while the loop accepts strangers.
        let mut admitted = admission.admit(peer, Newcomer::Unchecked);
        if admitted.is_none() && meeting.security.is_pinned() {
            // At the hard bound: a newcomer that has spoken already is still let in.
            let Ok((spoken, talking)) = has_spoken(socket) else {
                continue;
            };
            socket = spoken;
            if talking {
                admitted = admission.admit(peer, Newcomer::Talking);
            }
        }
        let Some((ticket, evicted)) = admitted else {
            if refusals.log_one(peer.ip()) {
                warn!(
                    %peer,
                    limit = handshakes.limit,
                    "too many {other} handshakes in progress; connection refused"
                );
            }
            continue;
        };
        if let Some(evicted) = evicted {
            if refusals.log_one(evicted.peer.ip()) {
                warn!(
                    peer = %evicted.peer,
                    held = ?evicted.held,
                    limit = handshakes.limit,
                    per_address = handshakes.per_source,
                    "{other} handshake unfinished; closed to make room for a newcomer"
                );
            }
        }
        count += 1;
        let number = count;
        let (serve, security, shutdown, refusals, sessions) = (
            Arc::clone(&serve),
            meeting.security.clone(),
            shutdown.clone(),
            refusals.clone(),
            sessions.clone(),
        );
        let task = async move {
            // Plain TCP has no handshake to wait for.
            let socket = if security.is_pinned() {
                match has_spoken(socket) {
                    Ok((socket, spoken)) => {
                        ticket.checked(spoken);
                        socket
                    }
                    Err(_) => return,
                }
            } else {
                ticket.checked(false);
                socket
            };
            let started = tokio::time::Instant::now();
            let deadline = started + handshakes.timeout;
            let handshake = async {
                if security.is_pinned() {
                    // A real peer's ClientHello comes at once: a connection that stays silent
                    // is given up early. (Plain TCP has no handshake to wait for.)
                    let first = started + FIRST_BYTES_TIMEOUT.min(handshakes.timeout);
                    let mut byte = [0; 1];
                    let peeked = tokio::time::timeout_at(first, socket.peek(&mut byte));
                    match peeked.await {
                        Err(_) => return Err(Refused::Silent),
                        Ok(Ok(1)) if byte[0] != TLS_HANDSHAKE_RECORD => {
                            return Err(Refused::NotTls(byte[0]))
                        }
                        Ok(_) => ticket.checked(true),
                    }
                }
                match tokio::time::timeout_at(deadline, security.accepted(socket)).await {
                    Ok(Ok(connection)) => Ok(connection),
                    Ok(Err(error)) => Err(Refused::Failed(error)),
                    Err(_) => Err(Refused::TimedOut),
                }
            };
            let secured = tokio::select! {
                biased;
                () = shutdown.begin.cancelled() => return,
                // Logged by the accept loop.
                () = ticket.evicted.cancelled() => return,
                secured = handshake => secured,
            };
            drop(ticket);
            let connection = match secured {
                Ok(connection) => connection,
                Err(refused) => {
                    metrics().handshake_failed(refused.reason());
                    if refusals.log_one(peer.ip()) {
                        refused.log(other, peer, &handshakes);
                    }
                    return;
                }
            };
            let _place = match sessions {
                None => None,
                Some((limit, sessions)) => match sessions.try_acquire_owned() {
                    Ok(place) => Some(place),
                    Err(_) => {
                        warn!(
                            limit,
                            "too many {other} connections (--max-sessions); closing this one"
                        );
                        return;
                    }
                },
            };
            info!("{other} connected");
            let session = Session::with_config(connection, Role::Server, mux_config());
            serve(number, session).await;
        };
        let span = info_span!("session", session = number, %peer);
        tokio::spawn(tracked(work.sessions.track(), task).instrument(span));
    }
}

/// Whether `socket` has bytes waiting to be read, without waiting or reading them.
fn has_spoken(socket: TcpStream) -> io::Result<(TcpStream, bool)> {
    let socket = socket.into_std()?;
    let mut byte = [0; 1];
    // Non-blocking: `WouldBlock` when nothing has come yet.
    let spoken = matches!(socket.peek(&mut byte), Ok(1));
    Ok((TcpStream::from_std(socket)?, spoken))
}

/// The first byte of a TLS handshake record, which a TLS client's first message starts with.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Why a connection accepted at an exposed listener was refused.
enum Refused {
    /// No byte within [`FIRST_BYTES_TIMEOUT`].
    Silent,
    /// Its first byte is not that of a TLS handshake.
    NotTls(u8),
    /// The TLS handshake failed.
    Failed(io::Error),
    /// The handshake did not finish in time.
    TimedOut,
}

impl Refused {
    /// The reason's label in the metrics.
    fn reason(&self) -> &'static str {
        match self {
            Refused::Silent => "silent",
            Refused::NotTls(_) => "not_tls",
            Refused::Failed(_) => "failed",
            Refused::TimedOut => "timed_out",
        }
    }

    fn log(&self, other: &str, peer: SocketAddr, handshakes: &Handshakes) {
        match self {
            Refused::Silent => warn!(
                %peer,
                timeout = ?FIRST_BYTES_TIMEOUT,
                "{other} handshake timed out: nothing sent; connection refused"
            ),
            Refused::NotTls(byte) => warn!(
                %peer,
                first_byte = format_args!("{byte:#04x}"),
                "{other} handshake failed: not TLS (an end started with --insecure speaks plain \
                 gomux; both ends need --key and --peer-fingerprint, or both --insecure); \
                 connection refused"
            ),
            Refused::Failed(error) => {
                warn!(%peer, %error, "{other} handshake failed; connection refused")
            }
            Refused::TimedOut => warn!(
                %peer,
                timeout = ?handshakes.timeout,
                "{other} handshake timed out; connection refused"
            ),
        }
    }
}

/// How an end makes its gomux connection with the other.
pub enum Peer {
    /// Dial the other end at this address, and again whenever the connection is lost.
    Dial(SocketAddr),
    /// Accept the other end's connections on this listener.
    Accept(TcpListener),
}

/// How an end that dials keeps its connection up.
#[derive(Debug, Clone)]
pub struct Redial {
    /// Wait before the second attempt; each further failure doubles it.
    pub backoff_initial: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// Give up on one attempt after this long: a dial to a host that silently drops packets
    /// would otherwise take minutes to fail.
    pub dial_timeout: Duration,
}

impl Default for Redial {
    fn default() -> Redial {
        Redial {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            dial_timeout: Duration::from_secs(5),
        }
    }
}

/// Dials the other end, again and again, with backoff between failed attempts.
pub(crate) struct Dialler {
    addr: SocketAddr,
    redial: Redial,
    meeting: Meeting,
    /// How many connections have been made, so that logs can tell them apart.
    pub(crate) number: u64,
    delay: Duration,
    /// When the latest connection was made.
    connected_at: Option<Instant>,
    /// Logs the failed dials once per outage.
    outage: Outage,
}

impl Dialler {
    pub(crate) fn new(
        addr: SocketAddr,
        redial: Redial,
        meeting: Meeting,
        other: &'static str,
    ) -> Dialler {
        Dialler {
            addr,
            meeting,
            delay: redial.backoff_initial,
            redial,
            number: 0,
            connected_at: None,
            outage: Outage::new(other),
        }
    }

    /// A new session with the other end, in the client role, once a dial succeeds. Called
    /// again after the previous session has ended.
    pub(crate) async fn connect(&mut self) -> Session {
        if let Some(connected_at) = self.connected_at.take() {
            // A connection that lasted a while was a good one: dial again straight away, the
            // other end was probably restarted. One that died at once (an end that accepts
            // and drops, say) counts as a failed attempt, so the wait keeps growing.
            if connected_at.elapsed() >= self.redial.backoff_max {
                self.delay = self.redial.backoff_initial;
            } else {
                self.pause().await;
            }
        }
        loop {
            match dial(self.addr, self.redial.dial_timeout, &self.meeting).await {
                Ok(socket) => {
                    self.outage.up();
                    self.number += 1;
                    self.connected_at = Some(Instant::now());
                    return Session::with_config(socket, Role::Client, mux_config());
                }
                Err(error) => {
                    let addr = self.addr;
                    self.outage.down(format_args!(
                        "{addr}: {error}; next try in {:?}",
                        self.delay
                    ));
                    self.pause().await;
                }
            }
        }
    }

    async fn pause(&mut self) {
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(self.redial.backoff_max);
    }
}
