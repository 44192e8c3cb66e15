//! The KV block size a worker's engine reports, against its models' configured `block_size`.
//!
//! The router hashes a prompt into blocks of the model's `block_size` tokens; an engine that
//! caches blocks of another size holds none of those hashes. With KV events the feed refuses
//! such blocks as they arrive (`index::feed`); without events, or before any, nothing told.
//! Both engines say their size in the metrics the router reads anyway:
//!
//! - vLLM: the `block_size` label of `vllm:cache_config_info` (one series per engine core;
//!   `"None"` while the engine has not resolved it yet);
//! - SGLang: the `sglang:page_size` gauge (its `--page-size`, tokens per KV page).
//!
//! The health checker reads it once per engine life (again after the worker was down:
//! a restarted engine may run with another `--block-size`), and the lifecycle, which knows
//! each model's configured size, names a disagreement: a warning in the log,
//! `kvroute_worker_block_size_mismatch{worker,model}` and the worker's admin status. The
//! size is not adopted: the configuration is the one place the router's hashes are defined,
//! and one model's workers must all agree with it.

use std::sync::atomic::{AtomicU32, Ordering};

use super::capacity::Sample;

/// The KV block size a Prometheus text exposition reports, if it does: vLLM's
/// `vllm:cache_config_info{block_size="N"}`, else SGLang's `sglang:page_size`. Ranks of one
/// engine share one size; the first valid one is taken.
pub fn reported_block_size(text: &str) -> Option<u32> {
    let mut sglang = None;
    for line in text.lines() {
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        match sample.name {
            "vllm:cache_config_info" => {
                if let Some(n) = sample
                    .label("block_size")
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|n| *n > 0)
                {
                    return Some(n);
                }
            }
            "sglang:page_size" if sglang.is_none() => {
                sglang = sample
                    .value
                    .filter(|v| v.is_finite() && *v >= 1.0 && *v <= f64::from(u32::MAX))
                    .map(|v| v as u32);
            }
            _ => {}
        }
    }
    sglang
}

/// The block size a worker's engine last reported (0: not read in this engine life).
#[derive(Debug, Default)]
pub struct EngineBlockSize(AtomicU32);

impl EngineBlockSize {
    /// Records `size`; whether it differs from what was recorded.
    pub fn set(&self, size: u32) -> bool {
        self.0.swap(size, Ordering::Relaxed) != size
    }

    /// The size, once read.
    pub fn reported(&self) -> Option<u32> {
        Some(self.0.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    /// Forgets the size (the engine went down; its successor is read again).
    pub fn forget(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// A model whose configured block size is not the one its worker's engine reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSizeMismatch {
    /// The model.
    pub model: String,
    /// Its `block_size` (or the default).
    pub configured: u32,
    /// The engine's.
    pub reported: u32,
}

impl BlockSizeMismatch {
    /// The warning for worker `worker`, with the fix.
    pub fn warning(&self, worker: &str) -> String {
        let BlockSizeMismatch {
            model,
            configured,
            reported,
        } = self;
        format!(
            "worker `{worker}`'s engine reports KV block size {reported}, but model `{model}` is \
             configured with block_size {configured}: the router's block hashes never match that \
             engine's cache, so its prefix hits are lost; set `block_size = {reported}` in the \
             model's [[models]] entry (or --block-size / KVROUTE_BLOCK_SIZE for unlisted models), \
             or start the engine with --block-size {configured} (SGLang: --page-size)"
        )
    }
}

/// The models among `models` (name, configured block size) whose size is not `reported`.
pub fn mismatches(
    reported: u32,
    models: impl IntoIterator<Item = (String, u32)>,
) -> Vec<BlockSizeMismatch> {
    models
        .into_iter()
        .filter(|(_, configured)| *configured != reported)
        .map(|(model, configured)| BlockSizeMismatch {
            model,
            configured,
            reported,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_and_sglang_sizes() {
        let vllm = "vllm:cache_config_info{block_size=\"32\",cache_dtype=\"auto\",engine=\"0\",\
                    num_gpu_blocks=\"573\"} 1.0\n";
        assert_eq!(reported_block_size(vllm), Some(32));
        let unresolved = "vllm:cache_config_info{block_size=\"None\",engine=\"0\"} 1.0\n";
        assert_eq!(reported_block_size(unresolved), None);
        let sglang = "# TYPE sglang:page_size gauge\nsglang:page_size{tp_rank=\"0\"} 64.0\n";
        assert_eq!(reported_block_size(sglang), Some(64));
        assert_eq!(reported_block_size("sglang:page_size 0\n"), None);
        assert_eq!(reported_block_size("vllm:num_requests_running 1\n"), None);
    }

    #[test]
    fn only_disagreeing_models_are_named() {
        let found = mismatches(32, [("a".into(), 16), ("b".into(), 32)]);
        assert_eq!(
            found,
            vec![BlockSizeMismatch {
                model: "a".into(),
                configured: 16,
                reported: 32
            }]
        );
        let text = found[0].warning("w1");
        for part in ["`w1`", "`a`", "32", "16", "block_size = 32"] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }

    #[test]
    fn a_size_is_known_until_forgotten() {
        let s = EngineBlockSize::default();
        assert_eq!(s.reported(), None);
        assert!(s.set(16));
        assert!(!s.set(16));
        assert_eq!(s.reported(), Some(16));
        s.forget();
        assert_eq!(s.reported(), None);
    }
}
