//! Submitting a workflow (`/submit/workflow`): a spec pasted in YAML (or JSON), the format of
//! `sked submit -f workflow.yaml`, read by the same code as the CLI
//! ([`sked_types::workflow_spec`]) and sent to `POST /api/v1/workflows`.
//!
//! What is typed is read as it changes: the tasks it holds, or the parser's message with its
//! line and column. A refusal of the API (a cycle, an unknown dependency, …) shows its
//! message and keeps the text; a workflow the API took opens its page.

use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::hooks::use_navigate;
use sked_types::workflow_spec::{SpecError, SpecFormat, parse_spec};
use sked_types::{SubmitWorkflow, WorkflowSubmitted};

use crate::{api, ui};

/// What the text area shows before anything is typed.
const EXAMPLE: &str = "name: nightly-etl
tasks:
  - name: extract
    command: [\"/opt/etl/extract\", \"--day\", \"yesterday\"]
  - name: transform
    command: [\"/opt/etl/transform\"]
    depends_on: [extract]
  - name: load
    command: [\"/opt/etl/load\"]
    depends_on: [transform]";

/// The spec typed, as the CLI reads a file given on stdin (`-`): YAML, which also reads JSON.
fn read(text: &str) -> Result<SubmitWorkflow, SpecError> {
    parse_spec(text, SpecFormat::Yaml)
}

/// Why the text is not a workflow, for people: where, then what.
fn problem(e: &SpecError) -> String {
    format!("The workflow cannot be read: {e}")
}

/// What the text holds, said under it while it is typed.
fn summary(spec: &SubmitWorkflow) -> String {
    let names: Vec<&str> = spec.tasks.iter().map(|t| t.name.as_str()).collect();
    let shown = if names.len() > 8 {
        format!("{}, …", names[..8].join(", "))
    } else {
        names.join(", ")
    };
    let tasks = if names.len() == 1 { "task" } else { "tasks" };
    match spec.name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => format!("{name}: {} {tasks} ({shown})", names.len()),
        None => format!("{} {tasks} ({shown})", names.len()),
    }
}

#[component]
pub fn SubmitWorkflowPage() -> impl IntoView {
    let text = RwSignal::new(String::new());
    let error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let navigate = use_navigate();
    let reading = Memo::new(move |_| {
        text.with(|t| (!t.trim().is_empty()).then(|| read(t).map_err(|e| (problem(&e), e.line))))
    });

    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        if busy.get_untracked() {
            return;
        }
        error.set(None);
        let spec = match text.with_untracked(|t| read(t)) {
            Ok(spec) => spec,
            Err(e) => {
                error.set(Some(problem(&e)));
                return;
            }
        };
        busy.set(true);
        let navigate = navigate.clone();
        spawn_local(async move {
            let result = api::post::<_, WorkflowSubmitted>("/workflows", &spec).await;
            busy.try_set(false);
            match result {
                Ok(w) => navigate(&format!("/workflows/{}", w.id), Default::default()),
                Err(e) => {
                    error.try_set(Some(e.message));
                }
            }
        });
    };

    view! {
        <h1>"Submit"</h1>
        <super::submit::SubmitTabs workflow=true/>
        <form class="form workflow-form" on:submit=on_submit novalidate=true>
            <label for="workflow-spec">"Workflow"</label>
            <div>
                <textarea id="workflow-spec" name="spec" rows="18" spellcheck="false" placeholder=EXAMPLE
                    bind:value=text></textarea>
                <p class="hint">
                    "YAML or JSON, as sked submit -f FILE takes it: a name and tasks, each with the fields of a "
                    "task (command, env, queue, timeout_secs, …) and its name, depends_on and trigger_rule. "
                    "See docs/workflows.md."
                </p>
                {move || reading.get().and_then(|r| match r {
                    Ok(spec) => Some(view! { <p class="hint" data-reading="">{summary(&spec)}</p> }.into_any()),
                    // Said once: the error below says it after a submission.
                    Err((message, _)) if error.with(|e| e.as_ref() == Some(&message)) => None,
                    Err((message, line)) => Some(view! {
                        <p class="hint bad" data-line=line>{message}</p>
                    }
                    .into_any()),
                })}
            </div>
            <span></span>
            <div>
                <ui::ErrorBox message=error/>
                <div class="actions">
                    <button type="submit" class="primary" data-action="submit-workflow" disabled=move || busy.get()>
                        "Submit workflow"
                    </button>
                </div>
            </div>
        </form>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_a_workflow_of_three_tasks() {
        let spec = read(EXAMPLE).unwrap();
        assert_eq!(
            summary(&spec),
            "nightly-etl: 3 tasks (extract, transform, load)"
        );
    }

    #[test]
    fn a_syntax_error_is_said_with_its_line() {
        let e = read("tasks:\n  - name: a\n    command: [\"true\"\n").unwrap_err();
        let says = problem(&e);
        assert!(
            says.starts_with("The workflow cannot be read: line "),
            "{says}"
        );
        assert!(e.line.is_some(), "{e:?}");
    }

    #[test]
    fn json_is_read_too() {
        let spec = read(r#"{"tasks": [{"name": "only", "kind": "noop"}]}"#).unwrap();
        assert_eq!(summary(&spec), "1 task (only)");
    }
}
