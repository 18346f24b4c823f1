//! A future's place in one of the session's wait lists, given back when the future goes.

use super::core::{Inner, Shared};

/// A future's slot in one of the session's wait lists, given back when the future is dropped,
/// whether it finished or not.
pub(super) struct Waiting<'a> {
    shared: &'a Shared,
    /// Gives the slot back.
    leave: fn(&mut Inner, &mut Option<usize>),
    pub(super) slot: Option<usize>,
}

impl<'a> Waiting<'a> {
    pub(super) fn new(
        shared: &'a Shared,
        leave: fn(&mut Inner, &mut Option<usize>),
    ) -> Waiting<'a> {
        Waiting {
            shared,
            leave,
            slot: None,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.slot.is_some() {
            (self.leave)(&mut self.shared.lock(), &mut self.slot);
        }
    }
}
