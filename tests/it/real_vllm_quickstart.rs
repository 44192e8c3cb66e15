//! The README's quickstart, run as written (`support::quickstart` reads its marked blocks) in
//! front of two real vLLM engines (the CPU route the README gives: vLLM CPU 0.32.0 and the tiny
//! Qwen3), with exact prefix hits: the router's `/debug/route` prediction equals vLLM's own
//! `usage.prompt_tokens_details.cached_tokens` for every request, and a repeat hits. Only the
//! ports are moved to fresh loopback ones (`PortMap`). The unignored test checks that the
//! blocks agree with each other (and the config loads) on every `cargo test`.
//!
//! The ignored test runs in the real-vLLM stage (see `real_vllm.rs`); it runs the README's
//! `bash scripts/real-engines/vllm-setup.sh` again, which takes seconds once the stage's own
//! run installed everything.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::quickstart::{PortMap, Quickstart, Shell, ports_in, run};
use crate::support::real_engine::engine_cache;
use crate::support::request_kinds::document;
use crate::support::vllm::VllmSetup;

/// The quickstart's `kvroute.toml` as a TOML value.
fn config(text: &str) -> toml::Value {
    toml::Value::Table(toml::from_str(text).expect("the quickstart's kvroute.toml is TOML"))
}

/// `--flag VALUE` values of every line of `block` that has it.
fn flag_values(block: &str, flag: &str) -> Vec<String> {
    block
        .split(flag)
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_readme_quickstart_blocks_agree_with_each_other() {
    let q = Quickstart::from_readme();
    let engines = q.block("engines");
    let toml_text = q.block("kvroute.toml");
    let c = config(toml_text);
    let model = &c["models"][0];
    // The router serves the engines' model name, at their block size.
    let served = flag_values(engines, "--served-model-name ");
    assert_eq!(served.len(), 2, "two engines: {engines}");
    for name in &served {
        assert_eq!(model["name"].as_str(), Some(name.as_str()));
    }
    for size in flag_values(engines, "--block-size ") {
        assert_eq!(
            model["block_size"].as_integer().map(|b| b.to_string()),
            Some(size)
        );
    }
    // The tokenizer is the directory the engines serve.
    for dir in flag_values(engines, "vllm serve ") {
        assert_eq!(model["tokenizer"].as_str(), Some(dir.as_str()));
    }
    // Each engine is a worker, its events where the engine publishes them.
    let workers = c["workers"].as_array().expect("[[workers]]");
    let http: BTreeSet<u16> = flag_values(engines, "--port ")
        .iter()
        .map(|p| p.parse().unwrap())
        .collect();
    let urls: BTreeSet<u16> = workers
        .iter()
        .flat_map(|w| ports_in(w["url"].as_str().unwrap()))
        .collect();
    assert_eq!(http, urls, "the workers are the engines' ports");
    let published: BTreeSet<u16> = ports_in(engines).difference(&http).copied().collect();
    let subscribed: BTreeSet<u16> = workers
        .iter()
        .flat_map(|w| {
            ports_in(w["kv_events"].as_str().unwrap())
                .into_iter()
                .chain(ports_in(w["kv_replay"].as_str().unwrap()))
        })
        .collect();
    assert_eq!(published, subscribed, "events and replay ports");
    // The router's port differs from the engines', and the checks ask the router.
    let listen = ports_in(c["server"]["listen"].as_str().unwrap());
    assert!(listen.is_disjoint(&http), "router and engines share a port");
    assert_eq!(
        ports_in(q.block("verify")),
        listen,
        "verify asks the router"
    );
    // kvroute accepts the config as written, with the Qwen3 tokenizer fixture where the
    // quickstart's model directory would be (the tokenizer must exist at load).
    let tokenizer = model["tokenizer"].as_str().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers/qwen3");
    let here = toml_text.replace(
        &format!("\"{tokenizer}\""),
        &format!("\"{}\"", fixture.display()),
    );
    assert_ne!(here, toml_text);
    kvroute::config::Config::from_toml(&here, Path::new("kvroute.toml"))
        .expect("the quickstart's config loads");
    assert!(q.block("router").contains("kvroute.toml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM: scripts/real-engines/vllm-setup.sh; run by .ci/run"]
async fn real_vllm_readme_quickstart_gives_exact_prefix_hits() {
    VllmSetup::locate();
    let home = std::env::var("HOME").expect("HOME");
    assert_eq!(
        engine_cache(),
        Path::new(&home).join(".cache/kvroute"),
        "the README's CPU route names ~/.cache/kvroute: unset KVROUTE_ENGINE_CACHE"
    );
    let q = Quickstart::from_readme();
    let ports = PortMap::fresh(q.ports());
    let dir = tempfile::tempdir().expect("temp dir");
    let dir = dir.path();
    // The reader's clone: its `scripts/`, and `kvroute` installed on PATH.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(repo.join("scripts"), dir.join("scripts")).unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kvroute"), bin.join("kvroute")).unwrap();

    // One terminal: the CPU route, then both engines in the background.
    let script = format!(
        "set -e\n{}\n{}\nwait\n",
        q.block("cpu"),
        ports.apply(q.block("engines"))
    );
    let mut engines = Shell::spawn(&script, dir, &bin, "engines");
    let toml_text = ports.apply(q.block("kvroute.toml"));
    std::fs::write(dir.join("kvroute.toml"), &toml_text).unwrap();
    let c = config(&toml_text);
    let urls: Vec<String> = c["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect();
    for url in &urls {
        wait_until(&mut engines, Duration::from_secs(900), || async {
            reqwest::get(format!("{url}/health"))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await
        .unwrap_or_else(|| panic!("{url} never answered /health"));
    }

    // Another terminal: the router.
    let mut router = Shell::spawn(&ports.apply(q.block("router")), dir, &bin, "router");
    let base = format!("http://{}", c["server"]["listen"].as_str().unwrap());
    wait_until(&mut router, Duration::from_secs(60), || async {
        let Ok(r) = reqwest::get(format!("{base}/admin/workers")).await else {
            return false;
        };
        let v: Value = r.json().await.unwrap_or_default();
        // Healthy, its events connected, and its models read from its `/v1/models` (the
        // quickstart's workers name none): until then the router serves nothing of it.
        let ready = |w: &Value| {
            w["healthy"] == true
                && w["kv_events_connected"] == true
                && w["models"].as_array().is_some_and(|m| !m.is_empty())
        };
        v["workers"]
            .as_array()
            .is_some_and(|ws| ws.len() == urls.len() && ws.iter().all(ready))
    })
    .await
    .expect("the router sees both engines healthy, their events connected");

    // The README's own check, as written.
    let (out, err) = run(&ports.apply(q.block("verify")), dir, &bin, 300);
    println!("the README's verify block printed:\n{out}{err}");
    readme_check_holds(&format!("{out}\n--- standard error:\n{err}"));

    // More prompts than the README's one, each waited for in the index before its repeat.
    let model = c["models"][0]["name"].as_str().unwrap().to_string();
    let block = c["models"][0]["block_size"].as_integer().unwrap() as u64;
    let http = reqwest::Client::new();
    for topic in ["harbor", "orchard", "canyon"] {
        let body = json!({"model": model, "prompt": document(topic, 300), "max_tokens": 4});
        for turn in ["first", "repeat"] {
            let explained = post(&http, &format!("{base}/debug/route"), &body).await.1;
            let (worker, answer) = post(&http, &format!("{base}/v1/completions"), &body).await;
            let worker = worker.expect("x-kvroute-worker");
            let predicted = explained["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["worker"] == worker.as_str())
                .and_then(|c| c["cached_tokens"].as_u64())
                .expect("the serving worker is a candidate");
            let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("vLLM reports cached_tokens");
            println!("{topic} {turn}: {worker} predicted {predicted}, vLLM cached {cached}");
            assert_eq!(predicted, cached, "{topic} {turn} on {worker}: {answer}");
            if turn == "repeat" {
                assert_eq!(
                    explained["worker"],
                    worker.as_str(),
                    "{topic}: routed as shown"
                );
                assert!(cached > 0, "{topic}: the repeat hits the engine holding it");
            }
            let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap();
            let blocks = prompt.saturating_sub(1) / block;
            let held = || async {
                let v = post(&http, &format!("{base}/debug/route"), &body).await.1;
                v["candidates"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c["worker"] == worker.as_str()
                            && c["overlap_blocks"].as_u64().unwrap_or(0) >= blocks
                    })
                })
            };
            wait_until(&mut router, Duration::from_secs(30), held)
                .await
                .expect("the engine's KV events reach the index");
        }
    }
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sum = |name: &str| crate::support::real_engine::metric_sum(&metrics, name);
    assert!(
        sum("kvroute_cached_tokens_compared_total") >= 8.0,
        "{metrics}"
    );
    assert_eq!(sum("kvroute_cached_tokens_mismatch_total"), 0.0);
}

/// The README's verify block printed, per turn, the router's prediction and then the engine's
/// count, and then the two counters: each prediction is the engine's count, the repeat hits,
/// and no answer differed from its prediction.
fn readme_check_holds(out: &str) {
    let printed = out.split("\n--- standard error:").next().unwrap_or(out);
    let lines: Vec<Value> = printed
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("jq printed JSON"))
        .collect();
    assert_eq!(lines.len(), 4, "two turns, two lines each:\n{out}");
    for pair in lines.chunks(2) {
        assert_eq!(
            pair[0]["predicted_cached_tokens"], pair[1]["engine_cached_tokens"],
            "{out}"
        );
    }
    assert!(lines[3]["engine_cached_tokens"].as_u64() > Some(0), "{out}");
    let counter = |name: &str| crate::support::real_engine::metric_sum(printed, name);
    assert_eq!(
        counter("kvroute_cached_tokens_compared_total"),
        2.0,
        "{out}"
    );
    assert_eq!(
        counter("kvroute_cached_tokens_mismatch_total"),
        0.0,
        "{out}"
    );
}

/// POSTs `body`; the `x-kvroute-worker` header and the JSON answer.
async fn post(http: &reqwest::Client, url: &str, body: &Value) -> (Option<String>, Value) {
    let r = http.post(url).json(body).send().await.expect(url);
    let worker = r
        .headers()
        .get("x-kvroute-worker")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = r.status();
    let v: Value = r.json().await.expect("JSON answer");
    assert!(status.is_success(), "{url}: {status} {v}");
    (worker, v)
}

/// Polls `cond` every 250 ms until it holds (`Some`) or `limit` passes (`None`); panics with the
/// shell's output if the shell exits first.
async fn wait_until<F, Fut>(shell: &mut Shell, limit: Duration, mut cond: F) -> Option<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond().await {
            return Some(());
        }
        if let Some(status) = shell.exited() {
            panic!("the shell exited ({status}):\n{}", shell.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}
