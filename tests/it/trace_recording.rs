//! `kvroute serve --record-trace FILE`: a real router process in front of simulated engines
//! writes each routed request as a Mooncake line; shared prefixes share ids, tenants do not,
//! no prompt text reaches the file, the file rotates by size, and `kvroute simulate --trace`
//! runs on what was recorded.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kvroute::recording::rotated;
use kvroute::workload::Trace;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::support::{self, RouterProcess, SimEngine};

const MODEL: &str = "sim";

fn sha_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A prompt of `n` distinct words starting at `from` (the builtin tokenizer: one token each).
fn words(tag: &str, from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every line written so far, oldest file first.
fn recorded(path: &Path, keep: usize) -> String {
    let mut files: Vec<PathBuf> = (1..=keep).rev().map(|n| rotated(path, n)).collect();
    files.push(path.to_owned());
    files
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect()
}

async fn wait_lines(path: &Path, keep: usize, n: usize) -> String {
    for _ in 0..400 {
        let text = recorded(path, keep);
        if text.lines().count() >= n {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    recorded(path, keep)
}

/// A load-only policy: the prompt is hashed off the request's path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_records_a_trace_that_simulate_replays() {
    record_and_replay("least_request").await;
}

/// A prefix-aware policy: the hashes made for the decision are the ones recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_records_the_hashes_it_routed_on() {
    record_and_replay("kv_aware").await;
}

async fn record_and_replay(policy: &str) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let engines = [
        SimEngine::start(MODEL, 1, 50.0).await,
        SimEngine::start(MODEL, 2, 50.0).await,
    ];
    let mut config = format!(
        "policy = \"{policy}\"\n[[models]]\nname = \"{MODEL}\"\nblock_size = 16\n\
         [recording]\nmax_bytes = 4096\nkeep_files = 8\n\
         [[tenants]]\nname = \"acme\"\napi_key_sha256 = \"{}\"\n\
         [[tenants]]\nname = \"globex\"\napi_key_sha256 = \"{}\"\n",
        sha_hex("key-acme"),
        sha_hex("key-globex"),
    );
    for (i, e) in engines.iter().enumerate() {
        config.push_str(&format!(
            "[[workers]]\nid = \"e{i}\"\nurl = \"http://{}\"\nmodels = [\"{MODEL}\"]\nkv_events = \"{}\"\n",
            e.addr, e.events
        ));
    }
    let flag = trace.to_str().unwrap();
    let (router, _config_file) =
        RouterProcess::start_with(&config, &["--record-trace", flag], Stdio::null()).await;
    let http = support::client();
    let send = |key: &'static str, prompt: String, max_tokens: u32, stream: bool| {
        let http = http.clone();
        let url = format!("http://{}/v1/completions", router.addr);
        async move {
            let resp = http
                .post(url)
                .bearer_auth(key)
                .json(&json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.bytes().await.unwrap();
        }
    };
    // 40 words = 2 full blocks of 16 and a partial one; the second prompt extends the first.
    let shared = words("secretword", 0, 40);
    send("key-acme", shared.clone(), 3, false).await;
    send(
        "key-acme",
        format!("{shared} {}", words("more", 0, 30)),
        5,
        true,
    )
    .await;
    send("key-globex", shared.clone(), 2, false).await;
    let text = wait_lines(&trace, 8, 3).await;
    assert!(!text.contains("secretword"), "no prompt text in the trace");

    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    let ids = |i: usize| -> Vec<u64> {
        lines[i]["hash_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    let (a, b, other) = (ids(0), ids(1), ids(2));
    let field = |i: usize, k: &str| lines[i][k].as_u64().unwrap();
    let input = [0, 1, 2].map(|i| field(i, "input_length"));
    assert!(input[0] == input[2] && input[1] > input[0], "{input:?}");
    for (i, ids) in [&a, &b, &other].into_iter().enumerate() {
        assert_eq!(
            ids.len() as u64,
            input[i].div_ceil(16),
            "ceil(tokens / 16) ids"
        );
    }
    let full = (input[0] / 16) as usize;
    assert!(full >= 2);
    assert_eq!(
        a[..full],
        b[..full],
        "a shared prefix shares its full blocks' ids"
    );
    if input[0] % 16 != 0 {
        assert_ne!(a[full], b[full], "a partial block is never shared");
    }
    assert!(
        other.iter().all(|id| !a.contains(id)),
        "another tenant's same prompt shares nothing"
    );
    assert_eq!(
        [3, 5, 2],
        [0, 1, 2].map(|i| field(i, "output_length")),
        "output from usage, or counted on a stream"
    );
    assert!([0, 1, 2].iter().all(|&i| field(i, "block_size") == 16));
    assert!(field(0, "timestamp") <= field(1, "timestamp"));

    // Enough traffic to pass the 4 KiB rotation size several times.
    for i in 0..60 {
        send("key-acme", words(&format!("r{i}x"), 0, 200), 1, false).await;
    }
    let text = wait_lines(&trace, 8, 63).await;
    assert_eq!(text.lines().count(), 63);
    assert!(rotated(&trace, 1).exists() && rotated(&trace, 2).exists());
    for p in (1..=8).map(|n| rotated(&trace, n)).filter(|p| p.exists()) {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len < 4096 + 2048, "{} is {len} bytes", p.display());
    }
    let all = dir.path().join("all.jsonl");
    std::fs::write(&all, &text).unwrap();
    let parsed = Trace::from_mooncake_file(&all).unwrap();
    assert_eq!(parsed.len(), 63);
    assert!(parsed.requests.iter().all(|r| r.block_tokens == 16));
    assert_eq!(parsed.requests[0].output_tokens, 3);

    let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["simulate", "--trace"])
        .arg(&all)
        .args(["--policies", "kv_aware,least_request", "--workers", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("kv_aware") && stdout.contains("least_request"),
        "{stdout}"
    );
    drop(router);
}
