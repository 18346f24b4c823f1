//! The entry's named services, from a config file: a listener each, whose clients' streams
//! name the service in a preface (see `preface`), and the reload that starts and stops them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;

use super::{accept_clients, Accepting, ClientService};
use crate::args::{Command, EntryService};
use crate::drain::tracked;
use crate::metrics::metrics;
use crate::relay::bind;
use crate::services::{Changes, Lane, Reloader};

/// A config-mode entry's services, their listeners bound, and the reloader of their file.
pub(crate) struct Named {
    /// Each service with its listener.
    pub(crate) services: Vec<(EntryService, TcpListener)>,
    /// Reads the file again on each signal.
    pub(crate) reloader: Reloader,
}

/// A service running, as its keys read and as its clients are served.
type Running = HashMap<String, (EntryService, Arc<ClientService>)>;

impl Named {
    /// Runs every service, and applies each reload, until the shutdown begins (which ends
    /// the accept loops).
    pub(crate) async fn run(self, accepting: Accepting) {
        let Named {
            services,
            mut reloader,
        } = self;
        let mut running = Running::new();
        for (keys, listener) in services {
            start(keys, listener, &accepting, &mut running);
        }
        loop {
            let args = tokio::select! {
                biased;
                () = accepting.shutdown.begin.cancelled() => return,
                args = reloader.next() => args,
            };
            let Command::EntryConfig { services, .. } = &args.command else {
                reloader.failed("the file now describes an exit");
                continue;
            };
            let keys: HashMap<String, EntryService> = running
                .iter()
                .map(|(name, (keys, _))| (name.clone(), keys.clone()))
                .collect();
            let changes = Changes::between(&keys, services.clone(), |s| &s.name);
            // Every new listener is bound before anything changes: one that cannot be bound
            // leaves everything as it was.
            let mut bound = Vec::new();
            let mut failed = None;
            for keys in &changes.added {
                match bind(&keys.listen, &format!("service.{}", keys.name)).await {
                    Ok(listener) => bound.push((keys.clone(), listener)),
                    Err(problem) => failed = Some(format!("service {:?}: {problem}", keys.name)),
                }
            }
            let mut moved = Vec::new();
            for keys in &changes.changed {
                let (old, _) = &running[&keys.name];
                if old.listen == keys.listen {
                    continue;
                }
                match bind(&keys.listen, &format!("service.{}", keys.name)).await {
                    Ok(listener) => moved.push((keys.clone(), listener)),
                    Err(problem) => failed = Some(format!("service {:?}: {problem}", keys.name)),
                }
            }
            if let Some(problem) = failed {
                reloader.failed(&problem);
                continue;
            }
            changes.log(|s| &s.name);
            let (shutdown, work) = (&accepting.shutdown, &accepting.work);
            for name in &changes.removed {
                if let Some((_, service)) = running.remove(name) {
                    service.lane.retire(name, shutdown, work);
                }
            }
            // A service that moves to another address drains on the old one as if removed.
            for (keys, listener) in moved {
                if let Some((_, service)) = running.remove(&keys.name) {
                    service.lane.retire(&keys.name, shutdown, work);
                }
                start(keys, listener, &accepting, &mut running);
            }
            // One that stays where it is takes its other keys at once.
            for keys in &changes.changed {
                if let Some((old, service)) = running.get_mut(&keys.name) {
                    service.socks.store(keys.socks, Ordering::Relaxed);
                    *old = keys.clone();
                }
            }
            for (keys, listener) in bound {
                start(keys, listener, &accepting, &mut running);
            }
            reloader.applied(args);
        }
    }
}

/// Starts the accept loop of a service.
fn start(keys: EntryService, listener: TcpListener, accepting: &Accepting, running: &mut Running) {
    let service = Arc::new(ClientService {
        name: Some(keys.name.clone()),
        socks: AtomicBool::new(keys.socks),
        metrics: metrics().service(&keys.name),
        lane: Lane::default(),
    });
    let accept = accept_clients(listener, Arc::clone(&service), accepting.clone());
    tokio::spawn(tracked(accepting.work.sessions.track(), accept));
    running.insert(keys.name.clone(), (keys, service));
}
