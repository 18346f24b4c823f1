//! How a stream names its service, between two ends run from a config file (`--config`).
//!
//! The entry writes a *preface* as the first bytes of each stream, before any byte of its
//! client: `0xF7 0x01 LEN NAME`, where LEN is one byte (1 to [`MAX_NAME`]) and NAME the
//! service's name in that many bytes. The exit reads it (within the handshake timeout),
//! then answers with two bytes before any byte of the target: `0xF7 0x00` when it has the
//! service and relays the stream, `0xF7 0x01` when it has none, and then closes the stream.
//! The client's bytes follow the preface at once: naming the service costs no round trip.
//!
//! An end run with flags writes and expects nothing of the kind: its streams are plain, as
//! the Go peer's tunnel has them. A config-mode exit refuses a stream that does not start
//! with the preface, and says an entry run with flags is the likely cause; a config-mode
//! entry closes a client whose stream is answered otherwise, and says an exit run with flags
//! is the likely cause (that exit has passed the preface on to its target: the two modes
//! do not mix).

use std::io;

use gomux::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The first byte of a preface and of its answer.
pub const MAGIC: u8 = 0xF7;
/// The preface's version.
const VERSION: u8 = 0x01;
/// The answer of an exit that relays the stream.
pub const ACCEPTED: u8 = 0x00;
/// The answer of an exit that has no such service.
pub const UNKNOWN: u8 = 0x01;

/// The longest service name, in bytes.
pub const MAX_NAME: usize = 64;

/// Whether `name` may name a service: 1 to [`MAX_NAME`] bytes of ASCII letters, digits, `.`,
/// `_` and `-`, so that it reads plainly in logs and metrics labels.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The preface of a stream for `name` (a valid name).
pub fn preface(name: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(3 + name.len());
    bytes.extend_from_slice(&[MAGIC, VERSION, name.len() as u8]);
    bytes.extend_from_slice(name.as_bytes());
    bytes
}

/// What the first bytes of a stream at a config-mode exit were.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// A preface naming this service (valid as a name or not: it is logged escaped).
    Named(String),
    /// Bytes that are not a preface: the entry is not run from a config file.
    NotPreface,
}

/// Reads the preface of `stream`, and not one byte more.
///
/// # Errors
///
/// The stream ended or failed before the preface was whole.
pub async fn read_preface(stream: &mut Stream) -> io::Result<Read> {
    let mut head = [0u8; 3];
    stream.read_exact(&mut head).await?;
    let [magic, version, len] = head;
    if magic != MAGIC || version != VERSION || len == 0 || usize::from(len) > MAX_NAME {
        return Ok(Read::NotPreface);
    }
    let mut name = vec![0u8; usize::from(len)];
    stream.read_exact(&mut name).await?;
    Ok(Read::Named(String::from_utf8_lossy(&name).into_owned()))
}

/// Answers a preface: whether the exit has the service.
///
/// # Errors
///
/// The stream is closed.
pub async fn answer(stream: &mut Stream, known: bool) -> io::Result<()> {
    let code = if known { ACCEPTED } else { UNKNOWN };
    stream.write_all(&[MAGIC, code]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_and_plain() {
        assert!(valid_name("web"));
        assert!(valid_name("redis-2.cache_a"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("é"));
        assert!(!valid_name(&"x".repeat(MAX_NAME + 1)));
        assert_eq!(preface("web"), [MAGIC, VERSION, 3, b'w', b'e', b'b']);
    }
}
