//! The open-loop replay client: sends every planned request at its time, whatever the server
//! is doing, and records what each one saw.
//!
//! Open loop matters: a closed-loop client waits for answers before sending more, so a slow
//! server gets less traffic and looks better than it is. Here a request is due at its trace
//! time; if the client itself cannot keep up (concurrency cap reached, CPU starved), the delay
//! is recorded per request and counted, so a run that did not offer the intended load says so.
//!
//! The whole client runs on one thread (a current-thread runtime) so its CPU cost is
//! measured exactly (Linux: `/proc/thread-self/schedstat`) and the claim "drives N req/s from
//! one core" is literal. One task per request; connections come from a hyper-util pool.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use indicatif::{ProgressBar, ProgressStyle};
use thiserror::Error;
use tokio::sync::Semaphore;

use super::plan::PlannedRequest;
use super::stream::StreamTally;
use crate::report::record::{Outcome, RequestRecord};
use kvroute_router::proxy::error_chain;

/// A request sent this much after its due time counts as late.
pub const LATE_AFTER: Duration = Duration::from_millis(10);

/// Longest error body kept in a record.
const MAX_ERROR_CHARS: usize = 200;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Full URL of the completions endpoint (see [`completions_url`]).
    pub url: Uri,
    /// Most requests in flight at once; a due request waits for a slot (and is then late).
    pub concurrency_limit: usize,
    /// Time allowed for one request from sending to the end of its response.
    pub request_timeout: Duration,
    /// Draw a progress bar (only ever on a terminal).
    pub progress: bool,
}

/// Why a replay could not run at all (per-request failures are recorded, not raised).
#[derive(Debug, Error)]
pub enum ReplayError {
    /// The target is not a usable `http://` URL.
    #[error("invalid target URL `{0}`: {1}")]
    Url(String, String),
    /// The client runtime or its thread could not start.
    #[error("cannot start the replay client: {0}")]
    Runtime(String),
}

/// What a replay produced.
#[derive(Clone, Debug)]
pub struct ReplayRun {
    /// One record per planned request, in plan order.
    pub records: Vec<RequestRecord>,
    /// Wall time from the first send to the last response end, seconds.
    pub wall_s: f64,
    /// CPU time the client thread used, seconds (Linux only).
    pub client_cpu_s: Option<f64>,
    /// Requests sent more than [`LATE_AFTER`] after their due time.
    pub late_sends: usize,
    /// Requests that had to wait for a concurrency slot.
    pub waited_for_slot: usize,
    /// Largest delay between a request's due time and its sending, seconds.
    pub max_send_delay_s: f64,
}

/// The completions URL for `target`: a bare `http://host:port` (or with `/` or `/v1`) gets
/// `/v1/completions`; any other path is used as given.
pub fn completions_url(target: &str) -> Result<Uri, ReplayError> {
    let bad = |m: &str| ReplayError::Url(target.to_string(), m.to_string());
    let uri: Uri = target
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => return Err(bad(&format!("scheme `{other}` is not supported; use http"))),
        None => return Err(bad("missing scheme; use http://host:port")),
    }
    let authority = uri.authority().ok_or_else(|| bad("missing host"))?.clone();
    let path = match uri.path().trim_end_matches('/') {
        "" => "/v1/completions",
        "/v1" => "/v1/completions",
        _ => return Ok(uri),
    };
    Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|e| bad(&e.to_string()))
}

/// Replays `plan` on a dedicated thread with its own single-threaded runtime and waits for it.
pub async fn replay(
    plan: Vec<PlannedRequest>,
    config: ReplayConfig,
) -> Result<ReplayRun, ReplayError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kvroute-bench-client".to_string())
        .spawn(move || {
            let _ = tx.send(replay_blocking(plan, config));
        })
        .map_err(|e| ReplayError::Runtime(e.to_string()))?;
    rx.await
        .map_err(|_| ReplayError::Runtime("client thread ended without a result".to_string()))?
}

/// Replays `plan` on the calling thread (which must not be inside a tokio runtime).
pub fn replay_blocking(
    plan: Vec<PlannedRequest>,
    config: ReplayConfig,
) -> Result<ReplayRun, ReplayError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ReplayError::Runtime(e.to_string()))?;
    let cpu_before = thread_cpu_time();
    let mut run = runtime.block_on(drive(plan, config));
    let cpu_after = thread_cpu_time();
    run.client_cpu_s = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a).as_secs_f64()),
        _ => None,
    };
    Ok(run)
}

/// The dispatcher: waits for each request's time, takes a slot, spawns its task.
async fn drive(plan: Vec<PlannedRequest>, config: ReplayConfig) -> ReplayRun {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(10)));
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(config.concurrency_limit)
        .build(connector);
    let slots = Arc::new(Semaphore::new(config.concurrency_limit.max(1)));
    let bar = progress_bar(config.progress, plan.len());

    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(plan.len());
    let (mut late_sends, mut waited_for_slot, mut max_delay) = (0usize, 0usize, Duration::ZERO);
    for p in plan {
        let due = start + Duration::from_secs_f64(p.arrival_s.max(0.0));
        tokio::time::sleep_until(due).await;
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                waited_for_slot += 1;
                match slots.clone().acquire_owned().await {
                    Ok(permit) => permit,
                    // The semaphore is never closed; stop dispatching if it somehow is.
                    Err(_) => break,
                }
            }
        };
        let now = tokio::time::Instant::now();
        let delay = now.saturating_duration_since(due);
        if delay > LATE_AFTER {
            late_sends += 1;
        }
        max_delay = max_delay.max(delay);
        let job = Job {
            client: client.clone(),
            url: config.url.clone(),
            timeout: config.request_timeout,
            scheduled_s: p.arrival_s,
            start_s: (now - start).as_secs_f64(),
        };
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            let record = job.run(p).await;
            drop(permit);
            if let Some(bar) = bar {
                bar.inc(1);
            }
            record
        }));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for t in tasks {
        // A task only fails by panicking, which the client code does not do.
        if let Ok(r) = t.await {
            records.push(r);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let wall_s = records.iter().map(RequestRecord::end_s).fold(0.0, f64::max);
    ReplayRun {
        records,
        wall_s,
        client_cpu_s: None,
        late_sends,
        waited_for_slot,
        max_send_delay_s: max_delay.as_secs_f64(),
    }
}

fn progress_bar(wanted: bool, len: usize) -> Option<ProgressBar> {
    if !wanted || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} done ({per_sec})")
    {
        bar.set_style(style);
    }
    Some(bar)
}

/// One request in flight.
struct Job {
    client: Client<HttpConnector, Full<Bytes>>,
    url: Uri,
    timeout: Duration,
    scheduled_s: f64,
    start_s: f64,
}

impl Job {
    async fn run(self, p: PlannedRequest) -> RequestRecord {
        let sent = Instant::now();
        let mut tally = StreamTally::default();
        let mut worker = None;
        let result = tokio::time::timeout(
            self.timeout,
            exchange(
                &self.client,
                &self.url,
                p.body,
                sent,
                &mut tally,
                &mut worker,
            ),
        )
        .await;
        let e2e_s = sent.elapsed().as_secs_f64();
        let (outcome, error) = match result {
            Err(_) => (
                Outcome::Timeout,
                Some(format!("no end within {:?}", self.timeout)),
            ),
            Ok(Err((outcome, message))) => (outcome, Some(message)),
            Ok(Ok(())) => match tally.stream_error.take() {
                Some(message) => (Outcome::Stream, Some(message)),
                None => (Outcome::Ok, None),
            },
        };
        let (itl_mean_s, itl_p99_s) = tally.itl();
        RequestRecord {
            index: p.index,
            scheduled_s: self.scheduled_s,
            start_s: self.start_s,
            ttft_s: tally.first_token_s,
            e2e_s,
            itl_mean_s,
            itl_p99_s,
            outcome,
            error,
            prompt_tokens: p.prompt_tokens,
            completion_tokens: tally.completion_tokens.unwrap_or(tally.token_events),
            cached_tokens: tally.cached_tokens,
            worker,
        }
    }
}

/// Sends one request and reads its response into `tally`.
async fn exchange(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &Uri,
    body: Bytes,
    sent: Instant,
    tally: &mut StreamTally,
    worker: &mut Option<String>,
) -> Result<(), (Outcome, String)> {
    let req = Request::post(url.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "text/event-stream")
        .body(Full::new(body))
        .map_err(|e| (Outcome::Connect, e.to_string()))?;
    let resp = client.request(req).await.map_err(|e| {
        let kind = if e.is_connect() {
            Outcome::Connect
        } else {
            Outcome::Stream
        };
        (kind, error_chain(&e))
    })?;
    *worker = resp
        .headers()
        .get("x-kvroute-worker")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let mut body = resp.into_body();
    if !status.is_success() || is_json {
        let bytes = body
            .collect()
            .await
            .map_err(|e| (Outcome::Stream, error_chain(&e)))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            let message: String = text.chars().take(MAX_ERROR_CHARS).collect();
            return Err((
                Outcome::Http {
                    status: status.as_u16(),
                },
                message,
            ));
        }
        tally.whole_body(&bytes, sent.elapsed().as_secs_f64());
        return Ok(());
    }
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| (Outcome::Stream, error_chain(&e)))?;
        if let Some(data) = frame.data_ref() {
            tally.feed(data, sent.elapsed().as_secs_f64());
        }
    }
    Ok(())
}

/// CPU time used so far by the calling thread (Linux; `None` elsewhere).
pub fn thread_cpu_time() -> Option<Duration> {
    // First field: nanoseconds spent on the CPU.
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_target_gets_completions_path() {
        assert_eq!(
            completions_url("http://127.0.0.1:8000")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:8000/v1/completions"
        );
        assert_eq!(
            completions_url("http://h:1/v1/").unwrap().to_string(),
            "http://h:1/v1/completions"
        );
        assert_eq!(
            completions_url("http://h:1/custom/path").unwrap().path(),
            "/custom/path"
        );
        assert!(completions_url("https://h").is_err());
        assert!(completions_url("h:1").is_err());
    }

    #[test]
    fn thread_cpu_time_advances_on_linux() {
        if let Some(a) = thread_cpu_time() {
            let mut x = 0u64;
            for i in 0..2_000_000u64 {
                x = x.wrapping_add(i * i);
            }
            std::hint::black_box(x);
            assert!(thread_cpu_time().unwrap() > a);
        }
    }
}
