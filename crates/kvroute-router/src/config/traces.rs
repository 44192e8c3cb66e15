//! `[tracing]` (this file is `traces` so as not to shadow the `tracing` crate): OpenTelemetry
//! traces over OTLP/HTTP. Off by default. Each key left out falls back to the standard `OTEL_*` variable the exporter reads (see `crate::telemetry`), so a
//! deployment that sets those (an OpenTelemetry operator injects them) needs only
//! `enabled = true`, or nothing at all when it sets an endpoint.

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::telemetry::TracingConfig;

/// The file's `[tracing]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTracing {
    pub(super) enabled: Option<bool>,
    pub(super) endpoint: Option<String>,
    pub(super) service_name: Option<String>,
    pub(super) sampling_ratio: Option<f64>,
}

/// The settings of `[tracing]`.
pub(super) fn tracing(file: FileTracing) -> Result<TracingConfig, ConfigError> {
    if let Some(r) = file.sampling_ratio
        && !(r.is_finite() && (0.0..=1.0).contains(&r))
    {
        return Err(invalid(
            "tracing.sampling_ratio",
            format!("{r} is not a fraction; give 0 to 1, e.g. 0.1 for one trace in ten"),
        ));
    }
    if let Some(e) = &file.endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return Err(invalid(
            "tracing.endpoint",
            format!(
                "`{e}` is not an http:// or https:// URL; write e.g. \"http://otel-collector:4318\""
            ),
        ));
    }
    if file.service_name.as_deref().is_some_and(str::is_empty) {
        return Err(invalid("tracing.service_name", "must not be empty"));
    }
    if cfg!(not(feature = "otel")) && file.enabled == Some(true) {
        return Err(invalid(
            "tracing.enabled",
            "this kvroute was built without tracing (cargo feature `otel`)",
        ));
    }
    Ok(TracingConfig {
        enabled: file.enabled,
        endpoint: file.endpoint,
        service_name: file.service_name,
        sampling_ratio: file.sampling_ratio,
    })
}
