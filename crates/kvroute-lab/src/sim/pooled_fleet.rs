//! The pooled-fleet reference: the fleet's engines sharing one KV cache, queueing as they do.
//!
//! The pooled-cache reference ([`super::super::pooled`]) gives the fleet's capacity to one cache
//! and runs each request alone on an idle engine: it has no queueing at all, so a 500k-token
//! prefill that holds one real engine for ten seconds delays nobody there. A policy's distance
//! to it mixes two things: the partition of the cache into engines, which placement works on,
//! and queueing, which no placement removes (some engine computes that prompt, and the requests
//! behind it wait or go elsewhere). Measured with this row (docs/benchmarks.md, "What
//! partitioned caches cost"), queueing is a small part of it, and the partition nearly all.
//!
//! This reference keeps everything a real fleet has — the same engines, each scheduling,
//! batching and queueing its own requests, `kv_aware` choosing among them — except the
//! partition: the engines share one cache of the fleet's capacity ([`CacheSlot::Pooled`]), so
//! any engine hits what any other computed, and room is the fleet's. Its KV events describe
//! every worker's cache, so every worker holds every prefix in the router's eyes and the
//! policy decides on load alone. The distance from a policy to this row is what partitioned
//! caches cost that policy; the distance from this row to the pooled cache is queueing, which
//! no placement over these engines removes.
//!
//! A host-memory tier is pooled too, with one write link per engine. Fleets that change
//! during the run, disaggregated fleets and routers without KV events have no such row.
//!
//! [`CacheSlot::Pooled`]: crate::engine::cache_slot::CacheSlot::Pooled

use std::sync::{Arc, Mutex};

use kvroute_router::policy::PolicyKind;

use super::super::config::{IndexMode, SimConfig};
use super::{PolicyRun, SimError, Simulation, engine_config};
use crate::engine::EngineCore;
use crate::engine::cache_slot::PooledCache;
use crate::engine::cpu_tier::CpuTierConfig;
use crate::engine::kv_cache::KvCache;
use crate::workload::trace::Trace;

/// The reference's row name.
pub const NAME: &str = "pooled_fleet";

/// The pooled-fleet reference's run of `trace` under `config`; `None` when the fleet changes
/// during the run, is disaggregated, or `kv_aware` would not read KV events.
pub fn pooled_fleet(trace: &Trace, config: &SimConfig) -> Result<Option<PolicyRun>, SimError> {
    let policy = PolicyKind::KvAware;
    let events = matches!(config.index_for(policy), IndexMode::Events { .. });
    if !config.changes.is_empty() || config.pd.is_some() || !events {
        return Ok(None);
    }
    let workers = config.max_workers().max(1);
    let base = &config.engine;
    let blocks = config.fleet_blocks(workers);
    let tier = base.cpu_tier.map(|t| CpuTierConfig {
        blocks: config.fleet_tier_blocks(workers),
        write_bytes_per_s: t.write_bytes_per_s * f64::from(workers),
        ..t
    });
    let shared: PooledCache = Arc::new(Mutex::new(KvCache::with_tier(
        blocks,
        base.block_size,
        tier,
    )));
    // One hashing seed for every engine (a block is one entry of the shared cache whoever
    // computed it), and the fleet's capacity as each engine's limit (a prompt longer than one
    // engine's cache would otherwise be refused, not computed).
    // Each engine at its slot's speed in a mixed fleet.
    let seed = engine_config(config, 0, 0).seed;
    let engine = |slot| {
        let pooled_config = crate::engine::EngineConfig {
            num_blocks: blocks,
            cpu_tier: tier,
            seed,
            ..engine_config(config, slot, 0)
        };
        EngineCore::pooled(pooled_config, shared.clone())
    };
    let mut sim = Simulation::with_engines(trace, config, policy, engine, |_| blocks)?;
    sim.pooled = true;
    let mut run = sim.run();
    run.policy = NAME.to_owned();
    // Every engine reported the shared cache's evictions: count them once.
    run.counters.evictions = shared
        .lock()
        .map_or_else(|e| e.into_inner().evictions(), |c| c.evictions());
    Ok(Some(run))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::FleetChange;
    use crate::sim::pooled::pooled_cache;
    use crate::sim::reference_tests::{config, req};

    #[test]
    fn a_busy_engine_prefix_is_hit_on_an_idle_one() {
        // The first request decodes for a long time on its worker; the second shares its
        // prefix. Partitioned, kv_aware sends it to the warm worker or recomputes elsewhere;
        // pooled, every worker holds the prefix, so it goes to the idle one and hits there.
        let trace = Trace::new(vec![
            req(0.0, &[1, 2, 3, 4], 256, 2_000),
            req(1.0, &[1, 2, 3, 4, 5], 320, 1),
        ]);
        let c = config(2, 256);
        let run = pooled_fleet(&trace, &c)
            .unwrap()
            .expect("a fixed fleet has the row");
        assert_eq!(run.policy, NAME);
        let (a, b) = (&run.records[0], &run.records[1]);
        assert!(a.error.is_none() && b.error.is_none());
        assert_ne!(a.worker, b.worker, "the idle worker holds the prefix too");
        assert_eq!(
            b.cached_tokens, 256,
            "and its engine hits the busy one's blocks"
        );
        let partitioned = Simulation::new(&trace, &c, PolicyKind::KvAware)
            .unwrap()
            .run();
        let p = &partitioned.records[1];
        assert!(
            p.worker == a.worker || p.cached_tokens == 0,
            "partitioned, only the busy worker holds it: {p:?}"
        );
    }

    #[test]
    fn one_request_at_a_time_it_is_the_pooled_cache() {
        // Far apart, no request queues: the pooled fleet hits and evicts as the pooled cache.
        let trace = Trace::new(vec![
            req(0.0, &[1, 2], 128, 64),
            req(100.0, &[7, 8, 9, 10, 11, 12, 13], 448, 64),
            req(200.0, &[20, 21, 22, 23, 24, 25, 26], 448, 64),
            req(300.0, &[1, 2, 3], 192, 1),
            req(400.0, &[7, 8, 9, 10], 256, 1),
        ]);
        // Two engines of 8 blocks: 16 in the pool, 19 written before the fourth request.
        let c = config(2, 8);
        let fleet = pooled_fleet(&trace, &c).unwrap().unwrap();
        let cache = pooled_cache(&trace, &c);
        let hits = |r: &PolicyRun| {
            r.records
                .iter()
                .map(|x| x.cached_tokens)
                .collect::<Vec<_>>()
        };
        assert_eq!(hits(&fleet), hits(&cache));
        assert!(fleet.records.iter().all(|r| r.error.is_none()));
        // One engine with the pool's 16 blocks evicts what the two sharing it evict (each of
        // the two reads the pool's count; it is counted once).
        let one = Simulation::new(&trace, &config(1, 16), PolicyKind::KvAware)
            .unwrap()
            .run();
        assert_eq!(hits(&one), hits(&fleet));
        assert!(one.counters.evictions > 0);
        assert_eq!(fleet.counters.evictions, one.counters.evictions);
    }

    #[test]
    fn fleets_that_change_have_no_row() {
        let trace = Trace::new(vec![req(0.0, &[1], 64, 1)]);
        let mut c = config(2, 64);
        c.changes = vec![FleetChange::Join { at: 5.0 }];
        assert!(pooled_fleet(&trace, &c).unwrap().is_none());
    }
}
