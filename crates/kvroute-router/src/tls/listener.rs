//! The front door's TLS: the current server configuration, rebuilt when its files change.
//!
//! cert-manager (and most certificate tooling) rotates a certificate by rewriting the files a
//! Secret volume shows, not by restarting anything. The files are read again every
//! `reload_interval`; when their bytes differ, a new configuration is built and used for every
//! connection accepted from then on (open connections keep the one they shook hands with). A
//! rotation that cannot be loaded — half-written files, a key that does not match — keeps the
//! running certificate and is logged and counted: serving the old one until it expires beats
//! serving nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{ServerTls, TlsError, load_certs, load_key, load_roots, provider};

/// The files' bytes a configuration was built from, to tell a rotation from no change.
#[derive(PartialEq, Eq)]
struct Loaded {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Loaded {
    fn read(settings: &ServerTls) -> std::io::Result<Loaded> {
        Ok(Loaded {
            cert: std::fs::read(&settings.cert_file)?,
            key: std::fs::read(&settings.key_file)?,
            client_ca: match &settings.client_ca_file {
                Some(p) => Some(std::fs::read(p)?),
                None => None,
            },
        })
    }
}

/// The front door's TLS state: the configuration new connections get, and reload counts.
pub struct TlsFront {
    settings: ServerTls,
    current: RwLock<(Arc<ServerConfig>, Loaded)>,
    reloads: AtomicU64,
    failed_reloads: AtomicU64,
}

impl std::fmt::Debug for TlsFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFront")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A server configuration from `settings`' files: HTTP/2 and HTTP/1.1 offered by ALPN, client
/// certificates required when a client CA is given.
pub fn server_config(settings: &ServerTls) -> Result<ServerConfig, TlsError> {
    let certs = load_certs(&settings.cert_file)?;
    let key = load_key(&settings.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &settings.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(load_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| TlsError::Config(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        TlsError::Config(format!(
            "{} and {}: {e}",
            settings.cert_file.display(),
            settings.key_file.display()
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

impl TlsFront {
    /// Loads the files once; a router whose certificate cannot be loaded does not start.
    pub fn load(settings: ServerTls) -> Result<Arc<TlsFront>, TlsError> {
        let loaded = Loaded::read(&settings).map_err(|e| TlsError::Config(e.to_string()))?;
        let config = Arc::new(server_config(&settings)?);
        Ok(Arc::new(TlsFront {
            settings,
            current: RwLock::new((config, loaded)),
            reloads: AtomicU64::new(0),
            failed_reloads: AtomicU64::new(0),
        }))
    }

    /// The acceptor for a connection accepted now.
    pub fn acceptor(&self) -> TlsAcceptor {
        let config = match self.current.read() {
            Ok(c) => Arc::clone(&c.0),
            Err(poisoned) => Arc::clone(&poisoned.into_inner().0),
        };
        TlsAcceptor::from(config)
    }

    /// Rotations applied and rotations refused (their files could not be used) so far.
    pub fn reload_counts(&self) -> (u64, u64) {
        (
            self.reloads.load(Ordering::Relaxed),
            self.failed_reloads.load(Ordering::Relaxed),
        )
    }

    /// Reads the files and, when they changed, builds and installs a new configuration.
    /// Returns whether a new one was installed.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let loaded = Loaded::read(&self.settings).map_err(|e| TlsError::Config(e.to_string()));
        let changed = match (&loaded, self.current.read()) {
            (Ok(l), Ok(c)) => *l != c.1,
            (Ok(_), Err(_)) => true,
            (Err(_), _) => true,
        };
        if !changed {
            return Ok(false);
        }
        let built = loaded.and_then(|l| Ok((Arc::new(server_config(&self.settings)?), l)));
        match built {
            Ok(next) => {
                match self.current.write() {
                    Ok(mut c) => *c = next,
                    Err(poisoned) => *poisoned.into_inner() = next,
                }
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) => {
                self.failed_reloads.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Checks the files every `reload_interval` until `stop`.
    pub fn spawn_reloader(
        self: &Arc<Self>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let front = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(front.settings.reload_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            // The same bad rotation is reported once, not at every check.
            let mut last_error = String::new();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match front.reload_if_changed() {
                    Ok(true) => {
                        last_error.clear();
                        tracing::info!(cert = %front.settings.cert_file.display(), "TLS certificate reloaded");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        let text = e.to_string();
                        if text != last_error {
                            tracing::warn!(error = %text, "TLS files changed but cannot be used; still serving the previous certificate");
                            last_error = text;
                        }
                    }
                }
            }
        })
    }
}
