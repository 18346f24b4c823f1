//! The guide: one chapter per topic, the long form of what the API docs state in short.
//!
//! This module holds documentation only, as rustls's `manual` does; it has no items to use.
//! Its examples run as doctests, like every example of the crate.
//!
//! - [`streams`]: reading, writing, flow control, closing and cancel safety.
//! - [`talking_to_go`]: the settings a Go gomux peer needs, and its faults with what helps.
//! - [`refusals_retries_and_dead_peers`]: when a stream is refused, which errors are safe to
//!   retry, and how soon a dead peer is noticed.
//! - [`memory_and_defaults`]: what a session may hold, and why each default is what it is.
//! - [`tuning`]: TCP settings, several connections with a [`Pool`](crate::Pool), priorities.
//! - [`protocol`]: the wire protocol, and the conventions two sessions of this crate add to it.

#[doc = include_str!("guide/streams.md")]
pub mod streams {}

#[doc = include_str!("guide/talking_to_go.md")]
pub mod talking_to_go {}

#[doc = include_str!("guide/refusals_retries_and_dead_peers.md")]
pub mod refusals_retries_and_dead_peers {}

#[doc = include_str!("guide/memory_and_defaults.md")]
pub mod memory_and_defaults {}

#[doc = include_str!("guide/tuning.md")]
pub mod tuning {}

#[doc = include_str!("guide/protocol.md")]
pub mod protocol {}
