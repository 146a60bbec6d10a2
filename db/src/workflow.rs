//! Workflows (DAGs of tasks) and the workflow functions of the SQL contract: submit, read,
//! list, cancel and re-run. See `docs/workflows.md`.

use chrono::{DateTime, Utc};
use sked_types::{SubmitWorkflow, TriggerRule, Workflow, WorkflowEdge, WorkflowState};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use crate::task::{SubmitRow, TaskRow};
use crate::text::Text;
use crate::{DbError, Result};

/// A row of `sked.workflows`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WorkflowRow {
    pub id: Uuid,
    pub owner: String,
    pub name: String,
    #[sqlx(try_from = "Text<WorkflowState>")]
    pub state: WorkflowState,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl WorkflowRow {
    pub fn into_workflow(self) -> Workflow {
        Workflow {
            state: self.state,
            id: self.id,
            owner: self.owner,
            name: self.name,
            created_at: self.created_at,
            finished_at: self.finished_at,
        }
    }
}

/// One task as `sked.workflow_submit` reads it: a task of `sked.tasks_submit` plus its name,
/// parents and rule.
#[derive(serde::Serialize)]
struct SpecTask<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    depends_on: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    trigger_rule: Option<TriggerRule>,
    #[serde(flatten)]
    task: SubmitRow<'a>,
}

#[derive(serde::Serialize)]
struct Spec<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    tasks: Vec<SpecTask<'a>>,
}

/// The JSON spec `sked.workflow_submit` takes for this request (durations as interval text).
pub fn spec_json(w: &SubmitWorkflow) -> Result<serde_json::Value> {
    let tasks = w
        .tasks
        .iter()
        .map(|t| {
            Ok(SpecTask {
                name: &t.name,
                depends_on: &t.depends_on,
                trigger_rule: t.trigger_rule,
                task: SubmitRow::new(&t.task)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    serde_json::to_value(Spec {
        name: w.name.as_deref(),
        tasks,
    })
    .map_err(|e| DbError::InvalidInput(e.to_string()))
}

/// Submits a workflow (`sked.workflow_submit`), all or nothing; returns its id. It belongs
/// to `w.owner` when given, else to `owner`.
pub async fn submit(db: impl PgExecutor<'_>, w: &SubmitWorkflow, owner: &str) -> Result<Uuid> {
    let spec = spec_json(w)?;
    Ok(sqlx::query_scalar("select sked.workflow_submit($1, $2)")
        .bind(spec)
        .bind(w.owner.as_deref().unwrap_or(owner))
        .fetch_one(db)
        .await?)
}

/// One workflow by id.
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<WorkflowRow>> {
    Ok(sqlx::query_as(
        "select id, owner, name, state, created_at, finished_at from sked.workflows where id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?)
}

/// Filters of a workflow listing; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub owner: Option<String>,
    pub state: Option<WorkflowState>,
    /// Keyset cursor: only workflows with a smaller (older) id.
    pub after: Option<Uuid>,
    pub limit: i64,
}

/// Workflows newest first (ids are time-ordered), one page at a time by keyset on the id.
pub async fn list(pool: &PgPool, f: &ListFilter) -> Result<Vec<WorkflowRow>> {
    let mut q = sqlx::QueryBuilder::new(
        "select id, owner, name, state, created_at, finished_at from sked.workflows where true",
    );
    if let Some(owner) = &f.owner {
        q.push(" and owner = ").push_bind(owner);
    }
    if let Some(state) = f.state {
        q.push(" and state = ").push_bind(state.as_str());
    }
    if let Some(after) = f.after {
        q.push(" and id < ").push_bind(after);
    }
    q.push(" order by id desc limit ").push_bind(f.limit);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

/// The tasks of a workflow, in submission order.
pub async fn tasks(pool: &PgPool, id: Uuid) -> Result<Vec<TaskRow>> {
    Ok(
        sqlx::query_as("select * from sked.tasks where workflow_id = $1 order by id")
            .bind(id)
            .fetch_all(pool)
            .await?,
    )
}

/// The edges between the tasks of a workflow.
pub async fn edges(pool: &PgPool, id: Uuid) -> Result<Vec<WorkflowEdge>> {
    let rows: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "select e.task_id, e.depends_on from sked.task_edges e
           join sked.tasks t on t.id = e.task_id
          where t.workflow_id = $1
          order by e.task_id, e.depends_on",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(task, depends_on)| WorkflowEdge { task, depends_on })
        .collect())
}

/// `sked.workflow_cancel`: the workflow's state after the call, or `None` when absent.
pub async fn cancel(pool: &PgPool, id: Uuid) -> Result<Option<WorkflowState>> {
    let state: Option<Text<WorkflowState>> = sqlx::query_scalar("select sked.workflow_cancel($1)")
        .bind(id)
        .fetch_one(pool)
        .await?;
    Ok(state.map(|s| s.0))
}

/// `sked.workflow_retry`: how many failed or cancelled tasks run again, or `None` when
/// absent.
pub async fn retry(pool: &PgPool, id: Uuid) -> Result<Option<i32>> {
    Ok(sqlx::query_scalar("select sked.workflow_retry($1)")
        .bind(id)
        .fetch_one(pool)
        .await?)
}
