//! What routing knows about a request's prompt.

use std::time::Duration;

use crate::index::{Holdings, Overlaps};
use crate::policy::RouteRequest;
use crate::tokens::{BlockHash, HashSeed, block_hashes};

/// A prompt as routing sees it: its size, its block hashes and who holds how many of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Analysis {
    /// The policy's view of the request.
    pub request: RouteRequest,
    /// Chained hashes of the prompt's full blocks (empty for load-only policies).
    pub hashes: Vec<BlockHash>,
    /// Leading blocks held per worker.
    pub overlaps: Overlaps,
}

impl Analysis {
    /// What a load-only policy sees: nothing of the prompt (no tokenization, no lookup).
    pub fn load_only() -> Analysis {
        Analysis::default()
    }

    /// Hashes `ids` in `block_size`-token blocks from `seed` (model, adapter, tenant salt) and
    /// looks the blocks up in `holdings` at `now` (the index clock; predictions expire on it).
    pub fn of_prompt(
        ids: &[u32],
        seed: HashSeed,
        block_size: usize,
        holdings: &Holdings,
        now: Duration,
    ) -> Analysis {
        let hashes = block_hashes(seed, ids, block_size);
        let overlaps = if hashes.is_empty() {
            Overlaps::default()
        } else {
            holdings.lookup(&hashes, now)
        };
        Analysis {
            request: RouteRequest {
                prompt_tokens: ids.len() as u64,
                blocks: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
                block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
            },
            hashes,
            overlaps,
        }
    }

    /// Prompt tokens a worker holding `overlap_blocks` leading blocks still has to compute.
    pub fn uncached_tokens(&self, overlap_blocks: u32) -> u64 {
        let cached = u64::from(overlap_blocks) * u64::from(self.request.block_size);
        self.request.prompt_tokens.saturating_sub(cached)
    }
}
