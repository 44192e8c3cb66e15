//! From a request to token ids and block hashes: the core's tokenizers, chat templates and
//! block hashes ([`kvroute_core::tokens`]), with the router's loading here — tokenizers fetched
//! from the Hugging Face hub ([`hub`]) and loaded per model ([`registry`]).

pub use kvroute_core::tokens::*;

pub mod hub;
pub mod registry;

pub use registry::ModelRegistry;
