//! The command line: what it says, and how it is read (a config file's keys are read as the
//! flags they stand for, by the same code: see `settings`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{
    AllowList, Credentials, Handshakes, Limits, Priorities, Rule, DEFAULT_DRAIN, DEFAULT_EXIT_WAIT,
    DEFAULT_THREADS, MAX_CONNECTIONS, MAX_THREADS,
};
use crate::logging::LogFormat;
use crate::security::Fingerprint;

/// What `--help` prints.
pub const USAGE: &str = "\
usage: gomux-tunnel keygen --out DIR
       gomux-tunnel fingerprint --key DIR
       gomux-tunnel entry --config FILE
       gomux-tunnel exit --config FILE
       gomux-tunnel check --config FILE
       gomux-tunnel entry --listen ADDR (--exit ADDR [--connections K] | --accept-exit ADDR)
                          SECURITY [--exit-wait SECONDS] [--socks] [ALL]
       gomux-tunnel exit (--listen ADDR | --entry ADDR) (--target ADDR | --socks [SOCKS AUTH])
                         SECURITY [--allow NETWORK:PORTS]... [--priority NETWORK:PORTS=N]...
                         [--max-sessions N] [--max-streams N] [ALL]
       gomux-tunnel relay --listen ADDR --target ADDR [ALL]
       gomux-tunnel --version

The entry accepts TCP clients and carries each one as a gomux stream over a single
connection to the exit; the exit connects each stream onwards. The connection between
them is mutual TLS 1.3, each end pinning the other's certificate.

keygen --out DIR           write a key pair and self-signed certificate into DIR (key.pem,
                           cert.pem) and print the certificate's SHA-256 fingerprint
fingerprint --key DIR      print the fingerprint of the certificate in DIR
entry  --listen ADDR       accept TCP clients on ADDR
       --exit ADDR         dial the exit at ADDR, and again whenever the connection is lost
       --connections K     with --exit: keep K connections to the exit (default 1), each
                           client carried by the one with the fewest
       --accept-exit ADDR  reverse: let the exit dial in on ADDR (the latest one carries
                           new clients)
       --exit-wait SECONDS while no connection to the exit is up, turn a new client away
                           after this long (default 3; 0: at once)
       --socks             the clients speak SOCKS5 (to a SOCKS exit): one turned away gets a
                           SOCKS5 failure reply (network unreachable) instead of a close
exit   --listen ADDR       accept gomux connections from entries on ADDR
       --entry ADDR        reverse: dial the entry at ADDR, and again whenever the connection
                           is lost (for an exit behind NAT)
       --target ADDR       connect every stream to ADDR
       --socks             read a SOCKS5 CONNECT request from every stream and connect it to
                           the address requested (host names resolved by the exit)
       --allow NETWORK:PORTS
                           connect only to targets in NETWORK on PORTS, as 10.0.0.0/8:22,80-90
                           or 127.0.0.1:* (repeatable; without any, every target is allowed)
       --priority NETWORK:PORTS=N
                           send the streams to targets in NETWORK on PORTS at priority N
                           (default 0; higher goes first), so that, say, SSH replies do not
                           wait behind downloads: 0.0.0.0/0:22=10 (repeatable; first match)
       --max-sessions N    serve at most N gomux connections at once (default 64)
       --max-streams N     serve at most N streams at once, across all connections (default
                           1024); each holds a connection to its target
SOCKS AUTH
       --socks-user USER --socks-password-file FILE
                           require this user name (1 to 255 bytes) and the password in FILE
                           (its first line; the file readable by its owner only) from SOCKS5
                           clients (RFC 1929); each wrong password in a row is answered later
SECURITY (entry and exit)
       --key DIR           this end's key and certificate, as keygen wrote them (key.pem
                           readable by its owner only)
       --peer-fingerprint HEX
                           the other end's certificate fingerprint, as keygen printed it
       --insecure          plain TCP instead: no authentication, no encryption
       --handshake-timeout SECONDS
                           close a connection (or a SOCKS5 stream) whose handshake takes
                           longer (default 10); one silent for 2 s is closed then
       --max-handshakes N  at most N handshakes in progress (default 64; 8 per address): a
                           newcomer beyond takes the place of the oldest silent one; at a
                           SOCKS exit, N SOCKS5 handshakes per gomux connection
--config FILE            run the end a TOML file describes: named services (one
                           [[service]] each), every flag a key (see the README); SIGHUP
                           reloads the services; a stream names its service in a preface
                           (config-mode ends talk to config-mode ends only)
check  --config FILE       check a config file without starting anything (exit status 0
                           when it is valid)
relay  --listen ADDR --target ADDR
                           forward each TCP connection on ADDR to its own connection to
                           ADDR, without gomux (a baseline for measurements)
ALL    --drain SECONDS     on Ctrl-C or SIGTERM, take no new connections and give the ones
                           being relayed this long to finish (default 30), then cut them; a
                           second Ctrl-C cuts them at once, a third exits at once
       --log-format FORMAT text (default) or json: one JSON object per line
       --threads N         run on N threads (default 1; an entry with --connections K: K);
                           more pay off for an end that carries several connections (an
                           exit many entries dial) or encrypts more than one core can
       --metrics ADDR      (entry and exit) serve OpenMetrics text on GET /metrics at ADDR,
                           an IP:PORT on loopback unless --metrics-public is given too

Each listener's bound address is printed on standard output as `listening NAME ADDR`
(NAME: clients, exits, entries, relay, metrics, or service.NAME for a config file's
services), so that port 0 can be asked for.
RUST_LOG sets the log filter (default: info); logs go to standard error, and a closed
standard error or output never stops the tunnel.";

/// The command line: which end to run, how it meets the other end, and how long its shutdown
/// may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// What to run.
    pub command: Command,
    /// How long the connections being relayed get to finish once a shutdown begins.
    pub drain: Duration,
    /// How the connection between the ends is secured (unused by the relay).
    pub security: SecurityArg,
    /// Bounds on the handshakes in progress (TLS, and SOCKS5 at a SOCKS exit).
    pub handshakes: Handshakes,
    /// How log lines are written (`--log-format`).
    pub log_format: LogFormat,
    /// How long the entry's new client waits for a connection to the exit (`--exit-wait`).
    pub exit_wait: Duration,
    /// Whether the entry's clients speak SOCKS5 (`entry --socks`): one turned away gets a
    /// SOCKS5 failure reply.
    pub entry_socks: bool,
    /// The most the exit serves at once (`--max-sessions`, `--max-streams`).
    pub limits: Limits,
    /// Where to serve the metrics (`--metrics`), checked against `--metrics-public`.
    pub metrics: Option<SocketAddr>,
    /// The threads the end runs on (`--threads`).
    pub threads: usize,
}

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Make a key pair.
    Keygen {
        /// The directory to write it into.
        out: PathBuf,
    },
    /// Print a key's fingerprint.
    Fingerprint {
        /// The directory that holds it.
        key: PathBuf,
    },
    /// Run the entry.
    Entry {
        /// Where clients connect.
        listen: String,
        /// How the gomux connection is made.
        exit: Via,
        /// Connections to keep to the exit, when the entry dials it.
        connections: usize,
    },
    /// Run the exit.
    Exit {
        /// How the gomux connection is made.
        entry: Via,
        /// Where streams go.
        target: TargetArg,
        /// The targets allowed (`--allow`).
        allow: AllowList,
        /// The streams' send priorities by target (`--priority`).
        priorities: Priorities,
        /// `--socks-user` and `--socks-password-file`.
        socks_auth: Option<(String, PathBuf)>,
    },
    /// Run the entry a config file describes.
    EntryConfig {
        /// The file, read again on SIGHUP.
        file: PathBuf,
        /// How the gomux connection is made.
        exit: Via,
        /// Connections to keep to the exit, when the entry dials it.
        connections: usize,
        /// Its services.
        services: Vec<EntryService>,
    },
    /// Run the exit a config file describes.
    ExitConfig {
        /// The file, read again on SIGHUP.
        file: PathBuf,
        /// How the gomux connection is made.
        entry: Via,
        /// Its services.
        services: Vec<ExitService>,
    },
    /// Check a config file.
    Check {
        /// The file.
        file: PathBuf,
    },
    /// Run a plain relay.
    Relay {
        /// Where clients connect.
        listen: String,
        /// Where each goes.
        target: String,
    },
}

/// How an end makes its gomux connection, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// Dial the other end at this address.
    Dial(String),
    /// Wait for the other end to dial in on this address.
    Accept(String),
}

/// What the exit connects its streams to, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetArg {
    /// Always this address.
    Fixed(String),
    /// The address each stream's SOCKS5 request names.
    Socks,
}

/// How the connection between the ends is secured, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecurityArg {
    /// `--key DIR --peer-fingerprint HEX`.
    Pinned {
        /// This end's key directory.
        key: PathBuf,
        /// The other end's fingerprint.
        peer: Fingerprint,
    },
    /// `--insecure`, or a mode with no connection between ends.
    Insecure,
}

/// Options that take no value.
const FLAGS: &[&str] = &["--socks", "--insecure", "--metrics-public"];
/// Options that may be given more than once.
const REPEATABLE: &[&str] = &["--allow", "--priority"];
/// The options of both ends' security.
const SECURITY: &[&str] = &[
    "--key",
    "--peer-fingerprint",
    "--insecure",
    "--handshake-timeout",
    "--max-handshakes",
    "--metrics",
    "--metrics-public",
];

/// Parses the arguments after the program name, all flags (`--config` is read by
/// `cli::parse_args`).
///
/// # Errors
///
/// A sentence saying what is wrong with them.
pub fn parse_flags(args: &[String]) -> Result<Args, String> {
    let Some((mode, options)) = args.split_first() else {
        return Err("say what to run: entry, exit, check, relay, keygen or fingerprint".into());
    };
    if mode == "check" || options.iter().any(|option| option == "--config") {
        return Err(match mode.as_str() {
            "check" if !options.iter().any(|option| option == "--config") => {
                "say which file: check --config FILE".into()
            }
            "entry" | "exit" | "check" => "--config FILE takes no other option: every flag \
                                           has a key in the file"
                .into(),
            _ => format!("--config is for entry, exit and check, not {mode}"),
        });
    }
    let known: Vec<&str> = match mode.as_str() {
        "entry" => [
            &[
                "--listen",
                "--exit",
                "--accept-exit",
                "--connections",
                "--exit-wait",
                "--socks",
                "--drain",
                "--log-format",
                "--threads",
            ][..],
            SECURITY,
        ]
        .concat(),
        "exit" => [
            &[
                "--listen",
                "--entry",
                "--target",
                "--socks",
                "--drain",
                "--allow",
                "--priority",
                "--socks-user",
                "--socks-password-file",
                "--max-sessions",
                "--max-streams",
                "--log-format",
                "--threads",
            ][..],
            SECURITY,
        ]
        .concat(),
        "relay" => vec![
            "--listen",
            "--target",
            "--drain",
            "--log-format",
            "--threads",
        ],
        "keygen" => vec!["--out"],
        "fingerprint" => vec!["--key"],
        unknown => {
            return Err(format!(
                "unknown mode {unknown:?}: entry, exit, check, relay, keygen or fingerprint"
            ))
        }
    };

    // Every option once at most but the repeatable ones; all but the flags take a value.
    let mut given: Vec<(&str, String)> = Vec::new();
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let Some(&flag) = known.iter().find(|&&flag| flag == option.as_str()) else {
            return Err(format!("unknown option {option:?} for {mode}"));
        };
        if !REPEATABLE.contains(&flag) && given.iter().any(|(seen, _)| *seen == flag) {
            return Err(format!("{flag} is given twice"));
        }
        let value = if FLAGS.contains(&flag) {
            String::new()
        } else {
            let what = match flag {
                "--drain" | "--handshake-timeout" | "--exit-wait" => "a number of seconds",
                "--connections" => "a number of connections",
                "--threads" => "a number of threads",
                "--max-handshakes" | "--max-sessions" | "--max-streams" => "a number",
                "--log-format" => "text or json",
                "--key" | "--out" | "--socks-password-file" => "a path",
                "--peer-fingerprint" => "a fingerprint",
                "--allow" => "NETWORK:PORTS",
                "--priority" => "NETWORK:PORTS=N",
                "--socks-user" => "a user name",
                _ => "an address",
            };
            options
                .next()
                .ok_or_else(|| format!("{flag} needs {what}"))?
                .clone()
        };
        given.push((flag, value));
    }
    let mut take = |flag: &str| {
        given
            .iter()
            .position(|(seen, _)| *seen == flag)
            .map(|at| given.remove(at).1)
    };
    let seconds = |flag: &str, value: String| {
        value
            .parse::<f64>()
            .ok()
            .and_then(|seconds| Duration::try_from_secs_f64(seconds).ok())
            .ok_or_else(|| format!("{flag} needs a number of seconds, not {value:?}"))
    };

    let drain = match take("--drain") {
        None => DEFAULT_DRAIN,
        Some(value) => seconds("--drain", value)?,
    };
    let mut handshakes = Handshakes::default();
    if let Some(value) = take("--handshake-timeout") {
        handshakes.timeout = seconds("--handshake-timeout", value)?;
    }
    let count = |flag: &str, value: String| {
        value
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{flag} needs a number above 0, not {value:?}"))
    };
    if let Some(value) = take("--max-handshakes") {
        handshakes.limit = count("--max-handshakes", value)?;
    }
    let mut limits = Limits::default();
    if let Some(value) = take("--max-sessions") {
        limits.sessions = count("--max-sessions", value)?;
    }
    if let Some(value) = take("--max-streams") {
        limits.streams = count("--max-streams", value)?;
    }
    let exit_wait = match take("--exit-wait") {
        None => DEFAULT_EXIT_WAIT,
        Some(value) => seconds("--exit-wait", value)?,
    };
    let log_format = match take("--log-format") {
        None => LogFormat::default(),
        Some(value) => value.parse()?,
    };
    let entry_socks = mode == "entry" && take("--socks").is_some();
    let metrics_public = take("--metrics-public").is_some();
    let metrics = match take("--metrics") {
        None if metrics_public => return Err("--metrics-public goes with --metrics ADDR".into()),
        None => None,
        Some(addr) => {
            let addr: SocketAddr = addr
                .parse()
                .map_err(|_| format!("--metrics needs an IP:PORT, not {addr:?}"))?;
            if !addr.ip().is_loopback() && !metrics_public {
                return Err(format!(
                    "--metrics {addr} is not a loopback address: the figures (services, \
                     traffic) would be open to the network; add --metrics-public to mean it"
                ));
            }
            Some(addr)
        }
    };
    let ends = ["entry", "exit"].contains(&mode.as_str());
    let security = match if ends {
        (
            take("--key"),
            take("--peer-fingerprint"),
            take("--insecure"),
        )
    } else {
        (None, None, None)
    } {
        (None, None, Some(_)) => SecurityArg::Insecure,
        (Some(key), Some(peer), None) => SecurityArg::Pinned {
            key: key.into(),
            peer: peer.parse()?,
        },
        (_, _, Some(_)) => {
            return Err(
                "--insecure leaves out TLS: give it without --key and --peer-fingerprint".into(),
            )
        }
        _ if ends => {
            return Err(
                "give --key DIR and --peer-fingerprint HEX (gomux-tunnel keygen makes \
                        a key and prints its fingerprint), or --insecure for plain TCP"
                    .into(),
            )
        }
        _ => SecurityArg::Insecure,
    };
    let up_to = |flag: &str, value: &str, max: usize| {
        value
            .parse::<usize>()
            .ok()
            .filter(|&n| (1..=max).contains(&n))
            .ok_or_else(|| format!("{flag} needs a number from 1 to {max}, not {value:?}"))
    };
    let threads_given = match take("--threads") {
        None => None,
        Some(value) => Some(up_to("--threads", &value, MAX_THREADS)?),
    };
    let connections_given = take("--connections");
    let connections = match &connections_given {
        None => 1,
        Some(value) => up_to("--connections", value, MAX_CONNECTIONS)?,
    };
    // An entry's K connections get a thread each unless told otherwise.
    let threads = threads_given.unwrap_or(if mode == "entry" {
        connections
    } else {
        DEFAULT_THREADS
    });
    let command = match mode.as_str() {
        "keygen" => Command::Keygen {
            out: take("--out").ok_or("--out DIR is required")?.into(),
        },
        "fingerprint" => Command::Fingerprint {
            key: take("--key").ok_or("--key DIR is required")?.into(),
        },
        "entry" => Command::Entry {
            listen: take("--listen").ok_or("--listen ADDR is required")?,
            connections,
            exit: match (take("--exit"), take("--accept-exit")) {
                (None, Some(_)) if connections_given.is_some() => {
                    return Err(
                        "--connections applies when the entry dials the exit (--exit); \
                                with --accept-exit, the exit dials"
                            .into(),
                    )
                }
                (Some(addr), None) => Via::Dial(addr),
                (None, Some(addr)) => Via::Accept(addr),
                (Some(_), Some(_)) => return Err("give --exit or --accept-exit, not both".into()),
                (None, None) => {
                    return Err(
                        "say how to reach the exit: --exit ADDR to dial it, or --accept-exit \
                         ADDR to let it dial in"
                            .into(),
                    )
                }
            },
        },
        "exit" => {
            let mut allow = AllowList::default();
            while let Some(rule) = take("--allow") {
                allow.push(rule.parse::<Rule>()?);
            }
            let mut priorities = Priorities::default();
            while let Some(rule) = take("--priority") {
                priorities.push_text(&rule)?;
            }
            let target = match (take("--target"), take("--socks")) {
                (Some(addr), None) => TargetArg::Fixed(addr),
                (None, Some(_)) => TargetArg::Socks,
                (Some(_), Some(_)) => return Err("give --target or --socks, not both".into()),
                (None, None) => return Err("--target ADDR or --socks is required".into()),
            };
            let socks_auth = match (take("--socks-user"), take("--socks-password-file")) {
                (None, None) => None,
                (Some(user), Some(_)) if user.is_empty() || user.len() > 255 => {
                    return Err(format!(
                        "--socks-user: a SOCKS5 user name is 1 to 255 bytes (RFC 1929), not {}",
                        user.len()
                    ))
                }
                (Some(user), Some(file)) if target == TargetArg::Socks => Some((user, file.into())),
                (Some(_), Some(_)) => {
                    return Err("--socks-user applies to the SOCKS5 exit (--socks)".into())
                }
                _ => return Err("give --socks-user and --socks-password-file together".into()),
            };
            Command::Exit {
                entry: match (take("--listen"), take("--entry")) {
                    (Some(addr), None) => Via::Accept(addr),
                    (None, Some(addr)) => Via::Dial(addr),
                    (Some(_), Some(_)) => return Err("give --listen or --entry, not both".into()),
                    (None, None) => {
                        return Err(
                            "say how to reach the entry: --listen ADDR to let it dial in, or \
                             --entry ADDR to dial it"
                                .into(),
                        )
                    }
                },
                target,
                allow,
                priorities,
                socks_auth,
            }
        }
        _ => Command::Relay {
            listen: take("--listen").ok_or("--listen ADDR is required")?,
            target: take("--target").ok_or("--target ADDR is required")?,
        },
    };
    Ok(Args {
        command,
        drain,
        security,
        handshakes,
        log_format,
        exit_wait,
        entry_socks,
        limits,
        metrics,
        threads,
    })
}

/// A service of a config-mode entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryService {
    /// Its name, which its streams' prefaces carry.
    pub name: String,
    /// Where its clients connect.
    pub listen: String,
    /// Whether its clients speak SOCKS5 (one turned away gets a SOCKS5 failure reply).
    pub socks: bool,
}

/// A service of a config-mode exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitService {
    /// Its name, as the entry's prefaces carry it.
    pub name: String,
    /// Where its streams go.
    pub target: TargetArg,
    /// The targets it may reach.
    pub allow: AllowList,
    /// The send priority of its streams.
    pub priorities: Priorities,
    /// The SOCKS5 user name and password its clients must give.
    pub credentials: Option<Credentials>,
}

/// The first line of `file`: a password kept out of the command line, which others can read.
pub(crate) fn read_password(file: &Path) -> Result<String, String> {
    crate::security::private(file).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(file).map_err(|e| {
        format!(
            "cannot read the SOCKS5 password from {}: {e}",
            file.display()
        )
    })?;
    let password = text.lines().next().unwrap_or_default().to_owned();
    if password.is_empty() || password.len() > 255 {
        return Err(format!(
            "{}: a SOCKS5 password is 1 to 255 bytes (RFC 1929)",
            file.display()
        ));
    }
    Ok(password)
}
