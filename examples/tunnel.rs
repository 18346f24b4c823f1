//! A TCP port forwarder that carries every forwarded connection over one gomux connection.
//!
//! Two programs in one: the *entry* listens where clients connect, and the *exit* runs near the
//! service they want to reach (the *target*). Between the two there is a single TCP connection,
//! and every client connection becomes one gomux stream on it:
//!
//! ```text
//!  client ──TCP──┐                                      ┌──TCP── target
//!  client ──TCP──┼── entry ══ one gomux connection ══ exit ──┼──TCP── target
//!  client ──TCP──┘                                      └──TCP── target
//! ```
//!
//! For example, to reach a Redis server on port 6379 through a tunnel whose entry listens on
//! port 7000 (run the two ends in two terminals, or on two machines):
//!
//! ```text
//! cargo run --release --example tunnel -- exit  --listen 127.0.0.1:7001 --target 127.0.0.1:6379
//! cargo run --release --example tunnel -- entry --listen 127.0.0.1:7000 --exit 127.0.0.1:7001
//! redis-cli -p 7000 PING
//! ```
//!
//! What each failure ends:
//!
//! - A client that closes its connection ends its own stream, nothing else.
//! - A target that refuses a connection gets that one stream closed: its client reads
//!   end-of-stream (and its connection is closed as soon as it writes or closes). The gomux
//!   connection and every other client carry on.
//! - When the gomux connection itself dies, every client connection it carried is closed, and
//!   the entry dials the exit again, waiting longer after each failed attempt (exponential
//!   backoff, capped). Clients that arrive meanwhile wait for the new connection, for a while.
//!
//! Both ends log through `tracing`; `RUST_LOG` picks what is shown (`info` by default,
//! `RUST_LOG=debug` adds a line for every client connection, with its session and stream ids).
//!
//! The entry and the exit are plain async functions, [`run_entry`] and [`run_exit`], that take
//! an already bound listener, so a test can run both in one process on ephemeral ports.
//!
//! For comparison, `tunnel relay --listen ADDR --target ADDR` forwards TCP connections one to
//! one, without gomux: two relays in a row make the same two hops as an entry and an exit, so
//! the difference between them is what carrying every client over one multiplexed connection
//! costs (`scripts/redis-tunnel.sh` measures both).

use std::error::Error as StdError;
use std::io::{self, IsTerminal};
use std::net::SocketAddr;
use std::process;
use std::time::{Duration, Instant};

use gomux::{Config, Role, Session, Stream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument, Span};

const USAGE: &str = "\
usage: tunnel entry --listen ADDR --exit ADDR     accept TCP clients on ADDR and carry each one
                                                 as a gomux stream to the exit at ADDR
       tunnel exit --listen ADDR --target ADDR    accept gomux connections on ADDR and connect
                                                 each stream to the target at ADDR
       tunnel relay --listen ADDR --target ADDR   forward each TCP connection on ADDR to its
                                                 own connection to ADDR, without gomux
RUST_LOG sets the log filter (default: info).";

/// Size of each of the two copy buffers of a forwarded connection, at each end. Half of the
/// largest gomux frame: big enough that bulk transfers go in large frames, small enough that a
/// thousand idle connections hold 64 MiB of buffers per end rather than twice that.
const COPY_BUFFER: usize = 32 * 1024;

/// How long the exit waits for the target to accept a connection.
const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed `accept`, which happens when the process runs out of file descriptors:
/// retrying at once would spin until one is freed.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------------

/// What the command line asked for.
enum Command {
    Entry { listen: String, exit: String },
    Exit { listen: String, target: String },
    Relay { listen: String, target: String },
}

#[tokio::main]
async fn main() {
    // `RUST_LOG` decides what is logged; without it, `info` shows connections to the exit
    // coming and going but not every client.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        // Colours only for a person watching, not in log files.
        .with_ansi(io::stderr().is_terminal())
        .init();

    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .first()
        .is_some_and(|arg| ["-h", "--help", "help"].contains(&arg.as_str()))
    {
        println!("{USAGE}");
        return;
    }
    // Check the whole command line before starting anything.
    let command = parse_args(&args).unwrap_or_else(|problem| {
        eprintln!("tunnel: {problem}\n{USAGE}");
        process::exit(2)
    });

    // Run until the work fails or the user presses Ctrl-C.
    tokio::select! {
        outcome = run(command) => {
            if let Err(error) = outcome {
                eprintln!("tunnel: {error}");
                process::exit(1);
            }
        }
        _ = tokio::signal::ctrl_c() => info!("interrupted, exiting"),
    }
}

/// Binds the listening address, resolves the other address once, and runs the chosen end.
async fn run(command: Command) -> Result<(), Box<dyn StdError>> {
    match command {
        Command::Entry { listen, exit } => {
            let listener = bind(&listen).await?;
            let exit = resolve(&exit).await?;
            info!(listen = %listener.local_addr()?, %exit, "entry listening");
            run_entry(listener, exit, EntryOptions::default()).await;
        }
        Command::Exit { listen, target } => {
            let listener = bind(&listen).await?;
            let target = resolve(&target).await?;
            info!(listen = %listener.local_addr()?, %target, "exit listening");
            run_exit(listener, target).await;
        }
        Command::Relay { listen, target } => {
            let listener = bind(&listen).await?;
            let target = resolve(&target).await?;
            info!(listen = %listener.local_addr()?, %target, "relay listening");
            run_relay(listener, target).await;
        }
    }
    Ok(())
}

async fn bind(addr: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
}

/// Resolves a `host:port` once at start-up; the tunnel then always dials that address.
async fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let mut found = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?;
    found
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))
}

/// Parses the arguments after the program name.
fn parse_args(args: &[String]) -> Result<Command, String> {
    let Some((mode, options)) = args.split_first() else {
        return Err("say which end to run: entry, exit or relay".into());
    };

    let mut listen = None;
    let mut other = None;
    let other_flag = match mode.as_str() {
        "entry" => "--exit",
        "exit" | "relay" => "--target",
        unknown => return Err(format!("unknown mode {unknown:?}: entry, exit or relay")),
    };
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let value = options
            .next()
            .ok_or_else(|| format!("{option} needs an address"))?
            .clone();
        match option.as_str() {
            "--listen" => listen = Some(value),
            flag if flag == other_flag => other = Some(value),
            unknown => return Err(format!("unknown option {unknown:?} for {mode}")),
        }
    }
    let listen = listen.ok_or("--listen ADDR is required")?;
    let other = other.ok_or_else(|| format!("{other_flag} ADDR is required"))?;
    Ok(match mode.as_str() {
        "entry" => Command::Entry {
            listen,
            exit: other,
        },
        "exit" => Command::Exit {
            listen,
            target: other,
        },
        _ => Command::Relay {
            listen,
            target: other,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// The entry
// ---------------------------------------------------------------------------------------------

/// How the entry keeps its connection to the exit, and how long clients wait for it.
#[derive(Debug, Clone)]
pub struct EntryOptions {
    /// Wait before the second attempt to dial the exit; each further failure doubles it.
    pub backoff_initial: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// Give up on one attempt after this long: a dial to a host that silently drops packets
    /// would otherwise take minutes to fail.
    pub dial_timeout: Duration,
    /// How long a new client waits for a connection to the exit before it is turned away.
    pub client_wait: Duration,
}

impl Default for EntryOptions {
    fn default() -> EntryOptions {
        EntryOptions {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            dial_timeout: Duration::from_secs(5),
            client_wait: Duration::from_secs(10),
        }
    }
}

/// One gomux connection to the exit. `number` counts the connections this entry has made, so
/// logs can tell them apart and a client can wait for a *newer* one than a connection that
/// just failed it.
#[derive(Clone)]
struct Link {
    number: u64,
    session: Session,
    /// Cancelled once the session has ended.
    ended: CancellationToken,
}

/// Runs the entry: accepts clients on `listener` and carries each one as a stream over a
/// single gomux connection to the exit at `exit`, which it dials, and dials again whenever it
/// is lost.
///
/// Runs until the future is dropped (or its task aborted); that also stops the dialling.
/// Client connections already being forwarded run in their own tasks and finish on their own.
pub async fn run_entry(listener: TcpListener, exit: SocketAddr, options: EntryOptions) {
    // The current connection is published through a watch channel: `None` while there is
    // none. Every client task reads the latest value; only the dialling task writes it.
    let (publish, links) = watch::channel(None);
    let _dialler = AbortOnDrop(tokio::spawn(maintain_link(exit, options.clone(), publish)));

    let mut clients = 0u64;
    loop {
        let (socket, peer) = accept(&listener).await;
        clients += 1;

        // Every log line about this client carries its number and address; the session and
        // stream ids are filled in once they are known.
        let span = info_span!(
            "client",
            client = clients,
            %peer,
            session = tracing::field::Empty,
            stream = tracing::field::Empty,
        );
        // One task per client, so a slow one never holds up the accept loop or the others.
        tokio::spawn(serve_client(socket, links.clone(), options.client_wait).instrument(span));
    }
}

/// Keeps a gomux connection to the exit up, publishing each new one, for as long as anyone
/// listens.
async fn maintain_link(
    exit: SocketAddr,
    options: EntryOptions,
    publish: watch::Sender<Option<Link>>,
) {
    let mut number = 0u64;
    let mut delay = options.backoff_initial;
    loop {
        match connect(exit, options.dial_timeout).await {
            Ok(socket) => {
                number += 1;
                let span = info_span!("session", session = number);
                let session = Session::with_config(socket, Role::Client, mux_config());
                span.in_scope(|| info!(%exit, "connected to the exit"));
                let ended = CancellationToken::new();
                publish.send_replace(Some(Link {
                    number,
                    session: session.clone(),
                    ended: ended.clone(),
                }));

                // Nothing to do until the connection dies. Then every client it carried is
                // told, through the token, and closes.
                let started = Instant::now();
                let reason = session.closed().await;
                ended.cancel();
                publish.send_replace(None);
                span.in_scope(|| warn!(%reason, "connection to the exit lost"));

                // A connection that lasted a while was a good one: dial again straight away,
                // the exit was probably restarted. One that died at once (an exit that accepts
                // and drops, say) counts as a failed attempt, so the wait keeps growing.
                if started.elapsed() >= options.backoff_max {
                    delay = options.backoff_initial;
                    continue;
                }
            }
            Err(error) => warn!(%exit, %error, retry_in = ?delay, "cannot reach the exit"),
        }
        if publish.is_closed() {
            return; // no client can be served any more: the entry has stopped
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(options.backoff_max);
    }
}

/// Forwards one client connection through the current gomux connection.
async fn serve_client(client: TcpStream, mut links: watch::Receiver<Option<Link>>, wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;

    // Find a connection to the exit and open a stream on it. A connection can die between
    // being published and our open, so a failed open waits for a newer one, until the
    // deadline.
    let mut failed = 0;
    let (link, stream) = loop {
        let newer = links.wait_for(|link| link.as_ref().is_some_and(|l| l.number > failed));
        let link = match tokio::time::timeout_at(deadline, newer).await {
            Ok(Ok(link)) => link.clone(),
            Ok(Err(_)) => return, // the dialling task is gone: the entry has stopped
            Err(_) => {
                warn!(?wait, "no connection to the exit; turning the client away");
                return;
            }
        };
        let Some(link) = link else { continue };
        match link.session.open().await {
            Ok(stream) => break (link, stream),
            Err(error) if error.is_session_end() => failed = link.number,
            Err(error) => {
                // Only this open failed (the session is at its stream limit).
                warn!(%error, "cannot open a stream; closing the client");
                return;
            }
        }
    };

    let span = Span::current();
    span.record("session", link.number);
    span.record("stream", stream.id());
    debug!("forwarding");
    bridge(client, stream, &link.ended).await;
}

/// Calls [`JoinHandle::abort`] when dropped, so a spawned helper task ends with its owner.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// The exit
// ---------------------------------------------------------------------------------------------

/// Runs the exit: accepts gomux connections on `listener` (from any number of entries) and
/// connects every stream on them to `target`.
///
/// Runs until the future is dropped (or its task aborted). Sessions already accepted run in
/// their own tasks and finish on their own.
pub async fn run_exit(listener: TcpListener, target: SocketAddr) {
    let mut sessions = 0u64;
    loop {
        let (socket, peer) = accept(&listener).await;
        sessions += 1;
        let span = info_span!("session", session = sessions, %peer);
        tokio::spawn(serve_session(socket, target).instrument(span));
    }
}

/// Serves one gomux connection from an entry until it ends.
async fn serve_session(socket: TcpStream, target: SocketAddr) {
    info!("entry connected");
    let session = Session::with_config(socket, Role::Server, mux_config());
    // Cancelled when the session ends, which is when `accept` fails.
    let ended = CancellationToken::new();
    let mut streams = 0u64;
    let reason = loop {
        match session.accept().await {
            Ok(stream) => {
                streams += 1;
                // The span nests in the session's, so each line names both ids.
                let span = info_span!("stream", stream = stream.id());
                tokio::spawn(forward(stream, ended.clone(), target).instrument(span));
            }
            Err(reason) => break reason,
        }
    };
    ended.cancel();
    info!(%reason, streams, "entry disconnected");
}

/// Connects one stream to the target and relays until both directions are done.
async fn forward(mut stream: Stream, session_ended: CancellationToken, target: SocketAddr) {
    let socket = match connect(target, TARGET_CONNECT_TIMEOUT).await {
        Ok(socket) => socket,
        Err(error) => {
            // Close this stream only: its client reads end-of-stream, the session goes on.
            warn!(%target, %error, "cannot reach the target; closing the stream");
            let _ = stream.close().await;
            return;
        }
    };
    debug!("forwarding");
    bridge(socket, stream, &session_ended).await;
}

// ---------------------------------------------------------------------------------------------
// The relay, for comparison
// ---------------------------------------------------------------------------------------------

/// Runs a plain TCP relay: every connection accepted on `listener` gets its own connection to
/// `target`, and bytes are copied both ways exactly as the tunnel's ends copy them, half-closes
/// included. No gomux: this is the baseline the tunnel is measured against.
pub async fn run_relay(listener: TcpListener, target: SocketAddr) {
    // Never cancelled: each relayed connection stands alone.
    let never = CancellationToken::new();
    loop {
        let (client, peer) = accept(&listener).await;
        let never = never.clone();
        tokio::spawn(
            async move {
                match connect(target, TARGET_CONNECT_TIMEOUT).await {
                    Ok(socket) => bridge(client, socket, &never).await,
                    Err(error) => warn!(%target, %error, "cannot reach the target"),
                }
            }
            .instrument(info_span!("relay", %peer)),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by both ends
// ---------------------------------------------------------------------------------------------

/// Session settings for both ends. Both are this program, so each may expect the other's
/// keepalives: a connection silent for the idle timeout is dead (a peer that vanished without
/// closing, a network that dropped it), and ending it lets the entry dial again instead of
/// waiting for TCP to notice, which can take many minutes.
fn mux_config() -> Config {
    Config::default()
        .keepalive_interval(Some(Duration::from_secs(10)))
        .idle_timeout(Some(Duration::from_secs(45)))
}

/// Relays between a TCP connection and a gomux stream (or, in the relay, another TCP
/// connection) until both directions are done, or the session carrying the stream ends
/// (`session_ended` is cancelled).
///
/// Half-closes travel through: when one side reads end-of-file, the other side's write half is
/// shut down (a TCP FIN one way, a gomux CloseRead the other), and the other direction keeps
/// flowing until it ends too. Any error ends both.
///
/// The session's end comes as a token that one task per session cancels, rather than from each
/// connection waiting on [`Session::closed`]: a token forgets a waiter as soon as it stops
/// waiting, so a session that carries millions of short connections keeps nothing of them.
async fn bridge<A, B>(mut tcp: A, mut stream: B, session_ended: &CancellationToken)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let relay =
        tokio::io::copy_bidirectional_with_sizes(&mut tcp, &mut stream, COPY_BUFFER, COPY_BUFFER);
    tokio::select! {
        result = relay => match result {
            Ok((to_mux, from_mux)) => debug!(to_mux, from_mux, "done"),
            Err(error) => debug!(%error, "ended by an error"),
        },
        // A direction blocked reading the TCP side would not notice the session's end until
        // that side sent something, which could be never: stop now, so the TCP connection is
        // closed with the session.
        () = session_ended.cancelled() => debug!("session ended"),
    }
    // Returning drops both: the TCP connection closes, and the stream sends its close.
}

/// Dials `addr` with Nagle's algorithm off, giving up after `limit`.
async fn connect(addr: SocketAddr, limit: Duration) -> io::Result<TcpStream> {
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
async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
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
