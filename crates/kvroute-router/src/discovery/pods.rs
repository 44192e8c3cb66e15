//! Which workers a pod is: pure, from the pod object alone.
//!
//! A pod is a worker while it is Running, Ready and not terminating (a deletion timestamp set
//! means the kubelet is stopping it: drain now, not when the object finally goes). Its ports are
//! the container ports named in `[discovery.kubernetes]` (`http`, `kv-events`, `kv-replay` by
//! default), or numbers given there, and an annotation `<prefix>http-port`,
//! `<prefix>kv-events-port` or `<prefix>kv-replay-port` (a number or a port name) overrides
//! either. `<prefix>data-parallel-size: N` says the pod serves N data-parallel ranks; how they
//! are reached is `<prefix>data-parallel-lb`: `external` (the default) makes it N workers, one
//! per rank, each rank's HTTP and event ports offset by the rank (vLLM's external load
//! balancing: a front door per rank); `internal` makes it one worker with N ranks behind its one
//! HTTP port, each pinned by `X-data-parallel-rank` (`vllm serve --data-parallel-size N`,
//! SGLang `--dp-size N`), whose events the router reads at the event ports plus the rank.
//! `<prefix>role` (annotation, or a pod label of that name) gives a disaggregated pod's role,
//! `prefill`, `decode` or `both` (the default), and `<prefix>bootstrap-port` a prefill pod's
//! SGLang bootstrap port.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

use crate::config::{KubernetesDiscovery, MAX_WORKER_ID_BYTES, PortRef, check_role};
use crate::fleet::{BaseUrl, Role, WorkerSpec};

/// Largest data-parallel size taken from an annotation.
pub const MAX_DATA_PARALLEL: u16 = 256;

/// Why a pod is no worker now.
#[derive(Debug, Error, PartialEq)]
pub enum NotAWorker {
    /// It has no name (never the case for a pod read from the API).
    #[error("the pod has no name")]
    Unnamed,
    /// It is being deleted.
    #[error("terminating")]
    Terminating,
    /// Not Running, or not Ready.
    #[error("not ready")]
    NotReady,
    /// No IP yet.
    #[error("no pod IP")]
    NoIp,
    /// Its IP is not an IP.
    #[error("pod IP `{0}` is not an address")]
    BadIp(String),
    /// The HTTP port is neither annotated nor a named container port.
    #[error("no container port named `{0}` and no annotation giving it")]
    NoHttpPort(String),
    /// An annotation that cannot be read.
    #[error("annotation `{key}`: `{value}` {why}")]
    BadAnnotation {
        /// The annotation.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
}

/// The workers `pod` is now, under `config`, in `namespace`.
pub fn workers_of(
    pod: &Pod,
    namespace: &str,
    config: &KubernetesDiscovery,
) -> Result<Vec<WorkerSpec>, NotAWorker> {
    let name = pod.metadata.name.as_deref().ok_or(NotAWorker::Unnamed)?;
    let (ip, ip_text) = serving_address(pod)?;
    let annotation = |what: &str| annotation_of(pod, config, what);
    let port = |what: &str, configured: &PortRef| port_of(pod, annotation(what), configured);
    let http = port("http-port", &config.http_port)?
        .ok_or_else(|| NotAWorker::NoHttpPort(config.http_port.to_string()))?;
    let events = port("kv-events-port", &config.kv_events_port)?;
    let replay = port("kv-replay-port", &config.kv_replay_port)?.filter(|_| events.is_some());
    let ranks = data_parallel_size(annotation("data-parallel-size"), config)?;
    let (role, bootstrap_port) = disaggregation(pod, config, &annotation, &port)?;
    let endpoints = PodEndpoints {
        namespace,
        name,
        ip,
        ip_text,
        http,
        events,
        replay,
        ranks,
        role,
        bootstrap_port,
        annotation_prefix: &config.annotation_prefix,
    };
    if internal_balancing(annotation("data-parallel-lb"))? {
        endpoints.one_worker_with_ranks()
    } else {
        endpoints.worker_per_rank()
    }
}

/// The pod's IP (and its text, for errors) if it serves now: not terminating (the kubelet is
/// stopping it: drain now, not when the object finally goes), Running and Ready, with an IP.
fn serving_address(pod: &Pod) -> Result<(IpAddr, &str), NotAWorker> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Err(NotAWorker::Terminating);
    }
    let status = pod.status.as_ref().ok_or(NotAWorker::NotReady)?;
    let ready = status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .as_ref()
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Err(NotAWorker::NotReady);
    }
    let ip_text = status.pod_ip.as_deref().ok_or(NotAWorker::NoIp)?;
    let ip: IpAddr = ip_text
        .parse()
        .map_err(|_| NotAWorker::BadIp(ip_text.to_owned()))?;
    Ok((ip, ip_text))
}

/// The annotation `<prefix><what>` and its trimmed value, if the pod has it: the key comes
/// back with it so an error can name it.
fn annotation_of(pod: &Pod, config: &KubernetesDiscovery, what: &str) -> Option<(String, String)> {
    let key = format!("{}{what}", config.annotation_prefix);
    let value = pod
        .metadata
        .annotations
        .as_ref()?
        .get(&key)?
        .trim()
        .to_owned();
    Some((key, value))
}

/// The port an annotation (`found`) gives — a number, or a container port's name — else the
/// `configured` one; `None` when a named port is not among the pod's containers'.
fn port_of(
    pod: &Pod,
    found: Option<(String, String)>,
    configured: &PortRef,
) -> Result<Option<u16>, NotAWorker> {
    let wanted = match found {
        Some((key, value)) => match value.parse::<u16>() {
            Ok(0) => {
                return Err(NotAWorker::BadAnnotation {
                    key,
                    value,
                    why: "is not a port",
                });
            }
            Ok(n) => PortRef::Number(n),
            Err(_) => PortRef::Name(value),
        },
        None => configured.clone(),
    };
    Ok(match wanted {
        PortRef::Number(n) => Some(n),
        PortRef::Name(n) => named_port(pod, &n),
    })
}

/// The data-parallel size: the annotation (`found`), else the configured one (at least 1).
fn data_parallel_size(
    found: Option<(String, String)>,
    config: &KubernetesDiscovery,
) -> Result<u16, NotAWorker> {
    match found {
        None => Ok(config.data_parallel_size.max(1)),
        Some((key, value)) => match value.parse::<u16>() {
            Ok(n) if (1..=MAX_DATA_PARALLEL).contains(&n) => Ok(n),
            _ => Err(NotAWorker::BadAnnotation {
                key,
                value,
                why: "is not a data-parallel size from 1 to 256",
            }),
        },
    }
}

/// Whether the `data-parallel-lb` annotation (`found`) says `internal`: one worker with its
/// ranks behind one HTTP port. `external`, or none, is a worker per rank.
fn internal_balancing(found: Option<(String, String)>) -> Result<bool, NotAWorker> {
    match found {
        None => Ok(false),
        Some((_, v)) if v == "external" => Ok(false),
        Some((_, v)) if v == "internal" => Ok(true),
        Some((key, value)) => Err(NotAWorker::BadAnnotation {
            key,
            value,
            why: "is neither `internal` nor `external`",
        }),
    }
}

/// What [`workers_of`] read from a serving pod, from which its workers are made one way
/// (one worker with its ranks) or the other (a worker per rank).
struct PodEndpoints<'a> {
    namespace: &'a str,
    name: &'a str,
    ip: IpAddr,
    ip_text: &'a str,
    http: u16,
    events: Option<u16>,
    replay: Option<u16>,
    ranks: u16,
    role: Role,
    bootstrap_port: Option<u16>,
    annotation_prefix: &'a str,
}

impl PodEndpoints<'_> {
    /// Port `p` of rank `rank`: the rank's ports are offset by the rank, and must stay ports.
    fn offset(&self, p: u16, rank: u16) -> Result<u16, NotAWorker> {
        p.checked_add(rank).ok_or(NotAWorker::BadAnnotation {
            key: format!("{}data-parallel-size", self.annotation_prefix),
            value: self.ranks.to_string(),
            why: "puts a rank's port beyond 65535",
        })
    }

    /// The ZeroMQ endpoint of event port `p` on the pod.
    fn zmq(&self, p: u16) -> String {
        format!("tcp://{}", SocketAddr::new(self.ip, p))
    }

    /// The worker's base URL on HTTP port `port`.
    fn url(&self, port: u16) -> Result<BaseUrl, NotAWorker> {
        BaseUrl::parse(&format!("http://{}", SocketAddr::new(self.ip, port)))
            .map_err(|_| NotAWorker::BadIp(self.ip_text.to_owned()))
    }

    /// Internal load balancing: one worker with every rank behind its one HTTP port.
    fn one_worker_with_ranks(&self) -> Result<Vec<WorkerSpec>, NotAWorker> {
        // The last rank's event ports must exist; rank N's are the router's to offset.
        for p in [self.events, self.replay].into_iter().flatten() {
            self.offset(p, self.ranks - 1)?;
        }
        let url = self.url(self.http)?;
        Ok(vec![WorkerSpec {
            id: worker_id(self.namespace, self.name, ""),
            url,
            models: Vec::new(),
            kv_events: self.events.map(|p| self.zmq(p)),
            kv_replay: self.replay.map(|p| self.zmq(p)),
            kv_blocks: None,
            data_parallel_size: u32::from(self.ranks),
            role: self.role,
            bootstrap_port: self.bootstrap_port,
        }])
    }

    /// External load balancing: a worker per rank, each on its own offset ports.
    fn worker_per_rank(&self) -> Result<Vec<WorkerSpec>, NotAWorker> {
        let mut workers = Vec::with_capacity(self.ranks as usize);
        for rank in 0..self.ranks {
            let url = self.url(self.offset(self.http, rank)?)?;
            let rank_suffix = (self.ranks > 1).then(|| format!(":dp{rank}"));
            let event_port = |p: Option<u16>| -> Result<Option<String>, NotAWorker> {
                Ok(p.map(|p| self.offset(p, rank))
                    .transpose()?
                    .map(|p| self.zmq(p)))
            };
            workers.push(WorkerSpec {
                id: worker_id(
                    self.namespace,
                    self.name,
                    rank_suffix.as_deref().unwrap_or(""),
                ),
                url,
                models: Vec::new(),
                kv_events: event_port(self.events)?,
                kv_replay: event_port(self.replay)?,
                kv_blocks: None,
                data_parallel_size: 1,
                role: self.role,
                bootstrap_port: self.bootstrap_port,
            });
        }
        Ok(workers)
    }
}

/// Reads a port annotation (or the configured port): see [`workers_of`].
type PortOf<'a> = dyn Fn(&str, &PortRef) -> Result<Option<u16>, NotAWorker> + 'a;

/// The pod's disaggregation role — the annotation `<prefix>role`, else the pod label of that
/// name (`prefill`, `decode` or `both`, the default) — and its SGLang bootstrap port
/// (`<prefix>bootstrap-port`: a number or a container port's name).
fn disaggregation(
    pod: &Pod,
    config: &KubernetesDiscovery,
    annotation: &dyn Fn(&str) -> Option<(String, String)>,
    port: &PortOf<'_>,
) -> Result<(Role, Option<u16>), NotAWorker> {
    let key = format!("{}role", config.annotation_prefix);
    let given = annotation("role").or_else(|| {
        let value = pod.metadata.labels.as_ref()?.get(&key)?.trim().to_owned();
        Some((key.clone(), value))
    });
    let role = match given {
        None => Role::Both,
        Some((key, value)) => value.parse().map_err(|_| NotAWorker::BadAnnotation {
            key,
            value,
            why: "is not a role: prefill, decode or both",
        })?,
    };
    let bootstrap = match annotation("bootstrap-port") {
        None => None,
        Some(_) => port("bootstrap-port", &PortRef::Number(0))?,
    };
    if let Err(e) = check_role(role, bootstrap) {
        tracing::debug!(error = %e, "pod annotations");
        return Err(NotAWorker::BadAnnotation {
            key: format!("{}bootstrap-port", config.annotation_prefix),
            value: bootstrap.map(|p| p.to_string()).unwrap_or_default(),
            why: "is given for a decode-only pod: only a prefill pod runs a bootstrap server",
        });
    }
    Ok((role, bootstrap))
}

/// The port of the container port named `name`, in any container of the pod.
fn named_port(pod: &Pod, name: &str) -> Option<u16> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .filter(|p| *p != 0)
}

/// `k8s:<namespace>:<pod><suffix>`, stable for the pod's name. A name too long for a worker id
/// (pod names reach 253 bytes, ids 128) is cut and ends with a hash of the whole, so two long
/// names never share an id.
pub fn worker_id(namespace: &str, pod: &str, suffix: &str) -> String {
    let id = format!("k8s:{namespace}:{pod}{suffix}");
    if id.len() <= MAX_WORKER_ID_BYTES {
        return id;
    }
    let hash = format!("~{:016x}", xxh3_64(id.as_bytes()));
    let mut cut = MAX_WORKER_ID_BYTES - hash.len();
    while !id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{hash}", &id[..cut])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::config::{DEFAULT_ANNOTATION_PREFIX, check_worker};

    fn config() -> KubernetesDiscovery {
        KubernetesDiscovery {
            namespace: None,
            label_selector: "app=vllm".into(),
            http_port: PortRef::Name("http".into()),
            kv_events_port: PortRef::Name("kv-events".into()),
            kv_replay_port: PortRef::Name("kv-replay".into()),
            annotation_prefix: DEFAULT_ANNOTATION_PREFIX.into(),
            data_parallel_size: 1,
        }
    }

    fn pod(name: &str, ip: &str, ready: bool, ports: &[(&str, i32)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "engine".into(),
                    ports: Some(
                        ports
                            .iter()
                            .map(|(n, p)| ContainerPort {
                                name: Some((*n).into()),
                                container_port: *p,
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some(ip.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn annotate(mut p: Pod, kv: &[(&str, &str)]) -> Pod {
        p.metadata.annotations = Some(
            kv.iter()
                .map(|(k, v)| (format!("kvroute.io/{k}"), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
        p
    }

    const PORTS: &[(&str, i32)] = &[("http", 8000), ("kv-events", 5557), ("kv-replay", 5558)];

    #[test]
    fn a_ready_pod_is_a_worker_on_its_named_ports() {
        let w = workers_of(&pod("vllm-0", "10.0.0.5", true, PORTS), "llm", &config()).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].id, "k8s:llm:vllm-0");
        assert_eq!(w[0].url.to_string(), "http://10.0.0.5:8000");
        assert_eq!(w[0].kv_events.as_deref(), Some("tcp://10.0.0.5:5557"));
        assert_eq!(w[0].kv_replay.as_deref(), Some("tcp://10.0.0.5:5558"));
        check_worker(&w[0]).unwrap();
        let only_http = workers_of(&pod("p", "fd00::5", true, &[("http", 80)]), "n", &config());
        let only_http = only_http.unwrap();
        assert_eq!(only_http[0].url.to_string(), "http://[fd00::5]:80");
        assert_eq!(
            (
                only_http[0].kv_events.as_ref(),
                only_http[0].kv_replay.as_ref()
            ),
            (None, None)
        );
    }

    #[test]
    fn not_ready_terminating_and_portless_pods_are_not_workers() {
        let c = config();
        assert_eq!(
            workers_of(&pod("p", "10.0.0.5", false, PORTS), "n", &c),
            Err(NotAWorker::NotReady)
        );
        let mut dying = pod("p", "10.0.0.5", true, PORTS);
        dying.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(workers_of(&dying, "n", &c), Err(NotAWorker::Terminating));
        let mut pending = pod("p", "10.0.0.5", true, PORTS);
        if let Some(s) = pending.status.as_mut() {
            s.phase = Some("Pending".into());
        }
        assert_eq!(workers_of(&pending, "n", &c), Err(NotAWorker::NotReady));
        let mut no_ip = pod("p", "10.0.0.5", true, PORTS);
        if let Some(s) = no_ip.status.as_mut() {
            s.pod_ip = None;
        }
        assert_eq!(workers_of(&no_ip, "n", &c), Err(NotAWorker::NoIp));
        assert_eq!(
            workers_of(&pod("p", "10.0.0.5", true, &[("web", 80)]), "n", &c),
            Err(NotAWorker::NoHttpPort("http".into()))
        );
    }

    #[test]
    fn annotations_override_ports_and_split_data_parallel_ranks() {
        let p = annotate(
            pod("p", "10.0.0.5", true, PORTS),
            &[
                ("http-port", "9000"),
                ("kv-events-port", "kv-replay"),
                ("data-parallel-size", "2"),
            ],
        );
        let w = workers_of(&p, "n", &config()).unwrap();
        let ids: Vec<_> = w.iter().map(|w| w.id.as_str()).collect();
        assert_eq!(ids, ["k8s:n:p:dp0", "k8s:n:p:dp1"]);
        assert_eq!(w[1].url.to_string(), "http://10.0.0.5:9001");
        assert_eq!(w[1].kv_events.as_deref(), Some("tcp://10.0.0.5:5559"));
        assert_eq!(w[1].kv_replay.as_deref(), Some("tcp://10.0.0.5:5559"));
        // Internal load balancing: one worker, its ranks pinned behind its one port.
        let p = annotate(
            pod("p", "10.0.0.5", true, PORTS),
            &[
                ("data-parallel-size", "4"),
                ("data-parallel-lb", "internal"),
                ("kv-replay-port", "5567"),
            ],
        );
        let w = workers_of(&p, "n", &config()).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].id, "k8s:n:p");
        assert_eq!(w[0].data_parallel_size, 4);
        assert_eq!(w[0].url.to_string(), "http://10.0.0.5:8000");
        assert_eq!(crate::config::check_worker(&w[0]), Ok(()));
        for (k, v) in [
            ("data-parallel-size", "0"),
            ("data-parallel-size", "x"),
            ("http-port", "0"),
            ("data-parallel-lb", "both"),
        ] {
            let bad = annotate(pod("p", "10.0.0.5", true, PORTS), &[(k, v)]);
            assert!(
                matches!(
                    workers_of(&bad, "n", &config()),
                    Err(NotAWorker::BadAnnotation { .. })
                ),
                "{k}={v}"
            );
        }
    }

    #[test]
    fn long_names_make_bounded_distinct_ids() {
        let a = worker_id("ns", &"a".repeat(253), "");
        let b = worker_id("ns", &format!("{}b", "a".repeat(252)), "");
        assert!(a.len() <= MAX_WORKER_ID_BYTES && b.len() <= MAX_WORKER_ID_BYTES);
        assert_ne!(a, b);
        assert_eq!(a, worker_id("ns", &"a".repeat(253), ""), "stable");
    }

    #[test]
    fn roles_come_from_an_annotation_or_a_label() {
        let p = annotate(
            pod("p", "10.0.0.5", true, PORTS),
            &[("role", "prefill"), ("bootstrap-port", "8998")],
        );
        let w = workers_of(&p, "n", &config()).unwrap();
        assert_eq!(
            (w[0].role, w[0].bootstrap_port),
            (Role::Prefill, Some(8998))
        );
        let mut labelled = pod("p", "10.0.0.5", true, PORTS);
        labelled.metadata.labels = Some(BTreeMap::from([(
            "kvroute.io/role".to_owned(),
            "decode".to_owned(),
        )]));
        let w = workers_of(&labelled, "n", &config()).unwrap();
        assert_eq!((w[0].role, w[0].bootstrap_port), (Role::Decode, None));
        let plain = workers_of(&pod("p", "10.0.0.5", true, PORTS), "n", &config()).unwrap();
        assert_eq!(plain[0].role, Role::Both);
        for kv in [
            &[("role", "mixed")][..],
            &[("role", "decode"), ("bootstrap-port", "8998")],
            &[("role", "prefill"), ("bootstrap-port", "0")],
        ] {
            let bad = annotate(pod("p", "10.0.0.5", true, PORTS), kv);
            assert!(
                matches!(
                    workers_of(&bad, "n", &config()),
                    Err(NotAWorker::BadAnnotation { .. })
                ),
                "{kv:?}"
            );
        }
    }
}
