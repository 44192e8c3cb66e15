//! Logs and traces: the `tracing` subscriber every subcommand logs through, and, for `serve`
//! with tracing on (`[tracing]`, or the standard `OTEL_*` variables), OpenTelemetry spans
//! exported over OTLP/HTTP.
//!
//! The request's spans (`request`, and under it `body_read`, `tokenize`, `decide`,
//! `upstream_connect`, `first_token`, `stream`) are `tracing` spans of the target [`TARGET`].
//! The log output never shows them, and without the OpenTelemetry layer nothing else is
//! interested in them either, so `tracing` disables their call sites: tracing off costs a
//! check of a cached interest per span, and no layer is installed.
//!
//! Context crosses the router in W3C Trace Context: a client's `traceparent` (and
//! `tracestate`) is the parent of the request span, and each attempt sent to a worker carries
//! the `upstream_connect` span as its parent (vLLM and SGLang continue the trace). With tracing
//! off the router leaves both headers alone: they reach the worker as the client sent them.

#[cfg(feature = "otel")]
mod otel;
mod settings;

pub use settings::{LogFormat, TracingConfig};

use std::io::IsTerminal;

use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// The target of the spans exported as traces (and never logged).
pub const TARGET: &str = "kvroute::trace";

/// What must outlive the program's work: the exporter, flushed by [`Telemetry::shutdown`].
#[derive(Default)]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    traces: Option<otel::Traces>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn tracing(&self) -> bool {
        #[cfg(feature = "otel")]
        return self.traces.is_some();
        #[cfg(not(feature = "otel"))]
        false
    }

    /// Exports the spans still buffered and stops the exporter. Call it outside the async
    /// runtime's tasks but while the runtime still runs (the exporter sends on it).
    pub fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(t) = self.traces {
            t.shutdown();
        }
    }
}

/// Sets up logging in `format` (stderr, `RUST_LOG`, `info` by default) and, when `traces`
/// turn tracing on, the OpenTelemetry exporter. Must be called on a Tokio runtime when
/// tracing is on. Fails when the exporter cannot be built (a bad endpoint); then nothing is
/// installed.
pub fn init(format: LogFormat, traces: Option<&TracingConfig>) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Logs go to stderr (stdout is for results: `bench` and `simulate` print theirs there), in
    // colour only when stderr is a terminal: escape codes in a file or a log collector are
    // noise. The trace spans are not log lines.
    let not_traces = filter_fn(|m| m.target() != TARGET);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => fmt.with_filter(filter.and(not_traces)).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter.and(not_traces)).boxed(),
    };
    let telemetry = Telemetry::default();
    #[cfg(feature = "otel")]
    if let Some(settings) = traces.filter(|t| otel::wanted(t)) {
        let traces = otel::Traces::start(settings)?;
        let layer = traces.layer();
        tracing_subscriber::registry().with(logs).with(layer).init();
        return Ok(Telemetry {
            traces: Some(traces),
        });
    }
    #[cfg(not(feature = "otel"))]
    let _ = traces;
    tracing_subscriber::registry().with(logs).init();
    Ok(telemetry)
}

/// Makes the request span a child of the trace context the client sent (`traceparent`), when
/// tracing is on.
pub fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    #[cfg(feature = "otel")]
    otel::continue_trace(span, headers);
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

/// Writes `span`'s context as `traceparent`/`tracestate` into a request to a worker, when
/// tracing is on (replacing the client's: the worker's spans are children of this one).
pub fn propagate(span: &tracing::Span, headers: &mut http::HeaderMap) {
    #[cfg(feature = "otel")]
    otel::propagate(span, headers);
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}
