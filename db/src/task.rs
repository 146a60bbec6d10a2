//! Task rows and the task functions of the SQL contract: submit, read, cancel, retry,
//! resubmit. Listings are in [`crate::listing`].
//!
//! A row is read into the API's [`Task`] by column name, without listing the columns: a
//! field of seconds `x_secs` in the API is the interval column `x`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, Error as _, IntoDeserializer, MapAccess};
use serde_json::Value;
use sked_types::{Attempt, LogChunk, SubmitTask, Task, TaskKind, TaskState};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgColumn, PgRow};
use sqlx::{Column, PgConnection, PgExecutor, PgPool, Row, TypeInfo};
use uuid::Uuid;

use crate::text::Text;
use crate::{DbError, Result};

/// The suffix of the API's fields that hold seconds: `timeout_secs` is the interval column
/// `timeout` (the key `timeout` of `sked.tasks_submit`), in seconds.
const SECS: &str = "_secs";

/// A row of `sked.tasks` (`select t.*`) as the API's [`Task`], with its real environment
/// (answers mask secret values on their way out of the server). Columns are read by name:
/// each is the field of its name, an interval `x` the field `x_secs`; a column the API does
/// not show is read and ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRow(Task);

impl std::ops::Deref for TaskRow {
    type Target = Task;
    fn deref(&self) -> &Task {
        &self.0
    }
}

impl TaskRow {
    /// The task as the API's types hold it, with its real environment.
    pub fn into_task(self) -> Task {
        self.0
    }
}

impl<'r> sqlx::FromRow<'r, PgRow> for TaskRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<TaskRow> {
        let fields = row
            .columns()
            .iter()
            .map(|column| column_field(row, column))
            .collect::<sqlx::Result<Vec<_>>>()?;
        let mut columns = Columns {
            fields: fields.into_iter(),
            value: None,
            failed: None,
        };
        let task = Task::deserialize(MapAccessDeserializer::new(&mut columns));
        task.map(TaskRow).map_err(|e| match columns.failed.take() {
            Some(index) => sqlx::Error::ColumnDecode {
                index,
                source: Box::new(e),
            },
            None => sqlx::Error::Decode(Box::new(e)),
        })
    }
}

/// A column of `row` as the field of its name, and its value as JSON.
fn column_field<'r>(row: &'r PgRow, column: &'r PgColumn) -> sqlx::Result<(Cow<'r, str>, Value)> {
    fn json<T: serde::Serialize>(value: Option<T>) -> Value {
        value.map_or(Value::Null, |v| {
            serde_json::to_value(v).unwrap_or(Value::Null)
        })
    }
    let (i, name) = (column.ordinal(), column.name());
    let value = match column.type_info().name() {
        "BOOL" => json(row.try_get::<Option<bool>, _>(i)?),
        "INT2" => json(row.try_get::<Option<i16>, _>(i)?),
        "INT4" => json(row.try_get::<Option<i32>, _>(i)?),
        "INT8" => json(row.try_get::<Option<i64>, _>(i)?),
        "FLOAT8" => json(row.try_get::<Option<f64>, _>(i)?),
        "TEXT" => json(row.try_get::<Option<&str>, _>(i)?),
        "TEXT[]" => json(row.try_get::<Option<Vec<String>>, _>(i)?),
        "UUID" => json(row.try_get::<Option<Uuid>, _>(i)?),
        "TIMESTAMPTZ" => json(row.try_get::<Option<DateTime<Utc>>, _>(i)?),
        "JSONB" => row.try_get::<Option<Value>, _>(i)?.unwrap_or(Value::Null),
        "INTERVAL" => {
            let secs = row.try_get::<Option<PgInterval>, _>(i)?;
            return Ok((
                Cow::Owned(format!("{name}{SECS}")),
                json(secs.as_ref().map(interval_secs)),
            ));
        }
        other => {
            return Err(sqlx::Error::ColumnDecode {
                index: name.to_owned(),
                source: format!("a task's column of type {other} is not read").into(),
            });
        }
    };
    Ok((Cow::Borrowed(name), value))
}

/// A row's fields as the map a [`Task`] is read from; a value that does not read names its
/// column (`failed`).
struct Columns<'r> {
    fields: std::vec::IntoIter<(Cow<'r, str>, Value)>,
    value: Option<(Cow<'r, str>, Value)>,
    failed: Option<String>,
}

impl<'de> MapAccess<'de> for &mut Columns<'_> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> std::result::Result<Option<K::Value>, Self::Error> {
        let Some((name, value)) = self.fields.next() else {
            return Ok(None);
        };
        let key = seed.deserialize(name.as_ref().into_deserializer())?;
        self.value = Some((name, value));
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> std::result::Result<V::Value, Self::Error> {
        let (name, value) = self
            .value
            .take()
            .ok_or_else(|| serde_json::Error::custom("a value without its column"))?;
        seed.deserialize(value).inspect_err(|_| {
            self.failed = Some(name.into_owned());
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

/// An interval as seconds (a month counts 30 days, as Postgres' own `extract(epoch …)` does).
pub fn interval_secs(i: &PgInterval) -> f64 {
    i.microseconds as f64 / 1e6 + f64::from(i.days) * 86_400.0 + f64::from(i.months) * 2_592_000.0
}

/// A task's `env` column as a map (the schema guarantees an object of strings).
pub fn env_map(env: &Value) -> BTreeMap<String, String> {
    match env {
        Value::Object(map) => map
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn secs(value: Option<f64>, field: &str) -> Result<Option<String>> {
    match value {
        Some(v) if !v.is_finite() => Err(DbError::InvalidInput(format!(
            "{field} must be a finite number"
        ))),
        Some(v) => Ok(Some(seconds_text(v))),
        None => Ok(None),
    }
}

/// Seconds as interval text (`5 seconds`, `0.25 seconds`), to the microsecond: an interval's
/// precision. `{v}` alone writes every digit of a tiny number (2.2e-309 with 308 zeros), more
/// than PostgreSQL reads as an interval.
pub(crate) fn seconds_text(v: f64) -> String {
    let fixed = format!("{v:.6}");
    let digits = fixed.trim_end_matches('0').trim_end_matches('.');
    format!("{digits} seconds")
}

/// One task as `sked.tasks_submit` reads it: the argument names of `sked.task_submit`,
/// durations as interval text. Serialized straight from the request, with no JSON tree in
/// between; absent fields are left out so that the function applies the defaults.
#[derive(serde::Serialize)]
pub(crate) struct SubmitRow<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<&'a Vec<String>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    args: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<TaskKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<&'a Value>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_attempts: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backoff_base: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backoff_max: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    labels: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    artifact_url: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    artifact_sha256: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shards: Option<i32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    broadcast: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_millis: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_mb: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_as: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restart_policy: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    health_check: Option<&'a Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    preemptible: bool,
}

impl<'a> SubmitRow<'a> {
    pub(crate) fn new(t: &'a SubmitTask) -> Result<SubmitRow<'a>> {
        Ok(SubmitRow {
            command: t.command.as_ref(),
            args: &t.args,
            kind: t.kind,
            queue: t.queue.as_deref(),
            priority: t.priority,
            input: t.input.as_ref(),
            env: &t.env,
            run_at: t.run_at,
            delay: secs(t.delay_secs, "delay_secs")?,
            max_attempts: t.max_attempts,
            timeout: secs(t.timeout_secs, "timeout_secs")?,
            backoff_base: secs(t.backoff_base_secs, "backoff_base_secs")?,
            backoff_max: secs(t.backoff_max_secs, "backoff_max_secs")?,
            idempotency_key: t.idempotency_key.as_deref(),
            labels: &t.labels,
            artifact_url: t.artifact_url.as_deref(),
            artifact_sha256: t.artifact_sha256.as_deref(),
            output_path: t.output_path.as_deref(),
            owner: t.owner.as_deref(),
            shards: t.shards,
            broadcast: t.broadcast,
            cpu_millis: t.cpu_millis,
            memory_mb: t.memory_mb,
            max_output_bytes: t.max_output_bytes,
            run_as: t.run_as.as_deref(),
            replicas: t.replicas,
            restart_policy: t.restart_policy.as_deref(),
            health_check: t.health_check.as_ref(),
            preemptible: t.preemptible,
        })
    }
}

/// A task as the JSON object `sked.tasks_submit` takes (the form of a schedule's template).
pub fn submit_json(t: &SubmitTask) -> Result<Value> {
    serde_json::to_value(SubmitRow::new(t)?).map_err(|e| DbError::InvalidInput(e.to_string()))
}

/// Submits tasks in one statement (all or nothing); returns their ids in order. Tasks that
/// name no owner get `owner`.
pub async fn submit(pool: &PgPool, tasks: &[SubmitTask], owner: &str) -> Result<Vec<Uuid>> {
    let mut conn = pool.acquire().await?;
    submit_in(&mut conn, tasks, owner).await
}

/// [`submit`] on one connection: within its transaction when it has one open.
pub async fn submit_in(
    conn: &mut PgConnection,
    tasks: &[SubmitTask],
    owner: &str,
) -> Result<Vec<Uuid>> {
    if tasks.len() >= COPY_FROM
        && tasks.iter().all(copyable)
        && !row_security_active(&mut *conn).await?
    {
        return submit_by_copy(conn, tasks, owner).await;
    }
    let rows = tasks
        .iter()
        .map(SubmitRow::new)
        .collect::<Result<Vec<_>>>()?;
    let ids: Vec<Uuid> = sqlx::query_scalar("select id from sked.tasks_submit($1, $2)")
        .bind(sqlx::types::Json(rows))
        .bind(owner)
        .fetch_all(conn)
        .await?;
    Ok(ids)
}

/// True when row-level security applies to this connection's role on `sked.tasks` (the
/// `sked_server` and `sked_submitter` roles, see `docs/security.md`): PostgreSQL refuses
/// `COPY … FROM` into such a table, so their batches go through `sked.tasks_submit`.
async fn row_security_active(db: impl PgExecutor<'_>) -> Result<bool> {
    Ok(
        sqlx::query_scalar("select row_security_active('sked.tasks')")
            .fetch_one(db)
            .await?,
    )
}

/// Batches at least this large go in by `COPY` when [`copyable`] and row-level security
/// does not apply.
const COPY_FROM: usize = 64;

/// A task `COPY` can insert: no idempotency key (which needs `ON CONFLICT`), no start time
/// of its own (`next_run_at` is then the database's `now()`, the column default), and not
/// sharded.
fn copyable(t: &SubmitTask) -> bool {
    t.idempotency_key.is_none()
        && t.run_at.is_none()
        && t.delay_secs.is_none()
        && t.shards.is_none()
        && !t.broadcast
}

/// Inserts a batch with one `COPY`, the cheapest way into the table: one statement (all or
/// nothing), the same validation triggers and one notification. The ids are made here
/// (time-ordered UUIDv7, like the column default). Absent fields get the table's defaults,
/// which this function repeats; a test compares both.
async fn submit_by_copy(
    conn: &mut PgConnection,
    tasks: &[SubmitTask],
    owner: &str,
) -> Result<Vec<Uuid>> {
    let mut ids = Vec::with_capacity(tasks.len());
    let mut buf = String::with_capacity(tasks.len() * 128);
    for t in tasks {
        let id = Uuid::now_v7();
        ids.push(id);
        let timeout = secs(t.timeout_secs, "timeout_secs")?;
        let base = secs(t.backoff_base_secs, "backoff_base_secs")?;
        let max = secs(t.backoff_max_secs, "backoff_max_secs")?;
        copy::field(&mut buf, &id.to_string());
        copy::field(&mut buf, t.owner.as_deref().unwrap_or(owner));
        copy::field(&mut buf, t.queue.as_deref().unwrap_or("default"));
        copy::field(&mut buf, &t.priority.unwrap_or(0).to_string());
        copy::field(&mut buf, t.kind.unwrap_or_default().as_str());
        copy::array(&mut buf, t.command.as_deref());
        copy::array(&mut buf, Some(&t.args));
        copy::json(&mut buf, t.input.as_ref());
        copy::json(
            &mut buf,
            Some(&serde_json::to_value(&t.env).unwrap_or_default()),
        );
        copy::array(&mut buf, Some(&t.labels));
        copy::opt(&mut buf, t.artifact_url.as_deref());
        copy::opt(&mut buf, t.artifact_sha256.as_deref());
        copy::opt(&mut buf, t.output_path.as_deref());
        copy::opt(&mut buf, timeout.as_deref());
        copy::field(&mut buf, &t.max_attempts.unwrap_or(3).to_string());
        copy::field(&mut buf, base.as_deref().unwrap_or("1 second"));
        copy::field(&mut buf, max.as_deref().unwrap_or("1 hour"));
        copy::opt(&mut buf, t.cpu_millis.map(|v| v.to_string()).as_deref());
        copy::opt(&mut buf, t.memory_mb.map(|v| v.to_string()).as_deref());
        copy::opt(
            &mut buf,
            t.max_output_bytes.map(|v| v.to_string()).as_deref(),
        );
        copy::opt(&mut buf, t.run_as.as_deref());
        copy::opt(&mut buf, t.replicas.map(|v| v.to_string()).as_deref());
        copy::opt(&mut buf, t.restart_policy.as_deref());
        copy::json(&mut buf, t.health_check.as_ref());
        copy::field(&mut buf, if t.preemptible { "t" } else { "f" });
        buf.pop();
        buf.push('\n');
    }
    let mut sink = conn
        .copy_in_raw(
            "copy sked.tasks (id, owner, queue, priority, kind, command, args, input, env, labels,
                              artifact_url, artifact_sha256, output_path, timeout, max_attempts,
                              backoff_base, backoff_max, cpu_millis, memory_mb,
                              max_output_bytes, run_as, replicas, restart_policy,
                              health_check, preemptible) from stdin",
        )
        .await?;
    sink.send(buf.into_bytes()).await?;
    sink.finish().await?;
    Ok(ids)
}

/// Fields of PostgreSQL's `COPY … FROM STDIN` text format, each followed by a tab.
mod copy {
    /// Text with the format's escapes (backslash, tab, newline, carriage return).
    pub fn field(buf: &mut String, value: &str) {
        escape(buf, value);
        buf.push('\t');
    }

    fn escape(buf: &mut String, value: &str) {
        for c in value.chars() {
            match c {
                '\\' => buf.push_str("\\\\"),
                '\t' => buf.push_str("\\t"),
                '\n' => buf.push_str("\\n"),
                '\r' => buf.push_str("\\r"),
                c => buf.push(c),
            }
        }
    }

    /// `\N` (null) or the text.
    pub fn opt(buf: &mut String, value: Option<&str>) {
        match value {
            Some(v) => field(buf, v),
            None => buf.push_str("\\N\t"),
        }
    }

    /// A `text[]` literal with every element quoted, or null.
    pub fn array(buf: &mut String, items: Option<&[String]>) {
        let Some(items) = items else {
            return opt(buf, None);
        };
        let mut literal = String::from("{");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                literal.push(',');
            }
            literal.push('"');
            for c in item.chars() {
                if c == '"' || c == '\\' {
                    literal.push('\\');
                }
                literal.push(c);
            }
            literal.push('"');
        }
        literal.push('}');
        field(buf, &literal);
    }

    /// A JSON document, or null.
    pub fn json(buf: &mut String, value: Option<&serde_json::Value>) {
        match value {
            Some(v) => field(buf, &v.to_string()),
            None => opt(buf, None),
        }
    }
}

/// One task by id.
pub async fn get(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<TaskRow>> {
    Ok(sqlx::query_as("select * from sked.tasks where id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?)
}

/// Every attempt of a task, oldest first.
pub async fn attempts(pool: &PgPool, id: Uuid) -> Result<Vec<Attempt>> {
    type Row = (
        i32,
        Option<Uuid>,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
        String,
        Option<i32>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "select attempt, worker_id, started_at, finished_at, outcome, exit_code, error,
                stdout_tail, stderr_tail
           from sked.task_attempt_history where task_id = $1 order by attempt",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Attempt {
            attempt: r.0,
            worker_id: r.1,
            started_at: r.2,
            finished_at: r.3,
            outcome: r.4,
            exit_code: r.5,
            error: r.6,
            stdout_tail: r.7,
            stderr_tail: r.8,
        })
        .collect())
}

/// Log chunks of a task after chunk id `after`, oldest first.
pub async fn logs(pool: &PgPool, id: Uuid, after: i64, limit: i64) -> Result<Vec<LogChunk>> {
    let rows: Vec<(i64, i32, String, DateTime<Utc>, String)> = sqlx::query_as(
        "select id, attempt, stream, at, data from sked.task_logs
          where task_id = $1 and id > $2 order by id limit $3",
    )
    .bind(id)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, attempt, stream, at, data)| LogChunk {
            id,
            attempt,
            stream,
            at,
            data,
        })
        .collect())
}

/// `sked.task_cancel`: the state after the call, or `None` when there is no such task.
pub async fn cancel(pool: &PgPool, id: Uuid) -> Result<Option<TaskState>> {
    let state: Option<Text<TaskState>> = sqlx::query_scalar("select sked.task_cancel($1)")
        .bind(id)
        .fetch_one(pool)
        .await?;
    Ok(state.map(|s| s.0))
}

/// `sked.task_retry`: the state after the call, or `None` when there is no such task.
pub async fn retry(pool: &PgPool, id: Uuid) -> Result<Option<TaskState>> {
    let state: Option<Text<TaskState>> = sqlx::query_scalar("select sked.task_retry($1)")
        .bind(id)
        .fetch_one(pool)
        .await?;
    Ok(state.map(|s| s.0))
}

/// `sked.task_resubmit`: submits a new task, owned by `owner`, with the definition of task
/// `id` (its real environment included); the new id, or `None` when there is no such task.
/// The function refuses tasks of a workflow and shards (rejected by the schema).
pub async fn resubmit(db: impl PgExecutor<'_>, id: Uuid, owner: &str) -> Result<Option<Uuid>> {
    Ok(sqlx::query_scalar("select sked.task_resubmit($1, $2)")
        .bind(id)
        .bind(owner)
        .fetch_one(db)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_read_as_an_interval_to_the_microsecond() {
        assert_eq!(seconds_text(5.0), "5 seconds");
        assert_eq!(seconds_text(0.25), "0.25 seconds");
        assert_eq!(seconds_text(-2.5), "-2.5 seconds");
        assert_eq!(seconds_text(3_155_760_000.0), "3155760000 seconds");
        assert_eq!(seconds_text(0.000_001), "0.000001 seconds");
        assert_eq!(seconds_text(2.225_073_858_507_203e-309), "0 seconds");
    }
}
