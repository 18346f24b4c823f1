//! Places for connections that have not proven anything yet, shared fairly between the
//! addresses they come from.
//!
//! A stranger can open connections and send nothing (slowloris). Refusing newcomers once the
//! places are full would hand the port to whoever opened connections first; here a newcomer is
//! always let in, and the place it needs is taken from the connection least likely to be
//! anyone's real one: one that has not sent a byte before one that has, one from the address
//! holding the most places before others, and the oldest among those. Each address also has
//! its own limit, beyond which its own oldest place goes. So a stranger, from one address or
//! from many, holds no place for longer than the next newcomers leave it, and a real peer,
//! which speaks at once and finishes in milliseconds, gets through however many places the
//! stranger keeps reopening.
//!
//! Used for the handshakes at the exposed listeners (`exit --listen`, `entry --accept-exit`)
//! and for the entry's client connections that are still silent.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// The places, and how many there are.
#[derive(Clone)]
pub(crate) struct Admission {
    state: Arc<Mutex<State>>,
    /// The most places in all.
    total: usize,
    /// The most places one address holds.
    per_source: usize,
    /// How long a place is safe from newcomers; when every place that could go is younger,
    /// the newcomer is let in beyond the limits (zero: the limits are strict).
    grace: Duration,
}

#[derive(Default)]
struct State {
    /// Increases with every admission, so the smallest is the oldest.
    next: u64,
    held: BTreeMap<u64, Place>,
    by_source: HashMap<IpAddr, usize>,
}

struct Place {
    peer: SocketAddr,
    since: Instant,
    /// Whether the connection has sent its first bytes.
    talking: bool,
    evict: CancellationToken,
}

/// A connection that lost its place to a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Evicted {
    pub(crate) peer: SocketAddr,
    /// How long it held the place.
    pub(crate) held: Duration,
}

/// One place, given up when dropped. `evicted` is cancelled when a newcomer takes it.
pub(crate) struct Ticket {
    state: Arc<Mutex<State>>,
    id: u64,
    pub(crate) evicted: CancellationToken,
}

impl Admission {
    /// `total` places in all (at least one), at most `per_source` (at least one) for one
    /// address, each safe from newcomers for `grace`.
    pub(crate) fn new(total: usize, per_source: usize, grace: Duration) -> Admission {
        Admission {
            state: Arc::default(),
            total: total.max(1),
            per_source: per_source.clamp(1, total.max(1)),
            grace,
        }
    }

    /// A place for a connection from `peer` (which has sent its first bytes already if
    /// `talking`), and the connection it was taken from, if one had to go.
    pub(crate) fn admit(&self, peer: SocketAddr, talking: bool) -> (Ticket, Option<Evicted>) {
        let source = peer.ip();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let own = state.by_source.get(&source).copied().unwrap_or(0);
        let old = |place: &Place| place.since.elapsed() >= self.grace;
        let victim = if own >= self.per_source {
            state.choose(|place| place.peer.ip() == source && old(place))
        } else if state.held.len() >= self.total {
            state.choose(old)
        } else {
            None
        };
        let evicted = victim.and_then(|id| state.remove(id)).map(|place| {
            place.evict.cancel();
            Evicted {
                peer: place.peer,
                held: place.since.elapsed(),
            }
        });
        let id = state.next;
        state.next += 1;
        let evict = CancellationToken::new();
        state.held.insert(
            id,
            Place {
                peer,
                since: Instant::now(),
                talking,
                evict: evict.clone(),
            },
        );
        *state.by_source.entry(source).or_default() += 1;
        drop(state);
        let ticket = Ticket {
            state: Arc::clone(&self.state),
            id,
            evicted: evict,
        };
        (ticket, evicted)
    }

    /// How many places are held.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .held
            .len()
    }
}

impl State {
    /// The place to give up among those `eligible`: silent before talking, then from the
    /// address holding the most, then the oldest.
    fn choose(&self, eligible: impl Fn(&Place) -> bool) -> Option<u64> {
        self.held
            .iter()
            .filter(|(_, place)| eligible(place))
            .min_by_key(|&(&id, place)| {
                let crowd = self.by_source.get(&place.peer.ip()).copied().unwrap_or(0);
                (place.talking, std::cmp::Reverse(crowd), id)
            })
            .map(|(&id, _)| id)
    }

    fn remove(&mut self, id: u64) -> Option<Place> {
        let place = self.held.remove(&id)?;
        if let Some(count) = self.by_source.get_mut(&place.peer.ip()) {
            *count -= 1;
            if *count == 0 {
                self.by_source.remove(&place.peer.ip());
            }
        }
        Some(place)
    }
}

impl Ticket {
    /// The connection has sent its first bytes: it goes after every silent one.
    pub(crate) fn talking(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(place) = state.held.get_mut(&self.id) {
            place.talking = true;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit_silent(admission: &Admission, peer: SocketAddr) -> (Ticket, Option<Evicted>) {
        admission.admit(peer, false)
    }

    #[test]
    fn places_within_their_grace_are_safe_and_the_newcomer_is_let_in_beyond() {
        let admission = Admission::new(1, 1, Duration::from_secs(60));
        let (first, _) = admission.admit(ip(2), false);
        let (_second, evicted) = admission.admit(ip(2), false);
        assert_eq!(evicted, None);
        assert!(!first.evicted.is_cancelled());
        assert_eq!(admission.held(), 2);
    }

    #[test]
    fn a_newcomer_already_talking_goes_after_every_silent_place() {
        let admission = Admission::new(2, 2, Duration::ZERO);
        let (talking, _) = admission.admit(ip(1), true);
        let (silent, _) = admission.admit(ip(2), false);
        let (_newcomer, evicted) = admission.admit(ip(3), false);
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(silent.evicted.is_cancelled() && !talking.evicted.is_cancelled());
    }

    fn ip(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 4000))
    }

    #[test]
    fn a_newcomer_takes_the_oldest_silent_place_of_the_most_crowded_address() {
        let admission = Admission::new(4, 3, Duration::ZERO);
        let (a1, none) = admit_silent(&admission, ip(2));
        assert_eq!(none, None);
        let (a2, _) = admit_silent(&admission, ip(2));
        let (b1, _) = admit_silent(&admission, ip(3));
        let (c1, _) = admit_silent(&admission, ip(4));
        c1.talking();
        // Full: 127.0.0.2 holds the most, and its oldest goes.
        let (d1, evicted) = admit_silent(&admission, ip(5));
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(a1.evicted.is_cancelled() && !a2.evicted.is_cancelled());
        // Now all hold one: the oldest silent one goes, not the one talking.
        let (_e1, evicted) = admit_silent(&admission, ip(6));
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(a2.evicted.is_cancelled());
        let (_f1, _) = admit_silent(&admission, ip(7));
        assert!(b1.evicted.is_cancelled() && !c1.evicted.is_cancelled());
        assert!(!d1.evicted.is_cancelled());
        assert_eq!(admission.held(), 4);
    }

    #[test]
    fn an_address_at_its_own_limit_gives_up_its_own_oldest_place() {
        let admission = Admission::new(100, 2, Duration::ZERO);
        let (other, _) = admit_silent(&admission, ip(9));
        let (first, _) = admit_silent(&admission, ip(2));
        let (_second, _) = admit_silent(&admission, ip(2));
        let (_third, evicted) = admit_silent(&admission, ip(2));
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(first.evicted.is_cancelled() && !other.evicted.is_cancelled());
        assert_eq!(admission.held(), 3);
    }

    #[test]
    fn a_dropped_ticket_frees_its_place() {
        let admission = Admission::new(1, 1, Duration::ZERO);
        let (ticket, _) = admit_silent(&admission, ip(2));
        drop(ticket);
        let (_next, evicted) = admit_silent(&admission, ip(3));
        assert_eq!(evicted, None);
        assert_eq!(admission.held(), 1);
    }
}
