//! What answers show of the environments they carry: every answer with a task, a service or
//! a schedule's template goes out as a [`Shown`] body, which masks secret environment
//! values by the rule of `sked_types::secrets` on its way out. Everything the server reads
//! keeps the real values: the database holds them, the worker runs with them, a
//! resubmission copies them in SQL.
//!
//! The live events carry no environment (`TaskSummary`), nor do any other answers.

use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sked_types::secrets::{mask_env, mask_template_env};
use sked_types::service::{Service, ServiceList};
use sked_types::{
    Schedule, ScheduleDetail, SchedulePage, Task, TaskDetail, TaskPage, WorkflowDefinition,
    WorkflowDefinitionPage, WorkflowDetail,
};

/// An answer that shows environments, masked by [`Masked::mask`].
pub(crate) trait Masked {
    fn mask(&mut self);
}

/// The JSON body of an answer that carries environments: masked, then serialized.
pub(crate) struct Shown<T>(pub T);

impl<T: Masked + Serialize> IntoResponse for Shown<T> {
    fn into_response(mut self) -> Response {
        self.0.mask();
        axum::Json(self.0).into_response()
    }
}

impl Masked for Task {
    /// Its environment, and those of the tasks of its inline sub-workflow.
    fn mask(&mut self) {
        mask_env(&mut self.env);
        if let Some(sub) = self.subworkflow.as_mut() {
            mask_template_env(sub);
        }
    }
}

impl Masked for TaskDetail {
    fn mask(&mut self) {
        self.task.mask();
    }
}

impl Masked for TaskPage {
    fn mask(&mut self) {
        self.tasks.iter_mut().for_each(Masked::mask);
    }
}

impl Masked for WorkflowDetail {
    fn mask(&mut self) {
        self.tasks.iter_mut().for_each(Masked::mask);
    }
}

impl Masked for Service {
    fn mask(&mut self) {
        mask_env(&mut self.env);
    }
}

impl Masked for ServiceList {
    fn mask(&mut self) {
        self.services.iter_mut().for_each(Masked::mask);
    }
}

impl Masked for Schedule {
    /// The environments of its template: a task's, or every task's of a workflow.
    fn mask(&mut self) {
        for template in [self.task.as_mut(), self.workflow.as_mut()]
            .into_iter()
            .flatten()
        {
            mask_template_env(template);
        }
    }
}

impl Masked for WorkflowDefinition {
    /// The environments of its spec's tasks.
    fn mask(&mut self) {
        mask_template_env(&mut self.spec);
    }
}

impl Masked for WorkflowDefinitionPage {
    fn mask(&mut self) {
        self.definitions.iter_mut().for_each(Masked::mask);
    }
}

impl Masked for ScheduleDetail {
    fn mask(&mut self) {
        self.schedule.mask();
    }
}

impl Masked for SchedulePage {
    fn mask(&mut self) {
        self.schedules.iter_mut().for_each(Masked::mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sked_types::secrets::MASK;

    #[test]
    fn a_shown_task_has_its_secrets_masked() {
        let task: Task = serde_json::from_value(serde_json::json!({
            "id": "00000000-0000-0000-0000-000000000001", "owner": "alice", "queue": "default",
            "priority": 0, "kind": "command", "command": ["true"], "args": [],
            "artifact_url": null, "artifact_sha256": null, "input": null,
            "env": {"API_TOKEN": "t0k", "MODE": "fast"}, "labels": [], "output_path": null,
            "timeout_secs": null, "max_attempts": 3, "backoff_base_secs": 1.0,
            "backoff_max_secs": 3600.0, "idempotency_key": null, "state": "waiting",
            "attempt": 0, "next_run_at": "2026-01-01T00:00:00Z", "worker_id": null,
            "lease_expires_at": null, "cancel_requested_at": null,
            "created_at": "2026-01-01T00:00:00Z", "started_at": null, "finished_at": null,
            "exit_code": null, "error": null, "stdout_tail": null, "stderr_tail": null,
            "output_sha256": null,
        }))
        .unwrap();
        let page = TaskPage {
            tasks: vec![task.clone()],
            next_cursor: None,
            scan_limit_reached: false,
        };
        let body = |response: Response| async move {
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let shown = runtime.block_on(body(Shown(task.clone()).into_response()));
        assert_eq!(
            shown["env"],
            serde_json::json!({"API_TOKEN": MASK, "MODE": "fast"})
        );
        let listed = runtime.block_on(body(Shown(page).into_response()));
        assert_eq!(listed["tasks"][0]["env"]["API_TOKEN"], MASK, "{listed}");
        assert_eq!(
            task.env["API_TOKEN"], "t0k",
            "what the server read is left as it was"
        );
    }
}
