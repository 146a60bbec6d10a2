//! The API's routes and its OpenAPI 3 document, from one declaration: [`api`] registers each
//! handler once with `routes!`, which gives axum its route and the document its operation
//! (from the handler's `#[utoipa::path]`). The document is served at
//! `GET /api/v1/openapi.json`.
//!
//! The errors every operation of a kind can meet are written once, as components the
//! operations refer to ([`CommonErrors`]): 401 for an operation that needs a token, 400 for
//! one with parameters or a body (what the extractors refuse), 413 for one with a body. The
//! links from what creates a task, workflow or schedule to the operations on it follow from
//! the paths ([`CREATES`]). What operations name alike in their `#[utoipa::path]` (the path
//! parameter of one resource, error answers worded the same everywhere, the quota's 429) is
//! declared once in `shared`.

use std::sync::LazyLock;

use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr, schema};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use sked_types::time_zones;

use crate::{
    AppState, alerts, bulk, definitions, queues, schedules, services, spawn, system, tasks,
    workflows,
};

mod shared;

pub(crate) use shared::{
    AdminOnly, BackfillId, DefinitionName, NoSuchBackfill, NoSuchDefinition, NoSuchSchedule,
    NoSuchService, NoSuchTask, NoSuchWorkflow, OwnerForbidden, QueueNamed, QueueRefusals,
    QuotaExceeded, ScheduleId, ServiceId, TaskId, WorkflowId,
};
use shared::{DEFINITION_NAME_PATTERN, error_response};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sked",
        description = "A task scheduler that uses PostgreSQL as its only moving part. Every \
                       endpoint but `health` and `openapi.json` needs `Authorization: Bearer \
                       <token>`; errors have the body `ApiError` with a stable `code`."
    ),
    components(schemas(
        sked_types::ApiError,
        sked_types::TaskState,
        sked_types::QueueName,
        tasks::ListView,
        tasks::Due
    ), responses(QuotaExceeded)),
    modifiers(&BearerAuth),
    tags(
        (name = "tasks", description = "Submit, list, follow, cancel, retry and resubmit tasks"),
        (name = "workflows", description = "Submit, list, read, cancel and re-run DAG workflows; keep workflow definitions by name and version and run them"),
        (name = "schedules", description = "Cron schedules: create, list, read, change, pause, resume, run now, backfill, delete; preview an expression"),
        (name = "services", description = "Long-running services: list, read with their copies, change (rolling update, scaling); stop by cancelling the task"),
        (name = "system", description = "The overview, workers, queues, the caller, health and this document"),
        (name = "queues", description = "Pause, resume, limit queues and set their retention (admin tokens); the cluster's retention"),
        (name = "alerts", description = "Alert targets: the webhooks that tasks' notifications are delivered to (admin tokens)"),
    )
)]
struct ApiDoc;

/// Every route of the API under `/api/v1` that has an OpenAPI operation, each declared once:
/// the route and its entry in the document both come from here.
pub(crate) fn api() -> OpenApiRouter<AppState> {
    // Batches and workflows may be larger than axum's default body limit (2 MiB).
    let large_bodies = || DefaultBodyLimit::max(crate::error::MAX_BATCH_BODY);
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(tasks::list, tasks::submit))
        .routes(routes!(tasks::count))
        .routes(routes!(tasks::submit_batch).layer(large_bodies()))
        .routes(routes!(bulk::retry))
        .routes(routes!(bulk::cancel))
        .routes(routes!(tasks::detail))
        .routes(routes!(tasks::logs))
        .routes(routes!(tasks::cancel))
        .routes(routes!(tasks::retry))
        .routes(routes!(tasks::resubmit))
        .routes(routes!(spawn::spawn))
        .routes(routes!(workflows::list, workflows::submit).layer(large_bodies()))
        .routes(routes!(workflows::detail))
        .routes(routes!(workflows::cancel))
        .routes(routes!(workflows::retry))
        .routes(routes!(definitions::list, definitions::define).layer(large_bodies()))
        .routes(routes!(definitions::versions))
        .routes(routes!(definitions::run))
        .routes(routes!(schedules::list, schedules::create))
        .routes(routes!(
            schedules::detail,
            schedules::update,
            schedules::delete
        ))
        .routes(routes!(schedules::pause))
        .routes(routes!(schedules::resume))
        .routes(routes!(schedules::run))
        .routes(routes!(schedules::backfills, schedules::start_backfill))
        .routes(routes!(schedules::backfill))
        .routes(routes!(schedules::cancel_backfill))
        .routes(routes!(schedules::preview))
        .routes(routes!(services::list))
        .routes(routes!(services::detail, services::update))
        .routes(routes!(system::overview))
        .routes(routes!(system::history))
        .routes(routes!(system::workers))
        .routes(routes!(system::queues))
        .routes(routes!(queues::update))
        .routes(routes!(queues::pause))
        .routes(routes!(queues::resume))
        .routes(routes!(queues::retention, queues::update_retention))
        .routes(routes!(system::me))
        .routes(routes!(system::health))
        .routes(routes!(system::metrics))
        .routes(routes!(alerts::list))
        .routes(routes!(alerts::set, alerts::delete))
        .routes(routes!(alerts::set_queue_notify))
        .routes(routes!(openapi_json))
}

/// The OpenAPI document of [`api`], with the version of this build, as JSON.
pub fn document() -> serde_json::Value {
    let (_, mut doc) = api().split_for_parts();
    CommonErrors.modify(&mut doc);
    NoNulInStrings.modify(&mut doc);
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let mut json = serde_json::to_value(doc).expect("the OpenAPI document serialises to JSON");
    created_links(&mut json);
    task_rules(&mut json["components"]["schemas"]);
    other_rules(&mut json);
    json
}

/// `schema` without its `null`: a `type` list loses it, a `oneOf` its null branch.
fn not_null(schema: &mut serde_json::Value) {
    if let Some(types) = schema["type"].as_array_mut() {
        types.retain(|t| t != "null");
    }
    if let Some(branches) = schema.get_mut("oneOf").and_then(|b| b.as_array_mut()) {
        branches.retain(|b| b.get("type").is_none_or(|t| t != "null"));
        if branches.len() == 1 {
            let only = branches.remove(0);
            *schema = only;
        }
    }
}

/// The first element of a command: the program, named.
static PROGRAM: LazyLock<serde_json::Value> =
    LazyLock::new(|| serde_json::json!({"type": "string", "minLength": 1, "pattern": NO_NUL}));

/// The cron expressions the document declares: a macro, or 5 fields (6 with seconds first) of
/// `*`, `*/step` or one value in the field's range. The parser (`sql/schedules.sql`) reads
/// more (lists, ranges, names); those are valid too, but not described here.
const CRON_PATTERN: &str = concat!(
    "^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|",
    "((\\*|[1-5]?[0-9])(/([1-9]|[1-5][0-9]))? )?",
    "(\\*|[1-5]?[0-9])(/([1-9]|[1-5][0-9]))? ",
    "(\\*|1?[0-9]|2[0-3])(/([1-9]|1[0-9]|2[0-3]))? ",
    "(\\*|[1-9]|1[0-9]|2[0-8]) ",
    "(\\*|[1-9]|1[0-2]) ",
    "(\\*|[0-7]))$"
);

/// The rules across fields of the other bodies, and what the schemas of free JSON values
/// (`serde_json::Value` fields) are.
fn other_rules(doc: &mut serde_json::Value) {
    use serde_json::json;
    let schemas = &mut doc["components"]["schemas"];
    bulk::schema_rules(schemas);
    let given = |field: &str, schema: serde_json::Value| json!({"required": [field], "properties": {field: schema}});
    // `check_changes`: a change names at least one key; `services_update_values_must_not_be_null`.
    schemas["UpdateService"]["minProperties"] = json!(1);
    for key in ["args", "env", "labels", "restart_policy", "replicas"] {
        not_null(&mut schemas["UpdateService"]["properties"][key]);
    }
    // `queues_burst_needs_a_rate`.
    schemas["QueueLimits"]["dependentSchemas"] = json!({"burst": {"if": given("burst", json!({"type": "integer"})),
                         "then": given("rate_per_sec", json!({"type": "number"}))}});
    // A notify's shape (`tasks_notify_must_be_an_object_of_event_lists`,
    // `schedules_notify_must_be_valid`, sql/alerts.sql): per event, at most 16 targets, each
    // an alert target's name or a follow-up task (checked as a submission when it is made).
    let targets = json!({"type": "array", "maxItems": 16, "items": {"oneOf": [
        {"type": "string", "pattern": sked_types::QUEUE_NAME_PATTERN},
        {"type": "object", "required": ["task"], "additionalProperties": false,
         "properties": {"task": {"type": "object", "propertyNames": {"pattern": NO_NUL},
                                 "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}}}},
    ]}});
    schemas["Notify"] = json!({
        "description": "Who is told when a task (or a workflow) succeeds, fails for good, or                         fails an attempt that will be retried: alert target names or                         {\"task\": {…}} follow-up tasks (see docs/operations.md)",
        "type": "object", "additionalProperties": false,
        "properties": {"on_success": targets, "on_failure": targets, "on_retry": targets},
    });
    schemas["ScheduleNotify"] = json!({
        "description": "Who is told when a schedule's ticks are missed, and when its                         occurrences fail failures_in_a_row times in a row (see docs/schedules.md)",
        "type": "object", "additionalProperties": false,
        "properties": {"on_missed": targets, "on_failure": targets,
                       "failures_in_a_row": {"type": "integer", "minimum": 1, "maximum": 1000}},
    });
    let notify = json!({"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/Notify"}]});
    for body in [
        "SubmitTask",
        "TaskTemplate",
        "WorkflowTask",
        "SubmitWorkflow",
        "QueueNotify",
        "SubWorkflow",
    ] {
        schemas[body]["properties"]["notify"] = notify.clone();
    }
    let notify =
        json!({"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/ScheduleNotify"}]});
    for body in ["CreateSchedule", "UpdateSchedule"] {
        schemas[body]["properties"]["notify"] = notify.clone();
    }
    // A schedule runs a task or a workflow (`schedules_run_a_task_or_a_workflow`); its
    // workflow is a workflow submission without an owner (the schedule's owns it).
    let mut template = schemas["SubmitWorkflow"].clone();
    if let Some(properties) = template["properties"].as_object_mut() {
        properties.remove("owner");
    }
    template["description"] = json!(
        "A schedule's workflow, or a stored definition's: a workflow submission without \
         `owner` (the schedule's or the definition's owner owns each occurrence)."
    );
    schemas["WorkflowTemplate"] = template;
    schemas["DefineWorkflow"]["properties"]["spec"] =
        json!({"$ref": "#/components/schemas/WorkflowTemplate"});
    let workflow =
        json!({"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/WorkflowTemplate"}]});
    for schedule in ["CreateSchedule", "UpdateSchedule"] {
        schemas[schedule]["properties"]["workflow"] = workflow.clone();
        schemas[schedule]["properties"]["cron"]["pattern"] = json!(CRON_PATTERN);
    }
    schemas["CreateSchedule"]["oneOf"] = json!([
        given("task", json!({"type": "object"})),
        given("workflow", json!({"type": "object"})),
    ]);
    schemas["UpdateSchedule"]["not"] = json!({"allOf": [
        given("task", json!({"type": "object"})),
        given("workflow", json!({"type": "object"})),
    ]});
    // A sub-workflow runs a workflow's tasks or a stored definition, exactly one; a version is
    // a definition's, a name and a notify go with tasks (`workflows_subworkflow_must_be_valid`).
    let sub = &mut schemas["SubWorkflow"];
    sub["oneOf"] = json!([
        given("tasks", json!({"type": "array"})),
        given("definition", json!({"type": "string"})),
    ]);
    sub["dependentSchemas"] = json!({
        "version": {"if": given("version", json!({"type": "integer"})),
                    "then": given("definition", json!({"type": "string"}))},
        "notify": {"if": given("notify", json!({"type": "object"})),
                   "then": given("tasks", json!({"type": "array"}))},
        "name": {"if": given("name", json!({"type": "string"})),
                 "then": given("tasks", json!({"type": "array"}))},
    });
    sub["properties"]["definition"]["pattern"] = json!(DEFINITION_NAME_PATTERN);
    // A spawn is a sub-workflow whose `name` names the new task (and an inline workflow), with
    // `wait` (`spawn::SpawnWorkflow`).
    let mut spawn = schemas["SubWorkflow"].clone();
    spawn["description"] = json!(
        "What a running task spawns: a sub-workflow (its tasks, or a stored definition of the \
         task's owner), `name` naming the new task, and `wait`"
    );
    if let Some(rules) = spawn["dependentSchemas"].as_object_mut() {
        rules.remove("name");
    }
    spawn["properties"]["name"] = json!({
        "type": ["string", "null"], "minLength": 1, "pattern": NO_NUL,
        "description": "The new task's name in the workflow (and, with `tasks`, the name of the \
                        workflow it runs); the spawning task's name and `.spawned` when absent",
    });
    spawn["properties"]["wait"] = json!({
        "type": ["boolean", "null"],
        "description": "Whether the spawning task's children wait for the new task too \
                        (default true)",
    });
    schemas["SpawnWorkflow"] = spawn;
    // The time zones the server takes (`sked_types::time_zones`).
    schemas["TimeZone"] = json!({
        "description": "A name of the IANA time zone database: a zone or a link to one",
        "type": "string",
        "enum": time_zones::TIME_ZONES,
    });
    let time_zone = json!({"$ref": "#/components/schemas/TimeZone"});
    for schedule in ["CreateSchedule", "UpdateSchedule"] {
        let property = &mut schemas[schedule]["properties"]["time_zone"];
        let description = property["description"].take();
        *property = json!({"oneOf": [{"type": "null"}, time_zone]});
        if !description.is_null() {
            property["description"] = description;
        }
    }
    // What `?wait=` reads (`awaits::parse_wait`).
    for path in ["/api/v1/tasks/{id}", "/api/v1/workflows/{id}"] {
        let parameters = doc["paths"][path]["get"]["parameters"]
            .as_array_mut()
            .into_iter()
            .flatten();
        for parameter in parameters.filter(|p| p["name"] == "wait") {
            parameter["schema"]["pattern"] = json!(crate::awaits::WAIT_PATTERN);
        }
    }
    let preview = doc["paths"]["/api/v1/cron/preview"]["get"]["parameters"]
        .as_array_mut()
        .into_iter()
        .flatten();
    for parameter in preview {
        match parameter["name"].as_str() {
            Some("cron") => parameter["schema"]["pattern"] = json!(CRON_PATTERN),
            Some("time_zone") => parameter["schema"] = time_zone.clone(),
            _ => {}
        }
    }
}

/// The rules of a task submission across its fields, as the table's constraints enforce them
/// (`tasks_command_and_artifact_are_exclusive`, `tasks_artifact_requires_sha256`,
/// `tasks_command_or_artifact_is_required`, `tasks_*_are_only_for_services`,
/// `tasks_services_are_not_preemptible`, `tasks_shards_and_broadcast_are_exclusive`,
/// `services_are_not_broadcast`, `services_have_no_timeout`, a service's `shards` within the
/// range of its `replicas`), and the
/// schemas made from `SubmitTask`: a workflow's task (its fields plus `name`, `depends_on` and
/// `trigger_rule`) and a schedule's task template (its fields but `owner`, `run_at` and
/// `delay_secs`, which the schedule sets).
fn task_rules(schemas: &mut serde_json::Value) {
    use serde_json::json;
    use sked_types::TaskKind;
    let builtins: Vec<&str> = TaskKind::ALL
        .into_iter()
        .filter(|k| k.is_builtin())
        .map(TaskKind::as_str)
        .collect();
    let service = TaskKind::Service.as_str();
    // A submission names every kind but `webhook`, which sked inserts itself
    // (`tasks_webhook_kind_is_for_alerts_only`); the templates made from SubmitTask below
    // inherit this.
    let kind = &mut schemas["SubmitTask"]["properties"]["kind"];
    let description = kind["oneOf"][1]["description"].take();
    *kind = json!({"oneOf": [
        {"type": "null"},
        {"type": "string", "enum": TaskKind::SUBMITTED.map(TaskKind::as_str), "description": description},
    ]});
    let given = |field: &str, schema: serde_json::Value| json!({"required": [field], "properties": {field: schema}});
    for body in ["SubmitTask", "UpdateService"] {
        let properties = &mut schemas[body]["properties"];
        // `tasks_env_must_be_an_object_of_strings`: names are not empty and hold no `=`.
        properties["env"]["propertyNames"] = json!({"pattern": "^[^=\\x00]+$"});
        // `tasks_command_must_not_be_empty`: the program is named.
        properties["command"]["prefixItems"] = json!([PROGRAM.clone()]);
    }
    // Free JSON (a task's `input`, a health check) is stored as jsonb, which holds no U+0000.
    schemas["JsonValue"] = json!({
        "description": "Any JSON value whose strings and keys hold no U+0000",
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            {"type": "string", "pattern": NO_NUL},
            {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
            {"type": "object", "propertyNames": {"pattern": NO_NUL},
             "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}},
        ],
    });
    // A workflow's parameters: names that are identifiers
    // (`workflows_param_names_must_be_identifiers`), values stored as jsonb.
    let params = json!({"type": "object", "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                        "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}});
    schemas["SubmitWorkflow"]["properties"]["params"] =
        json!({"oneOf": [{"type": "null"}, params.clone()]});
    // A run's parameters, over its definition's own; a sub-workflow's (and a spawn's), as either.
    schemas["RunWorkflowDefinition"]["properties"]["params"] =
        json!({"oneOf": [{"type": "null"}, params.clone()]});
    schemas["SubWorkflow"]["properties"]["params"] = json!({"oneOf": [{"type": "null"}, params]});
    for body in ["SubmitTask", "UpdateService"] {
        let properties = &mut schemas[body]["properties"];
        // Any JSON value, null (no input) included: not a `oneOf` with null, which null
        // would match twice.
        properties["input"] = json!({"$ref": "#/components/schemas/JsonValue"});
        properties["health_check"] = json!({"oneOf": [
            {"type": "null"},
            {"$ref": "#/components/schemas/HealthCheck"},
        ]});
    }
    // `services_health_check_must_be_valid` (`sked.service_health_check_problem`).
    schemas["HealthCheck"] = json!({
        "description": "A service's health check: a command or an HTTP GET (exactly one), how \
                        often it runs and how long it may take, and how many failures in a \
                        row make a copy unhealthy (see docs/services.md)",
        "type": "object",
        "properties": {
            "command": {"type": "array", "minItems": 1,
                        "items": {"type": "string", "pattern": NO_NUL},
                        "prefixItems": [PROGRAM.clone()]},
            "http": {"type": "string", "pattern": "^http://[^/\\s\\x00]+(/[^\\s\\x00]*)?$"},
            "interval_secs": {"type": "number", "minimum": 0.1, "maximum": 3600},
            "timeout_secs": {"type": "number", "minimum": 0.1, "maximum": 3600},
            "failures": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        "additionalProperties": false,
        "oneOf": [{"required": ["command"]}, {"required": ["http"]}],
    });
    let submit = &mut schemas["SubmitTask"];
    submit["allOf"] = json!([
        {"not": {"allOf": [
            given("command", json!({"type": "array"})),
            given("artifact_url", json!({"type": "string"})),
        ]}},
        {"if": given("artifact_url", json!({"type": "string"})),
         "then": given("artifact_sha256", json!({"type": "string"}))},
        {"if": {"not": given("kind", json!({"enum": builtins}))},
         "then": {"anyOf": [
             given("command", json!({"type": "array"})),
             given("artifact_url", json!({"type": "string"})),
         ]}},
        {"if": {"not": given("kind", json!({"const": service}))},
         "then": {"properties": {
             "replicas": {"type": "null"},
             "restart_policy": {"type": "null"},
             "health_check": {"type": "null"},
         }}},
        {"not": {"allOf": [
            given("kind", json!({"const": service})),
            given("preemptible", json!({"const": true})),
        ]}},
        {"if": given("kind", json!({"const": "service"})),
         "then": {"properties": {
             "broadcast": {"not": {"const": true}},
             "timeout_secs": {"type": "null"},
             // A service's shards are its copies: `shards` stands for `replicas`.
             "shards": {"maximum": 1000},
         }}},
        {"not": {"allOf": [
            given("shards", json!({"type": "integer"})),
            given("broadcast", json!({"const": true})),
        ]}},
    ]);
    let submit = submit.clone();

    // The fields only a service has (`replicas`, `restart_policy`, `health_check`): neither a
    // schedule's task template (`sked.schedule_check_template`) nor a workflow's task
    // (`sked.workflow_submit`) takes them.
    const OF_A_SERVICE: [&str; 3] = ["replicas", "restart_policy", "health_check"];
    let mut template = submit.clone();
    if let Some(properties) = template["properties"].as_object_mut() {
        for set_by_schedule in ["owner", "run_at", "delay_secs"] {
            properties.remove(set_by_schedule);
        }
        for key in OF_A_SERVICE {
            properties.remove(key);
        }
    }
    template["description"] = json!(
        "A schedule's task: the fields of a task submission but `owner`, `run_at` and \
         `delay_secs`, which the schedule sets for each occurrence, and the fields of a \
         service (`replicas`, `restart_policy`, `health_check`)."
    );
    schemas["TaskTemplate"] = template;
    for schedule in ["CreateSchedule", "UpdateSchedule"] {
        let task = &mut schemas[schedule]["properties"]["task"];
        *task = serde_json::from_str(&task.to_string().replace(
            "#/components/schemas/SubmitTask",
            "#/components/schemas/TaskTemplate",
        ))
        .expect("a schema stays JSON");
    }

    // `#[serde(flatten)]` gives `allOf: [SubmitTask, {name, ...}]`, which no object can
    // match since SubmitTask allows no other field: the workflow's task is SubmitTask's
    // fields and its own, in one object.
    let own = schemas["WorkflowTask"]["allOf"][1].clone();
    let mut workflow_task = submit;
    if let (Some(properties), Some(extra)) = (
        workflow_task["properties"].as_object_mut(),
        own["properties"].as_object(),
    ) {
        properties.extend(extra.clone());
    }
    // Not a service (`services_are_not_workflow_tasks`: it never finishes, so its children
    // would never run), so not a service's fields; and no idempotency key, which
    // `sked.workflow_submit` does not take (`workflows_task_keys_must_be_known`).
    if let Some(properties) = workflow_task["properties"].as_object_mut() {
        for key in OF_A_SERVICE.into_iter().chain(["idempotency_key"]) {
            properties.remove(key);
        }
    }
    let description = workflow_task["properties"]["kind"]["oneOf"][1]["description"].take();
    workflow_task["properties"]["kind"] = json!({"oneOf": [
        {"type": "null"},
        {"type": "string", "enum": ["command", "noop", "sleep"], "description": description},
    ]});
    workflow_task["required"] = own["required"].clone();
    workflow_task["description"] = schemas["WorkflowTask"]["description"].clone();
    schemas["WorkflowTask"] = workflow_task;
}

/// The operations that create one of what their path lists, and where their answer holds
/// its id: their 201 links to every operation on `{path}/{id}`, so that what was created can
/// be followed (Schemathesis reads, changes and deletes it).
const CREATES: &[(&str, &str)] = &[
    ("/api/v1/tasks", "$response.body#/ids/0"),
    ("/api/v1/workflows", "$response.body#/id"),
    ("/api/v1/schedules", "$response.body#/id"),
];

/// The links of [`CREATES`], each named by the operation it leads to.
fn created_links(doc: &mut serde_json::Value) {
    for (path, id) in CREATES {
        let one = format!("{path}/{{id}}");
        let links: serde_json::Map<String, serde_json::Value> = doc["paths"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(other, _)| **other == one || other.starts_with(&format!("{one}/")))
            .filter_map(|(_, item)| item.as_object())
            .flat_map(|item| item.values())
            .filter_map(|operation| operation["operationId"].as_str())
            .map(|operation| {
                let link = serde_json::json!({"operationId": operation, "parameters": {"id": id}});
                (operation.to_owned(), link)
            })
            .collect();
        doc["paths"][path]["post"]["responses"]["201"]["links"] = links.into();
    }
}

/// Declares the `bearer` security scheme the paths refer to.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token; only its SHA-256 is stored, in `sked.api_tokens`",
                    ))
                    .build(),
            ),
        );
    }
}

/// The errors of the extractors and the token check, declared once as response components
/// and referred to from every operation that can meet them (unless the operation describes
/// that status itself).
struct CommonErrors;

/// Every operation of the document.
fn operations_mut(openapi: &mut utoipa::openapi::OpenApi) -> impl Iterator<Item = &mut Operation> {
    openapi.paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
    })
}

/// The shared responses: (component name, status, description, applies to the operation).
type Rule = (
    &'static str,
    &'static str,
    &'static str,
    fn(&Operation) -> bool,
);

const COMMON_ERRORS: &[Rule] = &[
    (
        "TaskTokenForbidden",
        "403",
        "`forbidden`: a task token (the `SKED_TOKEN` of a running task), which may only spawn \
         into its own task's workflow (`POST /api/v1/tasks/{id}/spawn`)",
        |op| op.security.as_ref().is_some_and(|s| !s.is_empty()),
    ),
    (
        "InvalidRequest",
        "400",
        "`invalid_request`: a path segment, query parameter or body that does not read as \
         declared (malformed JSON, an unknown field, a wrong type, a value out of its range); \
         the message says which",
        |op| op.parameters.as_ref().is_some_and(|p| !p.is_empty()) || op.request_body.is_some(),
    ),
    (
        "Unauthorized",
        "401",
        "`unauthorized`: no token, a malformed `Authorization` header, or an unknown, revoked \
         or expired token",
        |op| op.security.as_ref().is_some_and(|s| !s.is_empty()),
    ),
    (
        "BodyTooLarge",
        "413",
        "`too_large`: the body is larger than the server reads (2 MiB; 32 MiB for batches and \
         workflows)",
        |op| op.request_body.is_some(),
    ),
];

impl Modify for CommonErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for operation in operations_mut(openapi) {
            for (name, status, _, applies) in COMMON_ERRORS {
                if applies(operation) {
                    operation
                        .responses
                        .responses
                        .entry((*status).to_owned())
                        .or_insert_with(|| RefOr::Ref(Ref::from_response_name(*name)));
                }
            }
        }
        let components = openapi.components.get_or_insert_with(Default::default);
        for (name, status, description, _) in COMMON_ERRORS {
            components.responses.insert(
                (*name).to_owned(),
                RefOr::T(error_response(status, description)),
            );
        }
    }
}

/// PostgreSQL's text cannot hold U+0000, so no string the API takes may contain it (a request
/// holding one is refused with 400): every free string of the document, in parameters and in
/// schemas, says so with a pattern. Strings that have a format, an enumeration or a pattern
/// of their own are left as they are.
struct NoNulInStrings;

/// Any text without U+0000.
const NO_NUL: &str = "^[^\\x00]*$";

impl Modify for NoNulInStrings {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for operation in operations_mut(openapi) {
            for parameter in operation.parameters.iter_mut().flatten() {
                if let Some(schema) = &mut parameter.schema {
                    no_nul(schema);
                }
            }
            for content in operation
                .request_body
                .iter_mut()
                .flat_map(|b| b.content.values_mut())
            {
                if let Some(schema) = &mut content.schema {
                    no_nul(schema);
                }
            }
        }
        for schema in openapi
            .components
            .iter_mut()
            .flat_map(|c| c.schemas.values_mut())
        {
            no_nul(schema);
        }
    }
}

/// Adds [`NO_NUL`] to the free strings of `schema`, at any depth.
fn no_nul(schema: &mut RefOr<schema::Schema>) {
    let RefOr::T(schema) = schema else { return };
    match schema {
        schema::Schema::Object(object) => {
            let is_string = match &object.schema_type {
                schema::SchemaType::Type(t) => *t == schema::Type::String,
                schema::SchemaType::Array(types) => types.contains(&schema::Type::String),
                schema::SchemaType::AnyValue => false,
            };
            if is_string
                && object.format.is_none()
                && object.enum_values.is_none()
                && object.pattern.is_none()
            {
                object.pattern = Some(NO_NUL.to_owned());
            }
            object.properties.values_mut().for_each(no_nul);
            if let Some(additional) = &mut object.additional_properties
                && let schema::AdditionalProperties::RefOr(additional) = additional.as_mut()
            {
                no_nul(additional);
            }
        }
        schema::Schema::Array(array) => {
            if let schema::ArrayItems::RefOrSchema(items) = &mut array.items {
                no_nul(items);
            }
        }
        schema::Schema::OneOf(one_of) => one_of.items.iter_mut().for_each(no_nul),
        schema::Schema::AllOf(all_of) => all_of.items.iter_mut().for_each(no_nul),
        schema::Schema::AnyOf(any_of) => any_of.items.iter_mut().for_each(no_nul),
        _ => {}
    }
}

/// The document, serialised once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    serde_json::to_string_pretty(&document()).expect("the OpenAPI document serialises to JSON")
});

/// This OpenAPI document; needs no token.
#[utoipa::path(
    get, path = "/api/v1/openapi.json", operation_id = "get_openapi", tag = "system",
    responses((status = 200, description = "The OpenAPI 3 document of this API", content_type = "application/json")),
)]
pub async fn openapi_json() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn doc() -> Value {
        document()
    }

    /// The `minimum` and `maximum` the document declares for a query parameter.
    fn range(doc: &Value, path: &str, name: &str) -> (i64, i64) {
        let parameters = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let schema = &parameters
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{path} declares {name}"))["schema"];
        (
            schema["minimum"].as_i64().unwrap(),
            schema["maximum"].as_i64().unwrap(),
        )
    }

    #[test]
    fn declared_ranges_are_the_enforced_ones() {
        let doc = doc();
        assert_eq!(range(&doc, "/api/v1/tasks", "limit"), (1, tasks::MAX_PAGE));
        assert_eq!(
            range(&doc, "/api/v1/workflows", "limit"),
            (1, tasks::MAX_PAGE)
        );
        assert_eq!(
            range(&doc, "/api/v1/tasks/{id}/logs", "limit"),
            (1, tasks::MAX_LOG_CHUNKS)
        );
        assert_eq!(
            range(&doc, "/api/v1/cron/preview", "n"),
            (1, i64::from(schedules::MAX_PREVIEW))
        );
    }

    /// Every `$ref` of `value`, at any depth.
    fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    found.push(target);
                }
                map.values().for_each(|v| refs(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves() {
        let doc = doc();
        let mut found = Vec::new();
        refs(&doc, &mut found);
        assert!(found.len() > 100, "the document refers to its components");
        for target in found {
            let pointer = target
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("{target} is a reference inside the document"));
            assert!(
                doc.pointer(pointer).is_some(),
                "{target} names a component of the document"
            );
        }
    }

    #[test]
    fn the_common_errors_are_declared_once_and_referred_to() {
        let doc = doc();
        let get_task = &doc["paths"]["/api/v1/tasks/{id}"]["get"]["responses"];
        assert_eq!(
            get_task["400"]["$ref"], "#/components/responses/InvalidRequest",
            "a path parameter can be refused: {get_task}"
        );
        assert_eq!(
            get_task["401"]["$ref"],
            "#/components/responses/Unauthorized"
        );
        assert!(get_task.get("413").is_none(), "no body, no 413: {get_task}");
        let submit = &doc["paths"]["/api/v1/queues/{name}"]["patch"]["responses"];
        assert_eq!(submit["413"]["$ref"], "#/components/responses/BodyTooLarge");
        let health = &doc["paths"]["/api/v1/health"]["get"]["responses"];
        assert!(
            health.get("400").is_none() && health.get("401").is_none(),
            "health takes no token and no input: {health}"
        );
        let me = &doc["paths"]["/api/v1/me"]["get"]["responses"];
        assert!(me.get("400").is_none(), "me takes no input: {me}");
        assert_eq!(
            doc["components"]["responses"]["Unauthorized"]["headers"]["WWW-Authenticate"]["schema"]
                ["type"],
            "string"
        );
    }

    #[test]
    fn the_state_filter_names_every_state() {
        let doc = doc();
        let parameters = doc["paths"]["/api/v1/tasks"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let pattern =
            parameters.iter().find(|p| p["name"] == "state").unwrap()["schema"]["pattern"]
                .as_str()
                .unwrap();
        for state in sked_types::TaskState::ALL {
            assert_eq!(
                pattern.matches(&format!("|{}|", state.as_str())).count()
                    + pattern.matches(&format!("({}|", state.as_str())).count()
                    + pattern.matches(&format!("|{})", state.as_str())).count(),
                2,
                "both alternations of {pattern} name {state}"
            );
        }
    }

    #[test]
    fn waits_are_declared_with_the_pattern_the_server_reads() {
        let doc = document();
        for path in ["/api/v1/tasks/{id}", "/api/v1/workflows/{id}"] {
            let parameters = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
            let wait = parameters.iter().find(|p| p["name"] == "wait").unwrap();
            assert_eq!(
                wait["schema"]["pattern"],
                crate::awaits::WAIT_PATTERN,
                "{path}"
            );
        }
    }

    #[test]
    fn links_name_their_operation_in_camel_case() {
        let doc = doc();
        let links = &doc["paths"]["/api/v1/tasks"]["post"]["responses"]["201"]["links"];
        assert_eq!(links["get_task"]["operationId"], "get_task", "{links}");
        assert_eq!(
            links["get_task"]["parameters"]["id"],
            "$response.body#/ids/0"
        );
        assert!(links["get_task"].get("operation_id").is_none(), "{links}");
    }

    #[test]
    fn the_quota_answer_is_declared_once_and_referred_to_by_what_creates_rows() {
        let doc = doc();
        let quota = &doc["components"]["responses"]["QuotaExceeded"];
        assert_eq!(
            quota["headers"]["Retry-After"]["schema"]["type"], "integer",
            "{quota}"
        );
        let mut referring: Vec<&str> = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
            .filter(|operation| operation["responses"].get("429").is_some())
            .map(|operation| {
                assert_eq!(
                    operation["responses"]["429"]["$ref"], "#/components/responses/QuotaExceeded",
                    "{operation}"
                );
                operation["operationId"].as_str().unwrap()
            })
            .collect();
        referring.sort_unstable();
        assert_eq!(
            referring,
            [
                "resubmit_task",
                "run_schedule",
                "run_workflow_definition",
                "spawn_task",
                "submit_task",
                "submit_task_batch",
                "submit_workflow",
                "update_service"
            ]
        );
    }

    #[test]
    fn the_time_zones_declared_are_the_ones_the_server_takes() {
        let doc = doc();
        let listed: Vec<&str> = doc["components"]["schemas"]["TimeZone"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|name| name.as_str().unwrap())
            .collect();
        assert_eq!(listed, time_zones::TIME_ZONES);
        let zone = json!({"$ref": "#/components/schemas/TimeZone"});
        for schedule in ["CreateSchedule", "UpdateSchedule"] {
            let property = &doc["components"]["schemas"][schedule]["properties"]["time_zone"];
            assert_eq!(property["oneOf"][1], zone, "{schedule}: {property}");
        }
        let preview = doc["paths"]["/api/v1/cron/preview"]["get"]["parameters"]
            .as_array()
            .unwrap();
        let parameter = preview.iter().find(|p| p["name"] == "time_zone").unwrap();
        assert_eq!(parameter["schema"], zone, "{parameter}");
    }

    /// Schemathesis follows links it infers from `workflow_id` fields, and would send `None`
    /// for one that is null: such an id is left out instead.
    #[test]
    fn ids_that_links_follow_are_left_out_rather_than_null() {
        let doc = doc();
        for (schema, field) in [
            ("Task", "workflow_id"),
            ("TaskSummary", "workflow_id"),
            ("RunNow", "task_id"),
            ("RunNow", "workflow_id"),
            ("ScheduleRun", "task_id"),
            ("ScheduleRun", "workflow_id"),
        ] {
            let schema = &doc["components"]["schemas"][schema];
            assert_eq!(schema["properties"][field]["type"], "string", "{schema}");
            let required = schema["required"].as_array().unwrap();
            assert!(!required.contains(&json!(field)), "{schema}");
        }
    }

    #[test]
    fn templates_and_workflow_tasks_declare_only_the_fields_they_take() {
        let doc = doc();
        let schemas = &doc["components"]["schemas"];
        let fields = |schema: &str| -> Vec<String> {
            schemas[schema]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        for key in ["replicas", "restart_policy", "health_check"] {
            assert!(schemas["SubmitTask"]["properties"].get(key).is_some());
            for schema in ["TaskTemplate", "WorkflowTask"] {
                assert!(!fields(schema).contains(&key.to_owned()), "{schema} {key}");
            }
        }
        assert!(!fields("WorkflowTask").contains(&"idempotency_key".to_owned()));
        for key in ["branch", "map_over", "map_max", "map_trigger_rule"] {
            assert!(fields("WorkflowTask").contains(&key.to_owned()), "{key}");
            assert!(!fields("SubmitTask").contains(&key.to_owned()), "{key}");
        }
        assert_eq!(
            schemas["WorkflowTask"]["properties"]["kind"]["oneOf"][1]["enum"],
            json!(["command", "noop", "sleep"])
        );
        assert_eq!(
            fields("WorkflowTemplate"),
            ["name", "notify", "params", "tasks"]
        );
        assert_eq!(
            schemas["SubmitTask"]["properties"]["kind"]["oneOf"][1]["enum"],
            json!(["command", "noop", "sleep", "service"]),
            "no submission names webhook"
        );
        assert_eq!(
            schemas["CreateSchedule"]["properties"]["workflow"]["oneOf"][1]["$ref"],
            "#/components/schemas/WorkflowTemplate"
        );
    }

    #[test]
    fn a_health_check_is_a_command_or_an_http_url() {
        let doc = doc();
        let check = &doc["components"]["schemas"]["HealthCheck"];
        assert_eq!(check["additionalProperties"], false, "{check}");
        assert_eq!(
            check["oneOf"],
            json!([{"required": ["command"]}, {"required": ["http"]}])
        );
        assert_eq!(
            check["properties"]["command"]["prefixItems"][0]["pattern"],
            NO_NUL
        );
        for body in ["SubmitTask", "UpdateService"] {
            assert_eq!(
                doc["components"]["schemas"][body]["properties"]["health_check"]["oneOf"][1]["$ref"],
                "#/components/schemas/HealthCheck",
                "{body}"
            );
        }
    }

    #[test]
    fn free_strings_exclude_nul() {
        let doc = doc();
        let submit = &doc["components"]["schemas"]["SubmitTask"]["properties"];
        assert_eq!(submit["command"]["items"]["pattern"], NO_NUL, "{submit}");
        assert_eq!(
            submit["command"]["prefixItems"][0]["pattern"], NO_NUL,
            "the program too: {submit}"
        );
        assert_eq!(
            submit["run_at"].get("pattern"),
            None,
            "a date-time has its format: {submit}"
        );
    }
}
