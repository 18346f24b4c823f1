//! What the scenarios share: the schedulers, the configuration, two sessions and their
//! drivers as shuttle tasks.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::time::Duration;

use gomux::{Config, Role, Session};

/// Iterations of each scheduler per scenario.
const ITERATIONS: usize = 200;
/// Bytes each direction of the pipe holds.
const PIPE: usize = 1024;

/// Runs `scenario` under both schedulers, inside a tokio runtime's context whose timers are
/// never driven.
pub fn check(scenario: fn()) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime for the timers' registrations");
    let _context = runtime.enter();
    shuttle::check_random(scenario, ITERATIONS);
    shuttle::check_pct(scenario, ITERATIONS, 3);
}

/// A small outgoing queue, so that writers wait for room; no keepalive, so that no timer is
/// needed while the session is up.
pub fn config() -> Config {
    Config::default()
        .write_buffer_size(256)
        .keepalive_interval(None)
        .close_timeout(Duration::from_secs(3600))
}

/// Two sessions on a pipe, their drivers spawned as shuttle tasks.
pub fn sessions() -> (Session, Session) {
    let (a, b) = tokio::io::duplex(PIPE);
    let (client, client_driver) = Session::new(a, Role::Client, config());
    let (server, server_driver) = Session::new(b, Role::Server, config());
    shuttle::future::spawn(async move {
        let _ = client_driver.await;
    });
    shuttle::future::spawn(async move {
        let _ = server_driver.await;
    });
    (client, server)
}

pub fn content(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}
