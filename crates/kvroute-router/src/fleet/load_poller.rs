//! Reads every worker's own load from its `/metrics` at a short interval, so that this router
//! replica weighs the requests other replicas sent there too ([`super::load_view`]).
//!
//! vLLM publishes `vllm:num_requests_running`, `vllm:num_requests_waiting` and
//! `vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` before V1); SGLang
//! `sglang:num_running_reqs`, `sglang:num_queue_reqs` and `sglang:token_usage` (names checked
//! in SGLang's `srt/metrics/collector.py`). Series of several data-parallel ranks behind one
//! endpoint add up; repeated series of one rank (tensor-parallel ranks) do not.
//!
//! The same exposition tells how many data-parallel ranks the engine has: a worker configured
//! with another number is warned about ([`super::engine_ranks`]).
//!
//! Each reading is stored with this router's own counters at the moment the engine was asked.
//! A worker that does not answer keeps its last reading until it is [`stale_after`] old, then
//! loses it: the router falls back to its own counters rather than weigh a queue that is long
//! gone. Unhealthy workers lose theirs at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::CancellationToken;

use super::capacity::Sample;
use super::engine_ranks::listed_ranks;
use super::health::{ProbeClient, get};
use super::load_view::EngineLoad;
use super::{Fleet, LoadSnapshot, Worker};
use crate::tls::{TlsError, UpstreamTls};

/// How long one reading may take: twice the interval, at least 100 ms.
pub fn timeout(interval: Duration) -> Duration {
    (interval * 2).max(Duration::from_millis(100))
}

/// Age after which a reading is dropped: ten intervals, at least one second.
pub fn stale_after(interval: Duration) -> Duration {
    (interval * 10).max(Duration::from_secs(1))
}

/// The engine's load in a Prometheus text exposition, if it has any of the series read here:
/// the sum over its data-parallel ranks (vLLM's `engine`, SGLang's `dp_rank` label).
pub fn parse_engine_load(text: &str) -> Option<EngineLoad> {
    load_of(&samples(text), None)
}

/// The load of data-parallel rank `rank` in a Prometheus text exposition (series labelled
/// `engine="N"` by vLLM, `dp_rank="N"` by SGLang), if it has any of the series read here.
pub fn parse_rank_load(text: &str, rank: u32) -> Option<EngineLoad> {
    load_of(&samples(text), Some(&rank.to_string()))
}

/// Per series read here, the value of each rank (max over repeats of a rank).
type ByRank = BTreeMap<&'static str, BTreeMap<String, f64>>;

fn samples(text: &str) -> ByRank {
    let mut by_name: ByRank = BTreeMap::new();
    for line in text.lines() {
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        let key = match sample.name {
            "vllm:num_requests_running" | "sglang:num_running_reqs" => "running",
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => "waiting",
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
                "usage"
            }
            _ => continue,
        };
        let Some(v) = sample.value.filter(|v| v.is_finite() && *v >= 0.0) else {
            continue;
        };
        let rank = sample
            .label("engine")
            .or_else(|| sample.label("dp_rank"))
            .unwrap_or_default()
            .to_string();
        let slot = by_name.entry(key).or_default().entry(rank).or_default();
        *slot = slot.max(v);
    }
    by_name
}

/// The load of one rank (`Some`), or the sum over all (`None`).
fn load_of(by_name: &ByRank, rank: Option<&str>) -> Option<EngineLoad> {
    let values = |k: &str| -> Option<Vec<f64>> {
        let ranks = by_name.get(k)?;
        let v: Vec<f64> = match rank {
            Some(r) => ranks.get(r).copied().into_iter().collect(),
            None => ranks.values().copied().collect(),
        };
        (!v.is_empty()).then_some(v)
    };
    let count = |k: &str| values(k).map(|v| v.iter().sum::<f64>().round() as u64);
    if count("running").is_none() && count("waiting").is_none() {
        return None;
    }
    let usage = values("usage").map(|v| v.iter().sum::<f64>() / v.len() as f64);
    Some(EngineLoad {
        running: count("running").unwrap_or(0),
        waiting: count("waiting").unwrap_or(0),
        kv_usage: usage.map(|u| u.clamp(0.0, 1.0)),
    })
}

/// Reads every worker's load each `interval` until `stop` is cancelled; `https://` workers are
/// reached as `tls` says (the proxy's settings). Fails when its TLS files cannot be used.
///
/// While other replicas are heard on the replica bus, the interval is stretched by their
/// number ([`super::PollShare`]): the engines see one reading per `interval` in all.
pub fn spawn(
    fleet: Arc<Fleet>,
    interval: Duration,
    tls: &UpstreamTls,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, TlsError> {
    let connector = crate::tls::upstream::connector(tls, timeout(interval))?;
    let client: ProbeClient = Client::builder(TokioExecutor::new()).build(connector);
    Ok(tokio::spawn(async move {
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            let every = fleet.poll_share.interval(interval);
            next += every;
            let workers = fleet.workers();
            let reads = workers.iter().map(|w| read_worker(&client, w, every));
            futures_util::future::join_all(reads).await;
            // A round that overran its interval (slow engines) starts the next one at once,
            // not a burst of missed ones.
            next = next.max(tokio::time::Instant::now());
        }
    }))
}

/// This replica's own load as the engine may have counted it: its counters when the engine was
/// asked, plus `uncertain` requests — those it admitted before the answer came back (they may
/// already be in the engine's counts) and those that ended since the previous reading (an
/// engine's gauges can lag its responses). Taken for
/// another replica's, each would be phantom load on a worker this replica just used, pushing
/// its next request off a warm cache for a whole interval; counted as its own, at worst another
/// replica's short request is missed until the next reading.
pub fn own_at_reading(asked: LoadSnapshot, uncertain: u64) -> LoadSnapshot {
    LoadSnapshot {
        in_flight: asked.in_flight.saturating_add(uncertain),
        ..asked
    }
}

/// Reads one worker's load now and stores it on each of its ranks (a data-parallel worker's
/// exposition has each rank's series); drops a reading that got too old.
async fn read_worker(client: &ProbeClient, worker: &Arc<Worker>, interval: Duration) {
    let ranks = worker.ranks();
    if !worker.is_healthy() {
        for r in ranks {
            r.load.clear_reading();
        }
        return;
    }
    let before: Vec<_> = ranks
        .iter()
        .map(|r| {
            (
                r.load.snapshot(),
                r.load.finished_since_last_ask(),
                r.load.admissions().requests,
            )
        })
        .collect();
    let asked = Instant::now();
    let answer = get(client, worker, "/metrics", timeout(interval)).await;
    let text = answer
        .filter(|(status, _)| status.is_success())
        .and_then(|(_, body)| String::from_utf8(body.to_vec()).ok());
    if let Some(listed) = text.as_deref().and_then(listed_ranks) {
        let configured = worker.data_parallel_size();
        worker.engine_ranks.observe(worker.id(), configured, listed);
    }
    for (r, (own, ended_lately, admitted_before)) in ranks.iter().zip(before) {
        let engine = text.as_deref().and_then(|t| {
            if ranks.len() > 1 {
                parse_rank_load(t, r.index)
            } else {
                parse_engine_load(t)
            }
        });
        match engine {
            Some(engine) => {
                let sent_meanwhile = r.load.admissions().requests.saturating_sub(admitted_before);
                let own = own_at_reading(own, sent_meanwhile + ended_lately);
                r.load.set_reading(engine, own, Some(asked));
            }
            None => {
                if r.load
                    .reading_taken()
                    .is_some_and(|at| at.elapsed() > stale_after(interval))
                {
                    tracing::debug!(worker = &*r.label, "engine load reading dropped: too old");
                    r.load.clear_reading();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_sent_while_the_engine_was_asked_are_not_taken_for_others() {
        use crate::fleet::load_view::Reading;
        // Asked with nothing in flight; one request sent before the answer, and the engine
        // already counts it: no other replica's request is on the engine.
        let asked = LoadSnapshot::default();
        let engine = EngineLoad {
            running: 1,
            waiting: 0,
            kv_usage: None,
        };
        let naive = Reading::after(None, engine, asked);
        assert_eq!(naive.others(), 1, "without the correction: phantom load");
        let own = own_at_reading(asked, 1);
        assert_eq!(Reading::after(None, engine, own).others(), 0);
        // Another replica's request is still seen when there is one more than ours.
        let engine = EngineLoad {
            running: 2,
            ..engine
        };
        assert_eq!(Reading::after(None, engine, own).others(), 1);
    }

    #[test]
    fn reads_vllm_counts_and_usage() {
        let text = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_waiting{engine="0",model_name="qwen"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
vllm:num_requests_running_bogus 99
"#;
        assert_eq!(
            parse_engine_load(text),
            Some(EngineLoad {
                running: 3,
                waiting: 7,
                kv_usage: Some(0.25)
            })
        );
    }

    #[test]
    fn data_parallel_ranks_add_up_and_repeats_of_a_rank_do_not() {
        let text = r#"vllm:num_requests_running{engine="0"} 2
vllm:num_requests_running{engine="1"} 5
vllm:num_requests_running{engine="1"} 5
vllm:num_requests_waiting{engine="0"} 1
vllm:gpu_cache_usage_perc{engine="0"} 0.2
vllm:gpu_cache_usage_perc{engine="1"} 0.4
"#;
        let l = parse_engine_load(text).unwrap();
        assert_eq!((l.running, l.waiting), (7, 1));
        assert!((l.kv_usage.unwrap() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn reads_sglang_names() {
        let text = r#"sglang:num_running_reqs{model_name="m",tp_rank="0"} 4.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 4.0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
"#;
        assert_eq!(
            parse_engine_load(text),
            Some(EngineLoad {
                running: 4,
                waiting: 2,
                kv_usage: Some(0.5)
            })
        );
    }

    #[test]
    fn no_load_series_gives_none() {
        for text in [
            "",
            "vllm:kv_cache_usage_perc 0.5\n",
            "vllm:num_requests_running NaN\n",
            "vllm:num_requests_waiting -1\n",
            "# vllm:num_requests_running 3\n",
        ] {
            assert_eq!(parse_engine_load(text), None, "{text:?}");
        }
    }

    #[test]
    fn readings_expire_after_ten_intervals_and_at_least_a_second() {
        assert_eq!(
            stale_after(Duration::from_millis(100)),
            Duration::from_secs(1)
        );
        assert_eq!(stale_after(Duration::from_secs(1)), Duration::from_secs(10));
        assert_eq!(
            timeout(Duration::from_millis(10)),
            Duration::from_millis(100)
        );
    }
}
