//! Stored workflow definitions (`sql/definitions.sql`, docs/workflows.md, "Stored
//! definitions"): define a version, read them, run one.

use serde_json::Value;
use sked_types::{DefineWorkflow, WorkflowDefinition};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use crate::Result;
use crate::workflow::spec_json;

/// A row of `sked.workflow_definitions`.
#[derive(Debug, Clone, sqlx::FromRow)]
struct DefinitionRow {
    id: Uuid,
    owner: String,
    name: String,
    version: i32,
    spec: Value,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl From<DefinitionRow> for WorkflowDefinition {
    fn from(r: DefinitionRow) -> Self {
        WorkflowDefinition {
            id: r.id,
            owner: r.owner,
            name: r.name,
            version: r.version,
            spec: r.spec,
            created_at: r.created_at,
        }
    }
}

/// Adds a version of a definition (`sked.workflow_define`) for `owner`, unless its spec is
/// the latest version's. Returns the version and whether it is new.
pub async fn define(
    db: &mut sqlx::PgConnection,
    d: &DefineWorkflow,
    owner: &str,
) -> Result<(WorkflowDefinition, bool)> {
    let spec = spec_json(&d.spec)?;
    let before: Option<i32> = sqlx::query_scalar(
        "select max(version) from sked.workflow_definitions where owner = $1 and name = $2",
    )
    .bind(owner)
    .bind(&d.name)
    .fetch_one(&mut *db)
    .await?;
    let version: i32 = sqlx::query_scalar("select sked.workflow_define($1, $2, $3)")
        .bind(&d.name)
        .bind(spec)
        .bind(owner)
        .fetch_one(&mut *db)
        .await?;
    let row: DefinitionRow = sqlx::query_as(
        "select * from sked.workflow_definitions where owner = $1 and name = $2 and version = $3",
    )
    .bind(owner)
    .bind(&d.name)
    .bind(version)
    .fetch_one(&mut *db)
    .await?;
    Ok((row.into(), before.is_none_or(|b| version > b)))
}

/// The latest version of each of an owner's definitions (every owner's when `None`), by
/// owner and name.
pub async fn latest(pool: &PgPool, owner: Option<&str>) -> Result<Vec<WorkflowDefinition>> {
    let rows: Vec<DefinitionRow> = sqlx::query_as(
        "select distinct on (owner, name) * from sked.workflow_definitions
          where $1::text is null or owner = $1
          order by owner, name, version desc",
    )
    .bind(owner)
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Every version of an owner's definition `name`, newest first (empty when there is none).
pub async fn versions(pool: &PgPool, owner: &str, name: &str) -> Result<Vec<WorkflowDefinition>> {
    let rows: Vec<DefinitionRow> = sqlx::query_as(
        "select * from sked.workflow_definitions where owner = $1 and name = $2
          order by version desc",
    )
    .bind(owner)
    .bind(name)
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Runs `version` (the latest when `None`) of `owner`'s definition `name` with `params` over
/// its own (`sked.workflow_run`); returns the workflow's id.
pub async fn run(
    db: impl PgExecutor<'_>,
    owner: &str,
    name: &str,
    version: Option<i32>,
    params: Option<&serde_json::Map<String, Value>>,
) -> Result<Uuid> {
    Ok(
        sqlx::query_scalar("select sked.workflow_run($1, $2, $3, $4)")
            .bind(name)
            .bind(version)
            .bind(params.map(|p| Value::Object(p.clone())))
            .bind(owner)
            .fetch_one(db)
            .await?,
    )
}
