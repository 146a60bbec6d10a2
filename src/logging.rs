//! The logs of every binary, on stderr, filtered by `RUST_LOG` (default `info`): readable text,
//! or with `--log-format json` one JSON object per line whose fields are the event's and those
//! of the spans it happened in, flattened (`task_id`, `attempt` and `queue` of an attempt,
//! `worker` of a worker's), so that a log pipeline can index and join them
//! (`docs/operations.md`).
//!
//! With `--otlp-endpoint URL` (`OTEL_EXPORTER_OTLP_ENDPOINT`; cargo feature `otlp`, on by
//! default) the spans are also exported as OpenTelemetry traces over OTLP/HTTP: a worker's
//! attempts, the server's requests (`otlp`).

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// How logs are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for people: time, level, spans with their fields, message, fields.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and every field
    /// of the event and of its spans.
    Json,
}

/// `--log-format` and `--otlp-endpoint`, flags of every binary.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// How logs on stderr are written: `text`, or `json` (one object per line, with the
    /// fields of the event and its spans: task_id, attempt, queue, worker).
    #[arg(long, global = true, env = "SKED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Export traces (a worker's attempts, the server's requests) over OTLP/HTTP to the
    /// collector at this base URL, e.g. http://localhost:4318 (spans go to URL/v1/traces).
    /// Unset: nothing is exported.
    #[arg(
        long,
        global = true,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    pub otlp_endpoint: Option<String>,
}

/// Why logging or tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(
        "--otlp-endpoint {endpoint:?}: {reason} (the collector's OTLP/HTTP base URL, e.g. \
         http://localhost:4318)"
    )]
    Endpoint { endpoint: String, reason: String },
    #[error("exporting traces to {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
    #[error(
        "--otlp-endpoint: this build of sked has no OpenTelemetry export (build it with the \
         cargo feature `otlp`)"
    )]
    NotBuilt,
}

/// What must outlive the process's work: the trace exporter, whose batched spans
/// [`Telemetry::shutdown`] sends.
#[must_use = "call shutdown() at the end, or the last spans are lost"]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<otlp::Provider>,
}

impl Telemetry {
    /// Sends the spans still batched (waiting at most 10 s for the collector) and stops the
    /// exporter. Call it once the process's work is done: a worker's or server's graceful
    /// shutdown has ended every span.
    pub async fn shutdown(self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider {
            otlp::shutdown(provider).await;
        }
    }
}

/// Logs to stderr in `args.log_format`, filtered by `RUST_LOG` (default `info`), and with
/// `args.otlp_endpoint` exports spans as `service` (the binary's name, unless
/// `OTEL_SERVICE_NAME` names another). Must be called inside the Tokio runtime.
pub fn init(args: &LogArgs, service: &str) -> Result<Telemetry, InitError> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match args.log_format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .boxed(),
    };
    // One filter for both the logs and the traces: filters of single layers lose events
    // when log records (`tracing-log`) are checked that no layer takes.
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    let endpoint = args
        .otlp_endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty());
    #[cfg(feature = "otlp")]
    {
        let provider = endpoint
            .map(|endpoint| otlp::provider(endpoint, service))
            .transpose()?;
        let layer = provider.as_ref().map(otlp::layer);
        registry.with(layer).init();
        if let Some(endpoint) = endpoint {
            tracing::info!(endpoint, service = %otlp::service_name(service), "exporting traces over OTLP");
        }
        Ok(Telemetry { provider })
    }
    #[cfg(not(feature = "otlp"))]
    {
        let _ = service;
        if endpoint.is_some() {
            return Err(InitError::NotBuilt);
        }
        registry.init();
        Ok(Telemetry {})
    }
}

/// OpenTelemetry traces over OTLP/HTTP (protobuf), batched and sent by the workspace's
/// reqwest on the process's Tokio runtime.
#[cfg(feature = "otlp")]
mod otlp {
    use std::any::TypeId;
    use std::time::Duration;

    use bytes::Bytes;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_http::{HttpClient, HttpError};
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata, Subscriber};
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::Context;
    use tracing_subscriber::registry::LookupSpan;

    use super::InitError;

    pub type Provider = SdkTracerProvider;

    /// How long one export may take.
    const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

    /// `OTEL_SERVICE_NAME` when set, else `default` (the binary's name).
    pub fn service_name(default: &str) -> String {
        std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|name| !name.trim().is_empty())
            .unwrap_or_else(|| default.to_owned())
    }

    /// `base`'s traces URL (`<base>/v1/traces`, as for `OTEL_EXPORTER_OTLP_ENDPOINT`), or why
    /// `base` is not a collector's URL.
    pub fn traces_url(base: &str) -> Result<String, InitError> {
        let refuse = |reason: String| InitError::Endpoint {
            endpoint: base.to_owned(),
            reason,
        };
        let url = reqwest::Url::parse(base).map_err(|e| refuse(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refuse(format!(
                "the scheme must be http or https, not {:?}",
                url.scheme()
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(refuse("no host".into()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(refuse("a base URL has no query or fragment".into()));
        }
        Ok(format!("{}/v1/traces", url.as_str().trim_end_matches('/')))
    }

    /// The tracer provider exporting to `endpoint` in batches (every 5 s, `OTEL_BSP_*`), as
    /// `service`.
    pub fn provider(endpoint: &str, service: &str) -> Result<Provider, InitError> {
        let url = traces_url(endpoint)?;
        let failed = |reason: String| InitError::Exporter {
            endpoint: url.clone(),
            reason,
        };
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(OnRuntime {
                client,
                runtime: tokio::runtime::Handle::current(),
            })
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let resource = Resource::builder()
            .with_service_name(service_name(service))
            .build();
        Ok(SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build())
    }

    /// The layer that turns the spans `RUST_LOG` lets through into OpenTelemetry spans, but
    /// for a worker's own span, which lasts as long as the worker (each attempt is a trace of
    /// its own).
    pub fn layer<S>(provider: &Provider) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        WithoutLifetimeSpans(tracing_opentelemetry::layer().with_tracer(provider.tracer("sked")))
    }

    /// Whether a span lasts as long as its process: a worker's (`worker{worker=…}`).
    fn lasts_the_process(meta: &Metadata<'_>) -> bool {
        meta.is_span() && meta.name() == "worker" && meta.target() == "sked_worker"
    }

    /// `L`, which never sees the spans that last as long as the process. (Not a filter of
    /// this layer alone: those lose events when log records are checked that no layer takes.)
    struct WithoutLifetimeSpans<L>(L);

    impl<L> WithoutLifetimeSpans<L> {
        fn sees<S>(id: &Id, ctx: &Context<'_, S>) -> bool
        where
            S: Subscriber + for<'a> LookupSpan<'a>,
        {
            ctx.metadata(id)
                .is_some_and(|meta| !lasts_the_process(meta))
        }
    }

    impl<S, L> Layer<S> for WithoutLifetimeSpans<L>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        L: Layer<S>,
    {
        fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
            self.0.on_register_dispatch(subscriber);
        }

        fn on_layer(&mut self, subscriber: &mut S) {
            self.0.on_layer(subscriber);
        }

        fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
            self.0.register_callsite(meta)
        }

        fn enabled(&self, meta: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
            self.0.enabled(meta, ctx)
        }

        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            if !lasts_the_process(attrs.metadata()) {
                self.0.on_new_span(attrs, id, ctx);
            }
        }

        fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
            if Self::sees(id, &ctx) {
                self.0.on_record(id, values, ctx);
            }
        }

        fn on_follows_from(&self, span: &Id, follows: &Id, ctx: Context<'_, S>) {
            if Self::sees(span, &ctx) && Self::sees(follows, &ctx) {
                self.0.on_follows_from(span, follows, ctx);
            }
        }

        fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
            self.0.event_enabled(event, ctx)
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            self.0.on_event(event, ctx);
        }

        fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
            if Self::sees(id, &ctx) {
                self.0.on_enter(id, ctx);
            }
        }

        fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
            if Self::sees(id, &ctx) {
                self.0.on_exit(id, ctx);
            }
        }

        fn on_close(&self, id: Id, ctx: Context<'_, S>) {
            if Self::sees(&id, &ctx) {
                self.0.on_close(id, ctx);
            }
        }

        fn on_id_change(&self, old: &Id, new: &Id, ctx: Context<'_, S>) {
            self.0.on_id_change(old, new, ctx);
        }

        unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
            if id == TypeId::of::<Self>() {
                Some(self as *const Self as *const ())
            } else {
                // SAFETY: the inner layer's answer, for the inner layer's types.
                unsafe { self.0.downcast_raw(id) }
            }
        }
    }

    /// Sends what is batched and stops the exporter, off the runtime's threads (the sends
    /// run on the runtime).
    pub async fn shutdown(provider: Provider) {
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(EXPORT_TIMEOUT))
                .await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: exporting the last spans failed: {e}"),
            Err(e) => eprintln!("warning: exporting the last spans failed: {e}"),
        }
    }

    /// reqwest sending on the process's Tokio runtime: the batch exporter runs on a thread of
    /// its own, outside the runtime, and waits there for the answer.
    #[derive(Debug)]
    struct OnRuntime {
        client: reqwest::Client,
        runtime: tokio::runtime::Handle,
    }

    #[async_trait::async_trait]
    impl HttpClient for OnRuntime {
        async fn send_bytes(
            &self,
            request: http::Request<Bytes>,
        ) -> Result<http::Response<Bytes>, HttpError> {
            let request = reqwest::Request::try_from(request)?;
            let client = self.client.clone();
            self.runtime
                .spawn(async move {
                    let response = client.execute(request).await?;
                    let status = response.status();
                    let headers = response.headers().clone();
                    let body = response.bytes().await?;
                    let mut answer = http::Response::builder().status(status).body(body)?;
                    *answer.headers_mut() = headers;
                    Ok(answer)
                })
                .await?
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_traces_url_is_the_base_with_v1_traces() {
            for (base, url) in [
                ("http://localhost:4318", "http://localhost:4318/v1/traces"),
                ("http://localhost:4318/", "http://localhost:4318/v1/traces"),
                (
                    "https://otel.example.com/otlp/",
                    "https://otel.example.com/otlp/v1/traces",
                ),
            ] {
                assert_eq!(traces_url(base).unwrap(), url);
            }
        }

        #[test]
        fn a_bad_endpoint_is_refused_with_its_reason() {
            for (base, reason) in [
                ("localhost:4318", "scheme"),
                ("ftp://collector:21", "scheme"),
                ("http://", "empty host"),
                ("http://collector:4318/?a=b", "query"),
                ("not a url", "relative URL"),
            ] {
                let err = traces_url(base).unwrap_err().to_string();
                assert!(err.contains(reason), "{base}: {err}");
                assert!(err.contains(base), "{base}: {err}");
            }
        }
    }
}

/// One JSON object per event: its time (RFC 3339, UTC), level, target, the fields of the spans
/// it is in from the outermost (an inner span's field wins over an outer one's of the same
/// name), then the event's own (the message under `message`).
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut object = Map::new();
        object.insert(
            "timestamp".into(),
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                .into(),
        );
        object.insert("level".into(), meta.level().as_str().into());
        object.insert("target".into(), meta.target().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                // Span fields are recorded by `JsonFields`: a JSON object per span.
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields)
                {
                    object.extend(fields);
                }
            }
        }
        event.record(&mut Fields(&mut object));
        writeln!(writer, "{}", Value::Object(object))
    }
}

/// Records an event's fields into a JSON object.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}
