//! `kvroute bench` as an operator runs it: without `--model` it sends the target's first
//! listed model, and a run where most requests fail exits non-zero instead of reporting a
//! "measurement" of 404s.

use std::process::Command;

use crate::support::*;

/// Runs `kvroute bench` against `target` with a tiny synthetic workload plus `extra` flags.
async fn bench(target: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "bench",
        "--target",
        target,
        "--synthetic",
        "unique",
        "--requests",
        "4",
        "--rate",
        "100",
        "--input-tokens",
        "16",
        "--output-tokens",
        "2",
        "--no-progress",
        "--timeout",
        "20",
    ];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(&args)
            .output()
            .expect("kvroute bench runs")
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn without_model_the_targets_first_model_is_sent() {
    // Straight at a worker: its /v1/models lists the model.
    let a = Backend::start("a", &["served-model", "other"]).await;
    let out = bench(&a.url(), &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("sending `served-model`"), "{stderr}");
    let received = a.received();
    assert_eq!(received.len(), 4);
    for rx in received {
        let body: serde_json::Value = serde_json::from_slice(&rx.body).unwrap();
        assert_eq!(body["model"], "served-model");
    }
}

#[tokio::test]
async fn a_run_of_failures_exits_non_zero() {
    let a = Backend::start("a", &["m"]).await;
    let r = start_router_over(PolicyKind::RoundRobin, &[&a], "").await;
    // The router answers 404 for a model no worker serves.
    let out = bench(&format!("http://{}", r.addr), &["--model", "nope"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("4 of 4 requests failed"), "{stderr}");
    assert!(stderr.contains("http_404"), "{stderr}");
    assert_eq!(a.count(), 0);
    // Tolerating every failure is the operator's explicit choice.
    let out = bench(
        &format!("http://{}", r.addr),
        &["--model", "nope", "--max-error-fraction", "1"],
    )
    .await;
    assert!(out.status.success());
    r.shutdown().await;
}

#[tokio::test]
async fn a_target_without_models_needs_the_flag() {
    let port = free_port();
    let out = bench(&format!("http://127.0.0.1:{port}"), &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("/v1/models"), "{stderr}");
}
