//! The reconciliation core: the endpoints a source wants (its desired set) against the workers
//! discovery put in the fleet, turned into joins, drains, undrains and leaves. Pure: no I/O and
//! no clock (time is passed in), so every rule is tested without sockets.
//!
//! The rules, and why:
//! - A source publishes a complete desired set or nothing. A source that cannot reach its API
//!   server or resolver publishes nothing, so the last known set stays: an outage never
//!   removes a worker (no flapping).
//! - A departing worker (gone from the set, or changed, e.g. a new pod IP under the same pod
//!   name) is drained first and left once it has no request in flight, or forcibly after the
//!   drain timeout (the pod is being killed anyway). A changed endpoint rejoins under the same
//!   id once the old one has left: ids are stable, and two workers never share one.
//! - An endpoint that comes back while its worker still drains, unchanged, is undrained.
//! - A join that fails (the endpoint's `/v1/models` does not answer yet) is retried with a
//!   growing delay.
//! - A worker removed behind discovery's back (the admin API with `?force=true`) is not
//!   brought back at once: it comes back when its endpoint changes or the source lists
//!   everything again (a re-list).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::fleet::WorkerSpec;

/// First delay before a failed join is tried again; it doubles up to [`JOIN_RETRY_MAX`].
pub const JOIN_RETRY_MIN: Duration = Duration::from_millis(500);
/// Longest delay between two tries of a failing join.
pub const JOIN_RETRY_MAX: Duration = Duration::from_secs(10);

/// What a source wants in the fleet now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    /// The endpoints, by worker id.
    pub endpoints: BTreeMap<String, WorkerSpec>,
    /// How many complete re-lists the source has made; a change lets workers removed by the
    /// admin come back.
    pub relists: u64,
}

/// What the fleet says of a worker discovery owns.
pub trait FleetView {
    /// Requests in flight on worker `id`; `None` when it is not in the fleet.
    fn in_flight(&self, id: &str) -> Option<u64>;
}

/// One step to carry out.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Probe the endpoint's models, then add it (report [`Reconciler::joined`] or
    /// [`Reconciler::join_failed`]).
    Join(WorkerSpec),
    /// Stop sending it new requests.
    Drain(String),
    /// It is wanted again, unchanged: take new requests.
    Undrain(String),
    /// Remove it (report [`Reconciler::left`]); `force` when the drain timed out.
    Leave {
        /// The worker.
        id: String,
        /// Remove it with requests in flight.
        force: bool,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    Active,
    Draining {
        since: Instant,
    },
    /// Removed by someone else; back when its endpoint changes or at the next re-list.
    Suppressed {
        relists: u64,
    },
}

#[derive(Clone, Debug)]
struct Owned {
    spec: WorkerSpec,
    state: State,
}

/// The workers one source owns, and the joins it is retrying.
#[derive(Debug)]
pub struct Reconciler {
    drain_timeout: Duration,
    owned: BTreeMap<String, Owned>,
    /// Failed joins: when to try next, and the delay after that.
    retry: HashMap<String, (Instant, Duration)>,
}

impl Reconciler {
    /// A reconciler owning nothing yet.
    pub fn new(drain_timeout: Duration) -> Reconciler {
        Reconciler {
            drain_timeout,
            owned: BTreeMap::new(),
            retry: HashMap::new(),
        }
    }

    /// The steps that bring the fleet towards `desired` at `now`.
    pub fn plan(&mut self, desired: &Desired, fleet: &dyn FleetView, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut gone = Vec::new();
        for (id, owned) in self.owned.iter_mut() {
            let wanted = desired.endpoints.get(id);
            let unchanged = wanted.is_some_and(|w| *w == owned.spec);
            if let State::Suppressed { relists } = owned.state {
                if !unchanged || relists != desired.relists {
                    gone.push(id.clone());
                }
                continue;
            }
            let Some(in_flight) = fleet.in_flight(id) else {
                owned.state = State::Suppressed {
                    relists: desired.relists,
                };
                continue;
            };
            match owned.state {
                State::Active if !unchanged => {
                    owned.state = State::Draining { since: now };
                    actions.push(Action::Drain(id.clone()));
                    if in_flight == 0 {
                        actions.push(Action::Leave {
                            id: id.clone(),
                            force: false,
                        });
                    }
                }
                State::Draining { .. } if unchanged => {
                    owned.state = State::Active;
                    actions.push(Action::Undrain(id.clone()));
                }
                State::Draining { since } => {
                    let timed_out = now.saturating_duration_since(since) >= self.drain_timeout;
                    if in_flight == 0 || timed_out {
                        actions.push(Action::Leave {
                            id: id.clone(),
                            force: timed_out && in_flight > 0,
                        });
                    }
                }
                _ => {}
            }
        }
        for id in gone {
            self.owned.remove(&id);
        }
        self.retry
            .retain(|id, _| desired.endpoints.contains_key(id));
        for (id, spec) in &desired.endpoints {
            if self.owned.contains_key(id) {
                continue;
            }
            if self.retry.get(id).is_some_and(|(at, _)| now < *at) {
                continue;
            }
            actions.push(Action::Join(spec.clone()));
        }
        actions
    }

    /// `spec` joined the fleet.
    pub fn joined(&mut self, spec: WorkerSpec) {
        self.retry.remove(&spec.id);
        self.owned.insert(
            spec.id.clone(),
            Owned {
                spec,
                state: State::Active,
            },
        );
    }

    /// The join of worker `id` failed at `now`; it is tried again later.
    pub fn join_failed(&mut self, id: &str, now: Instant) {
        let delay = match self.retry.get(id) {
            Some((_, d)) => (*d * 2).min(JOIN_RETRY_MAX),
            None => JOIN_RETRY_MIN,
        };
        self.retry.insert(id.to_owned(), (now + delay, delay));
    }

    /// Worker `id` left the fleet.
    pub fn left(&mut self, id: &str) {
        self.owned.remove(id);
    }

    /// Workers this source has in the fleet (draining ones included).
    pub fn in_fleet(&self) -> usize {
        self.owned
            .values()
            .filter(|o| !matches!(o.state, State::Suppressed { .. }))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::BaseUrl;

    fn spec(id: &str, url: &str) -> WorkerSpec {
        WorkerSpec {
            id: id.into(),
            url: BaseUrl::parse(url).unwrap(),
            models: Vec::new(),
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size: 1,
            role: crate::fleet::Role::Both,
            bootstrap_port: None,
        }
    }

    fn desired(specs: &[WorkerSpec], relists: u64) -> Desired {
        Desired {
            endpoints: specs.iter().map(|s| (s.id.clone(), s.clone())).collect(),
            relists,
        }
    }

    /// A fleet that records in-flight counts; absent ids are not in it.
    #[derive(Default)]
    struct Fake(HashMap<String, u64>);

    impl FleetView for Fake {
        fn in_flight(&self, id: &str) -> Option<u64> {
            self.0.get(id).copied()
        }
    }

    /// Carries out `actions` on the fake fleet as the runner would, all joins succeeding.
    fn apply(r: &mut Reconciler, fleet: &mut Fake, actions: &[Action]) {
        for a in actions {
            match a {
                Action::Join(s) => {
                    fleet.0.insert(s.id.clone(), 0);
                    r.joined(s.clone());
                }
                Action::Leave { id, .. } => {
                    fleet.0.remove(id);
                    r.left(id);
                }
                Action::Drain(_) | Action::Undrain(_) => {}
            }
        }
    }

    fn leave(id: &str, force: bool) -> Action {
        Action::Leave {
            id: id.into(),
            force,
        }
    }

    #[test]
    fn joins_the_new_and_drains_then_leaves_the_departed() {
        let (a, b) = (
            spec("a", "http://10.0.0.1:80"),
            spec("b", "http://10.0.0.2:80"),
        );
        let mut r = Reconciler::new(Duration::from_secs(30));
        let mut f = Fake::default();
        let t = Instant::now();
        let acts = r.plan(&desired(&[a.clone(), b.clone()], 1), &f, t);
        assert_eq!(acts, [Action::Join(a.clone()), Action::Join(b.clone())]);
        apply(&mut r, &mut f, &acts);
        assert_eq!(r.in_fleet(), 2);
        // Nothing changes: nothing to do.
        assert!(
            r.plan(&desired(&[a.clone(), b.clone()], 1), &f, t)
                .is_empty()
        );
        // b goes while busy: drained, not left.
        f.0.insert("b".into(), 2);
        let acts = r.plan(&desired(std::slice::from_ref(&a), 1), &f, t);
        assert_eq!(acts, [Action::Drain("b".into())]);
        assert!(
            r.plan(&desired(std::slice::from_ref(&a), 1), &f, t)
                .is_empty()
        );
        // Its last request ends: it leaves.
        f.0.insert("b".into(), 0);
        let acts = r.plan(&desired(std::slice::from_ref(&a), 1), &f, t);
        assert_eq!(acts, [leave("b", false)]);
        apply(&mut r, &mut f, &acts);
        assert_eq!(r.in_fleet(), 1);
    }

    #[test]
    fn an_idle_departed_worker_leaves_at_once_and_a_busy_one_after_the_timeout() {
        let a = spec("a", "http://10.0.0.1:80");
        let mut r = Reconciler::new(Duration::from_secs(30));
        let mut f = Fake::default();
        let t = Instant::now();
        let acts = r.plan(&desired(std::slice::from_ref(&a), 0), &f, t);
        apply(&mut r, &mut f, &acts);
        assert_eq!(
            r.plan(&desired(&[], 0), &f, t),
            [Action::Drain("a".into()), leave("a", false)]
        );
        let mut r = Reconciler::new(Duration::from_secs(30));
        let mut f = Fake::default();
        let acts = r.plan(&desired(std::slice::from_ref(&a), 0), &f, t);
        apply(&mut r, &mut f, &acts);
        f.0.insert("a".into(), 1);
        assert_eq!(r.plan(&desired(&[], 0), &f, t), [Action::Drain("a".into())]);
        assert!(
            r.plan(&desired(&[], 0), &f, t + Duration::from_secs(29))
                .is_empty()
        );
        assert_eq!(
            r.plan(&desired(&[], 0), &f, t + Duration::from_secs(30)),
            [leave("a", true)]
        );
    }

    #[test]
    fn a_changed_endpoint_leaves_before_it_rejoins_under_its_id() {
        let old = spec("k8s:ns:p", "http://10.0.0.1:80");
        let new = spec("k8s:ns:p", "http://10.0.0.9:80");
        let mut r = Reconciler::new(Duration::from_secs(30));
        let mut f = Fake::default();
        let t = Instant::now();
        let acts = r.plan(&desired(std::slice::from_ref(&old), 0), &f, t);
        apply(&mut r, &mut f, &acts);
        f.0.insert(old.id.clone(), 1);
        let want = desired(std::slice::from_ref(&new), 0);
        assert_eq!(r.plan(&want, &f, t), [Action::Drain(old.id.clone())]);
        // Not joined while the old one is still there.
        assert!(r.plan(&want, &f, t).is_empty());
        f.0.insert(old.id.clone(), 0);
        let acts = r.plan(&want, &f, t);
        assert_eq!(acts, [leave(&old.id, false)]);
        apply(&mut r, &mut f, &acts);
        assert_eq!(r.plan(&want, &f, t), [Action::Join(new)]);
    }

    #[test]
    fn a_worker_back_while_draining_is_undrained() {
        let a = spec("a", "http://10.0.0.1:80");
        let mut r = Reconciler::new(Duration::from_secs(30));
        let mut f = Fake::default();
        let t = Instant::now();
        let acts = r.plan(&desired(std::slice::from_ref(&a), 0), &f, t);
        apply(&mut r, &mut f, &acts);
        f.0.insert("a".into(), 3);
        assert_eq!(r.plan(&desired(&[], 0), &f, t), [Action::Drain("a".into())]);
        assert_eq!(
            r.plan(&desired(std::slice::from_ref(&a), 0), &f, t),
            [Action::Undrain("a".into())]
        );
        assert!(
            r.plan(&desired(std::slice::from_ref(&a), 0), &f, t)
                .is_empty()
        );
    }

    #[test]
    fn failed_joins_are_retried_later_and_later() {
        let a = spec("a", "http://10.0.0.1:80");
        let mut r = Reconciler::new(Duration::from_secs(30));
        let f = Fake::default();
        let t = Instant::now();
        let want = desired(std::slice::from_ref(&a), 0);
        assert_eq!(r.plan(&want, &f, t), [Action::Join(a.clone())]);
        r.join_failed("a", t);
        assert!(r.plan(&want, &f, t + JOIN_RETRY_MIN / 2).is_empty());
        assert_eq!(
            r.plan(&want, &f, t + JOIN_RETRY_MIN),
            [Action::Join(a.clone())]
        );
        r.join_failed("a", t + JOIN_RETRY_MIN);
        assert!(
            r.plan(&want, &f, t + JOIN_RETRY_MIN * 2).is_empty(),
            "the delay doubled"
        );
        assert_eq!(
            r.plan(&want, &f, t + JOIN_RETRY_MIN * 3),
            [Action::Join(a.clone())]
        );
        // Gone from the set: its retry is forgotten, and it joins at once when it is back.
        r.join_failed("a", t);
        assert!(r.plan(&desired(&[], 0), &f, t).is_empty());
        assert_eq!(r.plan(&want, &f, t), [Action::Join(a)]);
    }

    #[test]
    fn a_worker_removed_by_the_admin_comes_back_on_a_change_or_a_relist() {
        let a = spec("a", "http://10.0.0.1:80");
        let mut r = Reconciler::new(Duration::from_secs(30));
        let mut f = Fake::default();
        let t = Instant::now();
        let acts = r.plan(&desired(std::slice::from_ref(&a), 1), &f, t);
        apply(&mut r, &mut f, &acts);
        f.0.remove("a");
        let want = desired(std::slice::from_ref(&a), 1);
        assert!(r.plan(&want, &f, t).is_empty());
        assert!(r.plan(&want, &f, t).is_empty());
        assert_eq!(r.in_fleet(), 0);
        // The next re-list brings it back.
        let relisted = desired(std::slice::from_ref(&a), 2);
        assert_eq!(r.plan(&relisted, &f, t), [Action::Join(a.clone())]);
        // So does a change of its endpoint.
        apply(&mut r, &mut f, &[Action::Join(a.clone())]);
        f.0.remove("a");
        assert!(r.plan(&relisted, &f, t).is_empty());
        let moved = spec("a", "http://10.0.0.7:80");
        assert_eq!(
            r.plan(&desired(std::slice::from_ref(&moved), 2), &f, t),
            [Action::Join(moved)]
        );
    }

    #[test]
    fn an_empty_source_owns_nothing_and_does_nothing() {
        let mut r = Reconciler::new(Duration::from_secs(1));
        assert!(
            r.plan(&Desired::default(), &Fake::default(), Instant::now())
                .is_empty()
        );
    }
}
