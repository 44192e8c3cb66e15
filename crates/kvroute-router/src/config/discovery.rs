//! `[discovery]`: workers found at run time instead of listed — pods watched through the
//! Kubernetes API (`[discovery.kubernetes]`) or the addresses of a DNS name, typically a headless
//! Service (`[discovery.dns]`). The types here are what `crate::discovery` runs with.
//!
//! Nonsense is refused at load time rather than discovered at the first pod: an empty label
//! selector (it would make every pod of the namespace a worker, the router's own included), a
//! namespace that is not a DNS label, a port of 0, a resolution interval too short to be kind
//! to the resolver.

use super::role::{RoleError, bootstrap_port, check_role, worker_role};
use crate::fleet::Role;
use std::time::Duration;

use serde::Deserialize;

use super::data_parallel::{check_ranks, data_parallel_size};
use super::values::seconds;
use super::{ConfigError, invalid};

/// How long a departing discovered worker may keep requests in flight before it is removed
/// anyway: Kubernetes' default `terminationGracePeriodSeconds`, after which the pod is killed.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Time between two resolutions of `[discovery.dns] name`.
pub const DEFAULT_DNS_INTERVAL: Duration = Duration::from_secs(5);
/// Where a pod's annotations are read (`kvroute.io/http-port`, …).
pub const DEFAULT_ANNOTATION_PREFIX: &str = "kvroute.io/";

/// A container port: by its name in the pod spec, or by number.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PortRef {
    /// The number itself.
    Number(u16),
    /// A named container port (`ports[].name`).
    Name(String),
}

impl std::fmt::Display for PortRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortRef::Number(n) => write!(f, "{n}"),
            PortRef::Name(s) => write!(f, "{s}"),
        }
    }
}

/// The validated `[discovery]` section.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct DiscoveryConfig {
    /// Pods from the Kubernetes API, when configured.
    pub kubernetes: Option<KubernetesDiscovery>,
    /// Addresses of a DNS name, when configured.
    pub dns: Option<DnsDiscovery>,
    /// The `InferencePool` whose pods are the workers (`kvroute epp --pool-name`).
    pub inference_pool: Option<InferencePoolRef>,
    /// Longest a departing worker drains before it is removed with requests in flight.
    pub drain_timeout: Duration,
}

impl DiscoveryConfig {
    /// Whether any source is configured.
    pub fn enabled(&self) -> bool {
        self.kubernetes.is_some() || self.dns.is_some() || self.inference_pool.is_some()
    }
}

/// `[discovery.kubernetes]`: which pods are workers and where each listens.
#[derive(Clone, Debug, PartialEq)]
pub struct KubernetesDiscovery {
    /// The namespace watched; `None`: the router's own (in cluster) or the kubeconfig's.
    pub namespace: Option<String>,
    /// Which pods are workers, e.g. `app=vllm`.
    pub label_selector: String,
    /// The engine's OpenAI port.
    pub http_port: PortRef,
    /// The KV-event publisher's port; a pod without it is routed without events.
    pub kv_events_port: PortRef,
    /// The KV-event replay port; a pod without it is subscribed without replay.
    pub kv_replay_port: PortRef,
    /// Prefix of the annotations that override the ports and give the data-parallel size.
    pub annotation_prefix: String,
    /// Ranks of a pod without a `data-parallel-size` annotation (1; an `InferencePool`'s
    /// `targetPorts`, one port per rank, make it their number).
    pub data_parallel_size: u16,
}

/// The `InferencePool` (`inference.networking.k8s.io/v1`) whose pods are the workers
/// (`kvroute epp --pool-name`): its selector and `targetPorts` replace
/// `[discovery.kubernetes]`'s selector and HTTP port.
#[derive(Clone, Debug, PartialEq)]
pub struct InferencePoolRef {
    /// The pool's name.
    pub name: String,
    /// Its namespace; `None`: the picker's own (in cluster) or the kubeconfig's.
    pub namespace: Option<String>,
}

/// `[discovery.dns]`: every A/AAAA record of a name is a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct DnsDiscovery {
    /// The name resolved, e.g. `vllm-headless.llm.svc.cluster.local`.
    pub name: String,
    /// The engines' OpenAI port.
    pub port: u16,
    /// Their KV-event publisher's port, if they publish events.
    pub kv_events_port: Option<u16>,
    /// Their replay port, if any.
    pub kv_replay_port: Option<u16>,
    /// Engine cores behind each address's one HTTP port (vLLM `--data-parallel-size`); each
    /// rank publishes on the event ports plus its rank.
    pub data_parallel_size: u32,
    /// The disaggregation role of every address (`role`; default `both`): one side of a
    /// disaggregated fleet behind one name, the other side configured or discovered apart.
    pub role: Role,
    /// Their SGLang bootstrap port, when they are prefill workers of an SGLang-style model.
    pub bootstrap_port: Option<u16>,
    /// Time between two resolutions.
    pub interval: Duration,
}

/// The `[discovery]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileDiscovery {
    drain_timeout_s: Option<f64>,
    kubernetes: Option<FileKubernetes>,
    dns: Option<FileDns>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct FileKubernetes {
    namespace: Option<String>,
    label_selector: Option<String>,
    http_port: Option<PortRef>,
    kv_events_port: Option<PortRef>,
    kv_replay_port: Option<PortRef>,
    annotation_prefix: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct FileDns {
    name: Option<String>,
    port: Option<u16>,
    kv_events_port: Option<u16>,
    kv_replay_port: Option<u16>,
    data_parallel_size: Option<i64>,
    role: Option<String>,
    bootstrap_port: Option<i64>,
    interval_s: Option<f64>,
}

/// Builds and checks `[discovery]`.
pub(super) fn discovery(file: FileDiscovery) -> Result<DiscoveryConfig, ConfigError> {
    let drain_timeout = seconds(
        "discovery.drain_timeout_s",
        file.drain_timeout_s,
        DEFAULT_DRAIN_TIMEOUT,
        0.0,
    )?;
    Ok(DiscoveryConfig {
        kubernetes: file.kubernetes.map(kubernetes).transpose()?,
        dns: file.dns.map(dns).transpose()?,
        inference_pool: None,
        drain_timeout,
    })
}

/// Whether `s` may name a namespace (a DNS label).
pub fn is_namespace(s: &str) -> bool {
    is_dns_label(s)
}

fn kubernetes(k: FileKubernetes) -> Result<KubernetesDiscovery, ConfigError> {
    if !cfg!(feature = "kubernetes") {
        return Err(invalid(
            "discovery.kubernetes",
            "this kvroute was built without Kubernetes discovery (cargo feature `kubernetes`); \
             use a default build, or [discovery.dns] with a headless Service",
        ));
    }
    if let Some(ns) = &k.namespace
        && !is_dns_label(ns)
    {
        return Err(invalid(
            "discovery.kubernetes.namespace",
            format!(
                "`{ns}` is not a namespace name (lowercase letters, digits and `-`, at most 63)"
            ),
        ));
    }
    let label_selector = k.label_selector.unwrap_or_default();
    if label_selector.trim().is_empty() || label_selector.chars().any(char::is_control) {
        return Err(invalid(
            "discovery.kubernetes.label_selector",
            "give the label selector of the engines' pods, e.g. \"app=vllm\" (without one, every \
             pod of the namespace would become a worker, this router's own included)",
        ));
    }
    let port = |key: &str, v: Option<PortRef>, default: &str| -> Result<PortRef, ConfigError> {
        match v {
            Some(PortRef::Number(0)) => Err(invalid(
                format!("discovery.kubernetes.{key}"),
                "0 is not a port; give a port number or a container port's name",
            )),
            Some(PortRef::Name(n)) if !is_port_name(&n) => Err(invalid(
                format!("discovery.kubernetes.{key}"),
                format!(
                    "`{n}` is not a container port name (lowercase letters, digits and `-`, at \
                     most 15, with a letter)"
                ),
            )),
            Some(p) => Ok(p),
            None => Ok(PortRef::Name(default.into())),
        }
    };
    let annotation_prefix = k
        .annotation_prefix
        .unwrap_or_else(|| DEFAULT_ANNOTATION_PREFIX.into());
    if annotation_prefix.is_empty()
        || annotation_prefix
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(invalid(
            "discovery.kubernetes.annotation_prefix",
            format!("must be non-empty, without spaces; e.g. \"{DEFAULT_ANNOTATION_PREFIX}\""),
        ));
    }
    Ok(KubernetesDiscovery {
        namespace: k.namespace,
        label_selector,
        http_port: port("http_port", k.http_port, "http")?,
        kv_events_port: port("kv_events_port", k.kv_events_port, "kv-events")?,
        kv_replay_port: port("kv_replay_port", k.kv_replay_port, "kv-replay")?,
        annotation_prefix,
        data_parallel_size: 1,
    })
}

fn dns(d: FileDns) -> Result<DnsDiscovery, ConfigError> {
    let name = d.name.unwrap_or_default();
    if name.is_empty()
        || name.len() > 253
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(invalid(
            "discovery.dns.name",
            "give the DNS name whose addresses are the workers, e.g. \
             \"vllm-headless.llm.svc.cluster.local\" (a headless Service)",
        ));
    }
    let port = match d.port {
        None | Some(0) => {
            return Err(invalid(
                "discovery.dns.port",
                "give the engines' HTTP port, e.g. 8000",
            ));
        }
        Some(p) => p,
    };
    for (key, p) in [
        ("kv_events_port", d.kv_events_port),
        ("kv_replay_port", d.kv_replay_port),
    ] {
        if p == Some(0) {
            return Err(invalid(
                format!("discovery.dns.{key}"),
                "0 is not a port; omit the key when the engines have none",
            ));
        }
    }
    if d.kv_replay_port.is_some() && d.kv_events_port.is_none() {
        return Err(invalid(
            "discovery.dns.kv_replay_port",
            "a replay port without kv_events_port: replays fill gaps of an event stream",
        ));
    }
    let data_parallel_size = data_parallel_size(d.data_parallel_size)
        .map_err(|e| invalid("discovery.dns.data_parallel_size", e.message))?;
    // Every address is such a server: each rank's ports must exist.
    let zmq = |p: Option<u16>| p.map(|p| format!("tcp://h:{p}"));
    check_ranks(
        data_parallel_size,
        zmq(d.kv_events_port).as_deref(),
        zmq(d.kv_replay_port).as_deref(),
    )
    .map_err(|e| {
        let key = match e.field {
            "kv_events" | "kv_replay" => format!("discovery.dns.{}_port", e.field),
            other => format!("discovery.dns.{other}"),
        };
        invalid(key, e.message)
    })?;
    let dns_key = |e: RoleError| invalid(format!("discovery.dns.{}", e.field), e.message);
    let role = worker_role(d.role.as_deref()).map_err(dns_key)?;
    let bootstrap_port = bootstrap_port(d.bootstrap_port).map_err(dns_key)?;
    check_role(role, bootstrap_port).map_err(dns_key)?;
    Ok(DnsDiscovery {
        name,
        port,
        kv_events_port: d.kv_events_port,
        kv_replay_port: d.kv_replay_port,
        data_parallel_size,
        role,
        bootstrap_port,
        interval: seconds(
            "discovery.dns.interval_s",
            d.interval_s,
            DEFAULT_DNS_INTERVAL,
            0.1,
        )?,
    })
}

/// An RFC 1123 label: what a namespace name is.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An IANA service name: what a container port's name is.
fn is_port_name(s: &str) -> bool {
    is_dns_label(s) && s.len() <= 15 && s.chars().any(|c| c.is_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DiscoveryConfig, ConfigError> {
        let file: FileDiscovery =
            toml::from_str(text).map_err(|e| invalid("toml", e.to_string()))?;
        discovery(file)
    }

    #[test]
    fn defaults_and_nothing_configured() {
        let d = parse("").unwrap();
        assert!(!d.enabled());
        assert_eq!(d.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
    }

    #[cfg(feature = "kubernetes")]
    #[test]
    fn kubernetes_ports_by_name_or_number() {
        let d = parse(
            "drain_timeout_s = 5\n[kubernetes]\nlabel_selector = \"app=vllm\"\nhttp_port = 8000\n",
        )
        .unwrap();
        let k = d.kubernetes.unwrap();
        assert_eq!(k.http_port, PortRef::Number(8000));
        assert_eq!(k.kv_events_port, PortRef::Name("kv-events".into()));
        assert_eq!(k.kv_replay_port, PortRef::Name("kv-replay".into()));
        assert_eq!(k.annotation_prefix, DEFAULT_ANNOTATION_PREFIX);
        assert_eq!(k.namespace, None);
        assert_eq!(d.drain_timeout, Duration::from_secs(5));
    }

    #[cfg(not(feature = "kubernetes"))]
    #[test]
    fn kubernetes_needs_its_feature() {
        let e = parse("[kubernetes]\nlabel_selector = \"app=vllm\"\n").unwrap_err();
        assert!(e.to_string().contains("feature"), "{e}");
    }

    #[test]
    fn dns_needs_a_name_and_a_port() {
        let d = parse("[dns]\nname = \"vllm.llm.svc\"\nport = 8000\nkv_events_port = 5557\n")
            .unwrap()
            .dns
            .unwrap();
        assert_eq!(
            (d.port, d.kv_events_port, d.interval),
            (8000, Some(5557), DEFAULT_DNS_INTERVAL)
        );
    }

    #[test]
    fn nonsense_is_refused_with_its_key() {
        let mut cases = vec![
            ("drain_timeout_s = -1", "discovery.drain_timeout_s"),
            ("[dns]\nport = 8000", "discovery.dns.name"),
            ("[dns]\nname = \"a b\"\nport = 8000", "discovery.dns.name"),
            ("[dns]\nname = \"h\"", "discovery.dns.port"),
            ("[dns]\nname = \"h\"\nport = 0", "discovery.dns.port"),
            (
                "[dns]\nname = \"h\"\nport = 1\nkv_replay_port = 2",
                "discovery.dns.kv_replay_port",
            ),
            (
                "[dns]\nname = \"h\"\nport = 1\ninterval_s = 0.001",
                "discovery.dns.interval_s",
            ),
        ];
        if cfg!(feature = "kubernetes") {
            cases.extend([
                ("[kubernetes]\n", "discovery.kubernetes.label_selector"),
                (
                    "[kubernetes]\nlabel_selector = \" \"",
                    "discovery.kubernetes.label_selector",
                ),
                (
                    "[kubernetes]\nlabel_selector = \"a=b\"\nnamespace = \"Bad_NS\"",
                    "discovery.kubernetes.namespace",
                ),
                (
                    "[kubernetes]\nlabel_selector = \"a=b\"\nhttp_port = 0",
                    "discovery.kubernetes.http_port",
                ),
                (
                    "[kubernetes]\nlabel_selector = \"a=b\"\nkv_events_port = \"a_very_long_port_name\"",
                    "discovery.kubernetes.kv_events_port",
                ),
                (
                    "[kubernetes]\nlabel_selector = \"a=b\"\nannotation_prefix = \"\"",
                    "discovery.kubernetes.annotation_prefix",
                ),
            ]);
        }
        for (text, key) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(&format!("`{key}`")), "{text}: {e}");
        }
        assert!(parse("[dns]\nname = \"h\"\nport = 1\nbogus = 2").is_err());
    }
}
