//! Which workers may serve a request, and how: the model's routable workers, then the sides a
//! disaggregated model needs. Pure over a snapshot of the fleet with the time passed in, and
//! the only copy: the forwarding path and `/debug/route` both ask it, so an explanation fails
//! exactly when the request would (`RouteError`, one status each).

use std::sync::Arc;
use std::time::Instant;

use super::error::RouteError;
use super::pair::{Plan, plan_roles};
use crate::fleet::Worker;

/// What a request needs of the workers that serve its model, beyond being routable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// A completion or chat routed on its prompt: a disaggregated model serves it as a
    /// prefill/decode pair (an error when one side has no worker).
    Pairable,
    /// A request that generates but is never handed off (the Responses API): a worker that
    /// serves whole requests.
    Whole,
    /// A request that generates nothing (embeddings, tokenize, …): a worker serving whole
    /// requests where the model has one, else any of its workers (each answers it alone).
    Any,
}

/// The workers that may serve a request, and how.
#[derive(Debug)]
pub struct Eligible {
    /// The workers (every rank of each is a target).
    pub workers: Vec<Arc<Worker>>,
    /// [`Plan::Pair`]: a prefill and a decode worker from `workers`; [`Plan::Whole`]: one.
    pub plan: Plan,
}

/// The workers that may take a request for `model` at `now` (for `None`, any model: every
/// routable worker), then how they serve it ([`shape`]).
///
/// A model no worker serves is [`RouteError::ModelNotFound`]; a model whose every worker is
/// down, draining or open-circuited is [`RouteError::NoWorker`].
pub fn eligible(
    workers: &[Arc<Worker>],
    model: Option<&str>,
    needs: Needs,
    now: Instant,
) -> Result<Eligible, RouteError> {
    let serving: Vec<Arc<Worker>> = workers
        .iter()
        .filter(|w| w.takes(model, now))
        .cloned()
        .collect();
    if serving.is_empty() {
        return Err(match model {
            Some(m) if !workers.iter().any(|w| w.serves(m)) => {
                RouteError::ModelNotFound(m.to_owned())
            }
            _ => RouteError::NoWorker,
        });
    }
    shape(serving, needs)
}

/// How `serving` (the routable workers of the request's model, or the one worker a stored
/// response pins it to) serve a request that `needs` so: whole, or — a completion or chat of a
/// model with prefill- or decode-only workers — as pairs; otherwise the workers serving whole
/// requests, or for an endpoint that generates nothing and finds none, any of them.
pub fn shape(serving: Vec<Arc<Worker>>, needs: Needs) -> Result<Eligible, RouteError> {
    let plan = plan_roles(serving.iter().map(|w| w.role()));
    match (plan, needs) {
        (Ok(plan), _) if plan == Plan::Whole || needs == Needs::Pairable => Ok(Eligible {
            workers: serving,
            plan,
        }),
        (Err(missing), Needs::Pairable) => Err(missing.into()),
        _ => {
            let whole: Vec<_> = serving
                .iter()
                .filter(|w| w.role().serves_whole())
                .cloned()
                .collect();
            let workers = match (whole.is_empty(), needs) {
                (false, _) => whole,
                (true, Needs::Any) => serving,
                (true, _) => return Err(RouteError::NoWholeWorker),
            };
            Ok(Eligible {
                workers,
                plan: Plan::Whole,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{BaseUrl, Role, Side, WorkerId, WorkerSpec};
    use crate::routing::MissingSide;

    fn worker(id: u32, model: &str, role: Role) -> Arc<Worker> {
        let spec = WorkerSpec {
            id: format!("w{id}"),
            url: BaseUrl::parse(&format!("http://127.0.0.1:{}", 9000 + id)).unwrap(),
            models: vec![model.into()],
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size: 1,
            role,
            bootstrap_port: None,
        };
        Arc::new(Worker::new(spec, WorkerId(id)))
    }

    fn ids(e: &Result<Eligible, RouteError>) -> Result<(Vec<&str>, Plan), RouteError> {
        match e {
            Ok(e) => Ok((e.workers.iter().map(|w| w.id()).collect(), e.plan)),
            Err(e) => Err(e.clone()),
        }
    }

    #[test]
    fn unknown_models_are_not_found_and_unavailable_ones_have_no_worker() {
        let now = Instant::now();
        let fleet = [worker(0, "m", Role::Both), worker(1, "n", Role::Both)];
        let e = eligible(&fleet, Some("x"), Needs::Pairable, now);
        assert_eq!(ids(&e), Err(RouteError::ModelNotFound("x".into())));
        fleet[0].set_draining(true);
        let e = eligible(&fleet, Some("m"), Needs::Any, now);
        assert_eq!(ids(&e), Err(RouteError::NoWorker));
        let e = eligible(&fleet, None, Needs::Any, now);
        assert_eq!(ids(&e), Ok((vec!["w1"], Plan::Whole)));
        fleet[1].set_healthy(false);
        let e = eligible(&fleet, None, Needs::Any, now);
        assert_eq!(ids(&e), Err(RouteError::NoWorker));
    }

    #[test]
    fn disaggregated_models_pair_completions_and_serve_the_rest_whole() {
        let now = Instant::now();
        let pd = [
            worker(0, "m", Role::Prefill),
            worker(1, "m", Role::Decode),
            worker(2, "n", Role::Both),
        ];
        let e = eligible(&pd, Some("m"), Needs::Pairable, now);
        assert_eq!(ids(&e), Ok((vec!["w0", "w1"], Plan::Pair)));
        let e = eligible(&pd, Some("m"), Needs::Whole, now);
        assert_eq!(ids(&e), Err(RouteError::NoWholeWorker));
        let e = eligible(&pd, Some("m"), Needs::Any, now);
        assert_eq!(ids(&e), Ok((vec!["w0", "w1"], Plan::Whole)));
        // A whole worker beside a prefill one serves what cannot be paired.
        let mixed = [worker(0, "m", Role::Prefill), worker(1, "m", Role::Both)];
        let e = eligible(&mixed, Some("m"), Needs::Pairable, now);
        assert_eq!(ids(&e), Ok((vec!["w0", "w1"], Plan::Pair)));
        let e = eligible(&mixed, Some("m"), Needs::Whole, now);
        assert_eq!(ids(&e), Ok((vec!["w1"], Plan::Whole)));
        // A side without a worker fails a completion, not an endpoint that generates nothing.
        let decode = [worker(0, "m", Role::Decode)];
        let e = eligible(&decode, Some("m"), Needs::Pairable, now);
        assert_eq!(ids(&e), Err(MissingSide(Side::Prefill).into()));
        let e = eligible(&decode, Some("m"), Needs::Any, now);
        assert_eq!(ids(&e), Ok((vec!["w0"], Plan::Whole)));
    }
}
