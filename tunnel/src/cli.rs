//! Running what the command line asks for (the command line itself is read by `args`).

use std::error::Error as StdError;
use std::path::Path;

use tokio::sync::mpsc;
use tracing::info;

use crate::args::read_password;
pub use crate::args::{
    parse_flags, Args, Command, EntryService, ExitService, SecurityArg, TargetArg, Via, USAGE,
};
use crate::config::Credentials;
use crate::connect::{Meeting, Peer};
use crate::drain::{AbortOnDrop, Shutdown, ShutdownReport};
use crate::entry::named::Named;
use crate::entry::{run_entry, run_entry_with, Clients, EntryOptions};
use crate::exit::{run_exit, run_named_exit, Destination, ExitOptions, SocksOptions};
use crate::logging::{say, warn_at_start};
use crate::metrics::serve_metrics;
use crate::relay::{bind, resolve, run_relay};
use crate::security::{Identity, Security};
use crate::services::Reloader;

/// Parses the arguments after the program name: `entry --config FILE` and
/// `exit --config FILE` read the file (see `settings`), anything else is flags (see
/// [`parse_flags`]).
///
/// # Errors
///
/// A sentence saying what is wrong with them.
pub fn parse_args(args: &[String]) -> Result<Args, String> {
    let Some((mode, options)) = args.split_first() else {
        return parse_flags(args);
    };
    // A config file stands for every other option.
    if let [config, file] = options {
        if config == "--config" && ["entry", "exit", "check"].contains(&mode.as_str()) {
            if mode == "check" {
                return Ok(Args {
                    command: Command::Check { file: file.into() },
                    ..parse_flags(&["relay", "--listen", "-", "--target", "-"].map(String::from))?
                });
            }
            let args = crate::settings::load(Path::new(file))?;
            let config_mode = match args.command {
                Command::EntryConfig { .. } => "entry",
                _ => "exit",
            };
            if config_mode != mode {
                return Err(format!("{file} describes an {config_mode}, not an {mode}"));
            }
            return Ok(args);
        }
    }
    parse_flags(args)
}

/// What [`run`] did: an end that ran and shut down, or a one-off command.
#[derive(Debug)]
pub enum Ran {
    /// An end ran until a signal shut it down.
    Shutdown(ShutdownReport),
    /// A command that runs no end (keygen, fingerprint) finished.
    Done,
}

/// Runs the command: binds the listening addresses (printing each, see [`USAGE`]), resolves
/// the others once, loads the key, and runs the chosen end until it has shut down.
///
/// # Errors
///
/// When an address cannot be bound or resolved, a key cannot be read or written, or a fixed
/// target lies outside the allow-list.
pub async fn run(
    args: Args,
    shutdown: Shutdown,
    reloads: mpsc::Receiver<()>,
) -> Result<Ran, Box<dyn StdError>> {
    let reloader = Reloader::new(&args, reloads);
    let _metrics = match args.metrics {
        None => None,
        Some(addr) => {
            let listener = bind(&addr.to_string(), "metrics").await?;
            info!(listen = %listener.local_addr()?, "serving metrics on GET /metrics");
            Some(AbortOnDrop(tokio::spawn(serve_metrics(listener))))
        }
    };
    let Args {
        command,
        security,
        handshakes,
        exit_wait,
        entry_socks,
        limits,
        ..
    } = args;
    let security = || -> Result<Meeting, Box<dyn StdError>> {
        let security = match &security {
            SecurityArg::Insecure => {
                warn_at_start(
                    "--insecure: the connection between the ends is neither authenticated nor \
                     encrypted; whoever reaches its port can use the tunnel",
                );
                Security::Insecure
            }
            SecurityArg::Pinned { key, peer } => {
                let own = Identity::load(key)?;
                Security::pinned(&own, *peer)?
            }
        };
        info!(%security, "securing the connection between the ends");
        Ok(Meeting {
            security,
            handshakes,
        })
    };
    Ok(Ran::Shutdown(match command {
        Command::Keygen { out } => {
            let identity = Identity::generate()?;
            identity
                .save(&out)
                .map_err(|e| format!("cannot write the key into {}: {e}", out.display()))?;
            say(identity.fingerprint());
            return Ok(Ran::Done);
        }
        Command::Fingerprint { key } => {
            say(Identity::load(&key)?.fingerprint());
            return Ok(Ran::Done);
        }
        Command::Entry {
            listen,
            exit,
            connections,
        } => {
            let meeting = security()?;
            let clients = bind(&listen, "clients").await?;
            let listen = clients.local_addr()?;
            let exit = match exit {
                Via::Dial(addr) => {
                    let exit = resolve(&addr).await?;
                    info!(%listen, %exit, "entry listening");
                    Peer::Dial(exit)
                }
                Via::Accept(addr) => {
                    let exits = bind(&addr, "exits").await?;
                    info!(%listen, exits = %exits.local_addr()?, "entry listening");
                    Peer::Accept(exits)
                }
            };
            let options = EntryOptions {
                connections,
                client_wait: exit_wait,
                socks: entry_socks,
                ..EntryOptions::default()
            };
            run_entry(clients, exit, options, meeting, shutdown).await
        }
        Command::Exit {
            entry,
            target,
            allow,
            priorities,
            socks_auth,
        } => {
            let meeting = security()?;
            let destination = match target {
                TargetArg::Fixed(addr) => {
                    let target = resolve(&addr).await?;
                    if !allow.allows(target) {
                        return Err(format!("the target {target} is outside every --allow").into());
                    }
                    Destination::Fixed(target)
                }
                TargetArg::Socks => {
                    if allow.allows_all() {
                        warn_at_start(
                            "--socks without --allow: the exit connects its clients to any \
                             address its host can reach (an open proxy for whoever can use the \
                             entry)",
                        );
                    }
                    Destination::Socks
                }
            };
            let credentials = match socks_auth {
                None => None,
                Some((username, file)) => Some(Credentials {
                    username,
                    password: read_password(&file)?,
                }),
            };
            let options = ExitOptions {
                allow,
                priorities,
                limits,
                socks: SocksOptions {
                    credentials,
                    handshakes,
                },
                ..ExitOptions::default()
            };
            let entry = match entry {
                Via::Accept(addr) => {
                    let listener = bind(&addr, "entries").await?;
                    info!(listen = %listener.local_addr()?, target = %destination, "exit listening");
                    Peer::Accept(listener)
                }
                Via::Dial(addr) => {
                    let entry = resolve(&addr).await?;
                    info!(%entry, target = %destination, "exit dialling the entry");
                    Peer::Dial(entry)
                }
            };
            run_exit(entry, destination, options, meeting, shutdown).await
        }
        Command::Check { file } => {
            let args = crate::settings::load(&file)?;
            let (end, services) = match &args.command {
                Command::EntryConfig { services, .. } => ("entry", services.len()),
                Command::ExitConfig { services, .. } => ("exit", services.len()),
                _ => unreachable!("a config file describes an end"),
            };
            say(format_args!(
                "{}: valid ({end}, {services} services)",
                file.display()
            ));
            return Ok(Ran::Done);
        }
        Command::EntryConfig {
            exit,
            connections,
            services,
            ..
        } => {
            let meeting = security()?;
            let mut bound = Vec::new();
            for service in services {
                let listener = bind(&service.listen, &format!("service.{}", service.name)).await?;
                info!(service = %service.name, listen = %listener.local_addr()?, "service listening");
                bound.push((service, listener));
            }
            let exit = match exit {
                Via::Dial(addr) => Peer::Dial(resolve(&addr).await?),
                Via::Accept(addr) => Peer::Accept(bind(&addr, "exits").await?),
            };
            let options = EntryOptions {
                connections,
                client_wait: exit_wait,
                ..EntryOptions::default()
            };
            let clients = Clients::Named(Box::new(Named {
                services: bound,
                reloader,
            }));
            run_entry_with(clients, exit, options, meeting, shutdown).await
        }
        Command::ExitConfig {
            entry, services, ..
        } => {
            let meeting = security()?;
            let options = ExitOptions {
                limits,
                socks: SocksOptions {
                    credentials: None,
                    handshakes,
                },
                ..ExitOptions::default()
            };
            let entry = match entry {
                Via::Accept(addr) => Peer::Accept(bind(&addr, "entries").await?),
                Via::Dial(addr) => Peer::Dial(resolve(&addr).await?),
            };
            run_named_exit(entry, services, options, meeting, shutdown, reloader).await?
        }
        Command::Relay { listen, target } => {
            let listener = bind(&listen, "relay").await?;
            let target = resolve(&target).await?;
            info!(listen = %listener.local_addr()?, %target, "relay listening");
            run_relay(listener, target, shutdown).await
        }
    }))
}
