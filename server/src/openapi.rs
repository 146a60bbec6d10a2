//! The OpenAPI 3 document of the API, generated from the handlers' `#[utoipa::path]`
//! annotations and the wire types' schemas, served at `GET /api/v1/openapi.json`.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::{queues, schedules, services, system, tasks, workflows};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sked",
        description = "A task scheduler that uses PostgreSQL as its only moving part. Every \
                       endpoint but `health` and `openapi.json` needs `Authorization: Bearer \
                       <token>`; errors have the body `ApiError` with a stable `code`."
    ),
    paths(
        tasks::submit,
        tasks::submit_batch,
        tasks::list,
        tasks::detail,
        tasks::logs,
        tasks::cancel,
        tasks::retry,
        tasks::resubmit,
        workflows::submit,
        workflows::list,
        workflows::detail,
        workflows::cancel,
        workflows::retry,
        schedules::create,
        schedules::list,
        schedules::detail,
        schedules::update,
        schedules::pause,
        schedules::resume,
        schedules::run,
        schedules::delete,
        schedules::preview,
        services::list,
        services::detail,
        services::update,
        system::overview,
        system::workers,
        system::queues,
        queues::pause,
        queues::resume,
        queues::update,
        system::me,
        system::health,
        openapi_json,
    ),
    components(schemas(sked_types::ApiError, sked_types::TaskState, sked_types::TaskPage,
                       sked_types::TaskSummaryPage)),
    modifiers(&BearerAuth),
    tags(
        (name = "tasks", description = "Submit, list, follow, cancel, retry and resubmit tasks"),
        (name = "workflows", description = "Submit, list, read, cancel and re-run DAG workflows"),
        (name = "schedules", description = "Cron schedules: create, list, read, change, pause, resume, run now, delete; preview an expression"),
        (name = "services", description = "Long-running services: list, read with their copies, change (rolling update, scaling); stop by cancelling the task"),
        (name = "system", description = "The overview, workers, queues, the caller, health and this document"),
        (name = "queues", description = "Pause, resume and limit queues (admin tokens)"),
    )
)]
pub struct ApiDoc;

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

/// The document, serialised once.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.to_pretty_json()
        .expect("the OpenAPI document serialises to JSON")
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
