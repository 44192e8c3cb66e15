//! The OpenTelemetry side of [`super`]: the SDK's tracer provider with a batch exporter of
//! OTLP/HTTP protobuf, sending through the router's own hyper client, and W3C Trace Context
//! in and out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::global;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::LookupSpan;

use super::TARGET;
use super::TracingConfig;
use crate::tls::UpstreamTls;
use crate::tls::upstream::{WorkerConnector, connector};

/// Whether spans are exported: context is read from clients and written to workers only then.
static ON: AtomicBool = AtomicBool::new(false);

/// Longest one export may take (the OTLP default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The path of traces under an OTLP/HTTP base address.
const TRACES_PATH: &str = "/v1/traces";

/// Whether `settings` (and the variables) turn tracing on.
pub(super) fn wanted(settings: &TracingConfig) -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    if disabled {
        return false;
    }
    settings.enabled.unwrap_or_else(|| {
        set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    })
}

/// The running exporter.
pub(super) struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Builds the exporter and the provider, and sets the W3C propagator. Must be called on a
    /// Tokio runtime: the exporter sends on it.
    pub(super) fn start(settings: &TracingConfig) -> anyhow::Result<Traces> {
        let connector = connector(&UpstreamTls::default(), EXPORT_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("tracing: cannot set up TLS for the exporter: {e}"))?;
        let client = OnRuntime {
            runtime: tokio::runtime::Handle::current(),
            client: HyperClient::new(connector, EXPORT_TIMEOUT, None),
        };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(client);
        if let Some(endpoint) = &settings.endpoint {
            exporter = exporter.with_endpoint(traces_url(endpoint));
        }
        let exporter = exporter
            .build()
            .map_err(|e| anyhow::anyhow!("tracing: cannot build the OTLP exporter: {e}"))?;
        let service = settings
            .service_name
            .clone()
            .or_else(|| {
                std::env::var("OTEL_SERVICE_NAME")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "kvroute".to_owned());
        let mut provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service).build());
        if let Some(ratio) = settings.sampling_ratio {
            provider = provider.with_sampler(Sampler::ParentBased(Box::new(
                Sampler::TraceIdRatioBased(ratio),
            )));
        }
        let provider = provider.build();
        global::set_text_map_propagator(TraceContextPropagator::new());
        ON.store(true, Ordering::Release);
        Ok(Traces { provider })
    }

    /// The layer that turns the trace spans (and warnings inside them, as span events) into
    /// OpenTelemetry spans.
    pub(super) fn layer<S>(&self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("kvroute"))
            .with_filter(filter_fn(|m| {
                m.target() == TARGET || (m.is_event() && *m.level() <= tracing::Level::WARN)
            }))
    }

    pub(super) fn shutdown(self) {
        ON.store(false, Ordering::Release);
        if let Err(e) = self.provider.shutdown() {
            eprintln!("kvroute: tracing: could not export the last spans: {e}");
        }
    }
}

/// `base` with the traces path, unless it already ends with it (an
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`-style address).
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_owned()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

/// The exporter's HTTP client. The SDK's batch processor exports from a thread of its own,
/// outside the Tokio runtime that hyper needs, so each export is sent as a task on the
/// runtime and awaited from there.
#[derive(Debug)]
struct OnRuntime {
    runtime: tokio::runtime::Handle,
    client: HyperClient<WorkerConnector>,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await?
    }
}

pub(super) fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    if !ON.load(Ordering::Acquire) {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if cx.span().span_context().is_valid() {
        // Fails only for a span the layer does not record (disabled): nothing to continue.
        let _ = span.set_parent(cx);
    }
}

pub(super) fn propagate(span: &tracing::Span, headers: &mut http::HeaderMap) {
    if !ON.load(Ordering::Acquire) {
        return;
    }
    let cx = span.context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }
}
