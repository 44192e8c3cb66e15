//! What follows a request once it is routed: its prompt's prefix hits counted under every
//! policy, and its line in the recorded trace.
//!
//! A prefix-aware policy hashed the prompt before deciding, and its session counted the hits;
//! all that is left is the trace line, written when the response ends (its output length is
//! known only then).
//!
//! A load-only policy decides without the prompt, and must not wait for a tokenizer. The
//! prompt is hashed anyway. A small one (a body under `route::INLINE_TOKENIZE_BYTES`, a few
//! hundred tokens: microseconds of work) is tokenized, hashed and looked up on the request's
//! path, before forwarding: that costs less than handing it to a task, whose spawn and
//! cross-thread wake-up measured about 20 µs of added latency per request on a 2-core machine
//! (`benches/proxy_overhead.rs`, `least_request` against `kv_aware`). A larger one goes to a task
//! of its own that the request never waits on: on a blocking thread it tokenizes, hashes and
//! looks the blocks up in the index at that moment, concurrently with the decision and the
//! forwarding, then waits to learn which worker took the request. Either way, once the worker
//! is known, `kvroute_prefix_hit_blocks_total` and
//! `kvroute_prefix_queried_blocks_total` are counted for it, exactly as a prefix-aware policy's
//! session does, so policies can be compared on kvroute's own metrics. The lookup is made
//! within microseconds to milliseconds of the decision rather than at it: a block that
//! arrives or leaves in between counts the other way. The engine has normally not stored this
//! request's own blocks yet (that takes its prefill and an event's trip back); on a starved
//! machine, where the blocking thread runs later than that, the request counts its own blocks
//! as hits (seen once in a full test run under heavy load: `load_only_hits`). Telling them
//! apart would take a per-block store time in the index, which the request path does not
//! need; the over-count is bounded by the requests hashed that late. A worker
//! without KV events gets the prompt's blocks predicted when the worker is known (its
//! response head), as a prefix-aware policy's admission predicts them, so the approximate
//! index answers for load-only policies too.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::{AppState, route};
use crate::fleet::WorkerRank;
use crate::openai::RequestView;
use crate::recording::{Record, Recorder};
use crate::routing::{Analysis, Target};

/// The after-routing work of one request.
pub(super) enum Trail {
    /// Nothing: a prefix-aware policy counted the hits and no trace is recorded.
    Off,
    /// The prompt was analysed on the request's path; the trace line waits for the end.
    Hashed(Box<Hashed>),
    /// A load-only policy's small prompt, analysed on the path; counted when the worker is
    /// known.
    Inline(Box<Inline>),
    /// The prompt is analysed off the path, by a task that waits for these.
    Shadow {
        routed: Option<oneshot::Sender<WorkerRank>>,
        ended: Option<oneshot::Sender<Ended>>,
    },
}

/// A prompt analysed on the path, for its trace line.
pub(super) struct Hashed {
    recorder: Arc<Recorder>,
    arrival: Instant,
    analysis: Analysis,
}

/// A load-only policy's prompt analysed on the path.
pub(super) struct Inline {
    state: Arc<AppState>,
    arrival: Instant,
    /// `None` when the prompt could not be tokenized (nothing is counted, the trace line is
    /// dropped as untokenized).
    analysis: Option<Analysis>,
    /// Whether the hits were counted (a request is routed once).
    counted: bool,
}

/// How a recorded request's response ended.
pub(super) struct Ended {
    /// Whether its response was a success (only those are recorded).
    success: bool,
    /// Output tokens observed.
    output_tokens: Option<u64>,
}

impl Trail {
    /// The trail of a request that arrived at `arrival`, whose `analysis` routing made; the
    /// `view` (from a body of `body_bytes`) and tenant-namespaced `salt` hash its prompt when
    /// the policy did not.
    pub(super) fn start(
        state: &Arc<AppState>,
        analysis: &Analysis,
        (view, body_bytes): (RequestView, usize),
        salt: Option<String>,
        arrival: Instant,
    ) -> Trail {
        let recorder = state.recorder.clone();
        if state.decider.uses_prefix() {
            return match recorder {
                Some(recorder) => Trail::Hashed(Box::new(Hashed {
                    recorder,
                    arrival,
                    analysis: Analysis {
                        request: analysis.request,
                        hashes: analysis.hashes.clone(),
                        overlaps: Default::default(),
                        at: analysis.at,
                        ttft_target_s: None,
                        session: None,
                        standing: None,
                        no_reuse: false,
                    },
                })),
                None => Trail::Off,
            };
        }
        if body_bytes < route::INLINE_TOKENIZE_BYTES {
            return Trail::Inline(Box::new(Inline {
                state: Arc::clone(state),
                arrival,
                analysis: route::hash_now(state, view, salt.as_deref()),
                counted: false,
            }));
        }
        let (routed, routed_rx) = oneshot::channel();
        let (ended, ended_rx) = match recorder {
            Some(_) => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let state = Arc::clone(state);
        tokio::spawn(async move {
            let analysis = route::hash_off_path(&state, view, salt).await;
            let Ok(worker) = routed_rx.await else {
                return;
            };
            if let Some(a) = &analysis {
                count(&state, a, &worker);
            }
            let (Some(rx), Some(recorder)) = (ended_rx, &state.recorder) else {
                return;
            };
            if let Ok(ended) = rx.await {
                record(recorder, arrival, analysis, &ended);
            }
        });
        Trail::Shadow {
            routed: Some(routed),
            ended,
        }
    }

    /// Whether the request's output tokens are wanted (a trace is recorded).
    pub(super) fn records(&self) -> bool {
        match self {
            Trail::Off => false,
            Trail::Hashed(_) => true,
            Trail::Inline(i) => i.state.recorder.is_some(),
            Trail::Shadow { ended, .. } => ended.is_some(),
        }
    }

    /// The request was routed to `target` (a worker's rank) and its response head came back.
    pub(super) fn routed(&mut self, target: WorkerRank) {
        match self {
            Trail::Shadow { routed, .. } => {
                if let Some(tx) = routed.take() {
                    let _ = tx.send(target);
                }
            }
            Trail::Inline(i) if !i.counted => {
                i.counted = true;
                if let Some(a) = &i.analysis {
                    count(&i.state, a, &target);
                }
            }
            _ => {}
        }
    }

    /// The response ended, a `success` or not, after `output_tokens` were observed.
    pub(super) fn end(&mut self, success: bool, output_tokens: Option<u64>) {
        let ended = Ended {
            success,
            output_tokens,
        };
        match std::mem::replace(self, Trail::Off) {
            Trail::Off => {}
            Trail::Hashed(h) => {
                let Hashed {
                    recorder,
                    arrival,
                    analysis,
                } = *h;
                record(&recorder, arrival, Some(analysis), &ended);
            }
            Trail::Inline(i) => {
                let Inline {
                    state,
                    arrival,
                    analysis,
                    ..
                } = *i;
                if let Some(recorder) = &state.recorder {
                    record(recorder, arrival, analysis, &ended);
                }
            }
            Trail::Shadow { ended: tx, .. } => {
                if let Some(tx) = tx {
                    let _ = tx.send(ended);
                }
            }
        }
    }
}

/// Counts the prefix hits of a request a load-only policy sent to `worker`, as a prefix-aware
/// policy's session does, and predicts its blocks there when the worker publishes no events.
fn count(state: &AppState, analysis: &Analysis, worker: &WorkerRank) {
    let blocks = analysis.request.blocks;
    if blocks == 0 {
        return;
    }
    let metrics = &state.metrics;
    metrics
        .prefix_queried_blocks
        .with_label_values(&[&**worker.label()])
        .inc_by(u64::from(blocks));
    metrics
        .prefix_hit_blocks
        .with_label_values(&[&**worker.label()])
        .inc_by(u64::from(
            analysis.overlaps.get(worker.worker()).min(blocks),
        ));
    if !worker.publishes_events() {
        state
            .holdings
            .approx
            .record_routed(worker.worker(), &analysis.hashes, state.now());
    }
}

/// Writes the trace line of a request that ended, if it succeeded and is fully known.
fn record(recorder: &Recorder, arrival: Instant, analysis: Option<Analysis>, ended: &Ended) {
    if !ended.success {
        return;
    }
    let Some(analysis) = analysis.filter(|a| a.request.prompt_tokens > 0) else {
        recorder.dropped("untokenized");
        return;
    };
    let Some(output_tokens) = ended.output_tokens else {
        recorder.dropped("no_usage");
        return;
    };
    recorder.record(Record {
        arrival: recorder.since_start(arrival),
        input_tokens: analysis.request.prompt_tokens,
        output_tokens,
        hashes: analysis.hashes,
        block_size: analysis.request.block_size,
    });
}
