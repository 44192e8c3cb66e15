//! Block ids of a recorded trace: kvroute's chained block hashes under a key of the recorder's
//! own, cut to 53 bits.
//!
//! The 64-bit block hashes are not written as they are: they are an unkeyed hash of the tokens
//! and a seed derived from the model and the tenant's cache salt, so anyone holding a guess of a
//! prompt (and of the salt, which an anonymous request does not have) could hash the guess and
//! look for it in the file. Through SipHash (std's `RandomState`, a keyed PRF) with a key drawn
//! when the recorder starts and never written anywhere, an id says only "the same block as
//! another line's id at this position" — which is what the simulator needs.
//!
//! Ids are cut to 53 bits so that every JSON reader keeps them exact (a JavaScript or pandas
//! reader parses numbers as doubles). Two distinct blocks collide with probability about
//! n² / 2⁵⁴: for ten million distinct blocks, under one chance in a hundred that any pair does,
//! and a collision only makes two blocks look shared in a simulation. The map is stateless:
//! no memory grows with the traffic, and ids stay the same across rotated files of one run, so
//! those files can be concatenated. A restart draws a new key: runs do not share ids.

use std::hash::{BuildHasher, RandomState};

use crate::tokens::BlockHash;

/// Ids keep 53 bits: the integers a double holds exactly.
const ID_MASK: u64 = (1 << 53) - 1;

/// Distinguishes the ids of partial tail blocks from those of hashed blocks.
const TAIL_DOMAIN: u64 = 0x7461_696c;

/// Keyed, stateless map from block hashes to trace ids.
#[derive(Clone, Debug, Default)]
pub struct BlockIds {
    key: RandomState,
}

impl BlockIds {
    /// A map under a fresh random key.
    pub fn new() -> BlockIds {
        BlockIds::default()
    }

    /// The id of a full block.
    pub fn id(&self, hash: BlockHash) -> u64 {
        self.key.hash_one(hash.0) & ID_MASK
    }

    /// The id of request number `seq`'s partial last block: a block no other request shares.
    /// Engines never cache a partial block, so whether two tails are equal does not matter to
    /// a cache, and a fresh id says nothing about the tail's content.
    pub fn tail(&self, seq: u64) -> u64 {
        self.key.hash_one((TAIL_DOMAIN, seq)) & ID_MASK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_hashes_share_an_id_under_one_key_only() {
        let a = BlockIds::new();
        let b = BlockIds::new();
        let h = BlockHash(0x1234_5678_9abc_def0);
        assert_eq!(a.id(h), a.id(h));
        assert_ne!(a.id(h), a.id(BlockHash(h.0 + 1)));
        assert_ne!(a.id(h), b.id(h), "a fresh key gives fresh ids");
        assert!(a.id(h) <= ID_MASK && a.tail(7) <= ID_MASK);
        assert_ne!(a.tail(1), a.tail(2));
    }
}
