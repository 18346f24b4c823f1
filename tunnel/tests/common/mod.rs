//! Helpers shared by the tunnel's integration tests: bounded waiting and test content.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

/// How long any single step of a test may take before it counts as a hang.
pub const STEP: Duration = Duration::from_secs(20);

/// Awaits `future`, failing the test with `what` if it does not finish within [`STEP`], so a
/// deadlock shows up as a named failure instead of a stuck test run.
pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    within_for(STEP, what, future).await
}

/// As [`within`], with an explicit limit.
pub async fn within_for<F: Future>(limit: Duration, what: &str, future: F) -> F::Output {
    match tokio::time::timeout(limit, future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Deterministic test content: `len` bytes from a xorshift generator seeded with `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// Compares large buffers without dumping them: reports lengths and the first difference.
#[track_caller]
pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    panic!(
        "{what}: got {} bytes, want {} bytes, first difference at {:?}",
        got.len(),
        want.len(),
        first
    );
}
