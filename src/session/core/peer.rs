//! What this side knows of its peer, and the opens that wait for it.
//!
//! The protocol has no handshake, no acknowledgement and no refusal frame. Every session of
//! this crate therefore sends a greeting first (a Keepalive with id [`GREETING_ID`], which a Go
//! peer ignores like any keepalive) and acknowledges each stream its application accepts (a
//! WindowUpdate, of 0 or of the extra window). The peer's first frame tells which kind it is:
//!
//! - **Greeted**: a peer of this crate. A stream of ours that it closes before any frame for it
//!   came back never reached its application: [`Error::Refused`](crate::Error::Refused); so
//!   does every stream of ours it had not acknowledged when it ends the session in order (its
//!   CloseMux, written after every acknowledgement it queued). The greeting also carries its
//!   keepalive interval, so its silence can be told from its death. Opens wait while
//!   [`Config::open_backlog`](crate::Config::open_backlog) streams of ours are unacknowledged,
//!   so that a burst never overruns its accept backlog. A stream closed or dropped before its
//!   answer keeps its place in that backlog as a record of its id ([`Unanswered`]) until the
//!   answer comes: the peer answers every stream, whether its application accepts it or drops
//!   it unaccepted.
//! - **Plain**: anything else, a Go peer. It acknowledges nothing, so nothing waits for it, and
//!   a stream it closes reads as an ordinary end of stream (it may have been handled).
//! - **Unknown**: nothing has come yet. Opens are held at the backlog as for a greeted peer,
//!   but for at most [`GREETING_WAIT`] after the session started: a Go peer that says nothing
//!   holds a burst up that long at most.
//!
//! The greeting is the first frame on an ordered connection, so the kind is always known before
//! any answer about a stream arrives.

use std::collections::{HashSet, VecDeque};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::id_hash::SeqHash;
use super::slab::Slab;
use crate::frame::{Header, Kind, GREETING_ID, MAX_LENGTH_FIELD};

/// How long opens wait for a silent peer's greeting before they go ahead as towards a Go peer.
/// A peer of this crate greets as soon as its driver runs, so this is a few round trips.
pub(crate) const GREETING_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerKind {
    Unknown,
    /// A peer of this crate, with the keepalive interval it announced (`None`: it sends none).
    Greeted {
        keepalive: Option<Duration>,
    },
    Plain,
}

/// The greeting this side sends first: a keepalive whose length field is its own keepalive
/// interval in milliseconds (0 when it sends none, or when the interval does not fit).
pub(crate) fn greeting(keepalive: Option<Duration>) -> Header {
    let millis = keepalive
        .map(|interval| interval.as_millis().max(1))
        .filter(|&millis| millis <= u128::from(MAX_LENGTH_FIELD))
        .unwrap_or(0) as u32;
    Header {
        id: GREETING_ID,
        length: millis,
        kind: Kind::Keepalive,
    }
}

/// Until when a session that started at `started` waits for the peer's greeting.
pub(super) fn greeting_deadline(started: Instant) -> Instant {
    started + GREETING_WAIT
}

pub(super) struct Peer {
    pub(super) kind: PeerKind,
    /// Streams this side opened that the peer has said nothing about yet (counted whatever the
    /// peer's kind, held against the backlog only while it is not plain), the [`Unanswered`]
    /// ones included.
    pub(super) unacked: usize,
    /// Streams of ours whose handles went before the peer answered them.
    pub(super) unanswered: Unanswered,
    /// The opens waiting for the backlog (or for `max_streams`): made by the first, dropped
    /// when the last has gone, so that a session nobody waits on does not carry it.
    line: Option<Box<Line>>,
}

#[derive(Default)]
struct Line {
    /// Oldest first, by their slot in `waiters`; entries of opens that went away are skipped.
    queue: VecDeque<usize>,
    waiters: Slab<Option<Waker>>,
}

impl Peer {
    pub(super) fn new() -> Peer {
        Peer {
            kind: PeerKind::Unknown,
            unacked: 0,
            unanswered: Unanswered::default(),
            line: None,
        }
    }

    /// Learns the peer's kind from its first frame.
    pub(super) fn on_first_frame(&mut self, header: &Header) {
        if self.kind != PeerKind::Unknown {
            return;
        }
        self.kind = if header.kind == Kind::Keepalive && header.id == GREETING_ID {
            let keepalive =
                (header.length > 0).then(|| Duration::from_millis(u64::from(header.length)));
            PeerKind::Greeted { keepalive }
        } else {
            PeerKind::Plain
        };
    }

    /// Whether the peer acknowledges streams (a peer of this crate).
    pub(super) fn greeted(&self) -> bool {
        matches!(self.kind, PeerKind::Greeted { .. })
    }

    /// Whether unacknowledged streams hold opens back at `now`: towards a peer of this crate,
    /// or one not heard from yet within [`GREETING_WAIT`] of the session's start, `started`.
    pub(super) fn holds_opens(&self, now: Instant, started: Instant) -> bool {
        match self.kind {
            PeerKind::Greeted { .. } => true,
            PeerKind::Plain => false,
            PeerKind::Unknown => now < greeting_deadline(started),
        }
    }

    /// Whether the open holding `slot` is next in line: nobody waits, or it is the oldest.
    pub(super) fn first_in_line(&mut self, slot: Option<usize>) -> bool {
        self.prune();
        match self.line.as_ref().and_then(|line| line.queue.front()) {
            None => true,
            Some(&front) => slot == Some(front),
        }
    }

    /// The open holding `slot` waits its turn (taking a slot and a place in line on first use).
    pub(super) fn wait(&mut self, slot: &mut Option<usize>, waker: &Waker) {
        let line = self.line.get_or_insert_with(Box::default);
        match slot.and_then(|key| line.waiters.get_mut(key)) {
            Some(Some(stored)) if stored.will_wake(waker) => {}
            Some(entry) => *entry = Some(waker.clone()),
            None => {
                let key = line.waiters.insert(Some(waker.clone()));
                *slot = Some(key);
                line.queue.push_back(key);
            }
        }
    }

    /// The open holding `slot` is done waiting (it opened, failed, or was dropped).
    pub(super) fn leave(&mut self, slot: &mut Option<usize>) {
        if let (Some(key), Some(line)) = (slot.take(), self.line.as_deref_mut()) {
            line.waiters.remove(key);
        }
        self.prune();
    }

    /// Drops the entries of opens that went away from the front of the line, and the line
    /// once nobody is in it.
    fn prune(&mut self) {
        let Some(line) = self.line.as_deref_mut() else {
            return;
        };
        while let Some(&front) = line.queue.front() {
            if line.waiters.get(front).is_some() {
                break;
            }
            line.queue.pop_front();
        }
        if line.queue.is_empty() && line.waiters.len() == 0 {
            self.line = None;
        }
    }

    /// Wakes the open first in line (it opens, then wakes the next if there is room still).
    pub(super) fn wake_next(&mut self, wakers: &mut Vec<Waker>) {
        self.prune();
        let Some(line) = self.line.as_deref_mut() else {
            return;
        };
        if let Some(&front) = line.queue.front() {
            if let Some(waker) = line.waiters.get_mut(front).and_then(Option::take) {
                wakers.push(waker);
            }
        }
    }

    /// Wakes every waiting open: the session ended, or the line no longer applies.
    pub(super) fn wake_all(&mut self, wakers: &mut Vec<Waker>) {
        let Some(line) = self.line.as_deref_mut() else {
            return;
        };
        for &key in &line.queue {
            if let Some(waker) = line.waiters.get_mut(key).and_then(Option::take) {
                wakers.push(waker);
            }
        }
    }

    /// Whether any open waits in line.
    pub(super) fn has_waiting(&self) -> bool {
        self.line
            .as_ref()
            .is_some_and(|line| !line.queue.is_empty())
    }

    /// Opens waiting, for tests.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.line.as_ref().map_or(0, |line| line.waiters.len())
    }
}

/// The ids of streams of ours that were closed and forgotten before the peer answered them
/// (acknowledged or refused): each keeps its place in the open backlog until the answer comes,
/// so that write-and-drop never overruns the peer's accept backlog, and a refusal of a stream
/// whose handle is gone is still counted. Records are kept only while unacknowledged streams
/// hold opens back (a greeted peer, or one not heard from yet within [`GREETING_WAIT`]), so
/// there are at most `open_backlog` of them; they go when the peer turns out to be plain, and
/// with the session. Boxed and made by the first one: most sessions never have one.
#[derive(Default)]
// Boxed: 8 bytes in every session's state rather than the 32 of an empty set.
#[allow(clippy::box_collection)]
pub(super) struct Unanswered(Option<Box<HashSet<u32, SeqHash>>>);

impl Unanswered {
    /// Records stream `id`, forgotten before its answer.
    pub(super) fn insert(&mut self, id: u32) {
        self.0.get_or_insert_with(Box::default).insert(id);
    }

    /// Whether `id` is recorded (its id is not free for a new stream).
    pub(super) fn contains(&self, id: u32) -> bool {
        self.0.as_ref().is_some_and(|ids| ids.contains(&id))
    }

    /// Takes the record of `id`, if there is one: its answer came.
    pub(super) fn remove(&mut self, id: u32) -> bool {
        let Some(ids) = self.0.as_mut() else {
            return false;
        };
        let found = ids.remove(&id);
        if ids.is_empty() {
            self.0 = None;
        }
        found
    }

    /// Forgets every record (the peer is plain); returns how many there were.
    pub(super) fn clear(&mut self) -> usize {
        self.0.take().map_or(0, |ids| ids.len())
    }

    /// Takes every record (the peer ended the session).
    pub(super) fn take_all(&mut self) -> Vec<u32> {
        self.0
            .take()
            .map(|ids| ids.into_iter().collect())
            .unwrap_or_default()
    }

    /// How many are recorded.
    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |ids| ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_greeting_carries_the_keepalive_interval_in_milliseconds() {
        let header = greeting(Some(Duration::from_secs(30)));
        assert_eq!((header.id, header.length), (GREETING_ID, 30_000));
        assert_eq!(header.kind, Kind::Keepalive);
        assert_eq!(greeting(None).length, 0);
        assert_eq!(greeting(Some(Duration::MAX)).length, 0, "too long: none");
        assert_eq!(greeting(Some(Duration::from_micros(1))).length, 1);
        let mut peer = Peer::new();
        peer.on_first_frame(&greeting(Some(Duration::from_secs(30))));
        assert_eq!(
            peer.kind,
            PeerKind::Greeted {
                keepalive: Some(Duration::from_secs(30))
            }
        );
        // Later frames change nothing.
        peer.on_first_frame(&Header::new(2, Kind::OpenStream));
        assert!(peer.greeted());
    }

    #[test]
    fn a_peer_whose_first_frame_is_anything_else_is_plain() {
        for first in [
            Header::new(0, Kind::Keepalive),
            Header::new(GREETING_ID, Kind::WindowUpdate),
            Header::new(1, Kind::OpenStream),
        ] {
            let mut peer = Peer::new();
            peer.on_first_frame(&first);
            assert_eq!(peer.kind, PeerKind::Plain, "{first:?}");
            assert!(!peer.holds_opens(Instant::now(), Instant::now()));
        }
    }

    #[test]
    fn an_unknown_peer_holds_opens_for_the_greeting_wait_only() {
        let start = Instant::now();
        let peer = Peer::new();
        assert!(peer.holds_opens(start, start));
        assert!(peer.holds_opens(start + GREETING_WAIT - Duration::from_millis(1), start));
        assert!(!peer.holds_opens(start + GREETING_WAIT, start));
    }

    #[test]
    fn opens_wait_in_line_and_a_cancelled_one_passes_its_turn_on() {
        let mut peer = Peer::new();
        let (mut a, mut b) = (None, None);
        assert!(peer.first_in_line(None), "nobody waits");
        peer.wait(&mut a, Waker::noop());
        peer.wait(&mut b, Waker::noop());
        peer.wait(&mut a, Waker::noop());
        assert_eq!(peer.waiting(), 2, "waiting again keeps the place");
        assert!(peer.first_in_line(a) && !peer.first_in_line(b));
        assert!(!peer.first_in_line(None), "a newcomer waits behind them");
        peer.leave(&mut a);
        assert!(peer.first_in_line(b), "the next in line");
        let mut woken = Vec::new();
        peer.wake_next(&mut woken);
        assert_eq!(woken.len(), 1);
        peer.leave(&mut b);
        assert!(peer.first_in_line(None));
        assert_eq!(peer.waiting(), 0);
    }
}
