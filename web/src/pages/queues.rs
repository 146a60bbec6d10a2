//! The queues page (`/queues`): per queue, the tasks due now (its depth), delayed, running and
//! retrying, how long its oldest due task has waited, its controls (paused, concurrency and
//! rate limits), with pause and resume buttons and a form that edits the limits and the
//! queue's own retention for admins, and how long its finished tasks are kept (its own
//! retention, or the cluster's from `GET /api/v1/retention`, which the page's hint states).
//!
//! The numbers come from `GET /api/v1/overview`, the snapshot `GET /api/v1/queues` is built
//! from: the overview tells due tasks from delayed ones, which `/queues` counts together as
//! `waiting`. Live like the overview page. The controls come from `GET /api/v1/queues`,
//! fetched at start, after an action and at most every few seconds while the overview
//! changes; a queue with controls is listed even without tasks. Rows are keyed by the
//! queue's name and follow its numbers in place, so an open limits form keeps what is typed
//! in it while the numbers change.

use std::collections::BTreeMap;

use leptos::prelude::*;
use leptos::task::spawn_local;
use sked_types::{
    MAX_RETENTION_SECS, MIN_RETENTION_SECS, QueueControls, QueueCounts, QueueLimits, QueueOverview,
    Retention,
};

use crate::api;
use crate::pages::overview::{QueueCountCells, QueueCountHeads, aged_secs, live_overview};
use crate::ui::{self, ErrorBox};

/// Fewest milliseconds between two reads of the controls while the overview changes.
const CONTROLS_GAP_MS: f64 = 5000.0;

/// A queue's controls as `GET /api/v1/queues` shows them.
fn controls_of(q: &QueueCounts) -> QueueControls {
    QueueControls {
        queue: q.queue.clone(),
        paused_at: q.paused_at,
        max_running: q.max_running,
        rate_per_sec: q.rate_per_sec,
        burst: q.burst,
        retention_secs: q.retention_secs,
        keep_failed_secs: q.keep_failed_secs,
    }
}

/// A retention in seconds as people say it: whole days, else hours.
fn span(secs: f64) -> String {
    if secs >= 86_400.0 && secs % 86_400.0 == 0.0 {
        format!("{} d", secs / 86_400.0)
    } else if secs % 3_600.0 == 0.0 {
        format!("{} h", secs / 3_600.0)
    } else {
        format!("{secs} s")
    }
}

/// How long a queue keeps its finished and failed tasks: its own retention, else the
/// cluster's (`default`, when known), as "kept 1 d · failed 30 d (default)". A failed task is
/// kept for the longer of the two. Empty while the cluster's is unknown and the queue sets
/// none; "kept for ever" while retention is off.
fn retention_text(c: &QueueControls, cluster: Option<&Retention>) -> String {
    if cluster.is_some_and(|r| !r.enabled) {
        return "kept for ever (retention off)".to_owned();
    }
    let own = |v: Option<f64>, default: Option<f64>| match (v, default) {
        (Some(secs), _) => Some(span(secs)),
        (None, Some(secs)) => Some(format!("{} (default)", span(secs))),
        (None, None) => None,
    };
    let kept = c.retention_secs.or(cluster.map(|r| r.retention_secs));
    let failed = c.keep_failed_secs.or(cluster.map(|r| r.keep_failed_secs));
    let failed = match (kept, failed) {
        (Some(k), Some(f)) if k > f => Some(k),
        (_, f) => f,
    };
    let kept_text =
        own(c.retention_secs, cluster.map(|r| r.retention_secs)).map(|t| format!("kept {t}"));
    let failed_text = match c.keep_failed_secs {
        Some(_) => failed.map(span),
        None => failed.map(|secs| format!("{} (default)", span(secs))),
    }
    .map(|t| format!("failed {t}"));
    [kept_text, failed_text]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The queues to show: the overview's, each with its controls, and the queues that have
/// controls but no task counted, by name.
fn merge(
    overview: Vec<QueueOverview>,
    controls: &BTreeMap<String, QueueControls>,
) -> Vec<(QueueOverview, QueueControls)> {
    let mut rows: BTreeMap<String, (QueueOverview, QueueControls)> = overview
        .into_iter()
        .map(|q| {
            let c = controls.get(&q.queue).cloned().unwrap_or(QueueControls {
                queue: q.queue.clone(),
                ..QueueControls::default()
            });
            (q.queue.clone(), (q, c))
        })
        .collect();
    for (name, c) in controls {
        rows.entry(name.clone()).or_insert_with(|| {
            (
                QueueOverview {
                    queue: name.clone(),
                    ..QueueOverview::default()
                },
                c.clone(),
            )
        });
    }
    rows.into_values().collect()
}

#[component]
pub fn Queues() -> impl IntoView {
    let session = api::session();
    let (fetched, tick) = live_overview();
    let aged = aged_secs(fetched, tick);
    let controls = ui::Fetched::<Vec<QueueCounts>>::new();
    let load_controls = move || controls.load(api::get::<Vec<QueueCounts>>("/queues"));
    load_controls();
    // The cluster's retention, read once: it changes rarely, and the page's hint and every
    // queue that sets none show it.
    let cluster = ui::Fetched::<Retention>::new();
    cluster.load(api::get::<Retention>("/retention"));
    let cluster_retention = Signal::derive(move || cluster.data.get());
    let reload_controls = ui::throttled(CONTROLS_GAP_MS, load_controls);
    Effect::watch(
        move || fetched.data.with(|o| o.as_ref().map(|o| o.at)),
        move |_, _, _| reload_controls(),
        false,
    );
    let is_admin = Signal::derive(move || {
        session
            .me
            .with(|m| m.as_ref().is_some_and(|m| m.role == "admin"))
    });
    // The limits form opens with the queue's limits: only once they are known.
    let controls_ready = Signal::derive(move || controls.data.with(Option::is_some));
    let action_error = RwSignal::new(None::<String>);
    let queues = Memo::new(move |_| {
        let by_name: BTreeMap<String, QueueControls> = controls.data.with(|c| {
            c.iter()
                .flatten()
                .filter(|q| {
                    q.paused_at.is_some()
                        || q.max_running.is_some()
                        || q.rate_per_sec.is_some()
                        || q.retention_secs.is_some()
                        || q.keep_failed_secs.is_some()
                })
                .map(|q| (q.queue.clone(), controls_of(q)))
                .collect()
        });
        let overview = fetched
            .data
            .with(|o| o.as_ref().map(|o| o.queues.clone()).unwrap_or_default());
        merge(overview, &by_name)
    });
    // One error at a time: the overview's, the controls', then the last action's.
    let (overview_error, controls_error) = (fetched.error_message(), controls.error_message());
    let error = Signal::derive(move || {
        overview_error
            .get()
            .or_else(|| controls_error.get())
            .or_else(|| action_error.get())
    });
    let act = move |queue: String, action: &'static str| {
        action_error.set(None);
        spawn_local(async move {
            let path = format!("/queues/{}/{action}", api::enc(&queue));
            if let Err(e) = api::post_empty::<QueueControls>(&path).await {
                action_error.try_set(Some(e.message));
            }
            load_controls();
        });
    };
    let names =
        move || queues.with(|qs| qs.iter().map(|(q, _)| q.queue.clone()).collect::<Vec<_>>());
    view! {
        <h1>"Queues"</h1>
        <ui::Loaded
            error=error
            ready=fetched.ready()
            empty=Signal::derive(move || queues.with(Vec::is_empty))
            when_empty=|| "No queue has unfinished tasks, tasks finished in the last hour or controls."
        >
            <p class="hint">
                {move || fetched.data.with(|o| o.as_ref().map(|o| {
                    let whose = o.owner.as_ref().map_or_else(
                        || "every owner's tasks".to_owned(),
                        |owner| format!("tasks of {owner}"),
                    );
                    format!("Queues with unfinished tasks or tasks finished in the last hour; {whose}.")
                }))}
                " "
                <span class="retention-default">
                    {move || cluster.data.with(|r| r.as_ref().map(|r| if r.enabled {
                        format!(
                            "Finished tasks are kept {}, failed ones {}, unless their queue sets its own retention.",
                            span(r.retention_secs),
                            span(r.keep_failed_secs.max(r.retention_secs)),
                        )
                    } else {
                        "Retention is off: no finished task is deleted.".to_owned()
                    }))}
                </span>
            </p>
            <ui::Table class="queues" heads=view! {
                <QueueCountHeads due="Depth (due)"/>
                <th title="paused, limits over all workers, and how long finished tasks are kept">"Controls"</th>
                <th class="hide-narrow"></th>
            }>
                <For
                    each=names
                    key=|name| name.clone()
                    children=move |name| queue_row(name, queues, cluster_retention, aged, is_admin, controls_ready, act, load_controls)
                />
            </ui::Table>
        </ui::Loaded>
    }
}

/// A queue's controls as words: `paused`/`active`, then its limits.
fn controls_text(c: &QueueControls) -> Vec<String> {
    let mut limits = Vec::new();
    if let Some(n) = c.max_running {
        limits.push(format!("max {n} running"));
    }
    if let Some(rate) = c.rate_per_sec {
        limits.push(format!("{rate}/s, burst {}", c.burst.unwrap_or(1)));
    }
    limits
}

/// The most a count limit or the rate may be, as the API says.
const MOST: i64 = 1_000_000;

/// The limits form's fields as typed. An empty field (or `none`) removes the limit; an empty
/// burst is the rate rounded up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitsForm {
    pub max_running: String,
    pub rate_per_sec: String,
    pub burst: String,
    /// The queue's own retention and keep-failed retention as durations (`12h`, `7d`, `2w`);
    /// empty: the cluster's.
    pub retention: String,
    pub keep_failed: String,
}

impl LimitsForm {
    /// The form filled with a queue's controls. A burst that is the rate rounded up (the
    /// default) is left empty, so that a new rate brings its own default burst.
    pub fn of(c: &QueueControls) -> LimitsForm {
        let default_burst = c.rate_per_sec.map(default_burst);
        LimitsForm {
            max_running: c.max_running.map(|n| n.to_string()).unwrap_or_default(),
            rate_per_sec: c.rate_per_sec.map(|r| r.to_string()).unwrap_or_default(),
            burst: c
                .burst
                .filter(|&b| Some(b) != default_burst)
                .map(|b| b.to_string())
                .unwrap_or_default(),
            retention: c.retention_secs.map(compact_span).unwrap_or_default(),
            keep_failed: c.keep_failed_secs.map(compact_span).unwrap_or_default(),
        }
    }

    /// The `PATCH /api/v1/queues/{name}` body that sets all three limits and both retentions
    /// as typed (`null` for an empty field), or what is wrong with the first bad field. A
    /// burst without a rate is left to the server, which refuses it with its own message.
    pub fn parse(&self) -> Result<QueueLimits, String> {
        Ok(QueueLimits {
            max_running: Some(parse_count(&self.max_running, "Max running", "no limit")?),
            rate_per_sec: Some(parse_rate(&self.rate_per_sec)?),
            burst: Some(parse_count(&self.burst, "Burst", "the rate rounded up")?),
            retention_secs: Some(parse_retention(&self.retention, "Keep finished")?),
            keep_failed_secs: Some(parse_retention(&self.keep_failed, "Keep failed")?),
        })
    }
}

/// The burst of a rate without one set: the rate rounded up, at least 1 (as
/// `sked.queue_burst` computes it).
fn default_burst(rate: f64) -> i32 {
    rate.ceil().max(1.0) as i32
}

/// A retention as the form shows it: whole weeks, days or hours (`2w`, `7d`, `12h`), else
/// seconds.
fn compact_span(secs: f64) -> String {
    for (unit, per) in [("w", 604_800.0), ("d", 86_400.0), ("h", 3_600.0)] {
        if secs >= per && secs % per == 0.0 {
            return format!("{}{unit}", secs / per);
        }
    }
    format!("{secs}s")
}

/// A retention typed as a number and a unit (`12h`, `7d`, `2w`, `3600s`; a number alone is
/// days), an hour to 36,500 days, or `None` for an empty field (the cluster's).
fn parse_retention(text: &str, field: &str) -> Result<Option<f64>, String> {
    let t = text.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let per = match unit.trim() {
        "s" => 1.0,
        "h" => 3_600.0,
        "" | "d" => 86_400.0,
        "w" => 604_800.0,
        _ => {
            return Err(format!(
                "{field} must be a duration like 12h, 7d or 2w, got “{t}” (leave it empty for the cluster's)."
            ));
        }
    };
    let secs = match number.trim().parse::<f64>() {
        Ok(n) if n.is_finite() => n * per,
        _ => {
            return Err(format!(
                "{field} must be a duration like 12h, 7d or 2w, got “{t}” (leave it empty for the cluster's)."
            ));
        }
    };
    if (MIN_RETENTION_SECS..=MAX_RETENTION_SECS).contains(&secs) {
        Ok(Some(secs))
    } else {
        Err(format!(
            "{field} must be between an hour and 36500 days, got {t}."
        ))
    }
}

/// True for a field that means "no limit".
fn unset(text: &str) -> bool {
    text.is_empty() || text.eq_ignore_ascii_case("none")
}

/// A whole number from 1 to 1,000,000, or `None` for an empty field.
fn parse_count(text: &str, field: &str, empty: &str) -> Result<Option<i32>, String> {
    let t = text.trim();
    if unset(t) {
        return Ok(None);
    }
    match t.parse::<i64>() {
        Ok(n) if (1..=MOST).contains(&n) => Ok(Some(n as i32)),
        Ok(n) if n < 1 => Err(format!(
            "{field} must be at least 1, got {n} (leave it empty for {empty})."
        )),
        _ if t.bytes().all(|b| b.is_ascii_digit()) => {
            Err(format!("{field} must be at most {MOST}, got {t}."))
        }
        _ => Err(format!(
            "{field} must be a whole number, got “{t}” (leave it empty for {empty})."
        )),
    }
}

/// Tasks per second, more than 0 and at most 1,000,000 (fractions allowed), or `None` for an
/// empty field.
fn parse_rate(text: &str) -> Result<Option<f64>, String> {
    let t = text.trim();
    if unset(t) {
        return Ok(None);
    }
    match t.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= MOST as f64 => Ok(Some(r)),
        Ok(r) if r.is_finite() && r <= 0.0 => Err(format!(
            "Rate per second must be more than 0, got {t} (0.5 is one start every two seconds; leave it empty for no limit)."
        )),
        Ok(r) if r.is_finite() => Err(format!("Rate per second must be at most {MOST}, got {t}.")),
        _ => Err(format!(
            "Rate per second must be a number, got “{t}” (leave it empty for no limit)."
        )),
    }
}

/// A queue's row, which follows the queue in `queues`, and for admins its limits form in a
/// row under it. The form is the row's own state: it stays open, with what is typed, while
/// the numbers change, and closes when saved or cancelled.
#[allow(clippy::too_many_arguments)]
fn queue_row(
    name: String,
    queues: Memo<Vec<(QueueOverview, QueueControls)>>,
    cluster: Signal<Option<Retention>>,
    aged: Signal<f64>,
    admin: Signal<bool>,
    controls_ready: Signal<bool>,
    act: impl Fn(String, &'static str) + Copy + Send + Sync + 'static,
    reload: impl Fn() + Copy + Send + Sync + 'static,
) -> impl IntoView {
    let row = Memo::new({
        let name = name.clone();
        move |_| queues.with(|qs| qs.iter().find(|(q, _)| q.queue == name).cloned())
    });
    let counts =
        Memo::new(move |_| row.with(|r| r.as_ref().map(|(q, _)| q.clone()).unwrap_or_default()));
    let paused =
        Memo::new(move |_| row.with(|r| r.as_ref().is_some_and(|(_, c)| c.paused_at.is_some())));
    let limits = move || {
        row.with(|r| {
            r.as_ref()
                .map(|(_, c)| controls_text(c).join(" · "))
                .unwrap_or_default()
        })
    };
    let retention = move || {
        cluster.with(|cluster| {
            row.with(|r| {
                r.as_ref()
                    .map(|(_, c)| retention_text(c, cluster.as_ref()))
                    .unwrap_or_default()
            })
        })
    };

    let editing = RwSignal::new(false);
    let form = RwSignal::new(LimitsForm::default());
    let form_error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let open_form = move || {
        form.set(row.with_untracked(|r| {
            r.as_ref()
                .map(|(_, c)| LimitsForm::of(c))
                .unwrap_or_default()
        }));
        form_error.set(None);
        editing.set(true);
    };
    let close_form = move || {
        editing.set(false);
        form_error.set(None);
    };

    let buttons = {
        let name = name.clone();
        move || {
            admin.get().then(|| {
                let name = name.clone();
                let (action, label) = if paused.get() {
                    ("resume", "Resume")
                } else {
                    ("pause", "Pause")
                };
                view! {
                    <button type="button" data-action=action on:click=move |_| act(name.clone(), action)>
                        {label}
                    </button>
                    " "
                    <button
                        type="button"
                        data-action="edit-limits"
                        aria-expanded=move || editing.get().to_string()
                        disabled=move || editing.get() || !controls_ready.get()
                        on:click=move |_| open_form()
                    >
                        "Edit limits"
                    </button>
                }
            })
        }
    };

    let save = {
        let path = format!("/queues/{}", api::enc(&name));
        move |ev: leptos::ev::SubmitEvent| {
            ev.prevent_default();
            if busy.get_untracked() {
                return;
            }
            let limits = match form.with_untracked(LimitsForm::parse) {
                Ok(limits) => limits,
                Err(message) => {
                    form_error.set(Some(message));
                    return;
                }
            };
            form_error.set(None);
            busy.set(true);
            let path = path.clone();
            spawn_local(async move {
                let result = api::patch::<QueueLimits, QueueControls>(&path, &limits).await;
                busy.try_set(false);
                match result {
                    Ok(_) => {
                        editing.try_set(false);
                    }
                    Err(e) => {
                        form_error.try_set(Some(e.message));
                    }
                }
                reload();
            });
        }
    };
    // Text inputs, not `type=number`: a number input reads as empty when what is typed is not
    // a number, which would remove the limit instead of saying what is wrong.
    let field = move |id: &'static str,
                      label: &'static str,
                      placeholder: &'static str,
                      mode: &'static str,
                      get: fn(&LimitsForm) -> &String,
                      set: fn(&mut LimitsForm, String)| {
        view! {
            <label class="field">
                {label}
                <input
                    name=id
                    inputmode=mode
                    autocomplete="off"
                    placeholder=placeholder
                    prop:value=move || form.with(|f| get(f).clone())
                    on:input=move |ev| form.update(|f| set(f, event_target_value(&ev)))
                />
            </label>
        }
    };
    let form_of = name.clone();
    let form_row = move || {
        (admin.get() && editing.get()).then(|| {
            view! {
                <tr class="sub limits-edit" data-limits-of=form_of.clone()>
                    <td colspan="9">
                        <form
                            class="limits-form"
                            novalidate=true
                            on:submit=save.clone()
                            on:keydown=move |ev| {
                                if ev.key() == "Escape" {
                                    close_form()
                                }
                            }
                        >
                            {field("max_running", "Max running", "none", "numeric", |f| &f.max_running, |f, v| f.max_running = v)}
                            {field("rate_per_sec", "Rate per second", "none", "decimal", |f| &f.rate_per_sec, |f, v| f.rate_per_sec = v)}
                            {field("burst", "Burst", "rate rounded up", "numeric", |f| &f.burst, |f, v| f.burst = v)}
                            {field("retention", "Keep finished", "default", "text", |f| &f.retention, |f, v| f.retention = v)}
                            {field("keep_failed", "Keep failed", "default", "text", |f| &f.keep_failed, |f, v| f.keep_failed = v)}
                            <div class="actions">
                                <button type="submit" class="primary" data-action="save-limits" disabled=move || busy.get()>
                                    "Save"
                                </button>
                                <button type="button" data-action="cancel-limits" on:click=move |_| close_form()>
                                    "Cancel"
                                </button>
                            </div>
                            <p class="hint">
                                "Over all workers: tasks running at once, tasks started per second (0.5: one every two seconds) and starts at once under the rate. An empty field removes the limit; an empty burst is the rate rounded up. Keep finished and keep failed: how long the queue's finished and failed tasks are kept (12h, 7d, 2w); empty: the cluster's."
                            </p>
                            <ErrorBox message=form_error/>
                        </form>
                    </td>
                </tr>
            }
        })
    };

    view! {
        <tr data-queue=name.clone() data-paused=move || paused.get().to_string()>
            <QueueCountCells q=counts aged=aged/>
            <td class="controls">
                {move || if paused.get() {
                    view! { <span class="badge schedule-paused">"paused"</span> }
                } else {
                    view! { <span class="badge schedule-active">"active"</span> }
                }}
                " "
                <span class="limits">{limits}</span>
                " "
                <span class="retention" title="how long its finished tasks are kept">{retention}</span>
                " "
                {buttons}
            </td>
            <td class="hide-narrow"><a href=format!("/tasks?queue={}", api::enc(&name))>"tasks →"</a></td>
        </tr>
        {form_row}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_with_controls_but_no_tasks_are_listed_in_name_order() {
        let overview = vec![QueueOverview {
            queue: "b".into(),
            running: 2,
            ..QueueOverview::default()
        }];
        let controls: BTreeMap<String, QueueControls> =
            [("a", Some(3), None), ("b", None, Some(10.0))]
                .into_iter()
                .map(|(name, max_running, rate_per_sec)| {
                    (
                        name.to_owned(),
                        QueueControls {
                            queue: name.into(),
                            max_running,
                            rate_per_sec,
                            burst: rate_per_sec.map(|r| r as i32),
                            ..QueueControls::default()
                        },
                    )
                })
                .collect();
        let rows = merge(overview, &controls);
        let names: Vec<&str> = rows.iter().map(|(q, _)| q.queue.as_str()).collect();
        assert_eq!(names, ["a", "b"], "a queue with controls alone is listed");
        assert_eq!(rows[1].0.running, 2, "counts stay with their queue");
        assert_eq!(controls_text(&rows[0].1), ["max 3 running"]);
        assert_eq!(controls_text(&rows[1].1), ["10/s, burst 10"]);
    }

    fn form(max_running: &str, rate_per_sec: &str, burst: &str) -> LimitsForm {
        LimitsForm {
            max_running: max_running.into(),
            rate_per_sec: rate_per_sec.into(),
            burst: burst.into(),
            ..LimitsForm::default()
        }
    }

    #[test]
    fn the_limits_form_sends_every_field_and_null_for_an_empty_one() {
        let limits = form(" 3 ", "0.5", "").parse().unwrap();
        assert_eq!(
            limits,
            QueueLimits {
                max_running: Some(Some(3)),
                rate_per_sec: Some(Some(0.5)),
                burst: Some(None),
                retention_secs: Some(None),
                keep_failed_secs: Some(None),
            }
        );
        assert_eq!(
            serde_json::to_value(&limits).unwrap(),
            serde_json::json!({"max_running": 3, "rate_per_sec": 0.5, "burst": null,
                               "retention_secs": null, "keep_failed_secs": null}),
            "an empty field is sent as null, which removes the limit"
        );
        assert_eq!(
            form("", "none", "NONE").parse().unwrap(),
            QueueLimits {
                max_running: Some(None),
                rate_per_sec: Some(None),
                burst: Some(None),
                retention_secs: Some(None),
                keep_failed_secs: Some(None),
            },
            "empty and none both remove a limit"
        );
        assert_eq!(
            form("1000000", "1000000", "7").parse().unwrap().burst,
            Some(Some(7))
        );
        // A burst without a rate is the server's to refuse, with its own message.
        assert!(form("", "", "5").parse().is_ok());
    }

    #[test]
    fn the_limits_form_refuses_what_is_not_a_limit_and_names_the_field() {
        for (f, field, says) in [
            (form("-1", "", ""), "Max running", "at least 1"),
            (form("0", "", ""), "Max running", "at least 1"),
            (form("abc", "", ""), "Max running", "whole number"),
            (form("2.5", "", ""), "Max running", "whole number"),
            (form("1000001", "", ""), "Max running", "at most 1000000"),
            (
                form("99999999999999999999", "", ""),
                "Max running",
                "at most",
            ),
            (form("", "-5", ""), "Rate per second", "more than 0"),
            (form("", "0", ""), "Rate per second", "more than 0"),
            (form("", "fast", ""), "Rate per second", "a number"),
            (form("", "inf", ""), "Rate per second", "a number"),
            (form("", "NaN", ""), "Rate per second", "a number"),
            (form("", "2e6", ""), "Rate per second", "at most"),
            (form("", "5", "-2"), "Burst", "at least 1"),
            (form("", "5", "x"), "Burst", "whole number"),
        ] {
            let e = f.parse().unwrap_err();
            assert!(
                e.starts_with(field) && e.contains(says),
                "{f:?} is refused for {field} ({says}): {e}"
            );
        }
    }

    #[test]
    fn the_limits_form_opens_with_the_queues_limits() {
        let c = QueueControls {
            queue: "mail".into(),
            max_running: Some(3),
            rate_per_sec: Some(2.5),
            burst: Some(3),
            ..QueueControls::default()
        };
        assert_eq!(
            LimitsForm::of(&c),
            form("3", "2.5", ""),
            "the default burst (the rate rounded up) is left empty"
        );
        let c = QueueControls {
            burst: Some(20),
            ..c
        };
        assert_eq!(
            LimitsForm::of(&c).burst,
            "20",
            "a burst set on purpose is shown"
        );
        assert_eq!(
            LimitsForm::of(&c).parse().unwrap(),
            QueueLimits {
                max_running: Some(Some(3)),
                rate_per_sec: Some(Some(2.5)),
                burst: Some(Some(20)),
                retention_secs: Some(None),
                keep_failed_secs: Some(None),
            },
            "saving an unchanged form keeps the limits"
        );
        assert_eq!(LimitsForm::of(&QueueControls::default()), form("", "", ""));
    }

    #[test]
    fn the_form_edits_a_queues_retention_as_durations_and_refuses_what_is_not_one() {
        let c = QueueControls {
            queue: "scratch".into(),
            retention_secs: Some(12.0 * 3_600.0),
            keep_failed_secs: Some(14.0 * 86_400.0),
            ..QueueControls::default()
        };
        let f = LimitsForm::of(&c);
        assert_eq!(
            (f.retention.as_str(), f.keep_failed.as_str()),
            ("12h", "2w")
        );
        let limits = f.parse().unwrap();
        assert_eq!(
            (limits.retention_secs, limits.keep_failed_secs),
            (Some(Some(43_200.0)), Some(Some(1_209_600.0))),
            "saving an unchanged form keeps the retention"
        );
        let f = LimitsForm {
            retention: "3".into(),
            keep_failed: "".into(),
            ..LimitsForm::default()
        };
        let limits = f.parse().unwrap();
        assert_eq!(
            (limits.retention_secs, limits.keep_failed_secs),
            (Some(Some(259_200.0)), Some(None)),
            "a number alone is days; empty is the cluster's"
        );
        for bad in ["0", "-1d", "30m", "59s", "36501d", "forever", "1y", "NaNd"] {
            let f = LimitsForm {
                retention: bad.into(),
                ..LimitsForm::default()
            };
            let e = f.parse().unwrap_err();
            assert!(e.starts_with("Keep finished"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_queues_retention_is_its_own_or_the_clusters_marked_default() {
        let cluster = Retention {
            enabled: true,
            retention_secs: 7.0 * 86_400.0,
            keep_failed_secs: 30.0 * 86_400.0,
            artifact_grace_secs: 86_400.0,
            keep_keys_secs: 86_400.0,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        };
        let plain = QueueControls::default();
        assert_eq!(
            retention_text(&plain, Some(&cluster)),
            "kept 7 d (default) · failed 30 d (default)"
        );
        let scratch = QueueControls {
            retention_secs: Some(12.0 * 3_600.0),
            ..QueueControls::default()
        };
        assert_eq!(
            retention_text(&scratch, Some(&cluster)),
            "kept 12 h · failed 30 d (default)"
        );
        let audit = QueueControls {
            retention_secs: Some(90.0 * 86_400.0),
            ..QueueControls::default()
        };
        assert_eq!(
            retention_text(&audit, Some(&cluster)),
            "kept 90 d · failed 90 d (default)",
            "failed tasks are kept at least as long as the others"
        );
        assert_eq!(retention_text(&plain, None), "", "unknown until read");
        let off = Retention {
            enabled: false,
            ..cluster
        };
        assert_eq!(
            retention_text(&scratch, Some(&off)),
            "kept for ever (retention off)"
        );
    }
}
