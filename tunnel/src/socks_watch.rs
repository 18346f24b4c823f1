//! The entry's view of a SOCKS5 exchange: the exit answers the SOCKS5 handshake, but only the
//! entry knows the client's address. So the entry watches the first bytes each way of every
//! client connection it carries, without holding them back or changing them, and when they
//! are a SOCKS5 exchange that the exit refuses (a wrong user name or password, a target the
//! allow-list forbids, no authentication method in common, a target it cannot reach), it logs
//! the refusal once, in the client's span, which names the client's address.
//!
//! Nothing is added to what travels between the ends: the exit still logs its side of the
//! refusal (with the entry's address, the session's peer, and the stream's id), and the entry
//! works the same with any exit.
//!
//! A connection whose first bytes are not a SOCKS5 greeting, or whose other side speaks first
//! with anything but a SOCKS5 method choice, is not watched any further: a tunnel to a fixed
//! target pays a look at its first byte. An exchange is told apart from other traffic by
//! every field the protocol fixes (versions, lengths, the method chosen among those offered,
//! the reply's reserved byte and address type), so a refusal is logged only when both sides
//! spoke SOCKS5 throughout.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tracing::{info, warn};

/// The most the client sends before the reply that ends the exchange: a greeting (2 bytes and
/// at most 255 methods), a user name and password request (RFC 1929: 3 bytes, at most 255
/// bytes each) and a request (6 bytes and an address of at most 1 + 255 bytes).
const CLIENT_MAX: usize = (2 + 255) + (3 + 255 + 255) + (6 + 1 + 255);

/// The most of the exit's answers the verdict needs: the method choice (2 bytes), the
/// authentication status (2) and the head of the reply (version, code, reserved, address type).
const EXIT_MAX: usize = 2 + 2 + 4;

/// SOCKS5 (RFC 1928).
const VERSION: u8 = 5;
/// The username/password subnegotiation's version (RFC 1929).
const AUTH_VERSION: u8 = 1;
const METHOD_PASSWORD: u8 = 2;
const NO_ACCEPTABLE_METHOD: u8 = 0xff;
const REPLY_NOT_ALLOWED: u8 = 2;

/// A client connection at the entry, whose SOCKS5 exchange with the exit (if it is one) is
/// watched as bytes are read from the client and written to it.
pub(crate) struct Watched<T> {
    io: T,
    /// `None` once the exchange is judged, or the connection is found not to be one.
    watch: Option<Box<Watch>>,
}

impl<T> Watched<T> {
    pub(crate) fn new(io: T) -> Watched<T> {
        Watched {
            io,
            watch: Some(Box::default()),
        }
    }
}

/// What has passed each way so far, up to what a verdict needs (at most [`CLIENT_MAX`] and
/// [`EXIT_MAX`] bytes).
#[derive(Default)]
struct Watch {
    client: Vec<u8>,
    exit: Vec<u8>,
}

impl Watch {
    /// Takes in what the client sent (`from_client`) or what the exit answered; true once
    /// there is nothing more to watch for.
    fn take(&mut self, data: &[u8], from_client: bool) -> bool {
        let (kept, max) = if from_client {
            (&mut self.client, CLIENT_MAX)
        } else {
            (&mut self.exit, EXIT_MAX)
        };
        // Every message the verdict needs fits in the bound; what a client sends beyond (data
        // it sends on before the reply) is not needed.
        let taken = data.len().min(max - kept.len());
        if taken == 0 {
            return false; // nothing new to judge
        }
        kept.extend_from_slice(&data[..taken]);
        match judge(&self.client, &self.exit) {
            Verdict::Pending => false,
            Verdict::NotSocks | Verdict::Granted => true,
            Verdict::Refused(refusal) => {
                refusal.log();
                true
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if let Some(watch) = &mut this.watch {
            if watch.take(&buf.filled()[before..], true) {
                this.watch = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, data))?;
        if let Some(watch) = &mut this.watch {
            if watch.take(&data[..n], false) {
                this.watch = None;
            }
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Not enough yet.
    Pending,
    /// Not a SOCKS5 exchange (or one with a method this does not follow).
    NotSocks,
    /// The exit connected the client.
    Granted,
    /// The exit refused the client.
    Refused(Refusal),
}

/// Why the exit refused a SOCKS5 client.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// None of the authentication methods offered is one the exit accepts.
    NoMethod { offered: Vec<u8> },
    /// RFC 1929: the user name or the password is wrong.
    Credentials { user: String },
    /// The request's reply carries this error code.
    Reply {
        code: u8,
        command: u8,
        /// The address requested, as `host:port` (`None` for an address type unknown).
        requested: Option<String>,
    },
}

impl Refusal {
    /// Logs the refusal in the current span: the client's.
    fn log(&self) {
        match self {
            Refusal::NoMethod { offered } => warn!(
                ?offered,
                "the SOCKS5 client offers no authentication method the exit accepts; refused"
            ),
            Refusal::Credentials { user } => warn!(
                ?user,
                "wrong SOCKS5 user name or password; the exit refused the client"
            ),
            Refusal::Reply {
                code: REPLY_NOT_ALLOWED,
                requested,
                ..
            } => warn!(
                requested = %requested.as_deref().unwrap_or("?"),
                "the requested address is not allowed at the exit (--allow); refused"
            ),
            Refusal::Reply {
                code,
                command,
                requested,
            } => info!(
                reply = reply_name(*code),
                command,
                requested = %requested.as_deref().unwrap_or("?"),
                "the exit could not serve the SOCKS5 request"
            ),
        }
    }
}

/// RFC 1928's name for a reply code.
fn reply_name(code: u8) -> &'static str {
    match code {
        1 => "general SOCKS server failure",
        REPLY_NOT_ALLOWED => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unassigned",
    }
}

/// Judges a SOCKS5 exchange from what the client sent so far and what the exit answered.
fn judge(client: &[u8], exit: &[u8]) -> Verdict {
    // Each side's first byte says at once whether this may be SOCKS5.
    if client.first().is_some_and(|&v| v != VERSION) || exit.first().is_some_and(|&v| v != VERSION)
    {
        return Verdict::NotSocks;
    }
    // The greeting: VER NMETHODS METHODS.
    let Some(&count) = client.get(1) else {
        return Verdict::Pending;
    };
    if count == 0 {
        return Verdict::NotSocks;
    }
    let Some(offered) = client.get(2..2 + usize::from(count)) else {
        return Verdict::Pending;
    };
    let client = &client[2 + offered.len()..];
    // The method chosen: VER METHOD.
    let Some(&method) = exit.get(1) else {
        return Verdict::Pending;
    };
    let exit = &exit[2..];
    if method == NO_ACCEPTABLE_METHOD {
        return Verdict::Refused(Refusal::NoMethod {
            offered: offered.to_vec(),
        });
    }
    if !offered.contains(&method) {
        return Verdict::NotSocks;
    }
    let (client, exit) = match method {
        0 => (client, exit),
        METHOD_PASSWORD => match judge_password(client, exit) {
            Ok(rest) => rest,
            Err(verdict) => return verdict,
        },
        // A method whose messages this does not follow (GSSAPI, a private one).
        _ => return Verdict::NotSocks,
    };
    judge_request(client, exit)
}

/// The RFC 1929 subnegotiation: the client's VER ULEN UNAME PLEN PASSWD, the exit's VER STATUS.
/// What follows each, or the verdict.
fn judge_password<'a>(client: &'a [u8], exit: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), Verdict> {
    match client.first() {
        None => return Err(Verdict::Pending),
        Some(&AUTH_VERSION) => {}
        Some(_) => return Err(Verdict::NotSocks),
    }
    let user_len = usize::from(*client.get(1).ok_or(Verdict::Pending)?);
    let user = client.get(2..2 + user_len).ok_or(Verdict::Pending)?;
    let password_len = usize::from(*client.get(2 + user_len).ok_or(Verdict::Pending)?);
    let end = 3 + user_len + password_len;
    if client.len() < end {
        return Err(Verdict::Pending);
    }
    // RFC 1929 has the status's version byte 1; some servers answer 5.
    let (version, status) = match exit {
        [version, status, ..] => (*version, *status),
        _ => return Err(Verdict::Pending),
    };
    if version != AUTH_VERSION && version != VERSION {
        return Err(Verdict::NotSocks);
    }
    if status != 0 {
        let user = String::from_utf8_lossy(user).into_owned();
        return Err(Verdict::Refused(Refusal::Credentials { user }));
    }
    Ok((&client[end..], &exit[2..]))
}

/// The request (VER CMD RSV ATYP DST.ADDR DST.PORT) and the head of its reply (VER REP RSV
/// ATYP).
fn judge_request(client: &[u8], exit: &[u8]) -> Verdict {
    let (command, kind) = match client {
        [] => return Verdict::Pending,
        [VERSION] | [VERSION, _] | [VERSION, _, 0] => return Verdict::Pending,
        [VERSION, command, 0, kind, ..] => (*command, *kind),
        _ => return Verdict::NotSocks,
    };
    let address = &client[4..];
    let requested = match kind {
        1 => match address {
            [a, b, c, d, p, q, ..] => {
                Some(format!("{a}.{b}.{c}.{d}:{}", u16::from_be_bytes([*p, *q])))
            }
            _ => return Verdict::Pending,
        },
        3 => {
            let Some(&len) = address.first() else {
                return Verdict::Pending;
            };
            let len = usize::from(len);
            let (Some(name), Some(port)) = (address.get(1..1 + len), address.get(1 + len..3 + len))
            else {
                return Verdict::Pending;
            };
            let name = String::from_utf8_lossy(name);
            let port = u16::from_be_bytes([port[0], port[1]]);
            Some(format!("{}:{port}", name.escape_debug()))
        }
        4 => match address.get(..18) {
            Some(v6) => {
                let mut ip = [0; 16];
                ip.copy_from_slice(&v6[..16]);
                let port = u16::from_be_bytes([v6[16], v6[17]]);
                Some(std::net::SocketAddr::from((ip, port)).to_string())
            }
            None => return Verdict::Pending,
        },
        // The exit answers "address type not supported".
        _ => None,
    };
    match exit {
        [VERSION, 0, 0, 1 | 3 | 4, ..] => Verdict::Granted,
        [VERSION, code, 0, 1 | 3 | 4, ..] => Verdict::Refused(Refusal::Reply {
            code: *code,
            command,
            requested,
        }),
        [] | [VERSION] | [VERSION, _] | [VERSION, _, 0] => Verdict::Pending,
        _ => Verdict::NotSocks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GREET_PASSWORD: &[u8] = &[5, 1, 2];
    const CHOOSE_PASSWORD: &[u8] = &[5, 2];

    fn auth(user: &str, password: &str) -> Vec<u8> {
        let mut auth = vec![1, user.len() as u8];
        auth.extend_from_slice(user.as_bytes());
        auth.push(password.len() as u8);
        auth.extend_from_slice(password.as_bytes());
        auth
    }

    fn request_v4(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut request = vec![5, 1, 0, 1];
        request.extend_from_slice(&ip);
        request.extend_from_slice(&port.to_be_bytes());
        request
    }

    fn reply(code: u8) -> Vec<u8> {
        vec![5, code, 0, 1, 0, 0, 0, 0, 0, 0]
    }

    /// Feeds the two sides to a watch in the pieces given, in turn, and returns the verdict
    /// once it is reached (or the last one), and after how many pieces.
    fn run(pieces: &[(&[u8], bool)]) -> (Verdict, usize) {
        let (mut client, mut exit) = (Vec::new(), Vec::new());
        let mut verdict = Verdict::Pending;
        for (i, &(data, from_client)) in pieces.iter().enumerate() {
            if from_client {
                client.extend_from_slice(data);
            } else {
                exit.extend_from_slice(data);
            }
            verdict = judge(&client, &exit);
            if verdict != Verdict::Pending {
                return (verdict, i + 1);
            }
        }
        (verdict, pieces.len())
    }

    /// Every byte in a piece of its own, the two sides in the order of the exchange.
    fn bytewise(messages: &[(&[u8], bool)]) -> Vec<(Vec<u8>, bool)> {
        messages
            .iter()
            .flat_map(|&(m, from_client)| m.iter().map(move |&b| (vec![b], from_client)))
            .collect()
    }

    #[test]
    fn a_wrong_password_is_a_refusal_naming_the_user() {
        let _serial = serial();
        let auth = auth("ann", "open");
        let (verdict, at) = run(&[
            (GREET_PASSWORD, true),
            (CHOOSE_PASSWORD, false),
            (&auth, true),
            (&[1, 1], false),
        ]);
        assert_eq!(
            verdict,
            Verdict::Refused(Refusal::Credentials { user: "ann".into() })
        );
        assert_eq!(at, 4, "judged at the status, not before");
    }

    #[test]
    fn a_forbidden_target_is_a_refusal_naming_it_even_one_byte_at_a_time() {
        let _serial = serial();
        let auth = auth("ann", "sesame");
        let request = request_v4([10, 1, 2, 3], 22);
        let reply = reply(REPLY_NOT_ALLOWED);
        let messages: [(&[u8], bool); 6] = [
            (GREET_PASSWORD, true),
            (CHOOSE_PASSWORD, false),
            (&auth, true),
            (&[1, 0], false),
            (&request, true),
            (&reply, false),
        ];
        let pieces = bytewise(&messages);
        let pieces: Vec<(&[u8], bool)> = pieces.iter().map(|(d, c)| (&d[..], *c)).collect();
        let (verdict, at) = run(&pieces);
        let want = Refusal::Reply {
            code: REPLY_NOT_ALLOWED,
            command: 1,
            requested: Some("10.1.2.3:22".into()),
        };
        assert_eq!(verdict, Verdict::Refused(want));
        // The reply's fourth byte (its address type) completes the verdict.
        assert_eq!(at, pieces.len() - 6);
    }

    #[test]
    fn a_pipelined_client_and_a_granted_request() {
        let _serial = serial();
        // Greeting, authentication and request in one piece, before any answer.
        let mut everything = GREET_PASSWORD.to_vec();
        everything.extend(auth("ann", "sesame"));
        everything.extend([5, 1, 0, 3, 11]);
        everything.extend(b"example.org");
        everything.extend(443u16.to_be_bytes());
        let (verdict, _) = run(&[
            (&everything, true),
            (CHOOSE_PASSWORD, false),
            (&[1, 0], false),
        ]);
        assert_eq!(verdict, Verdict::Pending, "no reply yet");
        let mut answers = CHOOSE_PASSWORD.to_vec();
        answers.extend([1, 0]);
        answers.extend(reply(0));
        assert_eq!(judge(&everything, &answers), Verdict::Granted);
        answers[5] = 4; // host unreachable
        let want = Refusal::Reply {
            code: 4,
            command: 1,
            requested: Some("example.org:443".into()),
        };
        assert_eq!(judge(&everything, &answers), Verdict::Refused(want));
    }

    #[test]
    fn no_method_in_common_and_no_authentication() {
        let _serial = serial();
        assert_eq!(
            judge(&[5, 1, 0], &[5, NO_ACCEPTABLE_METHOD]),
            Verdict::Refused(Refusal::NoMethod { offered: vec![0] })
        );
        // Without authentication, straight to the request; IPv6.
        let mut client = vec![5, 1, 0, 5, 1, 0, 4];
        client.extend([0; 15]);
        client.push(1);
        client.extend(8080u16.to_be_bytes());
        let mut exit = vec![5, 0];
        exit.extend(reply(5));
        let want = Refusal::Reply {
            code: 5,
            command: 1,
            requested: Some("[::1]:8080".into()),
        };
        assert_eq!(judge(&client, &exit), Verdict::Refused(want));
    }

    #[test]
    fn other_traffic_is_let_go_at_once() {
        let _serial = serial();
        // A client that does not start with SOCKS5's version.
        assert_eq!(judge(b"GET / HTTP/1.1\r\n", b""), Verdict::NotSocks);
        // A server that speaks first (SSH, SMTP).
        assert_eq!(judge(b"", b"SSH-2.0-OpenSSH\r\n"), Verdict::NotSocks);
        // A 5 that leads into something else: no methods, a method not offered, an
        // authentication of the wrong version, a reply with a reserved byte set.
        assert_eq!(judge(&[5, 0], b""), Verdict::NotSocks);
        assert_eq!(judge(&[5, 1, 0], &[5, 2]), Verdict::NotSocks);
        assert_eq!(judge(&[5, 1, 2, 7], &[5, 2]), Verdict::NotSocks);
        let mut client = vec![5, 1, 0];
        client.extend(request_v4([127, 0, 0, 1], 80));
        assert_eq!(
            judge(&client, &[5, 0, 5, 2, 1, 1]),
            Verdict::NotSocks,
            "reserved byte"
        );
    }

    /// The tests of this module one at a time. tracing caches whether a log line's callsite is
    /// wanted, for the whole process, when a thread first reaches it: a test reaching the
    /// refusal's line without a subscriber, beside the test that captures it, could have it
    /// cached as unwanted, and the capture would see nothing (seen once under a loaded
    /// `cargo test --workspace`). The capturing test also rebuilds that cache once its
    /// subscriber is in place.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    /// Log lines, kept for a test to read.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("not poisoned").extend_from_slice(data);
            Ok(data.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl tracing_subscriber::fmt::MakeWriter<'_> for Captured {
        type Writer = Captured;

        fn make_writer(&self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn a_refusal_passing_through_is_logged_once_in_the_clients_span_bytes_untouched() {
        let _serial = serial();
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        let _logs = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(refusal_passing_through(captured));
    }

    async fn refusal_passing_through(captured: Captured) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tracing::Instrument;

        // `client` is the SOCKS5 client; the entry reads from and writes to `watched`.
        let (mut client, at_entry) = tokio::io::duplex(4096);
        let mut watched = Watched::new(at_entry);
        let auth = auth("ann", "open");
        let relay = async {
            let mut from_client = Vec::new();
            // What the client sends and what the exit answers, each passed on as it comes.
            for (expected, answer) in [
                (GREET_PASSWORD.len(), CHOOSE_PASSWORD),
                (auth.len(), &[1, 1]),
            ] {
                let mut message = vec![0; expected];
                watched.read_exact(&mut message).await.expect("read");
                from_client.extend(message);
                watched.write_all(answer).await.expect("write");
            }
            // After the refusal, the bytes are neither looked at nor changed.
            watched.write_all(&[5, 0xff, 1, 1]).await.expect("write");
            watched.shutdown().await.expect("shut down");
            assert!(watched.watch.is_none(), "the watch ended at the refusal");
            from_client
        };
        let relay = relay.instrument({
            let peer: std::net::SocketAddr = "203.0.113.7:4242".parse().expect("address");
            tracing::info_span!("client", %peer)
        });
        let talk = async {
            client.write_all(GREET_PASSWORD).await.expect("greet");
            let mut answer = [0; 2];
            client.read_exact(&mut answer).await.expect("method");
            client.write_all(&auth).await.expect("authenticate");
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).await.expect("status");
            (answer, rest)
        };
        let (from_client, (answer, rest)) = tokio::join!(relay, talk);
        let mut sent = GREET_PASSWORD.to_vec();
        sent.extend(&auth);
        assert_eq!(from_client, sent);
        assert_eq!(answer, [5, 2]);
        assert_eq!(rest, [1, 1, 5, 0xff, 1, 1]);

        let log =
            String::from_utf8(captured.0.lock().expect("not poisoned").clone()).expect("text");
        let refusals: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("wrong SOCKS5 user name or password"))
            .collect();
        assert_eq!(refusals.len(), 1, "logged once: {log}");
        assert!(refusals[0].contains("WARN"), "{log}");
        assert!(refusals[0].contains("peer=203.0.113.7:4242"), "{log}");
        assert!(refusals[0].contains("user=\"ann\""), "{log}");
    }

    #[test]
    fn the_watch_keeps_at_most_what_a_verdict_needs_and_logs_once() {
        let _serial = serial();
        let mut watch = Watch::default();
        // A client that sends a lot at once, starting like a greeting: kept up to the bound.
        let mut flood = vec![5, 255];
        flood.extend([0; 4096]);
        assert!(!watch.take(&flood, true), "still waiting for the method");
        assert_eq!(watch.client.len(), CLIENT_MAX);
        // The method chosen is not among those "offered" (all zero): not SOCKS5.
        assert!(watch.take(&[5, 2], false));

        // A refusal ends the watch, so the wrapper logs it once and drops it.
        let mut watch = Watch::default();
        assert!(!watch.take(GREET_PASSWORD, true));
        assert!(!watch.take(CHOOSE_PASSWORD, false));
        assert!(!watch.take(&auth("ann", "open"), true));
        assert!(watch.take(&[1, 1], false));
    }
}
