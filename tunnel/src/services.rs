//! What both ends share to run named services from a config file: the relays of each service
//! counted apart (so that a removed one drains on its own), and the reload on SIGHUP.
//!
//! A reload reads the file again and checks it whole. A file that does not check changes
//! nothing, and is logged at ERROR. Otherwise the services are compared by name with those
//! running: a new name starts, a name gone stops taking clients and its relays drain as on
//! SIGTERM (they go on until they finish, and what is left at the drain deadline is cut),
//! and a service whose keys changed serves its new clients with the new keys while its
//! clients already relayed go on untouched. The other services, and their clients, are
//! untouched. The connection-wide keys cannot change under a running connection: a change
//! to one is logged, and applies at the next start.

use std::collections::HashMap;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::args::{Args, Command};
use crate::drain::{tracked, Shutdown, Tracked, Tracker, Work};
use crate::settings;

/// The relays of one service, counted apart, and how its removal stops them.
#[derive(Clone, Default)]
pub(crate) struct Lane {
    /// Cancelled when the service is removed: it takes no new clients.
    pub(crate) stop: CancellationToken,
    /// Cancelled to cut the relays of a removed service at the drain deadline.
    pub(crate) cut: CancellationToken,
    relays: Tracker,
}

impl Lane {
    /// Counts one relay of this lane until the guard is dropped; the relay watches
    /// [`Lane::cut`] itself.
    pub(crate) fn track(&self) -> Tracked {
        self.relays.track()
    }

    /// Stops the service taking clients, and drains its relays in a task of the end's
    /// sessions: they go on until they finish, or until the drain deadline (or the cut of a
    /// shutdown), which cuts what is left.
    pub(crate) fn retire(&self, service: &str, shutdown: &Shutdown, work: &Work) {
        self.stop.cancel();
        let (lane, shutdown, service) = (self.clone(), shutdown.clone(), service.to_owned());
        let open = lane.relays.count();
        info!(%service, open, drain = ?shutdown.drain, "service removed: taking no new clients, letting those being relayed finish");
        let retiring = async move {
            tokio::select! {
                () = lane.relays.idle() => {
                    info!(%service, "service removed: every client finished");
                    return;
                }
                () = tokio::time::sleep(shutdown.drain) => {}
                () = shutdown.cut.cancelled() => {}
            }
            let cut = lane.relays.count();
            lane.cut.cancel();
            warn!(%service, cut, "service removed: cut the clients still open");
        };
        tokio::spawn(tracked(work.sessions.track(), retiring));
    }
}

/// Reads the config file again on each SIGHUP.
pub(crate) struct Reloader {
    file: PathBuf,
    signals: mpsc::Receiver<()>,
    running: Args,
}

impl Reloader {
    /// Reloads `args`'s file (a config-mode end's) on each signal of `signals`.
    pub(crate) fn new(args: &Args, signals: mpsc::Receiver<()>) -> Reloader {
        let file = match &args.command {
            Command::EntryConfig { file, .. } | Command::ExitConfig { file, .. } => file.clone(),
            _ => PathBuf::new(),
        };
        Reloader {
            file,
            signals,
            running: args.clone(),
        }
    }

    /// The file's next version that checks, read on a signal. A version that does not check
    /// is logged (ERROR) and skipped; a change to a connection-wide key is logged (WARN).
    /// Pending for ever once the signals are gone. Say [`Reloader::applied`] once it is.
    pub(crate) async fn next(&mut self) -> Args {
        loop {
            if self.signals.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
            info!(file = %self.file.display(), "SIGHUP: reloading the config file");
            match settings::load(&self.file) {
                Ok(args) => {
                    if connection_wide(&args) != connection_wide(&self.running) {
                        warn!(
                            file = %self.file.display(),
                            "connection-wide keys changed: they apply at the next start; \
                             reloading the services only"
                        );
                    }
                    return args;
                }
                Err(problem) => {
                    error!(%problem, "the config file does not check; nothing changed");
                }
            }
        }
    }

    /// Notes that `args`, from [`Reloader::next`], now runs.
    pub(crate) fn applied(&mut self, args: Args) {
        self.running = args;
    }

    /// Logs a version that checked but cannot be applied: nothing changed.
    pub(crate) fn failed(&self, problem: &str) {
        error!(file = %self.file.display(), %problem, "cannot apply the config file; nothing changed");
    }
}

/// `args` without its services.
fn connection_wide(args: &Args) -> Args {
    let mut args = args.clone();
    match &mut args.command {
        Command::EntryConfig { services, .. } => services.clear(),
        Command::ExitConfig { services, .. } => services.clear(),
        _ => {}
    }
    args
}

/// How a new list of services differs from those running, by name.
pub(crate) struct Changes<T> {
    /// Services with a new name.
    pub(crate) added: Vec<T>,
    /// Services with a name still running, whose keys changed.
    pub(crate) changed: Vec<T>,
    /// Names gone.
    pub(crate) removed: Vec<String>,
}

impl<T: PartialEq> Changes<T> {
    /// Compares `new` with `running` (by name, as `name` gives it).
    pub(crate) fn between(
        running: &HashMap<String, T>,
        new: Vec<T>,
        name: impl Fn(&T) -> &str,
    ) -> Changes<T> {
        let removed = running
            .keys()
            .filter(|old| !new.iter().any(|service| name(service) == old.as_str()))
            .cloned()
            .collect();
        let (mut added, mut changed) = (Vec::new(), Vec::new());
        for service in new {
            match running.get(name(&service)) {
                None => added.push(service),
                Some(old) if *old != service => changed.push(service),
                Some(_) => {}
            }
        }
        Changes {
            added,
            changed,
            removed,
        }
    }

    /// Logs what the reload does.
    pub(crate) fn log(&self, name: impl Fn(&T) -> &str) {
        let names = |list: &[T]| list.iter().map(&name).collect::<Vec<_>>().join(",");
        info!(
            added = %names(&self.added),
            changed = %names(&self.changed),
            removed = %self.removed.join(","),
            "config file reloaded"
        );
    }
}
