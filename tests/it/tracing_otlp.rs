//! OpenTelemetry tracing of a real `kvroute serve` process, received by a real OTLP/HTTP
//! receiver in this test (an axum server decoding `ExportTraceServiceRequest` protobufs): the
//! span tree of a streamed request under the client's `traceparent`, and the `traceparent` the
//! worker received continuing it. With tracing off, a client's `traceparent` reaches the
//! worker unchanged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;
use serde_json::json;

use crate::support::*;

/// One span as received: its ids in hex, its name, and its service's name.
#[derive(Clone, Debug)]
struct Got {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    service: String,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

type Spans = Arc<Mutex<Vec<Got>>>;

async fn receive(State(spans): State<Spans>, body: Bytes) -> impl axum::response::IntoResponse {
    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP/HTTP protobuf export");
    let mut got = spans.lock().unwrap();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|a| a.key == "service.name")
            .and_then(|a| a.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                any_value::Value::StringValue(s) => s.clone(),
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(Got {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name,
                    service: service.clone(),
                });
            }
        }
    }
    // An empty ExportTraceServiceResponse: full success.
    (
        [("content-type", "application/x-protobuf")],
        Vec::<u8>::new(),
    )
}

/// An OTLP/HTTP receiver on 127.0.0.1; its base address and what it received.
async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(receive))
        .with_state(Arc::clone(&spans));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), spans)
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")
}

#[tokio::test]
async fn a_streamed_request_is_one_span_tree_under_the_clients_trace() {
    let (endpoint, spans) = receiver().await;
    let backend = Backend::start("a", &["m"]).await;
    let config = format!(
        "[tracing]\nenabled = true\nsampling_ratio = 1.0\nservice_name = \"kvroute-test\"\n\
         [[workers]]\nid = \"w0\"\nurl = \"{}\"\nmodels = [\"m\"]\n",
        backend.url()
    );
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            std::path::Path::new(&endpoint),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", std::path::Path::new("50")),
    ];
    let (router, _file) =
        RouterProcess::start_env(&config, &[], std::process::Stdio::null(), &env).await;
    let resp = client()
        .post(format!("http://{}/v1/completions", router.addr))
        .header("traceparent", traceparent())
        .json(&json!({"model": "m", "prompt": "tell me a story", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    assert!(body.contains("[DONE]"), "{body}");

    let names = [
        "request",
        "body_read",
        "tokenize",
        "decide",
        "upstream_connect",
        "first_token",
        "stream",
    ];
    let all = |spans: &Spans| {
        let got = spans.lock().unwrap();
        names
            .iter()
            .all(|n| got.iter().any(|s| s.name == *n && s.trace_id == TRACE_ID))
    };
    assert!(
        wait_for(Duration::from_secs(15), || all(&spans)).await,
        "spans received: {:#?}",
        spans.lock().unwrap()
    );
    let got: Vec<Got> = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.trace_id == TRACE_ID)
        .cloned()
        .collect();
    let one = |name: &str| {
        let of: Vec<&Got> = got.iter().filter(|s| s.name == name).collect();
        assert_eq!(of.len(), 1, "one `{name}` span: {got:#?}");
        of[0].clone()
    };
    let request = one("request");
    assert_eq!(
        request.parent, CLIENT_SPAN,
        "the client's span is the parent"
    );
    assert_eq!(request.service, "kvroute-test");
    for name in &names[1..] {
        assert_eq!(
            one(name).parent,
            request.span_id,
            "`{name}` is a child of the request: {got:#?}"
        );
    }
    // The worker continues the trace under the attempt's span.
    let connect = one("upstream_connect");
    let sent = backend.received();
    let header = sent[0].headers["traceparent"].to_str().unwrap().to_owned();
    assert_eq!(
        header,
        format!("00-{TRACE_ID}-{}-01", connect.span_id),
        "the worker's traceparent"
    );
}

#[tokio::test]
async fn with_tracing_off_a_clients_traceparent_reaches_the_worker_unchanged() {
    let backend = Backend::start("a", &["m"]).await;
    let router = start_router_over(PolicyKind::RoundRobin, &[&backend], "").await;
    let resp = client()
        .post(format!("http://{}/v1/completions", router.addr))
        .header("traceparent", traceparent())
        .header("tracestate", "vendor=opaque")
        .json(&json!({"model": "m", "prompt": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = &backend.received()[0].headers;
    assert_eq!(got["traceparent"], traceparent().as_str());
    assert_eq!(got["tracestate"], "vendor=opaque");
    router.shutdown().await;
}
