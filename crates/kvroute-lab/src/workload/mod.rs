//! Workloads: what requests arrive when, shared by the real-time client (`bench`) and the
//! virtual-time simulator (`sim`).
//!
//! A routing decision is only comparable across policies, and across real and simulated runs,
//! if every run sees the very same requests; this module is that single source.
//!
//! - [`trace`]: the workload type and the Mooncake JSONL reader, with transforms.
//! - [`synthetic`]: seeded generators of workloads with a known shape.
//! - [`synthesis`]: block ids → deterministic token ids (the prompt content).
//! - [`args`]: the workload flags `kvroute bench` and `kvroute simulate` both flatten.

pub mod args;
pub mod sessions;
pub mod synthesis;
pub mod synthetic;
pub mod trace;

pub use args::{Naming, SyntheticChoice, WorkloadArgs};
pub use synthesis::PromptSynth;
pub use synthetic::{SyntheticKind, SyntheticSpec};
pub use trace::{Trace, TraceError, TraceRequest};
