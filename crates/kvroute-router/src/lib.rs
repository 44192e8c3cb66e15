//! kvroute's router: the front door (`server`), the proxy, the endpoint picker (`epp`), the
//! fleet's I/O (discovery, health, load polls, KV-event intake), configuration, metrics and
//! telemetry, over the transport-free core (`kvroute-core`).
//!
//! See `ARCHITECTURE.md` for the flows and the module map. Lower modules never import `server`;
//! `policy` is pure so the same code runs live and in the lab's simulator. The core's modules
//! (`openai`, `tokens`, `kv_events` decoding, `index`, `fleet`, `policy`, `routing`) are
//! re-exported here under the same paths; this crate adds the I/O around them. The lab
//! (`kvroute-lab`) and the `kvroute` binary build on this crate; nothing here knows them.

pub mod config;
pub mod discovery;
#[cfg(feature = "epp")]
pub mod epp;
pub mod fleet;
pub mod heap;
pub mod index;
pub mod kv_events;
pub mod lifecycle;
pub mod metrics;
pub use kvroute_core::{openai, policy, routing};
pub mod proxy;
pub mod recording;
pub mod replica_bus;
pub mod server;
pub mod shaping;
pub mod telemetry;
pub mod tls;
pub mod tokens;
