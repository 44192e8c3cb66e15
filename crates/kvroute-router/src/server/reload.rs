//! Live reload of the configuration (SIGHUP, and a changed file when
//! `server.config_reload_interval_s` is set): the file is read and validated again, and what
//! can change under running traffic is applied without dropping a connection or a request.
//!
//! A reload is all or nothing: the new file is validated completely (the same checks as at
//! start) before anything is applied, and a file that cannot be read or is invalid is refused
//! with a log line, counted in `kvroute_config_reloads_total{result="refused"}`, and the
//! running configuration is kept. Reloads are serialised. Each reloadable part is replaced in
//! one step that every request reads whole (the keys, the limits, the upstream timeouts, the
//! body limits are each one lock-free snapshot), and a request in flight keeps what it was
//! admitted with: its tenant, its slot (a lowered limit retires slots as their requests end),
//! its timeouts.
//!
//! A reload that would remove every tenant (authentication off) or every static worker is
//! refused unless the file says so (`tenants = []`, `workers = []`), an empty file is never
//! applied, and what an applied reload opens (no key needed, new tenants or keys, the admin
//! API opened) is logged at WARN (see `reload_guard`).
//!
//! Reloadable: `[[tenants]]` and `[admin]` (keys), `[limits]`, `[priority]` `isolate` and
//! `isolate_window_s` (placement isolation), `[kv_aware]` (the policy's
//! weights and prior), `[proxy]` timeouts, retries and retry budget, `[server]`
//! `max_body_bytes` and `body_read_timeout_s`, and `[[workers]]`, whose changes go through the
//! worker lifecycle with the same planning discovery uses ([`crate::discovery::reconcile`]): a
//! removed worker drains and leaves once idle (or after `discovery.drain_timeout_s`), a new one
//! joins, a changed one drains and rejoins. Every other key needs a restart: a changed one is
//! named in a warning and `kvroute_config_restart_pending` is 1 until then. Flags and
//! `KVROUTE_*` variables are those the process started with, and still override the file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{AppState, BodyLimits, reload_guard};
use crate::config::{Config, ConfigError, Loaded, ServeArgs};
use crate::discovery::Desired;
use crate::discovery::runner::{self, RunnerContext};
use crate::lifecycle::Source;

/// Applies reloaded configurations to a running router.
pub struct Reloader {
    args: ServeArgs,
    state: Arc<AppState>,
    /// The configuration the router started with: keys that need a restart are compared
    /// with it.
    started: Config,
    /// The configuration applied last: what a new file would remove or open is judged
    /// against it (see `reload_guard`).
    running: Mutex<Config>,
    /// The static workers wanted now, for their runner; the lock serialises reloads.
    workers: Mutex<watch::Sender<Desired>>,
    /// SHA-256 of the file as last read by a reload, applied or refused: the change watch
    /// reloads a file once per change, not an invalid one at every check.
    last_read: Mutex<String>,
    /// SHA-256 of new bytes the change watch has seen once: they are reloaded only if the
    /// next check reads the same, so a file caught mid-write (`>` truncates first, then
    /// writes) is never applied half-written — a truncated file can be valid and drop keys.
    settling: Mutex<Option<String>>,
}

/// What a reload did.
#[derive(Debug)]
pub enum Outcome {
    /// Applied; the keys named changed but need a restart (still running with their old value).
    Applied {
        /// SHA-256 of the file applied.
        sha256: String,
        /// Changed keys that only a restart applies.
        restart_needed: Vec<&'static str>,
    },
    /// Refused: the running configuration is kept.
    Refused(ConfigError),
}

impl Reloader {
    /// A reloader for the router with `state`, started from `loaded` (with `args`, its flags
    /// and variables); starts the runner of the static workers, which lives until `stop`.
    /// Must be called on a Tokio runtime. The caller records `loaded`'s digest before serving
    /// (`server::run`), so no scrape sees the router without it.
    pub fn start(
        state: Arc<AppState>,
        loaded: &Loaded,
        args: ServeArgs,
        stop: &CancellationToken,
    ) -> Arc<Reloader> {
        let config = &loaded.config;
        let (tx, rx) = watch::channel(desired(config, 0));
        let context = RunnerContext {
            lifecycle: Arc::clone(&state.lifecycle),
            metrics: crate::metrics::Metrics::clone(&state.metrics),
            drain_timeout: config.discovery.drain_timeout,
            probe_timeout: config.health.timeout,
            own_addrs: state.own_addrs(),
            probe_models: false,
            adopted: config.workers.clone(),
        };
        tokio::spawn(runner::run(Source::Config, rx, context, stop.clone()));
        Arc::new(Reloader {
            args,
            state,
            started: config.clone(),
            running: Mutex::new(config.clone()),
            workers: Mutex::new(tx),
            last_read: Mutex::new(loaded.sha256.clone()),
            settling: Mutex::new(None),
        })
    }

    /// Reloads when the file's bytes differ from those the last reload read and have read
    /// the same at two checks in a row (the change watch, `server.config_reload_interval_s`);
    /// `None` when they do not, or it cannot be read now (a ConfigMap update swaps a symlink:
    /// the next check sees the new file).
    pub fn reload_if_changed(&self) -> Option<Outcome> {
        let path = self.args.config.as_ref()?;
        let text = std::fs::read(path).ok()?;
        let sha256 = hex_sha256(&text);
        let last_read = self
            .last_read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut settling = self.settling.lock().unwrap_or_else(|e| e.into_inner());
        if !settled(&last_read, &mut settling, sha256) {
            return None;
        }
        drop(settling);
        tracing::info!(path = %path.display(), "the config file changed: reloading it");
        Some(self.reload())
    }

    /// Reads the file again and applies it, or refuses it; logs and counts either way.
    pub fn reload(&self) -> Outcome {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut empty = false;
        if let Some(text) = self
            .args
            .config
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
        {
            *self.last_read.lock().unwrap_or_else(|e| e.into_inner()) = hex_sha256(&text);
            empty = text.iter().all(u8::is_ascii_whitespace);
        }
        let metrics = &self.state.metrics.config;
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let checked = Config::load_hashed(&self.args).and_then(|l| {
            match reload_guard::refusal(&running, &l.config, empty) {
                Some(e) => Err(e),
                None => Ok(l),
            }
        });
        let loaded = match checked {
            Ok(l) => l,
            Err(e) => {
                metrics.reloads.with_label_values(&["refused"]).inc();
                tracing::error!(error = %format!("{e:#}"), "configuration reload refused; the running configuration is kept");
                return Outcome::Refused(e);
            }
        };
        let new = &loaded.config;
        new.warn_builtin_tokenizers();
        for what in reload_guard::opened(&running, new) {
            tracing::warn!("configuration reload: {what}");
        }
        let state = &self.state;
        state.keys.replace(&new.tenants, new.admin);
        state.admission.update(new.limits, &new.tenants);
        state.admission.set_isolation(new.isolation);
        state.upstream.retune(&new.proxy);
        state.body_limits.store(Arc::new(BodyLimits::of(new)));
        state.set_sessions(&new.sessions);
        state.policy.reconfigure(&new.policy_settings());
        let relists = workers.borrow().relists + 1;
        workers.send_replace(desired(new, relists));
        let restart_needed = restart_needed(&self.started, new);
        *running = new.clone();
        // The digest first, the count last. A scrape still may see the count before the digest:
        // the registry gathers metric families in no fixed order, one at a time.
        metrics.loaded(&loaded.sha256);
        metrics
            .restart_pending
            .set(i64::from(!restart_needed.is_empty()));
        metrics.reloads.with_label_values(&["applied"]).inc();
        tracing::info!(
            sha256 = %loaded.sha256,
            tenants = new.tenants.len(),
            workers = new.workers.len(),
            "configuration reloaded"
        );
        if !restart_needed.is_empty() {
            tracing::warn!(
                keys = %restart_needed.join(", "),
                "these changed keys apply only at a restart; their old values are still in use"
            );
        }
        Outcome::Applied {
            sha256: loaded.sha256,
            restart_needed,
        }
    }
}

/// The SIGHUP signals of the process, from now on (`None` where there are none, or the
/// handler cannot be installed: then SIGHUP keeps its default action).
pub fn hangups() -> Option<tokio::signal::unix::Signal> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP; configuration reloads are off");
            None
        }
    }
}

/// Reloads on every SIGHUP until `stop`.
pub async fn on_hangup(
    hangups: Option<tokio::signal::unix::Signal>,
    reloader: Arc<Reloader>,
    stop: CancellationToken,
) {
    let Some(mut hangups) = hangups else {
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        tracing::info!("SIGHUP: reloading the configuration");
        let reloader = Arc::clone(&reloader);
        // Reading and validating the file is blocking work.
        let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
    }
}

/// Whether the file whose bytes hash to `sha256` is to be reloaded now: it differs from
/// `last_read` and read the same at the previous check (`settling`, updated here).
fn settled(last_read: &str, settling: &mut Option<String>, sha256: String) -> bool {
    if last_read == sha256 {
        *settling = None;
        return false;
    }
    if settling.as_deref() == Some(sha256.as_str()) {
        *settling = None;
        return true;
    }
    *settling = Some(sha256);
    false
}

/// Checks the config file for a change every `interval` until `stop`.
pub async fn on_change(
    interval: std::time::Duration,
    reloader: Arc<Reloader>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let reloader = Arc::clone(&reloader);
        let _ = tokio::task::spawn_blocking(move || reloader.reload_if_changed()).await;
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The static workers of `config` as a desired set.
fn desired(config: &Config, relists: u64) -> Desired {
    Desired {
        endpoints: config
            .workers
            .iter()
            .map(|w| (w.id.clone(), w.clone()))
            .collect::<BTreeMap<_, _>>(),
        relists,
    }
}

/// The keys that need a restart and differ between `running` and `new`.
fn restart_needed(running: &Config, new: &Config) -> Vec<&'static str> {
    // Compared by their debug form: every part of `Config` has one, not every part has
    // equality, and a difference in either is a difference in value.
    fn differs<T: std::fmt::Debug>(a: &T, b: &T) -> bool {
        format!("{a:?}") != format!("{b:?}")
    }
    let (a, b) = (running, new);
    let proxy_client = |c: &Config| {
        (
            c.proxy.connect_timeout,
            c.proxy.pool_max_idle_per_host,
            c.proxy.tls.clone(),
        )
    };
    [
        ("server.listen", differs(&a.listen, &b.listen)),
        (
            "server.config_reload_interval_s",
            differs(&a.config_reload_interval, &b.config_reload_interval),
        ),
        (
            "server.metrics_listen",
            differs(&a.metrics_listen, &b.metrics_listen),
        ),
        (
            "server.shutdown_grace_s",
            differs(&a.shutdown_grace, &b.shutdown_grace),
        ),
        (
            "server.header_read_timeout_s",
            differs(&a.header_read_timeout, &b.header_read_timeout),
        ),
        (
            "server connections (idle_timeout_s, max_connections, http2_*)",
            differs(&a.connections, &b.connections),
        ),
        ("server.tls", differs(&a.tls, &b.tls)),
        ("policy", differs(&a.policy, &b.policy)),
        ("priority", differs(&a.priorities, &b.priorities)),
        ("seed", differs(&a.seed, &b.seed)),
        ("log_format", differs(&a.log_format, &b.log_format)),
        (
            "proxy.connect_timeout_s, pool_max_idle_per_host, [proxy.tls]",
            differs(&proxy_client(a), &proxy_client(b)),
        ),
        ("proxy.breaker_*", differs(&a.breaker, &b.breaker)),
        ("[health]", differs(&a.health, &b.health)),
        ("[[models]]", differs(&a.models, &b.models)),
        (
            "[tokens]",
            differs(
                &(a.default_block_size, a.token_cache_bytes),
                &(b.default_block_size, b.token_cache_bytes),
            ),
        ),
        ("[index]", differs(&a.index, &b.index)),
        (
            "[kv_events]",
            differs(
                &(a.replay_limits, a.engines_per_intake),
                &(b.replay_limits, b.engines_per_intake),
            ),
        ),
        ("[discovery]", differs(&a.discovery, &b.discovery)),
        ("[tracing]", differs(&a.tracing, &b.tracing)),
        ("[recording]", differs(&a.recording, &b.recording)),
        ("[endpoints]", differs(&a.endpoints, &b.endpoints)),
    ]
    .into_iter()
    .filter_map(|(key, changed)| changed.then_some(key))
    .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(text: &str) -> Config {
        Config::from_toml(text, Path::new("test")).unwrap()
    }

    #[test]
    fn a_change_is_reloaded_once_it_reads_the_same_twice() {
        let mut settling = None;
        let s = |x: &str| x.to_owned();
        assert!(!settled("a", &mut settling, s("a")), "unchanged");
        // Caught mid-write: a truncated file, then the whole one.
        assert!(!settled("a", &mut settling, s("half")));
        assert!(
            !settled("a", &mut settling, s("b")),
            "changed again: not settled"
        );
        assert!(settled("a", &mut settling, s("b")), "the same twice");
        assert_eq!(settling, None);
        // Back to what was last read before settling: nothing to do, and forgotten.
        assert!(!settled("a", &mut settling, s("c")));
        assert!(!settled("a", &mut settling, s("a")));
        assert!(
            !settled("a", &mut settling, s("c")),
            "seen once again, after a reset"
        );
    }

    #[test]
    fn only_keys_that_need_a_restart_are_reported() {
        let running = config("policy = \"kv_aware\"\n[limits]\nmax_concurrency = 8\n");
        let reloadable = config(
            "policy = \"kv_aware\"\n[limits]\nmax_concurrency = 2\n[kv_aware]\ndecode_weight = 0.5\n\
             [proxy]\nfirst_byte_timeout_s = 5\nretries = 2\n[server]\nbody_read_timeout_s = 3\n\
             [priority]\nisolate = true\nisolate_window_s = 1\n",
        );
        assert!(reloadable.isolation.enabled);
        assert!(restart_needed(&running, &reloadable).is_empty());
        let not = config(
            "policy = \"round_robin\"\n[server]\nlisten = \"127.0.0.1:9\"\n[proxy]\nconnect_timeout_s = 9\n",
        );
        assert_eq!(
            restart_needed(&running, &not),
            [
                "server.listen",
                "policy",
                "proxy.connect_timeout_s, pool_max_idle_per_host, [proxy.tls]"
            ]
        );
    }
}
