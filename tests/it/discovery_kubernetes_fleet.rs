//! Kubernetes discovery at fleet scale: `kvroute serve` watches 1,024 pods of the fake API
//! server (`support::kube_api`), then the pod set churns quickly — pods deleted and created,
//! turned not Ready and Ready again, restarted at another IP — without waiting for the router
//! between changes. The router's worker list must end exactly the Ready pods: none lost, none
//! left behind, none listed twice, each at its pod's current address.
//!
//! The pods' addresses are distinct loopback IPs (127.1.x.y), all served by one fake engine
//! listening on every address (a pod joins once its `/v1/models` answers); health checks run
//! every 5 s, so 1,024 of them stay cheap.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::kube_api::{FakeKube, pod_json};
use crate::support::*;

const NS: &str = "fleet";
const PODS: u32 = 1024;

fn ip(n: u32) -> String {
    format!("127.1.{}.{}", n / 200, n % 200 + 1)
}

fn id(name: &str) -> String {
    format!("k8s:{NS}:{name}")
}

/// The router's workers (id → url) as its admin API lists them, and how many entries the list
/// had (a duplicate id would make it longer than the map).
async fn workers(router: std::net::SocketAddr) -> (BTreeMap<String, String>, usize) {
    let v: Value = client()
        .get(format!("http://{router}/admin/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let list = v["workers"].as_array().unwrap();
    let map = list
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap().to_owned(),
                w["url"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (map, list.len())
}

/// Waits (at most 120 s) until the router lists exactly `want`; fails showing the difference.
async fn wait_exactly(router: std::net::SocketAddr, want: &BTreeMap<String, String>, what: &str) {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let (have, entries) = workers(router).await;
        assert_eq!(entries, have.len(), "{what}: a worker is listed twice");
        if &have == want {
            return;
        }
        if Instant::now() > end {
            let missing: Vec<_> = want
                .iter()
                .filter(|(k, v)| have.get(*k) != Some(v))
                .collect();
            let extra: Vec<_> = have
                .iter()
                .filter(|(k, v)| want.get(*k) != Some(v))
                .collect();
            panic!(
                "{what}: {} listed, {} expected; missing or stale {:?}; extra or stale {:?}",
                have.len(),
                want.len(),
                &missing[..missing.len().min(10)],
                &extra[..extra.len().min(10)]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The fleet as the test drives it: pods by name, (address number, Ready).
struct Fleet {
    api: FakeKube,
    pods: BTreeMap<String, (u32, bool)>,
    port: u16,
    next: u32,
}

impl Fleet {
    fn put(&mut self, name: String, addr: u32, ready: bool) {
        self.api
            .put(pod_json(NS, &name, &ip(addr), ready, self.port));
        self.pods.insert(name, (addr, ready));
    }

    fn add(&mut self) {
        let n = self.next;
        self.next += 1;
        self.put(format!("pod-{n}"), n, true);
    }

    /// What the router must list: the Ready pods at their current addresses.
    fn expected(&self) -> BTreeMap<String, String> {
        self.pods
            .iter()
            .filter(|(_, (_, ready))| *ready)
            .map(|(name, (addr, _))| (id(name), format!("http://{}:{}", ip(*addr), self.port)))
            .collect()
    }

    /// One round of churn: `k` pods deleted, `k` created, `k / 2` turned not Ready, the
    /// not-Ready ones of earlier rounds Ready again, `k / 2` moved to a new address.
    fn churn(&mut self, round: usize, k: usize) {
        let names: Vec<String> = self.pods.keys().cloned().collect();
        let pick = |i: usize| names[(i * 7919 + round * 104_729) % names.len()].clone();
        let revive: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, (_, ready))| !ready)
            .map(|(n, _)| n.clone())
            .collect();
        for name in revive {
            let addr = self.pods[&name].0;
            self.put(name, addr, true);
        }
        for i in 0..k {
            let name = pick(i);
            if self.pods.remove(&name).is_some() {
                self.api.delete(&name);
            }
            self.add();
        }
        for i in k..k + k / 2 {
            let name = pick(i);
            if let Some(&(addr, _)) = self.pods.get(&name) {
                self.put(name, addr, false);
            }
        }
        for i in 2 * k..2 * k + k / 2 {
            let name = pick(i);
            if let Some(&(_, ready)) = self.pods.get(&name) {
                let moved = self.next;
                self.next += 1;
                self.put(name, moved, ready);
            }
        }
    }
}

/// 1,024 pods are all found; after eight rounds of churn (64 deleted and 64 created, 32 not
/// Ready, 32 moved per round, applied back to back) the router lists exactly the Ready pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_pods_with_churn_are_all_found_once() {
    let api = FakeKube::start(NS).await;
    let engine =
        Backend::start_on(std::net::SocketAddr::from(([0, 0, 0, 0], 0)), "e", &["m"]).await;
    let port = engine.addr.port();
    let mut fleet = Fleet {
        api,
        pods: BTreeMap::new(),
        port,
        next: 0,
    };
    for _ in 0..PODS {
        fleet.add();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = fleet.api.kubeconfig(dir.path());
    let config = "shutdown_grace_s = 1.0\npolicy = \"round_robin\"\n[health]\ninterval_s = 5\n\
                  [discovery]\ndrain_timeout_s = 1\n\
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
    let t = Instant::now();
    wait_exactly(r, &fleet.expected(), "1,024 pods").await;
    eprintln!(
        "1,024 pods listed {:.1?} after the router's start",
        t.elapsed()
    );

    for round in 0..8 {
        fleet.churn(round, 64);
    }
    let t = Instant::now();
    let want = fleet.expected();
    assert!(want.len() > 900, "{} Ready pods", want.len());
    wait_exactly(r, &want, "after churn").await;
    eprintln!("churn converged {:.1?} after its last change", t.elapsed());
    assert!(
        fleet
            .api
            .stats()
            .watches
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 1
    );
}
