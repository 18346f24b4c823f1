//! An emulated network link for the benches: a userspace TCP relay whose two directions are each
//! a serial line of a given rate, with a one-way delay, shared by every connection through the
//! relay, like the bottleneck of a real path. How the relay takes bytes from its connections is
//! the link's [`Shape`]:
//!
//! - [`Shape::Queue`]: a queue of a given size in front of the line. Bytes a connection sends
//!   through [`Relay::addr`] are read by the relay only while the line's queue has room; each
//!   byte then waits for the bytes queued before it (from any connection) to be serialised at
//!   the rate, takes its own serialisation time, and arrives `delay` later at the relay's
//!   connection to the target. A sender that outpaces the line therefore fills its own
//!   socket's buffer, as it would behind a real bottleneck (without the packet losses a router
//!   would add: the relay pushes back through TCP's flow control instead of dropping).
//! - [`Shape::Reads`]: a relay as an application would write one. It reads up to [`READ_MAX`]
//!   bytes at a time from each connection, into sockets whose receive buffer is
//!   [`READS_RCVBUF`], hands each read to the line, and reads that connection again once the
//!   line has serialised it. The line is the only queue: each connection has at most one read
//!   on it, and what one connection sends waits behind the reads of every other that came
//!   first.
//!
//! What it holds, per direction:
//!
//! - the line's queue: with [`Shape::Queue`], at most [`Link::queue`] bytes waiting to be
//!   serialised; with [`Shape::Reads`], one read of each connection (the line is shared: what
//!   one connection queues delays every other's);
//! - with [`Shape::Queue`], bytes read and waiting for room: at most one read per connection,
//!   no more than the room the queue had just before it (at most [`READ_MAX`]);
//! - bytes on the line: at most the rate times the delay;
//! - bytes arrived and not yet taken by the receiver: at most [`DELIVERY_BACKLOG`] packets per
//!   connection, after which the relay stops reading that connection;
//! - the relay's socket receive buffers, set to [`RELAY_RCVBUF`] or [`READS_RCVBUF`] (the
//!   kernel doubles it for its bookkeeping), in front of the queue as a NIC's ring would be.
//!
//! Timing is tokio's timer on a thread and runtime of the relay's own, so delivery can be up to
//! about a millisecond late (the timer's resolution), and more on a busy machine. That lateness
//! is not carried over: bytes that were waiting in a socket while the relay slept are put on
//! the line from when the queue had room for them (from when the connection's previous read
//! was serialised, with [`Shape::Reads`]), so the line stays busy at its rate (the queue then
//! briefly holds, in that accounting, up to what the line drained meanwhile). Every
//! connection is carried until both of its directions have ended; an end is passed on as a
//! half-close.

// Each bench that uses the link takes the shapes it needs.
#![allow(dead_code)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Size of the packets the line carries: each arrives when its last byte has been serialised,
/// so this is the granularity of the serialisation delay (116 µs at 100 Mbit/s, less than the
/// timer's resolution). An Ethernet payload.
pub const PACKET: usize = 1500;

/// The most the relay reads from a connection at once.
pub const READ_MAX: usize = 16 * 1024;

/// Packets that have arrived, or are on the line, for one direction of one connection, beyond
/// which the relay stops reading that direction until the receiver takes some: 1024 packets,
/// 1.5 MiB, more than a second's worth at 10 Mbit/s.
pub const DELIVERY_BACKLOG: usize = 1024;

/// The receive buffer the relay asks for on its sockets, so that the kernel in front of the
/// relay holds little beyond the emulated queue.
pub const RELAY_RCVBUF: u32 = 8 * 1024;

/// The receive buffer the relay asks for on its sockets with [`Shape::Reads`].
pub const READS_RCVBUF: u32 = 16 * 1024;

/// How the relay takes bytes from the connections it carries (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Reads only while the line's queue of [`Link::queue`] bytes has room.
    Queue,
    /// Reads up to [`READ_MAX`] bytes, and reads again once the line has serialised them.
    Reads,
}

impl Shape {
    /// The receive buffer the relay asks for on its sockets.
    fn rcvbuf(self) -> u32 {
        match self {
            Shape::Queue => RELAY_RCVBUF,
            Shape::Reads => READS_RCVBUF,
        }
    }
}

/// The shape of the emulated path.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Bits per second, each way.
    pub rate: u64,
    /// One-way delay of every packet, beyond its serialisation.
    pub delay: Duration,
    /// Bytes the queue in front of each direction's line holds, with [`Shape::Queue`].
    pub queue: usize,
    /// How the relay takes bytes from its connections.
    pub shape: Shape,
}

impl Link {
    /// Megabits per second (10⁶ bits), milliseconds each way, bytes of queue; [`Shape::Queue`].
    pub fn new(mbit: u64, delay_ms: u64, queue: usize) -> Link {
        Link {
            rate: mbit * 1_000_000,
            delay: Duration::from_millis(delay_ms),
            queue,
            shape: Shape::Queue,
        }
    }

    /// The same link with the relay taking bytes as `shape` says.
    pub fn shaped(self, shape: Shape) -> Link {
        Link { shape, ..self }
    }

    /// Seconds the line takes to serialise `bytes`.
    fn serialisation(&self, bytes: usize) -> Duration {
        Duration::from_secs_f64(bytes as f64 * 8.0 / self.rate as f64)
    }

    /// Starts a relay to `target` on a loopback port, on a thread of its own.
    ///
    /// # Errors
    ///
    /// Binding the listener, or starting the thread or its runtime, failed.
    pub fn relay(self, target: SocketAddr) -> io::Result<Relay> {
        let (bound, address) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = thread::Builder::new()
            .name("link relay".into())
            .spawn(move || {
                let started = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .and_then(|runtime| {
                        let listener = runtime.block_on(async {
                            let socket = TcpSocket::new_v4()?;
                            socket.set_recv_buffer_size(self.shape.rcvbuf())?;
                            socket.bind((Ipv4Addr::LOCALHOST, 0).into())?;
                            socket.listen(64)
                        })?;
                        Ok((runtime, listener))
                    });
                let (runtime, listener) = match started {
                    Ok(started) => started,
                    Err(error) => {
                        let _ = bound.send(Err(error));
                        return;
                    }
                };
                let _ = bound.send(listener.local_addr());
                let lines = Lines {
                    forth: Arc::new(Line::new(self)),
                    back: Arc::new(Line::new(self)),
                };
                runtime.block_on(async move {
                    tokio::select! {
                        _ = accept(listener, target, lines) => {}
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime here ends every connection's tasks.
            })?;
        let addr = address
            .recv()
            .map_err(|_| io::Error::other("the relay's thread ended"))??;
        Ok(Relay {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// A running relay; stopped, and every connection through it closed, when dropped.
pub struct Relay {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Relay {
    /// Where clients connect to reach the target through the link.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The two directions' lines: `forth` carries what clients send, `back` what the target sends.
#[derive(Clone)]
struct Lines {
    forth: Arc<Line>,
    back: Arc<Line>,
}

/// One direction's serial line and its queue.
struct Line {
    link: Link,
    /// When the line will have serialised every byte queued so far. The bytes it holds are the
    /// time from now to then, times the rate. Never locked across an `.await`.
    free_at: Mutex<Instant>,
}

/// A packet and when it arrives at the far end.
type Packet = (Instant, Bytes);

impl Line {
    fn new(link: Link) -> Line {
        Line {
            link,
            free_at: Mutex::new(Instant::now()),
        }
    }

    /// How long until the queue has room for `bytes` more: zero if it has now.
    fn wait_for_room(&self, bytes: usize) -> Duration {
        self.room_from(bytes)
            .saturating_duration_since(Instant::now())
    }

    /// Bytes the queue has room for now.
    fn room(&self) -> usize {
        let now = Instant::now();
        let free_at = *self.free_at.lock().expect("line lock");
        let backlog =
            free_at.saturating_duration_since(now).as_secs_f64() * self.link.rate as f64 / 8.0;
        self.link.queue.saturating_sub(backlog as usize)
    }

    /// When the queue had (or will have) room for `bytes`.
    fn room_from(&self, bytes: usize) -> Instant {
        let free_at = *self.free_at.lock().expect("line lock");
        let room = self.link.queue.saturating_sub(bytes);
        free_at
            .checked_sub(self.link.serialisation(room))
            .unwrap_or(free_at)
    }

    /// Queues `bytes`, which reached the queue at `staged`, on the line, cut into packets, and
    /// returns them with their arrival times.
    fn send(&self, bytes: &[u8], staged: Instant) -> Vec<Packet> {
        let mut free_at = self.free_at.lock().expect("line lock");
        let mut done = (*free_at).max(staged);
        let packets = bytes
            .chunks(PACKET)
            .map(|packet| {
                done += self.link.serialisation(packet.len());
                (done + self.link.delay, Bytes::copy_from_slice(packet))
            })
            .collect();
        *free_at = done;
        packets
    }
}

/// Accepts clients and carries each to a connection of its own to `target`.
async fn accept(listener: TcpListener, target: SocketAddr, lines: Lines) {
    while let Ok((client, _)) = listener.accept().await {
        let lines = lines.clone();
        tokio::spawn(async move {
            // A target that refuses closes the client's connection, as a dead path would.
            if let Ok(server) = connect(target, lines.forth.link.shape).await {
                carry(client, server, lines).await;
            }
        });
    }
}

async fn connect(target: SocketAddr, shape: Shape) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(shape.rcvbuf())?;
    let stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Carries one connection both ways until both directions have ended.
async fn carry(client: TcpStream, server: TcpStream, lines: Lines) {
    let _ = client.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        direction(client_read, server_write, &lines.forth),
        direction(server_read, client_write, &lines.back),
    );
}

/// One direction: reads as the link's shape says, queues what it read on the line, and
/// delivers each packet when it arrives.
async fn direction(from: OwnedReadHalf, to: OwnedWriteHalf, line: &Line) {
    let (arrived, arrivals) = mpsc::channel(DELIVERY_BACKLOG);
    match line.link.shape {
        Shape::Queue => tokio::join!(read_queued(from, arrived, line), deliver(arrivals, to)),
        Shape::Reads => tokio::join!(read_serialised(from, arrived, line), deliver(arrivals, to)),
    };
}

/// [`Shape::Queue`]: reads while the line's queue has room, and queues what it read on the line.
/// Dropping `arrived` at the end tells the delivery to pass the end on once the line is empty.
async fn read_queued(mut from: OwnedReadHalf, arrived: mpsc::Sender<Packet>, line: &Line) {
    let mut buf = vec![0; READ_MAX];
    // When this direction's previous bytes reached the queue.
    let mut staged = Instant::now();
    loop {
        // Read only what the queue has room for, so that the bytes wait in the sender's
        // socket rather than here; and queue them only once there is room for all of them,
        // since another connection may have taken it meanwhile. The check and the queueing
        // have no `.await` between them, and the relay runs on one thread.
        wait_for_room(line, PACKET).await;
        let size = line.room().clamp(1, READ_MAX);
        // Bytes that were already waiting in the socket reached the queue when room came
        // for them, not when a late timer woke this task: so a timer's lateness does not
        // leave the line idle, nor slow the rate below the link's.
        let now = Instant::now();
        let Some((n, reached)) = read(&mut from, &mut buf[..size], || {
            line.room_from(PACKET).max(staged).min(now)
        })
        .await
        else {
            return;
        };
        staged = reached;
        wait_for_room(line, n).await;
        for packet in line.send(&buf[..n], staged) {
            if arrived.send(packet).await.is_err() {
                return;
            }
        }
    }
}

/// [`Shape::Reads`]: reads up to [`READ_MAX`] bytes, puts them on the line behind whatever is
/// on it, and reads again once the line has serialised them.
async fn read_serialised(mut from: OwnedReadHalf, arrived: mpsc::Sender<Packet>, line: &Line) {
    let mut buf = vec![0; READ_MAX];
    // When the line has serialised this direction's previous read.
    let mut serialised = Instant::now();
    loop {
        tokio::time::sleep_until(serialised).await;
        // Bytes already waiting in the socket were read when the previous read was
        // serialised, not when a late timer woke this task (see the module's documentation).
        let now = Instant::now();
        let Some((n, staged)) = read(&mut from, &mut buf, || serialised.min(now)).await else {
            return;
        };
        let packets = line.send(&buf[..n], staged);
        if let Some((at, _)) = packets.last() {
            serialised = *at - line.link.delay;
        }
        for packet in packets {
            if arrived.send(packet).await.is_err() {
                return;
            }
        }
    }
}

/// Reads into `buf`: bytes already waiting, with the time `waiting` gives for them, or else the
/// next to come, with the time they came. `None` at the end of the stream or on an error.
async fn read(
    from: &mut OwnedReadHalf,
    buf: &mut [u8],
    waiting: impl FnOnce() -> Instant,
) -> Option<(usize, Instant)> {
    match from.try_read(buf) {
        Ok(0) => None,
        Ok(n) => Some((n, waiting())),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => match from.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some((n, Instant::now())),
        },
        Err(_) => None,
    }
}

/// Waits until the line's queue has room for `bytes` (or, if it holds fewer in all, is empty).
async fn wait_for_room(line: &Line, bytes: usize) {
    loop {
        let wait = line.wait_for_room(bytes.min(line.link.queue));
        if wait.is_zero() {
            return;
        }
        tokio::time::sleep(wait).await;
    }
}

/// Writes each packet to `to` when it arrives, those that have arrived together in one write,
/// and half-closes `to` after the last.
async fn deliver(mut arrivals: mpsc::Receiver<Packet>, mut to: OwnedWriteHalf) {
    let mut next = arrivals.recv().await;
    let mut batch = Vec::with_capacity(READ_MAX);
    while let Some((at, packet)) = next.take() {
        tokio::time::sleep_until(at).await;
        batch.clear();
        batch.extend_from_slice(&packet);
        let now = Instant::now();
        loop {
            match arrivals.try_recv() {
                Ok((at, packet)) if at <= now => batch.extend_from_slice(&packet),
                Ok(later) => {
                    next = Some(later);
                    break;
                }
                Err(_) => break,
            }
        }
        if to.write_all(&batch).await.is_err() {
            return;
        }
        if next.is_none() {
            next = arrivals.recv().await;
        }
    }
    let _ = to.shutdown().await;
}
