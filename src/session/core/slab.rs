//! A minimal slab: stable `usize` keys for stream state, reused after removal.
//!
//! Stream handles hold their key, so a handle finds its state by indexing instead of hashing,
//! and a key stays valid for exactly as long as the state it names.

pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    next_free: usize,
    len: usize,
}

enum Entry<T> {
    Occupied(T),
    Vacant { next_free: usize },
}

impl<T> Default for Slab<T> {
    fn default() -> Slab<T> {
        Slab::new()
    }
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Slab<T> {
        Slab {
            entries: Vec::new(),
            next_free: 0,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn insert(&mut self, value: T) -> usize {
        let key = self.next_free;
        match self.entries.get_mut(key) {
            Some(entry) => {
                let Entry::Vacant { next_free } = *entry else {
                    unreachable!("the free list only names vacant entries")
                };
                self.next_free = next_free;
                *entry = Entry::Occupied(value);
            }
            None => {
                if self.entries.capacity() == 0 {
                    // Room for one: most sessions of a server holding thousands have a single
                    // stream. A first allocation of four (`Vec`'s least) that `shrink` gives
                    // back later leaves a hole the allocator cannot return to the system
                    // (`benches/idle_sessions.rs`).
                    self.entries.reserve_exact(1);
                }
                self.entries.push(Entry::Occupied(value));
                self.next_free = self.entries.len();
            }
        }
        self.len += 1;
        key
    }

    /// Gives back the room no entry uses: vacant entries at the end, and capacity beyond the
    /// last entry. Keys of the entries left are unchanged.
    pub(crate) fn shrink(&mut self) {
        while matches!(self.entries.last(), Some(Entry::Vacant { .. })) {
            self.entries.pop();
        }
        // The free list may name entries just dropped: thread it again through those left,
        // lowest key first, ending past the last entry as an empty list does.
        let mut next = self.entries.len();
        for (key, entry) in self.entries.iter_mut().enumerate().rev() {
            if let Entry::Vacant { next_free } = entry {
                *next_free = next;
                next = key;
            }
        }
        self.next_free = next;
        self.entries.shrink_to_fit();
    }

    pub(crate) fn get(&self, key: usize) -> Option<&T> {
        match self.entries.get(key) {
            Some(Entry::Occupied(value)) => Some(value),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        match self.entries.get_mut(key) {
            Some(Entry::Occupied(value)) => Some(value),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, key: usize) -> Option<T> {
        let entry = self.entries.get_mut(key)?;
        if !matches!(entry, Entry::Occupied(_)) {
            return None;
        }
        let old = std::mem::replace(
            entry,
            Entry::Vacant {
                next_free: self.next_free,
            },
        );
        self.next_free = key;
        self.len -= 1;
        match old {
            Entry::Occupied(value) => Some(value),
            Entry::Vacant { .. } => None,
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().filter_map(|entry| match entry {
            Entry::Occupied(value) => Some(value),
            Entry::Vacant { .. } => None,
        })
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.entries.iter_mut().filter_map(|entry| match entry {
            Entry::Occupied(value) => Some(value),
            Entry::Vacant { .. } => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_reused_and_stay_valid() {
        let mut slab = Slab::new();
        let a = slab.insert('a');
        let b = slab.insert('b');
        assert_eq!(slab.remove(a), Some('a'));
        assert_eq!(slab.remove(a), None);
        let c = slab.insert('c');
        assert_eq!(c, a);
        assert_eq!(slab.get(b), Some(&'b'));
        assert_eq!(slab.get(c), Some(&'c'));
        assert_eq!(slab.len(), 2);
        assert_eq!(slab.iter_mut().count(), 2);
    }

    #[test]
    fn shrinking_keeps_keys_and_the_free_list() {
        let mut slab = Slab::new();
        let keys: Vec<usize> = (0..6).map(|i| slab.insert(i)).collect();
        for &key in &[keys[1], keys[4], keys[5], keys[3]] {
            slab.remove(key);
        }
        slab.shrink();
        // Entries 3 to 5 were vacant at the end and are gone; 1 is still vacant.
        assert_eq!(slab.entries.len(), 3);
        assert_eq!(slab.entries.capacity(), 3);
        assert_eq!(slab.get(keys[0]), Some(&0));
        assert_eq!(slab.get(keys[2]), Some(&2));
        assert_eq!(slab.get(keys[4]), None);
        assert_eq!(slab.insert(10), keys[1], "the vacant entry is reused first");
        assert_eq!(slab.insert(11), 3, "then the slab grows again");
        assert_eq!(slab.len(), 4);

        let mut one = Slab::new();
        let key = one.insert('a');
        one.shrink();
        assert_eq!(
            one.entries.capacity(),
            1,
            "a session's one stream keeps one entry"
        );
        assert_eq!(one.get(key), Some(&'a'));
    }
}
