//! Router replicas sharing their bookings over a real NATS server (`[replica_bus]`), in front
//! of simulated engines (real HTTP, real KV events over ZeroMQ):
//!
//! - with the bus, a replica's load view holds the requests the other replica has in flight
//!   (engine load readings are off, so nothing else could tell it), and their prompts' blocks:
//!   its working set of each worker and the running KV blocks there are what the replica that
//!   routed them sees (`/debug/route`'s `live_blocks`, `running_prefix_blocks`);
//! - when the NATS server is killed, each replica falls back to its own requests and says so
//!   (`kvroute_replica_bus_connected` 0);
//! - when it is back on the same port, the replicas reconnect and resynchronise from each
//!   other's snapshots: the view holds the other's requests again, and releases them as they end.
//!
//! Counts only, never timings: the test waits for conditions. It skips (with a message) only
//! when no `nats-server` binary is found; CI installs one (`.ci/run`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kvroute::config::Config;
use kvroute::server::RouterHandle;
use serde_json::json;
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";
const ENGINES: usize = 2;
/// Requests held in flight through replica 0.
const HELD: u64 = 3;
const LIMIT: Duration = Duration::from_secs(30);

/// The `nats-server` binary, if installed (Debian puts it in /usr/sbin).
fn nats_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

/// A NATS server on 127.0.0.1:`port`, killed by its process id when dropped.
struct Nats {
    child: Child,
}

impl Nats {
    async fn start(bin: &Path, port: u16) -> Nats {
        let child = Command::new(bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let up = support::wait_for(LIMIT, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        assert!(up, "nats-server never listened on {port}");
        Nats { child }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(engines: &[SimEngine], nats_port: u16, id: &str) -> Config {
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 0.5\n[health]\ninterval_s = 0.2\nload_interval_ms = 0\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n[replica_bus]\nurl = \"nats://127.0.0.1:{nats_port}\"\nreplica_id = \"{id}\"\nheartbeat_ms = 200\nexpiry_ms = 1000\n"
    );
    SimEngine::config_over(&text, engines, MODEL)
}

/// Requests in flight on all workers as `router` weighs them.
fn seen(router: &RouterHandle) -> u64 {
    support::in_flight_seen(router)
}

/// A prompt of 601 tokens (one a word with the builtin tokenizer): 37 blocks, two
/// running-blocks marks (one in 16 blocks).
fn held_prompt(i: u64) -> String {
    (0..600).map(|w| format!("q{i}w{w} ")).collect()
}

/// Per candidate of `/debug/route` on `router` for `prompt`: its working set, running KV
/// tokens and the prompt's prefix running there.
async fn cache_view(router: &RouterHandle, prompt: &str) -> Vec<(String, u64, u64, u64)> {
    let v = support::post_json(
        &format!("http://{}/debug/route", router.addr),
        &json!({"model": MODEL, "prompt": prompt}),
    )
    .await;
    let mut view: Vec<(String, u64, u64, u64)> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["target"].as_str().unwrap().to_string(),
                c["live_blocks"].as_u64().unwrap(),
                c["running_kv_tokens"].as_u64().unwrap(),
                c["running_prefix_blocks"].as_u64().unwrap(),
            )
        })
        .collect();
    view.sort();
    view
}

fn connected(router: &RouterHandle) -> bool {
    router.state.metrics.replica_bus.connected.get() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_share_in_flight_requests_over_nats_fall_back_without_it_and_resync() {
    let Some(bin) = nats_server() else {
        eprintln!(
            "SKIPPED: no nats-server on PATH or in /usr/sbin (apt-get install nats-server); the replica bus test needs a real one"
        );
        return;
    };
    let port = support::quiet_port();
    let mut nats = Nats::start(&bin, port).await;
    let mut engines = Vec::new();
    for i in 0..ENGINES {
        engines.push(SimEngine::start(MODEL, i as u64, 0.05).await);
    }
    let mut routers = Vec::new();
    for id in ["r0", "r1"] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        routers.push(kvroute::server::start(&config(&engines, port, id), listener).unwrap());
    }
    let (r0, r1) = (&routers[0], &routers[1]);
    assert!(
        support::wait_for(LIMIT, || connected(r0)
            && connected(r1)
            && r1.state.metrics.replica_bus.peers.get() == 1)
        .await,
        "both replicas on the bus and hearing each other"
    );
    for r in &routers {
        let fleet = &r.state.fleet;
        assert!(support::wait_for(LIMIT, || fleet.workers().iter().all(|w| w.is_healthy())).await);
    }

    // Long streamed requests through replica 0, each past its first chunk and held open.
    let http = reqwest::Client::new();
    let mut held = Vec::new();
    for i in 0..HELD {
        let prompt = held_prompt(i);
        let mut resp = http
            .post(format!("http://{}/v1/completions", r0.addr))
            .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 4000, "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.chunk().await.unwrap().is_some(), "a first chunk");
        held.push(resp);
    }
    assert_eq!(seen(r0), HELD, "replica 0 counts its own");
    assert!(
        support::wait_for(LIMIT, || seen(r1) == HELD).await,
        "with the bus replica 1 sees replica 0's {HELD} requests (saw {})",
        seen(r1)
    );
    assert_eq!(r1.state.metrics.replica_bus.bookings.get(), HELD as i64);
    // /debug/route on replica 1 weighs them too.
    let v = support::post_json(
        &format!("http://{}/debug/route", r1.addr),
        &json!({"model": MODEL, "prompt": "anything at all"}),
    )
    .await;
    let in_flight: u64 = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["in_flight"].as_u64().unwrap())
        .sum();
    assert_eq!(in_flight, HELD, "/debug/route: {v}");
    // The bookings carried their prompts' blocks: replica 1's working sets and running KV
    // blocks are replica 0's, which admitted them (without the hashes replica 1 would see no
    // live blocks, no running prefix, and each prompt whole among the running tokens).
    let own = cache_view(r0, &held_prompt(0)).await;
    let heard = cache_view(r1, &held_prompt(0)).await;
    assert!(
        own.iter().map(|c| c.1).sum::<u64>() > 0 && own.iter().any(|c| c.3 >= 16),
        "replica 0 holds the prompts' blocks: {own:?}"
    );
    assert_eq!(heard, own, "replica 1 sees the blocks replica 0 booked");

    // The bus is lost: replica 1 falls back to its own requests (none).
    nats.kill();
    assert!(
        support::wait_for(LIMIT, || !connected(r1) && seen(r1) == 0).await,
        "without the bus replica 1 sees only its own (saw {}, connected {})",
        seen(r1),
        connected(r1)
    );
    assert_eq!(seen(r0), HELD, "replica 0 still counts its own");

    // Back on the same port: both reconnect and resynchronise from snapshots.
    let _nats = Nats::start(&bin, port).await;
    assert!(
        support::wait_for(LIMIT, || connected(r1) && seen(r1) == HELD).await,
        "after the restart replica 1 sees replica 0's requests again (saw {})",
        seen(r1)
    );
    // They end: released on both.
    drop(held);
    assert!(
        support::wait_for(LIMIT, || seen(r0) == 0 && seen(r1) == 0).await,
        "ended requests released (r0 {}, r1 {})",
        seen(r0),
        seen(r1)
    );
    let received = r1
        .state
        .metrics
        .replica_bus
        .messages
        .with_label_values(&["received"])
        .get();
    assert!(received > 0);
    for r in routers {
        r.shutdown().await;
    }
    for e in engines {
        let _ = e.handle.shutdown().await;
    }
}
