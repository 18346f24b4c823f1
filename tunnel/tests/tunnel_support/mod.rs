//! The tunnel under test, shared by `tests/tunnel.rs` and `tests/socks.rs`: an entry and an
//! exit in this process on ephemeral loopback ports, in either direction, joined by a [`Link`]
//! the tests can cut, each end with the shutdown trigger its signals would fire. The two ends
//! authenticate each other with pinned TLS, as the tool does by default.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use gomux_tunnel::config::Handshakes;
use gomux_tunnel::{
    run_entry, run_exit, Destination, EntryOptions, ExitOptions, Identity, Meeting, Peer, Redial,
    Security, Shutdown, ShutdownReport,
};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// Which end dials the gomux connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The entry dials the exit (`entry --exit`, `exit --listen`).
    Forward,
    /// The exit dials the entry (`exit --entry`, `entry --accept-exit`).
    Reverse,
}

/// How long an end's connections get to finish when it shuts down, unless a test says
/// otherwise: longer than any test waits, so that a drain that does not finish fails the test.
pub const DRAIN: Duration = Duration::from_secs(600);

/// An entry and an exit in this process, joined by a cuttable [`Link`].
pub struct Tunnel {
    /// Where clients connect.
    pub entry: SocketAddr,
    /// Between the dialling end and the listening one.
    pub link: Link,
    /// The entry's task, and its shutdown.
    pub entry_end: End,
    /// The exit's task, and its shutdown.
    pub exit_end: End,
}

impl Tunnel {
    pub async fn start(direction: Direction, destination: Destination) -> Tunnel {
        Tunnel::start_with_drain(direction, destination, DRAIN).await
    }

    /// A tunnel whose ends give their connections `drain` to finish when they shut down.
    pub async fn start_with_drain(
        direction: Direction,
        destination: Destination,
        drain: Duration,
    ) -> Tunnel {
        Tunnel::start_with(direction, destination, drain, entry_options()).await
    }

    /// A tunnel whose entry runs with `options` (its connections to the exit, say).
    pub async fn start_with(
        direction: Direction,
        destination: Destination,
        drain: Duration,
        options: EntryOptions,
    ) -> Tunnel {
        init_logs();
        let clients = bind().await;
        let entry = clients.local_addr().expect("entry address");
        // The end that listens for the gomux connection, and the link in front of it.
        let listening = bind().await;
        let link = Link::spawn(listening.local_addr().expect("address")).await;
        let (entry_peer, exit_peer) = match direction {
            Direction::Forward => (Peer::Dial(link.addr), Peer::Accept(listening)),
            Direction::Reverse => (Peer::Accept(listening), Peer::Dial(link.addr)),
        };
        let exit_end = End::spawn(drain, |shutdown| {
            run_exit(
                exit_peer,
                destination,
                exit_options(),
                exit_meeting(),
                shutdown,
            )
        });
        let entry_end = End::spawn(drain, |shutdown| {
            run_entry(clients, entry_peer, options, entry_meeting(), shutdown)
        });
        Tunnel {
            entry,
            link,
            entry_end,
            exit_end,
        }
    }
}

/// One end of the tunnel (or a relay) running in a task of its own, with the [`Shutdown`] that
/// its signals would fire.
pub struct End {
    pub shutdown: Shutdown,
    task: Task<ShutdownReport>,
}

impl End {
    /// Runs the end that `run` makes of a new shutdown trigger.
    pub fn spawn<F, Fut>(drain: Duration, run: F) -> End
    where
        F: FnOnce(Shutdown) -> Fut,
        Fut: Future<Output = ShutdownReport> + Send + 'static,
    {
        let shutdown = Shutdown::new(drain);
        End {
            task: Task::spawn(run(shutdown.clone())),
            shutdown,
        }
    }

    /// Begins the shutdown, as a first Ctrl-C does.
    pub fn shut_down(&self) {
        self.shutdown.begin.cancel();
    }

    /// Cuts the drain short, as a second Ctrl-C does.
    pub fn cut(&self) {
        self.shutdown.cut.cancel();
    }

    /// Waits for the end to have shut down by itself (within a test step), and returns how it
    /// went.
    pub async fn stopped(&mut self) -> ShutdownReport {
        crate::common::within("the end to shut down", &mut self.task.0)
            .await
            .expect("the end does not panic")
    }
}

/// A loopback listener on an ephemeral port.
pub async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

/// Dialling settings that re-dial quickly, so the tests do not wait on backoff.
pub fn fast_redial() -> Redial {
    Redial {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..Redial::default()
    }
}

/// Exit settings with [`fast_redial`], every target allowed.
pub fn exit_options() -> ExitOptions {
    ExitOptions {
        redial: fast_redial(),
        ..ExitOptions::default()
    }
}

/// The two ends' key pairs, made once per test binary: (entry, exit).
fn identities() -> &'static (Identity, Identity) {
    static IDENTITIES: OnceLock<(Identity, Identity)> = OnceLock::new();
    IDENTITIES.get_or_init(|| {
        let made = || Identity::generate().expect("a key pair");
        (made(), made())
    })
}

/// The entry's side of pinned TLS: its own key, the exit's fingerprint.
pub fn entry_meeting() -> Meeting {
    let (entry, exit) = identities();
    meeting(entry, exit)
}

/// The exit's side of pinned TLS: its own key, the entry's fingerprint.
pub fn exit_meeting() -> Meeting {
    let (entry, exit) = identities();
    meeting(exit, entry)
}

fn meeting(own: &Identity, peer: &Identity) -> Meeting {
    Meeting {
        security: Security::pinned(own, peer.fingerprint()).expect("TLS settings"),
        handshakes: Handshakes::default(),
    }
}

/// Entry settings with [`fast_redial`].
pub fn entry_options() -> EntryOptions {
    EntryOptions {
        redial: fast_redial(),
        ..EntryOptions::default()
    }
}

/// Logs of the tunnel in the test output, filtered by `RUST_LOG` (warnings by default).
pub fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Another test of this binary may have installed it already.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A TCP relay between the dialling end and the listening one that counts the connections it
/// carries and can cut them all, as a failing network would.
pub struct Link {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    live: Arc<Mutex<Vec<AbortHandle>>>,
    _task: Task,
}

impl Link {
    pub async fn spawn(to: SocketAddr) -> Link {
        let listener = bind().await;
        let addr = listener.local_addr().expect("link address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let live = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (accepted, live) = (Arc::clone(&accepted), Arc::clone(&live));
            Task::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let relay = tokio::spawn(async move {
                        let mut outbound = TcpStream::connect(to).await?;
                        inbound.set_nodelay(true)?;
                        outbound.set_nodelay(true)?;
                        tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await
                    });
                    live.lock()
                        .expect("not poisoned")
                        .push(relay.abort_handle());
                }
            })
        };
        Link {
            addr,
            accepted,
            live,
            _task: task,
        }
    }

    /// How many connections the dialling end has made through the link so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Checks how many connections the dialling end has made through the link so far.
    #[track_caller]
    pub fn assert_connections(&self, expected: usize, why: &str) {
        assert_eq!(self.connections(), expected, "{why}");
    }

    /// Drops every connection the link carries: both of its sockets close at once.
    pub fn cut(&self) {
        for relay in self.live.lock().expect("not poisoned").drain(..) {
            relay.abort();
        }
    }
}

/// A spawned task that is aborted when this handle is dropped, so each test stops what it
/// started.
pub struct Task<T = ()>(pub JoinHandle<T>);

impl<T: Send + 'static> Task<T> {
    pub fn spawn<F>(future: F) -> Task<T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        Task(tokio::spawn(future))
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
