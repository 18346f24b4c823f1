//! Who may be the other end: mutual TLS with pinned certificates, or, explicitly, nothing.
//!
//! Each end has its own key pair and a self-signed certificate ([`Identity`], made by
//! `gomux-tunnel keygen`), and is told the SHA-256 fingerprint of the other end's certificate
//! ([`Fingerprint`]). The end that dials is the TLS client, the end that accepts the TLS server,
//! and each requires the other's certificate: the client verifies the server's, the server
//! requires and verifies the client's. A verifier accepts exactly the pinned certificate, by its
//! fingerprint, and checks the handshake signature made with its key through rustls' own
//! webpki helpers; there is no certificate authority, no name check and no expiry check (the
//! pin is the whole trust decision; to revoke a key, change the pin).
//!
//! Only TLS 1.3 is offered: both ends are this program, and 1.3 keeps the client's certificate
//! encrypted on the wire. The handshake completes before the gomux session starts, so nothing
//! of the tunnel is reachable by an end that has not proven it holds the pinned key.
//!
//! What a connection buffers is rustls' to bound: records of at most 16 KiB, and 64 KiB of
//! plaintext waiting to be encrypted (rustls' default `set_buffer_limit`), beside the gomux
//! session's own bounds. How long a handshake may take, and how many may be in progress, is
//! [`Handshakes`](crate::config::Handshakes)'.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{self, ring as provider, WebPkiSupportedAlgorithms};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{
    self, ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The certificate file in a key directory.
pub const CERT_FILE: &str = "cert.pem";
/// The private key file in a key directory (PKCS #8, PEM; readable by its owner only).
pub const KEY_FILE: &str = "key.pem";

/// The name the client asks for and puts in certificates. Not checked: the pin is.
const NAME: &str = "gomux-tunnel";

/// Anything a gomux session of the tunnel runs on: TCP, or TLS over TCP.
pub trait Transport: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Transport for T {}

/// A connection between the two ends, authenticated (or not, with `--insecure`).
pub type Connection = Box<dyn Transport>;

/// How the connection between the two ends is secured.
#[derive(Clone)]
pub enum Security {
    /// Mutual TLS 1.3, each end pinning the other's certificate (the default).
    Pinned(Arc<Pinned>),
    /// Plain TCP: anyone who reaches the ports can use the tunnel (`--insecure`).
    Insecure,
}

/// The TLS configurations of an end that pins its peer.
pub struct Pinned {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
    peer: Fingerprint,
}

impl Security {
    /// Mutual TLS with `own` as this end's identity and `peer` the fingerprint of the other
    /// end's certificate.
    ///
    /// # Errors
    ///
    /// When rustls refuses the key (an unsupported key type, say).
    pub fn pinned(own: &Identity, peer: Fingerprint) -> Result<Security, rustls::Error> {
        let provider = Arc::new(provider::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let verifier = Arc::new(PinVerifier { peer, algorithms });
        let client = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_client_auth_cert(vec![own.cert.clone()], own.key.clone_key())?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![own.cert.clone()], own.key.clone_key())?;
        Ok(Security::Pinned(Arc::new(Pinned {
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
            peer,
        })))
    }

    /// Whether the connection is authenticated and encrypted.
    pub fn is_pinned(&self) -> bool {
        matches!(self, Security::Pinned(_))
    }

    /// Secures a connection this end dialled: the TLS client's handshake, which fails unless
    /// the other end shows the pinned certificate and accepts ours.
    ///
    /// # Errors
    ///
    /// When the handshake fails (the other end's certificate is not the pinned one, it refused
    /// ours, or it is not this program).
    pub async fn dialled(&self, tcp: TcpStream) -> io::Result<Connection> {
        match self {
            Security::Insecure => Ok(Box::new(tcp)),
            Security::Pinned(pinned) => {
                let name = ServerName::try_from(NAME).map_err(io::Error::other)?;
                let tls = pinned.connector.connect(name, tcp).await?;
                Ok(Box::new(tls))
            }
        }
    }

    /// Secures a connection this end accepted: the TLS server's handshake, which fails unless
    /// the client shows the pinned certificate and proves it holds its key.
    ///
    /// # Errors
    ///
    /// When the handshake fails: a client without the pinned key, or not a TLS client at all.
    pub async fn accepted(&self, tcp: TcpStream) -> io::Result<Connection> {
        match self {
            Security::Insecure => Ok(Box::new(tcp)),
            Security::Pinned(pinned) => Ok(Box::new(pinned.acceptor.accept(tcp).await?)),
        }
    }
}

impl fmt::Display for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Security::Pinned(pinned) => write!(f, "TLS 1.3, peer pinned to {}", pinned.peer),
            Security::Insecure => f.write_str("insecure (plain TCP)"),
        }
    }
}

/// An end's key pair and self-signed certificate.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    cert_pem: String,
    key_pem: String,
}

impl Identity {
    /// A new key pair (ECDSA P-256, rcgen's default) and a self-signed certificate for it.
    ///
    /// # Errors
    ///
    /// When rcgen fails to make them.
    pub fn generate() -> Result<Identity, rcgen::Error> {
        let made = rcgen::generate_simple_self_signed(vec![NAME.to_owned()])?;
        let key_pem = made.signing_key.serialize_pem();
        let key = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
        Ok(Identity {
            cert: made.cert.der().clone(),
            cert_pem: made.cert.pem(),
            key,
            key_pem,
        })
    }

    /// Reads `cert.pem` and `key.pem` from `dir`, as [`Identity::save`] wrote them.
    ///
    /// # Errors
    ///
    /// When a file cannot be read or holds no certificate or key.
    pub fn load(dir: &Path) -> io::Result<Identity> {
        let read = |name: &str| -> io::Result<(PathBuf, String)> {
            let path = dir.join(name);
            let text = fs::read_to_string(&path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            Ok((path, text))
        };
        let bad = |path: &Path, e: &dyn fmt::Display| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        };
        let (cert_path, cert_pem) = read(CERT_FILE)?;
        private(&dir.join(KEY_FILE))?;
        let (key_path, key_pem) = read(KEY_FILE)?;
        let cert =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| bad(&cert_path, &e))?;
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| bad(&key_path, &e))?;
        Ok(Identity {
            cert,
            key,
            cert_pem,
            key_pem,
        })
    }

    /// Writes `cert.pem` and `key.pem` into `dir` (made if missing), the key readable by its
    /// owner only. Both files are created anew: an existing file, or a symbolic link in their
    /// place, is an error, and nothing is written through it.
    ///
    /// # Errors
    ///
    /// When a file exists already or cannot be written.
    pub fn save(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)?;
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let key_path = dir.join(KEY_FILE);
        let mut key = options
            .open(&key_path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", key_path.display())))?;
        io::Write::write_all(&mut key, self.key_pem.as_bytes())?;
        // Created anew too (O_EXCL), which never follows a symbolic link planted there.
        let cert_path = dir.join(CERT_FILE);
        let mut cert = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&cert_path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", cert_path.display())))?;
        io::Write::write_all(&mut cert, self.cert_pem.as_bytes())
    }

    /// The SHA-256 fingerprint of the certificate, which the other end pins.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.cert)
    }
}

/// The SHA-256 digest of a certificate (its DER encoding), written as 64 hexadecimal digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of `cert`.
    pub fn of(cert: &CertificateDer<'_>) -> Fingerprint {
        let digest = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
        let mut bytes = [0; 32];
        bytes.copy_from_slice(digest.as_ref());
        Fingerprint(bytes)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl FromStr for Fingerprint {
    type Err = String;

    /// 64 hexadecimal digits, in either case; or 32 pairs of them separated by colons (as
    /// `openssl x509 -fingerprint` prints them). Nothing else: no sign, no space.
    fn from_str(text: &str) -> Result<Fingerprint, String> {
        let problem = || {
            format!(
                "a fingerprint is 64 hexadecimal digits (SHA-256), not {:?}",
                text.escape_debug().to_string()
            )
        };
        let digits: String = if text.contains(':') {
            let pairs: Vec<&str> = text.split(':').collect();
            if pairs.len() != 32 || pairs.iter().any(|pair| pair.len() != 2) {
                return Err(problem());
            }
            pairs.concat()
        } else {
            text.to_owned()
        };
        if digits.len() != 64 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(problem());
        }
        let mut bytes = [0; 32];
        for (byte, pair) in bytes.iter_mut().zip(digits.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| problem())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| problem())?;
        }
        Ok(Fingerprint(bytes))
    }
}

/// Checks that a file holding a secret (a private key, a password) is readable by its owner
/// only, as ssh checks its keys: one that others can read may have been read by them.
///
/// # Errors
///
/// When its metadata cannot be read, or the group or others may read or write it.
pub fn private(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: mode {:03o} lets others read a secret; make it readable by its owner \
                     only (chmod 600)",
                    path.display(),
                    mode & 0o777
                ),
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Accepts exactly the certificate whose fingerprint is pinned, on either side of the
/// handshake, and checks the handshake's signature with the key it holds.
#[derive(Debug)]
struct PinVerifier {
    peer: Fingerprint,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinVerifier {
    fn check(&self, end_entity: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        let shown = Fingerprint::of(end_entity);
        if shown == self.peer {
            Ok(())
        } else {
            let mismatch = format!(
                "the other end's certificate has fingerprint {shown}, but --peer-fingerprint \
                 pins {}",
                self.peer
            );
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(io::Error::other(
                    mismatch,
                )))),
            ))
        }
    }
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl ClientCertVerifier for PinVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity)
            .map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_reads_back_as_written_with_or_without_colons() {
        let identity = Identity::generate().expect("generate");
        let fingerprint = identity.fingerprint();
        let text = fingerprint.to_string();
        assert_eq!(text.len(), 64);
        assert_eq!(text.parse::<Fingerprint>(), Ok(fingerprint));
        let colons: Vec<String> = (0..32)
            .map(|i| text[2 * i..2 * i + 2].to_uppercase())
            .collect();
        assert_eq!(colons.join(":").parse::<Fingerprint>(), Ok(fingerprint));
        assert!("abc".parse::<Fingerprint>().is_err());
        assert!("zz".repeat(32).parse::<Fingerprint>().is_err());
        // from_str_radix would take a sign: "+f" is not two hexadecimal digits.
        assert!("+f".repeat(32).parse::<Fingerprint>().is_err());
        assert!(format!("{} ", &text[..63]).parse::<Fingerprint>().is_err());
        assert!(format!(":{text}").parse::<Fingerprint>().is_err());
    }

    #[test]
    fn an_identity_saved_loads_with_the_same_fingerprint_and_is_not_overwritten() {
        let dir = std::env::temp_dir().join(format!("gomux-tunnel-key-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let identity = Identity::generate().expect("generate");
        identity.save(&dir).expect("save");
        let loaded = Identity::load(&dir).expect("load");
        assert_eq!(loaded.fingerprint(), identity.fingerprint());
        assert!(Identity::generate().expect("generate").save(&dir).is_err());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.join(KEY_FILE))
                .expect("key")
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "the key is private: {mode:o}");
            // A key others can read is refused.
            let key = dir.join(KEY_FILE);
            fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("chmod");
            let refused = Identity::load(&dir).err().expect("refused");
            assert!(refused.to_string().contains("chmod 600"), "{refused}");
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn keygen_writes_nothing_through_a_planted_symbolic_link() {
        let dir = std::env::temp_dir().join(format!("gomux-tunnel-link-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("dir");
        let victim = dir.join("victim");
        fs::write(&victim, "precious").expect("victim");
        std::os::unix::fs::symlink(&victim, dir.join(CERT_FILE)).expect("symlink");
        assert!(Identity::generate().expect("generate").save(&dir).is_err());
        assert_eq!(fs::read_to_string(&victim).expect("read"), "precious");
        let _ = fs::remove_dir_all(&dir);
    }
}
