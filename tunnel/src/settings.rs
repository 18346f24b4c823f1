//! The config file (`entry --config FILE`, `exit --config FILE`, `check --config FILE`): TOML,
//! with a key for every flag and one `[[service]]` table per named service.
//!
//! The top-level keys are the flags of the connection between the ends, named as the flags
//! without their dashes (`--peer-fingerprint HEX` is `peer_fingerprint = "HEX"`, `--insecure`
//! is `insecure = true`, a repeatable flag takes a list). They are checked exactly as the
//! flags are, by the same code. A service's keys are:
//!
//! - at the entry: `name`, `listen` (where its clients connect), `socks` (its clients speak
//!   SOCKS5, as `entry --socks`);
//! - at the exit: `name`, `target` or `socks = true`, `allow` (a list of `--allow` rules),
//!   `priority` (the gomux send priority of its streams, 0 by default), `priority_rules`
//!   (`--priority` rules, which win over `priority` for the targets they hold), `socks_user`
//!   and `socks_password_file`.
//!
//! An end is an entry when its file names the exit (`exit` or `accept_exit`), an exit when it
//! names its own listener or the entry (`listen` or `entry`). A problem is reported with the
//! file and, where TOML gives one, its line.

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use crate::args::{parse_flags, read_password, Args, Command, EntryService, ExitService};
use crate::config::Credentials;
use crate::preface::valid_name;

/// The keys of a config file, both ends' together.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Keys {
    // Both ends.
    key: Option<String>,
    peer_fingerprint: Option<String>,
    insecure: Option<bool>,
    handshake_timeout: Option<f64>,
    max_handshakes: Option<u64>,
    drain: Option<f64>,
    log_format: Option<String>,
    metrics: Option<String>,
    metrics_public: Option<bool>,
    threads: Option<u64>,
    // The entry.
    exit: Option<String>,
    accept_exit: Option<String>,
    connections: Option<u64>,
    exit_wait: Option<f64>,
    // The exit.
    listen: Option<String>,
    entry: Option<String>,
    max_sessions: Option<u64>,
    max_streams: Option<u64>,
    #[serde(default, rename = "service")]
    services: Vec<Spanned<ServiceKeys>>,
}

/// The keys of one `[[service]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceKeys {
    name: String,
    // The entry.
    listen: Option<String>,
    // Both: the entry's clients speak SOCKS5, or the exit is a SOCKS5 proxy.
    socks: Option<bool>,
    // The exit.
    target: Option<String>,
    allow: Option<Vec<String>>,
    priority: Option<i32>,
    priority_rules: Option<Vec<String>>,
    socks_user: Option<String>,
    socks_password_file: Option<String>,
}

/// Reads and checks the config file `file`: the command line it stands for, whose command is
/// the `Command::EntryConfig` or `Command::ExitConfig` of its end, with its services.
///
/// # Errors
///
/// A sentence saying what is wrong, starting with `FILE:` (and the line, where known).
pub fn load(file: &Path) -> Result<Args, String> {
    let shown = file.display();
    let text = std::fs::read_to_string(file).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    parse(file, &text)
}

/// As [`load`], from the text of `file`.
///
/// # Errors
///
/// As [`load`].
pub fn parse(file: &Path, text: &str) -> Result<Args, String> {
    let shown = file.display();
    let keys: Keys = toml::from_str(text).map_err(|error| match error.span() {
        Some(span) => format!("{shown}:{}: {}", line_of(text, span.start), error.message()),
        None => format!("{shown}: {}", error.message()),
    })?;
    let entry = keys.exit.is_some() || keys.accept_exit.is_some();
    let exit = keys.listen.is_some() || keys.entry.is_some();
    let mode = match (entry, exit) {
        (true, false) => "entry",
        (false, true) => "exit",
        _ => {
            return Err(format!(
                "{shown}: say which end this is: an entry names the exit (exit or \
                 accept_exit), an exit its own listener or the entry (listen or entry), not both"
            ))
        }
    };
    if keys.services.is_empty() {
        return Err(format!("{shown}: no [[service]]"));
    }
    let mut args = vec![mode.to_owned()];
    flags(&mut args, &keys);
    // The flags need a service of their own; the file's take its place.
    args.extend(
        match mode {
            "entry" => ["--listen", "127.0.0.1:0"],
            _ => ["--target", "127.0.0.1:1"],
        }
        .map(String::from),
    );
    let mut parsed = parse_flags(&args).map_err(|problem| format!("{shown}: {problem}"))?;
    let mut names: Vec<&str> = Vec::new();
    let mut entry_services = Vec::new();
    let mut exit_services = Vec::new();
    for service in &keys.services {
        let line = line_of(text, service.span().start);
        let service = service.get_ref();
        let name = &service.name;
        let problem = |why: &str| format!("{shown}:{line}: service {name:?}: {why}");
        if !valid_name(name) {
            return Err(problem(
                "a name is 1 to 64 ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        if names.contains(&name.as_str()) {
            return Err(problem("a second service of this name"));
        }
        names.push(name);
        if mode == "entry" {
            entry_services.push(entry_service(service).map_err(|why| problem(&why))?);
        } else {
            exit_services.push(exit_service(service).map_err(|why| problem(&why))?);
        }
    }
    let file = file.to_path_buf();
    parsed.command = match parsed.command {
        Command::Entry {
            exit, connections, ..
        } => Command::EntryConfig {
            file,
            exit,
            connections,
            services: entry_services,
        },
        Command::Exit { entry, .. } => Command::ExitConfig {
            file,
            entry,
            services: exit_services,
        },
        _ => unreachable!("parse_args runs the mode it is given"),
    };
    Ok(parsed)
}

/// The line (from 1) of the byte at `offset` of `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(0, |before| before.matches('\n').count())
        + 1
}

/// Writes the top-level keys as the flags they stand for.
fn flags(args: &mut Vec<String>, keys: &Keys) {
    let mut value = |flag: &str, value: Option<String>| {
        if let Some(value) = value {
            args.push(flag.to_owned());
            args.push(value);
        }
    };
    let number = |n: Option<u64>| n.map(|n| n.to_string());
    let seconds = |n: Option<f64>| n.map(|n| n.to_string());
    value("--key", keys.key.clone());
    value("--peer-fingerprint", keys.peer_fingerprint.clone());
    value("--handshake-timeout", seconds(keys.handshake_timeout));
    value("--max-handshakes", number(keys.max_handshakes));
    value("--drain", seconds(keys.drain));
    value("--log-format", keys.log_format.clone());
    value("--metrics", keys.metrics.clone());
    value("--threads", number(keys.threads));
    value("--exit", keys.exit.clone());
    value("--accept-exit", keys.accept_exit.clone());
    value("--connections", number(keys.connections));
    value("--exit-wait", seconds(keys.exit_wait));
    value("--listen", keys.listen.clone());
    value("--entry", keys.entry.clone());
    value("--max-sessions", number(keys.max_sessions));
    value("--max-streams", number(keys.max_streams));
    for (flag, on) in [
        ("--insecure", keys.insecure),
        ("--metrics-public", keys.metrics_public),
    ] {
        if on == Some(true) {
            args.push(flag.to_owned());
        }
    }
}

/// Checks an entry's service.
fn entry_service(service: &ServiceKeys) -> Result<EntryService, String> {
    let exit_only = [
        ("target", service.target.is_some()),
        ("allow", service.allow.is_some()),
        ("priority", service.priority.is_some()),
        ("priority_rules", service.priority_rules.is_some()),
        ("socks_user", service.socks_user.is_some()),
        ("socks_password_file", service.socks_password_file.is_some()),
    ];
    if let Some((key, _)) = exit_only.iter().find(|(_, given)| *given) {
        return Err(format!("{key} is a key of the exit's services"));
    }
    let listen = service
        .listen
        .clone()
        .ok_or("listen = \"ADDR\" is required (where its clients connect)")?;
    Ok(EntryService {
        name: service.name.clone(),
        listen,
        socks: service.socks == Some(true),
    })
}

/// Checks an exit's service, as the flags of a one-service exit would be checked.
fn exit_service(service: &ServiceKeys) -> Result<ExitService, String> {
    if service.listen.is_some() {
        return Err("listen is a key of the entry's services".into());
    }
    let mut args: Vec<String> = ["exit", "--insecure", "--listen", "127.0.0.1:0"]
        .map(String::from)
        .to_vec();
    if let Some(target) = &service.target {
        args.extend(["--target".to_owned(), target.clone()]);
    }
    if service.socks == Some(true) {
        args.push("--socks".to_owned());
    }
    for rule in service.allow.iter().flatten() {
        args.extend(["--allow".to_owned(), rule.clone()]);
    }
    for rule in service.priority_rules.iter().flatten() {
        args.extend(["--priority".to_owned(), rule.clone()]);
    }
    if let Some(user) = &service.socks_user {
        args.extend(["--socks-user".to_owned(), user.clone()]);
    }
    if let Some(file) = &service.socks_password_file {
        args.extend(["--socks-password-file".to_owned(), file.clone()]);
    }
    let parsed = parse_flags(&args)?;
    let Command::Exit {
        target,
        allow,
        mut priorities,
        socks_auth,
        ..
    } = parsed.command
    else {
        unreachable!("parse_args runs the mode it is given")
    };
    priorities.set_otherwise(service.priority.unwrap_or(0));
    let credentials = match socks_auth {
        None => None,
        Some((username, file)) => Some(Credentials {
            username,
            password: read_password(&file)?,
        }),
    };
    Ok(ExitService {
        name: service.name.clone(),
        target,
        allow,
        priorities,
        credentials,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<Args, String> {
        parse(Path::new("t.toml"), text)
    }

    #[test]
    fn an_entry_file_reads_as_its_flags() {
        let args = parse_text(
            "exit = \"127.0.0.1:7000\"\ninsecure = true\nconnections = 2\nthreads = 4\n\n\
             [[service]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n\
             [[service]]\nname = \"proxy\"\nlisten = \"127.0.0.1:1080\"\nsocks = true\n",
        )
        .expect("valid");
        let Command::EntryConfig {
            connections,
            services,
            ..
        } = args.command
        else {
            panic!("an entry: {:?}", args.command)
        };
        assert_eq!(connections, 2);
        assert_eq!(args.threads, 4);
        assert_eq!(services.len(), 2);
        assert!(services[1].socks);
    }

    #[test]
    fn problems_name_the_line() {
        let problem = parse_text(
            "listen = \"127.0.0.1:7000\"\ninsecure = true\n\n[[service]]\nname = \"a\"\n\
             target = \"127.0.0.1:80\"\n\n[[service]]\nname = \"b\"\nallow = [\"nowhere\"]\n\
             target = \"127.0.0.1:81\"\n",
        )
        .expect_err("a bad rule");
        assert!(problem.starts_with("t.toml:8: service \"b\""), "{problem}");
        let problem = parse_text("listen = \"x:1\"\ninsecure = true\nbogus = 1\n")
            .expect_err("an unknown key");
        assert!(problem.starts_with("t.toml:3:"), "{problem}");
        let problem = parse_text(
            "listen = \"127.0.0.1:7000\"\n\n[[service]]\nname = \"a\"\ntarget = \"127.0.0.1:80\"\n",
        )
        .expect_err("no security");
        assert!(problem.contains("--key"), "{problem}");
    }
}
