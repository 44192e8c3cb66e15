//! Data-parallel ranks behind one endpoint, end to end: a simulated engine with
//! `--data-parallel-size 2` (two caches behind one HTTP port, each rank publishing real KV
//! events over ZeroMQ at the events port plus its rank) and a router that routes to each rank as
//! a target of its own and pins it with `X-data-parallel-rank`.

use std::path::Path;
use std::time::Duration;

use kvroute::config::Config;
use kvroute::engine::EngineArgs;
use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, ADMIN_ON_LOOPBACK, SimEngine, eventually};

const MODEL: &str = "sim";

struct Stack {
    router: RouterHandle,
    engine: SimEngine,
    http: reqwest::Client,
}

/// A router over one worker `d0` with `ranks` ranks whose events are at `events` (and replay
/// at `replay`), behind `engine`.
async fn router_over(engine: &SimEngine, ranks: u32, events: &str, replay: &str) -> RouterHandle {
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n\
         [[models]]\nname = \"{MODEL}\"\nblock_size = 16\n[kv_aware]\ncalibrate = false\n\
         [[workers]]\nid = \"d0\"\nurl = \"{}\"\nmodels = [\"{MODEL}\"]\n\
         kv_events = \"{events}\"\nkv_replay = \"{replay}\"\ndata_parallel_size = {ranks}\n\
         {ADMIN_ON_LOOPBACK}",
        engine.url()
    );
    let config = Config::from_toml(&text, Path::new("test")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvroute::server::start(&config, listener).unwrap()
}

impl Stack {
    async fn start() -> Stack {
        let engine = SimEngine::start_data_parallel(MODEL, 2).await;
        let router = router_over(&engine, 2, &engine.events, &engine.replay).await;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Stack {
            router,
            engine,
            http,
        }
    }

    fn router_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.router.addr)
    }

    /// Sends `prompt` to `base` (the router or the engine itself), pinned to `rank` if given;
    /// the response's headers and `cached_tokens`.
    async fn complete(
        &self,
        base: &str,
        prompt: &str,
        rank: Option<&str>,
    ) -> (reqwest::StatusCode, reqwest::header::HeaderMap, u64) {
        let mut req = self
            .http
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 2}));
        if let Some(rank) = rank {
            req = req.header("X-data-parallel-rank", rank);
        }
        let resp = req.send().await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        let body: Value = resp.json().await.unwrap();
        let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        (status, headers, cached)
    }

    async fn explain(&self, prompt: &str) -> Value {
        let body = json!({"model": MODEL, "prompt": prompt});
        support::post_json(&self.router_url("/debug/route"), &body).await
    }

    /// The index's overlap (blocks) of `prompt` on each candidate target, by target name.
    async fn overlaps(&self, prompt: &str) -> Vec<(String, u64)> {
        let v = self.explain(prompt).await;
        // A request no target can take is explained as the error it gets: no candidate.
        let Some(candidates) = v["candidates"].as_array() else {
            assert_eq!(v["error"]["code"], "no_worker_available", "{v}");
            return Vec::new();
        };
        candidates
            .iter()
            .map(|c| {
                (
                    c["target"].as_str().unwrap().to_owned(),
                    c["overlap_blocks"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// Waits until `target` holds at least one block of `prompt` in the index; then the
    /// overlaps of every target.
    async fn wait_held(&self, prompt: &str, target: &str) -> Vec<(String, u64)> {
        for _ in 0..250 {
            let o = self.overlaps(prompt).await;
            if o.iter().any(|(t, n)| t == target && *n > 0) {
                return o;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "{target} never held {prompt:?}: {:?}",
            self.overlaps(prompt).await
        );
    }
}

fn prompt(tag: &str) -> String {
    (0..150)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn header<'h>(h: &'h reqwest::header::HeaderMap, name: &str) -> Option<&'h str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn each_ranks_events_land_in_its_slot_and_its_prefix_is_routed_to_it() {
    let s = Stack::start().await;
    let engine = s.engine.url();
    // Each rank's cache is filled directly at the engine, pinned: the router only sees events.
    for (rank, tag) in [("1", "alpha"), ("0", "beta")] {
        let p = prompt(tag);
        let (status, h, _) = s.complete(&engine, &p, Some(rank)).await;
        assert_eq!(status, 200);
        assert_eq!(header(&h, "x-engine-data-parallel-rank"), Some(rank));
        let target = format!("d0/dp{rank}");
        let overlaps = s.wait_held(&p, &target).await;
        // The other rank's cache does not have it, and neither does its slot in the index.
        for (t, n) in &overlaps {
            if *t != target {
                assert_eq!(*n, 0, "{t} holds {tag}: {overlaps:?}");
            }
        }
        // The decision names the rank, and the forwarded request is pinned to it: the engine's
        // own cache answers with the reused prefix.
        let explained = s.explain(&p).await;
        assert_eq!(explained["worker"], "d0", "{explained}");
        assert_eq!(explained["target"], target.as_str(), "{explained}");
        assert_eq!(explained["rank"], rank.parse::<u64>().unwrap());
        for _ in 0..3 {
            let (status, h, cached) = s.complete(&s.router_url(""), &p, None).await;
            assert_eq!(status, 200);
            assert_eq!(header(&h, "x-kvroute-worker"), Some("d0"));
            assert_eq!(header(&h, "x-kvroute-data-parallel-rank"), Some(rank));
            assert_eq!(header(&h, "x-engine-data-parallel-rank"), Some(rank));
            assert!(cached > 0, "rank {rank} reused nothing of {tag}");
        }
    }
    // Per-target metrics name the rank; the worker's health stays the worker's.
    let metrics = support::metrics_text(s.router.addr).await;
    for rank in ["dp0", "dp1"] {
        let hit = format!("kvroute_prefix_hit_blocks_total{{worker=\"d0/{rank}\"}}");
        assert!(metrics.contains(&hit), "no {hit} in:\n{metrics}");
        let batches = format!("kvroute_kv_events_total{{kind=\"batches\",worker=\"d0/{rank}\"}}");
        assert!(metrics.contains(&batches), "no {batches}");
    }
    assert!(metrics.contains("kvroute_worker_healthy{worker=\"d0\"} 1"));
    // The admin API lists the worker once, with its ranks.
    let admin: Value = s
        .http
        .get(s.router_url("/admin/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let w = &admin["workers"][0];
    assert_eq!(admin["workers"].as_array().unwrap().len(), 1, "{admin}");
    assert_eq!(w["data_parallel_size"], 2, "{w}");
    assert_eq!(w["ranks"][1]["target"], "d0/dp1", "{w}");
    s.router.shutdown().await;
}

#[tokio::test]
async fn an_unpinned_request_is_placed_by_the_engine_and_indexed_on_that_rank() {
    let s = Stack::start().await;
    let engine = s.engine.url();
    let mut seen = Vec::new();
    for tag in ["gamma", "delta"] {
        let p = prompt(tag);
        let (status, h, _) = s.complete(&engine, &p, None).await;
        assert_eq!(status, 200);
        let rank = header(&h, "x-engine-data-parallel-rank")
            .unwrap()
            .to_owned();
        let overlaps = s.wait_held(&p, &format!("d0/dp{rank}")).await;
        assert_eq!(
            overlaps.iter().filter(|(_, n)| *n > 0).count(),
            1,
            "{overlaps:?}"
        );
        seen.push(rank);
    }
    // Idle ranks tie, and ties rotate: two requests in a row land on both caches.
    seen.sort();
    assert_eq!(seen, ["0", "1"]);
    // vLLM ignores a rank that is not a number and refuses one out of range.
    let (status, _, _) = s.complete(&engine, "x y z", Some("first")).await;
    assert_eq!(status, 200);
    let resp = s
        .http
        .post(format!("{engine}/v1/completions"))
        .header("X-data-parallel-rank", "2")
        .json(&json!({"model": MODEL, "prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out of range [0, 2)"),
        "{e}"
    );
    // A client's own pin never reaches the engine: the router's decision does.
    let p = prompt("alpha");
    s.complete(&engine, &p, Some("1")).await;
    s.wait_held(&p, "d0/dp1").await;
    let (_, h, cached) = s.complete(&s.router_url(""), &p, Some("0")).await;
    assert_eq!(header(&h, "x-engine-data-parallel-rank"), Some("1"));
    assert!(cached > 0);
    s.router.shutdown().await;
}

#[tokio::test]
async fn drain_and_removal_act_on_every_rank() {
    let s = Stack::start().await;
    let engine = s.engine.url();
    let (a, b) = (prompt("alpha"), prompt("beta"));
    s.complete(&engine, &a, Some("0")).await;
    s.complete(&engine, &b, Some("1")).await;
    s.wait_held(&a, "d0/dp0").await;
    s.wait_held(&b, "d0/dp1").await;
    let worker = s.router.state.fleet.get("d0").unwrap();
    assert_eq!(worker.keys().count(), 2);
    drop(worker);

    let admin = |path: &str| s.http.post(s.router_url(path)).send();
    assert_eq!(
        admin("/admin/workers/d0/drain").await.unwrap().status(),
        200
    );
    // No rank of a draining worker is a candidate.
    assert_eq!(s.overlaps(&a).await, Vec::<(String, u64)>::new());
    let (status, _, _) = s.complete(&s.router_url(""), &a, None).await;
    assert_eq!(status, 503);
    assert_eq!(
        admin("/admin/workers/d0/undrain").await.unwrap().status(),
        200
    );
    assert_eq!(s.overlaps(&a).await.len(), 2);

    let resp = s
        .http
        .delete(s.router_url("/admin/workers/d0"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    // Both ranks' entries, feeds and series are gone with the worker.
    assert_eq!(s.router.state.holdings.exact.entries(), 0);
    assert!(s.router.state.lifecycle.feed_stats().is_empty());
    let metrics = support::metrics_text(s.router.addr).await;
    assert!(!metrics.contains("d0/dp"), "{metrics}");
    // A new data-parallel worker over the same engine starts cold on every rank and reuses the
    // released numbers.
    let resp = s
        .http
        .post(s.router_url("/admin/workers"))
        .json(&json!({
            "id": "d1", "url": engine, "models": [MODEL],
            "kv_events": s.engine.events, "kv_replay": s.engine.replay,
            "data_parallel_size": 2,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let added: Value = resp.json().await.unwrap();
    assert_eq!(added["ranks"][0]["target"], "d1/dp0", "{added}");
    let w = s.router.state.fleet.get("d1").unwrap();
    assert_eq!(w.keys().count(), 2);
    drop(w);
    // The engine replays what each rank buffers: the new worker's ranks learn their own blocks.
    s.wait_held(&a, "d1/dp0").await;
    s.wait_held(&b, "d1/dp1").await;
    s.router.shutdown().await;
}

#[tokio::test]
async fn batches_naming_another_rank_are_left_out() {
    // A plain engine (rank 0) whose events port is the one the router expects rank 1 at: the
    // operator gave the wrong port. Its batches say `data_parallel_rank` 0.
    let base = support::quiet_ports(4);
    let args = EngineArgs {
        model: MODEL.into(),
        kv_events_endpoint: format!("tcp://127.0.0.1:{}", base + 1),
        kv_replay_endpoint: format!("tcp://127.0.0.1:{}", base + 3),
        ..EngineArgs::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = kvroute::engine::start(args.serve_config().unwrap(), listener)
        .await
        .unwrap();
    let engine = SimEngine {
        handle,
        addr,
        events: format!("tcp://127.0.0.1:{base}"),
        replay: format!("tcp://127.0.0.1:{}", base + 2),
    };
    let router = router_over(&engine, 2, &engine.events, &engine.replay).await;
    let http = reqwest::Client::new();
    let p = prompt("epsilon");
    let resp = http
        .post(format!("{}/v1/completions", engine.url()))
        .json(&json!({"model": MODEL, "prompt": p, "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mismatch = "kvroute_kv_events_total{kind=\"dp_rank_mismatch\",worker=\"d0/dp1\"}";
    let mut text = String::new();
    for _ in 0..250 {
        text = support::metrics_text(router.addr).await;
        if text
            .lines()
            .any(|l| l.starts_with(mismatch) && !l.ends_with(" 0"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with(mismatch) && !l.ends_with(" 0")),
        "{text}"
    );
    // Nothing of it was indexed on either rank.
    assert!(eventually(|| router.state.holdings.exact.entries() == 0).await);
    router.shutdown().await;
    drop(engine);
}

#[tokio::test]
async fn a_retry_goes_to_another_worker_not_another_rank_of_the_one_that_failed() {
    use crate::support::{Backend, PolicyKind, client, router_config, start_router};
    let bad = Backend::start("bad", &["m"]).await;
    bad.set(|b| b.fail_status = Some(503));
    let good = Backend::start("good", &["m"]).await;
    let mut config = router_config(
        PolicyKind::RoundRobin,
        &[(bad.url(), vec!["m"]), (good.url(), vec!["m"])],
        "[proxy]\nretries = 2\n",
    );
    config.workers[0].data_parallel_size = 4;
    let r = start_router(&config).await;
    let c = client();
    let n = 10;
    for i in 0..n {
        let resp = c
            .post(format!("http://{}/v1/completions", r.addr))
            .header("X-data-parallel-rank", "3")
            .json(&json!({"model": "m", "prompt": format!("request {i}"), "max_tokens": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(header(resp.headers(), "x-kvroute-worker"), Some("w1"));
        // A worker without data parallelism is never pinned.
        assert_eq!(header(resp.headers(), "x-kvroute-data-parallel-rank"), None);
    }
    // At most one attempt per request reached the failing worker: a retry skipped its other
    // ranks. Each attempt there named the rank the router chose, never the client's.
    let attempts = bad.received();
    let requests: std::collections::BTreeSet<_> = attempts.iter().map(|a| a.body.clone()).collect();
    assert!(!attempts.is_empty());
    assert_eq!(
        requests.len(),
        attempts.len(),
        "a request was retried on the same worker"
    );
    let ranks: std::collections::BTreeSet<_> = attempts
        .iter()
        .map(|a| {
            a.headers["x-data-parallel-rank"]
                .to_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        ranks
            .iter()
            .all(|r| ["0", "1", "2", "3"].contains(&r.as_str()))
    );
    assert!(
        good.received()
            .iter()
            .all(|a| !a.headers.contains_key("x-data-parallel-rank"))
    );
    r.shutdown().await;
}

/// A data-parallel server given as a plain worker (no `data_parallel_size`) is routed as one
/// KV cache: the router reads the ranks from the engine's own metrics and says so (a warning
/// and `kvroute_worker_data_parallel_mismatch`), and that they agree once configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_parallel_server_configured_as_one_cache_is_warned_about() {
    let engine = SimEngine::start_data_parallel(MODEL, 2).await;
    let series = "kvroute_worker_data_parallel_mismatch{worker=\"d0\"}";
    for (ranks, want) in [(1, 1), (2, 0)] {
        let router = router_over(&engine, ranks, &engine.events, &engine.replay).await;
        let line = format!("{series} {want}");
        let mut text = String::new();
        for _ in 0..100 {
            text = support::metrics_text(router.addr).await;
            if text.contains(&line) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            text.contains(&line),
            "{ranks} configured: no `{line}` in\n{text}"
        );
        router.shutdown().await;
    }
}
