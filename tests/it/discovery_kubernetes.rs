//! Kubernetes discovery end to end: `kvroute serve` (a child process given a KUBECONFIG) watches
//! the pods of a fake API server on loopback while a client keeps sending requests. Pods become
//! not Ready, are deleted, come back through a re-list forced by 410 Gone after an API-server
//! outage, and change IP. Every request must be answered in full, no backend may receive a
//! request once its worker has left, and the outage must keep the last known workers. A
//! departing pod stays (drained) while its last request runs, unless that outlasts the drain
//! timeout.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::kube_api::{FakeKube, pod_json};
use crate::support::*;

const NS: &str = "llm";

/// The router's workers as its admin API lists them.
async fn workers(router: std::net::SocketAddr) -> Vec<Value> {
    let v: Value = client()
        .get(format!("http://{router}/admin/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["workers"].as_array().unwrap().clone()
}

/// Polls the worker list until `cond` holds (at most 30 s); the list it held on.
async fn wait_workers(
    router: std::net::SocketAddr,
    what: &str,
    cond: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let w = workers(router).await;
        if cond(&w) {
            return w;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}: {w:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn find<'a>(w: &'a [Value], id: &str) -> Option<&'a Value> {
    w.iter().find(|w| w["id"] == id)
}

/// The value of the metric line starting with `series`, 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Requests from `n` clients until stopped: each outcome is (status, body complete).
struct Traffic {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<(u16, bool)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    fn start(router: std::net::SocketAddr, n: usize) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..n)
            .map(|i| {
                let (stop, outcomes) = (Arc::clone(&stop), Arc::clone(&outcomes));
                tokio::spawn(async move {
                    let c = client();
                    let mut k = 0;
                    while !stop.load(Ordering::SeqCst) {
                        k += 1;
                        let body = serde_json::json!({"model": "m", "prompt": format!("client {i} request {k}"), "max_tokens": 3, "stream": true});
                        let outcome = match c
                            .post(format!("http://{router}/v1/completions"))
                            .json(&body)
                            .send()
                            .await
                        {
                            Ok(r) => {
                                let status = r.status().as_u16();
                                let text = r.text().await.unwrap_or_default();
                                (status, text.contains("[DONE]"))
                            }
                            Err(_) => (0, false),
                        };
                        outcomes.lock().unwrap().push(outcome);
                    }
                })
            })
            .collect();
        Traffic {
            stop,
            outcomes,
            tasks,
        }
    }

    fn sent(&self) -> usize {
        self.outcomes.lock().unwrap().len()
    }

    async fn finish(self) -> Vec<(u16, bool)> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.outcomes.lock().unwrap().clone()
    }
}

/// Waits until the traffic has sent `more` further requests (so requests flow between steps).
async fn more_requests(t: &Traffic, more: usize) {
    let want = t.sent() + more;
    assert!(
        wait_for(Duration::from_secs(30), || t.sent() >= want).await,
        "traffic stalled at {}",
        t.sent()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_come_and_go_while_traffic_flows_and_nothing_is_lost() {
    let slow = |b: &Backend| b.set(|x| x.chunk_delay = Duration::from_millis(25));
    let a = Backend::start("a", &["m"]).await;
    let b = Backend::start("b", &["m"]).await;
    let c1 = Backend::start("c1", &["m"]).await;
    // The same pod after a restart on another node: same port, another IP.
    let c2 = Backend::start_on(
        std::net::SocketAddr::from(([127, 0, 0, 2], c1.addr.port())),
        "c2",
        &["m"],
    )
    .await;
    for x in [&a, &b, &c1, &c2] {
        slow(x);
    }
    let api = FakeKube::start(NS).await;
    api.put(pod_json(NS, "pod-a", "127.0.0.1", true, a.addr.port()));
    api.put(pod_json(NS, "pod-b", "127.0.0.1", true, b.addr.port()));
    api.put(pod_json(NS, "pod-c", "127.0.0.1", true, c1.addr.port()));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let config = "shutdown_grace_s = 1.0\n[health]\ninterval_s = 0.5\n\
                  [discovery]\ndrain_timeout_s = 30\n\
                  [discovery.kubernetes]\nlabel_selector = \"app=engine\"\n\
                  [admin]\nopen_on_loopback = true\n";
    let (router, _file) = RouterProcess::start_env(
        config,
        &[],
        Stdio::null(),
        &[("KUBECONFIG", kubeconfig.as_path())],
    )
    .await;
    let r = router.addr;

    // The three pods join, marked as discovered, in the kubeconfig's namespace.
    let ids = ["k8s:llm:pod-a", "k8s:llm:pod-b", "k8s:llm:pod-c"];
    let w = wait_workers(r, "three pods", |w| {
        ids.iter().all(|id| find(w, id).is_some())
    })
    .await;
    assert!(w.iter().all(|w| w["source"] == "kubernetes"), "{w:#?}");
    assert_eq!(
        find(&w, "k8s:llm:pod-a").unwrap()["models"],
        serde_json::json!(["m"])
    );
    {
        let queries = api.stats().queries.lock().unwrap().clone();
        assert!(
            queries
                .iter()
                .all(|q| q.contains("labelSelector=app%3Dengine")),
            "{queries:?}"
        );
        assert!(
            queries
                .iter()
                .any(|q| q.contains("watch=true") && q.contains("allowWatchBookmarks=true")),
            "{queries:?}"
        );
    }
    // The admin API does not remove a discovered worker unless forced.
    let del = client()
        .delete(format!("http://{r}/admin/workers/k8s:llm:pod-c"))
        .send()
        .await
        .unwrap();
    let e = assert_openai_error(del, 409).await;
    assert_eq!(e["code"], "worker_discovered");

    // A few clients, each request a few tens of milliseconds: always some in flight, without
    // starving the tests that run alongside.
    let traffic = Traffic::start(r, 3);
    more_requests(&traffic, 30).await;
    assert!(a.count() > 0 && b.count() > 0 && c1.count() > 0);

    // pod-b is no longer Ready: drained, then gone once idle.
    api.put(pod_json(NS, "pod-b", "127.0.0.1", false, b.addr.port()));
    wait_workers(r, "pod-b gone", |w| find(w, "k8s:llm:pod-b").is_none()).await;
    let b_at_leave = b.count();

    // pod-a is deleted.
    more_requests(&traffic, 20).await;
    api.delete("pod-a");
    wait_workers(r, "pod-a gone", |w| find(w, "k8s:llm:pod-a").is_none()).await;
    let a_at_leave = a.count();
    more_requests(&traffic, 20).await;

    // The API server goes away: watches cut, connections refused. The router keeps pod-c.
    let errors = |text: &str| {
        metric(
            text,
            "kvroute_discovery_events_total{kind=\"error\",source=\"kubernetes\"}",
        )
    };
    let before = errors(&metrics_text(r).await);
    api.set_down(true);
    let end = Instant::now() + Duration::from_secs(30);
    while errors(&metrics_text(r).await) < before + 2.0 {
        assert!(Instant::now() < end, "the router never noticed the outage");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    more_requests(&traffic, 20).await;
    let w = workers(r).await;
    assert!(
        find(&w, "k8s:llm:pod-c").is_some(),
        "an outage removed a worker: {w:#?}"
    );
    assert!(
        !find(&w, "k8s:llm:pod-c").unwrap()["draining"]
            .as_bool()
            .unwrap()
    );
    // While it is away, pod-b becomes Ready again and the history is compacted: the watch
    // cannot resume (410 Gone) and the router must list again to see pod-b.
    assert_eq!(
        b.count(),
        b_at_leave,
        "a request reached pod-b after it left"
    );
    api.put(pod_json(NS, "pod-b", "127.0.0.1", true, b.addr.port()));
    api.expire_history();
    let lists_before = api.stats().lists.load(Ordering::SeqCst);
    api.set_down(false);
    wait_workers(r, "pod-b back", |w| find(w, "k8s:llm:pod-b").is_some()).await;
    assert!(
        api.stats().gone.load(Ordering::SeqCst) >= 1,
        "no 410 was served"
    );
    assert!(
        api.stats().lists.load(Ordering::SeqCst) > lists_before,
        "no re-list"
    );
    more_requests(&traffic, 20).await;

    // A watch connection dropped mid-stream resumes; then pod-c moves to another IP: the
    // old endpoint drains and leaves, the new one joins under the same id.
    api.cut_watches();
    more_requests(&traffic, 10).await;
    api.put(pod_json(NS, "pod-c", "127.0.0.2", true, c1.addr.port()));
    let new_url = format!("http://127.0.0.2:{}", c1.addr.port());
    wait_workers(r, "pod-c at its new IP", |w| {
        find(w, "k8s:llm:pod-c").is_some_and(|c| c["url"] == new_url.as_str())
    })
    .await;
    let c1_at_leave = c1.count();
    more_requests(&traffic, 40).await;

    let outcomes = traffic.finish().await;
    let bad: Vec<_> = outcomes.iter().filter(|o| **o != (200, true)).collect();
    assert!(
        bad.is_empty(),
        "{} of {} requests failed: {bad:?}",
        bad.len(),
        outcomes.len()
    );
    assert_eq!(
        a.count(),
        a_at_leave,
        "a request reached pod-a after it left"
    );
    assert_eq!(
        c1.count(),
        c1_at_leave,
        "a request reached pod-c's old IP after it left"
    );
    assert!(b.count() > b_at_leave, "pod-b is back and serves");
    assert!(c2.count() > 0, "pod-c serves at its new IP");
    assert!(api.stats().bookmarks.load(Ordering::SeqCst) > 0);
    let text = metrics_text(r).await;
    for kind in ["join", "drain", "leave", "relist"] {
        let series =
            format!("kvroute_discovery_events_total{{kind=\"{kind}\",source=\"kubernetes\"}}");
        assert!(metric(&text, &series) >= 1.0, "{series} missing:\n{text}");
    }
    // Every departure waited for its requests: none was cut by the drain timeout.
    assert_eq!(
        metric(
            &text,
            "kvroute_discovery_events_total{kind=\"forced_leave\",source=\"kubernetes\"}"
        ),
        0.0
    );
    assert_eq!(
        metric(&text, "kvroute_discovery_workers{source=\"kubernetes\"}"),
        2.0
    );
    println!(
        "kubernetes discovery: {} requests, all answered; lists {}, watches {}, 410s {}, bookmarks {}",
        outcomes.len(),
        api.stats().lists.load(Ordering::SeqCst),
        api.stats().watches.load(Ordering::SeqCst),
        api.stats().gone.load(Ordering::SeqCst),
        api.stats().bookmarks.load(Ordering::SeqCst),
    );
}

/// Starts `kvroute serve` (round robin) watching the pods of `api`, departing workers drained
/// for at most `drain_timeout_s`.
async fn router_watching(
    api: &FakeKube,
    dir: &std::path::Path,
    drain_timeout_s: f64,
) -> (RouterProcess, tempfile::NamedTempFile) {
    let kubeconfig = api.kubeconfig(dir);
    let config = format!(
        "shutdown_grace_s = 1.0\npolicy = \"round_robin\"\n[health]\ninterval_s = 0.5\n\
         [discovery]\ndrain_timeout_s = {drain_timeout_s}\n\
         [discovery.kubernetes]\nlabel_selector = \"app=engine\"\n"
    );
    RouterProcess::start_env(
        &config,
        &[],
        Stdio::null(),
        &[("KUBECONFIG", kubeconfig.as_path())],
    )
    .await
}

/// Sends streaming requests until one is routed to `id`; returns its (unread) response.
async fn request_on(r: std::net::SocketAddr, id: &str) -> reqwest::Response {
    let c = client();
    for k in 0..50 {
        let body = serde_json::json!({"model": "m", "prompt": format!("p{k}"), "max_tokens": 3, "stream": true});
        let resp = c
            .post(format!("http://{r}/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        if resp.headers()["x-kvroute-worker"] == id {
            return resp;
        }
        assert!(resp.text().await.unwrap().contains("[DONE]"));
    }
    panic!("no request was routed to {id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departing_pod_leaves_only_when_its_last_request_ends() {
    let held = Backend::start("held", &["m"]).await;
    held.set(|b| b.hold_last_chunk = true);
    let other = Backend::start("other", &["m"]).await;
    let api = FakeKube::start(NS).await;
    api.put(pod_json(NS, "held", "127.0.0.1", true, held.addr.port()));
    api.put(pod_json(NS, "other", "127.0.0.1", true, other.addr.port()));
    let dir = tempfile::tempdir().unwrap();
    let (router, _file) = router_watching(&api, dir.path(), 600.0).await;
    let r = router.addr;
    wait_workers(r, "both pods", |w| w.len() == 2).await;
    let pending = request_on(r, "k8s:llm:held").await;

    // Not Ready: drained, and kept while its request runs.
    api.put(pod_json(NS, "held", "127.0.0.1", false, held.addr.port()));
    let w = wait_workers(r, "held draining", |w| {
        find(w, "k8s:llm:held").is_some_and(|h| h["draining"] == true)
    })
    .await;
    assert_eq!(find(&w, "k8s:llm:held").unwrap()["in_flight"], 1);
    let before = held.count();
    for k in 0..10 {
        let resp = complete(
            &client(),
            r,
            &serde_json::json!({"model": "m", "prompt": format!("q{k}"), "max_tokens": 2}),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-kvroute-worker"], "k8s:llm:other");
    }
    assert_eq!(held.count(), before, "a draining pod got a new request");
    assert!(
        find(&workers(r).await, "k8s:llm:held").is_some(),
        "left with a request in flight"
    );

    // Its request ends: answered in full, and the worker leaves.
    held.release();
    assert!(pending.text().await.unwrap().contains("[DONE]"));
    wait_workers(r, "held gone", |w| find(w, "k8s:llm:held").is_none()).await;
    let text = metrics_text(r).await;
    let kind = |k: &str| {
        metric(
            &text,
            &format!("kvroute_discovery_events_total{{kind=\"{k}\",source=\"kubernetes\"}}"),
        )
    };
    assert_eq!((kind("leave"), kind("forced_leave")), (1.0, 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_outlasts_its_timeout_is_forced_and_the_request_still_ends() {
    let held = Backend::start("held", &["m"]).await;
    held.set(|b| b.hold_last_chunk = true);
    let other = Backend::start("other", &["m"]).await;
    let api = FakeKube::start(NS).await;
    api.put(pod_json(NS, "held", "127.0.0.1", true, held.addr.port()));
    api.put(pod_json(NS, "other", "127.0.0.1", true, other.addr.port()));
    let dir = tempfile::tempdir().unwrap();
    let (router, _file) = router_watching(&api, dir.path(), 0.5).await;
    let r = router.addr;
    wait_workers(r, "both pods", |w| w.len() == 2).await;
    let pending = request_on(r, "k8s:llm:held").await;
    api.delete("held");
    wait_workers(r, "held removed", |w| find(w, "k8s:llm:held").is_none()).await;
    let text = metrics_text(r).await;
    assert_eq!(
        metric(
            &text,
            "kvroute_discovery_events_total{kind=\"forced_leave\",source=\"kubernetes\"}"
        ),
        1.0
    );
    // Removed, not cut: the request finishes on its open connection.
    held.release();
    assert!(pending.text().await.unwrap().contains("[DONE]"));
}
