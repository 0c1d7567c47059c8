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
use tokio::sync::mpsc;
pub use tokio_rustls;
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

/// Bounds of a server's connections. Every stage of a connection is bounded (the TLS
/// handshake, then the first request), each source address holds at most a share of the
/// connections, and a client without a certificate a smaller one, so that silent or greedy
/// clients of one address cannot keep the others out (stated's first-bytes guard and
/// per-peer limits, over TCP).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once, in every stage; more are accepted and closed at once (not
    /// left waiting in the kernel's backlog).
    pub max_connections: usize,
    /// Connections one source address (an IPv4 address, an IPv6 /64) may hold, in every stage.
    pub per_source: usize,
    /// Of those, connections without a client certificate (the maintenance API, trustd's
    /// joining nodes).
    pub anonymous_per_source: usize,
    /// Of those, connections still in their TLS handshake.
    pub handshakes_per_source: usize,
    /// Time a client has to complete its handshake.
    pub handshake_timeout: Duration,
    /// Time a client has, after its handshake, to send its first request (the HTTP/2 preface
    /// and a call): a connection that sends nothing holds no slot for long.
    pub first_request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            per_source: 16,
            anonymous_per_source: 4,
            handshakes_per_source: 4,
            handshake_timeout: Duration::from_secs(5),
            first_request_timeout: Duration::from_secs(10),
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
    /// Set by [`FirstRequestLayer`] once a request came on the connection.
    requested: Arc<std::sync::atomic::AtomicBool>,
}

impl ConnectInfo {
    /// Whom the connection counts as for per-client shares: the client certificate's
    /// fingerprint (sha256 of the leaf), or without one its source ([`source_of`]).
    pub fn client_key(&self) -> String {
        match self.peer_certificates.first() {
            Some(leaf) => {
                let digest = ring::digest::digest(&ring::digest::SHA256, leaf.as_ref());
                let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
                format!("certificate {}", &hex[..16])
            }
            None => format!("address {}", source_of(self.remote.ip())),
        }
    }
}

/// The source a connection counts against: the IPv4 address, or the /64 of an IPv6 one (a
/// host is given a whole /64; one address of it per connection would evade any per-address
/// limit). An IPv4-mapped IPv6 address counts as the IPv4 one.
pub fn source_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// The counts behind [`Limits`]: per source, in which stage its connections are.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    sources: std::collections::HashMap<std::net::IpAddr, SourceCount>,
    refused: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct SourceCount {
    open: usize,
    handshaking: usize,
    anonymous: usize,
}

/// The connection slots of one server.
#[derive(Debug)]
struct Gate {
    limits: Limits,
    counts: std::sync::Mutex<Counts>,
}

/// One connection's place in its [`Gate`]: released when the connection closes.
#[derive(Debug)]
struct Slot {
    gate: Arc<Gate>,
    source: std::net::IpAddr,
    handshaking: bool,
    anonymous: bool,
}

impl Gate {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection from `ip`, in its handshake; `None` past a limit.
    fn admit(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<Slot> {
        let l = &self.limits;
        let source = source_of(ip);
        let mut c = self.counts();
        let s = c.sources.get(&source).copied().unwrap_or_default();
        let why = if c.total >= l.max_connections {
            Some("the server holds its limit of connections")
        } else if s.open >= l.per_source {
            Some("the source holds its limit of connections")
        } else if s.handshaking >= l.handshakes_per_source {
            Some("the source holds its limit of connections in their handshake")
        } else {
            None
        };
        if let Some(why) = why {
            c.refused += 1;
            // Once, then every 1000th: a flood of refusals must not flood the log.
            if c.refused % 1000 == 1 {
                tracing::warn!(%source, open = s.open, total = c.total, refused = c.refused, "connection refused: {why}");
            }
            return None;
        }
        c.total += 1;
        let e = c.sources.entry(source).or_default();
        e.open += 1;
        e.handshaking += 1;
        drop(c);
        Some(Slot {
            gate: self.clone(),
            source,
            handshaking: true,
            anonymous: false,
        })
    }
}

impl Slot {
    /// The handshake is done: the connection counts as established, among the source's
    /// anonymous ones without a client certificate. `false` past the anonymous share.
    fn established(&mut self, anonymous: bool) -> bool {
        let limit = self.gate.limits.anonymous_per_source;
        let mut c = self.gate.counts();
        let Some(s) = c.sources.get_mut(&self.source) else {
            return false;
        };
        s.handshaking = s.handshaking.saturating_sub(1);
        self.handshaking = false;
        if anonymous {
            if s.anonymous >= limit {
                let source = self.source;
                c.refused += 1;
                if c.refused % 1000 == 1 {
                    tracing::warn!(%source, "connection refused: the source holds its limit of connections without a client certificate");
                }
                return false;
            }
            s.anonymous += 1;
            self.anonymous = true;
        }
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.gate.counts();
        c.total = c.total.saturating_sub(1);
        let gone = match c.sources.get_mut(&self.source) {
            Some(s) => {
                s.open = s.open.saturating_sub(1);
                if self.handshaking {
                    s.handshaking = s.handshaking.saturating_sub(1);
                }
                if self.anonymous {
                    s.anonymous = s.anonymous.saturating_sub(1);
                }
                s.open == 0
            }
            None => false,
        };
        if gone {
            c.sources.remove(&self.source);
        }
    }
}

/// One accepted TLS connection; holds its slot of [`Limits`] until it closes. Until a first
/// request came ([`FirstRequestLayer`]), a read fails once [`Limits::first_request_timeout`]
/// has passed, which closes the connection.
pub struct TlsConnection {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: ConnectInfo,
    first_request: Option<Pin<Box<tokio::time::Sleep>>>,
    _slot: Slot,
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some(deadline) = this.first_request.as_mut() {
            if this
                .info
                .requested
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                this.first_request = None;
            } else if r.is_pending() && std::future::Future::poll(deadline.as_mut(), cx).is_ready()
            {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the client made no request after its handshake",
                )));
            }
        }
        r
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

/// The layer that tells a connection a request came on it (every server of [`incoming`]
/// connections needs it outermost: without it every connection closes after
/// [`Limits::first_request_timeout`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstRequestLayer;

impl<S> tower::Layer<S> for FirstRequestLayer {
    type Service = FirstRequest<S>;

    fn layer(&self, inner: S) -> FirstRequest<S> {
        FirstRequest { inner }
    }
}

/// See [`FirstRequestLayer`].
#[derive(Clone, Debug)]
pub struct FirstRequest<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for FirstRequest<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let Some(i) = req.extensions().get::<ConnectInfo>() {
            i.requested
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.call(req)
    }
}

/// The TLS connections of `listener`, for tonic's `serve_with_incoming` (with
/// [`FirstRequestLayer`]). Every connection is accepted at once (none waits in the backlog);
/// one past a limit of [`Limits`] is closed at once. Handshakes run concurrently, each within
/// [`Limits::handshake_timeout`]; a failed one is logged at debug level and dropped (a TLS
/// 1.2 client, a client without an accepted certificate, a port scan).
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limits: Limits,
) -> ReceiverStream<std::io::Result<TlsConnection>> {
    let (tx, rx) = mpsc::channel(16);
    let gate = Arc::new(Gate {
        limits,
        counts: std::sync::Mutex::default(),
    });
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of fds, or a connection reset before accept: keep serving (a short
                    // pause so that EMFILE does not spin).
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let Some(mut slot) = gate.admit(remote.ip()) else {
                drop(tcp);
                continue;
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
                        if !slot.established(peer_certificates.is_empty()) {
                            return;
                        }
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
                                requested: Arc::default(),
                            },
                            first_request: Some(Box::pin(tokio::time::sleep(
                                limits.first_request_timeout,
                            ))),
                            _slot: slot,
                        };
                        let _ = conn_tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%remote, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%remote, "TLS handshake timed out"),
                }
            });
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
