//! `kvroute epp --pool-name` (a process) finding its workers through an `InferencePool` on a
//! fake API server: the pool's selector picks the pods, each of its `targetPorts` is a rank
//! of each pod (its own endpoint), readiness turns `SERVING` once workers are known, and a
//! pod that goes stops being picked.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::backend::Backend;
use crate::support::gateway::{Call, Gateway};
use crate::support::kube_api::{FakeKube, pod_json, pool_json};
use crate::support::{quiet_port, quiet_ports};

const NS: &str = "llm";

/// A `kvroute epp` process, killed when dropped.
struct EppProcess {
    child: Child,
    grpc: SocketAddr,
    health: SocketAddr,
}

impl Drop for EppProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_epp(config: &std::path::Path, kubeconfig: &std::path::Path) -> EppProcess {
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let (grpc, health, metrics) = (at(quiet_port()), at(quiet_port()), at(quiet_port()));
    let child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .arg("epp")
        .arg("--config")
        .arg(config)
        .args(["--pool-name", "pool", "--pool-namespace", NS])
        .args(["--grpc-listen", &grpc.to_string()])
        .args(["--health-listen", &health.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kvroute epp starts");
    EppProcess {
        child,
        grpc,
        health,
    }
}

/// The status of `service` on the health port (`None` while it does not answer).
async fn health(addr: SocketAddr, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest {
        service: service.into(),
    };
    let status = client.check(request).await.ok()?.into_inner().status;
    ServingStatus::try_from(status).ok()
}

async fn until_health(addr: SocketAddr, service: &str, wanted: ServingStatus) {
    for _ in 0..400 {
        if health(addr, service).await == Some(wanted) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("`{service}` never became {wanted:?}");
}

#[tokio::test]
async fn epp_routes_an_inference_pools_pods_one_endpoint_per_target_port() {
    let port = quiet_ports(2);
    let mut pods = Vec::new();
    for ip in [2u8, 3] {
        for rank in 0..2 {
            let addr = SocketAddr::from(([127, 0, 0, ip], port + rank));
            pods.push(Backend::start_on(addr, &format!("{ip}/{rank}"), &["m"]).await);
        }
    }
    let api = FakeKube::start(NS).await;
    api.put(pool_json(NS, "pool", &[port, port + 1]));
    api.put(pod_json(NS, "pod-a", "127.0.0.2", true, port));
    api.put(pod_json(NS, "pod-b", "127.0.0.3", true, port));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let config = dir.path().join("kvroute.toml");
    let text = "policy = \"round_robin\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.5\n";
    std::fs::write(&config, text).unwrap();
    let epp = spawn_epp(&config, &kubeconfig);
    until_health(epp.health, "liveness", ServingStatus::Serving).await;
    until_health(epp.health, "readiness", ServingStatus::Serving).await;
    let gateway = Gateway::connect(epp.grpc).await;
    let endpoint = |b: &Backend| b.addr.to_string();
    // Until all four ranks have joined, some are not picked yet: wait until each is.
    let mut seen = std::collections::HashSet::new();
    for i in 0..400 {
        let body =
            serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": format!("p{i}")}))
                .unwrap();
        let answer = gateway.request(Call::post("/v1/completions", &body)).await;
        assert_eq!(answer.status, 200);
        let d = answer.destination.unwrap();
        assert!(
            pods.iter().any(|b| endpoint(b) == d),
            "{d} is not a pool endpoint"
        );
        seen.insert(d);
        if seen.len() == 4 {
            break;
        }
    }
    assert_eq!(
        seen.len(),
        4,
        "every pod's every target port is an endpoint: {seen:?}"
    );
    let queries = api.stats().queries.lock().unwrap().clone();
    assert!(
        queries
            .iter()
            .any(|q| q.contains("fieldSelector=metadata.name%3Dpool")),
        "{queries:?}"
    );
    assert!(
        queries
            .iter()
            .any(|q| q.contains("labelSelector=app%3Dengine")),
        "{queries:?}"
    );
    // pod-b goes: its two endpoints stop being picked.
    api.delete("pod-b");
    let gone: Vec<String> = pods[2..].iter().map(endpoint).collect();
    let mut clean_streak = 0;
    for i in 0..400 {
        let body =
            serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": format!("q{i}")}))
                .unwrap();
        let answer = gateway.request(Call::post("/v1/completions", &body)).await;
        assert_eq!(answer.status, 200);
        if gone.contains(&answer.destination.unwrap()) {
            clean_streak = 0;
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else {
            clean_streak += 1;
            if clean_streak == 20 {
                break;
            }
        }
    }
    assert_eq!(
        clean_streak, 20,
        "the deleted pod's endpoints are no longer picked"
    );
}
