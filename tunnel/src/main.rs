//! `gomux-tunnel`: see the crate's README, or `gomux-tunnel --help`.

#![forbid(unsafe_code)]

use std::io;
use std::process;

use gomux_tunnel::cli::{parse_args, run, Command, USAGE};
use gomux_tunnel::logging::{self, complain, say};
use gomux_tunnel::Shutdown;
use tokio::sync::mpsc;
use tracing::{info, warn};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("-h" | "--help" | "help") => return say(USAGE),
        Some("-V" | "--version" | "version") => {
            return say(format_args!("gomux-tunnel {}", env!("CARGO_PKG_VERSION")))
        }
        _ => {}
    }
    // Check the whole command line before starting anything: one line says what is wrong.
    let args = parse_args(&args).unwrap_or_else(|problem| {
        complain(format_args!(
            "gomux-tunnel: {problem}\n(gomux-tunnel --help shows every option)"
        ));
        process::exit(2)
    });

    // `RUST_LOG` decides what is logged; without it, `info` shows connections between the
    // ends coming and going but not every client. No log line, written or not, can fail the
    // process (see `logging`).
    logging::init(args.log_format);

    // One thread runs everything on it (no wakeups between threads); more share the tasks.
    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    };
    let runtime = runtime.unwrap_or_else(|error| {
        complain(format_args!(
            "gomux-tunnel: cannot start the runtime: {error}"
        ));
        process::exit(1)
    });
    runtime.block_on(serve(args));
}

/// Runs what `args` asks for until it is done or a signal has shut it down, then exits.
async fn serve(args: gomux_tunnel::cli::Args) {
    // Take over the signals before anything starts, so that none arrives while their default
    // action (ending the process on the spot) still applies.
    let signals = Signals::new().unwrap_or_else(|error| {
        complain(format_args!("gomux-tunnel: cannot handle signals: {error}"));
        process::exit(1)
    });
    let shutdown = Shutdown::new(args.drain);
    tokio::spawn(shut_down_on_signals(signals, shutdown.clone()));
    // An end run from a config file reloads it on SIGHUP; the others keep SIGHUP's default.
    let (reload, reloads) = mpsc::channel(1);
    if matches!(
        args.command,
        Command::EntryConfig { .. } | Command::ExitConfig { .. }
    ) {
        let hangups = hangups().unwrap_or_else(|error| {
            complain(format_args!("gomux-tunnel: cannot handle SIGHUP: {error}"));
            process::exit(1)
        });
        tokio::spawn(reload_on_hangups(hangups, reload));
    }

    // Runs until the work fails, or a signal has shut it down.
    if let Err(problem) = run(args, shutdown, reloads).await {
        complain(format_args!("gomux-tunnel: {problem}"));
        process::exit(1);
    }
}

/// Turns signals into the steps of a shutdown: the first begins it, the second cuts what is
/// left, the third exits at once (should closing the gomux connections hang).
async fn shut_down_on_signals(mut signals: Signals, shutdown: Shutdown) {
    let signal = signals.next().await;
    info!(
        signal,
        drain = ?shutdown.drain,
        "shutting down; send it again to cut the connections still open"
    );
    shutdown.begin.cancel();
    let signal = signals.next().await;
    warn!(signal, "cutting the connections still open");
    shutdown.cut.cancel();
    let signal = signals.next().await;
    warn!(signal, "exiting at once");
    process::exit(130);
}

/// SIGHUP, installed (on Unix) before anything starts: from then on it no longer ends the
/// process.
#[cfg(unix)]
fn hangups() -> io::Result<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    signal(SignalKind::hangup())
}

/// Elsewhere there is no SIGHUP: nothing to install.
#[cfg(not(unix))]
fn hangups() -> io::Result<()> {
    Ok(())
}

/// Asks for a reload of the config file on each SIGHUP. Signals that come while one is
/// pending are one reload: it reads the file as it is by then.
#[cfg(unix)]
async fn reload_on_hangups(mut hangups: tokio::signal::unix::Signal, reload: mpsc::Sender<()>) {
    while hangups.recv().await.is_some() {
        let _ = reload.try_send(());
    }
}

/// Elsewhere no reload is ever asked for.
#[cfg(not(unix))]
async fn reload_on_hangups((): (), reload: mpsc::Sender<()>) {
    let _keep = reload;
    std::future::pending::<()>().await;
}

/// The signals that shut the tunnel down: SIGINT (Ctrl-C) and SIGTERM (what service managers
/// and container runtimes send) on Unix, Ctrl-C elsewhere.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers: from now on these signals no longer end the process by
    /// themselves.
    fn new() -> io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// Waits for the next signal, and names it.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                Some(()) = self.interrupt.recv() => "SIGINT",
                Some(()) = self.terminate.recv() => "SIGTERM",
                // Neither can deliver any more (the runtime is shutting down).
                else => std::future::pending().await,
            }
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "Ctrl-C",
                // Without a handler no signal can come: wait for ever rather than shut down.
                Err(_) => std::future::pending().await,
            }
        }
    }
}
