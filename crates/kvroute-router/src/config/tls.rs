//! `[server.tls]` and `[proxy.tls]`: HTTPS at the front door and to `https://` workers. Only
//! the shape is checked here (which files go together, sane intervals); the files themselves
//! are loaded when the router starts, which refuses to start with files it cannot use.

use std::time::Duration;

use super::file::{FileServerTls, FileUpstreamTls};
use super::values::seconds;
use super::{ConfigError, invalid};
use crate::tls::{ServerTls, UpstreamTls};

/// How often the front door's certificate files are checked for a rotation by default.
pub const DEFAULT_TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// The front door's TLS, if `[server.tls]` is given.
pub(super) fn server_tls(file: Option<&FileServerTls>) -> Result<Option<ServerTls>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let (Some(cert_file), Some(key_file)) = (file.cert_file.clone(), file.key_file.clone()) else {
        return Err(invalid(
            "server.tls",
            "needs both cert_file and key_file (PEM files)",
        ));
    };
    Ok(Some(ServerTls {
        cert_file,
        key_file,
        client_ca_file: file.client_ca_file.clone(),
        reload_interval: seconds(
            "server.tls.reload_interval_s",
            file.reload_interval_s,
            DEFAULT_TLS_RELOAD_INTERVAL,
            0.01,
        )?,
    }))
}

/// How `https://` workers are reached (`[proxy.tls]`; system roots and no client certificate
/// when absent).
pub(super) fn upstream_tls(file: Option<&FileUpstreamTls>) -> Result<UpstreamTls, ConfigError> {
    let Some(file) = file else {
        return Ok(UpstreamTls::default());
    };
    if file.cert_file.is_some() != file.key_file.is_some() {
        return Err(invalid(
            "proxy.tls",
            "a client certificate needs both cert_file and key_file",
        ));
    }
    Ok(UpstreamTls {
        ca_file: file.ca_file.clone(),
        cert_file: file.cert_file.clone(),
        key_file: file.key_file.clone(),
    })
}
