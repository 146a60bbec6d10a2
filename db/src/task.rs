//! Task rows and the task functions of the SQL contract: submit, read, cancel, retry,
//! resubmit. Listings are in [`crate::listing`].
//!
//! A task's fields are defined once in Rust, by the API's types ([`SubmitTask`] to submit,
//! [`Task`] to read), and once in SQL (`sql/tasks.sql`, "The fields of a task"); this module
//! moves them between the two by name, without listing them. The one difference of naming
//! between the two: a field of seconds `x_secs` in the API is the interval `x` in SQL.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, Error as _, IntoDeserializer, MapAccess};
use serde_json::{Map, Value};
use sked_types::{Attempt, LogChunk, SubmitTask, Submitted, Task, TaskState};
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

/// Seconds as interval text (`5 seconds`, `0.25 seconds`), to the microsecond: an interval's
/// precision. `{v}` alone writes every digit of a tiny number (2.2e-309 with 308 zeros), more
/// than PostgreSQL reads as an interval.
pub(crate) fn seconds_text(v: f64) -> String {
    let fixed = format!("{v:.6}");
    let digits = fixed.trim_end_matches('0').trim_end_matches('.');
    format!("{digits} seconds")
}

/// A task as the JSON object `sked.tasks_submit` takes (also the form of a schedule's
/// template and of a workflow's task): the request's fields by name, those it leaves out
/// absent (the table's defaults apply), seconds `x_secs` as the interval text of `x`.
pub fn submit_json(t: &SubmitTask) -> Result<Value> {
    submit_fields(t).map(Value::Object)
}

/// [`submit_json`] as the object's fields.
pub(crate) fn submit_fields(t: &SubmitTask) -> Result<Map<String, Value>> {
    let Value::Object(mut fields) =
        serde_json::to_value(t).map_err(|e| DbError::InvalidInput(e.to_string()))?
    else {
        return Err(DbError::InvalidInput("a task is a JSON object".into()));
    };
    let seconds: Vec<String> = fields
        .keys()
        .filter(|key| key.ends_with(SECS))
        .cloned()
        .collect();
    for key in seconds {
        let value = fields.remove(&key);
        // serde_json writes a number that is not finite as null.
        let Some(secs) = value.as_ref().and_then(Value::as_f64) else {
            return Err(DbError::InvalidInput(format!(
                "{key} must be a finite number"
            )));
        };
        let interval = key.trim_end_matches(SECS).to_owned();
        fields.insert(interval, Value::String(seconds_text(secs)));
    }
    Ok(fields)
}

/// Submits tasks in one statement (all or nothing); returns their ids in order and whether
/// each was created (false: its idempotency key named that task already). Tasks that name no
/// owner get `owner`.
pub async fn submit(pool: &PgPool, tasks: &[SubmitTask], owner: &str) -> Result<Submitted> {
    if crate::pooler::transaction_mode() {
        // Its statements (a COPY takes several) on one server connection.
        let mut tx = crate::begin(pool).await?;
        let submitted = submit_in(&mut tx, tasks, owner).await?;
        tx.commit().await?;
        return Ok(submitted);
    }
    let mut conn = pool.acquire().await?;
    submit_in(&mut conn, tasks, owner).await
}

/// [`submit`] on one connection: within its transaction when it has one open.
pub async fn submit_in(
    conn: &mut PgConnection,
    tasks: &[SubmitTask],
    owner: &str,
) -> Result<Submitted> {
    let specs = tasks
        .iter()
        .map(submit_fields)
        .collect::<Result<Vec<_>>>()?;
    if tasks.len() >= COPY_FROM
        && tasks.iter().all(copyable)
        && let Some(columns) = copy::Columns::of(&mut *conn, &specs).await?
    {
        let ids = copy::submit(conn, &specs, &columns, owner).await?;
        let created = vec![true; ids.len()];
        return Ok(Submitted { ids, created });
    }
    let rows: Vec<(Uuid, bool)> =
        sqlx::query_as("select id, created from sked.tasks_submit($1, $2)")
            .bind(sqlx::types::Json(specs))
            .bind(owner)
            .fetch_all(conn)
            .await?;
    let (ids, created) = rows.into_iter().unzip();
    Ok(Submitted { ids, created })
}

/// Batches at least this large go in by `COPY` when [`copyable`] and row-level security does
/// not apply (see [`copy::Columns`]).
const COPY_FROM: usize = 64;

/// A task `COPY` can insert: no idempotency key (a key that names a task already answers
/// with that task, which `COPY` cannot), no start time
/// of its own (`next_run_at` is then the database's `now()`, the column default), and not
/// sharded.
fn copyable(t: &SubmitTask) -> bool {
    t.idempotency_key.is_none()
        && t.run_at.is_none()
        && t.delay_secs.is_none()
        && t.shards.is_none()
        && !t.broadcast
}

/// Batches by `COPY`, the cheapest way into the table: one statement (all or nothing), the
/// same validation triggers and one notification. Only the columns some task of the batch
/// sets are copied; the table's defaults fill in the rest as for any insert.
mod copy {
    use std::borrow::Cow;

    use serde_json::{Map, Value};
    use sqlx::PgConnection;
    use uuid::Uuid;

    use crate::Result;

    /// A column a batch is copied into.
    struct Column {
        name: String,
        /// Of type jsonb: it takes a JSON document whatever its JSON type.
        jsonb: bool,
        /// The table's default, for a task that leaves the column out.
        default: Value,
    }

    /// The columns a batch is copied into: `id` (made here, time-ordered UUIDv7 like the
    /// column default), `owner`, and every field a task of the batch sets.
    pub struct Columns(Vec<Column>);

    impl Columns {
        /// The columns of `specs`, or `None` when row-level security applies to this
        /// connection's role (the `sked_server` and `sked_submitter` roles, see
        /// `docs/security.md`): PostgreSQL refuses `COPY … FROM` into such a table. The
        /// defaults are a new row of the table's (`sked.task_new()`), read in the same
        /// statement.
        pub async fn of(
            conn: &mut PgConnection,
            specs: &[Map<String, Value>],
        ) -> Result<Option<Columns>> {
            let (defaults, jsonb): (Option<sqlx::types::Json<Map<String, Value>>>, Vec<String>) =
                sqlx::query_as(
                    "select case when not row_security_active('sked.tasks')
                                 then to_jsonb(sked.task_new()) end,
                            array(select a.attname::text from pg_attribute a
                                   where a.attrelid = 'sked.tasks'::regclass and a.attnum > 0
                                     and not a.attisdropped and a.atttypid = 'jsonb'::regtype)",
                )
                .fetch_one(conn)
                .await?;
            let Some(sqlx::types::Json(mut defaults)) = defaults else {
                return Ok(None);
            };
            let mut columns: Vec<Column> = Vec::new();
            let names = ["id", "owner"].into_iter();
            for name in names.chain(
                specs
                    .iter()
                    .flat_map(|spec| spec.keys().map(String::as_str)),
            ) {
                if columns.iter().all(|c| c.name != name) {
                    columns.push(Column {
                        name: name.to_owned(),
                        jsonb: jsonb.iter().any(|j| j == name),
                        default: defaults.remove(name).unwrap_or(Value::Null),
                    });
                }
            }
            Ok(Some(Columns(columns)))
        }
    }

    /// Inserts the batch with one `COPY` into `columns`; the ids in order. A task that
    /// names no owner gets `owner`.
    pub async fn submit(
        conn: &mut PgConnection,
        specs: &[Map<String, Value>],
        columns: &Columns,
        owner: &str,
    ) -> Result<Vec<Uuid>> {
        let mut ids = Vec::with_capacity(specs.len());
        let mut buf = String::with_capacity(specs.len() * 128);
        for spec in specs {
            let id = Uuid::now_v7();
            ids.push(id);
            field(&mut buf, &id.to_string());
            field(
                &mut buf,
                spec.get("owner").and_then(Value::as_str).unwrap_or(owner),
            );
            for column in &columns.0[2..] {
                let given = spec.get(&column.name).unwrap_or(&column.default);
                value(&mut buf, given, column.jsonb);
            }
            buf.pop();
            buf.push('\n');
        }
        let names: Vec<&str> = columns.0.iter().map(|c| c.name.as_str()).collect();
        let statement = format!("copy sked.tasks ({}) from stdin", names.join(", "));
        let mut sink = conn.copy_in_raw(&statement).await?;
        sink.send(buf.into_bytes()).await?;
        sink.finish().await?;
        Ok(ids)
    }

    /// A field of PostgreSQL's `COPY … FROM STDIN` text format, followed by a tab: `\N` for
    /// null, the JSON document for a jsonb column, an array literal for an array, `t`/`f`
    /// for a boolean, the text of a string or a number.
    fn value(buf: &mut String, value: &Value, jsonb: bool) {
        match value {
            Value::Null => buf.push_str("\\N\t"),
            v if jsonb => field(buf, &v.to_string()),
            Value::Bool(b) => field(buf, if *b { "t" } else { "f" }),
            Value::String(s) => field(buf, s),
            Value::Array(items) => field(buf, &array(items)),
            v => field(buf, &v.to_string()),
        }
    }

    /// Text with the format's escapes (backslash, tab, newline, carriage return).
    fn field(buf: &mut String, value: &str) {
        for c in value.chars() {
            match c {
                '\\' => buf.push_str("\\\\"),
                '\t' => buf.push_str("\\t"),
                '\n' => buf.push_str("\\n"),
                '\r' => buf.push_str("\\r"),
                c => buf.push(c),
            }
        }
        buf.push('\t');
    }

    /// An array literal with every element quoted (`NULL` for a null one).
    fn array(items: &[Value]) -> String {
        let mut literal = String::from("{");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                literal.push(',');
            }
            let text = match item {
                Value::Null => {
                    literal.push_str("NULL");
                    continue;
                }
                Value::String(s) => Cow::Borrowed(s.as_str()),
                v => Cow::Owned(v.to_string()),
            };
            literal.push('"');
            for c in text.chars() {
                if c == '"' || c == '\\' {
                    literal.push('\\');
                }
                literal.push(c);
            }
            literal.push('"');
        }
        literal.push('}');
        literal
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
    .fetch_all(crate::on(pool))
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
    .fetch_all(crate::on(pool))
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
        .fetch_one(crate::on(pool))
        .await?;
    Ok(state.map(|s| s.0))
}

/// `sked.task_retry`: the state after the call, or `None` when there is no such task.
pub async fn retry(pool: &PgPool, id: Uuid) -> Result<Option<TaskState>> {
    let state: Option<Text<TaskState>> = sqlx::query_scalar("select sked.task_retry($1)")
        .bind(id)
        .fetch_one(crate::on(pool))
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
