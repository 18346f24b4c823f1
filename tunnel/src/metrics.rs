//! What an end counts while it runs, served as OpenMetrics text (`--metrics ADDR`, see
//! `metrics::serve`): per service, the clients (at the exit: streams) accepted, active and
//! refused and the bytes each way; per end, its gomux connections (up, reconnects, round trip,
//! credit waits) and the handshakes that failed, by reason.
//!
//! The figures live in one registry per process ([`metrics()`]), made at first use. Every
//! metric is an atomic: a relay adds the bytes of each chunk it writes to counters it holds,
//! with no lock and no look-up; a service's counters are looked up once per client. The
//! figures drawn from the gomux sessions (round trip, credit waits) are read at each scrape.

mod serve;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use gomux::{Pool, Session};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use serve::{serve_metrics, CONTENT_TYPE};

/// The label of a figure kept per service.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabel {
    service: String,
}

/// The labels of the refusals of a service.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    service: String,
    reason: String,
}

/// The labels of the bytes of a service.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BytesLabels {
    service: String,
    /// `to_target` (from the entry's clients to the exit's targets) or `to_client`.
    direction: String,
}

/// The label of a handshake failure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// Every figure of the process.
pub struct Metrics {
    registry: Registry,
    accepted: Family<ServiceLabel, Counter>,
    active: Family<ServiceLabel, Gauge>,
    refused: Family<RefusedLabels, Counter>,
    bytes: Family<BytesLabels, Counter>,
    up: Gauge,
    live: Gauge,
    reconnects: Counter,
    rtt: Gauge<f64, AtomicU64>,
    credit_waits: Counter,
    handshake_failures: Family<ReasonLabel, Counter>,
    /// Connections made so far, and how many of them were the first ones (the rest replace
    /// lost ones and count as reconnects).
    made: AtomicU64,
    first: AtomicU64,
    sessions: Mutex<Sessions>,
}

/// The gomux sessions of the end, as the scrape reads them, and the credit waits of each
/// already counted.
#[derive(Default)]
struct Sessions {
    pool: Option<Pool>,
    live: HashMap<u64, Session>,
    counted: HashMap<u64, u64>,
}

/// The figures of the process, made (and registered) at first use.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("gomux_tunnel");
        let metrics = Metrics {
            registry: Registry::default(),
            accepted: Family::default(),
            active: Family::default(),
            refused: Family::default(),
            bytes: Family::default(),
            up: Gauge::default(),
            live: Gauge::default(),
            reconnects: Counter::default(),
            rtt: Gauge::default(),
            credit_waits: Counter::default(),
            handshake_failures: Family::default(),
            made: AtomicU64::new(0),
            first: AtomicU64::new(1),
            sessions: Mutex::default(),
        };
        registry.register(
            "service_clients_accepted",
            "Clients accepted by a service (at the exit: its streams)",
            metrics.accepted.clone(),
        );
        registry.register(
            "service_clients_active",
            "Clients of a service being relayed now",
            metrics.active.clone(),
        );
        registry.register(
            "service_refused",
            "Clients of a service refused, by reason",
            metrics.refused.clone(),
        );
        registry.register(
            "service_bytes",
            "Bytes relayed for a service, by direction (to_target, to_client)",
            metrics.bytes.clone(),
        );
        registry.register(
            "connection_up",
            "1 while a gomux connection to the other end is up, else 0",
            metrics.up.clone(),
        );
        registry.register(
            "connections_live",
            "gomux connections to the other end up now",
            metrics.live.clone(),
        );
        registry.register(
            "reconnects",
            "gomux connections made to replace lost ones",
            metrics.reconnects.clone(),
        );
        registry.register(
            "round_trip_seconds",
            "Smallest round trip measured on the gomux connections up (0 until measured)",
            metrics.rtt.clone(),
        );
        registry.register(
            "credit_waits",
            "Writes that waited for the other end's credit (an empty send window)",
            metrics.credit_waits.clone(),
        );
        registry.register(
            "handshake_failures",
            "Connections between the ends whose handshake failed, by reason",
            metrics.handshake_failures.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The figures of service `name`, to be held by its accept loop (or its exit entry).
    pub fn service(&self, name: &str) -> ServiceMetrics {
        let label = ServiceLabel {
            service: name.to_owned(),
        };
        let bytes = |direction: &str| {
            self.bytes.get_or_create_owned(&BytesLabels {
                service: name.to_owned(),
                direction: direction.to_owned(),
            })
        };
        ServiceMetrics {
            name: name.to_owned(),
            accepted: self.accepted.get_or_create_owned(&label),
            active: self.active.get_or_create_owned(&label),
            to_target: bytes("to_target"),
            to_client: bytes("to_client"),
        }
    }

    /// Counts a refusal of a client of `service`.
    pub fn refused(&self, service: &str, reason: &str) {
        self.refused
            .get_or_create(&RefusedLabels {
                service: service.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts a failed handshake between the ends.
    pub fn handshake_failed(&self, reason: &str) {
        self.handshake_failures
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// How many connections the end makes at first (`--connections`): those made beyond
    /// replace lost ones.
    pub fn first_connections(&self, count: usize) {
        self.first.store(count as u64, Ordering::Relaxed);
    }

    /// Counts a gomux connection made.
    pub fn connected(&self) {
        let made = self.made.fetch_add(1, Ordering::Relaxed) + 1;
        if made > self.first.load(Ordering::Relaxed) {
            self.reconnects.inc();
        }
    }

    /// Reads the sessions of the entry's pool at each scrape.
    pub fn watch_pool(&self, pool: &Pool) {
        self.lock().pool = Some(pool.clone());
    }

    /// Reads `session` at each scrape until [`Metrics::session_ended`] says it has ended.
    pub fn session_started(&self, number: u64, session: &Session) {
        self.lock().live.insert(number, session.clone());
    }

    /// Counts the last figures of a session that has ended, and forgets it.
    pub fn session_ended(&self, number: u64, session: &Session) {
        let mut sessions = self.lock();
        let counted = sessions.counted.remove(&number).unwrap_or(0);
        sessions.live.remove(&number);
        drop(sessions);
        let waits = session.stats().credit_waits;
        self.credit_waits.inc_by(waits.saturating_sub(counted));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the sessions, then writes every figure as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut sessions = self.lock();
        let mut live: Vec<(u64, Session)> = sessions
            .live
            .iter()
            .map(|(&number, session)| (number, session.clone()))
            .collect();
        if let Some(pool) = &sessions.pool {
            live.extend(
                pool.sessions()
                    .iter()
                    .map(|pooled| (pooled.number(), pooled.session().clone())),
            );
        }
        live.retain(|(_, session)| !session.is_closed());
        let mut rtt = None;
        for (number, session) in &live {
            let stats = session.stats();
            let counted = sessions.counted.entry(*number).or_insert(0);
            self.credit_waits
                .inc_by(stats.credit_waits.saturating_sub(*counted));
            *counted = (*counted).max(stats.credit_waits);
            rtt = match (rtt, stats.min_rtt) {
                (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
                (a, b) => a.or(b),
            };
        }
        drop(sessions);
        self.live.set(live.len() as i64);
        self.up.set(i64::from(!live.is_empty()));
        self.rtt.set(rtt.map_or(0.0, |rtt| rtt.as_secs_f64()));
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The figures of one service, held by whatever serves its clients.
#[derive(Clone, Debug)]
pub struct ServiceMetrics {
    /// The service's name (`default` for the one service of the flags).
    pub name: String,
    accepted: Counter,
    active: Gauge,
    /// Bytes from the clients towards the targets.
    pub to_target: Counter,
    /// Bytes from the targets towards the clients.
    pub to_client: Counter,
}

impl ServiceMetrics {
    /// Counts a client accepted, and active until the guard is dropped.
    pub fn accepted(&self) -> Active {
        self.accepted.inc();
        self.active.inc();
        Active(self.active.clone())
    }

    /// Counts a refusal of a client of this service.
    pub fn refused(&self, reason: &str) {
        metrics().refused(&self.name, reason);
    }
}

/// A client counted as active until dropped.
pub struct Active(Gauge);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}
