//! A fleet of mixed contexts: one model's engines started with different `--max-model-len`
//! (GPUs of different memory). A prompt only the larger context holds is routed there, never
//! to an engine that would refuse it; a prompt both hold is routed among both; a completion the
//! smaller context would cut short goes where it fits whole (`routing::context_fit`).

use std::path::Path;
use std::time::{Duration, Instant};

use kvroute::config::Config;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

/// The candidates `/debug/route` weighed.
fn candidates(explained: &Value) -> Vec<String> {
    explained["candidates"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["worker"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_where_its_context_fits() {
    fits_under("kv_aware").await;
}

/// A load-only policy does not tokenize for its decision; in a fleet of mixed contexts the
/// router counts the prompt anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_only_policy_is_narrowed_too() {
    fits_under("least_request").await;
}

/// Engines of 256 and 4,096 tokens of context behind a router running `policy`.
struct Fleet {
    _short: SimEngine,
    _long: SimEngine,
    router: kvroute::server::RouterHandle,
}

impl Fleet {
    async fn start(policy: &str) -> Fleet {
        let short = SimEngine::start_with_context(MODEL, 256).await;
        let long = SimEngine::start_with_context(MODEL, 4096).await;
        let text =
            format!("policy = \"{policy}\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.2\n");
        let mut config = Config::from_toml(&text, Path::new("test")).unwrap();
        config.workers = vec![short.worker("short", MODEL), long.worker("long", MODEL)];
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let router = kvroute::server::start(&config, listener).unwrap();
        Fleet {
            _short: short,
            _long: long,
            router,
        }
    }

    fn debug(&self) -> String {
        format!("http://{}/debug/route", self.router.addr)
    }

    /// `/debug/route`'s explanation of `body` once the router has read both engines'
    /// contexts (from their `/v1/models`, on the first health check): the first that
    /// excludes a worker, or the last tried.
    async fn explained_once_read(&self, body: &Value) -> Value {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let explained = support::post_json(&self.debug(), body).await;
            if !support::context_excluded(&explained).is_empty() || Instant::now() > end {
                return explained;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn fits_under(policy: &str) {
    let fleet = Fleet::start(policy).await;
    let router = &fleet.router;
    let debug = fleet.debug();
    let long_prompt = json!({"model": MODEL, "prompt": "word ".repeat(600), "max_tokens": 4});
    let explained = fleet.explained_once_read(&long_prompt).await;
    if policy == "kv_aware" {
        let tokens = explained["prompt_tokens"].as_u64().unwrap_or(0);
        assert!((256..4096).contains(&tokens), "{explained}");
    }
    assert_eq!(
        support::context_excluded(&explained),
        ["short"],
        "{explained}"
    );
    assert_eq!(candidates(&explained), ["long"], "{explained}");

    // Sent together, the long prompts would be spread over both engines by load; every one
    // goes to the engine that holds it, and none is refused.
    let client = support::client();
    let sends = (0..12).map(|i| {
        let body = json!({"model": MODEL, "prompt": format!("{i} {}", "word ".repeat(600)), "max_tokens": 4});
        let client = client.clone();
        let addr = router.addr;
        async move { support::complete(&client, addr, &body).await }
    });
    for resp in futures_util::future::join_all(sends).await {
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        assert_eq!(resp.status(), 200, "served by {worker:?}");
        assert_eq!(worker.as_deref(), Some("long"));
    }

    // Counted once per request narrowed (the explanations above count nothing).
    let page = support::metrics_text(router.addr).await;
    let whole = page
        .lines()
        .find_map(|l| l.strip_prefix("kvroute_context_narrowed_total{kept=\"whole\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(whole, Some(12.0), "{page}");

    // A prompt both hold is weighed on both.
    let small = json!({"model": MODEL, "prompt": "word ".repeat(20), "max_tokens": 4});
    let explained = support::post_json(&debug, &small).await;
    assert!(
        support::context_excluded(&explained).is_empty(),
        "{explained}"
    );
    assert_eq!(candidates(&explained).len(), 2, "{explained}");
    // The same prompt asking for more output than the short context leaves room for: that
    // engine would cut the completion short, the other serves it whole.
    let cut = json!({"model": MODEL, "prompt": "word ".repeat(20), "max_tokens": 1000});
    let explained = support::post_json(&debug, &cut).await;
    assert_eq!(
        support::context_excluded(&explained),
        ["short"],
        "{explained}"
    );
}

/// A batch is analysed (hashed, looked up) on its first prompt, but the engine refuses the
/// whole batch when any of its prompts does not fit: a batch whose first prompt is short and
/// whose second is long goes where the long one fits, as token ids and as text. (The
/// simulated engine serves one prompt per request, so the explanation is checked here; the
/// real-vLLM stage sends a batch.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_goes_where_its_longest_prompt_fits() {
    let fleet = Fleet::start("kv_aware").await;
    let ids = |n: usize| {
        (0..n)
            .map(|i| 1000 + (i % 500) as u32)
            .collect::<Vec<u32>>()
    };
    let tokens = json!({"model": MODEL, "prompt": [ids(8), ids(600)], "max_tokens": 4});
    let explained = fleet.explained_once_read(&tokens).await;
    assert_eq!(
        support::context_excluded(&explained),
        ["short"],
        "{explained}"
    );
    assert_eq!(candidates(&explained), ["long"], "{explained}");

    // The long prompt first: its ids are the ones the analysis hashes (and moves out).
    let first_long = json!({"model": MODEL, "prompt": [ids(600), ids(8)], "max_tokens": 4});
    let explained = support::post_json(&fleet.debug(), &first_long).await;
    assert_eq!(
        support::context_excluded(&explained),
        ["short"],
        "{explained}"
    );

    let texts = json!({"model": MODEL, "prompt": ["word ".repeat(5), "word ".repeat(600)], "max_tokens": 4});
    let explained = support::post_json(&fleet.debug(), &texts).await;
    assert_eq!(
        support::context_excluded(&explained),
        ["short"],
        "{explained}"
    );
    assert_eq!(candidates(&explained), ["long"], "{explained}");

    // Both prompts short: both engines are weighed.
    let small = json!({"model": MODEL, "prompt": [ids(8), ids(16)], "max_tokens": 4});
    let explained = support::post_json(&fleet.debug(), &small).await;
    assert!(
        support::context_excluded(&explained).is_empty(),
        "{explained}"
    );
    assert_eq!(candidates(&explained).len(), 2, "{explained}");
}
