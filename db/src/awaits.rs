//! Awaiting a task or a workflow (`sql/awaits.sql`): the channel its final state is announced
//! on, and the registration that makes the database announce it.
//!
//! A waiter LISTENs on the channel first, then registers (`register_task`,
//! `register_workflow`), which also reads the state: a final state ends the wait at once,
//! otherwise the notification (or a renewed registration's read) does. Waiting holds no
//! connection of the pool.

use std::time::Duration;

use sqlx::PgExecutor;
use sqlx::postgres::types::PgInterval;
use uuid::Uuid;

use crate::error::Result;

/// `sked.task_channel`: where task `id`'s final state is announced to those awaiting it.
pub fn task_channel(id: Uuid) -> String {
    format!("sked_task_{id}")
}

/// `sked.workflow_channel`: where workflow `id`'s final state is announced.
pub fn workflow_channel(id: Uuid) -> String {
    format!("sked_workflow_{id}")
}

/// The longest registration `sked.task_await` accepts.
pub const MAX_REGISTRATION: Duration = Duration::from_secs(86_400);

/// What a registration read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The state, as the database names it.
    pub state: String,
    /// Whether it is final (nothing was registered then).
    pub finished: bool,
}

fn interval(d: Duration) -> PgInterval {
    let d = d.clamp(Duration::from_millis(1), MAX_REGISTRATION);
    PgInterval {
        months: 0,
        days: 0,
        microseconds: d.as_micros() as i64,
    }
}

/// `sked.task_await(id, false, for)`: registers a wait for task `id` for `for` (the caller
/// LISTENs itself, on [`task_channel`]) and reads its state; `None` when there is no such task
/// (or the database role may not read it).
pub async fn register_task(
    db: impl PgExecutor<'_>,
    id: Uuid,
    r#for: Duration,
) -> Result<Option<Registered>> {
    register(
        db,
        "select * from sked.task_await($1, false, $2)",
        id,
        r#for,
    )
    .await
}

/// [`register_task`] for a workflow (`sked.workflow_await`).
pub async fn register_workflow(
    db: impl PgExecutor<'_>,
    id: Uuid,
    r#for: Duration,
) -> Result<Option<Registered>> {
    register(
        db,
        "select * from sked.workflow_await($1, false, $2)",
        id,
        r#for,
    )
    .await
}

async fn register(
    db: impl PgExecutor<'_>,
    sql: &'static str,
    id: Uuid,
    r#for: Duration,
) -> Result<Option<Registered>> {
    match sqlx::query_as::<_, (String, bool)>(sql)
        .bind(id)
        .bind(interval(r#for))
        .fetch_one(db)
        .await
    {
        Ok((state, finished)) => Ok(Some(Registered { state, finished })),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("P0002") => Ok(None),
        Err(e) => Err(e.into()),
    }
}
