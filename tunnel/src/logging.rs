//! Where the tool's output goes, and why writing it can never fail the process.
//!
//! A daemon's standard error is often a pipe to a log collector, and its standard output a
//! pipe to whoever started it; either may close at any time (the collector restarts, `head`
//! has read enough). Every write to them here drops its error: a line that cannot be written
//! is lost, and the tunnel goes on serving and still shuts down on a signal. Nothing writes
//! with `print!`/`eprint!`, which panic on a closed pipe, and the log subscriber is told not
//! to report its own write errors (which it would do with `eprintln!`).
//!
//! Only this crate's `tracing` events are logged. The `log` records of the libraries (the
//! SOCKS5 library logs every password it checks at debug level) are not collected at all.

use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::str::FromStr;
use std::sync::OnceLock;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line of text per event (the default).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<LogFormat, String> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("--log-format is text or json, not {text:?}")),
        }
    }
}

/// The format [`init`] installed.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Installs the log: events of this process go to standard error in `format`, filtered by
/// `RUST_LOG` (`info` without it). Returns false when a log was installed already.
pub fn init(format: LogFormat) -> bool {
    let _ = FORMAT.set(format);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr)
        .log_internal_errors(false);
    // Not `init()`: that would also collect the libraries' `log` records (see above).
    match format {
        LogFormat::Text => tracing::subscriber::set_global_default(
            builder
                // Colours only for a person watching, not in log files.
                .with_ansi(io::stderr().is_terminal())
                .finish(),
        ),
        LogFormat::Json => tracing::subscriber::set_global_default(
            builder.json().flatten_event(true).with_ansi(false).finish(),
        ),
    }
    .is_ok()
}

/// Standard error for the log: a write that fails counts as done.
#[derive(Debug, Clone, Copy)]
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Stderr {
        Stderr
    }
}

/// Warns of a setting that leaves the tunnel open, at start: a line of its own on standard
/// error, or a warning event in a JSON log (which holds nothing but JSON).
pub fn warn_at_start(text: impl fmt::Display) {
    match FORMAT.get() {
        Some(LogFormat::Json) => tracing::warn!("{text}"),
        _ => complain(format_args!("gomux-tunnel: {text}")),
    }
}

/// Writes a line to standard output (listening addresses, fingerprints), or drops it if it
/// cannot be written.
pub fn say(line: impl fmt::Display) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Writes a line to standard error (usage errors, before the log is installed), or drops it
/// if it cannot be written.
pub fn complain(line: impl fmt::Display) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

/// A peer-supplied string as it may appear in the log: control characters, quotes and
/// backslashes escaped (`\n`, `\u{1b}`), so that it cannot forge a line or a terminal escape.
#[derive(Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.escape_debug())
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_text_holds_no_control_character() {
        let forged = "evil.example\n2026-01-01T00:00:00Z  INFO forged\r\u{1b}[2J";
        let shown = Escaped(forged).to_string();
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert!(
            shown.contains("\\n") && shown.contains("\\u{1b}"),
            "{shown}"
        );
    }

    #[test]
    fn log_formats_read_as_written() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
