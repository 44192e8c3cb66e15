//! TLS for the tests: a throwaway PKI made with `rcgen` (a CA, server and client certificates
//! written as PEM files), an HTTPS client that trusts that CA (optionally presenting a client
//! certificate), and an HTTPS test worker.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and its key, as PEM text and as files.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl Issued {
    /// The certificate's DER bytes (to compare with what a peer presented).
    pub fn der(&self) -> Vec<u8> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec()
    }
}

/// A test certificate authority; what it issues is written under its directory.
pub struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    pub cert_pem: String,
    pub cert_file: PathBuf,
    dir: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let cert_file = dir.join(format!("{name}.crt"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        TestCa {
            params,
            key,
            cert_pem: cert.pem(),
            cert_file,
            dir: dir.to_owned(),
        }
    }

    /// A certificate for `localhost` and 127.0.0.1 named `name` (server and client use),
    /// written to `<name>.crt` / `<name>.key`.
    pub fn issue(&self, name: &str) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let issued = Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_file: self.dir.join(format!("{name}.crt")),
            key_file: self.dir.join(format!("{name}.key")),
        };
        std::fs::write(&issued.cert_file, &issued.cert_pem).unwrap();
        std::fs::write(&issued.key_file, &issued.key_pem).unwrap();
        issued
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).unwrap())
            .unwrap();
        roots
    }

    /// A client configuration trusting this CA, presenting `client` when given.
    pub fn client_config(&self, client: Option<&Issued>) -> rustls::ClientConfig {
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.roots());
        match client {
            None => b.with_no_client_auth(),
            Some(c) => b
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
        }
    }
}

/// One HTTPS request on a fresh connection (so each sees the certificate served now): the
/// status and body, or the error that stopped it (handshake refused, …).
pub async fn https_request(
    config: rustls::ClientConfig,
    method: &str,
    url: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(https);
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The leaf certificate a TLS server at `addr` presents now (DER).
pub async fn presented_certificate(config: rustls::ClientConfig, addr: SocketAddr) -> Vec<u8> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec()
}

/// Serves `app` over HTTPS with `cert`, requiring a client certificate signed by `client_ca`
/// when given. The task ends when the returned handle is aborted.
pub async fn https_worker(
    app: Router,
    cert: &Issued,
    client_ca: Option<&TestCa>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let b = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let b = match client_ca {
        None => b.with_no_client_auth(),
        Some(ca) => b.with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca.roots()),
                provider(),
            )
            .build()
            .unwrap(),
        ),
    };
    let config = b
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, task)
}
