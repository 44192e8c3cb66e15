//! A worker's data-parallel ranks as its engine reports them, against its configuration.
//!
//! A vLLM server with `--data-parallel-size N` labels its metrics per engine core
//! (`engine="0"` … `engine="N-1"`), SGLang with `--dp-size N` per `dp_rank`. A server given to
//! the router without `data_parallel_size` is routed as one KV cache: the engine spreads its
//! requests over its ranks, and a repeated prompt lands on a rank that has never seen it (a
//! check measured 0 % cached tokens). The load poller reads those metrics anyway, so it tells
//! when they disagree with the configuration: a warning in the log and
//! `kvroute_worker_data_parallel_mismatch{worker}` (with `[health] load_interval_ms = 0` the
//! poller is off, and so is this check).
//!
//! The ranks are not adopted: each rank is a target with its own number, index entries, load,
//! calibration and KV-event feed (on the event port plus its rank), so changing a worker's
//! ranks means it leaves and joins again under new numbers, which is the operator's edit of
//! its `data_parallel_size` (a config reload does exactly that); and a server whose metrics
//! list several engines may also be balanced outside the router on purpose. A wrong guess
//! either way costs requests (a pin to a rank the server does not have is a 400), a warning
//! costs nothing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};

use super::capacity::Sample;

/// The number of distinct data-parallel ranks a Prometheus text exposition names: values of
/// vLLM's `engine` label on `vllm:` series and of SGLang's `dp_rank` on `sglang:` series.
/// `None` when no series names one (an engine that does not say, or not an engine).
pub fn listed_ranks(text: &str) -> Option<u32> {
    let mut ranks: BTreeSet<&str> = BTreeSet::new();
    for line in text.lines() {
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        let rank = if sample.name.starts_with("vllm:") {
            sample.label("engine")
        } else if sample.name.starts_with("sglang:") {
            sample.label("dp_rank")
        } else {
            None
        };
        ranks.extend(rank);
    }
    (!ranks.is_empty()).then(|| u32::try_from(ranks.len()).unwrap_or(u32::MAX))
}

/// The ranks a worker's engine last listed in its metrics (0: not read yet).
#[derive(Debug, Default)]
pub struct EngineRanks(AtomicU32);

impl EngineRanks {
    /// Records that the engine of worker `id`, configured with `configured` ranks, lists
    /// `listed`; logs a warning when they start to disagree (or disagree differently) and a
    /// note when they agree again.
    pub fn observe(&self, id: &str, configured: u32, listed: u32) {
        let before = self.0.swap(listed, Ordering::Relaxed);
        if before == listed {
            return;
        }
        let was_wrong = before != 0 && before != configured;
        if listed != configured {
            tracing::warn!(
                worker = id,
                configured,
                listed,
                "the worker's engine lists {listed} data-parallel ranks in its metrics, but it is \
                 configured with data_parallel_size = {configured}: routed so, each rank's KV \
                 cache is missed or a rank that is not there is pinned; set data_parallel_size \
                 = {listed} if the server is one data-parallel deployment behind one port"
            );
        } else if was_wrong {
            tracing::info!(
                worker = id,
                configured,
                "the worker's engine lists its configured data-parallel ranks again"
            );
        }
    }

    /// The ranks the engine last listed, once read.
    pub fn listed(&self) -> Option<u32> {
        Some(self.0.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    /// Whether the engine last listed another number of ranks than `configured`.
    pub fn disagrees(&self, configured: u32) -> bool {
        self.listed().is_some_and(|n| n != configured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_ranks_vllm_and_sglang_label() {
        let vllm = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n\
                    vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0\n\
                    vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n\
                    vllm:num_requests_waiting{engine=\"2\",model_name=\"m\"} 0\n";
        assert_eq!(listed_ranks(vllm), Some(3));
        let one = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n";
        assert_eq!(listed_ranks(one), Some(1));
        // One rank of an externally balanced deployment names its own index only.
        let external = "vllm:num_requests_running{engine=\"3\",model_name=\"m\"} 1\n";
        assert_eq!(listed_ranks(external), Some(1));
        let sglang = "sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 1\n\
                      sglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"0\"} 1\n\
                      sglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"1\"} 1\n";
        assert_eq!(listed_ranks(sglang), Some(2));
        // No rank labels, or labels on series that are not an engine's: unknown.
        assert_eq!(
            listed_ranks("sglang:num_running_reqs{tp_rank=\"0\"} 1\n"),
            None
        );
        assert_eq!(listed_ranks("process_cpu{engine=\"1\"} 1\n"), None);
        assert_eq!(listed_ranks(""), None);
    }

    #[test]
    fn a_disagreement_is_known_until_the_engine_agrees() {
        let r = EngineRanks::default();
        assert!(!r.disagrees(1), "unknown is no disagreement");
        r.observe("w", 1, 4);
        assert_eq!(r.listed(), Some(4));
        assert!(r.disagrees(1));
        r.observe("w", 1, 1);
        assert!(!r.disagrees(1));
        r.observe("w", 2, 1);
        assert!(r.disagrees(2), "configured ranks the engine does not have");
    }
}
