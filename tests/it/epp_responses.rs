//! The Responses API through `kvroute epp`: as with `serve`, the picker learns which engine
//! stored a response from the id in the answer the gateway reports, and pins a continuation
//! (`previous_response_id`) to it, naming no fallback (no other engine has it); an id it never
//! learned is answered 404 by the picker itself. The engines are simulated ones that store
//! responses per engine (an id stored on one is a 404 on the other), and the policy is
//! round-robin, so a request that were not pinned would reach the other engine.

use serde_json::{Value, json};

use crate::epp::start_epp;
use crate::support::backend::{PolicyKind, router_config};
use crate::support::gateway::{Call, Gateway};
use crate::support::{SimEngine, eventually};

const MODEL: &str = "sim";

#[tokio::test]
async fn a_continuation_is_pinned_to_the_engine_that_stored_its_response() {
    let engines = [
        SimEngine::start(MODEL, 0, 50.0).await,
        SimEngine::start(MODEL, 1, 50.0).await,
    ];
    let workers: Vec<(String, Vec<&str>)> =
        engines.iter().map(|e| (e.url(), vec![MODEL])).collect();
    let config = router_config(PolicyKind::RoundRobin, &workers, "");
    let epp = start_epp(&config).await;
    let gateway = Gateway::connect(epp.grpc_addr).await;
    let create = |body: Value| {
        let gateway = gateway.clone();
        async move {
            let bytes = serde_json::to_vec(&body).unwrap();
            gateway.request(Call::post("/v1/responses", &bytes)).await
        }
    };
    let first =
        create(json!({"model": MODEL, "input": "Say something.", "max_output_tokens": 2})).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let home = first.destination.clone().unwrap();
    let mut id = serde_json::from_slice::<Value>(&first.body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for turn in 0..6 {
        let body = json!({"model": MODEL, "previous_response_id": id,
                          "input": format!("turn {turn}"), "max_output_tokens": 2});
        let answer = create(body).await;
        let v: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(answer.status, 200, "turn {turn}: {v}");
        assert_eq!(
            answer.destination.as_deref(),
            Some(home.as_str()),
            "turn {turn}"
        );
        assert!(
            answer.fallbacks.is_empty(),
            "a pinned request has no fallback"
        );
        assert_eq!(v["previous_response_id"], id.as_str());
        id = v["id"].as_str().unwrap().to_owned();
    }
    let unknown = create(json!({"model": MODEL, "previous_response_id": "resp_never",
                                "input": "x"}))
    .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.destination, None, "answered by the picker");
    let e: Value = serde_json::from_slice(&unknown.body).unwrap();
    assert_eq!(e["error"]["code"], "response_not_found", "{e}");
    let fleet = std::sync::Arc::clone(&epp.state.fleet);
    assert!(eventually(|| fleet.workers().iter().all(|w| w.in_flight() == 0)).await);
    epp.shutdown().await;
}
