//! The official `openai` Python SDK against a router in front of simulated engines.
//!
//! Ignored by default because it needs `pip install openai`; `.ci/run` installs the SDK and
//! runs it with `cargo test --test it openai_sdk -- --ignored`.

use std::net::SocketAddr;
use std::process::Command;

use kvroute::demo::{DemoArgs, start};
use kvroute::engine::EngineCoreArgs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the openai Python package; run by .ci/run"]
async fn official_openai_sdk_streams_chat_and_completions() {
    let args = DemoArgs {
        engines: 2,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        engine_base_port: 0,
        core: EngineCoreArgs {
            engine_speedup: 20.0,
            ..EngineCoreArgs::default()
        },
        ..DemoArgs::default()
    };
    let demo = start(&args).await.expect("demo starts");
    let base = format!("http://{}", demo.router.addr);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/openai_sdk_check.py");
    let model = args.model.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .arg(&base)
            .arg(&model)
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    demo.shutdown().await;
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("0 failed"), "{stdout}");
}
