//! Worker discovery: workers found at run time rather than listed in the config.
//!
//! Each source publishes the complete set of endpoints it wants as workers (a
//! [`reconcile::Desired`], over a `tokio::sync::watch` channel, so only the latest set counts),
//! or nothing while it cannot tell (an unreachable API server, a failing resolver): the last
//! known set stays, and nothing flaps. A [`runner`] per source turns each set into joins, drains
//! and leaves through [`crate::lifecycle::Lifecycle`], which owns every worker's life:
//!
//! - [`kubernetes`] (cargo feature `kubernetes`): pods watched by label selector; a pod is a
//!   worker while it is Running, Ready and not terminating;
//! - [`dns`]: every A/AAAA record of a name (a headless Service), resolved every few seconds,
//!   for operators without access to the Kubernetes API.
//!
//! Discovered workers are marked with their source; the admin API refuses to remove them
//! unless forced, since their source would bring them back.

pub mod dns;
#[cfg(feature = "kubernetes")]
pub mod inference_pool;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(feature = "kubernetes")]
pub mod pods;
pub mod reconcile;
pub mod runner;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::DiscoveryConfig;
use crate::lifecycle::{Lifecycle, Source};
use crate::metrics::Metrics;

pub use reconcile::Desired;

/// Starts a source and its runner for each configured source; they run until `stop`. Must be
/// called on a Tokio runtime.
pub fn spawn(
    config: &DiscoveryConfig,
    lifecycle: &Arc<Lifecycle>,
    metrics: &Metrics,
    probe_timeout: Duration,
    own_addrs: Vec<SocketAddr>,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let context = || runner::RunnerContext {
        lifecycle: Arc::clone(lifecycle),
        metrics: metrics.clone(),
        drain_timeout: config.drain_timeout,
        probe_timeout,
        own_addrs: own_addrs.clone(),
        probe_models: true,
        adopted: Vec::new(),
    };
    if let Some(dns) = &config.dns {
        let (tx, rx) = watch::channel(Desired::default());
        tasks.push(tokio::spawn(dns::run(
            dns.clone(),
            tx,
            metrics.clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(runner::run(
            Source::Dns,
            rx,
            context(),
            stop.clone(),
        )));
    }
    #[cfg(feature = "kubernetes")]
    if let Some(pool) = &config.inference_pool {
        let (tx, rx) = watch::channel(Desired::default());
        let base = config.kubernetes.clone().unwrap_or_else(pool_defaults);
        tasks.push(tokio::spawn(inference_pool::run(
            pool.clone(),
            base,
            tx,
            metrics.clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(runner::run(
            Source::Kubernetes,
            rx,
            context(),
            stop.clone(),
        )));
        return tasks;
    }
    #[cfg(feature = "kubernetes")]
    if let Some(k8s) = &config.kubernetes {
        let (tx, rx) = watch::channel(Desired::default());
        tasks.push(tokio::spawn(kubernetes::run(
            k8s.clone(),
            tx,
            metrics.clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(runner::run(
            Source::Kubernetes,
            rx,
            context(),
            stop.clone(),
        )));
    }
    tasks
}

/// Counts one `kind` of discovery event of `source`.
/// The pod settings of an `InferencePool` without `[discovery.kubernetes]`: the default port
/// names and annotations (the pool gives the selector and the HTTP port).
#[cfg(feature = "kubernetes")]
fn pool_defaults() -> crate::config::KubernetesDiscovery {
    use crate::config::{DEFAULT_ANNOTATION_PREFIX, PortRef};
    crate::config::KubernetesDiscovery {
        namespace: None,
        label_selector: String::new(),
        http_port: PortRef::Name("http".into()),
        kv_events_port: PortRef::Name("kv-events".into()),
        kv_replay_port: PortRef::Name("kv-replay".into()),
        annotation_prefix: DEFAULT_ANNOTATION_PREFIX.into(),
        data_parallel_size: 1,
    }
}

fn count(metrics: &Metrics, source: Source, kind: &str) {
    metrics
        .discovery
        .events
        .with_label_values(&[source.name(), kind])
        .inc();
}
