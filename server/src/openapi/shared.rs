//! What the operations of the document declare alike, declared once: the path parameter that
//! names one task, workflow, schedule, service or queue (`params(TaskId)`), the error answers
//! worded the same wherever they occur (`responses(…, NoSuchTask)`), both written into each
//! operation that names them as if it spelled them out, and the 429 `quota_exceeded` that
//! operations refer to as a response component.

use std::collections::BTreeMap;

use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, Ref, RefOr, Required, Response, ResponseBuilder, schema,
};
use utoipa::{IntoParams, IntoResponses, PartialSchema, ToResponse};

/// Declares path parameters: each a type to name in `params(…)` of `#[utoipa::path]`, for one
/// required parameter of the path with its schema and description.
macro_rules! path_parameters {
    ($($(#[$meta:meta])* $type:ident: $name:literal = $schema:expr, $description:literal;)*) => {$(
        $(#[$meta])*
        pub(crate) struct $type;

        impl IntoParams for $type {
            fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
                vec![
                    ParameterBuilder::new()
                        .name($name)
                        .parameter_in(ParameterIn::Path)
                        .required(Required::True)
                        .description(Some($description))
                        .schema(Some($schema))
                        .build(),
                ]
            }
        }
    )*};
}

path_parameters! {
    /// `{id}` of the operations on one task.
    TaskId: "id" = uuid(), "Task id";
    /// `{id}` of the operations on one workflow.
    WorkflowId: "id" = uuid(), "Workflow id";
    /// `{id}` of the operations on one schedule.
    ScheduleId: "id" = uuid(), "Schedule id";
    /// `{name}` of the operations on one stored workflow definition.
    DefinitionName: "name" = definition_name(), "Workflow definition name";
    /// `{id}` of the operations on one backfill of a schedule.
    BackfillId: "id" = uuid(), "Backfill id";
    /// `{id}` of the operations on one service: the id of the task that is the service.
    ServiceId: "id" = uuid(), "The service's task id";
    /// `{name}` of the operations on one queue: a `QueueName`.
    QueueNamed: "name" = Ref::from_schema_name("QueueName"), "Queue name";
}

/// A workflow definition's name (`workflow_definitions_name_must_be_a_name`).
pub(crate) const DEFINITION_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$";

/// The schema of a workflow definition's name.
fn definition_name() -> RefOr<schema::Schema> {
    schema::ObjectBuilder::new()
        .schema_type(schema::Type::String)
        .pattern(Some(DEFINITION_NAME_PATTERN))
        .into()
}

/// The schema of an id: a string of format `uuid`.
fn uuid() -> RefOr<schema::Schema> {
    schema::ObjectBuilder::new()
        .schema_type(schema::Type::String)
        .format(Some(schema::SchemaFormat::KnownFormat(
            schema::KnownFormat::Uuid,
        )))
        .into()
}

/// Declares error answers: each a type to name in `responses(…)` of `#[utoipa::path]`, for
/// one or more statuses, each with its description and an `ApiError` body.
macro_rules! error_answers {
    ($($(#[$meta:meta])* $type:ident: $($status:literal => $description:expr),+;)*) => {$(
        $(#[$meta])*
        pub(crate) struct $type;

        impl IntoResponses for $type {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                BTreeMap::from([$(
                    ($status.to_owned(), RefOr::T(error_response($status, $description))),
                )+])
            }
        }
    )*};
}

/// What a user token that is not an admin's is told where only an admin token may act.
const NOT_ADMIN: &str = "Not an admin token";

error_answers! {
    /// 403 of an operation that takes an owner: a user token may name only its own.
    OwnerForbidden: "403" => "A user token named another owner";
    /// 403 of an operation only admin tokens may call.
    AdminOnly: "403" => NOT_ADMIN;
    /// The refusals of a queue's pause and resume: a user token, or a name no queue can have.
    QueueRefusals: "403" => NOT_ADMIN, "422" => "Not a valid queue name";
    /// 404 of an operation on one task: another owner's task reads as one that does not exist.
    NoSuchTask: "404" => "No such task, or not the caller's";
    /// 404 of an operation on one workflow, also another owner's.
    NoSuchWorkflow: "404" => "No such workflow, or not the caller's";
    /// 404 of an operation on one schedule, also another owner's.
    NoSuchSchedule: "404" => "No such schedule, or not the caller's";
    /// 404 of an operation on one stored workflow definition, also another owner's.
    NoSuchDefinition: "404" => "No such workflow definition (or version) of the owner";
    /// 404 of an operation on one backfill, also of another owner's schedule.
    NoSuchBackfill: "404" => "No such backfill, or not of the caller's schedule";
    /// 404 of an operation on one service, also another owner's.
    NoSuchService: "404" => "No such service, or not the caller's";
}

/// 429 `quota_exceeded`: the answer of an operation that creates task rows when its owner's
/// quota per minute cannot cover them now (`quotas.rs`). Declared once, as a response
/// component; each such operation names it: `(status = 429, response = QuotaExceeded)`.
pub(crate) struct QuotaExceeded;

impl<'r> ToResponse<'r> for QuotaExceeded {
    fn response() -> (&'r str, RefOr<Response>) {
        let mut response = error_response(
            "429",
            "`quota_exceeded`: the owner's task rows per minute \
             (`--max-rows-per-owner-per-minute`) cannot cover the request now; nothing was \
             written",
        );
        response.headers.insert(
            "Retry-After".to_owned(),
            HeaderBuilder::new()
                .schema(<u64 as PartialSchema>::schema())
                .description(Some(
                    "Whole seconds until the owner's quota covers the request",
                ))
                .build(),
        );
        ("QuotaExceeded", RefOr::T(response))
    }
}

/// A response whose body is an `ApiError`; a 401 also names the `Bearer` challenge.
pub(super) fn error_response(status: &str, description: &str) -> Response {
    let mut response = ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("ApiError")))
            .build(),
    );
    if status == "401" {
        response = response.header(
            "WWW-Authenticate",
            HeaderBuilder::new()
                .schema(schema::Object::with_type(schema::Type::String))
                .description(Some("`Bearer`"))
                .build(),
        );
    }
    response.build()
}
