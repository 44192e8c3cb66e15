//! Random sequences of KV events against a plain reference model: the index's lookups and
//! entry counts must agree with it exactly after every step.

use std::collections::{HashMap, HashSet};

use kvroute::fleet::WorkerId;
use kvroute::index::{IndexConfig, KvIndex};
use kvroute::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent};
use kvroute::tokens::{BlockHash, HashSeed, chain_hash};
use proptest::prelude::*;

const BS: usize = 2;
const WORKERS: u32 = 40; // more than one 32-worker page

fn seed() -> HashSeed {
    HashSeed::new("m", None, None)
}

fn seeds(_: Option<&str>, _: Option<&str>) -> HashSeed {
    seed()
}

/// Tokens of a chain: a few variants per position so chains share prefixes and diverge.
fn chain_tokens(variants: &[u8]) -> Vec<u32> {
    variants
        .iter()
        .enumerate()
        .flat_map(|(i, v)| [i as u32, u32::from(*v)])
        .collect()
}

fn chain(variants: &[u8]) -> Vec<BlockHash> {
    let mut parent = None;
    chain_tokens(variants)
        .chunks(BS)
        .map(|t| {
            let h = chain_hash(seed(), parent, t);
            parent = Some(h);
            h
        })
        .collect()
}

/// Engine ids depend on the worker and content, like a real engine's.
fn engine_id(worker: u32, block: BlockHash) -> EngineHash {
    EngineHash(block.0.rotate_left(worker) ^ u64::from(worker))
}

#[derive(Clone, Debug)]
enum Op {
    /// Worker stores blocks `from..` of the chain, continuing from block `from - 1`.
    Store {
        worker: u32,
        variants: Vec<u8>,
        from: usize,
    },
    /// Worker removes block `at` of the chain (if it holds it).
    Remove {
        worker: u32,
        variants: Vec<u8>,
        at: usize,
    },
    Clear {
        worker: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let variants = prop::collection::vec(0u8..3, 1..8);
    prop_oneof![
        6 => (0..WORKERS, variants.clone(), 0usize..4)
            .prop_map(|(worker, variants, from)| Op::Store { worker, variants, from }),
        3 => (0..WORKERS, variants, 0usize..8)
            .prop_map(|(worker, variants, at)| Op::Remove { worker, variants, at }),
        1 => (0..WORKERS).prop_map(|worker| Op::Clear { worker }),
    ]
}

fn batch(e: KvEvent) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events: vec![e],
        dp_rank: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn index_agrees_with_a_reference_model(ops in prop::collection::vec(op(), 1..60)) {
        let idx = KvIndex::new(IndexConfig::default());
        let mut held: HashMap<u32, HashSet<BlockHash>> = HashMap::new();
        let mut probes: Vec<Vec<BlockHash>> = Vec::new();
        for op in &ops {
            match op {
                Op::Store { worker, variants, from } => {
                    let hashes = chain(variants);
                    let from = (*from).min(hashes.len() - 1);
                    let toks = chain_tokens(variants);
                    let parent = from.checked_sub(1).map(|p| engine_id(*worker, hashes[p]));
                    let ev = KvEvent::Stored(BlockStored {
                        block_hashes: hashes[from..].iter().map(|h| engine_id(*worker, *h)).collect(),
                        parent_block_hash: parent,
                        token_ids: toks[from * BS..].to_vec(),
                        block_size: BS as u32,
                        ..BlockStored::default()
                    });
                    idx.apply(WorkerId(*worker), &batch(ev), &seeds);
                    let set = held.entry(*worker).or_default();
                    // The model: placed only if the parent is held (or there is none).
                    if from == 0 || set.contains(&hashes[from - 1]) {
                        set.extend(&hashes[from..]);
                    }
                    probes.push(hashes);
                }
                Op::Remove { worker, variants, at } => {
                    let hashes = chain(variants);
                    let at = (*at).min(hashes.len() - 1);
                    let ev = KvEvent::Removed(BlockRemoved {
                        block_hashes: vec![engine_id(*worker, hashes[at])],
                        ..BlockRemoved::default()
                    });
                    idx.apply(WorkerId(*worker), &batch(ev), &seeds);
                    held.entry(*worker).or_default().remove(&hashes[at]);
                }
                Op::Clear { worker } => {
                    idx.apply(WorkerId(*worker), &batch(KvEvent::AllCleared), &seeds);
                    held.remove(worker);
                }
            }
            let pairs: usize = held.values().map(HashSet::len).sum();
            prop_assert_eq!(idx.entries(), pairs);
            for p in &probes {
                let o = idx.lookup(p);
                for w in 0..WORKERS {
                    let expected = held
                        .get(&w)
                        .map_or(0, |s| p.iter().take_while(|b| s.contains(b)).count());
                    prop_assert_eq!(o.get(WorkerId(w)) as usize, expected, "worker {}", w);
                }
            }
        }
    }
}
