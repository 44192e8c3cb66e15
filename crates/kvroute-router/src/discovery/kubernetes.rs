//! Kubernetes discovery: the pods of a namespace matching a label selector, watched through the
//! API server.
//!
//! kube-runtime's `watcher` does the list+watch protocol: a paged list, then a watch from its
//! resource version with bookmarks (so a reconnect resumes from a recent version), a re-list
//! when the server answers `410 Gone` (the version expired), and a re-list after any other
//! failure. `default_backoff` spaces the retries (0.8 s doubling to 30 s, jittered). Here the
//! watch's events keep a store of pods; a re-list (`Init` … `InitDone`) is buffered and
//! replaces the store at its end, so pods deleted while the watch was down go then, and a
//! half-read list never empties the fleet. While the API server is unreachable nothing is
//! published: the last known set stays.
//!
//! The client comes from the environment as `kubectl`'s does: in a pod, its service account
//! (the Role in `deploy/kubernetes/base/role.yaml` grants get/list/watch on pods); elsewhere
//! `KUBECONFIG` or `~/.kube/config`.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::pods::{NotAWorker, workers_of};
use super::{Desired, count};
use crate::config::KubernetesDiscovery;
use crate::fleet::WorkerSpec;
use crate::lifecycle::Source;
use crate::metrics::Metrics;

/// Longest wait between two attempts to build a client (no kubeconfig, no service account).
const CLIENT_RETRY_MAX: Duration = Duration::from_secs(30);

/// Watches the pods of `config` and publishes their workers until `stop`.
pub async fn run(
    config: KubernetesDiscovery,
    desired: watch::Sender<Desired>,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let client = tokio::select! {
        _ = stop.cancelled() => return,
        c = client(&metrics) => c,
    };
    let namespace = config
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    tracing::info!(%namespace, selector = %config.label_selector, "watching pods");
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let stream = watcher::watcher(
        api,
        watcher::Config::default().labels(&config.label_selector),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut store = PodStore::default();
    let mut failing = false;
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = stream.next() => e,
        };
        let Some(event) = event else { return };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                count(&metrics, Source::Kubernetes, "error");
                if !failing {
                    tracing::warn!(error = %e, "cannot watch pods; keeping the last known workers");
                }
                failing = true;
                continue;
            }
        };
        if failing {
            tracing::info!("watching pods again");
            failing = false;
        }
        if matches!(event, Event::Init) {
            count(&metrics, Source::Kubernetes, "relist");
        }
        let changed = match event {
            Event::Init => store.init(),
            Event::InitApply(pod) => {
                let (name, workers) = pod_workers(&pod, &namespace, &config);
                store.init_apply(name, workers)
            }
            Event::InitDone => store.init_done(),
            Event::Apply(pod) => {
                let (name, workers) = pod_workers(&pod, &namespace, &config);
                store.apply(name, workers)
            }
            Event::Delete(pod) => store.delete(&pod.metadata.name.unwrap_or_default()),
        };
        if changed {
            desired.send_replace(store.desired());
        }
    }
}

/// The pod's name and the workers it is now (none when it is no worker: logged at debug for
/// a pod's ordinary life, at warn for a Ready pod that cannot be used).
fn pod_workers(
    pod: &Pod,
    namespace: &str,
    config: &KubernetesDiscovery,
) -> (String, Vec<WorkerSpec>) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let workers = workers_of(pod, namespace, config).unwrap_or_else(|why| {
        match why {
            // A pod's ordinary life: starting, stopping, not Ready for a while.
            NotAWorker::NotReady | NotAWorker::Terminating | NotAWorker::NoIp => {
                tracing::debug!(pod = %name, %why, "pod is no worker now");
            }
            // A Ready pod the selector matched but that cannot be used: the
            // operator's to fix.
            _ => tracing::warn!(pod = %name, %why, "pod matches the selector but is no worker"),
        }
        Vec::new()
    });
    (name, workers)
}

/// A client from the environment, retried with a growing delay until one can be built.
pub(super) async fn client(metrics: &Metrics) -> Client {
    let mut delay = Duration::from_secs(1);
    loop {
        match Client::try_default().await {
            Ok(c) => return c,
            Err(e) => {
                count(metrics, Source::Kubernetes, "error");
                tracing::error!(error = %e, retry_in = ?delay, "no Kubernetes client (in-cluster service account or KUBECONFIG)");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(CLIENT_RETRY_MAX);
    }
}

/// The workers of each pod by pod name, as the watch last told them.
#[derive(Debug, Default)]
pub struct PodStore {
    pods: BTreeMap<String, Vec<WorkerSpec>>,
    /// A re-list under way; replaces `pods` when it ends.
    listing: Option<BTreeMap<String, Vec<WorkerSpec>>>,
    /// Whether a list has ever completed: nothing is published before the first one.
    listed: bool,
    relists: u64,
}

impl PodStore {
    /// A re-list begins. Nothing changes until it ends.
    pub fn init(&mut self) -> bool {
        self.listing = Some(BTreeMap::new());
        false
    }

    /// A pod of the re-list.
    pub fn init_apply(&mut self, pod: String, workers: Vec<WorkerSpec>) -> bool {
        self.listing
            .get_or_insert_with(BTreeMap::new)
            .insert(pod, workers);
        false
    }

    /// The re-list is complete: it is the store now.
    pub fn init_done(&mut self) -> bool {
        self.pods = self.listing.take().unwrap_or_default();
        self.listed = true;
        self.relists += 1;
        true
    }

    /// A pod was added or changed.
    pub fn apply(&mut self, pod: String, workers: Vec<WorkerSpec>) -> bool {
        let changed = self.pods.get(&pod) != Some(&workers);
        self.pods.insert(pod, workers);
        changed && self.listed
    }

    /// A pod was deleted.
    pub fn delete(&mut self, pod: &str) -> bool {
        self.pods.remove(pod).is_some() && self.listed
    }

    /// The workers of every pod.
    pub fn desired(&self) -> Desired {
        Desired {
            endpoints: self
                .pods
                .values()
                .flatten()
                .map(|w| (w.id.clone(), w.clone()))
                .collect(),
            relists: self.relists,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::BaseUrl;

    fn w(id: &str, port: u16) -> Vec<WorkerSpec> {
        vec![WorkerSpec {
            id: id.into(),
            url: BaseUrl::parse(&format!("http://10.0.0.1:{port}")).unwrap(),
            models: Vec::new(),
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size: 1,
            role: crate::fleet::Role::Both,
            bootstrap_port: None,
        }]
    }

    fn ids(s: &PodStore) -> Vec<String> {
        s.desired().endpoints.into_keys().collect()
    }

    #[test]
    fn a_relist_replaces_the_store_only_when_complete() {
        let mut s = PodStore::default();
        assert!(!s.init());
        assert!(!s.init_apply("a".into(), w("a", 1)));
        assert!(!s.init_apply("b".into(), w("b", 2)));
        assert!(ids(&s).is_empty(), "nothing before the first list ends");
        assert!(s.init_done());
        assert_eq!(ids(&s), ["a", "b"]);
        assert_eq!(s.desired().relists, 1);
        // A watch update, then a re-list (after 410 Gone) without b: b goes at its end only.
        assert!(s.apply("c".into(), w("c", 3)));
        assert!(!s.apply("c".into(), w("c", 3)), "unchanged");
        s.init();
        s.init_apply("a".into(), w("a", 1));
        assert_eq!(ids(&s), ["a", "b", "c"]);
        s.init_apply("c".into(), w("c", 3));
        assert!(s.init_done());
        assert_eq!(ids(&s), ["a", "c"]);
        assert_eq!(s.desired().relists, 2);
        assert!(s.delete("a"));
        assert!(!s.delete("a"));
        assert_eq!(ids(&s), ["c"]);
        // A pod that is no worker now keeps its name with no workers.
        assert!(s.apply("c".into(), Vec::new()));
        assert!(ids(&s).is_empty());
    }
}
