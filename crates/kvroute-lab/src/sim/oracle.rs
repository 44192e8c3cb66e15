//! The oracle: a lower bound no router can beat, so results read as a ratio to the limit.
//!
//! Each request, in arrival order, computes only the prompt blocks never computed before on
//! any replica (a global set of kvroute block hashes; chained hashes make "this block seen"
//! imply "its whole prefix seen"), on an otherwise idle engine, with no queueing: its TTFT is
//! the engine timing model's prefill time of those tokens in chunks of at most
//! `max_num_batched_tokens`, and its completion adds one idle decode step (KV usage 0, the
//! model's cheapest) per further output token. At least one prompt token is always computed
//! (an engine must run the last position to produce a token, as vLLM does on a full hit).
//!
//! Why it is a bound: every policy's engine prefills at least the tokens its cache misses,
//! which are at least the globally unseen ones; prefill time is subadditive over chunks within
//! the token budget (the constant term outweighs the quadratic one), so splitting or batching
//! with others never makes a prefill faster; and queueing only adds.

use std::collections::HashSet;

use crate::engine::{AddError, EngineConfig};
use crate::workload::trace::Trace;
use kvroute_router::routing::request_seed;
use kvroute_router::tokens::block_hashes;

use super::config::SimConfig;
use super::record::SimRecord;
use super::simulation::PolicyRun;

/// The oracle's row name.
pub const NAME: &str = "oracle";

/// Seconds to prefill `tokens` new tokens alone on an idle engine: in steps of the token
/// budget, or of the long-prefill threshold when the engine has one (vLLM caps a long prompt's
/// step even when it runs alone).
pub fn idle_prefill_s(engine: &EngineConfig, tokens: usize) -> f64 {
    let budget = match engine.long_prefill_token_threshold {
        0 => engine.max_num_batched_tokens,
        cap => cap.min(engine.max_num_batched_tokens),
    }
    .max(1);
    let mut left = tokens.max(1);
    let mut ms = 0.0;
    while left > 0 {
        let chunk = left.min(budget);
        ms += engine.timing.prefill_ms(chunk);
        left -= chunk;
    }
    ms / 1000.0 / engine.timing.speedup
}

/// Seconds of one decode step on an idle engine.
pub fn idle_decode_s(engine: &EngineConfig) -> f64 {
    engine.timing.decode_ms(0.0) / 1000.0 / engine.timing.speedup
}

/// What a reference's cache answered for one request's prompt.
pub(super) struct Lookup {
    /// Full prompt blocks looked up.
    pub(super) queried_blocks: usize,
    /// Of those, leading blocks found.
    pub(super) hit_blocks: usize,
    /// Prompt tokens not computed (at most all but the last).
    pub(super) cached_tokens: usize,
    /// Seconds spent loading part of them from a host-memory tier first.
    pub(super) load_s: f64,
}

/// Records of a reference named `name`: each request in arrival order on an otherwise idle
/// engine, computing what `cache` (given the request's index, prompt and output length) did
/// not find, with no queueing. Requests an engine refuses fail as they would there.
pub(super) fn reference_run(
    name: &str,
    trace: &Trace,
    config: &SimConfig,
    mut cache: impl FnMut(usize, &[u32], u32) -> Lookup,
) -> PolicyRun {
    let engine = &config.engine;
    let decode = idle_decode_s(engine);
    let limit = engine.max_model_len();
    let mut run = PolicyRun {
        policy: name.to_string(),
        workers: config.max_workers(),
        ..PolicyRun::default()
    };
    for (i, req) in trace.requests.iter().enumerate() {
        let output = req.output_tokens.max(1);
        let mut rec = SimRecord {
            arrival: req.arrival_s,
            prompt_tokens: req.input_tokens,
            output_tokens: output,
            ..SimRecord::default()
        };
        let prompt_len = req.input_tokens as usize;
        if prompt_len == 0 {
            rec.error = Some(AddError::EmptyPrompt.to_string());
        } else if prompt_len + output as usize > limit {
            rec.error = Some(
                AddError::TooLong {
                    prompt: prompt_len,
                    output: output as usize,
                    limit,
                }
                .to_string(),
            );
        }
        if rec.error.is_some() {
            rec.end = Some(rec.arrival);
            run.records.push(rec);
            continue;
        }
        let prompt = config.synth.prompt_tokens(req);
        let found = cache(i, &prompt, output);
        let cached = found.cached_tokens.min(prompt.len().saturating_sub(1));
        let new = prompt.len() - cached;
        let ttft = found.load_s + idle_prefill_s(engine, new);
        rec.first_token = Some(rec.arrival + ttft);
        rec.end = Some(rec.arrival + ttft + f64::from(output - 1) * decode);
        rec.cached_tokens = cached as u32;
        run.counters.queried_blocks += found.queried_blocks as u64;
        run.counters.hit_blocks += found.hit_blocks as u64;
        run.counters.prefill_tokens += new as u64;
        run.records.push(rec);
    }
    run
}

/// The oracle's records for `trace` under `config` (same prompts and engine limits).
pub fn oracle(trace: &Trace, config: &SimConfig) -> PolicyRun {
    let block_size = config.engine.block_size;
    let seed = request_seed(&config.model, None, None);
    let mut seen: HashSet<u64> = HashSet::new();
    reference_run(NAME, trace, config, |_, prompt, _| {
        let hashes = block_hashes(seed, prompt, block_size);
        let hit = hashes.iter().take_while(|h| seen.contains(&h.0)).count();
        seen.extend(hashes.iter().map(|h| h.0));
        Lookup {
            queried_blocks: hashes.len(),
            hit_blocks: hit,
            cached_tokens: hit * block_size,
            load_s: 0.0,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::reference_tests;

    fn req(at: f64, ids: &[u64], tokens: u32) -> crate::workload::trace::TraceRequest {
        reference_tests::req(at, ids, tokens, 3)
    }

    #[test]
    fn second_request_pays_only_for_new_blocks() {
        let config = SimConfig::default();
        let trace = Trace::new(vec![req(0.0, &[1, 2], 128), req(1.0, &[1, 2, 3], 192)]);
        let run = oracle(&trace, &config);
        let e = &config.engine;
        let a = &run.records[0];
        assert!((a.ttft().unwrap() - idle_prefill_s(e, 128)).abs() < 1e-12);
        let b = &run.records[1];
        assert_eq!(b.cached_tokens, 128);
        assert!((b.ttft().unwrap() - idle_prefill_s(e, 64)).abs() < 1e-12);
        assert!((b.e2e().unwrap() - b.ttft().unwrap() - 2.0 * idle_decode_s(e)).abs() < 1e-12);
        assert_eq!(run.counters.hit_blocks, 2);
    }

    #[test]
    fn chunked_prefill_costs_more_than_one_chunk() {
        let e = SimConfig::default().engine;
        assert!(idle_prefill_s(&e, 16_384) > idle_prefill_s(&e, 8192) * 2.0 - 1e-12);
    }

    #[test]
    fn a_long_prefill_threshold_caps_each_step_of_a_lone_prompt() {
        let mut e = SimConfig::default().engine;
        let whole = idle_prefill_s(&e, 8192);
        e.long_prefill_token_threshold = 4096;
        let capped = idle_prefill_s(&e, 8192);
        let ms = 2.0 * e.timing.prefill_ms(4096) / 1000.0 / e.timing.speedup;
        assert!((capped - ms).abs() < 1e-12);
        assert!(capped > whole);
    }
}
