//! Affinity hints through the live router (issue 29): a session named by `x-session-id`,
//! `prompt_cache_key` or `user` returns to the worker its last request went to, on workers that
//! publish no KV events, after the router's own predictions of those prompts have expired —
//! and `/debug/route` shows the hint and its home. Counts, not timings.

use std::path::Path;
use std::time::Duration;

use kvroute::config::Config;
use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{self, SimEngine};

const MODEL: &str = "sim";

struct Fleet {
    router: RouterHandle,
    engines: Vec<SimEngine>,
    http: reqwest::Client,
}

impl Fleet {
    /// A `kv_aware` router over four engines it gets no KV events from; its predictions of
    /// routed prompts last 0.3 s.
    async fn start() -> Fleet {
        let mut engines = Vec::new();
        for i in 0..4 {
            engines.push(SimEngine::start(MODEL, i, 4.0).await);
        }
        let text = format!(
            "policy = \"kv_aware\"\nshutdown_grace_s = 1.0\n[index]\napprox_ttl_s = 0.3\n\
             [[models]]\nname = \"{MODEL}\"\nblock_size = 16\n"
        );
        let mut config = Config::from_toml(&text, Path::new("test")).expect("config");
        config.workers = engines
            .iter()
            .enumerate()
            .map(|(i, e)| e.worker_without_events(&format!("e{i}"), MODEL))
            .collect();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let router = kvroute::server::start(&config, listener).expect("router");
        Fleet {
            router,
            engines,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.router.addr)
    }

    /// Sends `body` (with `header` as `x-session-id` when given); status and serving worker.
    async fn send(&self, body: &Value, header: Option<&str>) -> (u16, String) {
        let mut req = self.http.post(self.url("/v1/completions")).json(body);
        if let Some(h) = header {
            req = req.header("x-session-id", h);
        }
        let resp = req.send().await.expect("router answers");
        let status = resp.status().as_u16();
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let _ = resp.bytes().await;
        (status, worker)
    }

    async fn shutdown(self) {
        self.router.shutdown().await;
        for e in self.engines {
            let _ = e.handle.shutdown().await;
        }
    }
}

/// Session `s`'s prompt after `turns` turns: each turn appends 20 words.
fn prompt(s: usize, turns: usize) -> String {
    (0..(turns + 1) * 20)
        .map(|i| format!(" s{s}w{i}"))
        .collect()
}

/// The body of session `s`'s turn, naming the session the way `how` says.
fn body(s: usize, turns: usize, how: &str) -> (Value, Option<String>) {
    let mut b = json!({"model": MODEL, "prompt": prompt(s, turns), "max_tokens": 2});
    let name = format!("session-{s}");
    match how {
        "prompt_cache_key" | "user" => {
            b[how] = json!(name);
            (b, None)
        }
        "header" => (b, Some(name)),
        _ => (b, None),
    }
}

/// Turns of 8 sessions, each turn after the router's predictions expired; how many turns of
/// each kind went to the worker that served the session's first turn.
async fn turns_at_home(f: &Fleet, how: &str, offset: usize) -> usize {
    let mut homes = Vec::new();
    for s in offset..offset + 8 {
        let (b, h) = body(s, 0, how);
        let (status, w) = f.send(&b, h.as_deref()).await;
        assert_eq!(status, 200);
        homes.push(w);
    }
    let mut at_home = 0;
    for turn in 1..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        for (i, s) in (offset..offset + 8).enumerate() {
            let (b, h) = body(s, turn, how);
            let (status, w) = f.send(&b, h.as_deref()).await;
            assert_eq!(status, 200);
            at_home += usize::from(w == homes[i]);
        }
    }
    at_home
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_sessions_return_home_and_unnamed_ones_are_routed_on_load() {
    let f = Fleet::start().await;
    for (i, how) in ["header", "prompt_cache_key", "user"].iter().enumerate() {
        let home = turns_at_home(&f, how, i * 8).await;
        assert_eq!(home, 24, "turns named by {how} that went home");
    }
    // Without a name, the same shape is routed on load alone (the control: the hint is what
    // kept the turns home).
    let home = turns_at_home(&f, "none", 100).await;
    assert!(home < 24, "every unnamed turn went home: {home}");
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_route_shows_the_hint_and_its_home() {
    let f = Fleet::start().await;
    let (b, h) = body(1, 0, "header");
    let (_, home) = f.send(&b, h.as_deref()).await;
    let (b, _) = body(1, 1, "prompt_cache_key");
    let v = support::post_json(&f.url("/debug/route"), &b).await;
    // The body names `session-1` as the header did: the same session (one name space).
    assert_eq!(v["session"]["source"], "prompt_cache_key", "{v}");
    assert_eq!(v["session"]["known"], true, "{v}");
    assert_eq!(v["session"]["home"], home.as_str(), "{v}");
    assert_eq!(v["session"]["shared_blocks"], 1, "{v}");
    let homes: Vec<_> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["session_home"] == true)
        .map(|c| c["worker"].clone())
        .collect();
    assert_eq!(homes, [json!(home)], "{v}");
    // A request naming no session shows none.
    let (b, _) = body(2, 0, "none");
    let v = support::post_json(&f.url("/debug/route"), &b).await;
    assert!(v["session"].is_null(), "{v}");
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_name_that_is_not_a_string_is_a_400() {
    let f = Fleet::start().await;
    for key in ["prompt_cache_key", "user"] {
        let mut b = json!({"model": MODEL, "prompt": "hi", "max_tokens": 1});
        b[key] = json!(5);
        let resp = f
            .http
            .post(f.url("/v1/completions"))
            .json(&b)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        let e: Value = resp.json().await.unwrap();
        assert_eq!(e["error"]["param"], key, "{e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("must be a string")
        );
    }
    f.shutdown().await;
}
