//! What the reference rows' tests share: trace requests of 64-token blocks and small fleets.

use super::config::SimConfig;
use crate::workload::trace::TraceRequest;

/// A request at `at` seconds of `tokens` prompt tokens over the block ids `ids`, asking for
/// `output` tokens.
pub fn req(at: f64, ids: &[u64], tokens: u32, output: u32) -> TraceRequest {
    TraceRequest {
        arrival_s: at,
        input_tokens: tokens,
        output_tokens: output,
        hash_ids: ids.to_vec(),
        block_tokens: 64,
        session: None,
    }
}

/// `workers` engines of `num_blocks` blocks of 64 tokens, the rest the defaults.
pub fn config(workers: u32, num_blocks: u32) -> SimConfig {
    let mut c = SimConfig {
        workers,
        ..SimConfig::default()
    };
    c.engine.block_size = 64;
    c.engine.num_blocks = num_blocks;
    c
}
