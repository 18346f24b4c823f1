//! How one session's bulk streams share an emulated link: eight streams at one priority, then
//! a stream at priority 10 beside one at priority 0.
//!
//! ```text
//! cargo bench --features tcp --bench shares -- [--seconds S] [--links 100/10,20/20]
//! ```
//!
//! One gomux session over one TCP connection through the userspace relay of
//! `support/link.rs` (a line of R Mbit/s each way, a one-way delay, a 16 KiB queue), both
//! sockets set up with `gomux::tcp::configure` as the README shows. Each stream writes 64 KiB at
//! a time as fast as it can; the server counts what each stream receives after a warm-up
//! second, for `S` seconds (default 10). Printed per link: the eight streams' rates, the
//! largest and smallest over their mean, and the link's total; then the priority-10 stream's
//! share of what the two moved.
//!
//! Run without `--bench` (as `cargo test --benches` does), it makes a one-second check.

#[path = "support/link.rs"]
mod link;
mod support;

use std::io;
use std::net::Ipv4Addr;
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gomux::{Role, Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use link::Link;

/// Bytes of the queue in front of the emulated line.
const QUEUE: usize = 16 * 1024;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let measuring = args.iter().any(|arg| arg == "--bench");
    let (mut window, mut warmup) = if measuring {
        (Duration::from_secs(10), Duration::from_secs(1))
    } else {
        println!("# a one-second check (run with --bench to measure)");
        (Duration::from_secs(1), Duration::from_millis(200))
    };
    let mut links = vec![(100, 10), (20, 20)];
    let mut rest = args.iter().filter(|arg| *arg != "--bench");
    while let Some(flag) = rest.next() {
        let value = rest.next().cloned().unwrap_or_default();
        match flag.as_str() {
            "--seconds" => match value.parse::<f64>() {
                Ok(s) if s > 0.0 && s < 3600.0 => {
                    window = Duration::from_secs_f64(s);
                    warmup = warmup.min(window);
                }
                _ => usage(&format!("bad --seconds {value}")),
            },
            "--links" => {
                links = value
                    .split(',')
                    .map(|pair| {
                        let parsed = pair
                            .split_once('/')
                            .and_then(|(r, d)| Some((r.parse().ok()?, d.parse().ok()?)));
                        parsed.unwrap_or_else(|| usage(&format!("bad link {pair}")))
                    })
                    .collect();
            }
            _ => usage(&format!("unknown option {flag}")),
        }
    }
    println!("# link       test          rates_MiB/s (per stream)                       max/mean min/mean total_MiB/s");
    for (mbit, delay_ms) in links {
        let link = Link::new(mbit, delay_ms, QUEUE);
        let label = format!("{mbit}M/{delay_ms}ms");
        for priorities in [vec![0; 8], vec![10, 0]] {
            let test = if priorities.len() == 8 {
                "8-equal"
            } else {
                "prio-10-vs-0"
            };
            eprintln!("{label} {test}...");
            match run(link, &priorities, window, warmup) {
                Ok(rates) => {
                    let total: f64 = rates.iter().sum();
                    let mean = total / rates.len() as f64;
                    let max = rates.iter().copied().fold(0.0, f64::max);
                    let min = rates.iter().copied().fold(f64::MAX, f64::min);
                    let shown: Vec<String> = rates.iter().map(|r| format!("{r:.2}")).collect();
                    println!(
                        "{label:<12} {test:<13} {:<46} {:>8.3} {:>8.3} {:>11.2}",
                        shown.join(" "),
                        max / mean,
                        min / mean,
                        total
                    );
                    if priorities.len() == 2 {
                        println!(
                            "# {label}: the priority-10 stream moved {:.1} % of what the two did",
                            100.0 * rates[0] / total
                        );
                    }
                }
                Err(error) => {
                    println!("# {label} {test}: failed: {error}");
                    process::exit(1);
                }
            }
        }
    }
}

fn usage(message: &str) -> ! {
    eprintln!("shares: {message}\nusage: shares [--seconds S] [--links R/D,...]");
    process::exit(2);
}

/// Runs one bulk stream per entry of `priorities` for `window` after `warmup`; returns each
/// stream's rate in MiB/s over the window, as its receiver counted.
fn run(link: Link, priorities: &[i32], window: Duration, warmup: Duration) -> io::Result<Vec<f64>> {
    let rt = support::runtime();
    rt.block_on(async move {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let relay = link.relay(listener.local_addr()?)?;
        let socket = TcpStream::connect(relay.addr()).await?;
        gomux::tcp::configure(&socket)?;
        let client = Session::client(socket);
        let (socket, _) = listener.accept().await?;
        gomux::tcp::configure(&socket)?;
        let server = Session::with_config(socket, Role::Server, Default::default());
        let counts: Arc<Vec<AtomicU64>> =
            Arc::new(priorities.iter().map(|_| AtomicU64::new(0)).collect());
        let serving = tokio::spawn(count_all(server, Arc::clone(&counts)));
        let mut writers = Vec::new();
        for (index, &priority) in priorities.iter().enumerate() {
            let mut stream = client.open().await?;
            stream.set_priority(priority);
            stream.write_all(&[index as u8]).await?;
            writers.push(tokio::spawn(async move {
                let chunk = vec![0x5a; 64 * 1024];
                while stream.write_all(&chunk).await.is_ok() {}
            }));
        }
        tokio::time::sleep(warmup).await;
        let start: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        tokio::time::sleep(window).await;
        let end: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        for writer in writers {
            writer.abort();
        }
        serving.abort();
        drop(relay);
        let seconds = window.as_secs_f64();
        Ok(start
            .iter()
            .zip(&end)
            .map(|(a, b)| (b - a) as f64 / seconds / (1 << 20) as f64)
            .collect())
    })
}

/// Accepts every stream and counts what each receives, by the index in its first byte.
async fn count_all(server: Session, counts: Arc<Vec<AtomicU64>>) {
    while let Ok(stream) = server.accept().await {
        tokio::spawn(count(stream, Arc::clone(&counts)));
    }
}

async fn count(mut stream: Stream, counts: Arc<Vec<AtomicU64>>) {
    let mut index = [0];
    if stream.read_exact(&mut index).await.is_err() {
        return;
    }
    let Some(counter) = counts.get(usize::from(index[0])) else {
        return;
    };
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            return;
        }
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}
