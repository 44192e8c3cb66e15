//! kvroute (in this process) in front of real engines (vLLM or SGLang), and the exactness
//! check: for each request, `/debug/route`'s predicted reuse on the worker that then serves it
//! must equal the `cached_tokens` that engine reports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvroute::config::Config;
use kvroute::server::RouterHandle;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::real_engine::EngineProc;

/// The tiny model's name as clients send it (both engines serve it under this name).
pub const MODEL: &str = "tiny-qwen3";
/// Its LoRA adapter's name.
pub const LORA: &str = "tiny-qwen3-lora";

/// What the router must be told about the engines' model: its tokenizer directory and the
/// engines' KV block (page) size.
pub trait RouterModel {
    fn tokenizer_dir(&self) -> PathBuf;
    fn block_size(&self) -> u32;
    /// `[[models]] engine`: how the engine renders chat tools.
    fn engine(&self) -> &'static str;
}

/// The admin key of routers started with tenants.
pub const ADMIN_KEY: &str = "admin-key";

/// A tenant: name and API key.
pub type Tenant = (&'static str, &'static str);

/// The router's config for `engines`: the tiny model with the engines' tokenizer and block
/// size, the LoRA adapter on it, and each engine's event and replay endpoints.
pub fn router_config(
    setup: &impl RouterModel,
    engines: &[EngineProc],
    policy: &str,
    tenants: &[Tenant],
) -> Config {
    let mut text = format!(
        "policy = \"{policy}\"\nshutdown_grace_s = 1.0\n[health]\ninterval_s = 0.5\n\
         [kv_aware]\ncalibrate = false\n\
         [[models]]\nname = \"{MODEL}\"\ntokenizer = \"{}\"\nblock_size = {}\nengine = \"{}\"\n\
         [[models]]\nname = \"{LORA}\"\nbase_model = \"{MODEL}\"\n",
        setup.tokenizer_dir().display(),
        setup.block_size(),
        setup.engine()
    );
    for e in engines {
        text += &format!(
            "[[workers]]\nid = \"{}\"\nurl = \"{}\"\nmodels = [\"{MODEL}\", \"{LORA}\"]\n\
             kv_events = \"{}\"\nkv_replay = \"{}\"\n",
            e.name,
            e.url(),
            e.events_endpoint(),
            e.replay_endpoint()
        );
    }
    if !tenants.is_empty() {
        for (name, key) in tenants {
            text += &format!(
                "[[tenants]]\nname = \"{name}\"\napi_key_sha256 = \"{}\"\n",
                super::sha256_hex(key)
            );
        }
        text += &format!(
            "[admin]\napi_key_sha256 = \"{}\"\n",
            super::sha256_hex(ADMIN_KEY)
        );
    }
    Config::from_toml(&text, Path::new("real_engines")).expect("router config")
}

/// What one request got, against what the router predicted for it.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub worker: String,
    /// `/debug/route`'s `cached_tokens` for `worker`, asked just before sending.
    pub predicted: u64,
    /// The engine's `usage.prompt_tokens_details.cached_tokens`.
    pub cached: u64,
    /// Prompt tokens as the router counted them, and as the engine did.
    pub router_prompt_tokens: u64,
    pub engine_prompt_tokens: u64,
    /// The engine's answer.
    pub body: Value,
}

impl Outcome {
    pub fn exact(&self) -> bool {
        self.predicted == self.cached && self.router_prompt_tokens == self.engine_prompt_tokens
    }
}

/// A router in this process, in front of real engines.
pub struct RealRouter {
    pub handle: RouterHandle,
    /// The engines' block size (the model's, in the router's config).
    block: u32,
    http: reqwest::Client,
}

impl RealRouter {
    pub async fn start(config: &Config) -> RealRouter {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind router");
        let handle = kvroute::server::start(config, listener).expect("router starts");
        RealRouter {
            handle,
            block: config.model(MODEL).block_size,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("http client"),
        }
    }

    /// Waits until `/ready` answers 200 (a worker can take requests), for up to 60 s.
    pub async fn wait_ready(&self) {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = self.http.get(self.url("/ready")).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(
                Instant::now() < end,
                "the router never found a healthy worker"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The KV block size the (first) worker's engine reports, as `/admin/workers` shows it
    /// once the health checker read it (within 20 s), and the models it names as configured
    /// with another one.
    pub async fn engine_block_size(&self) -> (u32, Value) {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let listed: Value = self
                .http
                .get(self.url("/admin/workers"))
                .send()
                .await
                .expect("admin workers")
                .json()
                .await
                .expect("admin workers JSON");
            let w = &listed["workers"][0];
            if let Some(size) = w["engine_block_size"].as_u64() {
                return (size as u32, w["block_size_mismatch"].clone());
            }
            assert!(Instant::now() < end, "no engine block size read: {w}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.handle.addr)
    }

    /// `/debug/route` for `body` (as `tenant` when given, with the admin key).
    pub async fn explain(&self, body: &Value, tenant: Option<&Tenant>) -> Value {
        let (status, v) = self.explain_or_error(body, tenant).await;
        assert!(status.is_success(), "/debug/route: {status} {v}");
        v
    }

    /// `/debug/route`'s status and answer for `body`: the explanation, or the error the
    /// request would get (a 503 while no engine can take it).
    pub async fn explain_or_error(
        &self,
        body: &Value,
        tenant: Option<&Tenant>,
    ) -> (reqwest::StatusCode, Value) {
        let mut req = self.http.post(self.url("/debug/route")).json(body);
        if let Some((name, _)) = tenant {
            req = req.bearer_auth(ADMIN_KEY).header("x-kvroute-tenant", *name);
        }
        let resp = req.send().await.expect("/debug/route answers");
        let status = resp.status();
        let v: Value = resp.json().await.expect("/debug/route JSON");
        (status, v)
    }

    /// The candidate entry of `worker` in an explanation.
    fn candidate<'v>(explained: &'v Value, worker: &str) -> Option<&'v Value> {
        explained["candidates"]
            .as_array()?
            .iter()
            .find(|c| c["worker"] == worker)
    }

    /// Sends `body` (chat when it has `messages`) as `tenant`; the serving worker and answer.
    pub async fn send(&self, body: &Value, tenant: Option<&Tenant>) -> (String, Value) {
        let path = match body.get("messages") {
            Some(_) => "/v1/chat/completions",
            None => "/v1/completions",
        };
        let mut req = self.http.post(self.url(path)).json(body);
        if let Some((_, key)) = tenant {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.expect("router answers");
        let status = resp.status();
        let worker = resp
            .headers()
            .get("x-kvroute-worker")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let v: Value = resp.json().await.expect("JSON answer");
        assert!(status.is_success(), "{path}: {status} {v}");
        (worker, v)
    }

    /// Asks `/debug/route`, sends, compares, then waits until the router has the request's
    /// blocks from the engine's events (so the next request's prediction is not racing them).
    pub async fn checked(&self, body: &Value, tenant: Option<&Tenant>) -> Outcome {
        let explained = self.explain(body, tenant).await;
        let (worker, answer) = self.send(body, tenant).await;
        let candidate = Self::candidate(&explained, &worker);
        let predicted = candidate.map_or(0, |c| c["cached_tokens"].as_u64().unwrap_or(0));
        let usage = &answer["usage"];
        let outcome = Outcome {
            worker: worker.clone(),
            predicted,
            cached: usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            router_prompt_tokens: explained["prompt_tokens"].as_u64().unwrap_or(0),
            engine_prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
            body: answer,
        };
        let full = outcome.engine_prompt_tokens.saturating_sub(1) / u64::from(self.block);
        self.settle(body, tenant, &worker, full).await;
        outcome
    }

    /// Waits until the index holds at least `blocks` of `body`'s blocks on `worker` and the
    /// worker's event stream has gone quiet (no new batch for 300 ms; engines publish once per
    /// step, and an idle engine takes no steps).
    pub async fn settle(&self, body: &Value, tenant: Option<&Tenant>, worker: &str, blocks: u64) {
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            let v = self.explain(body, tenant).await;
            let held = Self::candidate(&v, worker)
                .map_or(0, |c| c["overlap_blocks"].as_u64().unwrap_or(0));
            if held >= blocks {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut last = self.event_batches(worker).await;
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = self.event_batches(worker).await;
            if now == last || Instant::now() > end {
                return;
            }
            last = now;
        }
    }

    /// Event batches the router has received from `worker`.
    pub async fn event_batches(&self, worker: &str) -> f64 {
        let text = super::metrics_text(self.handle.addr).await;
        let series = format!("kvroute_kv_events_total{{kind=\"batches\",worker=\"{worker}\"}}");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// `kvroute_cached_tokens_compared_total` and `_mismatch_total`, summed over workers: the
    /// router's own count of requests whose engine-reported cached tokens it could compare with
    /// its prediction, and of those that differed (issue 33).
    pub async fn cached_token_mismatches(&self) -> (f64, f64) {
        let text = super::metrics_text(self.handle.addr).await;
        let sum = |name: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        (
            sum("kvroute_cached_tokens_compared_total"),
            sum("kvroute_cached_tokens_mismatch_total"),
        )
    }

    /// The router's own mismatch counter is 0 after requests it could compare (the exactness
    /// table, seen from the metrics an operator alerts on).
    pub async fn assert_no_cached_token_mismatch(&self) {
        let (compared, mismatched) = self.cached_token_mismatches().await;
        assert!(compared > 0.0, "no request's cached tokens were compared");
        assert_eq!(
            mismatched, 0.0,
            "kvroute_cached_tokens_mismatch_total counted {mismatched} of {compared} requests"
        );
    }

    pub async fn shutdown(self) {
        self.handle.shutdown().await;
    }
}

/// Exact/total per case, and every mismatch in full.
#[derive(Default)]
pub struct Exactness {
    rows: BTreeMap<String, (usize, usize)>,
    order: Vec<String>,
    mismatches: Vec<String>,
}

impl Exactness {
    pub fn record(&mut self, case: &str, o: &Outcome) {
        if !self.rows.contains_key(case) {
            self.order.push(case.to_string());
        }
        let row = self.rows.entry(case.to_string()).or_default();
        row.1 += 1;
        if o.exact() {
            row.0 += 1;
        } else {
            self.mismatches.push(format!(
                "{case}: worker {} predicted {} cached, engine reported {} (prompt tokens: router {}, engine {})",
                o.worker, o.predicted, o.cached, o.router_prompt_tokens, o.engine_prompt_tokens
            ));
        }
    }

    /// Prints the table (case, exact/total) and the mismatches.
    pub fn print(&self, title: &str) {
        println!("exactness ({title}): case | exact/total");
        for case in &self.order {
            let (exact, total) = self.rows[case];
            println!("  {case:<28} {exact}/{total}");
        }
        for m in &self.mismatches {
            println!("  MISMATCH {m}");
        }
    }

    pub fn assert_all_exact(&self) {
        assert!(
            self.mismatches.is_empty(),
            "{} of the requests were not predicted exactly:\n{}",
            self.mismatches.len(),
            self.mismatches.join("\n")
        );
    }
}

/// `json!` body of a completion for the tiny model.
pub fn completion(prompt: impl Into<Value>, max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": prompt.into(), "max_tokens": max_tokens, "temperature": 0})
}

/// `json!` body of a chat for the tiny model.
pub fn chat(messages: Value, max_tokens: u32) -> Value {
    json!({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
}
