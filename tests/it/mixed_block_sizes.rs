//! A mixed fleet: one model's workers whose engines store KV blocks of different sizes (vLLM's
//! CPU build at 32 tokens next to SGLang at 16, say). kvroute hashes a model's requests in
//! that model's one `block_size`, so blocks of any other size can never match a request: the
//! worker that publishes them is not indexed (it is routed as if its cache were cold), the
//! refusal is counted per worker (`kvroute_kv_events_total{kind="block_size_mismatch"}`) and
//! logged as an error naming both sizes, and the workers whose size matches are exact as
//! before.

use std::path::Path;
use std::time::{Duration, Instant};

use kvroute::config::Config;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

/// The counter `kvroute_kv_events_total{kind,worker}` in a metrics page (0 when absent).
fn stream_counter(page: &str, kind: &str, worker: &str) -> f64 {
    let series = format!("kvroute_kv_events_total{{kind=\"{kind}\",worker=\"{worker}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn overlap(explained: &Value, worker: &str) -> u64 {
    explained["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["worker"] == worker))
        .map_or(0, |c| c["overlap_blocks"].as_u64().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_storing_blocks_of_another_size_is_refused_by_the_index_and_reported() {
    let at16 = SimEngine::start_with_block_size(MODEL, 16).await;
    let at32 = SimEngine::start_with_block_size(MODEL, 32).await;
    let text = format!(
        "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n\
         [[models]]\nname = \"{MODEL}\"\nblock_size = 16\n"
    );
    let mut config = Config::from_toml(&text, Path::new("test")).unwrap();
    config.workers = vec![at16.worker("b16", MODEL), at32.worker("b32", MODEL)];
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router = kvroute::server::start(&config, listener).unwrap();
    let prompt =
        "one prompt for both engines, long enough for several blocks of either size ".repeat(8);
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1});

    // Both engines compute the prompt (sent to them directly) and publish its blocks.
    for e in [&at16, &at32] {
        let answer = support::post_json(&format!("http://{}/v1/completions", e.addr), &body).await;
        assert!(
            answer["usage"]["prompt_tokens"].as_u64().unwrap() > 64,
            "{answer}"
        );
    }
    let debug = format!("http://{}/debug/route", router.addr);
    let end = Instant::now() + Duration::from_secs(10);
    let (page, explained) = loop {
        let page = support::metrics_text(router.addr).await;
        let explained = support::post_json(&debug, &body).await;
        let settled = stream_counter(&page, "block_size_mismatch", "b32") > 0.0
            && overlap(&explained, "b16") > 0;
        if settled || Instant::now() > end {
            break (page, explained);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        stream_counter(&page, "block_size_mismatch", "b32") > 0.0 && overlap(&explained, "b16") > 0,
        "the worker at block size 32 was not refused (or the one at 16 not indexed): \
         b32 refused {} events, overlaps b16 {} b32 {}",
        stream_counter(&page, "block_size_mismatch", "b32"),
        overlap(&explained, "b16"),
        overlap(&explained, "b32")
    );
    assert_eq!(overlap(&explained, "b32"), 0, "{explained}");
    assert_eq!(
        stream_counter(&page, "block_size_mismatch", "b16"),
        0.0,
        "the worker whose size matches had events refused"
    );
    router.shutdown().await;
}
