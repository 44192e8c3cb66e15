//! Routing against real vLLM engines, measured by the engines themselves: shared-prefix
//! groups concentrate under `kv_aware`, and the engines' `vllm:prefix_cache_hits` /
//! `vllm:prefix_cache_queries` show the gain over `round_robin`.
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use crate::support::real_router::Exactness;
use crate::support::real_scenarios::kv_aware_beats_round_robin;
use crate::support::vllm::{VllmEngine, VllmOptions, VllmSetup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn kv_aware_concentrates_prefixes_and_real_vllm_hits_more_than_round_robin() {
    let setup = VllmSetup::locate();
    let engines = VllmEngine::start_all(&setup, 3, &VllmOptions::default()).await;
    let rss: Vec<f64> = engines.iter().map(|e| e.rss_mib()).collect();
    println!(
        "engine RSS (MiB, all processes of each engine): {:?}, total {:.0}",
        rss.iter().map(|r| r.round()).collect::<Vec<_>>(),
        rss.iter().sum::<f64>()
    );
    let mut table = Exactness::default();
    kv_aware_beats_round_robin(&setup, &engines, &mut table).await;
    table.print("routing, 3 engines");
    table.assert_all_exact();
}
