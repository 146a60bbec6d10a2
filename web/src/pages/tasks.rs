//! The task list (`/tasks`): filters kept in the address, keyset pages, rows updated live.
//!
//! The filters (`state`, `queue`, `owner`, `q`, `shard_of`, `workflow`, `schedule`, the
//! submission time `created_after`, and the overview's `due` and `finished_after`) and the
//! page (`after`) are the
//! query string of the page's address, so a link reproduces the view; the API gets the same
//! parameters. Live events patch the rows shown in place. On the first page, a new task that
//! matches the filters is put in its place at once from the event (newest first, the page
//! keeping its size); a row that no longer matches them refetches the page (at most once per
//! [`REFETCH_THROTTLE_MS`], never postponed by more events); `resync` refetches it on any page.
//!
//! "Retry all" and "Cancel all" act on every task the filters select (`POST
//! /api/v1/tasks/retry`, `/cancel`): a dry run first says how many ("Retry 1,234 failed tasks
//! in queue mail?"), and the confirmed action changes at most that many.

use std::time::Duration;

use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::NavigateOptions;
use leptos_router::hooks::{use_navigate, use_query_map};
use leptos_router::params::ParamsMap;
use sked_types::bulk::{BulkAction, BulkOutcome, describe, result_text, thousands};
use sked_types::events::TaskSummary;
use sked_types::{QueueCounts, TaskCount, TaskState, TaskSummaryPage};
use uuid::Uuid;

use crate::{api, live, ui};

/// The filter value of "every unfinished state".
const UNFINISHED: &str = "blocked,waiting,running,retry";
/// Wait after a live event before refetching, so a burst of events costs one request; later
/// events do not postpone a refetch already planned.
const REFETCH_THROTTLE_MS: u64 = 300;
/// Wait after the last keystroke in the search box before searching.
const TYPING_DEBOUNCE_MS: u64 = 400;

/// The view's filters and page, as in the address.
#[derive(Debug, Clone, Default, PartialEq)]
struct Filters {
    /// Comma-separated states.
    state: String,
    queue: String,
    owner: String,
    q: String,
    shard_of: String,
    /// `now` (due) or `later` (delayed), as the API takes it.
    due: String,
    /// An RFC 3339 instant: only tasks that finished since then.
    finished_after: String,
    /// Only the tasks of this workflow.
    workflow: String,
    /// Only the occurrences of this schedule.
    schedule: String,
    /// An RFC 3339 instant: only tasks submitted since then.
    created_after: String,
    after: String,
}

impl Filters {
    fn from_query(query: &ParamsMap) -> Self {
        let get = |key| query.get(key).unwrap_or_default();
        Filters {
            state: get("state"),
            queue: get("queue"),
            owner: get("owner"),
            q: get("q"),
            shard_of: get("shard_of"),
            due: get("due"),
            finished_after: get("finished_after"),
            workflow: get("workflow"),
            schedule: get("schedule"),
            created_after: get("created_after"),
            after: get("after"),
        }
    }

    /// The filters, then the page (`after`, last).
    fn pairs(&self) -> [(&'static str, &str); 11] {
        [
            ("state", &self.state),
            ("queue", &self.queue),
            ("owner", &self.owner),
            ("q", &self.q),
            ("shard_of", &self.shard_of),
            ("due", &self.due),
            ("finished_after", &self.finished_after),
            ("workflow", &self.workflow),
            ("schedule", &self.schedule),
            ("created_after", &self.created_after),
            ("after", &self.after),
        ]
    }

    /// The instant of `finished_after`, when it is one.
    fn finished_since(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        chrono::DateTime::parse_from_rfc3339(&self.finished_after)
            .ok()
            .map(|t| t.to_utc())
    }

    /// `?state=…&queue=…` with the non-empty values, or an empty string.
    fn query_string(&self) -> String {
        let parts: Vec<String> = self
            .pairs()
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| format!("{k}={}", api::enc(v)))
            .collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!("?{}", parts.join("&"))
        }
    }

    /// The address of this view in the dashboard.
    fn href(&self) -> String {
        format!("/tasks{}", self.query_string())
    }

    /// The API request that counts what the filters select (whatever the page).
    fn count_path(&self) -> String {
        let f = Filters {
            after: String::new(),
            ..self.clone()
        };
        format!("/tasks/count{}", f.query_string())
    }

    /// The API request for this view.
    fn api_path(&self) -> String {
        let query = self.query_string();
        let sep = if query.is_empty() { "?" } else { "&" };
        format!("/tasks{query}{sep}view=summary")
    }

    fn first_page(&self) -> bool {
        self.after.is_empty()
    }

    fn states(&self) -> Vec<TaskState> {
        self.state
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    }

    /// Whether a task passes the filters, as the API decides it. A schedule's occurrences
    /// are the server's to tell (its history), so with that filter no event's task matches
    /// and a change refetches the page.
    fn matches(&self, t: &TaskSummary) -> bool {
        let states = self.states();
        let text = self.q.to_lowercase();
        let since = |v: &str| {
            chrono::DateTime::parse_from_rfc3339(v)
                .ok()
                .map(|t| t.to_utc())
        };
        self.schedule.is_empty()
            && (states.is_empty() || states.contains(&t.state))
            && (self.workflow.is_empty()
                || t.workflow_id.map(|w| w.to_string()) == Some(self.workflow.clone()))
            && (self.created_after.is_empty()
                || since(&self.created_after).is_some_and(|s| t.created_at >= s))
            && (self.queue.is_empty() || t.queue == self.queue)
            && (self.owner.is_empty() || t.owner == self.owner)
            && (self.shard_of.is_empty()
                || t.shard_of.map(|p| p.to_string()) == Some(self.shard_of.clone()))
            && match self.due.as_str() {
                "now" => t.next_run_at <= ui::now(),
                "later" => t.next_run_at > ui::now(),
                _ => true,
            }
            && (self.finished_after.is_empty()
                || self
                    .finished_since()
                    .is_some_and(|since| t.finished_at.is_some_and(|at| at >= since)))
            && (text.is_empty()
                || t.argv.join(" ").to_lowercase().contains(&text)
                || t.name
                    .as_deref()
                    .is_some_and(|n| n.to_lowercase().contains(&text)))
    }

    /// These filters with the filter `key` set to `value`, on their first page.
    fn with_filter(&self, key: &str, value: String) -> Filters {
        let mut f = Filters {
            after: String::new(),
            ..self.clone()
        };
        match key {
            "state" => f.state = value,
            "queue" => f.queue = value.trim().to_owned(),
            "owner" => f.owner = value.trim().to_owned(),
            "q" => f.q = value,
            "shard_of" => f.shard_of = value,
            "due" => f.due = value,
            "finished_after" => f.finished_after = value,
            "workflow" => f.workflow = value,
            "schedule" => f.schedule = value,
            "created_after" => f.created_after = value,
            _ => {}
        }
        f
    }

    fn is_filtered(&self) -> bool {
        self.pairs()[..10].iter().any(|(_, v)| !v.is_empty())
    }
}

/// The API's page size when the request names none.
const PAGE_SIZE: usize = 50;

/// Puts a new task in its place in a first page sorted newest first (ids are time-ordered).
/// A task older than every row of a page that has more after it belongs to a later page and
/// is left out. The page keeps at most `size` rows; returns true when one was cut off.
fn insert_row(rows: &mut Vec<Row>, task: TaskSummary, complete: bool, size: usize) -> bool {
    let at = rows
        .iter()
        .position(|r| r.id < task.id)
        .unwrap_or(rows.len());
    if at == rows.len() && !complete {
        return false;
    }
    rows.insert(at, Row::new(task));
    if rows.len() > size.max(1) {
        rows.truncate(size.max(1));
        return true;
    }
    false
}

/// One row: the task's summary in a signal of its own, so a live event updates the row
/// without rebuilding the table.
#[derive(Clone)]
struct Row {
    id: Uuid,
    task: ArcRwSignal<TaskSummary>,
}

impl Row {
    fn new(task: TaskSummary) -> Self {
        Row {
            id: task.id,
            task: ArcRwSignal::new(task),
        }
    }
}

/// The page of tasks the filters name, and what its last answer said; live events patch its
/// rows.
#[derive(Clone, Copy)]
struct Listing {
    filters: Memo<Filters>,
    rows: RwSignal<Vec<Row>>,
    next_cursor: RwSignal<Option<Uuid>>,
    scan_limited: RwSignal<bool>,
    error: RwSignal<Option<String>>,
    /// Whether an answer has been shown.
    loaded: RwSignal<bool>,
    /// Whether a request is on its way.
    loading: RwSignal<bool>,
    generation: StoredValue<u64>,
    /// Tasks inserted from live events while a fetch was in flight: its answer may predate
    /// them, so they are put back into it.
    inserted_while_loading: StoredValue<Vec<TaskSummary>>,
    /// Whether a refetch is already planned.
    refetch_planned: StoredValue<bool>,
}

impl Listing {
    fn new(filters: Memo<Filters>) -> Self {
        Listing {
            filters,
            rows: RwSignal::new(Vec::new()),
            next_cursor: RwSignal::new(None),
            scan_limited: RwSignal::new(false),
            error: RwSignal::new(None),
            loaded: RwSignal::new(false),
            loading: RwSignal::new(false),
            generation: StoredValue::new(0),
            inserted_while_loading: StoredValue::new(Vec::new()),
            refetch_planned: StoredValue::new(false),
        }
    }

    /// Loads the page the filters name; an answer to an older request is dropped.
    fn fetch(self) {
        let f = self.filters.get_untracked();
        self.generation.update_value(|g| *g += 1);
        let mine = self.generation.get_value();
        self.loading.set(true);
        self.inserted_while_loading.set_value(Vec::new());
        spawn_local(async move {
            let result = api::get::<TaskSummaryPage>(&f.api_path()).await;
            if self.generation.try_get_value() != Some(mine) {
                return;
            }
            self.loading.set(false);
            match result {
                Ok(page) => self.show(page),
                Err(e) => self.error.set(Some(e.message)),
            }
        });
    }

    /// Shows an answer, with the tasks live events inserted while it was on its way.
    fn show(self, page: TaskSummaryPage) {
        let size = page.tasks.len();
        let complete = page.next_cursor.is_none();
        let mut fresh: Vec<Row> = page.tasks.into_iter().map(Row::new).collect();
        for task in self.inserted_while_loading.get_value() {
            if !fresh.iter().any(|r| r.id == task.id) {
                insert_row(&mut fresh, task, complete, size);
            }
        }
        self.rows.set(fresh);
        self.next_cursor.set(page.next_cursor);
        self.scan_limited.set(page.scan_limit_reached);
        self.error.set(None);
        self.loaded.set(true);
    }

    /// Fetches [`REFETCH_THROTTLE_MS`] from now, once for every call until then.
    fn fetch_soon(self) {
        if self.refetch_planned.get_value() {
            return;
        }
        self.refetch_planned.set_value(true);
        spawn_local(async move {
            gloo_timers::future::sleep(Duration::from_millis(REFETCH_THROTTLE_MS)).await;
            if self.refetch_planned.try_get_value().is_some() {
                self.refetch_planned.set_value(false);
                self.fetch();
            }
        });
    }

    /// Patches the rows with live events: a row shown follows its task; on the first page a
    /// new task that matches the filters is put in its place, and a row that no longer
    /// matches them refetches the page.
    fn apply(self, batch: &[TaskSummary]) {
        let f = self.filters.get_untracked();
        let complete = self.next_cursor.get_untracked().is_none();
        let mut refetch = false;
        let mut new_rows: Vec<TaskSummary> = Vec::new();
        self.rows.with_untracked(|rows| {
            for task in batch {
                match rows.iter().find(|r| r.id == task.id) {
                    Some(row) => {
                        row.task.set(task.clone());
                        refetch |= f.first_page() && !f.matches(task);
                    }
                    None if f.first_page() && f.matches(task) => new_rows.push(task.clone()),
                    None => {}
                }
            }
        });
        if !new_rows.is_empty() {
            let size = self.rows.with_untracked(|r| r.len()).max(PAGE_SIZE);
            let mut truncated = false;
            self.rows.update(|rows| {
                for task in &new_rows {
                    truncated |= insert_row(rows, task.clone(), complete, size);
                }
            });
            if truncated {
                self.next_cursor
                    .set(self.rows.with_untracked(|r| r.last().map(|r| r.id)));
            }
            if self.loading.get_untracked() {
                self.inserted_while_loading
                    .update_value(|v| v.extend(new_rows));
            }
        }
        if refetch {
            self.fetch_soon();
        }
    }

    /// Fetches when the filters change and on `resync`, and applies live task events.
    fn follow(self, live: live::Live) {
        Effect::new(move |_| {
            self.filters.track();
            self.fetch();
        });
        live.on_change(|l| l.resync.track(), move || self.fetch());
        live.on_tasks(move |batch| self.apply(batch));
    }

    /// Why the page shows no task.
    fn empty_sentence(self) -> &'static str {
        if self.scan_limited.get() {
            "No match among the tasks searched so far: “Older →” searches further."
        } else if self.filters.with(Filters::is_filtered) {
            "No tasks match these filters."
        } else if !self.filters.with(Filters::first_page) {
            "No older tasks."
        } else {
            "No tasks yet. Submit one on the Submit page, or with sked submit."
        }
    }
}

#[component]
pub fn TaskList() -> impl IntoView {
    let session = api::session();
    let query = use_query_map();
    let filters = Memo::new(move |_| query.with(Filters::from_query));
    let listing = Listing::new(filters);
    listing.follow(live::live());
    let admin = Signal::derive(move || {
        session
            .me
            .with(|m| m.as_ref().is_some_and(|m| m.role == "admin"))
    });
    let updating = Signal::derive(move || listing.loading.get() && listing.loaded.get());

    view! {
        <h1>"Tasks"</h1>
        <FilterBar filters=filters updating=updating admin=admin/>
        <Show when=move || session.me.with(Option::is_some)>
            <BulkActions listing=listing/>
        </Show>
        <ui::Loaded
            error=listing.error
            ready=listing.loaded
            empty=Signal::derive(move || listing.rows.with(Vec::is_empty))
            when_empty=move || move || listing.empty_sentence()
        >
            <TaskTable rows=listing.rows admin=admin/>
            <Show when=move || listing.scan_limited.get()>
                <p class="hint">
                    "The server stopped at its scan limit before filling this page: “Older →” continues the search."
                </p>
            </Show>
        </ui::Loaded>
        <Pager filters=filters next_cursor=listing.next_cursor/>
    }
}

/// A bulk action's confirmation: the action and the dry run's answer.
#[derive(Clone)]
struct Preview {
    action: &'static str,
    outcome: BulkOutcome,
}

/// "Retry all" and "Cancel all" for every task the filters select (not only this page): a
/// dry run says how many tasks the action would change, and the confirmed action runs with
/// `max` = that count, so it never changes more than was shown. A user token acts on its
/// own tasks only (the API decides). A button shows where its action may apply: retry for
/// finished states, cancel for unfinished ones.
#[component]
fn BulkActions(listing: Listing) -> impl IntoView {
    let filters = listing.filters;
    let busy = RwSignal::new(false);
    let preview = RwSignal::new(None::<Preview>);
    let done = RwSignal::new(None::<String>);
    let error = RwSignal::new(None::<String>);
    // The selection: the filters without the page.
    let selection = move || {
        filters.with_untracked(|f| {
            Filters {
                after: String::new(),
                ..f.clone()
            }
            .query_string()
        })
    };
    // A new filter forgets a preview of the old one.
    Effect::new(move |_| {
        filters.track();
        preview.set(None);
        done.set(None);
        error.set(None);
    });
    let ask = move |action: &'static str| {
        busy.set(true);
        done.set(None);
        error.set(None);
        preview.set(None);
        let path = format!("/tasks/{action}{}", selection());
        spawn_local(async move {
            let body = BulkAction {
                dry_run: true,
                max: None,
            };
            let answer = api::post::<_, BulkOutcome>(&path, &body).await;
            busy.try_set(false);
            match answer {
                Ok(outcome) if outcome.matched == 0 => {
                    done.try_set(Some(format!(
                        "No tasks here to {action}: {}.",
                        if action == "retry" {
                            "none of them is finished"
                        } else {
                            "none of them is unfinished"
                        }
                    )));
                }
                Ok(outcome) => {
                    preview.try_set(Some(Preview { action, outcome }));
                }
                Err(e) => {
                    error.try_set(Some(e.message));
                }
            }
        });
    };
    let run = move |_| {
        let Some(Preview { action, outcome }) = preview.get_untracked() else {
            return;
        };
        busy.set(true);
        let path = format!("/tasks/{action}{}", selection());
        spawn_local(async move {
            let body = BulkAction {
                dry_run: false,
                max: Some(outcome.matched),
            };
            let answer = api::post::<_, BulkOutcome>(&path, &body).await;
            busy.try_set(false);
            preview.try_set(None);
            match answer {
                Ok(outcome) => {
                    let text = result_text(&outcome);
                    let mut chars = text.chars();
                    let sentence = chars
                        .next()
                        .map(|c| c.to_uppercase().chain(chars).collect::<String>())
                        .unwrap_or_default();
                    done.try_set(Some(format!("{sentence}.")));
                    listing.fetch();
                }
                Err(e) => {
                    error.try_set(Some(e.message));
                }
            }
        });
    };
    // Which actions may apply to the states the filters name.
    let may_retry =
        move || filters.with(|f| f.states().is_empty() || f.states().iter().any(|s| s.is_final()));
    let may_cancel =
        move || filters.with(|f| f.states().is_empty() || f.states().iter().any(|s| !s.is_final()));
    let question = move || {
        preview.with(|p| {
            p.as_ref().map(|Preview { action, outcome }| {
                let f = filters.get_untracked();
                // An admin's list without an owner takes every owner's tasks: the question
                // says so.
                let owner = if f.owner.is_empty() && api::session().is_admin() {
                    "every owner"
                } else {
                    f.owner.as_str()
                };
                let what = describe(
                    outcome,
                    Some(f.queue.as_str()),
                    Some(owner),
                    Some(f.q.as_str()),
                );
                let verb = if *action == "retry" {
                    "Retry"
                } else {
                    "Cancel"
                };
                let more = if outcome.more {
                    " More tasks match: this acts on the newest ones; ask again for the rest."
                } else {
                    ""
                };
                format!("{verb} {what}?{more}")
            })
        })
    };
    let confirm_label = move || {
        preview.with(|p| {
            p.as_ref()
                .map(|Preview { action, outcome }| {
                    let verb = if *action == "retry" {
                        "Retry"
                    } else {
                        "Cancel"
                    };
                    let n = outcome.matched;
                    format!(
                        "{verb} {} {}",
                        thousands(n),
                        if n == 1 { "task" } else { "tasks" }
                    )
                })
                .unwrap_or_default()
        })
    };
    view! {
        <div class="actions bulk-actions">
            <Show
                when=move || preview.with(Option::is_some)
                fallback=move || view! {
                    <Show when=may_retry>
                        <ui::ActionButton action="retry-all" disabled=busy
                            title="Retry every finished task these filters select, after saying how many"
                            on_click=move |_| ask("retry")>
                            "Retry all"
                        </ui::ActionButton>
                    </Show>
                    <Show when=may_cancel>
                        <ui::ActionButton action="cancel-all" danger=true disabled=busy
                            title="Cancel every unfinished task these filters select, after saying how many"
                            on_click=move |_| ask("cancel")>
                            "Cancel all"
                        </ui::ActionButton>
                    </Show>
                }
            >
                <p class="notice" role="alert" data-confirm="bulk">{question}</p>
                <ui::ActionButton action="confirm-bulk" danger=true disabled=busy on_click=run>
                    {confirm_label}
                </ui::ActionButton>
                <ui::ActionButton action="keep" disabled=busy on_click=move |_| preview.set(None)>
                    "Leave them"
                </ui::ActionButton>
            </Show>
            {move || done.get().map(|d| view! { <p class="notice" role="status" data-done="bulk">{d}</p> })}
        </div>
        <ui::ErrorBox message=error/>
    }
}

/// The filters' fields; a change goes to the first page of the new filters.
#[component]
fn FilterBar(filters: Memo<Filters>, updating: Signal<bool>, admin: Signal<bool>) -> impl IntoView {
    let set_filter = filter_setter(filters);
    // The handler of a field's `change`: the filter `key` takes the field's value.
    let on_change = move |key: &'static str| {
        let set_filter = set_filter.clone();
        move |ev: leptos::ev::Event| set_filter(key, event_target_value(&ev), false)
    };
    let (on_state, on_queue, on_owner) =
        (on_change("state"), on_change("queue"), on_change("owner"));

    // Queue names for the queue filter's suggestions.
    let queues = RwSignal::new(Vec::<String>::new());
    spawn_local(async move {
        if let Ok(counts) = api::get::<Vec<QueueCounts>>("/queues").await {
            queues.try_set(counts.into_iter().map(|c| c.queue).collect());
        }
    });

    view! {
        <form class="filters" role="search" on:submit=|ev| ev.prevent_default()>
            <select name="state" aria-label="State" on:change=on_state>{move || state_options(filters)}</select>
            <input
                name="queue"
                placeholder="Queue"
                aria-label="Queue"
                list="task-list-queues"
                size="12"
                prop:value=move || filters.with(|f| f.queue.clone())
                on:change=on_queue
            />
            <datalist id="task-list-queues">
                {move || {
                    queues.get().into_iter().map(|q| view! { <option value=q></option> }).collect_view()
                }}
            </datalist>
            <Show when=move || admin.get()>
                <input
                    name="owner"
                    placeholder="Owner"
                    aria-label="Owner"
                    size="12"
                    prop:value=move || filters.with(|f| f.owner.clone())
                    on:change=on_owner.clone()
                />
            </Show>
            <SearchBox filters=filters/>
            <SubmittedSelect filters=filters/>
            <Show when=move || filters.with(|f| !f.workflow.is_empty() || !f.schedule.is_empty())>
                <OfNotice filters=filters/>
            </Show>
            <Show when=move || filters.with(|f| !f.due.is_empty() || !f.finished_after.is_empty())>
                <TimeNotice filters=filters/>
            </Show>
            <Show when=move || filters.with(|f| !f.shard_of.is_empty())>
                <ShardNotice filters=filters/>
            </Show>
            <Show when=move || updating.get()>
                <span class="hint">"Updating…"</span>
            </Show>
            <Count filters=filters/>
        </form>
    }
}

/// The submission-time ranges offered: the label and how far back.
const SUBMITTED: [(&str, i64); 4] = [
    ("last hour", 3600),
    ("last 24 hours", 24 * 3600),
    ("last 7 days", 7 * 24 * 3600),
    ("last 30 days", 30 * 24 * 3600),
];

/// The submission-time filter: any time, or the last hour, day, week or month (from the
/// moment it is chosen, kept in the address as an instant).
#[component]
fn SubmittedSelect(filters: Memo<Filters>) -> impl IntoView {
    let set_filter = filter_setter(filters);
    let on_change = move |ev: leptos::ev::Event| {
        let value = event_target_value(&ev);
        let after = value
            .parse::<i64>()
            .ok()
            .map(|secs| {
                (ui::now() - chrono::Duration::seconds(secs))
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            })
            .unwrap_or_default();
        set_filter("created_after", after, false);
    };
    let options = move || {
        let current = filters.with(|f| f.created_after.clone());
        let mut options = vec![
            view! { <option value="" selected=current.is_empty()>"Submitted any time"</option> }
                .into_any(),
        ];
        for (label, secs) in SUBMITTED {
            options.push(view! { <option value=secs.to_string()>{format!("Submitted in the {label}")}</option> }.into_any());
        }
        if !current.is_empty() {
            let since = chrono::DateTime::parse_from_rfc3339(&current)
                .map(|t| format!("Submitted since {}", ui::local_time(t.to_utc())))
                .unwrap_or_else(|_| format!("Submitted since {current}"));
            options.push(
                view! { <option value="" selected=true disabled=true>{since}</option> }.into_any(),
            );
        }
        options
    };
    view! {
        <select name="created_after" aria-label="Submitted" on:change=on_change>{options}</select>
    }
}

/// Says that the list shows one workflow's tasks or one schedule's occurrences, with a link
/// to it and a way back to every task.
#[component]
fn OfNotice(filters: Memo<Filters>) -> impl IntoView {
    let navigate = use_navigate();
    let of = move || {
        filters.with(|f| {
            if !f.workflow.is_empty() {
                (
                    "Tasks of workflow ",
                    format!("/workflows/{}", f.workflow),
                    f.workflow.clone(),
                )
            } else {
                (
                    "Occurrences of schedule ",
                    format!("/schedules/{}", f.schedule),
                    f.schedule.clone(),
                )
            }
        })
    };
    let clear = move |_| {
        let f = filters.with_untracked(|f| Filters {
            workflow: String::new(),
            schedule: String::new(),
            after: String::new(),
            ..f.clone()
        });
        navigate(&f.href(), NavigateOptions::default());
    };
    view! {
        <span class="notice" data-of="">
            {move || of().0}
            <a href=move || of().1>{move || of().2}</a>
            " "
            <button type="button" class="link" on:click=clear>"show all"</button>
        </span>
    }
}

/// How many tasks the filters select (`GET /api/v1/tasks/count`): exact up to 10,000, else
/// "more than" or "at least"; read again when the filters change.
#[component]
fn Count(filters: Memo<Filters>) -> impl IntoView {
    let counted = RwSignal::new(None::<String>);
    Effect::new(move |_| {
        let path = filters.with(Filters::count_path);
        counted.set(None);
        spawn_local(async move {
            if let Ok(c) = api::get::<TaskCount>(&path.clone()).await {
                let n = c.count.max(0) as u64;
                let noun = if n == 1 && c.exact { "task" } else { "tasks" };
                let text = format!("{}{} {noun}", c.qualifier(), thousands(n));
                // An answer for filters changed meanwhile is not shown.
                if filters.try_with_untracked(Filters::count_path).as_ref() == Some(&path) {
                    counted.try_set(Some(text));
                }
            }
        });
    });
    view! {
        <span class="hint" data-count="">{move || counted.get()}</span>
    }
}

/// A function that sets one filter and goes to the first page of the new filters (replacing
/// the current entry of the history when told to); nothing when the filters stay the same.
fn filter_setter(filters: Memo<Filters>) -> impl Fn(&'static str, String, bool) + Clone {
    let navigate = use_navigate();
    move |key, value, replace| {
        let f = filters.with_untracked(|f| f.with_filter(key, value));
        if f != filters.get_untracked() {
            navigate(
                &f.href(),
                NavigateOptions {
                    replace,
                    scroll: false,
                    ..NavigateOptions::default()
                },
            );
        }
    }
}

/// The search box: it searches [`TYPING_DEBOUNCE_MS`] after the last keystroke, and at once
/// when it is left.
#[component]
fn SearchBox(filters: Memo<Filters>) -> impl IntoView {
    let set_filter = filter_setter(filters);
    let typing = StoredValue::new(0u64);
    let on_input = {
        let set_filter = set_filter.clone();
        move |ev: leptos::ev::Event| {
            let text = event_target_value(&ev);
            typing.update_value(|n| *n += 1);
            let mine = typing.get_value();
            let set_filter = set_filter.clone();
            spawn_local(async move {
                gloo_timers::future::sleep(Duration::from_millis(TYPING_DEBOUNCE_MS)).await;
                if typing.try_get_value() == Some(mine) {
                    set_filter("q", text, true);
                }
            });
        }
    };
    let on_change = move |ev: leptos::ev::Event| {
        typing.update_value(|n| *n += 1);
        set_filter("q", event_target_value(&ev), false)
    };
    view! {
        <input
            type="search"
            name="q"
            placeholder="Search commands"
            aria-label="Search commands"
            prop:value=move || filters.with(|f| f.q.clone())
            on:input=on_input
            on:change=on_change
        />
    }
}

/// Says which times the list is limited to (the overview's cards link to such lists), with
/// a way to every time.
#[component]
fn TimeNotice(filters: Memo<Filters>) -> impl IntoView {
    let navigate = use_navigate();
    let says = move || {
        filters.with(|f| {
            let due = match f.due.as_str() {
                "now" => Some("due now".to_owned()),
                "later" => Some("due later (delayed)".to_owned()),
                "" => None,
                other => Some(format!("due {other}")),
            };
            let finished = (!f.finished_after.is_empty()).then(|| match f.finished_since() {
                Some(since) => format!("finished since {}", ui::local_time(since)),
                None => format!("finished since {}", f.finished_after),
            });
            [due, finished]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
        })
    };
    let clear = move |_| {
        let f = filters.with_untracked(|f| Filters {
            due: String::new(),
            finished_after: String::new(),
            after: String::new(),
            ..f.clone()
        });
        navigate(&f.href(), NavigateOptions::default());
    };
    view! {
        <span class="notice" data-times="">
            {says}
            " "
            <button type="button" class="link" data-action="any-time" on:click=clear>"any time"</button>
        </span>
    }
}

/// Says that the list shows the shards of one task, with a way back to every task.
#[component]
fn ShardNotice(filters: Memo<Filters>) -> impl IntoView {
    let set_filter = filter_setter(filters);
    let shard_of = move || filters.with(|f| f.shard_of.clone());
    view! {
        <span class="notice">
            "Shards of "
            <a href=move || format!("/tasks/{}", shard_of())>{shard_of}</a>
            " "
            <button type="button" class="link" on:click=move |_| set_filter("shard_of", String::new(), false)>
                "show all"
            </button>
        </span>
    }
}

/// The state filter's choices, the current one selected (also a list of states typed in the
/// address).
fn state_options(filters: Memo<Filters>) -> impl IntoView {
    let current = filters.with(|f| f.state.clone());
    let mut options: Vec<(String, String)> = vec![
        (String::new(), "All states".into()),
        (UNFINISHED.into(), "Unfinished".into()),
    ];
    options.extend(
        TaskState::ALL
            .iter()
            .map(|s| (s.as_str().to_owned(), s.as_str().replace('_', " "))),
    );
    if !options.iter().any(|(v, _)| *v == current) {
        options.push((current.clone(), current.replace(',', ", ")));
    }
    options
        .into_iter()
        .map(|(value, label)| {
            let selected = value == current;
            view! { <option value=value selected=selected>{label}</option> }
        })
        .collect_view()
}

/// The table of the rows shown; each row follows its task.
#[component]
fn TaskTable(rows: RwSignal<Vec<Row>>, admin: Signal<bool>) -> impl IntoView {
    // Re-renders ages and running durations every second.
    let tick = ui::ticker(1000);
    view! {
        <ui::Table class="task-list" heads=view! {
            <th>"Task"</th> <th>"State"</th> <th class="hide-narrow">"Queue"</th> <th>"Command"</th>
            <th class="num hide-narrow">"Attempt"</th>
            <Show when=move || admin.get()><th class="hide-narrow">"Owner"</th></Show>
            <th>"Created"</th> <th class="num hide-narrow">"Duration"</th>
            <th class="num hide-narrow">"Exit"</th>
        }>
            <For each=move || rows.get() key=|row| row.id let:row>
                <TaskRow task=row.task tick=tick admin=admin/>
            </For>
        </ui::Table>
    }
}

/// Links to the newest page and to the next older one, when there are such pages.
#[component]
fn Pager(filters: Memo<Filters>, next_cursor: RwSignal<Option<Uuid>>) -> impl IntoView {
    let newest_href = move || {
        let mut f = filters.get();
        f.after.clear();
        f.href()
    };
    let older_href = move || {
        next_cursor.get().map(|cursor| {
            let mut f = filters.get();
            f.after = cursor.to_string();
            f.href()
        })
    };
    view! {
        <nav class="pager">
            <Show when=move || !filters.with(Filters::first_page)>
                <a class="button" href=newest_href>"Newest"</a>
            </Show>
            {move || older_href().map(|href| view! { <a class="button" href=href>"Older →"</a> })}
        </nav>
    }
}

/// One task's row; it follows the task's signal.
#[component]
fn TaskRow(
    task: ArcRwSignal<TaskSummary>,
    tick: ReadSignal<u64>,
    admin: Signal<bool>,
) -> impl IntoView {
    let t = task.clone();
    let id = t.with_untracked(|t| t.id);
    let state = {
        let t = t.clone();
        Signal::derive(move || t.with(|t| t.state))
    };
    let command = {
        let t = t.clone();
        move || t.with(ui::summary_line)
    };
    let name = {
        let t = t.clone();
        move || t.with(|t| t.name.clone())
    };
    let queue = {
        let t = t.clone();
        move || t.with(|t| t.queue.clone())
    };
    let attempt = {
        let t = t.clone();
        move || t.with(|t| sked_types::service::attempts_text(t.attempt, t.max_attempts))
    };
    let owner = {
        let t = t.clone();
        move || t.with(|t| t.owner.clone())
    };
    let created = t.with_untracked(|t| t.created_at);
    let duration = {
        let t = t.clone();
        move || {
            t.with(|t| {
                t.started_at
                    .map(|start| ui::elapsed(start, t.finished_at, tick))
            })
        }
    };
    let exit = {
        let t = t.clone();
        move || t.with(|t| t.exit_code.map(|c| c.to_string()))
    };
    let cancel_requested = {
        let t = t.clone();
        move || t.with(|t| t.cancel_requested && !t.state.is_final())
    };
    let command_title = command.clone();
    view! {
        <tr data-task-id=id.to_string() data-state=move || state.get().as_str()>
            <td class="mono">
                <a href=format!("/tasks/{id}") title=id.to_string()>{ui::short_id(&id)}</a>
            </td>
            <td>
                <ui::StateBadge state=state/>
                <Show when=cancel_requested.clone()>
                    <span class="hint" title="cancel requested">" ⏹"</span>
                </Show>
            </td>
            <td class="hide-narrow">{queue}</td>
            <td>
                <div class="cmd" title=command_title>
                    {move || name().map(|n| view! { <b>{n}</b> " " })}
                    {command}
                </div>
            </td>
            <td class="num hide-narrow">{attempt}</td>
            <Show when=move || admin.get()>
                <td class="hide-narrow">{owner.clone()}</td>
            </Show>
            <td>{ui::age(created, tick)}</td>
            <td class="num hide-narrow">{duration}</td>
            <td class="num hide-narrow">{exit}</td>
        </tr>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: TaskState, queue: &str, argv: &[&str]) -> TaskSummary {
        TaskSummary {
            queue: queue.into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            ..crate::fixtures::task_summary(0, state)
        }
    }

    #[test]
    fn live_tasks_are_matched_against_the_filters_as_the_api_does() {
        let f = Filters {
            state: "failed,cancelled".into(),
            queue: "reports".into(),
            q: "NIGHTLY run".into(),
            ..Filters::default()
        };
        let t = task(
            TaskState::Failed,
            "reports",
            &["sh", "-c", "nightly", "run.sh"],
        );
        assert!(f.matches(&t), "states, queue and text all match");
        assert!(
            !f.matches(&task(TaskState::Succeeded, "reports", &["nightly", "run"])),
            "a state outside the list"
        );
        assert!(
            !f.matches(&task(TaskState::Failed, "default", &["nightly", "run"])),
            "another queue"
        );
        assert!(
            !f.matches(&task(TaskState::Failed, "reports", &["nightly"])),
            "the text is searched in the joined command line"
        );
        let named = TaskSummary {
            name: Some("Nightly Run".into()),
            ..task(TaskState::Cancelled, "reports", &["true"])
        };
        assert!(f.matches(&named), "the text is also searched in the name");
        assert!(
            Filters::default().matches(&t),
            "no filter matches every task"
        );
        assert!(!Filters::default().is_filtered());
        let page_two = Filters {
            after: Uuid::nil().to_string(),
            ..Filters::default()
        };
        assert!(!page_two.is_filtered() && !page_two.first_page());
    }

    #[test]
    fn a_changed_filter_goes_back_to_the_first_page() {
        let page_two = Filters {
            state: "failed".into(),
            after: Uuid::nil().to_string(),
            ..Filters::default()
        };
        let f = page_two.with_filter("queue", " reports ".into());
        assert_eq!(f.queue, "reports", "a queue name is trimmed");
        assert_eq!(f.state, "failed", "the other filters stay");
        assert!(f.first_page(), "a new filter starts at the newest tasks");
        assert_eq!(
            page_two.with_filter("q", " two words ".into()).q,
            " two words ",
            "a search is kept as typed"
        );
    }
}
