//! The speed tool's TLS transports: rustls (through tokio-rustls, the `ring` provider) over
//! loopback TCP, set up as `examples/tls.rs` does, with a self-signed certificate made at start
//! that the client is told to trust.
//!
//! - [`Tls`] (the `tls` mode): every stream is its own TLS connection, raw bytes in it; with
//!   one stream, what one TLS connection carries: the limit of a multiplexer running over one.
//! - [`tls_pair`] (the `mux-tls` mode): one TLS connection, both ends, for a gomux session on
//!   each.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

use crate::support::{self, Connector, Piecewise};

/// The name the certificate is made for, and the name the client expects.
const SERVER_NAME: &str = "localhost";

/// One end of a TLS connection over TCP, client's or server's.
pub type TlsTcp = TlsStream<TcpStream>;

/// As raw TCP's: reads of [`support::BULK`] bytes, so that one read takes all the records the
/// connection has decrypted, and the TLS limit is not held down by small reads.
impl Piecewise for TlsTcp {
    const READ_SIZE: usize = support::BULK;
}

/// Loopback TLS: every stream is its own TCP connection with its own TLS handshake.
pub struct Tls {
    listener: TcpListener,
    addr: SocketAddr,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl Tls {
    /// Makes the certificate and both configurations, and listens on an ephemeral loopback
    /// port.
    pub async fn bind() -> io::Result<Tls> {
        let (acceptor, connector) = configs()?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        Ok(Tls {
            listener,
            addr,
            acceptor,
            connector,
        })
    }
}

impl Connector for Tls {
    type Io = TlsTcp;

    async fn open(&self) -> io::Result<TlsTcp> {
        let socket = TcpStream::connect(self.addr).await?;
        socket.set_nodelay(true)?;
        let name = ServerName::try_from(SERVER_NAME).map_err(io::Error::other)?;
        let tls = self.connector.connect(name, socket).await?;
        Ok(TlsStream::Client(tls))
    }

    async fn accept(&self) -> io::Result<TlsTcp> {
        let (socket, _) = self.listener.accept().await?;
        socket.set_nodelay(true)?;
        Ok(TlsStream::Server(self.acceptor.accept(socket).await?))
    }
}

/// One TLS connection over loopback TCP, handshake done: (client's end, server's end).
pub async fn tls_pair() -> io::Result<(TlsTcp, TlsTcp)> {
    let tls = Tls::bind().await?;
    tokio::try_join!(tls.open(), tls.accept())
}

/// The server's acceptor with a new self-signed certificate, and a client connector that trusts
/// exactly that certificate. The `ring` provider is named, so that the choice does not depend
/// on which providers other crates happen to enable.
fn configs() -> io::Result<(TlsAcceptor, TlsConnector)> {
    let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])
        .map_err(io::Error::other)?;
    let certificate: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let mut server = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(vec![certificate.clone()], key.into())
        .map_err(io::Error::other)?;
    // No session tickets after the handshake: a sending end that never reads would close its
    // socket with them unread, and the kernel would then reset the connection under the
    // receiver before it has read everything.
    server.send_tls13_tickets = 0;
    let mut roots = RootCertStore::empty();
    roots.add(certificate).map_err(io::Error::other)?;
    let client = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((
        TlsAcceptor::from(Arc::new(server)),
        TlsConnector::from(Arc::new(client)),
    ))
}
