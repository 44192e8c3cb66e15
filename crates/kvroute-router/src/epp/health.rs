//! `grpc.health.v1` as GIE's protocol names its services: `liveness` serves as soon as the
//! process answers; `readiness` and the ext_proc service itself once the picker knows a
//! worker it may route to (before that every pick would be a 503), checked every second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::server::AppState;

/// The service names GIE's gateways and probes ask about.
const LIVENESS: &str = "liveness";
const READINESS: &str = "readiness";
const EXT_PROC: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
/// The name llm-d's single-replica probes ask about (ready as `readiness`).
const INFERENCE_EXTENSION: &str = "inference-extension";

/// How often readiness is re-evaluated.
const EVERY: Duration = Duration::from_secs(1);

/// Keeps the health services' statuses current until `stop`.
pub async fn report(state: Arc<AppState>, reporter: HealthReporter, stop: CancellationToken) {
    reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    let mut last = None;
    loop {
        let ready = state
            .fleet
            .workers()
            .iter()
            .any(|w| w.is_routable(Instant::now()));
        if last != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for service in [READINESS, EXT_PROC, INFERENCE_EXTENSION, ""] {
                reporter.set_service_status(service, status).await;
            }
            tracing::info!(ready, "endpoint picker readiness");
            last = Some(ready);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
    for service in [LIVENESS, READINESS, EXT_PROC, INFERENCE_EXTENSION, ""] {
        reporter
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
}
