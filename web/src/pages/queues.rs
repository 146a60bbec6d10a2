//! The queues page (`/queues`): per queue, the tasks due now (its depth), delayed, running and
//! retrying, how long its oldest due task has waited, and its controls (paused, concurrency
//! and rate limits), with pause and resume buttons for admins.
//!
//! The numbers come from `GET /api/v1/overview`, the snapshot `GET /api/v1/queues` is built
//! from: the overview tells due tasks from delayed ones, which `/queues` counts together as
//! `waiting`. Live like the overview page. The controls come from `GET /api/v1/queues`,
//! fetched at start, after an action and at most every few seconds while the overview
//! changes; a queue with controls is listed even without tasks.

use std::collections::BTreeMap;

use leptos::prelude::*;
use leptos::task::spawn_local;
use sked_types::{QueueControls, QueueCounts, QueueOverview};

use crate::api;
use crate::pages::overview::{aged_secs, live_overview};
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
    }
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
    let action_error = RwSignal::new(None::<String>);
    let queues = Memo::new(move |_| {
        let by_name: BTreeMap<String, QueueControls> = controls.data.with(|c| {
            c.iter()
                .flatten()
                .filter(|q| {
                    q.paused_at.is_some() || q.max_running.is_some() || q.rate_per_sec.is_some()
                })
                .map(|q| (q.queue.clone(), controls_of(q)))
                .collect()
        });
        let overview = fetched
            .data
            .with(|o| o.as_ref().map(|o| o.queues.clone()).unwrap_or_default());
        merge(overview, &by_name)
    });
    let error = move || {
        fetched
            .error
            .get()
            .or_else(|| controls.error.get())
            .map(|e| view! { <ErrorBox message=e.message/> })
            .or_else(|| action_error.get().map(|m| view! { <ErrorBox message=m/> }))
    };
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
    let rows = move || {
        queues
            .get()
            .into_iter()
            .map(|(q, c)| queue_row(q, c, aged, is_admin, act))
            .collect_view()
    };
    view! {
        <h1>"Queues"</h1>
        {error}
        <Show
            when=move || fetched.data.with(Option::is_some)
            fallback=move || {
                (!fetched.answered()).then(|| view! { <p class="empty loading">"Loading…"</p> })
            }
        >
            <Show
                when=move || queues.with(|qs| !qs.is_empty())
                fallback=|| view! {
                    <p class="empty">"No queue has unfinished tasks, tasks finished in the last hour or controls."</p>
                }
            >
                <p class="hint">
                    {move || fetched.data.with(|o| o.as_ref().map(|o| {
                        let whose = o.owner.as_ref().map_or_else(
                            || "every owner's tasks".to_owned(),
                            |owner| format!("tasks of {owner}"),
                        );
                        format!("Queues with unfinished tasks or tasks finished in the last hour; {whose}.")
                    }))}
                </p>
                <div class="table-wrap">
                    <table class="queues">
                        <thead>
                            <tr>
                                <th>"Queue"</th>
                                <th class="num" title="waiting and due: claimable now">"Depth (due)"</th>
                                <th class="num" title="how long the oldest due task has waited">"Oldest due"</th>
                                <th class="num" title="waiting for their start time">"Delayed"</th>
                                <th class="num">"Running"</th>
                                <th class="num" title="failed attempts waiting for their backoff">"Retry"</th>
                                <th class="num hide-narrow" title="waiting for workflow parents or shards">"Blocked"</th>
                                <th title="paused, and limits over all workers">"Controls"</th>
                                <th class="hide-narrow"></th>
                            </tr>
                        </thead>
                        <tbody>{rows}</tbody>
                    </table>
                </div>
            </Show>
        </Show>
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

fn queue_row(
    q: QueueOverview,
    c: QueueControls,
    aged: Signal<f64>,
    admin: Signal<bool>,
    act: impl Fn(String, &'static str) + Copy + Send + Sync + 'static,
) -> impl IntoView {
    let paused = c.paused_at.is_some();
    let limits = controls_text(&c).join(" · ");
    let name = q.queue.clone();
    let button = move || {
        admin.get().then(|| {
            let name = name.clone();
            let (action, label) = if paused {
                ("resume", "Resume")
            } else {
                ("pause", "Pause")
            };
            view! {
                <button type="button" data-action=action on:click=move |_| act(name.clone(), action)>
                    {label}
                </button>
            }
        })
    };
    let href = format!("/tasks?queue={}", api::enc(&q.queue));
    let cell = |n: i64, class: &'static str| {
        let class = if n == 0 {
            format!("num zero {class}")
        } else {
            format!("num {class}")
        };
        view! { <td class=class>{ui::count(n)}</td> }
    };
    let oldest = q.oldest_due_secs;
    view! {
        <tr data-queue=q.queue.clone() data-paused=paused.to_string()>
            <td><a href=href.clone()>{q.queue.clone()}</a></td>
            {cell(q.waiting_due, "")}
            <td class="num">
                {move || oldest.map(|s| ui::duration(s + aged.get())).unwrap_or_else(|| "—".to_owned())}
            </td>
            {cell(q.waiting_delayed, "")}
            {cell(q.running, "")}
            {cell(q.retry, "")}
            {cell(q.blocked, "hide-narrow")}
            <td class="controls">
                {if paused {
                    view! { <span class="badge schedule-paused">"paused"</span> }
                } else {
                    view! { <span class="badge schedule-active">"active"</span> }
                }}
                " "
                <span class="limits">{limits}</span>
                " "
                {button}
            </td>
            <td class="hide-narrow"><a href=href>"tasks →"</a></td>
        </tr>
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
}
