//! Deterministic prose for tokenization benches: a mix of English, punctuation, numbers,
//! accents and CJK, so a BPE tokenizer does representative work.

const WORDS: &[&str] = &[
    "the",
    "router",
    "caches",
    "blocks",
    "of",
    "tokens",
    "and",
    "routes",
    "requests",
    "to",
    "workers",
    "holding",
    "their",
    "longest",
    "prefix,",
    "unless",
    "queues",
    "cost",
    "more;",
    "prefill",
    "throughput",
    "latency",
    "(p99)",
    "is",
    "measured",
    "in",
    "milliseconds",
    "—",
    "Überprüfung",
    "naïve",
    "東京",
    "2026-11-29",
    "x86_64",
    "JSON",
    "{\"k\":",
    "1}",
    "e.g.",
    "kv-cache",
    "scheduler",
    "preemption",
    "eviction",
    "LRU",
    "policy",
    "assistant",
    "user",
];

/// `words` pseudo-random words, distinct per `seed`, starting with `[seed] `.
pub fn words(words: usize, seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut s = format!("[{seed}] ");
    for i in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % WORDS.len() as u64) as usize]);
        s.push(if i % 23 == 22 { '\n' } else { ' ' });
    }
    s
}
