//! The connector every client to the workers uses: `http://` as plain TCP, `https://` with
//! rustls — the system's roots or a configured CA bundle, and a client certificate when one is
//! configured (workers behind mutual TLS).

use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::ClientConfig;

use super::{TlsError, UpstreamTls, load_certs, load_key, load_roots, provider};

/// What the workers' clients connect with.
pub type WorkerConnector = HttpsConnector<HttpConnector>;

/// The rustls client configuration for `settings`.
pub fn client_config(settings: &UpstreamTls) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let roots = match &settings.ca_file {
        Some(ca) => load_roots(ca)?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::debug!(
                    "no system root certificates; https:// workers need proxy.tls.ca_file"
                );
            }
            roots
        }
    };
    let builder = builder.with_root_certificates(roots);
    match (&settings.cert_file, &settings.key_file) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| {
                TlsError::Config(format!("{} and {}: {e}", cert.display(), key.display()))
            }),
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// A connector for `http://` and `https://` workers with TCP_NODELAY and `connect_timeout`.
pub fn connector(
    settings: &UpstreamTls,
    connect_timeout: Duration,
) -> Result<WorkerConnector, TlsError> {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http.enforce_http(false);
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(client_config(settings)?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}
