//! Throughput round after round: shows how much one machine's speed moves between rounds that do
//! exactly the same work, and whether a slow round costs more CPU (the machine) or the same CPU
//! spread over more time (waiting).
//!
//! ```text
//! cargo run --release --example rounds -- [--streams N] [--rounds R] [--write-buffer BYTES]
//! ```
//!
//! Each round opens N gomux streams (default 100) over one loopback TCP connection (set up once)
//! and sends 64 MiB over them, at least 512 KiB per stream, in 64 KiB writes, while the peer
//! reads into 64 KiB buffers. Every round prints one line: its wall time, the CPU time the
//! process used meanwhile (user and system, from `/proc/self/stat`, Linux only, in 10 ms ticks),
//! the throughput, and the system's uptime when it ended (`/proc/uptime`), to match the round
//! with the timestamps of a profiler running meanwhile (`perf record -k CLOCK_MONOTONIC`).
//!
//! A last line gives the median throughput and the mean of the fastest quarter of rounds. The
//! second is the steadier figure for comparing two settings here: slow stretches of the machine
//! fall on either run at random and pull its median down, while both runs usually have fast
//! rounds. `--write-buffer` sets `Config::write_buffer_size` on both sessions.

use std::sync::Arc;
use std::time::Instant;

use gomux::{Config, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

const USAGE: &str = "usage: rounds [--streams N] [--rounds R] [--write-buffer BYTES]
  (defaults: 100 streams, 40 rounds, the session's default write buffer)";

/// What to run.
struct Options {
    streams: usize,
    rounds: usize,
    /// `Config::write_buffer_size` of both sessions, if not the default.
    write_buffer: Option<usize>,
}

fn main() -> std::io::Result<()> {
    let Options {
        streams,
        rounds,
        write_buffer,
    } = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let connecting = TcpStream::connect(listener.local_addr()?);
        let (client, (server, _)) = tokio::try_join!(connecting, listener.accept())?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let mut config = Config::default();
        if let Some(bytes) = write_buffer {
            config = config.write_buffer_size(bytes);
        }
        let client = Arc::new(Session::with_config(client, Role::Client, config.clone()));
        let server = Arc::new(Session::with_config(server, Role::Server, config));
        let mut rates = Vec::with_capacity(rounds);
        let per_stream = ((64usize << 20) / streams).max(512 << 10);
        let block: Arc<[u8]> = (0..64 * 1024).map(|i| (i * 7) as u8).collect();
        println!("# round  wall-ms  cpu-ms  GiB/s  end");
        for round in 1..=rounds {
            let (start, cpu_start) = (Instant::now(), cpu_seconds());
            let mut tasks = JoinSet::new();
            for _ in 0..streams {
                let (client, block) = (Arc::clone(&client), Arc::clone(&block));
                tasks.spawn(async move {
                    let mut stream = client.open().await?;
                    let mut left = per_stream;
                    while left > 0 {
                        let n = left.min(block.len());
                        stream.write_all(&block[..n]).await?;
                        left -= n;
                    }
                    stream.shutdown().await
                });
                let server = Arc::clone(&server);
                tasks.spawn(async move {
                    let mut stream = server.accept().await?;
                    let mut buf = vec![0; 64 * 1024];
                    while stream.read(&mut buf).await? > 0 {}
                    Ok(())
                });
            }
            while let Some(done) = tasks.join_next().await {
                done??;
            }
            let wall = start.elapsed().as_secs_f64();
            let cpu = cpu_seconds() - cpu_start;
            let gib = (per_stream * streams) as f64 / f64::from(1 << 30) / wall;
            let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
            let end = uptime.split_whitespace().next().unwrap_or("-");
            let (wall_ms, cpu_ms) = (wall * 1e3, cpu * 1e3);
            println!("{round:7}  {wall_ms:7.1}  {cpu_ms:6.0}  {gib:5.2}  {end}");
            rates.push(gib);
        }
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let fastest = &rates[rates.len() - rates.len().div_ceil(4)..];
        let fast_mean = fastest.iter().sum::<f64>() / fastest.len() as f64;
        println!("# median {median:.2} GiB/s, fastest quarter of rounds {fast_mean:.2} GiB/s");
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .map_err(std::io::Error::other)
}

/// User and system CPU time of this process so far, in seconds (0 where `/proc` is missing).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        streams: 100,
        rounds: 40,
        write_buffer: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number: usize = value
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or(format!("{flag} takes a positive whole number, not {value}"))?;
        match flag.as_str() {
            "--streams" => options.streams = number,
            "--rounds" => options.rounds = number,
            "--write-buffer" => options.write_buffer = Some(number),
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    Ok(options)
}
