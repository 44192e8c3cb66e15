//! The engine's own block ids for its prefix cache.
//!
//! A real engine names a cached block by a hash the router cannot reproduce (vLLM's depends on
//! `PYTHONHASHSEED`, the hash algorithm, extra keys and LoRA). The simulated engine keeps that
//! property on purpose: its hashes use a construction different from
//! [`kvroute_router::tokens::chain_hash`] (parent *after* the tokens, a domain tag, a seed mixed from
//! the engine's `--seed`), so a router that works against it has to map engine hashes from
//! the `token_ids` of `BlockStored` events, exactly as it must against vLLM.

use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

use kvroute_router::kv_events::EngineHash;

/// Separates engine hashes from every other xxh3 use in the crate.
const ENGINE_DOMAIN: u64 = 0x6b76_656e_6769_6e65; // "kvengine"

/// Computes chained engine block hashes for one engine instance.
#[derive(Clone, Copy, Debug)]
pub struct EngineHasher {
    seed: u64,
}

impl EngineHasher {
    /// A hasher whose ids depend on `engine_seed`, like vLLM's depend on its hash seed.
    pub fn new(engine_seed: u64) -> Self {
        EngineHasher {
            seed: ENGINE_DOMAIN ^ engine_seed.rotate_left(17),
        }
    }

    /// The seed of one request's chain: requests with different cache salts never share
    /// blocks, as vLLM puts the salt in the first block's extra keys.
    pub fn chain_seed(&self, cache_salt: Option<&str>) -> u64 {
        match cache_salt {
            None => self.seed,
            Some(salt) => xxh3_64_with_seed(salt.as_bytes(), self.seed) | 1,
        }
    }

    /// Hash of one full block given its parent's hash.
    pub fn hash(&self, chain_seed: u64, parent: Option<EngineHash>, tokens: &[u32]) -> EngineHash {
        let mut h = Xxh3::with_seed(chain_seed);
        h.update(b"blk");
        for t in tokens {
            h.update(&t.to_be_bytes());
        }
        match parent {
            Some(p) => h.update(&p.0.to_be_bytes()),
            None => h.update(b"root"),
        }
        EngineHash(h.digest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_router::tokens::{HashSeed, block_hashes};

    #[test]
    fn differs_from_kvroute_hash_and_across_seeds_and_salts() {
        let toks: Vec<u32> = (0..16).collect();
        let h = EngineHasher::new(0);
        let e = h.hash(h.chain_seed(None), None, &toks);
        let k = block_hashes(HashSeed::new("m", None, None), &toks, 16)[0];
        assert_ne!(e.0, k.0);
        let other = EngineHasher::new(1);
        assert_ne!(e, other.hash(other.chain_seed(None), None, &toks));
        assert_ne!(e, h.hash(h.chain_seed(Some("a")), None, &toks));
        assert_ne!(
            h.hash(h.chain_seed(Some("a")), None, &toks),
            h.hash(h.chain_seed(Some("b")), None, &toks)
        );
    }

    #[test]
    fn chained_on_parent() {
        let h = EngineHasher::new(7);
        let s = h.chain_seed(None);
        let toks: Vec<u32> = (0..16).collect();
        let a = h.hash(s, None, &toks);
        assert_eq!(a, h.hash(s, None, &toks));
        assert_ne!(
            h.hash(s, Some(a), &toks),
            h.hash(s, Some(EngineHash(1)), &toks)
        );
    }
}
