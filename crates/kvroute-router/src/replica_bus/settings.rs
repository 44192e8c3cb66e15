//! What `[replica_bus]` configures (built by `config::replica_bus`).

use std::time::Duration;

/// The subject every replica publishes on and listens to, by default.
pub const DEFAULT_SUBJECT: &str = "kvroute.replicas";
/// How often a replica says it is alive, by default.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a silent replica's bookings are kept, by default: three heartbeats.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(3);

/// The replica bus of one router replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaBusSettings {
    /// The NATS server(s), e.g. `nats://nats:4222` (comma-separated for a cluster).
    pub url: String,
    /// The subject the replicas of one fleet share (replicas of another fleet on the same
    /// NATS use another).
    pub subject: String,
    /// This replica's id on the bus, unique among the fleet's replicas.
    pub replica_id: String,
    /// How often this replica sends a heartbeat.
    pub heartbeat: Duration,
    /// How long another replica may be silent before its bookings are released.
    pub expiry: Duration,
}

/// The default replica id: the host name (a pod's name in Kubernetes) and the process id.
pub fn default_replica_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kvroute".to_owned());
    format!("{host}-{}", std::process::id())
}
