//! [`WaitList`]: tasks waiting for a session-wide event (a stream to accept, the driver to
//! finish), each in a slot of its own that its future gives up when dropped.
//!
//! A plain list of wakers would keep the waker of every `accept()` or `closed()` future that was
//! dropped before the event (a `select!` that another branch won), growing without bound on a
//! long-lived session and keeping those tasks' memory alive.

use std::task::Waker;

use super::slab::Slab;

pub(crate) struct WaitList {
    /// One slot per waiting future; `None` once woken, until the future waits again or goes.
    /// Boxed, and made on the first wait: most lists of a session are never waited on (its
    /// `closed()`, `wait_idle()` and drain waiters), and a pointer costs the session 8 bytes
    /// where the list costs 40 (`tests/idle_memory.rs`).
    waiters: Option<Box<Slab<Option<Waker>>>>,
}

impl WaitList {
    pub(crate) fn new() -> WaitList {
        WaitList { waiters: None }
    }

    /// Registers `waker` in the future's `slot`, taking a slot on first use.
    pub(crate) fn register(&mut self, slot: &mut Option<usize>, waker: &Waker) {
        let waiters = self.waiters.get_or_insert_with(|| Box::new(Slab::new()));
        match slot.and_then(|key| waiters.get_mut(key)) {
            Some(Some(stored)) if stored.will_wake(waker) => {}
            Some(entry) => *entry = Some(waker.clone()),
            None => *slot = Some(waiters.insert(Some(waker.clone()))),
        }
    }

    /// Gives back the room of slots nobody holds (the session has gone quiet), and the list
    /// itself when nobody holds a slot.
    pub(crate) fn shrink(&mut self) {
        match &mut self.waiters {
            Some(waiters) if waiters.len() == 0 => self.waiters = None,
            Some(waiters) => waiters.shrink(),
            None => {}
        }
    }

    /// Gives up the future's slot (when it is dropped or done waiting).
    pub(crate) fn remove(&mut self, slot: &mut Option<usize>) {
        if let (Some(key), Some(waiters)) = (slot.take(), &mut self.waiters) {
            waiters.remove(key);
        }
    }

    /// Collects every waiting future's waker; their slots stay theirs.
    pub(crate) fn wake_all(&mut self, wakers: &mut Vec<Waker>) {
        if let Some(waiters) = &mut self.waiters {
            wakers.extend(waiters.iter_mut().filter_map(Option::take));
        }
    }

    /// Whether no future holds a slot.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots held.
    pub(crate) fn len(&self) -> usize {
        self.waiters.as_ref().map_or(0, |waiters| waiters.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_held_once_and_given_back() {
        let mut list = WaitList::new();
        let mut slot = None;
        list.register(&mut slot, Waker::noop());
        list.register(&mut slot, Waker::noop());
        assert_eq!(list.len(), 1, "waiting again reuses the slot");
        let mut woken = Vec::new();
        list.wake_all(&mut woken);
        assert_eq!(woken.len(), 1);
        list.wake_all(&mut woken);
        assert_eq!(woken.len(), 1, "woken once per registration");
        list.remove(&mut slot);
        assert_eq!((list.len(), slot), (0, None));
        assert!(list.waiters.is_some(), "kept while the session is busy");
        list.shrink();
        assert!(list.waiters.is_none(), "given back once quiet and empty");
        list.remove(&mut slot);
        list.wake_all(&mut woken);
        assert_eq!((list.len(), woken.len()), (0, 1));
    }
}
