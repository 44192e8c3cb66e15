//! kvroute's own chained block hashes.
//!
//! A prompt is cut into full blocks of `block_size` tokens (the engine's block size); a trailing
//! partial block is never hashed, because engines only cache full blocks. Each block's hash
//! covers its parent's hash, so equal hashes mean equal *prefixes*, not just equal blocks: a
//! lookup can stop at the first block a worker does not hold.
//!
//! The chain is seeded from the model, the LoRA adapter and the tenant's cache salt. Two tenants
//! therefore never share index entries: a cache hit is an optimisation, never an authorisation.
//! Engine hashes are a different thing (see `kv_events`): they are opaque ids we map to ours.

use std::fmt;

use xxhash_rust::xxh3::xxh3_64;

use super::media::MediaMark;

/// The hash of one full block of tokens together with everything before it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BlockHash(pub u64);

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({:016x})", self.0)
    }
}

/// The seed of a hash chain: what, besides the tokens, makes two prefixes different caches.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct HashSeed(pub u64);

impl HashSeed {
    /// Seed for `model`, an optional LoRA adapter and an optional (already tenant-namespaced)
    /// cache salt. Fields are length-prefixed so `("ab","c")` and `("a","bc")` differ.
    pub fn new(model: &str, lora: Option<&str>, cache_salt: Option<&str>) -> Self {
        let mut buf = Vec::with_capacity(model.len() + 32);
        for part in [Some(model), lora, cache_salt] {
            match part {
                Some(s) => {
                    buf.push(1u8);
                    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
                    buf.extend_from_slice(s.as_bytes());
                }
                None => buf.push(0u8),
            }
        }
        HashSeed(xxh3_64(&buf))
    }
}

/// Hash of one block given its parent's hash (or `None` for the first block of a chain, which
/// chains from the seed instead).
///
/// `tokens` must be exactly one block; callers guarantee that. The block's tokens are hashed on
/// their own (xxh3 of their little-endian bytes) and only then linked to the parent by one
/// bijective mix ([`link`]). The expensive part therefore does not wait for the parent: hashing
/// a chain (every BlockStored on the event path, every request) runs the blocks' token hashes
/// side by side in the CPU, and only the short link is sequential. Hashing the parent's bytes
/// together with the tokens made each block wait for the whole previous hash. (On the index
/// benchmark, where an event's token ids arrive cold from memory, the rehash measured about the
/// same either way: `docs/index-performance.md`.)
#[inline]
pub fn chain_hash(seed: HashSeed, parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    BlockHash(link(parent.map_or(seed.0, |p| p.0), tokens_hash(tokens)))
}

/// xxh3 of `tokens` as little-endian bytes, in a stack buffer sized for the block: common
/// block sizes get a buffer of exactly their size, because clearing a larger one costs more
/// than hashing a 16-token block.
#[inline]
fn tokens_hash(tokens: &[u32]) -> u64 {
    match tokens.len() {
        16 => hash_in::<{ 4 * 16 }>(tokens),
        32 => hash_in::<{ 4 * 32 }>(tokens),
        n if n <= 64 => hash_in::<{ 4 * 64 }>(tokens),
        n if n <= 1024 => hash_in::<{ 4 * 1024 }>(tokens),
        n => {
            let mut buf = vec![0u8; 4 * n];
            hash_bytes(tokens, &mut buf)
        }
    }
}

#[inline]
fn hash_in<const B: usize>(tokens: &[u32]) -> u64 {
    let mut buf = [0u8; B];
    hash_bytes(tokens, &mut buf)
}

/// Hashes `tokens` in `buf`, which holds at least `4 × tokens.len()` bytes.
#[inline]
fn hash_bytes(tokens: &[u32], buf: &mut [u8]) -> u64 {
    let end = (4 * tokens.len()).min(buf.len());
    for (dst, t) in buf[..end].chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    xxh3_64(&buf[..end])
}

/// Links a block's token hash to its parent's hash (or the chain's seed): a bijection of
/// either input while the other is fixed (an odd multiply and a rotation of the parent, xored
/// with the tokens' hash, then MurmurHash3's 64-bit finaliser), so two blocks' hashes are
/// equal only if their parents and tokens are, up to 64-bit hash collisions.
#[inline]
fn link(parent: u64, tokens: u64) -> u64 {
    let mut x = parent.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ tokens;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Hashes of every full block of `tokens`, chained from `seed`.
pub fn block_hashes(seed: HashSeed, tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = None;
    for block in tokens.chunks_exact(block_size) {
        let h = chain_hash(seed, parent, block);
        out.push(h);
        parent = Some(h);
    }
    out
}

/// [`block_hashes`] of a chat whose media begin at `mark` ([`super::media`]): the blocks
/// before the one holding the first media item hash as text; from that block on, the chain
/// also covers the media's digest, so they match only the same media at the same place.
pub fn block_hashes_marked(
    seed: HashSeed,
    tokens: &[u32],
    block_size: usize,
    mark: Option<MediaMark>,
) -> Vec<BlockHash> {
    let Some(mark) = mark else {
        return block_hashes(seed, tokens, block_size);
    };
    if block_size == 0 {
        return Vec::new();
    }
    let first_media_block = mark.at / block_size;
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = None;
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        if i == first_media_block {
            let from = parent.map_or(seed.0, |p: BlockHash| p.0);
            parent = Some(BlockHash(link(from, mark.digest)));
        }
        let h = chain_hash(seed, parent, block);
        out.push(h);
        parent = Some(h);
    }
    out
}

/// [`block_hashes`] of ids that are walked rather than held as a slice (a client's token ids
/// are kept compact, see [`crate::openai::TokenIds`]): each block is gathered into one reused
/// buffer and hashed exactly as [`block_hashes`] hashes it. Also returns how many ids there were.
pub fn block_hashes_of(
    seed: HashSeed,
    tokens: impl IntoIterator<Item = u32>,
    block_size: usize,
) -> (Vec<BlockHash>, usize) {
    let tokens = tokens.into_iter();
    let mut out = Vec::with_capacity(tokens.size_hint().0 / block_size.max(1));
    let mut block = Vec::with_capacity(block_size);
    let mut parent = None;
    let mut count = 0;
    for t in tokens {
        count += 1;
        if block_size == 0 {
            continue;
        }
        block.push(t);
        if block.len() == block_size {
            let h = chain_hash(seed, parent, &block);
            out.push(h);
            parent = Some(h);
            block.clear();
        }
    }
    (out, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> HashSeed {
        HashSeed::new("m", None, None)
    }

    #[test]
    fn media_change_the_chain_from_their_block_on() {
        let tokens: Vec<u32> = (0..64).collect();
        let plain = block_hashes(seed(), &tokens, 16);
        let mark = |at, digest| Some(MediaMark { at, digest });
        assert_eq!(block_hashes_marked(seed(), &tokens, 16, None), plain);
        // Media at token 35, in the third block: the first two blocks are the text's.
        let a = block_hashes_marked(seed(), &tokens, 16, mark(35, 1));
        assert_eq!(a[..2], plain[..2]);
        assert!(a[2..].iter().zip(&plain[2..]).all(|(x, y)| x != y));
        // The same media hash alike; other media differ from the same block on.
        assert_eq!(block_hashes_marked(seed(), &tokens, 16, mark(35, 1)), a);
        let b = block_hashes_marked(seed(), &tokens, 16, mark(35, 2));
        assert_eq!(b[..2], plain[..2]);
        assert!(b[2..].iter().zip(&a[2..]).all(|(x, y)| x != y));
        // At the very start, and past the last full block.
        assert_ne!(
            block_hashes_marked(seed(), &tokens, 16, mark(0, 1))[0],
            plain[0]
        );
        assert_eq!(block_hashes_marked(seed(), &tokens, 16, mark(64, 1)), plain);
    }

    #[test]
    fn walked_ids_hash_as_a_slice_does() {
        let toks: Vec<u32> = (0..1000).map(|i| i * 7919 % 151_000).collect();
        for bs in [0, 1, 16, 32, 100, 2000] {
            for n in [0, 15, 16, 17, 999, 1000] {
                let (hashes, count) = block_hashes_of(seed(), toks[..n].iter().copied(), bs);
                assert_eq!(hashes, block_hashes(seed(), &toks[..n], bs), "{bs} {n}");
                assert_eq!(count, n);
            }
        }
    }

    #[test]
    fn partial_block_is_not_hashed() {
        let toks: Vec<u32> = (0..40).collect();
        assert_eq!(block_hashes(seed(), &toks, 16).len(), 2);
        assert!(block_hashes(seed(), &toks[..15], 16).is_empty());
    }

    #[test]
    fn equal_prefixes_share_leading_hashes_only() {
        let a: Vec<u32> = (0..48).collect();
        let mut b = a.clone();
        b[20] = 9999;
        let ha = block_hashes(seed(), &a, 16);
        let hb = block_hashes(seed(), &b, 16);
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
        // The chain carries the difference forward even though block 2 is equal.
        assert_ne!(ha[2], hb[2]);
    }

    #[test]
    fn seed_separates_models_adapters_and_salts() {
        let toks: Vec<u32> = (0..16).collect();
        let seeds = [
            HashSeed::new("m", None, None),
            HashSeed::new("m2", None, None),
            HashSeed::new("m", Some("lora"), None),
            HashSeed::new("m", None, Some("lora")),
            HashSeed::new("m", None, Some("tenant-a")),
        ];
        let hs: std::collections::HashSet<_> = seeds
            .iter()
            .map(|s| block_hashes(*s, &toks, 16)[0])
            .collect();
        assert_eq!(hs.len(), seeds.len());
    }

    #[test]
    fn incremental_chain_matches_batch() {
        let toks: Vec<u32> = (100..164).collect();
        let all = block_hashes(seed(), &toks, 16);
        let mut parent = None;
        for (i, block) in toks.chunks_exact(16).enumerate() {
            let h = chain_hash(seed(), parent, block);
            assert_eq!(h, all[i]);
            parent = Some(h);
        }
    }

    #[test]
    fn every_buffer_size_hashes_the_same_bytes() {
        // Reference: the definition, hashed from one freshly built byte string.
        let reference = |parent: Option<BlockHash>, toks: &[u32]| {
            let mut bytes = Vec::new();
            for t in toks {
                bytes.extend_from_slice(&t.to_le_bytes());
            }
            BlockHash(link(parent.map_or(seed().0, |p| p.0), xxh3_64(&bytes)))
        };
        let toks: Vec<u32> = (0..3000u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        for n in [1, 15, 16, 17, 32, 63, 64, 65, 512, 1024, 1025, 3000] {
            for parent in [None, Some(BlockHash(0xdead_beef))] {
                assert_eq!(
                    chain_hash(seed(), parent, &toks[..n]),
                    reference(parent, &toks[..n]),
                    "{n}"
                );
            }
        }
    }

    #[test]
    fn block_order_and_parents_matter() {
        let a: Vec<u32> = (0..16).collect();
        let b: Vec<u32> = (16..32).collect();
        let ab: Vec<u32> = a.iter().chain(&b).copied().collect();
        let ba: Vec<u32> = b.iter().chain(&a).copied().collect();
        let (hab, hba) = (block_hashes(seed(), &ab, 16), block_hashes(seed(), &ba, 16));
        assert_ne!(hab[1], hba[1]);
        // The same tokens as a chain start and after a parent whose hash equals nothing special.
        assert_ne!(
            chain_hash(seed(), None, &a),
            chain_hash(seed(), Some(hab[0]), &a)
        );
        // The link is a bijection of each input while the other is fixed.
        let parents: std::collections::HashSet<u64> = (0..4096u64).map(|p| link(p, 7)).collect();
        let tokens: std::collections::HashSet<u64> = (0..4096u64).map(|t| link(7, t)).collect();
        assert_eq!((parents.len(), tokens.len()), (4096, 4096));
    }

    #[test]
    fn large_blocks_hash_on_the_heap_path_consistently() {
        let toks: Vec<u32> = (0..4096).collect();
        let a = block_hashes(seed(), &toks, 2048);
        let b = block_hashes(seed(), &toks, 2048);
        assert_eq!(a, b);
        assert_eq!(a.len(), 2);
    }
}
