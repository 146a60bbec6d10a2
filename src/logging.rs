//! The logs of every binary, on stderr, filtered by `RUST_LOG` (default `info`): readable text,
//! or with `--log-format json` one JSON object per line whose fields are the event's and those
//! of the spans it happened in, flattened (`task_id`, `attempt` and `queue` of an attempt,
//! `worker` of a worker's), so that a log pipeline can index and join them
//! (`docs/operations.md`).

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

/// `--log-format`, a flag of every binary.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// How logs on stderr are written: `text`, or `json` (one object per line, with the
    /// fields of the event and its spans: task_id, attempt, queue, worker).
    #[arg(long, global = true, env = "SKED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default `info`).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .init(),
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
