//! The routing decision, free of transport: analyse → candidates → decide → admit.
//!
//! Every caller that routes runs this code and keeps no copy of it: the live server (first
//! attempt and every retry, through a [`Session`]), `/debug/route` (without admitting), the
//! virtual-time simulator (`sim::router` is a thin adapter over [`Decider`]) and the decision
//! bench. So a simulated decision is the live one, and a parity test holds them together.
//!
//! - **analyse**: a prompt's token ids → kvroute's chained block hashes → per-worker overlap from
//!   the index ([`Analysis`]); load-only policies skip it.
//! - **candidates**: the routable [`Target`]s not yet tried, each with its load snapshot and
//!   overlap.
//! - **decide**: the policy picks; a half-open circuit lets one probe through, so a target that
//!   refuses is skipped and the policy asked again.
//! - **admit**: the request is counted on the chosen worker's load, its blocks are predicted
//!   there when the worker publishes no events, and what was predicted is kept ([`Admitted`])
//!   for the policy's calibration at the first token.
//!
//! A disaggregated request (prefill and decode on different workers, `pair`) is routed by
//! the same core: its prefill worker by the policy among prefill-capable targets
//! ([`Session::on_side`]), its decode worker by [`choose_decode`] among decode-capable ones
//! ([`DecodeSession`]), each side with its own retries.
//!
//! Before any of it, [`eligible`] says which workers may serve a request at all (its model's
//! routable workers, the sides a disaggregated model needs) or why none may ([`RouteError`]),
//! and [`request_seed`] what its blocks are hashed with (model, LoRA adapter, cache salt). The
//! live server, `/debug/route` ([`Decider::explain_plan`]) and the simulator ask these and
//! keep no copy.
//!
//! Once the prompt is tokenized, [`context_fit`] narrows the eligible workers to those whose
//! context (`max_model_len`) holds it, so a long prompt in a fleet of mixed contexts is not
//! sent where the engine would refuse it.
//!
//! Between candidates and decide, **placement isolation** ([`isolation`]) narrows the candidates
//! of a tenant over its fair share to its share of the workers, and those of the other tenants
//! to workers it does not occupy, as the request's [`Standing`] (set by the caller, who knows the
//! tenants' shares) says; the chosen worker counts the request under its tenant
//! ([`crate::fleet::Tenancy`]).
//!
//! Time is passed in (the index clock as a `Duration`), never read, so the simulator drives the
//! same code in virtual time.

mod admitted;
mod analysis;
pub mod context_fit;
mod decider;
mod decision_metrics;
mod decode_session;
mod eligibility;
mod error;
mod explain;
pub mod isolation;
mod pair;
pub mod prefill_pieces;
mod route_error;
mod runners_up;
mod seed;
mod session;
pub mod slo;
mod target;
#[cfg(test)]
mod testing;

pub use admitted::Admitted;
pub use analysis::{Analysis, reusable_blocks};
pub use decider::{Choice, Decider, Weighed};
pub use decision_metrics::DecisionMetrics;
pub use decode_session::DecodeSession;
pub use eligibility::{Eligible, Needs, eligible, shape};
pub use error::RouteError;
pub use explain::{DecodeExplanation, Explanation};
pub use isolation::{Confined, Stance, Standing};
pub use pair::{
    DecodeCandidate, DecodeChoice, DecodeDecision, MissingSide, Plan, choose_decode, plan,
    plan_roles,
};
pub use runners_up::{decode_runners_up, runners_up};
pub use seed::{request_seed, tenant_salt};
pub use session::{Attempt, Attempts, Session};
pub use target::Target;
