//! The tunnel's settings: the bounds it keeps, the gomux session settings, and the exposure
//! controls of the exit (which targets it may reach, who may use its SOCKS5 proxy, how many
//! handshakes it lets wait).

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use gomux::Config;

/// The most connections `--connections` may ask for: far more than there are cores to use,
/// few enough that a typo does not open thousands of connections to the exit.
pub const MAX_CONNECTIONS: usize = 64;

/// The threads an end runs on, unless `--threads` says otherwise: one (an entry that dials K
/// connections to the exit runs on K). A request and its reply cross an end as a few small
/// writes; on one thread the task that reads a client and the session that writes its frame
/// hand over without waking another thread; on several threads each request pays for such
/// wakeups (a futex call, an eventfd write, a context switch). More threads pay off where an
/// end carries several connections at once (an exit many entries dial) or encrypts more than
/// one core can.
pub const DEFAULT_THREADS: usize = 1;

/// The most threads `--threads` may ask for.
pub const MAX_THREADS: usize = 1024;

/// How long the connections being relayed get to finish once a shutdown begins, unless
/// `--drain` says otherwise.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);

/// How long a new client at the entry waits for a connection to the exit while there is
/// none, unless `--exit-wait` says otherwise; then it is turned away.
pub const DEFAULT_EXIT_WAIT: Duration = Duration::from_secs(3);

/// Size of the buffer a forwarded connection borrows for each read, at each end (from a shared
/// pool, and only while the bytes it read are being written: an idle connection holds none).
/// Half of the largest gomux frame: big enough that bulk transfers go in large frames.
pub const COPY_BUFFER: usize = 32 * 1024;

/// How long the exit waits for the target to accept a connection (in SOCKS5 mode, name
/// resolution included).
pub const TARGET_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause after a failed `accept`, which happens when the process runs out of file descriptors:
/// retrying at once would spin until one is freed.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// How long a relay whose gomux connection has ended still delivers what its stream holds:
/// when the other end drained and closed the connection, the end of a reply may still wait
/// here for a client that reads it slowly. At most a receive window's worth, which a client
/// that reads at all takes in far less; one that does not is cut after this.
pub const DELIVERY_GRACE: Duration = Duration::from_secs(10);

/// How long the other end may be silent before its connection counts as dead, whatever it
/// is: above the ten minutes a Go gomux end (a plain tunnel end built on it) stays silent while
/// it is idle, as its session sends a keepalive only after ten minutes without writing.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(660);

/// Session settings for both ends. A keepalive every 10 s, which each session announces in its
/// greeting: a session of this crate whose peer announced one ends once it has heard nothing
/// for twice that (20 s), so an end of this program that vanished without closing, or a
/// network that dropped the connection, is noticed then, and the dialling end dials again
/// instead of waiting for TCP to notice, which can take many minutes. A Go end does not greet:
/// [`IDLE_TIMEOUT`] applies to it (`tests/silence.rs`).
pub fn mux_config() -> Config {
    Config::default()
        .keepalive_interval(Some(Duration::from_secs(10)))
        .idle_timeout(Some(IDLE_TIMEOUT))
}

/// Bounds on the handshakes in progress: the TLS handshake of every connection an end accepts
/// from the other (`exit --listen`, `entry --accept-exit`), and the SOCKS5 greeting and
/// request at the start of every stream of a SOCKS exit.
///
/// At an exposed listener, a connection has [`FIRST_BYTES_TIMEOUT`] to send its first bytes
/// and `timeout` to finish its handshake, and at most `limit` handshakes are in progress, at
/// most `per_source` of them from one address. A newcomer beyond either takes the place of
/// a connection still in its handshake (see `admission`): a silent one before one that has
/// spoken, from the address holding the most, the oldest first, once its task has looked at
/// it, and by a newcomer that has not spoken only once it is [`HANDSHAKE_GRACE`] old (up to
/// twice `limit` connections are let in meanwhile; beyond, a newcomer that has not spoken is
/// refused).
/// So a stranger who opens connections and sends nothing (slowloris), from one address or
/// many, holds at most twice `limit` sockets, none for long, and never keeps a real peer,
/// which speaks at once and finishes in milliseconds, from getting in.
///
/// At a SOCKS exit, each gomux connection has `limit` places for SOCKS5 handshakes of its own
/// (see `socks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshakes {
    /// The longest a handshake may take (`--handshake-timeout`, 10 s by default).
    pub timeout: Duration,
    /// The most handshakes in progress at once, of each kind (`--max-handshakes`, 64 by
    /// default).
    pub limit: usize,
    /// The most handshakes in progress at an exposed listener from one address
    /// (8 by default).
    pub per_source: usize,
}

impl Default for Handshakes {
    fn default() -> Handshakes {
        Handshakes {
            timeout: Duration::from_secs(10),
            limit: 64,
            per_source: 8,
        }
    }
}

/// How long a silent connection in its handshake at an exposed listener keeps its place from
/// a newcomer that has not spoken either: strangers who reopen every connection closed then
/// make the listener close at most twice `--max-handshakes` connections a second, not as many
/// as it can accept.
pub const HANDSHAKE_GRACE: Duration = Duration::from_secs(1);

/// How long a connection accepted at an exposed listener may stay silent before its first
/// bytes (a TLS ClientHello, which a real peer sends at once); at most the handshake timeout.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a SOCKS5 stream at the exit may stay silent before its greeting, which a real
/// client sends at once. A silent stream holds no handshake place meanwhile.
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a SOCKS5 greeting waits for one of its connection's handshake places to free up
/// before its stream is closed.
pub const HANDSHAKE_PLACE_WAIT: Duration = Duration::from_secs(1);

/// The most client connections from one address that the entry carries while they are still
/// silent (no byte either way yet); a newcomer beyond takes the place of that address's oldest
/// silent one, which is closed. A stranger's idle connections thus cost the exit at most this
/// many streams per address that it keeps open.
pub const SILENT_PER_CLIENT: usize = 16;

/// The most silent client connections (as [`SILENT_PER_CLIENT`]) the entry carries in all.
pub const SILENT_CLIENTS: usize = 1024;

/// How long a client connection at the entry may be silent before a newcomer can take its
/// place: a burst of real clients, which send their first bytes a moment after connecting, is
/// let in whole (beyond the limits, up to four times [`SILENT_CLIENTS`]) rather than cut.
pub const SILENT_GRACE: Duration = Duration::from_secs(1);

/// What an exit serves at most, across all its gomux connections: an entry that holds the
/// key (or whoever has stolen it) cannot grow the exit beyond these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Gomux connections at once (`--max-sessions`, 64 by default: an entry's most
    /// `--connections`). A connection beyond is closed once authenticated.
    pub sessions: usize,
    /// Streams being served at once, across all connections (`--max-streams`, 1024 by
    /// default): each holds a connection to its target (a descriptor) and two copy buffers
    /// of [`COPY_BUFFER`] bytes. A stream beyond is refused (reset) at once.
    pub streams: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            sessions: 64,
            streams: 1024,
        }
    }
}

/// The targets an exit may connect to: with no rule (the default), any; otherwise only
/// addresses inside one of the rules' networks, on one of that rule's ports.
///
/// Checked on the address actually dialled, after name resolution at the exit, so a host name
/// cannot lead around it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    rules: Vec<Rule>,
}

impl AllowList {
    /// Adds a rule, as `--allow` reads it (see [`Rule`]).
    pub fn push(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    /// Whether the list has no rule, and so allows every target.
    pub fn allows_all(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether the exit may connect to `target`.
    pub fn allows(&self, target: SocketAddr) -> bool {
        self.allows_all() || self.rules.iter().any(|rule| rule.allows(target))
    }
}

/// One rule of an [`AllowList`]: a network and the ports allowed in it.
///
/// Written `NETWORK:PORTS`, where NETWORK is an address with an optional prefix length
/// (`10.0.0.0/8`, `192.168.1.7`, `::1/128`, `[fd00::]/8`) and PORTS is `*` or a comma-separated
/// list of ports and ranges (`22,80-90`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    network: IpAddr,
    prefix: u8,
    /// Inclusive ranges; empty for every port.
    ports: Vec<(u16, u16)>,
}

impl Rule {
    fn allows(&self, target: SocketAddr) -> bool {
        let port = target.port();
        let port_ok = self.ports.is_empty()
            || self
                .ports
                .iter()
                .any(|&(low, high)| (low..=high).contains(&port));
        port_ok && in_network(target.ip().to_canonical(), self.network, self.prefix)
    }
}

/// Whether `ip` lies in `network/prefix` (IPv4-mapped IPv6 addresses count as IPv4).
fn in_network(ip: IpAddr, network: IpAddr, prefix: u8) -> bool {
    match (ip, network) {
        (IpAddr::V4(ip), IpAddr::V4(network)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(network) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(network)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(network) & mask
        }
        _ => false,
    }
}

impl FromStr for Rule {
    type Err = String;

    fn from_str(text: &str) -> Result<Rule, String> {
        let problem =
            |why: &str| format!("--allow {text:?}: {why} (NETWORK:PORTS, as 10.0.0.0/8:22,80-90)");
        let (network, ports) = text.rsplit_once(':').ok_or_else(|| problem("no ports"))?;
        let (address, prefix) = match network.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (network, None),
        };
        let address = address.trim_start_matches('[').trim_end_matches(']');
        let network: IpAddr = address.parse().map_err(|_| problem("not an IP address"))?;
        let network = network.to_canonical();
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= bits)
                .ok_or_else(|| problem("a prefix length out of range"))?,
        };
        let mut ranges = Vec::new();
        if ports != "*" {
            for part in ports.split(',') {
                let (low, high) = part.split_once('-').unwrap_or((part, part));
                let (low, high) = match (low.parse::<u16>(), high.parse::<u16>()) {
                    (Ok(low), Ok(high)) if low <= high => (low, high),
                    _ => return Err(problem("ports are N, N-M or *")),
                };
                ranges.push((low, high));
            }
        }
        Ok(Rule {
            network,
            prefix,
            ports: ranges,
        })
    }
}

/// The send priority of the streams an exit carries, by target (`--priority`): the first rule
/// whose network and ports hold the target gives it; any other target gets 0 (or the priority
/// of a config file's service, `priority = N`). A stream of
/// higher priority sends first (`gomux::Stream::set_priority`), so the replies of interactive
/// services (SSH, say: `--priority 0.0.0.0/0:22=10`) do not wait behind the downloads the same
/// connection carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Priorities {
    rules: Vec<(Rule, i32)>,
    /// The priority of a target no rule holds.
    otherwise: i32,
}

impl Priorities {
    /// Sets the priority of the targets no rule holds (0 unless set).
    pub fn set_otherwise(&mut self, priority: i32) {
        self.otherwise = priority;
    }

    /// Adds a rule, as `--priority` reads it: `NETWORK:PORTS=N`.
    ///
    /// # Errors
    ///
    /// The text is not `NETWORK:PORTS=N` with NETWORK:PORTS as `--allow` takes it.
    pub fn push_text(&mut self, text: &str) -> Result<(), String> {
        let (rule, priority) = text
            .rsplit_once('=')
            .ok_or_else(|| format!("--priority {text:?}: NETWORK:PORTS=N, as 0.0.0.0/0:22=10"))?;
        let priority = priority
            .parse::<i32>()
            .map_err(|_| format!("--priority {text:?}: the priority is a whole number"))?;
        let rule = rule.parse::<Rule>()?;
        self.rules.push((rule, priority));
        Ok(())
    }

    /// The priority of a stream to `target`.
    pub fn of(&self, target: SocketAddr) -> i32 {
        self.rules
            .iter()
            .find(|(rule, _)| rule.allows(target))
            .map_or(self.otherwise, |&(_, priority)| priority)
    }
}

/// The username and password a SOCKS5 client must give (RFC 1929), when the exit asks for them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
}

impl Credentials {
    /// Whether `username` and `password` are these. Compares every byte whatever the first
    /// difference, so that the time taken does not tell how much of a guess was right.
    pub fn check(&self, username: &str, password: &str) -> bool {
        let same = |a: &str, b: &str| {
            a.len() == b.len()
                && a.bytes()
                    .zip(b.bytes())
                    .fold(0, |acc, (x, y)| acc | (x ^ y))
                    == 0
        };
        // Both compared, always.
        let user_ok = same(&self.username, username);
        let password_ok = same(&self.password, password);
        user_ok & password_ok
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"(hidden)")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn priorities_go_by_the_first_rule_that_holds_the_target() {
        let mut priorities = super::Priorities::default();
        priorities.push_text("10.0.0.0/8:22=10").expect("valid");
        priorities.push_text("0.0.0.0/0:*=-5").expect("valid");
        let at = |text: &str| priorities.of(text.parse().expect("an address"));
        assert_eq!(at("10.1.2.3:22"), 10);
        assert_eq!(at("10.1.2.3:80"), -5);
        assert_eq!(
            super::Priorities::default().of("10.1.2.3:22".parse().expect("addr")),
            0
        );
        for bad in ["10.0.0.0/8:22", "10.0.0.0/8:22=x", "nowhere:22=1"] {
            assert!(
                super::Priorities::default().push_text(bad).is_err(),
                "{bad}"
            );
        }
    }

    use super::*;

    fn allow(rules: &[&str]) -> AllowList {
        let mut list = AllowList::default();
        for rule in rules {
            list.push(rule.parse().expect("a rule"));
        }
        list
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn an_empty_allow_list_allows_everything() {
        assert!(allow(&[]).allows(addr("203.0.113.9:25")));
    }

    #[test]
    fn rules_allow_their_networks_on_their_ports_only() {
        let list = allow(&["10.0.0.0/8:22,80-90", "127.0.0.1:*", "[fd00::]/8:443"]);
        assert!(list.allows(addr("10.1.2.3:22")));
        assert!(list.allows(addr("10.255.0.1:85")));
        assert!(!list.allows(addr("10.1.2.3:23")));
        assert!(!list.allows(addr("11.0.0.1:22")));
        assert!(list.allows(addr("127.0.0.1:6379")));
        assert!(!list.allows(addr("127.0.0.2:6379")));
        assert!(list.allows(addr("[fd12::1]:443")));
        assert!(!list.allows(addr("[fe80::1]:443")));
        // An IPv4-mapped IPv6 address is the IPv4 address it maps.
        assert!(list.allows(addr("[::ffff:10.0.0.1]:22")));
        assert!(allow(&["0.0.0.0/0:*"]).allows(addr("8.8.8.8:53")));
    }

    #[test]
    fn malformed_rules_are_refused() {
        for bad in [
            "10.0.0.0/8",
            "10.0.0.0/33:22",
            "host:22",
            "10.0.0.0/8:22-",
            "10.0.0.0/8:90-80",
            "10.0.0.0/8:70000",
            "10.0.0.0/8:",
        ] {
            assert!(bad.parse::<Rule>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn credentials_match_exactly() {
        let credentials = Credentials {
            username: "ann".into(),
            password: "secret".into(),
        };
        assert!(credentials.check("ann", "secret"));
        assert!(!credentials.check("ann", "secreT"));
        assert!(!credentials.check("ann", "secret2"));
        assert!(!credentials.check("bob", "secret"));
        assert!(!format!("{credentials:?}").contains("secret"));
    }
}
