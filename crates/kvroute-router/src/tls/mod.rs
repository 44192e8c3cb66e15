//! TLS on both sides of the router, with rustls (and its `ring` provider): the front door
//! serves HTTPS from certificate files it reloads when they change (cert-manager rotates them
//! in place), optionally requiring client certificates; `https://` workers are reached with the
//! system's roots or a configured CA bundle, optionally presenting a client certificate.
//!
//! The settings are plain data built by `config` (one builder per section); this module loads
//! the files they name. Nothing here reads the clock or the environment but the files.

pub mod listener;
pub mod upstream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The front door's TLS (`[server.tls]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA bundle: when set, clients must present a certificate it signed.
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are checked for a change (a rotated certificate is served to new
    /// connections from the next check on; open connections keep theirs).
    pub reload_interval: Duration,
}

/// How `https://` workers are reached (`[proxy.tls]`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpstreamTls {
    /// PEM CA bundle trusted for workers; without it, the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain presented to workers (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Unreadable or not PEM of the expected kind.
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// rustls refused the combination (a key that does not match its certificate, …).
    #[error("{0}")]
    Config(String),
}

fn file_error(path: &Path, what: impl Into<String>) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        what: what.into(),
    }
}

/// The provider every TLS configuration here is built with (explicit, so that no other crate's
/// choice of process-wide default can change it).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no certificate"));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| file_error(path, format!("holds no usable private key: {e}")))
}

/// A root store of the certificates in a PEM bundle.
pub fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}
