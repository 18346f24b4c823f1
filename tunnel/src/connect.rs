//! Making the gomux connection between the two ends: dialling (and dialling again), or
//! accepting, with the handshake that authenticates the other end before any session starts.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gomux::{Role, Session};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{info, info_span, warn, Instrument};

use crate::config::{mux_config, Handshakes};
use crate::drain::{tracked, Shutdown, Work};
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
    tokio::time::timeout(meeting.handshakes.timeout, meeting.security.dialled(tcp))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake timed out"))?
}

/// Accepts the other end's connections on `listener` until the shutdown begins (returning
/// closes the listener: the other end's dials are refused from then on). `other` names it in
/// the logs.
///
/// Each connection is authenticated in a task of its own (see [`Security::accepted`]), within
/// the handshake timeout and with at most `limit` handshakes in progress: beyond that a new
/// connection is closed at once. A connection that fails, or times out, is logged once with
/// its address and closed; nothing of the tunnel was reachable through it. Only then does a
/// gomux session start on it, in the server role, and `serve` run it with its number.
///
/// This is the one accept loop of both ends: the exit accepting entries (`exit --listen`) and
/// the entry accepting exits (`entry --accept-exit`).
pub(crate) async fn accept_sessions<F, Fut>(
    listener: TcpListener,
    other: &'static str,
    meeting: Meeting,
    shutdown: Shutdown,
    work: Work,
    serve: F,
) where
    F: Fn(u64, Session) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    let handshakes = meeting.handshakes;
    let in_progress = Arc::new(Semaphore::new(handshakes.limit));
    let mut count = 0u64;
    loop {
        let (socket, peer) = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => return,
            accepted = accept(&listener) => accepted,
        };
        let Ok(permit) = Arc::clone(&in_progress).try_acquire_owned() else {
            warn!(%peer, limit = handshakes.limit, "too many handshakes in progress; connection refused");
            continue;
        };
        count += 1;
        let number = count;
        let (serve, security, shutdown) = (
            Arc::clone(&serve),
            meeting.security.clone(),
            shutdown.clone(),
        );
        let task = async move {
            let handshake = tokio::time::timeout(handshakes.timeout, security.accepted(socket));
            let secured = tokio::select! {
                biased;
                () = shutdown.begin.cancelled() => return,
                secured = handshake => secured,
            };
            drop(permit);
            let connection = match secured {
                Ok(Ok(connection)) => connection,
                Ok(Err(error)) => {
                    warn!(%peer, %error, "{other} handshake failed; connection refused");
                    return;
                }
                Err(_) => {
                    warn!(%peer, timeout = ?handshakes.timeout, "{other} handshake timed out; connection refused");
                    return;
                }
            };
            info!("{other} connected");
            let session = Session::with_config(connection, Role::Server, mux_config());
            serve(number, session).await;
        };
        let span = info_span!("session", session = number, %peer);
        tokio::spawn(tracked(work.sessions.track(), task).instrument(span));
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
    /// "exit" or "entry", for the logs.
    other: &'static str,
    /// How many connections have been made, so that logs can tell them apart.
    pub(crate) number: u64,
    delay: Duration,
    /// When the latest connection was made.
    connected_at: Option<Instant>,
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
            other,
            number: 0,
            connected_at: None,
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
                    self.number += 1;
                    self.connected_at = Some(Instant::now());
                    return Session::with_config(socket, Role::Client, mux_config());
                }
                Err(error) => {
                    let (addr, other) = (self.addr, self.other);
                    warn!(%addr, %error, retry_in = ?self.delay, "cannot reach the {other}");
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
