//! The content every interop scenario sends, the same bytes as the Go peer's (`go/pattern.go`):
//! byte `p` of the stream with seed `s` is byte `p % 8` (little-endian) of `word_at(s, p / 8)`,
//! SplitMix64's output. Either end can check what the other sent, and name the first offset
//! that differs.

/// Generates or checks one stream's bytes, in order.
pub struct Pattern {
    seed: u64,
    pos: u64,
}

fn word_at(seed: u64, w: u64) -> u64 {
    let mut z = seed.wrapping_add(w.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Pattern {
    pub fn new(seed: u64) -> Pattern {
        Pattern { seed, pos: 0 }
    }

    /// Bytes generated or checked so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Writes the next `buf.len()` bytes of the pattern into `buf`.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut i = 0;
        while i < buf.len() {
            let word = word_at(self.seed, self.pos / 8).to_le_bytes();
            let start = (self.pos % 8) as usize;
            let n = (8 - start).min(buf.len() - i);
            buf[i..i + n].copy_from_slice(&word[start..start + n]);
            i += n;
            self.pos += n as u64;
        }
    }

    /// Checks `buf` against the next `buf.len()` bytes of the pattern.
    pub fn check(&mut self, buf: &[u8]) -> Result<(), String> {
        let mut i = 0;
        while i < buf.len() {
            let word = word_at(self.seed, self.pos / 8).to_le_bytes();
            let start = (self.pos % 8) as usize;
            let n = (8 - start).min(buf.len() - i);
            if buf[i..i + n] != word[start..start + n] {
                return Err(format!("byte {} differs from what was sent", self.pos));
            }
            i += n;
            self.pos += n as u64;
        }
        Ok(())
    }
}
