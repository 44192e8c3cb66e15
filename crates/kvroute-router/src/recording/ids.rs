//! Block ids of a recorded trace: kvroute's chained block hashes under a secret key, cut to 53
//! bits.
//!
//! The 64-bit block hashes are not written as they are: they are an unkeyed hash of the tokens
//! and a seed derived from the model and the tenant's cache salt, so anyone holding a guess of a
//! prompt (and of the salt, which an anonymous request does not have) could hash the guess and
//! look for it in the file. An id is instead the first bytes of SHA-256 over the key and the
//! block hash (a keyed pseudo-random function: with a fixed-length input, a hash of key then
//! message has none of the length-extension trouble of variable messages), so an id says only
//! "the same block as another line's id at this position" — which is what the simulator needs.
//!
//! The key is random per router process unless `[recording] id_key_file` names one: router
//! replicas and restarts that share a key file write the same ids for the same blocks, so their
//! traces merge. Ids are cut to 53 bits so that every JSON reader keeps them exact (JavaScript
//! and pandas parse numbers as doubles). Two distinct blocks collide with probability about
//! n² / 2⁵⁴: for ten million distinct blocks, under one chance in a hundred that any pair does,
//! and a collision only makes two blocks look shared in a simulation. The map keeps no state,
//! so no memory grows with the traffic.

use sha2::{Digest, Sha256};

use crate::tokens::BlockHash;

/// Ids keep 53 bits: the integers a double holds exactly.
const ID_MASK: u64 = (1 << 53) - 1;

/// Bytes of a random key.
pub const KEY_BYTES: usize = 32;

/// Keyed, stateless map from block hashes to trace ids.
#[derive(Clone)]
pub struct BlockIds {
    /// SHA-256 with the key already absorbed: each id clones it and adds eight bytes.
    keyed: Sha256,
    /// Random per process: tail ids must differ between runs that share a key.
    run: u64,
}

impl std::fmt::Debug for BlockIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockIds").finish_non_exhaustive()
    }
}

impl BlockIds {
    /// A map under `key` (the same key gives the same ids, in any process).
    pub fn with_key(key: &[u8]) -> BlockIds {
        let mut keyed = Sha256::new();
        keyed.update(b"kvroute-trace-id\0");
        keyed.update((key.len() as u64).to_le_bytes());
        keyed.update(key);
        BlockIds {
            keyed,
            run: rand::random(),
        }
    }

    /// A map under a fresh random key.
    pub fn random() -> BlockIds {
        BlockIds::with_key(&rand::random::<[u8; KEY_BYTES]>())
    }

    /// The id of a full block.
    pub fn id(&self, hash: BlockHash) -> u64 {
        self.keyed_u64(0, hash.0)
    }

    /// The id of request number `seq`'s partial last block: a block no other request shares.
    /// Engines never cache a partial block, so whether two tails are equal does not matter to
    /// a cache, and a fresh id says nothing about the tail's content.
    pub fn tail(&self, seq: u64) -> u64 {
        self.keyed_u64(1, seq ^ self.run.rotate_left(17))
    }

    fn keyed_u64(&self, domain: u8, x: u64) -> u64 {
        let mut h = self.keyed.clone();
        h.update([domain]);
        h.update(x.to_le_bytes());
        let d = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d[..8]);
        u64::from_le_bytes(first) & ID_MASK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_hashes_share_an_id_under_one_key_only() {
        let a = BlockIds::random();
        let b = BlockIds::random();
        let h = BlockHash(0x1234_5678_9abc_def0);
        assert_eq!(a.id(h), a.id(h));
        assert_ne!(a.id(h), a.id(BlockHash(h.0 + 1)));
        assert_ne!(a.id(h), b.id(h), "a fresh key gives fresh ids");
        assert!(a.id(h) <= ID_MASK && a.tail(7) <= ID_MASK);
        assert_ne!(a.tail(1), a.tail(2));
        let (k1, k2) = (BlockIds::with_key(b"shared"), BlockIds::with_key(b"shared"));
        assert_eq!(k1.id(h), k2.id(h), "one key file, one id per block");
        assert_ne!(k1.tail(0), k2.tail(0), "tails stay unique across runs");
    }
}
