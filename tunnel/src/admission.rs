//! Places for connections that have not proven anything yet, shared fairly between the
//! addresses they come from.
//!
//! A stranger can open connections and send nothing (slowloris). Refusing newcomers once the
//! places are full would hand the port to whoever opened connections first; here a newcomer
//! takes the place of the connection least likely to be anyone's real one: one that has not
//! sent a byte before one that has, one from the address holding the most places before
//! others, and the oldest among those. Each address also has its own limit, beyond which its
//! own oldest place goes. A place can be taken only once its connection has been looked at
//! (a newcomer's first bytes may be on their way while the listener accepts others) and, by a
//! newcomer that has not spoken, only once it is older than the grace; when no place can be
//! taken, the newcomer is let in beyond the limits, up to a hard bound past which it is
//! refused unless it has spoken. The grace keeps strangers who reopen every connection closed
//! from making the listener close and accept in a loop as fast as it can. So a stranger, from one
//! address or from many, holds no place for long, and a real peer, which speaks at once and
//! finishes in milliseconds, gets through however many places the stranger keeps reopening.
//!
//! Used for the handshakes at the exposed listeners (`exit --listen`, `entry --accept-exit`)
//! and for the entry's client connections that are still silent.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// How long a connection that has spoken is safe from newcomers, even at the hard bound:
/// far longer than a real peer's handshake takes.
const TALKING_GRACE: Duration = Duration::from_secs(1);

/// The places, and how many there are.
#[derive(Clone)]
pub(crate) struct Admission {
    state: Arc<Mutex<State>>,
    /// The most places in all.
    total: usize,
    /// The most places one address holds.
    per_source: usize,
    /// How long a place is safe from newcomers.
    grace: Duration,
    /// The most places in all, beyond `total` when no place can be taken; a newcomer beyond
    /// is refused.
    hard: usize,
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
    /// Whether the connection has been looked at: until then its place cannot be taken.
    checked: bool,
    /// Whether the connection has sent its first bytes.
    talking: bool,
    evict: CancellationToken,
}

/// What is known of a newcomer when it asks for a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Newcomer {
    /// Not looked at yet: its place cannot be taken until [`Ticket::checked`] says.
    Unchecked,
    /// Looked at: nothing sent yet.
    Silent,
    /// It has sent its first bytes: it takes a silent place whatever its age.
    Talking,
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
    /// address, each safe from newcomers for `grace`, and at most `hard` places even when
    /// none can be taken.
    pub(crate) fn new(total: usize, per_source: usize, grace: Duration, hard: usize) -> Admission {
        let total = total.max(1);
        Admission {
            state: Arc::default(),
            total,
            per_source: per_source.clamp(1, total),
            grace,
            hard: hard.max(total),
        }
    }

    /// A place for a connection from `peer`, and the connection it was taken from, if one had
    /// to go; `None` when the newcomer is refused.
    pub(crate) fn admit(
        &self,
        peer: SocketAddr,
        newcomer: Newcomer,
    ) -> Option<(Ticket, Option<Evicted>)> {
        let talking = newcomer == Newcomer::Talking;
        let source = peer.ip();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let own = state.by_source.get(&source).copied().unwrap_or(0);
        let crowded = own >= self.per_source;
        let in_scope = |place: &Place| !crowded || place.peer.ip() == source;
        let silent = |place: &Place| {
            in_scope(place)
                && place.checked
                && !place.talking
                && (talking || place.since.elapsed() >= self.grace)
        };
        let mut victim = if crowded || state.held.len() >= self.total {
            state.choose(silent)
        } else {
            None
        };
        if victim.is_none() && state.held.len() >= self.hard {
            // At the hard bound a newcomer that has not spoken is refused; one that has takes
            // even the place of one that has spoken, if slower than a real peer's handshake.
            if !talking {
                return None;
            }
            victim =
                state.choose(|place| in_scope(place) && place.since.elapsed() >= TALKING_GRACE);
            victim?;
        }
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
                checked: newcomer != Newcomer::Unchecked,
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
        Some((ticket, evicted))
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
    /// The connection has been looked at: it has sent its first bytes (`talking`: it goes
    /// after every silent one), or not yet.
    pub(crate) fn checked(&self, talking: bool) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(place) = state.held.get_mut(&self.id) {
            place.checked = true;
            place.talking |= talking;
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

    fn ip(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 4000))
    }

    fn admit(admission: &Admission, peer: SocketAddr) -> (Ticket, Option<Evicted>) {
        admission.admit(peer, Newcomer::Silent).expect("admitted")
    }

    #[test]
    fn a_newcomer_takes_the_oldest_silent_place_of_the_most_crowded_address() {
        let admission = Admission::new(4, 3, Duration::ZERO, 4);
        let (a1, none) = admit(&admission, ip(2));
        assert_eq!(none, None);
        let (a2, _) = admit(&admission, ip(2));
        let (b1, _) = admit(&admission, ip(3));
        let (c1, _) = admit(&admission, ip(4));
        c1.checked(true);
        // Full: 127.0.0.2 holds the most, and its oldest goes.
        let (d1, evicted) = admit(&admission, ip(5));
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(a1.evicted.is_cancelled() && !a2.evicted.is_cancelled());
        // Now all hold one: the oldest silent one goes, never the one talking.
        let (_e1, evicted) = admit(&admission, ip(6));
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(a2.evicted.is_cancelled());
        let (_f1, _) = admit(&admission, ip(7));
        assert!(b1.evicted.is_cancelled() && !c1.evicted.is_cancelled());
        assert!(!d1.evicted.is_cancelled());
        assert_eq!(admission.held(), 4);
    }

    #[test]
    fn an_address_at_its_own_limit_gives_up_its_own_oldest_place() {
        let admission = Admission::new(100, 2, Duration::ZERO, 100);
        let (other, _) = admit(&admission, ip(9));
        let (first, _) = admit(&admission, ip(2));
        let (_second, _) = admit(&admission, ip(2));
        let (_third, evicted) = admit(&admission, ip(2));
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(first.evicted.is_cancelled() && !other.evicted.is_cancelled());
        assert_eq!(admission.held(), 3);
    }

    #[test]
    fn places_not_yet_looked_at_or_within_their_grace_are_safe_up_to_the_hard_bound() {
        // Not looked at yet: the newcomer is let in beyond the limit, up to the hard bound.
        let admission = Admission::new(1, 1, Duration::ZERO, 2);
        let (first, _) = admission
            .admit(ip(2), Newcomer::Unchecked)
            .expect("admitted");
        let (second, evicted) = admission
            .admit(ip(3), Newcomer::Unchecked)
            .expect("let in beyond");
        assert_eq!(evicted, None);
        assert!(
            admission.admit(ip(4), Newcomer::Unchecked).is_none(),
            "refused beyond the hard bound"
        );
        // Looked at, and silent: its place can go.
        first.checked(false);
        let (_third, evicted) = admission
            .admit(ip(4), Newcomer::Unchecked)
            .expect("admitted");
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(!second.evicted.is_cancelled());
        // Within the grace, a place is safe.
        let admission = Admission::new(1, 1, Duration::from_secs(60), 10);
        let (first, _) = admit(&admission, ip(2));
        let (_second, evicted) = admit(&admission, ip(2));
        assert_eq!(evicted, None);
        assert!(!first.evicted.is_cancelled());
        // ... but not from one that has spoken.
        let (_third, evicted) = admission.admit(ip(3), Newcomer::Talking).expect("admitted");
        assert_eq!(evicted.map(|e| e.peer), Some(ip(2)));
        assert!(first.evicted.is_cancelled());
    }

    #[test]
    fn a_dropped_ticket_frees_its_place() {
        let admission = Admission::new(1, 1, Duration::ZERO, 1);
        let (ticket, _) = admit(&admission, ip(2));
        drop(ticket);
        let (_next, evicted) = admit(&admission, ip(3));
        assert_eq!(evicted, None);
        assert_eq!(admission.held(), 1);
    }
}
