//! A TCP port forwarder that carries every forwarded connection over one gomux connection (or
//! a few, `--connections K`), forward or reverse, to a fixed target or as a SOCKS5 proxy.
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
//! # Several connections: `--connections K`
//!
//! A gomux connection is driven by one task at each end, so one connection keeps at most one
//! core busy on each side. With `entry --exit ADDR --connections K` the entry keeps K
//! connections to the exit instead of one (a `gomux::Pool`), and carries each new client over
//! the one with the fewest clients at that moment; the exit serves every connection an entry
//! makes, K of them as well as one. The K connections are made when the entry starts; one
//! that is lost is dialled again when the next client comes (clients go to the others
//! meanwhile), with the same backoff as a single connection. A client stays on its connection
//! for its whole life: losing a connection closes the clients it carried, and only those.
//!
//! In the reverse direction the exit dials, and the entry carries new clients over the latest
//! connection an exit made, so `--connections` is refused with `--accept-exit`.
//!
//! # Reverse: the exit dials the entry
//!
//! Which end dials the gomux connection is a separate choice from which end the clients use.
//! With `exit --entry ADDR` and `entry --accept-exit ADDR`, the exit dials out to the entry and
//! the entry waits for it: the exit can then sit behind NAT or a firewall that lets connections
//! out but not in (an *agent*), and the entry on a public host. The exit keeps the connection
//! up, dialling again with backoff whenever it is lost, exactly as the entry does in the
//! forward direction; the entry still opens one stream per client, now towards the exit that
//! dialled it (either end of a gomux session can open streams). The latest exit to connect
//! carries new clients.
//!
//! # SOCKS5: the exit as a proxy
//!
//! With `--socks` instead of `--target ADDR`, the exit has no fixed target: every stream starts
//! with a SOCKS5 request (RFC 1928, "no authentication", CONNECT), which the exit answers before
//! connecting the stream to the host and port it names. The entry knows nothing of SOCKS: a
//! client's greeting and request travel through the stream like any other bytes. So names are
//! resolved, and hosts reached, from the exit's network. Together with the reverse direction,
//! this is a reverse SOCKS5 proxy, as Go gomux's author ships one: SOCKS clients on the public
//! host reach the network behind NAT as if they were on it.
//!
//! ```text
//! # behind NAT: dial the public host and serve SOCKS5 on every stream it opens
//! cargo run --release --example tunnel -- exit  --entry public.example.com:7001 --socks
//! # on the public host: SOCKS clients on 1080 (loopback only), the exit dials in on 7001
//! cargo run --release --example tunnel -- entry --listen 127.0.0.1:1080 --accept-exit 0.0.0.0:7001
//! curl --socks5-hostname 127.0.0.1:1080 http://intranet.internal/
//! ```
//!
//! Neither end authenticates the other and nothing is encrypted: whoever can reach the exit's
//! `--listen` port, or the entry's `--accept-exit` port, can use (or, for the latter, take
//! over) the tunnel. Keep those ports on a network you trust, or run the session over TLS as
//! `examples/tls.rs` does.
//!
//! # What each failure ends
//!
//! - A client that closes its connection ends its own stream, nothing else.
//! - A target that refuses a connection gets that one stream closed, and its client is closed
//!   with it (in SOCKS5 mode, after the SOCKS5 error reply). The gomux connection and every
//!   other client carry on.
//! - The same goes for a stream that the other end refuses, because too many streams already
//!   wait there to be accepted or because it is shutting down: its client is closed, nothing
//!   else.
//! - When the gomux connection itself dies, every client connection it carried is closed, and
//!   the dialling end dials again, waiting longer after each failed attempt (exponential
//!   backoff, capped). Clients that arrive meanwhile wait for the new connection, for a while
//!   (with `--connections K`, they go to the other connections while there are any).
//!
//! # Shutting down
//!
//! Ctrl-C, or SIGTERM, shuts an end down gracefully, as a service manager or a deployment
//! expects. The end takes no new work: the entry closes its listening ports (clients that
//! connect now are refused), the exit takes no new gomux connections, and neither dials
//! again. Each of its gomux connections is closed with `Session::graceful_close`: the other
//! end's new streams are refused (the entry closes their clients at once), and the connections
//! being relayed go on until they finish, their replies complete. Then the program exits. At
//! the drain deadline (`--drain SECONDS`, 30 by default), or on a second Ctrl-C, what is still
//! open is cut; a third Ctrl-C exits at once. The log says how many connections were being
//! relayed, and whether they all finished or how many were cut.
//!
//! The other end carries on. It delivers what reached it before the connection was closed
//! (the end of a reply for a client that reads slowly, say), then an entry whose exit shut
//! down waits for it, or dials it again, as when a connection is lost; an exit whose entry
//! shut down does the same.
//!
//! A forwarder cannot tell where a request ends: a connection finishes when its client and its
//! target have both closed it. Clients that keep idle connections open (HTTP keep-alive,
//! connection pools) hold the drain up until the deadline.
//!
//! Both ends log through `tracing`; `RUST_LOG` picks what is shown (`info` by default,
//! `RUST_LOG=debug` adds a line for every client connection, with its session and stream ids).
//!
//! The entry and the exit are plain async functions, [`run_entry`] and [`run_exit`], that take
//! already bound listeners (and the addresses to dial) and a [`Shutdown`] that `main` fires on
//! a signal, so a test can run both in one process on ephemeral ports, and shut either down.
//!
//! For comparison, `tunnel relay --listen ADDR --target ADDR` forwards TCP connections one to
//! one, without gomux: two relays in a row make the same two hops as an entry and an exit, so
//! the difference between them is what carrying every client over one multiplexed connection
//! costs (`scripts/redis-tunnel.sh` measures both).

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::io::{self, IsTerminal};
use std::net::SocketAddr;
use std::pin::Pin;
use std::process;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use fast_socks5::server::Socks5ServerProtocol;
use fast_socks5::util::target_addr::TargetAddr;
use fast_socks5::{ReplyError, Socks5Command};
use gomux::stream::Stopped;
use gomux::{Config, Error, Pool, PooledSession, Role, Session, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument, Span};

const USAGE: &str = "\
usage: tunnel entry --listen ADDR (--exit ADDR [--connections K] | --accept-exit ADDR)
                    [--drain SECONDS]
       tunnel exit (--listen ADDR | --entry ADDR) (--target ADDR | --socks) [--drain SECONDS]
       tunnel relay --listen ADDR --target ADDR [--drain SECONDS]

The entry accepts TCP clients and carries each one as a gomux stream over a single
connection to the exit; the exit connects each stream onwards.

entry  --listen ADDR       accept TCP clients on ADDR
       --exit ADDR         dial the exit at ADDR, and again whenever the connection is lost
       --connections K     with --exit: keep K connections to the exit (default 1), each
                           client carried by the one with the fewest
       --accept-exit ADDR  reverse: let the exit dial in on ADDR (the latest one carries
                           new clients)
exit   --listen ADDR       accept gomux connections from entries on ADDR
       --entry ADDR        reverse: dial the entry at ADDR, and again whenever the connection
                           is lost (for an exit behind NAT)
       --target ADDR       connect every stream to ADDR
       --socks             read a SOCKS5 CONNECT request from every stream and connect it to
                           the address requested (host names resolved by the exit)
relay  --listen ADDR --target ADDR
                           forward each TCP connection on ADDR to its own connection to
                           ADDR, without gomux (a baseline for measurements)
all    --drain SECONDS     on Ctrl-C or SIGTERM, take no new connections and give the ones
                           being relayed this long to finish (default 30), then cut them; a
                           second Ctrl-C cuts them at once, a third exits at once

RUST_LOG sets the log filter (default: info).";

/// The most connections `--connections` may ask for: far more than there are cores to use,
/// few enough that a typo does not open thousands of connections to the exit.
const MAX_CONNECTIONS: usize = 64;

/// How long the connections being relayed get to finish once a shutdown begins, unless
/// `--drain` says otherwise.
const DEFAULT_DRAIN: Duration = Duration::from_secs(30);

/// Size of each of the two copy buffers of a forwarded connection, at each end. Half of the
/// largest gomux frame: big enough that bulk transfers go in large frames, small enough that a
/// thousand idle connections hold 64 MiB of buffers per end rather than twice that.
const COPY_BUFFER: usize = 32 * 1024;

/// How long the exit waits for the target to accept a connection (in SOCKS5 mode, name
/// resolution included).
const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the exit waits for a stream's SOCKS5 greeting and request. A SOCKS client sends
/// each as soon as it may; a stream that stays silent this long is not one, and is closed
/// rather than kept with a task waiting on it.
const SOCKS_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest SOCKS5 reply: 4 bytes of header, an IPv6 address and a port.
const SOCKS_REPLY_MAX: usize = 4 + 16 + 2;

/// Pause after a failed `accept`, which happens when the process runs out of file descriptors:
/// retrying at once would spin until one is freed.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// How long a relay whose gomux connection has ended still delivers what its stream holds:
/// when the other end drained and closed the connection, the end of a reply may still wait
/// here for a client that reads it slowly. At most a receive window's worth, which a client
/// that reads at all takes in far less; one that does not is cut after this.
const DELIVERY_GRACE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------------

/// The command line: which end to run, and how long its shutdown may take.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    pub command: Command,
    /// How long the connections being relayed get to finish once a shutdown begins.
    pub drain: Duration,
}

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Entry {
        listen: String,
        exit: Via,
        /// Connections to keep to the exit, when the entry dials it.
        connections: usize,
    },
    Exit {
        entry: Via,
        target: TargetArg,
    },
    Relay {
        listen: String,
        target: String,
    },
}

/// How an end makes its gomux connection, as given on the command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Via {
    /// Dial the other end at this address.
    Dial(String),
    /// Wait for the other end to dial in on this address.
    Accept(String),
}

/// What the exit connects its streams to, as given on the command line.
#[derive(Debug, PartialEq, Eq)]
pub enum TargetArg {
    /// Always this address.
    Fixed(String),
    /// The address each stream's SOCKS5 request names.
    Socks,
}

#[tokio::main]
async fn main() {
    // `RUST_LOG` decides what is logged; without it, `info` shows connections between the
    // ends coming and going but not every client.
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
    let Args { command, drain } = parse_args(&args).unwrap_or_else(|problem| {
        eprintln!("tunnel: {problem}\n\n{USAGE}");
        process::exit(2)
    });

    // Take over the signals before anything starts, so that none arrives while their default
    // action (ending the process on the spot) still applies.
    let signals = Signals::new().unwrap_or_else(|error| {
        eprintln!("tunnel: cannot handle signals: {error}");
        process::exit(1)
    });
    let shutdown = Shutdown::new(drain);
    tokio::spawn(shut_down_on_signals(signals, shutdown.clone()));

    // Runs until the work fails, or a signal has shut it down.
    if let Err(error) = run(command, shutdown).await {
        eprintln!("tunnel: {error}");
        process::exit(1);
    }
}

/// Turns signals into the steps of a shutdown: the first begins it, the second cuts what is
/// left, the third exits at once (should closing the gomux connections hang).
async fn shut_down_on_signals(mut signals: Signals, shutdown: Shutdown) {
    let signal = signals.next().await;
    info!(
        signal,
        drain = ?shutdown.drain,
        "shutting down; send it again to cut the connections still open"
    );
    shutdown.begin.cancel();
    let signal = signals.next().await;
    warn!(signal, "cutting the connections still open");
    shutdown.cut.cancel();
    let signal = signals.next().await;
    warn!(signal, "exiting at once");
    process::exit(130);
}

/// The signals that shut the tunnel down: SIGINT (Ctrl-C) and SIGTERM (what service managers
/// and container runtimes send) on Unix, Ctrl-C elsewhere.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers: from now on these signals no longer end the process by
    /// themselves.
    fn new() -> io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// Waits for the next signal, and names it.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                Some(()) = self.interrupt.recv() => "SIGINT",
                Some(()) = self.terminate.recv() => "SIGTERM",
                // Neither can deliver any more (the runtime is shutting down).
                else => std::future::pending().await,
            }
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "Ctrl-C",
                // Without a handler no signal can come: wait for ever rather than shut down.
                Err(_) => std::future::pending().await,
            }
        }
    }
}

/// Binds the listening addresses, resolves the others once, and runs the chosen end until it
/// has shut down.
async fn run(command: Command, shutdown: Shutdown) -> Result<ShutdownReport, Box<dyn StdError>> {
    Ok(match command {
        Command::Entry {
            listen,
            exit,
            connections,
        } => {
            let clients = bind(&listen).await?;
            let listen = clients.local_addr()?;
            let exit = match exit {
                Via::Dial(addr) => {
                    let exit = resolve(&addr).await?;
                    info!(%listen, %exit, "entry listening");
                    Peer::Dial(exit)
                }
                Via::Accept(addr) => {
                    let exits = bind(&addr).await?;
                    info!(%listen, exits = %exits.local_addr()?, "entry listening");
                    Peer::Accept(exits)
                }
            };
            let options = EntryOptions {
                connections,
                ..EntryOptions::default()
            };
            run_entry(clients, exit, options, shutdown).await
        }
        Command::Exit { entry, target } => {
            let destination = match target {
                TargetArg::Fixed(addr) => Destination::Fixed(resolve(&addr).await?),
                TargetArg::Socks => Destination::Socks,
            };
            let entry = match entry {
                Via::Accept(addr) => {
                    let listener = bind(&addr).await?;
                    info!(listen = %listener.local_addr()?, target = %destination, "exit listening");
                    Peer::Accept(listener)
                }
                Via::Dial(addr) => {
                    let entry = resolve(&addr).await?;
                    info!(%entry, target = %destination, "exit dialling the entry");
                    Peer::Dial(entry)
                }
            };
            run_exit(entry, destination, Redial::default(), shutdown).await
        }
        Command::Relay { listen, target } => {
            let listener = bind(&listen).await?;
            let target = resolve(&target).await?;
            info!(listen = %listener.local_addr()?, %target, "relay listening");
            run_relay(listener, target, shutdown).await
        }
    })
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
pub fn parse_args(args: &[String]) -> Result<Args, String> {
    let Some((mode, options)) = args.split_first() else {
        return Err("say which end to run: entry, exit or relay".into());
    };
    let known: &[&str] = match mode.as_str() {
        "entry" => &[
            "--listen",
            "--exit",
            "--accept-exit",
            "--connections",
            "--drain",
        ],
        "exit" => &["--listen", "--entry", "--target", "--socks", "--drain"],
        "relay" => &["--listen", "--target", "--drain"],
        unknown => return Err(format!("unknown mode {unknown:?}: entry, exit or relay")),
    };

    // Every option once at most; all but `--socks` take a value, an address but for `--drain`.
    let mut given: Vec<(&str, String)> = Vec::new();
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let Some(&flag) = known.iter().find(|&&flag| flag == option.as_str()) else {
            return Err(format!("unknown option {option:?} for {mode}"));
        };
        if given.iter().any(|(seen, _)| *seen == flag) {
            return Err(format!("{flag} is given twice"));
        }
        let value = if flag == "--socks" {
            String::new()
        } else {
            let what = match flag {
                "--drain" => "a number of seconds",
                "--connections" => "a number of connections",
                _ => "an address",
            };
            options
                .next()
                .ok_or_else(|| format!("{flag} needs {what}"))?
                .clone()
        };
        given.push((flag, value));
    }
    let mut take = |flag: &str| {
        given
            .iter()
            .position(|(seen, _)| *seen == flag)
            .map(|at| given.swap_remove(at).1)
    };

    let drain = match take("--drain") {
        None => DEFAULT_DRAIN,
        Some(seconds) => seconds
            .parse::<f64>()
            .ok()
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
            .ok_or_else(|| format!("--drain needs a number of seconds, not {seconds:?}"))?,
    };
    let connections_given = take("--connections");
    let connections = match &connections_given {
        None => 1,
        Some(count) => count
            .parse::<usize>()
            .ok()
            .filter(|&count| (1..=MAX_CONNECTIONS).contains(&count))
            .ok_or_else(|| {
                format!("--connections needs a number from 1 to {MAX_CONNECTIONS}, not {count:?}")
            })?,
    };
    let command = match mode.as_str() {
        "entry" => Command::Entry {
            listen: take("--listen").ok_or("--listen ADDR is required")?,
            connections,
            exit: match (take("--exit"), take("--accept-exit")) {
                (None, Some(_)) if connections_given.is_some() => {
                    return Err(
                        "--connections applies when the entry dials the exit (--exit); \
                                with --accept-exit, the exit dials"
                            .into(),
                    )
                }
                (Some(addr), None) => Via::Dial(addr),
                (None, Some(addr)) => Via::Accept(addr),
                (Some(_), Some(_)) => return Err("give --exit or --accept-exit, not both".into()),
                (None, None) => {
                    return Err(
                        "say how to reach the exit: --exit ADDR to dial it, or --accept-exit \
                         ADDR to let it dial in"
                            .into(),
                    )
                }
            },
        },
        "exit" => Command::Exit {
            entry: match (take("--listen"), take("--entry")) {
                (Some(addr), None) => Via::Accept(addr),
                (None, Some(addr)) => Via::Dial(addr),
                (Some(_), Some(_)) => return Err("give --listen or --entry, not both".into()),
                (None, None) => {
                    return Err(
                        "say how to reach the entry: --listen ADDR to let it dial in, or \
                         --entry ADDR to dial it"
                            .into(),
                    )
                }
            },
            target: match (take("--target"), take("--socks")) {
                (Some(addr), None) => TargetArg::Fixed(addr),
                (None, Some(_)) => TargetArg::Socks,
                (Some(_), Some(_)) => return Err("give --target or --socks, not both".into()),
                (None, None) => return Err("--target ADDR or --socks is required".into()),
            },
        },
        _ => Command::Relay {
            listen: take("--listen").ok_or("--listen ADDR is required")?,
            target: take("--target").ok_or("--target ADDR is required")?,
        },
    };
    Ok(Args { command, drain })
}

// ---------------------------------------------------------------------------------------------
// Shutting down
// ---------------------------------------------------------------------------------------------

/// Tells an end to shut down, in two steps (`main` takes them on a first and a second signal).
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// Cancelled to begin: the end takes no new clients and no new gomux connections, dials no
    /// more, and closes its gomux connections once the connections they relay have finished.
    pub begin: CancellationToken,
    /// Cancelled to cut at once the connections still being relayed (after `begin`).
    pub cut: CancellationToken,
    /// How long the connections being relayed get to finish once the shutdown has begun; what
    /// is left then is cut.
    pub drain: Duration,
}

impl Shutdown {
    pub fn new(drain: Duration) -> Shutdown {
        Shutdown {
            begin: CancellationToken::new(),
            cut: CancellationToken::new(),
            drain,
        }
    }
}

/// How an end's shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Client connections (at the exit: streams) being handled when the shutdown began.
    pub connections: usize,
    /// Those still open at the drain deadline, or when the drain was cut short, and cut.
    pub cut: usize,
}

/// What an end has under way, so that its shutdown can say how much there is and wait for it.
#[derive(Clone, Default)]
struct Work {
    /// Tasks that make gomux connections (dialling, accepting) or own one.
    sessions: Tracker,
    /// Tasks that each handle one client connection (at the exit: one stream).
    relays: Tracker,
    /// Connections being relayed when the shutdown began, as each drain found them.
    connections: Arc<AtomicUsize>,
    /// Connections cut by the shutdown, as each drain reports them.
    cut: Arc<AtomicUsize>,
}

impl Work {
    /// Waits for the work under way to finish, once the shutdown has begun and nothing new is
    /// taken: each gomux connection drains (see [`drain`]) and is closed, cutting what is left
    /// at the deadline or when the shutdown is cut short, and the relays end with it. Logs how
    /// it went, and reports it.
    async fn wind_down(&self, shutdown: &Shutdown) -> ShutdownReport {
        self.log_start(shutdown);
        tokio::select! {
            () = async {
                self.sessions.idle().await;
                self.relays.idle().await;
            } => {}
            // The drains cut their relays. Relays whose session had ended before may still be
            // delivering what their stream holds, within `DELIVERY_GRACE`: not waited for.
            () = shutdown.cut.cancelled() => self.sessions.idle().await,
        }
        self.report(shutdown)
    }

    fn log_start(&self, shutdown: &Shutdown) {
        info!(
            drain = ?shutdown.drain,
            "shutting down: taking no new connections, letting those being relayed finish"
        );
    }

    fn report(&self, shutdown: &Shutdown) -> ShutdownReport {
        let connections = self.connections.load(Ordering::Relaxed);
        let cut = self.cut.load(Ordering::Relaxed);
        if cut == 0 {
            info!(connections, "shut down: every connection finished");
        } else if shutdown.cut.is_cancelled() {
            warn!(connections, cut, "shut down: the drain was cut short");
        } else {
            warn!(connections, cut, drain = ?shutdown.drain, "shut down: the drain deadline passed");
        }
        ShutdownReport { connections, cut }
    }
}

/// Counts the tasks of one kind under way, and tells when none is left.
#[derive(Clone)]
struct Tracker(Arc<watch::Sender<usize>>);

impl Default for Tracker {
    fn default() -> Tracker {
        Tracker(Arc::new(watch::Sender::new(0)))
    }
}

impl Tracker {
    /// Counts one more task until the guard is dropped. Take it before spawning the task, so
    /// that a wait for none cannot miss a task that has not started yet.
    fn track(&self) -> Tracked {
        self.0.send_modify(|count| *count += 1);
        Tracked(Arc::clone(&self.0))
    }

    fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until no task is counted.
    async fn idle(&self) {
        // The sender lives in `self`, so the wait cannot fail.
        let _ = self.0.subscribe().wait_for(|&count| count == 0).await;
    }
}

/// One task counted by a [`Tracker`], until dropped (with the task's future, however it ends).
struct Tracked(Arc<watch::Sender<usize>>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count -= 1);
    }
}

/// Drains one gomux connection (or the entry's pool of them, all at once) once the shutdown
/// has begun: the other end's new streams are refused, the streams open go on until they
/// finish, then the connection is closed. At the drain deadline, or when the shutdown is cut
/// short, the streams left are cut, and so are their relays, through `end`. Counts both in
/// `work`.
///
/// The only one to cut the relays of a live session, and only once it has counted them: a
/// relay cut earlier would take its stream with it, uncounted.
async fn drain(session: &impl Drain, shutdown: &Shutdown, work: &Work, end: &SessionEnd) {
    if session.is_closed() {
        return; // it ended by itself meanwhile: nothing to drain
    }
    let streams = session.stream_count();
    work.connections.fetch_add(streams, Ordering::Relaxed);
    info!(streams, "draining the connection");
    let outcome = tokio::select! {
        // Checked first: once the shutdown is cut short, a drain that has not finished yet
        // has nothing left to wait for.
        biased;
        () = shutdown.cut.cancelled() => {
            let streams = session.stream_count();
            // Stops waiting for the streams, though not for the other end's answer to our
            // CloseMux, which an end of this program sends at once (and which the session's
            // close timeout bounds).
            let _ = session.close().await;
            Err(Error::GracefulCloseTimedOut { streams })
        }
        outcome = session.graceful_close(shutdown.drain) => outcome,
    };
    match outcome {
        Ok(()) => info!("drained: the connection is closed"),
        Err(Error::GracefulCloseTimedOut { streams }) => {
            // Cut means cut: a relay does not go on delivering what its stream still holds.
            end.cut.cancel();
            work.cut.fetch_add(streams, Ordering::Relaxed);
            warn!(
                streams,
                "cut the streams still open, and closed the connection"
            );
        }
        Err(error) => warn!(%error, "the connection failed while draining"),
    }
}

/// What [`drain`] closes: a session, or the entry's pool of sessions to the exit.
trait Drain {
    /// Whether there is nothing left to drain.
    fn is_closed(&self) -> bool;
    /// The streams being relayed.
    fn stream_count(&self) -> usize;
    fn graceful_close(&self, timeout: Duration) -> impl Future<Output = Result<(), Error>>;
    fn close(&self) -> impl Future<Output = Result<(), Error>>;
}

impl Drain for Session {
    fn is_closed(&self) -> bool {
        Session::is_closed(self)
    }
    fn stream_count(&self) -> usize {
        Session::stream_count(self)
    }
    fn graceful_close(&self, timeout: Duration) -> impl Future<Output = Result<(), Error>> {
        Session::graceful_close(self, timeout)
    }
    fn close(&self) -> impl Future<Output = Result<(), Error>> {
        Session::close(self)
    }
}

impl Drain for Pool {
    fn is_closed(&self) -> bool {
        self.live() == 0
    }
    fn stream_count(&self) -> usize {
        let sessions = self.sessions();
        sessions.iter().map(|s| s.session().stream_count()).sum()
    }
    fn graceful_close(&self, timeout: Duration) -> impl Future<Output = Result<(), Error>> {
        Pool::graceful_close(self, timeout)
    }
    fn close(&self) -> impl Future<Output = Result<(), Error>> {
        Pool::close(self)
    }
}

/// How the relays of one gomux connection learn that it has ended.
///
/// Through tokens that one task per session cancels, rather than each relay waiting on
/// [`Session::closed`]: a token forgets a waiter as soon as it stops waiting, so a session that
/// carries millions of short connections keeps nothing of them.
#[derive(Clone, Default)]
pub struct SessionEnd {
    /// Cancelled once the session has ended. A relay then stops reading its TCP side (nothing
    /// can be sent on the stream any more), and delivers what its stream still holds: all the
    /// rest, when the other end finished sending before it closed the connection. Within
    /// [`DELIVERY_GRACE`], then it is cut.
    pub ended: CancellationToken,
    /// Cancelled to cut the relays at once: the drain deadline passed, or the shutdown was cut
    /// short.
    pub cut: CancellationToken,
}

// ---------------------------------------------------------------------------------------------
// Making the gomux connection
// ---------------------------------------------------------------------------------------------

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
struct Dialler {
    addr: SocketAddr,
    redial: Redial,
    /// "exit" or "entry", for the logs.
    other: &'static str,
    /// How many connections have been made, so that logs can tell them apart.
    number: u64,
    delay: Duration,
    /// When the latest connection was made.
    connected_at: Option<Instant>,
}

impl Dialler {
    fn new(addr: SocketAddr, redial: Redial, other: &'static str) -> Dialler {
        Dialler {
            addr,
            delay: redial.backoff_initial,
            redial,
            other,
            number: 0,
            connected_at: None,
        }
    }

    /// A new session with the other end, in the client role, once a dial succeeds. Called
    /// again after the previous session has ended.
    async fn connect(&mut self) -> Session {
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
            match connect(self.addr, self.redial.dial_timeout).await {
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

// ---------------------------------------------------------------------------------------------
// The entry
// ---------------------------------------------------------------------------------------------

/// How the entry keeps its connections to the exit, and how long clients wait for one.
#[derive(Debug, Clone)]
pub struct EntryOptions {
    /// How the entry dials the exit (unused when the exit dials in).
    pub redial: Redial,
    /// How many connections the entry keeps to the exit when it dials it (`--connections`).
    pub connections: usize,
    /// How long a new client waits for a connection to the exit before it is turned away.
    pub client_wait: Duration,
}

impl Default for EntryOptions {
    fn default() -> EntryOptions {
        EntryOptions {
            redial: Redial::default(),
            connections: 1,
            client_wait: Duration::from_secs(10),
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
pub async fn run_entry(
    clients: TcpListener,
    exit: Peer,
    options: EntryOptions,
    shutdown: Shutdown,
) -> ShutdownReport {
    let work = Work::default();
    let connecting = work.sessions.track();
    let (exits, connections) = match exit {
        Peer::Dial(addr) => {
            let dialled = Dialled::new(addr, &options, &shutdown, &work);
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
            let accept = accept_exits(listener, publish, shutdown.clone(), work.clone());
            (
                Exits::Latest(links),
                tokio::spawn(tracked(connecting, accept)),
            )
        }
    };
    let _connections = AbortOnDrop(connections);

    let mut count = 0u64;
    loop {
        let (socket, peer) = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => break,
            accepted = accept(&clients) => accepted,
        };
        count += 1;

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
        let client = serve_client(socket, exits.clone(), options.client_wait, shutdown.clone());
        tokio::spawn(tracked(work.relays.track(), client).instrument(span));
    }
    // Clients that connect from now on are refused.
    drop(clients);
    work.wind_down(&shutdown).await
}

/// How a client reaches the exit.
#[derive(Clone)]
enum Exits {
    /// Through the entry's own connections to the exit.
    Dialled(Dialled),
    /// Through the latest connection an exit dialled in on: `None` while there is none.
    Latest(watch::Receiver<Option<Link>>),
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
    fn new(exit: SocketAddr, options: &EntryOptions, shutdown: &Shutdown, work: &Work) -> Dialled {
        let Redial {
            backoff_initial,
            backoff_max,
            dial_timeout,
        } = options.redial;
        let pool = Pool::builder(options.connections)
            .config(mux_config())
            .backoff(backoff_initial, backoff_max)
            .connect_timeout(dial_timeout)
            .build(move || async move {
                match connect(exit, dial_timeout).await {
                    Ok(socket) => {
                        info!(%exit, "connected to the exit");
                        Ok(socket)
                    }
                    Err(error) => {
                        warn!(%exit, %error, "cannot reach the exit");
                        Err(error)
                    }
                }
            });
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
                opened = tokio::time::timeout_at(deadline, self.pool.open_with_session()) => opened,
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
                warn!(%error, ?wait, "no connection to the exit; turning the client away");
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
/// it is the latest, until the shutdown begins.
async fn accept_exits(
    listener: TcpListener,
    publish: watch::Sender<Option<Link>>,
    shutdown: Shutdown,
    work: Work,
) {
    let mut count = 0u64;
    loop {
        let (socket, peer) = tokio::select! {
            biased;
            // Returning closes the listener: exits that dial in from now on are refused.
            () = shutdown.begin.cancelled() => return,
            accepted = accept(&listener) => accepted,
        };
        count += 1;
        let number = count;
        let connection = {
            let (publish, shutdown, work) = (publish.clone(), shutdown.clone(), work.clone());
            async move {
                info!("exit connected");
                let session = Session::with_config(socket, Role::Server, mux_config());
                let reason = carry_clients(number, session, &publish, &shutdown, &work).await;
                // When shutting down, the drain has logged how it went.
                if !shutdown.begin.is_cancelled() {
                    if reason.is_graceful() {
                        info!(%reason, "exit disconnected"); // it was shut down on purpose
                    } else {
                        warn!(%reason, "exit disconnected");
                    }
                }
            }
        };
        // A task per connection: each one waits for its session's end.
        let span = info_span!("session", session = number, %peer);
        tokio::spawn(tracked(work.sessions.track(), connection).instrument(span));
    }
}

/// Makes `session` the one that carries new clients, until it ends (and returns why). Once the
/// shutdown begins, drains it.
async fn carry_clients(
    number: u64,
    session: Session,
    publish: &watch::Sender<Option<Link>>,
    shutdown: &Shutdown,
    work: &Work,
) -> Error {
    let end = SessionEnd::default();
    publish.send_replace(Some(Link {
        number,
        session: session.clone(),
        end: end.clone(),
    }));

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

/// Forwards one client connection through a gomux connection to the exit.
async fn serve_client(client: TcpStream, exits: Exits, wait: Duration, shutdown: Shutdown) {
    let opened = match exits {
        Exits::Dialled(dialled) => dialled.open(wait).await,
        Exits::Latest(links) => open_on_latest(links, wait, &shutdown).await,
    };
    let Some((number, stream, end)) = opened else {
        return;
    };
    let span = Span::current();
    span.record("session", number);
    span.record("stream", stream.id());
    debug!("forwarding");
    // A stream the exit refuses (its accept backlog is full, or it is shutting down) is closed
    // by it at once: `carry` then closes the client too.
    carry(client, stream, &end).await;
}

/// Opens a stream on the latest connection an exit dialled in on, waiting up to `wait` for
/// one. `None` when the client is to be turned away.
async fn open_on_latest(
    mut links: watch::Receiver<Option<Link>>,
    wait: Duration,
    shutdown: &Shutdown,
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
                Ok(Ok(link)) => link.clone(),
                Ok(Err(_)) => return None, // nothing publishes connections any more: the entry stopped
                Err(_) => {
                    warn!(?wait, "no connection to the exit; turning the client away");
                    return None;
                }
            },
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

/// Runs `future`, counted by `guard` until it finishes or is dropped. The guard is taken by
/// the caller, before the future is spawned.
async fn tracked<F: Future>(guard: Tracked, future: F) -> F::Output {
    let _guard = guard;
    future.await
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
pub async fn run_exit(
    entry: Peer,
    destination: Destination,
    redial: Redial,
    shutdown: Shutdown,
) -> ShutdownReport {
    let work = Work::default();
    let connecting = work.sessions.track();
    let _connections = AbortOnDrop(match entry {
        Peer::Accept(listener) => {
            let accept = accept_entries(listener, destination, shutdown.clone(), work.clone());
            tokio::spawn(tracked(connecting, accept))
        }
        Peer::Dial(addr) => {
            let dial = dial_entry(addr, redial, destination, shutdown.clone(), work.clone());
            tokio::spawn(tracked(connecting, dial))
        }
    });
    shutdown.begin.cancelled().await;
    work.wind_down(&shutdown).await
}

/// Accepts gomux connections from entries and serves each one's streams, until the shutdown
/// begins.
async fn accept_entries(
    listener: TcpListener,
    destination: Destination,
    shutdown: Shutdown,
    work: Work,
) {
    let mut sessions = 0u64;
    loop {
        let (socket, peer) = tokio::select! {
            biased;
            // Returning closes the listener: entries that dial in from now on are refused.
            () = shutdown.begin.cancelled() => return,
            accepted = accept(&listener) => accepted,
        };
        sessions += 1;
        let serve = {
            let (shutdown, work) = (shutdown.clone(), work.clone());
            async move {
                info!("entry connected");
                let session = Session::with_config(socket, Role::Server, mux_config());
                let (reason, streams) = serve_streams(session, destination, &shutdown, &work).await;
                info!(%reason, streams, "entry disconnected");
            }
        };
        let span = info_span!("session", session = sessions, %peer);
        tokio::spawn(tracked(work.sessions.track(), serve).instrument(span));
    }
}

/// Keeps a gomux connection to the entry up, serving its streams, until the shutdown begins.
async fn dial_entry(
    addr: SocketAddr,
    redial: Redial,
    destination: Destination,
    shutdown: Shutdown,
    work: Work,
) {
    let mut dialler = Dialler::new(addr, redial, "entry");
    loop {
        let session = tokio::select! {
            biased;
            () = shutdown.begin.cancelled() => return,
            session = dialler.connect() => session,
        };
        let span = info_span!("session", session = dialler.number);
        span.in_scope(|| info!(entry = %addr, "connected to the entry"));
        let (reason, streams) = serve_streams(session, destination, &shutdown, &work)
            .instrument(span.clone())
            .await;
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
    destination: Destination,
    shutdown: &Shutdown,
    work: &Work,
) -> (Error, u64) {
    // Told when the session ends. Not when `accept` fails: a draining session fails it at
    // once, while its streams go on.
    let end = SessionEnd::default();
    let mut streams = 0u64;
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
        let end = end.clone();
        let forward = async move {
            match destination {
                Destination::Fixed(target) => forward(stream, end, target).await,
                Destination::Socks => forward_socks(stream, end).await,
            }
        };
        tokio::spawn(tracked(work.relays.track(), forward).instrument(span));
    }
    let reason = session.closed().await;
    end.ended.cancel();
    (reason, streams)
}

/// Connects one stream to the target and relays until both directions are done.
async fn forward(mut stream: Stream, end: SessionEnd, target: SocketAddr) {
    let connected = tokio::select! {
        connected = connect(target, TARGET_CONNECT_TIMEOUT) => connected,
        // The session ended meanwhile (a shutdown cut it, say): nobody is left to serve.
        () = end.ended.cancelled() => return,
    };
    let socket = match connected {
        Ok(socket) => socket,
        Err(error) => {
            // Close this stream only: its client is closed, the session goes on.
            warn!(%target, %error, "cannot reach the target; closing the stream");
            let _ = stream.close().await;
            return;
        }
    };
    debug!("forwarding");
    carry(socket, stream, &end).await;
}

/// Answers the SOCKS5 request at the start of one stream, connects it to the address
/// requested, and relays until both directions are done.
///
/// The greeting offers "no authentication" only, and the only command served is CONNECT; a
/// host name is resolved here. Anything else is answered with the SOCKS5 error that fits, and
/// the stream closed. Parsing is `fast_socks5`'s: it reads fixed-size fields and lengths of one
/// byte (at most 255 authentication methods, host names of at most 255 bytes), so a peer
/// cannot make it read or allocate more.
async fn forward_socks(stream: Stream, end: SessionEnd) {
    let stream = WholeWrites::new(stream);
    let request = async {
        Socks5ServerProtocol::accept_no_auth(stream)
            .await?
            .read_command()
            .await
    };
    let (socks, command, requested) =
        match tokio::time::timeout(SOCKS_REQUEST_TIMEOUT, request).await {
            Ok(Ok(request)) => request,
            Ok(Err(error)) => {
                // Already answered with an error reply where the protocol has one; dropping
                // the stream closes it.
                info!(%error, "not a SOCKS5 request this exit serves; closing the stream");
                return;
            }
            Err(_) => {
                info!(timeout = ?SOCKS_REQUEST_TIMEOUT, "no SOCKS5 request; closing the stream");
                return;
            }
        };
    if !matches!(command, Socks5Command::TCPConnect) {
        info!(?command, "only SOCKS5 CONNECT is served; refusing");
        let _ = socks.reply_error(&ReplyError::CommandNotSupported).await;
        return;
    }

    let connected = tokio::select! {
        connected = connect_requested(&requested) => connected,
        // As in `forward`.
        () = end.ended.cancelled() => return,
    };
    let socket = match connected {
        Ok(socket) => socket,
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
    let stream = match socks.reply_success(bound).await {
        Ok(stream) => stream.into_inner(),
        Err(error) => {
            debug!(%error, "the client went away before the SOCKS5 reply");
            return;
        }
    };
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
/// trying its addresses in turn; all within [`TARGET_CONNECT_TIMEOUT`].
async fn connect_requested(requested: &TargetAddr) -> io::Result<TcpStream> {
    let connecting = async {
        let socket = match requested {
            TargetAddr::Ip(addr) => TcpStream::connect(addr).await?,
            TargetAddr::Domain(host, port) => TcpStream::connect((host.as_str(), *port)).await?,
        };
        // As for every connection the tunnel makes: see `connect`.
        socket.set_nodelay(true)?;
        Ok(socket)
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

// ---------------------------------------------------------------------------------------------
// The relay, for comparison
// ---------------------------------------------------------------------------------------------

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
                Ok(socket) => bridge(client, socket, cut.cancelled()).await,
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

// ---------------------------------------------------------------------------------------------
// Shared by both ends
// ---------------------------------------------------------------------------------------------

/// Session settings for both ends. Both are this program, so each may expect the other's
/// keepalives: a connection silent for the idle timeout is dead (a peer that vanished without
/// closing, a network that dropped it), and ending it lets the dialling end dial again instead
/// of waiting for TCP to notice, which can take many minutes.
fn mux_config() -> Config {
    Config::default()
        .keepalive_interval(Some(Duration::from_secs(10)))
        .idle_timeout(Some(Duration::from_secs(45)))
}

/// Relays between a TCP connection and a gomux stream until both directions are done, the
/// other end has closed the stream both ways, or the session carrying the stream ends (see
/// [`SessionEnd`]). See [`bridge`].
///
/// When the session ends, the relay stops reading the TCP side, whose bytes could not be sent
/// any more, but goes on writing what the stream still holds to it: when the other end
/// drained and closed the connection, that is the end of a reply, which the client would
/// otherwise lose without knowing. Within [`DELIVERY_GRACE`], unless `end.cut` comes first.
pub async fn carry(tcp: TcpStream, stream: Stream, end: &SessionEnd) {
    let stop = async {
        tokio::select! {
            () = async {
                end.ended.cancelled().await;
                tokio::time::sleep(DELIVERY_GRACE).await;
            } => debug!(grace = ?DELIVERY_GRACE, "the client did not take the rest in time"),
            () = end.cut.cancelled() => {}
        }
    };
    let tcp = UntilEnded::new(tcp, end.ended.clone());
    bridge(tcp, EndsWhenPeerCloses(stream), stop).await;
}

/// Relays between a TCP connection and a gomux stream (or, in the relay, another TCP
/// connection) until both directions are done, or `stop` resolves.
///
/// Half-closes travel through: when one side reads end-of-file, the other side's write half is
/// shut down (a TCP FIN one way, a gomux CloseRead the other), and the other direction keeps
/// flowing until it ends too. Any error ends both.
async fn bridge<A, B>(mut tcp: A, mut stream: B, stop: impl Future<Output = ()>)
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
        // A direction blocked reading a TCP side would not notice the end of the session, or
        // of the relay, until that side sent something, which could be never: stop now.
        () = stop => debug!("stopped"),
    }
    // Returning drops both: the TCP connection closes, and the stream sends its close.
}

/// The TCP side of a relay, which reads as ended once the session carrying the stream has
/// (`ended` is cancelled): nothing it sends could go anywhere. The relay then shuts the stream
/// down, which [`EndsWhenPeerCloses`] lets succeed, and goes on with the other direction, the
/// rest of the stream, untouched. (Dropping the relay instead would lose what it holds.)
struct UntilEnded<T> {
    io: T,
    ended: CancellationToken,
    /// Waits for `ended`, so that a read blocked on the TCP side wakes when it is cancelled.
    waiting: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl<T> UntilEnded<T> {
    fn new(io: T, ended: CancellationToken) -> UntilEnded<T> {
        UntilEnded {
            io,
            waiting: Box::pin(ended.clone().cancelled_owned()),
            ended,
        }
    }
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
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            // Registered only while the read waits, so a busy connection does not pay for it.
            Poll::Pending if this.waiting.as_mut().poll(cx).is_ready() => Poll::Ready(Ok(())),
            other => other,
        }
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
struct EndsWhenPeerCloses(Stream);

impl AsyncRead for EndsWhenPeerCloses {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let stream = &mut self.get_mut().0;
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
        Pin::new(&mut self.get_mut().0).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = ready!(Pin::new(&mut self.get_mut().0).poll_flush(cx));
        Poll::Ready(done_if_session_ended(result))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = ready!(Pin::new(&mut self.get_mut().0).poll_shutdown(cx));
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
