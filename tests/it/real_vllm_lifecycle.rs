//! Restarts next to real vLLM engines: an engine restarted on its ports comes back empty and
//! the router forgets its blocks at once; a router restarted next to warm engines knows their
//! caches before any new event (it asks the engines' replay sockets when it connects).
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use crate::support::real_router::Exactness;
use crate::support::real_scenarios::{engine_restart, router_restart};
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn a_vllm_engine_restarted_on_its_ports_is_forgotten_then_exact_again() {
    let setup = VllmSetup::locate();
    let mut engines = VllmEngine::start_all(&setup, 1, &VllmOptions::default()).await;
    let mut table = Exactness::default();
    engine_restart(&setup, &mut engines[0], &mut table).await;
    table.print("engine restart, 1 engine");
    table.assert_all_exact();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn a_router_restarted_next_to_a_warm_vllm_engine_is_exact_before_any_new_event() {
    let setup = VllmSetup::locate();
    let engines = VllmEngine::start_all(&setup, 1, &VllmOptions::default()).await;
    let mut table = Exactness::default();
    router_restart(&setup, &engines[0], &mut table).await;
    table.print("router restart, 1 engine");
    table.assert_all_exact();
}
