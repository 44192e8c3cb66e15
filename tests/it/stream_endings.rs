//! How streams end when they do not end well (issue 14, items 11 and 12): a stream still
//! running when the shutdown grace is over ends with an SSE error event (not a bare close),
//! and a stream the engine ends with an in-band error event is counted as an error.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;

use crate::support::*;

fn streaming_request() -> serde_json::Value {
    json!({"model": "m", "prompt": "tell me a long story", "stream": true, "max_tokens": 500})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_cut_by_shutdown_end_with_an_error_event() {
    let backend = Backend::start("b0", &["m"]).await;
    // 200 chunks, 100 ms apart: far longer than the grace.
    backend.set(|b| {
        b.chunks = 200;
        b.chunk_delay = Duration::from_millis(100);
    });
    let router = start_router_over(
        PolicyKind::RoundRobin,
        &[&backend],
        "[server]\nshutdown_grace_s = 1.0\n",
    )
    .await;
    let metrics = router.state.metrics.clone();
    let resp = complete(&client(), router.addr, &streaming_request()).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("tok0") {
        let chunk = body.next().await.expect("a first chunk").unwrap();
        got.extend_from_slice(&chunk);
    }
    let stopping = tokio::spawn(router.shutdown());
    let rest = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => got.extend_from_slice(&c),
                Err(_) => break,
            }
        }
    })
    .await;
    assert!(rest.is_ok(), "the stream ended within the deadline");
    let text = String::from_utf8_lossy(&got).to_string();
    let last = text
        .split("\n\n")
        .filter(|e| e.starts_with("data:"))
        .last()
        .unwrap_or_default();
    let event: serde_json::Value =
        serde_json::from_str(last.trim_start_matches("data:").trim()).expect("JSON event");
    assert_eq!(event["error"]["code"], "router_shutting_down", "{text}");
    assert!(event["error"]["message"].is_string(), "{event}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), stopping)
            .await
            .is_ok()
    );
    assert_eq!(
        metrics
            .requests
            .with_label_values(&["completions", "m", "w0", "shutdown"])
            .get(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_band_error_events_count_as_errors() {
    let backend = Backend::start("b0", &["m"]).await;
    backend.set(|b| b.error_event_mid_stream = true);
    let router = start_router_over(PolicyKind::RoundRobin, &[&backend], "").await;
    let resp = complete(&client(), router.addr, &streaming_request()).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("generation failed"),
        "the event reaches the client: {text}"
    );
    let m = &router.state.metrics;
    let count = |status: &str| {
        m.requests
            .with_label_values(&["completions", "m", "w0", status])
            .get()
    };
    assert!(eventually(|| count("stream_error") == 1).await);
    assert_eq!(count("200"), 0);

    // A stream that ends well is still a 200.
    backend.set(|b| b.error_event_mid_stream = false);
    let resp = complete(&client(), router.addr, &streaming_request()).await;
    let _ = resp.text().await.unwrap();
    assert!(eventually(|| count("200") == 1).await);
    assert_eq!(count("stream_error"), 1);
    router.shutdown().await;
}
