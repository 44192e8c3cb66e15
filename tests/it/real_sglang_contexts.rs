//! Real SGLang engines of different contexts (`--context-length` 256 and 4096) behind one
//! router: SGLang's own limits at their edges, as `routing::context_fit`'s notes state them —
//! its scheduler keeps 6 tokens back (a prompt of `context_length − 7` tokens is served, one of
//! `context_length − 6` refused), and unlike vLLM a `max_tokens` past the room left is refused,
//! not clamped — and the router sends a prompt only the larger context holds there.
//!
//! Ignored by default; see `real_sglang.rs` for how they run.

use crate::support::real_scenarios::{SHORT_CONTEXT, contexts_route_where_they_fit};
use crate::support::sglang::{SglangEngine, SglangOptions, SglangSetup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real SGLang: scripts/real-engines/sglang-setup.sh; run by .ci/run"]
async fn a_prompt_goes_to_the_real_sglang_engine_whose_context_holds_it() {
    let setup = SglangSetup::locate();
    let short = SglangOptions {
        context_length: SHORT_CONTEXT,
        ..SglangOptions::default()
    };
    let engines = SglangEngine::start_each(&setup, &[short, SglangOptions::default()]).await;
    // The scheduler keeps 6 tokens back; a long max_tokens is refused (400).
    contexts_route_where_they_fit(&setup, &engines, SHORT_CONTEXT - 7, 400).await;
}
