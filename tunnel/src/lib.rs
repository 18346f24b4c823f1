//! A TCP tunnel that carries every forwarded connection over one gomux connection (or a few,
//! `--connections K`), forward or reverse, to a fixed target or as a SOCKS5 proxy, with the
//! connection between its two ends mutually authenticated and encrypted (TLS 1.3, each end
//! pinning the other's certificate).
//!
//! Two programs in one: the *entry* listens where clients connect, and the *exit* runs near the
//! service they want to reach (the *target*). Between the two there is a single connection,
//! and every client connection becomes one gomux stream on it:
//!
//! ```text
//!  client ──TCP──┐                                           ┌──TCP── target
//!  client ──TCP──┼── entry ══ one TLS + gomux connection ══ exit ──┼──TCP── target
//!  client ──TCP──┘                                           └──TCP── target
//! ```
//!
//! The binary, `gomux-tunnel`, is described in the crate's README (deployments, the threat
//! model) and by `gomux-tunnel --help`. This library is what it is made of, so that the tests
//! can run both ends in one process on ephemeral ports and shut either down:
//!
//! - [`args`]: the command line, and [`cli`]: running what it asks for;
//! - [`security`]: key pairs, fingerprints, and the pinned TLS verifiers;
//! - [`config`]: the bounds the tunnel keeps, the allow-list, SOCKS5 credentials;
//! - [`connect`]: dialling and accepting the connection between the ends, handshake first;
//! - [`entry`] and [`exit`] (with [`socks`]): the two ends; the entry also watches the
//!   SOCKS5 exchanges it carries, to log the exit's refusals with the client's address;
//! - [`relay`]: copying bytes between TCP and a stream, and the plain relay baseline;
//! - [`drain`]: the two-step shutdown a signal fires;
//! - [`logging`]: where the output goes, and why writing it never fails the process;
//! - [`settings`]: the config file (named services, a key for every flag), and [`preface`]:
//!   how a stream names its service between two ends run from config files;
//! - [`metrics`]: the figures an end keeps, and the endpoint that serves them.
//!
//! Beside them, the bounds a stranger meets: `admission` (the places of connections still in
//! their handshake, or still silent at the entry), `refusals` (log lines summarised per
//! source address), `outage` (an outage of the other end logged once), and `turn_away` (the
//! SOCKS5 reply of a client the entry cannot carry).
//!
//! # What each failure ends
//!
//! - A client that closes its connection ends its own stream, nothing else.
//! - A target that refuses a connection (or that the allow-list forbids) gets that one stream
//!   closed, and its client is closed with it (in SOCKS5 mode, after the SOCKS5 error reply).
//!   The gomux connection and every other client carry on.
//! - The same goes for a stream that the other end refuses, because too many streams already
//!   wait there to be accepted or because it is shutting down: its client is closed, nothing
//!   else.
//! - A connection to a listening end that fails its handshake (a port scanner, garbage, a TLS
//!   client without the pinned key, one that never finishes within the handshake timeout) is
//!   logged once with its address and closed; no gomux session started on it.
//! - When the gomux connection itself dies, every client connection it carried is closed, and
//!   the dialling end dials again, waiting longer after each failed attempt (exponential
//!   backoff, capped). Clients that arrive meanwhile wait for the new connection, for
//!   `--exit-wait` (3 s by default; with `--connections K`, they go to the other connections
//!   while there are any).
//!
//! # Shutting down
//!
//! Ctrl-C, or SIGTERM, shuts an end down gracefully. The end takes no new work: the entry
//! closes its listening ports (clients that connect now are refused), the exit takes no new
//! gomux connections, and neither dials again. Each of its gomux connections is closed with
//! `Session::graceful_close`: the other end's new streams are refused, and the connections
//! being relayed go on until they finish. Then the program exits. At the drain deadline
//! (`--drain SECONDS`, 30 by default), or on a second Ctrl-C, what is still open is cut; a
//! third Ctrl-C exits at once. The log says how many connections were being relayed, and
//! whether they all finished or how many were cut.
//!
//! A forwarder cannot tell where a request ends: a connection finishes when its client and its
//! target have both closed it. Clients that keep idle connections open (HTTP keep-alive,
//! connection pools) hold the drain up until the deadline.

#![forbid(unsafe_code)]

mod admission;
pub mod args;
pub mod cli;
pub mod config;
pub mod connect;
pub mod drain;
pub mod entry;
pub mod exit;
pub mod logging;
pub mod metrics;
mod outage;
pub mod preface;
mod refusals;
pub mod relay;
pub mod security;
mod services;
pub mod settings;
pub mod socks;
mod socks_watch;
mod turn_away;

pub use connect::{Meeting, Peer, Redial};
pub use drain::{SessionEnd, Shutdown, ShutdownReport};
pub use entry::{run_entry, EntryOptions};
pub use exit::{run_exit, Destination, ExitOptions, SocksOptions};
pub use relay::{carry, run_relay};
pub use security::{Fingerprint, Identity, Security};
