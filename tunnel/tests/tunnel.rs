//! The TCP forwarder of `gomux-tunnel`, run in this process: its entry and exit on
//! ephemeral loopback ports, in both directions (the entry dialling the exit, and the exit
//! dialling the entry), real TCP clients in front and test targets (or a real Redis server,
//! where one is installed) behind. Its SOCKS5 mode is tested in `tests/socks.rs`, its command
//! line in `tests/command_line.rs`.
//!
//! Between the entry and the exit sits a [`Link`], a plain TCP relay the tests can cut, to
//! play a network failure and to count how many connections the dialling end made.
//!
//! Each end runs with the shutdown trigger that its signals fire in the tool's `main`
//! (Ctrl-C, SIGTERM), so the tests shut either end down as a signal would: a first to drain, a
//! second to cut.
//!
//! `RUST_LOG=debug cargo test --test tunnel -- --nocapture` shows the tunnel's logs.

mod common;
mod tunnel_support;

use std::future::Future;
use std::io;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use gomux::{Config, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;

use common::{assert_same, pattern, within};
use gomux_tunnel::{
    carry, run_entry, run_exit, run_relay, Destination, EntryOptions, Peer, SessionEnd,
    ShutdownReport,
};
use tunnel_support::{
    bind, entry_meeting, entry_options, exit_meeting, exit_options, init_logs, Direction, End,
    Task, Tunnel, DRAIN,
};

// ---------------------------------------------------------------------------------------------
// The scenarios, in both directions
// ---------------------------------------------------------------------------------------------

/// Runs each scenario twice: `forward::NAME` with the entry dialling the exit, and
/// `reverse::NAME` with the exit dialling the entry. What clients see must not depend on it.
macro_rules! in_both_directions {
    ($($scenario:ident),* $(,)?) => {
        mod forward {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Direction::Forward).await
                }
            )*
        }
        mod reverse {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Direction::Reverse).await
                }
            )*
        }
    };
}

in_both_directions!(
    many_concurrent_clients_each_get_their_own_echo,
    a_client_half_close_reaches_the_target,
    a_target_half_close_reaches_the_client,
    a_client_that_goes_away_ends_only_its_own_stream,
    a_refusing_target_ends_only_that_client,
    a_lost_connection_closes_its_clients_and_the_dialling_end_dials_again,
    shutting_down_the_entry_lets_a_relayed_connection_finish_and_turns_new_clients_away,
    shutting_down_the_exit_lets_a_relayed_connection_finish_and_turns_new_clients_away,
    the_entry_cuts_a_connection_that_never_ends_at_the_drain_deadline,
    the_exit_cuts_a_connection_that_never_ends_at_the_drain_deadline,
    a_second_signal_to_the_entry_cuts_the_drain_short,
    a_second_signal_to_the_exit_cuts_the_drain_short,
    a_reply_the_exit_finished_sending_reaches_a_slow_client_whole,
    an_upload_the_entry_finished_sending_reaches_a_slow_target_whole,
    both_ends_shutting_down_at_once_let_a_relayed_connection_finish,
);

async fn many_concurrent_clients_each_get_their_own_echo(direction: Direction) {
    let (_target, tunnel) = echo_tunnel(direction).await;

    let clients: Vec<_> = (0..48)
        .map(|seed| {
            let entry = tunnel.entry;
            tokio::spawn(async move {
                // Each client sends different content, so bytes delivered to the wrong client
                // are caught as well as lost or reordered ones.
                let data = pattern(seed, 64 * 1024 + seed as usize * 1000);
                let got = round_trip(connect(entry).await, &data).await;
                assert_same(&got, &data, &format!("client {seed}"));
            })
        })
        .collect();
    for client in clients {
        within("a client's echo", client).await.expect("no panic");
    }
    tunnel
        .link
        .assert_connections(1, "all clients share one connection");
}

async fn a_client_half_close_reaches_the_target(direction: Direction) {
    // This target answers only once it has read end-of-file, then closes: the answer arriving
    // shows that the client's half-close went all the way, and that the other direction still
    // worked after it.
    let target = Target::spawn(|mut socket: TcpStream| async move {
        let mut request = Vec::new();
        socket.read_to_end(&mut request).await?;
        let answer = format!("read {} bytes", request.len());
        socket.write_all(answer.as_bytes()).await?;
        socket.shutdown().await
    })
    .await;
    let tunnel = Tunnel::start(direction, Destination::Fixed(target.addr)).await;

    let mut client = connect(tunnel.entry).await;
    client.write_all(&[7; 100_000]).await.expect("write");
    client.shutdown().await.expect("half-close");
    let mut answer = String::new();
    within("the answer", client.read_to_string(&mut answer))
        .await
        .expect("read the answer to its end");
    assert_eq!(answer, "read 100000 bytes");
}

async fn a_target_half_close_reaches_the_client(direction: Direction) {
    // This target greets, half-closes, and then reads what the client still sends.
    let (heard_tx, heard) = tokio::sync::oneshot::channel();
    let heard_tx = Mutex::new(Some(heard_tx));
    let target = Target::spawn(move |mut socket: TcpStream| {
        let heard_tx = heard_tx.lock().expect("not poisoned").take();
        async move {
            socket.write_all(b"hello").await?;
            socket.shutdown().await?;
            let mut rest = Vec::new();
            socket.read_to_end(&mut rest).await?;
            if let Some(heard_tx) = heard_tx {
                let _ = heard_tx.send(rest);
            }
            Ok(())
        }
    })
    .await;
    let tunnel = Tunnel::start(direction, Destination::Fixed(target.addr)).await;

    let mut client = connect(tunnel.entry).await;
    let mut greeting = Vec::new();
    within(
        "the greeting and end-of-file",
        client.read_to_end(&mut greeting),
    )
    .await
    .expect("read the greeting to its end");
    assert_eq!(greeting, b"hello");

    // The target's half-close must not have closed the direction towards it.
    client.write_all(b"still heard").await.expect("write");
    client.shutdown().await.expect("half-close");
    let rest = within("what the target heard", heard).await.expect("sent");
    assert_eq!(rest, b"still heard");
}

async fn a_client_that_goes_away_ends_only_its_own_stream(direction: Direction) {
    let (_target, tunnel) = echo_tunnel(direction).await;

    let mut stays = connect(tunnel.entry).await;
    echo_once(&mut stays, b"before").await;

    // Leave in the middle of a transfer, without a half-close.
    let mut leaves = connect(tunnel.entry).await;
    leaves.write_all(&[1; 200_000]).await.expect("write");
    drop(leaves);

    echo_once(&mut stays, b"after").await;
    let newcomer = round_trip(connect(tunnel.entry).await, b"newcomer").await;
    assert_eq!(newcomer, b"newcomer");
    tunnel
        .link
        .assert_connections(1, "the gomux connection lived on");
}

async fn a_refusing_target_ends_only_that_client(direction: Direction) {
    let (target, tunnel) = echo_tunnel(direction).await;

    let mut earlier = connect(tunnel.entry).await;
    echo_once(&mut earlier, b"before").await;

    // Nothing listens on the target's port any more: the exit's connect is refused.
    target.stop().await;

    let mut refused = connect(tunnel.entry).await;
    // The write may race with the stream's close; whether it fails does not matter.
    let _ = refused.write_all(b"anyone?").await;
    assert_ended(&mut refused, "the refused client").await;

    // The client connected before, and the gomux connection, are untouched.
    echo_once(&mut earlier, b"after").await;
    tunnel
        .link
        .assert_connections(1, "the gomux connection lived on");
}

async fn a_lost_connection_closes_its_clients_and_the_dialling_end_dials_again(
    direction: Direction,
) {
    let (_target, tunnel) = echo_tunnel(direction).await;

    let mut first = connect(tunnel.entry).await;
    let mut second = connect(tunnel.entry).await;
    echo_once(&mut first, b"one").await;
    echo_once(&mut second, b"two").await;

    tunnel.link.cut();

    // Both clients were carried by the lost connection: both are closed, although neither
    // sends anything that could fail.
    assert_ended(&mut first, "the first client").await;
    assert_ended(&mut second, "the second client").await;

    // A new client is carried by a new connection, once the dialling end has dialled again:
    // it waits for it if it comes too early.
    let got = round_trip(connect(tunnel.entry).await, b"three").await;
    assert_eq!(got, b"three");
    tunnel.link.assert_connections(2, "one more dial");
}

// ---------------------------------------------------------------------------------------------
// Shutting down, in both directions, either end
// ---------------------------------------------------------------------------------------------

/// The end of the tunnel a shutdown scenario shuts down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Entry,
    Exit,
}

impl Side {
    fn of(self, tunnel: &mut Tunnel) -> &mut End {
        match self {
            Side::Entry => &mut tunnel.entry_end,
            Side::Exit => &mut tunnel.exit_end,
        }
    }

    /// Whether this end dials the gomux connection in `direction`.
    fn dials(self, direction: Direction) -> bool {
        matches!(
            (self, direction),
            (Side::Entry, Direction::Forward) | (Side::Exit, Direction::Reverse)
        )
    }
}

async fn shutting_down_the_entry_lets_a_relayed_connection_finish_and_turns_new_clients_away(
    direction: Direction,
) {
    a_relayed_connection_finishes_and_new_clients_are_turned_away(direction, Side::Entry).await
}

async fn shutting_down_the_exit_lets_a_relayed_connection_finish_and_turns_new_clients_away(
    direction: Direction,
) {
    a_relayed_connection_finishes_and_new_clients_are_turned_away(direction, Side::Exit).await
}

async fn the_entry_cuts_a_connection_that_never_ends_at_the_drain_deadline(direction: Direction) {
    a_connection_that_never_ends_is_cut_at_the_deadline(direction, Side::Entry).await
}

async fn the_exit_cuts_a_connection_that_never_ends_at_the_drain_deadline(direction: Direction) {
    a_connection_that_never_ends_is_cut_at_the_deadline(direction, Side::Exit).await
}

async fn a_second_signal_to_the_entry_cuts_the_drain_short(direction: Direction) {
    a_second_signal_cuts_the_drain_short(direction, Side::Entry).await
}

async fn a_second_signal_to_the_exit_cuts_the_drain_short(direction: Direction) {
    a_second_signal_cuts_the_drain_short(direction, Side::Exit).await
}

/// A connection relayed when the shutdown begins gets its whole reply, although the target
/// sends it only afterwards; clients that connect during the drain are turned away; and the
/// end stops by itself once the connection is done, without dialling again.
async fn a_relayed_connection_finishes_and_new_clients_are_turned_away(
    direction: Direction,
    side: Side,
) {
    let mut target = SlowTarget::spawn().await;
    let mut tunnel = Tunnel::start(direction, Destination::Fixed(target.addr)).await;

    let mut client = connect(tunnel.entry).await;
    client.write_all(SLOW).await.expect("write the request");
    target.request_arrived().await;

    let entry = tunnel.entry;
    let end = side.of(&mut tunnel);
    end.shut_down();

    // The end takes a moment to see the shutdown: until it has, a new client is carried as
    // usual (and its echo finishes at once). From then on, every new client is turned away.
    within("a new client to be turned away", async {
        while !turned_away(entry).await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // Only now does the target answer: the connection is still relayed, both ways.
    target.release();
    let mut reply = Vec::new();
    within("the reply", client.read_to_end(&mut reply))
        .await
        .expect("read the reply to its end");
    assert_same(&reply, &slow_reply(), "the reply sent during the drain");
    drop(client);

    let report = end.stopped().await;
    assert_eq!(report.cut, 0, "nothing cut: {report:?}");
    assert!(
        report.connections >= 1,
        "the slow client counted: {report:?}"
    );
    if side.dials(direction) {
        tunnel
            .link
            .assert_connections(1, "no dial while shutting down");
    }
}

/// Both ends shut down at once, as when a deployment stops everything: each drains its side of
/// the same gomux connection, the connection being relayed still finishes, and both stop.
async fn both_ends_shutting_down_at_once_let_a_relayed_connection_finish(direction: Direction) {
    let mut target = SlowTarget::spawn().await;
    let mut tunnel = Tunnel::start(direction, Destination::Fixed(target.addr)).await;

    let mut client = connect(tunnel.entry).await;
    client.write_all(SLOW).await.expect("write the request");
    target.request_arrived().await;

    tunnel.entry_end.shut_down();
    tunnel.exit_end.shut_down();
    target.release();
    let mut reply = Vec::new();
    within("the reply", client.read_to_end(&mut reply))
        .await
        .expect("read the reply to its end");
    assert_same(
        &reply,
        &slow_reply(),
        "the reply sent while both ends drained",
    );
    drop(client);

    for (end, name) in [
        (&mut tunnel.entry_end, "entry"),
        (&mut tunnel.exit_end, "exit"),
    ] {
        let report = end.stopped().await;
        assert_eq!(
            report,
            ShutdownReport {
                connections: 1,
                cut: 0
            },
            "{name}"
        );
    }
    tunnel
        .link
        .assert_connections(1, "no dial while shutting down");
}

/// A connection that never ends is cut at the drain deadline, its client closed, and the end
/// stops.
async fn a_connection_that_never_ends_is_cut_at_the_deadline(direction: Direction, side: Side) {
    let mut target = SlowTarget::spawn().await;
    let drain = Duration::from_millis(100);
    let mut tunnel =
        Tunnel::start_with_drain(direction, Destination::Fixed(target.addr), drain).await;

    let mut client = connect(tunnel.entry).await;
    client.write_all(HOLD).await.expect("write the request");
    target.request_arrived().await;

    let end = side.of(&mut tunnel);
    end.shut_down();
    let report = end.stopped().await;
    assert_eq!(
        report,
        ShutdownReport {
            connections: 1,
            cut: 1
        }
    );
    assert_ended(&mut client, "the client cut at the deadline").await;
}

/// A second signal cuts what the drain still waits for, long before its deadline.
async fn a_second_signal_cuts_the_drain_short(direction: Direction, side: Side) {
    let mut target = SlowTarget::spawn().await;
    // The default drain, far longer than a test step: only the cut can end it in time.
    let mut tunnel = Tunnel::start(direction, Destination::Fixed(target.addr)).await;

    let mut client = connect(tunnel.entry).await;
    client.write_all(HOLD).await.expect("write the request");
    target.request_arrived().await;

    let end = side.of(&mut tunnel);
    end.shut_down();
    end.cut();
    let report = end.stopped().await;
    assert_eq!(
        report,
        ShutdownReport {
            connections: 1,
            cut: 1
        }
    );
    assert_ended(&mut client, "the client cut by the second signal").await;
}

/// A reply still on its way when the end that drains closes the gomux connection reaches its
/// client whole. The exit's relay is done once the target has answered and closed and the
/// client has half-closed; it closes the connection while the rest of the reply still waits at
/// the entry for a client that reads slowly.
async fn a_reply_the_exit_finished_sending_reaches_a_slow_client_whole(direction: Direction) {
    let mut target = SlowTarget::spawn().await;
    let mut tunnel = Tunnel::start(direction, Destination::Fixed(target.addr)).await;

    let client = slow_reader(tunnel.entry).await;
    let (mut reader, mut writer) = client.into_split();
    writer.write_all(SLOW).await.expect("write the request");
    writer.shutdown().await.expect("half-close");
    target.request_arrived().await;

    tunnel.exit_end.shut_down();
    target.release();
    let mut reply = Vec::new();
    within("the reply", async {
        let mut chunk = [0; 4096];
        loop {
            let n = reader.read(&mut chunk).await.expect("read the reply");
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&chunk[..n]);
            // A slow client: the reply waits for it at the entry meanwhile.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_same(
        &reply,
        &slow_reply(),
        "the reply read after the exit closed",
    );
    assert_eq!(tunnel.exit_end.stopped().await.cut, 0);
}

/// The same the other way: an upload still on its way when the entry, draining, closes the
/// gomux connection reaches its target whole. The entry's relay is done once the client has
/// sent it all and half-closed and the target has half-closed; the rest of the upload still
/// waits at the exit for a target that reads slowly.
async fn an_upload_the_entry_finished_sending_reaches_a_slow_target_whole(direction: Direction) {
    // A target with a small receive buffer that half-closes at once, then reads slowly.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    socket
        .bind("127.0.0.1:0".parse().expect("address"))
        .expect("bind");
    let listener = socket.listen(16).expect("listen");
    let target = listener.local_addr().expect("address");
    let (uploaded_tx, uploaded) = tokio::sync::oneshot::channel();
    let _target = Task::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        socket.shutdown().await.expect("half-close");
        let mut upload = Vec::new();
        let mut chunk = [0; 4096];
        loop {
            let n = socket.read(&mut chunk).await.expect("read the upload");
            if n == 0 {
                break;
            }
            upload.extend_from_slice(&chunk[..n]);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let _ = uploaded_tx.send(upload);
    });
    let mut tunnel = Tunnel::start(direction, Destination::Fixed(target)).await;

    let mut client = connect(tunnel.entry).await;
    let mut nothing = Vec::new();
    within("the target's half-close", client.read_to_end(&mut nothing))
        .await
        .expect("read to the end");
    tunnel.entry_end.shut_down();
    let upload = pattern(12, 1024 * 1024);
    let sending = async {
        client.write_all(&upload).await.expect("upload");
        client.shutdown().await.expect("half-close");
    };
    within("the upload to be sent", sending).await;
    let got = within("the upload to reach the target", uploaded)
        .await
        .expect("the target read it");
    assert_same(&got, &upload, "the upload read after the entry closed");
    assert_eq!(tunnel.entry_end.stopped().await.cut, 0);
}

/// A client connection whose receive buffer is small, so that data sent to it waits in the
/// tunnel rather than in the kernel while it reads slowly.
async fn slow_reader(entry: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    let stream = within("connect to the entry", socket.connect(entry))
        .await
        .expect("connect to the entry");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_shuts_down_the_same_way() {
    init_logs();
    let mut target = SlowTarget::spawn().await;
    let listener = bind().await;
    let addr = listener.local_addr().expect("address");
    let mut relay = End::spawn(DRAIN, |shutdown| run_relay(listener, target.addr, shutdown));

    let mut client = connect(addr).await;
    client.write_all(SLOW).await.expect("write the request");
    target.request_arrived().await;
    relay.shut_down();
    within("a new client to be turned away", async {
        while !turned_away(addr).await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    target.release();
    let mut reply = Vec::new();
    within("the reply", client.read_to_end(&mut reply))
        .await
        .expect("read the reply to its end");
    assert_same(&reply, &slow_reply(), "the reply sent during the drain");
    drop(client);
    assert_eq!(relay.stopped().await.cut, 0);
}

/// Starts a connection to [`SlowTarget`] that is answered once the test releases it.
const SLOW: &[u8] = b"slow\n";
/// Starts a connection to [`SlowTarget`] that is never answered, nor closed.
const HOLD: &[u8] = b"hold\n";

/// What [`SlowTarget`] answers to [`SLOW`]: large enough to take many frames, so that a reply
/// cut short shows.
fn slow_reply() -> Vec<u8> {
    pattern(11, 1024 * 1024)
}

/// A target whose answer the test holds back, to have a connection being relayed when a
/// shutdown begins. Each connection starts with a line: [`SLOW`] is answered with
/// [`slow_reply`] once the test releases it, [`HOLD`] never; either tells the test that the
/// request has arrived. Any other line is echoed at once (the clients that probe whether a
/// tunnel being shut down still takes new connections), and the connection half-closed.
struct SlowTarget {
    addr: SocketAddr,
    arrived: tokio::sync::mpsc::UnboundedReceiver<()>,
    release: tokio::sync::watch::Sender<bool>,
    _target: Target,
}

impl SlowTarget {
    async fn spawn() -> SlowTarget {
        let (arrived_tx, arrived) = tokio::sync::mpsc::unbounded_channel();
        let (release, released) = tokio::sync::watch::channel(false);
        let target = Target::spawn(move |mut socket: TcpStream| {
            let (arrived, mut released) = (arrived_tx.clone(), released.clone());
            async move {
                let mut line = Vec::new();
                loop {
                    match socket.read_u8().await? {
                        b'\n' => break,
                        byte => line.push(byte),
                    }
                }
                line.push(b'\n');
                if line == SLOW {
                    let _ = arrived.send(());
                    let _ = released.wait_for(|&released| released).await;
                    socket.write_all(&slow_reply()).await?;
                    socket.shutdown().await?;
                } else if line == HOLD {
                    let _ = arrived.send(());
                } else {
                    socket.write_all(&line).await?;
                    socket.shutdown().await?;
                }
                // Until the client closes, or the tunnel cuts the connection.
                let mut rest = Vec::new();
                socket.read_to_end(&mut rest).await?;
                Ok(())
            }
        })
        .await;
        SlowTarget {
            addr: target.addr,
            arrived,
            release,
            _target: target,
        }
    }

    /// Waits until a [`SLOW`] or [`HOLD`] request has reached the target: its connection is
    /// then relayed by both ends.
    async fn request_arrived(&mut self) {
        within("the request to reach the target", self.arrived.recv())
            .await
            .expect("the target is running");
    }

    /// Lets the target answer the [`SLOW`] requests.
    fn release(&self) {
        self.release.send_replace(true);
    }
}

/// Whether a new client is turned away: its connection refused, or closed without an answer.
/// A client that is carried all the same (the end has not seen the shutdown yet) gets its
/// probe echoed by [`SlowTarget`], and is done.
async fn turned_away(entry: SocketAddr) -> bool {
    let Ok(socket) = TcpStream::connect(entry).await else {
        return true; // the listener is closed
    };
    let (mut reader, mut writer) = socket.into_split();
    // Either may fail once the connection is closed; what is read tells.
    let _ = writer.write_all(b"probe\n").await;
    let _ = writer.shutdown().await;
    let mut got = Vec::new();
    match within("a probe", reader.read_to_end(&mut got)).await {
        Err(error) => {
            assert!(
                matches!(
                    error.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ),
                "probe: unexpected error {error}"
            );
            true
        }
        Ok(_) if got.is_empty() => true,
        Ok(_) => {
            assert_eq!(got, b"probe\n", "a probe carried to the target is echoed");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios of one direction
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waits_for_an_exit_that_is_not_up_yet() {
    init_logs();
    let target = Target::spawn(echo).await;

    // The exit's port is bound, but nothing accepts on it for now: the entry's connection
    // waits in the backlog, its handshake unanswered.
    let exit = bind().await;
    let exit_addr = exit.local_addr().expect("address");
    let entry = bind().await;
    let entry_addr = entry.local_addr().expect("address");
    let _entry = End::spawn(DRAIN, |shutdown| {
        run_entry(
            entry,
            Peer::Dial(exit_addr),
            entry_options(),
            entry_meeting(),
            shutdown,
        )
    });

    let client = connect(entry_addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _exit = End::spawn(DRAIN, |shutdown| {
        run_exit(
            Peer::Accept(exit),
            Destination::Fixed(target.addr),
            exit_options(),
            exit_meeting(),
            shutdown,
        )
    });

    let got = round_trip(client, b"patience").await;
    assert_eq!(got, b"patience");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_with_three_connections_spreads_its_clients_over_them() {
    let target = Target::spawn(echo).await;
    let options = EntryOptions {
        connections: 3,
        ..entry_options()
    };
    let mut tunnel = Tunnel::start_with(
        Direction::Forward,
        Destination::Fixed(target.addr),
        DRAIN,
        options,
    )
    .await;

    // Clients held open at once, and more coming and going meanwhile, each with its own
    // content: the entry carries them over the three connections.
    let mut clients = Vec::new();
    for seed in 0..12u8 {
        let mut client = connect(tunnel.entry).await;
        echo_once(&mut client, &[b'a' + seed; 1000]).await;
        clients.push(client);
    }
    let transfers: Vec<_> = (0..24u64)
        .map(|seed| {
            let entry = tunnel.entry;
            tokio::spawn(async move {
                let data = pattern(seed, 100_000 + seed as usize * 1000);
                let got = round_trip(connect(entry).await, &data).await;
                assert_same(&got, &data, &format!("client {seed}"));
            })
        })
        .collect();
    for transfer in transfers {
        within("a client's echo", transfer).await.expect("no panic");
    }
    for (seed, client) in clients.iter_mut().enumerate() {
        echo_once(client, &[b'A' + seed as u8; 10]).await;
    }
    tunnel
        .link
        .assert_connections(3, "three connections from the one entry");

    // Once the clients are gone, the shutdown closes the three connections, cutting nothing,
    // and dials no more.
    drop(clients);
    tunnel.entry_end.shut_down();
    let report = tunnel.entry_end.stopped().await;
    assert_eq!(report.cut, 0, "{report:?}");
    tunnel
        .link
        .assert_connections(3, "no dial while shutting down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_a_client_waits_for_an_exit_that_has_not_dialled_in_yet() {
    init_logs();
    let target = Target::spawn(echo).await;

    // The entry listens for clients and for the exit; no exit has dialled in yet.
    let (clients, exits) = (bind().await, bind().await);
    let entry_addr = clients.local_addr().expect("address");
    let exits_addr = exits.local_addr().expect("address");
    let _entry = End::spawn(DRAIN, |shutdown| {
        run_entry(
            clients,
            Peer::Accept(exits),
            entry_options(),
            entry_meeting(),
            shutdown,
        )
    });

    let client = connect(entry_addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _exit = End::spawn(DRAIN, |shutdown| {
        run_exit(
            Peer::Dial(exits_addr),
            Destination::Fixed(target.addr),
            exit_options(),
            exit_meeting(),
            shutdown,
        )
    });

    let got = round_trip(client, b"patience").await;
    assert_eq!(got, b"patience");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_the_latest_exit_to_dial_in_carries_new_clients() {
    init_logs();
    // Two targets that say who they are, each behind its own exit.
    let first_target = Target::spawn(|socket| says(socket, "first")).await;
    let second_target = Target::spawn(|socket| says(socket, "second")).await;

    let (clients, exits) = (bind().await, bind().await);
    let entry_addr = clients.local_addr().expect("address");
    let exits_addr = exits.local_addr().expect("address");
    let _entry = End::spawn(DRAIN, |shutdown| {
        run_entry(
            clients,
            Peer::Accept(exits),
            entry_options(),
            entry_meeting(),
            shutdown,
        )
    });

    let _first_exit = End::spawn(DRAIN, |shutdown| {
        run_exit(
            Peer::Dial(exits_addr),
            Destination::Fixed(first_target.addr),
            exit_options(),
            exit_meeting(),
            shutdown,
        )
    });
    let mut early = connect(entry_addr).await;
    assert_eq!(hear(&mut early).await, "first");

    // The second exit dials in. Clients that arrive once it has are carried by it; the
    // client before it stays on the first exit.
    let _second_exit = End::spawn(DRAIN, |shutdown| {
        run_exit(
            Peer::Dial(exits_addr),
            Destination::Fixed(second_target.addr),
            exit_options(),
            exit_meeting(),
            shutdown,
        )
    });
    within("a client carried by the second exit", async {
        loop {
            let mut late = connect(entry_addr).await;
            if hear(&mut late).await == "second" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    echo_once(&mut early, b"still here").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_other_end_refuses_closes_its_client_at_once() {
    // A session whose other end accepts one stream at most and never takes it: the next
    // stream is refused with CloseStream, as it is when an exit has too many streams waiting.
    let (a, b) = tokio::io::duplex(64 * 1024);
    let opener = Session::client(a);
    let _refuser = Session::with_config(b, Role::Server, Config::default().accept_backlog(1));
    let _queued = opener.open().await.expect("open the stream that is queued");
    let refused = opener
        .open()
        .await
        .expect("open the stream that is refused");

    // A client that sends nothing and waits: only the refusal can end its connection.
    let listener = bind().await;
    let addr = listener.local_addr().expect("address");
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let mut client = client.expect("connect");
    let (socket, _) = accepted.expect("accept");

    within(
        "the relay to end",
        carry(socket, refused, &SessionEnd::default()),
    )
    .await;
    assert_ended(&mut client, "the client of the refused stream").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_through_the_tunnel() {
    let missing: Vec<_> = ["redis-server", "redis-cli", "redis-benchmark"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    if missing.contains(&"redis-server") {
        let required = std::env::var("CI").is_ok_and(|v| !["", "0", "false"].contains(&&*v))
            || std::env::var("GOMUX_REQUIRE_TOOLS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "redis-server not found (apt-get install redis-server redis-tools); with CI or \
             GOMUX_REQUIRE_TOOLS=1 set, the Redis test must run"
        );
        // Straight to the process's standard error, past the test harness's capture, so that
        // the skip shows in a plain `cargo test`.
        let _ = writeln!(
            std::io::stderr(),
            "tunnel: SKIPPED redis_through_the_tunnel: redis-server not found \
             (apt-get install redis-server redis-tools)"
        );
        return;
    }
    assert!(
        missing.is_empty(),
        "redis-server is installed but not {missing:?} (apt-get install redis-tools)"
    );

    let redis = Redis::start().await;
    let tunnel = Tunnel::start(Direction::Forward, Destination::Fixed(redis.addr)).await;
    let port = tunnel.entry.port().to_string();
    // A short benchmark: 2000 requests from 10 connections for each of SET and GET.
    let benchmark = run_tool(
        "redis-benchmark",
        &["-p", &port, "-q", "-n", "2000", "-c", "10", "-t", "set,get"],
        None,
    )
    .await;
    // Its progress lines end in carriage returns; the results contain "requests per second".
    let report = String::from_utf8_lossy(&benchmark).replace('\r', "\n");
    let results: Vec<_> = report
        .lines()
        .filter(|line| line.contains("requests per second"))
        .collect();
    eprintln!(
        "redis-benchmark through the tunnel:\n{}",
        results.join("\n")
    );
    for command in ["SET", "GET"] {
        assert!(
            results
                .iter()
                .any(|line| line.starts_with(&format!("{command}: "))),
            "no {command} result in the benchmark output:\n{report}"
        );
    }

    // A 4 MiB value of arbitrary bytes, stored and read back through the tunnel. `redis-cli`
    // prints a value read from a pipe as it is, plus a newline.
    let value = pattern(42, 4 * 1024 * 1024);
    let stored = run_tool(
        "redis-cli",
        &["-p", &port, "-x", "SET", "big"],
        Some(&value),
    )
    .await;
    assert_eq!(stored, b"OK\n");
    let mut read = run_tool("redis-cli", &["-p", &port, "GET", "big"], None).await;
    assert_eq!(
        read.pop(),
        Some(b'\n'),
        "redis-cli ends its output with a newline"
    );
    assert_same(&read, &value, "the value read back through the tunnel");
}

// ---------------------------------------------------------------------------------------------
// Targets and clients
// ---------------------------------------------------------------------------------------------

/// A tunnel in front of a new echo target. Keep the target: dropping it closes its listener.
async fn echo_tunnel(direction: Direction) -> (Target, Tunnel) {
    let target = Target::spawn(echo).await;
    let tunnel = Tunnel::start(direction, Destination::Fixed(target.addr)).await;
    (target, tunnel)
}

/// A TCP service on a loopback port that serves each connection with a function of ours.
struct Target {
    addr: SocketAddr,
    accepting: Task,
}

impl Target {
    async fn spawn<F, Fut>(serve: F) -> Target
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind target");
        let addr = listener.local_addr().expect("target address");
        let accepting = Task::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                socket.set_nodelay(true).expect("nodelay");
                // Connections outlive `stop`, which closes only the listener.
                tokio::spawn(serve(socket));
            }
        });
        Target { addr, accepting }
    }

    /// Closes the listening socket: connections to the port are refused from now on.
    async fn stop(self) {
        let task = &self.accepting.0;
        task.abort();
        // Wait until the task, and with it the listener, is really gone.
        while !task.is_finished() {
            tokio::task::yield_now().await;
        }
    }
}

/// Echoes everything until end-of-file, then half-closes in turn.
async fn echo(mut socket: TcpStream) -> io::Result<()> {
    let (mut reader, mut writer) = socket.split();
    tokio::io::copy(&mut reader, &mut writer).await?;
    writer.shutdown().await
}

/// Sends `name` and a newline, then echoes: a target that says which one it is.
async fn says(mut socket: TcpStream, name: &'static str) -> io::Result<()> {
    socket.write_all(format!("{name}\n").as_bytes()).await?;
    echo(socket).await
}

/// Reads the name a target that [`says`] it sends.
async fn hear(socket: &mut TcpStream) -> String {
    let mut name = Vec::new();
    within("the target's name", async {
        loop {
            let byte = socket.read_u8().await.expect("read the name");
            if byte == b'\n' {
                break;
            }
            name.push(byte);
        }
    })
    .await;
    String::from_utf8_lossy(&name).into_owned()
}

/// A client connection to the entry.
async fn connect(entry: SocketAddr) -> TcpStream {
    let socket = within("connect to the entry", TcpStream::connect(entry))
        .await
        .expect("connect to the entry");
    socket.set_nodelay(true).expect("nodelay");
    socket
}

/// Writes `data` and half-closes while reading everything until end-of-file, both at once
/// (an echo can only go as fast as it is read).
async fn round_trip(socket: TcpStream, data: &[u8]) -> Vec<u8> {
    let (mut reader, mut writer) = socket.into_split();
    let write = async {
        writer.write_all(data).await.expect("write the request");
        writer.shutdown().await.expect("half-close");
    };
    let read = async {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.expect("read to the end");
        got
    };
    within("a round trip", async { tokio::join!(write, read).1 }).await
}

/// Sends `message` on a connection to an echo target and reads it back, leaving the
/// connection open.
async fn echo_once(socket: &mut TcpStream, message: &[u8]) {
    socket.write_all(message).await.expect("write");
    let mut got = vec![0; message.len()];
    within("an echo", socket.read_exact(&mut got))
        .await
        .expect("read the echo");
    assert_eq!(got, message);
}

/// Reads until the connection ends, which must come without data: end-of-file, or a reset
/// (when the entry closed the connection with bytes of ours still unread).
async fn assert_ended(socket: &mut TcpStream, what: &str) {
    let mut got = Vec::new();
    let read = within(what, socket.read_to_end(&mut got)).await;
    assert!(got.is_empty(), "{what}: unexpected data {got:?}");
    if let Err(error) = read {
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ),
            "{what}: unexpected error {error}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

/// A `redis-server` on a free loopback port, without persistence, killed when dropped.
struct Redis {
    addr: SocketAddr,
    _process: tokio::process::Child,
}

impl Redis {
    /// redis-server cannot be handed a listener nor tell which port it bound, so a port that
    /// was free is tried: if another process took it meanwhile, redis-server exits and another
    /// port is tried. A name set in the server's configuration tells ours from any other.
    async fn start() -> Redis {
        for _ in 0..5 {
            let addr = {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                listener.local_addr().expect("address")
            };
            let port = addr.port().to_string();
            let name = format!("gomux-tunnel-test-{}", std::process::id());
            let mut process = Command::new("redis-server")
                .args(["--port", &port, "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--rename-command", "ECHO", &name])
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("start redis-server");
            // Ready once it answers the renamed ECHO, which only ours knows.
            let ready = within("redis-server to start", async {
                loop {
                    if process.try_wait().expect("redis-server status").is_some() {
                        return false; // it could not bind the port
                    }
                    let echo = Command::new("redis-cli")
                        .args(["-p", &port, &name, "ours"])
                        .stderr(Stdio::null())
                        .output()
                        .await
                        .expect("run redis-cli");
                    if echo.stdout.starts_with(b"ours") {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
            if ready {
                return Redis {
                    addr,
                    _process: process,
                };
            }
        }
        panic!("redis-server could not start on any of five free ports");
    }
}

/// Runs a Redis tool against 127.0.0.1 with `input` on its standard input, checks that it
/// succeeded and returns its standard output.
async fn run_tool(tool: &str, args: &[&str], input: Option<&[u8]>) -> Vec<u8> {
    let mut child = Command::new(tool)
        .args(["-h", "127.0.0.1"])
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {tool}: {e}"));
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // Closing stdin afterwards is what tells `redis-cli -x` the value is complete.
        stdin.write_all(input).await.expect("feed stdin");
    }
    let output = within_a_minute(tool, child.wait_with_output())
        .await
        .unwrap_or_else(|e| panic!("wait for {tool}: {e}"));
    assert!(
        output.status.success(),
        "{tool} {args:?}: {}",
        output.status
    );
    output.stdout
}

/// Like [`within`], with room for a benchmark on a slow, shared machine.
async fn within_a_minute<F: Future>(what: &str, future: F) -> F::Output {
    common::within_for(Duration::from_secs(120), what, future).await
}

/// Whether an executable of this name is on `PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}
