//! gomux over TLS: encryption goes *under* the multiplexer.
//!
//! The gomux protocol carries streams in plain frames; it does not encrypt. It runs on any
//! reliable byte stream, though, and a TLS connection is one. So the order is: TCP connection,
//! then the TLS handshake, then a gomux session on the TLS stream. One handshake protects every
//! stream the session will ever carry, and opening a stream costs no new handshake:
//!
//! ```text
//!  stream 0 ─┐                                              ┌─ stream 0
//!  stream 2 ─┼─ gomux ─ TLS ═══ one TCP connection ═══ TLS ─ gomux ─┼─ stream 2
//!  stream 4 ─┘                                              └─ stream 4
//! ```
//!
//! This example runs both ends in one process on loopback. The server has a self-signed
//! certificate made at start (with `rcgen`), which the client is told to trust. The client
//! opens several streams at once, sends different text on each, and checks that the server
//! echoes every byte back on the right stream:
//!
//! ```text
//! cargo run --release --example tls
//! ```
//!
//! TLS is `rustls` (through `tokio-rustls`) with the `ring` cryptography provider.

use std::error::Error as StdError;
use std::io;
use std::process;
use std::sync::Arc;
use std::time::Instant;

use gomux::{Session, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Streams the client opens, all at the same time, on the one TLS connection.
const STREAMS: usize = 6;

/// Bytes of text each stream carries each way.
const BYTES_PER_STREAM: usize = 1024 * 1024;

/// The name the certificate is made for, and the name the client expects.
const SERVER_NAME: &str = "localhost";

type BoxError = Box<dyn StdError + Send + Sync>;

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("tls: {error}");
        process::exit(1);
    }
}

async fn run() -> Result<(), BoxError> {
    // Step 1: a certificate. A real server loads one signed by an authority its clients
    // trust; this demo makes a self-signed one and hands it to its own client.
    let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])?;
    let certificate = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    println!("tls: made a self-signed certificate for {SERVER_NAME:?}");

    // Step 2: the two TLS configurations, both with the `ring` provider named explicitly, so
    // the choice does not depend on which providers other crates happen to enable.
    let server_config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![certificate.clone()], key.into())?;
    let client_config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(trusting(certificate)?)
        .with_no_client_auth();

    // Step 3: the server listens on a port the system picks, and runs in the background.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(serve(listener, TlsAcceptor::from(Arc::new(server_config))));

    // Step 4: the client. First TCP, then TLS on it...
    let socket = TcpStream::connect(addr).await?;
    // gomux sends many small frames; Nagle's algorithm would delay them (TLS records too).
    socket.set_nodelay(true)?;
    let name = ServerName::try_from(SERVER_NAME)?;
    let tls = TlsConnector::from(Arc::new(client_config))
        .connect(name, socket)
        .await?;
    let (_, connection) = tls.get_ref();
    if let (Some(version), Some(suite)) = (
        connection.protocol_version(),
        connection.negotiated_cipher_suite(),
    ) {
        println!(
            "tls: client handshake done: {version:?}, {:?}",
            suite.suite()
        );
    }

    // ... and only then gomux, on the TLS stream, exactly as it would run on the TCP stream.
    let session = Session::client(tls);

    // Step 5: several streams at once, each in its own task; their frames interleave inside
    // the one encrypted connection.
    let started = Instant::now();
    let mut streams = JoinSet::new();
    for index in 0..STREAMS {
        let session = session.clone();
        streams.spawn(async move {
            let stream = session.open().await?;
            echo_and_check(stream, index).await
        });
    }
    while let Some(result) = streams.join_next().await {
        let (id, bytes) = result??;
        println!("tls: stream {id}: {bytes} bytes sent and echoed back intact");
    }

    // Step 6: close the session: CloseMux, then the TLS close_notify, then the TCP close.
    session.close().await?;
    let served = server.await??;
    println!(
        "tls: {STREAMS} streams x {BYTES_PER_STREAM} bytes echoed over one TLS connection in \
         {:.3} s (the server saw {served} streams)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A root store that trusts exactly this one certificate.
fn trusting(certificate: CertificateDer<'static>) -> Result<RootCertStore, BoxError> {
    let mut roots = RootCertStore::empty();
    roots.add(certificate)?;
    Ok(roots)
}

// ---------------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------------

/// Accepts one TCP connection, does the TLS handshake, then serves one gomux session on it,
/// echoing every stream. Returns how many streams it served.
async fn serve(listener: TcpListener, acceptor: TlsAcceptor) -> Result<usize, BoxError> {
    let (socket, _) = listener.accept().await?;
    socket.set_nodelay(true)?;
    let tls = acceptor.accept(socket).await?;
    println!("tls: server handshake done");

    // The server role, on the server's end of the TLS connection.
    let session = Session::server(tls);
    let mut served = 0;
    let mut echoes = JoinSet::new();
    // `accept` fails once the session is over; the client closing it is the normal end.
    let reason = loop {
        match session.accept().await {
            Ok(stream) => {
                served += 1;
                echoes.spawn(echo(stream));
            }
            Err(reason) => break reason,
        }
    };
    if !matches!(reason, gomux::Error::ClosedByPeer) {
        return Err(format!("server: the session ended badly: {reason}").into());
    }
    while let Some(result) = echoes.join_next().await {
        result??;
    }
    Ok(served)
}

/// Echoes one stream until the client half-closes it, then half-closes in turn.
async fn echo(stream: Stream) -> io::Result<()> {
    let (mut reader, mut writer) = stream.into_split();
    tokio::io::copy(&mut reader, &mut writer).await?;
    writer.shutdown().await
}

// ---------------------------------------------------------------------------------------------
// The client's check
// ---------------------------------------------------------------------------------------------

/// Sends this stream's text, half-closes, reads the echo to its end and compares. Returns the
/// stream id and the byte count.
async fn echo_and_check(stream: Stream, index: usize) -> Result<(u32, usize), BoxError> {
    let id = stream.id();
    let text = text_for(index);

    // Write and read at the same time: the server echoes only as fast as we read, so writing
    // everything first would stall once the stream's flow-control window is full.
    let (mut reader, mut writer) = stream.into_split();
    let send = async {
        writer.write_all(&text).await?;
        writer.shutdown().await
    };
    let receive = async {
        let mut echoed = Vec::with_capacity(text.len());
        reader.read_to_end(&mut echoed).await?;
        Ok::<_, io::Error>(echoed)
    };
    let ((), echoed) = tokio::try_join!(send, receive)?;

    if echoed != text {
        let at = echoed.iter().zip(&text).position(|(a, b)| a != b);
        return Err(format!(
            "stream {id}: echo differs (sent {} bytes, got {}, first difference at {at:?})",
            text.len(),
            echoed.len()
        )
        .into());
    }
    Ok((id, text.len()))
}

/// Numbered lines naming the stream, cut to [`BYTES_PER_STREAM`]: a byte delivered to the
/// wrong stream, or out of order, changes the text.
fn text_for(index: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(BYTES_PER_STREAM + 64);
    let mut line = 0;
    while text.len() < BYTES_PER_STREAM {
        text.extend_from_slice(format!("stream #{index}, line {line}\n").as_bytes());
        line += 1;
    }
    text.truncate(BYTES_PER_STREAM);
    text
}
