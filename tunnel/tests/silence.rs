//! Silence between the ends, on tokio's paused clock.
//!
//! A Go gomux end sends nothing while it is idle except a keepalive after ten quiet minutes
//! (`writeLoop` in `../shared/gomux-go/mux.go`), so an idle plain tunnel between a Go end and
//! this one must outlast ten minutes of silence: here against an exit made of a session that
//! sends a keepalive only every 600 s and echoes every stream.
//!
//! An end of this program keeps talking (a keepalive every 10 s, announced in its greeting),
//! so when one goes silent without closing (a frozen process, a network that drops the
//! connection) the other notices within twice that and dials again.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::sync::Mutex;

use gomux::{Config, Role, Session};
use gomux_tunnel::config::Handshakes;
use gomux_tunnel::{
    run_entry, run_exit, Destination, EntryOptions, ExitOptions, Meeting, Peer, Redial, Security,
    Shutdown,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Go gomux's keepalive interval (`keepaliveInterval` in its `writeLoop`).
const GO_KEEPALIVE: Duration = Duration::from_secs(600);

/// An exit as quiet as a Go one: every stream echoed, nothing sent unprompted but a keepalive
/// every [`GO_KEEPALIVE`]. Counts the connections it accepts.
async fn quiet_exit() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let config = Config::go_peer().keepalive_interval(Some(GO_KEEPALIVE));
            let session = Session::with_config(socket, Role::Server, config);
            tokio::spawn(async move {
                while let Ok(stream) = session.accept().await {
                    tokio::spawn(async move {
                        let (mut reader, mut writer) = tokio::io::split(stream);
                        let _ = tokio::io::copy(&mut reader, &mut writer).await;
                        let _ = writer.shutdown().await;
                    });
                }
            });
        }
    });
    (addr, connections)
}

/// Plain TCP between the ends, as `--insecure`.
fn plain() -> Meeting {
    Meeting {
        security: Security::Insecure,
        handshakes: Handshakes::default(),
    }
}

/// An echo server.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = socket.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
                let _ = writer.shutdown().await;
            });
        }
    });
    addr
}

/// A TCP relay to `to` whose connections can be frozen: they stop carrying anything, and stay
/// open, as across a network that drops every packet.
struct Freezer {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    frozen: Arc<Mutex<Vec<CancellationToken>>>,
}

impl Freezer {
    async fn spawn(to: SocketAddr) -> Freezer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let frozen: Arc<Mutex<Vec<CancellationToken>>> = Arc::default();
        let (count, tokens) = (Arc::clone(&accepted), Arc::clone(&frozen));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let freeze = CancellationToken::new();
                tokens.lock().expect("not poisoned").push(freeze.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = freeze.cancelled() => {
                            // Both sockets stay open, and nothing more crosses.
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Freezer {
            addr,
            accepted,
            frozen,
        }
    }

    /// Freezes every connection it carries now.
    fn freeze(&self) {
        for token in self.frozen.lock().expect("not poisoned").drain(..) {
            token.cancel();
        }
    }

    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Sends `message` and reads it back, within a test step.
async fn exchange(client: &mut TcpStream, message: &[u8], what: &str) {
    common::within(what, async {
        client.write_all(message).await.expect("send");
        let mut echo = vec![0; message.len()];
        client
            .read_exact(&mut echo)
            .await
            .unwrap_or_else(|e| panic!("{what}: the echo: {e}"));
        assert_eq!(echo, message, "{what}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_plain_tunnel_to_a_go_quiet_exit_outlasts_its_keepalive_interval() {
    let (exit, exit_connections) = quiet_exit().await;
    let clients = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let entry_addr = clients.local_addr().expect("address");
    let shutdown = Shutdown::new(Duration::from_secs(1));
    let entry = tokio::spawn(run_entry(
        clients,
        Peer::Dial(exit),
        EntryOptions::default(),
        plain(),
        shutdown.clone(),
    ));

    let mut client = TcpStream::connect(entry_addr).await.expect("connect");
    exchange(&mut client, b"before the silence", "the first exchange").await;

    // Fifteen minutes with nothing to carry: the exit says nothing for ten of them at a time.
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;

    exchange(&mut client, b"after the silence", "the same client, later").await;
    let mut late = TcpStream::connect(entry_addr).await.expect("connect");
    exchange(&mut late, b"a new client", "a new client, later").await;
    assert_eq!(
        exit_connections.load(Ordering::SeqCst),
        1,
        "one connection to the exit all along"
    );

    shutdown.begin.cancel();
    drop((client, late));
    let report = common::within("the entry to shut down", entry)
        .await
        .expect("the entry does not panic");
    assert_eq!(report.cut, 0, "nothing left to cut");
}

#[tokio::test(start_paused = true)]
async fn a_tunnel_end_gone_silent_is_noticed_within_twice_its_keepalive_interval() {
    let echo = echo_server().await;
    let exits = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let link = Freezer::spawn(exits.local_addr().expect("address")).await;
    let exit_shutdown = Shutdown::new(Duration::from_secs(1));
    let _exit = tokio::spawn(run_exit(
        Peer::Accept(exits),
        Destination::Fixed(echo),
        ExitOptions::default(),
        plain(),
        exit_shutdown.clone(),
    ));
    let clients = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let entry_addr = clients.local_addr().expect("address");
    let options = EntryOptions {
        redial: Redial {
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
            ..Redial::default()
        },
        ..EntryOptions::default()
    };
    let shutdown = Shutdown::new(Duration::from_secs(1));
    let _entry = tokio::spawn(run_entry(
        clients,
        Peer::Dial(link.addr),
        options,
        plain(),
        shutdown.clone(),
    ));
    let mut client = TcpStream::connect(entry_addr).await.expect("connect");
    exchange(&mut client, b"before", "an exchange before the freeze").await;
    assert_eq!(link.connections(), 1);

    link.freeze();
    let frozen = tokio::time::Instant::now();
    // The client carried by the dead connection is closed once the entry notices.
    let mut byte = [0; 1];
    let read = tokio::time::timeout(Duration::from_secs(21), client.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the client is closed within twice the keepalive interval (10 s) and a little: {read:?}"
    );
    // Not before the silence lasted twice the interval: it is the keepalives that are missed.
    assert!(
        frozen.elapsed() >= Duration::from_secs(20),
        "noticed after {:?}",
        frozen.elapsed()
    );
    // The next client brings a new connection.
    let mut late = TcpStream::connect(entry_addr).await.expect("connect");
    exchange(&mut late, b"after", "a new client over the new connection").await;
    assert_eq!(link.connections(), 2, "the entry dialled again");
    shutdown.begin.cancel();
    exit_shutdown.begin.cancel();
}
