//! `gomux-tunnel`'s command line, read by `cli::parse_args` as the tool's `main` reads it:
//! every command and direction, both kinds of target, the security and exposure options, and
//! the lines it refuses with the reason it gives. The tunnel these lines set up is tested in
//! `tests/tunnel.rs`, the tool as a program in `tests/binary.rs`.

use std::time::Duration;

use gomux_tunnel::cli::{parse_args, SecurityArg, TargetArg, Via};
use gomux_tunnel::config::{AllowList, Priorities};

#[test]
fn the_command_line_reads_both_directions_and_both_kinds_of_target() {
    // The ends' security options are tested in `the_command_line_reads_security_and_exposure`;
    // here, both ends run with `--insecure`.
    let args = |line: &str| {
        let mut args: Vec<String> = line.split_whitespace().map(String::from).collect();
        if ["entry", "exit"].contains(&args.first().map_or("", String::as_str)) {
            args.insert(1, "--insecure".into());
        }
        parse_args(&args)
    };
    let parse = |line: &str| args(line).map(|args| args.command);
    let addr = |text: &str| text.to_string();
    use gomux_tunnel::cli::Command::{Entry, Exit, Relay};

    // The forward direction, as before.
    assert_eq!(
        parse("entry --listen 127.0.0.1:7000 --exit 127.0.0.1:7001"),
        Ok(Entry {
            listen: addr("127.0.0.1:7000"),
            exit: Via::Dial(addr("127.0.0.1:7001")),
            connections: 1,
        })
    );
    assert_eq!(
        parse("entry --listen 127.0.0.1:7000 --connections 4 --exit 127.0.0.1:7001"),
        Ok(Entry {
            listen: addr("127.0.0.1:7000"),
            exit: Via::Dial(addr("127.0.0.1:7001")),
            connections: 4,
        })
    );
    assert_eq!(
        parse("exit --listen 127.0.0.1:7001 --target 127.0.0.1:6379"),
        Ok(Exit {
            entry: Via::Accept(addr("127.0.0.1:7001")),
            target: TargetArg::Fixed(addr("127.0.0.1:6379")),
            allow: AllowList::default(),
            priorities: Priorities::default(),
            socks_auth: None,
        })
    );
    assert_eq!(
        parse("relay --listen 127.0.0.1:7002 --target 127.0.0.1:6379"),
        Ok(Relay {
            listen: addr("127.0.0.1:7002"),
            target: addr("127.0.0.1:6379"),
        })
    );
    // One thread unless told otherwise, or one per connection an entry dials.
    assert_eq!(
        args("relay --listen 127.0.0.1:7002 --target 127.0.0.1:6379").map(|args| args.threads),
        Ok(1)
    );
    assert_eq!(
        args("entry --listen 127.0.0.1:7000 --connections 3 --exit 127.0.0.1:7001")
            .map(|args| args.threads),
        Ok(3)
    );
    assert_eq!(
        args("entry --threads 4 --listen 127.0.0.1:7000 --exit 127.0.0.1:7001")
            .map(|args| args.threads),
        Ok(4)
    );
    // The reverse direction, with options in any order, and SOCKS5.
    assert_eq!(
        parse("entry --accept-exit 0.0.0.0:7001 --listen 127.0.0.1:1080"),
        Ok(Entry {
            listen: addr("127.0.0.1:1080"),
            exit: Via::Accept(addr("0.0.0.0:7001")),
            connections: 1,
        })
    );
    assert_eq!(
        parse("exit --socks --entry relay.example:7001"),
        Ok(Exit {
            entry: Via::Dial(addr("relay.example:7001")),
            target: TargetArg::Socks,
            allow: AllowList::default(),
            priorities: Priorities::default(),
            socks_auth: None,
        })
    );

    // How long a shutdown lets connections finish: 30 s unless `--drain` says otherwise, in
    // any mode.
    let drain = |line: &str| args(line).map(|args| args.drain);
    assert_eq!(
        drain("entry --listen a --exit b"),
        Ok(Duration::from_secs(30))
    );
    assert_eq!(
        drain("exit --drain 5 --listen a --socks"),
        Ok(Duration::from_secs(5))
    );
    assert_eq!(
        drain("relay --listen a --target b --drain 0.25"),
        Ok(Duration::from_millis(250))
    );
    assert_eq!(
        drain("entry --listen a --exit b --drain 0"),
        Ok(Duration::ZERO)
    );

    for (line, problem) in [
        ("", "say what to run"),
        ("middle --listen a", "unknown mode"),
        (
            "entry --listen a",
            "--exit ADDR to dial it, or --accept-exit",
        ),
        ("entry --listen a --exit b --accept-exit c", "not both"),
        ("entry --exit b", "--listen ADDR is required"),
        ("entry --listen a --listen b --exit c", "given twice"),
        ("entry --listen a --exit", "needs an address"),
        ("entry --listen a --exit b --target c", "unknown option"),
        (
            "entry --listen a --exit b --exit-wait soon",
            "number of seconds",
        ),
        ("entry --listen a --exit b --log-format xml", "text or json"),
        ("exit --listen a --target b --max-streams 0", "above 0"),
        ("exit --listen a --target b --max-sessions many", "above 0"),
        ("exit --target a", "say how to reach the entry"),
        ("exit --listen a --entry b --socks", "not both"),
        ("exit --listen a", "--target ADDR or --socks is required"),
        ("exit --listen a --target b --socks", "not both"),
        ("relay --listen a --entry b", "unknown option"),
        (
            "exit --listen a --target b --drain",
            "needs a number of seconds",
        ),
        (
            "relay --listen a --target b --drain soon",
            "number of seconds, not \"soon\"",
        ),
        ("entry --listen a --exit b --drain -1", "number of seconds"),
        (
            "entry --listen a --exit b --drain 1 --drain 2",
            "given twice",
        ),
        ("entry --listen a --exit b --connections", "needs a number"),
        ("entry --listen a --exit b --connections 0", "from 1 to 64"),
        ("entry --listen a --exit b --connections 65", "from 1 to 64"),
        ("entry --listen a --exit b --connections two", "not \"two\""),
        ("exit --listen a --target b --threads 0", "from 1 to 1024"),
        (
            "relay --listen a --target b --threads",
            "needs a number of threads",
        ),
        (
            "entry --listen a --accept-exit b --connections 2",
            "the exit dials",
        ),
        (
            "exit --listen a --target b --connections 2",
            "unknown option",
        ),
    ] {
        match parse(line) {
            Err(error) => assert!(error.contains(problem), "{line:?}: {error}"),
            Ok(command) => panic!("{line:?} parsed as {command:?}"),
        }
    }
}

#[test]
fn the_command_line_reads_security_and_exposure() {
    let parse = |line: &str| {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        parse_args(&args)
    };
    let hex = "ab".repeat(32);

    // Pinned TLS: a key directory and the peer's fingerprint, colons allowed.
    let pinned = parse(&format!(
        "entry --listen a --exit b --key /k --peer-fingerprint {}",
        hex.to_uppercase()
    ))
    .expect("parses");
    assert_eq!(
        pinned.security,
        SecurityArg::Pinned {
            key: "/k".into(),
            peer: hex.parse().expect("a fingerprint"),
        }
    );
    assert_eq!(
        parse("exit --listen a --target b --insecure")
            .expect("parses")
            .security,
        SecurityArg::Insecure
    );
    let limits = parse(&format!(
        "exit --listen a --socks --key k --peer-fingerprint {hex} --handshake-timeout 0.5 \
         --max-handshakes 3"
    ))
    .expect("parses")
    .handshakes;
    assert_eq!(limits.timeout, Duration::from_millis(500));
    assert_eq!(limits.limit, 3);

    // The allow-list (repeatable) and SOCKS5 credentials.
    let exit = parse(
        "exit --listen a --socks --insecure --allow 10.0.0.0/8:22,80-90 --allow 127.0.0.1:* \
         --socks-user ann --socks-password-file /p --priority 0.0.0.0/0:22=10 \
         --priority 10.0.0.0/8:*=-1",
    )
    .expect("parses")
    .command;
    let gomux_tunnel::cli::Command::Exit {
        allow,
        socks_auth,
        priorities,
        ..
    } = exit
    else {
        panic!("an exit: {exit:?}");
    };
    assert_eq!(priorities.of("10.9.9.9:22".parse().expect("address")), 10);
    assert_eq!(priorities.of("10.9.9.9:80".parse().expect("address")), -1);
    assert_eq!(priorities.of("192.0.2.1:80".parse().expect("address")), 0);
    assert!(allow.allows("10.9.9.9:85".parse().expect("address")));
    assert!(allow.allows("127.0.0.1:1".parse().expect("address")));
    assert!(!allow.allows("10.9.9.9:91".parse().expect("address")));
    assert_eq!(socks_auth, Some(("ann".into(), "/p".into())));

    // An empty user name, which no SOCKS5 client can send.
    let empty: Vec<String> = [
        "exit",
        "--listen",
        "a",
        "--socks",
        "--insecure",
        "--socks-user",
        "",
    ]
    .into_iter()
    .chain(["--socks-password-file", "f"])
    .map(String::from)
    .collect();
    let refused = parse_args(&empty).expect_err("an empty user name");
    assert!(refused.contains("1 to 255 bytes"), "{refused}");

    // Keys.
    assert!(parse("keygen --out /k").is_ok());
    assert!(parse("fingerprint --key /k").is_ok());

    for (line, problem) in [
        ("entry --listen a --exit b", "--insecure for plain TCP"),
        (
            "exit --listen a --target b --key k",
            "--insecure for plain TCP",
        ),
        (
            "exit --listen a --target b --insecure --key k",
            "without --key",
        ),
        (
            "entry --listen a --exit b --key k --peer-fingerprint 12",
            "64 hexadecimal digits",
        ),
        (
            "exit --listen a --target b --insecure --allow 10.0.0.0/8",
            "no ports",
        ),
        (
            "exit --listen a --target b --insecure --priority 10.0.0.0/8:22",
            "NETWORK:PORTS=N",
        ),
        (
            "exit --listen a --target b --insecure --socks-user u --socks-password-file f",
            "SOCKS5 exit",
        ),
        (
            "exit --listen a --socks --insecure --socks-user u",
            "together",
        ),
        (
            "exit --listen a --socks --insecure --max-handshakes 0",
            "above 0",
        ),
        ("relay --listen a --target b --insecure", "unknown option"),
        // RFC 1929: a user name is 1 to 255 bytes; no one could log in with another.
        (
            format!(
                "exit --listen a --socks --insecure --socks-user {} --socks-password-file f",
                "u".repeat(256)
            )
            .as_str(),
            "1 to 255 bytes",
        ),
        (
            format!(
                "entry --listen a --exit b --key k --peer-fingerprint {}",
                "+f".repeat(32)
            )
            .as_str(),
            "64 hexadecimal digits",
        ),
        ("keygen", "--out DIR is required"),
    ] {
        match parse(line) {
            Err(error) => assert!(error.contains(problem), "{line:?}: {error}"),
            Ok(args) => panic!("{line:?} parsed as {args:?}"),
        }
    }
}
