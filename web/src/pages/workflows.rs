//! Workflows: the list (`/workflows`) and one workflow's DAG (`/workflows/:id`).
//!
//! The list pages by keyset (newest first) with a state filter; a workflow that changes
//! state refetches the page that shows it, and on the first page a new one appears.
//!
//! A workflow's page draws its tasks as a graph laid out in Rust ([`layout`]): layers left to
//! right, boxes coloured by state (`data-task-id`, `data-state`), a click opens the task.
//! Workflows of more than [`MAX_GRAPH_TASKS`] tasks show the table only. Live task events
//! patch the states in place; a change of the workflow's own state, a task the page does
//! not know and `resync` refetch it. Actions: cancel the workflow, re-run it from its failed
//! tasks, retry one failed task.

mod graph;
mod layout;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::hooks::use_params_map;
use sked_types::{
    StateChange, Task, TaskState, Workflow, WorkflowChange, WorkflowDetail, WorkflowPage,
    WorkflowState,
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

fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds().max(0) as f64 / 1000.0
}

fn display_name(name: &str) -> String {
    if name.is_empty() {
        "(unnamed)".to_owned()
    } else {
        name.to_owned()
    }
}

/// A relative time that follows the clock, with the local time as its title.
fn age(at: DateTime<Utc>, tick: ReadSignal<u64>) -> impl IntoView {
    view! {
        <time datetime=at.to_rfc3339() title=ui::local_time(at)>
            {move || {
                tick.track();
                ui::relative(at)
            }}
        </time>
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
    Effect::watch(move || live.resync.get(), move |_, _, _| fetch(), false);
    Effect::watch(
        move || live.workflows.get(),
        move |ids, _, _| {
            // A workflow shown changed, or one may have been created (first page only).
            let shown = page.with_untracked(|p| {
                p.as_ref()
                    .is_some_and(|p| p.workflows.iter().any(|w| ids.contains(&w.id)))
            });
            if shown || cursors.with_untracked(Vec::is_empty) {
                fetch_soon();
            }
        },
        false,
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
                    "No workflows yet. Submit one with sked submit -f FILE or POST /api/v1/workflows."
                }
            }
        >
            <div class="table-wrap">
                <table class="workflow-list">
                    <thead>
                        <tr>
                            <th>"Workflow"</th>
                            <th>"State"</th>
                            <th>"Created"</th>
                            <th class="hide-narrow">"Finished"</th>
                            <th class="num">"Duration"</th>
                            <Show when=is_admin>
                                <th class="hide-narrow">"Owner"</th>
                            </Show>
                            <th class="hide-narrow">"Id"</th>
                        </tr>
                    </thead>
                    <tbody>
                        <For each=rows key=|w| (w.id, w.state, w.finished_at) let:w>
                            <WorkflowRow workflow=w tick=tick admin=Signal::derive(is_admin)/>
                        </For>
                    </tbody>
                </table>
            </div>
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
    let duration = move || {
        let end = finished.unwrap_or_else(|| {
            tick.track();
            ui::now()
        });
        ui::duration(seconds_between(created, end))
    };
    let owner = w.owner.clone();
    view! {
        <tr data-workflow-id=id.to_string() data-state=w.state.as_str()>
            <td>
                <a href=format!("/workflows/{id}")>{display_name(&w.name)}</a>
            </td>
            <td>
                <WorkflowBadge state=w.state/>
            </td>
            <td>{age(created, tick)}</td>
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
    cancel_requested: bool,
    /// Indices of its parents in the workflow's tasks.
    parents: Vec<usize>,
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
            cancel_requested: t.cancel_requested_at.is_some(),
            parents: Vec::new(),
        }
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
}

/// The workflow's tasks, their index by id, and the graph's shape as (parent, child) indices.
#[derive(Debug, Clone, PartialEq, Default)]
struct Nodes {
    list: Vec<Node>,
    index: HashMap<Uuid, usize>,
    edges: Vec<(usize, usize)>,
}

impl Nodes {
    fn new(detail: &WorkflowDetail) -> Self {
        let mut list: Vec<Node> = detail.tasks.iter().map(Node::new).collect();
        let index: HashMap<Uuid, usize> = list.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        let mut edges = Vec::with_capacity(detail.edges.len());
        for e in &detail.edges {
            if let (Some(&parent), Some(&child)) = (index.get(&e.depends_on), index.get(&e.task)) {
                edges.push((parent, child));
                list[child].parents.push(parent);
            }
        }
        Nodes { list, index, edges }
    }

    /// The ids and edges, which decide the graph's layout.
    fn shape(&self) -> (Vec<Uuid>, Vec<(usize, usize)>) {
        (self.list.iter().map(|n| n.id).collect(), self.edges.clone())
    }

    fn count(&self, state: TaskState) -> usize {
        self.list.iter().filter(|n| n.state == state).count()
    }
}

#[component]
pub fn WorkflowPage() -> impl IntoView {
    let live = live::live();
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id").and_then(|s| s.parse::<Uuid>().ok())));
    let workflow = RwSignal::new(None::<Workflow>);
    let nodes = RwSignal::new(Nodes::default());
    let error = RwSignal::new(None::<String>);
    let action_error = RwSignal::new(None::<String>);
    let notice = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let generation = StoredValue::new(0u64);
    let tick = ui::ticker(1000);

    let fetch = move || {
        let Some(wid) = id.get_untracked() else {
            return;
        };
        generation.update_value(|g| *g += 1);
        let mine = generation.get_value();
        spawn_local(async move {
            let result = api::get::<WorkflowDetail>(&format!("/workflows/{wid}")).await;
            if generation.try_get_value() != Some(mine) {
                return;
            }
            match result {
                Ok(detail) => {
                    nodes.set(Nodes::new(&detail));
                    workflow.set(Some(detail.workflow));
                    error.set(None);
                }
                Err(e) => error.set(Some(e.message)),
            }
        });
    };
    let fetch_soon = ui::throttled(REFETCH_GAP_MS, fetch);

    Effect::new(move |_| {
        id.track();
        workflow.set(None);
        nodes.set(Nodes::default());
        notice.set(None);
        action_error.set(None);
        fetch();
    });
    Effect::watch(move || live.resync.get(), move |_, _, _| fetch(), false);
    Effect::watch(
        move || live.workflows.get(),
        {
            let fetch_soon = fetch_soon.clone();
            move |ids: &Arc<Vec<Uuid>>, _, _| {
                if id.get_untracked().is_some_and(|wid| ids.contains(&wid)) {
                    fetch_soon();
                }
            }
        },
        false,
    );
    Effect::watch(
        move || live.tasks.get(),
        move |batch, _, _| {
            let Some(wid) = id.get_untracked() else {
                return;
            };
            let ours: Vec<_> = batch
                .iter()
                .filter(|t| t.workflow_id == Some(wid))
                .collect();
            if ours.is_empty() {
                return;
            }
            let mut refetch = false;
            nodes.update(|ns| {
                for t in ours {
                    let Some(&i) = ns.index.get(&t.id) else {
                        refetch = true;
                        continue;
                    };
                    let n = &mut ns.list[i];
                    if t.state == TaskState::Failed && n.state != TaskState::Failed {
                        // The error message is not in the event.
                        refetch = true;
                    }
                    if !t.state.is_final() {
                        n.error = None;
                    }
                    n.state = t.state;
                    n.attempt = t.attempt;
                    n.max_attempts = t.max_attempts;
                    n.started_at = t.started_at;
                    n.finished_at = t.finished_at;
                    n.exit_code = t.exit_code;
                    n.cancel_requested = t.cancel_requested;
                }
            });
            if refetch {
                fetch_soon();
            }
        },
        false,
    );

    // Runs an action, shows its outcome, and refetches.
    let act = move |request: Action| {
        busy.set(true);
        action_error.set(None);
        notice.set(None);
        spawn_local(async move {
            match request.await {
                Ok(message) => {
                    notice.try_set(Some(message));
                }
                Err(e) => {
                    action_error.try_set(Some(e.message));
                }
            }
            busy.try_set(false);
            fetch();
        });
    };
    let cancel = move |_| {
        let Some(wid) = id.get_untracked() else {
            return;
        };
        act(Box::pin(async move {
            let change: WorkflowChange =
                api::post_empty(&format!("/workflows/{wid}/cancel")).await?;
            Ok(match change.state {
                WorkflowState::Running => {
                    "Cancelled: tasks not started are cancelled; running ones are being stopped."
                        .to_owned()
                }
                state => format!("The workflow is {state}."),
            })
        }));
    };
    let rerun = move |_| {
        let Some(wid) = id.get_untracked() else {
            return;
        };
        act(Box::pin(async move {
            let change: WorkflowChange =
                api::post_empty(&format!("/workflows/{wid}/retry")).await?;
            Ok(match change.tasks_rerun {
                1 => "1 task runs again, and the tasks after it wait for it.".to_owned(),
                n => format!("{n} tasks run again, and the tasks after them wait for them."),
            })
        }));
    };
    let retry_task = move |task: Uuid, name: String| {
        act(Box::pin(async move {
            let change: StateChange = api::post_empty(&format!("/tasks/{task}/retry")).await?;
            Ok(format!(
                "{name} runs again (now {}).",
                change.state.as_str().replace('_', " ")
            ))
        }));
    };

    let state = Signal::derive(move || {
        workflow.with(|w| w.as_ref().map_or(WorkflowState::Running, |w| w.state))
    });
    let running = move || {
        workflow.with(|w| {
            w.as_ref()
                .is_some_and(|w| w.state == WorkflowState::Running)
        })
    };
    let rerunnable = move || {
        nodes.with(|ns| {
            ns.list
                .iter()
                .any(|n| matches!(n.state, TaskState::Failed | TaskState::Cancelled))
        })
    };
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
    let shape = Memo::new(move |_| nodes.with(Nodes::shape));
    let graph = Memo::new(move |_| {
        shape.with(|(ids, edges)| {
            (!ids.is_empty() && ids.len() <= MAX_GRAPH_TASKS)
                .then(|| Arc::new(layout::layout(ids.len(), edges)))
        })
    });

    let page_error = Signal::derive(move || match id.get() {
        None => Some("This is not a workflow id.".to_owned()),
        Some(_) => error.get(),
    });

    view! {
        <p class="hint"><a href="/workflows">"← Workflows"</a></p>
        <ui::Loaded error=page_error ready=Signal::derive(move || workflow.with(Option::is_some))>
            {move || workflow.get().map(|w| view! {
                <h1>
                    {display_name(&w.name)} " " <WorkflowBadge state=state/>
                </h1>
                <div class="panel">
                    <dl class="kv">
                        <dt>"Id"</dt>
                        <dd class="mono">{w.id.to_string()}</dd>
                        <dt>"Owner"</dt>
                        <dd>{w.owner.clone()}</dd>
                        <dt>"Created"</dt>
                        <dd><ui::Time at=w.created_at/> " (" {age(w.created_at, tick)} ")"</dd>
                        <dt>"Finished"</dt>
                        <dd>
                            {match w.finished_at {
                                Some(at) => view! {
                                    <ui::Time at=at/>
                                    " (after " {ui::duration(seconds_between(w.created_at, at))} ")"
                                }.into_any(),
                                None => view! { "not yet" }.into_any(),
                            }}
                        </dd>
                        <dt>"Tasks"</dt>
                        <dd>{summary}</dd>
                    </dl>
                </div>
            })}
            <div class="actions">
                <button
                    type="button"
                    class="danger"
                    data-action="cancel"
                    disabled=move || busy.get() || !running()
                    on:click=cancel
                >
                    "Cancel workflow"
                </button>
                <button
                    type="button"
                    data-action="rerun"
                    disabled=move || busy.get() || !rerunnable()
                    title="Run the failed and cancelled tasks again; the tasks after them wait for them"
                    on:click=rerun
                >
                    "Re-run from failed"
                </button>
            </div>
            <ui::ErrorBox message=action_error/>
            <Show when=move || notice.with(Option::is_some)>
                <p class="notice" role="status">{move || notice.get()}</p>
            </Show>
            <h2>"Graph"</h2>
            {move || match graph.get() {
                Some(g) => view! { <Graph layout=g nodes=nodes/> }.into_any(),
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
            }}
            <h2>"Tasks"</h2>
            <TaskTable nodes=nodes tick=tick busy=busy retry=retry_task/>
        </ui::Loaded>
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
    let filter = RwSignal::new(String::new());
    let limit = RwSignal::new(TABLE_ROWS);
    // (index, id) of the rows that pass the filter.
    let matching = move || {
        let f = filter.get();
        nodes.with(|ns| {
            ns.list
                .iter()
                .enumerate()
                .filter(|(_, n)| f.is_empty() || n.state.as_str() == f)
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
                prop:value=move || filter.get()
                on:change=move |ev| {
                    filter.set(event_target_value(&ev));
                    limit.set(TABLE_ROWS);
                }
            >
                <option value="">"All states"</option>
                {options}
            </select>
        </form>
        <div class="table-wrap">
            <table class="workflow-tasks">
                <thead>
                    <tr>
                        <th>"Task"</th>
                        <th>"State"</th>
                        <th class="num hide-narrow">"Attempt"</th>
                        <th class="hide-narrow">"After"</th>
                        <th class="hide-narrow">"Started"</th>
                        <th class="num">"Duration"</th>
                        <th class="hide-narrow">"Error"</th>
                        <th></th>
                    </tr>
                </thead>
                <tbody>
                    <For each=shown key=|row| *row let:row>
                        <TaskRow index=row.0 nodes=nodes tick=tick busy=busy retry=retry/>
                    </For>
                </tbody>
            </table>
        </div>
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
    let rule = (first.trigger_rule != "all_success").then(|| first.trigger_rule.replace('_', " "));
    let attempt = move || node().map(|n| format!("{}/{}", n.attempt, n.max_attempts));
    let started = move || {
        node()
            .and_then(|n| n.started_at)
            .map(|at| view! { <ui::Time at=at/> })
    };
    let duration = move || {
        node().and_then(|n| {
            n.started_at.map(|start| {
                let end = n.finished_at.unwrap_or_else(|| {
                    tick.track();
                    ui::now()
                });
                ui::duration(seconds_between(start, end))
            })
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
                    <button
                        type="button"
                        data-action="retry"
                        disabled=move || busy.get()
                        on:click={
                            let name = name.clone();
                            move |_| retry(id, name.clone())
                        }
                    >
                        "Retry"
                    </button>
                </Show>
            </td>
        </tr>
    }
    .into_any()
}
