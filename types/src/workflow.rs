//! Wire types of DAG workflows (see `docs/workflows.md`).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

use crate::{SubmitTask, Task};

/// When a task with parents runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TriggerRule {
    /// Every parent succeeded (the default).
    #[default]
    AllSuccess,
    /// Every parent finished, however it ended.
    AllDone,
    /// Some parent failed (a clean-up or alert task); `on_failure` is an alias.
    #[serde(alias = "on_failure")]
    OneFailed,
    /// Every parent finished and none failed; skipped ones count as done (the join after a
    /// branch).
    NoneFailed,
}

/// The rule of a map across its instances (see `docs/workflows.md`, "Map").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MapTriggerRule {
    /// Every instance must succeed (the default); one that failed fails the map.
    #[default]
    AllSuccess,
    /// The map succeeds once every instance finished, however it ended (its output holds
    /// null for an instance that did not succeed).
    AllDone,
}

/// One task of a workflow: the keys of a task submission plus its name, the names of the
/// tasks it depends on, and its trigger rule. Unknown keys are rejected.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowTask {
    /// Unique within the workflow; children's outputs are keyed by it.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub name: String,
    /// Names of tasks of this workflow that must finish first (null: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(nullable = true))]
    pub depends_on: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger_rule: Option<TriggerRule>,
    /// Its output (`{"next": [names]}`) chooses which of the tasks that depend on it run; the
    /// others end `skipped` (see `docs/workflows.md`, "Branches").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub branch: bool,
    /// A map: the task runs once per element of the JSON array at `<parent>.<path>` of the
    /// output of `<parent>`, a task it depends on (`<parent>` alone: the output itself); the
    /// path is object keys separated by dots (see `docs/workflows.md`, "Map").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub map_over: Option<String>,
    /// A map's cap on its instances (default 10000): an array with more elements fails it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100000))]
    pub map_max: Option<i32>,
    /// A map's rule across its instances (default `all_success`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_trigger_rule: Option<MapTriggerRule>,
    /// A sub-workflow task: instead of a command, it runs this workflow and ends in its state
    /// (see `docs/workflows.md`, "Sub-workflows"); it then takes no other key than `name`,
    /// `depends_on` and `trigger_rule` (422 `workflows_subworkflow_task_takes_only_its_place`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<Box<SubWorkflow>>,
    #[serde(flatten)]
    pub task: SubmitTask,
}

/// What a sub-workflow task runs (see `docs/workflows.md`, "Sub-workflows"): a stored
/// workflow definition of its owner by name, or a workflow given by its tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubWorkflow {
    /// A stored workflow definition (`sked workflow define`), by name; else `tasks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub definition: Option<String>,
    /// The definition's version; the latest one when the task starts, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub version: Option<i32>,
    /// The workflow's name (inline only); the task's name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The workflow's tasks, given inline; else `definition`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(no_recursion))]
    pub tasks: Option<Vec<WorkflowTask>>,
    /// Who is told when it succeeds or fails (inline only), as a workflow's `notify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub notify: Option<serde_json::Value>,
    /// Its parameters (over a definition's own); a string value may use the parameters of the
    /// task's own workflow, `{{ params.NAME }}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<serde_json::Map<String, serde_json::Value>>,
}

impl<'de> Deserialize<'de> for WorkflowTask {
    /// `name`, `depends_on`, `trigger_rule`, `branch` and the map's keys are taken out and the
    /// rest must be a valid
    /// [`SubmitTask`] (whose unknown fields are rejected, which `#[serde(flatten)]` would not
    /// do).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut map = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        let name = match map.remove("name") {
            Some(serde_json::Value::String(name)) => name,
            Some(_) => return Err(D::Error::custom("a task's `name` must be a string")),
            None => return Err(D::Error::missing_field("name")),
        };
        let depends_on = match map.remove("depends_on") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(v) => serde_json::from_value(v).map_err(|e| {
                D::Error::custom(format!(
                    "task {name:?}: `depends_on` must be a list of task names ({e})"
                ))
            })?,
        };
        let trigger_rule = match map.remove("trigger_rule") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(
                serde_json::from_value(v)
                    .map_err(|e| D::Error::custom(format!("task {name:?}: {e}")))?,
            ),
        };
        let branch = match map.remove("branch") {
            None => false,
            Some(serde_json::Value::Bool(branch)) => branch,
            Some(_) => {
                return Err(D::Error::custom(format!(
                    "task {name:?}: `branch` must be true or false"
                )));
            }
        };
        let map_over = match map.remove("map_over") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(over)) => Some(over),
            Some(_) => {
                return Err(D::Error::custom(format!(
                    "task {name:?}: `map_over` must be a string, \"<task>\" or \"<task>.<key>...\""
                )));
            }
        };
        let map_max = match map.remove("map_max") {
            None | Some(serde_json::Value::Null) => None,
            // As every integer of a request: a float without a fraction is the integer.
            Some(v) => Some(crate::strict::from_value(v).map_err(|e| {
                D::Error::custom(format!(
                    "task {name:?}: `map_max` must be a whole number ({e})"
                ))
            })?),
        };
        let map_trigger_rule = match map.remove("map_trigger_rule") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(
                serde_json::from_value(v)
                    .map_err(|e| D::Error::custom(format!("task {name:?}: {e}")))?,
            ),
        };
        let workflow = match map.remove("workflow") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(Box::new(crate::strict::from_value(v).map_err(|e| {
                D::Error::custom(format!("task {name:?}: `workflow`: {e}"))
            })?)),
        };
        let task = crate::strict::from_value(serde_json::Value::Object(map))
            .map_err(|e| D::Error::custom(format!("task {name:?}: {e}")))?;
        Ok(WorkflowTask {
            name,
            depends_on,
            trigger_rule,
            branch,
            map_over,
            map_max,
            map_trigger_rule,
            workflow,
            task,
        })
    }
}

/// A request to submit a workflow: its tasks and the edges between them, all or nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubmitWorkflow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 50000))]
    pub tasks: Vec<WorkflowTask>,
    /// Admins may submit on behalf of another owner; every task belongs to the workflow's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub owner: Option<String>,
    /// Who is told when the workflow succeeds or fails: `{"on_success" | "on_failure":
    /// [TARGET, …]}`, as a task's `notify` (`docs/operations.md`, "Alerts").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub notify: Option<serde_json::Value>,
    /// Parameters, by name: each task gets them as JSON in `SKED_PARAMS`, and a placeholder
    /// `{{ params.NAME }}` in its `command` or `args` is replaced by the value (see
    /// `docs/workflows.md`, "Parameters").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The answer to a workflow submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowSubmitted {
    pub id: Uuid,
}

/// The aggregate state of a workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    /// Some task is not finished.
    Running,
    /// Every task finished and none failed, was cancelled or could not run.
    Succeeded,
    /// Every task finished and some failed or could not run (`upstream_failed`).
    Failed,
    /// Every task finished and some were cancelled.
    Cancelled,
}

impl WorkflowState {
    pub const ALL: [WorkflowState; 4] = [
        WorkflowState::Running,
        WorkflowState::Succeeded,
        WorkflowState::Failed,
        WorkflowState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Running => "running",
            WorkflowState::Succeeded => "succeeded",
            WorkflowState::Failed => "failed",
            WorkflowState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for WorkflowState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkflowState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkflowState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown workflow state {s:?} (expected running, succeeded, failed or cancelled)"
                )
            })
    }
}

/// A workflow as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Workflow {
    pub id: Uuid,
    pub owner: String,
    pub name: String,
    pub state: WorkflowState,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The parameters it was submitted with; left out when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<serde_json::Value>,
    /// The stored definition and version it was run from; left out when it was submitted as
    /// a spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub definition: Option<DefinitionVersion>,
    /// A sub-workflow: the task (of kind `workflow`) that runs it, in the workflow above;
    /// left out for a workflow submitted on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub parent: Option<ParentTask>,
}

/// The task that runs a sub-workflow, and the workflow that task belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ParentTask {
    pub task: Uuid,
    pub workflow: Uuid,
}

/// The latest sub-workflow of a sub-workflow task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubWorkflowRun {
    /// The task of kind `workflow`.
    pub task: Uuid,
    /// Its latest sub-workflow.
    pub workflow: Uuid,
    pub state: WorkflowState,
}

/// A version of a stored workflow definition, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DefinitionVersion {
    pub name: String,
    pub version: i32,
}

/// A body of `POST /api/v1/workflow-definitions`: a workflow spec to keep under a name. It is
/// checked as a submission of it would be; a spec that differs from the latest version's
/// becomes the next version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DefineWorkflow {
    /// A letter or digit, then up to 127 letters, digits, `_`, `.` and `-`.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    )]
    pub name: String,
    /// The workflow, as `POST /api/v1/workflows` takes it, without `owner`; its `params` are
    /// the defaults a run's parameters go over.
    pub spec: SubmitWorkflow,
    /// The definition's owner (admin tokens only); the token's owner by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// One version of a stored workflow definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowDefinition {
    pub id: Uuid,
    pub owner: String,
    pub name: String,
    /// 1 for the first version, one more for each spec that differed from the latest.
    pub version: i32,
    /// The spec as `sked.workflow_submit` takes it (durations as Postgres intervals).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub spec: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// Stored workflow definitions: the latest version of each name, or every version of one
/// name, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowDefinitionPage {
    pub definitions: Vec<WorkflowDefinition>,
}

/// A body of `POST /api/v1/workflow-definitions/{name}/runs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RunWorkflowDefinition {
    /// The version to run; the latest when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub version: Option<i32>,
    /// Parameters over the definition's own (`{{ params.NAME }}`, `SKED_PARAMS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub params: Option<serde_json::Map<String, serde_json::Value>>,
    /// The owner of the definition to run, who owns the workflow (admin tokens only); the
    /// token's owner by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// An edge of a workflow: `task` runs after `depends_on`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowEdge {
    pub task: Uuid,
    pub depends_on: Uuid,
}

/// A workflow with its tasks (in submission order) and edges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowDetail {
    #[serde(flatten)]
    pub workflow: Workflow,
    pub tasks: Vec<Task>,
    pub edges: Vec<WorkflowEdge>,
    /// The latest sub-workflow of each of its sub-workflow tasks that started one.
    #[serde(default)]
    pub subworkflows: Vec<SubWorkflowRun>,
}

/// A page of workflows, newest first. Pass `next_cursor` as `after` to get the next page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowPage {
    pub workflows: Vec<Workflow>,
    pub next_cursor: Option<Uuid>,
}

/// The answer to a workflow cancel or retry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowChange {
    pub id: Uuid,
    /// The workflow's state after the call (`running` while cancelled tasks are being
    /// stopped, or after a retry).
    pub state: WorkflowState,
    /// Failed or cancelled tasks that run again (retry only).
    #[serde(default)]
    pub tasks_rerun: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_tasks_reject_unknown_keys_and_take_the_alias() {
        let task: WorkflowTask = serde_json::from_value(serde_json::json!({
            "name": "clean", "depends_on": ["a"], "trigger_rule": "on_failure",
            "command": ["true"], "timeout_secs": 5.0
        }))
        .unwrap();
        assert_eq!(task.trigger_rule, Some(TriggerRule::OneFailed));
        assert_eq!(task.depends_on, vec!["a".to_owned()]);
        assert_eq!(task.task.timeout_secs, Some(5.0));
        let err = serde_json::from_value::<WorkflowTask>(serde_json::json!({
            "name": "a", "depend_on": ["b"], "command": ["true"]
        }))
        .unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
        assert!(
            serde_json::from_value::<WorkflowTask>(serde_json::json!({"command": ["true"]}))
                .is_err()
        );
    }

    #[test]
    fn a_map_names_what_it_maps_over_its_cap_and_its_rule() {
        let task: WorkflowTask = serde_json::from_value(serde_json::json!({
            "name": "m", "depends_on": ["extract"], "map_over": "extract.rows", "map_max": 50,
            "map_trigger_rule": "all_done", "command": ["true"]
        }))
        .unwrap();
        assert_eq!(task.map_over.as_deref(), Some("extract.rows"));
        assert_eq!(task.map_max, Some(50));
        assert_eq!(task.map_trigger_rule, Some(MapTriggerRule::AllDone));
        let whole: WorkflowTask = serde_json::from_value(serde_json::json!({
            "name": "m", "depends_on": ["extract"], "map_over": "extract", "map_max": 219.0,
            "command": ["true"]
        }))
        .expect("a float without a fraction is the integer, as JSON Schema reads it");
        assert_eq!(whole.map_max, Some(219));
        let written = serde_json::to_value(&task).unwrap();
        assert_eq!(written["map_trigger_rule"], "all_done");
        let plain: WorkflowTask =
            serde_json::from_value(serde_json::json!({"name": "p", "command": ["true"]})).unwrap();
        let written = serde_json::to_value(&plain).unwrap();
        assert!(written.get("map_over").is_none() && written.get("map_max").is_none());
        for (bad, says) in [
            (
                serde_json::json!({"map_over": 1}),
                "`map_over` must be a string",
            ),
            (
                serde_json::json!({"map_max": "x"}),
                "`map_max` must be a whole number",
            ),
            (
                serde_json::json!({"map_trigger_rule": "one_failed"}),
                "unknown variant",
            ),
        ] {
            let mut spec = serde_json::json!({"name": "m", "command": ["true"]});
            spec.as_object_mut()
                .unwrap()
                .extend(bad.as_object().unwrap().clone());
            let err = serde_json::from_value::<WorkflowTask>(spec).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn a_branch_is_a_boolean_and_none_failed_a_rule() {
        let task: WorkflowTask = serde_json::from_value(serde_json::json!({
            "name": "decide", "branch": true, "trigger_rule": "none_failed", "command": ["true"]
        }))
        .unwrap();
        assert!(task.branch);
        assert_eq!(task.trigger_rule, Some(TriggerRule::NoneFailed));
        let plain: WorkflowTask =
            serde_json::from_value(serde_json::json!({"name": "a", "command": ["true"]})).unwrap();
        assert!(!plain.branch);
        assert!(
            !serde_json::to_value(&plain)
                .unwrap()
                .as_object()
                .unwrap()
                .contains_key("branch"),
            "a task that is no branch is written without the key"
        );
        let err = serde_json::from_value::<WorkflowTask>(serde_json::json!({
            "name": "decide", "branch": "yes", "command": ["true"]
        }))
        .unwrap_err();
        assert!(
            err.to_string().contains("`branch` must be true or false"),
            "{err}"
        );
    }
}
