//! A worker's KV cache capacity, read from the metrics its engine already exports.
//!
//! The exact index keeps, per worker, a map from the engine's block ids to kvroute blocks. A
//! cache that serves traffic fills up (engines evict only when they need room), so that map
//! reaches the cache's size in blocks anyway; knowing the size up front lets the index allocate
//! it once instead of growing it, each growth step moving every entry under the index's write
//! lock while lookups wait. Engines publish the size:
//!
//! - vLLM: `vllm:cache_config_info{…,num_gpu_blocks="N",…} 1`, one series per engine core
//!   (`engine` label; a data-parallel deployment behind one endpoint has one per rank, and
//!   kvroute sees them as one worker, so the ranks add up);
//! - SGLang: `sglang:max_total_num_tokens` and `sglang:page_size` gauges (tokens per KV block
//!   is the page size), per `dp_rank` when data-parallel.
//!
//! Anything else (no such series, `num_gpu_blocks="None"` before the engine profiled its
//! memory, unparseable values) gives no capacity: the index then grows as before.
//!
//! The sample lines are read by hand: the Prometheus text parser on crates.io
//! (`prometheus-parse` 0.2.5) matches metric names with `\w+`, which rejects the colons in
//! vLLM's and SGLang's names, and the two series needed here take a few lines to read.

use std::collections::BTreeMap;

/// The KV cache capacity in blocks found in a Prometheus text exposition, if any.
pub fn parse_kv_blocks(text: &str) -> Option<usize> {
    let mut vllm: BTreeMap<String, u64> = BTreeMap::new();
    let mut sglang_tokens: BTreeMap<String, f64> = BTreeMap::new();
    let mut sglang_page: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines() {
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        match sample.name {
            "vllm:cache_config_info" => {
                if let Some(n) = sample.label("num_gpu_blocks").and_then(|v| v.parse().ok()) {
                    let rank = sample.label("engine").unwrap_or_default().to_string();
                    let slot = vllm.entry(rank).or_default();
                    *slot = (*slot).max(n);
                }
            }
            "sglang:max_total_num_tokens" | "sglang:page_size" => {
                let Some(v) = sample.value.filter(|v| v.is_finite() && *v > 0.0) else {
                    continue;
                };
                let rank = sample.label("dp_rank").unwrap_or_default().to_string();
                let map = if sample.name == "sglang:page_size" {
                    &mut sglang_page
                } else {
                    &mut sglang_tokens
                };
                // Tensor-parallel ranks of one replica share a cache: not added up.
                let slot = map.entry(rank).or_default();
                *slot = slot.max(v);
            }
            _ => {}
        }
    }
    let vllm_blocks: u64 = vllm.values().sum();
    if vllm_blocks > 0 {
        return usize::try_from(vllm_blocks).ok();
    }
    let sglang_blocks: f64 = sglang_tokens
        .iter()
        .filter_map(|(rank, tokens)| {
            let page = sglang_page.get(rank).or_else(|| sglang_page.get(""))?;
            Some((tokens / page).floor())
        })
        .sum();
    (sglang_blocks >= 1.0 && sglang_blocks < usize::MAX as f64).then_some(sglang_blocks as usize)
}

/// One sample line: `name{label="value",…} value [timestamp]`.
pub struct Sample<'a> {
    /// The metric's name.
    pub name: &'a str,
    labels: &'a str,
    /// The value, if it parses as a number.
    pub value: Option<f64>,
}

impl<'a> Sample<'a> {
    pub fn parse(line: &'a str) -> Option<Sample<'a>> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let close = open + line[open..].rfind('}')?;
                (&line[..open], &line[open + 1..close], &line[close + 1..])
            }
            None => {
                let space = line.find(char::is_whitespace)?;
                (&line[..space], "", &line[space..])
            }
        };
        let value = rest.split_whitespace().next().and_then(|v| v.parse().ok());
        Some(Sample {
            name: name.trim(),
            labels,
            value,
        })
    }

    /// The value of label `key` (escapes are not needed for the numbers read here).
    pub fn label(&self, key: &str) -> Option<&'a str> {
        let mut rest = self.labels;
        while !rest.is_empty() {
            let eq = rest.find('=')?;
            let name = rest[..eq].trim().trim_start_matches(',').trim();
            let after = rest[eq + 1..].trim_start().strip_prefix('"')?;
            let end = quoted_end(after)?;
            if name == key {
                return Some(&after[..end]);
            }
            rest = &after[end + 1..];
        }
        None
    }
}

/// Index of the closing quote of a label value, skipping backslash escapes.
fn quoted_end(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vLLM 0.10 `cache_config_info` line, as its `/metrics` prints it.
    const VLLM: &str = r#"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.82",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="573",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space_bytes="4294967296"} 1.0
vllm:num_requests_running{engine="0",model_name="qwen"} 0.0
"#;

    #[test]
    fn reads_vllm_num_gpu_blocks() {
        assert_eq!(parse_kv_blocks(VLLM), Some(573));
    }

    #[test]
    fn data_parallel_vllm_ranks_add_up_and_repeats_do_not() {
        let text = r#"vllm:cache_config_info{engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{engine="1",num_gpu_blocks="1200"} 1.0
vllm:cache_config_info{engine="1",num_gpu_blocks="1200"} 1.0
"#;
        assert_eq!(parse_kv_blocks(text), Some(2200));
    }

    #[test]
    fn unknown_or_missing_capacity_gives_none() {
        for text in [
            "",
            "vllm:num_requests_running 0\n",
            r#"vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0"#,
            r#"vllm:cache_config_info{num_gpu_blocks="-5"} 1.0"#,
            r#"vllm:cache_config_info{num_gpu_blocks="12"#,
            "sglang:max_total_num_tokens 4096\n",
            "sglang:page_size 16\n",
            "sglang:max_total_num_tokens NaN\nsglang:page_size 16\n",
        ] {
            assert_eq!(parse_kv_blocks(text), None, "{text:?}");
        }
    }

    #[test]
    fn reads_sglang_tokens_over_page_size() {
        let text = r#"# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="qwen",engine_type="unified",tp_rank="0",pp_rank="0"} 471258.0
sglang:max_total_num_tokens{model_name="qwen",engine_type="unified",tp_rank="1",pp_rank="0"} 471258.0
sglang:page_size{model_name="qwen",tp_rank="0"} 16.0
"#;
        assert_eq!(parse_kv_blocks(text), Some(471258 / 16));
    }

    #[test]
    fn sglang_dp_ranks_add_up() {
        let text = r#"sglang:max_total_num_tokens{dp_rank="0"} 1600
sglang:max_total_num_tokens{dp_rank="1"} 3200
sglang:page_size{dp_rank="0"} 16
sglang:page_size{dp_rank="1"} 16
"#;
        assert_eq!(parse_kv_blocks(text), Some(300));
    }

    #[test]
    fn label_values_with_commas_and_escaped_quotes_are_skipped_correctly() {
        let text = r#"vllm:cache_config_info{note="a,b=\"c\"",num_gpu_blocks="42"} 1"#;
        assert_eq!(parse_kv_blocks(text), Some(42));
    }
}
