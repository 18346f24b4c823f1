//! Round trips of one small message, one after another: raw loopback TCP, or one gomux stream
//! over it. Everything runs on one thread, so the time of a round trip is the CPU both ends
//! spend on it, and what the program executes per round trip can be counted exactly.
//!
//! ```text
//! cargo run --release --example round_trips -- [tcp|gomux] [--count N] [--size BYTES]
//! ```
//!
//! Prints the mean time of a round trip. Wall-clock time on a shared machine moves from run to
//! run; the count of instructions does not. `scripts/round-trip-instructions.sh` runs this
//! program under callgrind at two counts and takes the difference, which leaves the
//! instructions of one round trip without those of the setup: the figure to compare two builds
//! by, where timing them cannot tell a few per cent apart.

use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const USAGE: &str = "usage: round_trips [tcp|gomux] [--count N] [--size BYTES]
  (defaults: gomux, 20000 round trips of 64 bytes)";

fn main() -> std::io::Result<()> {
    let (gomux, count, size) = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let connecting = TcpStream::connect(listener.local_addr()?);
        let (client, (server, _)) = tokio::try_join!(connecting, listener.accept())?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let message = vec![0x5a; size];
        let elapsed = if gomux {
            let client = gomux::Session::client(client);
            let server = gomux::Session::server(server);
            let mut stream = client.open().await?;
            // The first message opens the stream on the other side.
            stream.write_all(&message).await?;
            let mut echo = server.accept().await?;
            let mut first = vec![0; size];
            echo.read_exact(&mut first).await?;
            echo.write_all(&first).await?;
            stream.read_exact(&mut first).await?;
            tokio::spawn(echo_back(echo));
            tokio::spawn(round_trips(stream, message, count)).await??
        } else {
            tokio::spawn(echo_back(server));
            tokio::spawn(round_trips(client, message, count)).await??
        };
        let micros = elapsed * 1e6 / count as f64;
        let mode = if gomux { "gomux" } else { "tcp" };
        println!("{mode}: {count} round trips of {size} bytes, {micros:.2} µs each");
        Ok(())
    })
}

/// Sends `message` and waits for its echo, `count` times; returns the seconds it took. It runs
/// as a task of its own, as the echo does: a future that `block_on` polls is woken apart from
/// the tasks, which costs the runtime a look at the transport between them (`park_yield`) that
/// a task woken by another task does not.
async fn round_trips<S>(mut stream: S, message: Vec<u8>, count: u64) -> std::io::Result<f64>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut back = vec![0; message.len()];
    let start = Instant::now();
    for _ in 0..count {
        stream.write_all(&message).await?;
        stream.read_exact(&mut back).await?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Writes back what it reads until the other side closes.
async fn echo_back<S>(mut stream: S) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = vec![0; 4096];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        stream.write_all(&buf[..n]).await?;
    }
}

fn parse_args() -> Result<(bool, u64, usize), String> {
    let (mut gomux, mut count, mut size) = (true, 20_000, 64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| {
            args.next()
                .and_then(|value| value.parse::<u64>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{name} needs a number above 0"))
        };
        match arg.as_str() {
            "tcp" => gomux = false,
            "gomux" => gomux = true,
            "--count" => count = number("--count")?,
            "--size" => size = number("--size")? as usize,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((gomux, count, size))
}
