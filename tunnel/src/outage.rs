//! Outages of the connection to the other end, logged once each: one warning when the other
//! end cannot be had (with the first reason), and one line when it is back, saying how long
//! it was gone. The retries and the clients turned away in between are logged at debug level,
//! so an end that retries every few seconds for hours does not fill its log.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tracing::{debug, info, warn};

/// Whether the other end is out of reach, and since when.
#[derive(Clone)]
pub(crate) struct Outage {
    since: Arc<Mutex<Option<Instant>>>,
    /// "exit" or "entry", for the logs.
    other: &'static str,
}

impl Outage {
    pub(crate) fn new(other: &'static str) -> Outage {
        Outage {
            since: Arc::default(),
            other,
        }
    }

    /// The other end could not be had, for `why`: a warning if this begins an outage.
    pub(crate) fn down(&self, why: impl fmt::Display) {
        let began = {
            let mut since = self.since.lock().unwrap_or_else(PoisonError::into_inner);
            let began = since.is_none();
            if began {
                *since = Some(Instant::now());
            }
            began
        };
        let other = self.other;
        if began {
            warn!(
                reason = %why,
                "cannot reach the {other}; retrying, and turning away clients meanwhile \
                 (logged again once it is back)"
            );
        } else {
            debug!(reason = %why, "still cannot reach the {other}");
        }
    }

    /// A connection to the other end is up: if this ends an outage, says how long it lasted.
    pub(crate) fn up(&self) {
        let since = self
            .since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(since) = since {
            let other = self.other;
            info!(down_for = ?since.elapsed(), "the {other} is back");
        }
    }
}
