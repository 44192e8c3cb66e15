//! Maps keyed by ids that are already hashes (engine block hashes, kvroute block hashes, request
//! ids): one multiply-xor round instead of SipHash, for the index's tier maps and the simulated
//! engine's hot maps (its cache, host tier, scheduler and held requests).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A cheap hasher for maps keyed by `u64` ids (engine hashes, request ids): one multiply-xor
/// round instead of SipHash, which dominates a simulated step otherwise.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let x = (n ^ (n >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self.0 = x ^ (x >> 29);
    }
}

/// A map keyed by already-hashed ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
