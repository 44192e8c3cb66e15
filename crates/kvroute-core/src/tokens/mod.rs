//! From a request to token ids and block hashes: tokenizers per model, chat templates,
//! kvroute's chained block hashes, and vLLM's `/tokenize` and `/detokenize` answered from them
//! ([`tokenize_api`]).

pub mod builtin_chat;
pub mod byte_bpe;
pub mod chat_template;
pub mod engine_tools;
pub mod hash;
pub mod id_map;
pub mod media;
pub mod model;
mod pyjson;
pub mod segment;
pub mod source;
mod strftime;
pub mod tokenize_api;
pub mod tokenizer;

pub use chat_template::{ChatRequest, ChatTemplate};
pub use engine_tools::EngineKind;
pub use hash::{
    BlockHash, HashSeed, block_hashes, block_hashes_marked, block_hashes_of, chain_hash,
};
pub use id_map::{IdHasher, IdMap};
pub use model::ModelTokens;
pub use segment::{SegmentCache, Segmenter};
pub use source::{ModelSource, TokenizerSource};
pub use tokenizer::{TokenError, Tokenizer};
