//! Issue 34: the KV block size an engine reports in its metrics (vLLM's
//! `vllm:cache_config_info{block_size}`, which the simulated engine reports the same way) is
//! checked against the model's configured `block_size`. A worker whose engine disagrees is
//! warned about (worker, model, both sizes, the fix), counted in
//! `kvroute_worker_block_size_mismatch{worker,model}` and shown in `/admin/workers`; one that
//! agrees is not. The workers publish no KV events: the check does not need them.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

const MODEL: &str = "sim";

/// The value of `series` (name and labels, as printed) in a metrics page.
fn gauge(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

async fn admin_workers(addr: std::net::SocketAddr) -> Vec<Value> {
    let v: Value = client()
        .get(format!("http://{addr}/admin/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["workers"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_with_another_block_size_is_warned_about_counted_and_shown() {
    let at16 = SimEngine::start_with_block_size(MODEL, 16).await;
    let at32 = SimEngine::start_with_block_size(MODEL, 32).await;
    let config = format!(
        "[health]\ninterval_s = 0.2\n\
         [[models]]\nname = \"{MODEL}\"\nblock_size = 16\n\
         [[workers]]\nid = \"b16\"\nurl = \"http://{}\"\nmodels = [\"{MODEL}\"]\n\
         [[workers]]\nid = \"b32\"\nurl = \"http://{}\"\nmodels = [\"{MODEL}\"]\n",
        at16.addr, at32.addr
    );
    let (mut router, _file) = RouterProcess::start_env(&config, &[], Stdio::piped(), &[]).await;
    let addr = router.addr;
    // Polled until both engines' metrics were read (the health checks run every 0.2 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let workers = loop {
        let workers = admin_workers(addr).await;
        let read = workers.iter().all(|w| w["engine_block_size"].is_u64());
        if read || Instant::now() > deadline {
            break workers;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let by_id = |id: &str| workers.iter().find(|w| w["id"] == id).unwrap().clone();
    let (b16, b32) = (by_id("b16"), by_id("b32"));
    assert_eq!(b16["engine_block_size"], 16);
    assert_eq!(b16["block_size_mismatch"], serde_json::json!([]));
    assert_eq!(b32["engine_block_size"], 32);
    assert_eq!(
        b32["block_size_mismatch"],
        serde_json::json!([{"model": MODEL, "block_size": 16, "engine_block_size": 32}])
    );

    let page = metrics_text(addr).await;
    let mismatch = |w: &str| {
        gauge(
            &page,
            &format!("kvroute_worker_block_size_mismatch{{model=\"{MODEL}\",worker=\"{w}\"}}"),
        )
    };
    assert_eq!(mismatch("b32"), Some(1.0), "{page}");
    assert_eq!(mismatch("b16"), Some(0.0), "{page}");
    assert_eq!(
        gauge(&page, "kvroute_worker_engine_block_size{worker=\"b32\"}"),
        Some(32.0)
    );

    let _ = router.child.kill();
    let _ = router.child.wait();
    let mut log = String::new();
    router
        .child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("KV block size"))
        .collect();
    assert_eq!(warned.len(), 1, "one warning, for b32 only:\n{log}");
    for part in ["`b32`", "`sim`", "32", "block_size 16", "block_size = 32"] {
        assert!(warned[0].contains(part), "no `{part}` in {}", warned[0]);
    }
}
