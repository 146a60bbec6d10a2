//! Workflows: the list (`/workflows`) and one workflow's DAG (`/workflows/:id`).
//!
//! The list pages by keyset (newest first) with a state filter; a workflow that changes
//! state refetches the page that shows it, and on the first page a new one appears.
//!
//! A workflow's page draws its tasks as a graph laid out in Rust ([`layout`]): layers left to
//! right, boxes coloured by state (`data-task-id`, `data-state`), a click opens the task.
//! The shards of a sharded task (a map's instances) fold into its box, with their count by
//! state ([`layout::collapse`]). Workflows of more than [`MAX_GRAPH_TASKS`] boxes show the
//! table only. Live task events
//! patch the states in place; a change of the workflow's own state, a task the page does
//! not know and `resync` refetch it. Actions: cancel the workflow, re-run it from its failed
//! tasks, retry one failed task.
//!
//! A branch task is marked "branch" in its box and row; once it has succeeded they also name
//! the children it chose (`branch → load_full`), and the edges to the children it did not
//! choose are drawn faint.
//!
//! A sub-workflow task (kind `workflow`) is one box tagged "sub-workflow" with the state of its
//! latest sub-workflow (or "not started"), and a link to that sub-workflow's page; its row
//! links there too. A change of such a task's state, or of the state of a sub-workflow shown,
//! refetches the workflow. The page of a sub-workflow says which task of which workflow runs
//! it, with links back up.

mod graph;
mod layout;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::hooks::use_params_map;
use sked_types::events::TaskSummary;
use sked_types::{
    ParentTask, StateChange, Task, TaskDetail, TaskKind, TaskState, Workflow, WorkflowChange,
    WorkflowDetail, WorkflowPage, WorkflowState,
};
use uuid::Uuid;

use crate::{api, live, ui};
use graph::Graph;

/// Workflows per page of the list.
const PAGE_SIZE: usize = 50;
/// Above this many tasks a workflow's page shows the table only.
pub const MAX_GRAPH_TASKS: usize = 500;
/// Table rows shown at first, and added by "Show more".
const TABLE_ROWS: usize = 200;
/// Least time between two refetches caused by live events: a burst costs one or two requests.
const REFETCH_GAP_MS: f64 = 300.0;

/// A call of an action, answering the message to show.
type Action = std::pin::Pin<Box<dyn std::future::Future<Output = api::ApiResult<String>>>>;

/// A workflow's state as a badge; `data-state` holds its name.
#[component]
fn WorkflowBadge(#[prop(into)] state: Signal<WorkflowState>) -> impl IntoView {
    view! {
        <span class=move || format!("badge state-{}", state.get().as_str()) data-state=move || state.get().as_str()>
            {move || state.get().as_str()}
        </span>
    }
}

fn display_name(name: &str) -> String {
    if name.is_empty() {
        "(unnamed)".to_owned()
    } else {
        name.to_owned()
    }
}

#[component]
pub fn WorkflowList() -> impl IntoView {
    let session = api::session();
    let live = live::live();
    let state_filter = RwSignal::new(String::new());
    // The `after` cursors of the pages before this one; empty on the first page.
    let cursors = RwSignal::new(Vec::<Uuid>::new());
    let page = RwSignal::new(None::<WorkflowPage>);
    let error = RwSignal::new(None::<String>);
    let generation = StoredValue::new(0u64);
    let tick = ui::ticker(1000);

    let fetch = move || {
        let mut path = format!("/workflows?limit={PAGE_SIZE}");
        let state = state_filter.get_untracked();
        if !state.is_empty() {
            path.push_str(&format!("&state={}", api::enc(&state)));
        }
        if let Some(after) = cursors.with_untracked(|c| c.last().copied()) {
            path.push_str(&format!("&after={after}"));
        }
        generation.update_value(|g| *g += 1);
        let mine = generation.get_value();
        spawn_local(async move {
            let result = api::get::<WorkflowPage>(&path).await;
            if generation.try_get_value() != Some(mine) {
                return;
            }
            match result {
                Ok(p) => {
                    page.set(Some(p));
                    error.set(None);
                }
                Err(e) => error.set(Some(e.message)),
            }
        });
    };
    let fetch_soon = ui::throttled(REFETCH_GAP_MS, fetch);

    Effect::new(move |_| {
        state_filter.track();
        cursors.track();
        fetch();
    });
    live.on_change(|l| l.resync.track(), fetch);
    live.on_ids(
        |l| l.workflows,
        move |ids| {
            // A workflow shown changed, or one may have been created (first page only).
            let shown = page.with_untracked(|p| {
                p.as_ref()
                    .is_some_and(|p| p.workflows.iter().any(|w| ids.contains(&w.id)))
            });
            if shown || cursors.with_untracked(Vec::is_empty) {
                fetch_soon();
            }
        },
    );

    let is_admin = move || {
        session
            .me
            .with(|m| m.as_ref().is_some_and(|m| m.role == "admin"))
    };
    let older = move |_| {
        if let Some(next) = page.with_untracked(|p| p.as_ref().and_then(|p| p.next_cursor)) {
            cursors.update(|c| c.push(next));
        }
    };
    let newer = move |_| {
        cursors.update(|c| {
            c.pop();
        })
    };
    let rows = move || page.with(|p| p.as_ref().map(|p| p.workflows.clone()).unwrap_or_default());

    view! {
        <h1>"Workflows"</h1>
        <form class="filters" on:submit=|ev| ev.prevent_default()>
            <a class="button" href="/submit/workflow" data-action="new-workflow">"Submit a workflow"</a>
            <select
                name="state"
                aria-label="State"
                on:change=move |ev| {
                    state_filter.set(event_target_value(&ev));
                    cursors.set(Vec::new());
                }
            >
                <option value="">"All states"</option>
                {WorkflowState::ALL
                    .iter()
                    .map(|s| view! { <option value=s.as_str()>{s.as_str()}</option> })
                    .collect_view()}
            </select>
        </form>
        <ui::Loaded
            error=error
            ready=Signal::derive(move || page.with(Option::is_some))
            empty=Signal::derive(move || page.with(|p| p.as_ref().is_some_and(|p| p.workflows.is_empty())))
            when_empty=move || move || {
                if !cursors.with(Vec::is_empty) {
                    "No older workflows."
                } else if state_filter.with(|s| !s.is_empty()) {
                    "No workflows in this state."
                } else {
                    "No workflows yet. Submit one here (Submit a workflow), with sked submit -f FILE or POST /api/v1/workflows."
                }
            }
        >
            <ui::Table class="workflow-list" heads=view! {
                <th>"Workflow"</th> <th>"State"</th> <th>"Created"</th>
                <th class="hide-narrow">"Finished"</th> <th class="num">"Duration"</th>
                <Show when=is_admin><th class="hide-narrow">"Owner"</th></Show>
                <th class="hide-narrow">"Id"</th>
            }>
                <For each=rows key=|w| (w.id, w.state, w.finished_at) let:w>
                    <WorkflowRow workflow=w tick=tick admin=Signal::derive(is_admin)/>
                </For>
            </ui::Table>
        </ui::Loaded>
        <nav class="pager">
            <Show when=move || !cursors.with(Vec::is_empty)>
                <button type="button" on:click=newer>"← Newer"</button>
            </Show>
            <Show when=move || page.with(|p| p.as_ref().is_some_and(|p| p.next_cursor.is_some()))>
                <button type="button" on:click=older>"Older →"</button>
            </Show>
        </nav>
    }
}

#[component]
fn WorkflowRow(workflow: Workflow, tick: ReadSignal<u64>, admin: Signal<bool>) -> impl IntoView {
    let w = workflow;
    let id = w.id;
    let created = w.created_at;
    let finished = w.finished_at;
    let duration = move || ui::elapsed(created, finished, tick);
    let owner = w.owner.clone();
    view! {
        <tr data-workflow-id=id.to_string() data-state=w.state.as_str()>
            <td>
                <a href=format!("/workflows/{id}")>{display_name(&w.name)}</a>
            </td>
            <td>
                <WorkflowBadge state=w.state/>
            </td>
            <td>{ui::age(created, tick)}</td>
            <td class="hide-narrow">{finished.map(|at| view! { <ui::Time at=at/> })}</td>
            <td class="num">{duration}</td>
            <Show when=move || admin.get()>
                <td class="hide-narrow">{owner.clone()}</td>
            </Show>
            <td class="mono hide-narrow" title=id.to_string()>{ui::short_id(&id)}</td>
        </tr>
    }
}

/// What the page shows of one task; live events patch it.
#[derive(Debug, Clone, PartialEq)]
struct Node {
    id: Uuid,
    name: String,
    state: TaskState,
    attempt: i32,
    max_attempts: i32,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    exit_code: Option<i32>,
    error: Option<String>,
    trigger_rule: String,
    /// A branch: its output chooses which of its children run.
    branch: bool,
    /// The names of the children a branch chose, read from its output (`None` while it has
    /// none, or for a task that is not a branch).
    chosen: Option<Vec<String>>,
    /// A map: its shards are its instances, one per element of a parent's output.
    map: bool,
    /// A sub-workflow task (kind `workflow`): it runs a workflow instead of a command.
    subworkflow: bool,
    /// The latest sub-workflow of a sub-workflow task, and its state; `None` while it has not
    /// started one.
    run: Option<(Uuid, WorkflowState)>,
    cancel_requested: bool,
    /// Indices of its parents in the workflow's tasks.
    parents: Vec<usize>,
}

/// The names a branch's output chooses: `{"next": ["a", "b"]}` or `{"next": "a"}`; `None` when
/// the output is not of that shape.
fn branch_next(output: &serde_json::Value) -> Option<Vec<String>> {
    match output.get("next")? {
        serde_json::Value::String(name) => Some(vec![name.clone()]),
        serde_json::Value::Array(names) => names
            .iter()
            .map(|n| n.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

impl Node {
    fn new(t: &Task) -> Self {
        Node {
            id: t.id,
            name: t.name.clone().unwrap_or_else(|| ui::short_id(&t.id)),
            state: t.state,
            attempt: t.attempt,
            max_attempts: t.max_attempts,
            started_at: t.started_at,
            finished_at: t.finished_at,
            exit_code: t.exit_code,
            error: t.error.clone(),
            trigger_rule: t.trigger_rule.clone(),
            branch: t.branch,
            chosen: t
                .branch
                .then(|| t.output.as_ref().and_then(branch_next))
                .flatten(),
            map: t.map_over.is_some(),
            subworkflow: t.kind == TaskKind::Workflow,
            run: None,
            cancel_requested: t.cancel_requested_at.is_some(),
            parents: Vec::new(),
        }
    }

    /// The state of a sub-workflow task's latest sub-workflow (`failed`), or `not started`;
    /// `None` for a task that is not a sub-workflow task.
    fn run_state(&self) -> Option<&'static str> {
        self.subworkflow
            .then(|| self.run.map_or("not started", |(_, state)| state.as_str()))
    }

    /// `sub-workflow failed`, `sub-workflow not started`: what a sub-workflow task's box and
    /// row say of it.
    fn run_label(&self) -> Option<String> {
        self.run_state().map(|s| format!("sub-workflow {s}"))
    }

    /// The page of a sub-workflow task's latest sub-workflow.
    fn run_href(&self) -> Option<String> {
        self.run
            .filter(|_| self.subworkflow)
            .map(|(id, _)| format!("/workflows/{id}"))
    }

    /// Whether `POST /tasks/{id}/retry` applies (a failed or cancelled task runs again).
    fn retryable(&self) -> bool {
        matches!(self.state, TaskState::Failed | TaskState::Cancelled)
    }

    /// `failed · attempt 3/3` — the second line of the task's box.
    fn caption(&self) -> String {
        let state = self.state.as_str().replace('_', " ");
        if self.attempt > 1 || (self.retryable() && self.attempt > 0) {
            format!("{state} · {}/{}", self.attempt, self.max_attempts)
        } else {
            state
        }
    }

    /// `none failed` — its trigger rule when not the default `all_success`.
    fn rule_label(&self) -> Option<String> {
        (self.trigger_rule != "all_success").then(|| self.trigger_rule.replace('_', " "))
    }

    /// `load_full, load_delta` (or `none`): the children a branch that succeeded chose.
    fn chosen_label(&self) -> Option<String> {
        if !self.branch || self.state != TaskState::Succeeded {
            return None;
        }
        self.chosen.as_ref().map(|names| {
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        })
    }

    /// `branch`, or `branch → load_full` once it succeeded; `None` for a task that is not a
    /// branch.
    fn branch_label(&self) -> Option<String> {
        self.branch.then(|| match self.chosen_label() {
            Some(chosen) => format!("branch → {chosen}"),
            None => "branch".to_owned(),
        })
    }
}

/// What decides the graph's layout (see [`Nodes::shape`]).
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    ids: Vec<Uuid>,
    edges: Vec<(usize, usize)>,
    shard_of: Vec<Option<usize>>,
}

/// The workflow's tasks, their index by id, and the graph's shape as (parent, child) indices.
#[derive(Debug, Clone, PartialEq, Default)]
struct Nodes {
    list: Vec<Node>,
    index: HashMap<Uuid, usize>,
    edges: Vec<(usize, usize)>,
    /// The index of each task's parent when it is a shard (a map's instance) of a task of the
    /// workflow.
    shard_of: Vec<Option<usize>>,
}

impl Nodes {
    fn new(detail: &WorkflowDetail) -> Self {
        let mut list: Vec<Node> = detail.tasks.iter().map(Node::new).collect();
        let index: HashMap<Uuid, usize> = list.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        for run in &detail.subworkflows {
            if let Some(&i) = index.get(&run.task) {
                list[i].run = Some((run.workflow, run.state));
            }
        }
        let mut edges = Vec::with_capacity(detail.edges.len());
        for e in &detail.edges {
            if let (Some(&parent), Some(&child)) = (index.get(&e.depends_on), index.get(&e.task)) {
                edges.push((parent, child));
                list[child].parents.push(parent);
            }
        }
        let shard_of = detail
            .tasks
            .iter()
            .map(|t| t.shard_of.and_then(|p| index.get(&p).copied()))
            .collect();
        Nodes {
            list,
            index,
            edges,
            shard_of,
        }
    }

    /// The ids, edges and shards' parents, which decide the graph's layout.
    fn shape(&self) -> Shape {
        Shape {
            ids: self.list.iter().map(|n| n.id).collect(),
            edges: self.edges.clone(),
            shard_of: (0..self.list.len())
                .map(|i| self.shard_of.get(i).copied().flatten())
                .collect(),
        }
    }

    fn count(&self, state: TaskState) -> usize {
        self.list.iter().filter(|n| n.state == state).count()
    }

    /// Whether one of `ids` is the latest sub-workflow of a task shown.
    fn runs_any(&self, ids: &[Uuid]) -> bool {
        self.list
            .iter()
            .any(|n| n.run.is_some_and(|(id, _)| ids.contains(&id)))
    }

    /// Whether `parent` is a branch that succeeded without choosing `child`.
    fn unchosen(&self, parent: usize, child: usize) -> bool {
        let (Some(p), Some(c)) = (self.list.get(parent), self.list.get(child)) else {
            return false;
        };
        p.branch
            && p.state == TaskState::Succeeded
            && p.chosen
                .as_ref()
                .is_some_and(|names| !names.contains(&c.name))
    }

    /// Patches a task from a live event. True when the page must fetch the workflow again: the
    /// task is not one it knows, it has just failed (the event does not carry the error), it
    /// is a branch that has just succeeded (nor does it carry the branch's choice), or it is a
    /// sub-workflow task whose state changed (its sub-workflow has started or ended).
    fn apply(&mut self, t: &TaskSummary) -> bool {
        let Some(&i) = self.index.get(&t.id) else {
            return true;
        };
        let n = &mut self.list[i];
        let refetch = (t.state == TaskState::Failed && n.state != TaskState::Failed)
            || (n.branch && t.state == TaskState::Succeeded && n.state != TaskState::Succeeded)
            || (n.subworkflow && t.state != n.state);
        if !t.state.is_final() {
            n.error = None;
            n.chosen = None;
        }
        n.state = t.state;
        n.attempt = t.attempt;
        n.max_attempts = t.max_attempts;
        n.started_at = t.started_at;
        n.finished_at = t.finished_at;
        n.exit_code = t.exit_code;
        n.cancel_requested = t.cancel_requested;
        refetch
    }
}

#[component]
pub fn WorkflowPage() -> impl IntoView {
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id").and_then(|s| s.parse::<Uuid>().ok())));
    let shown = Shown::new(id);
    let outcome = Outcome::new();
    let tick = ui::ticker(1000);

    Effect::new(move |_| {
        id.track();
        shown.workflow.set(None);
        shown.nodes.set(Nodes::default());
        outcome.clear();
        shown.fetch();
    });
    shown.follow(live::live());

    let error = Signal::derive(move || match id.get() {
        None => Some("This is not a workflow id.".to_owned()),
        Some(_) => shown.error.get(),
    });
    let retry = move |task: Uuid, name: String| outcome.run(retry_task(task, name), shown);
    // A sub-workflow's task and workflow above it; read once, not at every refetch.
    let parent = Memo::new(move |_| {
        shown
            .workflow
            .with(|w| w.as_ref().and_then(|w| w.parent.clone()))
    });

    view! {
        <p class="hint"><a href="/workflows">"← Workflows"</a></p>
        {move || parent.get().map(|p| view! { <ParentLine parent=p/> })}
        <ui::Loaded error=error ready=Signal::derive(move || shown.workflow.with(Option::is_some))>
            {move || shown.workflow.get().map(|w| view! { <Header workflow=w nodes=shown.nodes tick=tick/> })}
            <ActionBar shown=shown outcome=outcome/>
            <h2>"Graph"</h2>
            <GraphView nodes=shown.nodes/>
            <h2>"Tasks"</h2>
            <p class="hint">
                <a href=move || id.get().map(|id| format!("/tasks?workflow={id}")).unwrap_or_default() data-action="in-task-list">
                    "These tasks in the task list"
                </a>
                " (filter, search, retry or cancel them all)"
            </p>
            <TaskTable nodes=shown.nodes tick=tick busy=outcome.busy retry=retry/>
        </ui::Loaded>
    }
}

/// What a workflow's page shows of it, and the error of its last fetch.
#[derive(Clone, Copy)]
struct Shown {
    id: Memo<Option<Uuid>>,
    workflow: RwSignal<Option<Workflow>>,
    nodes: RwSignal<Nodes>,
    error: RwSignal<Option<String>>,
    generation: StoredValue<u64>,
}

impl Shown {
    fn new(id: Memo<Option<Uuid>>) -> Self {
        Shown {
            id,
            workflow: RwSignal::new(None),
            nodes: RwSignal::new(Nodes::default()),
            error: RwSignal::new(None),
            generation: StoredValue::new(0),
        }
    }

    /// Fetches the workflow; an answer to an older request is dropped.
    fn fetch(self) {
        let Some(wid) = self.id.get_untracked() else {
            return;
        };
        self.generation.update_value(|g| *g += 1);
        let mine = self.generation.get_value();
        spawn_local(async move {
            let result = api::get::<WorkflowDetail>(&format!("/workflows/{wid}")).await;
            if self.generation.try_get_value() != Some(mine) {
                return;
            }
            match result {
                Ok(detail) => {
                    self.nodes.set(Nodes::new(&detail));
                    self.workflow.set(Some(detail.workflow));
                    self.error.set(None);
                }
                Err(e) => self.error.set(Some(e.message)),
            }
        });
    }

    /// Fetches again on `resync` and when the workflow changes, and patches its tasks from
    /// live task events (fetching again when one is new or failed).
    fn follow(self, live: live::Live) {
        let fetch_soon = ui::throttled(REFETCH_GAP_MS, move || self.fetch());
        live.on_change(|l| l.resync.track(), move || self.fetch());
        live.on_ids(|l| l.workflows, {
            let fetch_soon = fetch_soon.clone();
            move |ids| {
                // This workflow, or the sub-workflow of one of its tasks, changed.
                if self
                    .id
                    .get_untracked()
                    .is_some_and(|wid| ids.contains(&wid))
                    || self.nodes.with_untracked(|ns| ns.runs_any(ids))
                {
                    fetch_soon();
                }
            }
        });
        live.on_tasks(move |batch| {
            let Some(wid) = self.id.get_untracked() else {
                return;
            };
            if !batch.iter().any(|t| t.workflow_id == Some(wid)) {
                return;
            }
            let mut refetch = false;
            self.nodes.update(|ns| {
                for t in batch.iter().filter(|t| t.workflow_id == Some(wid)) {
                    refetch |= ns.apply(t);
                }
            });
            if refetch {
                fetch_soon();
            }
        });
    }
}

/// The state of the actions: whether one is running, and what the last one said.
#[derive(Clone, Copy)]
struct Outcome {
    busy: RwSignal<bool>,
    error: RwSignal<Option<String>>,
    notice: RwSignal<Option<String>>,
}

impl Outcome {
    fn new() -> Self {
        Outcome {
            busy: RwSignal::new(false),
            error: RwSignal::new(None),
            notice: RwSignal::new(None),
        }
    }

    fn clear(self) {
        self.notice.set(None);
        self.error.set(None);
    }

    /// Runs an action, shows its outcome, and fetches the workflow again.
    fn run(self, request: Action, shown: Shown) {
        self.busy.set(true);
        self.clear();
        spawn_local(async move {
            match request.await {
                Ok(message) => {
                    self.notice.try_set(Some(message));
                }
                Err(e) => {
                    self.error.try_set(Some(e.message));
                }
            }
            self.busy.try_set(false);
            shown.fetch();
        });
    }
}

/// `POST /workflows/{id}/cancel`, saying what it did.
fn cancel_workflow(wid: Uuid) -> Action {
    Box::pin(async move {
        let change: WorkflowChange = api::post_empty(&format!("/workflows/{wid}/cancel")).await?;
        Ok(match change.state {
            WorkflowState::Running => {
                "Cancelled: tasks not started are cancelled; running ones are being stopped."
                    .to_owned()
            }
            state => format!("The workflow is {state}."),
        })
    })
}

/// `POST /workflows/{id}/retry`, saying how many tasks run again.
fn rerun_workflow(wid: Uuid) -> Action {
    Box::pin(async move {
        let change: WorkflowChange = api::post_empty(&format!("/workflows/{wid}/retry")).await?;
        Ok(match change.tasks_rerun {
            1 => "1 task runs again, and the tasks after it wait for it.".to_owned(),
            n => format!("{n} tasks run again, and the tasks after them wait for them."),
        })
    })
}

/// `POST /tasks/{id}/retry` of the task called `name`, saying its new state.
fn retry_task(task: Uuid, name: String) -> Action {
    Box::pin(async move {
        let change: StateChange = api::post_empty(&format!("/tasks/{task}/retry")).await?;
        Ok(format!(
            "{name} runs again (now {}).",
            change.state.as_str().replace('_', " ")
        ))
    })
}

/// The workflow's name and state, its facts, and a count of its tasks in each state.
#[component]
fn Header(workflow: Workflow, nodes: RwSignal<Nodes>, tick: ReadSignal<u64>) -> impl IntoView {
    let w = workflow;
    let summary = move || {
        nodes.with(|ns| {
            let mut parts = vec![format!("{} tasks", ns.list.len())];
            for s in TaskState::ALL {
                let c = ns.count(s);
                if c > 0 {
                    parts.push(format!("{c} {}", s.as_str().replace('_', " ")));
                }
            }
            parts.join(" · ")
        })
    };
    view! {
        <h1>
            {display_name(&w.name)} " " <WorkflowBadge state=w.state/>
        </h1>
        <div class="panel">
            <dl class="kv">
                <dt>"Id"</dt>
                <dd class="mono">{w.id.to_string()}</dd>
                <dt>"Owner"</dt>
                <dd>{w.owner.clone()}</dd>
                <dt>"Created"</dt>
                <dd><ui::Time at=w.created_at/> " (" {ui::age(w.created_at, tick)} ")"</dd>
                <dt>"Finished"</dt>
                <dd>
                    {match w.finished_at {
                        Some(at) => view! {
                            <ui::Time at=at/>
                            " (after " {ui::elapsed(w.created_at, Some(at), tick)} ")"
                        }.into_any(),
                        None => view! { "not yet" }.into_any(),
                    }}
                </dd>
                <dt>"Tasks"</dt>
                <dd>{summary}</dd>
            </dl>
        </div>
    }
}

/// `sub-workflow of task load in workflow 1a2b3c4d`: on a sub-workflow's page, the task that
/// runs it (named once `GET /tasks/{id}` answers) and that task's workflow, as links.
#[component]
fn ParentLine(parent: ParentTask) -> impl IntoView {
    let ParentTask { task, workflow } = parent;
    let fetched = ui::Fetched::<TaskDetail>::new();
    let path = format!("/tasks/{task}");
    fetched.load(async move { api::get(&path).await });
    let task_name = move || {
        fetched
            .data
            .with(|d| d.as_ref().and_then(|d| d.task.name.clone()))
            .unwrap_or_else(|| ui::short_id(&task))
    };
    view! {
        <p class="hint subworkflow-of" data-parent-workflow=workflow.to_string()>
            "sub-workflow of task "
            <a href=format!("/tasks/{task}") title=task.to_string() data-action="parent-task">{task_name}</a>
            " in workflow "
            <a class="mono" href=format!("/workflows/{workflow}") title=workflow.to_string() data-action="parent-workflow">
                {ui::short_id(&workflow)}
            </a>
        </p>
    }
}

/// Cancel and re-run, and what the last action said.
#[component]
fn ActionBar(shown: Shown, outcome: Outcome) -> impl IntoView {
    let running = move || {
        shown.workflow.with(|w| {
            w.as_ref()
                .is_some_and(|w| w.state == WorkflowState::Running)
        })
    };
    let rerunnable = move || {
        shown.nodes.with(|ns| {
            ns.list
                .iter()
                .any(|n| matches!(n.state, TaskState::Failed | TaskState::Cancelled))
        })
    };
    let on = move |request: fn(Uuid) -> Action| {
        move |_: leptos::ev::MouseEvent| {
            if let Some(wid) = shown.id.get_untracked() {
                outcome.run(request(wid), shown);
            }
        }
    };
    let busy = outcome.busy;
    view! {
        <div class="actions">
            <ui::ActionButton action="cancel" danger=true disabled=move || busy.get() || !running() on_click=on(cancel_workflow)>
                "Cancel workflow"
            </ui::ActionButton>
            <ui::ActionButton action="rerun" disabled=move || busy.get() || !rerunnable() on_click=on(rerun_workflow)
                title="Run the failed and cancelled tasks again; the tasks after them wait for them">
                "Re-run from failed"
            </ui::ActionButton>
        </div>
        <ui::ErrorBox message=outcome.error/>
        <Show when=move || outcome.notice.with(Option::is_some)>
            <p class="notice" role="status">{move || outcome.notice.get()}</p>
        </Show>
    }
}

/// The graph of the workflow's tasks, or why it is not drawn.
#[component]
fn GraphView(nodes: RwSignal<Nodes>) -> impl IntoView {
    let shape = Memo::new(move |_| nodes.with(Nodes::shape));
    // The sharded tasks whose shards are drawn one by one.
    let expanded = RwSignal::new(std::collections::HashSet::<Uuid>::new());
    let graph = Memo::new(move |_| {
        shape.with(|s| {
            expanded.with(|open| {
                let c = layout::collapse(&s.shard_of, &s.edges, |p| {
                    s.ids.get(p).is_some_and(|id| open.contains(id))
                });
                (!c.tasks.is_empty() && c.tasks.len() <= MAX_GRAPH_TASKS).then(|| {
                    let l = layout::layout(c.tasks.len(), &c.edges);
                    Arc::new((c, l))
                })
            })
        })
    });
    move || match graph.get() {
        Some(g) => view! { <Graph drawn=g nodes=nodes expanded=expanded/> }.into_any(),
        None => {
            let n = nodes.with(|ns| ns.list.len());
            if n == 0 {
                view! { <ui::Empty>"This workflow has no tasks."</ui::Empty> }.into_any()
            } else {
                view! {
                    <p class="notice">
                        {format!(
                            "This workflow has {} tasks: the graph is drawn for up to {MAX_GRAPH_TASKS}. The table below lists them all.",
                            ui::count(n as i64),
                        )}
                    </p>
                }
                .into_any()
            }
        }
    }
}

/// The table of a workflow's tasks, with a state filter and a retry per failed task.
#[component]
fn TaskTable(
    nodes: RwSignal<Nodes>,
    tick: ReadSignal<u64>,
    busy: RwSignal<bool>,
    retry: impl Fn(Uuid, String) + Copy + Send + Sync + 'static,
) -> impl IntoView {
    let filter = RwSignal::new(None::<TaskState>);
    let limit = RwSignal::new(TABLE_ROWS);
    // (index, id) of the rows that pass the filter.
    let matching = move || {
        let f = filter.get();
        nodes.with(|ns| {
            ns.list
                .iter()
                .enumerate()
                .filter(|(_, n)| f.is_none_or(|f| n.state == f))
                .map(|(i, n)| (i, n.id))
                .collect::<Vec<_>>()
        })
    };
    let total = move || matching().len();
    let shown = move || {
        let mut rows = matching();
        rows.truncate(limit.get());
        rows
    };
    let options = move || {
        nodes.with(|ns| {
            TaskState::ALL
                .iter()
                .filter_map(|&s| {
                    let c = ns.count(s);
                    (c > 0).then(|| {
                        view! {
                            <option value=s.as_str()>{format!("{} ({c})", s.as_str().replace('_', " "))}</option>
                        }
                    })
                })
                .collect_view()
        })
    };

    view! {
        <form class="filters" on:submit=|ev| ev.prevent_default()>
            <select
                name="state"
                aria-label="Task state"
                prop:value=move || filter.get().map_or("", TaskState::as_str)
                on:change=move |ev| {
                    filter.set(event_target_value(&ev).parse().ok());
                    limit.set(TABLE_ROWS);
                }
            >
                <option value="">"All states"</option>
                {options}
            </select>
        </form>
        <ui::Table class="workflow-tasks" heads=view! {
            <th>"Task"</th> <th>"State"</th> <th class="num hide-narrow">"Attempt"</th>
            <th class="hide-narrow">"After"</th> <th class="hide-narrow">"Started"</th>
            <th class="num">"Duration"</th> <th class="hide-narrow">"Error"</th> <th></th>
        }>
            <For each=shown key=|row| *row let:row>
                <TaskRow index=row.0 nodes=nodes tick=tick busy=busy retry=retry/>
            </For>
        </ui::Table>
        <Show when=move || { total() > limit.get() }>
            <p class="pager">
                <button type="button" on:click=move |_| limit.update(|l| *l += TABLE_ROWS)>
                    {move || format!("Show more ({} of {})", limit.get(), total())}
                </button>
            </p>
        </Show>
    }
}

#[component]
fn TaskRow(
    index: usize,
    nodes: RwSignal<Nodes>,
    tick: ReadSignal<u64>,
    busy: RwSignal<bool>,
    retry: impl Fn(Uuid, String) + Copy + Send + Sync + 'static,
) -> impl IntoView {
    let node = move || nodes.with(|ns| ns.list.get(index).cloned());
    let Some(first) = nodes.with_untracked(|ns| ns.list.get(index).cloned()) else {
        return ().into_any();
    };
    let id = first.id;
    let state = Signal::derive(move || node().map_or(TaskState::Waiting, |n| n.state));
    let after = nodes.with_untracked(|ns| {
        ns.list[index]
            .parents
            .iter()
            .map(|&p| ns.list[p].name.clone())
            .collect::<Vec<_>>()
            .join(", ")
    });
    let rule = first.rule_label();
    let branch = move || node().and_then(|n| n.branch_label());
    // `(sub-workflow failed)`, a link to the sub-workflow once it has one.
    let run = move || {
        node().and_then(|n| {
            let label = n.run_label()?;
            Some(match n.run_href() {
                Some(href) => view! {
                    <span class="hint">
                        " (" <a href=href data-action="open-subworkflow">{label}</a> ")"
                    </span>
                }
                .into_any(),
                None => view! { <span class="hint">" (" {label} ")"</span> }.into_any(),
            })
        })
    };
    let attempt = move || node().map(|n| format!("{}/{}", n.attempt, n.max_attempts));
    let started = move || {
        node()
            .and_then(|n| n.started_at)
            .map(|at| view! { <ui::Time at=at/> })
    };
    let duration = move || {
        node().and_then(|n| {
            n.started_at
                .map(|start| ui::elapsed(start, n.finished_at, tick))
        })
    };
    let error = move || {
        node().and_then(|n| {
            n.error.or_else(|| {
                n.exit_code
                    .filter(|&c| c != 0)
                    .map(|c| format!("exit code {c}"))
            })
        })
    };
    let retryable = move || node().is_some_and(|n| n.retryable());
    let name = first.name.clone();
    view! {
        <tr data-task-id=id.to_string() data-state=move || state.get().as_str()>
            <td>
                <a href=format!("/tasks/{id}") title=id.to_string()>{first.name.clone()}</a>
                {move || branch().map(|b| view! { <span class="hint">" (" {b} ")"</span> })}
                {run}
            </td>
            <td>
                <ui::StateBadge state=state/>
                <Show when=move || node().is_some_and(|n| n.cancel_requested && !n.state.is_final())>
                    <span class="hint" title="cancel requested">" ⏹"</span>
                </Show>
            </td>
            <td class="num hide-narrow">{attempt}</td>
            <td class="wrap hide-narrow">
                {after}
                {rule.map(|r| view! { <span class="hint">" (" {r} ")"</span> })}
            </td>
            <td class="hide-narrow">{started}</td>
            <td class="num">{duration}</td>
            <td class="wrap hide-narrow error-text">{error}</td>
            <td>
                <Show when=retryable>
                    <ui::ActionButton action="retry" disabled=busy on_click={
                        let name = name.clone();
                        move |_| retry(id, name.clone())
                    }>
                        "Retry"
                    </ui::ActionButton>
                </Show>
            </td>
        </tr>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(states: &[TaskState]) -> Nodes {
        let list: Vec<Node> = states
            .iter()
            .enumerate()
            .map(|(i, &state)| Node {
                id: Uuid::from_u128(i as u128 + 1),
                name: format!("t{i}"),
                state,
                attempt: 1,
                max_attempts: 3,
                started_at: None,
                finished_at: None,
                exit_code: None,
                error: state.is_final().then(|| "boom".to_owned()),
                trigger_rule: "all_success".into(),
                branch: false,
                chosen: None,
                map: false,
                subworkflow: false,
                run: None,
                cancel_requested: false,
                parents: Vec::new(),
            })
            .collect();
        let index = list.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        Nodes {
            list,
            index,
            edges: Vec::new(),
            shard_of: Vec::new(),
        }
    }

    fn event(id: u128, state: TaskState, attempt: i32) -> TaskSummary {
        let t = crate::fixtures::task_summary(id, state);
        TaskSummary {
            attempt,
            started_at: Some(t.created_at),
            finished_at: state.is_final().then_some(t.created_at),
            exit_code: state.is_final().then_some(1),
            ..t
        }
    }

    /// `t0` a branch in `state` that chose `chosen`, with children `t1` and `t2`.
    fn branch(state: TaskState, chosen: Option<&[&str]>) -> Nodes {
        let mut ns = nodes(&[state, TaskState::Waiting, TaskState::Skipped]);
        ns.list[0].branch = true;
        ns.list[0].error = None;
        ns.list[0].chosen = chosen.map(|c| c.iter().map(|&s| s.to_owned()).collect());
        for child in [1, 2] {
            ns.list[child].parents.push(0);
            ns.edges.push((0, child));
        }
        ns
    }

    #[test]
    fn a_branch_output_names_its_choice_as_a_list_or_one_name() {
        let names = |v: serde_json::Value| branch_next(&v);
        assert_eq!(
            names(serde_json::json!({"next": ["a", "b"]})),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(
            names(serde_json::json!({"next": "a"})),
            Some(vec!["a".to_owned()])
        );
        assert_eq!(names(serde_json::json!({"next": []})), Some(Vec::new()));
        assert_eq!(
            names(serde_json::json!({"next": ["a", 1]})),
            None,
            "a list of names has only strings"
        );
        assert_eq!(
            names(serde_json::json!(["a"])),
            None,
            "the choice is the object's `next`"
        );
    }

    #[test]
    fn a_branch_is_labelled_and_names_its_choice_once_it_succeeded() {
        let ns = nodes(&[TaskState::Succeeded]);
        assert_eq!(ns.list[0].branch_label(), None, "a plain task is no branch");
        assert_eq!(
            ns.list[0].rule_label(),
            None,
            "all_success goes without saying"
        );

        let ns = branch(TaskState::Running, None);
        assert_eq!(ns.list[0].branch_label().as_deref(), Some("branch"));
        let ns = branch(TaskState::Succeeded, Some(&["t1"]));
        assert_eq!(ns.list[0].branch_label().as_deref(), Some("branch → t1"));
        let ns = branch(TaskState::Succeeded, Some(&["t1", "t2"]));
        assert_eq!(
            ns.list[0].branch_label().as_deref(),
            Some("branch → t1, t2")
        );
        let ns = branch(TaskState::Succeeded, Some(&[]));
        assert_eq!(
            ns.list[0].branch_label().as_deref(),
            Some("branch → none"),
            "a branch may choose none of its children"
        );
        let ns = branch(TaskState::Failed, Some(&["t1"]));
        assert_eq!(
            ns.list[0].branch_label().as_deref(),
            Some("branch"),
            "only a branch that succeeded has chosen"
        );

        let mut ns = nodes(&[TaskState::Waiting]);
        ns.list[0].trigger_rule = "none_failed".into();
        assert_eq!(ns.list[0].rule_label().as_deref(), Some("none failed"));
    }

    #[test]
    fn the_edges_a_branch_did_not_choose_are_told_apart() {
        let ns = branch(TaskState::Succeeded, Some(&["t1"]));
        assert!(!ns.unchosen(0, 1), "t1 was chosen");
        assert!(ns.unchosen(0, 2), "t2 was not");
        let ns = branch(TaskState::Running, None);
        assert!(
            !ns.unchosen(0, 2),
            "a branch that has not succeeded has chosen nothing yet"
        );
        let mut ns = branch(TaskState::Succeeded, Some(&["t1"]));
        ns.list[0].branch = false;
        assert!(!ns.unchosen(0, 2), "only a branch chooses");
    }

    #[test]
    fn a_branch_that_succeeds_live_is_fetched_for_its_choice() {
        let mut ns = branch(TaskState::Running, None);
        assert!(
            ns.apply(&event(1, TaskState::Succeeded, 1)),
            "the event does not carry the branch's output"
        );
        assert!(
            !ns.apply(&event(2, TaskState::Succeeded, 1)),
            "a task that is not a branch needs nothing more when it succeeds"
        );
        let mut ns = branch(TaskState::Succeeded, Some(&["t1"]));
        assert!(!ns.apply(&event(1, TaskState::Waiting, 2)));
        assert_eq!(
            ns.list[0].chosen, None,
            "a branch that runs again has not chosen yet"
        );
    }

    /// A workflow of `a → sub → z` whose `sub` runs a sub-workflow, with the runs `runs`.
    fn with_subworkflow(sub_state: TaskState, runs: &[(u128, WorkflowState)]) -> WorkflowDetail {
        let mut tasks = vec![
            crate::fixtures::task(1, TaskKind::Command, TaskState::Succeeded),
            crate::fixtures::task(2, TaskKind::Workflow, sub_state),
            crate::fixtures::task(3, TaskKind::Command, TaskState::Waiting),
        ];
        for (t, name) in tasks.iter_mut().zip(["a", "sub", "z"]) {
            t.name = Some(name.to_owned());
        }
        tasks[1].subworkflow = Some(serde_json::json!({"tasks": [{"name": "x"}]}));
        let workflow = serde_json::from_value(serde_json::json!({
            "id": Uuid::from_u128(100),
            "owner": "alice",
            "name": "outer",
            "state": "running",
            "created_at": "2027-01-15T08:00:00Z",
        }))
        .unwrap();
        WorkflowDetail {
            workflow,
            tasks,
            edges: [(2, 1), (3, 2)]
                .into_iter()
                .map(|(task, depends_on)| sked_types::WorkflowEdge {
                    task: Uuid::from_u128(task),
                    depends_on: Uuid::from_u128(depends_on),
                })
                .collect(),
            subworkflows: runs
                .iter()
                .map(|&(workflow, state)| sked_types::SubWorkflowRun {
                    task: Uuid::from_u128(2),
                    workflow: Uuid::from_u128(workflow),
                    state,
                })
                .collect(),
        }
    }

    #[test]
    fn a_subworkflow_task_says_the_state_of_its_latest_subworkflow_and_links_it() {
        let ns = Nodes::new(&with_subworkflow(TaskState::Waiting, &[]));
        let sub = &ns.list[1];
        assert!(sub.subworkflow);
        assert_eq!(sub.run_state(), Some("not started"));
        assert_eq!(sub.run_label().as_deref(), Some("sub-workflow not started"));
        assert_eq!(sub.run_href(), None, "nothing to open before it starts one");
        assert_eq!(
            ns.list[0].run_state(),
            None,
            "a command task runs no workflow"
        );
        assert_eq!(ns.list[0].run_label(), None);

        let ns = Nodes::new(&with_subworkflow(
            TaskState::Failed,
            &[(7, WorkflowState::Failed)],
        ));
        let sub = &ns.list[1];
        assert_eq!(sub.run_state(), Some("failed"));
        assert_eq!(sub.run_label().as_deref(), Some("sub-workflow failed"));
        assert_eq!(
            sub.run_href(),
            Some(format!("/workflows/{}", Uuid::from_u128(7)))
        );
        assert_eq!(
            ns.list[1].parents,
            vec![0],
            "its edges are read as any task's"
        );
        assert_eq!(ns.list[2].parents, vec![1]);

        let ns = Nodes::new(&with_subworkflow(
            TaskState::Blocked,
            &[(7, WorkflowState::Running)],
        ));
        assert_eq!(
            ns.list[1].run_label().as_deref(),
            Some("sub-workflow running")
        );
    }

    #[test]
    fn a_subworkflow_that_changes_or_a_subworkflow_task_that_does_refetches_the_workflow() {
        let mut ns = Nodes::new(&with_subworkflow(
            TaskState::Failed,
            &[(7, WorkflowState::Failed)],
        ));
        assert!(
            ns.runs_any(&[Uuid::from_u128(7)]),
            "its sub-workflow changed"
        );
        assert!(
            !ns.runs_any(&[Uuid::from_u128(8)]),
            "another workflow is none of its business"
        );
        assert!(
            ns.apply(&event(2, TaskState::Waiting, 2)),
            "run again, it goes back to its sub-workflow: which state that is in is fetched"
        );
        assert!(
            !ns.apply(&event(2, TaskState::Waiting, 2)),
            "an event that changes nothing fetches nothing"
        );
        assert!(ns.apply(&event(2, TaskState::Succeeded, 2)));
        assert_eq!(ns.list[1].state, TaskState::Succeeded);
        assert!(
            !ns.apply(&event(3, TaskState::Running, 1)),
            "a command task that starts needs nothing more"
        );
        assert!(
            ns.apply(&event(4, TaskState::Waiting, 0)),
            "a task spawned at run time is new to the page: it is fetched"
        );
    }

    #[test]
    fn live_events_patch_known_tasks_and_ask_for_what_they_lack() {
        let mut ns = nodes(&[TaskState::Running, TaskState::Failed]);
        assert!(
            ns.apply(&event(99, TaskState::Waiting, 0)),
            "a task the page does not know is fetched"
        );
        assert!(
            ns.apply(&event(1, TaskState::Failed, 1)),
            "a task that has just failed is fetched for its error"
        );
        assert_eq!(ns.list[0].state, TaskState::Failed);
        assert_eq!(ns.list[0].exit_code, Some(1));
        assert!(
            !ns.apply(&event(2, TaskState::Failed, 1)),
            "a task already failed needs nothing more"
        );
        assert!(
            !ns.apply(&event(2, TaskState::Retry, 2)),
            "a retry is in the event"
        );
        assert_eq!(
            ns.list[1].error, None,
            "a task that runs again has no error"
        );
        assert_eq!(ns.list[1].attempt, 2);
    }
}
