//! The simulator decides as the live router does: one script of arrivals, KV events, first
//! tokens, completions and worker restarts is fed to the live decision path (the server's
//! `Fleet` of `Worker`s, a `Session` per request as the proxy drives it, events applied as a
//! `WorkerFeed` applies them) and to `sim::router::SimRouter`, for every policy and both index
//! modes. Every decision, every worker's load after every step, and the index's answer for
//! every prompt must be identical.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute::config::IndexSettings;
use kvroute::fleet::WorkerId;
use kvroute::fleet::{BaseUrl, Fleet, LoadSnapshot, Worker, WorkerSpec};
use kvroute::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex, seeds_for};
use kvroute::kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};
use kvroute::metrics::Metrics;
use kvroute::policy::{self, PolicyKind};
use kvroute::routing::{Admitted, Decider, Session};
use kvroute::sim::IndexMode;
use kvroute::sim::router::{Routed, SimRouter};
use kvroute::tokens::model::hash_seed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
                holdings.exact.reserve(w.key, KV_BLOCKS);
            }
        }
        Live {
            fleet,
            decider: Decider::new(policy::seeded(policy, 7), holdings),
            metrics: Metrics::new(),
            now: Duration::ZERO,
        }
    }

    /// What `server::forward` does for a request: eligible workers, analysis, one attempt.
    fn route(&self, prompt: &[u32]) -> Option<(Arc<Worker>, Admitted)> {
        let eligible = self.fleet.eligible(MODEL);
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
            .map(|w| w.load.snapshot())
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
                let lw = l.as_ref().map(|(w, _)| w.key.0);
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
