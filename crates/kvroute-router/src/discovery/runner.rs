//! Carries out a source's reconciliation against the router: probes a new endpoint's models,
//! joins, drains, undrains and leaves through [`Lifecycle`] (the one owner of a worker's life),
//! and keeps the discovery metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::reconcile::{Action, Desired, FleetView, Reconciler};
use crate::config::{check_worker, names_own_address};
use crate::fleet::health::parse_models;
use crate::fleet::{Fleet, ServedModel, WorkerSpec};
use crate::lifecycle::{JoinError, LeaveError, Lifecycle, Source};
use crate::metrics::Metrics;

/// How often draining workers are looked at (to leave once idle) and failed joins retried,
/// when the source has nothing new.
const TICK: Duration = Duration::from_millis(100);

type ProbeClient = Client<HttpConnector, Empty<Bytes>>;

/// What a runner needs from the router.
pub struct RunnerContext {
    /// The workers' lives.
    pub lifecycle: Arc<Lifecycle>,
    /// Where the discovery metrics go.
    pub metrics: Metrics,
    /// Longest a departing worker drains before it is removed anyway.
    pub drain_timeout: Duration,
    /// Longest a probe of `/v1/models` may take.
    pub probe_timeout: Duration,
    /// The router's own addresses: an endpoint there would be a routing loop.
    pub own_addrs: Vec<SocketAddr>,
    /// Whether a new endpoint joins only once its `/v1/models` answers, with the models it
    /// lists (discovered endpoints); without, it joins at once with the models its spec names
    /// and the health checker learns the rest, as the config's static workers do at start.
    pub probe_models: bool,
    /// Workers already in the fleet that this source owns from the start (the config's static
    /// workers, which join with the fleet).
    pub adopted: Vec<WorkerSpec>,
}

struct InFlight<'a>(&'a Fleet);

impl FleetView for InFlight<'_> {
    fn in_flight(&self, id: &str) -> Option<u64> {
        self.0.get(id).map(|w| w.in_flight())
    }
}

/// Reconciles `source`'s desired sets from `desired` until `stop`.
pub async fn run(
    source: Source,
    mut desired: watch::Receiver<Desired>,
    mut ctx: RunnerContext,
    stop: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(ctx.probe_timeout));
    let client: ProbeClient = Client::builder(TokioExecutor::new()).build(connector);
    let mut rec = Reconciler::new(ctx.drain_timeout);
    for spec in std::mem::take(&mut ctx.adopted) {
        rec.joined(spec);
    }
    let mut runner = Runner {
        source,
        ctx,
        rec,
        client,
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(TICK) => {}
        }
        // Planned on the set in place (no copy each tick); the borrow ends before any await.
        let actions = {
            let want = desired.borrow_and_update();
            let fleet = InFlight(runner.ctx.lifecycle.fleet());
            runner.rec.plan(&want, &fleet, Instant::now())
        };
        let joins = runner.act(actions).await;
        runner.join_all(joins).await;
        runner
            .ctx
            .metrics
            .discovery
            .workers
            .with_label_values(&[runner.source.name()])
            .set(runner.rec.in_fleet() as i64);
    }
}

/// A source's runner between ticks: the reconciler's memory of what it did, and what it
/// does it with.
struct Runner {
    source: Source,
    ctx: RunnerContext,
    rec: Reconciler,
    client: ProbeClient,
}

impl Runner {
    /// Counts a discovery event of `kind` for the source.
    fn count(&self, kind: &str) {
        self.ctx
            .metrics
            .discovery
            .events
            .with_label_values(&[self.source.name(), kind])
            .inc();
    }

    /// Carries out the drains, undrains and leaves of `actions`, in order, and hands back the
    /// joins (which need their probes first).
    async fn act(&mut self, actions: Vec<Action>) -> Vec<WorkerSpec> {
        let mut joins = Vec::new();
        for action in actions {
            match action {
                Action::Join(spec) => joins.push(spec),
                Action::Drain(id) => {
                    self.ctx.lifecycle.drain(&id);
                    self.count("drain");
                }
                Action::Undrain(id) => {
                    self.ctx.lifecycle.undrain(&id);
                    self.count("undrain");
                }
                Action::Leave { id, force } => match self.ctx.lifecycle.leave(&id, force).await {
                    Ok(in_flight) => {
                        self.rec.left(&id);
                        self.count(if force { "forced_leave" } else { "leave" });
                        if force {
                            tracing::warn!(worker = %id, in_flight, "drain timed out; removed");
                        }
                    }
                    Err(LeaveError::NotFound(_)) => self.rec.left(&id),
                    // A request was admitted between the look and the leave: next tick.
                    Err(LeaveError::Busy { .. }) => {}
                },
            }
        }
        joins
    }

    /// Probes the `joins` together (when the source probes models), then joins each that
    /// may; one that may not is retried later.
    async fn join_all(&mut self, joins: Vec<WorkerSpec>) {
        let probes = joins.into_iter().map(|spec| {
            let client = &self.client;
            let timeout = self.ctx.probe_timeout;
            let probe = self.ctx.probe_models;
            async move {
                let models = if probe {
                    probe_models(client, &spec, timeout).await.map(Some)
                } else {
                    Ok(None)
                };
                (spec, models)
            }
        });
        for (spec, models) in futures_util::future::join_all(probes).await {
            match join(&self.ctx, self.source, spec.clone(), models) {
                Ok(()) => {
                    self.rec.joined(spec);
                    self.count("join");
                }
                Err(why) => {
                    tracing::info!(worker = %spec.id, url = %spec.url, %why, "not joined yet; retrying");
                    self.rec.join_failed(&spec.id, Instant::now());
                    self.count("join_failed");
                }
            }
        }
    }
}

/// Adds `spec` with the `models` it serves (as probed; `None`: not probed), or says why not.
fn join(
    ctx: &RunnerContext,
    source: Source,
    spec: WorkerSpec,
    models: Result<Option<Vec<ServedModel>>, String>,
) -> Result<(), String> {
    check_worker(&spec).map_err(|e| format!("{}: {}", e.field, e.message))?;
    if names_own_address(&spec.url, &ctx.own_addrs) {
        return Err("this is the router's own address".into());
    }
    let models = models?;
    match ctx.lifecycle.join_as(spec, source) {
        Ok(w) => {
            if let Some(models) = models {
                w.set_discovered_models(models);
            }
            Ok(())
        }
        Err(JoinError::Exists(e)) => Err(e.to_string()),
    }
}

/// The models an endpoint serves, from its `GET /v1/models`; an error while it answers none.
async fn probe_models(
    client: &ProbeClient,
    spec: &WorkerSpec,
    timeout: Duration,
) -> Result<Vec<ServedModel>, String> {
    let req = http::Request::get(spec.url.join("/v1/models"))
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let fetch = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), 4 << 20)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("GET /v1/models answered {status}"));
        }
        match parse_models(&body) {
            Some(m) if !m.is_empty() => Ok(m),
            Some(_) => Err("GET /v1/models lists no model".into()),
            None => Err("GET /v1/models is not an OpenAI model list".into()),
        }
    };
    tokio::time::timeout(timeout, fetch)
        .await
        .map_err(|_| format!("GET /v1/models took longer than {timeout:?}"))?
}
