//! The exit: serves the streams of gomux connections from the entry, connecting each one to a
//! fixed target or, in SOCKS5 mode, to the address its request names; within the allow-list.

mod named;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use gomux::{Error, Session, Stream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, info_span, warn, Instrument, Span};

use crate::config::{
    AllowList, Credentials, Handshakes, Limits, Priorities, TARGET_CONNECT_TIMEOUT,
};
use crate::connect::{accept_sessions, Dialler, Meeting, Peer, Redial};
use crate::drain::{
    drain, tracked, AbortOnDrop, SessionEnd, Shutdown, ShutdownReport, Tracked, Work,
};
use crate::metrics::{metrics, ServiceMetrics};
use crate::relay::{carry_with, connect, Carried};
use crate::services::{Lane, Reloader};
use crate::socks::{forward_socks, places, Guesses, SocksServer};

pub(crate) use named::run_named_exit;

/// What an exit may do, and how it dials the entry when it does.
#[derive(Debug, Clone, Default)]
pub struct ExitOptions {
    /// How the exit dials the entry (unused when the entry dials in).
    pub redial: Redial,
    /// The targets it may connect streams to (`--allow`; by default, any).
    pub allow: AllowList,
    /// The SOCKS5 exit's settings (unused with a fixed target).
    pub socks: SocksOptions,
    /// The send priority of each stream, by its target (`--priority`; by default, 0 for all).
    pub priorities: Priorities,
    /// The most gomux connections and streams it serves at once.
    pub limits: Limits,
}

/// How the SOCKS5 exit greets its clients.
#[derive(Debug, Clone, Default)]
pub struct SocksOptions {
    /// The user name and password clients must give (RFC 1929); `None` (the default) asks for
    /// none, and then whoever can open a stream (the entry's clients) may use the proxy.
    pub credentials: Option<Credentials>,
    /// Bounds on the SOCKS5 greetings and requests in progress.
    pub handshakes: Handshakes,
}

/// What every stream of the exit is served with, shared by all its sessions.
struct Serving {
    services: Services,
    /// Bounds on the SOCKS5 handshakes of each session.
    handshakes: Handshakes,
    /// One permit per stream being served, across all sessions.
    streams: Arc<Semaphore>,
    limits: Limits,
}

/// The services of the exit.
enum Services {
    /// The one of the flags: every stream is for it, and carries no preface.
    One(Arc<ExitRun>),
    /// A config file's, by name: each stream names its own in a preface (see `preface`).
    /// Read once per stream; replaced by a reload.
    Named(Table),
}

/// A config-mode exit's services, by name.
type Table = Arc<RwLock<HashMap<String, Arc<ExitRun>>>>;

/// One service of the exit, as its streams are served.
pub(crate) struct ExitRun {
    destination: Destination,
    allow: AllowList,
    priorities: Priorities,
    /// The SOCKS5 server, in SOCKS5 mode.
    socks: Arc<SocksServer>,
    metrics: ServiceMetrics,
    /// Its relays, drained apart when it is removed.
    lane: Lane,
}

impl ExitRun {
    /// A service named `name`.
    pub(crate) fn new(
        name: &str,
        destination: Destination,
        allow: AllowList,
        priorities: Priorities,
        socks: SocksOptions,
    ) -> ExitRun {
        ExitRun {
            destination,
            socks: Arc::new(SocksServer {
                credentials: socks.credentials,
                allow: allow.clone(),
                priorities: priorities.clone(),
                handshakes: socks.handshakes,
                guesses: Guesses::default(),
            }),
            allow,
            priorities,
            metrics: metrics().service(name),
            lane: Lane::default(),
        }
    }
}

/// Where the exit connects its streams.
#[derive(Debug, Clone, Copy)]
pub enum Destination {
    /// Every stream to this target.
    Fixed(SocketAddr),
    /// Each stream to the address its SOCKS5 request names.
    Socks,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destination::Fixed(addr) => addr.fmt(f),
            Destination::Socks => f.write_str("SOCKS5"),
        }
    }
}

/// Runs the exit: serves the streams of gomux connections from entries, connecting each one
/// to `destination`. With `Peer::Accept` it accepts connections from any number of entries;
/// with `Peer::Dial` it dials the entry, and dials again (as `redial` says) whenever the
/// connection is lost.
///
/// Runs until `shutdown` begins, then takes no new gomux connection and dials no more, lets
/// the streams being served finish (refusing new ones) and closes its gomux connections (see
/// [`Shutdown`]), and returns how that went. Dropping the future (or aborting its task) stops
/// the accepting, or the dialling, at once; sessions already accepted then run in their own
/// tasks and finish on their own.
///
/// Every gomux connection is secured as `meeting` says before its session starts: with TLS,
/// the entry must show the pinned certificate, whichever end dials.
pub async fn run_exit(
    entry: Peer,
    destination: Destination,
    options: ExitOptions,
    meeting: Meeting,
    shutdown: Shutdown,
) -> ShutdownReport {
    let handshakes = options.socks.handshakes;
    let service = ExitRun::new(
        "default",
        destination,
        options.allow.clone(),
        options.priorities.clone(),
        options.socks.clone(),
    );
    let services = Services::One(Arc::new(service));
    run_exit_serving(
        entry, services, &options, meeting, shutdown, None, handshakes,
    )
    .await
}

/// Runs the exit with `services`, as [`run_exit`] says; with a reloader, reloads the services
/// of a config-mode exit on each signal.
async fn run_exit_serving(
    entry: Peer,
    services: Services,
    options: &ExitOptions,
    meeting: Meeting,
    shutdown: Shutdown,
    mut reloader: Option<(Reloader, named::Running)>,
    handshakes: Handshakes,
) -> ShutdownReport {
    let serving = Arc::new(Serving {
        services,
        handshakes,
        streams: Arc::new(Semaphore::new(options.limits.streams)),
        limits: options.limits,
    });
    let work = Work::default();
    let connecting = work.sessions.track();
    let _connections = AbortOnDrop(match entry {
        Peer::Accept(listener) => {
            let (shutdown_, work_) = (shutdown.clone(), work.clone());
            let accept = accept_sessions(
                listener,
                "entry",
                meeting,
                Some(options.limits.sessions),
                shutdown.clone(),
                work.clone(),
                move |number, session| {
                    let (serving, shutdown, work) =
                        (Arc::clone(&serving), shutdown_.clone(), work_.clone());
                    async move {
                        metrics().connected();
                        metrics().session_started(number, &session);
                        let (reason, streams) =
                            serve_streams(session.clone(), &serving, &shutdown, &work).await;
                        metrics().session_ended(number, &session);
                        info!(%reason, streams, "entry disconnected");
                    }
                },
            );
            tokio::spawn(tracked(connecting, accept))
        }
        Peer::Dial(addr) => {
            let dialler = Dialler::new(addr, options.redial.clone(), meeting, "entry");
            let dial = dial_entry(dialler, addr, serving, shutdown.clone(), work.clone());
            tokio::spawn(tracked(connecting, dial))
        }
    });
    loop {
        tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => break,
            () = named::reload(&mut reloader, &shutdown, &work) => {}
        }
    }
    work.wind_down(&shutdown).await
}

/// Keeps a gomux connection to the entry up, serving its streams, until the shutdown begins.
async fn dial_entry(
    mut dialler: Dialler,
    addr: SocketAddr,
    serving: Arc<Serving>,
    shutdown: Shutdown,
    work: Work,
) {
    loop {
        let session = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => return,
            session = dialler.connect() => session,
        };
        let span = info_span!("session", session = dialler.number);
        span.in_scope(|| info!(entry = %addr, "connected to the entry"));
        metrics().connected();
        metrics().session_started(dialler.number, &session);
        let (reason, streams) = serve_streams(session.clone(), &serving, &shutdown, &work)
            .instrument(span.clone())
            .await;
        metrics().session_ended(dialler.number, &session);
        if shutdown.begin.is_cancelled() {
            return; // shutting down: no new connection (the drain has logged how it went)
        }
        span.in_scope(|| {
            // A CloseMux: the entry was shut down (or restarted) on purpose.
            if reason.is_graceful() {
                info!(%reason, streams, "connection to the entry closed by the entry");
            } else {
                warn!(%reason, streams, "connection to the entry lost");
            }
        });
    }
}

/// Connects every stream of one gomux connection to `destination`, until the connection ends;
/// once the shutdown begins, drains it. Returns why it ended, and how many streams it carried.
async fn serve_streams(
    session: Session,
    serving: &Arc<Serving>,
    shutdown: &Shutdown,
    work: &Work,
) -> (Error, u64) {
    // Told when the session ends. Not when `accept` fails: a draining session fails it at
    // once, while its streams go on.
    let end = SessionEnd::default();
    let mut streams = 0u64;
    // This session's SOCKS5 handshake places: other sessions' streams cannot take them.
    let socks_places = places(&serving.handshakes);
    let mut refused = 0u64;
    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => {
                drain(&session, shutdown, work, &end).await;
                break;
            }
            accepted = session.accept() => accepted,
        };
        let Ok(stream) = accepted else {
            break; // the session has ended
        };
        streams += 1;
        // The span nests in the session's, so each line names both ids.
        let span = info_span!("stream", stream = stream.id());
        // Taken before the task, so that the streams of all sessions together hold at most
        // the limit of tasks, target connections and buffers; beyond it, a stream is closed
        // at once (dropped, which resets it).
        let Ok(permit) = Arc::clone(&serving.streams).try_acquire_owned() else {
            refused += 1;
            match &serving.services {
                Services::One(service) => service.metrics.refused("max_streams"),
                Services::Named(_) => metrics().refused("", "max_streams"),
            }
            // The first, then one in a thousand: a flood of them is one line per thousand.
            if refused % 1000 == 1 {
                span.in_scope(|| {
                    warn!(
                        limit = serving.limits.streams,
                        refused,
                        "too many streams being served (--max-streams); closing the stream"
                    )
                });
            }
            continue;
        };
        let (end, places) = (end.clone(), Arc::clone(&socks_places));
        let held = Held {
            _permit: permit,
            _relay: work.relays.track(),
        };
        match &serving.services {
            Services::One(service) => {
                spawn_service(stream, Arc::clone(service), end, places, held, span);
            }
            Services::Named(table) => {
                let timeout = serving.handshakes.timeout;
                let named =
                    named::serve_named(stream, Arc::clone(table), end, places, timeout, held);
                tokio::spawn(named.instrument(span));
            }
        }
    }
    let reason = session.closed().await;
    end.ended.cancel();
    (reason, streams)
}

/// What the task of a stream holds until it ends: its place among the streams being served
/// (taken before the task, so that the streams of all sessions together hold at most the limit
/// of tasks, target connections and buffers), and its count among the end's relays.
pub(crate) struct Held {
    _permit: OwnedSemaphorePermit,
    _relay: Tracked,
}

/// Serves one stream of `service` in a task of its own (in `span`): connects it to the
/// service's target, or to the one its SOCKS5 request names, and relays until both directions
/// are done, or until the service, removed, is cut at its drain deadline. Counted as one of
/// the service's clients, and among its relays, meanwhile.
///
/// Each kind of service spawns only the future it needs (an idle stream of a fixed target
/// holds nothing of the SOCKS5 handshake), and watches the cut itself: a wrapping future that
/// took it and awaited it would keep room for it twice (the argument and the future being
/// awaited), and the task is all an idle stream holds besides its sockets.
fn spawn_service(
    stream: Stream,
    service: Arc<ExitRun>,
    end: SessionEnd,
    places: Arc<Semaphore>,
    held: Held,
    span: Span,
) {
    let counted = (held, service.lane.track(), service.metrics.accepted());
    match service.destination {
        Destination::Fixed(target) => {
            let allowed = service.allow.allows(target);
            stream.set_priority(service.priorities.of(target));
            let serve = async move {
                let _counted = counted;
                tokio::select! {
                    biased;
                    () = service.lane.cut.cancelled() => {}
                    () = forward(stream, end, target, allowed, &service.metrics) => {}
                }
            };
            tokio::spawn(serve.instrument(span));
        }
        Destination::Socks => {
            let serve = async move {
                let _counted = counted;
                let server = Arc::clone(&service.socks);
                tokio::select! {
                    biased;
                    () = service.lane.cut.cancelled() => {}
                    () = forward_socks(stream, end, server, places, &service.metrics) => {}
                }
            };
            tokio::spawn(serve.instrument(span));
        }
    }
}

/// Connects one stream to the target and relays until both directions are done. A target the
/// allow-list forbids is not dialled: the stream is closed.
async fn forward(
    mut stream: Stream,
    end: SessionEnd,
    target: SocketAddr,
    allowed: bool,
    service: &ServiceMetrics,
) {
    if !allowed {
        service.refused("not_allowed");
        warn!(%target, "the target is not allowed (--allow); closing the stream");
        let _ = stream.close().await;
        return;
    }
    let connected = tokio::select! {
        connected = connect(target, TARGET_CONNECT_TIMEOUT) => connected,
        // The session ended meanwhile (a shutdown cut it, say): nobody is left to serve.
        () = end.ended.cancelled() => return,
    };
    let socket = match connected {
        Ok(socket) => socket,
        Err(error) => {
            // Close this stream only: its client is closed, the session goes on.
            service.refused("target_unreachable");
            warn!(%target, %error, "cannot reach the target; closing the stream");
            let _ = stream.close().await;
            return;
        }
    };
    debug!("forwarding");
    carry_with(socket, stream, &end, Carried::at_exit(service)).await;
}
