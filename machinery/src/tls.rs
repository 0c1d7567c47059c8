//! TLS of the Talos API (trustd, apid and their clients), over rustls with ring: TLS 1.3 only
//! (upstream accepts 1.2; talos-rs does not, on purpose), ALPN `h2`, no session tickets, the
//! server's certificate swapped in place when secretsd reissues it (new handshakes get the new
//! one, open connections keep theirs), and tonic served on, or connected over, tokio-rustls.
//!
//! A server takes connections through [`incoming`]: a bounded number at once, each with a
//! handshake deadline, so that a client that connects and sends nothing holds no slot for long.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

pub use rustls;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::UnixTime;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;

use crate::secrets::x509::{self, Certificate, PrivateKey};

/// Why a TLS configuration cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key does not parse, or they do not belong together.
    #[error("{0}")]
    Credentials(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// A socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What both verifiers answer for TLS 1.2: the servers and clients speak TLS 1.3 only.
fn no_tls12() -> Result<HandshakeSignatureValid, rustls::Error> {
    Err(rustls::Error::PeerIncompatible(
        rustls::PeerIncompatible::Tls13RequiredForQuic,
    ))
}

/// The peer's proof that it holds its certificate's key, checked with ring's algorithms.
fn verify_tls13(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    rustls::crypto::verify_tls13_signature(
        message,
        cert,
        dss,
        &provider().signature_verification_algorithms,
    )
}

fn schemes() -> Vec<SignatureScheme> {
    provider()
        .signature_verification_algorithms
        .supported_schemes()
}

fn der_chain(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = x509::certificates(pem.as_bytes())
        .map_err(|e| TlsError::Credentials(format!("certificate: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Credentials("no certificate in the PEM".into()));
    }
    Ok(certs
        .iter()
        .map(|c| CertificateDer::from(c.der().to_vec()))
        .collect())
}

fn der_key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let key = PrivateKey::from_pem(pem.as_bytes())
        .map_err(|e| TlsError::Credentials(format!("key: {e}")))?;
    Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        key.pkcs8_der().to_vec(),
    )))
}

/// A certificate (chain) and its key, ready to serve or present.
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<CertifiedKey, TlsError> {
    let chain = der_chain(cert_pem)?;
    let key = provider()
        .key_provider
        .load_private_key(der_key(key_pem)?)
        .map_err(|e| TlsError::Credentials(format!("key: {e}")))?;
    let ck = CertifiedKey::new(chain, key);
    ck.keys_match()
        .map_err(|e| TlsError::Credentials(format!("the key is not the certificate's: {e}")))?;
    Ok(ck)
}

/// The certificate a server presents, replaceable while it runs. Until one is set, handshakes
/// fail (the server has nothing to prove who it is with).
#[derive(Clone, Debug, Default)]
pub struct ServerCertificate(Arc<RwLock<Option<Arc<CertifiedKey>>>>);

impl ServerCertificate {
    /// Presents `ck` from the next handshake on.
    pub fn set(&self, ck: CertifiedKey) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(ck));
    }

    /// Presents nothing any more.
    pub fn clear(&self) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether a certificate is set.
    pub fn is_set(&self) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl ResolvesServerCert for ServerCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn roots(cas: &[Certificate]) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for ca in cas {
        store
            .add(CertificateDer::from(ca.der().to_vec()))
            .map_err(|e| TlsError::Credentials(format!("CA certificate: {e}")))?;
    }
    Ok(store)
}

/// The CAs whose client certificates a server accepts, replaceable while it runs (apid's
/// accepted OS CAs change when secretsd republishes them). Until some are set, every client is
/// refused. On top of the chain, the client's certificate must be for client authentication
/// only: its extended key usage must say client authentication and nothing else (upstream's
/// `verifyExtKeyUsage`), so that a node's server certificate cannot log in.
#[derive(Clone, Debug, Default)]
pub struct ClientCas(
    Arc<RwLock<Option<Arc<dyn ClientCertVerifier>>>>,
    Arc<std::sync::atomic::AtomicBool>,
);

impl ClientCas {
    /// Open (a node in maintenance): from the next handshake on, no client certificate is
    /// asked for, so none is verified; closed: a certificate of the CAs is required again.
    /// What an open server lets an unauthenticated caller do is the caller's business (apid's
    /// authorization layer reads [`ClientCas::is_open`]).
    pub fn set_open(&self, open: bool) {
        self.1.store(open, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the server is open ([`ClientCas::set_open`]).
    pub fn is_open(&self) -> bool {
        self.1.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Accepts clients of `cas` from the next handshake on.
    ///
    /// # Errors
    ///
    /// [`TlsError`] when there is no CA or one cannot be used; the previous CAs stay.
    pub fn set(&self, cas: &[Certificate]) -> Result<(), TlsError> {
        if cas.is_empty() {
            return Err(TlsError::Credentials("no client CA".into()));
        }
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(cas)?), provider())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(verifier);
        Ok(())
    }

    /// Accepts no client any more.
    pub fn clear(&self) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn current(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl ClientCertVerifier for ClientCas {
    fn offer_client_auth(&self) -> bool {
        !self.is_open()
    }

    fn client_auth_mandatory(&self) -> bool {
        !self.is_open()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The hints would have to outlive a swap of the CAs; clients send their certificate
        // without them (Go's and rustls's do).
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verifier = self
            .current()
            .ok_or_else(|| rustls::Error::General("no client CA is configured yet".into()))?;
        let verified = verifier.verify_client_cert(end_entity, intermediates, now)?;
        let info = Certificate::from_der(end_entity.as_ref())
            .and_then(|c| c.info())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if !info.client_auth || info.server_auth || info.other_usages {
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::InvalidPurpose,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        no_tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        schemes()
    }
}

/// A TLS 1.3 server configuration presenting `cert`; with `client_cas`, every client must
/// present a client certificate that chains to one of them (apid), else none is asked
/// (trustd).
pub fn server_config(
    cert: ServerCertificate,
    client_cas: Option<ClientCas>,
) -> Result<ServerConfig, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_cas {
        Some(cas) => builder.with_client_cert_verifier(Arc::new(cas)),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(cert));
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// A TLS 1.3 client configuration trusting only `cas` (never the system's roots), presenting
/// `identity` (certificate PEM, key PEM) when given.
pub fn client_config(
    cas: &[Certificate],
    identity: Option<(&str, &str)>,
) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots(cas)?);
    let mut config = match identity {
        Some((crt, key)) => builder
            .with_client_auth_cert(der_chain(crt)?, der_key(key)?)
            .map_err(|e| TlsError::Credentials(e.to_string()))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A TLS 1.3 client configuration for a server whose certificate no CA of ours signed (a node
/// in maintenance, with a self-signed one): with `pins`, the server's leaf must have one of
/// those fingerprints ([`Certificate::fingerprint`], upstream's `--cert-fingerprint`); without,
/// any certificate is taken (trust on first use, as upstream's `--insecure`). The server must
/// still prove it holds the certificate's key. No client certificate is presented.
pub fn pinned_client_config(pins: &[String]) -> Result<ClientConfig, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned(pins.to_vec())))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// See [`pinned_client_config`].
#[derive(Debug)]
struct Pinned(Vec<String>);

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if self.0.is_empty() {
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        let seen = Certificate::from_der(end_entity.as_ref())
            .and_then(|c| c.fingerprint())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if self.0.contains(&seen) {
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        Err(rustls::Error::General(format!(
            "the server's certificate fingerprint is {seen}, not {}",
            self.0.join(" nor ")
        )))
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        no_tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        schemes()
    }
}

/// Bounds of a server's connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time a client has to complete its handshake.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// What a handler learns about the connection of a request
/// (`request.extensions().get::<ConnectInfo>()`).
#[derive(Clone, Debug)]
pub struct ConnectInfo {
    /// The client's address.
    pub remote: SocketAddr,
    /// The certificates the client presented (verified by then), leaf first. Shared: tonic
    /// hands every request of the connection its own copy of this.
    pub peer_certificates: Arc<[CertificateDer<'static>]>,
    /// The Organization values (roles) of the client's leaf certificate, read once at the
    /// handshake rather than on every request; `Err` says why it does not parse; `None`
    /// without a client certificate.
    pub peer_organizations: Option<Arc<Result<Vec<String>, String>>>,
}

/// One accepted TLS connection; holds its slot of [`Limits::max_connections`].
pub struct TlsConnection {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: ConnectInfo,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for TlsConnection {
    type ConnectInfo = ConnectInfo;

    fn connect_info(&self) -> ConnectInfo {
        self.info.clone()
    }
}

/// The TLS connections of `listener`, for tonic's `serve_with_incoming`. Handshakes run
/// concurrently, each within [`Limits::handshake_timeout`]; a failed one is logged at debug
/// level and dropped (a TLS 1.2 client, a client without an accepted certificate, a port scan).
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limits: Limits,
) -> ReceiverStream<std::io::Result<TlsConnection>> {
    let (tx, rx) = mpsc::channel(16);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (tcp, remote) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let conn_tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let peer_certificates: Arc<[CertificateDer<'static>]> = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                            .unwrap_or_default();
                        let peer_organizations = peer_certificates.first().map(|leaf| {
                            Arc::new(
                                crate::secrets::x509::Certificate::from_der(leaf.as_ref())
                                    .and_then(|c| c.info())
                                    .map(|i| i.organizations)
                                    .map_err(|e| e.to_string()),
                            )
                        });
                        let conn = TlsConnection {
                            stream,
                            info: ConnectInfo {
                                remote,
                                peer_certificates,
                                peer_organizations,
                            },
                            _slot: slot,
                        };
                        let _ = conn_tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// A lazily connected gRPC channel to `addr` over TLS, verifying the server's certificate
/// for `server_name` (a DNS name or an IP address) with `config`.
pub fn channel(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
) -> Result<tonic::transport::Channel, TlsError> {
    channel_via(addr, server_name, config, connect_timeout, |addr| {
        Box::pin(TcpStream::connect(addr))
    })
}

/// What opens a channel's TCP connections ([`channel_via`]).
pub type Dial = Pin<Box<dyn std::future::Future<Output = std::io::Result<TcpStream>> + Send>>;

/// [`channel`] with the TCP connections made by `dial` (from another network namespace, say).
pub fn channel_via(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
    dial: impl Fn(SocketAddr) -> Dial + Clone + Send + 'static,
) -> Result<tonic::transport::Channel, TlsError> {
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|_| TlsError::Config(format!("{server_name:?} is not a server name")))?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| TlsError::Config(e.to_string()))?
        .connect_timeout(connect_timeout);
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let connector = connector.clone();
            let name = name.clone();
            let tcp = dial(addr);
            async move {
                let tcp = tokio::time::timeout(connect_timeout, tcp)
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
                    })??;
                let _ = tcp.set_nodelay(true);
                let tls = tokio::time::timeout(connect_timeout, connector.connect(name, tcp))
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
                    })??;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        })),
    )
}
