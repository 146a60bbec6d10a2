//! Awaiting a task or a workflow (`sql/awaits.sql`): the channel its final state is announced
//! on, and the registration that makes the database announce it.
//!
//! A waiter LISTENs on the channel first, then registers ([`Awaited::register`]), which
//! also reads the state: a final state ends the wait at once,
//! otherwise the notification (or a renewed registration's read) does. Waiting holds no
//! connection of the pool.

use std::time::Duration;

use sqlx::PgExecutor;
use uuid::Uuid;

use crate::error::Result;
use crate::worker::pg_interval;

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

/// What is awaited: a task or a workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    Task(Uuid),
    Workflow(Uuid),
}

/// What a registration read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The state, as the database names it.
    pub state: String,
    /// Whether it is final (nothing was registered then).
    pub finished: bool,
}

impl Awaited {
    /// The channel its final state is announced on ([`task_channel`], [`workflow_channel`]).
    pub fn channel(self) -> String {
        match self {
            Awaited::Task(id) => task_channel(id),
            Awaited::Workflow(id) => workflow_channel(id),
        }
    }

    /// `sked.task_await(id, false, for)` or `sked.workflow_await`: registers a wait for
    /// `for` (the caller LISTENs itself, on [`Awaited::channel`]) and reads the state;
    /// `None` when there is no such task or workflow (or the database role may not read it).
    pub async fn register(
        self,
        db: impl PgExecutor<'_>,
        r#for: Duration,
    ) -> Result<Option<Registered>> {
        let (sql, id) = match self {
            Awaited::Task(id) => ("select * from sked.task_await($1, false, $2)", id),
            Awaited::Workflow(id) => ("select * from sked.workflow_await($1, false, $2)", id),
        };
        let r#for = r#for.clamp(Duration::from_millis(1), MAX_REGISTRATION);
        match sqlx::query_as::<_, (String, bool)>(sql)
            .bind(id)
            .bind(pg_interval(r#for))
            .fetch_one(db)
            .await
        {
            Ok((state, finished)) => Ok(Some(Registered { state, finished })),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("P0002") => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
