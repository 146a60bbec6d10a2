//! One task (`/tasks/:id`): its definition, attempts, output, actions and a live log tail.
//!
//! The detail is refetched when a live event names the task (and on `resync`). The log is
//! read with `GET /api/v1/tasks/{id}/logs?after=N` from the last chunk shown: a `logs` event
//! naming the task (or `resync`) fetches only the chunks after it, one request at a time.
//! The log view stays at the bottom while new output arrives unless the reader scrolled up;
//! each line shows when it was written, a search shows the matching lines, and Download saves
//! the whole log (read through the API, saved from a blob: the token stays in headers).
//!
//! A sub-workflow task (kind `workflow`) shows what it runs (its `subworkflow`, as JSON) and
//! a link to its latest sub-workflow, read from its workflow's detail when the task's state
//! or attempt changes.

use leptos::html::Pre;
use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::hooks::{use_navigate, use_params_map};
use sked_types::{
    Attempt, LogChunk, StateChange, SubWorkflowRun, Submitted, Task, TaskDetail, TaskKind,
    TaskState, WorkflowDetail,
};
use uuid::Uuid;

use crate::{api, live, ui};

/// Log chunks per request.
const LOG_PAGE: usize = 1000;
/// Chunks kept in the page; older ones are dropped from the view.
const LOG_KEEP: usize = 20_000;
/// How often the detail of a task that waits to run is fetched again (milliseconds).
const WAITING_REFRESH_MS: u32 = 10_000;
/// A reader closer than this to the bottom of the log (pixels) keeps following it.
const STICK_PX: i32 = 24;

/// A task that runs nothing itself: a service, which runs as its copies, a sharded task,
/// which runs as its shards (`docs/services.md`, `docs/shards.md`), or a sub-workflow task,
/// which runs as its sub-workflow (`docs/workflows.md`). Its row waits `blocked` on them and
/// has no log or worker of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parent {
    Service,
    Shards,
    Workflow,
}

impl Parent {
    fn of(task: &Task) -> Option<Parent> {
        if task.shard_of.is_some() {
            None
        } else if task.kind == TaskKind::Service {
            Some(Parent::Service)
        } else if task.shard_total.is_some() {
            Some(Parent::Shards)
        } else if task.kind == TaskKind::Workflow {
            Some(Parent::Workflow)
        } else {
            None
        }
    }

    /// What it runs as: `its 3 copies`, `its 4 shards`.
    fn parts(self, task: &Task) -> String {
        let n = task.shard_total.unwrap_or_default();
        match (self, n) {
            (Parent::Service, 1) => "its copy".to_owned(),
            (Parent::Service, n) => format!("its {n} copies"),
            (Parent::Shards, 1) => "its shard".to_owned(),
            (Parent::Shards, n) => format!("its {n} shards"),
            (Parent::Workflow, _) => "its sub-workflow".to_owned(),
        }
    }

    /// Who runs in its stead: `only its 3 copies do`.
    fn runners(self, task: &Task) -> String {
        match self {
            Parent::Workflow => "only the tasks of its sub-workflow do".to_owned(),
            p => format!("only {} do", p.parts(task)),
        }
    }
}

/// What a sub-workflow task runs, in a few words: `the stored definition etl (version 3)`,
/// or `2 tasks: extract, load` for a workflow given inline (the first names only when there
/// are many).
fn subworkflow_summary(body: &serde_json::Value) -> String {
    const NAMES: usize = 5;
    if let Some(name) = body.get("definition").and_then(|d| d.as_str()) {
        return match body.get("version").and_then(serde_json::Value::as_i64) {
            Some(v) => format!("the stored definition {name} (version {v})"),
            None => format!("the stored definition {name} (its latest version)"),
        };
    }
    let tasks = body
        .get("tasks")
        .and_then(|t| t.as_array())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut names: Vec<&str> = tasks
        .iter()
        .take(NAMES)
        .map(|t| t.get("name").and_then(|n| n.as_str()).unwrap_or("?"))
        .collect();
    if tasks.len() > NAMES {
        names.push("…");
    }
    match tasks.len() {
        0 => "a workflow".to_owned(),
        1 => format!("1 task: {}", names.join(", ")),
        n => format!("{n} tasks: {}", names.join(", ")),
    }
}

/// The latest sub-workflow of the sub-workflow task `task` among its workflow's.
fn latest_run(detail: &WorkflowDetail, task: Uuid) -> Option<SubWorkflowRun> {
    detail.subworkflows.iter().find(|r| r.task == task).cloned()
}

/// The latest sub-workflow of the sub-workflow task shown: for the task (by id), the run
/// (`None`: it has not started one) or why it could not be read.
type LatestRun = Option<(Uuid, Result<Option<SubWorkflowRun>, String>)>;

/// A chunk of the log as shown: its text in pieces, each a line or the rest of one, and the
/// time the chunk was written before each piece that starts a line.
#[derive(Debug, Clone)]
struct LogLine {
    id: i64,
    stderr: bool,
    /// The attempt whose output starts with this chunk, when it is not the first attempt.
    attempt_mark: Option<i32>,
    pieces: Vec<(Option<String>, String)>,
}

/// `data` in pieces that each end with a newline but the last, each with `time` when it
/// starts a line (the first one only when `at_line_start`); returns whether the next chunk
/// starts a line.
fn pieces(
    data: &str,
    time: &str,
    mut at_line_start: bool,
) -> (Vec<(Option<String>, String)>, bool) {
    let mut out = Vec::new();
    for piece in data.split_inclusive('\n') {
        out.push((at_line_start.then(|| time.to_owned()), piece.to_owned()));
        at_line_start = piece.ends_with('\n');
    }
    (out, at_line_start)
}

/// The log tail of one task.
#[derive(Clone, Copy)]
struct LogTail {
    lines: RwSignal<Vec<LogLine>>,
    /// Whether chunks were dropped from the front of the view.
    dropped: RwSignal<bool>,
    error: RwSignal<Option<String>>,
    /// The task the lines belong to.
    task: StoredValue<Option<Uuid>>,
    /// The id of the last chunk read.
    last: StoredValue<i64>,
    last_attempt: StoredValue<Option<i32>>,
    /// Whether the last chunk read ended its line.
    at_line_start: StoredValue<bool>,
    busy: StoredValue<bool>,
    again: StoredValue<bool>,
    /// Follow new output (the reader is at the bottom).
    stick: StoredValue<bool>,
    pre: NodeRef<Pre>,
}

impl LogTail {
    fn new() -> Self {
        LogTail {
            lines: RwSignal::new(Vec::new()),
            dropped: RwSignal::new(false),
            error: RwSignal::new(None),
            task: StoredValue::new(None),
            last: StoredValue::new(0),
            last_attempt: StoredValue::new(None),
            at_line_start: StoredValue::new(true),
            busy: StoredValue::new(false),
            again: StoredValue::new(false),
            stick: StoredValue::new(true),
            pre: NodeRef::new(),
        }
    }

    fn reset(&self, task: Option<Uuid>) {
        self.task.set_value(task);
        self.last.set_value(0);
        self.last_attempt.set_value(None);
        self.at_line_start.set_value(true);
        self.busy.set_value(false);
        self.again.set_value(false);
        self.stick.set_value(true);
        self.lines.set(Vec::new());
        self.dropped.set(false);
        self.error.set(None);
    }

    fn append(&self, chunks: Vec<LogChunk>) {
        let Some(last) = chunks.last().map(|c| c.id) else {
            return;
        };
        self.last.set_value(last);
        let mut previous = self.last_attempt.get_value();
        let mut at_line_start = self.at_line_start.get_value();
        let new: Vec<LogLine> = chunks
            .into_iter()
            .map(|c| {
                let mark = match previous {
                    Some(p) => (p != c.attempt).then_some(c.attempt),
                    None => (c.attempt > 1).then_some(c.attempt),
                };
                // Another attempt's output starts a line of its own.
                if mark.is_some() {
                    at_line_start = true;
                }
                previous = Some(c.attempt);
                let (pieces, next) = pieces(&c.data, &ui::local_clock(c.at), at_line_start);
                at_line_start = next;
                LogLine {
                    id: c.id,
                    stderr: c.stream == "stderr",
                    attempt_mark: mark,
                    pieces,
                }
            })
            .collect();
        self.last_attempt.set_value(previous);
        self.at_line_start.set_value(at_line_start);
        let follow = self.stick.get_value();
        self.lines.update(|lines| {
            lines.extend(new);
            if lines.len() > LOG_KEEP {
                let excess = lines.len() - LOG_KEEP;
                lines.drain(..excess);
                self.dropped.set(true);
            }
        });
        if follow {
            let pre = self.pre;
            request_animation_frame(move || {
                if let Some(el) = pre.get_untracked() {
                    el.set_scroll_top(el.scroll_height());
                }
            });
        }
    }

    /// Reads the chunks after the last one shown; a call while a read runs makes that read
    /// go once more instead.
    fn pull(self) {
        let Some(Some(task)) = self.task.try_get_value() else {
            return;
        };
        if self.busy.get_value() {
            self.again.set_value(true);
            return;
        }
        self.busy.set_value(true);
        spawn_local(async move {
            loop {
                let Some(after) = self.last.try_get_value() else {
                    return;
                };
                let result = api::get::<Vec<LogChunk>>(&format!(
                    "/tasks/{task}/logs?after={after}&limit={LOG_PAGE}"
                ))
                .await;
                // Another task is shown now (its reset cleared `busy`), or the page is gone.
                if self.task.try_get_value() != Some(Some(task)) {
                    return;
                }
                let full = match result {
                    Ok(chunks) => {
                        let full = chunks.len() == LOG_PAGE;
                        self.error.set(None);
                        self.append(chunks);
                        full
                    }
                    Err(e) => {
                        self.error.set(Some(e.message));
                        false
                    }
                };
                if full {
                    continue;
                }
                if self.again.get_value() {
                    self.again.set_value(false);
                    continue;
                }
                self.busy.set_value(false);
                return;
            }
        });
    }

    fn on_scroll(&self) {
        if let Some(el) = self.pre.get_untracked() {
            let gap = el.scroll_height() - el.scroll_top() - el.client_height();
            self.stick.set_value(gap <= STICK_PX);
        }
    }
}

#[component]
pub fn TaskPage() -> impl IntoView {
    let live = live::live();
    let params = use_params_map();
    let raw_id = Memo::new(move |_| params.with(|p| p.get("id").unwrap_or_default()));
    let id = Memo::new(move |_| raw_id.with(|s| Uuid::parse_str(s).ok()));
    let detail = RwSignal::new(None::<TaskDetail>);
    let error = RwSignal::new(None::<String>);
    // The last action's error; kept while the detail is refetched.
    let action_error = RwSignal::new(None::<String>);
    let generation = StoredValue::new(0u64);
    let log = LogTail::new();
    // Text searched for in the log (case-insensitive); empty: the whole log.
    let search = RwSignal::new(String::new());
    let times = RwSignal::new(true);
    let tick = ui::ticker(1000);
    ui::WorkerNames::provide();
    let latest = RwSignal::<LatestRun>::new(None);
    follow_latest_run(detail, latest);

    let load = move || {
        let Some(task) = id.get_untracked() else {
            return;
        };
        generation.update_value(|g| *g += 1);
        let mine = generation.get_value();
        spawn_local(async move {
            let result = api::get::<TaskDetail>(&format!("/tasks/{task}")).await;
            if generation.try_get_value() != Some(mine) {
                return;
            }
            match result {
                Ok(d) => {
                    // The log is read once the task is known to exist and be visible.
                    let first = detail.with_untracked(Option::is_none);
                    detail.set(Some(d));
                    error.set(None);
                    if first {
                        log.pull();
                    }
                }
                Err(e) => error.set(Some(e.message)),
            }
        });
    };

    // A new id (also when "Run again" leads to the new task): start over.
    Effect::new(move |_| {
        let task = id.get();
        detail.set(None);
        error.set(None);
        action_error.set(None);
        log.reset(task);
        if task.is_some() {
            load();
        }
    });
    live.on_change(
        |l| l.resync.track(),
        move || {
            load();
            log.pull();
        },
    );
    live.on_tasks(move |batch| {
        if let Some(task) = id.get_untracked()
            && batch.iter().any(|t| t.id == task)
        {
            load();
        }
    });
    // Why a task waits changes without an event naming it (a worker starts or stops, a
    // queue is paused or a running task of its queue ends): a waiting task's detail is also
    // fetched again on worker changes and every WAITING_REFRESH_MS.
    let waits = move || {
        detail.with_untracked(|d| {
            d.as_ref().is_some_and(|d| {
                matches!(
                    d.task.state,
                    TaskState::Blocked | TaskState::Waiting | TaskState::Retry
                )
            })
        })
    };
    let reload_waiting = ui::throttled(1000.0, move || {
        if waits() {
            load();
        }
    });
    live.on_change(|l| l.workers.track(), reload_waiting.clone());
    let slow = ui::ticker(WAITING_REFRESH_MS);
    Effect::watch(move || slow.get(), move |_, _, _| reload_waiting(), false);
    live.on_ids(
        |l| l.logs,
        move |ids| {
            if let Some(task) = id.get_untracked()
                && ids.contains(&task)
            {
                log.pull();
            }
        },
    );

    let title = move || match id.get() {
        Some(task) => format!("Task {}", ui::short_id(&task)),
        None => "Task".to_owned(),
    };
    let state = move || detail.with(|d| d.as_ref().map(|d| d.task.state));
    let parent = move || detail.with(|d| d.as_ref().and_then(|d| Parent::of(&d.task)));
    let started = move || detail.with(|d| d.as_ref().is_some_and(|d| d.task.attempt >= 1));
    // A service's row waits `blocked` on its copies until it is stopped: the service is active.
    let head_badge = move || {
        match (state(), parent()) {
        (Some(TaskState::Blocked), Some(Parent::Service)) => view! {
            <span class="badge state-running" data-state="blocked" data-shown-state="active"
                title="The service runs as its copies (see Copies); its own row waits on them, blocked, until it is stopped">
                "active"
            </span>
        }
        .into_any(),
        // A sub-workflow task waits `blocked` on its sub-workflow while that runs.
        (Some(TaskState::Blocked), Some(Parent::Workflow)) if started() => view! {
            <span class="badge state-running" data-state="blocked" data-shown-state="running"
                title="Its sub-workflow runs; its own row waits on it, blocked, until it ends">
                "running"
            </span>
        }
        .into_any(),
        (Some(s), _) => view! { <ui::StateBadge state=s/> }.into_any(),
        (None, _) => ().into_any(),
    }
    };
    // A service that runs, and its owner: its controls (scale, change, stop) stay while it
    // runs, whatever else of its row a refetch changes, so what is typed in them stays.
    let service_controls = Memo::new(move |_| {
        detail.with(|d| {
            d.as_ref()
                .filter(|d| {
                    Parent::of(&d.task) == Some(Parent::Service) && !d.task.state.is_final()
                })
                .map(|d| (d.task.id, d.task.owner.clone()))
        })
    });
    let page_error = Signal::derive(move || match id.get() {
        None => Some(format!("“{}” is not a task id.", raw_id.get())),
        Some(_) => error.get(),
    });
    view! {
        <div class="task-head">
            <h1>{title}</h1>
            {head_badge}
        </div>
        <ui::Loaded error=page_error ready=Signal::derive(move || detail.with(Option::is_some))>
            {move || detail.get().map(|d| view! { <Detail detail=d tick=tick reload=load action_error=action_error latest=latest/> })}
            {move || service_controls.get().map(|(sid, owner)| view! {
                <super::service::ServiceControls id=sid owner=owner/>
            })}
            {move || detail.with(|d| d.as_ref().and_then(|d| Parent::of(&d.task).map(|p| (p, d.task.clone())))).map(|(p, t)| {
                let (whose, link) = match p {
                    Parent::Service => ("each copy has its own log: open a copy from Copies above", None),
                    Parent::Shards => ("each shard has its own log", Some((format!("/tasks?shard_of={}", t.id), "its shards"))),
                    Parent::Workflow => (
                        "each of its tasks has its own log",
                        run_href(latest, t.id).map(|href| (href, "its sub-workflow")),
                    ),
                };
                view! {
                    <section class="panel" data-parent-log="">
                        <h2>"Log"</h2>
                        <p class="hint">
                            {format!("It prints nothing itself, running as {}: {whose}", p.parts(&t))}
                            {link.map(|(l, text)| view! { " (" <a href=l>{text}</a> ")" })}
                            "."
                        </p>
                    </section>
                }
            })}
            <section class="panel" class:hidden=move || parent().is_some()>
                <h2>"Log"</h2>
                <Show when=move || log.dropped.get()>
                    <p class="hint">"Earlier output is not shown (the view keeps the last chunks)."</p>
                </Show>
                <LogTools id=id search=search times=times/>
                <ui::ErrorBox message=log.error/>
                <Show when=move || !search.with(String::is_empty)>
                    <p class="hint" data-log-matches="">
                        {move || {
                            let n = matching(&log, &search.get()).len();
                            format!("{} matching {}", ui::count(n as i64), if n == 1 { "line" } else { "lines" })
                        }}
                    </p>
                </Show>
                <pre
                    class="log"
                    class:no-times=move || !times.get()
                    data-log=move || id.get().map(|i| i.to_string()).unwrap_or_default()
                    node_ref=log.pre
                    on:scroll=move |_| log.on_scroll()
                >
                    <Show
                        when=move || search.with(String::is_empty)
                        fallback=move || {
                            matching(&log, &search.get())
                                .into_iter()
                                .map(|(time, text, stderr)| view! {
                                    <span class="line">
                                        {time.map(|t| view! { <span class="ts">{t}</span> })}
                                        <span class:stderr=stderr>{text}</span>
                                    </span>
                                })
                                .collect_view()
                        }
                    >
                        <For each=move || log.lines.get() key=|line| line.id let:line>
                            {line.attempt_mark.map(|n| view! { <span class="mark">{format!("── attempt {n} ──\n")}</span> })}
                            {line.pieces.into_iter().map(|(time, text)| view! {
                                {time.map(|t| view! { <span class="ts">{t}</span> })}
                                <span class:stderr=line.stderr>{text}</span>
                            }).collect_view()}
                        </For>
                    </Show>
                </pre>
                <Show when=move || log.lines.with(Vec::is_empty) && log.error.with(Option::is_none)>
                    <p class="hint">
                        {move || {
                            let running = detail
                                .with(|d| d.as_ref().is_some_and(|d| !d.task.state.is_final()));
                            if running { "No output yet." } else { "No output." }
                        }}
                    </p>
                </Show>
            </section>
            {move || detail.get().map(|d| view! { <Definition detail=d tick=tick/> })}
        </ui::Loaded>
    }
}

/// Reads the latest sub-workflow of the sub-workflow task shown into `latest`, from its
/// workflow's detail: when the task is first shown and whenever its state or attempt changes
/// (its sub-workflow has started or ended). An answer to an older request is dropped.
fn follow_latest_run(detail: RwSignal<Option<TaskDetail>>, latest: RwSignal<LatestRun>) {
    let key = Memo::new(move |_| {
        detail.with(|d| {
            let t = &d.as_ref()?.task;
            (t.kind == TaskKind::Workflow)
                .then_some(t.workflow_id)
                .flatten()
                .map(|w| (t.id, w, t.state, t.attempt))
        })
    });
    let generation = StoredValue::new(0u64);
    Effect::new(move |_| {
        let Some((task, wid, _, _)) = key.get() else {
            return;
        };
        generation.update_value(|g| *g += 1);
        let mine = generation.get_value();
        spawn_local(async move {
            let result = api::get::<WorkflowDetail>(&format!("/workflows/{wid}")).await;
            if generation.try_get_value() != Some(mine) {
                return;
            }
            let run = result.map(|d| latest_run(&d, task)).map_err(|e| e.message);
            latest.try_set(Some((task, run)));
        });
    });
}

/// The page of the latest sub-workflow of `task`, once read.
fn run_href(latest: RwSignal<LatestRun>, task: Uuid) -> Option<String> {
    latest.with(|l| match l {
        Some((t, Ok(Some(run)))) if *t == task => Some(format!("/workflows/{}", run.workflow)),
        _ => None,
    })
}

/// A sub-workflow task's latest sub-workflow, as a link with its state; `not started yet`
/// before it has one.
#[component]
fn LatestRunLink(task: Uuid, latest: RwSignal<LatestRun>) -> impl IntoView {
    move || {
        latest.with(|l| match l {
            Some((t, Ok(Some(run)))) if *t == task => {
                let state = run.state.as_str();
                view! {
                    <a class="mono" href=format!("/workflows/{}", run.workflow) title=run.workflow.to_string()
                        data-action="open-subworkflow">
                        {ui::short_id(&run.workflow)}
                    </a>
                    " "
                    <span class=format!("badge state-{state}") data-state=state>{state}</span>
                }
                .into_any()
            }
            Some((t, Ok(None))) if *t == task => view! { "not started yet" }.into_any(),
            Some((t, Err(e))) if *t == task => {
                view! { <span class="bad">{format!("cannot read its workflow: {e}")}</span> }.into_any()
            }
            _ => view! { "…" }.into_any(),
        })
    }
}

/// The log's pieces whose text holds `term`, ignoring case, with their time and stream: the
/// lines a search shows. A line written in several chunks is matched piece by piece.
fn matching(log: &LogTail, term: &str) -> Vec<(Option<String>, String, bool)> {
    let term = term.to_lowercase();
    log.lines.with(|lines| {
        lines
            .iter()
            .flat_map(|l| l.pieces.iter().map(move |(t, text)| (t, text, l.stderr)))
            .filter(|(_, text, _)| text.to_lowercase().contains(&term))
            .map(|(t, text, stderr)| {
                let mut text = text.clone();
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                (t.clone(), text, stderr)
            })
            .collect()
    })
}

/// Above the log view: the search box, whether times show, and Download.
#[component]
fn LogTools(
    id: Memo<Option<Uuid>>,
    search: RwSignal<String>,
    times: RwSignal<bool>,
) -> impl IntoView {
    let downloading = RwSignal::new(false);
    let error = RwSignal::new(None::<String>);
    let download = move |_| {
        let Some(task) = id.get_untracked() else {
            return;
        };
        downloading.set(true);
        error.set(None);
        spawn_local(async move {
            let result = download_log(task).await;
            downloading.try_set(false);
            if let Err(e) = result {
                error.try_set(Some(e));
            }
        });
    };
    view! {
        <div class="filters log-tools">
            <input
                type="search"
                name="log-search"
                placeholder="Search the log"
                aria-label="Search the log"
                prop:value=move || search.get()
                on:input=move |ev| search.set(event_target_value(&ev))
            />
            <label class="choice">
                <input
                    type="checkbox"
                    name="log-times"
                    prop:checked=move || times.get()
                    on:change=move |ev| times.set(event_target_checked(&ev))
                />
                {format!("Times ({})", ui::time_zone())}
            </label>
            <ui::ActionButton action="download-log" disabled=downloading on_click=download
                title="Download the whole log as a text file">
                {move || if downloading.get() { "Downloading…" } else { "Download" }}
            </ui::ActionButton>
        </div>
        <ui::ErrorBox message=error/>
    }
}

/// Reads the whole log (`GET /api/v1/tasks/{id}/logs`, 10,000 chunks a request, with the
/// signed-in token in the `Authorization` header as every call) and saves it as
/// `task-<id>.log`, through a `Blob`: no address carries the token. stdout and stderr are
/// interleaved as written, each attempt's output after a line naming it.
async fn download_log(task: Uuid) -> Result<(), String> {
    const PAGE: usize = 10_000;
    let mut text = String::new();
    let mut after = 0;
    let mut attempt = None;
    loop {
        let chunks =
            api::get::<Vec<LogChunk>>(&format!("/tasks/{task}/logs?after={after}&limit={PAGE}"))
                .await
                .map_err(|e| e.message)?;
        for c in &chunks {
            if attempt.is_some_and(|a| a != c.attempt) || (attempt.is_none() && c.attempt > 1) {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&format!("── attempt {} ──\n", c.attempt));
            }
            attempt = Some(c.attempt);
            text.push_str(&c.data);
        }
        match chunks.last() {
            Some(last) if chunks.len() == PAGE => after = last.id,
            _ => break,
        }
    }
    save_text(&format!("task-{task}.log"), &text).map_err(|e| format!("saving the log: {e:?}"))
}

/// Offers `text` to the browser as a file download named `name`.
fn save_text(name: &str, text: &str) -> Result<(), wasm_bindgen::JsValue> {
    use wasm_bindgen::JsCast;
    let parts = js_sys::Array::of1(&wasm_bindgen::JsValue::from_str(text));
    let options = web_sys::BlobPropertyBag::new();
    options.set_type("text/plain;charset=utf-8");
    let blob = web_sys::Blob::new_with_str_sequence_and_options(&parts, &options)?;
    let url = web_sys::Url::create_object_url_with_blob(&blob)?;
    let document = web_sys::window()
        .and_then(|w| w.document())
        .ok_or("no document")?;
    let a: web_sys::HtmlAnchorElement = document.create_element("a")?.dyn_into()?;
    a.set_href(&url);
    a.set_download(name);
    a.set_attribute("data-download", name)?;
    a.click();
    web_sys::Url::revoke_object_url(&url)?;
    Ok(())
}

/// Above the log: the command, actions, what and where the task runs, and its output.
#[component]
fn Detail(
    detail: TaskDetail,
    tick: ReadSignal<u64>,
    reload: impl Fn() + Copy + Send + Sync + 'static,
    action_error: RwSignal<Option<String>>,
    latest: RwSignal<LatestRun>,
) -> impl IntoView {
    let waiting_reason = detail.waiting_reason;
    let task = detail.task;
    let t = task.clone();
    let argv = task.argv();
    let command = match (&task.kind, &task.subworkflow) {
        (TaskKind::Command, _) => ui::command_line(&argv),
        (TaskKind::Workflow, Some(body)) => format!("(workflow) {}", subworkflow_summary(body)),
        _ => format!("({}) {}", task.kind, ui::command_line(&argv)),
    };
    // A sub-workflow task waits `blocked` on its sub-workflow, which is no reason to tell.
    let runs_its_subworkflow = task.kind == TaskKind::Workflow && task.attempt >= 1;
    let running_for = {
        let (start, end) = (task.started_at, task.finished_at);
        move || start.map(|s| ui::elapsed(s, end, tick))
    };
    let output = task.output.as_ref().map(pretty);
    // The command line above says it all unless the arguments were given apart.
    let split_args = !task.args.is_empty();
    view! {
        <p class="mono command-line"><ui::Cut text=command/></p>
        <Actions task=t reload=reload error=action_error/>
        <section class="panel">
            <dl class="kv">
                {task.cancel_requested_at.filter(|_| !task.state.is_final()).map(|at| view! {
                    <dt>"Cancel requested"</dt>
                    <dd><ui::Time at=at/> " — the worker is stopping the process"</dd>
                })}
                <dt>"Id"</dt>
                <dd class="mono">{task.id.to_string()}</dd>
                {task.name.clone().map(|n| view! { <dt>"Name"</dt> <dd>{n}</dd> })}
                {task.workflow_id.map(|w| view! {
                    <dt>"Workflow"</dt>
                    <dd><a class="mono" href=format!("/workflows/{w}")>{w.to_string()}</a></dd>
                })}
                {task.shard_of.map(|p| view! {
                    <dt>"Shard of"</dt>
                    <dd>
                        <a class="mono" href=format!("/tasks/{p}")>{p.to_string()}</a>
                        {task.shard_index.zip(task.shard_total).map(|(i, n)| format!(" (shard {i} of {n})"))}
                    </dd>
                })}
                {(task.shard_of.is_none() && task.shard_total.is_some()).then(|| view! {
                    <dt>{if task.kind == TaskKind::Service { "Copies" } else { "Shards" }}</dt>
                    <dd>
                        <a href=format!("/tasks?shard_of={}", task.id)>
                            {if task.kind == TaskKind::Service {
                                format!("{} copies", task.shard_total.unwrap_or_default())
                            } else {
                                format!("{} shards", task.shard_total.unwrap_or_default())
                            }}
                        </a>
                        {task.broadcast.then_some(" (broadcast: one per worker)")}
                        <ShardTally parent=task.id/>
                    </dd>
                })}
                <dt>"Owner"</dt>
                <dd>{task.owner.clone()}</dd>
                <dt>"Kind"</dt>
                <dd>{task.kind.as_str()}</dd>
                {(task.kind == TaskKind::Workflow).then(|| view! {
                    <dt>"Sub-workflow"</dt>
                    <dd data-field="subworkflow"><LatestRunLink task=task.id latest=latest/></dd>
                })}
                {task.command.clone().filter(|_| split_args).map(|c| view! {
                    <dt>"Command"</dt>
                    <dd class="mono"><ui::Cut text=ui::command_line(&c)/></dd>
                })}
                {(!task.args.is_empty()).then(|| view! {
                    <dt>"Arguments"</dt>
                    <dd class="mono" data-field="args"><ui::Cut text=ui::command_line(&task.args)/></dd>
                })}
                {task.artifact_url.clone().map(|u| view! {
                    <dt>"Artifact"</dt>
                    <dd class="mono">
                        {u}
                        {task.artifact_sha256.clone().map(|s| view! { <br/> <span class="hint">"sha256 " {s}</span> })}
                    </dd>
                })}
                <dt>"Queue"</dt>
                <dd><a href=format!("/tasks?queue={}", api::enc(&task.queue))>{task.queue.clone()}</a></dd>
                <dt>"Priority"</dt>
                <dd>{task.priority}</dd>
                {(!task.labels.is_empty()).then(|| view! {
                    <dt>"Labels"</dt>
                    <dd>{task.labels.join(", ")}</dd>
                })}
                <dt>"Attempts"</dt>
                <dd data-field="attempts">
                    {match Parent::of(&task) {
                        Some(p) => format!(
                            "none of its own: it {} as {}",
                            if task.state.is_final() { "ran" } else { "runs" },
                            p.parts(&task)
                        ),
                        None => format!("{} of {}", task.attempt, task.max_attempts),
                    }}
                    {Parent::of(&task).is_none().then(|| view! {
                        <span class="hint">
                            {format!(
                                " · backoff {} up to {}",
                                ui::duration(task.backoff_base_secs),
                                ui::duration(task.backoff_max_secs)
                            )}
                        </span>
                    })}
                </dd>
                <dt>"Timeout"</dt>
                <dd>{task.timeout_secs.map(ui::duration).unwrap_or_else(|| "none".into())}</dd>
                {task.output_path.clone().map(|p| view! { <dt>"Output path"</dt> <dd class="mono">{p}</dd> })}
                {requests(&task).map(|r| view! { <dt>"Requests"</dt> <dd>{r}</dd> })}
                {task.preemptible.then(|| view! {
                    <dt>"Preemptible"</dt>
                    <dd>"yes" <span class="hint">" · may be stopped to make room for a service, then waits again"</span></dd>
                })}
                {task.max_output_bytes.map(|b| view! { <dt>"Max output"</dt> <dd>{format!("{b} bytes")}</dd> })}
                {task.run_as.clone().map(|u| view! { <dt>"Runs as"</dt> <dd class="mono">{u}</dd> })}
                {task.idempotency_key.clone().map(|k| view! { <dt>"Idempotency key"</dt> <dd class="mono">{k}</dd> })}
                <dt>"Created"</dt>
                <dd><ui::Time at=task.created_at/></dd>
                {matches!(task.state, TaskState::Waiting | TaskState::Retry).then(|| {
                    let at = task.next_run_at;
                    view! {
                        <dt>"Runs"</dt>
                        <dd>
                            <ui::Time at=at/>
                            <span class="hint">
                                " ("
                                {move || {
                                    tick.track();
                                    if at <= ui::now() { "due".to_owned() } else { ui::relative(at) }
                                }}
                                ")"
                            </span>
                        </dd>
                    }
                })}
                {waiting_reason.filter(|_| Parent::of(&task) != Some(Parent::Service) && !runs_its_subworkflow).map(|r| {
                    let hint = r.hint(&task.queue);
                    view! {
                        <dt>"Waits"</dt>
                        <dd class="waiting-reason" data-reason=r.code.clone()>
                            {r.message.clone()}
                            <span class="hint">{format!(" ({})", r.code)}</span>
                            {hint.map(|h| view! { <br/> <span class="hint" data-hint="">{h}</span> })}
                        </dd>
                    }
                })}
                {task.started_at.map(|at| view! { <dt>"Started"</dt> <dd><ui::Time at=at/></dd> })}
                {task.finished_at.map(|at| view! { <dt>"Finished"</dt> <dd><ui::Time at=at/></dd> })}
                {task.started_at.is_some().then(|| view! { <dt>"Duration"</dt> <dd>{running_for}</dd> })}
                {task.worker_id.map(|w| view! {
                    <dt>"Worker"</dt>
                    <dd><ui::WorkerName id=w/></dd>
                })}
                {task.exit_code.map(|c| view! { <dt>"Exit code"</dt> <dd>{c}</dd> })}
                {task.error.clone().map(|e| view! { <dt>"Error"</dt> <dd class="bad">{e}</dd> })}
            </dl>
        </section>
        {(task.kind == TaskKind::Service && task.shard_of.is_none()).then(|| view! {
            <super::service::ServiceCopies
                id=task.id
                running=!task.state.is_final()
                tick=tick
            />
        })}
        {output.map(|json| view! {
            <section class="panel">
                <h2>"Output"</h2>
                <pre class="json">{json}</pre>
            </section>
        })}
    }
}

/// How many of a sharded task's shards are in each state (` · 2 succeeded, 1 running`), from
/// `GET /api/v1/tasks?shard_of=ID` (the first 500), read when the detail is.
#[component]
fn ShardTally(parent: Uuid) -> impl IntoView {
    let fetched = ui::Fetched::<sked_types::TaskSummaryPage>::new();
    let path = format!("/tasks?shard_of={parent}&view=summary&limit=500");
    fetched.load(async move { api::get(&path).await });
    let tally = move || {
        fetched.data.with(|page| {
            let page = page.as_ref()?;
            let mut counts: Vec<(TaskState, usize)> = Vec::new();
            for t in &page.tasks {
                match counts.iter_mut().find(|(s, _)| *s == t.state) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((t.state, 1)),
                }
            }
            counts.sort_by_key(|(s, _)| TaskState::ALL.iter().position(|x| x == s));
            let parts: Vec<String> = counts
                .iter()
                .map(|(s, n)| format!("{n} {}", s.as_str().replace('_', " ")))
                .collect();
            let more = if page.next_cursor.is_some() {
                " (of the first 500)"
            } else {
                ""
            };
            Some(format!(" · {}{more}", parts.join(", ")))
        })
    };
    view! { <span class="hint" data-shard-tally="">{tally}</span> }
}

/// What the task was given, and its attempts: below the log.
#[component]
fn Definition(detail: TaskDetail, tick: ReadSignal<u64>) -> impl IntoView {
    let TaskDetail { task, attempts, .. } = detail;
    let input = task.input.as_ref().map(pretty);
    let body = task.subworkflow.as_ref().map(pretty);
    let parent = Parent::of(&task).map(|p| p.runners(&task));
    let env = task.env;
    view! {
        {match parent {
            Some(runners) => view! {
                <section class="panel">
                    <h2>"Attempts"</h2>
                    <ui::Empty>{format!("None of its own: it runs nothing itself, {runners}.")}</ui::Empty>
                </section>
            }
            .into_any(),
            None => view! { <Attempts attempts=attempts tick=tick/> }.into_any(),
        }}
        {body.map(|json| view! {
            <section class="panel">
                <h2>"Sub-workflow"</h2>
                <p class="hint">"The workflow it runs, as it was given."</p>
                <pre class="json" data-field="subworkflow-body">{json}</pre>
            </section>
        })}
        {input.map(|json| view! {
            <section class="panel">
                <h2>"Input"</h2>
                <pre class="json">{json}</pre>
            </section>
        })}
        {(!env.is_empty()).then(|| view! {
            <section class="panel">
                <h2>"Environment"</h2>
                <dl class="kv mono">
                    {env.into_iter().map(|(k, v)| view! { <dt>{k.clone()}</dt> <dd data-env=k><ui::Cut text=v/></dd> }).collect_view()}
                </dl>
            </section>
        })}
    }
}

/// Cancel, Retry and Run again, as the task's state allows.
#[component]
fn Actions(
    task: Task,
    reload: impl Fn() + Copy + Send + Sync + 'static,
    error: RwSignal<Option<String>>,
) -> impl IntoView {
    let navigate = use_navigate();
    let busy = RwSignal::new(false);
    let id = task.id;
    let state = task.state;
    // A service that runs is stopped from its controls, after a confirmation.
    let can_cancel = !state.is_final() && Parent::of(&task) != Some(Parent::Service);
    let cancel_pending = task.cancel_requested_at.is_some() && state == TaskState::Running;
    let can_retry = matches!(state, TaskState::Failed | TaskState::Cancelled);
    // A workflow's task runs with its workflow and a shard with its parent: the API refuses
    // to resubmit them alone.
    let can_rerun = task.workflow_id.is_none() && task.shard_of.is_none();

    let change = move |action: &'static str| {
        busy.set(true);
        error.set(None);
        spawn_local(async move {
            let result = api::post_empty::<StateChange>(&format!("/tasks/{id}/{action}")).await;
            busy.try_set(false);
            match result {
                Ok(_) => {
                    error.try_set(None);
                    reload();
                }
                Err(e) => {
                    error.try_set(Some(e.message));
                }
            }
        });
    };
    let rerun = move |_| {
        busy.set(true);
        error.set(None);
        let navigate = navigate.clone();
        spawn_local(async move {
            let result = api::post_empty::<Submitted>(&format!("/tasks/{id}/resubmit")).await;
            busy.try_set(false);
            match result {
                Ok(Submitted { ids, .. }) => {
                    if let Some(new) = ids.first() {
                        navigate(&format!("/tasks/{new}"), Default::default());
                    }
                }
                Err(e) => {
                    error.try_set(Some(e.message));
                }
            }
        });
    };
    view! {
        <div class="actions">
            {can_cancel.then(|| view! {
                <ui::ActionButton action="cancel" danger=true disabled=move || busy.get() || cancel_pending
                    title=if cancel_pending { "Cancel requested: the worker is stopping the process" } else { "Cancel this task" }
                    on_click=move |_| change("cancel")>
                    {if cancel_pending { "Cancelling…" } else { "Cancel" }}
                </ui::ActionButton>
            })}
            {can_retry.then(|| view! {
                <ui::ActionButton action="retry" disabled=busy on_click=move |_| change("retry")
                    title="Run this task again, as a further attempt">
                    "Retry"
                </ui::ActionButton>
            })}
            {can_rerun.then(|| view! {
                <ui::ActionButton action="rerun" disabled=busy on_click=rerun
                    title="Submit a new task with this task's definition">
                    "Run again"
                </ui::ActionButton>
            })}
        </div>
        <ui::ErrorBox message=error/>
    }
}

/// The attempts, oldest first.
#[component]
fn Attempts(attempts: Vec<Attempt>, tick: ReadSignal<u64>) -> impl IntoView {
    if attempts.is_empty() {
        return view! {
            <section class="panel">
                <h2>"Attempts"</h2>
                <ui::Empty>"Not started yet."</ui::Empty>
            </section>
        }
        .into_any();
    }
    let rows = attempts
        .into_iter()
        .map(|a| {
            let (start, end) = (a.started_at, a.finished_at);
            let duration = move || start.map(|s| ui::elapsed(s, end, tick));
            view! {
                <tr data-attempt=a.attempt>
                    <td class="num">{a.attempt}</td>
                    <td>
                        <span class=format!("badge {}", outcome_class(&a.outcome))>
                            {a.outcome.replace('_', " ")}
                        </span>
                    </td>
                    <td class="mono hide-narrow">
                        {a.worker_id.map(|w| view! { <ui::WorkerName id=w/> })}
                    </td>
                    <td>{a.started_at.map(|at| view! { <ui::Time at=at/> })}</td>
                    <td class="hide-narrow">{a.finished_at.map(|at| view! { <ui::Time at=at/> })}</td>
                    <td class="num">{duration}</td>
                    <td class="num">{a.exit_code}</td>
                    <td class="wrap">{a.error}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section class="panel">
            <h2>"Attempts"</h2>
            <ui::Table class="attempts" heads=view! {
                <th class="num">"#"</th> <th>"Outcome"</th> <th class="hide-narrow">"Worker"</th>
                <th>"Started"</th> <th class="hide-narrow">"Finished"</th>
                <th class="num">"Duration"</th> <th class="num">"Exit"</th> <th>"Error"</th>
            }>
                {rows}
            </ui::Table>
        </section>
    }
    .into_any()
}

/// The colour of an attempt's outcome, from the task states' palette.
fn outcome_class(outcome: &str) -> &'static str {
    match outcome {
        "succeeded" => "state-succeeded",
        "running" => "state-running",
        "failed" | "timed_out" | "worker_lost" => "state-failed",
        _ => "state-cancelled",
    }
}

fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// The CPU and memory a task reserves (and is limited to), as one line, when it asks for any.
fn requests(task: &Task) -> Option<String> {
    let parts: Vec<String> = [
        task.cpu_millis.map(|m| format!("CPU {m}m")),
        task.memory_mb.map(|mb| format!("memory {mb} MB")),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunks_lines_get_its_time_and_a_continued_line_none() {
        let (p, next) = pieces("a\nb\npart", "10:00:00.000", true);
        assert_eq!(
            p,
            [
                (Some("10:00:00.000".to_owned()), "a\n".to_owned()),
                (Some("10:00:00.000".to_owned()), "b\n".to_owned()),
                (Some("10:00:00.000".to_owned()), "part".to_owned()),
            ]
        );
        assert!(!next, "the next chunk continues the line");
        let (p, next) = pieces("ial\nc\n", "10:00:01.000", next);
        assert_eq!(
            p,
            [
                (None, "ial\n".to_owned()),
                (Some("10:00:01.000".to_owned()), "c\n".to_owned()),
            ]
        );
        assert!(next);
    }

    #[test]
    fn a_subworkflow_is_summed_up_by_its_definition_or_its_tasks() {
        let summary = |v: serde_json::Value| subworkflow_summary(&v);
        assert_eq!(
            summary(serde_json::json!({"definition": "etl", "version": 3})),
            "the stored definition etl (version 3)"
        );
        assert_eq!(
            summary(serde_json::json!({"definition": "etl", "params": {"day": "x"}})),
            "the stored definition etl (its latest version)"
        );
        assert_eq!(
            summary(
                serde_json::json!({"tasks": [{"name": "x"}, {"name": "y", "depends_on": ["x"]}]})
            ),
            "2 tasks: x, y"
        );
        assert_eq!(
            summary(serde_json::json!({"tasks": [{"name": "only"}]})),
            "1 task: only"
        );
        let many: Vec<_> = (0..7)
            .map(|i| serde_json::json!({"name": format!("t{i}")}))
            .collect();
        assert_eq!(
            summary(serde_json::json!({"tasks": many})),
            "7 tasks: t0, t1, t2, t3, t4, …",
            "the first names only"
        );
        assert_eq!(summary(serde_json::json!({})), "a workflow");
    }

    #[test]
    fn a_subworkflow_task_runs_as_its_subworkflow_and_finds_its_latest_run() {
        let task = crate::fixtures::task(2, TaskKind::Workflow, TaskState::Blocked);
        assert_eq!(Parent::of(&task), Some(Parent::Workflow));
        assert_eq!(Parent::Workflow.parts(&task), "its sub-workflow");
        assert_eq!(
            Parent::Workflow.runners(&task),
            "only the tasks of its sub-workflow do"
        );
        let mut sharded = crate::fixtures::task(3, TaskKind::Command, TaskState::Blocked);
        sharded.shard_total = Some(4);
        assert_eq!(Parent::Shards.runners(&sharded), "only its 4 shards do");
        let plain = crate::fixtures::task(4, TaskKind::Command, TaskState::Running);
        assert_eq!(Parent::of(&plain), None);

        let detail: WorkflowDetail = serde_json::from_value(serde_json::json!({
            "id": Uuid::from_u128(100),
            "owner": "alice",
            "name": "outer",
            "state": "running",
            "created_at": "2027-01-15T08:00:00Z",
            "tasks": [task],
            "edges": [],
            "subworkflows": [
                {"task": Uuid::from_u128(5), "workflow": Uuid::from_u128(50), "state": "succeeded"},
                {"task": Uuid::from_u128(2), "workflow": Uuid::from_u128(20), "state": "failed"},
            ],
        }))
        .unwrap();
        assert_eq!(
            latest_run(&detail, Uuid::from_u128(2)),
            Some(SubWorkflowRun {
                task: Uuid::from_u128(2),
                workflow: Uuid::from_u128(20),
                state: sked_types::WorkflowState::Failed,
            })
        );
        assert_eq!(
            latest_run(&detail, Uuid::from_u128(9)),
            None,
            "a task that has not started one"
        );
    }
}
