//! A keyed hash for the session's maps of small numbers (wire stream ids, read-buffer numbers,
//! stream keys).
//!
//! The map from wire id to stream is looked up for every frame received, and its keys are chosen
//! by the peer, so the hash must be fast and must not let a peer pick ids that collide. std's
//! default, SipHash-1-3, is both, but runs several rounds of mixing for a 4-byte key. This hash
//! is one 64 × 64 → 128-bit multiply per word, folded (the high half XORed into the low),
//! of the word XORed with a secret drawn per map from std's own random keys: the construction
//! of `foldhash`, and of `ahash` where it has no AES instructions. Without the key a peer
//! cannot tell which ids share a bucket.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Builds [`IdHasher`]s with a key of its own, drawn when it is made.
#[derive(Clone)]
pub(crate) struct IdHash {
    seed: u64,
    multiplier: u64,
}

impl Default for IdHash {
    fn default() -> IdHash {
        // `RandomState` is seeded from the OS once per thread and changes for every instance.
        let random = RandomState::new();
        IdHash {
            seed: random.hash_one(0x243f_6a88_85a3_08d3_u64),
            // Odd, so that the multiply loses no bits of the word.
            multiplier: random.hash_one(0x1319_8a2e_0370_7344_u64) | 1,
        }
    }
}

impl BuildHasher for IdHash {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher {
            state: self.seed,
            multiplier: self.multiplier,
        }
    }
}

/// See the module docs.
pub(crate) struct IdHasher {
    state: u64,
    multiplier: u64,
}

impl IdHasher {
    fn mix(&mut self, word: u64) {
        let product = u128::from(self.state ^ word) * u128::from(self.multiplier);
        self.state = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Not used by the integer keys of the session's maps; correct for any key all the same.
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        // A final mix (splitmix64's), so that every bit of the result depends on every bit of
        // the state: the folded multiply alone left, for some keys, consecutive even ids in a
        // handful of the map's buckets (its low bits pick the bucket), about one map in
        // fifteen (`tests::ids_spread_over_the_buckets_and_keys_differ_between_maps`).
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A `HashMap` with the session's hash.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, IdHash>;

/// For keys the session numbers itself, which a peer cannot choose (the read buffers'
/// generations): a fixed multiply by an odd constant, no key, so that the map carries no
/// hasher state (16 bytes less in state every session holds). Consecutive numbers fall in
/// distinct buckets: the multiply is a bijection on the low bits, which pick the bucket.
#[derive(Clone, Copy, Default)]
pub(crate) struct SeqHash;

impl BuildHasher for SeqHash {
    type Hasher = SeqHasher;

    fn build_hasher(&self) -> SeqHasher {
        SeqHasher(0)
    }
}

/// See [`SeqHash`].
pub(crate) struct SeqHasher(u64);

impl Hasher for SeqHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` of numbers the session chose, see [`SeqHash`].
pub(crate) type SeqMap<K, V> = std::collections::HashMap<K, V, SeqHash>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_spread_over_the_buckets_and_keys_differ_between_maps() {
        let hash = IdHash::default();
        // The low bits pick a bucket: consecutive client ids (all even) must not pile up.
        let mut buckets = [0u32; 64];
        for id in (0..64 * 256).map(|n| n * 2) {
            buckets[(hash.hash_one(id as u32) % 64) as usize] += 1;
        }
        let (least, most) = (buckets.iter().min(), buckets.iter().max());
        assert!(
            least >= Some(&160) && most <= Some(&352),
            "uneven buckets: {least:?}..{most:?}"
        );
        let other = IdHash::default();
        assert_ne!(hash.hash_one(2u32), other.hash_one(2u32), "a key per map");
    }
}
