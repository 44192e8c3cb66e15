//! Real vLLM engines of different contexts (`--max-model-len` 256 and 4096) behind one router:
//! vLLM's own limits, checked at their edges, are what `routing::context_fit` assumes — a
//! prompt of `max_model_len − 1` tokens is served and one of `max_model_len` refused, and a
//! `max_tokens` past the room left is clamped, not refused — and the router sends a prompt only
//! the larger context holds there, never to the engine that would refuse it.
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use crate::support::real_scenarios::{SHORT_CONTEXT, contexts_route_where_they_fit};
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn a_prompt_goes_to_the_real_engine_whose_context_holds_it() {
    let setup = VllmSetup::locate();
    let short = VllmOptions {
        max_model_len: SHORT_CONTEXT,
        enforce_eager: true,
        ..VllmOptions::default()
    };
    let long = VllmOptions {
        enforce_eager: true,
        ..VllmOptions::default()
    };
    let engines = VllmEngine::start_each(&setup, &[short, long]).await;
    // A prompt needs room for one output token; a long max_tokens is clamped (200 OK).
    contexts_route_where_they_fit(&setup, &engines, SHORT_CONTEXT - 1, 200).await;
}
