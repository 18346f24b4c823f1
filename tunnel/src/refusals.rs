//! Log lines about strangers, summarised per source address: a stranger who tries thousands
//! of times a second gets a few lines and then one count per period, not a line per try, so
//! the log stays readable and costs the tunnel little.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

/// How many refusals of one address are logged, each on its own line, per [`PERIOD`].
pub const BURST: u32 = 5;

/// The period over which refusals beyond [`BURST`] are counted, then logged as one line.
pub const PERIOD: Duration = Duration::from_secs(10);

/// The most addresses counted at once; refusals from further addresses are counted together
/// under the unspecified address (`0.0.0.0`), so a stranger with many addresses cannot grow
/// the table.
const ADDRESSES: usize = 4096;

/// Counts the refusals of each address in the current period.
#[derive(Clone, Default)]
pub(crate) struct Refusals(Arc<Mutex<HashMap<IpAddr, Tally>>>);

struct Tally {
    since: Instant,
    logged: u32,
    unlogged: u64,
}

impl Refusals {
    /// Whether a refusal of `source` is to be logged on its own line; if not, it is counted,
    /// and the count logged by [`Refusals::summarise`] once its period is over.
    pub(crate) fn log_one(&self, source: IpAddr) -> bool {
        let mut tallies = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let source = if tallies.len() >= ADDRESSES && !tallies.contains_key(&source) {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            source
        };
        let tally = tallies.entry(source).or_insert_with(|| Tally {
            since: Instant::now(),
            logged: 0,
            unlogged: 0,
        });
        if tally.logged < BURST {
            tally.logged += 1;
            true
        } else {
            tally.unlogged += 1;
            false
        }
    }

    /// Logs one line per address whose period is over with refusals left unlogged, and
    /// forgets those addresses. Called every [`PERIOD`] or so by the loop that refuses.
    pub(crate) fn summarise(&self, what: &str) {
        let over: Vec<(IpAddr, u64)> = {
            let mut tallies = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let mut over = Vec::new();
            tallies.retain(|&source, tally| {
                if tally.since.elapsed() < PERIOD {
                    return true;
                }
                if tally.unlogged > 0 {
                    over.push((source, tally.unlogged));
                }
                false
            });
            over
        };
        for (source, count) in over {
            warn!(%source, count, period = ?PERIOD, "{what}: more refused from this address, not logged one by one");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_logged_and_the_rest_only_counted() {
        let refusals = Refusals::default();
        let stranger = IpAddr::from([127, 0, 0, 2]);
        let logged = (0..1000).filter(|_| refusals.log_one(stranger)).count();
        assert_eq!(logged, BURST as usize);
        // Another address has its own count.
        assert!(refusals.log_one(IpAddr::from([127, 0, 0, 1])));
        let tallies = refusals.0.lock().expect("not poisoned");
        assert_eq!(tallies[&stranger].unlogged, 1000 - u64::from(BURST));
    }

    #[test]
    fn the_table_of_addresses_is_bounded() {
        let refusals = Refusals::default();
        for n in 0..(ADDRESSES as u32 + 100) {
            refusals.log_one(IpAddr::from((10 << 24 | n).to_be_bytes()));
        }
        assert!(refusals.0.lock().expect("not poisoned").len() <= ADDRESSES + 1);
    }
}
