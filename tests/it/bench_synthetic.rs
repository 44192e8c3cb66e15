//! Synthetic workloads: determinism and the property each one exists to exercise.

use std::collections::{HashMap, HashSet};

use kvroute::workload::synthetic::{SyntheticKind, SyntheticSpec};
use kvroute::workload::trace::Trace;

fn spec(kind: SyntheticKind) -> SyntheticSpec {
    SyntheticSpec {
        kind,
        requests: 2_000,
        rate: 50.0,
        input_tokens: 200,
        output_tokens: 40,
        block_tokens: 64,
        seed: 11,
    }
}

fn shared() -> SyntheticKind {
    SyntheticKind::SharedPrefix {
        prefixes: 10,
        prefix_tokens: 1000,
        zipf_s: 1.2,
    }
}

fn multi_turn() -> SyntheticKind {
    SyntheticKind::MultiTurn {
        turns: 5,
        think_s: 1.0,
    }
}

fn check_common(t: &Trace, s: &SyntheticSpec) {
    assert_eq!(t.len(), s.requests);
    assert!(
        t.requests
            .windows(2)
            .all(|w| w[0].arrival_s <= w[1].arrival_s)
    );
    for r in &t.requests {
        assert_eq!(r.block_tokens, s.block_tokens);
        assert_eq!(
            r.hash_ids.len(),
            r.input_tokens.div_ceil(s.block_tokens) as usize
        );
        assert!(r.output_tokens >= 1);
    }
}

#[test]
fn same_seed_same_trace_other_seed_differs() {
    for kind in [
        shared(),
        multi_turn(),
        SyntheticKind::Unique,
        SyntheticKind::HotPrefix {
            prefix_tokens: 512,
            hot_fraction: 0.8,
        },
    ] {
        let s = spec(kind);
        let a = s.generate().unwrap();
        check_common(&a, &s);
        assert_eq!(a, s.generate().unwrap());
        let other = SyntheticSpec {
            seed: 12,
            ..s.clone()
        };
        assert_ne!(a, other.generate().unwrap());
    }
}

#[test]
fn arrivals_are_near_the_requested_rate() {
    let s = spec(SyntheticKind::Unique);
    let t = s.generate().unwrap();
    let rate = t.len() as f64 / t.requests.last().unwrap().arrival_s;
    // 2,000 exponential gaps: the mean is within a few percent; allow a wide band.
    assert!((40.0..60.0).contains(&rate), "{rate}");
}

#[test]
fn shared_prefix_popularity_is_zipf_skewed() {
    let s = spec(shared());
    let t = s.generate().unwrap();
    // 1000 tokens round up to 16 blocks of 64: the first 16 ids name the prompt.
    let mut counts: HashMap<Vec<u64>, usize> = HashMap::new();
    for r in &t.requests {
        assert!(r.input_tokens >= 16 * 64);
        *counts.entry(r.hash_ids[..16].to_vec()).or_default() += 1;
    }
    let mut c: Vec<usize> = counts.values().copied().collect();
    c.sort_unstable_by(|a, b| b.cmp(a));
    assert!(c.len() <= 10 && c.len() >= 8, "{c:?}");
    // Rank 1 of zipf(10, 1.2) has ~38 % of the mass, rank 10 ~2 %.
    assert!(c[0] > 2 * c[2], "{c:?}");
    assert!(c[0] > 500, "{c:?}");
    // The question after the prefix is unique to each request.
    let tails: HashSet<u64> = t.requests.iter().map(|r| r.hash_ids[16]).collect();
    assert_eq!(tails.len(), t.len());
}

#[test]
fn unique_prompts_share_nothing() {
    let t = spec(SyntheticKind::Unique).generate().unwrap();
    let mut seen = HashSet::new();
    for r in &t.requests {
        for id in &r.hash_ids {
            assert!(seen.insert(*id), "id {id} reused");
        }
    }
}

#[test]
fn multi_turn_turns_extend_previous_prompts() {
    let s = spec(multi_turn());
    let t = s.generate().unwrap();
    // Group by first block id (each conversation's first block is fresh).
    let mut by_conv: HashMap<u64, Vec<&kvroute::workload::TraceRequest>> = HashMap::new();
    for r in &t.requests {
        by_conv.entry(r.hash_ids[0]).or_default().push(r);
    }
    assert!(by_conv.len() >= 400, "{}", by_conv.len());
    let mut extended = 0;
    for turns in by_conv.values() {
        assert!(turns.len() <= 5);
        for w in turns.windows(2) {
            let (prev, next) = (w[0], w[1]);
            assert!(next.arrival_s >= prev.arrival_s);
            assert!(next.input_tokens > prev.input_tokens + prev.output_tokens);
            assert!(
                next.hash_ids.starts_with(&prev.hash_ids),
                "turn does not extend"
            );
            extended += 1;
        }
    }
    assert!(extended > 1_000, "{extended}");
}

#[test]
fn multi_turn_token_prompts_are_prefixes() {
    let s = SyntheticSpec {
        requests: 20,
        ..spec(multi_turn())
    };
    let t = s.generate().unwrap();
    let synth = kvroute::workload::synthesis::PromptSynth::default();
    let mut checked = 0;
    for a in &t.requests {
        for b in &t.requests {
            if a.hash_ids[0] == b.hash_ids[0] && a.input_tokens < b.input_tokens {
                let pa = synth.prompt_tokens(a);
                let pb = synth.prompt_tokens(b);
                assert_eq!(pa[..], pb[..pa.len()]);
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn hot_prefix_carries_the_requested_fraction() {
    let s = spec(SyntheticKind::HotPrefix {
        prefix_tokens: 640,
        hot_fraction: 0.9,
    });
    let t = s.generate().unwrap();
    let hot: Vec<u64> = (0..10).collect();
    let n = t
        .requests
        .iter()
        .filter(|r| r.hash_ids.starts_with(&hot))
        .count();
    let frac = n as f64 / t.len() as f64;
    assert!((0.85..0.95).contains(&frac), "{frac}");
}

#[test]
fn invalid_specs_are_errors() {
    for bad in [
        SyntheticSpec {
            rate: 0.0,
            ..spec(SyntheticKind::Unique)
        },
        SyntheticSpec {
            block_tokens: 0,
            ..spec(SyntheticKind::Unique)
        },
        spec(SyntheticKind::SharedPrefix {
            prefixes: 0,
            prefix_tokens: 1,
            zipf_s: 1.0,
        }),
        spec(SyntheticKind::MultiTurn {
            turns: 0,
            think_s: 1.0,
        }),
        spec(SyntheticKind::HotPrefix {
            prefix_tokens: 1,
            hot_fraction: 1.5,
        }),
    ] {
        assert!(bad.generate().is_err(), "{bad:?}");
    }
}
