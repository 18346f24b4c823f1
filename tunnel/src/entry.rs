//! The entry: accepts TCP clients and carries each one as a gomux stream to the exit.

pub(crate) mod named;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use gomux::{Error, Pool, PooledSession, Session, Stream};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument, Span};

use crate::admission::{Admission, Newcomer, Ticket};
use crate::config::{
    mux_config, DEFAULT_EXIT_WAIT, SILENT_CLIENTS, SILENT_GRACE, SILENT_PER_CLIENT,
};
use crate::connect::{accept_sessions, dial, Meeting, Peer, Redial};
use crate::drain::{
    drain, tracked, AbortOnDrop, SessionEnd, Shutdown, ShutdownReport, Tracked, Work,
};
use crate::metrics::{metrics, ServiceMetrics};
use crate::outage::Outage;
use crate::preface;
use crate::refusals::{Refusals, PERIOD};
use crate::relay::{accept, carry_with, Carried};
use crate::services::Lane;
use crate::socks_watch::Watched;
use crate::turn_away::refuse_socks;

/// How the entry keeps its connections to the exit, and how long clients wait for one.
#[derive(Debug, Clone)]
pub struct EntryOptions {
    /// How the entry dials the exit (unused when the exit dials in).
    pub redial: Redial,
    /// How many connections the entry keeps to the exit when it dials it (`--connections`).
    pub connections: usize,
    /// How long a new client waits for a connection to the exit before it is turned away
    /// (`--exit-wait`; zero turns it away at once).
    pub client_wait: Duration,
    /// Whether the clients speak SOCKS5 to the exit (`entry --socks`): a client turned away
    /// gets a SOCKS5 failure reply rather than a silent close.
    pub socks: bool,
}

impl Default for EntryOptions {
    fn default() -> EntryOptions {
        EntryOptions {
            redial: Redial::default(),
            connections: 1,
            client_wait: DEFAULT_EXIT_WAIT,
            socks: false,
        }
    }
}

/// One gomux connection to the exit. `number` counts the connections this entry has had, so
/// logs can tell them apart and a client can wait for a *newer* one than a connection that
/// just failed it.
#[derive(Clone)]
struct Link {
    number: u64,
    session: Session,
    /// Tells the clients it carries that it has ended.
    end: SessionEnd,
}

/// Runs the entry: accepts clients on `clients` and carries each one as a stream over a gomux
/// connection to the exit. Either the entry dials the exit, keeping `options.connections` of
/// them in a [`Pool`] (each client goes to the one with the fewest, and one that is lost is
/// dialled again), or the exit dials in (`Peer::Accept`; the latest connection carries new
/// clients).
///
/// Runs until `shutdown` begins, then closes its listeners, dials no more, lets the clients
/// being relayed finish and closes its gomux connections (see [`Shutdown`]), and returns how
/// that went. Dropping the future (or aborting its task) stops the dialling, or the accepting
/// of exits, at once; client connections already being forwarded then run in their own tasks
/// and finish on their own.
///
/// Every gomux connection is secured as `meeting` says before its session starts: with TLS,
/// the exit must show the pinned certificate, whichever end dials.
pub async fn run_entry(
    clients: TcpListener,
    exit: Peer,
    options: EntryOptions,
    meeting: Meeting,
    shutdown: Shutdown,
) -> ShutdownReport {
    run_entry_with(Clients::One(clients), exit, options, meeting, shutdown).await
}

/// Where the entry's clients come from.
pub(crate) enum Clients {
    /// The one listener of the flags: its streams carry no preface.
    One(TcpListener),
    /// A config file's named services, each on its own listener, reloaded on signals.
    Named(Box<named::Named>),
}

/// Runs the entry, as [`run_entry`] says, with the clients of `clients`.
pub(crate) async fn run_entry_with(
    clients: Clients,
    exit: Peer,
    options: EntryOptions,
    meeting: Meeting,
    shutdown: Shutdown,
) -> ShutdownReport {
    let work = Work::default();
    let connecting = work.sessions.track();
    let (exits, connections) = match exit {
        Peer::Dial(addr) => {
            let dialled = Dialled::new(addr, &options, meeting, &shutdown, &work);
            let keep = dialled.clone().keep();
            (
                Exits::Dialled(dialled),
                tokio::spawn(tracked(connecting, keep)),
            )
        }
        Peer::Accept(listener) => {
            // The current connection is published through a watch channel: `None` while there
            // is none. Every client task reads the latest value; only the tasks that accept the
            // connections write it.
            let (publish, links) = watch::channel(None);
            let outage = Outage::new("exit");
            let accept = {
                let outage = outage.clone();
                let (shutdown, work) = (shutdown.clone(), work.clone());
                accept_sessions(
                    listener,
                    "exit",
                    meeting,
                    None,
                    shutdown.clone(),
                    work.clone(),
                    move |number, session| {
                        let (publish, shutdown, work) =
                            (publish.clone(), shutdown.clone(), work.clone());
                        let outage = outage.clone();
                        async move {
                            let reason =
                                carry_clients(number, session, &publish, &outage, &shutdown, &work)
                                    .await;
                            // When shutting down, the drain has logged how it went.
                            if !shutdown.begin.is_cancelled() {
                                if reason.is_graceful() {
                                    info!(%reason, "exit disconnected"); // it was shut down on purpose
                                } else {
                                    warn!(%reason, "exit disconnected");
                                }
                            }
                        }
                    },
                )
            };
            (
                Exits::Latest(links, outage),
                tokio::spawn(tracked(connecting, accept)),
            )
        }
    };
    let _connections = AbortOnDrop(connections);

    let accepting = Accepting {
        exits: Arc::new(exits),
        options,
        shutdown: shutdown.clone(),
        work: work.clone(),
        // Places for the clients that are still silent, per address (see `Silent`), across
        // all services.
        silent: Admission::new(
            SILENT_CLIENTS,
            SILENT_PER_CLIENT,
            SILENT_GRACE,
            4 * SILENT_CLIENTS,
        ),
        refusals: Refusals::default(),
        count: Arc::default(),
    };
    match clients {
        Clients::One(listener) => {
            let service = Arc::new(ClientService {
                name: None,
                socks: AtomicBool::new(accepting.options.socks),
                metrics: metrics().service("default"),
                lane: Lane::default(),
            });
            accept_clients(listener, service, accepting).await;
        }
        Clients::Named(named) => named.run(accepting).await,
    }
    work.wind_down(&shutdown).await
}

/// What every service's accept loop shares.
#[derive(Clone)]
pub(crate) struct Accepting {
    exits: Arc<Exits>,
    options: EntryOptions,
    shutdown: Shutdown,
    work: Work,
    silent: Admission,
    refusals: Refusals,
    /// Clients accepted so far, to number them in the logs.
    count: Arc<AtomicU64>,
}

/// A service of the entry, as its accept loop and its clients see it.
pub(crate) struct ClientService {
    /// Its name, which its streams' prefaces carry; `None` for the one service of the flags,
    /// whose streams carry no preface.
    name: Option<String>,
    /// Whether its clients speak SOCKS5 (a reload may change it).
    socks: AtomicBool,
    metrics: ServiceMetrics,
    lane: Lane,
}

/// Accepts the clients of `service` on `clients` until the shutdown begins or the service is
/// removed, then closes the listener: clients that connect from then on are refused.
async fn accept_clients(clients: TcpListener, service: Arc<ClientService>, accepting: Accepting) {
    let Accepting {
        silent,
        refusals,
        shutdown,
        ..
    } = &accepting;
    let mut summaries = tokio::time::interval(PERIOD);
    loop {
        let (socket, peer) = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => break,
            () = service.lane.stop.cancelled() => break,
            _ = summaries.tick() => {
                refusals.summarise("silent clients closed");
                continue;
            }
            accepted = accept(&clients) => accepted,
        };
        let count = accepting.count.fetch_add(1, Ordering::Relaxed) + 1;
        let Some((ticket, evicted)) = silent.admit(peer, Newcomer::Silent) else {
            service.metrics.refused("too_many_silent");
            if refusals.log_one(peer.ip()) {
                warn!(
                    %peer,
                    most = 4 * SILENT_CLIENTS,
                    "too many silent client connections; closing this one"
                );
            }
            continue;
        };
        if let Some(evicted) = evicted {
            if refusals.log_one(evicted.peer.ip()) {
                warn!(
                    peer = %evicted.peer,
                    silent_for = ?evicted.held,
                    per_address = SILENT_PER_CLIENT,
                    "too many silent connections from this client address; closing the oldest"
                );
            }
        }

        // Every log line about this client carries its number and address; the session and
        // stream ids are filled in once they are known.
        let span = info_span!(
            "client",
            client = count,
            %peer,
            session = tracing::field::Empty,
            stream = tracing::field::Empty,
        );
        // One task per client, so a slow one never holds up the accept loop or the others.
        let client = serve_client(
            [accepting.work.relays.track(), service.lane.track()],
            Silent::new(socket, ticket),
            Arc::clone(&service),
            Arc::clone(&accepting.exits),
            accepting.options.client_wait,
            shutdown.clone(),
        );
        tokio::spawn(client.instrument(span));
    }
    // Clients that connect from now on are refused.
    drop(clients);
}

/// How a client reaches the exit.
#[derive(Clone)]
enum Exits {
    /// Through the entry's own connections to the exit.
    Dialled(Dialled),
    /// Through the latest connection an exit dialled in on: `None` while there is none. The
    /// outage is told when clients are turned away for want of one, and when one comes.
    Latest(watch::Receiver<Option<Link>>, Outage),
}

/// The entry's connections to the exit when it dials it: a [`Pool`] of `--connections`, and
/// what the clients carried by each session need to learn of its end.
#[derive(Clone)]
struct Dialled {
    pool: Pool,
    /// The end of every session that carries clients, by the pool's number for it. Made when
    /// the first client is carried by the session, with a task that waits for its end.
    ends: Arc<Mutex<HashMap<u64, SessionEnd>>>,
    /// Cuts the relays of every session at once: the pool is drained as one.
    cut: CancellationToken,
    /// How long a client waits between two attempts to open a stream while no session can be
    /// had: the pool fails an open at once while it backs off from the exit.
    retry: Duration,
    shutdown: Shutdown,
    work: Work,
}

impl Dialled {
    fn new(
        exit: SocketAddr,
        options: &EntryOptions,
        meeting: Meeting,
        shutdown: &Shutdown,
        work: &Work,
    ) -> Dialled {
        let Redial {
            backoff_initial,
            backoff_max,
            dial_timeout,
        } = options.redial;
        // Logs the failed dials once per outage.
        let outage = Outage::new("exit");
        let pool = Pool::builder(options.connections)
            .config(mux_config())
            .backoff(backoff_initial, backoff_max)
            .connect_timeout(dial_timeout + meeting.handshakes.timeout)
            .build({
                let outage = outage.clone();
                move || {
                    let (meeting, outage) = (meeting.clone(), outage.clone());
                    async move {
                        match dial(exit, dial_timeout, &meeting).await {
                            Ok(socket) => {
                                metrics().connected();
                                outage.up();
                                info!(%exit, "connected to the exit");
                                Ok(socket)
                            }
                            Err(error) => {
                                outage.down(format_args!("{exit}: {error}"));
                                Err(error)
                            }
                        }
                    }
                }
            });
        metrics().first_connections(options.connections);
        metrics().watch_pool(&pool);
        Dialled {
            pool,
            ends: Arc::default(),
            cut: CancellationToken::new(),
            retry: backoff_initial,
            shutdown: shutdown.clone(),
            work: work.clone(),
        }
    }

    /// Makes the connections to the exit at once, rather than when the first client comes,
    /// then waits for the shutdown, and drains them all.
    async fn keep(self) {
        let (shutdown, work) = (&self.shutdown, &self.work);
        tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => {}
            live = self.pool.fill() => {
                // Those that failed have said so; clients bring the next attempts.
                if live > 0 {
                    info!(live, connections = self.pool.size(), "connections to the exit made");
                }
                shutdown.begin.cancelled().await;
            }
        }
        let end = SessionEnd {
            ended: CancellationToken::new(),
            cut: self.cut.clone(),
        };
        drain(&self.pool, shutdown, work, &end).await;
        // Sessions no client used, or that ended meanwhile, had nothing to drain; no more
        // connects either way.
        let _ = self.pool.close().await;
    }

    /// Opens a stream for a client on the session with the fewest, waiting up to `wait` for
    /// one to be had. `None` when the client is to be turned away.
    async fn open(&self, wait: Duration) -> Option<(u64, Stream, SessionEnd)> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let opened = tokio::select! {
                biased;
                () = self.shutdown.begin.cancelled() => {
                    debug!("shutting down; turning the client away");
                    return None;
                }
                // The wait is for a connection to be had: one that is up is used whatever
                // the wait (even none).
                opened = async {
                    if self.pool.live() > 0 {
                        Ok(self.pool.open_with_session().await)
                    } else {
                        tokio::time::timeout_at(deadline, self.pool.open_with_session()).await
                    }
                } => opened,
            };
            let error = match opened {
                Ok(Ok((stream, pooled))) => {
                    let end = self.end_of(&pooled);
                    return Some((pooled.number(), stream, end));
                }
                Ok(Err(Error::TooManyStreams)) => {
                    warn!("cannot open a stream, too many; closing the client");
                    return None;
                }
                Ok(Err(error)) => error,
                Err(_) => Error::from(io::Error::from(io::ErrorKind::TimedOut)),
            };
            if self.pool.is_closed() {
                return None;
            }
            // No session can be had now (the pool backs off from an exit that cannot be
            // reached): wait a little, until the deadline.
            let retry = (tokio::time::Instant::now() + self.retry).min(deadline);
            if retry >= deadline {
                // The failed dials have said so, once per outage.
                debug!(%error, ?wait, "no connection to the exit; turning the client away");
                return None;
            }
            tokio::time::sleep_until(retry).await;
        }
    }

    /// The end of `pooled`, made (with a task waiting for it) by the first client it carries.
    fn end_of(&self, pooled: &PooledSession) -> SessionEnd {
        let number = pooled.number();
        let mut ends = self.ends.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(end) = ends.get(&number) {
            return end.clone();
        }
        let end = SessionEnd {
            ended: CancellationToken::new(),
            cut: self.cut.clone(),
        };
        ends.insert(number, end.clone());
        drop(ends);
        let watch = {
            let (session, end) = (pooled.session().clone(), end.clone());
            let (ends, shutdown) = (Arc::clone(&self.ends), self.shutdown.clone());
            async move {
                let reason = session.closed().await;
                metrics().session_ended(number, &session);
                end.ended.cancel();
                ends.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&number);
                // When shutting down, the drain has logged how it went.
                if !shutdown.begin.is_cancelled() {
                    // A CloseMux: the exit was shut down (or restarted) on purpose.
                    if reason.is_graceful() {
                        info!(%reason, "connection to the exit closed by the exit");
                    } else {
                        warn!(%reason, "connection to the exit lost");
                    }
                }
            }
        };
        let span = info_span!(parent: None, "session", session = number, slot = pooled.slot());
        tokio::spawn(tracked(self.work.sessions.track(), watch).instrument(span));
        end
    }
}

/// Accepts gomux connections from exits, each of which carries the clients that arrive while
/// shutdown begins, drains it.
async fn carry_clients(
    number: u64,
    session: Session,
    publish: &watch::Sender<Option<Link>>,
    outage: &Outage,
    shutdown: &Shutdown,
    work: &Work,
) -> Error {
    let end = SessionEnd::default();
    metrics().connected();
    metrics().session_started(number, &session);
    publish.send_replace(Some(Link {
        number,
        session: session.clone(),
        end: end.clone(),
    }));
    outage.up();

    // Nothing to do until the connection dies, or the shutdown begins. Then every client it
    // carried is told (after a drain, none is left).
    let reason = tokio::select! {
        biased;
        reason = session.closed() => reason,
        () = shutdown.begin.cancelled() => {
            drain(&session, shutdown, work, &end).await;
            session.closed().await
        }
    };
    end.ended.cancel();
    metrics().session_ended(number, &session);
    // Withdraw it, unless a newer connection has taken its place meanwhile (an exit that
    // dialled in again before its old connection was found dead).
    publish.send_if_modified(|current| {
        let withdraw = current.as_ref().is_some_and(|link| link.number == number);
        if withdraw {
            *current = None;
        }
        withdraw
    });
    reason
}

/// Forwards one client connection through a gomux connection to the exit; closes it at
/// once if it loses its place while it is still silent.
///
/// Counted meanwhile (`counted`: among the end's relays, and by its service), and cut with
/// its service when the service, removed, reaches its drain deadline.
///
/// This future is the whole of an idle client's task, so it holds each thing once: the guards
/// and the cut are watched here rather than by a wrapping future (an async function that takes
/// a future and awaits it keeps room for it twice), it is an async block rather than an async
/// function (which would keep its arguments besides the values it moves on), and the
/// connections to the exit are shared behind one pointer.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
fn serve_client(
    counted: [Tracked; 2],
    client: Silent<TcpStream>,
    service: Arc<ClientService>,
    exits: Arc<Exits>,
    wait: Duration,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    async move {
        let _counted = counted;
        let evicted = client.evicted.clone();
        let _active = service.metrics.accepted();
        tokio::select! {
            biased;
            () = service.lane.cut.cancelled() => {}
            // Logged by the accept loop; nothing was sent either way, so nothing is lost.
            () = evicted.cancelled() => service.metrics.refused("silent_evicted"),
            () = forward_client(client, &service, &exits, wait, &shutdown) => {}
        }
    }
}

/// See [`serve_client`]. The open of the stream is boxed: its state is larger than the relay's,
/// and needed only until the stream is had.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice"
)]
fn forward_client<'a>(
    mut client: Silent<TcpStream>,
    service: &'a ClientService,
    exits: &'a Exits,
    wait: Duration,
    shutdown: &'a Shutdown,
) -> impl Future<Output = ()> + 'a {
    async move {
        let opened = Box::pin(open_stream(exits, wait, shutdown)).await;
        let Some((number, mut stream, end)) = opened else {
            service.metrics.refused("no_exit");
            if service.socks.load(Ordering::Relaxed) {
                refuse_socks(&mut client).await;
            }
            return;
        };
        {
            let span = Span::current();
            span.record("session", number);
            span.record("stream", stream.id());
        }
        // A config-mode stream names its service first (see `preface`): the client's bytes
        // follow at once, and the exit's answer is taken by the relay before any reply.
        if let Some(name) = &service.name {
            if let Err(error) = stream.write_all(&preface::preface(name)).await {
                debug!(%error, "the stream closed before its preface; closing the client");
                return;
            }
        }
        debug!("forwarding");
        // A stream the exit refuses (its accept backlog is full, or it is shutting down) is
        // closed by it at once: `carry` then closes the client too. A SOCKS5 refusal by the
        // exit is logged here, where the client's address is known (see `socks_watch`).
        let carried = Carried::at_entry(&service.metrics, service.name.clone());
        carry_with(Watched::new(client), stream, &end, carried).await;
    }
}

/// Opens a stream for a client on a connection to the exit, waiting up to `wait` for one to
/// be had. `None` when the client is to be turned away.
async fn open_stream(
    exits: &Exits,
    wait: Duration,
    shutdown: &Shutdown,
) -> Option<(u64, Stream, SessionEnd)> {
    match exits {
        Exits::Dialled(dialled) => dialled.open(wait).await,
        Exits::Latest(links, outage) => open_on_latest(links.clone(), wait, shutdown, outage).await,
    }
}

/// Opens a stream on the latest connection an exit dialled in on, waiting up to `wait` for
/// one. `None` when the client is to be turned away.
async fn open_on_latest(
    mut links: watch::Receiver<Option<Link>>,
    wait: Duration,
    shutdown: &Shutdown,
    outage: &Outage,
) -> Option<(u64, Stream, SessionEnd)> {
    let deadline = tokio::time::Instant::now() + wait;

    // A connection can die between being published and our open, so a failed open waits for a
    // newer one, until the deadline. A client that has no stream yet when the shutdown begins
    // is turned away: it is not being relayed, and a draining connection opens no stream.
    let mut failed = 0;
    loop {
        let newer = links.wait_for(|link| link.as_ref().is_some_and(|l| l.number > failed));
        let link = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => {
                debug!("shutting down; turning the client away");
                return None;
            }
            newer = tokio::time::timeout_at(deadline, newer) => match newer {
                Ok(Ok(link)) => Ok(link.clone()),
                Ok(Err(_)) => return None, // nothing publishes connections any more: the entry stopped
                Err(timed_out) => Err(timed_out),
            },
        };
        let link = match link {
            Ok(link) => link,
            Err(_) => {
                // Unless one came just now.
                if links.borrow().is_none() {
                    outage.down("no exit has dialled in");
                }
                debug!(?wait, "no connection to the exit; turning the client away");
                return None;
            }
        };
        let Some(link) = link else { continue };
        match link.session.open().await {
            Ok(stream) => return Some((link.number, stream, link.end)),
            Err(error) if error.is_session_end() => failed = link.number,
            Err(error) => {
                // Only this open failed (the session is at its stream limit).
                warn!(%error, "cannot open a stream; closing the client");
                return None;
            }
        }
    }
}

/// A client connection that holds a place among the silent ones until a byte passes either
/// way: a connection that has spoken, or been spoken to, is no longer a stranger's idle
/// socket (a server that speaks first, as SMTP or MySQL, makes a pooled connection so at
/// once).
struct Silent<T> {
    io: T,
    ticket: Option<Ticket>,
    /// Cancelled if the place is taken from it while it is silent.
    evicted: CancellationToken,
}

impl<T> Silent<T> {
    fn new(io: T, ticket: Ticket) -> Silent<T> {
        Silent {
            io,
            evicted: ticket.evicted.clone(),
            ticket: Some(ticket),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Silent<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.ticket = None;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Silent<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, data))?;
        if n > 0 {
            this.ticket = None;
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
