//! Request ids and the access log (issue 14, item 13): every response carries an
//! `x-request-id` (the client's when usable, else a generated one), the worker receives the
//! same id, and each completion request writes one access-log line (JSON with
//! `--log-format json`) without terminal colour codes.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

fn body() -> Value {
    json!({"model": "m", "prompt": "hello there, how are you today?", "max_tokens": 4})
}

async fn post_with_id(addr: std::net::SocketAddr, id: Option<&str>) -> reqwest::Response {
    let mut req = client()
        .post(format!("http://{addr}/v1/completions"))
        .json(&body());
    if let Some(id) = id {
        req = req.header("x-request-id", id);
    }
    req.send().await.unwrap()
}

fn id_of(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("x-request-id")
        .expect("the response carries x-request-id")
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_round_trip_and_reach_the_worker() {
    let backend = Backend::start("b0", &["m"]).await;
    let router = start_router_over(PolicyKind::RoundRobin, &[&backend], "").await;
    let addr = router.addr;
    let forwarded = |i: usize| {
        backend.received()[i]
            .headers
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_owned())
    };

    // Given: kept, returned, forwarded.
    let resp = post_with_id(addr, Some("client-id_42.a:b")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(id_of(&resp), "client-id_42.a:b");
    assert_eq!(forwarded(0).as_deref(), Some("client-id_42.a:b"));

    // Absent: generated (128 random bits in hex), returned, forwarded.
    let resp = post_with_id(addr, None).await;
    let generated = id_of(&resp);
    assert_eq!(generated.len(), 32, "{generated}");
    assert!(
        generated.bytes().all(|b| b.is_ascii_hexdigit()),
        "{generated}"
    );
    assert_eq!(forwarded(1), Some(generated.clone()));
    let again = id_of(&post_with_id(addr, None).await);
    assert_ne!(again, generated, "each request gets its own id");

    // Unusable: replaced by a generated one, which is what the worker sees.
    for bad in ["has space".to_owned(), "x".repeat(129)] {
        let resp = post_with_id(addr, Some(&bad)).await;
        let id = id_of(&resp);
        assert_ne!(id, bad);
        assert_eq!(id.len(), 32);
        let last = backend.count() - 1;
        assert_eq!(forwarded(last), Some(id));
    }

    // Errors and other endpoints carry one too.
    let resp = client()
        .get(format!("http://{addr}/no/such/route"))
        .header("x-request-id", "lost-1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(id_of(&resp), "lost-1");
    let resp = client()
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(id_of(&resp).len(), 32);
    router.shutdown().await;
}

/// Lines of a child's stderr, collected by a thread.
fn collect_lines(stderr: std::process::ChildStderr) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            match line {
                Ok(l) => sink.lock().unwrap().push(l),
                Err(_) => return,
            }
        }
    });
    lines
}

/// The access-log line (parsed) whose request id is `id`, once it is written.
async fn access_line(lines: &Mutex<Vec<String>>, id: &str) -> Value {
    let find = || {
        lines.lock().unwrap().iter().find_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            (v["target"] == "kvroute::access" && v["fields"]["request_id"] == id).then_some(v)
        })
    };
    assert!(
        wait_for(Duration::from_secs(15), || find().is_some()).await,
        "no access line for {id}: {:?}",
        lines.lock().unwrap()
    );
    find().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_lines_are_json_with_every_field_and_no_colour() {
    let backend = Backend::start("b0", &["m"]).await;
    let config = format!(
        "policy = \"kv_aware\"\n[[workers]]\nid = \"w0\"\nurl = \"{}\"\nmodels = [\"m\"]\n",
        backend.url()
    );
    let (mut router, _file) =
        RouterProcess::start_with(&config, &["--log-format", "json"], Stdio::piped()).await;
    let lines = collect_lines(router.child.stderr.take().unwrap());
    let addr = router.addr;

    let streamed = client()
        .post(format!("http://{addr}/v1/completions"))
        .header("x-request-id", "access-1")
        .json(
            &json!({"model": "m", "prompt": "a prompt long enough to have some tokens in it",
                      "stream": true, "max_tokens": 4}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    let text = streamed.text().await.unwrap();
    let line = access_line(&lines, "access-1").await;
    let f = &line["fields"];
    assert_eq!(f["model"], "m", "{line}");
    assert_eq!(f["endpoint"], "completions", "{line}");
    assert_eq!(f["worker"], "w0", "{line}");
    assert_eq!(f["status"], "200", "{line}");
    assert!(f["prompt_tokens"].as_u64().is_some_and(|n| n > 0), "{line}");
    assert!(f["predicted_ttft_s"].as_f64().is_some(), "{line}");
    assert!(f["ttft_s"].as_f64().is_some(), "{line}");
    assert_eq!(f["bytes"].as_u64(), Some(text.len() as u64), "{line}");
    assert!(f["duration_s"].as_f64().is_some(), "{line}");

    // A request the router refuses itself is logged too.
    let refused = client()
        .post(format!("http://{addr}/v1/completions"))
        .header("x-request-id", "access-2")
        .json(&json!({"model": "nope", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    let line = access_line(&lines, "access-2").await;
    assert_eq!(line["fields"]["status"], "404", "{line}");
    assert_eq!(line["fields"]["model"], "nope", "{line}");
    assert!(line["fields"].get("worker").is_none(), "{line}");

    let _ = router.child.kill();
    let _ = router.child.wait();
    let all = lines.lock().unwrap().join("\n");
    assert!(!all.contains("\x1b["), "colour codes in logs: {all}");
}
