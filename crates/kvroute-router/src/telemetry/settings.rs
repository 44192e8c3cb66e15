//! What the configuration says about logs and traces: the types `config` builds and
//! `telemetry` reads. They live here, below both, so that `telemetry` (which the proxy uses to
//! propagate trace context) never imports `config` (which builds the proxy's settings).

use serde::Deserialize;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Tracing as configured; what is not configured here comes from the `OTEL_*` variables.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TracingConfig {
    /// `Some(true)`: on; `Some(false)`: off whatever the variables say; `None`: on when
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
    pub enabled: Option<bool>,
    /// The collector's OTLP/HTTP address (`http://collector:4318`; `/v1/traces` is appended
    /// unless the path already ends with it). Default: the variables, else
    /// `http://localhost:4318`.
    pub endpoint: Option<String>,
    /// The `service.name` of the spans. Default: `OTEL_SERVICE_NAME`, else `kvroute`.
    pub service_name: Option<String>,
    /// The fraction of traces started here that are sampled (a client's sampled flag is
    /// followed). Default: `OTEL_TRACES_SAMPLER`/`OTEL_TRACES_SAMPLER_ARG`, else every trace.
    pub sampling_ratio: Option<f64>,
}
