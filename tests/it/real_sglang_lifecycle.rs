//! Restarts next to a real SGLang engine: restarted on its ports, it comes back empty (and
//! publishes an `AllBlocksCleared` at sequence 0) and the router forgets its blocks at once; a
//! router restarted next to a warm engine knows its cache before any new event (it asks the
//! engine's replay socket when it connects).
//!
//! Ignored by default; see `real_sglang.rs` for how they run.

use crate::support::real_router::Exactness;
use crate::support::real_scenarios::{engine_restart, router_restart};
use crate::support::sglang::{SglangEngine, SglangOptions, SglangSetup};

/// Both restarts on one engine: the router restart first (it needs the engine warm), then the
/// engine restart, saving an engine start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real SGLang: scripts/real-engines/sglang-setup.sh; run by .ci/run"]
async fn sglang_and_router_restarts_keep_predictions_exact() {
    let setup = SglangSetup::locate();
    let mut engines = SglangEngine::start_all(&setup, 1, &SglangOptions::default()).await;
    let mut table = Exactness::default();
    router_restart(&setup, &engines[0], &mut table).await;
    engine_restart(&setup, &mut engines[0], &mut table).await;
    table.print("router and engine restarts, 1 SGLang engine");
    table.assert_all_exact();
}
