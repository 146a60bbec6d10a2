//! Schedules: the list (`/schedules`) and one schedule (`/schedules/:id`).
//!
//! The list shows every schedule the token may see (the API does not page them), with its
//! next tick and what happened at its latest one (`last_tick`). A schedule's page shows its
//! expression and policies, its next fire times (in its own time zone and the browser's),
//! its latest runs with their outcome and occurrence, its backfills with their progress, and
//! the actions pause, resume, run now, backfill (a form: a past range, how many at once, the
//! order) and delete. Both refetch on `live.schedules` (a schedule was created, changed,
//! fired or deleted, or a backfill of it went on) and on `resync`; relative times follow a 1 s
//! ticker.

use chrono::{DateTime, Utc};
use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::hooks::{use_navigate, use_params_map};
use sked_types::{
    Backfill, BackfillOrder, RunNow, Schedule, ScheduleDetail, SchedulePage, ScheduleRun,
    StartBackfill,
};
use uuid::Uuid;
use wasm_bindgen::{JsCast, JsValue};

use crate::pages::submit::Field;
use crate::{api, live, ui};

/// Least time between two refetches caused by live events (a schedule firing every second
/// sends an event every second).
const REFETCH_GAP_MS: f64 = 300.0;

/// `active` or `paused` as a badge.
fn status_badge(paused: bool) -> impl IntoView {
    let (class, text) = if paused {
        ("badge schedule-paused", "paused")
    } else {
        ("badge schedule-active", "active")
    };
    view! { <span class=class data-paused=paused.to_string()>{text}</span> }
}

/// A run's outcome (`fired`, `queued`, `skipped`, `missed`, `manual`) as a badge.
fn outcome_badge(outcome: &str) -> impl IntoView + use<> {
    view! {
        <span class=format!("badge outcome-{outcome}") data-outcome=outcome.to_owned()>
            {outcome.to_owned()}
        </span>
    }
}

/// A link to a run's occurrence (a task or a workflow), if it has one.
fn occurrence(task: Option<Uuid>, workflow: Option<Uuid>) -> Option<impl IntoView> {
    match (task, workflow) {
        (Some(id), _) => Some(view! {
            <a class="mono" href=format!("/tasks/{id}") title=id.to_string()>{ui::short_id(&id)}</a>
        }),
        (None, Some(id)) => Some(view! {
            <a class="mono" href=format!("/workflows/{id}") title=id.to_string()>{ui::short_id(&id)}</a>
        }),
        (None, None) => None,
    }
}

/// What a schedule runs: a task's command line, or a workflow's name and size.
fn template(s: &Schedule) -> String {
    if let Some(w) = &s.workflow {
        let name = w.get("name").and_then(|n| n.as_str()).unwrap_or("");
        let tasks = w
            .get("tasks")
            .and_then(|t| t.as_array())
            .map_or(0, Vec::len);
        let noun = if tasks == 1 { "task" } else { "tasks" };
        return if name.is_empty() {
            format!("a workflow of {tasks} {noun}")
        } else {
            format!("workflow {name} ({tasks} {noun})")
        };
    }
    let Some(t) = &s.task else {
        return String::new();
    };
    let strings = |key: &str| -> Vec<String> {
        t.get(key)
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut argv = strings("command");
    if argv.is_empty()
        && let Some(url) = t.get("artifact_url").and_then(|u| u.as_str())
    {
        argv.push(url.to_owned());
    }
    argv.extend(strings("args"));
    if argv.is_empty() {
        t.get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("task")
            .to_owned()
    } else {
        ui::command_line(&argv)
    }
}

/// A run's detail, with the ticks it stands for when it counts missed ones.
fn run_detail(r: &ScheduleRun) -> String {
    let detail = r.detail.clone().unwrap_or_default();
    match r.missed_ticks {
        0 => detail,
        n if detail.is_empty() => format!("{n} more ticks missed"),
        n => format!("{detail} ({n} more ticks missed)"),
    }
}

/// `2026-12-01 09:00:00` in the time zone `zone`; `None` when the browser does not know the
/// zone.
fn zone_time(at: DateTime<Utc>, zone: &str) -> Option<String> {
    let date = js_sys::Date::new(&JsValue::from_f64(at.timestamp_millis() as f64));
    let options = js_sys::Object::new();
    js_sys::Reflect::set(&options, &"timeZone".into(), &zone.into()).ok()?;
    js_sys::Reflect::set(&options, &"hourCycle".into(), &"h23".into()).ok()?;
    // `toLocaleString` throws on an unknown zone; `Reflect.apply` turns that into an error.
    let format = js_sys::Reflect::get(&date, &"toLocaleString".into()).ok()?;
    let args = js_sys::Array::of2(&"sv-SE".into(), &options);
    js_sys::Reflect::apply(format.dyn_ref::<js_sys::Function>()?, &date, &args)
        .ok()?
        .as_string()
}

#[component]
pub fn ScheduleList() -> impl IntoView {
    let session = api::session();
    let live = live::live();
    let fetched = ui::Fetched::<SchedulePage>::new();
    let tick = ui::ticker(1000);
    let fetch = move || fetched.load(api::get::<SchedulePage>("/schedules"));
    let fetch_soon = ui::throttled(REFETCH_GAP_MS, fetch);

    fetch();
    live.on_change(|l| l.resync.track(), fetch);
    live.on_change(|l| l.schedules.track(), fetch_soon);

    let is_admin = move || {
        session
            .me
            .with(|m| m.as_ref().is_some_and(|m| m.role == "admin"))
    };
    let rows = move || {
        fetched
            .data
            .with(|p| p.as_ref().map(|p| p.schedules.clone()).unwrap_or_default())
    };

    view! {
        <h1>"Schedules"</h1>
        <ui::Loaded
            error=fetched.error_message()
            ready=fetched.ready()
            empty=Signal::derive(move || fetched.data.with(|p| p.as_ref().is_some_and(|p| p.schedules.is_empty())))
            when_empty=|| view! {
                "No schedules yet. Create one with " <code>"sked schedule create"</code>
                " or " <code>"POST /api/v1/schedules"</code> "."
            }
        >
            <ui::Table class="schedule-list" heads=view! {
                <th>"Schedule"</th> <th class="hide-narrow">"Expression"</th>
                <th class="hide-narrow">"Time zone"</th> <th>"Next tick"</th> <th>"Status"</th>
                <th>"Last tick"</th> <th class="hide-narrow">"Runs"</th>
                <Show when=is_admin><th class="hide-narrow">"Owner"</th></Show>
            }>
                <For each=rows key=|s| (s.id, s.updated_at, s.last_tick.as_ref().map(|t| t.recorded_at)) let:s>
                    <ScheduleRow schedule=s tick=tick admin=Signal::derive(is_admin)/>
                </For>
            </ui::Table>
        </ui::Loaded>
    }
}

#[component]
fn ScheduleRow(schedule: Schedule, tick: ReadSignal<u64>, admin: Signal<bool>) -> impl IntoView {
    let s = schedule;
    let id = s.id;
    let paused = s.paused_at.is_some();
    let next = (!paused).then(|| ui::age(s.next_run_at, tick));
    let last = s.last_tick.clone().map(|r| {
        view! {
            {outcome_badge(&r.outcome)}
            " "
            {ui::age(r.fire_at, tick)}
            " "
            {occurrence(r.task_id, r.workflow_id)}
        }
    });
    let what = template(&s);
    let owner = s.owner.clone();
    view! {
        <tr data-schedule-id=id.to_string() data-paused=paused.to_string()>
            <td>
                <a href=format!("/schedules/{id}")>{s.name.clone()}</a>
            </td>
            <td class="hide-narrow">
                <code>{s.cron.clone()}</code>
            </td>
            <td class="hide-narrow">{s.time_zone.clone()}</td>
            <td>{next.map(IntoAny::into_any).unwrap_or_else(|| "—".into_any())}</td>
            <td>{status_badge(paused)}</td>
            <td>{last.map(IntoAny::into_any).unwrap_or_else(|| view! { <span class="hint">"none yet"</span> }.into_any())}</td>
            <td class="hide-narrow">
                <div class="cmd" title=what.clone()>{what.clone()}</div>
            </td>
            <Show when=move || admin.get()>
                <td class="hide-narrow">{owner.clone()}</td>
            </Show>
        </tr>
    }
}

#[component]
pub fn SchedulePage() -> impl IntoView {
    let live = live::live();
    let params = use_params_map();
    let navigate = use_navigate();
    let id = Memo::new(move |_| params.with(|p| p.get("id").and_then(|s| s.parse::<Uuid>().ok())));
    let fetched = ui::Fetched::<ScheduleDetail>::new();
    let tick = ui::ticker(1000);
    let busy = RwSignal::new(false);
    let action_error = RwSignal::new(None::<String>);
    // The occurrence "run now" created.
    let ran = RwSignal::new(None::<RunNow>);
    let deleted = RwSignal::new(false);
    // Whether the template is unfolded; kept across refetches, which redraw the detail.
    let template_open = RwSignal::new(false);
    // The backfill form: open or not, its fields, and the backfill it started.
    let backfill_open = RwSignal::new(false);
    let backfill_from = RwSignal::new(String::new());
    let backfill_to = RwSignal::new(String::new());
    let backfill_max = RwSignal::new("1".to_owned());
    let backfill_newest = RwSignal::new(false);
    let backfill_error = RwSignal::new(None::<String>);
    let started = RwSignal::new(None::<Backfill>);

    let fetch = move || {
        if let Some(sid) = id.get_untracked() {
            let path = format!("/schedules/{sid}");
            fetched.load(async move { api::get::<ScheduleDetail>(&path).await });
        }
    };
    let fetch_soon = ui::throttled(REFETCH_GAP_MS, fetch);
    Effect::new(move |_| {
        id.track();
        ran.set(None);
        started.set(None);
        action_error.set(None);
        fetch();
    });
    live.on_change(|l| l.resync.track(), fetch);
    live.on_ids(
        |l| l.schedules,
        move |ids| {
            if id.get_untracked().is_some_and(|sid| ids.contains(&sid)) {
                fetch_soon();
            }
        },
    );

    // Runs an action, shows its error if any, and refetches.
    let act = move |path: &'static str| {
        let Some(sid) = id.get_untracked() else {
            return;
        };
        busy.set(true);
        action_error.set(None);
        spawn_local(async move {
            let result = match path {
                "run" => api::post_empty::<RunNow>(&format!("/schedules/{sid}/run"))
                    .await
                    .map(|r| {
                        ran.try_set(Some(r));
                    }),
                _ => api::post_empty::<Schedule>(&format!("/schedules/{sid}/{path}"))
                    .await
                    .map(|_| ()),
            };
            if let Err(e) = result {
                action_error.try_set(Some(e.message));
            }
            busy.try_set(false);
            fetch();
        });
    };
    let start_backfill = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let Some(sid) = id.get_untracked() else {
            return;
        };
        let request = match backfill_request(
            &backfill_from.get_untracked(),
            &backfill_to.get_untracked(),
            &backfill_max.get_untracked(),
            backfill_newest.get_untracked(),
            local_datetime,
        ) {
            Ok(request) => request,
            Err(e) => {
                backfill_error.set(Some(e));
                return;
            }
        };
        busy.set(true);
        backfill_error.set(None);
        spawn_local(async move {
            match api::post::<_, Backfill>(&format!("/schedules/{sid}/backfills"), &request).await {
                Ok(b) => {
                    started.try_set(Some(b));
                    backfill_open.try_set(false);
                }
                Err(e) => {
                    backfill_error.try_set(Some(e.message));
                }
            }
            busy.try_set(false);
            fetch();
        });
    };
    let cancel_backfill = Callback::new(move |backfill: Uuid| {
        busy.set(true);
        action_error.set(None);
        spawn_local(async move {
            if let Err(e) =
                api::post_empty::<Backfill>(&format!("/backfills/{backfill}/cancel")).await
            {
                action_error.try_set(Some(e.message));
            }
            busy.try_set(false);
            fetch();
        });
    });
    let delete = move |_| {
        let Some(sid) = id.get_untracked() else {
            return;
        };
        let name = fetched
            .data
            .with_untracked(|d| d.as_ref().map(|d| d.schedule.name.clone()))
            .unwrap_or_default();
        let confirmed = web_sys::window()
            .and_then(|w| {
                w.confirm_with_message(&format!(
                    "Delete the schedule {name} and its runs? Tasks it submitted stay."
                ))
                .ok()
            })
            .unwrap_or(false);
        if !confirmed {
            return;
        }
        busy.set(true);
        action_error.set(None);
        let navigate = navigate.clone();
        spawn_local(async move {
            match api::delete::<Schedule>(&format!("/schedules/{sid}")).await {
                Ok(_) => {
                    deleted.try_set(true);
                    navigate("/schedules", Default::default());
                }
                Err(e) => {
                    action_error.try_set(Some(e.message));
                }
            }
            busy.try_set(false);
        });
    };

    let paused = move || {
        fetched
            .data
            .with(|d| d.as_ref().is_some_and(|d| d.schedule.paused_at.is_some()))
    };
    let fetch_error = fetched.error_message();
    // A deleted schedule's page is left at once: the refetch that finds it gone says nothing.
    let error = Signal::derive(move || match id.get() {
        None => Some("This is not a schedule id.".to_owned()),
        Some(_) if deleted.get() => None,
        Some(_) => fetch_error.get(),
    });

    view! {
        <p class="hint"><a href="/schedules">"← Schedules"</a></p>
        <ui::Loaded error=error ready=fetched.ready()>
            <h1>
                {move || fetched.data.with(|d| d.as_ref().map(|d| d.schedule.name.clone()))} " "
                {move || status_badge(paused())}
            </h1>
            <div class="actions">
                <Show
                    when=paused
                    fallback=move || view! {
                        <ui::ActionButton action="pause" disabled=busy on_click=move |_| act("pause")>"Pause"</ui::ActionButton>
                    }
                >
                    <ui::ActionButton action="resume" disabled=busy on_click=move |_| act("resume")>"Resume"</ui::ActionButton>
                </Show>
                <ui::ActionButton action="run-now" disabled=busy on_click=move |_| act("run")
                    title="Submit one occurrence now, outside the schedule">
                    "Run now"
                </ui::ActionButton>
                <ui::ActionButton action="backfill" disabled=busy
                    on_click=move |_| {
                        if backfill_to.get_untracked().is_empty() {
                            backfill_to.set(local_datetime_now());
                        }
                        backfill_open.update(|open| *open = !*open)
                    }
                    title="Run the schedule for every tick of a past range">
                    "Backfill"
                </ui::ActionButton>
                <ui::ActionButton action="delete" danger=true disabled=busy on_click=delete.clone()>"Delete"</ui::ActionButton>
            </div>
            <ui::ErrorBox message=action_error/>
            <Show when=move || backfill_open.get()>
                <form class="form backfill-form panel" on:submit=start_backfill novalidate=true>
                    <p class="full hint">
                        "Every tick of the range gets an occurrence with its own tick, at most "
                        "the given number at once; a tick that has run already is not run again. "
                        "Times are in your browser's zone (" {ui::time_zone()} ")."
                    </p>
                    <Field id="backfill-from" label="From" name="from" kind="datetime-local" value=backfill_from/>
                    <Field id="backfill-to" label="To (included)" name="to" kind="datetime-local" value=backfill_to/>
                    <Field id="backfill-max-active" label="At most at once" name="max_active" inputmode="numeric" value=backfill_max hint="1 to 1000"/>
                    <Field id="backfill-newest-first" label="Newest tick first" name="newest_first" value=backfill_newest/>
                    <div class="full actions">
                        <button type="submit" class="primary" data-action="start-backfill" disabled=move || busy.get()>
                            "Start backfill"
                        </button>
                    </div>
                    <div class="full"><ui::ErrorBox message=backfill_error/></div>
                </form>
            </Show>
            {move || started.get().map(|b| view! {
                <p class="notice" role="status">
                    {format!("Backfill started: {} ticks.", b.ticks)}
                </p>
            })}
            {move || ran.get().map(|r| view! {
                <p class="notice" role="status">
                    "Submitted " {if r.task_id.is_some() { "task " } else { "workflow " }}
                    {occurrence(r.task_id, r.workflow_id)} "."
                </p>
            })}
            {move || {
                fetched
                    .data
                    .get()
                    .map(|d| view! {
                        <Detail detail=d tick=tick template_open=template_open
                            cancel_backfill=cancel_backfill busy=busy/>
                    })
            }}
        </ui::Loaded>
    }
}

/// The schedule's settings, next fire times, backfills and latest runs.
#[component]
fn Detail(
    detail: ScheduleDetail,
    tick: ReadSignal<u64>,
    template_open: RwSignal<bool>,
    cancel_backfill: Callback<Uuid>,
    busy: RwSignal<bool>,
) -> impl IntoView {
    let s = detail.schedule;
    let zone = s.time_zone.clone();
    let local_zone = ui::browser_zone();
    let show_local = local_zone.as_deref() != Some(zone.as_str());
    let template_json = s
        .task
        .as_ref()
        .or(s.workflow.as_ref())
        .and_then(|t| serde_json::to_string_pretty(t).ok())
        .unwrap_or_default();
    let misfire = format!(
        "{} (grace {}, catch-up limit {})",
        s.misfire_policy,
        ui::duration(s.misfire_grace_secs),
        s.catch_up_limit
    );
    let last_fired = s.last_fire_at.map(|at| {
        view! {
            <ui::Time at=at/> " (" {ui::age(at, tick)} ") "
            {occurrence(s.last_task_id, s.last_workflow_id)}
        }
    });
    let next_times = detail
        .next_fire_times
        .iter()
        .map(|&at| {
            let in_zone = zone_time(at, &zone).map(|t| format!("{t} {zone}"));
            view! {
                <li>
                    {in_zone.unwrap_or_else(|| ui::local_time(at))}
                    {show_local.then(|| view! { <span class="hint">" · local " {ui::local_time(at)}</span> })}
                    <span class="hint">" · " {ui::age(at, tick)}</span>
                </li>
            }
        })
        .collect_view();
    let no_next = detail.next_fire_times.is_empty();
    let paused = s.paused_at.is_some();
    let runs = detail.runs;
    let no_runs = runs.is_empty();
    let backfills = detail.backfills;

    view! {
        <div class="panel">
            <dl class="kv">
                <dt>"Expression"</dt>
                <dd><code>{s.cron.clone()}</code></dd>
                <dt>"Time zone"</dt>
                <dd>{zone.clone()}</dd>
                <dt>"Runs"</dt>
                <dd class="mono">{template(&s)}</dd>
                <dt>"Misfire policy"</dt>
                <dd>{misfire}</dd>
                <dt>"Overlap policy"</dt>
                <dd>{s.overlap_policy.replace('_', " ")}</dd>
                {(s.jitter_secs > 0.0).then(|| view! {
                    <dt>"Jitter"</dt>
                    <dd>"up to " {ui::duration(s.jitter_secs)}</dd>
                })}
                <dt>"History"</dt>
                <dd>
                    {format!("the latest {} runs are kept", ui::count(i64::from(s.history_limit)))}
                    " — "
                    <a href=format!("/tasks?schedule={}", s.id) data-action="occurrences">"their tasks in the task list"</a>
                </dd>
                {s.paused_at.map(|at| view! {
                    <dt>"Paused"</dt>
                    <dd><ui::Time at=at/> " (" {ui::age(at, tick)} ")"</dd>
                })}
                {s.queued_fire_at.map(|at| view! {
                    <dt>"Queued tick"</dt>
                    <dd><ui::Time at=at/> " waits for the previous occurrence to finish"</dd>
                })}
                <dt>"Last fired"</dt>
                <dd>{last_fired.map(IntoAny::into_any).unwrap_or_else(|| "never".into_any())}</dd>
                <dt>"Owner"</dt>
                <dd>{s.owner.clone()}</dd>
                <dt>"Created"</dt>
                <dd><ui::Time at=s.created_at/></dd>
                <dt>"Id"</dt>
                <dd class="mono">{s.id.to_string()}</dd>
            </dl>
        </div>
        <details class="panel" open=template_open.get_untracked()>
            <summary on:click=move |_| template_open.update(|open| *open = !*open)>
                {if s.workflow.is_some() { "Workflow template" } else { "Task template" }}
            </summary>
            <pre class="json">{template_json}</pre>
        </details>
        <h2>"Next ticks"</h2>
        {if no_next {
            view! {
                <ui::Empty>
                    {if paused { "None while paused: a resumed schedule starts at its next tick." } else { "No further ticks." }}
                </ui::Empty>
            }
            .into_any()
        } else {
            view! {
                <div class="panel">
                    <ol class="times">{next_times}</ol>
                </div>
            }
            .into_any()
        }}
        {(!backfills.is_empty()).then(|| view! {
            <h2>"Backfills"</h2>
            <ui::Table class="schedule-backfills" heads=view! {
                <th>"Range"</th> <th>"State"</th> <th>"Progress"</th>
                <th class="hide-narrow">"Started"</th> <th></th>
            }>
                {backfills
                    .into_iter()
                    .map(|b| {
                        let running = b.state == "running";
                        let id = b.id;
                        let done = b.fired + b.already;
                        view! {
                            <tr data-backfill=b.id.to_string() data-state=b.state.clone()>
                                <td>
                                    <ui::Time at=b.from/> " → " <ui::Time at=b.to/>
                                    {(b.order == BackfillOrder::NewestFirst).then(|| view! { <span class="hint">" · newest first"</span> })}
                                </td>
                                <td>{outcome_badge(&b.state)}</td>
                                <td class="wrap">
                                    <progress max=b.ticks.to_string() value=done.to_string()></progress>
                                    " " {backfill_progress(&b)}
                                </td>
                                <td class="hide-narrow"><ui::Time at=b.created_at/></td>
                                <td>
                                    {running.then(|| view! {
                                        <ui::ActionButton action="cancel-backfill" danger=true disabled=busy
                                            on_click=move |_| cancel_backfill.run(id)>
                                            "Cancel"
                                        </ui::ActionButton>
                                    })}
                                </td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </ui::Table>
        })}
        <h2>"Recent runs"</h2>
        {if no_runs {
            view! { <ui::Empty>"No runs yet."</ui::Empty> }.into_any()
        } else {
            view! {
                <ui::Table class="schedule-runs" heads=view! {
                    <th>"Tick"</th> <th>"Outcome"</th> <th>"Occurrence"</th> <th>"Detail"</th>
                    <th class="hide-narrow">"Recorded"</th>
                }>
                    {runs
                        .into_iter()
                        .map(|r| {
                            let detail = run_detail(&r);
                            view! {
                                <tr data-outcome=r.outcome.clone()>
                                    <td>
                                        <ui::Time at=r.fire_at/>
                                        <span class="hint">" · " {ui::age(r.fire_at, tick)}</span>
                                    </td>
                                    <td>{outcome_badge(&r.outcome)}</td>
                                    <td>{occurrence(r.task_id, r.workflow_id)}</td>
                                    <td class="wrap">{detail}</td>
                                    <td class="hide-narrow"><ui::Time at=r.recorded_at/></td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </ui::Table>
            }
            .into_any()
        }}
    }
}

/// A backfill's counts as a line: ticks handled of all, what its occurrences did, the next
/// tick and why it failed.
pub fn backfill_progress(b: &Backfill) -> String {
    let mut line = format!("{} of {} ticks fired", b.fired, b.ticks);
    if b.already > 0 {
        line.push_str(&format!(", {} had run already", b.already));
    }
    line.push_str(&format!(
        " · {} running · {} succeeded · {} failed",
        b.active, b.succeeded, b.failed
    ));
    if let Some(next) = b.next_tick {
        line.push_str(&format!(" · next tick {}", ui::local_time(next)));
    }
    if let Some(error) = &b.error {
        line.push_str(&format!(" · {error}"));
    }
    line
}

/// The request the backfill form's fields make, or what is wrong with them. `from` and `to`
/// are `datetime-local` texts, read as the browser's local time by `parse`.
pub fn backfill_request(
    from: &str,
    to: &str,
    max_active: &str,
    newest_first: bool,
    parse: impl Fn(&str) -> Option<DateTime<Utc>>,
) -> Result<StartBackfill, String> {
    let time = |text: &str, field: &str| {
        if text.trim().is_empty() {
            return Err(format!("Give the {field} of the range."));
        }
        parse(text.trim()).ok_or_else(|| format!("The {field} is not a date and time: {text}"))
    };
    let max_active = match max_active.trim() {
        "" => None,
        n => match n.parse::<i32>() {
            Ok(n) if (1..=1000).contains(&n) => Some(n),
            _ => {
                return Err(format!(
                    "At most at once must be a number from 1 to 1000, not {n}"
                ));
            }
        },
    };
    Ok(StartBackfill {
        from: time(from, "start")?,
        to: time(to, "end")?,
        max_active,
        order: newest_first.then_some(BackfillOrder::NewestFirst),
    })
}

/// A `datetime-local` text (`2026-03-01T02:30`) as the browser's local time.
fn local_datetime(text: &str) -> Option<DateTime<Utc>> {
    let ms = js_sys::Date::new(&JsValue::from_str(text)).get_time();
    if ms.is_nan() {
        return None;
    }
    DateTime::from_timestamp_millis(ms as i64)
}

/// Now as a `datetime-local` text in the browser's local time, to the minute.
fn local_datetime_now() -> String {
    let d = js_sys::Date::new_0();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}",
        d.get_full_year(),
        d.get_month() + 1,
        d.get_date(),
        d.get_hours(),
        d.get_minutes()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backfill() -> Backfill {
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        Backfill {
            id: Uuid::nil(),
            schedule_id: Uuid::nil(),
            from: at("2026-03-01T00:00:00Z"),
            to: at("2026-03-10T00:00:00Z"),
            order: BackfillOrder::OldestFirst,
            max_active: 2,
            state: "failed".into(),
            ticks: 10,
            fired: 6,
            already: 4,
            active: 0,
            succeeded: 5,
            failed: 1,
            next_tick: None,
            error: Some("the occurrence of the tick at … could not be submitted: no".into()),
            created_at: at("2026-03-11T00:00:00Z"),
            finished_at: None,
        }
    }

    #[test]
    fn a_backfills_progress_reads_as_one_line() {
        assert_eq!(
            backfill_progress(&backfill()),
            "6 of 10 ticks fired, 4 had run already · 0 running · 5 succeeded · 1 failed · \
             the occurrence of the tick at … could not be submitted: no"
        );
    }

    #[test]
    fn the_backfill_form_reads_its_fields_or_says_what_is_wrong() {
        let parse = |s: &str| format!("{s}:00Z").parse::<DateTime<Utc>>().ok();
        let request =
            backfill_request("2026-03-01T02:30", "2026-03-02T00:00", " 4 ", true, parse).unwrap();
        assert_eq!(
            request.from,
            "2026-03-01T02:30:00Z".parse::<DateTime<Utc>>().unwrap()
        );
        assert_eq!(request.max_active, Some(4));
        assert_eq!(request.order, Some(BackfillOrder::NewestFirst));
        let request =
            backfill_request("2026-03-01T02:30", "2026-03-02T00:00", "", false, parse).unwrap();
        assert_eq!((request.max_active, request.order), (None, None));
        for (from, to, max, says) in [
            ("", "2026-03-02T00:00", "1", "Give the start of the range."),
            ("2026-03-01T02:30", " ", "1", "Give the end of the range."),
            (
                "yesterday",
                "2026-03-02T00:00",
                "1",
                "The start is not a date and time: yesterday",
            ),
            (
                "2026-03-01T02:30",
                "2026-03-02T00:00",
                "0",
                "from 1 to 1000, not 0",
            ),
            (
                "2026-03-01T02:30",
                "2026-03-02T00:00",
                "many",
                "from 1 to 1000, not many",
            ),
        ] {
            let err = backfill_request(from, to, max, false, parse).unwrap_err();
            assert!(err.contains(says), "{from} {to} {max}: {err}");
        }
    }
}
