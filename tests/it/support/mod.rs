//! Helpers shared by the integration tests, by concept:
//! - [`backend`]: test backends (small OpenAI-style servers that record what they receive and
//!   misbehave on request) and a router started in front of them;
//! - [`process`]: `kvroute engine` / `kvroute serve` child processes, free ports, memory readings;
//! - [`qwen3`]: the Qwen3 tokenizer fixture, loaded once per test binary.
//!
//! Everything is re-exported here, so a test writes `use crate::support::*;` or names the
//! helpers it needs.

pub mod backend;
pub mod process;
pub mod qwen3;

pub use backend::*;
pub use process::*;
pub use qwen3::*;
