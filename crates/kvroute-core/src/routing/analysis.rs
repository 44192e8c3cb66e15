//! What routing knows about a request's prompt.

use std::time::Duration;

use super::isolation::Standing;
use crate::index::{Holdings, Overlaps, SessionKey};
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
    /// When it was analysed, on the index clock (working sets are counted at this time).
    pub at: Duration,
    /// The request's time-to-first-token target in seconds, if it has one (`slo`).
    pub ttft_target_s: Option<f64>,
    /// The session the client named (an affinity hint), if any.
    pub session: Option<SessionKey>,
    /// The request's tenant and its stance in placement isolation (`isolation`), if the
    /// caller knows them: its tenant is counted on the chosen worker, and its candidates
    /// narrowed as its stance says.
    pub standing: Option<Standing>,
    /// The engine will not read its prefix cache for this request (prompt logprobs): no reuse
    /// is predicted anywhere, not even from a hint.
    pub no_reuse: bool,
}

impl Analysis {
    /// What a load-only policy sees: nothing of the prompt (no tokenization, no lookup).
    pub fn load_only() -> Analysis {
        Analysis::default()
    }

    /// Hashes `ids` in `block_size`-token blocks from `seed` (model, adapter, tenant salt) and
    /// looks the blocks up in `holdings` at `now` (the index clock; predictions expire on it).
    ///
    /// Only the blocks an engine can actually reuse are looked up (see [`reusable_blocks`]), so
    /// the overlaps, the cost model and `/debug/route` all predict what the engine will report
    /// as `cached_tokens`. The hashes stay complete: once prefilled, the worker holds every
    /// full block, the last one included.
    pub fn of_prompt(
        ids: &[u32],
        seed: HashSeed,
        block_size: usize,
        holdings: &Holdings,
        now: Duration,
    ) -> Analysis {
        let hashes = block_hashes(seed, ids, block_size);
        Analysis::of_hashes(hashes, ids.len(), block_size, holdings, now)
    }

    /// [`Self::of_prompt`] for a prompt already hashed: `hashes` of its `prompt_tokens` ids in
    /// `block_size`-token blocks (for ids that are walked, not held as a slice:
    /// [`crate::tokens::block_hashes_of`]).
    pub fn of_hashes(
        hashes: Vec<BlockHash>,
        prompt_tokens: usize,
        block_size: usize,
        holdings: &Holdings,
        now: Duration,
    ) -> Analysis {
        let reusable = reusable_blocks(prompt_tokens, block_size).min(hashes.len());
        let overlaps = if reusable == 0 {
            Overlaps::default()
        } else {
            holdings.lookup(&hashes[..reusable], now)
        };
        let warm_prefix_rate = holdings
            .prefix_rates
            .rate(&hashes, overlaps.max() as usize, now);
        Analysis {
            request: RouteRequest {
                prompt_tokens: prompt_tokens as u64,
                blocks: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
                block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
                kv_bytes_per_token: 0,
                warm_prefix_rate,
            },
            hashes,
            overlaps,
            at: now,
            ttft_target_s: None,
            session: None,
            standing: None,
            no_reuse: false,
        }
    }

    /// The blocks past `worker`'s GPU prefix it holds in host memory and on disk, at most the
    /// reusable ones.
    pub fn lower_blocks(&self, worker: crate::fleet::WorkerId) -> crate::policy::LowerBlocks {
        let [cpu, disk] = self.overlaps.lower(worker);
        crate::policy::LowerBlocks { cpu, disk }
    }

    /// Prompt tokens a worker holding `overlap_blocks` leading blocks still has to compute.
    pub fn uncached_tokens(&self, overlap_blocks: u32) -> u64 {
        let cached = u64::from(overlap_blocks) * u64::from(self.request.block_size);
        self.request.prompt_tokens.saturating_sub(cached)
    }
}

/// How many leading full blocks of a `prompt_tokens`-token prompt an engine can serve from its
/// prefix cache: vLLM and SGLang always compute at least the last prompt token (its logits give
/// the first output token), so a fully cached prompt that is an exact multiple of the block size
/// reuses one block fewer than it holds (320 tokens at block size 32: 288 cached, not 320).
pub fn reusable_blocks(prompt_tokens: usize, block_size: usize) -> usize {
    prompt_tokens
        .saturating_sub(1)
        .checked_div(block_size)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::WorkerId;
    use crate::index::{ApproxConfig, ApproxIndex, IndexConfig, KvIndex};

    #[test]
    fn the_last_prompt_token_is_never_reused() {
        assert_eq!(reusable_blocks(320, 32), 9);
        assert_eq!(reusable_blocks(321, 32), 10);
        assert_eq!(reusable_blocks(32, 32), 0);
        assert_eq!(reusable_blocks(33, 32), 1);
        assert_eq!(reusable_blocks(0, 32), 0);
        assert_eq!(reusable_blocks(10, 0), 0);
    }

    /// A worker holding every block of a prompt that is an exact multiple of the block size is
    /// predicted to reuse all but the last block; one token more and it reuses them all.
    #[test]
    fn a_full_hit_predicts_what_the_engine_reuses() {
        let w = WorkerId(3);
        let seed = HashSeed::new("m", None, None);
        let holdings = Holdings::new(
            KvIndex::new(IndexConfig::default()),
            ApproxIndex::new(ApproxConfig {
                ttl: Duration::from_secs(60),
                capacity_per_worker: 1_000,
            }),
        );
        let ids: Vec<u32> = (0..320).collect();
        let all = block_hashes(seed, &ids, 32);
        holdings
            .approx
            .record_routed(w, &all, Duration::from_secs(1));
        let now = Duration::from_secs(2);

        let exact_multiple = Analysis::of_prompt(&ids, seed, 32, &holdings, now);
        assert_eq!(exact_multiple.hashes.len(), 10);
        assert_eq!(exact_multiple.overlaps.get(w), 9);
        assert_eq!(exact_multiple.uncached_tokens(9), 32);

        let longer: Vec<u32> = (0..321).collect();
        let one_more = Analysis::of_prompt(&longer, seed, 32, &holdings, now);
        assert_eq!(one_more.overlaps.get(w), 10);
        assert_eq!(one_more.uncached_tokens(10), 1);
    }
}
