//! Recomputing kvroute hashes from a BlockStored's tokens, on the event path.
//!
//! Exactly [`crate::tokens::chain_hash`], with a buffer sized for engine block sizes
//! (≤ 64 tokens) instead of 4 KiB: zeroing the larger stack buffer cost more than the hash
//! itself for 16-token blocks (~100 ns of a ~60 ns budget per applied block). Larger blocks use
//! `chain_hash` unchanged. A test pins the two to the same output.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::tokens::{BlockHash, HashSeed, chain_hash};

const SMALL_BLOCK: usize = 64;

/// Hash of one block given its parent's hash; identical to [`chain_hash`].
#[inline]
pub(crate) fn chain_hash_small(
    seed: HashSeed,
    parent: Option<BlockHash>,
    tokens: &[u32],
) -> BlockHash {
    // The common block sizes get a buffer of exactly their size (a few vector stores to
    // clear), the others up to 64 tokens a shared one, larger blocks the general function.
    match tokens.len() {
        16 => hash_in::<{ 8 + 4 * 16 }>(seed, parent, tokens),
        32 => hash_in::<{ 8 + 4 * 32 }>(seed, parent, tokens),
        n if n <= SMALL_BLOCK => hash_in::<{ 8 + 4 * SMALL_BLOCK }>(seed, parent, tokens),
        _ => chain_hash(seed, parent, tokens),
    }
}

/// [`chain_hash`] in a `B`-byte stack buffer; `tokens` must fit (`8 + 4 × len ≤ B`).
#[inline]
fn hash_in<const B: usize>(seed: HashSeed, parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut buf = [0u8; B];
    for (dst, t) in buf[8..].chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    let end = (8 + 4 * tokens.len()).min(B);
    match parent {
        None => BlockHash(xxh3_64_with_seed(&buf[8..end], seed.0)),
        Some(p) => {
            buf[..8].copy_from_slice(&p.0.to_le_bytes());
            BlockHash(xxh3_64(&buf[..end]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_shared_chain_hash_for_every_size() {
        let seed = HashSeed::new("m", Some("lora"), Some("salt"));
        let toks: Vec<u32> = (0..200u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        for n in [0, 1, 15, 16, 17, 32, 63, 64, 65, 128, 200] {
            for parent in [None, Some(BlockHash(0xdead_beef)), Some(BlockHash(0))] {
                assert_eq!(
                    chain_hash_small(seed, parent, &toks[..n]),
                    chain_hash(seed, parent, &toks[..n]),
                    "{n} {parent:?}"
                );
            }
        }
    }
}
