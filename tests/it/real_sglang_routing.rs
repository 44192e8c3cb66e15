//! Routing against real SGLang engines, measured by the engines themselves: shared-prefix
//! groups concentrate under `kv_aware`, and the engines' `sglang:cached_tokens_total` /
//! `sglang:prompt_tokens_total` show the gain over `round_robin`.
//!
//! Ignored by default; see `real_sglang.rs` for how they run.

use crate::support::real_router::Exactness;
use crate::support::real_scenarios::kv_aware_beats_round_robin;
use crate::support::sglang::{SglangEngine, SglangOptions, SglangSetup};

/// Two engines (at most two SGLang engines run at once on the CI machine); five groups, an odd
/// number, so `round_robin` moves every group between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real SGLang: scripts/real-engines/sglang-setup.sh; run by .ci/run"]
async fn kv_aware_concentrates_prefixes_and_real_sglang_hits_more_than_round_robin() {
    let setup = SglangSetup::locate();
    let engines = SglangEngine::start_all(&setup, 2, &SglangOptions::default()).await;
    let rss: Vec<f64> = engines.iter().map(|e| e.rss_mib()).collect();
    println!(
        "engine RSS (MiB, all processes of each engine): {:?}, total {:.0}",
        rss.iter().map(|r| r.round()).collect::<Vec<_>>(),
        rss.iter().sum::<f64>()
    );
    let mut table = Exactness::default();
    kv_aware_beats_round_robin(&setup, &engines, &mut table).await;
    table.print("routing, 2 SGLang engines");
    table.assert_all_exact();
}
