//! Workflows (DAGs of tasks) and the workflow functions of the SQL contract: submit, read,
//! list, cancel and re-run. See `docs/workflows.md`.

use chrono::{DateTime, Utc};
use serde_json::json;
use sked_types::{
    DefinitionVersion, ParentTask, SubWorkflow, SubWorkflowRun, SubmitWorkflow, Workflow,
    WorkflowEdge, WorkflowState, WorkflowTask,
};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use crate::Result;
use crate::task::{TaskRow, submit_fields};
use crate::text::Text;

/// The columns of a [`WorkflowRow`], of `sked.workflows w` left joined to its definition
/// `sked.workflow_definitions d` and, for a sub-workflow, the task that runs it
/// `sked.tasks p`.
macro_rules! workflow_columns {
    () => {
        "w.id, w.owner, w.name, w.state, w.created_at, w.finished_at, w.params,
         d.name as definition_name, d.version as definition_version,
         p.id as parent_task, p.workflow_id as parent_workflow"
    };
}

/// The joins of [`workflow_columns`].
macro_rules! workflow_joins {
    () => {
        " from sked.workflows w
           left join sked.workflow_definitions d on d.id = w.definition_id
           left join sked.tasks p on p.id = w.parent_task_id and p.owner = w.owner"
    };
}

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
    pub params: Option<serde_json::Value>,
    /// The definition it was run from (`sked.workflow_definitions`, joined).
    #[sqlx(default)]
    pub definition_name: Option<String>,
    #[sqlx(default)]
    pub definition_version: Option<i32>,
    /// A sub-workflow's task and that task's workflow (`sked.tasks`, joined).
    #[sqlx(default)]
    pub parent_task: Option<Uuid>,
    #[sqlx(default)]
    pub parent_workflow: Option<Uuid>,
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
            params: self.params,
            definition: self
                .definition_name
                .zip(self.definition_version)
                .map(|(name, version)| DefinitionVersion { name, version }),
            parent: self
                .parent_task
                .zip(self.parent_workflow)
                .map(|(task, workflow)| ParentTask { task, workflow }),
        }
    }
}

/// The JSON spec `sked.workflow_submit` takes for this request: each task as
/// `sked.tasks_submit` reads it ([`crate::task::submit_json`]) plus its name, parents and rule.
pub fn spec_json(w: &SubmitWorkflow) -> Result<serde_json::Value> {
    let mut spec = json!({ "tasks": tasks_json(&w.tasks)? });
    if let Some(name) = &w.name {
        spec["name"] = json!(name);
    }
    if let Some(notify) = &w.notify {
        spec["notify"] = notify.clone();
    }
    if let Some(params) = &w.params {
        spec["params"] = serde_json::Value::Object(params.clone());
    }
    Ok(spec)
}

/// A sub-workflow task's `workflow` as the SQL contract takes it: a definition by name, or
/// a spec whose tasks are read as [`spec_json`] reads a workflow's.
pub fn subworkflow_json(sub: &SubWorkflow) -> Result<serde_json::Value> {
    let mut body = serde_json::Map::new();
    if let Some(definition) = &sub.definition {
        body.insert("definition".into(), json!(definition));
    }
    if let Some(version) = sub.version {
        body.insert("version".into(), json!(version));
    }
    if let Some(name) = &sub.name {
        body.insert("name".into(), json!(name));
    }
    match (&sub.tasks, &sub.definition) {
        (Some(tasks), _) => {
            body.insert("tasks".into(), tasks_json(tasks)?);
        }
        // Neither: the SQL rule says what a sub-workflow is.
        (None, None) => {
            body.insert("tasks".into(), json!([]));
        }
        (None, Some(_)) => {}
    }
    if let Some(notify) = &sub.notify {
        body.insert("notify".into(), notify.clone());
    }
    if let Some(params) = &sub.params {
        body.insert("params".into(), serde_json::Value::Object(params.clone()));
    }
    Ok(serde_json::Value::Object(body))
}

/// The tasks of a workflow spec, as `sked.workflow_submit` reads them.
fn tasks_json(tasks: &[WorkflowTask]) -> Result<serde_json::Value> {
    let tasks = tasks
        .iter()
        .map(|t| {
            let mut fields = submit_fields(&t.task)?;
            fields.insert("name".into(), json!(t.name));
            if !t.depends_on.is_empty() {
                fields.insert("depends_on".into(), json!(t.depends_on));
            }
            if let Some(rule) = t.trigger_rule {
                fields.insert("trigger_rule".into(), json!(rule));
            }
            if t.branch {
                fields.insert("branch".into(), json!(true));
            }
            if let Some(over) = &t.map_over {
                fields.insert("map_over".into(), json!(over));
            }
            if let Some(max) = t.map_max {
                fields.insert("map_max".into(), json!(max));
            }
            if let Some(rule) = t.map_trigger_rule {
                fields.insert("map_trigger_rule".into(), json!(rule));
            }
            if let Some(sub) = &t.workflow {
                fields.insert("workflow".into(), subworkflow_json(sub)?);
            }
            Ok(serde_json::Value::Object(fields))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(serde_json::Value::Array(tasks))
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
    Ok(sqlx::query_as(concat!(
        "select ",
        workflow_columns!(),
        workflow_joins!(),
        " where w.id = $1"
    ))
    .bind(id)
    .fetch_optional(crate::on(pool))
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
    let mut q = sqlx::QueryBuilder::new(concat!(
        "select ",
        workflow_columns!(),
        workflow_joins!(),
        " where true"
    ));
    if let Some(owner) = &f.owner {
        q.push(" and w.owner = ").push_bind(owner);
    }
    if let Some(state) = f.state {
        q.push(" and w.state = ").push_bind(state.as_str());
    }
    if let Some(after) = f.after {
        q.push(" and w.id < ").push_bind(after);
    }
    q.push(" order by w.id desc limit ").push_bind(f.limit);
    Ok(q.build_query_as().fetch_all(crate::on(pool)).await?)
}

/// The tasks of a workflow, in submission order.
pub async fn tasks(pool: &PgPool, id: Uuid) -> Result<Vec<TaskRow>> {
    Ok(
        sqlx::query_as("select * from sked.tasks where workflow_id = $1 order by id")
            .bind(id)
            .fetch_all(crate::on(pool))
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
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows
        .into_iter()
        .map(|(task, depends_on)| WorkflowEdge { task, depends_on })
        .collect())
}

/// The latest sub-workflow of each sub-workflow task of a workflow, in task order.
pub async fn subworkflows(pool: &PgPool, id: Uuid) -> Result<Vec<SubWorkflowRun>> {
    let rows: Vec<(Uuid, Uuid, Text<WorkflowState>)> = sqlx::query_as(
        "select t.id, s.id, s.state from sked.tasks t
           cross join lateral (select s.id, s.state from sked.workflows s
                                where s.parent_task_id = t.id and s.owner = t.owner
                                order by s.id desc limit 1) s
          where t.workflow_id = $1 and t.kind = 'workflow'
          order by t.id",
    )
    .bind(id)
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows
        .into_iter()
        .map(|(task, workflow, state)| SubWorkflowRun {
            task,
            workflow,
            state: state.0,
        })
        .collect())
}

/// `sked.workflow_cancel`: the workflow's state after the call, or `None` when absent.
pub async fn cancel(pool: &PgPool, id: Uuid) -> Result<Option<WorkflowState>> {
    let state: Option<Text<WorkflowState>> = sqlx::query_scalar("select sked.workflow_cancel($1)")
        .bind(id)
        .fetch_one(crate::on(pool))
        .await?;
    Ok(state.map(|s| s.0))
}

/// `sked.workflow_retry`: how many failed or cancelled tasks run again, or `None` when
/// absent.
pub async fn retry(pool: &PgPool, id: Uuid) -> Result<Option<i32>> {
    Ok(sqlx::query_scalar("select sked.workflow_retry($1)")
        .bind(id)
        .fetch_one(crate::on(pool))
        .await?)
}
