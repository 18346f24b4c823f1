//! The exit's named services, from a config file: the preface each stream starts with picks
//! its service (see `preface`), and a reload replaces the table of them.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use gomux::Stream;
use tokio::sync::Semaphore;
use tracing::{debug, warn, Span};

use super::{
    spawn_service, Destination, ExitOptions, ExitRun, Held, Services, SocksOptions, Table,
};
use crate::args::{Command, ExitService, TargetArg};
use crate::config::Handshakes;
use crate::connect::{Meeting, Peer};
use crate::drain::{SessionEnd, Shutdown, ShutdownReport, Work};
use crate::logging::{warn_at_start, Escaped};
use crate::metrics::metrics;
use crate::preface::{self, Read};
use crate::relay::resolve;
use crate::services::{Changes, Reloader};

/// The services a config-mode exit runs, as their keys read, for a reload to compare.
pub(crate) struct Running {
    table: Table,
    keys: HashMap<String, ExitService>,
    handshakes: Handshakes,
}

/// Makes the running form of a service: resolves its target, and checks it against its
/// allow-list.
///
/// # Errors
///
/// The target does not resolve, or lies outside every `allow` rule.
pub(crate) async fn exit_service(
    keys: &ExitService,
    handshakes: Handshakes,
) -> Result<ExitRun, String> {
    let name = &keys.name;
    let destination = match &keys.target {
        TargetArg::Fixed(addr) => {
            let target = resolve(addr).await?;
            if !keys.allow.allows(target) {
                return Err(format!(
                    "service {name:?}: the target {target} is outside every allow rule"
                ));
            }
            Destination::Fixed(target)
        }
        TargetArg::Socks => {
            if keys.allow.allows_all() {
                warn_at_start(format!(
                    "service {name:?}: socks without allow: the exit connects its clients to \
                     any address its host can reach"
                ));
            }
            Destination::Socks
        }
    };
    let socks = SocksOptions {
        credentials: keys.credentials.clone(),
        handshakes,
    };
    Ok(ExitRun::new(
        name,
        destination,
        keys.allow.clone(),
        keys.priorities.clone(),
        socks,
    ))
}

/// Runs a config-mode exit: its `services`, reloaded from the file on each signal of the
/// reloader. Otherwise as [`run_exit`](super::run_exit).
///
/// # Errors
///
/// A service cannot start (see [`exit_service`]).
pub(crate) async fn run_named_exit(
    entry: Peer,
    services: Vec<ExitService>,
    options: ExitOptions,
    meeting: Meeting,
    shutdown: Shutdown,
    reloader: Reloader,
) -> Result<ShutdownReport, String> {
    let handshakes = options.socks.handshakes;
    let mut table = HashMap::new();
    let mut keys = HashMap::new();
    for service in services {
        let run = exit_service(&service, handshakes).await?;
        table.insert(service.name.clone(), Arc::new(run));
        keys.insert(service.name.clone(), service);
    }
    let table: Table = Arc::new(RwLock::new(table));
    let running = Running {
        table: Arc::clone(&table),
        keys,
        handshakes,
    };
    Ok(super::run_exit_serving(
        entry,
        Services::Named(table),
        &options,
        meeting,
        shutdown,
        Some((reloader, running)),
        handshakes,
    )
    .await)
}

/// Waits for the next reload of the file, and applies it: pending for ever without a
/// reloader.
pub(super) async fn reload(
    reloader: &mut Option<(Reloader, Running)>,
    shutdown: &Shutdown,
    work: &Work,
) {
    let Some((reloader, running)) = reloader else {
        return std::future::pending().await;
    };
    let args = reloader.next().await;
    let Command::ExitConfig { services, .. } = &args.command else {
        return reloader.failed("the file now describes an entry");
    };
    let changes = Changes::between(&running.keys, services.clone(), |s| &s.name);
    // Every new service is made before anything changes: one that cannot start leaves
    // everything as it was.
    let mut made = Vec::new();
    for keys in changes.added.iter().chain(&changes.changed) {
        match exit_service(keys, running.handshakes).await {
            Ok(run) => made.push((keys.clone(), Arc::new(run))),
            Err(problem) => return reloader.failed(&problem),
        }
    }
    changes.log(|s| &s.name);
    let mut table = running
        .table
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    for name in &changes.removed {
        if let Some(run) = table.remove(name) {
            run.lane.retire(name, shutdown, work);
        }
        running.keys.remove(name);
    }
    // A changed service serves its new streams as its keys now say; those it serves go on
    // as they were.
    for (keys, run) in made {
        table.insert(keys.name.clone(), run);
        running.keys.insert(keys.name.clone(), keys);
    }
    drop(table);
    reloader.applied(args);
}

/// Serves one stream of a config-mode exit: reads its preface (within `timeout`), answers it,
/// and hands the stream, with what its task holds (`held`), over to a task of its service (see
/// `spawn_service`); a stream for a service the exit does not have is answered so, logged with
/// the name, and closed without relaying.
pub(super) async fn serve_named(
    mut stream: Stream,
    table: Table,
    end: SessionEnd,
    places: Arc<Semaphore>,
    timeout: Duration,
    held: Held,
) {
    let name = match tokio::time::timeout(timeout, preface::read_preface(&mut stream)).await {
        Ok(Ok(Read::Named(name))) => name,
        Ok(Ok(Read::NotPreface)) => {
            metrics().refused("", "no_preface");
            warn!(
                "a stream without a service preface (is the entry run with flags rather than \
                 --config? the two modes do not mix); closing the stream"
            );
            return;
        }
        Ok(Err(error)) => {
            debug!(%error, "the stream ended before its preface");
            return;
        }
        Err(_) => {
            metrics().refused("", "no_preface");
            warn!(?timeout, "no service preface in time; closing the stream");
            return;
        }
    };
    let service = table
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&name)
        .cloned();
    let Some(service) = service else {
        metrics().refused("", "unknown_service");
        warn!(service = %Escaped(&name), "no such service; refusing the stream");
        let _ = preface::answer(&mut stream, false).await;
        let _ = stream.close().await;
        return;
    };
    if preface::answer(&mut stream, true).await.is_err() {
        return;
    }
    if service.lane.stop.is_cancelled() {
        return; // removed meanwhile
    }
    spawn_service(stream, service, end, places, held, Span::current());
}
