//! What an idle client costs the tunnel: the bytes its entry and exit keep allocated for each
//! client that is connected through them and sends nothing, counted by a global allocator in
//! this test binary of its own.
//!
//! Both ends, the clients and the target run on one current-thread runtime on the test's
//! thread, where the allocator counts. Each client makes one exchange with the target (so its
//! stream has carried data both ways) and then sits idle. The same clients connected straight
//! to the target give what the test's own sockets and tasks cost; the difference is the
//! tunnel's. A relay that kept a buffer per client (32 KiB each way at each end) would cost
//! more than a hundred KiB here.

mod common;
#[path = "../../tests/counting/mod.rs"]
mod counting;
mod tunnel_support;

use std::net::SocketAddr;

use gomux_tunnel::Destination;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::within;
use tunnel_support::{Direction, Tunnel};

/// Idle clients measured at once: enough that the stream table's growth and the allocator's
/// rounding average out.
const CLIENTS: usize = 200;

/// Clients connected before counting starts, so that what every client shares (the gomux
/// connection, TLS, the buffer pool) is already there.
const WARM_UP: usize = 20;

/// The most the entry and the exit together may keep allocated per idle client: the sockets'
/// registrations with the runtime, one task per client at each end holding its relay's state
/// (in an unoptimised build, where futures are larger), and the stream's state in each
/// session. Well below the 8 KB the tunnel aims at per idle client in resident memory (which
/// `scripts/rathole-compare.sh` measures, and which also counts the allocator's own overhead
/// and fragmentation): 4 KiB. A buffer kept per client goes far past it, and so does the
/// entry's client future held twice (as an async function that takes a future and awaits it
/// holds it).
const BOUND: usize = 4 * 1024;

#[test]
fn an_idle_client_costs_no_buffers() {
    counting::start_counting();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (through, direct) = runtime.block_on(async {
        let target = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target_addr = target.local_addr().expect("address");
        tokio::spawn(serve(target));
        let tunnel = Tunnel::start(Direction::Forward, Destination::Fixed(target_addr)).await;

        let mut held = Vec::with_capacity(WARM_UP + 2 * CLIENTS);
        connect_idle(tunnel.entry, WARM_UP, &mut held).await;
        let through = bytes_per_client(tunnel.entry, &mut held).await;
        let direct = bytes_per_client(target_addr, &mut held).await;
        drop(tunnel);
        (through, direct)
    });
    let tunnel = through.saturating_sub(direct);
    eprintln!(
        "per idle client: {through} bytes through the tunnel, {direct} direct: {tunnel} bytes \
         for the tunnel's two ends"
    );
    assert!(
        tunnel <= BOUND,
        "an idle client costs the tunnel {tunnel} bytes (bound {BOUND})"
    );
}

/// Bytes allocated and kept per client for [`CLIENTS`] idle clients connected to `addr`.
async fn bytes_per_client(addr: SocketAddr, held: &mut Vec<TcpStream>) -> usize {
    let before = counting::live();
    connect_idle(addr, CLIENTS, held).await;
    // Lets every task finish what the last exchange woke it for.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    counting::live().saturating_sub(before) / CLIENTS
}

/// Connects `count` clients to `addr`, one after the other; each sends a byte, waits for the
/// target's answer, and is kept in `held`, idle.
async fn connect_idle(addr: SocketAddr, count: usize, held: &mut Vec<TcpStream>) {
    for _ in 0..count {
        let mut client = within("a client connects", TcpStream::connect(addr))
            .await
            .expect("connect");
        client.write_all(b"?").await.expect("ask");
        let mut answer = [0; 1];
        within("the answer", client.read_exact(&mut answer))
            .await
            .expect("answer");
        assert_eq!(&answer, b"!");
        held.push(client);
    }
}

/// The target: answers each connection's first byte, then holds it open until it closes.
async fn serve(listener: TcpListener) {
    while let Ok((mut socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut byte = [0; 1];
            if socket.read_exact(&mut byte).await.is_ok() && socket.write_all(b"!").await.is_ok() {
                let _ = socket.read(&mut byte).await;
            }
        });
    }
}
