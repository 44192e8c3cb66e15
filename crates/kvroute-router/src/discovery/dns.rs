//! DNS discovery: every A and AAAA record of a name is a worker. Meant for a headless Service
//! (whose name resolves to the addresses of its Ready pods), for operators who cannot give the
//! router access to the Kubernetes API.
//!
//! The name is resolved with the system resolver (`tokio::net::lookup_host`, i.e.
//! `getaddrinfo` on a blocking thread), which returns every record and honours
//! `/etc/resolv.conf` search domains and `/etc/hosts` exactly as the rest of the pod does; a
//! resolver crate would add code and a second notion of the pod's DNS setup for nothing here.
//!
//! A failed resolution keeps the last known set (a resolver hiccup must not empty the fleet),
//! and an address is dropped only when [`MISSING_ROUNDS`] answers in a row lack it: one
//! answer can be short (a truncated UDP reply, a cache refreshing). The flip side, said in the
//! docs: when every pod is gone and the name no longer resolves at all, the last workers stay
//! (marked down by their failing health checks) until the name resolves again.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Desired, count};
use crate::config::DnsDiscovery;
use crate::fleet::{BaseUrl, WorkerSpec};
use crate::lifecycle::Source;
use crate::metrics::Metrics;

/// Answers in a row that must lack an address before its worker leaves.
pub const MISSING_ROUNDS: u32 = 2;

/// The addresses of successive answers, with a departure counted only after
/// [`MISSING_ROUNDS`] answers without it.
#[derive(Debug, Default)]
pub struct Debounce {
    /// Addresses kept, with how many answers in a row lacked each.
    kept: BTreeMap<IpAddr, u32>,
}

impl Debounce {
    /// Takes one successful answer; returns the addresses that are workers now.
    pub fn observe(&mut self, answer: &BTreeSet<IpAddr>) -> BTreeSet<IpAddr> {
        for (ip, missing) in self.kept.iter_mut() {
            *missing = if answer.contains(ip) { 0 } else { *missing + 1 };
        }
        self.kept.retain(|_, missing| *missing < MISSING_ROUNDS);
        for ip in answer {
            self.kept.entry(*ip).or_insert(0);
        }
        self.kept.keys().copied().collect()
    }
}

/// The worker at `ip` under `config`: id `dns:<ip>:<port>`.
pub fn endpoint(config: &DnsDiscovery, ip: IpAddr) -> Option<WorkerSpec> {
    let http = SocketAddr::new(ip, config.port);
    let zmq = |port: Option<u16>| port.map(|p| format!("tcp://{}", SocketAddr::new(ip, p)));
    Some(WorkerSpec {
        id: format!("dns:{http}"),
        url: BaseUrl::parse(&format!("http://{http}")).ok()?,
        models: Vec::new(),
        kv_events: zmq(config.kv_events_port),
        kv_replay: zmq(config.kv_replay_port),
        kv_blocks: None,
        data_parallel_size: config.data_parallel_size,
        role: config.role,
        bootstrap_port: config.bootstrap_port,
    })
}

/// Resolves `config.name` every `config.interval` and publishes its workers until `stop`.
pub async fn run(
    config: DnsDiscovery,
    desired: watch::Sender<Desired>,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut debounce = Debounce::default();
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let answer = tokio::time::timeout(
            config.interval.max(std::time::Duration::from_secs(1)),
            tokio::net::lookup_host((config.name.as_str(), config.port)),
        )
        .await;
        let addrs: BTreeSet<IpAddr> = match answer {
            Ok(Ok(addrs)) => addrs.map(|a| a.ip()).collect(),
            Ok(Err(e)) => {
                count(&metrics, Source::Dns, "error");
                if !failing {
                    tracing::warn!(name = %config.name, error = %e, "cannot resolve; keeping the last known workers");
                }
                failing = true;
                continue;
            }
            Err(_) => {
                count(&metrics, Source::Dns, "error");
                failing = true;
                continue;
            }
        };
        if failing {
            tracing::info!(name = %config.name, "resolves again");
            failing = false;
        }
        let endpoints = debounce
            .observe(&addrs)
            .into_iter()
            .filter_map(|ip| endpoint(&config, ip))
            .map(|s| (s.id.clone(), s))
            .collect();
        desired.send_if_modified(|d| {
            let changed = d.endpoints != endpoints;
            d.endpoints = endpoints;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn set(ips: &[&str]) -> BTreeSet<IpAddr> {
        ips.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn an_address_leaves_after_missing_rounds_in_a_row() {
        let mut d = Debounce::default();
        assert_eq!(
            d.observe(&set(&["10.0.0.1", "10.0.0.2"])),
            set(&["10.0.0.1", "10.0.0.2"])
        );
        // One short answer keeps it.
        assert_eq!(
            d.observe(&set(&["10.0.0.1"])),
            set(&["10.0.0.1", "10.0.0.2"])
        );
        // Back: the count starts over.
        assert_eq!(
            d.observe(&set(&["10.0.0.1", "10.0.0.2"])),
            set(&["10.0.0.1", "10.0.0.2"])
        );
        assert_eq!(
            d.observe(&set(&["10.0.0.1"])),
            set(&["10.0.0.1", "10.0.0.2"])
        );
        assert_eq!(
            d.observe(&set(&["10.0.0.1", "10.0.0.3"])),
            set(&["10.0.0.1", "10.0.0.3"])
        );
    }

    #[test]
    fn endpoints_are_named_by_address_and_port() {
        let c = DnsDiscovery {
            name: "vllm".into(),
            port: 8000,
            kv_events_port: Some(5557),
            kv_replay_port: Some(5558),
            data_parallel_size: 1,
            role: crate::fleet::Role::Both,
            bootstrap_port: None,
            interval: Duration::from_secs(5),
        };
        let v4 = endpoint(&c, "10.1.2.3".parse().unwrap()).unwrap();
        assert_eq!(v4.id, "dns:10.1.2.3:8000");
        assert_eq!(v4.url.to_string(), "http://10.1.2.3:8000");
        assert_eq!(v4.kv_events.as_deref(), Some("tcp://10.1.2.3:5557"));
        assert_eq!(v4.kv_replay.as_deref(), Some("tcp://10.1.2.3:5558"));
        let v6 = endpoint(&c, "fd00::7".parse().unwrap()).unwrap();
        assert_eq!(v6.id, "dns:[fd00::7]:8000");
        assert_eq!(v6.url.to_string(), "http://[fd00::7]:8000");
        assert_eq!(v6.kv_events.as_deref(), Some("tcp://[fd00::7]:5557"));
        crate::config::check_worker(&v6).unwrap();
    }
}
