//! The simulator decides as the live router does: one script of arrivals, KV events, first
//! tokens, completions and worker restarts is fed to the live decision path (the server's
//! `Fleet` of `Worker`s, a `Session` per request as the proxy drives it, events applied as a
//! `WorkerFeed` applies them) and to `sim::router::SimRouter`, for every policy and both index
//! modes. Every decision, every worker's load after every step, and the index's answer for
//! every prompt must be identical.
//!
//! Two legs more, on real sockets: `/debug/route` answers as the live path decides (the worker a
//! request then goes to, the error it gets), and the server and the simulator seed a request's
//! blocks alike (LoRA adapters, tenants' cache salts).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute::config::{Config, IndexSettings};
use kvroute::fleet::WorkerId;
use kvroute::fleet::{BaseUrl, Fleet, LoadSnapshot, Worker, WorkerSpec};
use kvroute::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex, seeds_for};
use kvroute::kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};
use kvroute::metrics::Metrics;
use kvroute::policy::{self, PolicyKind};
use kvroute::routing::{self, Admitted, Decider, Needs, Session, request_seed, tenant_salt};
use kvroute::server::RouterHandle;
use kvroute::sim::IndexMode;
use kvroute::sim::router::{Routed, SimRouter};
use kvroute::tokens::block_hashes;
use kvroute::tokens::model::hash_seed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{Backend, client, eventually, start_router};

const MODEL: &str = "m";
const BLOCK: usize = 16;
const WORKERS: u32 = 4;
const KV_BLOCKS: usize = 4096;

/// One step of the script.
#[derive(Clone, Debug)]
enum Step {
    Arrive { prompt: Vec<u32> },
    FirstToken { request: usize },
    Finish { request: usize },
    Stored { request: usize },
    Restart { worker: u32 },
}

/// A reproducible script: prompts share a few system prefixes, so prefixes matter.
fn script(seed: u64, steps: usize) -> Vec<(f64, Step)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let prefixes: Vec<Vec<u32>> = (0..4)
        .map(|p| {
            (0..rng.random_range(2..6) * BLOCK as u32)
                .map(|t| p * 10_000 + t)
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    let mut t = 0.0;
    let mut arrived = 0usize;
    for _ in 0..steps {
        t += rng.random_range(0.0..0.05);
        let step = match rng.random_range(0..10) {
            0..=3 => {
                let mut prompt = prefixes[rng.random_range(0..prefixes.len())].clone();
                let tail = rng.random_range(0..(4 * BLOCK as u32));
                prompt.extend((0..tail).map(|_| rng.random_range(50_000..60_000)));
                arrived += 1;
                Step::Arrive { prompt }
            }
            4 | 5 if arrived > 0 => Step::FirstToken {
                request: rng.random_range(0..arrived),
            },
            6 | 7 if arrived > 0 => Step::Finish {
                request: rng.random_range(0..arrived),
            },
            8 if arrived > 0 => Step::Stored {
                request: rng.random_range(0..arrived),
            },
            9 => Step::Restart {
                worker: rng.random_range(0..WORKERS),
            },
            _ => continue,
        };
        out.push((t, step));
    }
    out
}

fn holdings() -> Arc<Holdings> {
    let d = IndexSettings::default();
    Arc::new(Holdings::new(
        KvIndex::new(IndexConfig {
            max_entries: d.max_entries,
        }),
        ApproxIndex::new(ApproxConfig {
            ttl: d.approx_ttl,
            capacity_per_worker: d.approx_capacity_blocks,
        }),
    ))
}

/// The live side: the server's types, driven as the server drives them.
struct Live {
    fleet: Fleet,
    decider: Decider,
    metrics: Metrics,
    now: Duration,
}

impl Live {
    fn new(policy: PolicyKind, events: bool) -> Live {
        let specs = (0..WORKERS)
            .map(|i| WorkerSpec {
                id: format!("w{i}"),
                url: BaseUrl::parse(&format!("http://127.0.0.1:{}", 9000 + i)).unwrap(),
                models: vec![MODEL.into()],
                kv_events: events.then(|| format!("tcp://127.0.0.1:{}", 9100 + i)),
                kv_replay: None,
                kv_blocks: Some(KV_BLOCKS),
                data_parallel_size: 1,
                role: kvroute::fleet::Role::Both,
                bootstrap_port: None,
            })
            .collect();
        let fleet = Fleet::new(specs);
        let holdings = holdings();
        for w in fleet.workers().iter() {
            // What the server does when a worker's feed subscribes and its capacity is known.
            w.set_event_feed(events);
            if events {
                holdings.exact.reserve(w.rank(0).key, KV_BLOCKS);
            }
        }
        Live {
            fleet,
            decider: Decider::new(policy::seeded(policy, 7), holdings),
            metrics: Metrics::new(),
            now: Duration::ZERO,
        }
    }

    /// What `server::forward` does for a request: eligible workers (`routing::eligible`),
    /// analysis, one attempt.
    fn route(&self, prompt: &[u32]) -> Option<(Arc<Worker>, Admitted)> {
        let eligible = routing::eligible(
            &self.fleet.workers(),
            Some(MODEL),
            Needs::Pairable,
            Instant::now(),
        )
        .map(|e| e.workers)
        .unwrap_or_default();
        let analysis = self
            .decider
            .analyse(prompt, hash_seed(MODEL, None, None), BLOCK, self.now);
        let now = self.now;
        let clock = move || now;
        let mut session = Session::new(
            &self.decider,
            &self.metrics,
            eligible,
            analysis,
            &clock,
            Instant::now(),
        );
        session.next_attempt().map(|a| (a.worker, a.admitted))
    }

    fn loads(&self) -> Vec<LoadSnapshot> {
        self.fleet
            .workers()
            .iter()
            .map(|w| w.rank(0).load.snapshot())
            .collect()
    }
}

fn stored(prompt: &[u32], ids: &mut u64) -> KvEvent {
    let blocks = prompt.len() / BLOCK;
    let hashes = (0..blocks)
        .map(|_| {
            *ids += 1;
            EngineHash(*ids)
        })
        .collect();
    KvEvent::Stored(BlockStored {
        block_hashes: hashes,
        token_ids: prompt[..blocks * BLOCK].to_vec(),
        block_size: BLOCK as u32,
        ..BlockStored::default()
    })
}

fn run(policy: PolicyKind, mode: IndexMode, seed: u64) {
    let events = matches!(mode, IndexMode::Events { .. });
    let live = &mut Live::new(policy, events);
    let mut sim = SimRouter::new(policy::seeded(policy, 7), mode, MODEL, BLOCK, WORKERS);
    for w in 0..WORKERS {
        sim.enable(w, KV_BLOCKS);
    }
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    let mut arrivals: Vec<f64> = Vec::new();
    let mut live_req: Vec<Option<(Arc<Worker>, Admitted)>> = Vec::new();
    let mut sim_req: Vec<Option<Routed>> = Vec::new();
    let mut engine_ids = 0u64;
    let (mut decisions, mut hits) = (0, 0);
    for (n, (t, step)) in script(seed, 600).into_iter().enumerate() {
        live.now = Duration::from_secs_f64(t);
        let at = format!("{policy}/{mode:?}, step {n} ({step:?})");
        match step {
            Step::Arrive { prompt } => {
                let l = live.route(&prompt);
                let s = sim.route(&prompt, t);
                let lw = l.as_ref().map(|(w, _)| w.rank(0).key.0);
                let sw = s.as_ref().map(|r| r.slot);
                assert_eq!(lw, sw, "decision differs at {at}");
                if let (Some((_, a)), Some(r)) = (&l, &s) {
                    assert_eq!(
                        (a.overlap_blocks, a.blocks),
                        (r.overlap_blocks, r.blocks),
                        "prediction differs at {at}"
                    );
                    hits += usize::from(a.overlap_blocks > 0);
                }
                decisions += 1;
                prompts.push(prompt);
                arrivals.push(t);
                live_req.push(l);
                sim_req.push(s);
            }
            Step::FirstToken { request } => {
                if let Some((_, a)) = live_req[request].as_mut() {
                    // What the server's response observer does at a successful first token.
                    a.first_token();
                    a.observe_ttft(t - arrivals[request]);
                }
                if let Some(r) = sim_req[request].as_mut() {
                    sim.first_token(r, t);
                }
            }
            Step::Finish { request } => {
                if let Some((_, mut a)) = live_req[request].take() {
                    a.finish();
                }
                if let Some(mut r) = sim_req[request].take() {
                    sim.finish(&mut r);
                }
            }
            Step::Stored { request } => {
                let Some(r) = sim_req[request].as_ref() else {
                    continue;
                };
                if !events {
                    continue;
                }
                let event = stored(&prompts[request], &mut engine_ids);
                let batch = EventBatch {
                    ts: t,
                    events: vec![event.clone()],
                    dp_rank: Some(0),
                };
                live.decider
                    .holdings()
                    .exact
                    .apply(WorkerId(r.slot), &batch, &seeds_for(MODEL));
                sim.apply_events(r.slot, t, vec![event]);
            }
            Step::Restart { worker } => {
                if events {
                    // What the live feed does on a publisher reset.
                    live.decider.holdings().exact.clear_worker(WorkerId(worker));
                }
                sim.worker_restarted(worker);
            }
        }
        assert_eq!(live.loads(), sim.loads(), "load differs after {at}");
        if let Some(p) = prompts.last() {
            let hashes = sim.hashes(p);
            assert_eq!(
                live.decider.holdings().lookup(&hashes, live.now),
                sim.holdings().lookup(&hashes, live.now),
                "index differs after {at}"
            );
        }
    }
    assert!(decisions > 100, "{policy}: the script routes ({decisions})");
    if live.decider.uses_prefix() {
        assert!(
            hits > 0,
            "{policy}/{mode:?}: some decisions see a cached prefix"
        );
    }
}

#[test]
fn the_simulator_decides_and_accounts_as_the_live_router_for_every_policy() {
    for policy in PolicyKind::ALL {
        for mode in [IndexMode::Approx, IndexMode::Events { delay_s: 0.0 }] {
            run(policy, mode, 11);
        }
    }
}

/// The live router in front of three test backends serving `m` (no KV events: every routed
/// request's blocks are predicted on its worker), a fourth and a fifth serving `pd` as its
/// prefill and its decode worker, tenants and an adapter `m-lora` of `m`.
async fn live_router(backends: &[Backend]) -> RouterHandle {
    let sha = |k: &str| -> String {
        Sha256::digest(k.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let mut text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[kv_aware]\ncalibrate = false\n\
         [[models]]\nname = \"{MODEL}\"\nblock_size = {BLOCK}\n\
         [[models]]\nname = \"{ADAPTER}\"\nbase_model = \"{MODEL}\"\n\
         [[tenants]]\nname = \"{TENANT}\"\napi_key_sha256 = \"{}\"\n\
         [admin]\napi_key_sha256 = \"{}\"\n",
        sha(TENANT_KEY),
        sha(ADMIN_KEY)
    );
    for (i, b) in backends.iter().enumerate() {
        let (models, role) = match i {
            0..3 => (format!("\"{MODEL}\", \"{ADAPTER}\""), "both"),
            3 => ("\"pd\"".to_owned(), "prefill"),
            _ => ("\"pd\"".to_owned(), "decode"),
        };
        text.push_str(&format!(
            "[[workers]]\nid = \"w{i}\"\nurl = \"{}\"\nmodels = [{models}]\nrole = \"{role}\"\n",
            b.url()
        ));
    }
    start_router(&Config::from_toml(&text, std::path::Path::new("test")).unwrap()).await
}

const ADAPTER: &str = "m-lora";
const TENANT: &str = "acme";
const TENANT_KEY: &str = "key-acme";
const ADMIN_KEY: &str = "key-admin";

/// `/debug/route`'s answer and status for `body`, asked by the admin (as `tenant` if given).
async fn explain(r: &RouterHandle, body: &Value, tenant: Option<&str>) -> (u16, Value) {
    let mut req = client()
        .post(format!("http://{}/debug/route", r.addr))
        .bearer_auth(ADMIN_KEY)
        .json(body);
    if let Some(t) = tenant {
        req = req.header("x-kvroute-tenant", t);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// The live answer to `body`: its status, the worker that served it and the JSON.
async fn send(r: &RouterHandle, body: &Value) -> (u16, Option<String>, Value) {
    let resp = client()
        .post(format!("http://{}/v1/completions", r.addr))
        .bearer_auth(TENANT_KEY)
        .json(body)
        .send()
        .await
        .unwrap();
    let worker = resp
        .headers()
        .get("x-kvroute-worker")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), worker, resp.json().await.unwrap())
}

/// `kvroute_prefill_saturated_decisions_total` on the router's metrics page.
async fn saturated_decisions(r: &RouterHandle) -> u64 {
    crate::support::metrics_text(r.addr)
        .await
        .lines()
        .find(|l| l.starts_with("kvroute_prefill_saturated_decisions_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("the counter is on the page")
}

/// `/debug/route` answers as the live path decides: the worker a request then goes to, and —
/// where it gets an error — the same status and code (an unknown model, a model whose workers
/// all drain, a disaggregated model without a decode worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_route_explains_the_decision_and_the_error_the_request_gets() {
    let mut backends = Vec::new();
    for i in 0..5 {
        backends.push(Backend::start(&format!("b{i}"), &[MODEL, ADAPTER, "pd"]).await);
    }
    let r = live_router(&backends).await;
    let block = r.state.tokens.get(MODEL).block_size();
    // Each family of prompts has a long prefix some worker is predicted to hold, so no two
    // workers tie (a tie is broken at random, and each call draws anew).
    let prefix = |f: u32| -> Vec<u32> { (0..16 * block as u32).map(|t| f * 100_000 + t).collect() };
    let salt = tenant_salt(&Sha256::digest(TENANT_KEY).into(), TENANT, None);
    let seed = request_seed(MODEL, None, Some(&salt));
    for f in 0..3u32 {
        let w = r.state.fleet.get(&format!("w{f}")).unwrap();
        let hashes = block_hashes(seed, &prefix(f), block);
        r.state
            .holdings
            .approx
            .record_routed(w.ranks()[0].key, &hashes, r.state.now());
    }
    let mut rng = StdRng::seed_from_u64(5);
    for n in 0..30 {
        // Every earlier request has ended (its load released), as when the live one is sent.
        assert!(eventually(|| r.state.fleet.workers().iter().all(|w| w.in_flight() == 0)).await);
        let mut prompt = prefix(rng.random_range(0..3));
        let tail = rng.random_range(1..(3 * block as u32));
        prompt.extend((0..tail).map(|_| rng.random_range(50_000..60_000)));
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1});
        let (status, explained) = explain(&r, &body, Some(TENANT)).await;
        assert_eq!(status, 200, "{explained}");
        let (status, worker, out) = send(&r, &body).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(
            worker.as_deref(),
            explained["worker"].as_str(),
            "request {n}: {explained}"
        );
        // An idle fleet is not saturated.
        assert_eq!(explained["saturated"], false, "{explained}");
        assert_eq!(explained["saturated_by"], Value::Null, "{explained}");
    }
    // Every worker with far more than twice the prompt queued for prefill: saturated.
    let queued: Vec<_> = r
        .state
        .fleet
        .workers()
        .iter()
        .flat_map(|w| {
            w.ranks()
                .iter()
                .map(|rank| rank.load.admit(1 << 20, 1 << 20))
        })
        .collect();
    let body = json!({"model": MODEL, "prompt": prefix(0), "max_tokens": 1});
    let (status, explained) = explain(&r, &body, Some(TENANT)).await;
    assert_eq!(status, 200, "{explained}");
    assert_eq!(explained["saturated"], true, "{explained}");
    assert_eq!(explained["saturated_by"], "prefill", "{explained}");
    // The live decisions are counted: none of the thirty above, this one.
    assert_eq!(saturated_decisions(&r).await, 0);
    let (status, _, out) = send(&r, &body).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(saturated_decisions(&r).await, 1);
    drop(queued);
    let m = |model: &str| json!({"model": model, "prompt": "hello", "max_tokens": 1});
    assert_eq!(
        same_error(&r, m("nope")).await,
        (404, "model_not_found".into())
    );
    // A disaggregated model whose only decode worker drains has no decode side.
    r.state.fleet.get("w4").unwrap().set_draining(true);
    assert_eq!(
        same_error(&r, m("pd")).await,
        (503, "no_decode_worker".into())
    );
    for i in 0..3 {
        r.state
            .fleet
            .get(&format!("w{i}"))
            .unwrap()
            .set_draining(true);
    }
    assert_eq!(
        same_error(&r, m(MODEL)).await,
        (503, "no_worker_available".into())
    );
    r.shutdown().await;
}

/// The server and the simulator seed a request's blocks alike (`routing::request_seed`): for
/// the base model and a LoRA adapter, with and without a tenant's namespaced salt, the blocks
/// the simulator hashes for a request are exactly the ones the live router looks up for it
/// (and no other case's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_and_the_simulator_seed_adapters_and_tenant_salts_alike() {
    let mut backends = Vec::new();
    for i in 0..5 {
        backends.push(Backend::start(&format!("b{i}"), &[MODEL, ADAPTER, "pd"]).await);
    }
    let r = live_router(&backends).await;
    let block = r.state.tokens.get(MODEL).block_size();
    let sim = SimRouter::new(
        policy::seeded(PolicyKind::KvAware, 7),
        IndexMode::Approx,
        MODEL,
        block,
        1,
    );
    let key: [u8; 32] = Sha256::digest(TENANT_KEY).into();
    let mut cases = Vec::new();
    for model in [MODEL, ADAPTER] {
        for tenant in [None, Some(TENANT)] {
            for client_salt in [None, Some("s")] {
                cases.push((model, tenant, client_salt));
            }
        }
    }
    let w1 = r.state.fleet.get("w1").unwrap().ranks()[0].key;
    let blocks = 4;
    let prompt: Vec<u32> = (0..=(blocks * block) as u32).collect();
    for (i, &(model, tenant, client_salt)) in cases.iter().enumerate() {
        // The salt the engine gets: the tenant's namespaced one, else the client's.
        let salt = match tenant {
            Some(t) => Some(tenant_salt(&key, t, client_salt)),
            None => client_salt.map(str::to_owned),
        };
        let seed = sim.seed_for(model, salt.as_deref());
        let hashes = block_hashes(seed, &prompt, block);
        if model == MODEL && salt.is_none() {
            assert_eq!(hashes, sim.hashes(&prompt), "the simulator's own requests");
        }
        r.state.holdings.approx.clear_worker(w1);
        r.state
            .holdings
            .approx
            .record_routed(w1, &hashes, r.state.now());
        for (j, &(model, tenant, client_salt)) in cases.iter().enumerate() {
            let mut body = json!({"model": model, "prompt": prompt});
            if let Some(s) = client_salt {
                body["cache_salt"] = json!(s);
            }
            let (status, v) = explain(&r, &body, tenant).await;
            assert_eq!(status, 200, "{v}");
            let overlap = v["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["worker"] == "w1")
                .map(|c| c["overlap_blocks"].as_u64().unwrap());
            let want = if i == j { blocks as u64 } else { 0 };
            assert_eq!(
                overlap,
                Some(want),
                "seeded as {:?}, asked as {:?}",
                cases[i],
                cases[j]
            );
        }
    }
    r.shutdown().await;
}

/// The status and code `/debug/route` answers `body` with, checked equal to the live answer's.
async fn same_error(r: &RouterHandle, body: Value) -> (u16, String) {
    let (debug, explained) = explain(r, &body, Some(TENANT)).await;
    let (live, _, out) = send(r, &body).await;
    assert_eq!(debug, live, "{body}: /debug/route {explained}, live {out}");
    assert_eq!(explained["error"]["code"], out["error"]["code"], "{body}");
    let code = out["error"]["code"].as_str().unwrap_or_default().to_owned();
    (live, code)
}
