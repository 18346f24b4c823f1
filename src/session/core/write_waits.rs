//! How long writes wait for the peer's credit and for room in the send queues, for
//! `Session::stats`.
//!
//! A stream's state has no room for a timestamp (every stream pays for it, and it is held at
//! 168 bytes: `core::tests::stream_state_stays_small`), so the streams whose writer is waiting
//! are kept here, as `Inner::stop_waiters` keeps the few that wait in `stopped()`: an entry
//! while a write waits, none otherwise. A write polled while no writer waits costs one test of an
//! empty map; the clock is read only when a write starts waiting and when a write that waited
//! is polled again. The map keeps its capacity, so waiting allocates only when more writers
//! wait at once than ever before: at most one entry per stream.
//!
//! Each poll of a waiting write first takes its entry and counts the time waited so far
//! (`take`), then puts it back if the write still waits (`blocked`): so a wait is counted
//! whichever way it ends (the write goes through, fails, or the stream goes), and a re-poll
//! for the same reason is not a new wait.

use std::time::Duration;

use tokio::time::Instant;

use super::id_hash::IdMap;

/// What a write waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blocked {
    /// The stream's send window is empty: the peer has not returned credit yet.
    Credit,
    /// The session's send queues are full: the transport has not taken what is queued yet.
    Room,
}

/// One stream's waits, kept from its first wait until it goes (`StreamStats`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct StreamWaits {
    pub(super) credit_waits: u64,
    pub(super) room_waits: u64,
    pub(super) credit_time: Duration,
    pub(super) room_time: Duration,
}

#[derive(Default)]
pub(super) struct WriteWaits {
    /// By stream key: since when its writer waits, and for what (the latest reason).
    since: IdMap<usize, (Instant, Blocked)>,
    /// By stream key, for each stream whose writes have waited: their counts and times.
    streams: IdMap<usize, StreamWaits>,
    /// Writes that found no credit, or no room, and waited; a wait that changes its reason
    /// counts once for each.
    pub(super) credit_waits: u64,
    pub(super) room_waits: u64,
    /// Time waited in the waits that have ended, by what each waited for.
    credit_time: Duration,
    room_time: Duration,
}

impl WriteWaits {
    /// A write on stream `key` is polled: ends the wait it was in, if any, counting the time
    /// waited, and returns what it waited for.
    pub(super) fn take(&mut self, key: usize) -> Option<Blocked> {
        if self.since.is_empty() {
            return None;
        }
        let (since, why) = self.since.remove(&key)?;
        let waited = Instant::now().saturating_duration_since(since);
        let stream = self.streams.entry(key).or_default();
        let (total, own) = match why {
            Blocked::Credit => (&mut self.credit_time, &mut stream.credit_time),
            Blocked::Room => (&mut self.room_time, &mut stream.room_time),
        };
        *total = total.saturating_add(waited);
        *own = own.saturating_add(waited);
        Some(why)
    }

    /// The write on stream `key` waits for `why`; `was` is what [`take`](Self::take) returned
    /// on this poll. A wait for a new reason counts as a wait.
    pub(super) fn blocked(&mut self, key: usize, why: Blocked, was: Option<Blocked>) {
        self.since.insert(key, (Instant::now(), why));
        if was != Some(why) {
            let stream = self.streams.entry(key).or_default();
            match why {
                Blocked::Credit => {
                    self.credit_waits += 1;
                    stream.credit_waits += 1;
                }
                Blocked::Room => {
                    self.room_waits += 1;
                    stream.room_waits += 1;
                }
            }
        }
    }

    /// Stream `key` is gone (its slab key will be reused): a wait it left ends here.
    pub(super) fn forget(&mut self, key: usize) {
        self.take(key);
        self.streams.remove(&key);
    }

    /// Stream `key`'s waits, the one under way included.
    pub(super) fn of_stream(&self, key: usize) -> StreamWaits {
        let mut waits = self.streams.get(&key).copied().unwrap_or_default();
        if let Some(&(since, why)) = self.since.get(&key) {
            let waited = Instant::now().saturating_duration_since(since);
            match why {
                Blocked::Credit => waits.credit_time = waits.credit_time.saturating_add(waited),
                Blocked::Room => waits.room_time = waits.room_time.saturating_add(waited),
            }
        }
        waits
    }

    /// Time waited for credit and for room, the waits still under way included.
    pub(super) fn times(&self) -> (Duration, Duration) {
        let now = Instant::now();
        let (mut credit, mut room) = (self.credit_time, self.room_time);
        for &(since, why) in self.since.values() {
            let waited = now.saturating_duration_since(since);
            match why {
                Blocked::Credit => credit = credit.saturating_add(waited),
                Blocked::Room => room = room.saturating_add(waited),
            }
        }
        (credit, room)
    }
}
