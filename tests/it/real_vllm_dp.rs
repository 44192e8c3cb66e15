//! kvroute in front of one real vLLM server started with `--data-parallel-size 2`: two engine
//! cores behind one HTTP port, each with its own KV cache, publishing its events on the events
//! port plus its rank. The router keeps each rank's blocks apart, routes a prefix to the rank
//! that holds it by pinning `X-data-parallel-rank`, and predicts exactly what that rank reuses.
//!
//! Ignored by default; see `real_vllm.rs` for how they run.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::real_router::{RealRouter, completion, router_config};
use crate::support::vllm::{VLLM_BLOCK, VllmEngine, VllmOptions, VllmSetup};

/// `/debug/route`'s candidate entry for `target` (`v0/dpN`).
fn candidate<'v>(explained: &'v Value, target: &str) -> Option<&'v Value> {
    explained["candidates"]
        .as_array()?
        .iter()
        .find(|c| c["target"] == target)
}

/// Waits until the router's index holds at least `blocks` of `body` on `target`.
async fn held(router: &RealRouter, body: &Value, target: &str, blocks: u64) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let v = router.explain(body, None).await;
        let n = candidate(&v, target).map_or(0, |c| c["overlap_blocks"].as_u64().unwrap_or(0));
        if n >= blocks {
            return;
        }
        assert!(
            Instant::now() < end,
            "{target} holds {n} < {blocks} blocks: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn each_vllm_rank_is_a_target_pinned_by_its_header() {
    let setup = VllmSetup::locate();
    let options = VllmOptions {
        data_parallel_size: 2,
        kv_blocks: 1024,
        ..VllmOptions::default()
    };
    let started = Instant::now();
    let mut engines = VllmEngine::start_all(&setup, 1, &options).await;
    println!(
        "vLLM --data-parallel-size 2 ready in {:.0} s, RSS {:.0} MiB",
        started.elapsed().as_secs_f64(),
        engines[0].rss_mib()
    );
    let mut config = router_config(&setup, &engines, "kv_aware", &[]);
    config.workers[0].data_parallel_size = 2;
    let router = RealRouter::start(&config).await;
    router.wait_ready().await;
    let engine = engines[0].url();
    let http = reqwest::Client::new();
    for (rank, tag) in [(1u32, "river"), (0, "mountain")] {
        let prompt: String = (0..120).map(|i| format!("{tag} {i} ")).collect();
        let body = completion(prompt, 2);
        // The rank's cache is filled directly at vLLM, pinned: the router sees only events.
        let direct = http
            .post(format!("{engine}/v1/completions"))
            .header("X-data-parallel-rank", rank.to_string())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(direct.status().is_success());
        let answer: Value = direct.json().await.unwrap();
        let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
        let full = (prompt_tokens - 1) / u64::from(VLLM_BLOCK);
        let target = format!("{}/dp{rank}", engines[0].name);
        held(&router, &body, &target, full).await;
        let explained = router.explain(&body, None).await;
        let other = format!("{}/dp{}", engines[0].name, 1 - rank);
        assert_eq!(
            candidate(&explained, &other).map(|c| c["overlap_blocks"].clone()),
            Some(json!(0)),
            "the other rank's slot has none of it: {explained}"
        );
        assert_eq!(explained["target"], target.as_str(), "{explained}");
        let predicted = candidate(&explained, &target).unwrap()["cached_tokens"]
            .as_u64()
            .unwrap();
        // Through the router: pinned to the rank that holds it, which reuses what was predicted.
        let resp = http
            .post(router.url("/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
        let served = resp.headers()["x-kvroute-data-parallel-rank"]
            .to_str()
            .unwrap()
            .to_owned();
        let v: Value = resp.json().await.unwrap();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        println!("rank {rank}: predicted {predicted} cached {cached} (served by rank {served})");
        assert_eq!(served, rank.to_string());
        assert_eq!(predicted, cached);
        assert_eq!(cached, full * u64::from(VLLM_BLOCK));
    }
    let metrics = crate::support::metrics_text(router.handle.addr).await;
    for rank in 0..2 {
        let series = format!(
            "kvroute_kv_events_total{{kind=\"dp_rank_mismatch\",worker=\"{}/dp{rank}\"}} 0",
            engines[0].name
        );
        assert!(metrics.contains(&series), "no {series}");
    }
    router.shutdown().await;
    engines[0].stop();
}
