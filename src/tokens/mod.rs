//! From a request to token ids and block hashes: tokenizers per model, chat templates, and
//! kvroute's chained block hashes.

pub mod hash;
pub mod tokenizer;

pub use hash::{BlockHash, HashSeed, block_hashes, chain_hash};
pub use tokenizer::{TokenError, Tokenizer};
