//! Kubernetes discovery through an `InferencePool` (`inference.networking.k8s.io/v1`, the
//! Gateway API Inference Extension's pool of model servers): its `selector.matchLabels` says
//! which pods are workers and its `targetPorts` where they listen, one port per data-parallel
//! rank (vLLM's external load balancing: rank N serves on the first port plus N, so the ports
//! must be consecutive). The pool is watched; each version of its spec runs the pod watch of
//! [`super::kubernetes`] with that selector and those ports, so a changed pool replaces the
//! pod watch and the workers follow through the same reconciler. The KV-event ports, the
//! annotations and the roles are read from the pods as `[discovery.kubernetes]` says.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Desired, count};
use crate::config::{InferencePoolRef, KubernetesDiscovery, PortRef};
use crate::lifecycle::Source;
use crate::metrics::Metrics;

/// The API group, version and kind of the pool.
pub const GROUP: &str = "inference.networking.k8s.io";
/// Its version.
pub const VERSION: &str = "v1";
/// Its kind.
pub const KIND: &str = "InferencePool";
/// Its resource name.
pub const PLURAL: &str = "inferencepools";

/// Why a pool's spec gives no workers.
#[derive(Debug, Error, PartialEq)]
pub enum PoolError {
    /// No `selector.matchLabels`.
    #[error("the pool has no selector.matchLabels")]
    NoSelector,
    /// No `targetPorts`.
    #[error("the pool has no targetPorts")]
    NoPorts,
    /// A port that is not a port number.
    #[error("targetPorts[{0}] is not a port number")]
    BadPort(usize),
    /// Ports that are not the first one plus the rank.
    #[error(
        "targetPorts {0:?} are not consecutive: rank N must serve on the first port plus N \
         (vLLM's --data-parallel-external-lb layout)"
    )]
    NotConsecutive(Vec<u16>),
}

/// The pod discovery a pool's `spec` asks for: `base` (ports of the KV events, annotations)
/// with the pool's selector, first port and one rank per target port.
pub fn pod_discovery(
    spec: &Value,
    base: &KubernetesDiscovery,
) -> Result<KubernetesDiscovery, PoolError> {
    let labels: BTreeMap<&str, &str> = spec["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
                .collect()
        })
        .unwrap_or_default();
    if labels.is_empty() {
        return Err(PoolError::NoSelector);
    }
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let ports = spec["targetPorts"].as_array().ok_or(PoolError::NoPorts)?;
    let ports = ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p["number"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or(PoolError::BadPort(i))
        })
        .collect::<Result<Vec<u16>, PoolError>>()?;
    let first = *ports.first().ok_or(PoolError::NoPorts)?;
    let consecutive = ports
        .iter()
        .enumerate()
        .all(|(i, p)| u32::from(*p) == u32::from(first) + i as u32);
    if !consecutive {
        return Err(PoolError::NotConsecutive(ports));
    }
    Ok(KubernetesDiscovery {
        label_selector: selector,
        http_port: PortRef::Number(first),
        data_parallel_size: ports.len() as u16,
        ..base.clone()
    })
}

/// Watches the pool `pool` and, for each version of it, the pods it selects; publishes their
/// workers until `stop`. While the pool is missing or unusable the last workers stay.
pub async fn run(
    pool: InferencePoolRef,
    base: KubernetesDiscovery,
    desired: watch::Sender<Desired>,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let client = tokio::select! {
        _ = stop.cancelled() => return,
        c = super::kubernetes::client(&metrics) => c,
    };
    let namespace = pool
        .namespace
        .clone()
        .or_else(|| base.namespace.clone())
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    let resource = ApiResource::from_gvk_with_plural(&gvk, PLURAL);
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &resource);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={}", pool.name));
    let stream = watcher::watcher(api, by_name).default_backoff();
    let mut stream = std::pin::pin!(stream);
    tracing::info!(pool = %pool.name, %namespace, "watching the InferencePool");
    let base = KubernetesDiscovery {
        namespace: Some(namespace),
        ..base
    };
    let mut running: Option<(KubernetesDiscovery, CancellationToken)> = None;
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => break,
            e = stream.next() => e,
        };
        let object = match event {
            None => break,
            Some(Ok(Event::Apply(o) | Event::InitApply(o))) => o,
            Some(Ok(Event::Delete(_))) => {
                tracing::warn!(pool = %pool.name, "the InferencePool was deleted; keeping the last known workers");
                continue;
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => {
                count(&metrics, Source::Kubernetes, "error");
                tracing::warn!(error = %e, "cannot watch the InferencePool; keeping the last known workers");
                continue;
            }
        };
        let wanted = match pod_discovery(&object.data["spec"], &base) {
            Ok(w) => w,
            Err(why) => {
                tracing::warn!(pool = %pool.name, %why, "the InferencePool gives no workers; keeping the last known ones");
                continue;
            }
        };
        if running.as_ref().is_some_and(|(r, _)| *r == wanted) {
            continue;
        }
        if let Some((_, old)) = running.take() {
            old.cancel();
        }
        tracing::info!(selector = %wanted.label_selector, port = %wanted.http_port, ranks = wanted.data_parallel_size, "InferencePool");
        let child = stop.child_token();
        tokio::spawn(super::kubernetes::run(
            wanted.clone(),
            desired.clone(),
            metrics.clone(),
            child.clone(),
        ));
        running = Some((wanted, child));
    }
    if let Some((_, child)) = running {
        child.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_ANNOTATION_PREFIX;
    use serde_json::json;

    fn base() -> KubernetesDiscovery {
        KubernetesDiscovery {
            namespace: Some("llm".into()),
            label_selector: String::new(),
            http_port: PortRef::Name("http".into()),
            kv_events_port: PortRef::Name("kv-events".into()),
            kv_replay_port: PortRef::Name("kv-replay".into()),
            annotation_prefix: DEFAULT_ANNOTATION_PREFIX.into(),
            data_parallel_size: 1,
        }
    }

    #[test]
    fn a_pool_gives_its_selector_first_port_and_one_rank_per_target_port() {
        let spec = json!({
            "selector": {"matchLabels": {"app": "vllm", "tier": "gpu"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}],
        });
        let d = pod_discovery(&spec, &base()).unwrap();
        assert_eq!(d.label_selector, "app=vllm,tier=gpu");
        assert_eq!(d.http_port, PortRef::Number(8000));
        assert_eq!(d.data_parallel_size, 2);
        assert_eq!(d.kv_events_port, PortRef::Name("kv-events".into()));
    }

    #[test]
    fn a_pool_without_selector_or_with_scattered_ports_is_refused() {
        let no_labels = json!({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]});
        assert_eq!(
            pod_discovery(&no_labels, &base()),
            Err(PoolError::NoSelector)
        );
        let scattered = json!({
            "selector": {"matchLabels": {"app": "x"}},
            "targetPorts": [{"number": 8000}, {"number": 9000}],
        });
        assert!(matches!(
            pod_discovery(&scattered, &base()),
            Err(PoolError::NotConsecutive(_))
        ));
        let zero =
            json!({"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 0}]});
        assert_eq!(pod_discovery(&zero, &base()), Err(PoolError::BadPort(0)));
        let none = json!({"selector": {"matchLabels": {"app": "x"}}, "targetPorts": []});
        assert_eq!(pod_discovery(&none, &base()), Err(PoolError::NoPorts));
    }
}
